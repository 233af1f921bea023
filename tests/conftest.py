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
