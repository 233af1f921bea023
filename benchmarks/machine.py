"""The machine a benchmark ran on, as one line every benchmark prints first (and benchmarks/README.md quotes).

CPU model, the vector ISA lazy's C++ kernels are built for, physical cores and logical CPUs, torch's threads, the
GPU if lazy's backing device is one, torch and Python versions, and the date:

    2026-11-25  AMD EPYC (AVX-512), 1 core / 2 CPUs, 2 torch threads, torch 2.13.0+cpu, Python 3.11.7
"""
from __future__ import annotations

import datetime
import os
import platform
import sys

import torch


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown cpu"


def kernel_isa() -> str:
    """The vector ISA lazy's C++ kernels are compiled for on this machine (lazy.runtime.cpp decides it, if lazy is
    imported; a process that must not import lazy, such as an LTC worker, gets what -march=native gives)."""
    try:
        if "lazy" not in sys.modules:
            raise ImportError
        from lazy.runtime.cpp import target_isa
        return target_isa()
    except ImportError:
        flags = set(_cpuinfo().get("flags", "").split())
        if "avx512f" in flags:
            return "AVX-512"
        if "avx2" in flags:
            return "AVX2"
        return "NEON" if platform.machine() in ("aarch64", "arm64") else platform.machine()


def cores() -> str:
    """Physical cores (distinct core ids per package) and logical CPUs."""
    logical = os.cpu_count() or 1
    seen = set()
    package = core = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    package = value.strip()
                elif key == "core id":
                    core = value.strip()
                    seen.add((package, core))
    except OSError:
        pass
    physical = len(seen) or logical
    return f"{physical} core{'s' if physical != 1 else ''} / {logical} CPU{'s' if logical != 1 else ''}"


def gpu() -> str:
    """The backing GPU's name, or '' when lazy computes on the cpu."""
    lazy = sys.modules.get("lazy")
    device = torch.device(lazy.config.backing_device if lazy is not None
                          else os.environ.get("LAZY_BACKING_DEVICE", "cpu"))
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_name(device)


def describe() -> str:
    """The machine line: date, CPU (kernel ISA), cores, threads, GPU, torch, Python."""
    parts = [f"{cpu_model()} ({kernel_isa()})", cores(), f"{torch.get_num_threads()} torch threads"]
    name = gpu()
    if name:
        parts.append(f"GPU {name}")
    parts += [f"torch {torch.__version__}", f"Python {platform.python_version()}"]
    return f"{datetime.date.today().isoformat()}  " + ", ".join(parts)


if __name__ == "__main__":
    print(describe())
