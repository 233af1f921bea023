"""The Triton runtime: a graph's kernels as a Triton module, run as a Program (the reference/cpp interface:
``run(leaves, scalars) -> outputs``) over a buffer plan with extern ATen calls on the same stream.

The pipeline is listed in ``Program.__init__`` (STYLE.md item 4): lower -> schedule -> render -> build. On a CUDA
backing device kernels are compiled by Triton (Note [Triton compiles] in triton_build.py); on the cpu they run
under Triton's interpreter (TRITON_INTERPRET semantics, eager's math functions: codegen/triton_interp.py), which is
how the backend is tested without a GPU. If any pass fails the graph runs on the reference executor with one
warning and the ``compile_fallback`` counter.

Note [Pre-bound launches]
A run enqueues work on the current stream and returns: it never synchronizes (the asynchronous runtime builds on
that). Each kernel's launch is prepared once: the loaded kernel, its launcher and argument types (Note [One
launcher for every signature] in triton_launch.py), the grid, and the positions of its arguments, so a run calls
the launcher directly with the tensors of its buffers and its runtime scalars, not Triton's Python launch path
(binding, specialization and cache lookup per call). Once a program's block sizes are final, a program whose
kernels PyTorch's launcher loaded and whose externs are plain ATen operators runs in C instead (Note [Triton
kernels launched in C] in csrc/cuda_launch.cpp), the same launches without the Python loop. Kernels are compiled
for 16-byte aligned buffers (as every buffer the caching allocator hands out is); a run whose leaves or extern
results are not aligned takes Triton's own launch path, which compiles (once) and launches the variant they need
(in C, an unaligned extern result is copied to an aligned buffer instead).

Note [Temporaries in one allocation]
A GPT training step's program stores about 490 buffers, most of them temporaries that only its kernels write and
read. As on the cpu (Note [Run plan] in runtime/cpp.py), those live at offsets of one arena laid out once by
lifetime (runtime/arena.py), allocated per run with one ``torch.empty`` from the caching allocator and released at
the run's end: both are stream-ordered, so the next run (or anything else on the stream) reuses the bytes only
after this run's kernels. Graph outputs, and buffers an extern reads (an ATen call takes tensors), stay tensors of
their own. A kernel's pointer arguments are passed as addresses (Python ints), never as tensors: the static
launcher asks a tensor argument for ``data_ptr()`` through a Python attribute call and the driver for its device
pointer (``cuPointerGetAttribute``), about a microsecond per argument, thousands per step. Interpreted kernels and
Triton's own launch path take tensors, so for them the arena's temporaries are views of it.

Note [Tuning on the first run]
A kernel rendered with several block sizes (Note [Tuned block sizes] in codegen/triton_blocks.py) is timed at the
first run of its compiled program, on that run's own buffers: each candidate launched once to warm up, then
TUNE_REPS times between two CUDA events, and the fastest is kept (kernels sharing a function and a grid share the
choice). Timing waits for the GPU, once per program. A kernel is only ever run again where running it twice equals
running it once: one that loads a buffer it stores (``Launch.inplace``) keeps its default blocks. No tuning
happens while a CUDA graph is being captured. The choices are written into the program's record with its compiled
kernels (triton_build.py), so a later process with the same record times nothing (``triton.tuned_kernels``
counts the kernels timed).

Note [Scalars in device memory]
A CUDA graph (lazy/runtime/cuda_graph.py) replays its kernels with the arguments they were captured with, but a
graph's runtime scalars change between runs (an optimizer's bias corrections, a scheduled learning rate). So a
program built for graph replay (``scalar_memory``) renders kernels that load their scalars from two device
buffers, float64 and int64, indexed by scalar slot; a run first copies the scalars there from host memory (one
copy, outside any graph), and the kernels' arguments never change. Extern calls still take their scalars as
Python numbers (a graph replay checks they are unchanged).
"""
from __future__ import annotations

import operator
import os
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch

from .. import _C
from ..cache import disk
from ..codegen import triton as renderer
from ..codegen.triton_split import split_reductions
from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.graph import Linearized
from ..lower import Extern, lower
from ..schedule import Kernel, format_schedule, schedule
from . import cpp_native
from . import triton_build as build
from . import triton_launch as launcher
from .cpp import _raise_kernel_error, describe
from .arena import layout, nbytes, stored_by_kernels
from .arena import view as arena_view
from .externs import extern_call, run_extern
from .reference import eager_dispatch
from .reference import Program as ReferenceProgram

_KERNEL, _EXTERN = "kernel", "extern"
COLLECTIVE = "c10d_"  # the names of collective ops (lazy/distributed/collectives.py)
TUNE_REPS = 10


class Program:
    """A compiled graph: Triton kernel launches and extern calls over buffers, in step order."""

    backend = "triton"

    def __init__(self, lin: Linearized, device: torch.device, tiered: bool = False,
                 scalar_memory: Any = False, autotune: Optional[str] = None) -> None:
        """``scalar_memory``: True, False, or a function of (steps, output bytes) deciding it once the graph is
        scheduled (Note [CUDA graphs for cached programs] in runtime/cuda_graph.py)."""
        self.device = device
        self.interpret = device.type != "cuda"
        tune = config.autotune if autotune is None else autotune
        if self.interpret and device.type != "cpu":
            raise RuntimeError(f"the triton backend runs on cuda (or, interpreted, on the cpu), not on {device}")
        lowered = lower(lin, device)                           # ATen graph -> kernel IR + externs
        sched = schedule(lowered, renderer.LIMITS)             # fusion, order, buffer lifetimes
        sched = split_reductions(sched)                        # few long rows: two kernels
        if callable(scalar_memory):
            scalar_memory = scalar_memory(len(sched.steps), sum(nbytes(b) for b in lowered.outputs))
        self.scalar_memory = scalar_memory = bool(scalar_memory)
        self.kernel_ir = format_schedule(sched)
        source, variants = renderer.render(sched, scalar_memory, tune)  # kernel IR -> Triton
        self.source = source
        describe(self, lin, lowered, sched)
        self.variants = variants  # per kernel: its launches, the default blocks first (Note [Tuned block sizes])
        self.launches = [vs[0] for vs in variants]
        self.choice = [0] * len(variants)
        launches = [launch for vs in variants for launch in vs]
        dtypes = {b.id: b.dtype for s in sched.kernels for b in s.buffers()}
        build.use_cache_dir(self.interpret)
        key = disk.graph_digest(lin, "triton", "interpret" if self.interpret else "cuda",
                                "memory" if scalar_memory else "", f"tune={tune}")
        path = build.module_path(key, source)
        self._path, self._dtypes = path, dtypes
        # interpreted, the kernels run from the module (a syntax error shows here, in the caller); compiled, the
        # module is loaded only for runs that take Triton's own launch path (``_fn``)
        self.module = build.load_module(path, True) if self.interpret else None
        self.scalar_kinds = list(lowered.scalar_kinds)
        self._plan(lowered, sched)
        self._scalar_buffers(len(lin.scalars))
        self._native: Any = None  # the C runner (Note [Triton kernels launched in C]): None unbuilt, False none
        self._pending: Any = None
        self._fallback: Optional[ReferenceProgram] = None
        self._bound: Optional[List[Any]] = None
        self._untuned: set = set()
        if self.interpret or not launches:
            self._bound = []
        else:
            reqs, index = build.requests(launches, dtypes)
            record = build.read_record(key, source, len(launches), len(variants))
            if record is not None:
                self._bind(*record, key, source)
            elif not tiered or config.triton_workers <= 0:
                infos = build.compile_now(path, reqs, device)
                self._bind([infos[i] for i in index], None, key, source)
            else:  # Note [Triton compiles]: the reference executor runs the graph until the pool is done
                self._fallback = ReferenceProgram(lin, device, source=False)
                self._pending = (build.submit(path, reqs, device), index, key, source)
        metrics.bump("kernels_compiled", self.num_kernels)
        for name, n in self.externs_by_op.items():
            metrics.bump(f"extern.{name}", n)

    def _fn(self, name: str) -> Any:
        """The module's Triton function ``name`` (the module loaded at the first call)."""
        if self.module is None:
            self.module = build.load_module(self._path, self.interpret)
        return getattr(self.module, name)

    def _bind(self, infos: Sequence[Dict[str, Any]], tuned: Optional[List[int]], key: str, source: str) -> None:
        """Note [Pre-bound launches]; ``infos``: the launch info of each launch of every kernel's variants (Note
        [Compile workers without torch] in triton_worker.py); ``tuned``: block-size choices a record kept."""
        it = iter(infos)
        device = self.device.index if self.device.index is not None else torch.cuda.current_device()
        loaded: dict = {}  # launches sharing a compiled kernel and a grid share its loaded function
        kept = []  # the infos the record keeps: those of kernels compiled again replaced
        self._cands = []
        for vs in self.variants:
            cands = []
            for launch in vs:
                info = next(it)
                if launcher.statically(info) and not os.path.exists(build.cubin(info)):
                    info = build.recompile(self._path, launch, self._dtypes, self.device)
                kept.append(info)
                at = (info["hash"], info["name"], launch.grid)
                if at not in loaded:
                    if launcher.statically(info):
                        loaded[at] = launcher.load(info, build.cubin(info), launch.grid, device)
                    else:
                        ck = build.compile_jit(self._fn(launch.name), launch, self._dtypes)
                        loaded[at] = launcher.load_compiled(ck, launch.grid)
                cands.append(loaded[at])
            self._cands.append(cands)
        self._record = (key, source, kept)
        if tuned is not None and all(j < len(vs) for j, vs in zip(tuned, self.variants)):
            self.choice = list(tuned)
        else:
            self._untuned = {n for n, vs in enumerate(self.variants) if len(vs) > 1 and not vs[0].inplace}
            # with nothing to time, the choices are final now: a later process reads them and rewrites nothing
            build.write_record(key, source, kept, tuned=None if self._untuned else self.choice)
        self._bound = [cands[j] for cands, j in zip(self._cands, self.choice)]

    def choose(self, n: int, j: int) -> None:
        """Run kernel ``n`` with its ``j``-th block sizes from now on (Note [Tuning on the first run])."""
        self.choice[n] = j
        if self._bound:
            self._bound[n] = self._cands[n][j]
            self._native = None  # built again, with this kernel

    def _tune(self, n: int, args: List[Any], stream: int, chosen: dict) -> None:
        """Note [Tuning on the first run]: time kernel ``n``'s candidates on ``args`` and keep the fastest."""
        launch = self.variants[n][0]
        key = (launch.name, launch.grid)
        if key not in chosen:
            times = []
            for bound in self._cands[n]:
                bound(args, stream)  # warm up
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(TUNE_REPS):
                    bound(args, stream)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            chosen[key] = min(range(len(times)), key=times.__getitem__)
            metrics.bump("triton.tuned_kernels")
            log(2, f"tuned {launch.name}: " + ", ".join(
                f"{v.grid} programs x {v.num_warps} warps {t / TUNE_REPS * 1e3:.1f} us"
                for v, t in zip(self.variants[n], times)))
        self.choose(n, chosen[key])
        self._untuned.discard(n)

    def _plan(self, lowered: Any, sched: Any) -> None:
        """Note [Temporaries in one allocation]: steps as tuples, kernel-only temporaries at arena offsets."""
        self.num_buffers = lowered.num_buffers
        self.leaf_ids = [b.id for b in lowered.leaves]
        self.output_ids = [b.id for b in lowered.outputs]
        outputs = set(self.output_ids)
        extern_read = {b.id for s in sched.steps if isinstance(s, Extern) for b in s.inputs}
        defined, stored = stored_by_kernels(sched.steps, Kernel)
        in_arena = [b for bid, b in stored.items() if bid not in outputs and bid not in extern_read]
        self.arena_bytes, offsets = layout(in_arena, defined, sched.last_use)
        self.arena_slots = tuple((b.id, offsets[b.id], b.shape, b.dtype) for b in in_arena)
        kept = {b.id for b in in_arena}
        steps: List[tuple] = []
        self._ext_ops: List[Any] = []  # each extern step's operator, for the C runner's plan
        n = 0
        for i, step in enumerate(sched.steps):
            frees = tuple(b for b in sched.frees.get(i, ()) if b not in kept)
            if isinstance(step, Extern):
                # a collective's outputs, for a CUDA graph that launches it between its pieces (Note [Collectives
                # in a CUDA graph] in runtime/cuda_graph.py)
                between = tuple((b.id, b.shape, b.strides, b.dtype) for b in step.outputs if b is not None) \
                    if step.name.startswith(COLLECTIVE) else None
                steps.append((_EXTERN, extern_call(step), frees, between))
                self._ext_ops.append(step.fn)
                continue
            assert isinstance(step, Kernel)
            launch = self.launches[n]
            allocs = tuple((b.id, b.shape, b.dtype) for b, _, _ in step.stores if b.id not in kept)
            steps.append((_KERNEL, n, allocs, tuple(launch.buffers), tuple(launch.scalars),
                          tuple(launch.floats), frees, _float_getter(launch)))
            n += 1
        self.steps = steps
        self._values = [None] * self.num_buffers

    def _native_runner(self) -> Any:
        """The C runner of this program once its kernels are final (Note [Triton kernels launched in C] in
        csrc/cuda_launch.cpp), or False: kernels Triton's own launcher launches, a collective, an extern step that
        is not an aten operator with flat arguments, device-memory scalars (a CUDA graph's program)."""
        if not cpp_native.NATIVE or self.interpret or self.scalar_memory:
            return False
        plan: List[tuple] = []
        ops = iter(self._ext_ops)
        try:
            for step in self.steps:
                if step[0] is _KERNEL:
                    _, n, allocs, bufs, slots, _, frees, _ = step
                    bound = self._bound[n]
                    if not bound.static:
                        raise cpp_native.Unsupported(f"kernel {n} is launched by Triton's launcher")
                    params = (*bufs, *slots, *(-1 for _ in bound.hidden))
                    codes = tuple((i, tuple(shape), cpp_native.dtype_code(dtype)) for i, shape, dtype in allocs)
                    plan.append(("cu", bound.function, bound.grid, 32 * bound.num_warps, bound.shared,
                                 bound.arg_types, params, codes, frees))
                else:
                    _, call, frees, collective = step
                    if collective is not None:
                        raise cpp_native.Unsupported("a collective")
                    plan.append(cpp_native.extern_step(next(ops), call, self.scalar_kinds, frees))
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            slots = [(i, off) for i, off, _, _ in self.arena_slots]
            runner = cpp_native.make_runner(plan, self.num_buffers, (index, self.arena_bytes, slots))
        except cpp_native.Unsupported as e:
            log(3, f"triton program runs from Python: {e}")
            return False
        self._wanted = tuple(self.output_ids)
        self._launches = self.launched_kernels()
        self._index = index
        return runner

    def _scalar_buffers(self, n: int) -> None:
        """Note [Scalars in device memory]: the device buffers (float64 slots, then int64 slots, in one
        allocation), each kernel's regions of them (16-byte aligned: Note [One function per distinct kernel] in
        codegen/triton.py), and the layout a run packs its scalars in."""
        self.extern_slots = tuple(sorted({s for step in self.steps if step[0] is _EXTERN for s in step[1][6]}))
        self._scal = None
        self._scalar_args: List[List[torch.Tensor]] = [[] for _ in self.launches]
        if not self.scalar_memory or n == 0:
            return
        layouts: dict = {True: [], False: []}
        regions = []
        for launch in self.launches:
            at = {}
            for f in (True, False):
                slots = [s for s, is_float in zip(launch.scalars, launch.floats) if is_float is f]
                at[f] = len(layouts[f])
                layouts[f] += slots + [None] * (len(slots) % 2)
            regions.append(at)
        self._float_slots, self._int_slots = layouts[True], layouts[False]
        nf, ni = len(self._float_slots), len(self._int_slots)
        if nf + ni == 0:  # only extern calls take scalars: nothing to load
            return
        self._slots = tuple(-1 if s is None else s for s in self._float_slots + self._int_slots)  # -1: a pad
        self._scal = torch.zeros(nf + ni, dtype=torch.int64, device=self.device)
        sf, si = self._scal[:nf].view(torch.float64), self._scal[nf:]
        self._scalar_args = [[buf[at[f]:] for buf, f in ((sf, True), (si, False)) if f in launch.floats]
                             for launch, at in zip(self.launches, regions)]

    def load_scalars(self, scalars: Sequence[Any]) -> None:
        """Copy the runtime scalars to the device buffers (Note [Scalars in device memory]); stream-ordered."""
        if self._scal is not None:  # packed and copied in one C call (Note [Uploads in C] in csrc/upload.cpp)
            _C.upload_scalars(self._scal, tuple(scalars), self._slots, len(self._float_slots))

    def ready(self) -> bool:
        """Whether a run launches the compiled kernels (not the reference executor of a tiered compile)."""
        return self._bound is not None or (self.steps is not None and self._ready())

    def _ready(self) -> bool:
        """Whether the kernels are loaded; loads them once the pool has compiled them (Note [Triton compiles])."""
        if self._bound is not None:
            return True
        compiles, index, key, source = self._pending
        if not compiles.done():
            return False
        try:
            infos, seconds = compiles.result()
            metrics.bump("triton.compile_time_s", seconds)
            self._bind([infos[i] for i in index], None, key, source)
        except Exception as e:  # noqa: BLE001 -- a failed compile keeps the graph on the reference executor
            warnings.warn(f"lazy: the triton backend could not compile a graph ({type(e).__name__}: "
                          f"{str(e)[:500]}); it runs on the reference executor (correct, slower).", RuntimeWarning,
                          stacklevel=2)
            metrics.bump("compile_fallback")
            self._pending = None
            self._bound = None
            self.steps = None
            return False
        self._pending = None
        self._fallback = None
        log(2, f"triton kernels of a graph of {self.num_nodes} nodes loaded")
        return True

    def run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        if not self.ready():
            metrics.bump("warming_runs")  # Note [Triton compiles]: the kernels are still compiling
            return self._fallback.run(leaves, scalars)
        self.load_scalars(scalars)
        return self.launch(leaves, scalars)

    def launch(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any], count: bool = True,
               between: Optional[Any] = None) -> List[torch.Tensor]:
        """The kernels and externs in step order, the scalars already loaded (``load_scalars``): what a CUDA graph
        captures (``count``: whether the run counts in the metrics; a capture's do not). Note [Temporaries in one
        allocation]: ``ptrs`` holds every live buffer's address, ``values`` the tensors that own them (arena
        temporaries have none, but as views where a launch needs tensors). ``between(call, values, outputs)``, if
        given, stands in for each collective: it returns (buffer id, tensor) for the collective's outputs (Note
        [Collectives in a CUDA graph] in runtime/cuda_graph.py)."""
        device = self.device
        native = self._native
        if native is None and not self._untuned and self._bound is not None:
            native = self._native = self._native_runner()
        if native and count and between is None:
            values = self._values.copy()
            for i, t in zip(self.leaf_ids, leaves):
                values[i] = t
            pairs = _C.run_cuda_program(native, scalars, values, torch._C._cuda_getCurrentRawStream(self._index),
                                        self._wanted)
            if pairs is not None:  # None: a leaf not 16-byte aligned, nothing ran (the path below)
                metrics.bump_many(("executed_graphs", 1), ("executed_nodes", self.num_nodes),
                                  ("kernels_launched", self._launches), ("triton.native_runs", 1))
                outs = dict(pairs)
                return [outs[i] for i in self.output_ids]
        values: List[Any] = [None] * self.num_buffers
        ptrs: List[int] = [0] * self.num_buffers
        aligned = True
        for i, t in zip(self.leaf_ids, leaves):
            values[i] = t
            p = ptrs[i] = t.data_ptr()
            aligned = aligned and p % 16 == 0
        arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=device) if self.arena_bytes else None
        if arena is not None:
            base = arena.data_ptr()
            for i, off, _, _ in self.arena_slots:
                ptrs[i] = base + off
        if self.interpret or not aligned:  # the launch takes tensors (Note [Pre-bound launches])
            self._arena_views(values, arena)
        stream = torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else
                                                    torch.cuda.current_device()) if not self.interpret else None
        launched = 0
        tuning = self._untuned and not self.interpret and not torch.cuda.is_current_stream_capturing()
        chosen: dict = {}
        with eager_dispatch():
            for step in self.steps:
                if step[0] is _KERNEL:
                    _, n, allocs, bufs, slots, floats, frees, getter = step
                    for i, shape, dtype in allocs:
                        if values[i] is None:
                            t = values[i] = torch.empty(shape, dtype=dtype, device=device)
                            ptrs[i] = t.data_ptr()
                    launch = self.variants[n][self.choice[n]]
                    if launch.grid > 0:
                        if self.scalar_memory:
                            tail = self._scalar_args[n]
                        elif getter is not None and aligned and not self.interpret:
                            tail = getter(scalars)  # Note [Float arguments unconverted]
                        else:
                            tail = [float(scalars[s]) if f else int(scalars[s]) for s, f in zip(slots, floats)]
                        if self.interpret:
                            self._interpret(launch, [values[i] for i in bufs] + tail)
                        elif not aligned:
                            self._fn(launch.name)[(launch.grid,)](*[values[i] for i in bufs], *tail,
                                                                  num_warps=launch.num_warps, **build.OPTIONS)
                        else:
                            args = [ptrs[i] for i in bufs]  # addresses: no data_ptr() call per argument
                            args += tail
                            if tuning and n in self._untuned:
                                self._tune(n, args, stream, chosen)
                            self._bound[n](args, stream)
                        launched += 1
                else:
                    _, call, frees, collective = step
                    results = run_extern(call, values, scalars, device) if between is None or collective is None \
                        else between(call, values, collective)
                    for i, t in results:
                        values[i] = t
                        p = ptrs[i] = t.data_ptr()
                        if aligned and p % 16:
                            aligned = False
                            self._arena_views(values, arena)
                for i in frees:
                    values[i] = None
        if tuning and not self._untuned:  # every kernel is timed: the choices go into the record
            build.write_record(*self._record, tuned=self.choice)
        if count:
            metrics.bump_many(("executed_graphs", 1), ("executed_nodes", self.num_nodes),
                              ("kernels_launched", launched))
        if not aligned:
            metrics.bump("triton.unaligned_runs")  # launched through Triton's own (slower) launch path
        return [values[i] for i in self.output_ids]

    def launched_kernels(self) -> int:
        """How many kernels a run launches (kernels of an empty grid launch nothing)."""
        return sum(1 for step in self.steps
                   if step[0] is _KERNEL and self.variants[step[1]][self.choice[step[1]]].grid > 0)

    def _arena_views(self, values: List[Any], arena: torch.Tensor) -> None:
        """The arena's temporaries as tensors, for launches that take tensors rather than addresses."""
        for i, off, shape, dtype in self.arena_slots:
            values[i] = arena_view(arena, off, shape, dtype)

    def _interpret(self, launch: Any, args: List[Any]) -> None:
        from triton.runtime.errors import InterpreterError
        try:
            self._fn(launch.name)[(launch.grid,)](*args)
        except InterpreterError as e:
            if "index out of range" in str(e):  # triton_ops.HELPERS' device_assert
                _raise_kernel_error(2)
            raise


def compile_triton(lin: Linearized, device: torch.device, tiered: bool = False, scalar_memory: Any = False,
                   autotune: Optional[str] = None) -> Any:
    """The triton backend's compiler for graph_cache; falls back to the reference executor on any failure."""
    start = time.perf_counter()
    try:
        program = Program(lin, device, tiered, scalar_memory, autotune)
    except Exception as e:  # noqa: BLE001 -- any failure falls back, loudly and counted
        cause = f"{type(e).__name__}: {e}"
        metrics.bump("compile_fallback")
        log(1, f"triton compile failed, reference fallback: {cause}")
        warnings.warn(f"lazy: the triton backend could not compile a graph of {len(lin.order)} nodes "
                      f"({cause[:500]}); it runs on the reference executor (correct, slower). Set "
                      "LAZY_COMPILER=reference to silence.", RuntimeWarning, stacklevel=2)
        return ReferenceProgram(lin, device)
    metrics.bump("triton.build_time_s", time.perf_counter() - start)
    return program


# Note [Float arguments unconverted]
# A kernel's runtime scalars are its last arguments. Converting each with float() or int() in Python cost ~0.09 us
# per scalar, 10 us of the 200-op chain's 120 at 16^2 (half its run's host time). The launcher converts a float
# argument itself (PyFloat_AsDouble: a float, an int, a bool or a numpy number alike), so a kernel whose scalars
# are all float slots takes them straight from the run's scalars through one itemgetter. An int slot can hold an
# integral float (a replay's computed number) that the launcher's integer conversion rejects, so a kernel with one
# converts as before; so do the interpreter and Triton's own launch path, which specialize on argument types.
def _float_getter(launch: Any) -> Optional[Any]:
    """The scalars of a kernel whose runtime scalars are all float slots, as one call (Note [Float arguments
    unconverted]); None where it has an int slot."""
    if not all(launch.floats):
        return None
    slots = tuple(launch.scalars)
    if len(slots) == 1:
        only = slots[0]
        return lambda scalars: (scalars[only],)
    return operator.itemgetter(*slots) if slots else lambda scalars: ()
