"""Loading and compiling the Triton module of a graph: the module file, Triton compiles (in a worker pool), and
the persistent record of compiled kernels.

Note [Triton compiles]
A Triton compile takes seconds per kernel, so with the default tiered compiler a graph's Triton program does not
wait for them: its kernels compile in a pool of worker processes (``triton_workers``; spawned, so a worker has
a CUDA context of its own and the parent's is never forked), each compile filling Triton's own cache, which
lives under lazy's cache directory (``<cache_dir>/triton``: created 0700 and refused if foreign, as
cache/disk.py does). Until every kernel of the graph is compiled the program runs on the reference executor;
then the parent loads the kernels from that cache (milliseconds) and runs them from then on. Spawned workers take
seconds to start (torch, Triton, a CUDA context), so the pool starts at the first graph of PRESTART_NODES nodes or
more that will tier up (graph_cache.lookup): a training step's first graph, whose steady-state successor tiers up a
step later. A graph compiled at its first run (``compiler='triton'``, not tiered) waits for its kernels, but
compiles them in the pool too when they are POOL_MIN_COMPILES or more (a GPT step's kernels and their tuning
candidates take tens of seconds one after another).
A record ``<key>.triton.json`` keeps the sha256 of the module's source and of every file of each compiled kernel
in Triton's cache (written atomically, last). A later process whose record matches its source and files loads
its kernels at once, in the calling thread (it compiles nothing: ``triton.compiles`` stays 0); a record that
does not match (truncated, corrupt, another source) is counted as ``disk_cache.corrupt``, the kernels' cache
directories are removed and the kernels compile again.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..cache import disk
from ..config import config
from ..debug import metrics

_POOL: Optional[concurrent.futures.ProcessPoolExecutor] = None
PRESTART_NODES = 256
POOL_MIN_COMPILES = 8  # a graph compiled at its first run (not tiered) uses the pool from this many compiles on
# Triton's compile options of every kernel. NOTE: no overflow checks, which a kernel compiled with debug (one with
# index checks) would otherwise assert on: integer arithmetic wraps, as eager's does.
OPTIONS = {"num_stages": 1, "sanitize_overflow": False}


def triton_cache_dir() -> Optional[str]:
    """Triton's cache directory, inside lazy's (None when lazy's disk cache is disabled or refused)."""
    root = disk.cache_dir()
    if root is None:
        return None
    path = os.path.join(root, "triton")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def use_cache_dir(interpret: bool) -> None:
    """Point Triton's cache at lazy's (Note [Triton compiles]); inherited by the worker processes. Before triton
    is first imported, choose its interpreter if the kernels run on the cpu."""
    if interpret and "triton" not in sys.modules:
        # NOTE: Triton decides at import whether its own library functions (tl.zeros, tl.sum, ...) are interpreted
        os.environ["TRITON_INTERPRET"] = "1"
    path = triton_cache_dir()
    if path is None:
        path = tempfile.mkdtemp(prefix="lazy-triton-")
    os.environ["TRITON_CACHE_DIR"] = path
    try:
        from triton import knobs
        knobs.cache.dir = path
    except (ImportError, AttributeError):  # older Triton reads the environment variable only
        pass


def module_path(key: str, source: str) -> str:
    """The path of the graph's module file (in the cache directory, else a private temp directory)."""
    root = disk.cache_dir()
    if root is None:
        root = tempfile.mkdtemp(prefix="lazy-triton-")
    path = os.path.join(root, f"lz_{key[:32]}.py")
    data = source.encode()
    try:
        with open(path, "rb") as f:
            same = f.read() == data
    except OSError:
        same = False
    if not same:
        disk._atomic_write(path, data)
    return path


def load_module(path: str, interpret: bool) -> Any:
    """Execute the generated module with its loader globals (codegen/triton.py: ``_kernel``, ``_jit``, ``M``)."""
    import triton
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    if interpret:
        from triton.runtime import interpreter
        from triton.runtime.interpreter import InterpretedFunction
        # device_assert (an index out of range: triton_ops.HELPERS) checks, as in a kernel compiled with debug; no
        # overflow checks: integer arithmetic wraps, as eager's does
        interpreter.interpreter_builder.options = interpreter.InterpreterOptions(debug=True, sanitize_overflow=False)
        if not isinstance(triton.language.zeros, InterpretedFunction):
            raise RuntimeError("the triton backend runs on the cpu under Triton's interpreter, but triton was "
                               "imported without it: set TRITON_INTERPRET=1 before importing triton (or use "
                               "compiler 'cpp' on the cpu)")

        from ..codegen import triton_interp
        mod._jit = InterpretedFunction
        mod._kernel = lambda names, debug: InterpretedFunction
        mod.M = triton_interp
    else:
        from triton.language.extra import libdevice
        mod._jit = triton.jit
        mod._kernel = lambda names, debug: (lambda fn: triton.jit(fn, do_not_specialize=names, debug=debug))
        mod.M = libdevice
    spec.loader.exec_module(mod)
    return mod


def warm_args(launch: Any, dtypes: Dict[int, Any]) -> List[Any]:
    """Arguments that specialize a kernel as a run does (16-byte aligned buffers; scalars are never
    specialized): dtypes stand for tensors (Triton's warmup takes them so), scalar buffers included."""
    if launch.memory:
        return [dtypes[b] for b in launch.buffers] + launch.scalar_buffers()
    return [dtypes[b] for b in launch.buffers] + [0.0 if f else 0 for f in launch.floats]


def compile_kernels(path: str, launches: Sequence[Any], dtypes: Dict[int, Any]) -> List[Any]:
    """Compile (or load from Triton's cache) every kernel of the module at ``path``: the CompiledKernels."""
    mod = load_module(path, interpret=False)
    out = []
    done: Dict[tuple, Any] = {}  # launches sharing a function and a signature share the compile
    for launch in launches:
        args = warm_args(launch, dtypes)
        key = _compile_key(launch, args)
        if key not in done:
            done[key] = getattr(mod, launch.name).warmup(*args, grid=(1,), **OPTIONS, num_warps=launch.num_warps)
        out.append(done[key])
    return out


def _distinct(launches: Sequence[Any], dtypes: Dict[int, Any]) -> List[Any]:
    """One launch per distinct compile (Note [One function per distinct kernel] in codegen/triton.py)."""
    return list({_compile_key(launch, warm_args(launch, dtypes)): launch for launch in launches}.values())


def distinct_compiles(launches: Sequence[Any], dtypes: Dict[int, Any]) -> int:
    return len(_distinct(launches, dtypes))


def _compile_key(launch: Any, args: List[Any]) -> tuple:
    """What a Triton compile of a launch depends on: its function, argument types and options."""
    return (launch.name, tuple(str(a) for a in args), launch.num_warps)


def _worker(path: str, launches: Sequence[Any], dtypes: Dict[int, Any], cache: str) -> float:
    os.environ["TRITON_CACHE_DIR"] = cache
    start = time.perf_counter()
    for ck in compile_kernels(path, launches, dtypes):
        # NOTE: also builds the kernel's launcher, a C module Triton compiles per signature into its cache (about
        # a second each: 9.5 s of a GPT step's 78 kernels when the parent built them one after another)
        ck._init_handles()
    return time.perf_counter() - start


class Compiles:
    """The compiles of one module's kernels, spread over the pool's workers: done when every share is."""

    def __init__(self, futures: List[concurrent.futures.Future]) -> None:
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self) -> float:
        """Seconds of compiling, summed over the workers; raises a worker's error."""
        return sum(f.result() for f in self.futures)


def _pool() -> concurrent.futures.ProcessPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ProcessPoolExecutor(max_workers=max(1, config.triton_workers),
                                                       mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_shutdown)
    return _POOL


def _warm_worker(cache: str) -> None:
    """A worker's start: Triton imported and the GPU's target known, ahead of its first compile."""
    os.environ["TRITON_CACHE_DIR"] = cache
    import triton
    triton.runtime.driver.active.get_current_target()


def start_pool() -> None:
    """Start the workers now, so they are up when a graph tiers up (Note [Triton compiles]); once per process."""
    if _POOL is not None or config.triton_workers <= 0:
        return
    use_cache_dir(False)
    pool = _pool()
    with _main_hidden():
        for _ in range(max(1, config.triton_workers)):
            pool.submit(_warm_worker, os.environ["TRITON_CACHE_DIR"])


def submit(path: str, launches: Sequence[Any], dtypes: Dict[int, Any]) -> Compiles:
    """Compile the module's kernels in the worker pool (Note [Triton compiles]), its kernels dealt round-robin to
    the workers, so a graph of many kernels compiles in parallel."""
    workers = max(1, config.triton_workers)
    pool = _pool()
    distinct = _distinct(launches, dtypes)
    metrics.bump("triton.compiles", len(distinct))
    shares = [list(distinct[i::workers]) for i in range(min(workers, len(distinct)))]
    with _main_hidden():  # a submit may start workers
        return Compiles([pool.submit(_worker, path, share, dict(dtypes), os.environ["TRITON_CACHE_DIR"])
                         for share in shares])


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Note [Workers never run the user's script]: a spawned worker re-imports the parent's ``__main__`` module by
    its path, which runs a training script's top level again in every worker (and fails in one that lacks the
    ``if __name__ == "__main__"`` guard). The workers need nothing of it, so while they start, ``__main__`` is an
    empty module: multiprocessing finds no path or name to import."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _shutdown() -> None:
    """At exit, before the interpreter tears down the modules the pool's manager thread needs."""
    if _POOL is not None:
        _POOL.shutdown(wait=False, cancel_futures=True)


# ---- the record of compiled kernels (Note [Triton compiles]) ---------------------------------------------------

def _group(kernel_hash: str) -> str:
    """Triton's cache directory of a compiled kernel (named after its hash, base32-encoded since Triton 3.2)."""
    root = os.environ.get("TRITON_CACHE_DIR", "")
    try:
        from triton.runtime.cache import _base32
        name = _base32(kernel_hash)
    except (ImportError, ValueError):
        name = kernel_hash
    path = os.path.join(root, name)
    return path if os.path.isdir(path) else os.path.join(root, kernel_hash)


def _files(kernel_hash: str) -> Dict[str, str]:
    """sha256 of each file Triton keeps for a compiled kernel (its lock and temporaries aside)."""
    group = _group(kernel_hash)
    found = {}
    if os.path.isdir(group):
        for name in sorted(os.listdir(group)):
            if name == "lock" or name.startswith("tmp"):
                continue
            with open(os.path.join(group, name), "rb") as f:
                found[name] = hashlib.sha256(f.read()).hexdigest()
    return found


def record_matches(key: str, source: str, count: bool = True) -> bool:
    """Whether a valid record says every kernel of this source is in Triton's cache, unchanged (counted in the
    ``disk_cache`` counters, where ``count``)."""
    root = disk.cache_dir()
    if root is None:
        return False
    path = os.path.join(root, key + ".triton.json")
    if not os.path.exists(path):
        if count:
            metrics.bump("disk_cache.miss")
        return False
    try:
        with open(path) as f:
            meta = json.load(f)
        ok = meta["key"] == key and meta["source_sha256"] == hashlib.sha256(source.encode()).hexdigest()
        ok = ok and all(_files(h) == files and files for h, files in meta["kernels"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok, meta = False, {}
    if not ok:
        metrics.bump("disk_cache.corrupt")
        metrics.bump("disk_cache.miss")
        for h in (meta.get("kernels") or {}) if isinstance(meta, dict) else {}:
            shutil.rmtree(_group(os.path.basename(str(h))), ignore_errors=True)
        os.unlink(path)
        return False
    if count:
        metrics.bump("disk_cache.hit")
    return True


def write_record(key: str, source: str, compiled: Sequence[Any], tuned: Optional[List[int]] = None) -> None:
    """The record of a module's compiled kernels and, once its first run timed them, each kernel's chosen block
    sizes (Note [Tuning on the first run] in runtime/triton.py)."""
    root = disk.cache_dir()
    if root is None:
        return
    kernels = {h: _files(h) for h in {ck.hash for ck in compiled}}  # launches share compiled kernels
    meta = {"key": key, "source_sha256": hashlib.sha256(source.encode()).hexdigest(), "kernels": kernels,
            "versions": disk._versions()}
    if tuned is not None:
        meta["tuned"] = list(tuned)
    disk._atomic_write(os.path.join(root, key + ".triton.json"), json.dumps(meta).encode())
    metrics.bump("disk_cache.store")


def read_tuned(key: str, kernels: int) -> Optional[List[int]]:
    """The block-size choices a record keeps for a module of ``kernels`` kernels (None: not timed yet). Called after
    ``record_matches`` or a fresh compile; a record's choices of the wrong length or type are ignored."""
    root = disk.cache_dir()
    if root is None:
        return None
    try:
        with open(os.path.join(root, key + ".triton.json")) as f:
            tuned = json.load(f).get("tuned")
    except (OSError, ValueError, AttributeError):
        return None
    if type(tuned) is not list or len(tuned) != kernels or not all(type(j) is int and j >= 0 for j in tuned):
        return None
    return tuned
