"""Own shape rules for the commonest ops, ahead of the meta kernels (trace/meta.py).

A rule returns the output metadata (``Out``) when it is certain of it, or None to let the meta kernel decide. The
rules cover the bulk of a training step's first recording, where each new signature would otherwise cost a
meta-kernel call (tens of microseconds): elementwise ops on contiguous floating tensors with a tensor of the same
metadata or a Python number as the other operand, matrix products, dim reductions, and the layout views
``t``/``transpose``/``unsqueeze`` (any layout). tests/test_shapes.py checks every rule against the meta kernels.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from ..ir.layout import contiguous_stride, storage_numel

aten = torch.ops.aten


def _lazy(t: Any) -> bool:
    from ..device.tensor import LazyTensor
    return type(t) is LazyTensor


def _contiguous_float(t: Any) -> Optional[tuple]:
    """``t``'s (shape, stride, offset, dtype) if it is a contiguous, non-empty, floating lazy tensor."""
    if not _lazy(t):
        return None
    desc = t._lz_desc
    shape, stride, _, dtype = desc
    if not dtype.is_floating_point or 0 in shape or stride != contiguous_stride(shape):
        return None
    return desc


def _fresh(desc: tuple) -> Any:
    from .meta import Out
    shape, stride, _, dtype = desc
    return Out((shape, stride, 0, dtype, storage_numel(shape, stride)))


def _unary(args: tuple, kwargs: dict) -> Any:
    desc = _contiguous_float(args[0]) if args else None
    return None if desc is None else _fresh(desc)


_NUMBERS = (int, float, bool)  # a Python number of these types never changes a floating tensor's dtype


def _binary(args: tuple, kwargs: dict) -> Any:
    if len(args) < 2:
        return None
    desc = _contiguous_float(args[0])
    if desc is None:
        return None
    other = args[1]
    if type(other) in _NUMBERS or _contiguous_float(other) == desc:
        if "alpha" in kwargs and type(kwargs["alpha"]) not in _NUMBERS:
            return None
        return _fresh(desc)
    return None


def _mm(args: tuple, kwargs: dict) -> Any:
    if len(args) != 2 or kwargs:
        return None
    a, b = _contiguous_float(args[0]), _contiguous_float(args[1])
    if a is None or b is None or len(a[0]) != 2 or len(b[0]) != 2 or a[3] != b[3] or a[0][1] != b[0][0]:
        return None
    shape = (a[0][0], b[0][1])
    return _fresh((shape, contiguous_stride(shape), 0, a[3]))


def _addmm(args: tuple, kwargs: dict) -> Any:
    if len(args) != 3 or kwargs:  # beta/alpha passed: the meta kernel decides
        return None
    out = _mm(args[1:], {})
    bias = _contiguous_float(args[0])
    if out is None or bias is None or bias[3] != out[3] or bias[0] not in (out[0], out[0][1:]):
        return None
    return out


def _dims(dims: Any, ndim: int) -> Optional[list]:
    """Normalized, distinct dims of a non-empty int list, or None."""
    if type(dims) not in (list, tuple) or not dims or any(type(d) is not int for d in dims):
        return None
    if any(d < -ndim or d >= ndim for d in dims):
        return None
    norm = sorted({d % ndim for d in dims})
    return norm if len(norm) == len(dims) else None


def _reduce_dims(args: tuple, kwargs: dict) -> Any:
    """sum.dim_IntList / mean.dim: (x, dims, keepdim=False) without a dtype."""
    if not 2 <= len(args) <= 3 or kwargs or (len(args) == 3 and type(args[2]) is not bool):
        return None
    desc = _contiguous_float(args[0])
    if desc is None:
        return None
    dims = _dims(args[1], len(desc[0]))
    if dims is None:
        return None
    keep = len(args) == 3 and args[2]
    shape = tuple(1 if i in dims else n for i, n in enumerate(desc[0]) if keep or i not in dims)
    return _fresh((shape, contiguous_stride(shape), 0, desc[3]))


def _view_of(t: Any, shape: tuple, stride: tuple) -> Any:
    """A view of ``t`` with a new shape and stride: same offset, dtype and storage."""
    from .meta import Out
    _, _, offset, dtype = t._lz_desc
    st = t._lz_st
    if st.value.dtype != dtype:  # a dtype view counts its storage in other elements
        return None
    return Out((shape, stride, offset, dtype, st.numel))


def _transpose(args: tuple, kwargs: dict) -> Any:
    if len(args) != 3 or kwargs or not _lazy(args[0]) or type(args[1]) is not int or type(args[2]) is not int:
        return None
    shape, stride = list(args[0]._lz_desc[0]), list(args[0]._lz_desc[1])
    n = len(shape)
    if n == 0 or not (-n <= args[1] < n and -n <= args[2] < n):
        return None
    a, b = args[1] % n, args[2] % n
    shape[a], shape[b] = shape[b], shape[a]
    stride[a], stride[b] = stride[b], stride[a]
    return _view_of(args[0], tuple(shape), tuple(stride))


def _t(args: tuple, kwargs: dict) -> Any:
    if len(args) != 1 or kwargs or not _lazy(args[0]) or len(args[0]._lz_desc[0]) != 2:
        return None
    return _transpose((args[0], 0, 1), {})


def _unsqueeze(args: tuple, kwargs: dict) -> Any:
    if len(args) != 2 or kwargs or not _lazy(args[0]) or type(args[1]) is not int:
        return None
    shape, stride = args[0]._lz_desc[0], args[0]._lz_desc[1]
    n = len(shape)
    if not -(n + 1) <= args[1] <= n:
        return None
    d = args[1] % (n + 1)
    new_stride = 1 if d >= n else shape[d] * stride[d]  # as ATen's inferUnsqueezeGeometry
    return _view_of(args[0], shape[:d] + (1,) + shape[d:], stride[:d] + (new_stride,) + stride[d:])


_UNARY = ("relu", "neg", "abs", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "gelu", "silu",
          "reciprocal", "erf", "log1p", "expm1", "square")
_BINARY = ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "maximum", "minimum", "pow.Tensor_Scalar")


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


RULES: Dict[Any, Callable[[tuple, dict], Any]] = {
    **{_overload(name): _unary for name in _UNARY},
    **{_overload(name): _binary for name in _BINARY},
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten.sum.dim_IntList: _reduce_dims,
    aten.mean.dim: _reduce_dims,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.unsqueeze.default: _unsqueeze,
}
