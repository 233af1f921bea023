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

from typing import Any, Callable, Optional, Tuple

import torch


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

    __slots__ = ("name", "fn", "__weakref__")

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"lazy.{self.name}"


def _no_op(*_: Any) -> Any:
    raise RuntimeError("lazy internal error: a data or getitem node is never called")


DATA = Op("data", _no_op)
GETITEM = Op("getitem", _no_op)


# Note [Interned signatures]
# A node's signature is everything but its inputs and runtime values: (op, args, kwargs, shape, dtype, metas).
# Signatures are interned, so structurally equal nodes share one signature object and ``id(sig)`` is an exact
# structural identity: graph keys are built from these ids, never from hash values, which collide (CPython
# hashes -1 like -2, so dims -1 and -2 would otherwise be one key). The table only grows with distinct
# signatures, like the shape memo.
_SIGNATURES: dict = {}


class Node:
    """An immutable IR node.

    ``shape``/``dtype`` describe the single output; an op with several outputs gives a node with ``shape=None``
    whose outputs are read by ``getitem`` nodes and described by ``metas`` (a tuple of ``(shape, dtype)`` or None).
    ``sig`` is the interned signature (Note [Interned signatures]); ``hash`` covers it and the inputs' hashes,
    computed once here, never from data.
    """

    __slots__ = ("op", "args", "kwargs", "inputs", "scalars", "shape", "dtype", "metas", "data", "sig", "hash")

    def __init__(self, op: Any, args: tuple, kwargs: tuple, inputs: Tuple["Node", ...], scalars: tuple,
                 shape: Optional[tuple], dtype: Optional[torch.dtype], metas: Optional[tuple] = None,
                 data: Optional[torch.Tensor] = None) -> None:
        # id(op): ops are immortal (ATen overloads, cached internal Ops) and OpOverload.__hash__ is a Python method
        sig = (id(op), args, kwargs, shape, dtype, metas)
        sig = _SIGNATURES.setdefault(sig, sig)
        self.sig = sig
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.inputs = inputs
        self.scalars = scalars
        self.shape = shape
        self.dtype = dtype
        self.metas = metas
        self.data = data
        self.hash = hash((id(sig), *[i.hash for i in inputs])) if inputs else id(sig)

    @property
    def is_data(self) -> bool:
        return self.op is DATA

    def __repr__(self) -> str:
        name = getattr(self.op, "name", None)
        name = name() if callable(name) else (name or str(self.op))
        return f"Node({name}, shape={self.shape}, dtype={self.dtype}, inputs={len(self.inputs)})"


def data_leaf(tensor: torch.Tensor) -> Node:
    """A leaf holding real data on the backing device. Its hash covers shape, dtype and layout, not the data."""
    return Node(DATA, (tuple(tensor.stride()),), (), (), (), tuple(tensor.shape), tensor.dtype, data=tensor)


def getitem(node: Node, index: int) -> Node:
    """The ``index``-th output of a multi-output node."""
    shape, dtype = node.metas[index]
    return Node(GETITEM, (index,), (), (node,), (), shape, dtype)
