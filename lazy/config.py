"""Every knob of lazy, declared once: name, default, environment variable, help.

Read a knob as ``lazy.config.<name>``; override it for a block with ``with lazy.config.override(name=value):``.
Environment variables are read once, when this module is imported.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import _C


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    env: str
    help: str
    parse: Callable[[str], Any] = str


def _bool(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


AUTOTUNE = ("off", "default", "max")


KNOBS = (
    Knob("backing_device", "cpu", "LAZY_BACKING_DEVICE",
         "Device that runs compiled graphs and holds synced data: 'cpu' or 'cuda[:N]'."),
    Knob("compiler", "auto", "LAZY_COMPILER",
         "How graphs are compiled: 'cpp' (fused C++/OpenMP kernels), 'triton' (fused Triton kernels: on a CUDA "
         "backing device, or interpreted on the cpu), 'reference' (each node through ATen), or 'auto' (cpp on a cpu "
         "backing device, triton on cuda, reference where triton is not installed)."),
    Knob("async_execution", True, "LAZY_ASYNC",
         "1, the default: on a cpu backing device a mark_step launches its graph on a worker thread and returns; only "
         "reading data (.cpu(), .item(), print, bool) waits, and lazy.wait_device_ops() waits for all (on cuda a sync "
         "returns once its program is enqueued anyway). 0: every sync runs its graph before returning, on all of the "
         "calling thread's threads (Note [Asynchronous execution]).", _bool),
    Knob("async_threads", 0, "LAZY_ASYNC_THREADS",
         "OpenMP/MKL threads of a mark_step's program while async_execution is on, launched or run in place; 0, the "
         "default: one fewer than the calling thread's torch.get_num_threads(), at least 1 (Note [Thread budget of "
         "the worker]).", int),
    Knob("async_min_run_us", 150.0, "LAZY_ASYNC_MIN_RUN_US",
         "With async_execution: a program whose fastest synchronous run took less than this many microseconds keeps "
         "running synchronously (launching it would cost the calling thread more than it overlaps: Note [Programs "
         "too short to launch]); 0 launches every program after its first run.", float),
    Knob("capture_verify", False, "LAZY_CAPTURE_VERIFY",
         "lazy.compile: run every replay and a plain run of the same call, and raise on the first difference "
         "(outputs, tensors and Python state it writes).", _bool),
    Knob("compile_after", 2, "LAZY_COMPILE_AFTER",
         "With compiler 'auto': the execution of a graph that compiles it; the ones before run on the reference "
         "executor (1: compile at the first execution; 2, the default: at the second).", int),
    Knob("compile_background", True, "LAZY_COMPILE_BACKGROUND",
         "With compiler 'auto' on the cpu: a graph's C++ library builds in the background while the graph runs on "
         "the reference executor (Note [C++ compiles in the background]); 0: the run that compiles waits for g++.",
         _bool),
    Knob("compile_nice", 10, "LAZY_COMPILE_NICE",
         "With compile_background: the niceness (1-19) of the background C++ compiler processes, so that they take "
         "what the steps leave of the cores (Note [Background builds yield the cores]); 0: the caller's priority.",
         int),
    Knob("cuda_graphs", True, "LAZY_CUDA_GRAPHS",
         "Triton backend on cuda: a cached graph's program replays as one CUDA graph from its second compiled run, "
         "its inputs copied into the graph's memory and its outputs out of it (Note [CUDA graphs for cached "
         "programs]); 0: every run launches its kernels from the host.", _bool),
    Knob("autotune", "default", "LAZY_AUTOTUNE",
         "Triton backend on cuda: block sizes tried per kernel at its first run, the fastest kept and cached "
         "(Note [Tuned block sizes]): 'off', 'default' (a few for each large reduction) or 'max' (more, pointwise "
         "kernels too; what lazy.compile(mode='max-autotune') uses)."),
    Knob("cache_dir", "~/.cache/lazy", "LAZY_CACHE_DIR",
         "Directory of the persistent cache of generated sources and compiled libraries ('' disables it)."),
    Knob("cxx", "g++", "LAZY_CXX", "The C++ compiler the cpp backend runs."),
    Knob("cpu_isa", "native", "LAZY_CPU_ISA",
         "Instruction set of the cpp backend's kernels: 'native' (all this CPU has), 'avx512', 'avx2' (no AVX-512 "
         "instruction, also on an AVX-512 machine), 'x86-64-v2/v3/v4' or 'generic' (the compiler's default)."),
    Knob("debug", 0, "LAZY_DEBUG", "Logging level 0..4: 1 syncs, 2 compiles, 3 graph details, 4 every traced op.",
         int),
    Knob("dump_dir", "", "LAZY_DUMP_DIR", "If set, write the IR of every compiled graph into this directory."),
    Knob("logs", "", "LAZY_LOGS",
         "Comma-separated topics logged to stderr as they happen: graph_breaks, recompiles, guards, output_code "
         "(lazy.compile), syncs, compiles."),
    # NOTE: a GPT step's 78 distinct kernels reached Triton after 13.0 s with 4 workers, 10.9 s with 8 (H200 host,
    # 16 cores); each worker takes a core
    Knob("triton_workers", max(1, min(8, (os.cpu_count() or 2) // 2)), "LAZY_TRITON_WORKERS",
         "Processes compiling Triton kernels while graphs run on the reference executor (compiler 'auto'); 0 "
         "compiles in the calling thread. Default: half the CPUs, at most 8.", int),
    Knob("graph_cache_size", 1024, "LAZY_GRAPH_CACHE_SIZE", "Entries of the in-memory graph cache (LRU).", int),
    Knob("spare_bytes", 256 << 20, "LAZY_SPARE_BYTES",
         "Bytes of the outputs of their last runs that compiled programs keep to write the next runs' outputs into, "
         "once nothing else references them (Note [Reused outputs]); the programs run last keep theirs. 0: every "
         "output is fresh memory.", int),
    Knob("strict", False, "LAZY_STRICT",
         "Raise on every implicit sync (.item(), .cpu(), print, bool, data-dependent ops) instead of syncing.", _bool),
    Knob("warn_fallback", True, "LAZY_WARN_FALLBACK",
         "Warn once per op that cannot be recorded and runs eagerly on the backing device.", _bool),
)


class _Config:
    """Attribute access to the knobs; values come from the environment or the defaults."""

    def __init__(self) -> None:
        for knob in KNOBS:
            raw = os.environ.get(knob.env)
            self._set(knob.name, knob.default if raw is None else knob.parse(raw))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _NAMES:
            raise AttributeError(f"lazy.config has no knob {name!r}; knobs: {sorted(_NAMES)}")
        self._set(name, value)

    def _set(self, name: str, value: Any) -> None:
        if name == "autotune" and value not in AUTOTUNE:
            raise ValueError(f"lazy.config.autotune (LAZY_AUTOTUNE) must be 'off', 'default' or 'max', not {value!r}")
        object.__setattr__(self, name, value)
        if name == "debug":
            # The C fast path of the recorder (csrc/record.cpp) logs nothing: level 4 (every traced op) turns it off.
            _C.set_fast_path(int(value) < 4)

    @contextlib.contextmanager
    def override(self, **values: Any) -> Iterator[None]:
        """Temporarily set knobs: ``with lazy.config.override(strict=True): ...``."""
        old = {name: getattr(self, name) for name in values}
        try:
            for name, value in values.items():
                setattr(self, name, value)
            yield
        finally:
            for name, value in old.items():
                self._set(name, value)

    def describe(self) -> str:
        """One line per knob: name, current value, env var and help."""
        return "\n".join(f"{k.name} = {getattr(self, k.name)!r}  [{k.env}]  {k.help}" for k in KNOBS)


_NAMES = frozenset(k.name for k in KNOBS)
config = _Config()
