"""lazy's own shape rules agree with PyTorch's meta kernels wherever they answer."""
import itertools

import pytest
import torch

from lazy.trace import meta
from lazy.trace.shapes import RULES

aten = torch.ops.aten
# Rules with their own argument patterns (checked by test_structural_rule_matches_meta); the rest are elementwise.
STRUCTURAL = {aten.mm.default, aten.addmm.default, aten.sum.dim_IntList, aten.mean.dim, aten.t.default,
              aten.transpose.int, aten.unsqueeze.default}

L = "lazy"

SHAPES = [(5,), (1,), (3, 4), (1, 4), (4, 1), (2, 1, 3), (2, 3, 4, 1)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _inputs():
    for shape, dtype in itertools.product(SHAPES, DTYPES):
        base = torch.randn(*shape).to(dtype)
        yield base.to(L)
        if len(shape) >= 2:
            yield base.transpose(0, 1).contiguous().transpose(0, 1).to(L)  # a non-contiguous layout: no rule
        yield base[..., :1].to(L)


@pytest.mark.parametrize("op", sorted(set(RULES) - STRUCTURAL, key=str), ids=str)
def test_rule_matches_meta(op):
    answered = 0
    for x in _inputs():
        others = [(), (2.5,), (3,), (True,), (x,), (x.to(torch.float64),)]
        for other in others:
            args = (x,) + other
            try:
                want = meta._infer(op, args, {})
            except Exception:  # noqa: BLE001 - an invalid call has no metadata to compare
                continue
            got = RULES[op](args, {})
            if got is not None:
                answered += 1
                assert tuple(got) == tuple(want), (op, x._lz_desc, other, got, want)
    assert answered > 0


def _layouts(*shape, dtype=torch.float32):
    """Lazy tensors of ``shape``: contiguous, transposed (if 2-D or more), a slice with an offset, a dtype view."""
    base = torch.randn(*shape).to(dtype)
    yield base.to(L)
    if len(shape) >= 2:
        yield base.transpose(0, 1).contiguous().transpose(0, 1).to(L)
    if shape and shape[0] > 1:
        yield base.to(L)[1:]
    if dtype == torch.float32:
        yield base.to(L).view(torch.int32)


def _structural_calls():
    for dtype in (torch.float32, torch.float64, torch.float16):
        for a in _layouts(3, 4, dtype=dtype):
            for b in _layouts(4, 2, dtype=dtype):
                yield aten.mm.default, (a, b)
                for bias in list(_layouts(2, dtype=dtype)) + list(_layouts(3, 2, dtype=dtype)) + [b]:
                    yield aten.addmm.default, (bias, a, b)
            yield aten.mm.default, (a, a)
    for shape in ((5,), (3, 4), (2, 3, 4), (1, 4, 1)):
        for x in _layouts(*shape):
            for dims in ([0], [-1], [0, -1], [1, 0], [0, 0], [len(shape)], []):
                for keep in ((), (True,), (False,)):
                    yield aten.sum.dim_IntList, (x, dims) + keep
                    yield aten.mean.dim, (x, dims) + keep
            yield aten.t.default, (x,)
            for d0, d1 in ((0, -1), (-1, 0), (0, 0), (0, len(shape))):
                yield aten.transpose.int, (x, d0, d1)
            for d in range(-len(shape) - 2, len(shape) + 2):
                yield aten.unsqueeze.default, (x, d)


def test_structural_rule_matches_meta():
    answered = {op: 0 for op in STRUCTURAL}
    for op, args in _structural_calls():
        try:
            want = meta._infer(op, args, {})
        except Exception:  # noqa: BLE001 - an invalid call has no metadata to compare
            want = None
        got = RULES[op](args, {})
        if got is not None:
            answered[op] += 1
            assert want is not None and tuple(got) == tuple(want), (op, [getattr(a, "_lz_desc", a) for a in args],
                                                                    got, want)
    assert all(answered.values()), answered
