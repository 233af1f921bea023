"""Asynchronous execution (lazy/sync/launch.py): a mark_step launches and returns; reads wait for what they read;
a launched graph's failure is raised at the next sync, its values stay failed, and nothing reads garbage."""
import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.debug import metrics
from lazy.sync import launch
from lazy.sync.launch import StepFailed

L = "lazy"


@pytest.fixture(autouse=True)
def asynchronous():
    """Asynchronous execution on (it is off by default)."""
    with lazy.config.override(async_execution=True):
        yield


def _steps(n, fn, x):
    outs = []
    for _ in range(n):
        x = fn(x)
        lazy.mark_step()
        outs.append(x)
    return outs


def test_repeated_steps_launch_asynchronously_and_match_a_synchronous_run():
    def step(x):
        return (x * 1.5).sin() + x.mean(0) * 0.1

    x0 = torch.randn(32, 32)
    with lazy.config.override(async_execution=True, compiler="cpp"):
        got = [t.cpu() for t in _steps(5, step, x0.to(L))]
    launched = metrics.counter("async.launched")
    with lazy.config.override(async_execution=False, compiler="cpp"):  # the same programs, run synchronously
        want = [t.cpu() for t in _steps(5, step, x0.to(L))]
    assert launched >= 3  # every run after a program's first
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    expected = x0
    for _ in range(5):
        expected = step(expected)
    torch.testing.assert_close(got[-1], expected)


def test_disabled_runs_every_graph_on_the_calling_thread():
    with lazy.config.override(async_execution=False):
        _steps(4, lambda x: x + 1, torch.zeros(4).to(L))
    assert metrics.counter("async.launched") == 0


def test_a_read_waits_for_the_graph_that_computes_it_only():
    x = torch.ones(8).to(L)
    for _ in range(4):
        x = x * 2
        lazy.mark_step()
    assert x.cpu().tolist() == [16.0] * 8
    assert x.sum().item() == 128.0
    assert bool((x > 0).all())


def test_training_with_asynchronous_steps_equals_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref.load_state_dict(model.state_dict())
    model.to(L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(6)]
    losses = []
    for xb, yb in data:
        loss = F.mse_loss(model(xb.to(L)), yb.to(L))
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazy.mark_step()
        losses.append(loss)
        ref_loss = F.mse_loss(ref(xb), yb)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(losses[-1].item(), ref_loss.item(), rtol=1e-5, atol=1e-6)
    assert metrics.counter("async.launched") >= 3
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(lazy.config.backing_device.startswith("cuda"),
                    reason="an index out of range is a device-side assert on cuda, fatal to the process's CUDA "
                           "context, as in eager")
def test_an_asynchronous_failure_surfaces_once_and_poisons_what_read_it():
    table = torch.randn(4, 3).to(L)
    with lazy.config.override(compiler="reference"):
        for _ in range(2):  # run the graph once synchronously, so later runs launch
            y = table[torch.tensor([0, 1]).to(L)] + 1
            lazy.mark_step()
        lazy.wait_device_ops()
        y = table[torch.tensor([0, 9]).to(L)] + 1  # same graph, an index out of range: fails on the worker
        lazy.mark_step()
        assert metrics.counter("async.launched") >= 1
        with pytest.raises(StepFailed, match="failed") as info:
            lazy.wait_device_ops()
        assert isinstance(info.value.__cause__, (IndexError, RuntimeError))
        with pytest.raises(Exception):  # its value is failed: reading it runs the graph again, which raises
            y.cpu()
        z = table * 2  # later steps work
        lazy.mark_step()
        torch.testing.assert_close(z.cpu(), table.cpu() * 2)
    del y, info  # the failed value, and the traceback holding this frame: later tests count live storages


def test_seeded_ops_run_on_the_calling_thread():
    x = torch.randn(16, 16).to(L)
    for _ in range(4):
        y = F.dropout(x, 0.5, training=True)
        lazy.mark_step()
    y.cpu()
    assert metrics.counter("async.launched") == 0


def test_a_placeholder_adopts_an_output_of_another_layout_by_copying():
    p = torch.empty(0)
    p.set_(p.untyped_storage(), 0, (3, 2), (1, 3))
    out = torch.arange(6.0).reshape(3, 2)  # contiguous: strides (2, 1)
    launch._adopt(p, out)
    assert p.stride() == (1, 3) and torch.equal(p, out)


def test_the_switch_interval_is_lowered_only_while_programs_are_in_flight():
    import sys
    before = sys.getswitchinterval()
    x = torch.ones(4).to(L)
    with lazy.config.override(compiler="reference"):
        for _ in range(3):
            x = x + 1
            lazy.mark_step()
    assert metrics.counter("async.launched") >= 1
    lazy.wait_device_ops()
    assert sys.getswitchinterval() == before
    assert x.cpu().tolist() == [4.0] * 4
