"""Helpers the compiled-kernel benchmarks share: one run per instruction set (``--isa``), and the cached run of a
compiled graph without recording.

``--isa native,avx2`` runs the benchmark once per ISA, each in a process of its own (eager's and torch.compile's
kernels pick their ISA when torch loads): lazy's kernels built for it (``LAZY_CPU_ISA``) and eager's ATen kernels
and torch.compile's Inductor kernels restricted to it (``ATEN_CPU_CAPABILITY``, which both follow), so that every
ratio compares code for the same vector width. On an AVX-512 machine, 'avx2' is what an AVX2 machine of the same
generation runs (Note [Kernel ISA] in lazy/runtime/cpp_isa.py).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, List, Optional, Sequence

def temp_dir(prefix: str) -> str:
    """A temp directory removed when the process exits (a benchmark's private compile cache)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


# LAZY_CPU_ISA -> ATEN_CPU_CAPABILITY (None: torch's own choice, the machine's best)
ATEN_CAPABILITY = {"native": None, "avx512": "avx512", "avx2": "avx2"}


def add_isa_argument(parser) -> None:
    parser.add_argument("--isa", default="", help="comma-separated instruction sets, each measured in a process of "
                        "its own with eager and torch.compile restricted to it: native, avx512, avx2 (default: this "
                        "process's LAZY_CPU_ISA, torch's own choice)")


def rerun_per_isa(isas: str, argv: Sequence[str]) -> bool:
    """If ``isas`` names any ISA, run this script once per ISA (without --isa) and return True; else False."""
    if not isas:
        return False
    for isa in isas.split(","):
        if isa not in ATEN_CAPABILITY:
            raise SystemExit(f"--isa {isa!r}: choose from {', '.join(ATEN_CAPABILITY)}")
        # Inductor's cache of its own per ISA: its key does not cover ATEN_CPU_CAPABILITY, and an entry compiled for
        # one ISA, reused by a run for another, crashed that run (glibc: double free)
        env = dict(os.environ, LAZY_CPU_ISA=isa,
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tempfile.gettempdir(), f"lazy-bench-inductor-{isa}"))
        env.pop("ATEN_CPU_CAPABILITY", None)
        if ATEN_CAPABILITY[isa] is not None:
            env["ATEN_CPU_CAPABILITY"] = ATEN_CAPABILITY[isa]
        args = [a for i, a in enumerate(argv) if not (a.startswith("--isa") or (i and argv[i - 1] == "--isa"))]
        print(f"## --isa {isa}: LAZY_CPU_ISA={isa}, ATEN_CPU_CAPABILITY={env.get('ATEN_CPU_CAPABILITY', '(unset)')}",
              flush=True)
        subprocess.run([sys.executable] + args, env=env, check=True)
    return True


def restrict_inductor() -> None:
    """Give torch.compile the vector width ATEN_CPU_CAPABILITY names. NOTE: with ATEN_CPU_CAPABILITY=avx2 alone,
    torch 2.13's Inductor picks its AVX2 ISA but computes wrong results on an AVX-512 machine (measured: half the
    elements of ``x * 2 + 1`` at 4096^2, NaN in the 200-op chain at 16^2); with ``cpp.simdlen`` set too they equal
    eager's. The benchmarks check torch.compile's results against eager's as well."""
    width = {"avx2": 256, "avx512": 512}.get(os.environ.get("ATEN_CPU_CAPABILITY", ""))
    if width:
        import torch._inductor.config as inductor_config
        inductor_config.cpp.simdlen = width


def isa_line() -> str:
    """What this process's lazy, eager and torch.compile kernels are built for."""
    import torch
    from torch._inductor import cpu_vec_isa

    from lazy.runtime.cpp import target_isa
    return (f"kernels: lazy {target_isa()} (LAZY_CPU_ISA={os.environ.get('LAZY_CPU_ISA', 'native')}), eager "
            f"{torch.backends.cpu.get_cpu_capability()}, torch.compile {cpu_vec_isa.pick_vec_isa() or 'scalar'}")


OPS = (lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05)


def chain(x):
    """The 200-op pointwise chain of the benchmarks (multiply, add, sin, relu, subtract, 40 times)."""
    for i in range(200):
        x = OPS[i % 5](x)
    return x


def cached_run(fn: Callable, args: Sequence) -> tuple:
    """(program, call): the compiled program of ``fn``'s graph and a call that runs it on the same leaves (no
    recording, no cache lookup: the kernels, extern calls and output allocation of one cached run)."""
    import lazy
    import torch
    from lazy.cache import graph_cache

    lz = [a.to("lazy") for a in args]
    lazy.mark_step()
    y = fn(*lz)  # kept alive: mark_step syncs live tensors only
    lazy.mark_step()
    program = graph_cache.latest()
    seen: dict = {}
    run = program.run

    def spy(leaves: List, scalars: List) -> Optional[list]:
        seen["args"] = (list(leaves), list(scalars))
        return run(leaves, scalars)

    program.run = spy  # NOTE: an instance attribute over the method, removed again below
    y = fn(*lz)
    with lazy.config.override(async_execution=False):  # a launched run would go to Program.submit, not run
        lazy.mark_step()
    del program.run
    leaves, scalars = seen["args"]
    first = y[0] if isinstance(y, (list, tuple)) else y
    torch.testing.assert_close(run(leaves, scalars)[0].cpu(), first.cpu())
    return program, lambda: run(leaves, scalars)
