"""Walks over the IR: the topological order of a graph and its structural cache key.

Note [Graph key]
The key of a graph is the sequence, in topological order, of each node's interned signature id (Note [Interned
signatures]) followed by the positions of its inputs, then a separator and the positions of the outputs, packed
as int64s into one bytes object (hashed once, compared with memcmp: a lookup costs no per-element Python work).
Signatures cover structure, shapes and dtypes but not data, so two steps with fresh data and new runtime scalars
get equal keys;
positions encode sharing and leaf numbering by first use, so ``x + x`` and ``x + y`` (or a shared and a
duplicated subexpression) get different keys. The bytes themselves are the dict key and every element is an exact
identity, so a hash collision can never return the wrong graph.
"""
from __future__ import annotations

import struct
from typing import Dict, List, Optional, Sequence

import torch

from .. import _C
from .node import DATA, Node


class Linearized:
    """A graph cut at a sync point: its nodes in order, its key, and the runtime inputs of this instance."""

    __slots__ = ("order", "outputs", "key", "leaves", "scalars", "_positions")

    def __init__(self, order: List[Node], outputs: List[int], key: bytes, leaves: List[torch.Tensor],
                 scalars: list) -> None:
        self.order = order
        self.outputs = outputs
        self.key = key
        self.leaves = leaves
        self.scalars = scalars
        self._positions: Optional[Dict[int, int]] = None

    @property
    def positions(self) -> Dict[int, int]:
        """``id(node)`` -> its position in ``order``; built on first use (a cache hit never needs it)."""
        if self._positions is None:
            self._positions = {id(n): i for i, n in enumerate(self.order)}
        return self._positions

    def add_outputs(self, positions: Sequence[int]) -> None:
        """More outputs (already in ``order``): appended to ``outputs`` and to the key."""
        self.outputs.extend(positions)
        self.key += struct.pack(f"{len(positions)}q", *positions)


def linearize(roots: Sequence[Node]) -> Linearized:
    """Topologically sort the graph of ``roots`` (inputs first, leaves numbered by first use) in one pass.

    Depth first, inputs in order; the key is each node's ``id(sig)`` followed (except for data leaves) by the
    positions of its inputs, then a separator and the positions of the roots (Note [Graph key]). The walk is C
    (csrc/graph.cpp): it runs at every sync, over every node.
    """
    return Linearized(*_C.linearize(roots))


def format_graph(order: Sequence[Node], outputs: Sequence[int] = ()) -> str:
    """The graph as text, one node per line: ``%3 = aten.add.Tensor(%1, %2, Scalar[float]) : f32[4, 4]``."""
    pos = {id(n): i for i, n in enumerate(order)}
    lines = []
    for i, node in enumerate(order):
        ins = iter(f"%{pos[id(x)]}" for x in node.inputs)
        args = _format_template(node.args, ins)
        kwargs = ", ".join(f"{k}={_format_template(v, ins)}" for k, v in node.kwargs)
        ty = f"{_short_dtype(node.dtype)}{list(node.shape)}" if node.shape is not None else "tuple"
        if node.op is DATA:
            lines.append(f"%{i} = data() : {ty}")
        else:
            lines.append(f"%{i} = {node.op}({args}{', ' if kwargs else ''}{kwargs}) : {ty}")
    if outputs:
        lines.append("return " + ", ".join(f"%{o}" for o in outputs))
    return "\n".join(lines)


def _format_template(value, inputs) -> str:
    from .node import TENSOR
    if value is TENSOR:
        return next(inputs)
    if isinstance(value, tuple):
        return "[" + ", ".join(_format_template(v, inputs) for v in value) + "]"
    return repr(value)


def _short_dtype(dtype) -> str:
    return str(dtype).replace("torch.", "")

