"""Loading and compiling the Triton module of a graph: the module file, Triton compiles (in a worker pool), and
the persistent record of compiled kernels.

Note [Triton compiles]
A Triton compile takes a fraction of a second to seconds per kernel, so with the default tiered compiler a graph's
Triton program does not wait for them: its kernels compile in a pool of worker processes (``triton_workers``;
Note [Compile workers without torch] in triton_worker.py: they start in a fraction of a second and never touch
CUDA), one kernel per request, each compile filling Triton's own cache, which lives under lazy's cache directory
(``<cache_dir>/triton``: created 0700 and refused if foreign, as cache/disk.py does). Until every kernel of the
graph is compiled the program runs on the reference executor; then the parent loads the kernels' cubins from that
cache (Note [One launcher for every signature] in triton_launch.py: no Triton JIT, no launcher builds) and runs
them from then on. The pool starts at the first graph of PRESTART_NODES nodes or more that will tier up
(graph_cache.lookup): a training step's first graph, whose steady-state successor tiers up a step later. A graph
compiled at its first run (``compiler='triton'``, not tiered) waits for its kernels, but compiles them in the pool
too when they are POOL_MIN_COMPILES or more.
A record ``<key>.triton.json`` keeps the sha256 of the module's source and of every file of each compiled kernel
in Triton's cache, and what each launch loads (its kernel's cache entry, name, shared memory, warps, argument
types), written atomically, last. A later process whose record matches its source and files loads its kernels at
once, in the calling thread (it compiles nothing: ``triton.compiles`` stays 0); a record that does not match
(truncated, corrupt, another source) is counted as ``disk_cache.corrupt``, the kernels' cache directories are
removed and the kernels compile again.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..cache import disk
from ..config import config
from ..debug import metrics
from . import triton_worker

_POOL: Optional["_Pool"] = None
PRESTART_NODES = 256
POOL_MIN_COMPILES = 8  # a graph compiled at its first run (not tiered) uses the pool from this many compiles on
OPTIONS = triton_worker.OPTIONS


def triton_cache_dir() -> Optional[str]:
    """Triton's cache directory, inside lazy's (None when lazy's disk cache is disabled or refused)."""
    root = disk.cache_dir()
    if root is None:
        return None
    path = os.path.join(root, "triton")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


_PRIVATE: List[str] = []  # the process's one temp dir where the disk cache is disabled


def _private_dir() -> str:
    """A temp directory of this process (removed at its exit): Triton's cache and the graphs' modules where lazy's
    disk cache is disabled. One per process, not one per graph: each was left behind."""
    if not _PRIVATE:
        path = tempfile.mkdtemp(prefix="lazy-triton-")
        atexit.register(shutil.rmtree, path, True)
        _PRIVATE.append(path)
    return _PRIVATE[0]


def use_cache_dir(interpret: bool) -> None:
    """Point Triton's cache at lazy's (Note [Triton compiles]); inherited by the worker processes. Before triton
    is first imported, choose its interpreter if the kernels run on the cpu."""
    if interpret and "triton" not in sys.modules:
        # NOTE: Triton decides at import whether its own library functions (tl.zeros, tl.sum, ...) are interpreted
        os.environ["TRITON_INTERPRET"] = "1"
    path = triton_cache_dir()
    if path is None:
        path = os.path.join(_private_dir(), "triton")
        os.makedirs(path, mode=0o700, exist_ok=True)
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
        root = _private_dir()
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
    if not interpret:
        return triton_worker.load_module(path)
    import triton
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpretedFunction
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
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
    spec.loader.exec_module(mod)
    return mod


_TYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1"}


def _triton_type(dtype: torch.dtype) -> str:
    if dtype not in _TYPES:
        raise NotImplementedError(f"the triton backend has no kernels for {dtype} buffers")
    return _TYPES[dtype]


def requests(launches: Sequence[Any], dtypes: Dict[int, Any]) -> Tuple[List[Dict[str, Any]], List[int]]:
    """The distinct compiles of ``launches`` as worker requests (Note [One function per distinct kernel] in
    codegen/triton.py: launches of one function, signature and options share one), and each launch's request."""
    reqs: List[Dict[str, Any]] = []
    seen: Dict[tuple, int] = {}
    index = []
    for launch in launches:
        types = [f"*{_triton_type(dtypes[b])}" for b in launch.buffers]
        types += [f"*{_triton_type(dt)}" for dt in launch.scalar_buffers()] if launch.memory else \
            launch.scalar_types()
        key = (launch.name, tuple(types), launch.num_warps, launch.debug)
        if key not in seen:
            seen[key] = len(reqs)
            reqs.append({"name": launch.name, "types": types, "num_warps": launch.num_warps, "debug": launch.debug})
        index.append(seen[key])
    return reqs, index


def target(device: torch.device) -> Tuple[str, int, int]:
    """The GPU Triton compiles for (asked of torch, so that this process never needs Triton's CUDA driver)."""
    major, minor = torch.cuda.get_device_capability(device)
    return ("cuda", major * 10 + minor, 32)


def compile_jit(fn: Any, launch: Any, dtypes: Dict[int, Any]) -> Any:
    """Compile ``launch`` of the module's Triton function ``fn`` through Triton's JIT in this process: the
    CompiledKernel, for a launch only Triton's launcher can launch (Note [One launcher for every signature] in
    triton_launch.py)."""
    args = [dtypes[b] for b in launch.buffers]
    args += launch.scalar_buffers() if launch.memory else [0.0 if f else 0 for f in launch.floats]
    return fn.warmup(*args, grid=(1,), **OPTIONS, num_warps=launch.num_warps)


class Compiles:
    """Compiles running in the pool's workers, one future per kernel: done when every one is."""

    def __init__(self, futures: List[concurrent.futures.Future]) -> None:
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self) -> Tuple[List[Dict[str, Any]], float]:
        """The kernels' launch infos in request order and the seconds of compiling summed over the workers; raises
        a worker's error."""
        answers = [f.result() for f in self.futures]
        return [info for a in answers for info in a["infos"]], sum(a["seconds"] for a in answers)


def compile_now(path: str, reqs: List[Dict[str, Any]], device: torch.device) -> List[Dict[str, Any]]:
    """Compile and wait: in the pool when the compiles are POOL_MIN_COMPILES or more (Note [Triton compiles]),
    else in this process."""
    if config.triton_workers > 0 and len(reqs) >= POOL_MIN_COMPILES:
        infos, seconds = submit(path, reqs, device).result()
    else:
        metrics.bump("triton.compiles", len(reqs))
        answer = triton_worker.compile_share(path, reqs, target(device))
        infos, seconds = answer["infos"], answer["seconds"]
    metrics.bump("triton.compile_time_s", seconds)
    return infos


class _Worker:
    """One compile worker process (Note [Compile workers without torch])."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-P", triton_worker.__file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env, text=True)

    def call(self, request: Dict[str, Any]) -> Dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            self.err.seek(0)
            tail = self.err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"a Triton compile worker exited (status {self.proc.poll()}): {tail}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        """End the process: at once (it may be compiling; nothing waits for it any more)."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self.proc.stdout.close()
        self.err.close()


class _Pool:
    """Worker processes, each served by a daemon thread of its own that takes the next request from one queue (so
    the interpreter's exit never waits for a compile), and futures for the requests."""

    def __init__(self, n: int) -> None:
        self.requests: "queue.SimpleQueue[Optional[tuple]]" = queue.SimpleQueue()
        self.workers = [_Worker() for _ in range(n)]
        self.closed = False
        for i in range(n):
            threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"lazy-triton-compile-{i}").start()

    def submit(self, request: Dict[str, Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.requests.put((request, future))
        return future

    def _serve(self, i: int) -> None:
        while True:
            item = self.requests.get()
            if item is None:
                return
            request, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self.workers[i].call(request))
            except Exception as e:  # noqa: BLE001 -- the compile's caller raises it
                if self.workers[i].proc.poll() is not None and not self.closed:  # a dead worker is replaced
                    self.workers[i].close()
                    self.workers[i] = _Worker()
                future.set_exception(e)

    def shutdown(self) -> None:
        self.closed = True
        for _ in self.workers:
            self.requests.put(None)
        for w in self.workers:
            w.close()


def _pool() -> _Pool:
    global _POOL
    if _POOL is None:
        _POOL = _Pool(max(1, config.triton_workers))
        atexit.register(_shutdown)
    return _POOL


def start_pool() -> None:
    """Start the workers now, so they are up when a graph tiers up (Note [Triton compiles]); once per process."""
    if _POOL is not None or config.triton_workers <= 0:
        return
    use_cache_dir(False)
    _pool()


def submit(path: str, reqs: List[Dict[str, Any]], device: torch.device) -> Compiles:
    """Compile the kernels of ``reqs`` in the worker pool (Note [Triton compiles]), one request per kernel, so that
    a worker takes the next kernel as soon as it is free."""
    pool = _pool()
    metrics.bump("triton.compiles", len(reqs))
    common = {"path": path, "target": list(target(device)), "cache": os.environ["TRITON_CACHE_DIR"]}
    return Compiles([pool.submit({**common, "kernels": [req]}) for req in reqs])


def _shutdown() -> None:
    """At exit: the workers end, compiling or not."""
    if _POOL is not None:
        _POOL.shutdown()


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


_INFO = {"hash": str, "name": str, "shared": int, "num_warps": int, "hidden": int}


def _valid_info(info: Any) -> bool:
    return (type(info) is dict and all(type(info.get(k)) is t for k, t in _INFO.items())
            and (info.get("types") is None or type(info["types"]) is str))


def read_record(key: str, source: str, launches: int, kernels: int) -> Optional[Tuple[List[Dict[str, Any]],
                                                                                      Optional[List[int]]]]:
    """(launch infos, tuned block-size choices or None) of a valid record of this source's ``launches`` compiled
    launches whose kernel files are unchanged; None when there is none (counted in the ``disk_cache`` counters)."""
    root = disk.cache_dir()
    if root is None:
        return None
    path = os.path.join(root, key + ".triton.json")
    if not os.path.exists(path):
        metrics.bump("disk_cache.miss")
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
        infos = meta["launches"]
        ok = meta["key"] == key and meta["source_sha256"] == hashlib.sha256(source.encode()).hexdigest()
        ok = ok and type(infos) is list and len(infos) == launches and all(map(_valid_info, infos))
        ok = ok and {i["hash"] for i in infos} <= set(meta["kernels"])
        ok = ok and all(_files(h) == files and files for h, files in meta["kernels"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok, meta = False, {}
    if not ok:
        metrics.bump("disk_cache.corrupt")
        metrics.bump("disk_cache.miss")
        kernels_of = meta.get("kernels") if isinstance(meta, dict) else None
        for h in kernels_of if isinstance(kernels_of, dict) else {}:
            shutil.rmtree(_group(os.path.basename(str(h))), ignore_errors=True)
        os.unlink(path)
        return None
    metrics.bump("disk_cache.hit")
    tuned = meta.get("tuned")
    if type(tuned) is not list or len(tuned) != kernels or not all(type(j) is int and j >= 0 for j in tuned):
        tuned = None
    return infos, tuned


def cubin(info: Dict[str, Any]) -> str:
    """The path of a launch info's compiled kernel in Triton's cache (where its compile put it, or, from a record,
    in the cache directory of now)."""
    return info.get("cubin") or os.path.join(_group(info["hash"]), f"{info['name']}.cubin")


def recompile(path: str, launch: Any, dtypes: Dict[int, Any], device: torch.device) -> Dict[str, Any]:
    """Compile one launch again, in this process: its kernel's files left Triton's cache since it was compiled (a
    corrupt record of another graph sharing the kernel removes them: ``read_record``)."""
    return compile_now(path, requests([launch], dtypes)[0], device)[0]


def write_record(key: str, source: str, infos: Sequence[Dict[str, Any]], tuned: Optional[List[int]] = None) -> None:
    """The record of a module's compiled launches (their launch infos) and, once its first run timed them, each
    kernel's chosen block sizes (Note [Tuning on the first run] in runtime/triton.py)."""
    root = disk.cache_dir()
    if root is None:
        return
    kernels = {h: _files(h) for h in {info["hash"] for info in infos}}  # launches share compiled kernels
    launches = [{k: v for k, v in info.items() if k != "cubin"} for info in infos]  # found again by hash
    meta = {"key": key, "source_sha256": hashlib.sha256(source.encode()).hexdigest(), "kernels": kernels,
            "launches": launches, "versions": disk._versions()}
    if tuned is not None:
        meta["tuned"] = list(tuned)
    disk._atomic_write(os.path.join(root, key + ".triton.json"), json.dumps(meta).encode())
    metrics.bump("disk_cache.store")
