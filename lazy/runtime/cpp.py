"""The C++ runtime: compile a graph's translation unit with the system compiler, load it once with ctypes, and
run it as a Program (same interface as the reference executor) over a buffer plan with extern ATen calls.

The pipeline of passes is listed in ``compile_cpp`` (STYLE.md item 4): lower -> schedule -> render -> build.
If any pass or the compiler fails, the graph runs on the reference executor with one warning naming the cause
and the ``compile_fallback`` counter; results stay correct.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shlex
import subprocess
import tempfile
import time
import warnings
from typing import Any, List, Sequence

import torch

from ..cache import disk
from ..codegen import cpp as renderer
from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..ir.graph import Linearized, format_graph
from ..ir.node import DATA
from ..lower import Extern, lower
from ..schedule import Kernel, format_schedule, schedule
from .reference import Program as ReferenceProgram
from .reference import run_node

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
         "-fwrapv") + (("-mprefer-vector-width=512",) if platform.machine() in ("x86_64", "AMD64") else ())
# NOTE: no -ffast-math: results must match eager (NaN/inf semantics, no reassociation). -fno-math-errno only lets
# sqrt & co. compile to instructions instead of libm calls that set errno; values are unchanged. -fwrapv: signed
# integer overflow wraps, as eager's does (int64 mul, int32 add, abs/neg of INT_MIN), instead of being UB.
# -fno-trapping-math only gives up the floating-point exception *flags* (nothing reads them; values, NaN/inf and
# signed zeros are unchanged); without it g++ will not if-convert selects or vectorize floor/ceil, so the math of
# cpp_math.py would stay scalar. -mprefer-vector-width=512: where AVX-512 exists, the kernels (compute-bound math)
# use 16-float vectors: the 200-op chain at 1024^2 runs in 183 ms instead of 328 ms (measured under load ~3.5).

_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


class CompileError(RuntimeError):
    pass


def _build(source: str) -> str:
    """Compile ``source`` into a shared library in a private temp dir; returns its path."""
    tmp = tempfile.mkdtemp(prefix="lazy-cpp-")
    src, so = os.path.join(tmp, "graph.cpp"), os.path.join(tmp, "graph.so")
    with open(src, "w") as f:
        f.write(source)
    cmd = shlex.split(config.cxx) + list(FLAGS) + ["-o", so, src]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise CompileError(f"cannot run the C++ compiler {config.cxx!r} ({e}); set LAZY_CXX") from e
    metrics.bump("cpp.compiles")
    metrics.bump("cpp.compile_time_s", time.perf_counter() - start)
    if proc.returncode != 0:
        raise CompileError(f"{config.cxx} failed ({proc.returncode}): {proc.stderr.strip()[:2000]}")
    return so


class Program:
    """A compiled graph: kernel segments (one C entry point each) and extern calls over a buffer plan."""

    backend = "cpp"

    def __init__(self, lin: Linearized, device: torch.device) -> None:
        if device.type != "cpu":
            raise CompileError(f"the cpp backend runs on the cpu, not on {device}")
        self.device = device
        lowered = lower(lin)                                   # ATen graph -> kernel IR + externs
        sched = schedule(lowered, renderer.LIMITS)             # fusion, order, buffer lifetimes
        self.kernel_ir = format_schedule(sched)
        source, segments = renderer.render(sched)              # kernel IR -> C++
        self.source = source
        self.graph_text = format_graph(lin.order, lin.outputs)
        self.num_nodes = sum(1 for n in lin.order if n.op is not DATA)
        self.num_kernels = len(sched.kernels)
        self.num_externs = sum(isinstance(s, Extern) for s in sched.steps)
        self.externs_by_op = dict(lowered.externs_by_op)
        key = disk.graph_digest(lin, "cpp", config.cxx, " ".join(FLAGS))
        self.lib = self._load(key, source) if segments else None
        self._plan(lowered, sched, segments)
        metrics.bump("kernels_compiled", self.num_kernels)
        for name, n in self.externs_by_op.items():
            metrics.bump(f"extern.{name}", n)

    def _load(self, key: str, source: str) -> Any:
        path = disk.lookup(key, source)
        if path is None:
            built = _build(source)
            path = disk.store(key, source, built) or built
        return ctypes.CDLL(path)

    def _plan(self, lowered: Any, sched: Any, segments: List[List[Kernel]]) -> None:
        self.num_buffers = lowered.num_buffers
        self.leaf_ids = [b.id for b in lowered.leaves]
        self.output_ids = [b.id for b in lowered.outputs]
        self.scalar_kinds = list(lowered.scalar_kinds)
        seg_of = {id(seg[0]): i for i, seg in enumerate(segments)}
        steps: List[list] = []
        for i, step in enumerate(sched.steps):
            frees = list(sched.frees.get(i, ()))
            if isinstance(step, Extern):
                steps.append(["extern", step.fn, step.args, step.kwargs, tuple(b.id for b in step.inputs),
                              tuple(step.slots), tuple((b.id if b is not None else None) for b in step.outputs),
                              frees])
                continue
            if id(step) in seg_of:
                fn = getattr(self.lib, f"lz_seg{seg_of[id(step)]}")
                fn.argtypes = _ARGTYPES
                fn.restype = ctypes.c_int
                steps.append(["seg", [], [], fn, 0])
            seg = steps[-1]
            seg[1].extend((b.id, b.shape, b.dtype) for b, _, _ in step.stores)
            seg[2].extend(frees)
            seg[4] += 1
        self.steps = [tuple(s) for s in steps]

    def run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        values: List[Any] = [None] * self.num_buffers
        ptrs = (ctypes.c_void_p * max(self.num_buffers, 1))()
        for i, t in zip(self.leaf_ids, leaves):
            values[i] = t
            ptrs[i] = t.data_ptr()
        n = max(len(scalars), 1)
        fs = (ctypes.c_double * n)(*[float(s) if isinstance(s, (int, float)) else 0.0 for s in scalars])
        is_ = (ctypes.c_int64 * n)(*[int(s) if isinstance(s, (int, bool)) else 0 for s in scalars])
        launched = 0
        for step in self.steps:
            if step[0] == "seg":
                _, allocs, frees, fn, count = step
                for i, shape, dtype in allocs:
                    t = torch.empty(shape, dtype=dtype)
                    values[i] = t
                    ptrs[i] = t.data_ptr()
                if fn(ptrs, fs, is_):
                    raise ZeroDivisionError("lazy: integer division by zero in a compiled kernel")
                launched += count
            else:
                _, fn, args, kwargs, ins, slots, outs, frees = step
                result = run_node(fn, args, kwargs, [values[i] for i in ins], [scalars[s] for s in slots],
                                  self.device)
                results = result if len(outs) > 1 or isinstance(result, (tuple, list)) else (result,)
                for i, t in zip(outs, results):
                    if i is None:
                        continue
                    if not t.is_contiguous():
                        t = t.contiguous()
                    values[i] = t
                    ptrs[i] = t.data_ptr()
            for i in frees:
                values[i] = None
        metrics.bump("executed_graphs")
        metrics.bump("executed_nodes", self.num_nodes)
        metrics.bump("kernels_launched", launched)
        return [values[i] for i in self.output_ids]


def compile_cpp(lin: Linearized, device: torch.device) -> Any:
    """The cpp backend's compiler for graph_cache; falls back to the reference executor on any failure."""
    try:
        return Program(lin, device)
    except Exception as e:  # noqa: BLE001 -- any failure falls back, loudly and counted
        cause = f"{type(e).__name__}: {e}"
        metrics.bump("compile_fallback")
        log(1, f"cpp compile failed, reference fallback: {cause}")
        warnings.warn(f"lazy: the cpp backend could not compile a graph of {len(lin.order)} nodes ({cause[:500]}); "
                      "it runs on the reference executor (correct, slower). Set LAZY_COMPILER=reference to silence.",
                      RuntimeWarning, stacklevel=2)
        return ReferenceProgram(lin, device)
