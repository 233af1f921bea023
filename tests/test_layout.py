"""lazy/ir/layout.py: layout arithmetic, checked against torch's own."""
import itertools

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from lazy.ir.layout import contiguous_stride, non_overlapping_and_dense, storage_numel


def _layouts():
    base = torch.empty(2, 3, 4)
    yield from (base, base.transpose(0, 2), base.permute(1, 2, 0), base[:, ::2], base[:, 1:], base[0:1],
                base[:, :, 0], base.unsqueeze(1), torch.empty(3, 1).expand(3, 4), torch.empty(0, 3),
                torch.empty(1, 4).t(), torch.empty(4, 1, 2).as_strided((4, 1, 2), (2, 7, 1)),
                torch.empty(6).as_strided((2, 2), (1, 1)), torch.empty(()), torch.empty(5)[::3],
                torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last))


def test_non_overlapping_and_dense_agrees_with_torch():
    for t in _layouts():
        assert non_overlapping_and_dense(t.shape, t.stride()) == is_non_overlapping_and_dense_or_false(t), \
            (tuple(t.shape), t.stride())
    for shape in itertools.product((1, 2, 3), repeat=2):  # every permutation of small strides
        for stride in itertools.product((0, 1, 2, 3, 6), repeat=2):
            t = torch.empty(64).as_strided(shape, stride)
            assert non_overlapping_and_dense(shape, stride) == is_non_overlapping_and_dense_or_false(t)


def test_contiguous_stride_and_storage_numel():
    for t in _layouts():
        assert contiguous_stride(t.shape) == torch.empty(t.shape).stride()
        expected = 0 if t.numel() == 0 else t.untyped_storage().nbytes() // t.element_size()
        assert storage_numel(t.shape, t.stride(), t.storage_offset()) <= expected
    assert storage_numel((2, 3), (3, 1)) == 6 and storage_numel((2, 3), (1, 2), 4) == 10
