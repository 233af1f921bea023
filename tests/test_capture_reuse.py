"""A replay's new gradients take the wrappers of the ones they replace where nothing can tell (Note [Reused gradient
wrappers] in csrc/replay_io.cpp and lazy/capture/replay.py).

Each test steps a model on the lazy device under lazy.compile beside the same model in eager, and checks gradients,
parameters and losses against eager's; the tests that break a condition of reuse between two steps (a user keeps the
old gradient, a view of it, a weak reference, an attribute on it, IR recorded on it, ...) check that what they hold
behaves as eager's would and that exactly that gradient was not reused.
"""
import copy
import weakref

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy import _C
from lazy.device.tensor import LazyTensor

from models import MLP

L = "lazy"


@pytest.fixture(autouse=True)
def replays_unverified():
    """LAZY_CAPTURE_VERIFY keeps every effect's old value for its undo, the old gradients too, so no gradient would be
    reused: these replays run plainly and are compared with eager instead. The reference executor keeps the
    numbers those of plain lazy steps."""
    with lazy.config.override(capture_verify=False, compiler="reference"):
        yield
    lazy.compile.reset()


def _step(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _step_returning_grad(model, opt, x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach(), model.net[0].weight.grad


def _step_returning_old_grad(model, opt, x, y):
    old = model.net[0].weight.grad
    for p in model.parameters():
        p.grad = None
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach(), old


def _copy(fn):
    """Another function of ``fn``'s code (lazy.compile registers a function object, which then always replays)."""
    return type(fn)(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=3e-3)


class Twin:
    """One MLP trained on the lazy device by a compiled step and in eager by the same step, in lockstep."""

    def __init__(self, opt="adamw", step=_step):
        torch.manual_seed(0)
        self.eager = MLP()
        self.lazy = copy.deepcopy(self.eager).to(L)
        self.eager_opt = _optimizer(opt, self.eager.parameters())
        self.lazy_opt = _optimizer(opt, self.lazy.parameters())
        self.eager_step = _copy(step)
        self.lazy_step = lazy.compile(_copy(step))
        self.n = 0
        self.params = list(self.lazy.parameters())

    def step(self):
        """One step of both; returns (lazy result, eager result, how many gradients the lazy step reused)."""
        g = torch.Generator().manual_seed(self.n)
        x, y = torch.randn(8, 20, generator=g), torch.randint(0, 5, (8,), generator=g)
        self.n += 1
        want = self.eager_step(self.eager, self.eager_opt, x, y)
        before = lazy.metrics.counter("capture.reused_grads")
        got = self.lazy_step(self.lazy, self.lazy_opt, x.to(L), y.to(L))
        return got, want, lazy.metrics.counter("capture.reused_grads") - before

    def warm(self, steps=4):
        """Steps until every gradient is reused (the capture's own gradients and the first replay's are not)."""
        reused = 0
        for _ in range(steps):
            reused = self.check(*self.step())
        assert reused == len(self.params)

    def check(self, got, want, reused):
        """Lazy's loss, parameters and gradients against eager's; returns ``reused``."""
        close = dict(rtol=1e-4, atol=1e-5)
        got_loss = got[0] if isinstance(got, tuple) else got
        want_loss = want[0] if isinstance(want, tuple) else want
        torch.testing.assert_close(got_loss.cpu(), want_loss, **close)
        for (name, w), p in zip(self.eager.named_parameters(), self.params):
            torch.testing.assert_close(p.detach().cpu(), w.detach(), msg=name, **close)
            torch.testing.assert_close(p.grad.cpu(), w.grad, msg=f"{name}.grad", **close)
            assert type(p.grad) is LazyTensor and not p.grad.requires_grad and p.grad._version == 0
        return reused


# ---------------------------------------------------------------------------------------------------------------
# The plain loop reuses every gradient

@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_training_loop_reuses_every_gradient_and_equals_eager(opt):
    twin = Twin(opt)
    twin.warm()
    grads = [id(p.grad) for p in twin.params]  # (holding them would keep them from being reused)
    for _ in range(3):
        assert twin.check(*twin.step()) == len(twin.params)
    assert [id(p.grad) for p in twin.params] == grads  # the same wrappers, with new values
    assert entry_of(twin).reusable_grads == len(twin.params)


def entry_of(twin):
    from lazy.capture.function import state_of
    (entry,) = state_of(twin.lazy_step).entries
    return entry


def test_reused_gradient_equals_plain_lazy_steps_bit_for_bit():
    """Replays that reuse the wrappers give the numbers plain lazy steps give (both on the reference executor, the
    plain steps' mark_step on all threads as a replay's program runs: Note [Thread budget of the worker])."""
    twin = Twin()
    twin.warm()
    twin.check(*twin.step())
    torch.manual_seed(0)
    model = MLP().to(L)
    opt = _optimizer("adamw", model.parameters())
    for n in range(twin.n):
        g = torch.Generator().manual_seed(n)
        x, y = torch.randn(8, 20, generator=g), torch.randint(0, 5, (8,), generator=g)
        _step(model, opt, x.to(L), y.to(L))
        with lazy.config.override(async_execution=False):
            lazy.mark_step()
    for p, q in zip(model.parameters(), twin.params):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), rtol=0, atol=0)


def test_refcounts_of_a_gradient_only_its_parameter_holds():
    """The counts the reuse check reads, as torch 2.13 keeps them: a gradient only its parameter holds has one Python
    reference (its TensorImpl's, while C++ holds the TensorImpl too), two TensorImpl uses (the object's and the
    parameter's), no weak ones, one StorageImpl use; a user's reference, a view and a saved tensor each show."""
    twin = Twin()
    twin.warm()
    p = twin.params[0]
    assert _C.grad_holders(p) == (1, 2, 1, 1)
    import sys
    count = sys.getrefcount(p.grad)  # (pytest's assert would hold p.grad in a temporary of its own)
    assert count == 2  # the temporary p.grad and the TensorImpl's
    g = p.grad
    assert _C.grad_holders(p) == (2, 2, 1, 1)
    del g
    v = p.grad.view(-1)
    assert _C.grad_holders(p)[1] > 2 and _C.grad_holders(p)[3] > 1
    del v
    a = torch.ones(p.shape, device=L, requires_grad=True)
    y = (a * p.grad).sum()  # saves p.grad for backward: a C++ use, no Python one
    assert _C.grad_holders(p)[:2] == (1, 3)
    del y
    assert _C.grad_holders(p) == (1, 2, 1, 1)


# ---------------------------------------------------------------------------------------------------------------
# Each condition broken between two steps: what the user holds stays as eager would have it

def _break_then_step(twin, act):
    """Warm up, ``act(p)`` on the first parameter, step; returns what act returned and how many were reused."""
    twin.warm()
    p = twin.params[0]
    held = act(p)
    reused = twin.check(*twin.step())
    return p, held, reused


def test_a_kept_gradient_keeps_its_values():
    twin = Twin()
    p, (g, before), reused = _break_then_step(twin, lambda p: (p.grad, p.grad.cpu()))
    assert reused == len(twin.params) - 1
    assert p.grad is not g
    torch.testing.assert_close(g.cpu(), before, rtol=0, atol=0)
    assert not torch.equal(p.grad.cpu(), before)


def test_a_kept_view_keeps_its_values_and_base():
    twin = Twin()
    p, (v, before), reused = _break_then_step(twin, lambda p: (p.grad.view(-1), p.grad.cpu()))
    assert reused == len(twin.params) - 1
    torch.testing.assert_close(v.cpu(), before.view(-1), rtol=0, atol=0)
    assert v._base is not p.grad


def test_a_kept_alias_keeps_its_values():
    twin = Twin()
    p, (d, before), reused = _break_then_step(twin, lambda p: (p.grad.detach(), p.grad.cpu()))
    assert reused == len(twin.params) - 1
    torch.testing.assert_close(d.cpu(), before, rtol=0, atol=0)


def test_a_weak_reference_dies_with_the_old_gradient():
    twin = Twin()
    p, ref, reused = _break_then_step(twin, lambda p: weakref.ref(p.grad))
    assert reused == len(twin.params) - 1
    assert ref() is None


def test_a_weak_tensor_reference_expires_with_the_old_gradient():
    twin = Twin()
    p, ref, reused = _break_then_step(twin, lambda p: torch._C._WeakTensorRef(p.grad))
    assert reused == len(twin.params) - 1
    assert ref.expired()


def test_an_attribute_stays_on_the_old_gradient():
    twin = Twin()

    def act(p):
        p.grad.note = "old"
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    assert not hasattr(p.grad, "note")


@pytest.mark.parametrize("field", ["_backward_hooks", "_post_accumulate_grad_hooks"])
def test_hook_fields_stay_on_the_old_gradient(field):
    twin = Twin()

    def act(p):
        setattr(p.grad, field, {})
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    assert getattr(p.grad, field) is None


def test_a_subclass_assigned_stays_on_the_old_gradient():
    class Marked(LazyTensor):
        pass
    twin = Twin()

    def act(p):
        p.grad.__class__ = Marked
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    assert type(p.grad) is LazyTensor


@pytest.mark.parametrize("toggle", ["on", "on-off"])
def test_requires_grad_set_on_the_old_gradient_stays_there(toggle):
    twin = Twin()

    def act(p):
        p.grad.requires_grad_(True)
        if toggle == "on-off":
            p.grad.requires_grad_(False)
    p, _, reused = _break_then_step(twin, act)  # check() asserts the new gradient does not require grad
    assert reused == len(twin.params) - 1


def test_a_negative_bit_set_on_the_old_gradient_stays_there():
    twin = Twin()
    p, _, reused = _break_then_step(twin, lambda p: torch._C._set_neg(p.grad, True))
    assert reused == len(twin.params) - 1
    assert not p.grad.is_neg()


def test_an_inference_gradient_is_not_reused():
    twin = Twin()

    def act(p):
        with torch.inference_mode():
            z = torch.zeros(p.shape, device=L)
        p.grad = z
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    assert not p.grad.is_inference()


def test_a_strided_gradient_is_not_reused():
    """A gradient of other strides than the new one's (a user's ``p.grad = ...``) keeps them; the new one is dense."""
    twin = Twin()

    def act(p):
        p.grad = torch.empty_strided(p.shape, (1, p.shape[0]), device=L)
        lazy.mark_step()
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    assert p.grad.stride() == twin.eager.net[0].weight.grad.stride()


def test_an_updated_gradient_is_not_reused():
    """An in-place update moves the wrapper's version counter; a new gradient's reads 0 (check() asserts it)."""
    twin = Twin()

    def act(p):
        p.grad.mul_(2)
        lazy.mark_step()
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1


def test_ir_recorded_on_the_old_gradient_reads_its_old_values():
    """IR holds the old data leaf, not the storage: the gradient is reused and the unsynced norm is the old one's."""
    twin = Twin()
    p, (n, before), reused = _break_then_step(twin, lambda p: (p.grad.norm(), p.grad.cpu()))
    assert reused == len(twin.params)
    torch.testing.assert_close(n.item(), before.norm().item(), rtol=1e-6, atol=0)


def test_a_saved_gradient_keeps_its_values_for_backward():
    twin = Twin()

    def act(p):
        a = torch.ones(p.shape, device=L, requires_grad=True)
        return a, (a * p.grad).sum(), p.grad.cpu()
    p, (a, y, before), reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    y.backward()
    torch.testing.assert_close(a.grad.cpu(), before, rtol=0, atol=0)


def test_a_kept_storage_is_not_shared_with_the_new_gradient():
    twin = Twin()
    p, s, reused = _break_then_step(twin, lambda p: p.grad.untyped_storage())
    assert reused == len(twin.params) - 1
    assert p.grad.untyped_storage()._cdata != s._cdata


@pytest.mark.parametrize("hold", ["storage", "weak storage"])
def test_a_held_lazy_storage_keeps_its_value(hold):
    """Lazy's own storage object, held or weakly referenced (nothing in lazy does either today), is not reused."""
    twin = Twin()

    def act(p):
        st = p.grad._lz_st
        return (st, st.value) if hold == "storage" else (weakref.ref(st), None)
    p, (st, value), reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 1
    if hold == "storage":
        assert st.value is value and p.grad._lz_st is not st
    else:
        assert st() is None


def test_a_gradient_shared_by_two_parameters_is_not_reused():
    """net[0].bias and net[2].bias (both 32) given one gradient: neither reuses it; each gets a gradient of its own."""
    twin = Twin()

    def act(p):
        twin.lazy.net[2].bias.grad = twin.lazy.net[0].bias.grad
    p, _, reused = _break_then_step(twin, act)
    assert reused == len(twin.params) - 2
    assert twin.lazy.net[2].bias.grad is not twin.lazy.net[0].bias.grad


def test_a_function_returning_the_new_gradient_returns_eager_values():
    """A created gradient that is also returned is never offered for reuse (the capture rule, conservative)."""
    twin = Twin(step=_step_returning_grad)
    for k in range(5):
        got, want, reused = twin.step()
        twin.check(got, want, reused)
        assert got[1] is twin.params[0].grad
        assert reused == (len(twin.params) - 1 if k >= 3 else 0)
    kept = got[1]
    before = kept.cpu()
    twin.check(*twin.step())
    torch.testing.assert_close(kept.cpu(), before, rtol=0, atol=0)
    assert kept is not twin.params[0].grad
    assert entry_of(twin).reusable_grads == len(twin.params) - 1


def test_a_function_returning_the_old_gradient_reuses_nothing():
    """A replay that reads a ``.grad`` after making its new tensors (here: returns the old one) reuses nothing."""
    twin = Twin(step=_step_returning_old_grad)
    previous = None
    for k in range(5):
        got, want, reused = twin.step()
        twin.check(got, want, reused)
        assert reused == 0
        if previous is not None:
            torch.testing.assert_close(got[1].cpu(), previous, rtol=0, atol=0)
            assert got[1] is not twin.params[0].grad
        previous = twin.params[0].grad.cpu()
        del got
    assert entry_of(twin).reusable_grads == 0


class _Recorder:
    """``recorder.v = x`` runs a setter that remembers the gradient the first layer's weight has then."""

    def __init__(self, model):
        self.model, self.last = model, None

    @property
    def v(self):
        return None

    @v.setter
    def v(self, x):
        self.last = self.model.net[0].weight.grad


def _step_with_a_setter(model, opt, x, y):
    model.recorder.v = 1  # a store that runs code: a replay runs it with its stores, after its new tensors
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def test_a_store_running_code_sees_the_old_gradient_unchanged():
    """A setter a replay runs among its stores reads the old gradient (the stores that replace it come after): no
    wrapper is reused in such a replay, so what it reads has the old values, as eager's setter saw them."""
    twin = Twin(step=_step_with_a_setter)
    twin.eager.recorder = _Recorder(twin.eager)
    twin.lazy.recorder = _Recorder(twin.lazy)
    for _ in range(4):
        before = twin.params[0].grad.cpu() if twin.params[0].grad is not None else None
        want_before = twin.eager.net[0].weight.grad
        want_before = want_before.clone() if want_before is not None else None
        got, want, reused = twin.step()
        twin.check(got, want, reused)
        assert reused == 0
        if before is not None:
            torch.testing.assert_close(twin.lazy.recorder.last.cpu(), before, rtol=0, atol=0)
            torch.testing.assert_close(twin.eager.recorder.last, want_before)
    assert entry_of(twin).reusable_grads == 0


def test_a_reused_gradient_takes_the_place_of_a_new_storage():
    """A reused wrapper's storage is the newest, in the order the new tensors would have been made: mark_step orders
    its outputs by it (a stable graph key whether or not a gradient was reused)."""
    twin = Twin()
    twin.warm()
    serials = [p.grad._lz_st.serial for p in twin.params]
    twin.check(*twin.step())
    now = [p.grad._lz_st.serial for p in twin.params]
    assert all(b > a for a, b in zip(serials, now))
    live = [st.serial for st in _C.live_storages()]
    assert live == sorted(live)


# ---------------------------------------------------------------------------------------------------------------
# new_tensors itself: the checks a replay cannot reach

def _param_with_grad(shape=(4, 3), sync=True):
    p = torch.zeros(shape, device=L, requires_grad=True)
    p.grad = torch.ones(shape, device=L)
    if sync:
        lazy.mark_step()
    return p


def _new_tensor(p, owner=True, desc=None, numel=None, out=None):
    """``_C.new_tensors`` of one tensor like ``p`` over a new output, offering ``p``'s gradient for reuse."""
    shape = tuple(p.shape)
    out = torch.full(shape, 2.0, device=lazy.config.backing_device) if out is None else out
    desc = (shape, (shape[1], 1), 0, torch.float32) if desc is None else desc
    numel = shape[0] * shape[1] if numel is None else numel
    (t,) = _C.new_tensors((desc,), [out], (0,), (numel,), (p if owner else None,))
    return t, out


def test_new_tensors_reuses_a_sole_gradient():
    p = _param_with_grad()
    old, serial = id(p.grad), p.grad._lz_st.serial
    t, out = _new_tensor(p)
    assert id(t) == old and p.grad is t
    assert t._lz_st.value.data is out and t._lz_st.serial > serial
    torch.testing.assert_close(t.cpu(), torch.full((4, 3), 2.0))
    t2, _ = _new_tensor(p, owner=False)
    assert t2 is not t


def test_new_tensors_takes_an_equal_desc_object():
    p = _param_with_grad()
    desc = ((4, 3), (3, 1), 0, torch.float32)
    assert p.grad._lz_desc == desc and p.grad._lz_desc is not desc
    t, _ = _new_tensor(p, desc=desc)
    assert p.grad is t and t._lz_desc is desc


def test_new_tensors_offers_one_wrapper_once():
    """One owner offered twice in a call: the first takes the wrapper, the second a new tensor."""
    p = _param_with_grad()
    old = id(p.grad)
    device = lazy.config.backing_device
    outs = [torch.full((4, 3), 2.0, device=device), torch.full((4, 3), 3.0, device=device)]
    desc = ((4, 3), (3, 1), 0, torch.float32)
    a, b = _C.new_tensors((desc, desc), outs, (0, 1), (12, 12), (p, p))
    assert id(a) == old and b is not a
    torch.testing.assert_close(a.cpu(), torch.full((4, 3), 2.0))
    torch.testing.assert_close(b.cpu(), torch.full((4, 3), 3.0))


def test_new_tensors_reuses_no_gradient_under_a_torch_function_mode():
    from torch.overrides import TorchFunctionMode

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    p = _param_with_grad()
    old = id(p.grad)  # (holding it would keep it from being reused anyway)
    with Passthrough():
        t, _ = _new_tensor(p)
    assert id(t) != old
    t, _ = _new_tensor(p)
    assert id(t) == old  # and without the mode it is


def test_new_tensors_reuses_no_gradient_behind_a_grad_property():
    class Shadowed(LazyTensor):
        @property
        def grad(self):
            return None
    p = _param_with_grad()
    old = id(torch._C.TensorBase.grad.__get__(p))
    p.__class__ = Shadowed
    t, _ = _new_tensor(p)
    assert id(t) != old


def test_new_tensors_reuses_no_gradient_holding_ir():
    p = _param_with_grad(sync=False)
    old = p.grad
    assert not old._lz_st.value.is_data
    del old
    t, _ = _new_tensor(p)
    assert t is not p.grad


def test_new_tensors_reuses_no_gradient_whose_graph_failed():
    p = _param_with_grad()
    st = p.grad._lz_st
    st.failed = st.value
    del st
    old = id(p.grad)
    t, _ = _new_tensor(p)
    assert id(t) != old


@pytest.mark.parametrize("what", ["numel", "stride", "offset", "dtype"])
def test_new_tensors_reuses_no_gradient_of_other_metadata(what):
    p = _param_with_grad()
    old = id(p.grad)
    device = lazy.config.backing_device
    if what == "numel":
        t, _ = _new_tensor(p, numel=13)
    elif what == "stride":
        t, _ = _new_tensor(p, desc=((4, 3), (1, 4), 0, torch.float32), out=torch.zeros(3, 4, device=device).t())
    elif what == "offset":
        t, _ = _new_tensor(p, desc=((4, 3), (3, 1), 1, torch.float32))
    else:
        wide = torch.zeros(4, 3, dtype=torch.float64, device=device)
        t, _ = _new_tensor(p, desc=((4, 3), (3, 1), 0, torch.float64), out=wide)
    assert id(t) != old
