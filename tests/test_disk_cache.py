"""The persistent compile cache: stable keys, atomic checked entries, corrupt entries rebuilt, other processes hit."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import torch

import lazy
from lazy.cache import disk
from lazy.debug import metrics

SCRIPT = textwrap.dedent("""
    import json, torch, lazy
    from lazy.debug import metrics
    torch.manual_seed(0)
    x = torch.randn(32, 32).to("lazy")
    y = ((x * 1.5).exp().sum(1) + x[:, 0]).relu()
    out = y.cpu()
    print(json.dumps({k: metrics.counter(k) for k in ("cpp.compiles", "disk_cache.hit", "disk_cache.miss",
                                                       "compile_fallback")} | {"sum": float(out.sum())}))
""")


def run_child(cache_dir):
    env = dict(os.environ, LAZY_COMPILER="cpp", LAZY_BACKING_DEVICE="cpu", LAZY_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing_and_corrupt_entries_are_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = run_child(cache)
    assert first["cpp.compiles"] == 1 and first["disk_cache.miss"] == 1 and first["compile_fallback"] == 0
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"
    second = run_child(cache)
    assert second["cpp.compiles"] == 0 and second["disk_cache.hit"] == 1 and second["sum"] == first["sum"]
    so = next(p for p in cache.iterdir() if p.suffix == ".so")
    so.write_bytes(so.read_bytes()[:100])  # truncated library
    code = SCRIPT.replace('"compile_fallback")}', '"compile_fallback", "disk_cache.corrupt")}')
    env = dict(os.environ, LAZY_COMPILER="cpp", LAZY_BACKING_DEVICE="cpu", LAZY_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    third = json.loads(out.stdout.strip().splitlines()[-1])
    assert third["disk_cache.corrupt"] == 1 and third["cpp.compiles"] == 1 and third["sum"] == first["sum"]
    assert run_child(cache)["cpp.compiles"] == 0


def test_digest_is_stable_across_processes_and_covers_structure():
    code = textwrap.dedent("""
        import torch, lazy
        from lazy.ir.graph import linearize
        from lazy.cache import disk
        from lazy.trace.views import value
        x = torch.zeros(4, 5).to("lazy")
        print(disk.graph_digest(linearize([value((x * 2.0 + 1).sum(1))]), "cpp"))
    """)
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=str(s))).stdout.strip() for s in (1, 2)}
    assert len(digests) == 1 and len(next(iter(digests))) == 64
    from lazy.ir.graph import linearize
    from lazy.trace.views import value
    x = torch.zeros(4, 5).to("lazy")
    a = disk.graph_digest(linearize([value((x * 2.0 + 1).sum(1))]), "cpp")
    b = disk.graph_digest(linearize([value((x * 2.0 + 1).sum(0))]), "cpp")
    c = disk.graph_digest(linearize([value((x * 3.0 + 1).sum(1))]), "cpp")  # a new scalar value: same key
    assert a != b and a == c


def test_foreign_directory_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "theirs"
    d.mkdir()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(d).st_uid + 1)
    with lazy.config.override(cache_dir=str(d)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert disk.cache_dir() is None
            assert disk.cache_dir() is None
    assert len([w for w in caught if "owned by uid" in str(w.message)]) == 1
    assert metrics.counter("disk_cache.refused") == 1


def test_entries_are_checked(tmp_path):
    with lazy.config.override(cache_dir=str(tmp_path)):
        src = tmp_path / "x.so"
        src.write_bytes(b"\x7fELF not really")
        disk.store("k" * 64, "source", str(src))
        assert disk.lookup("k" * 64, "source") is not None
        assert disk.lookup("k" * 64, "other source") is None       # foreign: built from another source
        meta = tmp_path / ("k" * 64 + ".json")
        meta.write_text("{not json")
        assert disk.lookup("k" * 64, "source") is None
    assert metrics.counter("disk_cache.corrupt") == 2 and metrics.counter("disk_cache.hit") == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_empty_cache_dir_disables():
    with lazy.config.override(cache_dir=""):
        assert disk.cache_dir() is None
        assert disk.lookup("a" * 64, "s") is None


def test_key_does_not_import_triton():
    """A warm cache hit must stay cheap: the key reads triton's version from package metadata (import triton: 0.2 s)."""
    code = textwrap.dedent("""
        import sys, torch, lazy
        from lazy.cache import disk
        disk._versions()
        print("triton" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_builds_leave_no_temp_dirs(tmp_path, monkeypatch, cpu_backing):
    """Each C++ build's private temp dir is removed once its library is cached or loaded, with the cache on and off
    (a run that compiled thousands of graphs left thousands behind)."""
    import tempfile

    from lazy.cache import graph_cache
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tempfile.tempdir)
    x = torch.randn(8, 8)
    for scale, cache_dir in ((1.25, str(tmp_path / "cache")), (1.75, "")):
        graph_cache.clear()  # no program of an earlier test's graph
        with lazy.config.override(compiler="cpp", cache_dir=cache_dir):
            metrics.reset()
            got = ((x.to("lazy") * scale).exp().sum(1) + 3).cpu()
            assert metrics.counter("cpp.compiles") == 1
        torch.testing.assert_close(got, (x * scale).exp().sum(1) + 3)
        assert os.listdir(tempfile.tempdir) == []
