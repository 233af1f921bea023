"""lazy's own shape rules agree with PyTorch's meta kernels wherever they answer."""
import itertools

import pytest
import torch

from lazy.trace import meta
from lazy.trace.shapes import RULES

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


@pytest.mark.parametrize("op", sorted(RULES, key=str), ids=str)
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
