"""The interpreter's base policy (lazy/capture/interpreter.py): every operation on a value computed natively, as
CPython would, with no metadata. The differential tests run it; lazy/capture/policy.py's CapturePolicy overrides it
to record where each value came from."""
from __future__ import annotations

import operator
import types
from typing import Any, Dict, List, Optional

from .interpreter import Box, Frame, Generator, Interpreter, decode

class Policy:
    """What the interpreter asks about values. This base policy is transparent: it computes natively and keeps no
    metadata, which is what the differential tests run; lazy/capture/policy.py adds provenance."""

    interp: "Interpreter"

    def box(self, value: Any) -> Box:
        """A value the interpreter itself made (a constant, a function, a container, a cell, an exception)."""
        return Box(value)

    def const(self, value: Any) -> Box:
        return Box(value)

    def load_global(self, frame: Frame, name: str) -> Box:
        if name in frame.globals:
            return Box(frame.globals[name])
        if name in frame.builtins:
            return Box(frame.builtins[name])
        raise NameError(f"name {name!r} is not defined")

    def store_global(self, frame: Frame, name: str, value: Box) -> None:
        frame.globals[name] = value.v

    def delete_global(self, frame: Frame, name: str) -> None:
        del frame.globals[name]

    def getattr(self, obj: Box, name: str) -> Box:
        return Box(getattr(obj.v, name))

    def setattr(self, obj: Box, name: str, value: Box) -> None:
        setattr(obj.v, name, value.v)

    def delattr(self, obj: Box, name: str) -> None:
        delattr(obj.v, name)

    def getitem(self, obj: Box, key: Box) -> Box:
        return Box(obj.v[key.v])

    def setitem(self, obj: Box, key: Box, value: Box) -> None:
        obj.v[key.v] = value.v

    def delitem(self, obj: Box, key: Box) -> None:
        del obj.v[key.v]

    def binary(self, op: str, a: Box, b: Box) -> Box:
        return Box(BINARY[op](a.v, b.v))

    def unary(self, op: str, a: Box) -> Box:
        return Box(UNARY[op](a.v))

    def compare(self, op: str, a: Box, b: Box) -> Box:
        return Box(COMPARE[op](a.v, b.v))

    def truth(self, a: Box) -> bool:
        return bool(a.v)

    def build(self, kind: str, items: List[Box]) -> Box:
        return Box(BUILD[kind]([x.v for x in items]))

    def build_map(self, keys: List[Box], values: List[Box]) -> Box:
        return Box({k.v: v.v for k, v in zip(keys, values)})

    def container_op(self, op: str, target: Box, *args: Box) -> None:
        """In-place updates of containers the interpreter is building: list_append, list_extend, set_add,
        set_update, dict_update, dict_merge, map_add (args: key, value)."""
        CONTAINER_OPS[op](target.v, *[a.v for a in args])

    def list_to_tuple(self, lst: Box) -> Box:
        return Box(tuple(lst.v))

    def unpack(self, seq: Box, count: int, star: Optional[int] = None) -> List[Box]:
        """``seq``'s items, ``count`` of them (``star``: index of the starred target, which gets a list)."""
        items = list(seq.v)
        if star is None:
            if len(items) != count:
                raise ValueError(f"{'too many' if len(items) > count else 'not enough'} values to unpack "
                                 f"(expected {count}, got {len(items)})")
            return [Box(x) for x in items]
        after = count - star - 1
        if len(items) < count - 1:
            raise ValueError(f"not enough values to unpack (expected at least {count - 1}, got {len(items)})")
        rest = items[star:len(items) - after]
        return [Box(x) for x in items[:star]] + [Box(rest)] + [Box(x) for x in items[len(items) - after:]]

    def iterate(self, obj: Box) -> Box:
        if isinstance(obj.v, Generator):
            return obj
        return Box(iter(obj.v))

    def next(self, it: Box) -> Optional[Box]:
        """The next item of an iterator made by ``iterate``, or None when it is exhausted."""
        if isinstance(it.v, Generator):
            return it.v.next_box()
        try:
            return Box(next(it.v))
        except StopIteration:
            return None

    def format(self, value: Box, conversion: Optional[str], spec: Optional[Box]) -> Box:
        v = value.v
        if conversion is not None:
            v = {"s": str, "r": repr, "a": ascii}[conversion](v)
        return Box(format(v, spec.v if spec is not None else ""))

    def make_cell(self, contents: Optional[Box]) -> Box:
        return Box(types.CellType() if contents is None else types.CellType(contents.v))

    def cell_get(self, cell: Box, name: str) -> Box:
        try:
            return Box(cell.v.cell_contents)
        except ValueError:
            raise NameError(f"cannot access free variable {name!r} where it is not associated with a value in "
                            "enclosing scope") from None

    def cell_set(self, cell: Box, value: Optional[Box]) -> None:
        if value is None:
            del cell.v.cell_contents
        else:
            cell.v.cell_contents = value.v

    def closure_cell(self, func: types.FunctionType, index: int) -> Box:
        return Box(func.__closure__[index])

    def make_function(self, frame: Frame, code: Box, defaults: Optional[Box], kwdefaults: Optional[Box],
                      annotations: Optional[Box], closure: Optional[Box]) -> Box:
        fn = types.FunctionType(code.v, frame.globals, code.v.co_name,
                                defaults.v if defaults is not None else None,
                                closure.v if closure is not None else None)
        fn.__qualname__ = code.v.co_qualname
        if kwdefaults is not None:
            fn.__kwdefaults__ = kwdefaults.v
        if annotations is not None:
            fn.__annotations__ = (dict(zip(annotations.v[::2], annotations.v[1::2]))
                                  if isinstance(annotations.v, tuple) else annotations.v)
        return Box(fn)

    def call(self, fn: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        """Call ``fn``: a Python function the interpreter can run is interpreted, anything else runs natively."""
        target = fn.v
        kind = type(target)
        if kind is types.MethodType and type(target.__func__) is types.FunctionType:
            return self.call(Box(target.__func__), [Box(target.__self__)] + args, kwargs)
        if kind is types.FunctionType:
            if decode(target.__code__).supported:
                return self.interp.run_function(target, args, kwargs)
        elif not isinstance(target, type):
            dunder = getattr(kind, "__call__", None)  # an instance of a Python class with __call__ (nn.Module)
            if type(dunder) is types.FunctionType:
                return self.call(Box(dunder), [fn] + args, kwargs)
        return self.native_call(fn, args, kwargs)

    def native_call(self, fn: Box, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        return Box(fn.v(*[a.v for a in args], **{k: v.v for k, v in kwargs.items()}))

    def call_ex(self, fn: Box, args: Box, kwargs: Optional[Box]) -> Box:
        """``fn(*args, **kwargs)`` (CALL_FUNCTION_EX): the sequences are unpacked into boxes, then ``call``."""
        pos = self.unpack(args, len(args.v))
        kw = {}
        if kwargs is not None:
            for key in list(kwargs.v.keys()):
                kw[key] = self.getitem(kwargs, self.const(key))
        return self.call(fn, pos, kw)

    def import_name(self, frame: Frame, name: str, fromlist: Box, level: Box) -> Box:
        return Box(__import__(name, frame.globals, None, fromlist.v, level.v))

    def exception(self, exc: BaseException) -> Box:
        return Box(exc)


BINARY = {
    "+": operator.add, "&": operator.and_, "//": operator.floordiv, "<<": operator.lshift, "@": operator.matmul,
    "*": operator.mul, "%": operator.mod, "|": operator.or_, "**": operator.pow, ">>": operator.rshift,
    "-": operator.sub, "/": operator.truediv, "^": operator.xor,
    "+=": operator.iadd, "&=": operator.iand, "//=": operator.ifloordiv, "<<=": operator.ilshift,
    "@=": operator.imatmul, "*=": operator.imul, "%=": operator.imod, "|=": operator.ior, "**=": operator.ipow,
    ">>=": operator.irshift, "-=": operator.isub, "/=": operator.itruediv, "^=": operator.ixor,
    "[]": operator.getitem,
}
UNARY = {"-": operator.neg, "+": operator.pos, "~": operator.invert, "not": operator.not_}
COMPARE = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge,
    "is": operator.is_, "is not": operator.is_not, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
}
BUILD = {"tuple": tuple, "list": list, "set": set, "slice": lambda items: slice(*items),
         "string": lambda items: "".join(items)}
CONTAINER_OPS = {
    "list_append": list.append, "list_extend": list.extend, "set_add": set.add, "set_update": set.update,
    "dict_update": dict.update, "map_add": dict.__setitem__,
    "dict_merge": lambda d, other: _dict_merge(d, other),
}


def _dict_merge(d: dict, other: Any) -> None:
    for key in other.keys():
        if key in d:
            raise TypeError(f"got multiple values for keyword argument '{key}'")
        d[key] = other[key]
