"""The C++ renderer and runtime: templates, serial/parallel paths, runtime scalars, fallback on failure."""
import warnings

import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.codegen import cpp
from lazy.debug import metrics
from lazy.lower import pointwise


@pytest.fixture(autouse=True, scope="module")
def cpp_backend(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("lazy-cache"))
    with lazy.config.override(compiler="cpp", backing_device="cpu", cache_dir=cache):
        yield


def last_program():
    return next(reversed(graph_cache._CACHE.values()))


def test_every_lowered_expression_op_has_a_template():
    import inspect
    import re
    used = set()
    for mod in (pointwise, __import__("lazy.lower.structure", fromlist=["x"])):
        used |= set(re.findall(r'kir\.op\("(\w+)"', inspect.getsource(mod)))
        used |= set(re.findall(r'_(?:unary|binary|compare|logical)\("(\w+)"', inspect.getsource(mod)))
    missing = {u for u in used if u not in cpp.TEMPLATES}
    assert not missing


def test_parallel_only_when_large_and_scalars_are_arguments():
    small = torch.randn(16, 16).to("lazy")
    (small * 0.123456 + 1).cpu()
    src = last_program().source
    assert "omp parallel" not in src and "0.123456" not in src and "F[0]" in src
    big = torch.randn(512, 512).to("lazy")
    ((big * 2).exp() + big).cpu()
    assert "#pragma omp parallel for" in last_program().source


def test_program_interface():
    x0 = torch.randn(8, 8)
    y = (x0.to("lazy").softmax(1) * 2)
    metrics.reset()
    torch.testing.assert_close(y.cpu(), x0.softmax(1) * 2)
    p = last_program()
    assert p.backend == "cpp" and p.num_kernels == 1 and "extern \"C\"" in p.source
    assert metrics.counter("kernels_compiled") == 1 and metrics.counter("kernels_launched") == 1


def test_compiler_failure_falls_back_with_one_warning():
    x0 = torch.randn(5, 5)
    with lazy.config.override(cxx="/nonexistent/c++", cache_dir=""):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = (x0.to("lazy") * 3.25).tanh().cpu()
    torch.testing.assert_close(y, (x0 * 3.25).tanh())
    msgs = [str(w.message) for w in caught if "cpp backend" in str(w.message)]
    assert len(msgs) == 1 and "/nonexistent/c++" in msgs[0]
    assert metrics.counter("compile_fallback") == 1
    assert last_program().backend == "reference"


def test_compiler_choice_follows_config_at_lookup():
    x = torch.randn(3, 3).to("lazy")
    lazy.mark_step()
    with lazy.config.override(compiler="reference"):
        (x + 1).cpu()
        assert last_program().backend == "reference"
    (x + 1).cpu()
    assert last_program().backend == "cpp"
    assert metrics.counter("graph_cache.miss") == 2


def test_unsupported_dtype_is_extern_not_wrong():
    x0 = torch.randn(4, 4)
    y = (x0.to("lazy").to(torch.complex64) * 2).real + 1
    torch.testing.assert_close(y.cpu(), (x0.to(torch.complex64) * 2).real + 1)
    assert metrics.counter("compile_fallback") == 0
    assert metrics.counter("extern.aten.mul.Tensor") == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_kernels_round_like_eager(dtype):
    """Note [Half precision]: float16/bfloat16 chains compile to kernels (no extern), computed in float and
    rounded after every op, so they equal eager's op-by-op results exactly; casts, reductions, NaN and inf too."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(33, 17, generator=g) * 4).to(dtype)
    y = torch.randn(33, 17, generator=g).to(dtype)
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -70000.0])

    def fn(x, y):
        z = (x * 1.01 + y).exp().sin() - 0.5  # exp overflows to inf in float16: sin(inf) is NaN, as in eager
        return [z, x / y, (x > y).to(dtype) * x, x.float() * 3, (x.double() / 3).to(dtype), x.amax(0), x.t() + y.t(),
                torch.where(x > 0, x, y), x.to(torch.int32), (x * y).sum(1), x.relu() * y.abs()]
    want = fn(x, y)
    lz = fn(x.to("lazy"), y.to("lazy"))
    lazy.mark_step()
    got = [t.cpu() for t in lz]
    assert metrics.counter("compile_fallback") == 0
    assert not [k for k in metrics.counters() if k.startswith("extern.")]
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype
        exact = i != 9  # the sum accumulates in double, eager in float: equal up to rounding
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0 if exact else None, atol=0 if exact else None,
                                   msg=lambda m: f"output {i}: {m}")


@pytest.mark.parametrize("keep", [True, False])
def test_arena_temporaries_and_fresh_outputs(keep, monkeypatch):
    # Note [Run plan]: kernel-only temporaries live in the Program's arena (reused by lifetime), outputs are new
    # tensors every run, and an extern's output that views an arena buffer is copied out before kernels reuse it.
    from lazy.runtime.cpp import _arena_layout
    from lazy.lower.kir import Buffer
    bufs = [Buffer(i, (16,), torch.float32) for i in range(3)]
    size, off = _arena_layout(bufs, {0: 0, 1: 1, 2: 3}, {0: 1, 1: 2, 2: 4})
    assert off[0] != off[1] and off[2] in (off[0], off[1]) and size == 2 * 64

    def fn(x, w):
        y = x
        for i in range(30):                             # too big to recompute: stored once, read by two kernels
            y = (y * 1.01).sin() if i % 2 else y + 0.5
        h = y.exp().sum(1, keepdim=True)
        a = (x / h) @ w                                 # an extern reading a kernel buffer
        v = (y + 1).t()
        return [a.relu(), y.sum(0) * 3, (v @ x).tanh(), (x - h).tanh() * 2]

    if not keep:  # a large arena: a fresh one per run, extern inputs as fresh tensors
        monkeypatch.setattr(lazy.runtime.cpp, "ARENA_KEEP_BYTES", 0)
        graph_cache._CACHE.clear()
    x, w = torch.randn(8, 8), torch.randn(8, 4)
    want = fn(x, w)
    firsts = None
    for step in range(3):
        lz = fn(x.to("lazy"), w.to("lazy"))
        lazy.mark_step()
        got = [t.cpu() for t in lz]
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
        if step == 0:
            firsts = [g.clone() for g in got]
    for g, e in zip(firsts, want):
        torch.testing.assert_close(g, e)  # earlier results are not overwritten by later runs
    prog = last_program()
    assert prog.backend == "cpp" and prog.keep_arena == keep and prog.arena_slots
    assert bool(prog.arena_views) == keep


def test_per_kernel_timing_under_debug_3(capsys):
    x = torch.randn(64, 64)
    with lazy.config.override(debug=3):
        metrics.reset()
        lz = x.to("lazy")
        (((lz * 1.5).softmax(1) @ lz).sum(0) + 1).cpu()
    timed = [k for k in metrics.counters() if k.startswith("cpp.time.")]
    assert any(k.startswith("cpp.time.kernel k") for k in timed) and any("extern aten.mm" in k for k in timed)
    assert "cpp run:" in capsys.readouterr().err
    metrics.reset()
    (x.to("lazy") * 2.5).cpu()
    assert not [k for k in metrics.counters() if k.startswith("cpp.time.")]  # off unless asked for
