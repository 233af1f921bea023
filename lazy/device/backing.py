"""The backing device: where graphs run and synced data lives, and how ATen is called there.

Part of the device layer (Note [Layers] in lazy/device/tensor.py): the recorder, the executors and the sync layer
all read it, so it sits below all of them.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import _C
from ..config import config

# c10::ScalarType codes: how C code (csrc/upload.cpp, the C runner's allocations) is told a dtype
SCALAR_TYPE_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
                     torch.float32: 6, torch.float64: 7, torch.complex32: 8, torch.complex64: 9, torch.complex128: 10,
                     torch.bool: 11, torch.bfloat16: 15}


def backing_device() -> torch.device:
    """The device that runs graphs and holds synced data (``lazy.config.backing_device``)."""
    name = config.backing_device
    if name != _BACKING[0]:  # parsed once per setting: every sync asks
        _BACKING[:] = [name, torch.device(name)]
    return _BACKING[1]


_BACKING: list = [None, None]  # (lazy.config.backing_device, its torch.device)


# Note [Uploads do not wait]
# ``x.to("lazy")`` of a host tensor snapshots its data on the backing device. On cuda, eager's copy from pageable
# memory waits for the copy, hence for all work queued before it on the stream: a training loop's batch upload
# waited for the previous step's kernels, so the host recorded nothing while the GPU ran (a plain mark_step GPT step
# on an H100 waited 17 ms of its 60). An upload is instead staged in pinned memory (a host copy: the source may
# change as soon as ``to`` returns, as after eager's; a dtype conversion happens there too) and copied asynchronously
# from there; PyTorch's caching host allocator keeps the pinned block until the copy has run. The result is eager's:
# same values, dtype and layout.
def to_backing(t: torch.Tensor, dtype: Optional[torch.dtype] = None,
               memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    """A copy of ``t`` (any device) on the backing device, converted to ``dtype``, in eager's layout for
    ``memory_format``; from the host to cuda without waiting for the device (Note [Uploads do not wait])."""
    device = backing_device()
    t = t.detach()
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device, dtype=dtype, copy=True, memory_format=memory_format)
    if memory_format is torch.preserve_format:  # one C call (Note [Uploads in C] in csrc/upload.cpp)
        code = -1 if dtype is None or dtype is t.dtype else SCALAR_TYPE_CODES.get(dtype)
        if code is not None:
            out = _C.upload(t, code, device.index if device.index is not None else torch.cuda.current_device())
            if out is not None:
                return out
    like = torch.empty_like(t, memory_format=memory_format)  # eager's layout of the copy (pages never touched)
    staged = torch.empty_strided(t.shape, like.stride(), dtype=dtype or t.dtype, pin_memory=True)
    staged.copy_(t)  # converted on the host, where eager converts a copy to cuda too (its copy_ of a cpu source)
    return staged.to(device, non_blocking=True)


# Note [Executing inside __torch_dispatch__]
# Syncs usually start inside the recorder (.cpu() is aten._to_copy, .item() is _local_scalar_dense), where the
# dispatcher has excluded the Conjugate, Negative and ZeroTensor keys (among others) from the thread's key set.
# ATen calls made there skip those fallbacks, so a conj or neg view (``_conj``, ``_neg_view``) reaching a kernel
# is read without its conjugation or negation: fft.hfft* returned wrong values. Graphs and eager fallbacks run
# under the dispatch key sets of plain eager code instead, captured here at import (outside any dispatch).
_EAGER_KEYS = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


def eager_dispatch() -> Any:
    """A context in which ATen calls dispatch as in plain eager code (Note [Executing inside __torch_dispatch__])."""
    return torch._C._ForceDispatchKeyGuard(*_EAGER_KEYS)
