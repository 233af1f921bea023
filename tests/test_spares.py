"""Reused outputs (lazy/runtime/spares.py, csrc/outputs.cpp): a cached program writes its outputs into those of its
earlier runs only where nothing else can see them; every value anyone still holds stays what eager computed."""
import weakref

import pytest
import torch

import lazy
from lazy.runtime.spares import BUDGET

L = "lazy"


@pytest.fixture(autouse=True)
def cpp_backend(cpu_backing):
    with lazy.config.override(compiler="cpp", async_execution=False):
        yield
    BUDGET.clear()


def data_of(t):
    """The backing tensor a synced lazy tensor's storage holds."""
    return t._lz_st.value.data


def step(x, w):
    y = (x * w + 1).relu()
    return y, y.sum(dim=0)


def test_a_loop_writes_into_the_outputs_of_two_runs_ago():
    x = torch.randn(64, 32)
    w = torch.randn(32).to(L)
    y = s = None
    pointers = []
    for i in range(8):
        last = y, s  # alive during the run, dropped after it, as a training loop's parameters are
        y, s = step(x.to(L) + i, w)
        lazy.mark_step()
        del last
        pointers.append(data_of(y).data_ptr())
        torch.testing.assert_close(y.cpu(), (x.add(i) * w.cpu() + 1).relu())
    # two buffers in turn once the graph is compiled: run N writes where run N-2's output was
    assert lazy.metrics.counter("spares.reused") >= 2 * 5, lazy.metrics.counters()
    assert pointers[-1] == pointers[-3] == pointers[-5] != pointers[-2] == pointers[-4], pointers
    assert BUDGET.bytes > 0


def test_outputs_still_held_are_never_overwritten():
    torch.manual_seed(0)
    xs = [torch.randn(64, 32) for _ in range(6)]
    w = torch.randn(32)
    kept, views, cpu_copies, weak = [], [], [], []
    for i, x in enumerate(xs):
        y, s = step(x.to(L), w.to(L))
        lazy.mark_step()
        if i % 3 == 0:
            kept.append((y, s))  # the lazy tensors themselves
        elif i % 3 == 1:
            views.append(y[3:5])  # a view: shares the output's storage
            lazy.mark_step()
        else:
            backing = data_of(y)
            weak.append(weakref.ref(backing))  # only a weak reference: the tensor may go, never be overwritten
            cpu_copies.append(y.cpu())
    for i, (y, s) in zip(range(0, 6, 3), kept):
        torch.testing.assert_close(y.cpu(), (xs[i] * w + 1).relu())
        torch.testing.assert_close(s.cpu(), (xs[i] * w + 1).relu().sum(dim=0))
    for i, v in zip(range(1, 6, 3), views):
        torch.testing.assert_close(v.cpu(), (xs[i] * w + 1).relu()[3:5])
    for i, c, ref in zip(range(2, 6, 3), cpu_copies, weak):
        torch.testing.assert_close(c, (xs[i] * w + 1).relu())
        if ref() is not None:  # a weak reference still sees the values it saw (a spare is never a referenced one)
            torch.testing.assert_close(ref(), c, rtol=0, atol=0)


@pytest.mark.parametrize("holder", ["view", "storage"])
def test_a_spare_whose_memory_is_held_elsewhere_is_not_taken(holder):
    """A backing view of an output (it holds the output's TensorImpl) or another tensor over its storage (only the
    StorageImpl) outlives the lazy tensor: the output is never written again."""
    x = torch.randn(16, 8)
    w = torch.randn(8).to(L)
    y, _ = step(x.to(L), w)
    lazy.mark_step()
    y2, _ = step(x.to(L), w)
    lazy.mark_step()
    backing = data_of(y)
    alias = backing[2:4] if holder == "view" else torch.empty(0).set_(backing.untyped_storage())
    first = alias.clone()
    del y, backing
    reused = lazy.metrics.counter("spares.reused")
    for _ in range(4):
        z, _ = step((x * 3).to(L), w)
        lazy.mark_step()
        del z
    assert lazy.metrics.counter("spares.reused") > reused  # the loop does reuse, other buffers
    torch.testing.assert_close(alias, first)


def test_the_budget_bounds_what_programs_keep():
    x = torch.randn(256, 256)  # 256 KiB outputs
    with lazy.config.override(spare_bytes=300 << 10):
        for i in range(3):
            a = (x.to(L) * 2 + 1)
            lazy.mark_step()
            b = (x.to(L) - 5).abs()
            lazy.mark_step()
            del a, b
            assert BUDGET.bytes <= 300 << 10
        assert len(BUDGET.holders) == 1  # the program run last
    with lazy.config.override(spare_bytes=0):
        a = (x.to(L) * 2 + 1)
        lazy.mark_step()
        assert not BUDGET.holders and BUDGET.bytes == 0
        torch.testing.assert_close(a.cpu(), x * 2 + 1)


def test_a_captured_training_step_reuses_state_buffers_and_matches_eager():
    from models import MODELS, batch, loss_fn

    def train(device, compiled):
        torch.manual_seed(0)
        model = MODELS["mlp"]().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def one(x, y):
            loss = loss_fn("mlp", model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        fn = lazy.compile(one) if compiled else one
        losses = [float(fn(*batch("mlp", s, device))) for s in range(8)]
        return losses, [p.detach().cpu() for p in model.parameters()]

    want = train("cpu", False)
    got = train(L, True)
    lazy.compile.reset()
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(want[0]), rtol=1e-4, atol=1e-5)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert BUDGET.holders
