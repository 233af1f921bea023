"""The math functions (``M``) of Triton kernels run by Triton's interpreter (TRITON_INTERPRET=1): the cpu backing
device, on which the Triton backend is tested without a GPU.

libdevice (what ``M`` is on a GPU) has no interpreter implementation, so each function here applies eager's own
CPU kernel (torch) to the interpreter's numpy arrays: a kernel interpreted on the cpu computes every math function
as eager CPU does, and the tests compare everything else (the kernel's structure, masks, reductions, casts).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _wrap(fn: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    def apply(*args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        first = tensors[0]
        shape = np.broadcast_shapes(*(a.handle.data.shape for a in tensors))
        dtype = first.handle.data.dtype
        data = [torch.from_numpy(np.array(np.broadcast_to(a.handle.data, shape)))
                if isinstance(a, tl.tensor) else a for a in args]
        out = fn(*data).numpy().astype(dtype, copy=False)
        ty = first.type
        if len(shape) and any(a.type.is_block() for a in tensors):
            ty = tl.block_type(first.dtype, list(shape))
        return tl.tensor(TensorHandle(out, first.dtype), ty)
    return apply


_UNARY = {
    "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "sqrt": torch.sqrt, "sin": torch.sin, "cos": torch.cos,
    "erf": torch.erf, "log1p": torch.log1p, "expm1": torch.expm1, "log2": torch.log2, "exp2": torch.exp2,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "atan": torch.atan, "asin": torch.asin,
    "acos": torch.acos, "sinh": torch.sinh, "cosh": torch.cosh, "tan": torch.tan, "erfc": torch.erfc,
    "log10": torch.log10, "acosh": torch.acosh, "asinh": torch.asinh, "atanh": torch.atanh, "lgamma": torch.lgamma,
    "erfinv": torch.erfinv, "nearbyint": torch.round,
}
_BINARY = {"div_rn": torch.div, "pow": torch.pow, "atan2": torch.atan2, "fmod": torch.fmod,
           "copysign": torch.copysign, "hypot": torch.hypot}

for _name, _fn in {**_UNARY, **_BINARY}.items():
    globals()[_name] = _wrap(_fn)
