"""The reference executor: a compiled graph that runs every node through ATen on the backing device.

It is the oracle the compiler is tested against and its fallback, so it stays exact and simple. A ``Program``
holds no IR node and no data: only instructions over positions, so the graph cache can keep it while the
graph it came from is freed, and run it again on the leaves and runtime scalars of a later, equal graph.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch

from ..debug import metrics
from ..device.backing import eager_dispatch
from ..ir.graph import Linearized, format_graph
from ..ir.node import DATA, DEVICE, GENERATOR, GETITEM, TENSOR, _Marker

aten = torch.ops.aten


def _reshape_view(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    # NOTE: IR values are logical (Note [IR values are logical]); the physical layout of an intermediate may not
    # allow a true view, and reshape gives the same contents.
    return x.reshape(size)


def _dtype_view(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.contiguous().view(dtype)


def _complex_view(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x.contiguous())


# Ops whose ATen kernel depends on the physical layout of its input: run a layout-independent equivalent. The
# conj and neg bits are layout too: a node's value is the conjugated (negated) contents, so no kernel, and no
# check like view_as_real's "unresolved conjugated tensors", ever sees the bit.
EXEC_OVERRIDES: Dict[Any, Callable[..., Any]] = {
    aten.view.default: _reshape_view,
    aten._unsafe_view.default: _reshape_view,
    aten.view.dtype: _dtype_view,
    aten.view_as_complex.default: _complex_view,
    aten._conj.default: torch.conj_physical,
    aten._neg_view.default: torch.neg,
}


def _fill(value: Any, inputs: Any, scalars: Any, device: torch.device) -> Any:
    if value is TENSOR:
        return next(inputs)
    if type(value) is _Marker:
        if value is DEVICE:
            return device
        if value is GENERATOR:
            gen = torch.Generator(device=device)
            gen.manual_seed(next(scalars))
            return gen
        return next(scalars)
    if type(value) is tuple:
        return [_fill(v, inputs, scalars, device) for v in value]
    return value


_CONST, _INPUT, _SCALAR, _LIST = 0, 1, 2, 3


def _plan(args: tuple, kwargs: tuple, lists: bool = False) -> Any:
    """A flat argument plan ``([(kind, x)], [(name, kind, x)])`` of a node's templates, built once per Program so a
    run does no template walk; None when a template nests markers or needs a device or generator (then
    ``_fill`` runs). ``lists``: a list of tensors and Nones (``index_put``'s indices) is one ``(_LIST, [input
    position or None, ...])`` entry (runtime/cpp_native.py) instead of a reason to give up."""
    counts = [0, 0]
    try:
        return [_plan_entry(v, counts, lists) for v in args], [(k,) + _plan_entry(v, counts, lists) for k, v in kwargs]
    except LookupError:
        return None


def _plan_entry(v: Any, counts: list, lists: bool) -> Any:
    """One argument's plan entry; ``counts``: the tensors and scalars numbered so far (a module function: a nested
    recursive one is a reference cycle per node, left to the cyclic collector)."""
    if v is TENSOR:
        counts[0] += 1
        return (_INPUT, counts[0] - 1)
    if type(v) is _Marker:
        if v is DEVICE or v is GENERATOR:
            raise LookupError
        counts[1] += 1
        return (_SCALAR, counts[1] - 1)
    if type(v) is tuple:
        if lists and any(x is TENSOR for x in v) and all(x is TENSOR or x is None for x in v):
            return (_LIST, [None if x is None else _plan_entry(x, counts, lists)[1] for x in v])
        if any(type(x) is _Marker or type(x) is tuple for x in v):
            raise LookupError
        return (_CONST, list(v))
    return (_CONST, v)


def _direct(fn: Any) -> Any:
    # An OpOverload's __call__ is a Python frame around its C++ overload: call the overload itself.
    return getattr(fn, "_op", fn) if isinstance(fn, torch._ops.OpOverload) else fn


class Program:
    """Instructions over a table of values: data leaves, then one ATen call per node, then the outputs."""

    backend = "reference"

    def __init__(self, lin: Linearized, device: torch.device, source: bool = True) -> None:
        """``source``: keep the graph's text as ``source`` (dumps); a compiled program's stand-in while it builds
        (runtime/cpp_build.py ``BuildingProgram``), whose dumps are the compiled program's, needs none."""
        self.device = device
        self.outputs = list(lin.outputs)
        self.num_values = len(lin.order)
        self.source = format_graph(lin.order, lin.outputs) if source else ""
        last_use: Dict[int, int] = {}
        for p, node in enumerate(lin.order):
            for i in node.inputs:
                last_use[lin.positions[id(i)]] = p
        keep = set(self.outputs)
        frees: Dict[int, List[int]] = {}
        for value, p in last_use.items():
            if value not in keep:
                frees.setdefault(p, []).append(value)
        self.leaf_positions: List[int] = []
        self.instrs: list = []
        scalar_at = 0
        for p, node in enumerate(lin.order):
            if node.op is DATA:
                self.leaf_positions.append(p)
                continue
            ins = tuple(lin.positions[id(i)] for i in node.inputs)
            n = len(node.scalars)
            if node.op is GETITEM:
                self.instrs.append((p, None, node.args[0], ins, 0, 0, (), frees.get(p, ())))
                continue
            fn = _direct(EXEC_OVERRIDES.get(node.op, node.op))
            plan = _plan(node.args, node.kwargs)
            self.instrs.append((p, fn, (node.args, plan), ins, scalar_at, n, node.kwargs, frees.get(p, ())))
            scalar_at += n
        self.num_nodes = len(self.instrs)

    def run(self, leaves: Sequence[torch.Tensor], scalars: Sequence[Any]) -> List[torch.Tensor]:
        values: List[Any] = [None] * self.num_values
        for p, leaf in zip(self.leaf_positions, leaves):
            values[p] = leaf
        with eager_dispatch():
            self._run(values, scalars)
        metrics.bump("executed_graphs")
        metrics.bump("executed_nodes", self.num_nodes)
        return [values[o] for o in self.outputs]

    def _run(self, values: List[Any], scalars: Sequence[Any]) -> None:
        device = self.device
        for p, fn, args, ins, s0, ns, kwargs, frees in self.instrs:
            if fn is None:  # getitem
                values[p] = values[ins[0]][args]
            else:
                template, plan = args
                ivals = [values[i] for i in ins]
                if plan is not None:
                    aplan, kwplan = plan
                    a = [x if k == _CONST else ivals[x] if k == _INPUT else scalars[s0 + x] for k, x in aplan]
                    kw = {name: x if k == _CONST else ivals[x] if k == _INPUT else scalars[s0 + x]
                          for name, k, x in kwplan}
                else:
                    it = iter(ivals)
                    sc = iter(scalars[s0:s0 + ns])
                    a = _fill(template, it, sc, device)
                    kw = {k: _fill(v, it, sc, device) for k, v in kwargs}
                values[p] = fn(*a, **kw)
            for f in frees:
                values[f] = None


def run_node(op: Any, args: tuple, kwargs: tuple, inputs: Sequence[torch.Tensor], scalars: Sequence[Any],
             device: torch.device) -> Any:
    """One node's op applied to real inputs, exactly as a Program runs it."""
    it, sc = iter(inputs), iter(scalars)
    a = _fill(args, it, sc, device)
    kw = {k: _fill(v, it, sc, device) for k, v in kwargs}
    with eager_dispatch():
        return EXEC_OVERRIDES.get(op, op)(*a, **kw)


def compile_reference(lin: Linearized, device: torch.device) -> Program:
    return Program(lin, device)
