"""The in-memory graph cache: graph key -> compiled program, least recently used evicted first."""
from __future__ import annotations

import collections
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
    """The compiler of ``backend`` ('reference' or 'cpp'), as chosen by ``lazy.config.compiler``."""
    if backend not in _COMPILERS:
        if backend == "cpp":
            from ..runtime.cpp import compile_cpp
            _COMPILERS["cpp"] = compile_cpp
        elif backend == "reference":
            from ..runtime.reference import compile_reference
            _COMPILERS["reference"] = compile_reference
        else:
            raise ValueError(f"lazy.config.compiler is {backend!r}; use 'reference' or 'cpp' (LAZY_COMPILER)")
    return _COMPILERS[backend]


def lookup(lin: Linearized, device: torch.device) -> tuple:
    """(program, hit) for this graph on ``device``, compiling on a miss."""
    backend = config.compiler
    key = (lin.key, device, backend)
    program = _CACHE.get(key)
    if program is not None:
        _CACHE.move_to_end(key)
        metrics.bump("graph_cache.hit")
        return program, True
    metrics.bump("graph_cache.miss")
    start = time.perf_counter()
    program = compiler_for(backend)(lin, device)
    elapsed = time.perf_counter() - start
    metrics.bump("compiles")
    metrics.bump("compile_time_s", elapsed)
    log(2, f"compiled a graph of {len(lin.order)} nodes in {elapsed * 1e3:.2f} ms ({program.backend})")
    _dump(program, key)
    _CACHE[key] = program
    while len(_CACHE) > config.graph_cache_size:
        _CACHE.popitem(last=False)
        metrics.bump("graph_cache.evicted")
    return program, False


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


def size() -> int:
    return len(_CACHE)


def clear() -> None:
    """Drop every cached program."""
    _CACHE.clear()
