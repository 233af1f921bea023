"""Lowering table, indexing part: gather-style loads, concatenation, padding and scatters into slices as index maps.

Note [Indexed loads]
gather, index (advanced indexing with integer index tensors), index_select, embedding, a scatter that writes one
slot per row, slice_scatter, select_scatter, diagonal_scatter, cat and constant_pad_nd move no data either
(arange is here too): each output element loads one input element at an index computed from the output index and,
for the gather family, from an element of an index tensor. So do flip, diagonal, repeat, roll, tril/triu and the
multi-output views (split, unbind), whose index maps need no index tensor; their ``_copy`` and ``unsafe_`` forms
(which eager computes into fresh tensors, and whose decompositions would end in an extern split) lower the same.
- Eager raises on an index out of range; a kernel cannot. ``checked`` wraps a negative index where eager does
  (advanced indexing) and, for one out of range, loads element 0 and sets the kernel's error code, which the
  runtime raises as eager's error once the kernel returns (runtime/cpp.py).
- A load in a branch that is not taken (cat's other inputs, a pad's border) uses a clamped index, so no load
  leaves its buffer, whatever the renderer evaluates eagerly.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from ..ir.layout import contiguous_stride
from . import kir
from .pointwise import register
from .structure import ZERO
from .values import ScalarArg, TVal, Unlowerable, broadcast_shapes, check_dtype, norm_dim, operand, slice_start

_INDEX_DTYPES = (torch.int64, torch.int32)


def checked(i: kir.Expr, n: int, wrap: bool = False) -> kir.Expr:
    """Index expression ``i`` (any integer dtype) as eager reads it on a dimension of size ``n``: in [0, n), or,
    with ``wrap`` (advanced indexing only; gather, index_select, embedding and scatter refuse), in [-n, n)."""
    return kir.op("index_checked", kir.INDEX, kir.cast(i, kir.INDEX), kir.const(n, kir.INDEX),
                  kir.const(int(wrap), kir.INDEX))


def clamped(i: kir.Expr, n: int) -> kir.Expr:
    """``i`` clamped to [0, n - 1]: in bounds for a load whose value is discarded when ``i`` is outside."""
    return kir.op("index_clamp", kir.INDEX, i, kir.const(n - 1, kir.INDEX))


def replaced(idx: Sequence[kir.Expr], dim: int, e: kir.Expr) -> List[kir.Expr]:
    """``idx`` with its ``dim`` entry replaced by ``e``."""
    out = list(idx)
    out[dim] = e
    return out


def in_range(i: kir.Expr, n: int) -> kir.Expr:
    """0 <= i < n."""
    return kir.op("and", torch.bool, kir.op("ge", torch.bool, i, ZERO),
                  kir.op("lt", torch.bool, i, kir.const(n, kir.INDEX)))


def _index_tensor(t: object) -> TVal:
    if not isinstance(t, TVal) or t.dtype not in _INDEX_DTYPES:
        raise Unlowerable(f"index of {getattr(t, 'dtype', type(t).__name__)} (masks stay extern)")
    return t


def _source(x: object) -> TVal:
    if not isinstance(x, TVal) or not x.shape or 0 in x.shape:
        raise Unlowerable("indexing a 0-dim or empty tensor")
    check_dtype(x.dtype)
    return x


@register("aten.gather")
def _gather(args: list, kwargs: dict, meta: tuple) -> TVal:
    x, index = _source(args[0]), _index_tensor(args[2])
    dim = norm_dim(args[1], len(x.shape))
    if len(index.shape) != len(x.shape):
        raise Unlowerable("gather with an index of another rank")
    n = x.shape[dim]
    return TVal(meta[0], x.dtype, lambda idx: x(replaced(idx, dim, checked(index(idx), n))))


@register("aten.index_select")
def _index_select(args: list, kwargs: dict, meta: tuple) -> TVal:
    x, index = _source(args[0]), _index_tensor(args[2])
    dim = norm_dim(args[1], len(x.shape))
    if len(index.shape) > 1:
        raise Unlowerable("index_select with a multi-dimensional index")
    n = x.shape[dim]
    at = (lambda idx: index([idx[dim]])) if index.shape else (lambda idx: index([]))
    return TVal(meta[0], x.dtype, lambda idx: x(replaced(idx, dim, checked(at(idx), n))))


@register("aten.embedding")
def _embedding(args: list, kwargs: dict, meta: tuple) -> TVal:
    weight, index = _source(args[0]), _index_tensor(args[1])
    if len(weight.shape) != 2:
        raise Unlowerable("embedding of a weight that is not 2-D")
    nb = len(index.shape)
    n = weight.shape[0]
    return TVal(meta[0], weight.dtype, lambda idx: weight([checked(index(idx[:nb]), n), idx[nb]]))


@register("aten.index")
def _index(args: list, kwargs: dict, meta: tuple) -> TVal:
    """x[i0, :, i2] with integer index tensors: broadcast together; their dims go where the first one was if
    the indexed dims are adjacent, else first (numpy's rule, as eager)."""
    x, indices = _source(args[0]), list(args[1])
    indices += [None] * (len(x.shape) - len(indices))
    picked = [d for d, t in enumerate(indices) if t is not None]
    if not picked or len(indices) > len(x.shape):
        raise Unlowerable("index without index tensors")
    tensors = {d: _index_tensor(indices[d]) for d in picked}
    bshape = broadcast_shapes(*[t.shape for t in tensors.values()])
    loaders = {d: operand(t, bshape) for d, t in tensors.items()}
    rest = [d for d in range(len(x.shape)) if d not in tensors]
    adjacent = picked == list(range(picked[0], picked[-1] + 1))
    at = picked[0] if adjacent else 0  # where the broadcast index dims sit in the output
    nb = len(bshape)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        bidx = list(idx[at:at + nb])
        others = list(idx[:at]) + list(idx[at + nb:])
        src: List[Optional[kir.Expr]] = [None] * len(x.shape)
        for d in picked:
            src[d] = checked(loaders[d](bidx), x.shape[d], wrap=True)
        for d, e in zip(rest, others):
            src[d] = e
        return x(src)

    return TVal(meta[0], x.dtype, fn)


@register("aten.scatter")
def _scatter(args: list, kwargs: dict, meta: tuple) -> TVal:
    """scatter(self, dim, index, src or value) where the index picks one slot per row (index.size(dim) == 1 and
    every other dim is self's): out = (position == index) ? src : self. Wider scatters stay extern (their
    duplicate writes have no order here)."""
    x, index = _source(args[0]), _index_tensor(args[2])
    src = args[3] if len(args) > 3 else kwargs.get("value", kwargs.get("src"))
    dim = norm_dim(args[1], len(x.shape))
    if "reduce" in kwargs or len(args) > 4:
        raise Unlowerable("scatter with reduce=")
    if len(index.shape) != len(x.shape) or any(n != (1 if d == dim else x.shape[d])
                                               for d, n in enumerate(index.shape)):
        raise Unlowerable("scatter of more than one slot per row")
    if isinstance(src, TVal):
        if len(src.shape) != len(x.shape) or any(m < n for m, n in zip(src.shape, index.shape)):
            raise Unlowerable("scatter src smaller than its index")
        value = lambda idx: src(idx)  # noqa: E731
    elif isinstance(src, (ScalarArg, bool, int, float)):
        value = operand(src, ())
    else:
        raise Unlowerable(f"scatter of {type(src).__name__}")
    n = x.shape[dim]

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        row = replaced(idx, dim, ZERO)
        hit = kir.op("eq", torch.bool, checked(index(row), n), idx[dim])
        return kir.op("where", x.dtype, hit, kir.cast(value(row), x.dtype), x(idx))

    return TVal(meta[0], x.dtype, fn)


@register("aten.cat")
def _cat(args: list, kwargs: dict, meta: tuple) -> TVal:
    shape, out = tuple(meta[0]), meta[1]
    check_dtype(out)
    dim = norm_dim(args[1] if len(args) > 1 else kwargs.get("dim", 0), len(shape))
    parts = []
    for t in args[0]:
        if not isinstance(t, TVal):
            raise Unlowerable("cat of a non-tensor")
        if t.shape == (0,) and len(shape) != 1:
            continue  # eager's legacy rule: 1-D empty tensors are skipped
        if t.shape[dim]:
            parts.append(t)
    if not parts or 0 in shape:
        return TVal(shape, out, lambda idx: kir.const(0, out))
    starts = [0]
    for t in parts:
        starts.append(starts[-1] + t.shape[dim])

    def load(k: int, idx: Sequence[kir.Expr]) -> kir.Expr:
        t = parts[k]
        i = kir.iadd(idx[dim], kir.const(-starts[k], kir.INDEX))
        i = i if len(parts) == 1 else clamped(i, t.shape[dim])
        return kir.cast(t(replaced(idx, dim, i)), out)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        e = load(len(parts) - 1, idx)
        for k in range(len(parts) - 2, -1, -1):
            e = kir.op("where", out, kir.op("lt", torch.bool, idx[dim], kir.const(starts[k + 1], kir.INDEX)),
                       load(k, idx), e)
        return e

    return TVal(shape, out, fn)


@register("aten.constant_pad_nd")
def _constant_pad_nd(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    if not isinstance(x, TVal):
        raise Unlowerable("pad of a non-tensor")
    check_dtype(x.dtype)
    pad = list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    shape = tuple(meta[0])
    if 0 in x.shape or 0 in shape:
        fill = operand(value, ())
        return TVal(shape, x.dtype, lambda idx: kir.cast(fill(()), x.dtype))
    nd = len(x.shape)
    lows = {nd - 1 - k: pad[2 * k] for k in range(len(pad) // 2)}  # pairs from the last dim backwards
    fill = operand(value, ())

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        src, inside = list(idx), None
        for d, lo in lows.items():
            j = kir.iadd(idx[d], kir.const(-lo, kir.INDEX))
            lo_b, hi_b = kir.bounds(j)
            if lo_b >= 0 and hi_b < x.shape[d]:
                src[d] = j  # cropped, or padded on no side this output reaches
                continue
            ok = in_range(j, x.shape[d])
            inside = ok if inside is None else kir.op("and", torch.bool, inside, ok)
            src[d] = clamped(j, x.shape[d])
        if inside is None:
            return x(src)
        return kir.op("where", x.dtype, inside, x(src), kir.cast(fill(()), x.dtype))

    return TVal(shape, x.dtype, fn)


@register("aten.slice_scatter")
def _slice_scatter(args: list, kwargs: dict, meta: tuple) -> TVal:
    """self with self[..., start:start + n, ...] = src (step 1; the backward of slicing): out = inside ? src : self."""
    x, src = _source(args[0]), args[1]
    dim = norm_dim(args[2] if len(args) > 2 else kwargs.get("dim", 0), len(x.shape))
    start = args[3] if len(args) > 3 else kwargs.get("start")
    step = args[5] if len(args) > 5 else kwargs.get("step", 1)
    if not isinstance(src, TVal) or step != 1 or not (start is None or isinstance(start, int)):
        raise Unlowerable("slice_scatter with a step or runtime bounds")
    start = slice_start(start, x.shape[dim])
    n = src.shape[dim]
    if n == 0:
        return x

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        j = kir.iadd(idx[dim], kir.const(-start, kir.INDEX))
        value = kir.cast(src(replaced(idx, dim, clamped(j, n))), x.dtype)
        return kir.op("where", x.dtype, in_range(j, n), value, x(idx))

    return TVal(meta[0], x.dtype, fn)


@register("aten.select_scatter")
def _select_scatter(args: list, kwargs: dict, meta: tuple) -> TVal:
    """self with self.select(dim, index) = src: out = (position == index) ? src : self."""
    x, src = _source(args[0]), args[1]
    dim = norm_dim(args[2], len(x.shape))
    index = args[3]
    if not isinstance(src, TVal) or not isinstance(index, int):
        raise Unlowerable("select_scatter with a runtime index")
    index = index + x.shape[dim] if index < 0 else index
    at = kir.const(index, kir.INDEX)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        hit = kir.op("eq", torch.bool, idx[dim], at)
        value = kir.cast(src([e for d, e in enumerate(idx) if d != dim]), x.dtype)
        return kir.op("where", x.dtype, hit, value, x(idx))

    return TVal(meta[0], x.dtype, fn)


@register("aten.arange")
def _arange(args: list, kwargs: dict, meta: tuple) -> TVal:
    """start + i * step, computed as eager's kernel does (in double for floating results, int64 for integers)."""
    shape, out = tuple(meta[0]), meta[1]
    check_dtype(out)
    if len(shape) != 1 or len(args) not in (1, 2, 3):
        raise Unlowerable("arange of an unexpected form")
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) == 3 else 1)
    acc = torch.float64 if out.is_floating_point else torch.int64
    first, stride = operand(start, ()), operand(step, ())

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        offset = kir.op("mul", acc, kir.cast(idx[0], acc), kir.cast(stride(()), acc))
        return kir.cast(kir.op("add", acc, kir.cast(first(()), acc), offset), out)

    return TVal(shape, out, fn)


# ---- movement ops without an index tensor ------------------------------------------------------------------------

def _tensor(x: object, what: str) -> TVal:
    if not isinstance(x, TVal):
        raise Unlowerable(f"{what} of a non-tensor")
    check_dtype(x.dtype)
    return x


def _static_ints(v: object, what: str) -> List[int]:
    """A static int or list of ints (a runtime scalar would change the index map per call: extern instead)."""
    vs = list(v) if isinstance(v, (list, tuple)) else [v]
    if not all(type(k) is int for k in vs):
        raise Unlowerable(f"{what} with runtime arguments {v!r}")
    return vs


def _nothing(shape: Sequence[int], dtype: torch.dtype) -> TVal:
    """A value with no elements: nothing is loaded (and index arithmetic modulo a 0 extent is undefined)."""
    return TVal(shape, dtype, lambda idx: kir.const(0, dtype))


def _arg(args: list, kwargs: dict, i: int, name: str, default: object) -> object:
    return args[i] if len(args) > i else kwargs.get(name, default)


@register("aten.flip", "prims.rev")
def _flip(args: list, kwargs: dict, meta: tuple) -> TVal:
    """out[..., i, ...] = x[..., n - 1 - i, ...] on each flipped dim."""
    x = _tensor(args[0], "flip")
    nd = len(x.shape)
    dims = {norm_dim(d, nd) for d in _static_ints(_arg(args, kwargs, 1, "dims", []), "flip")}
    if not nd:
        return x
    if 0 in x.shape:
        return _nothing(x.shape, x.dtype)
    last = {d: kir.const(x.shape[d] - 1, kir.INDEX) for d in dims}
    return TVal(x.shape, x.dtype,
                lambda idx: x([kir.iadd(last[d], kir.imul(i, -1)) if d in last else i for d, i in enumerate(idx)]))


def _diagonal_args(args: list, kwargs: dict, first: int, nd: int) -> tuple:
    """(offset, dim1, dim2) of diagonal / diagonal_scatter, whose arguments start at ``first``."""
    offset = _arg(args, kwargs, first, "offset", 0)
    dim1 = _arg(args, kwargs, first + 1, "dim1", 0)
    dim2 = _arg(args, kwargs, first + 2, "dim2", 1)
    offset, dim1, dim2 = _static_ints([offset, dim1, dim2], "diagonal")
    return offset, norm_dim(dim1, nd), norm_dim(dim2, nd)


@register("aten.diagonal", "aten.diagonal_copy")
def _diagonal(args: list, kwargs: dict, meta: tuple) -> TVal:
    """The diagonal (dim1, dim2) as a new last dim d: x[..., d + max(-offset, 0), ..., d + max(offset, 0), ...]."""
    x = _tensor(args[0], "diagonal")
    offset, dim1, dim2 = _diagonal_args(args, kwargs, 1, len(x.shape))
    shape = tuple(meta[0])
    if 0 in shape:
        return _nothing(shape, x.dtype)
    rest = [d for d in range(len(x.shape)) if d not in (dim1, dim2)]
    lo1, lo2 = kir.const(max(-offset, 0), kir.INDEX), kir.const(max(offset, 0), kir.INDEX)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        src: List[kir.Expr] = [ZERO] * len(x.shape)
        for d, i in zip(rest, idx[:-1]):
            src[d] = i
        src[dim1], src[dim2] = kir.iadd(idx[-1], lo1), kir.iadd(idx[-1], lo2)
        return x(src)

    return TVal(shape, x.dtype, fn)


@register("aten.diagonal_scatter")
def _diagonal_scatter(args: list, kwargs: dict, meta: tuple) -> TVal:
    """self with self.diagonal(offset, dim1, dim2) = src (the backward of diagonal, trace/views.py's write-back):
    out = (idx[dim2] - idx[dim1] == offset) ? src[..., idx[dim1] - max(-offset, 0)] : self."""
    x, src = _source(args[0]), _tensor(args[1], "diagonal_scatter")
    offset, dim1, dim2 = _diagonal_args(args, kwargs, 2, len(x.shape))
    n = src.shape[-1] if src.shape else 0
    if n == 0:
        return x
    rest = [d for d in range(len(x.shape)) if d not in (dim1, dim2)]
    at, lo1 = kir.const(offset, kir.INDEX), kir.const(-max(-offset, 0), kir.INDEX)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        hit = kir.op("eq", torch.bool, kir.iadd(idx[dim2], kir.imul(idx[dim1], -1)), at)
        d = clamped(kir.iadd(idx[dim1], lo1), n)  # off the diagonal the load is discarded: keep it in bounds
        value = kir.cast(src([idx[k] for k in rest] + [d]), x.dtype)
        return kir.op("where", x.dtype, hit, value, x(idx))

    return TVal(meta[0], x.dtype, fn)


@register("aten.repeat")
def _repeat(args: list, kwargs: dict, meta: tuple) -> TVal:
    """x tiled: the leading new dims are ignored, and each of x's dims reads i % size."""
    x = _tensor(args[0], "repeat")
    _static_ints(args[1], "repeat")
    shape = tuple(meta[0])
    if 0 in shape:
        return _nothing(shape, x.dtype)
    off = len(shape) - len(x.shape)
    return TVal(shape, x.dtype, lambda idx: x([kir.imod(idx[off + d], n) for d, n in enumerate(x.shape)]))


@register("aten.roll")
def _roll(args: list, kwargs: dict, meta: tuple) -> TVal:
    """out[i] = x[(i - shift) mod n] on each rolled dim; with no dims, the same on the row-major flat index."""
    x = _tensor(args[0], "roll")
    shifts = _static_ints(args[1], "roll")
    dims = [norm_dim(d, len(x.shape)) for d in _static_ints(_arg(args, kwargs, 2, "dims", []), "roll")]
    if 0 in x.shape or not x.shape:
        return x
    if not dims:
        if len(shifts) != 1:
            raise Unlowerable(f"roll of {len(shifts)} shifts without dims")
        return _roll_flat(x, shifts[0])
    if len(shifts) != len(dims):
        raise Unlowerable(f"roll with {len(shifts)} shifts for {len(dims)} dims")
    back = {}
    for d, s in zip(dims, shifts):  # a dim named twice rolls twice, as eager
        back[d] = (back.get(d, 0) - s) % x.shape[d]
    return TVal(x.shape, x.dtype, lambda idx: x([kir.imod(kir.iadd(i, kir.const(back[d], kir.INDEX)), x.shape[d])
                                                 if back.get(d) else i for d, i in enumerate(idx)]))


def _roll_flat(x: TVal, shift: int) -> TVal:
    """roll without dims: eager flattens, rolls and restores the shape."""
    strides = contiguous_stride(x.shape)
    total = strides[0] * x.shape[0]
    back = kir.const((-shift) % total, kir.INDEX)

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        flat = ZERO
        for i, s in zip(idx, strides):
            flat = kir.iadd(flat, kir.imul(i, s))
        flat = kir.imod(kir.iadd(flat, back), total)
        return x([kir.imod(kir.ifloordiv(flat, s), n) for s, n in zip(strides, x.shape)])

    return TVal(x.shape, x.dtype, fn)


def _triangle(name: str, keep: str) -> Callable[..., TVal]:
    """tril (keep 'le') / triu (keep 'ge'): x where (column - row) compares with the diagonal, else 0."""
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        x = _tensor(args[0], name)
        if len(x.shape) < 2:
            raise Unlowerable("tril/triu of fewer than 2 dims")
        diagonal = operand(_arg(args, kwargs, 1, "diagonal", 0), ())
        zero = kir.const(0, x.dtype)

        def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
            above = kir.iadd(idx[-1], kir.imul(idx[-2], -1))
            inside = kir.op(keep, torch.bool, above, kir.cast(diagonal(()), kir.INDEX))
            return kir.op("where", x.dtype, inside, x(idx), zero)

        return TVal(x.shape, x.dtype, fn)
    return lower


register("aten.tril")(_triangle("tril", "le"))
register("aten.triu")(_triangle("triu", "ge"))


# ---- multi-output views (the node's metas hold one (shape, dtype) per output) ------------------------------------

@register("aten.split", "aten.split_with_sizes", "aten.split_copy", "aten.split_with_sizes_copy",
          "aten.unsafe_split", "aten.unsafe_split_with_sizes")
def _split(args: list, kwargs: dict, meta: tuple) -> List[TVal]:
    """Consecutive slices along dim; their sizes are the outputs' (the recorder's shapes: eager's rule)."""
    x = _tensor(args[0], "split")
    dim = norm_dim(_static_ints(_arg(args, kwargs, 2, "dim", 0), "split")[0], len(x.shape))
    _static_ints(args[1], "split")
    outs, start = [], 0
    for shape, _ in meta:
        outs.append(_slice_of(x, dim, start, tuple(shape)))
        start += shape[dim]
    return outs


def _slice_of(x: TVal, dim: int, start: int, shape: tuple) -> TVal:
    if start == 0 and shape == x.shape:
        return x
    c = kir.const(start, kir.INDEX)
    return TVal(shape, x.dtype, lambda idx: x(replaced(idx, dim, kir.iadd(idx[dim], c))))


@register("aten.unbind", "aten.unbind_copy")
def _unbind(args: list, kwargs: dict, meta: tuple) -> List[TVal]:
    x = _tensor(args[0], "unbind")
    dim = norm_dim(_static_ints(_arg(args, kwargs, 1, "dim", 0), "unbind")[0], len(x.shape))
    consts = [kir.const(k, kir.INDEX) for k in range(len(meta))]
    return [TVal(shape, x.dtype, lambda idx, c=c: x(list(idx[:dim]) + [c] + list(idx[dim:])))
            for (shape, _), c in zip(meta, consts)]
