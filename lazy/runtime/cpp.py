"""The C++ runtime: compile a graph's translation unit with the system compiler, load it once with ctypes, and
run it as a Program (same interface as the reference executor) over a buffer plan with extern ATen calls.

The pipeline of passes is listed in ``compile_cpp`` (STYLE.md item 4): lower -> schedule -> render -> build.
If any pass or the compiler fails, the graph runs on the reference executor with one warning naming the cause
and the ``compile_fallback`` counter; results stay correct.
"""
from __future__ import annotations

import ctypes
import math
import os
import time
from typing import Any, Dict, List, Sequence, Tuple

import torch

from .. import _C
from ..cache import disk
from ..codegen import cpp as renderer
from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.graph import Linearized, format_graph
from ..ir.node import DATA
from ..lower import Extern, lower
from ..schedule import Kernel, format_schedule, schedule
from . import cpp_native, pages
from .cpp_build import Build, BuildingProgram, CompileError, fell_back
from .arena import layout, stored_by_kernels
from .arena import view as arena_view
from .spares import BUDGET
from .cpp_isa import IsaError, target, target_isa  # noqa: F401 -- benchmarks/machine.py reports target_isa
from .externs import extern_call, run_extern
from .reference import eager_dispatch
from .reference import Program as ReferenceProgram

FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fno-trapping-math", "-fwrapv",
         "-ffp-contract=off", "-fno-tree-loop-distribute-patterns")
# NOTE: no -ffast-math: results must match eager (NaN/inf semantics, no reassociation). -fno-math-errno only lets
# sqrt & co. compile to instructions instead of libm calls that set errno; values are unchanged. -fwrapv: signed
# integer overflow wraps, as eager's does (int64 mul, int32 add, abs/neg of INT_MIN), instead of being UB.
# -ffp-contract=off: g++ would otherwise fuse ``x * a + b`` (two eager ops, each rounded) into one FMA (rounded
# once), even in ISO mode; the math functions of cpp_math.py ask for their FMAs explicitly (__builtin_fma).
# -fno-trapping-math only gives up the floating-point exception *flags* (nothing reads them; values, NaN/inf and
# signed zeros are unchanged); without it g++ will not if-convert selects or vectorize floor/ceil, so the math of
# cpp_math.py would stay scalar. -fno-tree-loop-distribute-patterns: a lane loop that only copies (a float row summed
# in float lanes, Note [Short float sums in float lanes]) stays a vector loop, not a memcpy call per block. The
# -march/-m flags come from lazy.config.cpu_isa: flags() (Note [Kernel ISA] in
# cpp_isa.py).

_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_SEGMENT, _EXTERN = "seg", "extern"
ARENA_KEEP_BYTES = 1 << 20  # a Program keeps an arena up to this size between runs (Note [Run plan])

# Note [Run plan]
# A cached graph runs every step, so a run does no planning: its steps are prebuilt tuples (entry points with
# their ctypes signatures, extern calls with flat argument plans, which buffers to allocate and free). Buffers
# that only kernels read or write (temporaries inside a segment or between segments) live at offsets of one
# byte arena, laid out once by lifetime (runtime/arena.py: a temporary reuses the bytes of one that died
# before it was defined), so they cost neither a torch.empty nor a tensor per run. A Program keeps its arena
# when it is small (ARENA_KEEP_BYTES), with the kernel buffers that externs read as prebuilt views into it;
# an extern output that aliases the arena is copied out, since later kernels overwrite those bytes. Graph
# outputs are fresh tensors, or outputs of earlier runs that nothing references (Note [Reused outputs] in
# runtime/spares.py). A re-entered run (another thread) or a large arena gets a fresh arena per run.


def flags() -> List[str]:
    """The compiler flags of a kernel build under the current configuration: FLAGS and those of ``cpu_isa``."""
    return list(FLAGS) + list(target().flags)


def _units() -> int:
    """How many translation units a program's source may be split into: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Program:
    """A compiled graph: kernel segments (one C entry point each) and extern calls over a buffer plan."""

    backend = "cpp"

    def __init__(self, lin: Linearized, device: torch.device, background: bool = False) -> None:
        """``background``: a library not in the disk cache builds in the background (Note [C++ compiles in the
        background] in cpp_build.py): ``built()`` says when the program can run."""
        if device.type != "cpu":
            raise CompileError(f"the cpp backend runs on the cpu, not on {device}")
        self.device = device
        lowered = lower(lin)                                   # ATen graph -> kernel IR + externs
        sched = schedule(lowered, renderer.LIMITS)             # fusion, order, buffer lifetimes
        self.kernel_ir = format_schedule(sched)
        source, segments, units = renderer.render(sched, config.debug >= 3, _units())  # kernel IR -> C++
        self.source = source
        describe(self, lin, lowered, sched)
        key = disk.graph_digest(lin, "cpp", config.cxx, " ".join(flags()), target().key())
        self.lib: Any = None
        self._building: Any = None
        path = disk.lookup(key, source) if segments else None
        if path is not None:
            self.lib = ctypes.CDLL(path)
        elif segments:
            build = Build(units, flags(), key, source, background)
            if background:
                self._building = (build, lowered, sched, segments)
                return
            try:
                self.lib = ctypes.CDLL(build.wait())
            finally:
                build.close()
        self._ready(lowered, sched, segments)

    def _ready(self, lowered: Any, sched: Any, segments: List[List[Kernel]]) -> None:
        self._plan(lowered, sched, segments)
        metrics.bump("kernels_compiled", self.num_kernels)
        for name, n in self.externs_by_op.items():
            metrics.bump(f"extern.{name}", n)

    def built(self) -> bool:
        """Whether the program can run: a background build is done and its library loaded (loaded here, at the
        first call that finds it built). Raises CompileError where the build failed."""
        if self._building is None:
            return True
        build, lowered, sched, segments = self._building
        path = build.poll()
        if path is None:
            return False
        self._building = None
        try:
            self.lib = ctypes.CDLL(path)
        finally:
            build.close()
        self._ready(lowered, sched, segments)
        return True

    def _plan(self, lowered: Any, sched: Any, segments: List[List[Kernel]]) -> None:
        """Flat run-time plan (Note [Run plan]): steps as tuples, kernel-only temporaries at fixed arena offsets."""
        self.num_buffers = lowered.num_buffers
        self.leaf_ids = [b.id for b in lowered.leaves]
        self.output_ids = [b.id for b in lowered.outputs]
        self.scalar_kinds = list(lowered.scalar_kinds)
        outputs = set(self.output_ids)
        extern_read = {b.id for s in sched.steps if isinstance(s, Extern) for b in s.inputs}
        defined, stored = stored_by_kernels(sched.steps, Kernel)
        # kernel-only temporaries live in the arena; outputs escape (fresh tensors); extern inputs need tensors,
        # which are prebuilt views of the arena when it is kept by the Program (small), else fresh tensors
        in_arena = [b for bid, b in stored.items() if bid not in outputs]
        self.arena_bytes, offsets = layout(in_arena, defined, sched.last_use)
        self.keep_arena = self.arena_bytes <= ARENA_KEEP_BYTES
        if not self.keep_arena:
            in_arena = [b for b in in_arena if b.id not in extern_read]
            self.arena_bytes, offsets = layout(in_arena, defined, sched.last_use)
        self._busy = False
        self.arena_slots = [(b.id, offsets[b.id]) for b in in_arena if b.id not in extern_read]
        self.arena_views = [(b.id, offsets[b.id], b.shape, b.dtype) for b in in_arena if b.id in extern_read]
        self._values: List[Any] = [None] * self.num_buffers
        # (the last scalars tuple, its float and int arrays, their addresses, whether it holds numbers only), for
        # runs from Python (Note [Segment calls in C] in csrc/graph.cpp); a run in C packs the scalars itself
        self._packed: Tuple[Any, ...] = (None, None, None, 0, 0, False)
        if self.keep_arena:
            self._arena, self._ptrs, self._values = self._new_arena()
        else:
            self._arena, self._ptrs = None, (ctypes.c_void_p * max(self.num_buffers, 1))()
        kept = {bid for bid, _ in self.arena_slots} | ({v[0] for v in self.arena_views} if self.keep_arena else set())
        seg_of = {id(seg[0]): i for i, seg in enumerate(segments)}
        steps: List[list] = []
        ext_ops: List[Any] = []
        for i, step in enumerate(sched.steps):
            frees = [b for b in sched.frees.get(i, ()) if b not in kept]
            if isinstance(step, Extern):
                steps.append([_EXTERN, step.name, extern_call(step), tuple(frees)])
                ext_ops.append(step.fn)
                continue
            if id(step) in seg_of:
                n = seg_of[id(step)]
                fn = self._entry(f"lz_seg{n}")
                steps.append([_SEGMENT, f"seg{n}", fn, [], [], 0, [], ctypes.cast(fn, ctypes.c_void_p).value])
            seg = steps[-1]
            seg[3].extend((b.id, b.shape, b.dtype) for b, _, _ in step.stores
                          if b.id in outputs or (b.id in extern_read and not self.keep_arena))
            seg[4].extend(frees)
            seg[5] += 1
            seg[6].append(step.name)
        for s in steps:
            if s[0] is _SEGMENT:
                s[3] = tuple(s[3])  # allocs: a tuple, as _C.take_buffers takes them
        self.steps = [tuple(s) for s in steps]
        self._allocs = tuple(a for s in self.steps if s[0] is _SEGMENT for a in s[3])  # what a run in C takes first
        self._native = self._native_runner(ext_ops)
        self.spare_bytes = self._segment_bytes(())
        self._spares = None  # Note [Reused outputs] (runtime/spares.py)

    def _native_runner(self, ext_ops: List[Any]) -> Any:
        """The C runner of this program (Note [Programs run in C] in csrc/runner.cpp), or None where some extern
        step is not an aten operator with flat arguments (then the run loop below runs it)."""
        if not cpp_native.NATIVE:
            return None
        upfront = self._segment_bytes(set(self.output_ids))
        if upfront > cpp_native.UPFRONT_BYTES:  # the C run takes every segment's outputs first: memory it holds longer
            log(3, f"cpp program runs from Python: {upfront} bytes of temporaries would be taken before the run")
            return None
        plan: List[tuple] = []
        ops = iter(ext_ops)
        wanted = set()
        try:
            for step in self.steps:
                if step[0] is _SEGMENT:
                    plan.append(("seg", step[7], step[4]))
                else:
                    plan.append(cpp_native.extern_step(next(ops), step[2], self.scalar_kinds, step[3]))
                    wanted.update(i for i in step[2][7] if i is not None)
            runner = cpp_native.make_runner(plan, self.num_buffers)
        except cpp_native.Unsupported as e:
            log(3, f"cpp program runs from Python: {e}")
            return None
        self._wanted = tuple(i for i in self.output_ids if i in wanted)  # graph outputs that externs make
        return runner

    def _segment_bytes(self, skip: Any) -> int:
        """Bytes of the buffers the kernel segments allocate, but those in ``skip``."""
        return sum(math.prod(shape) * dtype.itemsize for s in self.steps if s[0] is _SEGMENT
                   for i, shape, dtype in s[3] if i not in skip)

    def _entry(self, name: str) -> Any:
        fn = getattr(self.lib, name)
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int
        return fn

    def run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        if self._busy or not self.keep_arena:  # re-entered (another thread) or a large arena: a private one
            return self._run_fresh(leaves, scalars)
        self._busy = True
        try:  # a copy of the values with the arena's views: a run holds no leaf, extern result or output after it
            return self._run(self._values.copy(), self._ptrs, self._arena, leaves, scalars)
        finally:
            self._busy = False

    def _new_arena(self) -> tuple:
        """(arena, pointer array, values): a new arena, its temporaries' addresses set in the array, and a values
        list (one entry per buffer) holding, where the arena is kept, a view of each temporary an extern reads as a
        tensor."""
        arena = torch.empty(self.arena_bytes, dtype=torch.uint8)
        ptrs = (ctypes.c_void_p * max(self.num_buffers, 1))()
        base = arena.data_ptr()
        for bid, off in self.arena_slots:
            ptrs[bid] = base + off
        values: List[Any] = [None] * self.num_buffers
        if self.keep_arena:
            for bid, off, shape, dtype in self.arena_views:
                t = values[bid] = arena_view(arena, off, shape, dtype)
                ptrs[bid] = t.data_ptr()
        return arena, ptrs, values

    def _run_fresh(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        arena, ptrs, values = self._new_arena()
        return self._run(values, ptrs, arena, leaves, scalars)

    # ---- launched on the C thread (Note [Launches on a C thread] in csrc/native_launch.cpp) ----

    def launchable(self) -> bool:
        """Whether a launched run can go to the C launch thread: the program runs in C (and untimed)."""
        return self._native is not None and config.debug < 3

    def submit(self, leaves: Sequence[torch.Tensor], forwards: list, scalars: Sequence[Any], epoch: int,
               threads: Any) -> tuple:
        """Prepare a run on the calling thread (its own arena, buffers, pointers and scalars: an earlier run of this
        program may still be in flight) and queue it on the launch thread; ``forwards`` (buffer id, job, the job's
        buffer id) are leaves an earlier job produces; ``threads`` its OpenMP/MKL count. What ``finish`` takes."""
        arena, ptrs, template = self._launch_set()
        values = template.copy()
        for i, t in zip(self.leaf_ids, leaves):
            values[i] = t  # a forwarded leaf's placeholder too: the job replaces it when it starts
        address = ctypes.addressof(ptrs)
        reused = self._take_outputs(values, address, BUDGET.admit(self))
        lo = arena.data_ptr() if self.arena_views and self.keep_arena else 0
        job = _C.native_submit(self._native, address, scalars, values, forwards, lo,
                               lo + arena.numel() if lo else 0, epoch, threads, arena)
        return job, values, reused

    def _launch_set(self) -> tuple:
        """(arena, pointer array, values with its arena views) for the next launched run: two sets, taken in turn.
        A launch waits while two runs are in flight (MAX_IN_FLIGHT in lazy/sync/launch.py), so the run that used a
        set before is done; the pointer array is copied by the job. A program whose arena is not kept (a large one)
        gets a fresh one every run, as a synchronous run does."""
        sets = self.__dict__.setdefault("_launch_sets", [None, None])
        turn = self.__dict__["_launch_turn"] = 1 - self.__dict__.get("_launch_turn", 1)
        if sets[turn] is None or not self.keep_arena:
            sets[turn] = self._new_arena()
        return sets[turn]

    def finish(self, submitted: tuple) -> Any:
        """The outputs of a submitted run once it has run (waiting for it), None where it did not run (an earlier
        job of its epoch failed); raises its error."""
        job, values, reused = submitted
        answer = _C.native_finish(job, self._wanted)
        if answer is None:
            return None
        return self._settle_native(answer, values, reused)

    def _take_outputs(self, values: List[Any], address: int, spares: Any) -> int:
        """Every segment's outputs, taken before a run in C (their shapes are fixed): spares nothing references, else
        fresh buffers, into ``values`` and the pointer array at ``address``; how many were spares."""
        return _C.take_buffers(self._allocs, spares, values, address, pages.empty) if self._allocs else 0

    def _settle_native(self, answer: tuple, values: List[Any], reused: int) -> List[torch.Tensor]:
        """The outputs of a run in C: its error bits raised, the extern results it made put in place."""
        err, made = answer
        if err:
            _raise_kernel_error(err)
        for i, t in made:
            values[i] = t
        metrics.bump_many(("executed_graphs", 1), ("executed_nodes", self.num_nodes),
                          ("kernels_launched", self.num_kernels), ("spares.reused", reused), ("cpp.native_runs", 1))
        return [values[i] for i in self.output_ids]

    def _run_native(self, values: List[Any], address: int, scalars: Sequence[Any], spares: Any, lo: int,
                    hi: int) -> List[torch.Tensor]:
        """The run in C (Note [Programs run in C]): every segment's outputs taken first (their shapes are fixed),
        then one call without the GIL (which packs the scalars and reads the values' addresses)."""
        reused = self._take_outputs(values, address, spares)
        answer = _C.run_program(self._native, address, scalars, values, lo, hi, self._wanted)
        return self._settle_native(answer, values, reused)

    def _run(self, values: List[Any], ptrs: Any, arena: torch.Tensor, leaves: Sequence[torch.Tensor],
             scalars: Sequence[Any]) -> List[torch.Tensor]:
        for i, t in zip(self.leaf_ids, leaves):
            values[i] = t  # with its address, in C for a run in C (Note [Addresses from the values] in csrc/runner.cpp)
        timer = _Timer(self) if config.debug >= 3 else None
        check_alias = bool(self.arena_views) and self.keep_arena
        lo = arena.data_ptr()
        hi = lo + arena.numel()
        launched = reused = 0
        spares = BUDGET.admit(self)
        address = ctypes.addressof(ptrs)
        if self._native is not None and timer is None:
            return self._run_native(values, address, scalars, spares, lo if check_alias else 0,
                                    hi if check_alias else 0)
        seen, fs, is_, fs_at, is_at, numbers = self._packed
        if scalars is seen and not numbers and all(type(s) in (int, float, bool) for s in scalars):
            # the same tuple again, of numbers only (a replay's constants): its packing holds from now on. Checked
            # at the second run only: a replay's tuple of computed scalars is new at every run
            numbers = True
            self._packed = (seen, fs, is_, fs_at, is_at, True)
        if scalars is not seen or not numbers:
            n = max(len(scalars), 1)
            fs, is_ = (ctypes.c_double * n)(), (ctypes.c_int64 * n)()
            _C.pack_scalars(scalars, fs, is_)  # float(s) and int(s) of each number, in C (~0.3 us each in Python)
            fs_at, is_at = ctypes.addressof(fs), ctypes.addressof(is_)
            self._packed = (scalars if type(scalars) is tuple else None, fs, is_, fs_at, is_at, False)
        for i, t in zip(self.leaf_ids, leaves):
            ptrs[i] = t.data_ptr()
        with eager_dispatch():
            for step in self.steps:
                if step[0] is _SEGMENT:
                    _, label, fn, allocs, frees, count, names, at = step
                    if allocs:  # a spare nothing references, else fresh (Note [Huge pages for large outputs])
                        reused += _C.take_buffers(allocs, spares, values, address, pages.empty)
                    if timer is not None:
                        err = timer.segment(label, fn, names, ptrs, fs, is_)
                    else:
                        err = _C.call_segment(at, address, fs_at, is_at)  # Note [Segment calls in C]
                    if err:
                        _raise_kernel_error(err)
                    launched += count
                else:
                    _, label, call, frees = step
                    start = time.perf_counter() if timer is not None else 0.0
                    for i, t in run_extern(call, values, scalars, self.device):
                        p = t.data_ptr()
                        if check_alias and lo <= p < hi:  # a view of an arena buffer: copy it out
                            t = t.clone()
                            p = t.data_ptr()
                        values[i] = t
                        ptrs[i] = p
                    if timer is not None:
                        timer.add(f"extern {label}", time.perf_counter() - start)
                for i in frees:
                    values[i] = None
        outs = [values[i] for i in self.output_ids]
        if timer is not None:
            timer.report()
        metrics.bump_many(("executed_graphs", 1), ("executed_nodes", self.num_nodes), ("kernels_launched", launched),
                          ("spares.reused", reused))
        return outs


class _Timer:
    """Per-kernel and per-extern wall time of one run (LAZY_DEBUG>=3), added to the ``cpp.time.*`` counters and
    logged. Kernels are timed one by one through their ``lz_kernel_<name>`` entry points, which the renderer
    emits only for graphs compiled at LAZY_DEBUG>=3; otherwise per segment."""

    def __init__(self, program: "Program") -> None:
        self.program = program
        self.times: Dict[str, float] = {}

    def add(self, label: str, seconds: float) -> None:
        self.times[label] = self.times.get(label, 0.0) + seconds
        metrics.bump(f"cpp.time.{label}", seconds)

    def segment(self, label: str, fn: Any, names: List[str], ptrs: Any, fs: Any, is_: Any) -> int:
        lib = self.program.lib
        if all(hasattr(lib, f"lz_kernel_{n}") for n in names):
            err = 0
            for n in names:
                k = getattr(lib, f"lz_kernel_{n}")
                k.argtypes, k.restype = _ARGTYPES, ctypes.c_int
                start = time.perf_counter()
                err |= k(ptrs, fs, is_)
                self.add(f"kernel {n}", time.perf_counter() - start)
            return err
        start = time.perf_counter()
        err = fn(ptrs, fs, is_)
        self.add(f"segment {label} ({' '.join(names)})", time.perf_counter() - start)
        return err

    def report(self) -> None:
        total = sum(self.times.values())
        lines = [f"  {t * 1e6:9.1f} us  {label}" for label, t in sorted(self.times.items(), key=lambda x: -x[1])]
        log(3, f"cpp run: {total * 1e3:.3f} ms in kernels and externs\n" + "\n".join(lines))


class KernelIndexError(RuntimeError, IndexError):
    """An index out of range met by a compiled kernel; eager raises RuntimeError (gather, scatter) or IndexError
    (indexing, index_select, embedding) for it, so this is both."""


def _raise_kernel_error(err: int) -> None:
    """The error bits a kernel returned (codegen/cpp.py's lz_err)."""
    if err & 2:
        raise KernelIndexError("lazy: index out of range in a compiled kernel (gather, indexing, index_select, "
                               "embedding or scatter): some index is >= the size of the dimension it indexes, or "
                               "< -size; eager raises on the same input")
    raise ZeroDivisionError("lazy: integer division by zero in a compiled kernel")


def describe(program: Any, lin: Linearized, lowered: Any, sched: Any) -> None:
    """What a compiled program tells about itself (dumps, tests, metrics): shared by the cpp and Triton programs."""
    # NOTE: the graph's text is read only by the dump written right after the compile (graph_cache._dump): ~4 ms of
    # a tiny GPT step's new size when made for nothing
    program.graph_text = format_graph(lin.order, lin.outputs) if config.dump_dir else ""
    program.num_nodes = sum(1 for n in lin.order if n.op is not DATA)
    program.num_kernels = len(sched.kernels)
    program.num_externs = sum(isinstance(s, Extern) for s in sched.steps)
    program.externs_by_op = dict(lowered.externs_by_op)


def compile_cpp(lin: Linearized, device: torch.device) -> Any:
    """The cpp backend's compiler for graph_cache; falls back to the reference executor on any failure. Under
    ``compiler='auto'`` the library builds in the background (Note [C++ compiles in the background])."""
    try:
        program = Program(lin, device, background=config.compiler == "auto" and config.compile_background)
        return program if program.built() else BuildingProgram(program, ReferenceProgram(lin, device, source=False))
    except Exception as e:  # noqa: BLE001 -- any failure falls back, loudly and counted
        fell_back(f"{type(e).__name__}: {e}", len(lin.order), stacklevel=2)
        return ReferenceProgram(lin, device)
