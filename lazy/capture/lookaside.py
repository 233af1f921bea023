"""Calls during capture: what is interpreted, what is modelled, what runs as a torch op, what breaks the capture.

``call`` decides for every call the interpreter makes (lazy/capture/policy.py):
- Python functions, methods and ``__call__``s (an nn.Module) are interpreted;
- builtins that move values between containers or compute on numbers (``len``, ``isinstance``, ``getattr``, ``zip``,
  ``min``, ``math.sqrt``, ``list.append``, ``dict.items``, ...) are modelled here, so that what they return keeps its
  provenance and what they store becomes an effect;
- callables of torch (functions, Tensor methods, the autograd engine) go to ``torch_call`` (lazy/capture/tensors.py);
- classes are instantiated by interpreting ``__init__``;
- what is left is run natively only when nothing it touches can change between calls, otherwise the capture breaks:
  printing, files, the clock, Python's ``random``, reseeding a torch generator, user code the interpreter cannot see.
"""
from __future__ import annotations

import builtins
import collections
import functools
import math
import operator
import sys
import types
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .. import _C
from . import expr as X
from .expr import E
from .interpreter import Box, Generator, decode
from .policy import NUMBERS, CONSTANT_TYPES, Bound, BoxIter, New, is_tensor

Lookaside = Callable[[Any, List[Box], Dict[str, Box]], Box]
LOOKASIDES: Dict[int, Lookaside] = {}
_KEEP: List[Any] = []


def lookaside(*targets: Any) -> Callable[[Lookaside], Lookaside]:
    def register(fn: Lookaside) -> Lookaside:
        for t in targets:
            LOOKASIDES[id(t)] = fn
            _KEEP.append(t)
        return fn
    return register


# ---------------------------------------------------------------------------------------------------------------
# The call decision

def call(p: Any, fn: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    target, m = fn.v, fn.m
    if type(m) is Bound:
        return call_method(p, m.recv, m.name, target, args, kwargs)
    kind = type(target)
    if kind.__name__ == "CompiledFunction" and kind.__module__ == "lazy.capture.function":
        return call(p, Box(target.fn, X.attr(m, "fn") if type(m) is E else None), args, kwargs)
    if kind is types.FunctionType:
        p.need(fn, "id")
        wrapped = _dynamo_wrapper(target)
        if wrapped is not None:
            return call(p, Box(wrapped), args, kwargs)
        if target.__code__.co_filename.startswith(_LAZY_ROOT):
            return p.torch_call(fn, args, kwargs)  # lazy's own methods (Tensor.item, .cpu): run as the runtime runs
        handler = LOOKASIDES.get(id(target))
        if handler is not None:
            return handler(p, args, kwargs)
        if decode(target.__code__).supported and target not in NATIVE_PYTHON:
            return p.run_python(target, args, kwargs)
        return opaque(p, fn, args, kwargs)
    if kind is types.MethodType:
        if type(fn.m) is E:
            # NOTE: a method read from state is bound anew at every read (``Function.apply``, a classmethod: DDP's
            # _DDPSink): an identity guard on it would fail at every call, so it guards what the method binds.
            p.need(Box(target.__func__, X.attr(fn.m, "__func__")), "id")
            p.need(Box(target.__self__, X.attr(fn.m, "__self__")), "id")
        else:
            p.need(fn, "id")
        recv = Box(target.__self__, X.attr(fn.m, "__self__") if type(fn.m) is E else None)
        return call(p, Box(target.__func__), [recv] + args, kwargs)
    if kind is functools.partial:
        p.need(fn, "id")
        inner = Box(target.func, X.attr(fn.m, "func") if type(fn.m) is E else None)
        pre = [p.const(a) for a in target.args]
        return call(p, inner, pre + args, {**{k: p.const(v) for k, v in target.keywords.items()}, **kwargs})
    handler = LOOKASIDES.get(id(target))
    if handler is not None:
        p.need(fn, "id")
        return handler(p, args, kwargs)
    if kind is weakref.ReferenceType and not args and not kwargs:  # a weakref's referent, read again at replay
        p.need(fn, "id")
        referent = target()
        return Box(referent, X.call(fn.m, ()) if type(fn.m) is E else X.pinned(referent))
    if isinstance(target, type):
        p.need(fn, "id")
        return instantiate(p, fn, args, kwargs)
    if is_torch_callable(target):
        p.need(fn, "id")
        return p.torch_call(fn, args, kwargs)
    dunder = getattr(kind, "__call__", None)
    if type(dunder) is types.FunctionType:
        p.need(fn, "id")
        return call(p, Box(dunder), [fn] + args, kwargs)
    return opaque(p, fn, args, kwargs)


_LAZY_ROOT = __file__.rsplit("/", 2)[0] + "/"
_DYNAMO_FILES = ("torch/_compile.py", "torch/_dynamo/eval_frame.py", "torch/_dynamo/decorators.py")


def _dynamo_wrapper(fn: types.FunctionType) -> Optional[Any]:
    """The function a ``torch._disable_dynamo`` / ``torch._dynamo.disable`` wrapper wraps (optimizers' zero_grad
    is one): the wrapper only steers Dynamo, which capture is not, so capture runs the function itself."""
    if fn.__code__.co_filename.endswith(_DYNAMO_FILES):
        return getattr(fn, "__wrapped__", None)
    return None


def is_torch_callable(target: Any) -> bool:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(target, "__module__", None) or ""
    if isinstance(target, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        owner = getattr(target, "__self__", None)
        return module.startswith("torch") or (owner is not None and type(owner).__module__.startswith("torch"))
    return False


def call_method(p: Any, recv: Box, name: str, bound: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    rv = recv.v
    func = getattr(bound, "__func__", None)
    if type(func) is types.FunctionType:  # a Python method (Tensor.backward, torch/_tensor.py's): interpreted
        return call(p, Box(func), [recv] + args, kwargs)
    if is_tensor(rv):
        return p.torch_call(Box(bound), args, kwargs, recv=recv)
    if type(bound).__name__ == "method-wrapper":  # object's slots reached through super(): plain stores and reads
        if name == "__setattr__":
            p.set_attribute(recv, p.concrete(args[0]), args[1])
            return Box(None)
        if name == "__delattr__":
            p.delattr(recv, p.concrete(args[0]))
            return Box(None)
        if name == "__getattribute__":
            return p.getattr(recv, p.concrete(args[0]))
        if name == "__init__" and not args and not kwargs:
            return Box(None)
    for kind in type(rv).__mro__:
        handler = METHODS.get((kind, name))
        if handler is not None:
            return handler(p, recv, args, kwargs)
    if type(rv).__module__.startswith("torch"):
        if type(rv) is torch.Generator and name in ("manual_seed", "seed", "set_state"):
            p.breaks(f"reseeds a torch.Generator ({name})")
            return opaque(p, Box(bound), args, kwargs)
        return p.torch_call(Box(bound), args, kwargs, recv=recv)
    if type(recv.m) is E or type(recv.m) is New:
        if type(rv) in (str, bytes) or isinstance(rv, NUMBERS):
            return _pure_native(p, Box(bound), [recv] + args, kwargs, bound_call=True)
        p.breaks(f"calls {type(rv).__name__}.{name}, which capture cannot follow")
    return opaque(p, Box(bound), args, kwargs)


def opaque(p: Any, fn: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    """A callable the capture cannot see into: allowed when everything it receives is a constant (then, being
    deterministic, it returns the same thing at every call); a tensor argument makes it a torch call."""
    flat = list(_flatten(args)) + list(_flatten(list(kwargs.values())))
    if any(is_tensor(b.v) for b in flat):
        return p.torch_call(fn, args, kwargs)
    for b in flat:
        if type(b.m) is E and not isinstance(b.v, NUMBERS + CONSTANT_TYPES + (tuple, type)):
            name = getattr(fn.v, "__qualname__", type(fn.v).__name__)
            p.breaks(f"passes a {type(b.v).__name__} from its inputs to {name}, which capture cannot follow")
            break
    return _pure_native(p, fn, args, kwargs)


def _pure_native(p: Any, fn: Box, args: List[Box], kwargs: Dict[str, Box], bound_call: bool = False) -> Box:
    raw = [p.concrete(a) for a in args]
    kw = {k: p.concrete(v) for k, v in kwargs.items()}
    result = fn.v(*raw[1:], **kw) if bound_call else fn.v(*raw, **kw)
    return wrap_native(p, result)


def wrap_native(p: Any, result: Any) -> Box:
    """The result of a native call the capture cannot see into. An object some other place already refers to (its
    reference count says so) existed before the call: it is held as itself, guarded where it is used; only an
    object nothing else refers to is one the call created."""
    if isinstance(result, NUMBERS + CONSTANT_TYPES) or result is None:
        return Box(result)
    if sys.getrefcount(result) > _FRESH_REFS + _C.eval_frame_hooked() and not isinstance(result, (tuple, list, dict)):
        return Box(result, X.pinned(result))
    if type(result) in (tuple, list):
        items = [wrap_native(p, x) for x in result]
        return p.new(result, New("tuple" if type(result) is tuple else "list", items))
    if type(result) is dict:
        return p.new(result, New("dict", {k: wrap_native(p, v) for k, v in result.items()}))
    return p.new(result, New("object"))


# The caller's variable, getrefcount's argument, and the call's own temporary; one more while a PEP 523 frame
# evaluation function is installed (the frame hook of lazy.compile, torch._dynamo's): CPython then calls Python
# functions through vectorcall, which leaves the caller's own reference to each argument on its stack.
_FRESH_REFS = 3


def _flatten(boxes: List[Box]) -> Iterator[Box]:
    for b in boxes:
        yield b
        if type(b.m) is New and b.m.kind in ("list", "tuple"):
            yield from _flatten(b.m.items)
        elif type(b.m) is New and b.m.kind == "dict":
            yield from _flatten(list(b.m.items.values()))


# ---------------------------------------------------------------------------------------------------------------
# Classes

def instantiate(p: Any, cls: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    kind = cls.v
    handler = LOOKASIDES.get(id(kind))
    if handler is not None:
        return handler(p, args, kwargs)
    if issubclass(kind, BaseException):
        return Box(kind(*[p.concrete(a) for a in args], **{k: p.concrete(v) for k, v in kwargs.items()}))
    if kind.__module__.startswith("torch") and kind.__init__ is object.__init__ or not _python_class(kind):
        if is_torch_class(kind):
            return p.torch_call(cls, args, kwargs)
        return _pure_native(p, cls, args, kwargs)
    if type(kind).__call__ is not type.__call__:
        p.breaks(f"instantiates {kind.__qualname__}, whose metaclass defines __call__")
        return _pure_native(p, cls, args, kwargs)
    new = kind.__new__
    if new is object.__new__:
        obj = object.__new__(kind)
    elif type(getattr(new, "__func__", new)) is types.FunctionType:
        obj = call(p, Box(getattr(new, "__func__", new)), [cls] + args, kwargs).v
    else:
        obj = new(kind, *[p.concrete(a) for a in args], **{k: p.concrete(v) for k, v in kwargs.items()})
    box = p.new(obj, New("object"))
    if isinstance(obj, kind):
        init = kind.__init__
        if type(init) is types.FunctionType:
            call(p, Box(init), [box] + args, kwargs)
        elif init is not object.__init__:
            init(obj, *[p.concrete(a) for a in args], **{k: p.concrete(v) for k, v in kwargs.items()})
    return box


def _python_class(kind: type) -> bool:
    return type(kind.__dict__.get("__init__")) is types.FunctionType or any(
        type(c.__dict__.get("__init__")) is types.FunctionType for c in kind.__mro__[1:-1])


def is_torch_class(kind: type) -> bool:
    return kind.__module__.startswith("torch") and not _python_class(kind)


# ---------------------------------------------------------------------------------------------------------------
# Iteration

def iterate(p: Any, obj: Box) -> Box:
    v, m = obj.v, obj.m
    if type(m) is BoxIter:
        return obj
    if isinstance(v, Generator):
        return Box(v, BoxIter(_gen_boxes(v)))
    if is_tensor(v):
        return p.torch_call(Box(iter), [obj], {})
    if type(m) is New and m.kind in ("list", "tuple"):
        return Box(None, BoxIter(_index_boxes(m.items)))
    if type(m) is New and m.kind == "dict":
        return Box(None, BoxIter(iter([Box(k) for k in list(m.items)])))
    if type(m) is New and m.kind == "set":
        return Box(None, BoxIter(iter(list(m.items))))
    if type(m) is E and type(v) in (list, tuple) or type(m) is E and isinstance(v, (list, tuple)) and \
            type(type(v).__iter__) is not types.FunctionType:
        p.need(obj, "type")
        p.need(obj, "len")
        return Box(None, BoxIter(p.read(x, X.item(m, i)) for i, x in enumerate(v)))
    if type(m) is E and isinstance(v, dict) and type(type(v).__iter__) is not types.FunctionType:
        p.need(obj, "type")
        p.need(obj, "keys")
        return Box(None, BoxIter(_key_box(p, k) for k in list(v.keys())))
    if type(v) is range or type(m) is None and isinstance(v, (str, bytes, tuple, frozenset, range)):
        return Box(None, BoxIter(Box(x) for x in v))
    dunder = getattr(type(v), "__iter__", None)
    if type(dunder) is types.FunctionType:
        return iterate(p, call(p, Box(dunder), [obj], {}))
    if type(m) is E:
        p.breaks(f"iterates a {type(v).__name__} capture cannot follow")
    return Box(None, BoxIter(wrap_native(p, x) for x in iter(v)))


def _gen_boxes(g: Generator) -> Iterator[Box]:
    while True:
        b = g.next_box()
        if b is None:
            return
        yield b


def _index_boxes(items: List[Box]) -> Iterator[Box]:
    i = 0
    while i < len(items):  # live, as a list iterator over a list the loop may append to
        yield items[i]
        i += 1


def _key_box(p: Any, key: Any) -> Box:
    if isinstance(key, NUMBERS + CONSTANT_TYPES) or key is None or type(key) is tuple:
        return Box(key)  # the keys guard fixed it
    return Box(key, X.pinned(key))  # an object key (a tensor keying optimizer state): the keys guard's identity


def mapping_items(p: Any, b: Optional[Box]) -> List[Tuple[Any, Box]]:
    """(key, value box) pairs of a mapping (for ``**kwargs`` and dict updates)."""
    if b is None:
        return []
    m = b.m
    if type(m) is New and m.kind == "dict":
        return list(m.items.items())
    if type(m) is E and isinstance(b.v, dict):
        p.need(b, "keys")
        return [(k, p.read(b.v[k], X.item(m, k))) for k in b.v.keys()]
    if type(m) is E:
        p.breaks(f"unpacks a {type(b.v).__name__} as keyword arguments")
    return [(k, wrap_native(p, b.v[k])) for k in b.v.keys()]


# ---------------------------------------------------------------------------------------------------------------
# Sequences and numbers

def sequence_binary(p: Any, op: str, a: Box, b: Box) -> Box:
    va, vb = a.v, b.v
    if op in ("+", "+=") and type(va) in (list, tuple) and type(vb) is type(va) and not (
            op == "+=" and type(a.m) is not New and type(va) is list):
        items = p.items(a) + p.items(b)
        value = operator.add(va, vb) if op == "+" else operator.iadd(va, vb)
        if op == "+=" and type(a.m) is New:
            a.m.items[:] = items
            return a
        return p.new(value, New("list" if type(va) is list else "tuple", items))
    if op in ("*", "*=") and type(va) in (list, tuple) and type(vb) is int:
        n = p.concrete(b)
        items = p.items(a) * n
        return p.new(va * n, New("list" if type(va) is list else "tuple", items))
    if op == "%" and type(va) is str:
        p.concrete(b)
    if type(a.m) is New and type(va) is list and op.endswith("="):
        p.breaks(f"updates a list with {op}")
    return Box(operator.getitem(__import__("lazy.capture.interpreter", fromlist=["BINARY"]).BINARY, op)(
        p.concrete(a), p.concrete(b)))


def _number_fn(fn: Callable[..., Any]) -> Lookaside:
    """A pure function of numbers: a symbolic argument makes a symbolic result (``math.sqrt(bias_correction)``)."""
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        if kwargs or not all(type(a.v) in NUMBERS for a in args):
            return _pure_native(p, Box(fn), args, kwargs)
        value = fn(*[a.v for a in args])
        if any(type(a.m) is E for a in args) and type(value) in NUMBERS:
            return Box(value, X.call(fn, tuple(a.m if type(a.m) is E else a.v for a in args)))
        return Box(value)
    return handler


for _fn in (math.sqrt, math.exp, math.log, math.cos, math.sin, math.tan, math.pow, math.log2, math.log10,
            math.floor, math.ceil, math.fabs, math.tanh, math.atan, math.acos, math.asin, math.expm1, math.log1p,
            abs, round, float, int, pow, operator.neg, operator.index, math.isnan, math.isinf, math.isfinite):
    LOOKASIDES[id(_fn)] = _number_fn(_fn)
    _KEEP.append(_fn)


@lookaside(bool)
def _bool(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return Box(p.truth(args[0])) if args else Box(False)


@lookaside(min, max)
def _min_max(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return _pure_native(p, Box(min), args, kwargs)  # replaced below with the right function


def _extremum(fn: Callable[..., Any]) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        items = p.items(args[0]) if len(args) == 1 else list(args)
        if kwargs or not all(type(b.v) in NUMBERS for b in items):
            return _pure_native(p, Box(fn), args, kwargs)
        value = fn(b.v for b in items)
        if not any(type(b.m) is E for b in items):
            return Box(value)
        ops = tuple(b.m if type(b.m) is E else b.v for b in items)
        return Box(value, X.call(fn, (X.seq("tuple", ops),)))
    return handler


LOOKASIDES[id(min)] = _extremum(min)
LOOKASIDES[id(max)] = _extremum(max)


@lookaside(sum)
def _sum(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    items = p.items(args[0])
    start = args[1] if len(args) > 1 else kwargs.get("start", p.const(0))
    total = start
    for b in items:
        total = p.binary("+", total, b)
    return total


@lookaside(len)
def _len(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    (b,) = args
    if type(b.m) is New and b.m.kind in ("list", "tuple", "dict"):
        return Box(len(b.m.items))
    if is_tensor(b.v):
        p.need(b, "tensor")
        return Box(len(b.v))
    if type(b.m) is E:
        return Box(len(b.v), X.call(len, (b.m,)))
    return Box(len(b.v))


@lookaside(isinstance)
def _isinstance(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    obj, kinds = args
    p.need(obj, "tensor" if is_tensor(obj.v) else "type")
    return Box(isinstance(obj.v, p.concrete(kinds)))


@lookaside(issubclass, callable, id)
def _pure_identity_predicates(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


def _about_object(fn: Callable[..., Any]) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        for a in args:
            p.need(a, "id" if fn is id else "type")
        return Box(fn(*[a.v for a in args]))
    return handler


for _fn in (issubclass, callable):
    LOOKASIDES[id(_fn)] = _about_object(_fn)


@lookaside(id)
def _id(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    p.breaks("takes the id() of an object")
    return Box(id(args[0].v))


@lookaside(type)
def _type(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    if len(args) != 1:
        p.breaks("creates a class")
        return Box(type(*[a.v for a in args]))
    p.need(args[0], "tensor" if is_tensor(args[0].v) else "type")
    return Box(type(args[0].v))


@lookaside(getattr)
def _getattr(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    obj, name = args[0], p.concrete(args[1])
    if len(args) == 3:
        try:
            return p.getattr(obj, name)
        except AttributeError:
            if type(obj.m) is E:
                p.s.guard("noattr", obj.m, name)
            return args[2]
    return p.getattr(obj, name)


@lookaside(hasattr)
def _hasattr(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    obj, name = args[0], p.concrete(args[1])
    result = hasattr(obj.v, name)
    if type(obj.m) is E:
        p.s.guard("hasattr", X.attr(obj.m, "__class__") if False else obj.m, (name, result))
    return Box(result)


@lookaside(setattr, object.__setattr__)
def _setattr(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    obj, name, value = args
    p.set_attribute(obj, p.concrete(name), value)
    return Box(None)


@lookaside(delattr)
def _delattr(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    p.delattr(args[0], p.concrete(args[1]))
    return Box(None)


@lookaside(object.__getattribute__)
def _object_getattribute(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return p.getattr(args[0], p.concrete(args[1]))


@lookaside(iter)
def _iter(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    if len(args) != 1:
        p.breaks("calls iter() with a sentinel")
        return _pure_native(p, Box(iter), args, kwargs)
    return p.iterate(args[0])


@lookaside(next)
def _next(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    it = args[0] if type(args[0].m) is BoxIter or isinstance(args[0].v, Generator) else p.iterate(args[0])
    b = p.next(it)
    if b is None:
        if len(args) > 1:
            return args[1]
        raise StopIteration
    return b


@lookaside(list, tuple)
def _list_tuple(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


def _sequence_ctor(kind: type) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        items = p.items(args[0]) if args else []
        return p.new(kind(b.v for b in items), New(kind.__name__, items))
    return handler


LOOKASIDES[id(list)] = _sequence_ctor(list)
LOOKASIDES[id(tuple)] = _sequence_ctor(tuple)


@lookaside(dict)
def _dict(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    shadow: Dict[Any, Box] = {}
    if args:
        src = args[0]
        if isinstance(src.v, dict) or type(src.m) is New and src.m.kind == "dict":
            shadow.update(mapping_items(p, src))
        else:
            for pair in p.items(src):
                key, value = p.unpack(pair, 2)
                shadow[p.concrete(key)] = value
    shadow.update(kwargs)
    return p.new({k: v.v for k, v in shadow.items()}, New("dict", shadow))


@lookaside(enumerate)
def _enumerate(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    start = p.concrete(args[1]) if len(args) > 1 else p.concrete(kwargs["start"]) if "start" in kwargs else 0
    it = p.iterate(args[0])

    def pairs() -> Iterator[Box]:
        i = start
        while True:
            b = p.next(it)
            if b is None:
                return
            yield p.new((i, b.v), New("tuple", [Box(i), b]))
            i += 1
    return Box(None, BoxIter(pairs()))


@lookaside(zip)
def _zip(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    strict = p.concrete(kwargs["strict"]) if "strict" in kwargs else False
    its = [p.iterate(a) for a in args]

    def tuples() -> Iterator[Box]:
        while True:
            row = [p.next(it) for it in its]
            if any(b is None for b in row):
                if strict and not all(b is None for b in row):
                    raise ValueError("zip() arguments have different lengths")
                return
            yield p.new(tuple(b.v for b in row), New("tuple", row))
    return Box(None, BoxIter(tuples()))


@lookaside(reversed)
def _reversed(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return Box(None, BoxIter(iter(list(reversed(p.items(args[0]))))))


@lookaside(range)
def _range(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return Box(range(*[p.concrete(a) for a in args]))


@lookaside(sorted)
def _sorted(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    if kwargs.get("key") is not None:
        p.breaks("sorts with a key function")
    items = p.items(args[0])
    for b in items:
        p.concrete(b)
    order = sorted(range(len(items)), key=lambda i: items[i].v, reverse=bool(kwargs.get("reverse", Box(False)).v))
    picked = [items[i] for i in order]
    return p.new([b.v for b in picked], New("list", picked))


@lookaside(any, all)
def _any_all(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


def _any_all_handler(want: bool) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        it = p.iterate(args[0])
        while True:
            b = p.next(it)
            if b is None:
                return Box(not want)
            if p.truth(b) == want:
                return Box(want)
    return handler


LOOKASIDES[id(any)] = _any_all_handler(True)
LOOKASIDES[id(all)] = _any_all_handler(False)


@lookaside(super)
def _super(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    cls, obj = args
    p.need(cls, "id")
    return Box(super(cls.v, obj.v), Bound(obj, "<super>"))


@lookaside(print, input, open, __import__("time").time, __import__("time").perf_counter,
           __import__("random").random, __import__("random").randint)
def _impure(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


def _breaking(fn: Callable[..., Any], why: str) -> Lookaside:
    def handler(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        p.breaks(why)
        return Box(fn(*[a.v for a in args], **{k: v.v for k, v in kwargs.items()}))
    return handler


for _fn, _why in ((print, "prints"), (input, "reads input"), (open, "opens a file"),
                  (__import__("time").time, "reads the clock"), (__import__("time").perf_counter, "reads the clock"),
                  (__import__("random").random, "draws from Python's random module"),
                  (__import__("random").randint, "draws from Python's random module")):
    LOOKASIDES[id(_fn)] = _breaking(_fn, _why)


# Python functions run natively, never interpreted: their effects are modelled by the policy or harmless.
NATIVE_PYTHON = set()


# ---------------------------------------------------------------------------------------------------------------
# Methods of containers, by (type, name): list.append on a list the call built updates its shadow; on a list of
# the entry state it is an effect.

Method = Callable[[Any, Box, List[Box], Dict[str, Box]], Box]
METHODS: Dict[Tuple[type, str], Method] = {}


def method(kind: type, *names: str) -> Callable[[Method], Method]:
    def register(fn: Method) -> Method:
        for name in names:
            METHODS[(kind, name)] = fn
        return fn
    return register


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
        p.s.effects.append(Effect("list_method", m, name, tuple(args)))
        if name == "pop":
            p.breaks("pops from a list of its inputs and uses the value")
        return Box(result)
    p.breaks(f"calls list.{name} on a list it did not reach through its inputs")
    return Box(result)


for _name in ("append", "extend", "insert", "pop", "clear", "reverse", "remove"):
    METHODS[(list, _name)] = (lambda n: lambda p, r, a, k: _list_effect(p, r, n, a))(_name)


@method(list, "copy")
def _list_copy(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    items = p.items(recv)
    return p.new(list(recv.v), New("list", items))


@method(list, "index", "count")
@method(tuple, "index", "count")
def _seq_query(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    p.items(recv)
    return Box(getattr(recv.v, "index" if False else "count")(p.concrete(args[0]))) if False else \
        Box(_seq_query_value(p, recv, args))


def _seq_query_value(p: Any, recv: Box, args: List[Box]) -> Any:
    for b in p.items(recv):
        p.concrete(b)
    return recv.v.index(p.concrete(args[0])) if len(args) == 1 else recv.v.index(*[p.concrete(a) for a in args])


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
        written = p.s.written.get((id(v), ("item", id(key.v) if type(kexpr) is E else kexpr)))
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


@method(dict, "keys", "values", "items")
def _dict_view(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


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


@method(dict, "setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__")
def _dict_mutation(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("replaced below")


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


@method(str, "format", "join", "startswith", "endswith", "split", "replace", "lower", "upper", "strip")
def _str_method(p: Any, recv: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    raise AssertionError("str methods go through call_method's constant path")


for _key in [k for k in METHODS if k[0] is str]:
    del METHODS[_key]

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
