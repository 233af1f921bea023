"""Extern steps of a compiled program (the cpp and Triton runtimes): an ATen call on the program's buffers.

Note [Extern runners]
A program's extern step is an ATen call whose arguments come from the program's buffers (some passed as strided
views: Note [Extern inputs are views] in lower/graph.py), its runtime scalars and constants of its template, and
whose results go back into buffers in the layout the program planned. Assembled per call from the template's plan
(lists of positions walked by comprehensions, a views loop, a results loop) that bookkeeping cost ~4.6 us over the
ATen call itself, as much as the call's own dispatch; a captured GPT step makes 18 such calls. So each extern whose
template is flat gets a runner generated once, at program build: one Python function whose body is the call with
every argument written out (``values[3].as_strided(...)``, ``scalars[2]``, ``K[0]``) and its results' layout checks.
Templates that nest markers or need a device or a generator run through ``_fill`` as the reference executor does.
"""
from __future__ import annotations

import keyword
from typing import Any, Callable, List, Optional, Sequence

import torch

from ..ir.layout import contiguous_stride
from ..lower import Extern
from .reference import _CONST, _INPUT, EXEC_OVERRIDES, _direct, _fill
from .reference import _plan as _plan_args


def extern_call(step: Extern) -> tuple:
    """What a compiled program keeps of an extern step to run it (``run_extern``): the callable, its argument
    template and plan, input buffer ids, the inputs passed as views, scalar slots, output buffer ids, the planned
    strides of outputs not laid out contiguous, and the generated runner (Note [Extern runners]) or None."""
    fn = _direct(EXEC_OVERRIDES.get(step.fn, step.fn))
    views = tuple((j, v) for j, v in enumerate(step.views) if v is not None)
    plan = _plan_args(step.args, step.kwargs)
    ins = tuple(b.id for b in step.inputs)
    slots = tuple(step.slots)
    outs = tuple((b.id if b is not None else None) for b in step.outputs)
    layouts = tuple((b.strides if b is not None and b.strides != contiguous_stride(b.shape) else None)
                    for b in step.outputs)
    runner = _runner(fn, plan, ins, dict(views), slots, outs, layouts) if plan is not None else None
    return (fn, step.args, step.kwargs, plan, ins, views, slots, outs, layouts, runner)


def run_extern(call: tuple, values: List[Any], scalars: Sequence[Any], device: torch.device) -> Sequence[tuple]:
    """An extern step of a compiled program, ``call`` made by ``extern_call``: the ATen call on its input buffers;
    returns (buffer id, result in its planned layout) for each output the program keeps: contiguous but where the
    lowering planned the op's own (Note [Attention results keep their layout] in lower/graph.py)."""
    runner = call[9]
    if runner is not None:
        return runner(values, scalars)
    fn, args, kwargs, plan, ins, views, slots, outs, layouts, _ = call
    ivals = [values[i] for i in ins]
    for j, (shape, strides, offset) in views:
        base = ivals[j]
        ivals[j] = base.as_strided(shape, strides, base.storage_offset() + offset)
    it, sc = iter(ivals), iter([scalars[s] for s in slots])
    result = fn(*_fill(args, it, sc, device), **{k: _fill(v, it, sc, device) for k, v in kwargs})
    results = result if len(outs) > 1 or isinstance(result, (tuple, list)) else (result,)
    return [(i, settle(t, st)) for i, t, st in zip(outs, results, layouts) if i is not None]


def settle(t: torch.Tensor, strides: Optional[tuple]) -> torch.Tensor:
    """``t`` in the layout planned for it: ``strides``, or contiguous where None."""
    if strides is None:
        return t if t.is_contiguous() else t.contiguous()
    if t.stride() == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _runner(fn: Any, plan: tuple, ins: tuple, views: dict, slots: tuple, outs: tuple,
            layouts: tuple) -> Callable[[List[Any], Sequence[Any]], Sequence[tuple]]:
    """The generated runner of an extern with a flat template (Note [Extern runners])."""
    consts: List[Any] = [fn]

    def const(v: Any) -> str:
        consts.append(v)
        return f"K[{len(consts) - 1}]"

    def arg(kind: int, x: Any) -> str:
        if kind == _CONST:
            return const(x)
        if kind == _INPUT:
            v = f"values[{ins[x]}]"
            if x not in views:
                return v
            shape, strides, offset = views[x]
            return f"{v}.as_strided({shape!r}, {strides!r}, {v}.storage_offset() + {offset})"
        return f"scalars[{slots[x]}]"

    aplan, kwplan = plan
    if all(name.isidentifier() and not keyword.iskeyword(name) for name, _, _ in kwplan):
        kw = [f"{name}={arg(k, x)}" for name, k, x in kwplan]
    else:  # a schema's keyword that Python's call syntax cannot spell
        kw = ["**{" + ", ".join(f"{name!r}: {arg(k, x)}" for name, k, x in kwplan) + "}"]
    call = ", ".join([arg(k, x) for k, x in aplan] + kw)
    lines = ["def run(values, scalars):", f"    r = K[0]({call})"]
    if len(outs) == 1:
        lines.append("    r = r[0] if type(r) is tuple or type(r) is list else r")
        picks = [("r", outs[0], layouts[0])]
    else:
        picks = [(f"r[{k}]", i, st) for k, (i, st) in enumerate(zip(outs, layouts))]
    kept = [(f"({i}, {'settle(' + t + ', None)' if st is None else 'settle(' + t + ', ' + repr(st) + ')'})")
            for t, i, st in picks if i is not None]
    lines.append(f"    return ({', '.join(kept)}{',' if len(kept) == 1 else ''})")
    namespace = {"K": consts, "settle": settle}
    exec(compile("\n".join(lines), "<lazy extern runner>", "exec"), namespace)  # noqa: S102 -- our own source
    return namespace["run"]
