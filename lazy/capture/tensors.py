"""Torch calls during capture: lazy ops are recorded as in any run; ops on host tensors become host ops.

``torch_call`` runs a torch callable (a function, a Tensor method, an operator on tensors, the autograd engine) on
the real values and sorts what happened:
- a call with a lazy tensor among its inputs or outputs recorded lazy ops: the pre-existing lazy tensors it read
  are guarded by metadata and their storages bound to the expressions that reached them (the replay's graph
  inputs); the nodes it recorded are the ones with serials in its window, and with the symbolic numbers among its
  arguments they go to the scalar binding (Note [Binding scalars] in lazy/capture/finalize.py);
- a call on host tensors only (an optimizer's CPU step counter ``step_t += 1``, ``step_t.item()``) is a host op: it
  is replayed, in order, before the graph runs, and its result is a register;
- the autograd engine's backward writes ``.grad`` of leaves: those writes become effects.
Recorder hooks (``CaptureHooks``, installed in lazy/trace/record.py and seen by lazy/sync while capturing) report the
host tensors snapshotted into the graph, the seeds of random ops, and syncs (which break the capture).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

import torch

from .. import _C
from ..device.tensor import LazyTensor
from . import expr as X
from .expr import E
from .interpreter import Box
from .boxes import NUMBERS, Bound, New, is_lazy, is_tensor, library_code
from .session import Effect, HostOp, TorchCall


def _boxes(args: List[Box], kwargs: Dict[str, Box]) -> List[Box]:
    out: List[Box] = []
    for b in args:
        _walk_boxes(b, out)
    for b in kwargs.values():
        _walk_boxes(b, out)
    return out


def _walk_boxes(b: Box, out: List[Box]) -> None:
    """Appends ``b`` and the boxes inside it (a module function: a nested recursive one would be a reference cycle
    holding the call's tensors until the cyclic collector runs)."""
    out.append(b)
    if type(b.m) is New and b.m.kind in ("list", "tuple"):
        for x in b.m.items:
            _walk_boxes(x, out)
    elif type(b.m) is New and b.m.kind == "dict":
        for x in b.m.items.values():
            _walk_boxes(x, out)
    elif type(b.m) is E and type(b.v) in (list, tuple) and any(is_tensor(x) for x in b.v):
        for i, x in enumerate(b.v):
            _walk_boxes(Box(x, X.item(b.m, i)), out)


def operand(p: Any, b: Box) -> Any:
    """``b`` as an operand of a host op replayed later: its expression, a rebuilt container, or its value."""
    if type(b.m) is E:
        if type(b.v) in NUMBERS:
            p.concrete(b)
            return b.v
        return b.m
    if type(b.m) is New and b.m.kind in ("list", "tuple"):
        return X.seq(b.m.kind, tuple(operand(p, x) for x in b.m.items))
    if type(b.m) is New:
        p.breaks(f"passes a {type(b.v).__name__} it created to an op on host tensors")
    if is_lazy(b.v):
        p.breaks("passes a lazy tensor to an op on host tensors")
    return b.v


def torch_call(p: Any, fn: Box, args: List[Box], kwargs: Dict[str, Box], recv: Optional[Box] = None) -> Box:
    s = p.s
    every = _boxes(([recv] if recv is not None else []) + args, kwargs)
    lazies = [b for b in every if is_lazy(b.v)]
    hosts = [b for b in every if is_tensor(b.v) and not is_lazy(b.v)]
    syms = [b for b in every if type(b.m) is E and type(b.v) in NUMBERS]
    grads_before = None
    for b in lazies:
        if type(b.m) is E:
            p.need(b, "tensor")
            st = b.v._lz_st
            s.storage_source.setdefault(id(st), (st, b.m))
            if b.v.requires_grad and b.v.is_leaf:
                p.leaves_seen.setdefault(id(b.v), (b.v, b))
    engine = getattr(fn.v, "__name__", "") == "run_backward"
    if engine:
        grads_before = {k: t.grad for k, (t, _) in p.leaves_seen.items()}
    for b in hosts:
        if type(b.m) is E and b.m.op != "reg":
            p.need(b, "tensor")
    known_hosts = {id(b.v): b.m for b in hosts if type(b.m) is E}
    hooks = CaptureHooks.current
    hooks.host_exprs = known_hosts
    hooks.transfers = []
    first = _C.next_node_serial()
    raw_args = [b.v for b in args]
    raw_kwargs = {k: b.v for k, b in kwargs.items()}
    records_autograd = torch.is_grad_enabled() and any(b.v.requires_grad for b in lazies)
    if syms and records_autograd:
        for b in syms:  # autograd keeps these numbers for the backward, where no binding can see them
            p.concrete(b)
        syms = []
    with _tripwire(p, fn.v):
        result = fn.v(*raw_args, **raw_kwargs)
    last = _C.next_node_serial()
    made_lazy = bool(lazies) or _contains_lazy(result)
    where = p.user_where()
    if made_lazy:
        if syms:
            s.torch_calls.append(TorchCall(_name(fn.v), first, last, [(b.v, b.m) for b in syms], where))
        _bind_transfers(p, hooks, fn, args, kwargs, recv, result)
        if engine:
            _backward_effects(p, grads_before, raw_args, raw_kwargs)
        return _wrap(p, result, recv, args)
    if not hosts and not _contains_tensor(result):
        # No tensor in or out (a global-state query, a context manager of torch's): nothing to replay; its symbolic
        # arguments, if any, decide its result, so they are guarded.
        for b in syms:
            p.concrete(b)
        from .lookaside import wrap_native
        return wrap_native(p, result)
    # A host op: replayed before the graph, in order.
    k = len(s.host_ops)
    if recv is not None:
        call = X.method(operand(p, recv), getattr(fn.v, "__name__", None) or _name(fn.v),
                        tuple(operand(p, a) for a in args), tuple((n, operand(p, v)) for n, v in kwargs.items()))
    else:
        call = X.call(fn.v, tuple(operand(p, a) for a in args), tuple((n, operand(p, v)) for n, v in kwargs.items()))
    s.host_ops.append(HostOp(k, call, (), {}))
    return _host_result(p, result, X.reg(k), recv, args)


def _contains_lazy(v: Any) -> bool:
    if is_lazy(v):
        return True
    if isinstance(v, (list, tuple)):
        return any(_contains_lazy(x) for x in v)
    return False


def _contains_tensor(v: Any) -> bool:
    if is_tensor(v):
        return True
    if isinstance(v, (list, tuple)):
        return any(_contains_tensor(x) for x in v)
    return False


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _wrap(p: Any, result: Any, recv: Optional[Box], args: List[Box]) -> Box:
    """A lazy op's result: graph values need no metadata; a returned input (in-place ops return self) keeps its box;
    Python values (metadata of tensors) are constants."""
    if recv is not None and result is recv.v:
        return recv
    for a in args:
        if result is a.v and (is_tensor(result)):
            return a
    if is_lazy(result):
        return Box(result)
    if isinstance(result, (list, tuple)):
        items = [_wrap(p, x, None, args) for x in result]
        return p.new(result, New("tuple" if isinstance(result, tuple) else "list", items))
    if is_tensor(result):
        p.breaks("an op on lazy tensors returned a host tensor (a copy to the cpu)")
    return Box(result)


def _host_result(p: Any, result: Any, e: E, recv: Optional[Box], args: List[Box]) -> Box:
    if recv is not None and result is recv.v:
        return recv
    if isinstance(result, tuple) and not isinstance(result, torch.Size):
        items = [_host_result(p, x, X.item(e, i), None, []) for i, x in enumerate(result)]
        return p.new(result, New("tuple", items))
    if isinstance(result, (torch.Tensor,) + NUMBERS):
        return Box(result, e)
    if result is None or isinstance(result, (str, torch.dtype, torch.device, torch.Size)):
        return Box(result)
    return p.new(result, New("object"))


def _bind_transfers(p: Any, hooks: "CaptureHooks", fn: Box, args: List[Box], kwargs: Dict[str, Box],
                    recv: Optional[Box], result: Any) -> None:
    """Data leaves this call created from host tensors: from a host tensor the capture follows, the leaf is that
    tensor's expression; from data the call made itself (``torch.tensor(data, device='lazy')``), the call is replayed
    and the leaf is its result's data."""
    untracked = [leaf for src, leaf in hooks.transfers if src is None]
    for src, leaf in hooks.transfers:
        if src is not None:
            p.s.host_leaves[id(leaf)] = src
            p.s.remember(leaf)
    if not untracked:
        return
    if any(is_lazy(b.v) for b in _boxes(args, kwargs)) or recv is not None and is_lazy(recv.v):
        return  # made inside an op on lazy tensors from its constant arguments: a constant leaf
    k = len(p.s.host_ops)
    call = X.call(fn.v, tuple(_operand_const(p, a) for a in args),
                  tuple((n, _operand_const(p, v)) for n, v in kwargs.items()))
    p.s.host_ops.append(HostOp(k, call, (), {}))
    for path, t in _lazy_paths(result, X.reg(k)):
        value = t._lz_st.value
        if value.is_data:
            p.s.host_leaves[id(value)] = X.attr(X.attr(X.attr(path, "_lz_st"), "value"), "data")
            p.s.remember(value)


def _operand_const(p: Any, b: Box) -> Any:
    from .tensors import operand
    return operand(p, b)


def _lazy_paths(v: Any, e: E) -> list:
    if is_lazy(v):
        return [(e, v)]
    if isinstance(v, (list, tuple)):
        return [pair for i, x in enumerate(v) for pair in _lazy_paths(x, X.item(e, i))]
    return []


def _backward_effects(p: Any, before: Dict[int, Any], args: list, kwargs: dict) -> None:
    """``.grad`` of the leaves the capture saw, as the engine left them: new gradient tensors are effects."""
    for k, (t, b) in p.leaves_seen.items():
        new = t.grad
        if new is not before.get(k):
            value = Box(new)
            p.s.effects.append(Effect("setattr", b.m, "grad", value, (id(t), "grad"), (t, "grad")))
            p.s.written[(id(t), "grad")] = value
    roots = args[0] if args else kwargs.get("tensors", ())
    p.s.backward_roots.extend(roots if isinstance(roots, (list, tuple)) else [roots])
    retain = args[2] if len(args) > 2 else kwargs.get("keep_graph", False)
    if retain:
        p.s.retain_graph = True


class _tripwire:
    """Breaks the capture if user code (outside torch, lazy and the standard library) runs natively inside a call
    the interpreter cannot follow (a tensor hook run by the autograd engine, a custom autograd Function)."""

    def __init__(self, p: Any, fn: Any) -> None:
        self.p, self.fn = p, fn

    def __enter__(self) -> None:
        self.previous = sys.getprofile()
        sys.setprofile(self._profile)

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self.previous)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
            if not library_code(filename):
                self.p.breaks(f"runs {frame.f_code.co_qualname} ({filename}:{frame.f_lineno}) natively inside "
                              f"{_name(self.fn)}, where capture cannot follow it")


class CaptureHooks:
    """What the recorder and the sync layer report while a capture runs (installed as lazy.trace.record.CAPTURE)."""

    current: Optional["CaptureHooks"] = None

    def __init__(self, policy: Any) -> None:
        self.p = policy
        self.host_exprs: Dict[int, E] = {}
        self.transfers: list = []

    def on_constant(self, host: torch.Tensor, leaf: Any) -> None:
        """A host tensor argument of a lazy op snapshotted into the graph as ``leaf``."""
        e = self.host_exprs.get(id(host))
        if e is not None:
            self.p.s.host_leaves[id(leaf)] = e
            self.p.s.remember(leaf)

    def on_transfer(self, host: torch.Tensor, leaf: Any) -> None:
        """``host.to('lazy')``: a data leaf made from a host tensor."""
        self.transfers.append((self.host_exprs.get(id(host)), leaf))

    def on_seed(self, seed: int, generator: Any) -> None:
        """A random op drew ``seed``: a replay draws a fresh one from the same generator at the same point."""
        from ..trace.record import _draw_seed
        s = self.p.s
        k = len(s.host_ops)
        s.host_ops.append(HostOp(k, X.call(_draw_seed, (X.pinned(generator) if generator is not None else None,)),
                                 (), {}))
        s.seeds.append((seed, k))
        if generator is not None:
            s.remember(generator)

    def on_sync(self, cause: str) -> None:
        self.p.breaks(f"syncs ({cause}): a value is read from the lazy device inside the function")


_ = LazyTensor, Bound
