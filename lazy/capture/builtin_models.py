"""Models of builtin functions during capture: ``len``, ``isinstance``, ``getattr``, ``zip``, ``min``/``max``,
``sum``, ``sorted``, ``any``/``all``, ``super``, the constructors of lists, tuples and dicts, pure functions of numbers
(``math.sqrt``, ``abs``, ...), binary operators on sequences, and the impure builtins that break the capture (``print``,
the clock, Python's ``random``).

The models of functions are registered in ``LOOKASIDES`` (lazy/capture/lookaside.py) at import time, where ``call``
finds them; ``sequence_binary`` is called by the policy's binary operators (lazy/capture/policy.py).
"""
from __future__ import annotations

import collections
import inspect
import math
import operator
from typing import Any, Callable, Dict, Iterator, List

from . import expr as X
from .expr import E
from .interpreter import Box, Generator
from .plain_policy import BINARY
from .lookaside import LOOKASIDES, _KEEP, Lookaside, _pure_native, lookaside, mapping_items
from .boxes import NUMBERS, Bound, BoxIter, New, is_tensor


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
    return Box(BINARY[op](p.concrete(a), p.concrete(b)))


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


for _fn in (min, max):
    LOOKASIDES[id(_fn)] = _extremum(_fn)


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


@lookaside(inspect.signature)
def _signature(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    """``inspect.signature`` of a function the capture holds by identity (one read from the inputs, guarded so) or of
    a method it looked up (its function guarded where the object came from the inputs): computed natively, as
    constant as the function (an immutable Signature). Interpreted otherwise (inspect.unwrap takes id()s)."""
    fn = args[0] if len(args) == 1 and not kwargs else None
    if fn is not None and type(fn.m) in (E, Bound):
        if type(fn.m) is E:
            p.need(fn, "id")
        return Box(inspect.signature(fn.v))
    return p.run_python(inspect.signature, args, kwargs)


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
        p.s.guard("hasattr", obj.m, (name, result))
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
    return _new_dict(p, args, kwargs, dict)


@lookaside(collections.OrderedDict)
def _ordered_dict(p: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    return _new_dict(p, args, kwargs, collections.OrderedDict)


def _new_dict(p: Any, args: List[Box], kwargs: Dict[str, Box], kind: type) -> Box:
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
    return p.new(kind((k, v.v) for k, v in shadow.items()), New("dict", shadow))


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
    reverse = bool(p.concrete(kwargs["reverse"])) if "reverse" in kwargs else False  # guarded where read from state
    order = sorted(range(len(items)), key=lambda i: items[i].v, reverse=reverse)
    picked = [items[i] for i in order]
    return p.new([b.v for b in picked], New("list", picked))


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
