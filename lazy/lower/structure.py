"""Lowering table, structural part: movement ops as index maps and reductions.

Note [Movement ops are index maps]
view/reshape/permute/transpose/expand/slice/select/squeeze/unsqueeze/broadcast never copy: each returns a
``TVal`` whose loader rewrites the index and calls its input's loader. Reshape goes through the flat row-major
index; kir's index simplification folds ``(i*C + j) // C`` back to ``i``, so merged or split contiguous dims
stay plain strided loads.
"""
from __future__ import annotations

from typing import Any, Callable, List, Sequence

import torch

from ..ir.layout import contiguous_stride
from . import kir, values
from .pointwise import LOWERINGS, register
from .values import TVal, Unlowerable, check_dtype, norm_dim, slice_start

ZERO = kir.const(0, kir.INDEX)


def _view(args: list, kwargs: dict, meta: tuple) -> TVal:
    x, shape = args[0], tuple(meta[0])
    if not isinstance(x, TVal) or (len(args) > 1 and isinstance(args[1], torch.dtype)):
        raise Unlowerable("view of a non-tensor, or a dtype view (reinterprets bits)")
    if shape == x.shape:
        return x
    out_strides = contiguous_stride(shape)
    in_strides = contiguous_stride(x.shape)
    if 0 in x.shape:  # no element is ever loaded (and index arithmetic modulo a 0 extent is undefined)
        return TVal(shape, x.dtype, lambda idx: kir.const(0, x.dtype))

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        flat = ZERO
        for i, s, n in zip(idx, out_strides, shape):
            if n != 1:
                flat = kir.iadd(flat, kir.imul(i, s))
        return x([ZERO if n == 1 else kir.imod(kir.ifloordiv(flat, s), n) for s, n in zip(in_strides, x.shape)])

    return TVal(shape, x.dtype, fn)


for _name in ("view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "expand_dims", "flatten", "unflatten",
              "view_as", "reshape_as", "squeeze_copy", "unsqueeze_copy", "view_copy", "_reshape_alias"):
    LOWERINGS[f"aten.{_name}"] = _view
LOWERINGS["prims.reshape"] = LOWERINGS["prims.squeeze"] = _view


@register("aten.permute", "prims.transpose", "aten.permute_copy")
def _permute(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    dims = [norm_dim(d, len(x.shape)) for d in args[1]]
    inv = [0] * len(dims)
    for i, d in enumerate(dims):
        inv[d] = i
    return TVal(meta[0], x.dtype, lambda idx: x([idx[inv[k]] for k in range(len(dims))]))


@register("aten.t", "aten.transpose", "aten.swapaxes")
def _transpose(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    nd = len(x.shape)
    if nd < 2:
        return x
    a, b = (norm_dim(args[1], nd), norm_dim(args[2], nd)) if len(args) > 2 else (0, 1)
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return TVal(meta[0], x.dtype, lambda idx: x([idx[perm[k]] for k in range(nd)]))


@register("aten.expand", "aten.expand_as", "aten.broadcast_to", "aten.expand_copy")
def _expand(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    shape = tuple(meta[0])
    off = len(shape) - len(x.shape)
    return TVal(shape, x.dtype, lambda idx: x([ZERO if n == 1 else idx[off + d] for d, n in enumerate(x.shape)]))


@register("prims.broadcast_in_dim")
def _broadcast_in_dim(args: list, kwargs: dict, meta: tuple) -> TVal:
    x, shape, bdims = args[0], tuple(args[1]), list(args[2])
    return TVal(shape, x.dtype, lambda idx: x([ZERO if n == 1 else idx[bdims[k]] for k, n in enumerate(x.shape)]))


@register("aten.slice", "aten.slice_copy")
def _slice(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    nd = len(x.shape)
    dim = norm_dim(args[1] if len(args) > 1 else kwargs.get("dim", 0), nd)
    start = args[2] if len(args) > 2 else kwargs.get("start")
    step = args[4] if len(args) > 4 else kwargs.get("step", 1)
    if not (start is None or isinstance(start, int)) or not isinstance(step, int):
        raise Unlowerable("slice with runtime bounds")
    start = slice_start(start, x.shape[dim])

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        idx = list(idx)
        idx[dim] = kir.iadd(kir.imul(idx[dim], step), kir.const(start, kir.INDEX))
        return x(idx)

    return TVal(meta[0], x.dtype, fn)


@register("aten.select", "aten.select_copy")
def _select(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    dim = norm_dim(args[1], len(x.shape))
    index = args[2]
    if not isinstance(index, int):
        raise Unlowerable("select with a runtime index")
    index = index + x.shape[dim] if index < 0 else index
    c = kir.const(index, kir.INDEX)
    return TVal(meta[0], x.dtype, lambda idx: x(list(idx[:dim]) + [c] + list(idx[dim:])))


# ---- reductions --------------------------------------------------------------------------------------------------

def _dims(x: TVal, dims: Any) -> List[int]:
    nd = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(nd))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(d, nd) for d in dims}) if nd else []


def reduce(kind: str, x: TVal, dims: List[int], keepdim: bool, out: torch.dtype,
           body: Callable[[kir.Expr], kir.Expr] = lambda e: e) -> TVal:
    """``kind`` ('sum'|'max'|'min'|'prod', or 'argmax'|'argmin' with ``out`` int64: Note [Arg reductions]) of
    ``body(x)`` over ``dims``; the result is a lazy ``reduce`` ref."""
    check_dtype(out)
    kept = [d for d in range(len(x.shape)) if d not in dims]
    red_shape = [x.shape[d] for d in dims]
    out_shape = [x.shape[d] for d in kept]
    value = out  # the type body(x) is computed in
    if kind in kir.ARG_KINDS:
        # NOTE: float16/bfloat16 compare in float (exact), as eager's kernels do
        acc = value = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    elif kind in ("max", "min"):
        acc = out
    elif out.is_floating_point:
        # NOTE: float sums accumulate in double: sound without pairwise summation (short ones: Note [Short float sums
        # in float lanes] in codegen/cpp_stages.py)
        acc = torch.float64
    else:
        acc = torch.int64

    def red_body(ov: List[kir.Expr], rv: List[kir.Expr]) -> kir.Expr:
        idx: List[kir.Expr] = [ZERO] * len(x.shape)
        for d, v in zip(kept, ov):
            idx[d] = v
        for d, v in zip(dims, rv):
            idx[d] = v
        return kir.cast(body(kir.cast(x(idx), value)), acc)

    red = kir.reduction(kind, out, acc, out_shape, red_shape, red_body)
    rv = set(red.red_vars)
    if any(e.op == "reduce" and any(kir.free_vars(i) & rv for i in e.args[1]) for e in kir.walk(red.body)):
        # NOTE: the input reads another reduction at an index that moves with this one's reduction loop: store
        # the input first, so every kernel only nests reductions indexed by its outer loop (schedule/).
        x = values.REALIZE(x)
        red = kir.reduction(kind, out, acc, out_shape, red_shape, red_body)
    final_shape = [1 if d in dims else n for d, n in enumerate(x.shape)] if keepdim else out_shape

    def fn(idx: Sequence[kir.Expr]) -> kir.Expr:
        if keepdim:
            idx = [i for d, i in enumerate(idx) if d not in dims]
        return kir.reduce_ref(red, idx)

    return TVal(final_shape, out, fn)


def _reduction(kind: str, mean: bool = False) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        x = args[0]
        dims = args[1] if len(args) > 1 and not isinstance(args[1], (torch.dtype, bool)) else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        out = meta[1]
        d = _dims(x, dims)
        r = reduce(kind, x, d, bool(keepdim), out)
        if not mean:
            return r
        n = 1
        for k in d:
            n *= x.shape[k]
        c = kir.const(n, out)
        return TVal(r.shape, out, lambda idx: kir.op("truediv", out, r(idx), c))
    return lower


LOWERINGS["aten.sum"] = LOWERINGS["prims.sum"] = _reduction("sum")
LOWERINGS["aten.mean"] = _reduction("sum", mean=True)
LOWERINGS["aten.prod"] = LOWERINGS["prims.prod"] = _reduction("prod")
LOWERINGS["aten.amax"] = LOWERINGS["prims.amax"] = _reduction("max")
LOWERINGS["aten.amin"] = LOWERINGS["prims.amin"] = _reduction("min")


def _extremum(kind: str) -> Callable[..., Any]:
    def lower(args: list, kwargs: dict, meta: tuple) -> Any:
        if len(args) == 1 and "dim" not in kwargs:
            if meta[0] is None:
                raise Unlowerable(f"{kind} without a result")
            return reduce(kind, args[0], _dims(args[0], None), False, meta[1])
        # max.dim / min.dim: (values, indices) (Note [Arg reductions])
        x, dim = args[0], args[1] if len(args) > 1 else kwargs["dim"]
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise Unlowerable(f"{kind} with another tensor")
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        indices = _arg(f"arg{kind}", x, dim, keepdim)
        nd = len(x.shape)
        if nd == 0:
            return [x, indices]
        d = norm_dim(dim, nd)

        def value(idx: Sequence[kir.Expr]) -> kir.Expr:
            at = list(idx) if keepdim else list(idx[:d]) + [ZERO] + list(idx[d:])
            at[d] = indices(idx)
            return x(at)

        return [TVal(indices.shape, x.dtype, value), indices]
    return lower


# Note [Arg reductions]
# argmax/argmin and the indices of max.dim/min.dim are reductions of kind 'argmax'/'argmin' (kir.ARG_KINDS): the
# body is the value compared (in its own type; float16/bfloat16 in float32, as eager compares), the result the
# row-major flat index over the reduced dims of the FIRST maximal (minimal) element, where a NaN is above (below)
# every number and the first NaN wins; that is eager CPU's answer, also for -0.0 == 0.0 (a tie: the first) and for
# argmax(dim=None) (the index into the flattened logical tensor). A backend must keep that answer wherever it
# combines partial results (ties go to the smaller index). The values of max.dim/min.dim are then the input read
# back at that index, not a separate max reduction: eager returns the element at its index, and a max combined in
# lanes may return 0.0 where eager returns the -0.0 it met first. A reduced dim of size 0 stays an extern (eager
# raises; the recorder already did).
def _arg(kind: str, x: TVal, dim: Any, keepdim: bool) -> TVal:
    dims = _dims(x, dim)
    if any(x.shape[d] == 0 for d in dims):
        raise Unlowerable(f"{kind} over an empty dim")
    return reduce(kind, x, dims, keepdim, torch.int64)


def _arg_reduction(kind: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        x = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)):
            raise Unlowerable(f"{kind} with a dim of type {type(dim).__name__}")
        if x.dtype is torch.bool:
            raise Unlowerable(f"{kind} of bool")  # eager raises
        r = _arg(kind, x, dim, keepdim)
        if tuple(r.shape) != tuple(meta[0]):
            raise Unlowerable(f"{kind}: shape {r.shape} differs from the recorded {meta[0]}")
        return r
    return lower


LOWERINGS["aten.argmax"] = _arg_reduction("argmax")
LOWERINGS["aten.argmin"] = _arg_reduction("argmin")


LOWERINGS["aten.max"] = _extremum("max")
LOWERINGS["aten.min"] = _extremum("min")


# Note [Deviations in float]
# var's second pass squares and sums the deviations from the mean. In double (eager's CPU kernel accumulates in
# double too) each element costs two conversions and double arithmetic, half the lanes of a float vector: var(-1)
# of 1024^2 ran at 1.3-1.7x torch.compile's kernel time (Inductor's Welford runs in float) on an AMD EPYC. For a
# float32 input the deviation x - mean and its square are float (the mean rounded to float: an error d in the mean
# adds n d^2 to a sum of squares S, a relative d^2 / var, below 2^-46 for any mean within the data's range), and the
# sum follows every float32 sum: float lanes where each lane takes at most FLOAT_LANE_TERMS terms, double otherwise.
@register("prims.var")
def _var(args: list, kwargs: dict, meta: tuple) -> TVal:
    """Two passes (mean, then the sum of squared deviations): sound in float without Welford."""
    x, dims = args[0], _dims(args[0], args[1])
    correction = args[2] if len(args) > 2 else kwargs.get("correction", 0)
    if not isinstance(correction, (int, float, values.ScalarArg)):
        raise Unlowerable(f"var with a correction of type {type(correction).__name__}")
    out = meta[1]
    n = 1
    for d in dims:
        n *= x.shape[d]
    total = reduce("sum", x, dims, True, out)
    nc = kir.const(n, torch.float64)
    mean = TVal(total.shape, torch.float64, lambda idx: kir.op("truediv", torch.float64, total(idx), nc))
    off = len(x.shape) - len(mean.shape)
    # Note [Deviations in float]: a float32 input's deviations are squared in float, so a short sum of them takes
    # float lanes (Note [Short float sums in float lanes] in codegen/cpp_stages.py); others stay double
    dev = torch.float32 if x.dtype == torch.float32 and out == torch.float32 else torch.float64
    centered = TVal(x.shape, dev, lambda idx: kir.op("sub", dev, kir.cast(x(idx), dev),
                                                     kir.cast(mean([ZERO if m == 1 else idx[off + k]
                                                                    for k, m in enumerate(mean.shape)]), dev)))
    sq = reduce("sum", centered, dims, False, dev, lambda e: kir.op("mul", dev, e, e))
    if isinstance(correction, values.ScalarArg):  # x.var(dim) records its correction as a runtime scalar
        zero, f64 = kir.const(0, torch.float64), torch.float64
        denom = kir.op("maximum", f64, kir.op("sub", f64, kir.const(n, f64), kir.cast(correction.expr(), f64)), zero)
    else:
        denom = kir.const(max(n - correction, 0), torch.float64)
    return TVal(sq.shape, out, lambda idx: kir.cast(kir.op("truediv", torch.float64, sq(idx), denom), out))
