"""Guard programs (csrc/capture_guards.cpp, lazy/capture/guards.py): every guard kind, hitting and missing, gives
the answer of the Python check rendered for the same guards (lazy/capture/replay.py)."""
import collections
import math

import pytest
import torch

import lazy
from lazy.capture import expr as X
from lazy.capture.expr import E, Renderer
from lazy.capture.function import state_of
from lazy.capture.guards import OP, _Builder, compile_guards
from lazy.capture.guards import tensor_signature
from lazy.capture.python_guards import STATE_CALLS, _python_check, global_state

L = "lazy"


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Raises:
    @property
    def boom(self):
        raise RuntimeError("a property that raises")


def check_both(guards, A, state=None):
    """(C answer, Python answer, residual guards) for ``guards`` on the bound arguments ``A``."""
    state = global_state() if state is None else state
    program, residual = compile_guards(state, guards, STATE_CALLS, tensor_signature)
    rest = _python_check(Renderer(), [((k, e), v) for k, e, v in residual], None) if residual else None
    c = bool(program(A)) and (rest is None or bool(rest(A)))
    python = bool(_python_check(Renderer(), [((k, e), v) for k, e, v in guards], state)(A))
    return c, python, residual


A0 = X.arg(0)
HELD = Obj(a=1)
KEY = torch.zeros(())


class Keyed:
    """An object whose ``keys()`` returns what it was given."""

    def __init__(self, keys):
        self._keys = keys

    def keys(self):
        return self._keys


class KeysRaise:
    def keys(self):
        raise RuntimeError("keys() that raises")


def _reordered():
    d = collections.OrderedDict(a=1, b=2)
    d.move_to_end("a")  # dict's own order is still a, b
    return d


def _bypassed():
    d = collections.OrderedDict(a=1, b=2)
    dict.__delitem__(d, "b")  # a key dict holds no more, still in the OrderedDict's order
    return d
NAN = float("nan")


# Modules whose attributes the program reads from the dicts Module.__getattr__ reads (Note [Module attributes in
# guard programs]): what it finds and misses must be what Python finds.
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("buf", torch.zeros(2))
        self.scale = 2

    @property
    def doubled(self):
        return self.scale * 2

    def forward(self, x):
        return x


class Forwarding(torch.nn.Module):  # its own __getattr__: the generic lookup
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def __getattr__(self, name):
        return "forwarded" if name == "magic" else super().__getattr__(name)

    def forward(self, x):
        return -x


NET = Net()
SHADOWED = Net()
SHADOWED.__dict__["lin"] = "an instance attribute"  # found before _modules, as Python's lookup finds it
RENAMED = Net()
RENAMED._parameters["scale2"] = RENAMED.lin.weight
EMPTY_NET = Net()
del EMPTY_NET.lin
FORWARDING = Forwarding()
PATCHED = Net()
PATCHED.forward = lambda *a: None  # an instance attribute: no __func__
REBOUND = Net()
REBOUND.forward = Net.forward.__get__(REBOUND)  # a bound method in the instance dict: its __func__ is still Net's


class Doubling(dict):
    def __getitem__(self, key):
        return 2 * dict.__getitem__(self, key)


class Intercepting(Net):
    def __getattribute__(self, name):
        if name == "forward" and object.__getattribute__(self, "other"):
            return Forwarding.forward.__get__(self)
        return super().__getattribute__(name)


GETATTRIBUTE = Intercepting()
GETATTRIBUTE.other = False
GETATTRIBUTE_OTHER = Intercepting()
GETATTRIBUTE_OTHER.other = True


def attrs(*names):
    e = A0
    for n in names:
        e = X.attr(e, n)
    return e

# (name, guards, hitting arguments, missing arguments)
CASES = [
    ("id", [("id", A0, HELD)], [(HELD,)], [(Obj(a=1),), (None,)]),
    ("type", [("type", A0, int)], [(3,), (-7,)], [(3.0,), (True,), ("3",)]),
    ("eq int", [("eq", A0, 3)], [(3,)], [(3.0,), (4,), (True,), (None,)]),
    ("eq float", [("eq", A0, 0.5)], [(0.5,)], [(0.25,), (1,)]),
    ("eq nan", [("eq", A0, NAN)], [], [(NAN,), (math.nan,)]),
    ("eq bool", [("eq", A0, True)], [(True,)], [(1,), (False,)]),
    ("eq str", [("eq", A0, "mean")], [("mean",)], [("sum",), (b"mean",)]),
    ("eq none", [("eq", A0, None)], [(None,)], [(0,)]),
    ("truth", [("truth", A0, False)], [([],), (0,), ({},)], [([1],), (1,)]),
    ("isnone", [("isnone", A0, True)], [(None,)], [(0,), ("",)]),
    ("len", [("len", A0, 2)], [([1, 2],), ((3, 4),), ("ab",)], [([1],), (3,)]),
    ("keys", [("keys", A0, ("a", "b"))], [({"a": 1, "b": 2},)], [({"b": 2, "a": 1},), ({"a": 1},), ([],)]),
    # Note [Key guards in C]: keys() of what has one, in its order; equal keys of one type that are not tensors
    ("keys of other mappings", [("keys", A0, ("a", "b"))],
     [(collections.OrderedDict(a=1, b=2),), (Keyed(["a", "b"]),), ({"".join(["a"]): 1, "b": 2},)],
     [(_reordered(),), (_bypassed(),), (Keyed(["a"]),), (Keyed(None),), (KeysRaise(),), ("ab",), (None,)]),
    ("keys of one type", [("keys", A0, (1, "x", 2.5))], [({1: 0, "x": 0, 2.5: 0},)],
     [({1.0: 0, "x": 0, 2.5: 0},), ({True: 0, "x": 0, 2.5: 0},), (Keyed([1, "x", 2]),)]),
    ("keys that are tensors", [("keys", A0, (KEY,))], [({KEY: 0},)], [(Keyed([torch.zeros(())]),)]),
    ("no keys", [("keys", A0, ())], [({},), (collections.OrderedDict(),)], [(_bypassed(),), ({0: 0},)]),
    ("absent", [("absent", A0, "k")], [({"j": 1},), ([],)], [({"k": 1},), (3,)]),
    ("noattr", [("noattr", A0, "a")], [(Obj(b=1),), (Raises(),)], [(Obj(a=None),)]),
    ("hasattr", [("hasattr", A0, ("a", True))], [(Obj(a=1),)], [(Obj(),)]),
    ("hasattr raising", [("hasattr", A0, ("boom", False))], [], [(Raises(),)]),
    ("attribute chain", [("eq", X.attr(X.attr(A0, "inner"), "n"), 2)],
     [(Obj(inner=Obj(n=2)),)], [(Obj(inner=Obj(n=3)),), (Obj(inner=None),), (Obj(),)]),
    ("item chain", [("eq", X.item(X.item(A0, "lr"), 0), 0.1)],
     [({"lr": [0.1]},)], [({"lr": [0.2]},), ({"lr": []},), ({},), (None,)]),
    ("held object", [("eq", X.item(X.pinned({"k": 5}), "k"), 5)], [(None,)], []),
    ("item at a loaded key", [("type", X.item(X.arg(1), X.item(A0, 0)), dict)],  # optimizer.state[param]
     [([HELD], {HELD: {}}), ([3], {3: {}, 4: 1})], [([HELD], {HELD: 1}), ([Obj()], {HELD: {}}), ([4], {3: {}, 4: 1}),
                                                     ([], {HELD: {}})]),
    ("property that raises", [("truth", X.attr(A0, "boom"), True)], [], [(Raises(),)]),
    ("module: submodule, parameter, buffer", [("id", attrs("lin"), NET.lin), ("id", attrs("lin", "weight"),
                                                                              NET.lin.weight),
                                               ("id", attrs("buf"), NET.buf)],
     [(NET,)], [(Net(),), (SHADOWED,), (EMPTY_NET,), (Obj(lin=NET.lin),)]),
    ("module: instance dict, property", [("eq", attrs("scale"), 2), ("eq", attrs("doubled"), 4)],
     [(NET,), (Obj(scale=2, doubled=4),)], [(Obj(scale=2),)]),
    ("module: shadowing instance attribute", [("eq", attrs("lin"), "an instance attribute")],
     [(SHADOWED,)], [(NET,)]),
    ("module: parameter only in _parameters", [("id", attrs("scale2"), RENAMED.lin.weight)],
     [(RENAMED,)], [(NET,)]),
    ("module: missing attribute", [("noattr", A0, "lin")], [(EMPTY_NET,)], [(NET,)]),
    ("module: own __getattr__", [("eq", attrs("magic"), "forwarded"), ("id", attrs("lin"), FORWARDING.lin)],
     [(FORWARDING,)], [(NET,)]),
    ("second argument", [("type", X.arg(1), float)], [(0, 1.5)], [(0, 1), (0,)]),
    # Note [Arithmetic in guard programs]: Python's operators in the program; raising (a division by 0) fails
    ("arithmetic", [("type", A0, int), ("eq", X.binary("+", A0, 1), 3)], [(2,)], [(3,), (2.0,)]),
    ("floor division", [("eq", X.binary("//", 384, A0), 64)], [(6,)], [(5,), (6.0,), (0,), ("6",)]),
    ("comparison", [("truth", E("cmp", "<", A0, 0.0), False), ("truth", E("cmp", ">=", A0, 1), False)],
     [(0.5,), (NAN,), (0,)], [(-1.0,), (1,), (None,)]),
    ("membership", [("truth", E("cmp", "in", "a", A0), True), ("truth", E("cmp", "not in", "b", A0), True)],
     [({"a": 1},), ("ab"[:1],)], [({},), ({"a": 1, "b": 2},), (None,), (3,)]),
    ("len", [("truth", E("cmp", "==", X.call(len, (A0,)), 0), True)], [({},), ([],)], [({1: 2},), (None,), (3,)]),
    # Note [Objects reached twice]: two loads of one object
    ("same", [("same", X.attr(A0, "a"), X.item(X.arg(1), 0))], [(Obj(a=HELD), [HELD])],
     [(Obj(a=Obj()), [HELD]), (Obj(a=1), [1.0]), (Obj(), [HELD]), (Obj(a=HELD), [])]),
    # Note [Method guards]: a method's function read without binding it, and the cases that bind it
    ("method", [("id", X.attr(attrs("forward"), "__func__"), Net.forward)],
     [(NET,), (SHADOWED,)], [(FORWARDING,), (PATCHED,), (torch.nn.Linear(2, 2),), (Obj(),)]),
    ("method shadowed by a bound method", [("id", X.attr(attrs("forward"), "__func__"), Net.forward)],
     [(REBOUND,)], []),
    ("method of a class with its own __getattribute__", [("id", X.attr(attrs("forward"), "__func__"), Net.forward)],
     [(GETATTRIBUTE,)], [(GETATTRIBUTE_OTHER,)]),
    ("other calls (residual)", [("eq", X.call(sorted, (A0,)), [1, 2])], [([2, 1],)], [([1],)]),
    # dict subclasses: one that keeps dict's __getitem__ (missing keys call __missing__), one with its own
    ("defaultdict item", [("eq", X.item(A0, "k"), 0)],
     [(collections.defaultdict(int),), (collections.defaultdict(int, k=0),)], [(collections.defaultdict(list),),
                                                                               (collections.defaultdict(int, k=1),)]),
    ("dict subclass with its own __getitem__", [("eq", X.item(A0, "k"), 2)], [(Doubling(k=1),)],
     [(Doubling(k=2),), ({"k": 1},)]),
]


@pytest.mark.parametrize("name,guards,hits,misses", CASES, ids=[c[0] for c in CASES])
def test_each_guard_kind_agrees_with_the_python_check(name, guards, hits, misses):
    for A in hits:
        assert check_both(guards, A)[:2] == (True, True), A
    for A in misses:
        assert check_both(guards, A)[:2] == (False, False), A
    residual = check_both(guards, hits[0] if hits else misses[0])[2]
    assert bool(residual) == name.endswith("(residual)")


def test_lazy_tensor_signature():
    x = torch.randn(3, 4).to(L)
    guards = [("tensor", A0, tensor_signature(x))]
    changed = [torch.randn(3, 4).to(L), x.detach(), torch.randn(4, 3).to(L), torch.randn(3, 4).double().to(L),
               torch.randn(3, 4).to(L).requires_grad_(), torch.randn(4, 3).to(L).t(), x[:, :2],
               torch.randn(3, 4), None, 3.0]
    for A, want in [((x,), True)] + [((t,), tensor_signature(t) == guards[0][2]) for t in changed]:
        got = check_both(guards, A)
        assert got[:2] == (want, want), (A, got)
    assert check_both(guards, (changed[0],))[:2] == (True, True)  # same metadata, other data: the guard holds
    assert check_both(guards, (changed[2],))[:2] == (False, False)


class HostSubclass(torch.Tensor):  # read through tensor_signature, not the TensorImpl
    pass


class GradProperty(torch.Tensor):  # its own ``grad``: the program must read it as Python does
    @property
    def grad(self):
        return None


def _with_grad(t):
    torch._C.TensorBase.grad.__set__(t, torch.ones_like(t))  # past a subclass's own property
    return t


def test_gradient_guards():
    """Note [Gradients in guard programs]: ``x.grad is None`` read from the TensorImpl gives Python's answer for lazy
    and host parameters and plain tensors, with and without a gradient; a subclass's own ``grad``, a
    TorchFunctionMode that answers for ``grad`` and non-tensors take Python's lookup."""
    from torch.overrides import TorchFunctionMode

    class NoGrads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func == torch.Tensor.grad.__get__:
                return None
            return func(*args, **(kwargs or {}))

    def fresh():
        return [torch.nn.Parameter(torch.randn(2).to(L)), torch.nn.Parameter(torch.randn(2)),
                torch.randn(2, requires_grad=True)]

    without, with_ = fresh(), [_with_grad(t) for t in fresh()]
    overriding = _with_grad(torch.Tensor._make_subclass(GradProperty, torch.randn(2), True))
    is_none = [("isnone", X.attr(A0, "grad"), True)]
    has_grad = [("isnone", X.attr(A0, "grad"), False)]
    for guards, hits, misses in ((is_none, without + [overriding, Obj(grad=None)], with_ + [Obj(grad=1), Obj()]),
                                 (has_grad, with_ + [Obj(grad=1)], without + [overriding, Obj(grad=None), Obj()])):
        builder = _Builder()
        assert builder.guard(*guards[0], tensor_signature)
        assert [ins[0] for ins in builder.code] == [OP["arg"], OP["grad_is_none"]]
        for A in hits:
            assert check_both(guards, (A,))[:2] == (True, True), A
        for A in misses:
            assert check_both(guards, (A,))[:2] == (False, False), A
    with NoGrads():  # the mode answers None for every tensor: so must the program
        for t in with_:
            assert check_both(is_none, (t,))[:2] == (True, True)
            assert check_both(has_grad, (t,))[:2] == (False, False)


def test_host_tensor_signature():
    """Host tensors (an optimizer's step counters, a batch) are checked from the TensorImpl: every field of
    tensor_signature's "host" tuple misses on its own."""
    t = torch.randn(2, 3)
    base = torch.randn(10)
    guards = [("tensor", A0, tensor_signature(t))]
    program, residual = compile_guards(global_state(), guards, STATE_CALLS, tensor_signature)
    assert not residual
    for other, want in ((torch.randn(2, 3), True), (torch.randn(3, 2), False), (t.t(), False),
                        (torch.randn(2, 3, dtype=torch.float64), False), (t.to(L), False),
                        (torch.randn(2, 3, requires_grad=True), False), (base[:6].view(2, 3), True),
                        (base[1:7].view(2, 3), False), (torch.randn(2, 3, device="meta"), False),
                        (torch.randn(2, 3).as_subclass(HostSubclass), True), (torch.randn(2), False), (3.0, False),
                        (torch.nn.Parameter(torch.randn(2, 3)), False)):
        assert check_both(guards, (other,))[:2] == (want, want), other
    counter = torch.tensor(4.0)
    guards = [("tensor", A0, tensor_signature(counter))]
    for other, want in ((torch.tensor(5.0), True), (torch.tensor([5.0]), False), (torch.tensor(5), False)):
        assert check_both(guards, (other,))[:2] == (want, want), other


def test_global_state():
    guards, state = [("type", A0, int)], global_state()
    assert check_both(guards, (1,), state)[:2] == (True, True)
    with torch.no_grad():
        assert check_both(guards, (1,), state)[:2] == (False, False)
    with torch.autocast("cpu"):
        assert check_both(guards, (1,), state)[:2] == (False, False)
    with torch.inference_mode():
        assert check_both(guards, (1,), state)[:2] == (False, False)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert check_both(guards, (1,), state)[:2] == (False, False)
    finally:
        torch.set_default_dtype(previous)
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        assert check_both(guards, (1,), state)[:2] == (False, False)
    finally:
        torch.set_autocast_dtype("cpu", state[3])
    with lazy.config.override(backing_device="meta"):
        assert check_both(guards, (1,), state)[:2] == (False, False)
    assert check_both(guards, (1,), state)[:2] == (True, True)


def test_captured_entries_agree_on_perturbed_calls():
    """A whole capture's guards (a module, a global, an argument list, tensors, numbers): the entry's program and its
    Python check agree on the call it was made for and on calls that change each argument."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(L)

    def f(x, ys, n, flag, opts):
        out = model(x) * n
        for y in ys:
            out = out + y
        return out if flag else -out * opts["scale"]

    with lazy.config.override(capture_verify=False):
        lazy.compile(f)
        x = torch.randn(2, 4).to(L)
        ys = [torch.randn(2, 4).to(L)]
        with torch.no_grad():
            f(x, ys, 2, False, {"scale": 0.5})
        entry = state_of(f).entries[0]
        assert not entry.residual_guards and entry.guard_program.size > 20
        base = (x, ys, 2, False, {"scale": 0.5})
        variants = [base, (x.double(), ys, 2, False, {"scale": 0.5}), (x, ys + ys, 2, False, {"scale": 0.5}),
                    (x, [], 2, False, {"scale": 0.5}), (x, ys, 3, False, {"scale": 0.5}),
                    (x, ys, 2, True, {"scale": 0.5}), (x, ys, 2, False, {"scale": 0.7}), (x, ys, 2, False, {}),
                    (x, [torch.randn(3, 4).to(L)], 2, False, {"scale": 0.5})]
        with torch.no_grad():
            answers = [(bool(entry.check(A)), bool(entry.python_check(A))) for A in variants]
        assert all(c == p for c, p in answers), answers
        assert answers[0] == (True, True) and sum(c for c, _ in answers) >= 2  # the base call and a runtime scalar
        assert not entry.check(base)  # grad mode differs from the capture's
    lazy.compile.reset()


def test_load_programs_return_what_python_reads():
    """Note [Replay loads in C]: a replay's loads as a program of the guard instructions give what Python's reads
    give (modules' attributes included); an expression they cannot load is left to Python; a load that finds
    nothing raises."""
    from lazy.capture.guards import compile_loads

    state = {NET.lin: {"step": 3}}
    exprs = [attrs("lin", "weight"), attrs("doubled"), X.item(X.item(X.arg(1), attrs("lin")), "step"),
             X.binary("+", attrs("scale"), 1), X.call(sorted, (X.arg(2),)), X.attr(X.pinned(HELD), "a")]
    program, which = compile_loads(exprs)
    assert which == [0, 1, 2, 3, 5]  # sorted() is no load
    assert program((NET, state, [2, 1])) == (NET.lin.weight, 4, 3, 3, 1)
    with pytest.raises(AttributeError):
        program((SHADOWED, state, []))  # its instance attribute "lin", a string, found first as Python finds it
    with pytest.raises(AttributeError):
        program((EMPTY_NET, state, []))
    with pytest.raises(LookupError):
        program((NET, {}, []))



def test_programs_answer_alike_with_and_without_prefetch():
    """Note [Prefetching what the last run read]: a program prefetches the addresses its last run read, never reads
    them; it answers the same with the prefetch off, and after what its last run read was freed (the argument of
    the call before)."""
    import gc

    from lazy import _C

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(L)
    holder = Obj(model=model)

    def f(x):
        return holder.model(x)

    try:
        with lazy.config.override(capture_verify=False), torch.no_grad():
            lazy.compile(f)
            f(torch.randn(2, 4).to(L))
            program = state_of(f).entries[0].guard_program
            for prefetch in (True, False):
                _C.set_guard_prefetch(prefetch)
                assert program((torch.randn(2, 4).to(L),))  # its tensor freed right after: stale addresses
                gc.collect()
                assert program((torch.randn(2, 4).to(L),)) and program((torch.randn(2, 4).to(L),))
                assert program.prefetched > program.size or not prefetch  # what the runs read, recorded
                assert not program((torch.randn(3, 4).to(L),)) and not program((torch.randn(2, 4),))
                holder.model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(L)
                assert not program((torch.randn(2, 4).to(L),))  # another module: its identity guard fails
                holder.model = model
                assert program((torch.randn(2, 4).to(L),))
    finally:
        _C.set_guard_prefetch(True)
        lazy.compile.reset()


class Holder(torch.nn.Module):  # a class of its own: the test changes its class attributes
    flag = "class value"

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.w = torch.nn.Parameter(torch.randn(2))
        self.register_buffer("buf", torch.zeros(2))
        self.n = 3


def _state_changes(net, opts, tensor, mod, other):
    """(description, change) pairs applied one after the other to the objects the memo test's guards read; each
    change is followed by a check, so every load meets its dicts changed, restored and changed back."""
    lin, w, lr = net.lin, net.w, opts[0]["lr"]
    return [
        ("nothing", lambda: None),
        ("submodule replaced", lambda: setattr(net, "lin", torch.nn.Linear(2, 2))),
        ("submodule restored", lambda: setattr(net, "lin", lin)),
        ("parameter replaced in _parameters", lambda: net._parameters.__setitem__("w", other)),
        ("parameter restored", lambda: net._parameters.__setitem__("w", w)),
        ("instance attribute shadows the submodule", lambda: net.__dict__.__setitem__("lin", "shadow")),
        ("shadow removed", lambda: net.__dict__.pop("lin")),
        ("instance attribute changed", lambda: setattr(net, "n", 4)),
        ("instance attribute set back", lambda: setattr(net, "n", 3)),
        ("class attribute changed", lambda: setattr(Holder, "flag", "another")),
        ("class attribute set back", lambda: setattr(Holder, "flag", "class value")),
        ("instance attribute shadows the class attribute", lambda: setattr(net, "flag", "mine")),
        ("shadow deleted", lambda: delattr(net, "flag")),
        ("property on the class shadows the instance", lambda: setattr(Holder, "n", property(lambda s: 5))),
        ("property removed", lambda: delattr(Holder, "n")),
        ("instance dict replaced", lambda: setattr(net, "__dict__", dict(net.__dict__))),
        ("item changed", lambda: opts[0].__setitem__("lr", 0.5)),
        ("item set back", lambda: opts[0].__setitem__("lr", lr)),
        ("item removed and added", lambda: (opts[0].pop("lr"), opts[0].__setitem__("lr", lr))),
        ("optimizer state moved to another key", lambda: opts[1].__setitem__(other, opts[1].pop(w))),
        ("optimizer state back", lambda: opts[1].__setitem__(w, opts[1].pop(other))),
        ("tensor requires grad (outside any dict)", lambda: tensor.requires_grad_(True)),
        ("tensor requires no grad", lambda: tensor.requires_grad_(False)),
        ("tensor data of another shape", lambda: setattr(tensor, "data", torch.randn(5).to(L))),
        ("tensor data of the first shape", lambda: setattr(tensor, "data", torch.randn(3).to(L))),
        ("module attribute changed", lambda: setattr(mod, "value", 2)),
        ("module attribute set back", lambda: setattr(mod, "value", 1)),
        ("class of the holder changed", lambda: setattr(net, "__class__", type("Sub", (Holder,), {"n": 7}))),
        ("class restored", lambda: setattr(net, "__class__", Holder)),
    ]


def test_memoized_loads_follow_every_change():
    """Note [Loads memoized by dict versions]: one program run again and again while the objects it reads change
    (submodules, parameters, instance and class attributes, properties, dict items, optimizer state keyed by a
    parameter, a lazy tensor's signature, module globals, the object's class) answers what the Python check answers
    after every change, with the memos on and off."""
    import types

    from lazy import _C

    net = Holder().to(L)
    tensor = torch.randn(3).to(L)
    other = torch.nn.Parameter(torch.randn(2).to(L))
    mod = types.ModuleType("settings")
    mod.value = 1
    opts = [{"lr": 0.1}, collections.defaultdict(dict, {net.w: {"step": 1}})]  # as an optimizer's state
    guards = [
        ("id", attrs("lin"), net.lin), ("id", attrs("lin", "weight"), net.lin.weight), ("id", attrs("w"), net.w),
        ("id", attrs("buf"), net.buf), ("eq", attrs("n"), 3), ("eq", attrs("flag"), "class value"),
        ("eq", X.item(X.item(X.arg(1), 0), "lr"), 0.1),
        ("type", X.item(X.item(X.arg(1), 1), X.attr(A0, "w")), dict),
        ("tensor", X.arg(2), tensor_signature(tensor)),
        ("eq", X.attr(X.arg(3), "value"), 1),
    ]
    A = (net, opts, tensor, mod)
    python = _python_check(Renderer(), [((k, e), v) for k, e, v in guards], global_state())
    try:
        for memos in (True, False):
            _C.set_guard_memos(memos)
            program, residual = compile_guards(global_state(), guards, STATE_CALLS, tensor_signature)
            assert not residual
            answers = []
            for what, change in _state_changes(net, opts, tensor, mod, other):
                change()
                for _ in range(2):  # the second run reads through the memos the first one made
                    want = bool(python(A))
                    assert bool(program(A)) == want, (what, memos)
                answers.append(want)
            assert answers.count(False) >= 10 and answers[0] and answers[-1]  # the changes were seen
    finally:
        _C.set_guard_memos(True)
