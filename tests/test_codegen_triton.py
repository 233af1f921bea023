"""The Triton renderer and runtime: kernels of every kind against eager on the backing device, kernel counts,
runtime scalars, fallback on what the renderer cannot express, and a training step.

On the cpu backing device the kernels run under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1 there);
with LAZY_BACKING_DEVICE=cuda they are compiled by Triton and compared against eager CUDA.
"""
import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_compiler")
DEVICE = lazy.config.backing_device


def run(fn, *inputs, **tol):
    """``fn`` on lazy copies of ``inputs`` in one graph, against eager on the backing device; returns (kernels
    launched, program)."""
    want = fn(*[x.to(DEVICE) for x in inputs])
    metrics.reset()
    got = fn(*[x.to("lazy") for x in inputs])
    got = [t.cpu() for t in (got if isinstance(got, (list, tuple)) else [got])]
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(g, w.cpu(), equal_nan=True, **tol)
    program = graph_cache.latest()
    assert program.backend == "triton" and metrics.counter("compile_fallback") == 0
    return metrics.counter("kernels_launched"), program


def chain(x):
    for i in range(200):
        x = [lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05][i % 5](x)
    return x


def test_200_op_chain_is_one_kernel_storing_only_its_output():
    kernels, program = run(chain, torch.randn(16, 16))
    assert kernels == 1 and program.num_kernels == 1
    assert len(re.findall(r"tl\.store\(", program.source)) == 1


def test_kernel_only_temporaries_share_one_arena():
    """Note [Temporaries in one allocation]: buffers only kernels read and write live at offsets of one allocation
    per run, reused by lifetime; graph outputs and extern inputs stay tensors of their own."""
    def f(x, w):
        a = x - x.mean(0)                    # column means: a temporary of the next kernel
        b = (a * a).sum(1, keepdim=True)     # row sums: another
        h = (a / (b + 1)).tanh() @ w         # the mm's input: a tensor of its own
        return h.softmax(-1), b.squeeze(1)

    x, w = torch.randn(64, 48), torch.randn(48, 32)
    for _ in range(3):  # cached runs reuse the layout; a CUDA graph replays it
        _, program = run(f, x, w, rtol=1e-4, atol=1e-5)
    assert program.arena_slots and program.arena_bytes > 0
    extern_read = {b for step in program.steps if step[0] == "extern" for b in step[1][4]}
    assert not extern_read & {i for i, *_ in program.arena_slots}
    assert not set(program.output_ids) & {i for i, *_ in program.arena_slots}


def test_pointwise_with_broadcasting_and_views():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 40, generator=g), torch.randn(40, generator=g)
    kernels, _ = run(lambda x, y: (x * y + y[:20].repeat(2)).t()[3:, ::2].exp() + y[::4].sum(), x, y)
    assert kernels <= 2
    xt = torch.randn(40, 16, generator=g).t()  # a transposed leaf
    run(lambda x, b: [x * b[:, None] - b[:, None].expand(16, 40).t().t(), torch.where(x > 0, x, b[:, None])], xt,
        torch.randn(16, generator=g))


def test_reductions_of_every_kind():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 33, generator=g)
    run(lambda x: [x.sum(1), x.mean(0), x.prod(1), x.amax(1), x.amin(0), x.var(1), x.std(0), x.sum(),
                   x.logsumexp(1)], x, rtol=1e-5, atol=1e-5)


def test_column_sums_are_tiled_and_long_rows_loop():
    g = torch.Generator().manual_seed(2)
    run(lambda x: [x.sum(0), x.amax(0), x.argmax(0)], torch.randn(300, 64, generator=g), rtol=1e-5, atol=1e-5)
    long = torch.randn(3, 20000, generator=g)
    kernels, program = run(lambda x: [x.softmax(-1), x.sum(1), x.argmin(1)], long, rtol=1e-5, atol=1e-5)
    assert "for r" in program.source  # a looped reduction: the rows are longer than a block holds


def test_softmax_and_layer_norm_are_one_kernel_each():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(32, 64, generator=g), torch.randn(64, generator=g), torch.randn(64, generator=g)
    assert run(lambda x: x.softmax(-1), x)[0] == 1
    assert run(lambda x: x.log_softmax(0), x)[0] <= 2
    assert run(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b, rtol=1e-5, atol=1e-5)[0] <= 2
    # softmax's exp(x - max) is computed once per element: the row is one block (Note [Triton kernel shapes])
    _, program = run(lambda x: x.softmax(-1), x)
    assert program.source.count("M.exp(") == 1


def test_arg_reductions_keep_the_first_index_nan_included():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 2.0, float("nan"), 5.0], [2.0, 2.0, 2.0, 2.0]])
    run(lambda x: [x.argmax(1), x.argmin(1), x.argmax(0), x.max(1).indices, x.min(1).values], x)
    i = torch.tensor([[3, 1, 3], [0, 0, -2]])
    run(lambda i: [i.argmax(1), i.argmin(0), (i > 0).to(torch.uint8).argmax(1)], i)


def test_mixed_dtypes():
    g = torch.Generator().manual_seed(4)
    i = torch.randint(-50, 50, (6, 7), generator=g)
    run(lambda i: [i.sum(1), i // 3, i % -3, torch.div(i, 4, rounding_mode="trunc"), i.amax(1), (i > 0).sum(),
                   (i > 0).any(1), i.to(torch.int8) * 5, i.to(torch.uint8), i.abs(), i << 2, i >> 1, ~i], i)
    h = torch.randn(16, 40, generator=g)
    run(lambda x: [x.softmax(-1), (x * 2).sin(), x.sum(1), F.gelu(x)], h.half(), rtol=2e-3, atol=2e-3)
    run(lambda x: [x.softmax(-1), x.float() + 1, x.exp(), x.amax(1)], h.bfloat16(), rtol=1.6e-2, atol=1e-2)
    f = torch.randn(5, 6, generator=g) * 3
    run(lambda x: [x.double().sum(1) * 1.5, (x > 0) & (x < 2), x.to(torch.int32) * 3 + 7, x.to(torch.bool),
                   torch.where(x > 0, x, 0.5), x.clamp(-0.5, 0.5), x.sign(), x.round(), torch.remainder(x, 0.7),
                   x.sigmoid(), x.abs().rsqrt(), torch.floor_divide(x, 0.3), x.tanh(), x.log1p().nan_to_num(0.0)],
        f)


def test_empty_and_indexed():
    run(lambda x: [x.sum(), x.sum(0), x * 2], torch.randn(0, 3))
    w = torch.randn(10, 4)
    run(lambda w, i: [F.embedding(i, w), w[i[0]], w.gather(0, i % 4)], w, torch.tensor([[1, 2], [9, 0]]))


def test_runtime_scalars_do_not_recompile():
    x = torch.randn(8, 8).to("lazy")
    lazy.mark_step()
    for lr in (0.1, 0.25, 0.5):
        y = (x * lr + 1.0 / 3).cpu()
        torch.testing.assert_close(y, x.cpu() * lr + 1.0 / 3)
    assert metrics.counter("graph_cache.miss") == 1 and metrics.counter("graph_cache.hit") == 2


def test_float32_kernels_take_their_float_scalars_as_float32():
    """Note [Scalars read as float32]: a float slot read only through a cast to float32 is a float32 argument; one
    float64 arithmetic reads stays float64; both compute eager's result (a scalar float32 cannot hold exactly)."""
    x32, x64 = torch.randn(8, 8), torch.randn(8, 8, dtype=torch.float64)
    _, program = run(lambda x: x * 1.1 + 1.0 / 3, x32)
    assert re.findall(r's\d+: "(\w+)"', program.source) == ["fp32", "fp32"]
    assert all(set(launch.scalar_types()) == {"fp32"} for launch in program.launches)
    _, program = run(lambda x, y: [x * 1.1, (y * 1.1).float() + x], x32, x64)
    # the two 1.1s are one slot, which float64 arithmetic reads too: float64
    assert re.findall(r"s\d+: \"(\w+)\"", program.source) == ["fp64"]
    _, program = run(lambda x: x.sum() * 1e-3 + x * 0.7, x32)
    assert set(re.findall(r's\d+: "(\w+)"', program.source)) == {"fp32"}


def test_what_the_renderer_cannot_express_falls_back_once():
    x = torch.rand(6, 6) + 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.special.digamma(x.to("lazy") * 2).cpu()
    torch.testing.assert_close(y, torch.special.digamma(x.to(DEVICE) * 2).cpu())
    msgs = [str(w.message) for w in caught if "triton backend" in str(w.message)]
    assert len(msgs) == 1 and "'digamma' has no Triton template" in msgs[0]
    assert metrics.counter("compile_fallback") == 1 and graph_cache.latest().backend == "reference"


def test_mlp_training_step_matches_eager():
    from models import MLP, batch, loss_fn

    def train(device, steps=4):
        torch.manual_seed(0)
        model = MLP().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for step in range(steps):
            x, y = batch("mlp", step, device)
            loss = loss_fn("mlp", model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if device == "lazy":
                lazy.mark_step()
            losses.append(loss.item())
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    want_losses, want = train(DEVICE)
    got_losses, got = train("lazy")
    assert metrics.counter("compile_fallback") == 0 and metrics.counter("kernels_launched") > 0
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mlp", "cnn", "encoder", "gpt"])
def test_training_parity_under_triton(kind):
    """test_training's models, 12 SGD steps on lazy with every graph compiled by Triton, against eager on the
    backing device (the parity bound of tests/test_training.py)."""
    from test_training import train

    want_losses, want_state = train(kind, "sgd", DEVICE, 12, eval_every=5)
    got_losses, got_state = train(kind, "sgd", "lazy", 12, eval_every=5)
    assert metrics.counter("compile_fallback") == 0 and metrics.counter("kernels_launched") > 0
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    for name, want in want_state.items():
        torch.testing.assert_close(got_state[name], want, rtol=1e-4, atol=1e-5, msg=name)


_TIERED = r"""
import time, torch, lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
x = torch.randn(64, 300).to("lazy")
lazy.mark_step()
want = torch.softmax(x.cpu(), -1) * 2
backends = []
start = time.perf_counter()
while True:
    y = (x.softmax(-1) * 2).cpu()
    torch.testing.assert_close(y, want)
    backends.append(graph_cache.latest()._bound is not None if graph_cache.latest().backend == "triton" else False)
    if backends[-1] or time.perf_counter() - start > 120:
        break
    time.sleep(0.05)
print("RESULT", len(backends), backends[-1], metrics.counter("triton.compiles"), metrics.counter("disk_cache.hit"),
      metrics.counter("warming_runs"))
"""


@pytest.mark.skipif(DEVICE == "cpu", reason="Triton compiles only for a GPU (the cpu runs kernels interpreted)")
def test_tiered_compiles_in_workers_then_a_second_process_compiles_nothing(tmp_path):
    """Under 'auto' the first runs do not wait for Triton: the graph runs on the reference executor while the pool
    compiles, then switches; a second process with the same cache loads the kernels and compiles nothing."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, LAZY_COMPILER="auto", LAZY_CACHE_DIR=str(tmp_path), LAZY_BACKING_DEVICE=DEVICE)
    results = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _TIERED], env=env, capture_output=True, text=True, timeout=300)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
        assert line, out.stderr[-3000:]
        results.append(line[0].split()[1:])
    (runs1, ok1, compiles1, _, warming1), (runs2, ok2, compiles2, hits2, warming2) = results
    assert ok1 == "True" and int(runs1) > 2 and int(compiles1) >= 1  # runs 1 and 2 on the reference executor
    assert float(warming1) == int(runs1) - 2  # run 1 before the tier-up, the last on the kernels
    assert ok2 == "True" and int(runs2) == 2 and compiles2 == "0" and int(hits2) >= 1 and float(warming2) == 0


def test_records_of_compiled_kernels_detect_corrupt_and_foreign_entries(tmp_path, monkeypatch):
    """Note [Triton compiles]: a record matches only its own source and unchanged kernel files; a corrupt one is
    counted, its kernels' cache directories removed (Triton rebuilds them) and the record dropped."""
    import hashlib
    import os

    from lazy.runtime import triton_build
    from triton.runtime.cache import _base32

    kernel = hashlib.sha256(b"kernel").hexdigest()
    infos = [{"hash": kernel, "name": "k0", "shared": 0, "num_warps": 4, "types": "OOdOO", "hidden": 2}]

    with lazy.config.override(cache_dir=str(tmp_path / "lazy")):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
        group = tmp_path / "triton" / _base32(kernel)
        group.mkdir(parents=True)
        (group / "k0.cubin").write_bytes(b"\x7fELF compiled")
        (group / "lock").write_bytes(b"")
        triton_build.write_record("key", "source", infos)
        assert oct(os.stat(tmp_path / "lazy").st_mode & 0o777) == "0o700"
        assert triton_build.read_record("key", "source", 1, 1) == (infos, None)
        assert triton_build.cubin(infos[0]) == str(group / "k0.cubin")
        assert triton_build.read_record("key", "another source", 1, 1) is None  # foreign: dropped, rebuilt
        assert not group.exists() and metrics.counter("disk_cache.corrupt") == 1
        group.mkdir()
        (group / "k0.cubin").write_bytes(b"\x7fELF compiled")
        triton_build.write_record("key", "source", infos, tuned=[1])
        assert triton_build.read_record("key", "source", 1, 1) == (infos, [1])
        assert triton_build.read_record("key", "source", 1, 2) == (infos, None)  # choices of another kernel count
        assert triton_build.read_record("key", "source", 2, 1) is None  # another number of launches: foreign
        group.mkdir()
        (group / "k0.cubin").write_bytes(b"\x7fELF compiled")
        triton_build.write_record("key", "source", infos)
        (group / "k0.cubin").write_bytes(b"\x7fELF truncat")  # corrupt
        assert triton_build.read_record("key", "source", 1, 1) is None
        assert metrics.counter("disk_cache.corrupt") == 3 and metrics.counter("disk_cache.hit") == 3


@pytest.mark.skipif(DEVICE != "cpu", reason="on cuda an index out of range is a device-side assert, as in eager, "
                    "which leaves the CUDA context unusable")
def test_an_index_out_of_range_raises_as_eager_does():
    w = torch.randn(10, 4)
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(torch.tensor([1, 12]).to("lazy"), w.to("lazy")).cpu()
    lazy.mark_step()
    run(lambda i, w: F.embedding(i, w), torch.tensor([1, 9]), w)


def test_indices_are_checked_only_in_lanes_that_hold_elements():
    """An index computed in a kernel (max's backward compares each position with the argmax) is checked where its
    loops hold elements: a masked lane's argmax over no element is 2^30 and raised a device-side assert."""
    def grads(x):
        out = [], []
        for which, fn in enumerate((torch.max, torch.min)):
            x = x.detach().requires_grad_()
            fn(x, 1)[0].sum().backward()
            out[which].append(x.grad)
        return out[0] + out[1]

    run(grads, torch.randn(5, 5, 5))
    if DEVICE == "cpu":  # a real one still raises (on cuda, a device-side assert: test_an_index_out_of_range_...)
        with pytest.raises(IndexError, match="index out of range"):
            F.embedding(torch.tensor([[1, 2, 3], [0, 12, 1]]).to("lazy"), torch.randn(10, 4).to("lazy")).cpu()
        lazy.mark_step()


def test_efficient_zero_tensors_are_zeros_in_kernels():
    """A double backward's zero gradients are ATen ZeroTensors, which have no storage: lowered as zeros."""
    def gradgrad(x):
        x = x.detach().requires_grad_()
        g, = torch.autograd.grad(F.softsign(x).sum(), x, create_graph=True)
        return torch.autograd.grad(g.sum(), x)[0]

    run(gradgrad, torch.randn(5, 5, dtype=torch.float64))


def test_max_and_min_against_constants_propagate_nan():
    """maximum/minimum/clamp/relu test an operand for NaN unless it is a constant other than NaN (log_sigmoid's
    backward compares two constants: Triton's interpreter rejected the scalar test or'ed with a block)."""
    x = torch.randn(20)
    x[3] = float("nan")
    for dev in ("lazy", DEVICE):
        t = x.to(dev).requires_grad_()
        F.logsigmoid(t).sum().backward()
        if dev == "lazy":
            got = t.grad.cpu()
    torch.testing.assert_close(got, t.grad.cpu(), equal_nan=True)
    run(lambda t: [t.clamp(min=0.0), t.relu(), torch.maximum(t, torch.tensor(float("nan"))),
                   t.clamp(max=float("nan"))], x)


def test_few_long_rows_are_split_reductions(monkeypatch):
    """Note [Split reductions]: a kernel of few long rows reduces chunks in many programs, then the partials (the
    thresholds scaled down 16x, so that the interpreter runs it quickly)."""
    from lazy.codegen import triton_split
    monkeypatch.setattr(triton_split, "SPLIT_MIN_ELEMS", triton_split.SPLIT_MIN_ELEMS // 16)
    monkeypatch.setattr(triton_split, "SPLIT_CHUNK", triton_split.SPLIT_CHUNK // 16)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4200, generator=g)

    def fn(x):
        return [x.sum(), x.amax(1), (x > 0).sum(1), (x[:, :4097] * 1e-2).exp().prod(1), x.double().mean(), x.var(1)]

    want = fn(x.to(DEVICE))
    got = fn(x.to("lazy"))
    metrics.reset()
    lazy.mark_step()
    program = graph_cache.latest()
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-4)
    assert program.backend == "triton" and metrics.counter("kernels_launched") == program.num_kernels
    parts = [launch for launch in program.launches if launch.name.endswith("p")]
    assert len(parts) >= 2 and "outer[k0_s<17]" in program.kernel_ir  # x.sum(): 17 chunks of one row ...
    assert "stage sum over [17]" in program.kernel_ir  # ... then their partials
    assert "stage sum over [4200]" in program.kernel_ir  # x.var(1): a stage reading another is not split


def test_few_long_columns_are_split_tiled_reductions():
    """Note [Split reductions]: column sums of few outputs over many rows (a LayerNorm's weight and bias
    gradients) reduce chunks of rows in many programs, then the partials, both kernels tiled."""
    g = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(4100, 72, generator=g), torch.randn(72, generator=g), torch.randn(72, generator=g)

    def grads(x, w, b):
        w, b = w.detach().requires_grad_(), b.detach().requires_grad_()
        y = F.layer_norm(x, (72,), w, b)
        return list(torch.autograd.grad(y.square().sum(), [w, b]))

    kernels, program = run(grads, x, w, b, rtol=1e-4, atol=1e-3)
    parts = [k for k in program.kernel_ir.split("kernel ")[1:] if k.split()[0].rstrip(":").endswith("p")]
    assert parts and all("tile=" in k for k in parts), program.kernel_ir
    kernels, program = run(lambda x: [x.sum(0), x.amax(0)], x, rtol=1e-5, atol=1e-4)
    assert "stage max over [16]" in program.kernel_ir  # 16 chunks of 257 rows, then their partials


def test_repeated_layers_share_one_function_per_distinct_kernel():
    """Note [One function per distinct kernel]: kernels that differ only in buffers and scalar slots (a model's
    repeated layers) are one function of the module, launched once per layer, with or without scalars in memory."""
    g = torch.Generator().manual_seed(7)
    x, ws = torch.randn(8, 16, generator=g), [torch.randn(16, 16, generator=g) for _ in range(3)]

    def layers(x, *ws):
        for i, w in enumerate(ws):
            x = (x @ w).relu() * (1.1 + i) + 0.3 * i
        return x

    kernels, program = run(layers, x, *ws, rtol=1e-5, atol=1e-5)
    assert kernels == 3 and len({launch.name for launch in program.launches}) == 1
    assert len(re.findall(r"^@_kernel", program.source, re.M)) == 1

    want = layers(*[t.to(DEVICE) for t in (x, *ws)]).cpu()
    f = lazy.compile(layers, mode="reduce-overhead")
    for _ in range(3):  # captured, then replayed: each layer reads its own scalars from its region
        torch.testing.assert_close(f(*[t.to("lazy") for t in (x, *ws)]).cpu(), want, rtol=1e-5, atol=1e-5)
    from lazy.capture.function import state_of
    memory = getattr(state_of(f).entries[0].program, "program", state_of(f).entries[0].program)
    assert memory.scalar_memory and len({launch.name for launch in memory.launches}) == 1


def test_without_the_disk_cache_a_process_keeps_one_temp_dir(tmp_path, monkeypatch):
    """With lazy's disk cache disabled, the graphs' Triton modules go to one temp dir of the process (removed at its
    exit), not one per graph."""
    import tempfile

    from lazy.runtime import triton_build
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(triton_build, "_PRIVATE", [])
    graph_cache.clear()
    with lazy.config.override(cache_dir=""):
        for scale in (1.5, 2.5):  # two graphs (the second multiplies twice), two modules
            run(lambda x: (x * scale).sin() if scale < 2 else (x * scale * scale).cos(), torch.randn(4, 4))
    made = os.listdir(tmp_path)
    assert len(made) == 1 and made[0].startswith("lazy-triton-")
    assert len([f for f in os.listdir(tmp_path / made[0]) if f.startswith("lz_")]) == 2


def test_pow_with_a_constant_exponent_is_eagers_arithmetic():
    """Note [Scalars that pick eager's kernel]: eager's special exponents are multiplications and divisions (and
    sqrt), bit for bit eager's for 2, 3 and -1; others call pow."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(5)) * 3
    for e in (2.0, 3.0, -1.0):
        _, program = run(lambda x: torch.pow(x, e), x, rtol=0, atol=0)
        assert "M.pow(" not in program.source
    _, program = run(lambda x: torch.pow(x.abs(), 2.5), x)
    assert "M.pow(" in program.source
