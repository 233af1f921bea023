"""Launching compiled Triton kernels: PyTorch's static CUDA launcher over the kernel's cubin, else Triton's own.

Note [One launcher for every signature]
Triton (3.6, the GPU machine's) launches a kernel through a C module it generates per argument signature and
builds with gcc, about a second each: a GPT step's kernels have dozens of signatures, so building their
launchers was most of the time until its step ran on Triton kernels. PyTorch ships one compiled launcher for
any signature (``torch._C._StaticCudaLauncher``, what Inductor launches its Triton kernels with): it loads a
kernel's cubin (cuModuleLoad, the opt-in shared memory set as Triton's loader sets it) and launches it with
cuLaunchKernel, its arguments described by one character each ('O' a pointer: a tensor or None; 'l' a 64-bit
integer; 'd' a double...). A kernel is loaded so when the launcher exists and the kernel needs nothing it does not
do (triton_worker.launch_info: more than one CTA per cluster, cooperative or PDL launches, a global or profiling
scratch buffer, tensor descriptors); otherwise, and on a torch built without it, the kernel is compiled through
Triton's JIT in this process and runs through Triton's launcher. Triton's launch hooks
(``knobs.runtime.launch_enter_hook``, used by profilers such as Proton) are not called for kernels launched
statically, as for Inductor's.

Both paths are called the same way: ``launcher(function, grid, 1, 1, num_warps, shared, arg_types, args,
stream)``, ``args`` a tuple of the kernel's non-constexpr arguments, the hidden scratch pointers included.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Tuple

import torch

from ..debug import metrics


class Bound(NamedTuple):
    """A loaded kernel, ready to launch (Note [One launcher for every signature])."""
    launcher: Callable[..., Any]
    function: int
    num_warps: int
    shared: int
    arg_types: str
    hidden: Tuple[None, ...]  # the scratch pointers Triton appends to every kernel's parameters
    grid: int
    static: bool = False  # loaded by PyTorch's launcher: ``function`` is a CUfunction the C runner can launch

    def __call__(self, args: list, stream: int) -> None:
        self.launcher(self.function, self.grid, 1, 1, self.num_warps, self.shared, self.arg_types,
                      (*args, *self.hidden), stream)


def _static() -> Any:
    return getattr(torch._C, "_StaticCudaLauncher", None)


def available() -> bool:
    """Whether this torch has PyTorch's static CUDA launcher."""
    return _static() is not None


def statically(info: Dict[str, Any]) -> bool:
    """Whether the kernel of a launch info (triton_worker.launch_info) is launched by PyTorch's launcher."""
    return info["types"] is not None and _static() is not None


def load(info: Dict[str, Any], cubin: str, grid: int, device: int) -> Bound:
    """The kernel of ``info`` (its cubin file at ``cubin``) loaded on ``device``, for launches of ``grid``
    programs; ``statically(info)`` must hold."""
    static = _static()
    loaded = static._load_kernel(cubin, info["name"], info["shared"], device)
    # (function, n_regs, n_spills); newer torch returns the module first
    return Bound(static._launch_kernel, loaded[-3], info["num_warps"], info["shared"], info["types"],
                 (None,) * info["hidden"], grid, True)


def load_compiled(ck: Any, grid: int) -> Bound:
    """A CompiledKernel of Triton's JIT, launched by Triton's launcher (Note [One launcher for every signature])."""
    metrics.bump("triton.triton_launchers")  # a launcher Triton builds (a gcc compile the first time)
    ck._init_handles()

    def triton_launch(function: int, gx: int, gy: int, gz: int, num_warps: int, shared: int, arg_types: str,
                      args: tuple, stream: int) -> None:
        ck.run(gx, gy, gz, stream, function, ck.packed_metadata, None, None, None, *args)

    return Bound(triton_launch, ck.function, ck.metadata.num_warps, ck.metadata.shared, "", (), grid)
