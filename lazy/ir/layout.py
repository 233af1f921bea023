"""Layout arithmetic shared by the lazy tensors (device/) and the kernel IR (lower/)."""
from __future__ import annotations

from typing import Sequence, Tuple


def contiguous_stride(shape: Sequence[int]) -> Tuple[int, ...]:
    """Row-major strides of ``shape`` (size-0 and size-1 dims count as 1, as PyTorch does)."""
    stride = []
    acc = 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


def storage_numel(shape: Sequence[int], stride: Sequence[int], offset: int = 0) -> int:
    """Elements a storage needs to hold a tensor of this shape and stride at this offset."""
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def non_overlapping_and_dense(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a tensor of this shape and stride covers its memory exactly once (some permutation of it is
    contiguous), as c10's TensorImpl computes it: size-1 dims are ignored, the others sorted by stride."""
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(shape, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True
