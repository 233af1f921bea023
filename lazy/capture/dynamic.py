"""Captures with symbolic sizes (``lazy.compile(dynamic=True)``): one capture replayed at other sizes.

Note [Dynamic captures]
A capture with ``dynamic=True`` runs the function as any capture does (lazy/capture/function.py), with its lazy
tensor arguments as ``SymLazy`` tensors of a symbolic recording (lazy/capture/symbolic.py): every dimension of size
2 or more is a symbol, as in Dynamo. The capture's entry is the ordinary one, at the call's own sizes (its graph
is the concrete twins' graph); the recording's op list rides along. A call at other sizes that the entry's shape
guards refuse is checked instead against the entry's other guards, each dynamic argument's rank, dtype, layout
(dense) and ``requires_grad``, and the recording's guards on the symbols (Note [Checks of symbolic sizes]); where
they hold, the op list is replayed at the new sizes, without the function's Python, into a graph that must be the
entry's graph node for node (ops, dtypes, ranks, inputs, runtime scalars and their kinds), whose inputs are the
same storages and whose outputs are the same tensors; it is compiled once per sizes (``Sized``) and replays with
the entry's rendered run, reading from it what depends on the sizes. A graph that differs, a guard that fails, a
size outside a symbol's range: the call captures again, as without ``dynamic``.

Note [Dropping the symbolic recording]
The capture run is the call itself: what the function stores and returns, the user keeps. So the symbolic
recording is a passenger that steps off where it cannot follow, and the capture goes on with the concrete
tensors: an op FakeTensor has no kernel for, a read of data, an op that moves a tensor off the lazy device. Its
entry is then the ordinary, static one. Autograd it follows: a training step's forward, backward and optimizer
step are one op list, and the symbolic tensors carry the autograd history the user's code sees. At the end of the
run the recording steps off for good (ops on its tensors run on their twins from then on), and every ``SymLazy``
without autograd history and every symbolic size the call leaves behind (returned, stored in an object, a list, a
dict, a cell, a ``.grad``) is replaced by its concrete twin or its value, at the places the capture's effects
recorded (``Effect.held``) where they still hold it, so the caller sees the objects a capture without symbolic
sizes gives. (A tensor with history that
escapes, which breaks the capture anyway, stays symbolic: it runs on its twin, its history with it.) Building the
graph of new sizes records the op list's random ops, which draw seeds: the generators are put back after it.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from ..cache import graph_cache
from ..debug import metrics
from ..device.backing import backing_device
from ..device.tensor import LazyTensor, live_storages
from ..ir.graph import Linearized, linearize
from ..ir.node import DATA
from ..sync import mark_step, pending_storages
from . import expr as X
from .expr import _SYMBOLIC, Renderer, compile_function, value_of
from .finalize import Plan, created_output, slot_kinds
from .interpreter import Box
from .replay import guard_check
from .session import Session
from .symbolic import Recorder, SymLazy, value_at


def _dense_input(t: Any) -> bool:
    """Whether an argument may have symbolic sizes: a base lazy tensor, dense, that does not require grad."""
    return type(t) is LazyTensor and t._lz_chain is None and t.is_contiguous() and not t.requires_grad


def symbolic_arguments(bound: tuple, names: Tuple[str, ...]) -> Tuple[Recorder, tuple, List[Tuple[int, str]]]:
    """A recording whose inputs are the call's lazy tensor arguments of rank 1 or more (dimensions of size 2 or
    more symbolic), and the arguments with those replaced by their ``SymLazy``."""
    rec = Recorder(droppable=True)
    out = list(bound)
    dynamic: List[Tuple[int, str]] = []
    for i, v in enumerate(bound):
        if _dense_input(v) and any(n >= 2 for n in v.shape):
            out[i] = rec.input(names[i], v, [d for d, n in enumerate(v.shape) if n >= 2])
            dynamic.append((i, names[i]))
    return rec, tuple(out), dynamic


def concrete_result(rec: Recorder, s: Session, result: Box) -> Any:
    """Note [Dropping the symbolic recording]: the call's result, and every place it stored into, with each
    ``SymLazy`` without autograd history replaced by its concrete twin and each symbolic number by its value."""
    rec.dropped = rec.dropped or "the capture ended"  # a tensor left with autograd history runs on its twin
    concrete = _Concrete()
    for eff in s.effects:
        if eff.value is None or eff.held is None:
            continue
        obj, key = eff.held
        if eff.kind == "list_method":  # its arguments went into the list
            for a in eff.value:
                new = concrete(a.v)
                if new is not a.v:
                    obj[:] = [new if x is a.v else x for x in obj]
            continue
        old = eff.value.v
        new = concrete(old)
        if new is old:
            continue
        # only where the place still holds what this store put there (a later store may have replaced it)
        if eff.kind == "setattr" and getattr(obj, key, None) is old:
            object.__setattr__(obj, key, new) if not isinstance(obj, torch.Tensor) else setattr(obj, key, new)
        elif eff.kind == "setitem" and _item(obj, key) is old:
            obj[key] = new
        elif eff.kind == "cell_set" and _item(obj, None) is old:
            obj.cell_contents = new
    return concrete(result.v)


_MISSING = object()


def _item(obj: Any, key: Any) -> Any:
    try:
        return obj.cell_contents if key is None else obj[key]
    except (KeyError, IndexError, TypeError, ValueError):
        return _MISSING


class _Concrete:
    """A value with the recording's objects replaced: a ``SymLazy`` without history by its twin, a symbolic
    number by its value; lists, dicts and plain objects are changed in place, tuples rebuilt."""

    _OPAQUE = (torch.Tensor, torch.nn.Module, type, torch.optim.Optimizer)

    def __init__(self) -> None:
        self.memo: Dict[int, Any] = {}

    def __call__(self, v: Any, depth: int = 0) -> Any:
        if isinstance(v, SymLazy):
            return v.concrete if not v.requires_grad else v
        if isinstance(v, _SYMBOLIC):
            return value_of(v)
        if v is None or type(v) in (int, float, bool, str) or depth > 6:
            return v
        if id(v) in self.memo:
            return self.memo[id(v)]
        self.memo[id(v)] = v  # cycles: the object itself
        out = v
        if type(v) is list:
            for i, x in enumerate(v):
                y = self(x, depth + 1)
                if y is not x:
                    v[i] = y
        elif isinstance(v, dict):
            for k, x in list(v.items()):
                y = self(x, depth + 1)
                if y is not x:
                    v[k] = y
        elif isinstance(v, tuple):
            items = [self(x, depth + 1) for x in v]
            if any(y is not x for x, y in zip(items, v)):
                out = type(v)(items) if type(v) in (tuple, torch.Size) else type(v)(*items)
        elif hasattr(v, "__dict__") and not isinstance(v, self._OPAQUE) and not callable(v):
            for k, x in list(vars(v).items()):
                y = self(x, depth + 1)
                if y is not x:
                    object.__setattr__(v, k, y)
        self.memo[id(v)] = out
        return out


class Sized:
    """What a replay at one set of sizes reads besides the entry's run (``Entry.render_sized_run``)."""

    __slots__ = ("program", "consts", "scalars", "descs", "numels", "numbers")

    def __init__(self, program: Any, consts: list, scalars: tuple, descs: tuple, numels: tuple,
                 numbers: tuple) -> None:
        self.program, self.consts, self.scalars, self.descs, self.numels = program, consts, scalars, descs, numels
        self.numbers = numbers


class Shapes:
    """A capture's symbolic recording and its compiled sizes (Note [Dynamic captures])."""

    def __init__(self, rec: Recorder, dynamic: List[Tuple[int, str]], s: Session, plan: Plan, entry: Any,
                 breaks: Callable[[str], None]) -> None:
        self.rec = rec
        self.dynamic = dynamic
        self.plan = plan
        self.sizes = rec.compile_check()
        self.recorded = self.sizes({name: t.concrete for name, t in rec.inputs})
        self.variants: Dict[tuple, Optional[Sized]] = {}
        self.refused: Dict[tuple, str] = {}  # sizes whose graph is not the entry's: why
        # each dynamic argument: rank, dtype and requires_grad, dense (its shape guard, dropped, checked these)
        self.layouts = [(i, s_.dim(), s_.dtype) for (i, _), (_, s_) in zip(dynamic, rec.inputs)]
        shaped = {("tensor", X.arg(i)) for i, _ in dynamic}
        rest = [(kind, e, v) for (kind, e), v in s.guards.items() if (kind, e) not in shaped]
        self.check = guard_check(entry.state, rest)[0]  # the entry's guard program, less the dynamic shapes
        self.created_ids = [rec.id_of(t) if id(t) in rec._ids else None for t in plan.created_tensors]
        r = Renderer()
        targets = [e for _, e in plan.mutated] + [e for kind, e in plan.inputs if kind == "storage"]
        values = "".join(f"{r.expr(e)}, " for e in targets)  # first: the preamble then holds their temporaries
        self.targets = compile_function("targets", "A", r.preamble + [f"return ({values})"], r.consts)
        self.run, self.numbers = entry.render_sized_run(s, plan, breaks)

    def key(self, A: tuple) -> Optional[tuple]:
        """The symbols' values of the call ``A``, or None where the call is not one this recording serves."""
        for i, rank, dtype in self.layouts:
            t = A[i]
            if not _dense_input(t) or t.dim() != rank or t.dtype is not dtype or t._lz_st.numel != t.numel():
                return None
        if not self.check(A):
            return None
        sizes = self.sizes({name: A[i] for i, name in self.dynamic})
        return None if sizes is None or sizes == self.recorded else sizes

    def variant(self, key: tuple, A: tuple) -> Optional[Sized]:
        """The compiled graph of these sizes (built at their first call), or None where the recording does not
        give the entry's graph at them (``refused[key]`` says why)."""
        if key not in self.variants:
            if pending_storages():
                mark_step()
            with _no_collections():
                built = self._build(key, A)
            self.variants[key] = built if isinstance(built, Sized) else None
            if not isinstance(built, Sized):
                self.refused[key] = built
            metrics.bump("capture.dynamic_compiles")
        return self.variants[key]

    def _build(self, key: tuple, A: tuple) -> Any:
        """The graph of the op list at the call's sizes, compiled; else why it is not the entry's graph."""
        plan = self.plan
        if plan.lin is None or None in self.created_ids:
            return "the call returns or stores a tensor the recording did not make"
        saved = [(st, st.value, st.version) for st in live_storages()]
        # the op list's random ops draw seeds as they record: the generators are put back, as a replay draws its own
        generators = [torch.default_generator] + self.rec.generators()
        states = [g.get_state() for g in generators]
        try:
            env = self.rec.instantiate({name: A[i] for i, name in self.dynamic}, key)
            targets = self.targets(A)
            roots = [t._lz_st.value for t in targets[:len(plan.mutated)]]
            descs, numels = [], []
            for rid in self.created_ids:
                value, desc, numel = created_output(env[rid])
                roots.append(value)
                descs.append(desc)
                numels.append(numel)
            lin = linearize(roots)
        finally:
            for st, value, version in saved:  # the op list recorded into real storages: put back
                if st.value is not value:
                    st.value, st.version = value, version
            for g, state in zip(generators, states):
                g.set_state(state)
        inputs = [t._lz_st.value for t in targets[len(plan.mutated):]]
        consts = _same_graph(plan, lin, inputs)
        if type(consts) is str:
            return consts
        program = graph_cache.compiler_for(graph_cache.backend_for(backing_device()))(lin, backing_device())
        binding = dict(zip(self.rec.symbols(), key))
        numbers = tuple(value_at(v, binding) for v in self.numbers)
        return Sized(program, consts, tuple(lin.scalars), tuple(descs), tuple(numels), numbers)


# Note [No collections while a size builds]
# Building a size's graph (replaying the op list, lowering, scheduling, rendering) allocates some 10^6 objects that
# die young, nearly all freed by reference counting. With the cyclic collector on, its young collections promoted
# those alive at the time to the old generation, and that counted towards a full collection of the process's heap
# (~400k objects: torch's, the capture's; ~0.23 s on the AMD EPYC): a tiny GPT step's 20 new sizes ran 4 of them,
# 45-52 ms a size. The collector is off while a size builds (and on again after only where it was): an object freed
# leaves the young generation's count, so the build neither collects nor promotes; 1 full collection in those 20
# sizes, 22 ms a size. A cycle the build made waits for the next collection; other threads run without collections
# for the build's ~0.1 s.
@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _same_graph(plan: Plan, lin: Linearized, inputs: List[Any]) -> Any:
    """The constant inputs of ``lin`` (in order) where it is the plan's graph at other sizes: node for node the
    same op, dtype, rank, inputs and runtime scalars of the same kinds, the same outputs, and its storage inputs
    the storages the replay reads (``inputs``: their values now); else where it differs (a str)."""
    old = plan.lin
    if len(old.order) != len(lin.order) or old.outputs != lin.outputs or len(old.scalars) != len(lin.scalars):
        return (f"the graph at these sizes has {len(lin.order)} nodes and {len(lin.scalars)} runtime scalars, "
                f"the recording's {len(old.order)} and {len(old.scalars)}")
    where_old, where_new = old.positions, lin.positions
    for i, (a, b) in enumerate(zip(old.order, lin.order)):
        if a.op is not b.op or a.dtype != b.dtype or (a.shape is None) != (b.shape is None) or \
                (a.shape is not None and len(a.shape) != len(b.shape)) or len(a.scalars) != len(b.scalars) or \
                [where_old[id(x)] for x in a.inputs] != [where_new[id(x)] for x in b.inputs] or \
                (a.op is not DATA and a.scalars and slot_kinds(a) != slot_kinds(b)):
            return f"node {i} of the graph at these sizes is {b.op}, the recording's {a.op} (or their inputs differ)"
    consts = []
    storage = iter(inputs)
    for (kind, _), node in zip(plan.inputs, [n for n in lin.order if n.op is DATA]):
        if kind == "storage" and next(storage) is not node:
            return "the graph at these sizes reads another tensor than the recording's"
        if kind == "const":
            consts.append(node.data)
    return consts

