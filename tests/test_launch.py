"""Asynchronous execution (lazy/sync/launch.py): a mark_step launches and returns; reads wait for what they read;
a launched graph's failure is raised at the next sync, its values stay failed, and nothing reads garbage."""
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.sync import launch
from lazy.sync.launch import StepFailed

L = "lazy"


@pytest.fixture(autouse=True)
def asynchronous(cpu_backing):
    """Asynchronous execution on, for programs of any length (Note [Programs too short to launch]); on the cpu
    backing device, which it serves, also when the suite runs with LAZY_BACKING_DEVICE=cuda."""
    with lazy.config.override(async_execution=True, async_min_run_us=0):
        yield


def test_a_sync_on_cuda_never_launches():
    """On cuda a sync returns once its program is enqueued on the stream: no worker (Note [Asynchronous
    execution])."""
    assert launch.enabled(torch.device("cpu")) and not launch.enabled(torch.device("cuda"))
    with lazy.config.override(async_execution=False):
        assert not launch.enabled(torch.device("cpu"))


def _record_next():
    """Trace an op after a mark_step, as a training loop records its next step before reading: the run just synced
    overlapped recording, so its program's next run launches (Note [Runs that overlap nothing])."""
    return torch.zeros(1).to(L) + 1


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


def _native_runs():
    return metrics.counter("cpp.native_runs")


def test_programs_that_run_in_c_launch_on_the_c_thread_reading_what_earlier_jobs_produce():
    """Note [Launches on a C thread]: each step reads the last step's output while that step may still be in flight
    (its leaf is forwarded from the earlier job); two programs alternate, so jobs of both are in flight at once."""
    def step(x):
        return (x * 1.5).sin() + x.mean(0) * 0.1

    def other(x):
        return x.t() @ x * 0.01 + 1

    def run(x):
        chained = [t.cpu() for t in _steps(6, lambda x: other(step(x)), x)]
        outs = []
        for i in range(6):
            x = step(x) if i % 2 == 0 else other(x)
            lazy.mark_step()
            outs.append(x)
        return chained, [t.cpu() for t in outs]

    x0 = torch.randn(16, 16)
    before = _native_runs()
    with lazy.config.override(compiler="cpp"):
        got, alternating = run(x0.to(L))
    assert _native_runs() - before >= 6 and launch._S.native
    with lazy.config.override(async_execution=False, compiler="cpp"):
        want, want_alternating = run(x0.to(L))
    for g, w in zip(got + alternating, want + want_alternating):
        assert torch.equal(g, w)


def test_a_failure_on_the_c_thread_surfaces_once_and_the_values_stay_failed():
    """A kernel's error on the C launch thread is raised at the next sync or wait, once; the value stays failed;
    later steps run."""
    table = torch.randn(4, 3).to(L)
    with lazy.config.override(compiler="cpp"):
        for _ in range(2):
            y = table[torch.tensor([0, 1]).to(L)] + 1
            lazy.mark_step()
            _record_next()
        lazy.wait_device_ops()
        before = _native_runs()
        with pytest.raises(StepFailed, match="index out of range") as info:
            y = table[torch.tensor([0, 9]).to(L)] + 1  # an index out of range: the kernel reports it
            lazy.mark_step()
            lazy.wait_device_ops()
        assert isinstance(info.value.__cause__, (IndexError, RuntimeError))
        lazy.wait_device_ops()  # raised once
        with pytest.raises(Exception):
            y.cpu()
        w = table * 3
        lazy.mark_step()
        torch.testing.assert_close(w.cpu(), table.cpu() * 3)
        assert _native_runs() > before
    del y, info


def test_a_launch_that_fails_before_it_is_queued_raises_at_once_and_waits_for_nothing(monkeypatch):
    """A run whose preparation raises (``Program.submit``: out of memory taking its outputs) was never queued: the
    mark_step raises, nothing waits for it afterwards, its values stay IR (a read computes them again) and later steps
    run."""
    from lazy.runtime import cpp

    x = torch.randn(8, 8).to(L)
    with lazy.config.override(compiler="cpp"):
        for _ in range(2):
            y = (x * 2).sin()
            lazy.mark_step()
            _record_next()
        lazy.wait_device_ops()

        def refuse(*args, **kwargs):
            raise MemoryError("no memory for the run's outputs")

        launched = metrics.counter("async.launched")
        monkeypatch.setattr(cpp.Program, "submit", refuse)
        y = (x * 2).sin()
        with pytest.raises(MemoryError):
            lazy.mark_step()
        assert metrics.counter("async.launched") == launched and not launch._S.running and not launch._S.inflight
        monkeypatch.undo()
        lazy.wait_device_ops()  # returns: nothing in flight
        torch.testing.assert_close(y.cpu(), (x.cpu() * 2).sin())
        z = (x * 2).sin()
        lazy.mark_step()
        torch.testing.assert_close(z.cpu(), (x.cpu() * 2).sin())


def test_a_program_the_graph_cache_evicts_is_freed():
    """What a launch remembers of a program (its outputs' layout, its run times, its placeholders: Note [Programs
    too short to launch]) lives on the program: once the graph cache evicts it, nothing holds it or its arenas."""
    import gc
    import weakref

    x = torch.randn(8, 8).to(L)
    with lazy.config.override(compiler="cpp", graph_cache_size=1):
        for _ in range(3):
            y = (x * 2).sin()
            lazy.mark_step()
            _record_next()
        lazy.wait_device_ops()
        first = weakref.ref(graph_cache.latest())
        assert metrics.counter("async.launched") > 0
        for _ in range(3):
            y = (x * 3).cos() + 1
            lazy.mark_step()
            _record_next()
        lazy.wait_device_ops()
        torch.testing.assert_close(y.cpu(), (x.cpu() * 3).cos() + 1)
    gc.collect()
    assert first() is None


def test_a_job_queued_behind_a_failed_one_of_its_epoch_does_not_run():
    """Note [Launches on a C thread]: jobs run in launch order; once one fails, the ones of its epoch queued behind it
    are not run (they may read its outputs) until the calling thread has learned of it (a new epoch)."""
    from lazy.runtime.cpp import KernelIndexError

    table = torch.randn(4, 3)
    seen = []
    with lazy.config.override(compiler="cpp", async_execution=False):
        y = table.to(L)[torch.tensor([0, 1]).to(L)] + 1
        lazy.mark_step()
        program = graph_cache.latest()
        run = program.run
        program.run = lambda leaves, scalars: seen.append((list(leaves), scalars)) or run(leaves, scalars)
        try:
            y = table.to(L)[torch.tensor([2, 3]).to(L)] + 1
            lazy.mark_step()
        finally:
            del program.run
    leaves, scalars = seen[0]
    k = next(i for i, t in enumerate(leaves) if t.dtype == torch.int64)
    bad = list(leaves)
    bad[k] = torch.tensor([0, 9])
    epoch = launch._S.epoch
    failing = program.submit(bad, [], scalars, epoch, 1)
    behind = program.submit(leaves, [], scalars, epoch, 1)
    with pytest.raises(KernelIndexError):
        program.finish(failing)
    assert program.finish(behind) is None  # not run
    launch._S.epoch += 1  # what the calling thread does once it has learned of a failure
    outs = program.finish(program.submit(leaves, [], scalars, launch._S.epoch, 1))
    torch.testing.assert_close(outs[0], table[[2, 3]] + 1)
    torch.testing.assert_close(y.cpu(), table[[2, 3]] + 1)


def test_a_job_runs_with_the_threads_it_was_submitted_with_even_while_the_caller_waits():
    """Note [Thread budget of the worker] on the C launch thread: the count is the job's, never the timing's; a
    job that starts while the calling thread is blocked on it keeps its budget."""
    from lazy import _C

    seen = []
    a = torch.randn(768, 768)  # ~20 ms of matmuls on one thread
    with lazy.config.override(compiler="cpp", async_execution=False):
        y = (a.to(L) @ a.to(L)).sin() @ a.to(L)
        lazy.mark_step()
        program = graph_cache.latest()
        run = program.run
        program.run = lambda leaves, scalars: seen.append((list(leaves), scalars)) or run(leaves, scalars)
        try:
            y = (a.to(L) @ a.to(L)).sin() @ a.to(L)
            lazy.mark_step()
        finally:
            del program.run
    leaves, scalars = seen[0]
    epoch = launch._S.epoch
    program.finish(program.submit(leaves, [], scalars, epoch, 1))  # the launch thread is up
    first = program.submit(leaves, [], scalars, epoch, 1)
    time.sleep(0.005)  # the first has started, the calling thread not yet waiting
    second = program.submit(leaves, [], scalars, epoch, 1)
    program.finish(second)  # blocked on the second before it starts
    program.finish(first)
    third = program.submit(leaves, [], scalars, epoch, 2)
    program.finish(third)
    assert [_C.native_threads(job[0]) for job in (first, second, third)] == [1, 1, 2]
    torch.testing.assert_close(y.cpu(), (a @ a).sin() @ a, rtol=1e-4, atol=1e-3)


def test_programs_shorter_than_the_launch_minimum_run_in_place():
    """Note [Programs too short to launch]: a program launches once two synchronous runs have shown it takes at
    least async_min_run_us; a shorter one keeps running on the calling thread."""
    x = torch.ones(8).to(L)
    with lazy.config.override(async_min_run_us=1e6):  # a second: nothing here is that long
        _steps(5, lambda x: x + 1, x)
    assert metrics.counter("async.launched") == 0
    with lazy.config.override(async_min_run_us=1e-3, compiler="cpp"):  # a nanosecond: from a program's third run
        y = _steps(5, lambda x: x * 3, x)[-1]
    assert metrics.counter("async.launched") == 3
    assert y.cpu().tolist() == [243.0] * 8


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
    losses, ref_losses = [], []
    for xb, yb in data:  # the losses are read at the end: each step's run overlaps the next one's recording
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
        ref_losses.append(ref_loss.item())
    torch.testing.assert_close([t.item() for t in losses], ref_losses, rtol=1e-5, atol=1e-6)
    assert metrics.counter("async.launched") >= 3
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_an_asynchronous_failure_surfaces_once_and_poisons_what_read_it():
    table = torch.randn(4, 3).to(L)
    with lazy.config.override(compiler="reference"):
        for _ in range(2):  # run the graph once synchronously, so later runs launch
            y = table[torch.tensor([0, 1]).to(L)] + 1
            lazy.mark_step()
            _record_next()
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


def test_dropout_with_p_above_zero_stays_seeded_and_reproducible():
    """Note [Random ops that draw nothing] spares only calls that draw nothing: p > 0 draws a seed at record time,
    so the same torch.manual_seed gives the same mask, and the kept values are eager's x / (1 - p)."""
    x = torch.randn(64, 64) + 3.0  # no zeros: a zero in the output is a dropped element
    masks = []
    for _ in range(2):
        torch.manual_seed(7)
        state = torch.random.get_rng_state()
        y = F.dropout(x.to(L), 0.25, training=True)
        assert not torch.equal(state, torch.random.get_rng_state())  # recording drew the seed
        lazy.mark_step()
        got = y.cpu()
        kept = got != 0
        torch.testing.assert_close(got[kept], (x / 0.75)[kept])
        masks.append(kept)
    assert torch.equal(masks[0], masks[1])
    assert 0.6 < masks[0].float().mean().item() < 0.9
    assert metrics.counter("async.launched") == 0


@pytest.mark.parametrize("compiler", ["reference", "cpp"])
def test_attention_without_dropout_launches_asynchronously_and_equals_eager(compiler):
    """SDPA with dropout_p == 0 draws nothing (Note [Random ops that draw nothing]): recorded unseeded, its graph
    launches on the worker, eager's generator is not advanced, and forward and backward equal eager's."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    on_backing = [t.to(lazy.config.backing_device).requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*on_backing, is_causal=True)  # the kernel eager picks there
    want.sum().backward()
    want, grads = want.cpu(), [t.grad.cpu() for t in on_backing]
    with lazy.config.override(compiler=compiler):
        for _ in range(3):
            lz = [t.detach().to(L).requires_grad_() for t in (q, k, v)]
            state = torch.random.get_rng_state()
            y = F.scaled_dot_product_attention(*lz, is_causal=True)
            y.sum().backward()
            assert torch.equal(state, torch.random.get_rng_state())  # no seed drawn
            lazy.mark_step()
            assert torch.equal(y.cpu(), want.detach())
            for t, g in zip(lz, grads):
                assert torch.equal(t.grad.cpu(), g)
    assert metrics.counter("async.launched") >= 1


def test_dropout_outside_training_is_recorded_unseeded():
    x = torch.randn(8, 8)
    y, mask = torch.ops.aten.native_dropout(x.to(L), 0.5, False)
    lazy.mark_step()
    assert metrics.counter("async.launched") == 0  # the first run of a program is synchronous
    assert torch.equal(y.cpu(), x) and bool(mask.cpu().all())
    program = graph_cache.latest()
    assert launch.layout_known(program) is not None  # later runs of it launch: no seeded op in the graph


def _spy_runs(program, before=None):
    """Make ``program``'s runs note the thread count the running thread would give OpenMP, set ``started``, call
    ``before`` and run."""
    run = program.run
    seen = []
    started = threading.Event()

    def spy(leaves, scalars):
        seen.append((threading.current_thread() is not threading.main_thread(), torch.get_num_threads()))
        started.set()
        if before is not None:
            before()
        return run(leaves, scalars)

    program.run = spy  # NOTE: an instance attribute over the method; the caller deletes it
    return seen, started


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_the_worker_runs_with_the_thread_budget_and_the_caller_keeps_its_threads(two_threads):
    """Note [Thread budget of the worker]: beside the recorder the worker's OpenMP count is the budget (one fewer
    than the caller's by default, async_threads otherwise); the calling thread's own count never changes."""
    x = torch.randn(64).to(L)
    with lazy.config.override(compiler="reference"):
        y = x * 2
        lazy.mark_step()  # the first run, synchronous
        program = graph_cache.latest()
        seen, started = _spy_runs(program)
        try:
            for budget in (0, 2, 1):
                _record_next()
                with lazy.config.override(async_threads=budget):
                    y = x * 2
                    lazy.mark_step()
                assert started.wait(60)
                started.clear()
                assert torch.get_num_threads() == 2
                _record_next()
                lazy.wait_device_ops()
        finally:
            del program.run
    assert seen == [(True, 1), (True, 2), (True, 1)]
    assert torch.get_num_threads() == 2
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_the_budget_follows_the_callers_thread_count(two_threads):
    x = torch.randn(64).to(L)
    with lazy.config.override(compiler="reference"):
        y = x + 1
        lazy.mark_step()
        program = graph_cache.latest()
        seen, started = _spy_runs(program)
        try:
            torch.set_num_threads(1)
            y = x + 1
            lazy.mark_step()
            assert started.wait(60)
            lazy.wait_device_ops()
        finally:
            del program.run
    assert seen == [(True, 1)]  # never fewer than one
    assert torch.get_num_threads() == 1
    torch.testing.assert_close(y.cpu(), x.cpu() + 1)


def test_a_program_the_caller_waits_for_runs_on_the_budget(two_threads):
    """The first launched run starts while the caller records and holds the worker until the caller waits; the
    second then starts with the caller blocked, and still runs on the budget (Note [Thread budget of the worker]:
    results never depend on what overlapped)."""
    x = torch.randn(64).to(L)

    runs = []

    def hold_the_first_until_the_second_is_queued():
        runs.append(None)
        deadline = time.monotonic() + 60
        while len(runs) == 1 and launch._S.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.001)

    with lazy.config.override(compiler="reference"):
        y = x - 1
        lazy.mark_step()
        program = graph_cache.latest()
        seen, started = _spy_runs(program, before=hold_the_first_until_the_second_is_queued)
        try:
            y = x - 1
            lazy.mark_step()
            assert started.wait(60)  # the first has chosen its threads with the caller recording
            y = x - 1
            lazy.mark_step()
            lazy.wait_device_ops()
        finally:
            del program.run
    assert seen == [(True, 1), (True, 1)]
    assert torch.get_num_threads() == 2
    torch.testing.assert_close(y.cpu(), x.cpu() - 1)


def test_a_mark_step_run_in_place_has_the_budget_and_a_read_all_threads(two_threads):
    """A mark_step's program runs on the budget in place too (its first runs, before it may launch); a sync that
    reads data runs with the caller's count; the caller's count is restored after either."""
    x = torch.randn(64).to(L)
    with lazy.config.override(compiler="reference", async_min_run_us=1e9):  # nothing launches
        y = x * 3
        lazy.mark_step()
        program = graph_cache.latest()
        seen, _ = _spy_runs(program)
        try:
            for _ in range(3):
                y = x * 3
                lazy.mark_step()
        finally:
            del program.run
        assert seen == [(False, 1)] * 3
        assert torch.get_num_threads() == 2
        (x * 4).sum().item()  # a read: its own program, run in place
        program = graph_cache.latest()
        read, _ = _spy_runs(program)
        try:
            value = (x * 4).sum().item()
        finally:
            del program.run
    assert read == [(False, 2)]
    assert torch.get_num_threads() == 2
    assert value == pytest.approx(float((x.cpu() * 4).sum()), rel=1e-6)
    torch.testing.assert_close(y.cpu(), x.cpu() * 3)


def test_results_do_not_depend_on_whether_a_program_launched(two_threads, cpu_backing):
    """A float sum through ATen splits its work by thread count. A mark_step's program whose last run overlapped
    recording runs on the budget, launched or in place (the launch minimum, a timing, decides which): the same bits
    either way; one read at once, on all threads (Note [Runs that overlap nothing])."""
    x = torch.randn(1 << 17)
    on_all = x.sum().item()
    torch.set_num_threads(1)
    on_budget = x.sum().item()
    torch.set_num_threads(2)
    if on_all == on_budget:  # this build's sum splits its work alike on 1 and 2 threads: no difference to tell
        pytest.skip("a float sum gives the same bits on 1 and 2 threads here")
    with lazy.config.override(compiler="reference"):
        runs = []
        for min_run in (0, 1e9):  # launched from the second run on, then never launched
            with lazy.config.override(async_min_run_us=min_run):
                prev = None
                for _ in range(5):
                    t = x.to(L).sum()
                    lazy.mark_step()
                    if prev is not None:
                        runs.append(prev.item())  # read once the next run is synced: each run overlapped
                    prev = t
        launched = metrics.counter("async.launched")
        read_at_once = []
        for _ in range(3):
            t = x.to(L).sum()
            lazy.mark_step()
            read_at_once.append(t.item())
        # the first of these follows an overlapped run and launches; read at once, the next two run in place
        assert metrics.counter("async.launched") == launched + 1
    assert launched >= 3
    assert runs[0] == on_all  # the program's first run: no last run to follow
    assert set(runs[1:]) == {on_budget}
    assert read_at_once[0] == on_budget and set(read_at_once[1:]) == {on_all}


def test_placeholders_take_the_storage_of_outputs_of_their_layout():
    """Note [Placeholders without the dispatcher]: a placeholder has the promised layout and dtype; adopting an
    output of that layout shares its storage, offset included, and bumps the version; others are left to Python."""
    from lazy import _C

    like = torch.empty(0)
    p, q, r = _C.placeholders([(like, (3, 2), (1, 3)), (like, (4,), (1,)), (like, (2,), (1,))])
    assert (p.shape, p.stride(), p.dtype) == ((3, 2), (1, 3), torch.float32)
    out_p = torch.arange(6.0).reshape(3, 2)  # contiguous: another layout than promised
    out_q = torch.arange(10.0)[3:7]  # a storage offset
    out_r = torch.arange(2, dtype=torch.float64)  # another dtype
    version = q._version
    assert _C.adopt_outputs([p, q, r], [out_p, out_q, out_r]) == [0, 2]
    assert q.data_ptr() == out_q.data_ptr() and q.storage_offset() == 3 and q.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert q._version > version
    launch._adopt(p, out_p)
    assert p.stride() == (1, 3) and torch.equal(p, out_p)


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
