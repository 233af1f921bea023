"""Models of methods during capture: the methods of lists, tuples, dicts and sets by (type, name), the set
constructors, ``function.__get__``, reads of tensor attributes (``tensor_attribute``), and DistributedDataParallel's
forward context and bucket rebuild (Note [DDP's bucket rebuild breaks once]).

The methods are registered in ``METHODS`` and the constructors in ``LOOKASIDES`` (lazy/capture/lookaside.py) at import
time, where ``call_method`` and ``call`` find them; ``tensor_attribute`` is called by the policy's attribute reads
(lazy/capture/policy.py).
"""
from __future__ import annotations

import builtins
import collections
import contextvars
import operator
import types
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import expr as X
from .expr import E
from .interpreter import Box
from .lookaside import LOOKASIDES, METHODS, Lookaside, Method, _key_box, lookaside, mapping_items, method
from .boxes import Bound, New
from .session import ENTRY_VALUE


# ---------------------------------------------------------------------------------------------------------------
# Methods of containers, by (type, name): list.append on a list the call built updates its shadow; on a list of
# the entry state it is an effect.


def _list_effect(p: Any, recv: Box, name: str, args: List[Box]) -> Box:
    """A mutating list method: run it, update the shadow or record the effect."""
    v, m = recv.v, recv.m
    raw = [a.v for a in args]
    result = getattr(v, name)(*raw)
    if type(m) is New:
        if name == "append":
            m.items.append(args[0])
        elif name == "extend":
            m.items.extend(p.items(args[0]))
        elif name == "insert":
            m.items.insert(p.concrete(args[0]), args[1])
        elif name == "pop":
            out = m.items.pop(p.concrete(args[0]) if args else -1)
            return out
        elif name == "clear":
            m.items.clear()
        elif name == "reverse":
            m.items.reverse()
        elif name == "remove":
            for i, b in enumerate(m.items):
                if b.v is args[0].v or b.v == args[0].v:
                    del m.items[i]
                    break
        return Box(result)
    if type(m) is E:
        p.need(recv, "type")
        if name in ("pop", "remove", "insert"):
            for a in args:
                p.concrete(a)
        from .session import Effect
        p.s.effects.append(Effect("list_method", m, name, tuple(args), held=(v, None)))
        if name == "pop":
            p.breaks("pops from a list of its inputs and uses the value")
        return Box(result)
    p.breaks(f"calls list.{name} on a list it did not reach through its inputs")
    return Box(result)


for _name in ("append", "extend", "insert", "pop", "clear", "reverse", "remove"):
    METHODS[(list, _name)] = (lambda n: lambda p, r, a, k: _list_effect(p, r, n, a))(_name)


# ---------------------------------------------------------------------------------------------------------------
# Note [Context variables in a capture]
# A library may set a contextvars.ContextVar for the length of a call and reset it before returning (transformers
# activates its output collector around a model's forward so). The capture run sets and resets the real variable
# (it is the call) and keeps a shadow of its value: a ``get`` after a ``set`` returns the box that was set (an
# object the call made, or one it read), a ``get`` before any set reads the entry state, guarded as any read is (by
# ``var.get(default)``). A replay sets nothing, so a call that returns with a variable set to anything but what it
# found breaks (function.py checks it after the call: Session.unbalanced_context_vars).


@method(contextvars.ContextVar, "set")
def _context_set(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    token = recv.v.set(args[0].v)
    shadow = p.s.context_vars.setdefault(id(recv.v), [recv.v, ENTRY_VALUE])
    p.s.context_tokens[id(token)] = (token, shadow[1])
    shadow[1] = args[0]
    return Box(token)


@method(contextvars.ContextVar, "reset")
def _context_reset(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    token = args[0].v
    recv.v.reset(token)  # raises as the call does: another variable's token, or one used twice
    saved = p.s.context_tokens.pop(id(token), None)
    if saved is None:
        p.breaks(f"resets the ContextVar {recv.v.name!r} with a token from before the call")
    else:
        p.s.context_vars[id(recv.v)][1] = saved[1]
    return Box(None)


@method(contextvars.ContextVar, "get")
def _context_get(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    shadow = p.s.context_vars.get(id(recv.v))
    if shadow is not None and shadow[1] is not ENTRY_VALUE:
        return shadow[1]
    defaults = tuple(p.concrete(a) for a in args)
    value = recv.v.get(*defaults)  # LookupError as the call raises it
    if type(recv.m) is not E:
        p.breaks(f"reads the ContextVar {recv.v.name!r}, which it did not reach through its inputs")
        return Box(value)
    return p.read(value, X.method(recv.m, "get", defaults, ()))


@method(list, "copy")
def _list_copy(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    items = p.items(recv)
    return p.new(list(recv.v), New("list", items))


def _seq_query(name: str) -> Method:
    """list/tuple ``index`` and ``count``: answered from the items, each concrete (guarded) as the answer depends on
    every one of them."""
    def handler(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        for b in p.items(recv):
            p.concrete(b)
        return Box(getattr(recv.v, name)(*[p.concrete(a) for a in args]))
    return handler


for _kind in (list, tuple):
    for _query in ("index", "count"):
        METHODS[(_kind, _query)] = _seq_query(_query)


def _dict_read(p: Any, recv: Box, key: Box) -> Tuple[bool, Optional[Box]]:
    """Whether ``key`` is in the dict, and its value box."""
    v, m = recv.v, recv.m
    if type(m) is New and m.kind == "dict":
        k = p.concrete(key)
        return (k in m.items, m.items.get(k))
    present = key.v in v
    if type(m) is E:
        p.need(recv, "type")
        kexpr = p.key_of(key)
        written = p.stored_item(recv, key, kexpr)
        if written is not None:
            return True, written
        p.s.guard("eq", E("cmp", "in", kexpr, m), present)
        return present, p.read(v[key.v], X.item(m, kexpr)) if present else None
    return present, Box(v[key.v]) if present else None


@method(dict, "get")
def _dict_get(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    present, value = _dict_read(p, recv, args[0])
    if present:
        return value
    return args[1] if len(args) > 1 else Box(None)


@method(dict, "__getitem__")
def _dict_getitem(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return p.getitem(recv, args[0])


@method(dict, "__contains__")
def _dict_contains(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return Box(_dict_read(p, recv, args[0])[0])


def _dict_view_handler(which: str) -> Method:
    def handler(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        pairs = mapping_items(p, recv) if type(recv.m) in (New, E) else [(k, Box(v)) for k, v in recv.v.items()]
        if which == "keys":
            boxes = [_key_box(p, k) if type(recv.m) is E else Box(k) for k, _ in pairs]
        elif which == "values":
            boxes = [b for _, b in pairs]
        else:
            boxes = [p.new((k, b.v), New("tuple", [_key_box(p, k) if type(recv.m) is E else Box(k), b]))
                     for k, b in pairs]
        view = getattr(recv.v, which)()
        return p.new(view, New("tuple", boxes))
    return handler


for _which in ("keys", "values", "items"):
    METHODS[(dict, _which)] = _dict_view_handler(_which)


def _dict_mutation_handler(name: str) -> Method:
    def handler(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        if name == "__setitem__":
            p.setitem(recv, args[0], args[1])
            return Box(None)
        if name == "__delitem__":
            p.delitem(recv, args[0])
            return Box(None)
        if name == "setdefault":
            present, value = _dict_read(p, recv, args[0])
            if present:
                return value
            default = args[1] if len(args) > 1 else Box(None)
            p.setitem(recv, args[0], default)
            return default
        if name == "update":
            for key, value in mapping_items(p, args[0]) if args else []:
                p.setitem(recv, Box(key), value)
            for key, value in kwargs.items():
                p.setitem(recv, Box(key), value)
            return Box(None)
        if name == "pop":
            present, value = _dict_read(p, recv, args[0])
            if not present:
                if len(args) > 1:
                    return args[1]
                raise KeyError(args[0].v)
            p.delitem(recv, args[0])
            return value
        p.breaks(f"calls dict.{name}")
        return Box(getattr(recv.v, name)(*[a.v for a in args]))
    return handler


for _name in ("setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"):
    METHODS[(dict, _name)] = _dict_mutation_handler(_name)


@method(dict, "copy")
def _dict_copy(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    shadow = dict(mapping_items(p, recv))
    return p.new(dict(recv.v), New("dict", shadow))


# collections.OrderedDict and defaultdict are dicts: their methods above apply through the MRO.
_ = (collections, builtins)


# ---------------------------------------------------------------------------------------------------------------
# Tensor attributes

TENSOR_METADATA = frozenset((
    "shape", "dtype", "device", "ndim", "is_leaf", "requires_grad", "layout", "is_cuda", "is_sparse", "is_quantized",
    "is_meta", "is_nested", "itemsize", "is_complex", "is_floating_point"))
TENSOR_VALUES = frozenset(("data", "T", "mT", "H", "mH", "real", "imag"))


def tensor_attribute(p: Any, obj: Box, name: str) -> Box:
    v, m = obj.v, obj.m
    if name in TENSOR_METADATA:
        p.need(obj, "tensor")
        if name in ("shape", "ndim") and type(m) is E:
            # read from the state at each replay: a number the call derives from a size (``n += x.shape[0]``)
            # is an expression, not a constant (guarded where it decides anything: Note [Guards])
            return Box(getattr(v, name), X.attr(m, name))
        return Box(getattr(v, name))
    if name == "grad":
        value = v.grad
        if type(m) is E:
            return Box(value, X.attr(m, "grad"))
        return Box(value)
    if name in TENSOR_VALUES:
        return p.torch_call(Box(operator.attrgetter(name)), [obj], {})
    if name == "grad_fn":
        p.need(obj, "tensor")
        return Box(v.grad_fn)
    value = getattr(v, name)
    if callable(value):
        return Box(value, Bound(obj, name))
    if name.startswith("_lz_") or name == "_version":
        p.breaks(f"reads a tensor's internal attribute {name}")
    p.need(obj, "tensor")
    return Box(value)


# ---------------------------------------------------------------------------------------------------------------
# Sets the call builds (``memo = set()`` in nn.Module's member walks): membership of objects by identity or value

def _set_ctor(kind: type) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        items = p.items(args[0]) if args else []
        for b in items:
            p.concrete(b)
        return p.new(kind(b.v for b in items), New("set", items))
    return handler


LOOKASIDES[id(set)] = _set_ctor(set)
LOOKASIDES[id(frozenset)] = _set_ctor(frozenset)


def _set_method(name: str) -> Method:
    def handler(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        if type(recv.m) is not New:
            p.breaks(f"calls set.{name} on a set it did not create")
        new = p.items(args[0]) if name in ("update", "difference_update") else list(args)
        raw = [p.concrete(b) for b in new]
        if name in ("update", "difference_update"):
            result = getattr(recv.v, name)(raw)
        else:
            result = getattr(recv.v, name)(*raw)
        if type(recv.m) is New and name in ("add", "update"):
            recv.m.items.extend(new)
        if isinstance(result, (set, frozenset)):
            return p.new(result, New("set", [Box(x) for x in result]))
        return Box(result)
    return handler


for _name in ("add", "discard", "remove", "update", "clear", "__contains__", "issubset", "issuperset",
              "isdisjoint", "difference_update"):
    METHODS[(set, _name)] = _set_method(_name)


@method(types.FunctionType, "__get__")
def _function_get(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    """``func.__get__(obj)``: the bound method, knowing its receiver's box."""
    obj = args[0]
    if obj.v is None:
        return recv
    return Box(types.MethodType(recv.v, obj.v), Bound(obj, recv.v.__name__))


# Note [DDP's bucket rebuild breaks once]
# DistributedDataParallel's Reducer rebuilds its gradient buckets once, in the first forward after the first
# backward (in the order the gradients arrived): it broadcasts rank 0's bucket assignment and reads it on the host,
# a sync inside the call. That is a first-steps event like an optimizer creating its state, so the break is
# transient: this call runs as captured code would have (plainly), and the next call, whose Reducer no longer
# rebuilds, is captured. The Reducer's other calls (prepare_for_forward/backward, the logger) take no tensors and
# change only its bookkeeping for the autograd hooks, which a replay does not run: nothing of them is replayed.
#
# DDP's forward also marks itself as the active DDP module (``_inside_ddp_forward``: a class attribute set and
# restored around the module's forward, for torch.compile's DDPOptimizer). The context manager runs natively: the pair
# of stores leaves the class as it was, and no replayed code could observe what is between them.
_c10d = getattr(torch._C, "_distributed_c10d", None)
if _c10d is not None:
    from torch.nn.parallel import DistributedDataParallel as _DDP

    @lookaside(_DDP.__dict__["_inside_ddp_forward"])
    def _ddp_forward_context(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        return p.new(_DDP._inside_ddp_forward(args[0].v), New("object"))

    @method(_c10d.Reducer, "_rebuild_buckets")
    def _reducer_rebuild_buckets(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        before = p.s.broken
        rebuilt = bool(recv.v._rebuild_buckets(*[p.concrete(a) for a in args]))
        if rebuilt and before is None:
            p.s.broken = None  # the rebuild's own sync
            p.breaks("DistributedDataParallel rebuilds its gradient buckets (once, in the forward after the first "
                     "backward)", transient=True)
        return Box(rebuilt)
