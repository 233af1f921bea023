"""Recording: ops become IR and nothing runs; what cannot be recorded is handled loudly, never wrongly."""
import warnings

import pytest
import torch

import lazy
from lazy.debug import metrics

L = "lazy"


def test_thousand_ops_recorded_nothing_executed():
    x = torch.randn(16, 16).to(L)
    metrics.reset()
    y = x
    for i in range(250):
        y = (y * 1.001 + 0.01).relu().neg()
    assert metrics.counter("traced_ops") == 1000
    assert metrics.counter("executed_graphs") == 0 and metrics.counter("executed_nodes") == 0
    assert not any(k.startswith("sync.") for k in metrics.counters())
    ref = x.cpu()
    for i in range(250):
        ref = (ref * 1.001 + 0.01).relu().neg()
    torch.testing.assert_close(y.cpu(), ref)
    assert metrics.counter("executed_graphs") == 1


def test_shape_inference_is_memoized():
    x = torch.randn(4, 4).to(L)
    (x * 2).cpu()
    before = metrics.counter("shape_inference.meta")
    for _ in range(10):
        x * 2
    assert metrics.counter("shape_inference.meta") == before


@torch.library.custom_op("lazytest::cpu_only", mutates_args=(), device_types="cpu")
def _cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@pytest.mark.usefixtures("cpu_backing")
def test_unrecordable_op_falls_back_counted_and_warned_once():
    x = torch.arange(4.0).to(L)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.ops.lazytest.cpu_only(x + 1)
        z = torch.ops.lazytest.cpu_only(x)
    assert isinstance(y, lazy.LazyTensor)
    torch.testing.assert_close((y + 1).cpu(), (torch.arange(4.0) + 1) * 3 + 1)
    torch.testing.assert_close(z.cpu(), torch.arange(4.0) * 3)
    assert metrics.counter("fallback.lazytest.cpu_only.default") == 2
    assert sum("cannot be recorded" in str(w.message) for w in caught) <= 1


def test_sparse_layout_is_a_clear_error():
    x = torch.eye(3).to(L)
    with pytest.raises(RuntimeError, match="sparse|strided"):
        x.to_sparse()


def test_shapes_checked_at_record_time_state_intact():
    w = torch.ones(3, 3).to(L)
    with pytest.raises(RuntimeError):
        w @ torch.ones(4, 4).to(L)
    torch.testing.assert_close((w * 2).cpu(), torch.full((3, 3), 2.0))


def test_record_time_errors_name_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"aten\.mm\.default: .*\[4, 7\] X \[20, 32\]"):
        torch.ones(4, 7).to(L) @ torch.ones(20, 32).to(L)
