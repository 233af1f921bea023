"""The plan of a compiled program run in C, without the GIL (Note [Programs run in C] in csrc/runner.cpp; a Triton
program's kernels: Note [Triton kernels launched in C] in csrc/cuda_launch.cpp).

A program qualifies when every extern step is an ``aten`` operator with a flat argument plan (runtime/reference.py
``_plan``: buffers, runtime scalars, constants) whose constants and results the C runner can express; otherwise it
runs from Python (runtime/cpp.py) as before. ``NATIVE`` turns the C runner off (tests compare the two).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from .. import _C
from ..device.backing import _EAGER_KEYS, SCALAR_TYPE_CODES
from ..ir.node import Op
from .reference import _CONST, _INPUT, _LIST, EXEC_OVERRIDES, _plan

NATIVE = True
# A run in C takes the outputs of every kernel segment before it starts (their shapes are fixed; taking them needs
# Python): the buffers externs read that are not graph outputs then live for the whole run instead of until their
# last read. Programs where those add more than this many bytes (a large graph, whose arena is not kept: runtime/
# cpp.py) run from Python; their kernels are long enough that the GIL handovers the C run saves matter little.
UPFRONT_BYTES = 16 << 20

# c10::ScalarType and c10::MemoryFormat codes: what a dtype or memory format argument is in a boxed call
_CODES = {**SCALAR_TYPE_CODES,
          torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2, torch.channels_last_3d: 3}


class Unsupported(Exception):
    """A step the C runner cannot express: the program runs from Python."""


def _constant(value: Any, kind: str) -> tuple:
    if value is None:
        return ("n",)
    if type(value) is bool:
        return ("b", value)
    if type(value) is int:
        return ("f", float(value)) if kind in ("float", "Optional[float]") else ("i", value)
    if type(value) is float:
        if kind not in ("float", "Optional[float]", "number", "Optional[number]"):
            raise Unsupported(f"a float for {kind}")
        return ("f", value)
    if type(value) is str:
        return ("s", value)
    if isinstance(value, (torch.dtype, torch.memory_format)):
        if value in _CODES:
            return ("i", _CODES[value])
        raise Unsupported(f"the constant {value}")
    if type(value) in (list, tuple):
        if kind in ("List[int]", "Optional[List[int]]", "List[SymInt]", "Optional[List[SymInt]]") and \
                all(type(x) is int for x in value):
            return ("il", list(value))
        if kind in ("List[float]", "Optional[List[float]]") and all(type(x) in (int, float) for x in value):
            return ("fl", [float(x) for x in value])
        if kind in ("List[bool]", "Optional[List[bool]]") and all(type(x) is bool for x in value):
            return ("bl", list(value))
    raise Unsupported(f"a constant {type(value).__name__} for {kind}")


def _scalar_as(kind: str, runtime: Any) -> str:
    if kind in ("float", "Optional[float]"):
        return "f"
    if kind in ("int", "Optional[int]", "SymInt", "Optional[SymInt]"):
        return "i"
    if kind in ("bool", "Optional[bool]"):
        return "b"
    if kind in ("number", "Optional[number]") and runtime in (float, int, bool):
        return {float: "f", int: "i", bool: "b"}[runtime]
    raise Unsupported(f"a runtime scalar for {kind}")


def extern_step(op: Any, call: tuple, scalar_kinds: Sequence[Any], frees: Sequence[int]) -> tuple:
    """The runner's plan of an extern step (``call`` from runtime/externs.py ``extern_call``)."""
    if isinstance(op, Op) and op.fn is op.target:  # a random op that draws nothing: the aten call itself
        op = op.target
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or op in EXEC_OVERRIDES:
        raise Unsupported(f"{op} is not a plain aten operator")
    _, targs, tkwargs, plan, ins, views, slots, outs, layouts, _ = call
    if plan is None:
        plan = _plan(targs, tkwargs, lists=True)
        if plan is None:
            raise Unsupported(f"{op} takes a nested argument, a device or a generator")
    schema = op._schema
    if any(str(r.type) != "Tensor" for r in schema.returns) or len(schema.returns) != len(outs):
        raise Unsupported(f"{op} returns {[str(r.type) for r in schema.returns]}")
    aplan, kwplan = plan
    by_name = {name: (k, x) for name, k, x in kwplan}
    view_of = dict(views)
    args: List[tuple] = []
    for i, a in enumerate(schema.arguments):
        if i < len(aplan) and not a.kwarg_only:
            entry: Optional[tuple] = aplan[i]
        else:
            entry = by_name.pop(a.name, None)
        kind = str(a.type)
        if entry is None:
            if not a.has_default_value():
                raise Unsupported(f"{op}: no value for {a.name}")
            args.append(("d",))
        elif entry[0] == _INPUT:
            if kind not in ("Tensor", "Optional[Tensor]"):
                raise Unsupported(f"{op}: a tensor for {kind}")
            args.append(("t", ins[entry[1]], view_of.get(entry[1])))
        elif entry[0] == _LIST:
            if kind not in ("List[Tensor]", "List[Optional[Tensor]]"):
                raise Unsupported(f"{op}: a tensor list for {kind}")
            args.append(("tl", tuple(None if j is None else (ins[j], view_of.get(j)) for j in entry[1]),
                         kind == "List[Optional[Tensor]]"))
        elif entry[0] == _CONST:
            args.append(("c", _constant(entry[1], kind)))
        else:
            slot = slots[entry[1]]
            args.append(("s", slot, _scalar_as(kind, scalar_kinds[slot])))
    if len(aplan) > len(schema.arguments) or by_name:
        raise Unsupported(f"{op}: arguments beyond its schema")
    results = tuple((-1 if b is None else b, st) for b, st in zip(outs, layouts))
    return ("ext", schema.name, schema.overload_name, tuple(args), results, tuple(frees))


def dtype_code(dtype: torch.dtype) -> int:
    """The c10::ScalarType code of ``dtype``, for a buffer the C runner allocates."""
    if not isinstance(dtype, torch.dtype) or dtype not in _CODES:
        raise Unsupported(f"a buffer of {dtype}")
    return _CODES[dtype]


def make_runner(steps: List[tuple], num_buffers: int, cuda: Optional[tuple] = None) -> Any:
    """The C runner of a plan (a list of ``("seg", address, frees)``, ``("cu", ...)`` and ``extern_step`` tuples);
    ``cuda``: (device index, arena bytes, [(buffer, arena offset)]) of a Triton program (runtime/triton.py)."""
    include, exclude = _EAGER_KEYS
    return _C.make_runner(steps, num_buffers, include.raw_repr(), exclude.raw_repr(), *(cuda or ()))
