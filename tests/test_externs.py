"""Extern steps (lazy/runtime/externs.py): the generated runner of a flat template (Note [Extern runners]) calls
what the template-walking path calls, with views, runtime scalars, several outputs and planned layouts, and gives
eager's results."""
import torch

from lazy.ir.node import DEVICE, SCALAR_MARKERS, TENSOR
from lazy.lower import kir
from lazy.lower.graph import Extern
from lazy.runtime.externs import extern_call, run_extern

aten = torch.ops.aten
CPU = torch.device("cpu")


def both(step, values, scalars):
    """The step's results through its runner and through the template walk; asserts they agree and returns them."""
    call = extern_call(step)
    assert call[9] is not None
    fast = run_extern(call, list(values), scalars, CPU)
    slow = run_extern(call[:9] + (None,), list(values), scalars, CPU)
    assert [i for i, _ in fast] == [i for i, _ in slow]
    for (_, a), (_, b) in zip(fast, slow):
        assert a.stride() == b.stride() and torch.equal(a, b)
    return fast


def test_views_and_runtime_scalars():
    bias, x, w = torch.randn(5), torch.randn(3, 4), torch.randn(5, 4)
    bufs = [kir.Buffer(0, (5,), torch.float32), kir.Buffer(1, (3, 4), torch.float32),
            kir.Buffer(2, (5, 4), torch.float32)]
    out = kir.Buffer(3, (3, 5), torch.float32)
    f = SCALAR_MARKERS[float]
    step = Extern(aten.addmm.default, (TENSOR, TENSOR, TENSOR), (("beta", f), ("alpha", f)), bufs, [1, 0], [out],
                  [None, None, ((4, 5), (1, 4), 0)])  # w read transposed, as F.linear passes it
    [(i, got)] = both(step, [bias, x, w, None], [2.0, 0.5])
    assert i == 3 and torch.equal(got, torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0))


def test_several_outputs_some_dropped_and_planned_layouts():
    x = torch.randn(4, 6)
    src = kir.Buffer(0, (4, 6), torch.float32)
    values, indices = kir.Buffer(1, (4,), torch.float32), kir.Buffer(2, (4,), torch.int64)
    got = both(Extern(aten.max.dim, (TENSOR, 1), (), [src], [], [values, None]), [x, None, None], [])
    assert [i for i, _ in got] == [1] and torch.equal(got[0][1], x.max(1).values)
    got = both(Extern(aten.max.dim, (TENSOR, 1), (), [src], [], [None, indices]), [x, None, None], [])
    assert [i for i, _ in got] == [2] and torch.equal(got[0][1], x.max(1).indices)
    # a transpose: kept as the op lays it out where that is planned, made contiguous where it is not
    kept = kir.Buffer(1, (6, 4), torch.float32, (1, 6))
    [(_, t)] = both(Extern(aten.t.default, (TENSOR,), (), [src], [], [kept]), [x, None], [])
    assert t.stride() == (1, 6) and t.data_ptr() == x.data_ptr()
    [(_, c)] = both(Extern(aten.t.default, (TENSOR,), (), [src], [], [kir.Buffer(1, (6, 4), torch.float32)]),
                    [x, None], [])
    assert c.is_contiguous() and torch.equal(c, x.t())


def test_a_template_with_a_device_takes_the_template_walk():
    step = Extern(aten.ones.default, ((2, 3),), (("device", DEVICE),), [], [], [kir.Buffer(0, (2, 3), torch.float32)])
    call = extern_call(step)
    assert call[9] is None
    [(i, t)] = run_extern(call, [None], [], CPU)
    assert i == 0 and torch.equal(t, torch.ones(2, 3))


def test_a_keyword_python_cannot_spell():
    """A seeded op takes its seed as the keyword ``lazy.seed`` (Note [The seed of a seeded op] in lazy/ir/ops.py)."""
    def scaled(x, **kw):
        return x * kw["lazy.seed"]

    step = Extern(scaled, (TENSOR,), (("lazy.seed", SCALAR_MARKERS[int]),), [kir.Buffer(0, (3,), torch.float32)], [0],
                  [kir.Buffer(1, (3,), torch.float32)])
    x = torch.randn(3)
    [(_, y)] = both(step, [x, None], [7])
    assert torch.equal(y, x * 7)
