"""Compile workers (runtime/triton_worker.py, Note [Compile workers without torch]; the pool in triton_build.py):
kernels compile for a GPU without one and without torch in the worker, the launch infos they answer match the
compiled kernel's parameters, and a failing or dying worker raises a clear error and is replaced."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from lazy.runtime import triton_build, triton_worker

pytest.importorskip("triton")
TARGET = ["cuda", 90, 32]  # compiled for sm_90 whether or not this machine has a GPU

# A module as codegen/triton.py renders them: its loader globals (_kernel, M) set by the loader.
_MODULE = textwrap.dedent("""
    import triton
    import triton.language as tl

    @_kernel(["s0", "s1"], False)
    def k0(b0, b1, s0: "fp64", s1: "i64"):
        i = tl.program_id(0) * 128 + tl.arange(0, 128)
        m = i < s1
        tl.store(b1 + i, tl.load(b0 + i, mask=m) * s0, mask=m)
""")
_WIDTH = {"O": 64, "l": 64, "K": 64, "d": 64, "i": 32, "I": 32, "f": 32}


@pytest.fixture
def module(tmp_path, monkeypatch):
    path = tmp_path / "lz_module.py"
    path.write_text(_MODULE)
    cache = tmp_path / "triton"
    cache.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    return {"path": str(path), "cache": str(cache), "target": TARGET}


def _request(module, name="k0", types=("*fp32", "*fp64", "fp64", "i64")):
    return {**module, "kernels": [{"name": name, "types": list(types), "num_warps": 4, "debug": False}]}


def test_launch_infos_match_the_compiled_kernels_parameters(tmp_path):
    """The argument types handed to PyTorch's static launcher (Note [One launcher for every signature]) are the
    compiled kernel's parameters, width for width, the hidden scratch pointers included; constexprs are not
    passed."""
    probe = tmp_path / "probe.py"  # Triton reads a kernel's source from its file
    probe.write_text(textwrap.dedent("""
        import re, triton, triton.language as tl
        from lazy.runtime import triton_worker

        @triton.jit
        def k(x, y, n, m, a, b, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y + i, tl.load(x + i, mask=i < n) * a + b + m, mask=i < n)

        types = ["*fp32", "*fp64", "i32", "i64", "fp32", "fp64"]
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        src = ASTSource(k, dict(zip(k.arg_names, types + ["constexpr"])), {"BLOCK": 128},
                        attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
        info = triton_worker.launch_info(ck)
        entry = re.search(r"\\.entry\\s+\\w+\\s*\\((.*?)\\)", ck.asm["ptx"], re.S).group(1)
        print(info["types"], info["hidden"], " ".join(re.findall(r"\\.param\\s+\\.(\\w+)", entry)))
    """))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(triton_worker.__file__))),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    types, hidden, *params = done.stdout.split()
    assert types.startswith("OOilfd") and len(types) == 6 + int(hidden)
    assert [_WIDTH[c] for c in types] == [int(p[1:]) for p in params]


def test_kernels_a_triton_launcher_must_launch_have_no_static_types():
    from types import SimpleNamespace as NS
    assert triton_worker.hidden_args(NS(global_scratch_size=0, profile_scratch_size=0)) == 2
    assert triton_worker.hidden_args(NS(global_scratch_size=0)) == 1
    assert triton_worker.hidden_args(NS(global_scratch_size=128, profile_scratch_size=0)) is None
    src = NS(signature={"x": "*fp32", "d": "nvTmaDesc"}, fn=NS(arg_names=["x", "d"]), constants={})
    assert triton_worker.arg_types(NS(src=src)) is None


def test_workers_compile_without_torch(module):
    pool = triton_build._Pool(1)
    try:
        worker = pool.workers[0]
        answer = pool.submit(_request(module)).result(timeout=300)
        info, = answer["infos"]
        assert info["name"] == "k0" and info["types"] == "OOdl" + "O" * info["hidden"]
        assert os.path.exists(triton_build.cubin(info))  # in the parent's Triton cache
        with open(f"/proc/{worker.proc.pid}/maps") as f:
            maps = f.read()
        assert "libtriton" in maps and "libtorch" not in maps
    finally:
        pool.shutdown()


def test_a_failed_compile_or_a_dead_worker_raises_and_the_pool_goes_on(module):
    pool = triton_build._Pool(1)
    try:
        with pytest.raises(RuntimeError, match="AttributeError.*k9"):
            pool.submit(_request(module, name="k9")).result(timeout=300)
        pool.workers[0].proc.kill()
        pool.workers[0].proc.wait()
        with pytest.raises(RuntimeError, match="compile worker exited"):
            pool.submit(_request(module)).result(timeout=300)
        assert pool.submit(_request(module)).result(timeout=300)["infos"][0]["name"] == "k0"  # a new worker
    finally:
        pool.shutdown()


def test_workers_end_with_their_process(module, tmp_path):
    """A script that exits while a compile runs exits cleanly, and its compile worker ends with it."""
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent(f"""
        import lazy
        from lazy.runtime import triton_build
        lazy.config.triton_workers = 1
        pool = triton_build._pool()
        pool.submit({_request(module)!r})
        print(pool.workers[0].proc.pid, flush=True)
    """))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.split()[-1])
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"compile worker {pid} outlived its parent")


def test_requests_are_one_per_distinct_compile():
    """A model's repeated layers launch one function with one signature: one compile request between them; buffers
    take their dtype's pointer type, scalars float64/int64 (or their device buffers, Note [Scalars in device
    memory]); a dtype without kernels is refused by name."""
    import torch

    from lazy.codegen.triton import Launch
    dtypes = {0: torch.float32, 1: torch.float32, 2: torch.bool, 3: torch.float32, 4: torch.complex64}
    a = Launch("k0", [0, 1], [0, 1], [True, False], 4, 4, False)
    b = Launch("k0", [3, 1], [2, 3], [True, False], 8, 4, False)  # another layer: same compile
    c = Launch("k0", [2, 1], [0, 1], [True, False], 4, 4, False)  # a bool buffer: another signature
    d = Launch("k1", [0, 1], [0], [True], 4, 4, False, memory=True)
    reqs, index = triton_build.requests([a, b, c, d], dtypes)
    assert index == [0, 0, 1, 2]
    assert reqs[0] == {"name": "k0", "types": ["*fp32", "*fp32", "fp64", "i64"], "num_warps": 4, "debug": False}
    assert reqs[1]["types"][0] == "*i1" and reqs[2]["types"] == ["*fp32", "*fp32", "*fp64"]
    with pytest.raises(NotImplementedError, match="complex64"):
        triton_build.requests([Launch("k2", [4], [], [], 1, 4, False)], dtypes)
