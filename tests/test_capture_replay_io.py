"""The C helpers of a replay's per-tensor work, each held to what the plain path it replaces gives: data leaves made
from templates (Note [Data leaves from templates] in csrc/leaf_templates.cpp) against leaves made from scratch, and a
captured step's replays against plain lazy steps."""
import pytest
import torch

import lazy
from lazy import _C

L = "lazy"
FIELDS = ("op", "args", "kwargs", "inputs", "scalars", "shape", "dtype", "metas")


def assert_scratch_leaf(leaf, out):
    """``leaf`` is what ``_C.data_leaf(out)`` makes: equal fields, the same interned signature, ``out`` as data."""
    ref = _C.data_leaf(out)
    for name in FIELDS:
        assert getattr(leaf, name) == getattr(ref, name), name
    assert leaf.op is ref.op and leaf.dtype is ref.dtype
    assert leaf.sig is ref.sig
    assert leaf.data is out and leaf.is_data


def _synced(shape=(4, 3)):
    t = torch.zeros(shape, device=L)
    lazy.mark_step()
    return t


def _write(t, out, templates):
    assert _C.replay_writes((t,), [out], (0,), templates) == 1
    return t._lz_st.value


class Float64Named(torch.Tensor):
    """A tensor subclass whose ``dtype`` is not torch's getter: a leaf must read it through Python."""

    @property
    def dtype(self):
        return torch.float64


def _others(device):
    """Outputs of the same sizes as a (4, 3) float32 one but another layout, scalar type or tensor type."""
    return {
        "stride": torch.zeros(3, 4, device=device).t(),
        "dtype": torch.zeros(4, 3, dtype=torch.float64, device=device),
        "sizes": torch.zeros(3, 4, device=device),
        "subclass": torch.zeros(4, 3, device=device).as_subclass(Float64Named),
    }


@pytest.mark.parametrize("other", ["stride", "dtype", "sizes", "subclass"])
def test_replay_writes_from_templates_makes_the_leaves_made_from_scratch(other):
    device = lazy.config.backing_device
    t = _synced()
    templates = _C.leaf_templates(1)
    first = torch.full((4, 3), 1.0, device=device)
    leaf = _write(t, first, templates)
    assert_scratch_leaf(leaf, first)
    same = torch.full((4, 3), 2.0, device=device)
    again = _write(t, same, templates)
    assert_scratch_leaf(again, same)
    assert again.args is leaf.args and again.shape is leaf.shape  # made from the template
    torch.testing.assert_close(t.cpu(), same.cpu())
    odd = _others(device)[other]  # the template refuses it: made from scratch, then the template
    leaf = _write(t, odd, templates)
    assert_scratch_leaf(leaf, odd)
    assert leaf.args is not again.args or leaf.shape is not again.shape
    later = odd.clone() if other != "subclass" else odd.as_subclass(Float64Named)
    assert_scratch_leaf(_write(t, later, templates), later)
    back = torch.full((4, 3), 3.0, device=device)
    assert_scratch_leaf(_write(t, back, templates), back)


def test_new_tensors_from_templates_makes_the_leaves_made_from_scratch():
    device = lazy.config.backing_device
    desc = ((4, 3), (3, 1), 0, torch.float32)
    templates = _C.leaf_templates(2)
    made = []
    for value in (1.0, 2.0):
        outs = [torch.full((4, 3), value, device=device), torch.full((4, 3), -value, device=device)]
        a, b = _C.new_tensors((desc, desc), outs, (1, 0), (12, 12), None, templates)
        assert_scratch_leaf(a._lz_st.value, outs[1])
        assert_scratch_leaf(b._lz_st.value, outs[0])
        torch.testing.assert_close(a.cpu(), torch.full((4, 3), -value))
        made.append(a._lz_st.value)
    assert made[1].args is made[0].args


def test_templates_of_another_size_or_kind_are_refused():
    device = lazy.config.backing_device
    t = _synced()
    out = torch.ones(4, 3, device=device)
    with pytest.raises(TypeError, match="leaf templates"):
        _C.replay_writes((t, t), [out], (0, 0), _C.leaf_templates(1))
    with pytest.raises(TypeError, match="leaf templates"):
        _C.replay_writes((t,), [out], (0,), object())


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x.to(L)), y.to(L))
    loss.backward()
    opt.step()
    return loss.detach()


def test_a_captured_step_equals_plain_lazy_steps():
    """Replays whose leaves come from templates (every write and new tensor after the first replay) step a model
    exactly as plain lazy steps do (both on the reference executor, whose numbers do not depend on when a graph
    compiles)."""
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    twins = []
    for model in models:
        model.to(L)
        twins.append((model, torch.optim.AdamW(model.parameters(), lr=1e-2)))
    compiled = lazy.compile(lambda x, y: _step(*twins[0], x, y))
    data = [(torch.randn(5, 6), torch.randn(5, 2)) for _ in range(6)]
    with lazy.config.override(capture_verify=False, compiler="reference"):
        for x, y in data:
            got = compiled(x, y)
            lazy.mark_step()
            want = _step(*twins[1], x, y)
            lazy.mark_step()
            torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)
    assert lazy.metrics.counter("capture.replays") == len(data) - 2  # the gradients are None at the first call
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(a.grad.cpu(), b.grad.cpu(), rtol=0, atol=0)
    lazy.compile.reset()


def test_store_grads_stores_in_order_as_setattr_does():
    """_C.store_grads is object.__setattr__(p, "grad", g) pair by pair: a gradient already there stays (skipped), a
    new one is stored, a store that raises stops the run there."""
    ps = [torch.zeros(2, device=L, requires_grad=True) for _ in range(3)]
    kept = torch.ones(2, device=L)
    ps[0].grad = kept
    new = [kept, torch.full((2,), 2.0, device=L), torch.full((3,), 3.0, device=L)]  # the last: a wrong shape
    with pytest.raises(RuntimeError):
        _C.store_grads(tuple(ps), tuple(new))
    assert ps[0].grad is kept and ps[1].grad is new[1] and ps[2].grad is None
    with pytest.raises(RuntimeError):
        object.__setattr__(ps[2], "grad", new[2])  # what setattr raises
    _C.store_grads(tuple(ps[:2]), (None, None))
    assert ps[0].grad is None and ps[1].grad is None
    with pytest.raises(TypeError):
        _C.store_grads(tuple(ps), (None,))


def test_a_returned_loss_whose_graph_backward_used_raises_at_a_second_backward_as_eager():
    """A step that returns its loss after ``loss.backward()``: eager's loss has a history whose buffers are freed, so
    a second backward raises. A replay's loss must too (Plan.backward_consumed), and keep eager's value."""
    torch.manual_seed(0)
    w0 = torch.randn(5, 2)

    def make(device):
        w = w0.clone().to(device).requires_grad_()
        opt = torch.optim.SGD([w], lr=0.1)

        def step(x):
            loss = (x.to(device) @ w).sin().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    eager, compiled = make("cpu"), lazy.compile(make(L))
    for i in range(4):
        x = torch.randn(3, 5)
        want, got = eager(x), compiled(x)
        assert got.requires_grad and got.grad_fn is not None and want.grad_fn is not None
        torch.testing.assert_close(got.detach().cpu(), want.detach())
        for loss in (want, got):
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()
    assert lazy.metrics.counter("capture.replays") >= 2
