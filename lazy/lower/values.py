"""Lowered values: what a graph node becomes while it is lowered (a lazily indexed tensor), and the helpers every
lowering table shares: broadcasting, runtime scalars, type promotion.

Note [Lowered values are loaders]
A ``TVal`` is a tensor described by a function from an index (one ``Expr`` per dimension) to the ``Expr`` of
its element, as in Inductor's define-by-run IR. Pointwise ops compose loaders; movement ops remap the index and
move no data; a realized value (a leaf, an extern's output, a stored kernel output) loads from its buffer.
Loaders are memoized per index, so a value shared inside an expression stays one DAG node.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import kir
from .kir import Expr


class Unlowerable(Exception):
    """This op (with these arguments/dtypes) has no lowering: it becomes an extern ATen call."""


SUPPORTED_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                              torch.int16, torch.int8, torch.uint8, torch.bool})


class TVal:
    __slots__ = ("shape", "dtype", "_fn", "_memo", "buffer")

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, fn: Callable[[Tuple[Expr, ...]], Expr],
                 buffer: Optional[kir.Buffer] = None) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self._fn = fn
        self._memo: Dict[tuple, Expr] = {}
        self.buffer = buffer

    def __call__(self, index: Sequence[Expr]) -> Expr:
        key = tuple(index)
        e = self._memo.get(key)
        if e is None:
            e = self._memo[key] = self._fn(key)
        return e

    def __repr__(self) -> str:
        return f"TVal({self.dtype}, {list(self.shape)}, {self.buffer})"


# Set by graph.lower for the duration of a lowering: stores a TVal into a buffer and returns the loading TVal.
REALIZE: Callable[["TVal"], "TVal"] = lambda v: v  # noqa: E731 -- a replaceable hook


def from_buffer(buf: kir.Buffer) -> TVal:
    return TVal(buf.shape, buf.dtype, lambda idx: kir.load(buf, idx), buf)


class ScalarArg:
    """A runtime scalar (Note [Argument templates]): slot in the graph's scalar list and its Python type."""

    __slots__ = ("slot", "kind")

    def __init__(self, slot: int, kind: type) -> None:
        self.slot = slot
        self.kind = kind

    def expr(self) -> Expr:
        return kir.scalar(self.slot, torch.float64 if self.kind is float else torch.int64)

    def __repr__(self) -> str:
        return f"ScalarArg({self.slot}, {self.kind.__name__})"


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise Unlowerable(f"dtype {dtype} has no C++ lowering yet")


def broadcast_shapes(*shapes: Sequence[int]) -> Tuple[int, ...]:
    """Eager's broadcast of ``shapes`` (recorded ops were checked already). NOTE: not torch.broadcast_shapes: its
    Python reference imports sympy (~0.6 s) the first time a process lowers a graph."""
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, n in enumerate(s, len(out) - len(s)):
            if n != 1 and out[i] != n:
                if out[i] != 1:
                    raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[i] = n
    return tuple(out)


def operand(x: Any, shape: Sequence[int]) -> Callable[[Sequence[Expr]], Expr]:
    """``x`` (TVal, ScalarArg or Python number) as a loader over the broadcast ``shape``."""
    if isinstance(x, TVal):
        check_dtype(x.dtype)
        off = len(shape) - len(x.shape)
        if tuple(x.shape) == tuple(shape):
            return x
        zero = kir.const(0, kir.INDEX)
        return lambda idx: x([zero if n == 1 else idx[off + d] for d, n in enumerate(x.shape)])
    if isinstance(x, ScalarArg):
        e = x.expr()
        return lambda idx: e
    if isinstance(x, bool):
        e = kir.const(x, torch.bool)
    elif isinstance(x, int):
        e = kir.const(x, torch.int64)
    elif isinstance(x, float):
        e = kir.const(x, torch.float64)
    else:
        raise Unlowerable(f"operand {type(x).__name__}")
    return lambda idx: e


def shape_of(x: Any) -> Tuple[int, ...]:
    return x.shape if isinstance(x, TVal) else ()


@functools.lru_cache(maxsize=4096)
def _promote(sig: tuple) -> torch.dtype:
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    args = [torch.empty((1,) * nd, dtype=dt, device="meta") if dt is not None else nd for dt, nd in sig]
    return elementwise_dtypes(*args, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def promote(*xs: Any) -> torch.dtype:
    """Eager's result dtype of ``xs`` (tensors of any rank, 0-dim tensors, Python numbers)."""
    sig = []
    for x in xs:
        if isinstance(x, TVal):
            sig.append((x.dtype, len(x.shape) if x.shape else 0))
        elif isinstance(x, ScalarArg):
            sig.append((None, x.kind(1)))
        elif isinstance(x, (bool, int, float)):
            sig.append((None, type(x)(1)))
    return _promote(tuple(sig))


def pointwise(fn: Callable[..., Expr], out_dtype: torch.dtype, compute: Optional[torch.dtype], *xs: Any) -> TVal:
    """Elementwise ``fn`` over the broadcast of ``xs``; each operand cast to ``compute`` (None: kept)."""
    check_dtype(out_dtype)
    shape = broadcast_shapes(*[shape_of(x) for x in xs])
    loaders = [operand(x, shape) for x in xs]

    def body(idx: Tuple[Expr, ...]) -> Expr:
        args = [ld(idx) for ld in loaders]
        if compute is not None:
            args = [kir.cast(a, compute) for a in args]
        return kir.cast(fn(*args), out_dtype)

    return TVal(shape, out_dtype, body)


def norm_dim(d: int, ndim: int) -> int:
    return d + max(ndim, 1) if d < 0 else d


def slice_start(start: Optional[int], size: int) -> int:
    """A slice's start as eager resolves it: None is 0, a negative start counts from the end, then within
    [0, size]."""
    start = 0 if start is None else (start + size if start < 0 else start)
    return min(max(start, 0), size)


def vars_for(shape: Sequence[int], prefix: str) -> List[Expr]:
    return [kir.var(f"{prefix}{i}", n) for i, n in enumerate(shape)]
