"""View steps: how a view's value derives from its base, and how a write to a view goes back into the base.

See Note [Storages and views] (device/tensor.py). Each step records the ATen view op with its static
arguments; ``REVERSE`` maps a view op to the op that scatters a new view value back into the step's input.
A chain with a step missing from ``REVERSE`` is written back with one layout-aware ``as_strided_scatter`` of
the whole storage, which is always correct.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

import torch

from ..device.tensor import LazyTensor, Storage
from ..ir.node import TENSOR, Node
from ..ir.ops import AS_STRIDED, AS_STRIDED_SCATTER

aten = torch.ops.aten


class ViewStep:
    """One view op applied to the previous value of a chain."""

    __slots__ = ("op", "args", "kwargs", "shape", "dtype", "reverse")

    def __init__(self, op: Any, args: tuple, kwargs: tuple, shape: tuple, dtype: torch.dtype) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.shape = shape
        self.dtype = dtype
        self.reverse: Optional[Callable[[Node, Node, "ViewStep"], Node]] = REVERSE.get(op)

    def apply(self, value: Node) -> Node:
        return Node(self.op, self.args, self.kwargs, (value,), (), self.shape, self.dtype)


def emit(op: Any, args: tuple, inputs: tuple, shape: tuple, dtype: torch.dtype) -> Node:
    """A node of known metadata (no shape inference needed)."""
    return Node(op, args, (), inputs, (), shape, dtype)


def _arg(step: ViewStep, i: int, default: Any) -> Any:
    return step.args[i] if len(step.args) > i else default


def _reshape_back(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.view.default, (TENSOR, prev.shape), (new,), prev.shape, prev.dtype)


def _identity(prev: Node, new: Node, step: ViewStep) -> Node:
    return new


def _slice(prev: Node, new: Node, step: ViewStep) -> Node:
    args = (TENSOR, TENSOR, _arg(step, 1, 0), _arg(step, 2, None), _arg(step, 3, None), _arg(step, 4, 1))
    return emit(aten.slice_scatter.default, args, (prev, new), prev.shape, prev.dtype)


def _select(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.select_scatter.default, (TENSOR, TENSOR, step.args[1], step.args[2]), (prev, new),
                prev.shape, prev.dtype)


def _diagonal(prev: Node, new: Node, step: ViewStep) -> Node:
    args = (TENSOR, TENSOR, _arg(step, 1, 0), _arg(step, 2, 0), _arg(step, 3, 1))
    return emit(aten.diagonal_scatter.default, args, (prev, new), prev.shape, prev.dtype)


def _permute(prev: Node, new: Node, step: ViewStep) -> Node:
    dims = [d % len(prev.shape) for d in step.args[1]]
    inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
    return emit(aten.permute.default, (TENSOR, inverse), (new,), prev.shape, prev.dtype)


def _transpose(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.transpose.int, (TENSOR, step.args[1], step.args[2]), (new,), prev.shape, prev.dtype)


def _t(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.t.default, (TENSOR,), (new,), prev.shape, prev.dtype)


def _dtype_back(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.view.dtype, (TENSOR, prev.dtype), (new,), prev.shape, prev.dtype)


def _involution(prev: Node, new: Node, step: ViewStep) -> Node:
    """conj and neg views: applying the view again undoes it."""
    return emit(step.op, (TENSOR,), (new,), prev.shape, prev.dtype)


def _real_back(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.view_as_complex.default, (TENSOR,), (new,), prev.shape, prev.dtype)


def _complex_back(prev: Node, new: Node, step: ViewStep) -> Node:
    return emit(aten.view_as_real.default, (TENSOR,), (new,), prev.shape, prev.dtype)


# Views that are their input itself (same metadata, same elements). Note [Aliases of a base are bases]
ALIASES = frozenset((aten.alias.default, aten.detach.default, aten.lift_fresh.default))

REVERSE: Dict[Any, Callable[[Node, Node, ViewStep], Node]] = {
    aten._conj.default: _involution,
    aten._neg_view.default: _involution,
    aten.view_as_real.default: _real_back,
    aten.view_as_complex.default: _complex_back,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.diagonal.default: _diagonal,
    aten.permute.default: _permute,
    aten.transpose.int: _transpose,
    aten.t.default: _t,
    aten.view.dtype: _dtype_back,
    **{op: _identity for op in ALIASES},
    **{op: _reshape_back for op in (
        aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default, aten.unsqueeze.default,
        aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.view_as.default)},
}


def value(t: LazyTensor) -> Node:
    """The current IR value of a lazy tensor (re-derived from its storage if the storage changed)."""
    chain = t._lz_chain
    st = t._lz_st
    if chain is None:
        return st.value
    version, node = t._lz_cache
    if version == st.version:
        return node
    node = st.value
    for step in chain:
        node = step.apply(node)
    t._lz_cache = (st.version, node)
    return node


def write(t: LazyTensor, new: Node) -> None:
    """Give ``t`` the value ``new`` (same shape and dtype as ``t``), updating every alias of its storage."""
    st = t._lz_st
    chain = t._lz_chain
    if chain is None:
        st.value = new
    else:
        st.value = _scatter(st, chain, new, t._lz_desc)
    st.version += 1
    if chain is not None:
        t._lz_cache = (st.version, new)


def _scatter(st: Storage, chain: tuple, new: Node, desc: tuple) -> Node:
    if all(step.reverse is not None for step in chain):
        prevs = [st.value]
        for step in chain[:-1]:
            prevs.append(step.apply(prevs[-1]))
        for step, prev in zip(reversed(chain), reversed(prevs)):
            new = step.reverse(prev, new, step)
        return new
    base = st.value
    shape, stride, offset, _ = desc
    # NOTE: ``new`` may have another dtype than the storage (a chain through view_as_real): the executor writes
    # it into the storage's bytes, as eager does.
    args = (TENSOR, TENSOR, shape, stride, offset, st.stride, st.numel)
    return emit(AS_STRIDED_SCATTER, args, (base, new), base.shape, base.dtype)


# Note [Dense blocks of a dense storage are slices]
# ``as_strided`` reads memory, so in general its step is the layout-aware AS_STRIDED (an extern that lays the
# storage out in a buffer and copies the view out of it), and a write through it one AS_STRIDED_SCATTER of the whole
# storage. DDP's Reducer views its flat gradient buckets that way, one view per parameter, each written and read
# every step: a copy of the whole bucket per view. But where the storage's base is dense row-major and the view a
# dense block of it (the bucket views are), the view is the base flattened, sliced and reshaped: steps with reverses,
# which lower to index maps (no copy) and whose writes go back as a ``slice_scatter`` of the block alone.
def as_strided_chain(desc: tuple, st: Storage) -> tuple:
    """The view steps reading ``desc`` (size, stride, absolute offset, dtype) out of the storage ``st``: a flat view,
    a slice and a view where that is what it is (Note [Dense blocks of a dense storage are slices]), else one
    layout-aware as_strided step."""
    shape, stride, offset, dtype = desc
    base = st.value
    n = math.prod(shape)
    flat = (st.numel,)
    if dtype != base.dtype or n == 0 or offset + n > st.numel or math.prod(base.shape) != st.numel or \
            not _dense(base.shape, st.stride) or not _dense(shape, stride):
        return (as_strided_step(desc, st),)
    steps = []
    if tuple(base.shape) != flat:
        steps.append(ViewStep(aten.view.default, (TENSOR, flat), (), flat, dtype))
    if n != st.numel:
        steps.append(ViewStep(aten.slice.Tensor, (TENSOR, 0, offset, offset + n, 1), (), (n,), dtype))
    if tuple(shape) != (n,) or not steps:
        steps.append(ViewStep(aten.view.default, (TENSOR, tuple(shape)), (), tuple(shape), dtype))
    return tuple(steps)



def _dense(shape: tuple, stride: tuple) -> bool:
    """Row-major without gaps (the strides of size-1 dims do not matter; no size is 0)."""
    want = 1
    for i in range(len(shape) - 1, -1, -1):
        d = shape[i]
        if d != 1 and stride[i] != want:
            return False
        want *= d
    return True


def as_strided_step(desc: tuple, st: Storage) -> ViewStep:
    """A step reading ``desc`` (size, stride, absolute offset) straight out of the storage ``st``."""
    shape, stride, offset, dtype = desc
    args = (TENSOR, shape, stride, offset, st.stride, st.numel)
    if dtype != st.value.dtype:  # a view of another dtype (view_as_real): read the storage's bytes as ``dtype``
        args += (dtype,)
    return ViewStep(AS_STRIDED, args, (), shape, dtype)


def split_steps(op: Any, args: tuple, outs: list) -> Optional[list]:
    """Single-output steps for the outputs of a multi-output view (split, unbind), or None if unknown."""
    if op is aten.unbind.int:
        dim = args[1] if len(args) > 1 else 0
        return [ViewStep(aten.select.int, (TENSOR, dim, i), (), o[0], o[3]) for i, o in enumerate(outs)]
    if op in (aten.split.Tensor, aten.split_with_sizes.default):
        dim = args[2] if len(args) > 2 else 0
        steps, start = [], 0
        for o in outs:
            end = start + o[0][dim]
            steps.append(ViewStep(aten.slice.Tensor, (TENSOR, dim, start, end, 1), (), o[0], o[3]))
            start = end
        return steps
    return None
