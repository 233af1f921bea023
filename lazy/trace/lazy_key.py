"""Kernels on the ``Lazy`` dispatch key: calls that carry no lazy tensor but ask for the lazy device.

Factories (``torch.empty(..., device="lazy")``, and through them zeros, ones, full, rand, arange, eye, ... and
``x.to("lazy")``) reach the dispatcher's ``Lazy`` key, not ``__torch_dispatch__``; one fallback kernel sends
every such call to the recorder, which records it with the device replaced by the backing device.

NOTE: calls made with the Python dispatch key excluded (``torch.tensor(data, device="lazy")`` does that) reach
the Lazy key even for lazy tensors, and the generic fallback trampoline asserts on them: the entry points they
use get kernels of their own.
"""
from __future__ import annotations

import torch

from .dispatch import dispatch

_lib = None


def register() -> None:
    """Install the Lazy-key fallback (once per process)."""
    global _lib
    if _lib is not None:
        return
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "Lazy"):
        raise RuntimeError("lazy: another lazy-tensor backend (torch._lazy / LTC) already owns the Lazy dispatch key "
                           "in this process; lazy and torch._lazy cannot be used in the same process")
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(lambda op, *args, **kwargs: dispatch(op, args, kwargs), "Lazy")
    aten_lib = torch.library.Library("aten", "IMPL")
    for name in _ENTRY_POINTS:
        op = getattr(torch.ops.aten, name.split(".")[0])
        op = getattr(op, name.split(".")[1] if "." in name else "default")
        aten_lib.impl(name, _kernel(op, dispatch), "Lazy")
    _lib = (lib, aten_lib)


_ENTRY_POINTS = ("empty.memory_format", "empty_strided", "_to_copy", "copy_", "lift_fresh", "detach", "alias",
                 "_copy_from", "_copy_from_and_resize")


def _kernel(op, dispatch):  # noqa: ANN001, ANN202
    def kernel(*args, **kwargs):  # noqa: ANN202
        return dispatch(op, args, kwargs)
    return kernel
