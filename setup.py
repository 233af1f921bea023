"""Build and install lazy.

``lazy._C`` (csrc/, pybind11) holds the C parts: the recording hot path and the IR objects it creates. Only
csrc/alias.cpp sees torch's C++ headers, and only c10's TensorImpl (views share their base's StorageImpl), so the
extension is built against the installed torch: ``pip install --no-build-isolation -e .`` (torch is a
requirement, never a build requirement: pip's isolated build environment would pull a second, CUDA torch).
"""
import pybind11
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup


def _torch_flags() -> dict:
    """Include and link flags for c10, from the torch this build runs beside."""
    try:
        import torch
        from torch.utils.cpp_extension import include_paths, library_paths
    except ImportError as e:
        raise SystemExit("lazy: building lazy._C needs torch: pip install torch==2.13.0 first, then "
                         "pip install --no-build-isolation -e . (so the build sees that torch)") from e
    return dict(
        # pybind11's own headers first: torch's include directory holds an older pybind11 of its own
        include_dirs=[pybind11.get_include(), include_paths()[0]],
        library_dirs=library_paths()[:1],
        libraries=["c10", "torch_cpu", "dl"],  # torch_cpu: the dispatcher (csrc/runner.cpp); dl: the CUDA driver
        define_macros=[("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))],
    )


ext = Pybind11Extension(
    "lazy._C",
    sources=["csrc/module.cpp", "csrc/ir.cpp", "csrc/record.cpp", "csrc/record_methods.cpp", "csrc/graph.cpp",
             "csrc/alias.cpp", "csrc/capture_hook.cpp", "csrc/capture_guards.cpp", "csrc/guard_reads.cpp",
             "csrc/replay_io.cpp", "csrc/leaf_templates.cpp", "csrc/outputs.cpp", "csrc/runner.cpp",
             "csrc/native_launch.cpp", "csrc/cuda_launch.cpp", "csrc/upload.cpp"],
    depends=["csrc/ir.h", "csrc/record.h", "csrc/record_state.h", "csrc/graph.h", "csrc/alias.h", "csrc/capture_hook.h",
             "csrc/capture_guards.h", "csrc/guard_reads.h", "csrc/replay_io.h", "csrc/leaf_templates.h",
             "csrc/outputs.h", "csrc/runner.h", "csrc/native_launch.h", "csrc/cuda_launch.h", "csrc/upload.h"],
    cxx_std=20,  # torch 2.13's headers need C++20 (bit-field initializers)
    extra_compile_args=["-O2"],
    **_torch_flags(),
)

setup(
    name="lazy",
    version="0.1.0",
    description="A lazy-tensor runtime for PyTorch: record ATen ops into a graph, compile and run it at sync points",
    packages=find_packages(include=["lazy", "lazy.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.11",
    install_requires=["torch>=2.11", "numpy", "pybind11>=2.10"],
    extras_require={"triton": ["triton"], "test": ["pytest", "expecttest"]},
)
