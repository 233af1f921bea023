"""The in-memory graph cache: graph key -> compiled program, least recently used evicted first."""
from __future__ import annotations

import collections
import functools
import importlib.util
import os
import time
from typing import Any, Callable, Dict

import torch

from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.graph import Linearized

_CACHE: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
_COMPILERS: Dict[str, Callable[[Linearized, torch.device], Any]] = {}


def set_compiler(compiler: Callable[[Linearized, torch.device], Any], backend: str = "reference") -> None:
    """Register the function that turns a linearized graph into a runnable program for ``backend``."""
    _COMPILERS[backend] = compiler


def compiler_for(backend: str) -> Callable[[Linearized, torch.device], Any]:
    """The compiler of ``backend`` ('reference', 'cpp' or 'triton'), as chosen by ``lazy.config.compiler``."""
    if backend not in _COMPILERS:
        if backend == "cpp":
            from ..runtime.cpp import compile_cpp
            _COMPILERS["cpp"] = compile_cpp
        elif backend == "triton":
            from ..runtime.cuda_graph import compile_graphed
            # Note [Tiered compilation]: under 'auto', the kernels compile in workers (runtime/triton_build.py);
            # Note [CUDA graphs for cached programs]: on cuda, replayed as a CUDA graph once cached
            _COMPILERS["triton"] = compile_graphed
        elif backend == "reference":
            from ..runtime.reference import compile_reference
            _COMPILERS["reference"] = compile_reference
        else:
            raise ValueError(f"lazy.config.compiler is {backend!r}; use 'auto', 'cpp', 'triton' or 'reference' "
                             "(LAZY_COMPILER)")
    return _COMPILERS[backend]


# Note [Tiered compilation]
# A graph runs on the reference executor (one ATen call per node: no compile cost, eager's exact numerics) until its
# ``config.compile_after``-th execution, which compiles it with the chosen compiler (C++ for a cpu backing device)
# and runs compiled from then on, as TorchScript's profiling executor behind torch._lazy does. One-off graphs
# (a print, an .item(), the first step of a training loop, whose optimizer creates its state) never pay a
# compile; a training step's graph is compiled at its second step. The tier-up depends on the execution count
# only (not on what the disk cache holds); when the compiled kernels then take over depends on the compile time
# under ``compile_background`` (Note [C++ compiles in the background] in runtime/cpp_build.py) and on cuda (Note
# [Triton compiles]), and on the count only without it, where a run is reproducible, in a fresh process too.


class _Warming:
    """A graph executed fewer than ``config.compile_after`` times: its reference program and run count."""

    __slots__ = ("program", "runs")

    def __init__(self, program: Any) -> None:
        self.program, self.runs = program, 1


def backend_for(device: torch.device) -> str:
    """The compiler that ``lazy.config.compiler`` names for graphs run on ``device``: 'auto' is the C++
    compiler on the cpu, Triton on cuda (the reference executor where triton is not installed)."""
    backend = config.compiler
    if backend == "auto":
        if device.type == "cpu":
            return "cpp"
        return "triton" if device.type == "cuda" and _has_triton() else "reference"
    return backend


@functools.lru_cache(maxsize=1)
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def lookup(lin: Linearized, device: torch.device) -> tuple:
    """(program, hit) for this graph on ``device``, compiling on a miss. With ``compiler='auto'``, a graph is
    compiled at its ``compile_after``-th execution (Note [Tiered compilation]); an explicit compiler compiles at
    the first."""
    backend = backend_for(device)
    key = _cache_key(lin.key, device, backend)
    entry = _CACHE.get(key)
    if entry is not None:
        _CACHE.move_to_end(key)
        metrics.bump("graph_cache.hit")
        if type(entry) is not _Warming:
            return entry, True
        entry.runs += 1
        if entry.runs < config.compile_after:
            return entry.program, True
        metrics.bump("graph_cache.tier_up")  # not in ``compiles``: that counts new graphs (misses)
        program = _CACHE[key] = _compile(backend, lin, device, key, "tier-up")
        return program, True
    metrics.bump("graph_cache.miss")
    warm = config.compiler == "auto" and backend != "reference" and config.compile_after > 1
    if warm and backend == "triton" and device.type == "cuda":
        from ..runtime import triton_build
        if len(lin.order) >= triton_build.PRESTART_NODES:
            triton_build.start_pool()  # Note [Triton compiles]: its workers start while this graph warms up
    program = _compile("reference" if warm else backend, lin, device, key,
                       f"until run {config.compile_after}" if warm else "")
    metrics.bump("compiles")
    _insert(key, _Warming(program) if warm else program)
    return program, False


def _cache_key(key: bytes, device: torch.device, backend: str) -> tuple:
    """The cache's key of the graph key ``key`` compiled by ``backend`` for ``device``: kernels differ by the ISA
    and tuning knobs too (Note [Kernel ISA] in runtime/cpp_isa.py, Note [Tuned block sizes])."""
    return (key, device, backend, config.cpu_isa, config.autotune)


def compiled(key: bytes, device: torch.device) -> Any:
    """The compiled program cached for the graph key ``key`` on ``device`` (made most recently used), or None where
    there is none or it is still warming up (Note [Tiered compilation]): a hit as ``lookup``'s, which the caller
    counts, never a compile."""
    full = _cache_key(key, device, backend_for(device))
    entry = _CACHE.get(full)
    if entry is None or type(entry) is _Warming:
        return None
    _CACHE.move_to_end(full)
    return entry


def _compile(backend: str, lin: Linearized, device: torch.device, key: Any, why: str) -> Any:
    start = time.perf_counter()
    program = compiler_for(backend)(lin, device)
    elapsed = time.perf_counter() - start
    metrics.bump("compile_time_s", elapsed)
    log(2, f"compiled a graph of {len(lin.order)} nodes in {elapsed * 1e3:.2f} ms ({program.backend}"
           f"{', ' + why if why else ''})")
    _dump(program, key)
    return program


def _insert(key: Any, entry: Any) -> None:
    _CACHE[key] = entry
    while len(_CACHE) > config.graph_cache_size:
        _CACHE.popitem(last=False)
        metrics.bump("graph_cache.evicted")


def _dump(program: Any, key: Any) -> None:
    if not config.dump_dir:
        return
    os.makedirs(config.dump_dir, exist_ok=True)
    name = f"graph_{abs(hash(key)) & 0xFFFFFFFFFFFF:012x}_{program.backend}.txt"
    text = program.source
    kernel_ir = getattr(program, "kernel_ir", None)
    if kernel_ir is not None:
        # compiled backends: the fused kernel IR (schedule pass) ahead of the generated source, in one file
        graph = getattr(program, "graph_text", "")
        text = "/* graph:\n" + graph.replace("*/", "* /") + "\n\nfused kernel IR:\n" + \
            kernel_ir.replace("*/", "* /") + "\n*/\n" + text
    with open(os.path.join(config.dump_dir, name), "w") as f:
        f.write(text + "\n")


def latest() -> Any:
    """The program of the most recently compiled or looked-up graph (for tests, benchmarks and debugging)."""
    entry = next(reversed(_CACHE.values()))
    return entry.program if type(entry) is _Warming else entry


def size() -> int:
    return len(_CACHE)


def clear() -> None:
    """Drop every cached program."""
    _CACHE.clear()
