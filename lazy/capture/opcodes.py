"""The interpreter's opcode table: one handler per CPython 3.11/3.12 opcode (lazy/capture/interpreter.py).

A handler takes (interpreter, frame, instruction) and returns None, a ``_Return`` (the frame returns) or a Box (the
frame yields it). Every operation on a value goes through the policy; a handler only moves boxes between the stack,
the locals and the policy, and decides where execution continues. Where 3.11 and 3.12 differ, both spellings are here
(POP_JUMP_FORWARD_IF_TRUE and POP_JUMP_IF_TRUE, LOAD_METHOD and LOAD_ATTR's method bit, FOR_ITER's exhaustion).
"""
from __future__ import annotations

import dis
from typing import Any, Callable, Dict

from .interpreter import NULL, PY312, Box, Frame, Generator, Interpreter, _Return

Handler = Callable[[Interpreter, Frame, Any], Any]
HANDLERS: Dict[str, Handler] = {}


def op(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = fn
        return fn
    return register


def _pop_n(frame: Frame, n: int) -> list:
    if n == 0:
        return []
    items = frame.stack[-n:]
    del frame.stack[-n:]
    return items


def _jump(frame: Frame, ins: Any) -> None:
    frame.i = frame.code.index_of[ins.argval]


# ---- no-ops ----

@op("NOP", "RESUME", "CACHE", "PRECALL", "EXTENDED_ARG")
def _nop(it: Interpreter, f: Frame, ins: Any) -> None:
    return None


# ---- locals, constants, stack ----

@op("LOAD_FAST", "LOAD_FAST_CHECK")
def _load_fast(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.locals[ins.arg]
    if v is None:
        raise UnboundLocalError(f"cannot access local variable {ins.argval!r} where it is not associated with a value")
    f.stack.append(v)


@op("LOAD_FAST_AND_CLEAR")
def _load_fast_and_clear(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.locals[ins.arg]
    f.stack.append(NULL if v is None else v)
    f.locals[ins.arg] = None


@op("STORE_FAST", "STORE_FAST_MAYBE_NULL")
def _store_fast(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    f.locals[ins.arg] = None if v is NULL else v


@op("DELETE_FAST")
def _delete_fast(it: Interpreter, f: Frame, ins: Any) -> None:
    if f.locals[ins.arg] is None:
        raise UnboundLocalError(f"cannot access local variable {ins.argval!r} where it is not associated with a value")
    f.locals[ins.arg] = None


@op("LOAD_CONST")
def _load_const(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.const(ins.argval))


@op("POP_TOP")
def _pop_top(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.pop()


@op("END_FOR")
def _end_for(it: Interpreter, f: Frame, ins: Any) -> None:
    del f.stack[-2:]


@op("PUSH_NULL")
def _push_null(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(NULL)


@op("COPY")
def _copy(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(f.stack[-ins.arg])


@op("SWAP")
def _swap(it: Interpreter, f: Frame, ins: Any) -> None:
    s = f.stack
    s[-1], s[-ins.arg] = s[-ins.arg], s[-1]


# ---- returns and generators ----

@op("RETURN_VALUE")
def _return_value(it: Interpreter, f: Frame, ins: Any) -> _Return:
    return _Return(f.stack.pop())


@op("RETURN_CONST")
def _return_const(it: Interpreter, f: Frame, ins: Any) -> _Return:
    return _Return(it.policy.const(ins.argval))


@op("RETURN_GENERATOR")
def _return_generator(it: Interpreter, f: Frame, ins: Any) -> None:
    # The Generator object exists already (run_function made it); the first resumption's None is what the POP_TOP
    # after this instruction removes.
    f.stack.append(it.policy.const(None))


@op("GET_YIELD_FROM_ITER")
def _get_yield_from_iter(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.iterate(f.stack.pop()))


@op("SEND")
def _send(it: Interpreter, f: Frame, ins: Any) -> None:
    value = f.stack.pop()
    receiver = f.stack[-1]
    gen = receiver.v
    if isinstance(gen, Generator):
        kind, box = gen.resume("send", value)
    elif value.v is None:
        box = it.policy.next(receiver)
        kind = "yield" if box is not None else "return"
        box = box if box is not None else it.policy.const(None)
    else:
        box = it.policy.box(receiver.v.send(value.v))
        kind = "yield"
    if kind == "yield":
        f.stack.append(box)
        return
    if PY312:
        f.stack.append(box)  # END_SEND, the jump's target, drops the receiver below it
    else:
        f.stack[-1] = box
    _jump(f, ins)


@op("END_SEND")
def _end_send(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    f.stack[-1] = v


@op("CLEANUP_THROW")
def _cleanup_throw(it: Interpreter, f: Frame, ins: Any) -> None:
    exc = f.stack.pop()
    f.stack.pop()
    f.stack.pop()
    if not isinstance(exc.v, StopIteration):
        raise exc.v
    f.stack.append(it.policy.const(None))
    f.stack.append(it.policy.const(exc.v.value))


@op("YIELD_VALUE")
def _yield_value(it: Interpreter, f: Frame, ins: Any) -> Box:
    return f.stack.pop()


# ---- globals, attributes, items ----

@op("LOAD_GLOBAL")
def _load_global(it: Interpreter, f: Frame, ins: Any) -> None:
    if ins.arg & 1:
        f.stack.append(NULL)
    f.stack.append(it.policy.load_global(f, ins.argval))


@op("STORE_GLOBAL")
def _store_global(it: Interpreter, f: Frame, ins: Any) -> None:
    it.policy.store_global(f, ins.argval, f.stack.pop())


@op("DELETE_GLOBAL")
def _delete_global(it: Interpreter, f: Frame, ins: Any) -> None:
    it.policy.delete_global(f, ins.argval)


@op("LOAD_ATTR")
def _load_attr(it: Interpreter, f: Frame, ins: Any) -> None:
    obj = f.stack.pop()
    if PY312 and ins.arg & 1:  # the method form: NULL and the bound attribute mean the same call
        f.stack.append(NULL)
    f.stack.append(it.policy.getattr(obj, ins.argval))


@op("LOAD_METHOD")
def _load_method(it: Interpreter, f: Frame, ins: Any) -> None:
    obj = f.stack.pop()
    f.stack.append(NULL)
    f.stack.append(it.policy.getattr(obj, ins.argval))


@op("LOAD_SUPER_ATTR")
def _load_super_attr(it: Interpreter, f: Frame, ins: Any) -> None:
    self_, cls, super_ = f.stack.pop(), f.stack.pop(), f.stack.pop()
    sup = it.policy.call(super_, [cls, self_], {})
    if ins.arg & 1:
        f.stack.append(NULL)
    f.stack.append(it.policy.getattr(sup, ins.argval))


@op("STORE_ATTR")
def _store_attr(it: Interpreter, f: Frame, ins: Any) -> None:
    obj = f.stack.pop()
    value = f.stack.pop()
    it.policy.setattr(obj, ins.argval, value)


@op("DELETE_ATTR")
def _delete_attr(it: Interpreter, f: Frame, ins: Any) -> None:
    it.policy.delattr(f.stack.pop(), ins.argval)


@op("BINARY_SUBSCR")
def _binary_subscr(it: Interpreter, f: Frame, ins: Any) -> None:
    key = f.stack.pop()
    container = f.stack.pop()
    f.stack.append(it.policy.getitem(container, key))


@op("STORE_SUBSCR")
def _store_subscr(it: Interpreter, f: Frame, ins: Any) -> None:
    key, container, value = f.stack.pop(), f.stack.pop(), f.stack.pop()
    it.policy.setitem(container, key, value)


@op("DELETE_SUBSCR")
def _delete_subscr(it: Interpreter, f: Frame, ins: Any) -> None:
    key, container = f.stack.pop(), f.stack.pop()
    it.policy.delitem(container, key)


@op("BINARY_SLICE")
def _binary_slice(it: Interpreter, f: Frame, ins: Any) -> None:
    end, start, container = f.stack.pop(), f.stack.pop(), f.stack.pop()
    f.stack.append(it.policy.getitem(container, it.policy.build("slice", [start, end])))


@op("STORE_SLICE")
def _store_slice(it: Interpreter, f: Frame, ins: Any) -> None:
    end, start, container, value = f.stack.pop(), f.stack.pop(), f.stack.pop(), f.stack.pop()
    it.policy.setitem(container, it.policy.build("slice", [start, end]), value)


# ---- operators ----

@op("BINARY_OP")
def _binary_op(it: Interpreter, f: Frame, ins: Any) -> None:
    b = f.stack.pop()
    a = f.stack.pop()
    f.stack.append(it.policy.binary(dis._nb_ops[ins.arg][1], a, b))


_UNARY_NAMES = {"UNARY_NEGATIVE": "-", "UNARY_POSITIVE": "+", "UNARY_INVERT": "~", "UNARY_NOT": "not"}


@op(*_UNARY_NAMES)
def _unary(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.unary(_UNARY_NAMES[ins.opname], f.stack.pop()))


@op("COMPARE_OP")
def _compare_op(it: Interpreter, f: Frame, ins: Any) -> None:
    b = f.stack.pop()
    a = f.stack.pop()
    f.stack.append(it.policy.compare(ins.argval, a, b))


@op("IS_OP")
def _is_op(it: Interpreter, f: Frame, ins: Any) -> None:
    b = f.stack.pop()
    a = f.stack.pop()
    f.stack.append(it.policy.compare("is not" if ins.arg else "is", a, b))


@op("CONTAINS_OP")
def _contains_op(it: Interpreter, f: Frame, ins: Any) -> None:
    b = f.stack.pop()
    a = f.stack.pop()
    f.stack.append(it.policy.compare("not in" if ins.arg else "in", a, b))


# ---- jumps ----

@op("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def _jump_op(it: Interpreter, f: Frame, ins: Any) -> None:
    _jump(f, ins)


def _is_none(it: Interpreter, v: Box) -> bool:
    return it.policy.truth(it.policy.compare("is", v, it.policy.const(None)))


_CONDITIONS = {
    "TRUE": lambda it, v: it.policy.truth(v),
    "FALSE": lambda it, v: not it.policy.truth(v),
    "NONE": _is_none,
    "NOT_NONE": lambda it, v: not _is_none(it, v),
}


def _pop_jump(condition: Callable[[Interpreter, Box], bool]) -> Handler:
    def handler(it: Interpreter, f: Frame, ins: Any) -> None:
        if condition(it, f.stack.pop()):
            _jump(f, ins)
    return handler


for _cond, _test in _CONDITIONS.items():
    for _name in (f"POP_JUMP_IF_{_cond}", f"POP_JUMP_FORWARD_IF_{_cond}", f"POP_JUMP_BACKWARD_IF_{_cond}"):
        HANDLERS[_name] = _pop_jump(_test)


@op("JUMP_IF_TRUE_OR_POP")
def _jump_if_true_or_pop(it: Interpreter, f: Frame, ins: Any) -> None:
    if it.policy.truth(f.stack[-1]):
        _jump(f, ins)
    else:
        f.stack.pop()


@op("JUMP_IF_FALSE_OR_POP")
def _jump_if_false_or_pop(it: Interpreter, f: Frame, ins: Any) -> None:
    if not it.policy.truth(f.stack[-1]):
        _jump(f, ins)
    else:
        f.stack.pop()


# ---- iteration ----

@op("GET_ITER")
def _get_iter(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.iterate(f.stack.pop()))


@op("FOR_ITER")
def _for_iter(it: Interpreter, f: Frame, ins: Any) -> None:
    nxt = it.policy.next(f.stack[-1])
    if nxt is not None:
        f.stack.append(nxt)
        return
    f.stack.pop()
    _jump(f, ins)
    if f.code.instrs[f.i].opname == "END_FOR":  # 3.12: an exhausted FOR_ITER jumps past its END_FOR
        f.i += 1


@op("GET_LEN")
def _get_len(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.call(it.policy.const(len), [f.stack[-1]], {}))


# ---- building containers ----

@op("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_STRING")
def _build(it: Interpreter, f: Frame, ins: Any) -> None:
    kind = ins.opname[len("BUILD_"):].lower()
    f.stack.append(it.policy.build(kind, _pop_n(f, ins.arg)))


@op("BUILD_SLICE")
def _build_slice(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.build("slice", _pop_n(f, ins.arg)))


@op("BUILD_MAP")
def _build_map(it: Interpreter, f: Frame, ins: Any) -> None:
    items = _pop_n(f, 2 * ins.arg)
    f.stack.append(it.policy.build_map(items[::2], items[1::2]))


@op("BUILD_CONST_KEY_MAP")
def _build_const_key_map(it: Interpreter, f: Frame, ins: Any) -> None:
    keys = f.stack.pop()
    values = _pop_n(f, ins.arg)
    f.stack.append(it.policy.build_map([it.policy.const(k) for k in keys.v], values))


@op("LIST_TO_TUPLE")
def _list_to_tuple(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.list_to_tuple(f.stack.pop()))


_CONTAINER_UPDATES = {"LIST_APPEND": "list_append", "SET_ADD": "set_add", "LIST_EXTEND": "list_extend",
                      "SET_UPDATE": "set_update", "DICT_UPDATE": "dict_update", "DICT_MERGE": "dict_merge"}


@op(*_CONTAINER_UPDATES)
def _container_update(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    it.policy.container_op(_CONTAINER_UPDATES[ins.opname], f.stack[-ins.arg], v)


@op("MAP_ADD")
def _map_add(it: Interpreter, f: Frame, ins: Any) -> None:
    value = f.stack.pop()
    key = f.stack.pop()
    it.policy.container_op("map_add", f.stack[-ins.arg], key, value)


@op("UNPACK_SEQUENCE")
def _unpack_sequence(it: Interpreter, f: Frame, ins: Any) -> None:
    items = it.policy.unpack(f.stack.pop(), ins.arg)
    f.stack.extend(reversed(items))


@op("UNPACK_EX")
def _unpack_ex(it: Interpreter, f: Frame, ins: Any) -> None:
    before, after = ins.arg & 0xFF, ins.arg >> 8
    items = it.policy.unpack(f.stack.pop(), before + 1 + after, star=before)
    f.stack.extend(reversed(items))


# ---- calls and functions ----

@op("KW_NAMES")
def _kw_names(it: Interpreter, f: Frame, ins: Any) -> None:
    f.kwnames = f.code.code.co_consts[ins.arg]


def call(it: Interpreter, f: Frame, fn: Box, args: list, kwargs: dict) -> Box:
    """A call from interpreted code; zero-argument ``super()`` gets the frame's class cell and first argument, which
    CPython's builtin would look for in a native frame that does not exist."""
    if fn.v is super and not args and not kwargs:
        args = _super_args(it, f)
    return it.policy.call(fn, args, kwargs)


def _super_args(it: Interpreter, f: Frame) -> list:
    co = f.code.code
    names = f.code.names
    if "__class__" not in co.co_freevars or not co.co_argcount and not co.co_flags & 0x04:
        raise RuntimeError("super(): no arguments")
    cls = it.policy.cell_get(f.locals[names.index("__class__")], "__class__")
    first = f.locals[0]
    if first is None:
        raise RuntimeError("super(): arg[0] deleted")
    if names[0] in co.co_cellvars:  # the first argument lives in a cell (a closure captured it)
        first = it.policy.cell_get(first, names[0])
    return [cls, first]


@op("CALL")
def _call(it: Interpreter, f: Frame, ins: Any) -> None:
    kwnames = f.kwnames
    f.kwnames = ()
    args = _pop_n(f, ins.arg)
    callable_ = f.stack.pop()
    method = f.stack.pop()
    if method is not NULL:
        args = [callable_] + args
        callable_ = method
    nkw = len(kwnames)
    kwargs = dict(zip(kwnames, args[len(args) - nkw:])) if nkw else {}
    if nkw:
        del args[len(args) - nkw:]
    f.stack.append(call(it, f, callable_, args, kwargs))


@op("CALL_FUNCTION_EX")
def _call_function_ex(it: Interpreter, f: Frame, ins: Any) -> None:
    kwargs = f.stack.pop() if ins.arg & 1 else None
    args = f.stack.pop()
    fn = f.stack.pop()
    if f.stack and f.stack[-1] is NULL:
        f.stack.pop()
    f.stack.append(it.policy.call_ex(fn, args, kwargs))


@op("MAKE_FUNCTION")
def _make_function(it: Interpreter, f: Frame, ins: Any) -> None:
    code = f.stack.pop()
    flags = ins.arg
    closure = f.stack.pop() if flags & 0x08 else None
    annotations = f.stack.pop() if flags & 0x04 else None
    kwdefaults = f.stack.pop() if flags & 0x02 else None
    defaults = f.stack.pop() if flags & 0x01 else None
    f.stack.append(it.policy.make_function(f, code, defaults, kwdefaults, annotations, closure))


@op("CALL_INTRINSIC_1")
def _call_intrinsic_1(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    if ins.arg == 3:  # STOPITERATION_ERROR: a StopIteration leaving a generator becomes a RuntimeError
        exc = v.v
        if isinstance(exc, StopIteration):
            new = RuntimeError("generator raised StopIteration")
            new.__cause__ = exc
            v = it.policy.exception(new)
        f.stack.append(v)
    elif ins.arg == 5:
        f.stack.append(it.policy.unary("+", v))
    else:  # 6: LIST_TO_TUPLE
        f.stack.append(it.policy.list_to_tuple(v))


# ---- cells ----

@op("MAKE_CELL")
def _make_cell(it: Interpreter, f: Frame, ins: Any) -> None:
    f.locals[ins.arg] = it.policy.make_cell(f.locals[ins.arg])


@op("COPY_FREE_VARS")
def _copy_free_vars(it: Interpreter, f: Frame, ins: Any) -> None:
    first = f.code.nlocals - ins.arg
    for j in range(ins.arg):
        f.locals[first + j] = it.policy.closure_cell(f.func, j)


@op("LOAD_CLOSURE")
def _load_closure(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(f.locals[ins.arg])


@op("LOAD_DEREF")
def _load_deref(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.cell_get(f.locals[ins.arg], ins.argval))


@op("STORE_DEREF")
def _store_deref(it: Interpreter, f: Frame, ins: Any) -> None:
    it.policy.cell_set(f.locals[ins.arg], f.stack.pop())


@op("DELETE_DEREF")
def _delete_deref(it: Interpreter, f: Frame, ins: Any) -> None:
    it.policy.cell_set(f.locals[ins.arg], None)


from . import opcodes_except  # noqa: E402,F401 -- registers the handlers of with, exceptions, strings and imports
