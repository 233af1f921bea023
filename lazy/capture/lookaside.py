"""Calls during capture: what is interpreted, what is modelled, what runs as a torch op, what breaks the capture.

``call`` decides for every call the interpreter makes (lazy/capture/policy.py):
- Python functions, methods and ``__call__``s (an nn.Module) are interpreted;
- builtins that move values between containers or compute on numbers (``len``, ``isinstance``, ``getattr``, ``zip``,
  ``min``, ``math.sqrt``, ``list.append``, ``dict.items``, ...) are modelled, so that what they return keeps its
  provenance and what they store becomes an effect: builtin functions in lazy/capture/builtin_models.py, methods of
  containers and tensor attributes in lazy/capture/method_models.py, both registered in the tables here;
- callables of torch (functions, Tensor methods, the autograd engine) go to ``torch_call`` (lazy/capture/tensors.py);
- classes are instantiated by interpreting ``__init__``;
- what is left is run natively only when nothing it touches can change between calls, otherwise the capture breaks:
  printing, files, the clock, Python's ``random``, reseeding a torch generator, user code the interpreter cannot see.
"""
from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .. import _C
from . import expr as X
from .expr import E
from .interpreter import Box, Generator, decode
from .boxes import CONSTANT_TYPES, NUMBERS, Bound, BoxIter, New, is_tensor, shadowable_dict

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


# Models of methods, by (type, name), registered with ``method`` (lazy/capture/method_models.py).
Method = Callable[[Any, Box, List[Box], Dict[str, Box]], Box]
METHODS: Dict[Tuple[type, str], Method] = {}


def method(kind: type, *names: str) -> Callable[[Method], Method]:
    def register(fn: Method) -> Method:
        for name in names:
            METHODS[(kind, name)] = fn
        return fn
    return register


# Python functions run natively, never interpreted: their effects are modelled by the policy or harmless.
NATIVE_PYTHON = set()


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


_SIZE_METHODS = frozenset(("size", "dim", "numel", "ndimension", "nelement"))


def call_method(p: Any, recv: Box, name: str, bound: Any, args: List[Box], kwargs: Dict[str, Box]) -> Box:
    rv = recv.v
    func = getattr(bound, "__func__", None)
    if type(func) is types.FunctionType:  # a Python method (Tensor.backward, torch/_tensor.py's): interpreted
        return call(p, Box(func), [recv] + args, kwargs)
    if is_tensor(rv):
        if name in _SIZE_METHODS and type(recv.m) is E and not kwargs and all(type(a.v) is int and type(a.m) is not E
                                                                             for a in args):
            # as ``.shape`` (method_models.tensor_attribute): read at each replay, an expression of the state
            p.need(recv, "tensor")
            return Box(bound(*[a.v for a in args]), X.method(recv.m, name, tuple(a.v for a in args), ()))
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
    if name in _ITEM_METHODS and type(recv.m) is New and isinstance(rv, dict) and \
            getattr(bound, "__self__", None) is rv:
        return _base_item(p, recv, name, bound, args)
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


_ITEM_METHODS = frozenset(("__getitem__", "__setitem__", "__delitem__"))


def _base_item(p: Any, recv: Box, name: str, bound: Any, args: List[Box]) -> Box:
    """An item method of a dict's C class (``super().__setitem__`` in a ModelOutput's) on a dict the call created:
    run natively, its shadow kept in step (Note [Dicts of a subclass the call creates] in boxes.py); a store into
    an unshadowed one breaks."""
    k = p.concrete(args[0])
    if recv.m.kind != "dict":
        if name != "__getitem__":
            p.breaks(f"stores into a {type(recv.v).__name__} whose items capture cannot follow")
        return wrap_native(p, bound(*[a.v for a in args]))
    items = recv.m.items
    if name == "__setitem__":
        bound(k, args[1].v)
        items[k] = args[1]
        return Box(None)
    bound(k)  # raises as the call does (a missing key)
    if name == "__delitem__":
        del items[k]
        return Box(None)
    return items[k]


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
    return p.new(result, New("dict", {}) if shadowable_dict(result) else New("object"))


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
    box = p.new(obj, New("dict", {}) if shadowable_dict(obj) else New("object"))
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
    if type(m) is New and m.kind == "set":  # in the set's own (hash) order, each element as the box added
        boxes: Dict[int, Box] = {}
        for b in m.items:
            boxes.setdefault(id(b.v), b)
        return Box(None, BoxIter(iter([boxes.get(id(x)) or Box(x) for x in v])))
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


# The models register themselves in LOOKASIDES and METHODS as they are imported; they import the registries and
# helpers above, so they are imported last, once those exist, and every importer of this module sees full tables.
from . import builtin_models, method_models  # noqa: E402, F401
