"""Build and install lazy.

There is no C++ extension yet: csrc/ will hold the PEP 523 frame hook (lazy._C, pybind11) once it exists, and this
file will build it then. torch is a requirement, never a build requirement (see pyproject.toml).
"""
from setuptools import find_packages, setup

setup(
    name="lazy",
    version="0.1.0",
    description="A lazy-tensor runtime for PyTorch: record ATen ops into a graph, compile and run it at sync points",
    packages=find_packages(include=["lazy", "lazy.*"]),
    python_requires=">=3.11",
    install_requires=["torch>=2.11", "numpy", "pybind11>=2.10"],
    extras_require={"triton": ["triton"], "test": ["pytest", "expecttest"]},
)
