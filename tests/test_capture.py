"""lazy.compile: capture once, replay under guards, never unsoundly (lazy/capture/).

Every replay is checked against eager, or against a plain lazy run of the same function; counters prove what
happened (captures, replays, guard misses, breaks).
"""
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy
from lazy.capture.function import state_of
from lazy.capture.session import CaptureBreak
from lazy.debug.metrics import counter

from models import MODELS, batch, loss_fn

pytestmark = pytest.mark.usefixtures("capture_verified")

L = "lazy"


def plain_copy(fn):
    """Another function of ``fn``'s code: it stays plain when ``fn`` is compiled (``lazy.compile(fn) is fn``)."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


# ---------------------------------------------------------------------------------------------------------------
# Replays equal eager

def test_a_function_replays_and_equals_eager():
    @lazy.compile
    def f(x, y, alpha):
        return (x * alpha + y).relu().sum(dim=1)

    for i in range(5):
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        out = f(x.to(L), y.to(L), 0.5 + i)  # a runtime scalar: no recompile
        torch.testing.assert_close(out.cpu(), (x * (0.5 + i) + y).relu().sum(dim=1))
    assert counter("capture.captures") == 1 and counter("capture.replays") == 4


def _optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    return torch.optim.AdamW(params, lr=3e-3)


def _train(kind, opt_name, device, steps, compiled):
    torch.manual_seed(0)
    model = MODELS[kind]().to(device)
    opt = _optimizer(opt_name, model.parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)

    def step(model, opt, sched, x, y):
        model.train()
        loss = loss_fn(kind, model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss.detach()

    fn = lazy.compile(step) if compiled else step
    losses = []
    for s in range(steps):
        x, y = batch(kind, s, device)
        loss = fn(model, opt, sched, x, y)
        if device == L and not compiled:
            lazy.mark_step()
        losses.append(loss.item())
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    steps_taken = [opt.state[p]["step"] for p in model.parameters()] if opt_name == "adamw" else []
    return losses, state, [float(t) for t in steps_taken], opt.param_groups[0]["lr"], fn


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_training_step_replays_as_eager(kind, opt_name, cpu_backing):
    """20 steps of a whole training step (forward, backward, clipping, optimizer, cosine schedule) captured once and
    replayed: on the reference executor, the same numbers as 20 plain lazy steps to the bit (the replay runs the
    graph the plain steps record; every sync on all threads, as a mark_step's would not be under asynchronous
    execution: Note [Thread budget of the worker]), and eager's within the parity bound of tests/test_training.py;
    the optimizer's step counters and the learning rate exactly."""
    want = _train(kind, opt_name, "cpu", 20, compiled=False)
    with lazy.config.override(compiler="reference", async_execution=False):
        plain = _train(kind, opt_name, L, 20, compiled=False)
        lazy.metrics.reset()
        got = _train(kind, opt_name, L, 20, compiled=True)
    fn = state_of(got[4])
    assert fn.broken is None or fn.broken.transient, fn.broken
    assert counter("capture.replays") >= 17, lazy.metrics.counters()
    assert got[0] == plain[0]
    for name, w in plain[1].items():
        torch.testing.assert_close(got[1][name], w, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(want[0]), rtol=1e-4, atol=1e-5)
    for name, w in want[1].items():
        torch.testing.assert_close(got[1][name], w, rtol=1e-4, atol=1e-5, msg=name)
    assert got[2] == want[2] and got[3] == want[3]
    if opt_name == "adamw":  # its step counters: Note [Host step counters in C] (csrc/replay_io.cpp)
        assert any("_host_steps(" in entry.run_source for entry in fn.entries)
    assert all("= _loads(A)" in entry.run_source for entry in fn.entries)  # Note [Replay loads in C]


def test_host_step_counters_in_c_equal_torch():
    """_C.host_steps (Note [Host step counters in C]) adds and reads as the torch ops it stands for, in order, with
    their version bumps; for a tensor or value it cannot vouch for it declines (None) having changed nothing."""
    from lazy import _C

    def counters():
        return [torch.tensor(3.5), torch.tensor(2.0, dtype=torch.float64), torch.tensor(7), torch.tensor(16777216.0)]

    want, got = counters(), counters()
    versions = [t._version for t in got]
    results = []
    for t in want:
        t += 1
        results.append(t.item())
    want[0] += 0.1
    results.append(want[0].item())
    out = _C.host_steps(tuple(got + [got[0], got[0]]), (True,) * 4 + (True, False),
                        (1,) * 4 + (0.1, None))
    assert [r for r in out[:4]] == got and out[5] == results[-1]
    for w, g, v in zip(want, got, versions):
        assert w.dtype == g.dtype and torch.equal(w, g)
        assert g._version > v
    assert _C.host_steps((got[0],), (False,), (None,)) == [want[0].item()]
    with torch.inference_mode():
        frozen = torch.tensor(1.0)
    # declined: an int64 counter and a float value (eager raises), grad, an inference tensor, int32, two elements,
    # an int beyond int64; the counter before the declined one is left as it was
    for t, value in [(torch.tensor(1), 0.5), (torch.tensor(1.0, requires_grad=True), 1), (frozen, 1),
                     (torch.tensor(1, dtype=torch.int32), 1), (torch.ones(2), 1), (torch.tensor(1), 2 ** 70)]:
        before, first = t.clone(), torch.tensor(0.0)
        assert _C.host_steps((first, t), (True, True), (1, value)) is None
        assert torch.equal(t.detach(), before) and first.item() == 0.0


def test_a_step_that_makes_the_first_record_function_call_is_captured_once(monkeypatch):
    """Note [torch's one-time caches before a capture]: an optimizer's step (inside record_function) whose capture
    is the process's first record_function call is captured once, not again at its second call; its replays equal
    plain runs (verified)."""
    import torch.autograd.profiler as profiler

    if not hasattr(profiler, "_maybe_cupti_monitor"):
        pytest.skip("this torch has no one-time CUPTI check")
    monkeypatch.setattr(profiler, "_cupti_monitor_checked", False)
    monkeypatch.setattr(profiler, "_cupti_monitor_module", None)
    torch.manual_seed(0)
    model = nn.Linear(4, 4).to(L)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: the first call is captured

    def step(x):
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    model(torch.randn(2, 4).to(L)).sum().backward()  # gradients exist at every call, as after an earlier step
    lazy.compile(step)
    lazy.metrics.reset()
    for _ in range(4):
        step(torch.randn(2, 4).to(L))
    assert len(state_of(step).entries) == 1 and counter("capture.guard_miss") == 0
    assert counter("capture.replays") == 3


def test_a_replay_that_cannot_go_on_has_changed_nothing():
    """A replay reads its inputs before it runs its host ops (AdamW's step counters): an input still holding IR
    recorded between calls (synced, then replayed) and two arguments sharing the storage the capture saw as two (a
    miss) leave every counter stepped once, as eager's."""
    def run(device, compiled):
        torch.manual_seed(0)
        model = nn.Linear(4, 4).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x, y):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = lazy.compile(step) if compiled else step
        g = torch.Generator().manual_seed(1)
        losses = []
        for i in range(7):
            x, y = torch.randn(2, 4, generator=g).to(device), torch.randn(2, 4, generator=g).to(device)
            if i == 3:
                with torch.no_grad():
                    model.weight.mul_(0.5)  # IR on an input's storage, unsynced
            losses.append(float(fn(x, x) if i == 4 else fn(x, y)))
        return losses, [float(opt.state[p]["step"]) for p in model.parameters()], model.weight.detach().cpu()

    want = run("cpu", False)
    got = run(L, True)
    assert got[1] == want[1] == [7.0, 7.0]
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(want[0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)
    assert counter("capture.replays") >= 4, lazy.metrics.counters()


# ---------------------------------------------------------------------------------------------------------------
# Guards: each kind hits and misses

def _compiled_sum():
    @lazy.compile
    def f(x):
        return (x * 2).sum()
    return f


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "layout"])
def test_tensor_guards(change):
    f = _compiled_sum()
    x = torch.randn(3, 4)
    f(x.to(L))
    f(x.to(L))
    assert counter("capture.replays") == 1
    y = {"shape": torch.randn(5, 4), "dtype": torch.randn(3, 4, dtype=torch.float64),
         "requires_grad": x.clone().requires_grad_(), "layout": torch.randn(4, 3).t()}[change]
    with torch.no_grad():
        out = f(y.to(L) if change != "requires_grad" else y.detach().to(L).requires_grad_())
    torch.testing.assert_close(out.cpu(), (y.detach() * 2).sum())
    assert counter("capture.guard_miss") == 1 and counter("capture.captures") == 2


def test_python_number_used_as_a_shape_is_guarded_and_as_a_scalar_is_not():
    @lazy.compile
    def f(x, n, scale):
        return x.reshape(n, -1) * scale

    x = torch.randn(4, 6)
    for n, scale in ((2, 0.3), (2, 0.7), (3, 0.7), (2, 1.3)):
        torch.testing.assert_close(f(x.to(L), n, scale).cpu(), x.reshape(n, -1) * scale)
    assert counter("capture.captures") == 2  # n=2 and n=3; the scales are runtime inputs
    assert counter("capture.replays") == 2


def test_constant_and_runtime_scalars_of_replays_reach_the_kernels():
    """A replay passes its graph's scalars as a tuple: the function's own constants one constant tuple, packed once
    by the C++ program; runtime numbers a new tuple per call, packed again (runtime/cpp.py)."""
    @lazy.compile
    def f(x, a):
        return (x * 2.5 + 0.25) * a

    @lazy.compile
    def g(x):
        return (x * 1.5 - 0.75).sin()

    for i in range(5):
        x = torch.randn(8, 8)
        for a in (0.5, 3.0):
            torch.testing.assert_close(f(x.to(L), a).cpu(), (x * 2.5 + 0.25) * a)
        torch.testing.assert_close(g(x.to(L)).cpu(), (x * 1.5 - 0.75).sin())
    assert counter("capture.captures") == 2 and counter("capture.replays") == 13


def test_autograd_function_apply_replays():
    """``Function.apply`` (a classmethod: bound anew at every read, as DDP's _DDPSink's) is guarded by what it binds,
    not by its own identity, so the call replays instead of recompiling every time. (A Function of torch's own: one
    of user code runs its forward natively, which breaks the capture.)"""
    from torch.autograd._functions.tensor import Resize

    @lazy.compile
    def f(w):
        w.grad = None
        loss = (Resize.apply(w, (2, 3)) ** 2).sum()
        loss.backward()
        return loss.detach()

    for _ in range(4):
        x = torch.randn(6)
        w = x.to(L).requires_grad_()
        torch.testing.assert_close(f(w).cpu(), (x ** 2).sum())
        torch.testing.assert_close(w.grad.cpu(), 2 * x)
    assert counter("capture.captures") == 1 and counter("capture.replays") == 3, lazy.explain(f)


def test_module_training_flag_and_globals_and_closures():
    global OFFSET
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).to(L)
    offset = [1.7]

    @lazy.compile
    def f(x):
        return model(x) + OFFSET + offset[0]

    OFFSET = 0.3
    x = torch.randn(2, 4).to(L)
    model.eval()
    with torch.no_grad():
        a = f(x).cpu()
        assert torch.equal(f(x).cpu(), a)  # replayed: in eval mode dropout is the identity
        assert counter("capture.replays") == 1
        model.train()  # the training flag is guarded: a new capture, where dropout drops
        assert (f(x).cpu() - a).abs().max() > 0.1
        assert counter("capture.captures") == 2
        model.eval()
        OFFSET, offset[0] = 10.3, 2.7  # numbers read again at each replay (runtime scalars), not recompiles
        torch.testing.assert_close(f(x).cpu(), a + 11.0)
    assert counter("capture.captures") == 2


def test_grad_mode_is_guarded():
    f = _compiled_sum()
    x = torch.randn(3).to(L)
    f(x)
    with torch.no_grad():
        f(x)
    assert counter("capture.captures") == 2


def test_other_objects_are_guarded_by_identity():
    @lazy.compile
    def f(m, x):
        return m(x)

    x = torch.randn(2, 3)
    m1, m2 = nn.Linear(3, 2).to(L), nn.Linear(3, 2).to(L)
    with torch.no_grad():
        for m in (m1, m1, m2, m2, m1):
            torch.testing.assert_close(f(m, x.to(L)).cpu(), F.linear(x, m.weight.cpu(), m.bias.cpu()))
    assert counter("capture.captures") == 2 and counter("capture.replays") == 3


@pytest.mark.parametrize("change", ["replace parameter", "tie weights"])
def test_one_object_reached_along_two_paths_is_guarded(change):
    """Note [Objects reached twice]: the model and the optimizer reach each parameter along two paths; replacing a
    model's parameter (the optimizer keeps the old one) or tying two is a guard miss, and the steps equal eager's."""
    def run(device, compiled):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        def step(x):
            loss = m(x).square().sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        f = lazy.compile(plain_copy(step)) if compiled else step
        run.fn = f
        losses = []
        for i in range(6):
            if i == 3:
                with torch.no_grad():
                    if change == "replace parameter":
                        m[0].weight = nn.Parameter(torch.full((4, 4), 0.1, device=device))
                    else:
                        m[1].weight = m[0].weight
            losses.append(f(torch.randn(2, 4, generator=torch.Generator().manual_seed(i)).to(device)).cpu())
        return losses, [p.detach().cpu() for p in m.parameters()], [p.detach().cpu() for p in opt.param_groups[0]["params"]]

    want = run("cpu", False)
    got = run(L, True)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            torch.testing.assert_close(b, a)
    misses = [e["text"] for e in state_of(run.fn).events if e["kind"] == "guard miss"]
    assert misses and misses[0].startswith("same "), misses
    assert not any("unreadable" in m for m in misses), misses  # each reason reads the value it names
    assert counter("capture.replays") >= 1


def test_stores_a_later_store_overwrites_are_dropped_unless_storing_does_more():
    """Note [Dead stores]: zero_grad's ``p.grad = None``, a plain attribute and a dict item stored twice are dropped
    from the replay; a property's setter still runs every time."""
    class Holder:
        def __init__(self):
            self.log = []
            self.plain = 0

        @property
        def watched(self):
            return self.log[-1] if self.log else None

        @watched.setter
        def watched(self, v):
            self.log.append(v)

    h, d = Holder(), {}
    m = nn.Linear(3, 2).to(L)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = m(x).sum()
        loss.backward()
        opt.step()
        h.plain = 1
        h.plain = 2
        h.watched = 1
        h.watched = 2
        d["k"] = 1
        d["k"] = 2
        return loss.detach()

    f = lazy.compile(plain_copy(step))
    for i in range(5):
        with lazy.config.override(capture_verify=False):  # a verified replay runs the setter twice
            f(torch.randn(4, 3).to(L))
        assert h.log == [1, 2] * (i + 1) and h.plain == 2 and d == {"k": 2}
    entry = state_of(f).entries[-1]
    assert counter("capture.replays") >= 2
    assert entry.dead_stores == 4 and "'plain'" in entry.run_source  # two grads, an attribute and an item


def test_stores_before_a_store_that_does_more_are_kept():
    """Note [Dead stores]: a property's setter between zero_grad's ``p.grad = None`` and backward's store sees None,
    as in eager; a deletion between two stores of one key finds the key the first store put there."""
    class Holder:
        def __init__(self, m):
            self.m, self.seen = m, []

        @property
        def watched(self):
            return None

        @watched.setter
        def watched(self, v):
            self.seen.append(self.m.weight.grad is None)

    m = nn.Linear(3, 2).to(L)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    h, d = Holder(m), {}

    def step(x):
        opt.zero_grad()
        h.watched = 1
        d["k"] = 1
        del d["k"]
        d["k"] = 2
        loss = m(x).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    f = lazy.compile(plain_copy(step))
    for i in range(5):
        d.clear()
        with lazy.config.override(capture_verify=False):  # a verified replay runs the setter twice
            f(torch.randn(4, 3).to(L))
        assert h.seen == [True] * (i + 1) and d == {"k": 2}
    assert counter("capture.replays") >= 2
    assert state_of(f).entries[-1].dead_stores == 0


# ---------------------------------------------------------------------------------------------------------------
# Traps: state a replay must reproduce

def test_random_ops_draw_fresh_seeds_as_a_plain_run_does():
    def f(x):
        return F.dropout(x, 0.5) + torch.rand_like(x)

    f, cf = plain_copy(f), lazy.compile(f)
    x = torch.ones(64).to(L)
    torch.manual_seed(7)
    got = [cf(x).cpu() for _ in range(4)]
    after_compiled = torch.rand(3)
    torch.manual_seed(7)
    want = [f(x).cpu() for _ in range(4)]
    after_plain = torch.rand(3)
    assert counter("capture.replays") == 3
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert not torch.equal(got[1], got[2])
    assert torch.equal(after_compiled, after_plain)  # the generator advanced as in the plain run


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0
        self.history = []

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        self.history.append(self.calls)
        return y * self.calls


def test_python_counters_lists_and_attributes_are_replayed():
    m = Counter().to(L)
    cm = Counter().to(L)
    cm.load_state_dict(m.state_dict())
    f = lazy.compile(lambda mod, x: mod(x))
    x = torch.randn(2, 3)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(f(cm, x.to(L)).cpu(), m(x.to(L)).cpu())
    assert counter("capture.replays") == 3
    assert cm.calls == m.calls == 4 and cm.history == m.history == [1, 2, 3, 4]


def test_no_grad_and_train_eval_inside_the_function():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(L)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(L)
    ref.load_state_dict(model.state_dict())

    def evaluate(m, x):
        m.eval()
        with torch.no_grad():
            out = m(x)
        m.train()
        return out

    f, evaluate = lazy.compile(evaluate), plain_copy(evaluate)
    for s in range(3):
        x = torch.randn(5, 4).to(L)
        torch.testing.assert_close(f(model, x).cpu(), evaluate(ref, x).cpu())
        assert model.training and torch.is_grad_enabled()
    assert counter("capture.replays") == 2


def test_forward_hooks_run_in_a_replay():
    model = nn.Linear(3, 3).to(L)
    seen = []
    model.register_forward_hook(lambda mod, inp, out: seen.append(1) or out * 2)
    f = lazy.compile(lambda x: model(x))
    x = torch.randn(2, 3).to(L)
    with torch.no_grad():
        outs = [f(x).cpu() for _ in range(3)]
    assert counter("capture.replays") == 2 and torch.equal(outs[0], outs[2])
    assert len(seen) == 3  # the hook's append is an effect on a list: replayed with the graph
    torch.testing.assert_close(outs[0], model(x).cpu())  # the hook doubled the output


# ---------------------------------------------------------------------------------------------------------------
# Graph breaks: the function runs plainly, correct

@pytest.mark.parametrize("case", ["item", "print", "bool", "nonzero", "open"])
def test_graph_breaks_run_plainly(case, tmp_path, capsys):
    def f(x):
        y = x * 2
        if case == "item":
            return y + y.sum().item()
        if case == "print":
            print("y", y.shape)
            return y
        if case == "bool":
            return y if (y.sum() > 0) else -y
        if case == "nonzero":
            return y[y > 0].sum()
        with open(tmp_path / "log", "a") as fh:
            fh.write("step\n")
        return y

    cf = lazy.compile(f)
    for _ in range(3):
        x = torch.randn(6)
        torch.testing.assert_close(cf(x.to(L)).cpu(), f(x.to(L)).cpu())
    assert counter("capture.replays") == 0 and state_of(cf).broken is not None
    assert "test_capture.py" in state_of(cf).broken.where


def test_fullgraph_turns_a_break_into_an_error_with_the_users_line():
    @lazy.compile(fullgraph=True)
    def f(x):
        return x + x.sum().item()

    with pytest.raises(CaptureBreak, match=r"syncs.*test_capture\.py:\d+"):
        f(torch.randn(3).to(L))


def test_a_tensor_hook_run_by_autograd_breaks():
    w = torch.randn(3).to(L).requires_grad_()
    w.register_hook(lambda g: g * 2)

    @lazy.compile
    def f(x):
        (w * x).sum().backward()
        return w.grad.detach()

    f(torch.ones(3).to(L))
    assert state_of(f).broken is not None and "natively" in state_of(f).broken.reason


# ---------------------------------------------------------------------------------------------------------------
# Recompiles, nesting, forms, errors

def test_recompile_limit_then_plain_runs():
    @lazy.compile(max_recompiles=2)
    def f(x):
        return x * 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 7):
            torch.testing.assert_close(f(torch.ones(n).to(L)).cpu(), torch.full((n,), 2.0))
    assert counter("capture.captures") == 3 and counter("capture.plain_run") == 3
    assert sum("max_recompiles" in str(w.message) for w in caught) == 1


def test_nested_compiled_functions():
    inner = lazy.compile(lambda x: x.sin() * 2)

    @lazy.compile
    def outer(x):
        return inner(x) + inner(x * 3)

    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(outer(x.to(L)).cpu(), x.sin() * 2 + (x * 3).sin() * 2)
    assert len(state_of(outer).entries) == 1 and state_of(outer).entries[0].hits == 2  # inner ran inside outer's capture


def test_method_and_module_forms():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x)

        @lazy.compile
        def double(self, x):
            return self.lin(x) * 2

    m = M().to(L)
    cm = lazy.compile(m)
    x = torch.randn(4, 3)
    want = F.linear(x, m.lin.weight.detach().cpu(), m.lin.bias.detach().cpu())
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(m.double(x.to(L)).cpu(), want * 2)
            torch.testing.assert_close(cm(x.to(L)).cpu(), want)
    assert counter("capture.replays") == 2


def test_training_forward_outside_autograd_runs_plainly():
    """A module's forward compiled on its own returns a tensor with autograd history that a backward outside will
    use: that is not replayable, so it runs plainly, and training works."""
    torch.manual_seed(0)
    m = nn.Linear(3, 1).to(L)
    cm = lazy.compile(m)
    loss = cm(torch.randn(4, 3).to(L)).sum()
    loss.backward()
    assert m.weight.grad is not None and cm.broken is not None and "autograd" in cm.broken.reason


def test_exceptions_propagate_and_the_function_keeps_working():
    @lazy.compile
    def f(x, fail):
        if fail:
            raise ValueError("boom")
        return x + 1

    with pytest.raises(ValueError, match="boom"):
        f(torch.ones(2).to(L), True)
    torch.testing.assert_close(f(torch.ones(2).to(L), False).cpu(), torch.full((2,), 2.0))


def test_reset_unregisters_and_compiling_again_captures_again():
    f = _compiled_sum()
    x = torch.randn(3).to(L)
    f(x)
    f(x)
    lazy.compile.reset()
    torch.testing.assert_close(f(x).cpu(), (x.cpu() * 2).sum())  # a plain function again
    assert counter("capture.captures") == 1 and counter("capture.replays") == 1
    f = lazy.compile(f)
    f(x)
    f(x)
    assert counter("capture.captures") == 2 and counter("capture.replays") == 2


def test_generators_are_refused():
    def gen(x):
        yield x

    with pytest.raises(TypeError, match="generator"):
        lazy.compile(gen)


def test_every_argument_kind():
    @lazy.compile
    def f(a, b=2.5, *rest, c, d=1.5, **kw):
        return a * b + sum(rest) * c + d + kw["e"]

    x = torch.randn(3)
    for e in (0.3, 0.7):
        got = f(x.to(L), 1.25, x.to(L), x.to(L), c=0.5, e=e)
        torch.testing.assert_close(got.cpu(), x * 1.25 + (x + x) * 0.5 + 1.5 + e)
    assert counter("capture.replays") == 1


# ---------------------------------------------------------------------------------------------------------------
# Observability: verification, explain, logs

def test_verification_catches_a_replay_that_differs():
    from lazy.capture.verify import CaptureMismatch

    state = {"calls": 0}

    @lazy.compile
    def f(x):
        state["calls"] += 1
        return x * 2

    x = torch.ones(3).to(L)
    f(x)
    f(x)
    entry = state_of(f).entries[0]
    good = entry.run
    entry.run = lambda A: torch.full((3,), 5.0).to(L)  # a replay computing the wrong value
    with pytest.raises(CaptureMismatch, match="result"):
        f(x)
    entry.run = lambda A: good(A) if state.__setitem__("calls", state["calls"] - 1) is None else None
    with pytest.raises(CaptureMismatch, match="calls"):  # a replay whose effect on Python state is wrong
        f(x)


def test_explain_and_topic_logs(capsys):
    with lazy.config.override(logs="recompiles,graph_breaks,guards,output_code"):
        @lazy.compile
        def f(x):
            return x * 2

        f(torch.ones(3).to(L))
        f(torch.ones(4).to(L))
        g = lazy.compile(lambda x: x + x.sum().item())
        g(torch.ones(2).to(L))
    err = capsys.readouterr().err
    assert "[lazy:recompiles]" in err and "guard failed: tensor A[0]" in err
    assert "[lazy:graph_breaks]" in err and "syncs (item)" in err
    assert "[lazy:guards]" in err and "[lazy:output_code]" in err and "def replay(A)" in err
    text = lazy.explain(f)
    assert "2 entries" in text and "guard miss: tensor A[0]" in text and "(4,)" in text
    assert "runs plainly" in lazy.explain(g) and "test_capture.py" in lazy.explain(g)
    assert counter("capture.guard_miss") == 1 and counter("capture.breaks") == 1


def _reshape_to_seven(x):
    return x.reshape(7, 7)


def test_an_error_in_a_capture_shows_the_users_lines():
    import traceback

    @lazy.compile
    def f(x):
        y = x * 2
        return _reshape_to_seven(y)

    with pytest.raises(RuntimeError, match="invalid for input of size 4") as info:
        f(torch.ones(4).to(L))
    text = "".join(traceback.format_exception(info.value))
    assert "in f\n    return _reshape_to_seven(y)" in text
    assert "in _reshape_to_seven\n    return x.reshape(7, 7)" in text
    assert "lazy/capture/opcodes.py" not in text and "lazy/capture/interpreter.py" not in text


def test_options():
    with pytest.raises(ValueError, match="mode"):
        lazy.compile(lambda x: x, mode="fast")
    for mode in ("default", "reduce-overhead", "max-autotune"):
        f = lazy.compile(lambda x: x * 3, mode=mode)
        for _ in range(2):
            torch.testing.assert_close(f(torch.ones(2).to(L)).cpu(), torch.full((2,), 3.0))


def test_counters_of_a_tensors_size_replay_without_guarding_the_counter():
    """``n += x.size(0)`` (or ``x.shape[0]``, ``x.numel()``) is an expression of the argument and the counter: the
    counter changes at every call, and replays add the size to its value then, as eager does."""
    class Stats:
        rows = 0
        elements = 0

    stats = Stats()

    @lazy.compile
    def f(x):
        stats.rows += x.size(0)
        stats.elements += x.numel() + x.shape[1] * 0
        return x + 1

    for _ in range(4):
        f(torch.ones(3, 2).to(L))
    assert (stats.rows, stats.elements) == (12, 24)
    assert counter("capture.captures") == 1 and counter("capture.replays") == 3
