"""Shared fixtures: every test starts with zeroed lazy metrics and settled state."""
import os

import pytest
import torch

# The Triton backend's tests run its kernels under Triton's interpreter on a cpu backing device; Triton reads this
# when it is first imported.
if os.environ.get("LAZY_BACKING_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Graphs that tier up under 'auto' run compiled from the run that compiles them, as the tests count (Note [C++
# compiles in the background]: tests/test_cpp_build.py tests the background builds); subprocesses inherit it.
os.environ.setdefault("LAZY_COMPILE_BACKGROUND", "0")

import lazy  # noqa: E402
from lazy.sync.launch import StepFailed  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def private_disk_cache(tmp_path_factory):
    """Compiled graphs go to a cache directory of this test session, not the user's ~/.cache/lazy (the default
    compiler, 'auto', compiles graphs that run twice)."""
    if "LAZY_CACHE_DIR" in os.environ:  # the caller chose one (CI may keep it between runs)
        yield
        return
    with lazy.config.override(cache_dir=str(tmp_path_factory.mktemp("lazy-cache"))):
        yield


@pytest.fixture(autouse=True)
def fresh_metrics():
    """Sync whatever an earlier test left pending and wait for it (Note [Asynchronous execution]), then zero the
    counters, so counts asserted are this test's."""
    lazy.mark_step()
    try:
        lazy.wait_device_ops()
    except StepFailed:  # a graph an earlier test launched failed after it ended: not this test's concern
        pass
    lazy.metrics.reset()
    yield


@pytest.fixture(scope="module")
def cpp_compiler(tmp_path_factory):
    """Every graph of the module compiled by the C++ compiler at its first execution, on the cpu, with a disk cache
    of its own (``pytestmark = pytest.mark.usefixtures("cpp_compiler")``)."""
    cache = str(tmp_path_factory.mktemp("lazy-cache"))
    with lazy.config.override(compiler="cpp", backing_device="cpu", cache_dir=cache):
        yield


@pytest.fixture(scope="module")
def triton_compiler(tmp_path_factory):
    """Every graph of the module compiled by the Triton compiler at its first execution, on the backing device
    (interpreted on the cpu), with a disk cache of its own."""
    cache = str(tmp_path_factory.mktemp("lazy-cache"))
    with lazy.config.override(compiler="triton", cache_dir=cache):
        yield


@pytest.fixture
def capture_verified():
    """Every replay is checked against a plain run of the same call (LAZY_CAPTURE_VERIFY); captures are forgotten
    after the test. The capture suites use it for every test (``pytestmark``)."""
    with lazy.config.override(capture_verify=True):
        yield
    lazy.compile.reset()


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
