"""From a capture run to a replayable program: the graph, what feeds it, what it writes, what the call returns.

After the interpreter has run the function (lazy/capture/policy.py), the lazy tensors hold the recorded IR of
everything the call computed. ``finalize`` cuts it into one graph whose outputs are every tensor the call left
behind: storages of pre-existing tensors it changed (parameters, optimizer state, ``.grad`` accumulated in place)
and tensors it created that outlive it (its return value, new ``.grad`` tensors, tensors stored into objects). Then
it decides, for each input and runtime scalar of that graph, where a replay gets it:
- a data leaf that was the entry value of a pre-existing storage comes from the expression that reached a tensor
  on that storage; a snapshot of a host tensor from that tensor's expression; any other leaf is a constant the call
  made from constants;
- a runtime scalar is a seed (drawn afresh at each replay), a symbolic number bound to it (Note [Binding scalars]),
  or a constant.

Note [Binding scalars]
A number reaches the graph through ATen, which converts it to a C++ scalar and back: the Python object the function
computed (a learning rate) is not the object in the node's scalar slot, and a C++ composite op may derive new numbers
from it (``1 / alpha``) or fold it into a shape. So numbers are bound to slots by value, per call, and only where the
binding is unambiguous: each torch call records the symbolic numbers among its arguments and the serials of the
nodes it recorded (lazy/capture/tensors.py). A slot of such a node takes the expression of the one symbolic argument
whose value it equals exactly. A call is bound only if *every* runtime slot of its nodes is explained (equal to a
symbolic argument), every symbolic argument explains some slot, no two arguments with different expressions share a
value, and the values are distinctive (not integers or simple binary fractions, which C++ code uses as constants);
otherwise its symbolic arguments are guarded by value instead, which is always sound (a changed value recompiles).
Arguments of ``float`` schema type (which may decide output shapes) are always guarded. Numbers that autograd saved
for a backward are guarded when they are passed (lazy/capture/tensors.py).
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..device.tensor import LazyTensor
from ..ir.graph import Linearized, linearize
from ..ir.layout import contiguous_stride, storage_numel
from ..trace import views
from ..ir.node import DATA, GENERATOR, SCALAR_MARKERS, Node, _Marker
from ..ir.ops import SEED_KWARG
from ..trace.schema import RUNTIME_MEMO_VALUE, STATIC, describe
from ..sync import launch
from .expr import E
from .interpreter import Box
from .boxes import New, is_lazy
from .session import Session

_SCALAR_MARKER_SET = frozenset(map(id, SCALAR_MARKERS.values()))


@dataclasses.dataclass
class Plan:
    """Everything a replay needs besides the compiled program (lazy/capture/replay.py renders it)."""

    lin: Optional[Linearized]
    inputs: List[Tuple[str, Any]]      # per data leaf: ("storage", E) | ("host", E) | ("const", tensor)
    scalars: List[Tuple[str, Any]]     # per runtime scalar: ("const", v) | ("expr", E) | ("reg", k)
    mutated: List[Tuple[int, E]]       # (graph output index, expression of a tensor on the storage)
    created: Dict[int, Tuple[int, tuple, int]]  # id(tensor) -> (graph output index, desc, numel)
    result: Box
    backward_consumed: set = dataclasses.field(default_factory=set)  # ids of outputs whose graph backward used
    created_tensors: List[Any] = dataclasses.field(default_factory=list)  # those of ``created``, in output order


def created_output(t: LazyTensor) -> Tuple[Node, tuple, int]:
    """What a tensor the call created and left behind is in the graph: its value (its storage's, or a view's own,
    for a replay gives a view storage of its own), its layout and its storage's numel."""
    if t._lz_chain is None:
        return t._lz_st.value, t._lz_desc, t._lz_st.numel
    shape, _, _, dtype = t._lz_desc
    stride = contiguous_stride(shape)
    return views.value(t), (shape, stride, 0, dtype), storage_numel(shape, stride)


def finalize(s: Session, result: Box, entry: Dict[int, Tuple[Any, Node]], breaks: Any) -> Optional[Plan]:
    """The plan of a capture run, or None (with ``s.broken`` set) if the call cannot be replayed."""
    escaping = _escaping_tensors(s, result, breaks)
    if s.broken is not None:
        return None
    mutated_storages = []
    for key, (st, before) in entry.items():
        if st.value is not before:
            if key not in s.storage_source:
                breaks("changes a tensor it did not reach through its inputs (a global tensor, a captured one)")
                return None
            mutated_storages.append(st)
    roots: List[Node] = [st.value for st in mutated_storages]
    created: Dict[int, Tuple[int, tuple, int]] = {}
    created_tensors: List[LazyTensor] = []
    escaping_storages = {id(t._lz_st) for t in escaping}
    for t in escaping:
        st = t._lz_st
        if id(st) in entry:
            breaks("returns or stores a view of a tensor that existed before the call")
            return None
        if id(t) in created:
            continue
        shape, stride, offset, dtype = t._lz_desc
        # A view of a tensor the call made (``loss.detach()``, a reshape): a replay gives it storage of its own, which
        # is what the call left if nothing else it returns shares that storage and the view is dense.
        if t._lz_chain is not None and (
                sum(1 for u in escaping if id(u._lz_st) == id(st)) > 1 or offset != 0 or
                stride != contiguous_stride(shape) or len(escaping_storages) != len({id(u._lz_st) for u in escaping})):
            breaks("returns or stores views of a tensor it created that share its storage; return .clone()s")
            return None
        value, desc, numel = created_output(t)
        created[id(t)] = (len(roots), desc, numel)
        created_tensors.append(t)
        roots.append(value)
    if not roots:
        return Plan(None, [], [], [], {}, result)
    lin = linearize(roots)
    inputs = _bind_inputs(s, lin, entry, breaks)
    if inputs is None:
        return None
    scalars = _bind_scalars(s, lin, breaks)
    if scalars is None:
        return None
    mutated = [(i, s.storage_source[id(st)][1]) for i, st in enumerate(mutated_storages)]
    consumed = {id(t) for t in s.backward_roots if isinstance(t, torch.Tensor)} if not s.retain_graph else set()
    return Plan(lin, inputs, scalars, mutated, created, result, consumed, created_tensors)


def _escaping_tensors(s: Session, result: Box, breaks: Any) -> List[LazyTensor]:
    """Lazy tensors the call created that outlive it: in the result and in stored values."""
    found: List[LazyTensor] = []
    seen = set()

    def walk(b: Any) -> None:
        if b is None or id(b) in seen:
            return
        seen.add(id(b))
        if type(b) is tuple:
            for x in b:
                walk(x)
            return
        v, m = b.v, b.m
        if is_lazy(v):
            if type(m) is not E:
                found.append(v)
            return
        if type(m) is New:
            if m.kind in ("list", "tuple"):
                for x in m.items:
                    walk(x)
            elif m.kind == "dict":
                for x in m.items.values():
                    walk(x)
            elif m.kind not in ("cell",):
                breaks(f"returns or stores a {type(v).__name__} it created, which a replay cannot rebuild")
    walk(result)
    for eff in s.effects:
        walk(eff.value)
    return found


def _bind_inputs(s: Session, lin: Linearized, entry: Dict[int, Tuple[Any, Node]], breaks: Any) -> Optional[list]:
    # NOTE: storages may share one value node (``a.copy_(b)`` makes b's value a's): any of them that the call
    # reached gives the input.
    by_value: Dict[int, list] = {}
    for key, (st, node) in entry.items():
        by_value.setdefault(id(node), []).append(key)
    inputs = []
    for node in lin.order:
        if node.op is not DATA:
            continue
        keys = by_value.get(id(node))
        if keys is not None:
            source = next((s.storage_source[k] for k in keys if k in s.storage_source), None)
            if source is None:
                breaks("reads a tensor it did not reach through its inputs (a global tensor, a captured one)")
                return None
            inputs.append(("storage", source[1]))
        elif id(node) in s.host_leaves:
            inputs.append(("host", s.host_leaves[id(node)]))
        else:
            inputs.append(("const", launch.ready(node.data)))
    return inputs


def slot_kinds(node: Node) -> List[str]:
    """For each runtime scalar of ``node``, in order: "seed", "memo" (a ``float`` schema argument) or "runtime"."""
    op = node.op
    target = getattr(op, "target", None) or op
    desc = describe(target) if isinstance(target, torch._ops.OpOverload) else None
    kinds: List[str] = []
    for i, v in enumerate(node.args):
        _slot_kinds_of(v, desc.kinds[i] if desc is not None and i < len(desc.kinds) else STATIC, kinds)
    for name, v in node.kwargs:
        if name == SEED_KWARG:
            kinds.append("seed")
        else:
            _slot_kinds_of(v, desc.kw_kinds.get(name, STATIC) if desc is not None else STATIC, kinds)
    return kinds


def _slot_kinds_of(v: Any, kind: int, kinds: List[str]) -> None:
    """Appends the kinds of the runtime scalars in argument ``v`` (a module function: a nested recursive one would
    be a reference cycle per node, left to the cyclic collector)."""
    if type(v) is _Marker:
        if v is GENERATOR:
            kinds.append("seed")
        elif id(v) in _SCALAR_MARKER_SET:
            kinds.append("memo" if kind == RUNTIME_MEMO_VALUE else "runtime")
    elif type(v) is tuple:
        for x in v:
            _slot_kinds_of(x, kind, kinds)


def _distinctive(v: Any) -> bool:
    """A float unlikely to be a constant of C++ code (not a multiple of 1/256)."""
    return type(v) is float and v == v and abs(v) != float("inf") and v * 256 != round(v * 256)


def _bind_scalars(s: Session, lin: Linearized, breaks: Any) -> Optional[list]:
    calls = sorted(s.torch_calls, key=lambda c: c.first_serial)
    starts = [c.first_serial for c in calls]
    seed_regs = {seed: reg for seed, reg in s.seeds}
    slots: List[Tuple[str, Any]] = []
    in_call: Dict[int, List[Tuple[int, Any, str]]] = {}  # call -> (slot, value, kind)
    for node in lin.order:
        if node.op is DATA or not node.scalars:
            continue
        kinds = slot_kinds(node)
        if len(kinds) != len(node.scalars):
            breaks(f"records {node.op} with runtime scalars capture cannot place")
            return None
        at = bisect.bisect_right(starts, node.serial) - 1
        call = at if at >= 0 and node.serial < calls[at].last_serial else None
        for value, kind in zip(node.scalars, kinds):
            if kind == "seed":
                if value not in seed_regs:
                    breaks(f"records a random op ({node.op}) whose seed capture did not see drawn")
                    return None
                slots.append(("reg", seed_regs[value]))
                continue
            slots.append(("const", value))
            if call is not None:
                in_call.setdefault(call, []).append((len(slots) - 1, value, kind))
    for at, call in enumerate(calls):
        binding = _bind_call(call.syms, in_call.get(at, []))
        if binding is None:
            for v, e in call.syms:
                s.guard("eq", e, v)
            continue
        for i, e in binding.items():
            slots[i] = ("expr", e)
    return slots


def _bind_call(syms: list, slots: list) -> Optional[Dict[int, Any]]:
    """slot -> expression for one torch call (Note [Binding scalars]), or None: guard its numbers instead."""
    exprs: Dict[Tuple[type, Any], set] = {}
    for v, e in syms:
        exprs.setdefault((type(v), v), set()).add(e)
    if any(len(es) > 1 for es in exprs.values()):
        return None  # two different numbers of equal value: which slot is which cannot be told
    binding: Dict[int, Any] = {}
    used: Dict[Tuple[type, Any], int] = {}
    for i, value, kind in slots:
        key = (type(value), value)
        if key not in exprs or kind == "memo":
            return None  # a number the call made (1 / alpha?) or one that may decide a shape
        binding[i] = next(iter(exprs[key]))
        used[key] = used.get(key, 0) + 1
    for key in exprs:
        n = used.get(key, 0)
        occurrences = sum(1 for v, _ in syms if (type(v), v) == key)
        if n == 0 or (n > occurrences and not _distinctive(key[1])):
            return None  # unused (a static use?), or more slots than arguments with a value C++ code might use
    return binding
