"""CUDA-graph replay of a compiled Triton program: ``lazy.compile(mode="reduce-overhead")`` on a cuda backing device.

Note [CUDA-graph replay]
A captured step replays one compiled program; on the GPU its host cost is the launches (hundreds of kernels and
externs, tens of microseconds each from Python). A ``GraphedProgram`` records those launches once into a CUDA graph
and then replays the whole program with one ``cudaGraphLaunch``. A graph replays fixed addresses and fixed kernel
arguments, which decides the rest:
- **Inputs** are copied into static buffers the graph reads (owned here), unless the input *is* the buffer: the
  storages a step updates in place (parameters, optimizer state) are written back into their input's buffer at the
  end of the graph, and bound to it, so a training loop copies nothing in or out for them.
- **Scalars** change between runs, so the program reads them from device memory (Note [Scalars in device memory] in
  runtime/triton.py), loaded before each replay. Extern calls take Python numbers: the graph is recaptured when one
  of theirs changes (at most ``MAX_RECAPTURES`` times; then the program runs without a graph).
- **Outputs**: tensors the call creates (its return value, a step's new gradients) are copied out of the graph's
  memory, which the next replay overwrites, in one multi-tensor copy into the copies of two runs before where
  nothing references them any more (Note [Reused outputs] in runtime/spares.py: a ``torch.empty`` each cost a GPT
  step 0.3 ms of host time), else into fresh tensors; storages it updates are bound to the static memory directly,
  and a replay that writes into the buffer a storage's leaf already holds keeps the leaf (Note [Rebinding written
  in place] in csrc/replay_io.cpp).
- **Soundness of writing in place.** A replay overwrites the static buffers, so it must not happen while anything
  else still reads the values bound to them: lazy IR recorded between two calls (``ema = 0.9 * ema + p``, unsynced)
  holds the data leaf that the last replay bound to the storage. Each leaf bound to static memory is remembered with
  its storage; a replay first checks, by reference count, that none is referenced beyond its storage, and where one
  is, runs the program without the graph instead (fresh outputs, nothing overwritten; ``cuda_graph.unsafe_runs``).
- **Not graphed**: programs with random ops (their generators are made per run). Random ops stay ungraphable
  everywhere.

Note [Collectives in a CUDA graph]
A data-parallel step records its collectives like any other op (lazy/distributed/collectives.py). Over one rank they
return their input and communicate nothing, and a captured step's graph holds them like any extern (a 2-layer d=256
GPT DDP step on one H200: 3.24 ms launched from the host, 2.35 ms replayed). Over more ranks the graph stops at
each collective: the program is captured as pieces, the kernels and externs between two collectives in one CUDA
graph each (all pieces share one memory pool and are replayed in the order they were captured, as a pool shared
between graphs requires), and a replay launches each collective from the host between the pieces, on the static
buffers the piece before it wrote, its result copied into the static buffer the piece after it reads. Two reasons:
- **NCCL in a graph hangs** on the 2-GPU H200 machines this was measured on: a graph holding an NCCL all-reduce
  hangs at its first replay on both ranks, for a captured DDP step and for PyTorch's own ``torch.cuda.graph``
  capture of one ``dist.all_reduce`` alike (torch 2.11, NCCL 2.28.9; with ``capture_error_mode`` thread_local or
  global, the c10d or the functional collective, NCCL's cuMem, P2P or SHM transports off, c10d's async error
  handling off). Only ``NCCL_GRAPH_MIXING_SUPPORT=0`` made that capture replay, a mode correct only while a
  communicator never has an outstanding graph launch followed by an ungraphed one.
- **Ranks need not agree when to graph.** A program is graphed at its second ready run, and a cached ``mark_step``
  program becomes ready when its Triton kernels have compiled (tiered compilation), at different steps on different
  ranks; a graph holding the collectives would have to be captured at the same step everywhere. With the
  collectives between the pieces every run, graphed or not, launches the same collectives in the same order, and
  capturing launches none: the warm-up run before the capture stands an empty tensor in for each collective's
  result (the capture records, it runs nothing), and the first replay after it is the run that communicates.
The price is a launch per collective from the host and a copy of its result (a DDP bucket, read and written once at
the GPU's bandwidth); NCCL overlaps nothing more either way, since a replay's pieces are stream-ordered.

Note [CUDA graphs for cached programs]
A plain ``mark_step()`` loop runs the same cached program every step, and launching it from the host cost a GPT
step 17 ms (288 kernels, 88 extern calls) for 33 ms of GPU work: added to recording, the host, not the GPU, set
the step's time. So a Triton program on cuda that the graph cache holds is replayed as a CUDA graph too
(``compile_graphed``, ``config.cuda_graphs``), with the simplest sound binding: its inputs are copied into the
graph's static buffers (one multi-tensor copy; an input that is the same tensor as at the last run, a model's
weights in an inference loop, is not copied again) and its outputs are copied out into fresh tensors; the graph's
memory is never bound to a lazy tensor, so nothing the user holds can see a replay overwrite it. The copies cost
the GPU a read and a write of the inputs and outputs (a GPT step's parameters, optimizer state and gradients: ~0.2
ms of a 33 ms step) and one more copy of each in device memory; ``LAZY_CUDA_GRAPHS=0`` launches from the host
instead. They do not pay for a program of a few memory-bound kernels (a softmax of a large tensor would pay its
bytes twice to save one launch), so only a program of at least GRAPH_MIN_STEPS steps that copies at most
COPY_BYTES_PER_STEP per step is graphed (``graph_pays``), decided once the graph is scheduled: only such a program
reads its scalars from device memory (a kernel of many scalars runs slower loading them: the 200-op chain's 120,
3x). Runs of one program, graphed or not, take turns (a lock): they share its static buffers and scalars.
A captured step (``mode="reduce-overhead"``) binds its updated storages to the graph's buffers in place instead,
as above, because the capture knows which inputs its outputs update.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from .. import _C
from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.layout import non_overlapping_and_dense
from .externs import run_extern
from .triton import COLLECTIVE

MAX_RECAPTURES = 8
# Note [CUDA graphs for cached programs]: a cached program is graphed when it has at least GRAPH_MIN_STEPS kernel
# launches and extern calls and the bytes its replay copies are at most COPY_BYTES_PER_STEP per step: a step
# launched from the host costs ~10 us or more, in which the GPU copies ~10 MB at 1 TB/s (a third of an H100's).
GRAPH_MIN_STEPS = 4
COPY_BYTES_PER_STEP = 10 << 20
_SEEDED = "seeded["  # random ops ("unseeded[" ones draw nothing)


def _externs(program: Any) -> List[str]:
    names = [str(name) for name in getattr(program, "externs_by_op", {})]
    return [name[len("lazy."):] if name.startswith("lazy.") else name for name in names]


def _ranks() -> int:
    """The ranks of the default process group (1 without torch.distributed)."""
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def ungraphable(program: Any) -> Optional[str]:
    """Why ``program`` cannot be replayed as a CUDA graph, or None."""
    for text in _externs(program):
        if text.startswith(_SEEDED):
            return f"it calls {text}"
    return None


def graphed_between(program: Any) -> bool:
    """Whether ``program``'s graph stops at its collectives, which a replay launches from the host between its
    pieces: where they communicate, over more than one rank (Note [Collectives in a CUDA graph])."""
    return _ranks() > 1 and any(text.startswith(COLLECTIVE) for text in _externs(program))


class GraphedProgram:
    """A Triton program (built with ``scalar_memory``) replayed as a CUDA graph; the same ``run`` interface."""

    def __init__(self, program: Any, aliases: Dict[int, int], mutated: Set[int], const: Sequence[bool],
                 optional: bool = False) -> None:
        self.program = program
        self.optional = optional      # a cached program's graph (Note [CUDA graphs for cached programs])
        self.aliases = aliases        # output index -> index of the input whose storage it updates in place
        self.mutated = mutated        # output indices bound to storages that existed before the call
        self.const = list(const)      # inputs that are the same tensor at every run (the graph reads them directly)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static_in: List[torch.Tensor] = []
        self.static_out: List[torch.Tensor] = []
        self.seen: List[Any] = []
        self.extern_values: Optional[tuple] = None
        self.outstanding: List[Tuple[Any, Any]] = []   # (storage, data leaf over static memory)
        self.static_ids: Set[int] = set()
        self.ready_runs = 0
        self.kernels = 0
        self.static_outputs = set(aliases) | set(mutated)  # outputs a replay may return as static memory
        self.out_template: List[Any] = []
        self.created: List[int] = []
        self.created_static: List[torch.Tensor] = []
        self.recaptures = 0
        self.created_allocs: Optional[tuple] = None
        self.created_spares: List[list] = []
        self.created_ptrs: Any = None
        device = getattr(program, "device", None)
        self.empty = lambda shape, dtype: torch.empty(shape, dtype=dtype, device=device)
        self.disabled = ungraphable(program)
        self.between = graphed_between(program)
        # what a replay runs in turn: graphs, and (collective, its inputs, its static results) between them
        self.pieces: List[Any] = []
        self.lock = threading.Lock()  # one run at a time (Note [CUDA graphs for cached programs])

    def __getattr__(self, name: str) -> Any:  # the program's description (num_kernels, source, ...)
        return getattr(self.__dict__["program"], name)

    # ---- binding outputs (lazy/capture/replay.py) ----

    def bound(self, tensors: tuple, outs: List[torch.Tensor], indices: tuple) -> None:
        """Remember the data leaves bound to the storages of ``tensors`` (``outs[indices[j]]``, as
        ``_C.replay_writes`` binds them) that hold static memory, once each."""
        static, candidates = self.static_ids, self.static_outputs
        known = {id(leaf) for _, leaf in self.outstanding}
        for t, i in zip(tensors, indices):
            if i in candidates and id(outs[i]) in static:
                st = t._lz_st
                if id(st.value) not in known:
                    self.outstanding.append((st, st.value))

    def _overwritable(self) -> bool:
        """Whether no leaf bound to static memory is referenced beyond its storage (Note [CUDA-graph replay]).
        Leaves still bound stay remembered: a replay writes into them again (Note [Rebinding written in place] in
        csrc/replay_io.cpp)."""
        safe, self.outstanding = _C.leaves_unshared(self.outstanding)
        return safe

    # ---- running ----

    def run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        # one run at a time, graphed or not: runs share the static buffers and the device memory of the scalars
        with self.lock:
            return self._run(leaves, scalars)

    def _run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        program = self.program
        if self.disabled is not None or not program.ready() or (self.optional and not config.cuda_graphs):
            return program.run(leaves, scalars)
        self.ready_runs += 1
        if self.ready_runs < 2:
            return program.run(leaves, scalars)  # warm-up
        if not self._overwritable():
            metrics.bump("cuda_graph.unsafe_runs")
            return program.run(leaves, scalars)
        values = tuple(scalars[s] for s in program.extern_slots)
        if self.graph is None or values != self.extern_values:
            if self.graph is not None:
                self.recaptures += 1
                metrics.bump("cuda_graph.recaptures")
                if self.recaptures > MAX_RECAPTURES:
                    self._disable(f"the scalars of its extern calls changed more than {MAX_RECAPTURES} times")
                    return program.run(leaves, scalars)
            try:
                self._capture(leaves, scalars)
            except Exception as e:  # noqa: BLE001 -- a program the graph cannot hold runs plainly, said once
                self._disable(f"capturing it failed ({type(e).__name__}: {str(e)[:300]})")
                return program.run(leaves, scalars)
            self.extern_values = values
        self._copy_inputs(leaves)
        program.load_scalars(scalars)
        self._replay(scalars)
        metrics.bump_many(("cuda_graph.replays", 1), ("executed_graphs", 1), ("executed_nodes", self.num_nodes),
                          ("kernels_launched", self.kernels))
        return self._outputs()

    def _replay(self, scalars: Sequence[Any]) -> None:
        """The graph, or its pieces with the collectives between them (Note [Collectives in a CUDA graph])."""
        if not self.between:
            self.graph.replay()
            return
        device = self.program.device
        for piece in self.pieces:
            if type(piece) is not tuple:
                piece.replay()
                continue
            call, inputs, static = piece
            results = run_extern(call, inputs, scalars, device)
            torch._foreach_copy_([t for _, t in static], [t for _, t in results])

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self.graph = None
        self.pieces = []
        metrics.bump("cuda_graph.disabled")
        log(1, f"lazy: a program of {program_size(self.program)} runs without a CUDA graph: {reason}")

    def _copy_inputs(self, leaves: Sequence[torch.Tensor]) -> None:
        """Copy each input into its static buffer unless it is the buffer or the tensor copied at the last run
        (data leaves are immutable: a lazy update binds a new one), in one multi-tensor copy. ``seen`` holds weak
        references: it must keep no input alive, nor stop one being reused as a spare (Note [Reused outputs])."""
        dst, src = _C.stale_inputs(leaves, self.static_in, self.seen)
        if dst:
            torch._foreach_copy_(dst, src)

    def _outputs(self) -> List[torch.Tensor]:
        """The run's outputs: the static buffers a storage is bound to, fresh copies of the others."""
        out = list(self.out_template)
        created = self.created
        if created:  # copied out of the graph's memory in one multi-tensor launch (a step's new .grad tensors)
            static = self.created_static
            if self.created_allocs is not None:  # into outputs of earlier runs nothing sees any more
                fresh = [None] * len(static)
                spares = self.created_spares if config.spare_bytes > 0 else None
                reused = _C.take_buffers(self.created_allocs, spares, fresh, ctypes.addressof(self.created_ptrs),
                                         self.empty)
                if reused:
                    metrics.bump("cuda_graph.reused_outputs", reused)
            else:
                fresh = [torch.empty_like(o) for o in static]
            torch._foreach_copy_(fresh, static)
            for i, t in zip(created, fresh):
                out[i] = t
        seen = self.seen
        for k in self.aliases.values():
            seen[k] = None  # overwritten by the graph: a tensor copied there before is no longer what it holds
        return out

    def _capture(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> None:
        program = self.program
        device = program.device
        if not self.static_in:
            for k, t in enumerate(leaves):
                if not self.const[k] and not non_overlapping_and_dense(tuple(t.shape), t.stride()):
                    raise RuntimeError(f"input {k} is not dense (shape {tuple(t.shape)}, stride {t.stride()})")
                self.static_in.append(t if self.const[k] else
                                      torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device))
            self.seen = [None] * len(leaves)
        self._copy_inputs(leaves)
        program.load_scalars(scalars)
        stream = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(stream)
        # no collective runs at a capture: empty tensors stand in for their results in the warm-up
        between = (lambda call, values, outputs: _empty_results(outputs, device)) if self.between else None
        with torch.cuda.stream(side):  # the warm-up torch.cuda.graph asks for: allocator, library workspaces
            program.launch(self.static_in, scalars, count=False, between=between)
        stream.wait_stream(side)
        if self.between:
            outs = self._capture_pieces(scalars)
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other threads may record meanwhile
                outs = self._launch_captured(scalars, None)
            self.graph = graph
        self.static_out = outs
        self.kernels = program.launched_kernels()
        # what _outputs returns, fixed by the plan: an updated storage's input buffer, a mutated storage's output
        # buffer, else (None) a fresh copy
        self.out_template = [self.static_in[self.aliases[i]] if i in self.aliases else o if i in self.mutated else
                             None for i, o in enumerate(outs)]
        self.created = [i for i, o in enumerate(self.out_template) if o is None]
        self.created_static = [outs[i] for i in self.created]
        # Note [Reused outputs] (runtime/spares.py) for the copies out: contiguous ones only, as spares are
        self.created_allocs = tuple((k, tuple(o.shape), o.dtype) for k, o in enumerate(self.created_static)) \
            if all(o.is_contiguous() for o in self.created_static) else None
        self.created_spares = [[] for _ in self.created]
        self.created_ptrs = (ctypes.c_void_p * max(1, len(self.created)))()
        self.static_ids = {id(t) for t in self.static_in} | {id(o) for o in outs}
        metrics.bump("cuda_graph.captures")

    def _launch_captured(self, scalars: Sequence[Any], between: Any) -> List[torch.Tensor]:
        """The program's launches as a capture records them, and the updated storages written back in place."""
        outs = self.program.launch(self.static_in, scalars, count=False, between=between)
        for i, k in self.aliases.items():
            self.static_in[k].copy_(outs[i])
        return outs

    def _capture_pieces(self, scalars: Sequence[Any]) -> List[torch.Tensor]:
        """Note [Collectives in a CUDA graph]: one graph per stretch between collectives, in one memory pool; each
        collective's inputs (the buffers the piece before it wrote) and its static results (allocated outside the
        pool: no piece's allocation may take them) kept for the replays."""
        device = self.program.device
        pool = torch.cuda.graph_pool_handle()
        pieces: List[Any] = []
        side = torch.cuda.Stream(device)
        torch.cuda.synchronize(device)

        def begin() -> None:
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            pieces.append(graph)

        def end() -> None:
            with warnings.catch_warnings():  # a stretch with nothing to launch (two collectives in a row) is empty
                warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
                pieces[-1].capture_end()

        def collective(call: tuple, values: List[Any], outputs: tuple) -> List[tuple]:
            end()
            inputs: List[Any] = [None] * len(values)
            for i in call[4]:  # extern_call's input buffer ids
                inputs[i] = values[i]
            static = _empty_results(outputs, device)
            pieces.append((call, inputs, static))
            begin()
            return static

        with torch.cuda.stream(side):
            begin()
            try:
                outs = self._launch_captured(scalars, collective)
            finally:
                end()
        torch.cuda.current_stream(device).wait_stream(side)
        self.pieces = pieces
        self.graph = pieces[-1]
        metrics.bump("cuda_graph.pieces", sum(1 for p in pieces if type(p) is not tuple))
        return outs


def _empty_results(outputs: tuple, device: torch.device) -> List[tuple]:
    """(buffer id, empty tensor) for a collective's outputs (buffer id, shape, strides, dtype): what stands in for its
    results at a capture's warm-up, and the static buffers a replay copies them into."""
    return [(i, torch.empty_strided(shape, strides, dtype=dtype, device=device)) for i, shape, strides, dtype in outputs]


def program_size(program: Any) -> str:
    return f"{getattr(program, 'num_kernels', '?')} kernels and {getattr(program, 'num_externs', '?')} externs"


def graphed(program: Any, plan: Any) -> Any:
    """``program`` wrapped for CUDA-graph replay of a capture ``plan`` (lazy/capture/finalize.py), or ``program``
    itself where it cannot be (not a Triton program on cuda)."""
    if getattr(program, "backend", None) != "triton" or program.device.type != "cuda" or \
            not getattr(program, "scalar_memory", False):
        return program
    storages = [e for kind, e in plan.inputs]
    kinds = [kind for kind, _ in plan.inputs]
    aliases: Dict[int, int] = {}
    leaves = plan.lin.leaves
    outputs = [plan.lin.order[p] for p in plan.lin.outputs]
    for i, e in plan.mutated:
        for k, (kind, src) in enumerate(zip(kinds, storages)):
            if kind == "storage" and src is e and k not in aliases.values() and \
                    _same_layout(leaves[k], outputs[i]):
                aliases[i] = k
                break
    return GraphedProgram(program, aliases, {i for i, _ in plan.mutated}, [kind == "const" for kind in kinds])


def _same_layout(data: torch.Tensor, out: Any) -> bool:
    """Whether a graph output (node ``out``) can be written into the input buffer of ``data`` (same shape and
    dtype; outputs are contiguous)."""
    return tuple(data.shape) == tuple(out.shape) and data.dtype == out.dtype and data.is_contiguous()


def compile_graphed(lin: Any, device: torch.device) -> Any:
    """The graph cache's Triton compiler: the program, wrapped for CUDA-graph replay on cuda (Note [CUDA graphs for
    cached programs]) unless ``config.cuda_graphs`` is off or the graph fell back to the reference executor."""
    from .triton import compile_triton
    if not config.cuda_graphs or device.type != "cuda":
        return compile_triton(lin, device, tiered=config.compiler == "auto")
    # decided once the graph is scheduled: only a program that will be graphed reads its scalars from memory (a
    # kernel of many scalars, a 200-op chain, runs ~3x slower loading them)
    input_bytes = sum(t.numel() * t.element_size() for t in lin.leaves)
    program = compile_triton(lin, device, tiered=config.compiler == "auto",
                             scalar_memory=lambda steps, output_bytes: graph_pays(steps, output_bytes + input_bytes))
    if not getattr(program, "scalar_memory", False):  # not worth a graph, or fell back to the reference executor
        return program
    return GraphedProgram(program, {}, set(), [False] * len(lin.leaves), optional=True)


def graph_pays(steps: int, copied_bytes: int) -> bool:
    """Whether replaying a program of ``steps`` kernel launches and extern calls as a CUDA graph that copies
    ``copied_bytes`` in and out saves more host time than the copies cost the GPU (Note [CUDA graphs for cached
    programs])."""
    return steps >= GRAPH_MIN_STEPS and copied_bytes <= steps * COPY_BYTES_PER_STEP
