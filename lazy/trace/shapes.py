"""Own shape rules for the commonest ops, ahead of the meta kernels (trace/meta.py).

A rule returns the output metadata (``Out``) when it is certain of it, or None to let the meta kernel decide. The
rules here cover elementwise ops on contiguous floating tensors, with a tensor of the same metadata or a Python
number as the other operand: the bulk of a training step's first recording, where each new signature would
otherwise cost a meta-kernel call (tens of microseconds). tests/test_shapes.py checks every rule against the
meta kernels.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from ..ir.layout import contiguous_stride, storage_numel

aten = torch.ops.aten


def _contiguous_float(t: Any) -> Optional[tuple]:
    """``t``'s (shape, stride, offset, dtype) if it is a contiguous, non-empty, floating lazy tensor."""
    from ..device.tensor import LazyTensor
    if type(t) is not LazyTensor:
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


_UNARY = ("relu", "neg", "abs", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "gelu", "silu",
          "reciprocal", "erf", "log1p", "expm1", "square")
_BINARY = ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "maximum", "minimum", "pow.Tensor_Scalar")


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


RULES: Dict[Any, Callable[[tuple, dict], Any]] = {
    **{_overload(name): _unary for name in _UNARY},
    **{_overload(name): _binary for name in _BINARY},
}
