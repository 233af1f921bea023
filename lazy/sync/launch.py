"""Asynchronous execution: a ``mark_step`` launches its graph's program on a worker thread and returns at once.

Note [Asynchronous execution]
A training loop records step N+1 while step N's program runs. ``launch`` hands the program, its leaves and its
scalars to one worker thread (a FIFO, so programs run in launch order and a program reads its leaves after the
program that produced them wrote them) and gives each synced storage a data leaf at once: a *placeholder*, a
tensor with the output's shape, strides and dtype over an empty storage, which the worker points at the real
output (``Tensor.set_``) when the program has run. Recording only needs shapes and dtypes, and the next graph's
key only the placeholder's strides, so nothing waits until something reads data: ``ready(tensor)`` (a ``.cpu()``,
``.item()``, print, bool, an eager fallback, a graph run on the calling thread) waits for the one execution that
produces that tensor; ``wait_all`` (``lazy.wait_device_ops()``, a capture) for every one. A launch waits only
when MAX_IN_FLIGHT programs are unfinished, so a recorder faster than its programs does not queue steps (and
their memory) without bound.

A program launches asynchronously only once it has run synchronously: that run shows the strides of its outputs
(deterministic for a program, whose key fixes its inputs' layouts), which the placeholders need before the run.
If a later run returns other strides, the worker copies into storage of the promised layout, so a graph keyed
on the placeholder's strides never reads another layout.

The worker's kernels (ctypes calls, ATen externs) release the GIL, so they run beside the recorder. But between
its kernels a Python worker runs Python (the program's loop, extern calls, settling its outputs), and each time it
takes the GIL back while the recorder runs Python the two hand it over (Note [The GIL between recorder and
worker]). This serves the cpu backing device only: on cuda a sync returns once its program is enqueued on the
stream, and a worker there, whose host work is Python launching kernels, only fought the recorder for the GIL
(recording the 6x384 GPT step at batch 8 took 58 ms per step beside it against 26 ms alone, on an H100). A
program that runs in C (Note [Programs run in C] in csrc/runner.cpp) therefore launches onto a C++ thread that
never takes the GIL (Note [Launches on a C thread] in csrc/native_launch.cpp): the calling thread prepares the
run (``Program.submit``: buffers, pointers, scalars, one of two arenas taken in turn) and settles it when it next
retires or waits (``Program.finish``; the placeholders are made and pointed at the outputs in C,
``_C.placeholders`` and ``_C.adopt_outputs``). A leaf that a job in
flight produces is forwarded from that job's outputs when the next one starts. One worker kind is in flight at a
time (a launch of the other kind waits for the ones in flight), so programs still run in launch order. Measured
with train_step.py's models at 1 thread on an AMD EPYC with 2 cores (benchmarks/README.md), an asynchronous step
costs 1.02-1.11x the larger of recording and running in the median (1.27-1.37x through the Python worker), with
programs shorter than a launch is worth run in place (Note [Programs too short to launch]). It is on by default
(``async_execution``); the thread count of every run is fixed by the sync, not by timing, so results do not depend
on what overlapped (Note [Thread budget of the worker]).

An execution that raises poisons those launched before the calling thread learns of it (they may read its
outputs); the error is raised at the next sync or wait, naming the launching line, and the synced storages get
their IR back and are marked failed, as after a synchronous failure: reading them raises again, and any graph that
would read a poisoned placeholder raises instead of running.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import glob
import itertools
import os
import queue
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from .. import _C
from ..config import config
from ..debug import metrics
from ..ir.ops import SEEDED_OPS

# Note [The GIL between recorder and worker]
# The worker holds the GIL only between kernels and extern calls (ctypes and ATen release it while they run), but
# each time it wants it back while the recorder runs Python, CPython makes it wait for the switch interval (5 ms by
# default) before the recorder yields: tens of waits per step. While programs are in flight the interval is
# SWITCH_INTERVAL_S, so the worker gets the GIL back quickly; it costs the recorder nothing while the worker runs
# kernels (nobody asks for the GIL then), and the user's interval is restored when the last program is retired.
SWITCH_INTERVAL_S = 2e-4
MAX_IN_FLIGHT = 2  # launched programs not yet finished before a launch waits: the one running and the next
_ENTRY = "_lazy_launch"


class Layout:
    """What launches know of a program, held on the program itself (so it goes when the graph cache drops the
    program); a program without a ``__dict__`` has none and never launches."""

    __slots__ = ("strides", "runs", "fastest", "overlapped", "specs")

    def __init__(self, strides: Optional[tuple], seconds: float) -> None:
        # its outputs' strides, or None where it must not launch (Note [Seeded ops run on the calling thread])
        self.strides = strides
        self.runs = 1  # synchronous runs, and the fastest one's seconds (Note [Programs too short to launch])
        self.fastest = seconds
        # whether its last mark_step run overlapped recording (Note [Runs that overlap nothing])
        self.overlapped = False
        self.specs: Optional[list] = None  # its placeholders' (like, shape, strides), once launched


def _entry(program: Any) -> Optional[Layout]:
    held = getattr(program, "__dict__", None)
    return held.get(_ENTRY) if held is not None else None


# Note [Thread budget of the worker]
# The worker's program and the recorder share the cores. OpenMP sizes a parallel region by the nthreads setting of
# the thread that opens it (a per-thread ICV): the generated kernels' loops, ATen's parallel_for and oneDNN all
# follow it, and MKL follows its own per-thread setting (MKL_Set_Num_Threads_Local). So a program that may overlap
# recording runs with ``thread_budget`` threads, one fewer than the calling thread's torch.get_num_threads() (at
# least one; ``async_threads`` sets another budget): on 2 cores the worker's kernels take one and the recorder keeps
# the other. Measured with train_step.py's models at 2 threads on the 2-core cpu (median step, ms, budget 1 / budget
# 2 / in place): cnn 6.7 / 16.0 / 16.1, encoder 4.7 / 4.7 / 4.7, gpt 5.4 / 5.6 / 5.2, mlp 1.9 / 1.9 / 1.5: a team of
# two on the worker takes the recorder's core (and its idle threads spin, GOMP_SPINCOUNT, before they sleep). Not
# spinning at all (OMP_WAIT_POLICY=PASSIVE, fixed when the OpenMP runtime loads, so not ours to set) was slower:
# encoder 7.7 and gpt 8.9 ms launched, each region waking its team. The calling thread waits on an Event (a
# futex), never spinning against the worker.
# The count is a function of the sync, never of timing, because results depend on it: ATen's reductions split their
# work by thread count (a float sum of 10^5 values differs in its last bits between 1 and 2 threads), and whether a
# program launches (Note [Programs too short to launch]) or finds the calling thread already waiting are timings.
# So while asynchronous execution is on, a mark_step's run whose program overlapped recording last time has the
# budget, launched or in place (``overlaps``, Note [Runs that overlap nothing]; ``run_in_place`` sets the calling
# thread's own two counts for the run and restores them). What overlaps nothing runs on the calling thread with all
# of its threads: such a mark_step's run, a sync that reads data (.item() of pending IR), a capture's run and its
# replays (lazy/capture/: a replay's program runs during the call). The same script gives the same bits at every
# run; a replay gives those of the plain run it replaces synced at the same count (LAZY_CAPTURE_VERIFY syncs its
# plain run with asynchronous execution off). A runtime not found in torch/lib is left alone. The C launch thread
# (Note [Launches on a C thread]) uses the same setters.
# NOTE: MKL's C entry point takes the count by value; its lower-case name is the Fortran one (a pointer).
_THREAD_CONTROL: Optional[tuple] = None  # (omp_set_num_threads or None, MKL_Set_Num_Threads_Local or None)


def _thread_control() -> tuple:
    """The setters of the per-thread counts in the OpenMP runtime and MKL that torch loaded (found in torch/lib)."""
    global _THREAD_CONTROL
    if _THREAD_CONTROL is None:
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        found = []
        for patterns, name in ((("libgomp*.so*", "libiomp5*.so*", "libomp*.so*"), "omp_set_num_threads"),
                               (("libtorch_cpu.so*", "libmkl_rt*.so*"), "MKL_Set_Num_Threads_Local")):
            fn = None
            for path in (p for pattern in patterns for p in sorted(glob.glob(os.path.join(lib, pattern)))):
                try:
                    fn = getattr(ctypes.CDLL(path), name)  # NOTE: the library torch loaded: dlopen returns it
                    break
                except (OSError, AttributeError):
                    continue
            found.append(fn)
        _THREAD_CONTROL = tuple(found)
    return _THREAD_CONTROL


def thread_budget(threads: int) -> int:
    """OpenMP/MKL threads of a program launched beside a recorder whose torch.get_num_threads() is ``threads``."""
    budget = int(config.async_threads)
    return max(1, min(budget, threads) if budget > 0 else threads - 1)


# Note [Runs that overlap nothing]
# The budget buys overlap only where the calling thread records while the program runs. A loop that reads the step's
# result at once (``mark_step(); print(loss.item())``, a benchmark's ``wait_device_ops()``) overlaps nothing, and
# the budget only halves a 2-core machine's kernels (the 200-op chain at 1024^2: 14.2 ms per step on the budget
# against 6.9 ms on both threads). Whether a run overlapped is a fact of the user's code, not of timing: after a
# mark_step's run (``watch``), the first of a read of one of its outputs, a wait for all (``ready``, ``wait_all``)
# and the next sync decides it: with no op traced since the run, it overlapped nothing; with any, it overlapped.
# The program's next run follows its last one: one that overlapped nothing runs in place with all
# of the calling thread's threads (launching it would only cost the launch); otherwise on the budget, launched or
# in place. A program's first run has no last one and runs with all threads. So the same script gives the same
# thread counts, and the same bits, at every run.
def overlaps(program: Any) -> bool:
    """Whether a mark_step's run of ``program`` (on a device where runs may launch: ``enabled``) is taken to overlap
    recording, as its last one did: it may launch, and runs on the budget (Note [Runs that overlap nothing])."""
    entry = _entry(program)
    return entry is not None and entry.overlapped


def budget() -> int:
    """The OpenMP/MKL threads of a run that overlaps recording (Note [Thread budget of the worker])."""
    return thread_budget(torch.get_num_threads())


def run_in_place(program: Any, leaves: Sequence[torch.Tensor], scalars: Sequence[Any], budgeted: bool) -> Any:
    """``program.run`` on the calling thread: on the budget where ``budgeted``, else with the calling thread's own
    OpenMP/MKL threads."""
    if budgeted:
        threads = torch.get_num_threads()
        n = thread_budget(threads)
        if n != threads:
            _configure()
            before = _C.caller_threads(n, n)
            try:
                return program.run(leaves, scalars)
            finally:
                _C.caller_threads(*before)
    return program.run(leaves, scalars)


def watch(program: Any, outs: Sequence[torch.Tensor]) -> None:
    """After a mark_step's run of ``program`` (launched or in place) with outputs ``outs``: learn whether it overlaps
    recording (Note [Runs that overlap nothing])."""
    entry = _entry(program)  # the outputs by id: holding them would keep them past the user's last use
    _S.watch = (entry, _C.traced_ops(), set(map(id, outs))) if entry is not None else None


def watching() -> bool:
    return _S.watch is not None


def settle_watch(read: Optional[torch.Tensor] = None) -> None:
    """Decide the watched run's overlap: at a sync or a wait for everything (``read`` None), or at a read of
    ``read``."""
    entry, traced, outs = _S.watch
    if read is not None and id(read) not in outs:
        return  # another tensor's read tells nothing of this run
    _S.watch = None
    entry.overlapped = _C.traced_ops() != traced


def _configure() -> None:
    """Give the C side the thread-count setters (the C launch thread and ``caller_threads``, which the Python worker
    and runs in place call, use them)."""
    if not _S.configured:
        omp, mkl = _thread_control()
        _C.native_configure(*(ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else None for fn in (omp, mkl)))
        _S.configured = True


class StepFailed(RuntimeError):
    """An asynchronously launched graph raised; raised at the next sync or wait."""


class Execution:
    """One launched program: what it runs on, the placeholders it fills, and when it is done."""

    __slots__ = ("program", "leaves", "scalars", "outputs", "synced", "where", "epoch", "seq", "threads", "done",
                 "error", "job", "out_bids")

    def __init__(self, program: Any, leaves: Sequence[torch.Tensor], scalars: Sequence[Any],
                 outputs: List[torch.Tensor], synced: list, where: str, epoch: int, seq: int, threads: int) -> None:
        self.program, self.leaves, self.scalars = program, leaves, scalars
        self.outputs, self.synced, self.where = outputs, synced, where
        self.epoch, self.seq = epoch, seq
        self.threads = threads  # Note [Thread budget of the worker]
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.job: Any = None  # a run on the C launch thread (Note [Launches on a C thread] in csrc/native_launch.cpp)
        self.out_bids: Sequence[int] = ()  # its program's output buffers, which later jobs' leaves may read


class _State:
    """The calling thread's view: executions not yet retired, placeholders in flight, poisoned placeholders."""

    def __init__(self) -> None:
        self.queue: "queue.SimpleQueue[Execution]" = queue.SimpleQueue()
        self.running: "collections.deque[Execution]" = collections.deque()
        self.inflight: Dict[int, Execution] = {}  # id(placeholder) -> its execution (the execution holds it)
        self.poisoned: Dict[int, torch.Tensor] = {}  # id -> placeholder of a failed execution (held: ids unique)
        self.epoch = 0  # bumped when the calling thread learns of a failure
        self.seq = 0  # launches so far
        self.worker: Optional[threading.Thread] = None
        self.user_interval: Optional[float] = None  # sys.getswitchinterval() while programs are in flight
        self.pid = os.getpid()
        self.native = False  # the executions in flight are on the C launch thread (else the Python worker)
        self.configured = False  # the C side knows the thread-count setters
        self.settles = False  # settle() runs at exit
        self.watch: Optional[tuple] = None  # (layout entry, traced ops, output ids) of the last mark_step's run


_S = _State()


def enabled(device: torch.device) -> bool:
    """Whether a sync on ``device`` may launch asynchronously (``lazy.config.async_execution``, on the cpu: on cuda
    a sync returns once its program is enqueued on the stream anyway)."""
    return device.type == "cpu" and bool(config.async_execution)


# Note [Programs too short to launch]
# A launch costs the calling thread more than running the program in place does: placeholders for its outputs,
# preparing and settling the run (~0.14 ms for the MLP step of train_step.py against its 0.05 ms program, on a
# 2-core AMD EPYC; 1.24x the larger of recording and running launched, 1.09x in place). So a program launches only
# once two synchronous runs have shown it takes at least ``config.async_min_run_us`` (150 us: the GPT, encoder and
# CNN steps' programs, 0.26-0.53 ms, launch); a shorter one keeps running in place, and its fastest run is updated
# at each. The first run shows the outputs' strides; the second a run time without first-touch page faults.
def layout_known(program: Any) -> Optional[tuple]:
    """The output strides a program's synchronous runs showed, if it launches asynchronously; None before its runs
    have shown them, if it must not launch, or if it is too short to (Note [Programs too short to launch])."""
    entry = _entry(program)
    if entry is None or entry.strides is None:
        return None
    minimum = config.async_min_run_us
    if minimum > 0 and (entry.runs < 2 or entry.fastest < minimum * 1e-6):
        return None
    return entry.strides


def remember_layout(program: Any, outs: Sequence[torch.Tensor], order: Sequence[Any], seconds: float = 0.0) -> None:
    """After a synchronous run: the strides of ``program``'s outputs, unless the graph (``order``, its nodes) holds
    a seeded op. Note [Seeded ops run on the calling thread]: a seeded op (lazy/ir/ops.py) seeds the default
    generator of the backing device for its run and restores it; on the worker that would race with the recorder
    and the user's own code drawing from the same generator (their draws would be lost or repeated), so such a
    graph runs where the recorder runs. Attention without dropout and dropout outside training draw nothing and
    are recorded unseeded (Note [Random ops that draw nothing] in lazy/trace/schema.py): their graphs launch."""
    entry = _entry(program)
    if entry is None:
        held = getattr(program, "__dict__", None)
        if held is not None:
            seeded = any(n.op in SEEDED_OPS for n in order)
            held[_ENTRY] = Layout(None if seeded else tuple(tuple(o.stride()) for o in outs), seconds)
    else:  # Note [Programs too short to launch]
        entry.runs += 1
        entry.fastest = min(entry.fastest, seconds)


def launch(program: Any, leaves: Sequence[torch.Tensor], scalars: Sequence[Any], nodes: Sequence[Any],
           strides: tuple, synced: list, where: str, device: torch.device, threads: int) -> List[torch.Tensor]:
    """Queue ``program`` on the worker to run with ``threads`` OpenMP/MKL threads; returns the placeholders of its
    outputs (``nodes`` give their shapes and dtypes, ``strides`` their strides). ``synced`` lists (storage, IR
    value) pairs given these outputs."""
    _check_fork()
    retire()
    native = getattr(program, "launchable", None) is not None and program.launchable()
    if _S.running and native != _S.native:  # one worker at a time, so that programs run in launch order
        _wait(_S.running[-1])
    _S.native = native
    if len(_S.running) >= MAX_IN_FLIGHT:  # the recorder is ahead of the programs: wait for the oldest
        _wait(_S.running[0])
    entry = _entry(program)
    if entry.specs is None:  # the placeholders' (dtype and device, shape, strides): fixed for a program
        entry.specs = [(_like(node.dtype, device), tuple(node.shape), tuple(stride))
                       for node, stride in zip(nodes, strides)]
    outputs = _C.placeholders(entry.specs)
    _S.seq += 1
    ex = Execution(program, leaves, scalars, outputs, synced, where, _S.epoch, _S.seq, threads)
    _S.inflight.update(zip(map(id, outputs), itertools.repeat(ex)))
    if not _S.running and _S.user_interval is None:
        _S.user_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(SWITCH_INTERVAL_S, _S.user_interval))
    _S.running.append(ex)
    if not _S.settles:  # a thread that dies at exit mid-kernel would take the process with it
        atexit.register(settle)
        _S.settles = True
    _configure()
    if native:
        try:
            _submit(ex, program, leaves, scalars)
        except BaseException:  # never queued: nothing may wait for it
            _S.running.remove(ex)
            for p in outputs:
                _S.inflight.pop(id(p), None)
            raise
    else:
        if _S.worker is None:
            _S.worker = threading.Thread(target=_work, args=(_S.queue,), name="lazy-launch", daemon=True)
            _S.worker.start()
        _S.queue.put(ex)
    metrics.bump("async.launched")
    return outputs


def _submit(ex: Execution, program: Any, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> None:
    """Queue ``ex`` on the C launch thread (Note [Launches on a C thread] in csrc/native_launch.cpp): a leaf that an
    execution in flight produces is read from that execution's job when this one starts."""
    forwards = []
    for bid, t in zip(program.leaf_ids, leaves):
        src = _S.inflight.get(id(t))
        if src is not None and src.job is not None:
            k = next(k for k, q in enumerate(src.outputs) if q is t)
            forwards.append((bid, src.job[0], src.out_bids[k]))
    ex.job = program.submit(leaves, forwards, scalars, ex.epoch, ex.threads)
    ex.out_bids = program.output_ids
    ex.leaves = ex.scalars = None


def _settle_native(ex: Execution) -> None:
    """On the calling thread: wait for ``ex``'s job, point its placeholders at its outputs, mark it done."""
    try:
        outs = ex.program.finish(ex.job)
        if outs is None:
            raise StepFailed("an earlier asynchronously launched graph failed, and this one may read its outputs")
        _adopt_all(ex.outputs, outs)
        ex.synced = None  # the IR it replaced is needed only to recover from a failure
    except BaseException as e:  # noqa: BLE001 -- raised by retire(), as the worker's errors are
        ex.error = e
    ex.program = ex.job = None
    ex.done.set()


def _complete(ex: Execution) -> None:
    """Wait until ``ex`` has run and, for a job of the C launch thread, settle it."""
    if not ex.done.is_set():
        if ex.job is not None:
            _settle_native(ex)
        else:
            ex.done.wait()


_LIKE: Dict[tuple, torch.Tensor] = {}


def _like(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty tensor of ``dtype`` on ``device``: what a placeholder's dtype and device are read from."""
    t = _LIKE.get((dtype, device))
    if t is None:
        t = _LIKE[(dtype, device)] = torch.empty(0, dtype=dtype, device=device)
    return t


def _adopt_all(placeholders: List[torch.Tensor], outs: List[torch.Tensor]) -> None:
    """Point each placeholder at its output (in C where the layouts agree; ``_adopt`` copies the others)."""
    for k in _C.adopt_outputs(placeholders, list(outs)):
        _adopt(placeholders[k], outs[k])


def _work(q: "queue.SimpleQueue[Execution]") -> None:
    failed_epoch = -1
    threads = 0  # what this thread's OpenMP and MKL counts were last set to
    while True:
        ex = q.get()
        if ex.epoch <= failed_epoch:
            ex.error = StepFailed("an earlier asynchronously launched graph failed, and this one may read its outputs")
        else:
            if ex.threads != threads:  # this thread's own counts (ATen's per-thread init first, in C)
                _C.caller_threads(ex.threads, ex.threads)
                threads = ex.threads
            start = time.perf_counter()
            try:
                outs = ex.program.run(ex.leaves, ex.scalars)
                _adopt_all(ex.outputs, outs)
                ex.synced = None  # the IR it replaced is needed only to recover from a failure
                metrics.bump("async.run_time_s", time.perf_counter() - start)
            except BaseException as e:  # noqa: BLE001 -- raised on the calling thread by retire()
                ex.error = e
                failed_epoch = ex.epoch
        ex.leaves = ex.scalars = ex.program = None
        ex.done.set()
        del ex  # not held while waiting for the next one (an error's traceback reaches this frame)


def _adopt(p: torch.Tensor, out: torch.Tensor) -> None:
    """Point placeholder ``p`` at ``out``'s data; copy where ``out`` has another layout than promised."""
    if out.stride() == p.stride() and out.dtype == p.dtype:
        p.set_(out)
    else:
        p.set_(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device))
        p.copy_(out)


def ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` once its data is there: waits for the execution that produces it (and so for those before it)."""
    if _S.watch is not None:
        settle_watch(read=t)
    if _S.poisoned and id(t) in _S.poisoned:
        raise StepFailed("this value was computed by an asynchronously launched graph that failed (the error was "
                         "raised at an earlier sync)")
    ex = _S.inflight.get(id(t))
    if ex is not None:
        _wait(ex)
    return t


def busy() -> bool:
    """Whether some execution is in flight or has failed (``ready`` may have to wait or raise for a tensor)."""
    return bool(_S.inflight or _S.poisoned)


def in_flight(t: torch.Tensor) -> bool:
    """Whether ``t`` is the placeholder of a launched execution not yet retired (its data may not be there)."""
    return id(t) in _S.inflight


def ready_all(tensors: Sequence[torch.Tensor]) -> None:
    """Wait until every tensor in ``tensors`` has its data (before a graph runs on the calling thread)."""
    if _S.poisoned:
        for t in tensors:
            ready(t)
    if not _S.inflight:
        return
    last = None
    for t in tensors:
        ex = _S.inflight.get(id(t))
        if ex is not None and (last is None or ex.seq > last.seq):
            last = ex
    if last is not None:
        _wait(last)


def check_leaves(tensors: Sequence[torch.Tensor]) -> None:
    """Raise if a graph about to launch reads a placeholder of a failed execution."""
    if _S.poisoned:
        for t in tensors:
            if id(t) in _S.poisoned:
                ready(t)


def _wait(ex: Execution) -> None:
    if not ex.done.is_set():
        start = time.perf_counter()
        if ex.job is not None:  # settled in launch order, up to ``ex``
            for e in list(_S.running):
                _complete(e)
                if e is ex:
                    break
        else:
            ex.done.wait()
        metrics.bump("async.wait_time_s", time.perf_counter() - start)
        metrics.bump("async.waits")
    retire()  # FIFO: everything launched before ``ex`` is done too


def wait_all() -> None:
    """Wait for every launched execution; raise the first failure."""
    if _S.watch is not None:
        settle_watch()
    if _S.running:
        _wait(_S.running[-1])


def retire() -> None:
    """Forget finished executions from the oldest on; the first failed one raises here (Note [Asynchronous
    execution])."""
    while _S.running:
        ex = _S.running[0]
        if not ex.done.is_set():
            if ex.job is None or not _C.native_done(ex.job[0]):
                break
            _settle_native(ex)
        ex = _S.running.popleft()
        for p in ex.outputs:
            _S.inflight.pop(id(p), None)
        if not _S.running and _S.user_interval is not None:
            sys.setswitchinterval(_S.user_interval)
            _S.user_interval = None
        if ex.error is not None:
            _fail(ex)


def _fail(ex: Execution) -> None:
    first = ex.error
    failed = [ex]
    while _S.running:  # every later execution launched before now is poisoned by the worker: retire them too
        later = _S.running[0]
        if later.epoch != ex.epoch:
            break
        _complete(later)
        _S.running.popleft()
        failed.append(later)
    for f in failed:
        for p in f.outputs:
            _S.inflight.pop(id(p), None)
            _S.poisoned[id(p)] = p
        for st, value in f.synced or ():
            if st.value.is_data and st.value.data is not None and id(st.value.data) in _S.poisoned:
                st.value = value
                st.failed = value
        f.synced = None
    _S.epoch += 1
    metrics.bump("async.failed")
    raise StepFailed(f"the graph launched at {ex.where} failed: {type(first).__name__}: {first}") from first


def settle() -> None:
    """Wait until every launched program has finished, raising nothing (errors wait for the next sync). Also at
    exit: a daemon thread would otherwise die mid-kernel."""
    for ex in list(_S.running):
        if ex.job is not None:
            _C.native_wait(ex.job[0])
        else:
            ex.done.wait()


metrics.SETTLE = settle


def _check_fork() -> None:
    if _S.pid != os.getpid():  # a forked child (a DataLoader worker): the worker thread did not come along
        _S.__init__()
