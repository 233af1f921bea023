"""Training loops on the lazy device give eager's numbers, and settle into one cached graph per step."""
import gc
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.device.tensor import live_storages

from models import MODELS, GPT2Like, batch, loss_fn

L = "lazy"
# Parity is against eager on the backing device: the same kernels, so float32 tolerances hold even for AdamW,
# which amplifies the rounding noise of zero-gradient biases (eager cuda vs eager cpu would differ there too).
EAGER = str(lazy.sync.backing_device())

OPTIMIZERS = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=3e-3, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=3e-3, weight_decay=1e-4, **k),
    "rmsprop": lambda p, **k: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=1e-2, **k),
}


def train(kind, opt_name, device, steps, foreach=None, eval_every=0):
    torch.manual_seed(0)
    model = MODELS[kind]().to(device)
    kwargs = {} if foreach is None else {"foreach": foreach}
    opt = OPTIMIZERS[opt_name](model.parameters(), **kwargs)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
    losses = []
    for step in range(steps):
        x, y = batch(kind, step, device)
        model.train()
        loss = loss_fn(kind, model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if device == L:
            lazy.mark_step()
        losses.append(loss.item())
        if eval_every and step % eval_every == eval_every - 1:
            model.eval()
            with torch.no_grad():
                losses.append(loss_fn(kind, model(x), y).item())
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return losses, state


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_parity_with_eager(kind, opt_name):
    if EAGER != "cpu" and opt_name == "adamw" and kind != "mlp":
        pytest.xfail("on cuda, eager picks cudnn batch norm and fused attention kernels that lazy does not mirror "
                     "yet; AdamW amplifies their rounding differences on zero-gradient biases")
    want_losses, want_state = train(kind, opt_name, EAGER, 20, eval_every=7)
    # NOTE: the reference executor's parity, whatever LAZY_COMPILER says (the cpp compiler's has its own test). It
    # runs eager's kernels at eager's thread count: asynchronous execution would run a mark_step's program on one
    # thread fewer (Note [Thread budget of the worker]), whose reductions round differently, which AdamW amplifies
    # on the gradient-free parameters (GRADIENT_FREE).
    with lazy.config.override(compiler="reference", async_execution=False):
        got_losses, got_state = train(kind, opt_name, L, 20, eval_every=7)
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    for name, want in want_state.items():
        torch.testing.assert_close(got_state[name], want, rtol=1e-4, atol=1e-5, msg=name)


# Under the cpp compiler (test_parity_with_eager_cpp): parameters whose exact gradient is zero, and the slice of
# each that is. A bias feeding batch norm is subtracted again by the normalization; the key part of an attention
# in-projection bias adds q.b_k, constant along each softmax row. Their computed gradients are rounding noise that
# AdamW divides by its own running RMS (also noise), so each step moves them by up to ~lr in a direction the noise
# picks: two correct implementations that round differently disagree there by up to lr * steps (eager cuda vs
# eager cpu would too). A batch norm's running mean tracks such a bias, and eval losses read the running mean.
GRADIENT_FREE = {
    "cnn": {"conv1.bias": slice(None), "conv2.bias": slice(None), "bn1.running_mean": slice(None),
            "bn2.running_mean": slice(None)},
    "encoder": {"layer.self_attn.in_proj_bias": slice(16, 32)},
    "gpt": {"blocks.0.qkv.bias": slice(16, 32)},
    "gpt2": {f"h.{i}.c_attn.bias": slice(16, 32) for i in range(2)},
}
CPP_STEPS, CPP_EVAL_EVERY = 20, 7


def _cpp_parity(kind, opt_name, tmp_path):
    """Train ``kind`` 20 steps on eager cpu and on lazy with the cpp compiler; compare losses and state.

    Tolerance: the compiled kernels round differently from eager's only where they reassociate float sums
    (fused reductions accumulate in double and round once; eager sums float32 in vectorized/pairwise order) and
    where a decomposition (torch._decomp) orders a backward formula differently: a few float32 ulps per op, which
    20 training steps grow to ~1e-6 (measured: losses within 5e-7, parameters within 1e-6). The bound asserted,
    rtol=1e-4 and atol=1e-5, is the reference executor's parity bound. With AdamW, the gradient-free parameter
    slices of GRADIENT_FREE (and the eval losses that read batch-norm running means) are held to AdamW's own
    bound instead: each step moves a parameter by at most ~lr, so they agree within lr * steps."""
    want_losses, want_state = train(kind, opt_name, EAGER, CPP_STEPS, eval_every=CPP_EVAL_EVERY)
    graph_cache.clear()  # graphs compiled by earlier tests (under LAZY_COMPILER=cpp) would leave nothing to compile
    with lazy.config.override(compiler="cpp", backing_device="cpu", cache_dir=str(tmp_path)):
        got_losses, got_state = train(kind, opt_name, L, CPP_STEPS, eval_every=CPP_EVAL_EVERY)
    assert metrics.counter("compile_fallback") == 0 and metrics.counter("kernels_compiled") > 0
    free = GRADIENT_FREE.get(kind, {}) if opt_name == "adamw" else {}
    bound = 3e-3 * CPP_STEPS  # AdamW's lr (OPTIMIZERS) times the steps
    evals = {s + 1 + s // CPP_EVAL_EVERY for s in range(CPP_STEPS) if s % CPP_EVAL_EVERY == CPP_EVAL_EVERY - 1}
    for i, (got, want) in enumerate(zip(got_losses, want_losses)):
        loose = i in evals and any("running_mean" in k for k in free)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=bound if loose else 1e-5,
                                   msg=lambda m: f"loss {i}: {m}")
    _assert_state_close(got_state, want_state, free, bound)


def _assert_state_close(got_state, want_state, free, bound):
    """Parameters and buffers within the parity bound; the gradient-free slices ``free`` within AdamW's ``bound``."""
    for name, want in want_state.items():
        got = got_state[name].clone()
        if name in free:
            part = free[name]
            torch.testing.assert_close(got[part], want[part], rtol=0, atol=bound, msg=name)
            got[part] = want[part]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_parity_with_eager_cpp_mlp(opt_name, tmp_path):
    _cpp_parity("mlp", opt_name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", sorted(set(MODELS) - {"mlp"}))
def test_parity_with_eager_cpp(kind, opt_name, tmp_path):
    _cpp_parity(kind, opt_name, tmp_path)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_optimizers_match_eager(opt_name, foreach):
    want, want_state = train("mlp", opt_name, EAGER, 6, foreach=foreach)
    got, got_state = train("mlp", opt_name, L, 6, foreach=foreach)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for name, w in want_state.items():
        torch.testing.assert_close(got_state[name], w, rtol=1e-4, atol=1e-5)


def test_steady_state_compiles_stop():
    torch.manual_seed(0)
    model = MODELS["mlp"]().to(L)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=30)
    compiles = []
    for step in range(30):
        x, y = batch("mlp", step, L)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        lazy.mark_step()
        compiles.append(metrics.counter("compiles"))
    assert compiles[-1] <= 3
    assert compiles[-1] == compiles[2], compiles


def test_memory_flat_over_many_steps():
    """1000 steps: live lazy storages and graph-cache entries stay flat (benchmarks/memory.py shows RSS)."""
    from lazy.cache import graph_cache
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(L)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 4).to(L), torch.randint(0, 2, (8,)).to(L)
    counts = []
    for step in range(1000):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lazy.mark_step()
        if step % 250 == 249:
            gc.collect()
            counts.append((len(live_storages()), graph_cache.size(), metrics.counter("compiles")))
    # flat from the second count on; the first may be higher on cuda, where the step's Triton kernels may still be
    # compiling (tiered: Note [Triton compiles]) and the reference executor's run holds more storages
    assert counts[-1] == counts[1] and counts[1] <= counts[0], counts


def test_batchnorm_running_stats_once_per_step():
    torch.manual_seed(0)
    bn_cpu = nn.BatchNorm1d(4)
    bn_lazy = nn.BatchNorm1d(4).to(L)
    for step in range(3):
        x = torch.randn(8, 4) * (step + 1)
        bn_cpu(x)
        bn_lazy(x.to(L))
        lazy.mark_step()
    torch.testing.assert_close(bn_lazy.running_mean.cpu(), bn_cpu.running_mean)
    torch.testing.assert_close(bn_lazy.running_var.cpu(), bn_cpu.running_var)
    assert bn_lazy.num_batches_tracked.item() == 3
    bn_cpu.eval()
    bn_lazy.eval()
    x = torch.randn(5, 4)
    torch.testing.assert_close(bn_lazy(x.to(L)).cpu(), bn_cpu(x))


def test_dropout_reproducible_under_seed():
    x = torch.ones(1000, device=L)
    torch.manual_seed(3)
    a = F.dropout(x, 0.5, training=True).cpu()
    torch.manual_seed(3)
    b = F.dropout(x, 0.5, training=True).cpu()
    torch.testing.assert_close(a, b)
    assert set(a.unique().tolist()) == {0.0, 2.0} and 400 < (a == 0).sum().item() < 600
    torch.testing.assert_close(F.dropout(x, 0.5, training=False).cpu(), torch.ones(1000))


def test_autograd_features():
    xc = torch.randn(4, 3, requires_grad=True)
    xl = xc.detach().to(L).requires_grad_()
    for x in (xc, xl):
        y = (x.sin() * x).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        x.gg = gg
        z = (x ** 2).sum()
        z.backward(retain_graph=True)
        z.backward()  # accumulates
        seen = []
        h = x.register_hook(lambda grad: seen.append(grad.shape) or grad * 0)
        (x * 3).sum().backward()
        h.remove()
        x.seen = seen
    torch.testing.assert_close(xl.gg.cpu(), xc.gg)
    torch.testing.assert_close(xl.grad.cpu(), xc.grad)
    assert xl.seen == xc.seen == [torch.Size([4, 3])]
    with torch.no_grad():
        assert not (xl * 2).requires_grad
    with torch.inference_mode():
        assert not (xl * 2).requires_grad
    assert not xl.detach().requires_grad


def test_grad_accumulation_micro_batches():
    for device in ("cpu", L):
        torch.manual_seed(0)
        model = MODELS["mlp"]().to(device)
        for micro in range(3):
            x, y = batch("mlp", micro, device)
            (F.cross_entropy(model(x), y) / 3).backward()
        if device == "cpu":
            want = [p.grad.clone() for p in model.parameters()]
        else:
            lazy.mark_step()
            for p, w in zip(model.parameters(), want):
                torch.testing.assert_close(p.grad.cpu(), w)


def test_optimizer_state_dict_save_reload(tmp_path):
    torch.manual_seed(0)
    model = MODELS["mlp"]().to(L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        x, y = batch("mlp", step, L)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        lazy.mark_step()
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    sd = torch.load(tmp_path / "opt.pt")
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt2.load_state_dict(sd)
    s1, s2 = opt.state_dict()["state"][0], opt2.state_dict()["state"][0]
    torch.testing.assert_close(s2["exp_avg"].cpu(), s1["exp_avg"].cpu())


def test_bad_input_raises_at_the_op_and_state_survives():
    torch.manual_seed(0)
    model = MODELS["mlp"]().to(L)
    before = [p.detach().cpu() for p in model.parameters()]
    with pytest.raises(RuntimeError):
        model(torch.randn(4, 7).to(L))  # wrong feature size
    with pytest.raises(RuntimeError, match="same device"):
        model(torch.randn(4, 20))  # a cpu tensor into a lazy model
    with pytest.raises(RuntimeError):
        F.cross_entropy(model(torch.randn(4, 20).to(L)), torch.zeros(4).to(L))  # float targets of wrong shape
    lazy.mark_step()
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), b)
    x, y = batch("mlp", 0, L)
    F.cross_entropy(model(x), y).backward()
    lazy.mark_step()


class Conv1dRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = F.silu(self.bn(self.conv(x))).transpose(1, 2)
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.out(F.softmax(h, -1) + F.log_softmax(h, -1))


def test_conv1d_mha_softmax_mse_parity():
    results = []
    for device in ("cpu", L):
        torch.manual_seed(0)
        model = Conv1dRegressor().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for step in range(5):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(4, 3, 7, generator=g).to(device), torch.randn(4, 7, 2, generator=g).to(device)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if device == L:
                lazy.mark_step()
            losses.append(loss.item())
        results.append((losses, [p.detach().cpu() for p in model.parameters()]))
    torch.testing.assert_close(torch.tensor(results[1][0]), torch.tensor(results[0][0]), rtol=1e-4, atol=1e-5)
    for got, want in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _train_gpt2(device, steps, dropout, seed=0):
    """GPT2Like trained with AdamW; losses and final parameters on the cpu."""
    torch.manual_seed(seed)
    model = GPT2Like(dropout=dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for step in range(steps):
        x, y = batch("gpt", step, device)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device == L:
            lazy.mark_step()
        losses.append(loss.item())
    assert model.lm_head.weight is model.wte.weight
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_gpt2_block_parity():
    """GPT-2's attention as Hugging Face writes it (SDPA with ``scale=``, dropout 0.0, a tied head) trains as eager
    does, with AdamW, under both executors: SDPA's recorded kernel takes a keyword scalar beside its seed."""
    if EAGER != "cpu":
        pytest.xfail("on cuda, eager picks fused attention kernels that lazy does not mirror yet; AdamW amplifies "
                     "their rounding differences")
    steps = 8
    want_losses, want_state = _train_gpt2(EAGER, steps, dropout=0.0)
    for compiler in ("reference", "cpp"):
        # the reference executor at eager's thread count (test_parity_with_eager says why)
        with lazy.config.override(compiler=compiler, async_execution=compiler == "cpp"):
            got_losses, got_state = _train_gpt2(L, steps, dropout=0.0)
        torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
        # The reference executor runs eager's kernels: exact but for the last bits; the compiled kernels round
        # differently, which AdamW amplifies on the gradient-free key bias (GRADIENT_FREE).
        free = GRADIENT_FREE["gpt2"] if compiler == "cpp" else {}
        _assert_state_close(got_state, want_state, free, 3e-3 * steps)


def test_gpt2_block_with_dropout(cpu_backing):
    """With dropout 0.1 (attention and residual), lazy's random numbers are its own (as CUDA's are), so the check is:
    both executors draw the same masks from the same seed, a seed reproduces a run, another seed changes it, and the
    model learns. On the cpu, where both executors run."""
    with lazy.config.override(compiler="reference"):
        ref_losses, ref_state = _train_gpt2(L, 6, dropout=0.1)
        again, _ = _train_gpt2(L, 6, dropout=0.1)
        other, _ = _train_gpt2(L, 6, dropout=0.1, seed=1)
    with lazy.config.override(compiler="cpp"):
        cpp_losses, cpp_state = _train_gpt2(L, 6, dropout=0.1)
    assert ref_losses == again
    assert other != ref_losses
    torch.testing.assert_close(torch.tensor(cpp_losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
    _assert_state_close(cpp_state, ref_state, GRADIENT_FREE["gpt2"], 3e-3 * 6)
    no_dropout, _ = _train_gpt2("cpu", 6, dropout=0.0)
    assert ref_losses[-1] < ref_losses[0] and all(math.isfinite(v) for v in ref_losses)
    assert ref_losses != no_dropout  # dropout did act


def test_nanogpt_loop_body_under_lazy_compile_replays_as_eager():
    """nanoGPT's train.py step as a user wraps it in ``@lazy.compile``: a disabled GradScaler (the cpu's), gradient
    clipping, the learning rate set on the param groups outside the step, zero_grad(set_to_none=True). Captured once,
    each replay checked against a plain run, losses equal to eager's."""
    def run(device, compiled):
        torch.manual_seed(0)
        model = MODELS["gpt"]().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        scaler = torch.amp.GradScaler("cpu", enabled=False)

        def step(x, y):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        if compiled:
            step = lazy.compile(step)
        losses = []
        for it in range(6):
            for group in opt.param_groups:
                group["lr"] = 1e-3 * (it + 1) / 6  # nanoGPT's get_lr, outside the step
            x, y = batch("gpt", it, "cpu")
            losses.append(step(x.contiguous().to(device), y.contiguous().to(device)).item())
        return losses

    want = run(EAGER, False)
    with lazy.config.override(capture_verify=True):
        got = run("lazy", True)
    lazy.compile.reset()
    assert metrics.counter("capture.replays") >= 4
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
