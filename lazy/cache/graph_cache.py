"""The in-memory graph cache: graph key -> compiled program, least recently used evicted first."""
from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Optional

import torch

from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.graph import Linearized

_CACHE: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
_compiler: Optional[Callable[[Linearized, torch.device], Any]] = None


def set_compiler(compiler: Callable[[Linearized, torch.device], Any]) -> None:
    """The function that turns a linearized graph into a runnable program (the reference executor for now)."""
    global _compiler
    _compiler = compiler


def lookup(lin: Linearized, device: torch.device) -> tuple:
    """(program, hit) for this graph on ``device``, compiling on a miss."""
    key = (lin.key, device)
    program = _CACHE.get(key)
    if program is not None:
        _CACHE.move_to_end(key)
        metrics.bump("graph_cache.hit")
        return program, True
    metrics.bump("graph_cache.miss")
    start = time.perf_counter()
    program = _compiler(lin, device)
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
    with open(os.path.join(config.dump_dir, name), "w") as f:
        f.write(program.source + "\n")


def size() -> int:
    return len(_CACHE)


def clear() -> None:
    """Drop every cached program."""
    _CACHE.clear()
