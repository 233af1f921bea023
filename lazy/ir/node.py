"""One node type for the whole IR.

Note [IR values are logical]
A node's value is a tensor's *contents* (shape, dtype, elements), never its memory layout: strides, storage
offsets and aliasing live on the lazy tensors (device/), which turn views and in-place updates into new
functional nodes. So the cache key and every executor or compiler see a pure dataflow graph.

Note [Argument templates]
``args``/``kwargs`` hold the op's arguments with every tensor replaced by ``TENSOR`` (the next node of
``inputs``), every runtime Python number by a ``Scalar`` marker of its type (the next value of ``scalars``)
and the lazy device by ``DEVICE``. The template is hashable and part of the node hash; runtime scalars are not,
so a learning rate or an ``alpha`` that changes from step to step reuses the compiled graph.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import _C


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (_marker, (self.name,))


_MARKERS = {}


def _marker(name: str) -> _Marker:
    if name not in _MARKERS:
        _MARKERS[name] = _Marker(name)
    return _MARKERS[name]


TENSOR = _marker("TENSOR")
DEVICE = _marker("DEVICE")
GENERATOR = _marker("GENERATOR")  # a fresh generator seeded from the node's last runtime scalar
SCALAR_MARKERS = {t: _marker(f"Scalar[{t.__name__}]") for t in (float, int, bool, complex)}


class Op:
    """An internal op of the IR (not an ATen overload): a name, an eager implementation, and how it hashes."""

    __slots__ = ("name", "fn", "target", "__weakref__")

    def __init__(self, name: str, fn: Callable[..., Any], target: Any = None) -> None:
        self.name = name
        self.fn = fn
        self.target = target  # the ATen overload an internal op wraps (functionalized, seeded), if any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy.{self.name}"


def _no_op(*_: Any) -> Any:
    raise RuntimeError("lazy internal error: a data or getitem node is never called")


DATA = Op("data", _no_op)
GETITEM = Op("getitem", _no_op)


# Note [Interned signatures]
# A node's signature is everything but its inputs and runtime values: (id(op), args, kwargs, shape, dtype, metas).
# Signatures are interned, so structurally equal nodes share one signature object and ``id(sig)`` is an exact
# structural identity: graph keys are built from these ids (Note [Graph key] in ir/graph.py), never from hash
# values, which collide (CPython hashes -1 like -2, so dims -1 and -2 would otherwise be one key). The table only
# grows with distinct signatures, like the shape memo. It lives in lazy._C, whose recording fast path interns too.
_SIGNATURES: dict = _C.signatures()


# Node(op, args, kwargs, inputs, scalars, shape, dtype, metas=None, data=None): an immutable IR node, a C type
# (csrc/ir.cpp) so that the recorder's fast path creates nodes without running Python and the garbage collector
# never walks a graph. ``shape``/``dtype`` describe the single output; an op with several outputs gives a node
# with ``shape=None`` whose outputs are read by ``getitem`` nodes and described by ``metas`` (a tuple of
# ``(shape, dtype)`` or None). ``sig`` is the interned signature (Note [Interned signatures]), computed once at
# construction, never from data; ``is_data`` tells a data leaf.
Node = _C.Node
_C.set_data_op(DATA)


# data_leaf(tensor) -> Node: a leaf holding real data on the backing device, in C (csrc/replay_io.cpp): what
# ``Node(DATA, (tuple(tensor.stride()),), (), (), (), tuple(tensor.shape), tensor.dtype, data=tensor)`` builds, its
# sizes and strides read from the TensorImpl. Its hash covers shape, dtype and layout, not the data.
data_leaf: Callable[[torch.Tensor], Node] = _C.data_leaf


def getitem(node: Node, index: int) -> Node:
    """The ``index``-th output of a multi-output node."""
    shape, dtype = node.metas[index]
    return Node(GETITEM, (index,), (), (node,), (), shape, dtype)
