"""Fusion: kernel counts (asserted through lazy.metrics), no stored intermediates, horizontal fusion."""
import os
import importlib.util
import re

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.codegen import cpp as cpp_renderer
from lazy.debug import metrics


pytestmark = pytest.mark.usefixtures("cpp_compiler")


@pytest.fixture(params=["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"))])
def backend(request, tmp_path):
    """The kernel-count tests on both compilers (one schedule, two renderers): the cpp backend on the cpu, the
    Triton backend on the backing device (interpreted on the cpu)."""
    # the session's backing device (this module's cpp_compiler fixture pins the cpu in lazy.config)
    device = "cpu" if request.param == "cpp" else os.environ.get("LAZY_BACKING_DEVICE", "cpu")
    with lazy.config.override(compiler=request.param, backing_device=device, cache_dir=str(tmp_path)):
        yield request.param


STORE = {"cpp": r"\b(b\d+)\[[^\]]*\] = ", "triton": r"tl\.store\((b\d+)"}


def run(fn, *inputs):
    """Run ``fn`` lazily in one graph; returns (kernels, externs, program) and checks against eager."""
    want = fn(*inputs)
    lz = fn(*[x.to("lazy") for x in inputs])
    lazy.mark_step()
    metrics.reset()
    lz = fn(*[x.to("lazy") for x in inputs])
    lazy.mark_step()
    got = [t.cpu() for t in (lz if isinstance(lz, (list, tuple)) else [lz])]
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(g, w)
    program = graph_cache.latest()
    assert program.backend == lazy.config.compiler
    return metrics.counter("kernels_launched"), program.num_externs, program


def chain(x):
    for i in range(200):
        x = [lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05][i % 5](x)
    return x


def test_200_op_chain_is_one_kernel_without_stored_intermediates(backend):
    kernels, externs, program = run(chain, torch.randn(16, 16))
    assert (kernels, externs) == (1, 0)
    assert program.num_kernels == 1
    stores = re.findall(STORE[backend], program.source)
    # only the output is stored (by the cpp backend once per interleaved copy: Note [Interleaved copies] in
    # codegen/cpp.py): no fused intermediate touches memory
    assert len(set(stores)) == 1 and len(stores) in (1, cpp_renderer.INTERLEAVE)


def test_softmax_and_layer_norm_kernel_counts(backend):
    x = torch.randn(32, 64)
    assert run(lambda x: x.softmax(-1), x)[0] <= 2
    assert run(lambda x: x.log_softmax(0), x)[0] <= 2
    w, b = torch.randn(64), torch.randn(64)
    assert run(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b)[0] <= 2


def test_linear_relu_is_one_extern_and_one_kernel(backend):
    x, w, b = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    kernels, externs, program = run(lambda x, w, b: (x @ w + b).relu(), x, w, b)
    assert (kernels, externs) == (1, 1)
    kernels, externs, _ = run(lambda x, w, b: F.linear(x, w.t(), b).relu(), x, w, b)
    # NOTE: the transposed weight an extern reads is copied by one kernel today (views are not yet passed to
    # extern calls as strided tensors).
    assert externs == 1 and kernels <= 2


def test_pointwise_into_reduction_and_epilogue(backend):
    x = torch.randn(16, 32)
    kernels, _, program = run(lambda x: ((x * 2).exp().sum(1) + 1).sqrt(), x)
    assert kernels == 1
    kernels, _, _ = run(lambda x: x - x.mean(1, keepdim=True) / x.std(1, keepdim=True), x)
    assert kernels == 1


def test_horizontal_fusion_of_same_shape_outputs(backend):
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    kernels, _, _ = run(lambda x, y: [x * y, x + y, (x - y).exp()], x, y)
    assert kernels == 1


def test_broadcast_is_never_materialized(backend):
    x, b = torch.randn(64, 64), torch.randn(64)
    kernels, _, program = run(lambda x, b: x * b.expand(64, 64) + b[:, None], x, b)
    assert kernels == 1 and len(re.findall(STORE[backend], program.source)) == 1


def test_kernel_ir_is_dumped(tmp_path):
    with lazy.config.override(dump_dir=str(tmp_path)):
        x = torch.randn(4, 4).to("lazy")
        (x.exp() * 3).softmax(1).cpu()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 1 and names[0].endswith("_cpp.txt")
    text = (tmp_path / names[0]).read_text()
    assert "kernel k0" in text and "stage max" in text and 'extern "C"' in text


def _random_case(g):
    """A random shape (rank 0-4, dims from 0, 1 and small sizes) and two inputs over it: ``x`` laid out
    contiguous, transposed or sliced with a step; ``y`` broadcasting to it (size-1 and missing leading dims)."""
    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    rank = pick([0, 1, 2, 2, 3, 3, 4])
    shape = [pick([0, 1, 1, 2, 3, 5, 7, 8]) if pick([0] * 5 + [1]) else pick([1, 2, 3, 5, 7, 8]) for _ in range(rank)]
    layout = pick(["contiguous", "transposed", "strided"])
    if layout == "transposed":
        x = torch.randn(shape[::-1], generator=g).permute(list(range(rank - 1, -1, -1)))
    elif layout == "strided":
        x = torch.randn([2 * n for n in shape], generator=g)[tuple(slice(None, None, 2) for _ in shape)]
    else:
        x = torch.randn(shape, generator=g)
    y_shape = [1 if pick([0, 0, 1]) else n for n in shape][pick(list(range(rank + 1))):]
    y = torch.randn(y_shape, generator=g)
    return x, y


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_pointwise_chain_is_one_kernel(seed):
    """Pointwise chains over random shapes (0-size, 1-element, non-contiguous, broadcast): eager's values, one
    kernel, nothing stored but the output."""
    x, y = _random_case(torch.Generator().manual_seed(seed))
    kernels, externs, program = run(lambda x, y: ((x * y + 1.5).sigmoid() - y.abs()).clamp(-0.3, 0.9) * x, x, y)
    assert (kernels, externs) == (1, 0), (x.shape, x.stride(), y.shape)
    assert len(re.findall(r"\bb\d+\[[^\]]*\] = ", program.source)) == 1


@pytest.mark.parametrize("seed", range(6))
def test_random_shapes_reductions_and_epilogues(seed):
    """Reductions, softmax and broadcast epilogues fused over random shapes and layouts, int and bool too: eager's
    values (float sums accumulate in double: within assert_close's float32 tolerance), no fallback."""
    g = torch.Generator().manual_seed(100 + seed)
    x, y = _random_case(g)
    nonempty = x.numel() > 0
    dim = int(torch.randint(max(x.dim(), 1), (1,), generator=g)) if x.dim() else 0

    def fn(x, y):
        a = (x * y).exp() - y
        outs = [a.sum(dim, keepdim=True), a - a.mean(dim, keepdim=True), a.softmax(dim), x.sum() + y.sum(),
                (a > 0).sum(dim), torch.where(a > 0.5, x, y) * 2, (x * 10).to(torch.int64) // 3,
                (x * 10).to(torch.int64) % -3, (x > y).logical_and(x < 1)]
        if nonempty or x.dim() == 0:
            outs += [a.amax(dim), a.log_softmax(dim)]
        if x.dim() >= 2:
            outs += [a.transpose(0, -1).sum(0), (a.transpose(0, 1) * 2).contiguous()]
        return outs

    run(fn, x, y)
    assert metrics.counter("compile_fallback") == 0


def test_expensive_shared_value_is_stored_once():
    # gelu(tanh)'s backward feeds a transposed matmul operand and a bias-gradient reduction: recomputing its tanh
    # in each consumer (one of them a scalar reduction loop) cost 4x storing it once (lower.recompute_cost).
    x, g = torch.randn(64, 32), torch.randn(64, 32)

    def fn(x, g):
        d = torch.ops.aten.gelu_backward(g, x, approximate="tanh")
        return [d.t() @ x, d.sum(0)]

    kernels, externs, program = run(fn, x, g)
    assert externs == 1
    assert len(re.findall(r"= lz_tanh\(", program.source)) == 1  # one evaluation site, not one per consumer
    from lazy.lower import kir
    from lazy.lower.graph import SHARED_INLINE_LIMIT, recompute_cost
    v = kir.var("v", 8)
    cheap = kir.op("add", torch.float32, kir.load(kir.Buffer(0, (8,), torch.float32), [v]), kir.const(1, torch.float32))
    assert recompute_cost(cheap) < SHARED_INLINE_LIMIT < recompute_cost(kir.op("tanh", torch.float32, kir.op(
        "exp", torch.float32, cheap)))


def test_column_reductions_are_tiled():
    """Note [Column reductions are tiled]: a kernel whose reduced loop is strided and whose output loop is
    contiguous runs its output loop in blocks (``tile``); row reductions are not tiled; one kernel either way."""
    x, w = torch.randn(300, 37), torch.randn(300)

    def tile_of(fn, *inputs):
        kernels, externs, program = run(fn, *inputs)
        assert (kernels, externs) == (1, 0)
        first = program.kernel_ir.splitlines()[0]
        return first.split(" tile=")[1] if " tile=" in first else None

    assert tile_of(lambda x: x.sum(0), x) == "x0"
    assert tile_of(lambda x, w: (x * w[:, None]).sum(0), x, w) == "x0"  # w[r] is contiguous in r: x decides
    assert tile_of(lambda x: x.softmax(0), x) is not None
    assert tile_of(lambda x: x.t().sum(1), x) is not None  # a row sum of a transposed input
    assert tile_of(lambda x: x.sum(1), x) is None
    assert tile_of(lambda x: x.softmax(-1), x) is None
    assert tile_of(lambda x: x.sum(), x) is None
    # the bias gradient of a fused q/k/v projection: the cat of three [B, H, T, D] grads, as [B*T, 3*H*D], summed
    # over its rows; the cat's index moves by one along its columns except where a piece or a head ends (Note
    # [Probed strides] in lower/kir.py)
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    cat = lambda q, k, v: torch.cat([t.transpose(1, 2) for t in (q, k, v)], -1).reshape(16, 36).sum(0)  # noqa: E731
    assert tile_of(cat, q, k, v) == "x0"


def test_equal_reductions_run_once():
    """Note [Equal reductions are one object]: layer_norm's mean (its var_mean sums x for the variance and again for
    the mean) is one stage, so its kernel makes two passes over each row, not three; reductions that differ in the
    dim they reduce (a square input: same shapes), their input, their body or their kind stay apart."""
    x, w, b = torch.randn(32, 64), torch.randn(64), torch.randn(64)
    kernels, _, program = run(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b)
    assert kernels == 1 and program.kernel_ir.count(" stage ") == 2, program.kernel_ir
    sq, y = torch.randn(48, 48), torch.randn(48, 48)

    def fn(sq, y):
        return [sq.sum(1), sq.sum(0), y.sum(1), (sq * 2).sum(1), sq.amax(1), sq.sum(1) + sq.mean(1), sq.var(1)]

    _, _, program = run(fn, sq, y)
    stages = re.findall(r" stage (\w+) over", program.kernel_ir)
    # sum(1) once for the first, sixth and seventh outputs (the mean and the variance's mean are the same sum);
    # sum(0), y's, (sq * 2)'s, the max and the variance's sum of squares: one each
    assert sorted(stages) == ["max"] + ["sum"] * 5, program.kernel_ir


def test_stage_values_kept_for_the_stores(monkeypatch, tmp_path):
    """Note [Stage values kept for the stores]: softmax's exp(x - max) is computed once per element, in the sum's
    stage, and the store reads it back: eager's values, and bit for bit those of recomputing it (keep_bytes=0). Over
    two reduced dims the kept values are indexed as the inner loops are. Nothing is kept where the store reads exp at
    other indices (flip), beyond keep_bytes (rows of 5000 floats), or in a tiled kernel (softmax over dim 0)."""
    from lazy.codegen import cpp
    from lazy.schedule import Limits
    x, y = torch.randn(6, 300), torch.randn(4, 8, 30)

    def fn(x, y):
        return [x.softmax(-1), (y.exp() / y.exp().sum((1, 2), keepdim=True)) * 2]

    kernels, _, program = run(fn, x, y)
    kept = [line for line in program.kernel_ir.splitlines() if "(keeps" in line]
    assert kept == [" stage sum over [300] (keeps exp):", " stage sum over [8, 30] (keeps exp):"], program.kernel_ir
    assert len(re.findall(r"= lz_exp\(", program.source)) == 2  # one evaluation site per kernel
    got = [t.cpu() for t in fn(x.to("lazy"), y.to("lazy"))]
    monkeypatch.setattr(cpp, "LIMITS", Limits(cpp.LIMITS.max_buffers, cpp.LIMITS.parallel_threshold, keep_bytes=0))
    graph_cache.clear()
    with lazy.config.override(cache_dir=str(tmp_path)):
        _, _, program = run(fn, x, y)
        assert "(keeps" not in program.kernel_ir and len(re.findall(r"= lz_exp\(", program.source)) == 4
        recomputed = [t.cpu() for t in fn(x.to("lazy"), y.to("lazy"))]
    assert all(torch.equal(a, b) for a, b in zip(got, recomputed))
    monkeypatch.undo()
    graph_cache.clear()
    for f, args in ((lambda x: x.flip(1).exp() / x.exp().sum(1, keepdim=True), (x,)),
                    (lambda x: x.softmax(-1), (torch.randn(3, 5000),)), (lambda x: x.softmax(0), (x,))):
        _, _, program = run(f, *args)
        assert "(keeps" not in program.kernel_ir, program.kernel_ir


def test_reductions_shared_by_kernels_are_stored_once():
    """Note [Reductions shared by kernels are stored once]: batch_norm_backward (odd sizes) sums dy and
    dy * (x - mean) over (N, H, W) for grad_input and for the weight and bias gradients; each sum runs as a stage of
    one kernel only, its loops over H and W merged into one (Note [Contiguous loops are merged]) and the two sums in
    one loop nest (Note [Sibling stages share their loop])."""
    torch.manual_seed(0)
    x, dy, w = torch.randn(5, 3, 7, 9), torch.randn(5, 3, 7, 9), torch.randn(3)
    mean, invstd = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt()

    def fn(dy, x, w, mean, invstd):
        return list(torch.ops.aten.native_batch_norm_backward(dy, x, w, None, None, mean, invstd, True, 1e-5,
                                                              [True, True, True]))

    _, externs, program = run(fn, dy, x, w, mean, invstd)
    assert externs == 0
    assert program.kernel_ir.count(" stage sum over [5, 7, 9]") == 2, program.kernel_ir
    assert len(re.findall(r"for \(int64_t (r\w+) = 0; \1 < 5;", program.source)) == 1, program.source
    assert re.search(r"for \(int64_t (r\w+k) = 0; \1 < 63;", program.source), program.source


def test_contiguous_loops_are_merged():
    """Note [Contiguous loops are merged]: sum over (0, 2, 3) of an NCHW tensor reduces N and one loop of H * W;
    a pointwise kernel over a contiguous tensor is one loop; a transposed read keeps its loops apart."""
    x = torch.randn(5, 3, 7, 9)
    _, _, program = run(lambda x: x.sum((0, 2, 3)), x)
    assert re.search(r"for \(int64_t (r\w+k) = 0; \1 < 63;", program.source), program.source
    _, _, program = run(lambda x: x * 2 + 1, x)
    assert program.kernel_ir.splitlines()[0].count("<") == 1 and "<945]" in program.kernel_ir.splitlines()[0]
    _, _, program = run(lambda x: x.transpose(2, 3) * 2 + 1, x)
    assert program.kernel_ir.splitlines()[0].count("<") == 3, program.kernel_ir
    _, _, program = run(lambda w: w * 0.9 + 0.1, torch.randn(6, 1, 3, 3))  # a loop of one iteration is dropped
    assert program.kernel_ir.splitlines()[0].count("<") == 1 and "<54]" in program.kernel_ir.splitlines()[0]
    torch.testing.assert_close(x.sum(0).to("lazy").cpu(), x.sum(0))


def test_a_matmul_input_is_stored_in_its_producers_order(backend):
    """Note [Matmul inputs in their producer's layout]: the weight gradient of a fused q/k/v projection multiplies
    the transpose of the cat of three [B, H, T, D] grads; the cat is stored as eager stores it, [B*T, 3*H*D] (its
    loads adjacent along the columns), and mm reads the transpose view, as eager's does."""
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    x = torch.randn(16, 5)

    def weight_grad(q, k, v, x):
        grad = torch.cat([t.transpose(1, 2) for t in (q, k, v)], -1).reshape(16, 36)
        return grad.t() @ x

    kernels, externs, program = run(weight_grad, q, k, v, x)
    assert (kernels, externs) == (1, 1)
    assert "store buf" in program.kernel_ir and " [16, 36]:" in program.kernel_ir, program.kernel_ir
    # a transposed product is stored in its operand's order; an input adjacent along its last dim keeps its order
    a, b = torch.randn(7, 6), torch.randn(7, 3)
    assert " [7, 6]:" in run(lambda a, b: (a * 2).t() @ b, a, b)[2].kernel_ir
    assert " [6, 7]:" in run(lambda a, b: (a * 2) @ b, a.t().contiguous(), b)[2].kernel_ir


def test_an_extern_input_is_stored_once(backend):
    """Note [Extern inputs are stored once]: gelu's output, read by the next layer's matmul and (transposed) by its
    weight gradient, is stored once for both."""
    g = torch.Generator().manual_seed(5)
    x, w1, w2, dy = (torch.randn(*s, generator=g) for s in ((12, 8), (8, 16), (16, 4), (12, 4)))

    def mlp(x, w1, w2, dy):
        h = F.gelu(x @ w1, approximate="tanh")
        return h @ w2, h.t() @ dy

    kernels, externs, program = run(mlp, x, w1, w2, dy)
    assert (kernels, externs) == (1, 3) and program.kernel_ir.count(" store ") == 1, program.kernel_ir
