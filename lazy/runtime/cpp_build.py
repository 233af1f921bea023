"""Building a program's C++ translation units into a shared library: at once, or in the background.

Note [C++ compiles in the background]
g++ takes most of a graph's compile on the cpu: ~0.75 s of a tiny GPT training step's ~1 s on 2 cores, paid by the
step that tiers the graph up, by a capture's first call and by each new size of a ``dynamic=True`` capture. Under
``compiler='auto'`` (with ``config.compile_background``) a program is lowered, scheduled and rendered as before, on
the calling thread; only the compiler processes run in the background, as the Triton backend's compiles do in
their pool (Note [Triton compiles] in triton_build.py). Until the library is built the graph runs on the
reference executor (each such run counted in ``warming_runs``); the first run that finds it built loads it and
runs compiled from then on. Only processes run in the background, no Python thread: lowering reads the
configuration and the interned tables of the calling thread, which another thread must not race. The switch
depends on how long g++ takes, so a run's numbers (the reference executor's are eager's, the kernels' may round
differently) depend on timing; ``compile_background=False``, or an explicit ``compiler='cpp'``, compiles
synchronously (the test suite runs so, tests/conftest.py, so that its counts hold and the compiled kernels run
from the tier-up on; tests/test_cpp_build.py tests the background). One background build runs at a time: the
units of one program already take every core (``_units`` in cpp.py), and on 2 cores builds started at once for
the sizes of a ``dynamic=True`` capture made the steps that ran meanwhile up to three times slower. A failed
build warns once when it is found, and the graph stays on the reference executor (``compile_fallback``), as a
failed synchronous compile does.

Note [Background builds yield the cores]
A background build's compiler processes run at a lower priority (``config.compile_nice``, 10 by default, through
``nice``), below the steps that run meanwhile. At the caller's priority, on 2 cores, the two compiler processes of
a build shared the cores with the calling thread's Python and with the OpenMP threads of the graph's warming run on
the reference executor: an OpenMP team waits at each barrier for a member queued behind g++, so a tiny GPT step's
reference run, 4-20 ms alone, took 0.3-2 s, and each later new size of benchmarks/dynamic_sizes.py under
``dynamic=True`` cost 290-354 ms of the calling thread, 109-112 ms with the builds at niceness 10 (a static
recapture 644-886 and 318-324 ms; AMD EPYC, 2 cores, otherwise idle; 19 gave what 10 gives). The builds then take
what the steps leave: the last one finished 1.0-1.3 s later in that benchmark (its steps meanwhile ran on the
reference executor, 8 ms against 4 compiled). At 10 a build still gets about a tenth of a core that a
step keeps busy (CFS weights), so a loop that never leaves the cores idle is tiered up late, not never. Synchronous
builds (the caller waits for them) and the link keep the caller's priority.
"""
from __future__ import annotations

import atexit
import collections
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any, List, Optional, Sequence, Tuple

from ..cache import disk
from ..config import config
from ..debug import metrics
from ..debug.log import log


class CompileError(RuntimeError):
    pass


_LIVE: "weakref.WeakSet[Build]" = weakref.WeakSet()  # builds not finished: ended at exit
_QUEUE: "collections.deque[Build]" = collections.deque()  # background builds waiting for the one running
_QUEUE_LOCK = threading.RLock()  # programs poll from the calling thread and from the launch worker


class Build:
    """The compiler processes of one program's units (Note [Programs compiled in parallel] in codegen/cpp.py), in a
    private temporary directory; ``poll``/``wait`` link them once compiled and give the library's path, stored in
    the disk cache under ``key`` where that works. A build starts at once, or (``background``) when no other
    background build runs (the module's Note)."""

    def __init__(self, units: List[str], flags: List[str], key: str, source: str, background: bool = False) -> None:
        cxx = self.cxx = shlex.split(config.cxx) + flags
        self.key, self.source = key, source
        # one dir per compile, removed once the library is in the disk cache or loaded (a loaded library stays
        # mapped when its file is gone): one dir per compile filled /tmp over a long session
        self.tmp = tempfile.mkdtemp(prefix="lazy-cpp-")
        self.pid = os.getpid()  # Note [Builds across a fork]
        self._remove = weakref.finalize(self, _remove_dir, self.tmp, self.pid)  # a build no program polls any more
        self.so = os.path.join(self.tmp, "graph.so")
        sources = []
        for i, text in enumerate(units):
            sources.append(os.path.join(self.tmp, f"graph{i or ''}.cpp"))
            with open(sources[-1], "w") as f:
                f.write(text)
        run = _niced(cxx) if background else cxx  # Note [Background builds yield the cores]
        if len(units) == 1:
            self.commands = [run + ["-o", self.so, sources[0]]]
            self.objects: List[str] = []
        else:
            self.objects = [src[:-4] + ".o" for src in sources]
            self.commands = [run + ["-c", "-o", obj, src] for src, obj in zip(sources, self.objects)]
        self.procs: List[subprocess.Popen] = []
        self.started = False
        self.error: Optional[CompileError] = None  # the compiler could not be started
        self.path: Optional[str] = None
        _LIVE.add(self)
        if background:
            with _QUEUE_LOCK:
                _QUEUE.append(self)
            _pump()
        else:
            self._start()

    def _start(self) -> None:
        """Start the compiler processes; never raises (a failure to start is ``error``, raised by ``poll``)."""
        self.start = time.perf_counter()
        self.started = True
        for k, cmd in enumerate(self.commands):
            # NOTE: errors go to files, not pipes: a compiler writing more than a pipe holds would block forever
            # while nothing reads it before it exits
            try:
                with open(self._log(k), "w") as err:
                    self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err))
            except OSError as e:
                self.error = CompileError(f"cannot run the C++ compiler {config.cxx!r} ({e}); set LAZY_CXX")
                for p in self.procs:
                    p.kill()
                    p.wait()
                return

    def compiled(self) -> bool:
        """Whether the compiler processes are done (or could not start)."""
        return self.started and (self.error is not None or all(p.poll() is not None for p in self.procs))

    def _log(self, k: int) -> str:
        return os.path.join(self.tmp, f"cxx{k}.log")

    def poll(self) -> Optional[str]:
        """The library's path once every unit has compiled (linking them first), else None; raises CompileError
        where a compiler process failed."""
        if self.path is None:
            if self.pid != os.getpid():
                raise CompileError("the build started in the parent process before it forked (Note [Builds across "
                                   "a fork]): this process runs the graph on the reference executor")
            _pump()
            if not self.compiled():
                return None
            if self.error is not None:
                self.close()
                raise self.error
            self._finish()
        return self.path

    def wait(self) -> str:
        """The library's path, once built (a build started at construction)."""
        for p in self.procs:
            p.wait()
        return self.poll()

    def _finish(self) -> None:
        results = []
        for k, p in enumerate(self.procs):
            with open(self._log(k)) as f:
                results.append((p.returncode, f.read()))
        if self.objects and all(code == 0 for code, _ in results):
            link = subprocess.run(self.cxx + ["-o", self.so] + self.objects, capture_output=True, text=True)
            results.append((link.returncode, link.stderr))
        _LIVE.discard(self)
        metrics.bump("cpp.compiles")
        metrics.bump("cpp.compile_time_s", time.perf_counter() - self.start)
        for code, err in results:
            if code != 0:
                self.close()
                raise CompileError(f"{config.cxx} failed ({code}): {err.strip()[:2000]}")
        self.path = disk.store(self.key, self.source, self.so) or self.so

    def close(self) -> None:
        """End the processes (where still running) and remove the directory; a library loaded from it stays."""
        for p in self.procs if self.pid == os.getpid() else ():
            if p.poll() is None:
                p.kill()
                p.wait()
        with _QUEUE_LOCK:
            if self in _QUEUE:
                _QUEUE.remove(self)
        self._remove()
        _LIVE.discard(self)


def _niced(cxx: List[str]) -> List[str]:
    """``cxx`` run through ``nice`` at ``config.compile_nice``; as it is where that is 0, or where ``nice`` or the
    compiler is not found (a compiler that cannot be started then raises as it would without ``nice``)."""
    level = min(int(config.compile_nice), 19)
    nice = shutil.which("nice")
    if level <= 0 or nice is None or shutil.which(cxx[0]) is None:
        return cxx
    return [nice, "-n", str(level)] + cxx


def _remove_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # never a parent's directory from a forked child
        shutil.rmtree(path, ignore_errors=True)


# Note [Builds across a fork]
# A child forked while builds run (os.fork, a fork-started worker) inherits the parent's Build objects, queue and
# lock, but the compiler processes are the parent's: the child must neither wait for them (waitpid on another's
# child reports an exit, and a half-written library would be loaded), nor kill them, nor remove their directory at
# its exit. So the child forgets the queue (its lock is new: a thread may have held it at the fork), a build polled
# in the child raises CompileError (the graph stays on the reference executor there), and kills and removals are
# done only by the process that started the build.
def _forget_parent_builds() -> None:
    global _QUEUE_LOCK
    _QUEUE_LOCK = threading.RLock()
    _QUEUE.clear()
    _LIVE.clear()


os.register_at_fork(after_in_child=_forget_parent_builds)


def _running() -> Optional[Build]:
    """The background build whose processes run (the queue's head, once started)."""
    return _QUEUE[0] if _QUEUE and _QUEUE[0].started else None


def _pump() -> None:
    """Start the next queued background build once the one running has finished compiling."""
    with _QUEUE_LOCK:
        while _QUEUE and _QUEUE[0].compiled():
            _QUEUE.popleft()
        if _QUEUE and not _QUEUE[0].started:
            _QUEUE[0]._start()


def wait_all() -> Tuple[int, float]:
    """Wait until every queued background build has compiled; (how many, seconds waited). Their programs load
    them at their next run."""
    start = time.perf_counter()
    n = len(_QUEUE)
    while _QUEUE:
        running = _running()
        for p in running.procs if running is not None else ():
            p.wait()
        _pump()
    return n, time.perf_counter() - start


def fell_back(cause: str, nodes: int, stacklevel: int) -> None:
    """A graph the cpp backend could not compile runs on the reference executor: said once, logged and counted
    (``compile_fallback``), whether the compile failed at once or in the background."""
    metrics.bump("compile_fallback")
    log(1, f"cpp compile failed, reference fallback: {cause}")
    warnings.warn(f"lazy: the cpp backend could not compile a graph of {nodes} nodes ({cause[:500]}); it runs on the "
                  "reference executor (correct, slower). Set LAZY_COMPILER=reference to silence.", RuntimeWarning,
                  stacklevel=stacklevel + 1)


@atexit.register
def _end_all() -> None:
    for b in list(_LIVE):
        b.close()


class BuildingProgram:
    """A cpp program whose library builds in the background (Note [C++ compiles in the background]): runs on the
    reference executor until the build is done, then as the program. Everything else is the program's."""

    backend = "cpp"

    def __init__(self, program: Any, fallback: Any) -> None:
        self._program, self._fallback = program, fallback
        self._lock = threading.Lock()
        self._built = False
        self._failed = False

    def __getattr__(self, name: str) -> Any:  # the program's plan and description (dumps, launches)
        return getattr(self.__dict__["_program"], name)

    def ready(self) -> bool:
        """Whether runs are compiled: loads the library once built (one thread at a time: a run may be on the
        launch worker while the caller checks)."""
        if self._built:
            return True
        if self._failed:
            return False
        with self._lock:
            if not self._built and not self._failed:
                try:
                    self._built = self._program.built()
                    if self._built:
                        self._fallback = None  # its plan and buffers are not needed any more
                except CompileError as e:
                    self._failed = True
                    fell_back(f"{type(e).__name__}: {e}", self._program.num_nodes, stacklevel=3)
        return self._built

    def run(self, leaves: Sequence[Any], scalars: Sequence[Any]) -> List[Any]:
        fallback = self._fallback  # read first: another thread drops it once the library is loaded
        if self._built or self.ready() or fallback is None:
            return self._program.run(leaves, scalars)
        if not self._failed:
            metrics.bump("warming_runs")
        return fallback.run(leaves, scalars)

    def launchable(self) -> bool:
        return (self._built or self.ready()) and self._program.launchable()
