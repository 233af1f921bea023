"""Compiling Triton kernels without torch: run as a script, it is one compile worker of the pool
(runtime/triton_build.py); imported, it is the same code run in the calling process. It imports nothing of torch or
of lazy, so that a worker starts in a fraction of a second.

Note [Compile workers without torch]
Importing torch takes 4-6 s on the GPU machine, importing Triton a quarter of a second, and compiling a kernel
needs only Triton: the source, a signature, the options and the target (the GPU's architecture, which the parent
asks its CUDA device for). So a worker is a plain ``python -P triton_worker.py`` process (``-P``: this directory,
which holds lazy's own ``triton.py``, is not put on ``sys.path``) that reads one JSON request per line on stdin
and writes one JSON answer per line on stdout. It compiles with ``triton.compile`` (Triton's JIT launch path, which
needs a CUDA driver and hence torch, is never used) into Triton's cache, and answers what the parent needs to load
each kernel without Triton: its cache entry (hash), name, shared memory, warps and argument types (Note [One
launcher for every signature] in triton_launch.py).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

# Triton's compile options of every kernel. NOTE: no overflow checks, which a kernel compiled with debug (one with
# index checks) would otherwise assert on: integer arithmetic wraps, as eager's does. Multiplies and adds fuse
# (FMA), as in eager's CUDA kernels (nvcc's default); set, since Triton 3.10 changes its default.
OPTIONS = {"num_stages": 1, "sanitize_overflow": False, "enable_fp_fusion": True}

_SCALARS = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
            "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}


def load_module(path: str) -> Any:
    """Execute a generated module for compiling (its loader globals: codegen/triton.py's HEADER)."""
    import triton
    from triton.language.extra import libdevice
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    mod._jit = triton.jit
    mod._kernel = lambda names, debug: (lambda fn: triton.jit(fn, do_not_specialize=names, debug=debug))
    mod.M = libdevice
    spec.loader.exec_module(mod)
    return mod


def arg_types(ck: Any) -> Optional[str]:
    """One character per non-constexpr argument of a CompiledKernel, as PyTorch's static launcher takes them ('O' a
    pointer, 'i'/'l' 32/64-bit integers, 'f'/'d' floats); None: an argument it cannot pass."""
    signature = ck.src.signature
    names = ck.src.fn.arg_names
    constants = {names[k] if isinstance(k, int) else names[k[0]] if isinstance(k, tuple) else k
                 for k in getattr(ck.src, "constants", {})}
    out = []
    for i, name in enumerate(names):
        ty = signature[name] if name in signature else signature.get(i)
        if ty is None or ty == "constexpr" or name in constants:
            continue
        code = ("O" if ty.startswith("*") else _SCALARS.get(ty)) if isinstance(ty, str) else None
        if code is None:
            return None
        out.append(code)
    return "".join(out)


def hidden_args(meta: Any) -> Optional[int]:
    """How many scratch pointers Triton appends to the kernel's parameters (passed as null); None when the kernel
    needs scratch memory allocated."""
    n = 0
    for name in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(meta, name):
            if getattr(meta, name):
                return None
            n += 1
    return n


def launch_info(ck: Any) -> Dict[str, Any]:
    """What the parent loads a compiled kernel by: ``types`` is None when only Triton's launcher can launch it
    (clusters, cooperative or PDL launches, scratch memory, tensor descriptors, an argument type the static
    launcher lacks)."""
    meta = ck.metadata
    types, hidden = arg_types(ck), hidden_args(meta)
    plain = (getattr(meta, "num_ctas", 1) == 1 and not getattr(meta, "launch_cooperative_grid", False)
             and not getattr(meta, "launch_pdl", False) and not getattr(meta, "tensordesc_meta", None)
             and f"{ck.name}.cubin" in ck.metadata_group)
    ok = plain and types is not None and hidden is not None
    return {"hash": ck.hash, "name": ck.name, "shared": int(meta.shared), "num_warps": int(meta.num_warps),
            "types": types + "O" * hidden if ok else None, "hidden": hidden if ok else 0,
            "cubin": ck.metadata_group.get(f"{ck.name}.cubin")}


def compile_one(fn: Any, types: List[str], num_warps: int, debug: bool, target: Tuple[Any, ...]) -> Any:
    """Compile ``fn`` for buffers (``*fp32``...: 16-byte aligned, as the caching allocator's are) and scalars of
    ``types`` into Triton's cache: the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = dict(zip(fn.arg_names, types))
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types) if t.startswith("*")}
    src = ASTSource(fn, signature, {}, attrs=attrs)
    options = {**OPTIONS, "num_warps": num_warps, "debug": debug}
    return triton.compile(src, target=GPUTarget(*target), options=options)


_MODULES: Dict[Tuple[str, str], Any] = {}  # a worker's loaded modules (a graph's kernels come one request each)


def compile_share(path: str, kernels: List[Dict[str, Any]], target: Tuple[Any, ...]) -> Dict[str, Any]:
    """Compile the kernels (``{"name", "types", "num_warps", "debug"}`` each) of the module at ``path``: their
    launch infos, in order, and the seconds it took."""
    start = time.perf_counter()
    with open(path, "rb") as f:
        at = (path, hashlib.sha256(f.read()).hexdigest())  # a module file rewritten is a new module
    mod = _MODULES.get(at)
    if mod is None:
        if len(_MODULES) > 8:
            _MODULES.clear()
        mod = _MODULES[at] = load_module(path)
    infos = [launch_info(compile_one(getattr(mod, k["name"]), k["types"], k["num_warps"], k["debug"], target))
             for k in kernels]
    return {"infos": infos, "seconds": time.perf_counter() - start}


def _use_cache(path: str) -> None:
    """Triton's cache directory, the parent's (runtime/triton_build.use_cache_dir)."""
    os.environ["TRITON_CACHE_DIR"] = path
    try:
        from triton import knobs
        knobs.cache.dir = path
    except (ImportError, AttributeError):  # older Triton reads the environment variable only
        pass


def main() -> None:
    """Serve compile requests, one JSON object per line, until stdin closes."""
    import triton  # noqa: F401 -- imported once, before the first request
    out = sys.stdout
    sys.stdout = sys.stderr  # anything Triton prints stays out of the answers
    for line in sys.stdin:
        request = json.loads(line)
        try:
            _use_cache(request["cache"])
            answer = compile_share(request["path"], request["kernels"], tuple(request["target"]))
        except Exception as e:  # noqa: BLE001 -- the parent raises it, with the kernel's compile error
            answer = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
