"""The instruction set the C++ kernels are built for: ``lazy.config.cpu_isa`` -> compiler flags, checked against
the CPU, named for benchmarks, and made part of the disk-cache key.

Note [Kernel ISA]
``cpu_isa`` picks the -march/-m flags of every kernel build: 'native' (the default: all the machine has; with
AVX-512, 512-bit vectors are preferred, Note in runtime/cpp.py FLAGS), 'avx512', 'avx2' (on an AVX-512 machine:
``-march=native -mno-avx512f``, the machine's own tuning without any AVX-512 instruction, i.e. what an AVX2 machine
of the same generation runs, so one box tests and measures both paths), the portable levels 'x86-64-v2/v3/v4'
(for a cache shared by a fleet) and 'generic' (the compiler's default target). What a choice really enables is
asked of the compiler, not assumed: ``g++ <flags> -dM -E`` lists the predefined macros, whose ISA-extension macros
(``__AVX2__``, ``__AVX512F__``, ``__FMA__``, ...) are the features the kernels may use. A choice that needs a
feature ``-march=native`` does not give (the CPU lacks it: the kernels would die on an illegal instruction) raises
``IsaError`` naming the missing features; the backend then falls back to the reference executor with a warning.
The features and the compiler's version are part of the disk-cache key (Note [Disk cache entries]): with
``-march=native`` the flags read the same on every machine, so a cache copied to a CPU lacking a feature, or
built by another compiler, misses and rebuilds instead of loading code it cannot run. The probe costs one
preprocessor run (~15 ms) per compiler and choice, once per process (two for a choice other than 'native').
"""
from __future__ import annotations

import functools
import platform
import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

from ..config import config

_X86 = platform.machine() in ("x86_64", "AMD64")
# -mprefer-vector-width=512: where AVX-512 exists, the kernels (compute-bound math) use 16-float vectors (the
# 200-op chain at 1024^2: 183 ms instead of 328 ms); g++ prefers 256 bits otherwise. Ignored without AVX-512.
_WIDE = ("-mprefer-vector-width=512",) if _X86 else ()
ISAS: Dict[str, Tuple[str, ...]] = {
    "native": ("-march=native",) + _WIDE,
    "avx512": ("-march=native",) + _WIDE,
    "avx2": ("-march=native", "-mno-avx512f"),
    "x86-64-v4": ("-march=x86-64-v4",) + _WIDE,
    "x86-64-v3": ("-march=x86-64-v3",),
    "x86-64-v2": ("-march=x86-64-v2",),
    "generic": (),
}
# features a choice must have (beyond being a subset of the CPU's), and those it must not
_NEEDS = {"avx512": {"AVX512F"}, "avx2": {"AVX2", "FMA"}}
_EXCLUDES = {"avx2": "AVX512"}
# macros that name an instruction-set extension the generated code may use
_FEATURE = re.compile(r"#define __((?:SSE|AVX|FMA|F16C|BMI|LZCNT|POPCNT|MOVBE|AMX|GFNI|VAES|VPCLMULQDQ|PCLMUL|AES|SHA"
                      r"|ADX|ARM_NEON|ARM_FEATURE_)\w*?)(?:__)? ")


class IsaError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    """What the kernels are built for: ``flags`` (the -march/-m flags), ``features`` (the ISA-extension macros they
    define, without underscores: 'AVX2', 'AVX512F', ...) and ``compiler`` (its __VERSION__)."""
    isa: str
    flags: Tuple[str, ...]
    features: FrozenSet[str]
    compiler: str

    def key(self) -> str:
        """The part of the disk-cache key that says where the code may run (Note [Kernel ISA])."""
        return f"isa={self.isa};flags={' '.join(self.flags)};features={','.join(sorted(self.features))};" \
            f"cxx={self.compiler}"

    def vector_isa(self) -> str:
        """The widest vector extension: 'AVX-512', 'AVX2', 'AVX', 'SSE2', 'NEON', 'SVE' or the machine's name."""
        for feature, name in (("AVX512F", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX"), ("ARM_FEATURE_SVE", "SVE"),
                              ("ARM_NEON", "NEON"), ("SSE2", "SSE2")):
            if feature in self.features:
                return name
        return platform.machine() or "scalar"


@functools.lru_cache(maxsize=None)
def _probe(cxx: str, flags: Tuple[str, ...]) -> Tuple[FrozenSet[str], str]:
    """(ISA features, compiler version) that ``cxx flags`` predefines."""
    cmd = shlex.split(cxx) + list(flags) + ["-dM", "-E", "-x", "c++", "/dev/null"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise IsaError(f"cannot run the C++ compiler {cxx!r} ({e}); set LAZY_CXX") from e
    if proc.returncode != 0:
        raise IsaError(f"the C++ compiler rejects the flags {' '.join(flags)!r} of lazy.config.cpu_isa: "
                       f"{proc.stderr.strip()[:500]}")
    version = re.search(r'#define __VERSION__ "([^"]*)"', proc.stdout)
    return frozenset(m.group(1) for m in _FEATURE.finditer(proc.stdout)), version.group(1) if version else cxx


@functools.lru_cache(maxsize=None)
def _target(isa: str, cxx: str) -> Target:
    if isa not in ISAS:
        raise IsaError(f"lazy.config.cpu_isa (LAZY_CPU_ISA) is {isa!r}; choose one of {', '.join(ISAS)}")
    flags = ISAS[isa]
    features, version = _probe(cxx, flags)
    if flags != ISAS["native"]:
        missing = features - _probe(cxx, ISAS["native"])[0]
        if missing:
            raise IsaError(f"lazy.config.cpu_isa={isa!r} needs {', '.join(sorted(missing))}, which this CPU lacks "
                           "(kernels built for it would die on an illegal instruction); use 'native' or a lower ISA")
    lacking = _NEEDS.get(isa, set()) - features
    if lacking:
        raise IsaError(f"lazy.config.cpu_isa={isa!r}: this CPU (or {cxx}) has no {', '.join(sorted(lacking))}; use "
                       "'native' or a lower ISA")
    excluded = [f for f in features if f.startswith(_EXCLUDES.get(isa, "-"))]
    if excluded:
        raise IsaError(f"lazy.config.cpu_isa={isa!r}: the flags {' '.join(flags)} still enable "
                       f"{', '.join(sorted(excluded))} with {cxx}")
    return Target(isa, flags, features, version)


def target() -> Target:
    """The target of kernel builds under the current configuration (``cpu_isa``, ``cxx``); raises IsaError if the
    CPU cannot run it."""
    return _target(config.cpu_isa, config.cxx)


def target_isa() -> str:
    """The vector ISA the C++ kernels are built for under the current configuration ('AVX-512', 'AVX2', ...)."""
    return target().vector_isa()
