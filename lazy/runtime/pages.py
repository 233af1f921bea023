"""Fresh output buffers of compiled graphs: huge pages for large ones.

Note [Huge pages for large outputs]
A graph output is a fresh tensor (it becomes a lazy tensor's data), and a large one is fresh memory from the kernel
(glibc maps every allocation above 32 MB anew, and unmaps it when freed): each 4 KB page faults and is zeroed when
the kernel first writes it. For a memory-bound kernel that is most of the time: ``x * 2 + 1`` at 4096^2 (64 MB
out) ran at 33 % of ``copy_``'s bandwidth into an existing buffer, 1 thread; eager and torch.compile pay the same.
Where transparent huge pages are enabled in 'madvise' mode (the common default), ``madvise(MADV_HUGEPAGE)`` on the
2 MB-aligned interior of the fresh buffer, before anything touches it, makes those faults 2 MB ones: 66 % of
``copy_`` (the rest is the kernel zeroing the pages). Only for outputs of at least HUGE_MIN_BYTES, on Linux; a
failed madvise changes nothing but speed. Reusing the previous run's output when nothing references it any more
would remove the zeroing too, but makes a cached program hold its outputs' memory between runs.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Optional

import torch

HUGE_MIN_BYTES = 8 << 20
_HUGE = 1 << 21  # x86-64 and aarch64 (4 KB base pages) transparent huge page size
_MADV_HUGEPAGE = 14


def _madvise() -> Optional[ctypes._CFuncPtr]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_MADVISE = _madvise()


def empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A fresh contiguous tensor for a kernel to write; huge pages asked for if it is large (Note [Huge pages for
    large outputs])."""
    t = torch.empty(shape, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    if nbytes >= HUGE_MIN_BYTES and _MADVISE is not None:
        start = t.data_ptr()
        lo, hi = (start + _HUGE - 1) & ~(_HUGE - 1), (start + nbytes) & ~(_HUGE - 1)
        if hi > lo:
            _MADVISE(lo, hi - lo, _MADV_HUGEPAGE)
    return t
