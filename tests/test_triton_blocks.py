"""Block sizes of Triton kernels and their tuning (codegen/triton_blocks.py, Note [Tuned block sizes]; runtime
Note [Tuning on the first run]): every candidate a kernel may be tuned to computes eager's result, and on cuda the
first run times them once and a later process reuses the choice."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_compiler")
DEVICE = lazy.config.backing_device
CUDA = torch.device(DEVICE).type == "cuda"


def _kernels():
    """Kernels of every kind the tuning treats apart: pointwise, persistent rows, looped long rows, tiled columns."""
    g = torch.Generator().manual_seed(0)
    return {"pointwise": (lambda x: x.sin() * 2 + 1, torch.randn(64, 48, generator=g)),
            # a latency-bound chain (Note [Latency-bound pointwise kernels]): three dependent transcendentals
            "chain": (lambda x: (x.sin() * 1.5).sin().cos() + 1, torch.randn(64, 48, generator=g)),
            "persistent": (lambda x: [x.softmax(-1), F.layer_norm(x, (48,))], torch.randn(64, 48, generator=g)),
            "looped": (lambda x: [x.sum(1), x.amax(1)], torch.randn(3, 9000, generator=g)),
            "tiled": (lambda x: [x.sum(0), x.amax(0)], torch.randn(300, 200, generator=g))}


def _scheduled(fn, x):
    """The Triton backend's kernels of ``fn(x)`` on lazy tensors (nothing runs)."""
    from lazy.codegen.triton import LIMITS
    from lazy.codegen.triton_split import split_reductions
    from lazy.ir.graph import linearize
    from lazy.lower import lower
    from lazy.schedule import schedule
    from lazy.trace.views import value
    out = fn(x.to("lazy"))
    lin = linearize([value(t) for t in (out if isinstance(out, list) else [out])])
    kernels = split_reductions(schedule(lower(lin, torch.device(DEVICE)), LIMITS)).kernels
    lazy.mark_step()
    return kernels


def test_candidates_start_with_the_default_and_are_distinct():
    from lazy.codegen.triton_blocks import TUNE_MIN_WORK, candidates, default_blocks
    for name, (fn, x) in _kernels().items():
        for k in _scheduled(fn, x):
            for tune in ("off", "default", "max"):
                found = candidates(k, tune)
                assert found[0] == default_blocks(k) and len(set(found)) == len(found)
                assert all(b.warps in (1, 2, 4, 8, 16) and b.x >= 1 for b in found)
                if tune == "off" or k.work < TUNE_MIN_WORK:
                    assert len(found) == 1, (name, tune)


def test_large_reductions_and_chains_get_candidates_and_other_pointwise_only_at_max(monkeypatch):
    from lazy.codegen import triton_blocks
    monkeypatch.setattr(triton_blocks, "TUNE_MIN_WORK", 0)
    for name, (fn, x) in _kernels().items():
        for k in _scheduled(fn, x):
            default, wide = triton_blocks.candidates(k, "default"), triton_blocks.candidates(k, "max")
            assert len(wide) >= len(default)
            assert (len(default) > 1) == (bool(k.stages) or name == "chain"), name
            assert len(wide) > 1, name


@pytest.mark.parametrize("kind", ["pointwise", "chain", "persistent", "looped", "tiled"])
def test_every_candidate_computes_eagers_result(monkeypatch, kind):
    """Each block size a kernel can be tuned to, run (the interpreter on the cpu), against eager."""
    from lazy.codegen import triton_blocks
    monkeypatch.setattr(triton_blocks, "TUNE_MIN_WORK", 0)
    fn, x = _kernels()[kind]
    want = fn(x.to(DEVICE))
    want = want if isinstance(want, list) else [want]
    with lazy.config.override(autotune="max"):
        out = fn(x.to("lazy"))  # noqa: F841 -- kept alive, so that the step has something to compute
        lazy.mark_step()
    program = graph_cache.latest()
    assert program.backend == "triton" and max(len(vs) for vs in program.variants) > 1
    for j in range(max(len(vs) for vs in program.variants)):
        for n, vs in enumerate(program.variants):
            program.choose(n, min(j, len(vs) - 1))
        with lazy.config.override(autotune="max"):  # the same graph: a cache hit, run with the chosen blocks
            got = fn(x.to("lazy"))
            lazy.mark_step()
        assert graph_cache.latest() is program
        got = [t.cpu() for t in (got if isinstance(got, list) else [got])]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.cpu(), rtol=1e-5, atol=1e-5, msg=f"{kind}, candidate {j}")


def test_autotune_off_renders_one_function_per_kernel():
    fn, x = _kernels()["persistent"]
    with lazy.config.override(autotune="off"):
        out = fn(x.to("lazy"))  # noqa: F841
        lazy.mark_step()
    program = graph_cache.latest()
    assert all(len(vs) == 1 for vs in program.variants) and "_v1(" not in program.source
    with pytest.raises(ValueError, match="'off', 'default' or 'max'"):
        lazy.config.autotune = "fast"


@pytest.mark.skipif(not CUDA, reason="block sizes are timed on a GPU")
def test_first_run_times_candidates_once_and_a_later_process_reuses_the_choice(monkeypatch, tmp_path):
    from lazy.codegen import triton_blocks
    monkeypatch.setattr(triton_blocks, "TUNE_MIN_WORK", 0)
    monkeypatch.setattr(lazy.config, "cache_dir", str(tmp_path))  # no record of an earlier test's compile
    graph_cache.clear()  # nor its program
    fn, x = _kernels()["persistent"]
    want = fn(x.to(DEVICE))
    metrics.reset()
    got = fn(x.to("lazy"))
    lazy.mark_step()
    program = graph_cache.latest()
    timed = metrics.counter("triton.tuned_kernels")
    assert timed >= 1
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=1e-5, atol=1e-5)
    got = fn(x.to("lazy"))  # a cache hit: nothing is timed again
    lazy.mark_step()
    assert metrics.counter("triton.tuned_kernels") == timed
    records = [f for f in os.listdir(lazy.config.cache_dir) if f.endswith(".triton.json")]
    tuned = [json.load(open(os.path.join(lazy.config.cache_dir, f))).get("tuned") for f in records]
    assert program.choice in tuned
    graph_cache.clear()  # as a new process: the record's kernels and choices are loaded, nothing timed
    got = fn(x.to("lazy"))
    lazy.mark_step()
    assert metrics.counter("triton.tuned_kernels") == timed and graph_cache.latest().choice == program.choice
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=1e-5, atol=1e-5)


def test_short_latency_bound_kernels_spread_over_programs():
    """Note [Short latency-bound kernels]: a few elements of a long dependent chain each run an element per thread
    in programs of SPREAD_BLOCK elements; a short kernel that is not latency-bound, or a large one, keeps its
    default block; the spread kernel computes eager's result."""
    from lazy.codegen.triton_blocks import POINTWISE_BLOCK, SPREAD_BLOCK, Blocks, default_blocks

    def chain(x):
        for i in range(40):
            x = (x * 1.01 + 0.1).sin().relu() - 0.05
        return x

    g = torch.Generator().manual_seed(0)
    small, large = torch.randn(16, 16, generator=g), torch.randn(256, 256, generator=g)
    [k] = _scheduled(chain, small)
    assert default_blocks(k) == Blocks(SPREAD_BLOCK, 0, SPREAD_BLOCK // 32)
    [k] = _scheduled(lambda x: x * 2 + 1, small)
    assert default_blocks(k) == Blocks(256, 0, 2)
    [k] = _scheduled(chain, large)
    assert default_blocks(k).x == POINTWISE_BLOCK
    out = chain(small.to("lazy"))
    lazy.mark_step()
    torch.testing.assert_close(out.cpu(), chain(small.to(DEVICE)).cpu(), rtol=1e-5, atol=1e-5)
