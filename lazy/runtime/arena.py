"""One byte arena for a compiled program's kernel-only temporaries, laid out once by buffer lifetime.

Shared by the cpp runtime (Note [Run plan] in runtime/cpp.py) and the Triton runtime (Note [Temporaries in one
allocation] in runtime/triton.py): a buffer that only kernels write and read lives at a fixed offset of one
allocation instead of costing an allocation (and, on the GPU, a tensor object) of its own per run.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

ALIGN = 64  # every buffer starts on a cache line (and on Triton's 16-byte pointer alignment)


def stored_by_kernels(steps: Sequence[Any], kernel_type: type) -> Tuple[Dict[int, int], Dict[int, Any]]:
    """For the buffers that kernels of ``steps`` store: the step defining each (its first store), and the buffer by
    id."""
    defined: Dict[int, int] = {}
    stored: Dict[int, Any] = {}
    for i, step in enumerate(steps):
        if isinstance(step, kernel_type):
            for b, _, _ in step.stores:
                defined.setdefault(b.id, i)
                stored[b.id] = b
    return defined, stored


def layout(bufs: List[Any], defined: Dict[int, int], last_use: Dict[int, int]) -> Tuple[int, Dict[int, int]]:
    """Byte offsets of ``bufs`` in one arena: greedy by size, a buffer shares bytes only with buffers whose
    lifetimes (defining step .. last use) do not overlap its own. Returns (arena size, offsets by buffer id)."""
    placed: List[Tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    offsets: Dict[int, int] = {}
    size = 0
    for b in sorted(bufs, key=lambda b: (-nbytes(b), b.id)):
        n = -(-max(nbytes(b), 1) // ALIGN) * ALIGN
        first = defined[b.id]
        last = max(last_use.get(b.id, first), first)
        busy = sorted((o, e) for o, e, f, end in placed if not (end < first or last < f))
        off = 0
        for o, e in busy:
            if off + n <= o:
                break
            off = max(off, e)
        placed.append((off, off + n, first, last))
        offsets[b.id] = off
        size = max(size, off + n)
    return size, offsets


def nbytes(b: Any) -> int:
    n = b.dtype.itemsize
    for d in b.shape:
        n *= d
    return n


def view(arena: torch.Tensor, offset: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """The buffer at ``offset`` of ``arena`` (uint8) as a contiguous tensor of ``shape`` and ``dtype``."""
    n = 1
    for d in shape:
        n *= d
    return arena[offset:offset + n * dtype.itemsize].view(dtype).view(shape)
