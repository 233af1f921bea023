"""Build and install lazy.

``lazy._C`` (csrc/, pybind11) holds the C parts: the recording hot path and the IR objects it creates. It uses
only the CPython and pybind11 headers, never torch's, so it builds in seconds and against any torch. torch is a
requirement, never a build requirement (see pyproject.toml).
"""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ext = Pybind11Extension(
    "lazy._C",
    sources=["csrc/module.cpp", "csrc/ir.cpp", "csrc/record.cpp", "csrc/graph.cpp"],
    depends=["csrc/ir.h", "csrc/record.h", "csrc/graph.h"],
    cxx_std=17,
    extra_compile_args=["-O2"],
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
