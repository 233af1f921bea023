"""The C++ renderer and runtime: templates, serial/parallel paths, runtime scalars, fallback on failure."""
import re
import warnings

import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.codegen import cpp
from lazy.debug import metrics
from lazy.lower import pointwise


pytestmark = pytest.mark.usefixtures("cpp_compiler")


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
    src = graph_cache.latest().source
    assert "omp parallel" not in src and "0.123456" not in src and "F[0]" in src
    big = torch.randn(512, 512).to("lazy")
    ((big * 2).exp() + big).cpu()
    assert "#pragma omp parallel for" in graph_cache.latest().source


def test_program_interface():
    x0 = torch.randn(8, 8)
    y = (x0.to("lazy").softmax(1) * 2)
    metrics.reset()
    torch.testing.assert_close(y.cpu(), x0.softmax(1) * 2)
    p = graph_cache.latest()
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
    assert graph_cache.latest().backend == "reference"


def test_compiler_choice_follows_config_at_lookup():
    x = torch.randn(3, 3).to("lazy")
    lazy.mark_step()
    with lazy.config.override(compiler="reference"):
        (x + 1).cpu()
        assert graph_cache.latest().backend == "reference"
    (x + 1).cpu()
    assert graph_cache.latest().backend == "cpp"
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
    from lazy.runtime.arena import layout as _arena_layout
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
    prog = graph_cache.latest()
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


# ---- reductions (Note [Reductions in lanes] in lazy/codegen/cpp.py, Note [Column reductions are tiled] in
# lazy/schedule/__init__.py) ----------------------------------------------------------------------------------------

def _reduction_inputs(dtype):
    """[37, 301]-shaped inputs (no size a multiple of any lane count), contiguous, transposed, sliced and broadcast,
    and 0-size and 1-element ones; floating ones hold NaN and +-inf in some rows and columns, not in others."""
    g = torch.Generator().manual_seed(0)

    def make(*shape):
        if dtype is torch.bool:
            return torch.rand(shape, generator=g) > 0.5
        if not dtype.is_floating_point:
            return torch.randint(-60, 60, shape, generator=g).to(dtype)
        return torch.randn(shape, generator=g).to(dtype)

    x = make(37, 301)
    if dtype.is_floating_point:
        x[3, 10] = x[30, 20] = float("nan")
        x[4, 200] = x[9, 20] = float("inf")
        x[6, 0] = x[9, 21] = -float("inf")
        x[7, :] = -float("inf")
    return {"contiguous": x, "transposed": make(301, 37).t(), "sliced": make(80, 700)[3:77:2, 1:602:2],
            "broadcast": make(301)[None].expand(37, 301), "column": make(37, 1).expand(37, 301),
            "1x1": make(1, 1), "0x7": make(0, 7), "7x0": make(7, 0)}


def _reduction_ops(dtype, case):
    ops = {"sum0": lambda x: x.sum(0), "sum1": lambda x: x.sum(1), "sum": lambda x: x.sum(),
           "amax0": lambda x: x.amax(0), "amax1": lambda x: x.amax(1), "amin0": lambda x: x.amin(0),
           "amin1": lambda x: x.amin(1), "max": lambda x: x.max(), "min": lambda x: x.min(),
           "prod1": lambda x: x.prod(1), "prod0": lambda x: x.prod(0), "sum1_keepdim": lambda x: x.sum(1, True) * 2}
    if dtype.is_floating_point:
        ops.update({"mean0": lambda x: x.mean(0), "mean1": lambda x: x.mean(1), "var1": lambda x: x.var(1),
                    "std0": lambda x: x.std(0), "var": lambda x: x.var(), "softmax1": lambda x: x.softmax(1),
                    "softmax0": lambda x: x.softmax(0), "log_softmax1": lambda x: x.log_softmax(1),
                    "log_softmax0": lambda x: x.log_softmax(0)})
        # NOTE: not over constant rows (broadcast along the normalized dim), where the mean is rounded to the dtype
        # before x - mean (lowering of var_mean), which 1/sqrt(eps) magnifies; eager's x - mean is exactly 0 there.
        if case != "column":
            ops["layer_norm_rows"] = lambda x: torch.nn.functional.layer_norm(x, x.shape[1:])
        if case != "broadcast":
            ops["layer_norm_columns"] = lambda x: torch.nn.functional.layer_norm(x.t(), x.t().shape[1:])
    return ops


# NOTE: every op and layout for float32, int64 and bool; the other dtypes (which differ only in their loads,
# stores and lane counts) on a few, to keep the default run short (one graph per dtype: ~10 s of decomposition
# and g++ for float32's).
_REDUCTION_SUBSET = ({"contiguous", "transposed", "sliced", "7x0"},
                     {"sum0", "sum1", "amax1", "amin0", "prod1", "softmax1", "softmax0", "var1", "layer_norm_rows"})


def test_float32_variance_in_float_lanes_stays_within_a_few_ulps():
    """Note [Deviations in float]: var of float32 rows, short (float lanes) and long (double accumulation), shifted
    far from zero and scaled: eager's values within float32's tolerance, and within 4 eps of float64's."""
    torch.manual_seed(0)
    xs = [torch.randn(256, 1024) + 1000, torch.randn(64, 4096) * 1e-3 + 5, torch.randn(8, 16384) * 10 - 3]
    lz = [x.to("lazy").var(-1) for x in xs]
    lazy.mark_step()
    assert metrics.counter("compile_fallback") == 0
    for x, got in zip(xs, lz):
        got = got.cpu()
        torch.testing.assert_close(got, x.var(-1))
        exact = x.double().var(-1)
        assert ((got.double() - exact).abs() / exact).max() < 4 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.bool])
def test_reductions_match_eager(dtype):
    """Row and column reductions (in lanes, tiled or sequential) on every layout of _reduction_inputs, in one graph:
    eager's values within assert_close's tolerances for the dtype, eager's NaNs and infinities, no fallback."""
    want, lz = {}, {}
    every = dtype in (torch.float32, torch.int64, torch.bool)
    for case, x in _reduction_inputs(dtype).items():
        for name, op in _reduction_ops(dtype, case).items():
            if not every and (case not in _REDUCTION_SUBSET[0] or name not in _REDUCTION_SUBSET[1]):
                continue
            # NOTE: eager multiplies floats in the input's dtype (float16 rows of 301: 2 % off the exact product);
            # lazy in double, rounded once, so prod is checked against the product in double, rounded.
            exact = name.startswith("prod") and dtype.is_floating_point
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # var(): degrees of freedom <= 0 (1x1)
                    want[case, name] = op(x.double()).to(dtype) if exact else op(x)
            except (RuntimeError, IndexError):  # eager refuses it (max of an empty tensor, amax over a 0-size dim)
                continue
            lz[case, name] = op(x.to("lazy"))
    lazy.mark_step()
    assert metrics.counter("compile_fallback") == 0 and metrics.counter("cpp.compiles") == 1
    for key, got in lz.items():
        torch.testing.assert_close(got.cpu(), want[key], equal_nan=True, msg=lambda m: f"{key}: {m}")


def _vectorized_lane_loops(source, tmp_path):
    """(lane loops, of which g++ vectorized): the loops under ``#pragma omp simd`` in ``source``'s kernels, and
    those holding a line that -fopt-info-vec-optimized reports as a vectorized loop (it names a line of the body)."""
    import subprocess

    from lazy.runtime import cpp as runtime
    path = tmp_path / "graph.cpp"
    path.write_text(source)
    flags = [f for f in runtime.flags() if f != "-shared"]
    out = subprocess.run(["g++", *flags, "-c", "-fopt-info-vec-optimized", "-o", str(tmp_path / "graph.o"), str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    reported = {int(line.split(":")[1]) for line in out.stderr.splitlines() if "loop vectorized" in line}
    lines = source.splitlines()
    loops, open_ = [], []
    for i, line in enumerate(lines, 1):
        if line.strip().startswith("for (") and line.endswith("{"):
            open_.append((i, lines[i - 2].strip() == "#pragma omp simd"))
        elif line.strip() == "}" and open_:
            start, lanes = open_.pop()
            if lanes:
                loops.append((start, i))
    assert loops
    return loops, [(a, b) for a, b in loops if any(a <= n <= b for n in reported)]


@pytest.mark.parametrize("case", ["softmax", "column_sum", "layer_norm"])
def test_reduction_loops_vectorize(case, tmp_path):
    """Note [Reductions in lanes], Note [Column reductions are tiled]: every lane loop of a softmax (max, then the
    sum of exp(x - max), then the store), a column sum (the bias gradient) and a layer norm is vectorized."""
    x, b = torch.randn(64, 1000), torch.randn(1000)
    fn = {"softmax": lambda x, b: x.softmax(-1), "column_sum": lambda x, b: (x * 2).sum(0),
          "layer_norm": lambda x, b: torch.nn.functional.layer_norm(x, (1000,), b, b)}[case]
    got = fn(x.to("lazy"), b.to("lazy")).cpu()
    torch.testing.assert_close(got, fn(x, b))
    program = graph_cache.latest()
    assert program.num_kernels == 1
    if case == "column_sum":
        assert "tile=" in program.kernel_ir
    loops, vectorized = _vectorized_lane_loops(program.source, tmp_path)
    assert len(loops) >= (1 if case == "column_sum" else 2) and vectorized == loops, program.source


def test_float_arithmetic_is_not_contracted_into_fma():
    """``x * a + b`` is two eager ops, each rounded; g++ contracts it into one FMA (rounded once) unless
    -ffp-contract=off (runtime/cpp.py FLAGS). With it, a chain of multiplies and adds is bit-identical to eager."""
    torch.manual_seed(0)
    x = torch.randn(1000, 37)
    want = (x * 1.01 + 0.1) * x - 0.3 * x
    got = ((x.to("lazy") * 1.01 + 0.1) * x.to("lazy") - 0.3 * x.to("lazy")).cpu()
    assert metrics.counter("kernels_launched") == 1
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("shape", [(4, 1030), (40003,), (3, 256), (16, 16), (2, 12, 8)])
def test_deep_chains_run_interleaved_copies_with_the_same_results(shape):
    """Note [Interleaved copies]: the innermost loop of a long chain computes INTERLEAVE copies per iteration (with a
    remainder loop where the extent is not a multiple; as the OpenMP loop of a 1-D kernel too), bit-identical to
    the plain loop, which a short chain keeps. The 3-D chain reads its input transposed, so its loops cannot merge
    (Note [Contiguous loops are merged]) and an enclosing loop of 8 is the one interleaved."""
    torch.manual_seed(0)
    x = torch.randn(shape) * 4

    def deep(t):
        if t.dim() == 3:
            t = t.transpose(1, 2)
        for _ in range(3):
            t = (t * 1.01 + 0.1).sin().exp() - 1.5
        return t

    got = deep(x.to("lazy")).cpu()
    src = graph_cache.latest().source
    assert f"_{cpp.INTERLEAVE - 1} = " in src
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpp, "INTERLEAVE", 1)
        lazy.cache.graph_cache._CACHE.clear()
        plain = deep(x.to("lazy")).cpu()
        assert "_1 = " not in graph_cache.latest().source
    assert torch.equal(got, plain)
    torch.testing.assert_close(got, deep(x), rtol=1e-5, atol=1e-5)
    short = (x.to("lazy") * 2 + 1).cpu()
    assert "_1 = " not in graph_cache.latest().source and torch.equal(short, x * 2 + 1)


def test_large_outputs_ask_for_huge_pages_and_stay_correct():
    """Note [Huge pages for large outputs] (runtime/pages.py): a large fresh output is an ordinary tensor whose
    contents the kernel writes; the madvise hint changes nothing but speed."""
    from lazy.runtime import pages
    t = pages.empty((pages.HUGE_MIN_BYTES // 4 + 3,), torch.float32)
    assert t.shape == (pages.HUGE_MIN_BYTES // 4 + 3,) and t.is_contiguous()
    x = torch.randn(2048, 1031)
    got = (x.to("lazy") * 2 + 1).cpu()
    assert torch.equal(got, x * 2 + 1)


def test_batch_norm_training_and_adamw_match_eager():
    """BatchNorm2d in training (odd sizes: its statistics and gradients reduce (N, H, W) of NCHW, Note [Contiguous
    loops are merged] and Note [Sibling stages share their loop]) and AdamW's update of its parameters, three steps
    on the lazy device against eager: outputs, every gradient, running statistics and updated parameters."""
    import copy
    torch.manual_seed(0)
    xs = [torch.randn(5, 3, 7, 9) for _ in range(3)]
    dys = [torch.randn(5, 3, 7, 9) for _ in range(3)]
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.randn(3))
        bn.bias.copy_(torch.randn(3))

    def train(device):
        m = copy.deepcopy(bn).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.01)
        seen = []
        for x, dy in zip(xs, dys):
            x = x.to(device).requires_grad_()
            y = m(x)
            opt.zero_grad()
            (y * dy.to(device)).sum().backward()
            opt.step()
            if device == "lazy":
                lazy.mark_step()
            seen.append([t.detach().cpu().clone() for t in (y, x.grad, m.weight.grad, m.bias.grad, m.weight, m.bias,
                                                     m.running_mean, m.running_var)])
        return seen

    for got, want in zip(train("lazy"), train("cpu")):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_sums_over_outer_dims_match_eager():
    """sum over dims (0, 2, 3) of NCHW and sum(0), odd sizes, float32 and float64: merged loops and lanes give
    eager's values within its tolerances."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(5, 3, 7, 9, dtype=dtype)
        torch.testing.assert_close(x.to("lazy").sum((0, 2, 3)).cpu(), x.sum((0, 2, 3)))
        torch.testing.assert_close((x.to("lazy") * 2).sum((0, 2, 3), keepdim=True).cpu(), (x * 2).sum((0, 2, 3),
                                   keepdim=True))
        torch.testing.assert_close(x.to("lazy").sum(0).cpu(), x.sum(0))
        y = torch.randn(37, 301, dtype=dtype)
        torch.testing.assert_close(y.to("lazy").sum(0).cpu(), y.sum(0))


def test_invariant_values_are_computed_before_the_inner_loops():
    """Note [Invariant values are computed before the inner loops]: BatchNorm's grad_input behind a ReLU mask reads
    weight, mean and invstd per channel; they are loaded once per channel, outside the loops over (N, H, W)."""
    torch.manual_seed(0)

    def fn(g, y, x, w, m, s):
        dy = torch.where(y.relu() <= 0, 0.0, g)
        return torch.ops.aten.native_batch_norm_backward(dy, x, w, None, None, m, s, True, 1e-5,
                                                         [True, False, False])[0]

    ins = [torch.randn(5, 3, 7, 9) for _ in range(3)] + [torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]
    got = fn(*[t.to("lazy") for t in ins]).cpu()
    torch.testing.assert_close(got, fn(*ins))
    src = graph_cache.latest().source
    store_loop = src[src.rindex("#pragma GCC ivdep"):]
    store_loop = store_loop[:store_loop.index("\n}\n")]
    assert "b0[" in store_loop and not re.search(r"b\d+\[i0\]", store_loop), store_loop


@pytest.mark.parametrize("inner", [True, False])
def test_concatenations_split_their_loop(inner):
    """Note [Concatenations split their loop]: a concatenation along the innermost loop runs one loop per piece,
    each loading its own piece only (no select); along an outer dimension it keeps its selects. Results are eager's,
    with expensive pieces and transposed, broadcast inputs."""
    torch.manual_seed(0)
    a, b, c, d = torch.randn(6, 5), torch.randn(4, 6), torch.randn(6, 1), torch.randn(3, 5)

    def fn(a, b, c, d):
        if inner:
            return torch.cat([a * 2, b.t().sin(), c.expand(6, 3).exp(), (a[:, :2] + 1).tanh()], dim=1)
        return torch.cat([a * 2, d.exp(), a[:2] + 1], dim=0)

    got = fn(*[t.to("lazy") for t in (a, b, c, d)]).cpu()
    torch.testing.assert_close(got, fn(a, b, c, d), rtol=1e-6, atol=1e-6)
    src = graph_cache.latest().source
    body = src[src.index("static void lz_k"):]
    body = body[:body.index("\n}\n")]
    loops = re.findall(r"for \(int64_t i1 = (\d+); i1 < (\d+);", body)
    if inner:
        assert loops == [("0", "5"), ("5", "9"), ("9", "12"), ("12", "14")], body
        assert " ? " not in body, body
    else:
        assert " ? " in body and len(loops) <= 1, body


def test_a_constant_scalars_tuple_is_packed_once(monkeypatch):
    """Note [Segment calls in C]: a run from Python keeps the packing of a tuple of numbers it sees again (a replay's
    constants) and packs any other scalars afresh; a run in C packs them itself at each run. New values always reach
    the kernels."""
    x0 = torch.randn(8, 8)
    ((x0.to("lazy") * 0.5 + 0.25).sin()).cpu()
    p = graph_cache.latest()
    leaf = x0.clone()
    for scalars in ((0.5, 0.25), (2.0, -1.0), [3.0, 0.5]):  # in C
        torch.testing.assert_close(p.run([leaf], scalars)[0], (leaf * scalars[0] + scalars[1]).sin())
    monkeypatch.setattr(p, "_native", None)  # the run from Python
    same = (0.5, 0.25)
    for _ in range(3):
        torch.testing.assert_close(p.run([leaf], same)[0], (leaf * 0.5 + 0.25).sin())
    assert p._packed[0] is same and p._packed[5]
    arrays = p._packed[1]
    p.run([leaf], same)
    assert p._packed[1] is arrays  # reused, not packed again
    for scalars in ((2.0, -1.0), [3.0, 0.5], (2.0, -1.0)):  # new values, a list, an equal but new tuple
        torch.testing.assert_close(p.run([leaf], scalars)[0], (leaf * scalars[0] + scalars[1]).sin())
    assert not p._packed[5]


def test_programs_of_many_segments_compile_as_units_at_once(monkeypatch):
    """Note [Programs compiled in parallel]: a program's segments split into translation units compiled apart and
    linked; its kernels call sin/cos from several units (their vector variants are defined once), the program's
    source stays one unit, and the results are eager's, equal to those of the same program built as one unit."""
    from lazy.runtime import cpp as runtime
    from lazy.runtime import cpp_build
    built = []

    class Build(cpp_build.Build):
        def __init__(self, units, *args, **kwargs):
            built.append(len(units))
            super().__init__(units, *args, **kwargs)

    def fn(x, w):
        a = (x * 1.5).sin()
        b = (a @ w + 1.0).cos()  # the matmul (an extern) ends a segment
        c = (b @ w).sin().exp()
        return [c, (c @ w * 0.5).sin() + a.sum()]

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    monkeypatch.setattr(runtime, "Build", Build)
    monkeypatch.setattr(runtime, "_units", lambda: 4)
    monkeypatch.setattr(cpp, "UNIT_MIN_CHARS", 1)
    split = [t.cpu() for t in fn(x.to("lazy"), w.to("lazy"))]
    source = graph_cache.latest().source
    assert built and built[-1] >= 3 and source.count("int lz_err") == 1  # linked: sin's variants defined once
    for got, want in zip(split, fn(x, w)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(runtime, "_units", lambda: 1)
    graph_cache._CACHE.clear()
    with lazy.config.override(cache_dir=None):
        whole = [t.cpu() for t in fn(x.to("lazy"), w.to("lazy"))]
    assert built[-1] == 1
    for a, b in zip(split, whole):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pow_with_a_scalar_exponent_is_eagers_kernel(dtype):
    """Note [Scalars that pick eager's kernel] and [Pow with a scalar exponent]: the exponent is a constant of the
    graph, the exponents eager computes by arithmetic give eager's bits (x*x*x for 3, 1/x for -1, ...; its square
    roots are its vector sqrt's, within an ulp), and a new exponent compiles a new graph while the same one is a
    cache hit."""
    x = torch.randn(4, 300, dtype=dtype) * 3
    x[0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")], dtype=dtype)
    lx = x.to("lazy")
    for e in (2.0, 3.0, -1.0, -2.0, 2):
        got = (torch.pow(lx, e) * 1.0).cpu()
        assert torch.equal(got.isnan(), torch.pow(x, e).isnan())
        assert torch.equal(got.nan_to_num(), torch.pow(x, e).nan_to_num()), e
    for e in (0.5, -0.5, 2.5):
        torch.testing.assert_close((lx ** e).cpu(), x ** e, equal_nan=True)
    compiles = metrics.counter("cpp.compiles")
    for e in (2.0, 3.0):
        (torch.pow(lx, e) * 1.0).cpu()
    assert metrics.counter("cpp.compiles") == compiles
    lx.pow_(3.0)
    torch.testing.assert_close(lx.cpu(), x.pow(3.0), equal_nan=True)
