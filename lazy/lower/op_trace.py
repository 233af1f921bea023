"""A light tracer of decompositions: the ATen ops a function runs on meta tensors, as a list of steps.

Note [Tracing decompositions without FX]
Lowering decomposes composite ops by tracing PyTorch's decompositions on meta tensors (lazy/lower/decompose.py),
one to six traces per op signature, and a training step's graph has tens of signatures: with ``make_fx`` each
trace cost 20-85 ms (FX proxies and the metadata it keeps on every node), which made lowering the larger part of a
step's first compile (a CNN step: 1.4 of 2.4 s). Decomposition needs less: the ops in order, their arguments with
tensors named by the step that made them, and the output's shape and dtype. ``trace`` records that in a
``TorchDispatchMode`` over meta tensors, applying the decomposition table as make_fx does (a table entry runs in
place of the op, under the same mode, unless it returns NotImplemented), and names a tuple output's elements by
``getitem`` steps, as make_fx's graph does. What make_fx would turn into a constant of the graph (a tensor the
function did not get from its inputs or make with an op) raises ``Untraceable``: the caller traces with make_fx
instead, so the result never depends on which tracer ran. ``trace`` and make_fx give the same steps for every
decomposition the tests lower (tests/test_lower.py compares them).
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.utils._pytree as pytree
from torch.fx.immutable_collections import immutable_list
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary


aten = torch.ops.aten
_NOT_DECOMPOSED = (aten.size.default, aten.stride.default, aten.storage_offset.default)  # as in make_fx
try:  # make_fx's own test of whether autograd would have run an op's CompositeImplicitAutograd kernel
    from torch.utils._python_dispatch import autograd_would_have_decomposed as _would_decompose
except ImportError:  # an older torch, whose make_fx runs every one that reaches it
    def _would_decompose(func: Any, flat_args: Any) -> bool:
        return True


class Untraceable(Exception):
    """The function does something the light tracer does not follow (make_fx traces it instead)."""


class Step:
    """One traced op, shaped as make_fx's graph node: ``op`` (placeholder, call_function, output), ``target``,
    ``args`` and ``kwargs`` with tensors replaced by the Step that made them, ``meta["val"]`` its value."""

    __slots__ = ("op", "target", "args", "kwargs", "meta")

    def __init__(self, op: str, target: Any, args: tuple, kwargs: dict, val: Any) -> None:
        self.op, self.target, self.args, self.kwargs = op, target, args, kwargs
        self.meta = {"val": val}

    def __repr__(self) -> str:
        return f"Step({self.op}, {self.target})"


class _Recorder(TorchDispatchMode):
    def __init__(self, table: Dict[Any, Callable[..., Any]]) -> None:
        super().__init__()
        self.table = table
        self.steps: List[Step] = []
        # tensor -> the step whose value it is, held weakly as make_fx holds its proxies: a strong reference
        # would make a factory's result shared, and torch's factories then detach it (one more op in the trace)
        self.made = WeakTensorKeyDictionary()

    def name(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            step = self.made.get(v)
            if step is None:
                raise Untraceable("a tensor that no traced op made (make_fx keeps it as a constant)")
            return step
        if type(v) is list:  # as FX keeps a node's list arguments
            return immutable_list(self.name(x) for x in v)
        if isinstance(v, (list, tuple)):
            return type(v)(self.name(x) for x in v)
        return v

    def value(self, v: Any, step: Step) -> None:
        self.made[v] = step

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        decomposition = self.table.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func not in _NOT_DECOMPOSED and _would_decompose(func, pytree.tree_leaves((args, kwargs))):
            with self:  # a CompositeImplicitAutograd kernel, as make_fx runs it
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        named_args, named_kwargs = self.name(args), {k: self.name(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        # a step keeps a detached alias of its value (as make_fx's metadata does), not the value itself
        if isinstance(out, torch.Tensor):
            step = Step("call_function", func, named_args, named_kwargs, out.detach())
            self.steps.append(step)
            self.value(out, step)
        elif isinstance(out, (tuple, list)) and all(x is None or isinstance(x, torch.Tensor) for x in out):
            step = Step("call_function", func, named_args, named_kwargs,
                        tuple(x.detach() if x is not None else None for x in out))
            self.steps.append(step)
            for i, x in enumerate(out):
                if x is not None:
                    item = Step("call_function", operator.getitem, (step, i), {}, x.detach())
                    self.steps.append(item)
                    self.value(x, item)
        else:
            raise Untraceable(f"{func} returned {type(out).__name__}")
        return out


def trace(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], table: Dict[Any, Callable[..., Any]]) -> List[Step]:
    """The steps of ``fn(*inputs)`` (meta tensors): placeholders, the ops, then an output step."""
    rec = _Recorder(table)
    for t in inputs:
        step = Step("placeholder", None, (), {}, t.detach())
        rec.steps.append(step)
        rec.value(t, step)
    with rec:
        out = fn(*inputs)
    rec.steps.append(Step("output", "output", (rec.name(out),), {}, None))
    return rec.steps
