"""What one capture run accumulates while the interpreter executes the function (lazy/capture/policy.py fills it).

- ``guards``: (kind, expression, expected) checks on the entry state a replay needs (Note [Guards]).
- ``effects``: stores into objects that existed before the call, in order, replayed after the graph runs.
- ``host_ops``: calls on host (non-lazy) tensors, replayed in order before the graph runs (an optimizer's CPU step
  counters), each leaving its result in a register.
- ``torch_calls``: the calls that recorded lazy ops with symbolic Python numbers among their arguments, with the
  serials of the nodes they recorded, for binding numbers to the graph's scalar slots (Note [Binding scalars]).
- ``written``: what the function stored where, so that a later read of the same place sees the stored box.
- ``broken``: why the function cannot be replayed (a sync inside, I/O, ...), with the user's source line.

Note [Guards]
A replay is valid only while everything the capture depended on is as it was. The policy adds a guard where a value
is *used*, not where it is read, as Dynamo does: an object that is called is guarded by identity; a number used in a
branch by the branch's outcome; a number passed to an op that is not a runtime input by its value; a tensor by its
metadata; a dict that is iterated by its keys. Values read but never used cost no guard. Numbers that reach the
graph as runtime scalars, and values the function stores or returns, are not guarded: the replay reads them again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch

from .expr import _SYMBOLIC, E, specialized


def _plain(v: Any) -> Any:
    if isinstance(v, _SYMBOLIC):
        return specialized(v)
    if type(v) in (tuple, torch.Size) and any(isinstance(x, _SYMBOLIC) for x in v):
        return type(v)(_plain(x) for x in v)
    return v


@dataclasses.dataclass
class Break:
    """Why a function cannot be replayed, and where (the user's file and line)."""

    reason: str
    where: str
    transient: bool = False  # e.g. an optimizer's first step creates its state: the next call may capture

    def __str__(self) -> str:
        return f"{self.reason} (at {self.where})"


class CaptureBreak(Exception):
    """Raised inside a capture run where ``fullgraph=True`` makes a break an error."""


@dataclasses.dataclass
class HostOp:
    """``fn(*args, **kwargs)`` on host tensors: args are expressions or constants; the result goes to ``R[index]``."""

    index: int
    fn: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]


@dataclasses.dataclass
class Effect:
    """A store into an object that existed before the call: ``kind`` is setattr, delattr, setitem, delitem,
    cell_set, list_method (``name`` then names a list method and ``value`` its argument tuple)."""

    kind: str
    target: E
    key: Any
    value: Any  # a Box (rebuilt at replay), or None for deletions
    # (id(object), key) of a store that a later store to the same place makes dead, where storing has no effect
    # but the value (Note [Dead stores] in lazy/capture/replay.py); None for other effects
    place: Any = None
    # (object, key) the store went to, as the call ran: a capture with symbolic sizes makes what the call stored
    # concrete there (Note [Dropping the symbolic recording] in lazy/capture/dynamic.py)
    held: Any = None


@dataclasses.dataclass
class TorchCall:
    """A call that recorded lazy ops: the serials of the nodes it made, the symbolic numbers among its arguments
    (value, expression), and whether autograd recorded it (then its numbers are guarded, never bound)."""

    what: str
    first_serial: int
    last_serial: int
    syms: List[Tuple[Any, E]]
    where: str


class Session:
    def __init__(self) -> None:
        self.guards: Dict[Tuple[str, E], Any] = {}
        self.effects: List[Effect] = []
        self.host_ops: List[HostOp] = []
        self.torch_calls: List[TorchCall] = []
        self.written: Dict[Tuple[int, Any], Any] = {}
        self.keep: List[Any] = []                  # objects whose ids key the tables above: kept alive
        self.created: Dict[int, Any] = {}          # id -> shadow of objects created during the call
        self.storage_source: Dict[int, Tuple[Any, E]] = {}   # id(storage) -> (storage, expression of a tensor on it)
        self.paths: Dict[int, Tuple[Any, E]] = {}  # id(object) -> (object, the first expression that reached it)
        self.host_leaves: Dict[int, Any] = {}      # id(data leaf) -> expression of the host tensor it snapshots
        self.seeds: List[Tuple[int, Any]] = []     # (seed, generator or None) in the order drawn
        self.context_vars: Dict[int, list] = {}    # id(ContextVar) -> [it, its value's box or ENTRY_VALUE]
        self.context_tokens: Dict[int, tuple] = {}  # id(Token) -> (it, the value its reset restores)
        self.broken: Optional[Break] = None
        self.backward_roots: List[Any] = []        # tensors backward() ran from (their graphs are consumed)
        self.retain_graph = False

    def guard(self, kind: str, e: E, expected: Any) -> None:
        key = (kind, e)
        if key not in self.guards:
            # a size of a capture with symbolic sizes (Note [Dynamic captures] in capture/dynamic.py): guarded by
            # its value, which is a guard of the recording too
            self.guards[key] = _plain(expected)

    def remember(self, obj: Any) -> None:
        self.keep.append(obj)

    def breaks(self, reason: str, where: str, transient: bool = False) -> None:
        if self.broken is None:
            self.broken = Break(reason, where, transient)

    def unbalanced_context_vars(self) -> List[str]:
        """The names of the ContextVars the call left set to other than what it found (Note [Context variables in
        a capture] in lazy/capture/method_models.py)."""
        return [var.name for var, value in self.context_vars.values() if value is not ENTRY_VALUE]


ENTRY_VALUE = object()  # a ContextVar holding the value the call found (Note [Context variables in a capture])


def plain_store(kind: str, obj: Any, key: Any) -> bool:
    """Whether storing into ``obj`` at ``key`` does nothing but bind the value (Note [Dead stores] in
    lazy/capture/replay.py): an item of a dict at a constant key; an attribute with no data descriptor on the
    object's type but an instance dict, or a tensor's ``.grad`` (its setter only checks the value)."""
    if kind == "setitem":
        return type(obj) is dict and type(key) is not E
    if kind != "setattr":
        return False
    if isinstance(obj, torch.Tensor):
        return key == "grad"
    descriptor = getattr(type(obj), key, None)
    return hasattr(obj, "__dict__") and type(obj).__setattr__ is object.__setattr__ and \
        not hasattr(type(descriptor), "__set__")
