"""argmax/argmin and max.dim/min.dim lowered to kernel reductions of (value, index) (Note [Arg reductions] in
lazy/lower/structure.py), checked bit for bit against eager CPU: first index of ties, NaN, signed zeros, every dtype,
keepdim, negative dims, dim=None, non-contiguous inputs, fused producers and consumers, and no extern left."""
import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics

pytestmark = pytest.mark.usefixtures("cpp_compiler")

NAN = float("nan")


def externs():
    return {k: v for k, v in metrics.counters().items() if k.startswith("extern.")}


def check(fn, *inputs, externs_allowed=False):
    """``fn`` (returning a list of tensors) on eager inputs and on lazy copies, in one compiled graph: every output
    equal to eager's exactly (NaN where eager's is NaN, the sign of zeros), and no extern call unless allowed."""
    want = fn(*inputs)
    lz = fn(*[x.to("lazy") for x in inputs])
    lazy.mark_step()
    got = [t.cpu() for t in lz]
    assert metrics.counter("compile_fallback") == 0
    assert externs_allowed or not externs(), externs()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"output {i}: {m}")
        if g.is_floating_point():
            assert torch.equal(torch.signbit(g), torch.signbit(w)), f"output {i}: sign of a zero"
    return got


def arg_ops(x):
    """Every form of the four ops on ``x`` (at least 2-d)."""
    out = [x.argmax(), x.argmin(), x.argmax(None, keepdim=True), x.argmin(-1, keepdim=True)]
    for dim in range(-x.dim(), x.dim()):
        for keepdim in (False, True):
            out += [x.argmax(dim, keepdim), x.argmin(dim, keepdim)]
            out += list(x.max(dim, keepdim)) + list(x.min(dim, keepdim))
    return out


def tied(shape, dtype, lo=0, hi=4):
    """Random values in a small range: every row has ties."""
    return torch.randint(lo, hi, shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_float_ties_nan_signed_zero(dtype):
    torch.manual_seed(0)
    x = tied((5, 6, 7), dtype) - 2
    x[x == 0] = torch.tensor([0.0, -0.0])[torch.randint(0, 2, (int((x == 0).sum()),))].to(dtype)  # -0.0 == 0.0
    x[1, 2, 3] = x[3, 0, 0] = x[3, 0, 4] = x[4, 5, 6] = x[0, 0, 0] = NAN  # first NaN wins, in some rows twice
    x[2, :, :] = NAN  # all-NaN
    x[3, 3, :] = float("-inf")
    x[3, 4, :] = float("inf")
    check(arg_ops, x)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_integers(dtype):
    torch.manual_seed(1)
    info = torch.iinfo(dtype)
    x = tied((4, 5, 6), dtype, 0, 3)
    x[0, 0, :] = info.min  # the accumulator's initial value: index 0
    x[0, 1, :] = info.max
    x[1, 1, 2] = info.min
    x[1, 2, 4] = info.max
    check(arg_ops, x)


def test_bool_max_min_dim():
    torch.manual_seed(2)
    x = torch.rand(5, 6) > 0.5
    x[0] = True
    x[1] = False
    check(lambda x: [t for d in (0, 1, -1) for t in list(x.max(d)) + list(x.min(d, keepdim=True))], x)


def test_noncontiguous_small_and_empty():
    torch.manual_seed(3)
    a = tied((6, 8), torch.float32).t()                  # transposed: argmax() is the index into the logical flat
    b = tied((5, 9, 4), torch.float32)[1:, ::2, 1:]      # sliced, strided, offset
    c = tied((1, 5), torch.float32).expand(4, 5)         # stride 0
    d = torch.tensor(3.5)                                # 0-dim
    e = torch.randn(1, 1)                                # 1-element dims
    f = torch.randn(0, 3)                                # 0-size output (reduced dim non-empty)
    check(lambda a, b, c, d, e, f: arg_ops(a) + arg_ops(b) + arg_ops(c) + arg_ops(e)
          + [d.argmax(), d.argmin(0), d.argmax(-1, True), *d.max(0), *d.min(-1, True), f.argmax(1), *f.max(1)],
          a, b, c, d, e, f)


def test_empty_reduced_dim_raises_as_eager():
    """argmax's meta kernel raises at the call; max.dim's does not, and its extern raises at the sync."""
    x = torch.randn(0, 3)
    for fn in (lambda x: x.argmax(0), lambda x: x.max(0)[0], lambda x: x.min(0)[1], lambda x: x.argmin()):
        with pytest.raises((RuntimeError, IndexError)):
            fn(x)
        with pytest.raises((RuntimeError, IndexError)):
            fn(x.to("lazy")).cpu()


def test_fused_producers_and_consumers_need_no_extern():
    """The accuracy of a classifier is one graph of kernels; the arg reduction reads its producer fused and its
    consumers read the index (and max.dim's values, read back at that index) without a stored intermediate."""
    torch.manual_seed(4)
    logits, y = torch.randn(64, 10), torch.randint(0, 10, (64,))
    w = torch.randn(10)
    logits[3, 4] = logits[3, 7] = logits[3].max() + 1  # a tie
    got = check(lambda lg, y, w: [(lg.argmax(1) == y).float().mean(), (lg * w + 1).relu().max(1).values * 2,
                                  (lg * w).exp().max(-1)[1] + 1, (lg - lg.amax(1, keepdim=True)).argmin(0),
                                  lg.t().min(1).values.sum(), lg.max(1, keepdim=True)[0] - lg],
                logits, y, w)
    assert got[0].item() == (logits.argmax(1) == y).float().mean().item()
    p = graph_cache.latest()
    assert p.backend == "cpp" and p.externs_by_op == {}


def test_large_rows_and_columns_first_index():
    """Rows and columns long enough to run in parallel and in tiled blocks (Note [Column reductions are tiled]),
    with ties everywhere: the first index, as eager's parallel reduction."""
    torch.manual_seed(5)
    x = tied((300, 257), torch.float32)
    x[7, 100] = x[7, 200] = NAN
    x[:, 9] = NAN
    check(lambda x: [x.argmax(0), x.argmin(1), *x.max(0), *x.min(1), x.argmax(), (x * 2).argmin(0, True)], x)
    assert "argmax" in graph_cache.latest().kernel_ir and "tile=" in graph_cache.latest().kernel_ir


def test_random_against_eager():
    """Random shapes, dims and dtypes; ties and NaNs in every input."""
    g = torch.Generator().manual_seed(6)
    for trial in range(6):
        nd = int(torch.randint(1, 4, (), generator=g))
        shape = tuple(int(n) for n in torch.randint(1, 9, (nd,), generator=g))
        dtype = [torch.float32, torch.float64, torch.float16, torch.int64][trial % 4]
        x = torch.randint(-2, 3, shape, generator=g).to(dtype)
        if dtype.is_floating_point:
            x[torch.rand(shape, generator=g) < 0.1] = NAN
        dim = int(torch.randint(-nd, nd, (), generator=g))
        check(lambda x: [x.argmax(dim), x.argmin(dim, True), *x.max(dim), *x.min(dim, True), x.argmax(),
                         (x.abs() + 1).argmin(), x.permute(*reversed(range(nd))).argmax(0)], x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_lanes_keep_the_first_index(dtype):
    """Rows of every extent around the lane counts (Note [Reductions in lanes]: blocks of lanes, a shifted last
    block, a tree over the lanes), each with its maximum and minimum twice at random places, NaNs in several lanes,
    rows all equal to the accumulator's initial value; dim=None reduces three dims with the innermost in lanes."""
    g = torch.Generator().manual_seed(7)
    for n in (1, 2, 3, 7, 31, 32, 33, 63, 64, 65, 100, 257):
        rows = torch.randint(0, 3, (12, n), generator=g)
        for r in range(8):
            a, b = torch.randint(0, n, (2,), generator=g).tolist()
            rows[r, a] = rows[r, b] = 5 if r % 2 else -5
        x = rows.to(dtype) if dtype is not torch.bool else rows > 1
        if dtype.is_floating_point:
            x[8, torch.randint(0, n, (3,), generator=g)] = NAN
            x[9] = NAN
            x[10] = float("-inf")
            x[11] = float("inf")
        elif dtype is not torch.bool:
            x[10] = torch.iinfo(dtype).min
            x[11] = torch.iinfo(dtype).max
        y = x.reshape(3, 4, n)
        if dtype is torch.bool:
            check(lambda x, y: [*x.max(1), *x.min(1), *y.max(-1, True)], x, y)
        else:
            check(lambda x, y: [x.argmax(1), x.argmin(1), *x.max(1), *x.min(1), y.argmax(), y.argmin(),
                                (y * 1).argmax(None, True)], x, y)
