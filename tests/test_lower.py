"""Lowering to kernel IR, checked against eager CPU through the cpp backend. Checks are batched: each ``check``
call compiles one graph with many outputs, since every C++ compile costs a fraction of a second."""
import collections
import re

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics


pytestmark = pytest.mark.usefixtures("cpp_compiler")


def check(fn, *inputs, atol=None, rtol=None, compiles=1):
    """``fn`` (returning a list of tensors) on eager inputs and on lazy copies, in one graph; compare all."""
    want = fn(*inputs)
    lz = fn(*[x.to("lazy") for x in inputs])
    before = metrics.counter("compiles")
    lazy.mark_step()
    got = [t.cpu() for t in lz]
    assert metrics.counter("compile_fallback") == 0
    assert metrics.counter("compiles") - before == compiles
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"output {i}: {m}")


def float_ops(x, y):
    a = y.abs() + 0.5
    return [x + y, x - y * 2.5, x * y, x / a, -x, x.relu(), x.exp(), a.log(), x.tanh(), x.sigmoid(), a.sqrt(),
            a.rsqrt(), x.abs(), a.pow(1.7), torch.where(x > y, x, y), (x > y), (x >= 0.5), x == y, x != y, x < y,
            x <= y, x.to(torch.int64), x.double(), x.clamp(-0.5, 0.5), x.clamp(min=0.1), torch.maximum(x, y),
            torch.minimum(x, y), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), x // a, x % a,
            torch.fmod(x, a), torch.div(x, a, rounding_mode="trunc"), torch.div(x, a, rounding_mode="floor"),
            x.floor(), x.ceil(), x.round(), x.trunc(), x.erf(), x.sin(), x.cos(), x.expm1(), a.log1p(), x.sign(),
            1 - x, 2 ** x, x.reciprocal(), torch.lerp(x, y, 0.3), torch.addcmul(x, x, y, value=0.5),
            torch.addcdiv(x, x, a, value=2), x.masked_fill(x > 0, 3.0), F.hardtanh(x), F.leaky_relu(x, 0.1),
            F.softplus(x), F.elu(x), x.square(), torch.isnan(x)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pointwise_float(dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 7, dtype=dtype)
    check(float_ops, x, torch.randn(6, 7, dtype=dtype))


def test_pointwise_shapes_noncontiguous_broadcast():
    torch.manual_seed(1)
    cases = [
        (torch.randn(0, 3), torch.randn(0, 3)),                      # 0-size
        (torch.randn(1), torch.randn(1)),                             # 1 element
        (torch.randn(5, 4).t(), torch.randn(4, 5)),                   # non-contiguous
        (torch.randn(3, 1), torch.randn(1, 4)),                       # broadcast both ways
        (torch.randn(2, 3, 4)[:, 1:, ::2], torch.randn(4, 2, 2).permute(1, 2, 0)[..., :2]),  # sliced, strided
        (torch.randn(()), torch.randn(3, 2)),                         # 0-dim with a tensor
        (torch.randn(8)[2:6], torch.tensor(2.0).expand(4)),           # storage offset, stride 0
    ]
    flat = [t for pair in cases for t in pair]

    def fn(*ts):
        outs = []
        for x, y in zip(ts[::2], ts[1::2]):
            outs += [x * y + 1, (x - y).exp().relu(), torch.where(x > 0, x, y * 2), (x + y).sum(), x.sigmoid() * y]
        return outs
    check(fn, *flat)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_pointwise_int(dtype):
    torch.manual_seed(2)
    x = torch.randint(-20, 20, (5, 6), dtype=dtype)
    y = torch.randint(1, 7, (5, 6), dtype=dtype) * torch.where(torch.rand(5, 6) > 0.5, 1, -1).to(dtype)
    check(lambda x, y: [x + y, x - y, x * y, -x, x.abs(), x // y, x % y, torch.div(x, y, rounding_mode="trunc"),
                        torch.fmod(x, y), x / y, x > y, x == 3, torch.maximum(x, y), torch.minimum(x, y),
                        torch.where(x > 0, x, y), x.relu(), x * 2.5, x + 1, x.float(), x.clamp(-3, 4),
                        x.sum(), x.sum(1), x.amax(0), x.amin(), x.sign(), x.to(torch.int8) * 9, x.exp()], x, y)


def test_bool_and_int8():
    torch.manual_seed(3)
    a, b = torch.rand(4, 5) > 0.5, torch.rand(4, 5) > 0.3
    i8 = torch.randint(-100, 100, (4, 5), dtype=torch.int8)
    check(lambda a, b, i8: [a & b, a | b, a ^ b, ~a, a.logical_not(), a.sum(), a.sum(0), a + b, a * b, a.int() + 1,
                            i8 + i8, i8 * 3, i8.sum(), torch.where(a, i8, 0)], a, b, i8)


def assert_lowered():
    """No op of the graphs compiled since the last metrics reset became an extern ATen call."""
    externs = {k: v for k, v in metrics.counters().items() if k.startswith("extern.")}
    assert not externs, externs


INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def int_values(dtype):
    """Every value of an 8-bit dtype; for wider ones the extremes, the values around 0 and around the bit width (as
    shift amounts: < 0, = width - 1, >= width) and random values."""
    info = torch.iinfo(dtype)
    if info.bits == 8:
        return torch.arange(info.min, info.max + 1).to(dtype)
    n = info.bits
    edges = torch.tensor([info.min, info.min + 1, -n - 1, -n, -n + 1, -3, -2, -1, 0, 1, 2, 3, n - 2, n - 1, n, n + 1,
                          2 * n, info.max - 1, info.max])
    return torch.cat([edges, torch.randint(info.min, info.max, (40,))]).to(dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_shifts_match_eager_at_every_amount(dtype):
    """Note [Shifts]: every (value, amount) pair of 8-bit dtypes, edge pairs of wider ones: an amount < 0 or >= the
    bit width shifts left to 0 and right to the sign fill, as eager's kernels; tensor and Python-number amounts."""
    torch.manual_seed(10)
    v = int_values(dtype)
    check(lambda a, b: [a << b, a >> b, torch.bitwise_left_shift(a, b), torch.bitwise_right_shift(a, b), a << 3,
                        a >> 1, a << 70, a >> 70, 5 << b, torch.bitwise_right_shift(-7, b), a.t() << b.t()],
          v[:, None], v[None, :])
    assert_lowered()


@pytest.mark.parametrize("dtype", INT_DTYPES + (torch.bool,), ids=str)
def test_bitwise_ops(dtype):
    """and/or/xor/not in every integer dtype and bool (where they are logical: ~True is False), with numbers, mixed
    dtypes (promoted as eager does), broadcasts, non-contiguous, 0-size and 1-element inputs."""
    torch.manual_seed(11)
    v = int_values(dtype) if dtype is not torch.bool else torch.tensor([False, True])
    a, b = v[:, None], v[None, :]
    other = torch.randint(-1000, 1000, (v.numel(), 1), dtype=torch.int32)
    empty, one = torch.zeros(0, 3, dtype=dtype), v[-1:]
    scalar = True if dtype is torch.bool else 0x5A
    check(lambda a, b, other, empty, one: [a & b, a | b, a ^ b, ~a, ~b.t(), a & scalar, scalar | b, a ^ scalar,
                                           a & other, other ^ b, empty & empty, ~empty, one | one, ~one,
                                           torch.bitwise_xor(a[::2], b[:, 1::2])],
          a, b, other, empty, one)
    assert_lowered()


def test_attention_mask_and_stays_in_the_kernel():
    """A causal mask & a padding mask (bool, broadcast), as every transformer step builds them: one kernel."""
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    pad = torch.rand(2, 1, 1, 6) > 0.3
    scores = torch.randn(2, 3, 6, 6)
    check(lambda c, p, s: [s.masked_fill(~(c & p), float("-inf")).softmax(-1), c & p, c | ~p], causal, pad, scores)
    assert_lowered()


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_pow(dtype):
    """eager's integer pow: wraps on overflow; a negative exponent gives 1 for base 1, +-1 for -1, 0 otherwise;
    tensor exponents and number bases (2 ** t)."""
    torch.manual_seed(12)
    v = int_values(dtype)
    small = torch.tensor([-3, -2, -1, 0, 1, 2, 3, 7, 8, 15, 16, 31, 32, 62, 63, 64, 65, 127]).to(dtype)
    check(lambda a, b, s: [a[:, None] ** s, torch.pow(s[:, None], a), 2 ** a, (-1) ** a, torch.pow(3, s),
                           s[:, None] ** s[None, :], a[::3] ** s[1:2], a ** b], v, v.flip(0), small)
    assert_lowered()


def test_integer_pow_by_a_number_raises_as_eager():
    """pow(int tensor, number) checks the number (negative: an error, out of the dtype's range: an error), which a
    kernel cannot: it stays an extern call, which raises as eager does; so do pow and shifts of bools (whose result
    dtype, int64, is no bool: the operands' is)."""
    x = torch.tensor([2, -3, 5])
    torch.testing.assert_close((x.to("lazy") ** 3).cpu(), x ** 3)
    with pytest.raises(RuntimeError, match="negative integer powers"):
        (x.to("lazy") ** -1).cpu()
    with pytest.raises(RuntimeError, match="overflow"):
        (x.to(torch.int8).to("lazy") ** 300).cpu()
    b = torch.tensor([True, False]).to("lazy")
    for fn in (lambda b: b ** b, lambda b: torch.pow(True, b), lambda b: b >> b, lambda b: b << True):
        with pytest.raises(RuntimeError, match="(?i)bool"):  # at the call (meta) or the sync (kernel)
            fn(b).cpu()


FLOAT_SPECIALS = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.3, -0.7, 1.0, 1.5, -2.5,
                  0.99, -0.99, 1e-30, 65504.0, 1e30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_float_pointwise_special_values(dtype):
    """Classes and sign bits of NaN, -NaN, +-inf, +-0 (signbit outputs check the signs assert_close ignores), sign
    and sgn of NaN (0, as eager), copysign, hypot, xlogy/xlog1py at x == 0 and y NaN, inverse hyperbolics, lgamma,
    softshrink, elu/selu/celu and angle, in every float dtype (half precision computed in float, rounded once)."""
    x = torch.tensor(FLOAT_SPECIALS).to(dtype)
    y = x.flip(0)
    check(lambda x, y: [x.isinf(), x.isfinite(), x.isposinf(), x.isneginf(), x.signbit(), x.sign(), torch.sgn(x),
                        torch.copysign(x, y), torch.copysign(x, y).signbit(), torch.copysign(x, -1.0), x.acosh(),
                        x.asinh(), x.atanh(), x.lgamma(), torch.hypot(x, y), torch.xlogy(x, y), torch.xlogy(0.0, y),
                        torch.xlogy(x, 2.0), torch.special.xlog1py(x, y), torch.special.xlog1py(0.0, y),
                        F.softshrink(x, 0.5), F.softshrink(x.t()), x.conj_physical(), x[:, ::3].isinf(),
                        x[:, 1:].isneginf(), F.elu(x), F.elu(x, 0.5).signbit(), F.selu(x), F.celu(x, 2.0),
                        torch.angle(x)], x[None], y[None])
    assert_lowered()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_erfinv_to_the_tails(dtype):
    """erfinv over (-1, 1), up to 1 - 1e-16 from both ends (where Newton on erf alone stalls), and its special
    values: +-1 -> +-inf, |y| > 1 and NaN -> NaN, +-0 -> +-0 (the sign of a NaN result is not compared: eager's
    depends on the dtype)."""
    tails = torch.logspace(-16, -1, 60, dtype=torch.float64)
    y = torch.cat([torch.linspace(-1, 1, 2001, dtype=torch.float64), 1 - tails, tails - 1,
                   torch.tensor([0.0, -0.0, float("nan"), 1.5, -7.0, float("inf"), 1e-300])]).to(dtype)
    check(lambda y: [torch.erfinv(y), torch.erfinv(y).signbit() & ~y.isnan() & (y.abs() <= 1)], y)
    assert_lowered()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_digamma(dtype):
    """digamma and polygamma(0, .) around its poles and roots, far out on both sides, and at eager's special values:
    +-0 -> -+inf, negative integers and -inf -> NaN, inf -> inf."""
    x = torch.cat([torch.linspace(-12, 12, 4801, dtype=torch.float64), torch.logspace(-30, 30, 61, dtype=torch.float64),
                   -torch.logspace(-30, 15, 46, dtype=torch.float64) - 0.25,
                   torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), -1.0, -7.0, 1.4616321449683622])
                   ]).to(dtype)
    check(lambda x: [torch.digamma(x), torch.polygamma(0, x), torch.special.psi(x[::7])], x)
    assert_lowered()


def test_signbit_alone_compiles_in_every_float_dtype():
    """A loop of only signbit vectorizes; g++ 12's __builtin_signbit then failed to compile over bfloat16 loads."""
    xs = [torch.randn(64).to(dtype) for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16)]
    for x in xs:
        check(lambda x: [x.signbit()], x)
    assert_lowered()


@pytest.mark.parametrize("dtype", INT_DTYPES + (torch.bool,), ids=str)
def test_integer_pointwise(dtype):
    """floor/ceil/trunc/round of integers are copies; integers are finite and never inf; signbit is x < 0; sign;
    copysign promotes to float; gcd and lcm as ATen's (|-128| stays -128 in int8, overflow wraps), every pair of
    8-bit values. Without INT_MIN in int32/int64: eager's lcm of INT_MIN and an odd number traps (SIGFPE)."""
    torch.manual_seed(13)
    v = int_values(dtype) if dtype is not torch.bool else torch.tensor([False, True])
    if dtype in (torch.int32, torch.int64):
        v = v[1:]
    a, b = v[:, None], v[None, :]

    def fn(a, b):
        outs = [a.isinf(), a.isfinite(), a.isposinf(), a.signbit(), torch.copysign(a, b), a.conj_physical(),
                a.sign(), torch.sgn(a), torch.angle(a)]
        if dtype is not torch.bool:
            outs += [a.floor(), a.ceil(), a.trunc(), a.round(), torch.gcd(a, b), torch.lcm(a, b), a.abs(), -a]
        return outs
    check(fn, a, b)
    assert_lowered()


def test_integer_division_by_zero_raises():
    x = torch.tensor([1, 2, 3]).to("lazy")
    with pytest.raises((ZeroDivisionError, RuntimeError)):
        (x // torch.tensor([1, 0, 1]).to("lazy")).cpu()


def test_nan_propagation():
    x = torch.tensor([[1.0, float("nan"), -2.0], [0.5, 0.25, float("inf")]])
    y = torch.tensor([[0.0, 1.0, float("nan")], [-1.0, 2.0, 3.0]])
    check(lambda x, y: [x.amax(1), x.amin(0), x.sum(1), torch.maximum(x, y), torch.minimum(x, y), x.relu(),
                        x.clamp(0, 1), x.max(), y.min(), torch.where(x != x, 0.0, x)], x, y)


def test_movement_ops_are_index_maps():
    torch.manual_seed(4)
    x = torch.randn(2, 3, 4)
    check(lambda x: [x.view(6, 4) * 2, x.reshape(4, 6) + 1, x.permute(2, 0, 1) * 1, x.transpose(0, 2).exp(),
                     x[:, 1:, ::2] - 1, x.select(1, 2) * 3, x[:, -1] * 1, x.unsqueeze(1).expand(2, 5, 3, 4) * 1,
                     x.reshape(24)[3:20:3] + 0, x.view(2, 12).t().reshape(3, 8) * 1, x[:1].squeeze(0) + 1,
                     x.flatten() * 2, x.reshape(2, 3, 2, 2).permute(3, 2, 1, 0).reshape(12, 2) + 0,
                     x.mT.contiguous() * 1], x)


def test_reductions():
    torch.manual_seed(5)
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    f = torch.randn(3, 1000)
    check(lambda x, f: [x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.mean(-1), x.mean((0, 1)), x.amax(2),
                        x.amin((1, 2), keepdim=True), x.var(1), x.std((0, 2)), x.var(1, correction=0),
                        x.prod(2), x.max(), x.min(), x.sum(0).exp().sum(), x.norm(), torch.var_mean(x, 2)[0],
                        f.sum(1), f.mean(), (f * 1e4).sum(), f.var(1), torch.logsumexp(f, 1),
                        x.permute(2, 0, 1).sum(0), (x - x.mean(1, keepdim=True)).sum(2)], x, f)


def test_reductions_edge_shapes():
    e = torch.randn(0, 4)
    one = torch.randn(1, 1)
    check(lambda e, one: [e.sum(0), e.sum(), e.sum(1), one.sum(), one.amax(1), one.mean(0), e.sum(0) + 1,
                          one.var(1, correction=0), e.exp(), e.view(2, 0, 2).exp(), e.reshape(0).sum()], e, one)


def test_composites_decompose():
    torch.manual_seed(6)
    x = torch.randn(8, 16)
    w, b = torch.randn(16), torch.randn(16)
    check(lambda x, w, b: [x.softmax(-1), x.log_softmax(1), x.softmax(0), F.layer_norm(x, (16,), w, b),
                           F.layer_norm(x, (16,)), torch.logsumexp(x, -1)], x, w, b)


def test_softmax_multiplies_by_the_reciprocal_of_its_sum():
    """Note [Softmax multiplies by the reciprocal]: the kernel computes 1 / sum once per row and multiplies (no
    division per element); over row lengths from 1 to 4096, shifted and scaled rows, -inf, NaN and half-precision
    inputs, eager's values within its tolerances, and within a few eps of eager's error against float64."""
    torch.manual_seed(3)
    xs = [torch.randn(64, n) * scale + shift for n, scale, shift in ((1, 1, 0), (7, 1, 0), (1000, 10, 0),
                                                                     (1024, 1e-3, 1e4), (4096, 30, -5))]
    special = torch.randn(4, 33)
    special[0, 3], special[1, :], special[2, 5] = float("nan"), -float("inf"), float("inf")
    check(lambda *xs: [x.softmax(-1) for x in xs], *xs, special)
    source = graph_cache.latest().source
    assert set(re.findall(r"= \((.+) / red\d+\);", source)) == {"float(1)"}, source  # only the reciprocals
    eps = torch.finfo(torch.float32).eps
    for x in xs:  # exp(x - max) magnifies the rounding of x - max (scaled rows) in eager as in lazy
        got, exact = x.to("lazy").softmax(-1).cpu().double(), x.double().softmax(-1)
        eager = ((x.softmax(-1).double() - exact).abs() / exact).max()
        assert ((got - exact).abs() / exact).max() < eager + 4 * eps
    half = torch.randn(16, 300)
    check(lambda h: [h.half().softmax(-1), h.bfloat16().softmax(0), torch.randn(0, 5, device=h.device).softmax(0)],
          half)


@pytest.mark.parametrize("momentum", [0.1, None])  # None: a cumulative average, its factor a new scalar per step
def test_batch_and_group_norm_forward_are_kernels(momentum):
    """Note [Batch norm's forward as kernels]: a training BatchNorm's output and running statistics, and GroupNorm's
    output, come from kernels, the momentum a runtime scalar (one graph for all steps), as eager computes them;
    eval mode stays an extern call."""
    torch.manual_seed(9)
    eager = torch.nn.ModuleList([torch.nn.BatchNorm2d(6, momentum=momentum), torch.nn.BatchNorm1d(6, momentum=momentum),
                                 torch.nn.GroupNorm(3, 6)])
    on_lazy = torch.nn.ModuleList([torch.nn.BatchNorm2d(6, momentum=momentum),
                                   torch.nn.BatchNorm1d(6, momentum=momentum), torch.nn.GroupNorm(3, 6)]).to("lazy")
    metrics.reset()
    for step in range(4):
        if step == 3:
            eager.eval()
            on_lazy.eval()
        x, h = torch.randn(4, 6, 5, 5) * (step + 1), torch.randn(8, 6) + step
        want = [eager[0](x), eager[1](h), eager[2](x)]
        got = [on_lazy[0](x.to("lazy")), on_lazy[1](h.to("lazy")), on_lazy[2](x.to("lazy"))]
        lazy.mark_step()
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
        for (name, w), g in zip(eager.state_dict().items(), on_lazy.state_dict().values()):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step} {name}: {m}")
        if step == 1:
            compiled = metrics.counter("compiles")
        if step == 2:  # the same graphs again (with momentum None, float(num_batches_tracked) syncs: two a step)
            assert not [k for k in metrics.counters() if "batch_norm" in k or "group_norm" in k], metrics.counters()
            assert metrics.counter("compiles") == compiled


def test_runtime_scalars_do_not_recompile():
    torch.manual_seed(7)
    x0 = torch.randn(16, 16)
    x = x0.to("lazy")
    lazy.mark_step()
    metrics.reset()
    for lr in (0.1, 0.01, 0.5):
        y = (x * lr + lr).exp() - lr
        torch.testing.assert_close(y.cpu(), (x0 * lr + lr).exp() - lr)
    assert metrics.counter("compiles") == 1 and metrics.counter("graph_cache.hit") == 2


def test_externs_inside_graph():
    torch.manual_seed(8)
    x, w = torch.randn(6, 5), torch.randn(5, 4)
    check(lambda x, w: [(x @ w).relu() + 1, x.sort(1)[0] * 2, x.cumsum(0).exp(), x.index_select(0, torch.tensor(
        [0, 2, 2], device=x.device)) - 1, torch.cat([x, x * 2]).sum(0), x.half().float() + 1, F.pad(x, (1, 1)) * 3,
        x.argmax(1), x.max(1).values * 1, torch.bmm(x[None], w[None])[0].tanh()], x, w)
    assert metrics.counter("extern.aten.mm.default") >= 1


def test_conformance_regressions():
    """Wrong results the cpp OpInfo conformance run found (tests/test_conformance_cpp.py): round(decimals=) ran as
    plain round, fmax/fmin propagated NaN like maximum, clamp ignored a NaN bound, float -> uint8 skipped eager's
    int64 step; signed overflow must wrap as eager's does (-fwrapv)."""
    n = float("nan")
    x = torch.tensor([1.0, n, 3.0, -2.5, 300.7, -300.2, 0.125, 2.5])
    y = torch.tensor([n, 2.0, n, 1.0, 1.0, 1.0, n, -1.0])
    i = torch.tensor([2 ** 62, -2 ** 63, 2 ** 31 - 1, -7])
    check(lambda x, y, i: [x.round(decimals=2), (x * 1000).round(decimals=-2), x.round(), torch.fmax(x, y),
                           torch.fmin(x, y), x.clamp(min=n), x.clamp(min=y), x.clamp(max=y), x.clamp(2, 1),
                           x.to(torch.uint8), (x * 100).to(torch.uint8), i * 4, -i, i.abs(),
                           i.to(torch.int32) + 2 ** 30, i.to(torch.int8) * 3], x, y, i)


@pytest.mark.parametrize("wins", [True, False])
def test_clamp_nan_number_bound_follows_the_running_torch(monkeypatch, tmp_path, wins):
    """torch 2.13's clamp(min=nan) is all NaN; torch 2.11's returns the input (clamp_min and tensor bounds give NaN
    on both). The lowering follows a probe of the running torch; both answers are checked here."""
    from lazy.lower import pointwise
    monkeypatch.setattr(pointwise, "_SCALAR_NAN_BOUND_WINS", wins)
    monkeypatch.setattr(lazy.config, "cache_dir", str(tmp_path))  # the disk key has torch's version, not the probe
    graph_cache.clear()
    n = float("nan")
    x = torch.tensor([1.0, n, 3.0, -2.5])
    lz = x.to("lazy")
    got = [t.cpu() for t in (lz.clamp(min=n), lz.clamp(max=n), lz.clamp(min=0.0, max=n), torch.clamp_min(lz, n),
                             lz.clamp(min=torch.tensor(n).to("lazy")))]
    ignored = torch.tensor([1.0, n, 3.0, 0.0])
    want = [torch.full((4,), n)] * 3 if wins else [x, x, ignored]
    for g, w in zip(got, want + [torch.full((4,), n)] * 2):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert metrics.counter("compile_fallback") == 0


def test_decompositions_branching_on_a_runtime_scalar_are_not_baked():
    """A decomposition that compares a runtime scalar with a special value (vector_norm's ord == 0 over size-1
    dims, addmm's beta == 0 dropping a NaN self) once took the sentinels' branch for every value."""
    torch.manual_seed(9)
    x = torch.randn(3, 2, 1, 2)
    a, m1, m2 = torch.full((2, 2), float("nan")), torch.randn(2, 3), torch.randn(3, 2)
    check(lambda x, a, m1, m2: [torch.linalg.vector_norm(x, ord=0, dim=2, keepdim=True),
                                torch.linalg.vector_norm(x, ord=0.0, dim=2), torch.addmm(a, m1, m2, beta=0),
                                torch.addmm(a, m1, m2, beta=0.0, alpha=2.0)], x, a, m1, m2)


def test_index_arithmetic_splits_by_common_divisor():
    # (17*i + j) // 136 with j < 17 is i // 8; k*(a // k) + a % k folds back to a: the row index of a reshaped
    # (256, 17) -> (32, 8, 17) reduction is a plain loop variable again, so the scheduler hoists the reduction.
    from lazy.lower import kir
    i, j = kir.var("i", 256), kir.var("j", 17)
    flat = kir.iadd(kir.imul(i, 17), j)
    assert kir.ifloordiv(flat, 136) is kir.ifloordiv(i, 8)
    assert kir.imod(flat, 136) is kir.iadd(kir.imul(kir.imod(i, 8), 17), j)
    assert kir.iadd(kir.imul(kir.ifloordiv(flat, 136), 8), kir.imod(kir.ifloordiv(flat, 17), 8)) is i
    assert kir.iadd(kir.imul(kir.ifloordiv(i, 8), 8), kir.imod(i, 8)) is i
    # not applicable: the remainder can reach the divisor, or the quotient part could be negative
    assert kir.ifloordiv(kir.iadd(kir.imul(i, 17), kir.imul(j, 2)), 136).op == "ifloordiv"
    assert kir.ifloordiv(kir.iadd(flat, kir.const(-17, kir.INDEX)), 136).op == "ifloordiv"
    x = torch.randn(4, 6, 10)
    check(lambda x: [x.reshape(24, 10).softmax(1).reshape(4, 6, 10) * 1, x.reshape(4, 60).sum(1),
                     x.reshape(2, 12, 10).log_softmax(2).reshape(24, 10)[3:17:2] + 1], x)


def test_index_arithmetic_folds_nested_divisions():
    # Note [Nested divisions]: flatten(1) of a [32, 8, 4, 4] tensor unravels the flat index of a [32, 128] loop nest
    # into (n, c, h, w) by divisions and remainders; folded, the view is the identity again
    from lazy.lower import kir
    i, j = kir.var("i", 32), kir.var("j", 128)
    flat = kir.iadd(kir.imul(i, 128), j)
    assert kir.ifloordiv(flat, 16) is kir.iadd(kir.imul(i, 8), kir.ifloordiv(j, 16))
    assert kir.ifloordiv(kir.ifloordiv(j, 4), 4) is kir.ifloordiv(j, 16)
    parts = [(kir.ifloordiv(flat, 128), 128), (kir.imod(kir.ifloordiv(flat, 16), 8), 16),
             (kir.imod(kir.ifloordiv(flat, 4), 4), 4), (kir.imod(flat, 4), 1)]
    index = kir.const(0, kir.INDEX)
    for e, k in parts:
        index = kir.iadd(index, kir.imul(e, k))
    assert index is flat
    # not where a part can be negative (the renderers divide truncating)
    assert kir.ifloordiv(kir.iadd(flat, kir.const(-5, kir.INDEX)), 16).op == "ifloordiv"
    x = torch.randn(6, 8, 4, 4)
    check(lambda x: [x.relu().flatten(1) * 2, x.flatten(1).sum(1), x.reshape(6, 2, 64).softmax(2).flatten(1)], x)


def _kernel_stores(sched_text: str) -> int:
    return sched_text.count(" store ")


def test_extern_inputs_are_strided_views_not_copies():
    """Note [Extern inputs are views]: a transposed, sliced, selected or expanded input of an extern (mm, sort) is
    passed as an as_strided view of its buffer; no kernel copies it first. Bases: leaves (one non-contiguous, one
    at a storage offset) and a kernel temporary whose only use is the view."""
    torch.manual_seed(0)
    x, w, b = torch.randn(8, 20), torch.randn(32, 20), torch.randn(32)
    big = torch.randn(6, 7, 9)
    tall = torch.randn(20, 5).t()  # a non-contiguous leaf
    offset_leaf = torch.randn(40, 6)[3:23]  # a leaf at a storage offset

    def fn(x, w, b, big, tall, offset_leaf):
        y = x * 2.0  # a temporary read only through views by the externs below
        return [torch.relu(F.linear(x, w, b)), y.t() @ x, big[1:5, ::2, 3].t() @ big[0, :4, 1:3],
                torch.sort(big[2, 1:, ::3].t(), dim=-1).values, tall @ offset_leaf[:, 1:2].expand(20, 7),
                b[None].expand(4, 32) @ w]

    metrics.reset()
    check(fn, x, w, b, big, tall, offset_leaf)
    assert metrics.counter("extern.aten.mm.default") == 5
    program = graph_cache.latest()
    # kernels: linear's bias + relu epilogue and y = x * 2 (both stored by design), nothing else
    assert _kernel_stores(program.kernel_ir) == 2, program.kernel_ir


@pytest.mark.parametrize("n", [4, 600])
def test_extern_view_of_a_temporary_kept_alive_in_and_out_of_the_arena(n):
    """The base of a view read by an extern lives until the call, in a kept arena (small) and in fresh buffers
    (an arena over runtime/cpp.py's ARENA_KEEP_BYTES), while other temporaries come and go around it."""
    torch.manual_seed(0)
    x = torch.randn(n, n)

    def fn(x):
        t = (x * 1.5).sin()          # read only through its transpose, by the mm after more kernels ran
        u = (x + 1.0).cos().sum(0)   # a reduction kernel with temporaries of its own in between
        return [t.t() @ x + u, (t.t()[: n // 2] @ x[:, :3]).relu()]

    check(fn, x, atol=1e-4, rtol=1e-4)


def test_broadcast_shapes_is_eagers():
    from lazy.lower.values import broadcast_shapes
    cases = [((2, 3), (3,)), ((1,), (4, 1, 5), (2, 1)), ((0, 1), (1, 3)), ((), (2, 2)), ((1, 0), (4, 1)), ((5,),)]
    for shapes in cases:
        assert broadcast_shapes(*shapes) == tuple(torch.broadcast_shapes(*shapes))
    for shapes in [((2, 3), (4,)), ((0,), (2,)), ((3, 2), (2, 3))]:
        with pytest.raises(ValueError):
            broadcast_shapes(*shapes)
        with pytest.raises(RuntimeError):
            torch.broadcast_shapes(*shapes)


@pytest.mark.parametrize("case", ["frac of int64", "abs of bool", "relu of bool", "sqrt of float"])
def test_dtypes_eager_rejects_stay_externs(case, cpu_backing):
    """Note [Dtypes eager rejects]: meta kernels accept frac of integers and abs/relu of bool, eager's CPU kernels
    raise; the compiled graph raises eager's error at the sync instead of computing a value."""
    x = torch.arange(-3, 3).reshape(2, 3)
    fn = {"frac of int64": lambda t: t.frac(), "abs of bool": lambda t: (t > 0).abs(),
          "relu of bool": lambda t: (t > 0).relu(), "sqrt of float": lambda t: (t * 1.5).abs().sqrt()}[case]
    with lazy.config.override(compiler="cpp"):
        metrics.reset()
        try:
            expected = fn(x)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)):
                fn(x.to("lazy")).cpu()
            assert sum(v for k, v in metrics.counters().items() if k.startswith("extern.")) == 1
        else:
            torch.testing.assert_close(fn(x.to("lazy")).cpu(), expected)
            assert not any(k.startswith("extern.") for k in metrics.counters())


def test_walks_are_kept_per_expression_without_cycles():
    """kir.walk is computed once per root (expressions are interned and immutable) and kept without the root, so an
    expression no longer used is freed by reference counting alone."""
    import gc
    import weakref

    from lazy.lower import kir
    i, j = kir.var("i", 7), kir.var("j", 5)
    root = kir.mk("mul", torch.float32, kir.mk("add", torch.float32, i, j), kir.mk("neg", torch.float32, i))
    first = kir.walk(root)
    assert first[-1] is root and set(first) == {i, j, root, *root.args}
    assert all(first.index(a) < first.index(e) for e in first for a in kir.children(e))  # children first
    assert kir.walk(root) == first and kir.walk(root) is not first
    assert set(kir.walk(root, stop={root.args[0]})) == {root.args[0], root.args[1], i, root}  # not into i + j
    gc.disable()
    try:
        ref = weakref.ref(root)
        del root, first
        assert ref() is None
    finally:
        gc.enable()


def test_strides_of_affine_indices_are_their_coefficients():
    """kir.stride reads an affine index's coefficient directly; it is what the substitution ``index(v + 1) -
    index(v)`` gives, for affine indices and for ones with divisions, remainders and loads."""
    from lazy.lower import kir

    def by_substitution(index, v):
        step = kir.iadd(kir.substitute(index, {v: kir.iadd(v, kir.const(1, kir.INDEX))}), kir.imul(index, -1))
        return step.args[0] if step.op == "const" else None

    i, j, k = kir.var("i", 6), kir.var("j", 10), kir.var("k", 4)
    buf = kir.Buffer(0, (60,), torch.int64)
    flat = kir.iadd(kir.imul(i, 10), j)
    indices = [flat, kir.iadd(kir.imul(i, -3), kir.const(7, kir.INDEX)), kir.const(5, kir.INDEX), k,
               kir.iadd(kir.imul(kir.ifloordiv(flat, 4), 4), kir.imod(flat, 4)), kir.imod(flat, 4),
               kir.iadd(kir.ifloordiv(j, 3), kir.imul(k, 2)), kir.iadd(kir.imul(k, 9), kir.imod(i, 4)),
               kir.iadd(kir.load(buf, [flat]), kir.imul(k, 3))]
    for index in indices:
        for v in (i, j, k):
            assert kir.stride(index, v) == by_substitution(index, v), (index, v)
    assert kir.stride(flat, i) == 10 and kir.stride(flat, j) == 1 and kir.stride(flat, k) == 0
    assert kir.stride(kir.imod(flat, 4), j) is None


def test_a_decomposition_without_runtime_scalars_is_traced_once(monkeypatch):
    """Note [Decompositions keep runtime scalars]: the second trace, with other sentinels, runs only where the node
    has runtime scalars (one without would be traced twice alike); results are eager's either way."""
    import lazy.lower.decompose as D
    traced = []
    inner = D._trace_once
    monkeypatch.setattr(D, "_MEMO", collections.OrderedDict())
    monkeypatch.setattr(D, "_trace_once", lambda node, *a, **k: traced.append(str(node.op)) or inner(node, *a, **k))
    x = torch.randn(5, 7)
    check(lambda x: [torch.log_softmax(x, 1)], x)
    assert traced == ["aten._log_softmax.default"]
    traced.clear()
    check(lambda x: [F.leaky_relu(x, 0.3)], x)
    assert traced.count("aten.leaky_relu.default") == 2 + len(D.SPECIAL_VALUES)


def test_the_decomposition_memo_keeps_the_latest_traces(monkeypatch):
    """A process meeting ever new shapes keeps the MEMO_SIZE most recently used traces, not all of them; results
    stay eager's."""
    import lazy.lower.decompose as D
    monkeypatch.setattr(D, "_MEMO", collections.OrderedDict())
    monkeypatch.setattr(D, "MEMO_SIZE", 3)
    graph_cache.clear()  # each graph below compiles (and lowers) here, whatever earlier tests compiled
    for n in range(2, 9):
        check(lambda x: [torch.log_softmax(x, 1)], torch.randn(n, 7))
        assert len(D._MEMO) <= 3
    keys = list(D._MEMO)
    # another graph with a node of the oldest kept shape: its trace is reused and becomes the latest
    check(lambda x: [torch.log_softmax(x, 1) * 2], torch.randn(keys[0][3][0][0][0], 7))
    assert list(D._MEMO)[-1] == keys[0]
