"""Shared fixtures: every test starts with zeroed lazy metrics and settled state."""
import pytest
import torch

import lazy


@pytest.fixture(autouse=True)
def fresh_metrics():
    """Sync whatever an earlier test left pending, then zero the counters, so counts asserted are this test's."""
    lazy.mark_step()
    lazy.metrics.reset()
    yield


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    yield


@pytest.fixture
def cpu_backing():
    """Pin the backing device to the cpu, for tests of eager-CPU-only behaviour (a CPU-only custom op, a failed
    index that CUDA reports as an unrecoverable device-side assert) when the suite runs with
    LAZY_BACKING_DEVICE=cuda."""
    # fresh_metrics (autouse, so first) has already synced what earlier tests left
    with lazy.config.override(backing_device="cpu"):
        yield
