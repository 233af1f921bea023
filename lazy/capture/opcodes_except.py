"""The interpreter's opcode table, continued (lazy/capture/opcodes.py): ``with``, exceptions, string formatting and
imports."""
from __future__ import annotations

import importlib
from typing import Any

from .interpreter import PY312, Frame, Interpreter
from .opcodes import op

# ---- with, exceptions ----

@op("BEFORE_WITH")
def _before_with(it: Interpreter, f: Frame, ins: Any) -> None:
    mgr = f.stack.pop()
    kind = type(mgr.v)
    if not hasattr(kind, "__enter__") or not hasattr(kind, "__exit__"):
        missing = "__enter__" if not hasattr(kind, "__enter__") else "__exit__"
        raise TypeError(f"'{kind.__name__}' object does not support the context manager protocol"
                        + (" (missed __exit__ method)" if missing == "__exit__" and PY312 else ""))
    exit_ = it.policy.getattr(mgr, "__exit__")
    enter = it.policy.getattr(mgr, "__enter__")
    f.stack.append(exit_)
    f.stack.append(it.policy.call(enter, [], {}))


@op("WITH_EXCEPT_START")
def _with_except_start(it: Interpreter, f: Frame, ins: Any) -> None:
    exit_ = f.stack[-4]
    val = f.stack[-1]
    exc = val.v
    p = it.policy
    f.stack.append(p.call(exit_, [p.const(type(exc)), val, p.const(exc.__traceback__)], {}))


@op("PUSH_EXC_INFO")
def _push_exc_info(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    f.stack.append(it.current_exc if it.current_exc is not None else it.policy.const(None))
    it.current_exc = v
    f.stack.append(v)


@op("POP_EXCEPT")
def _pop_except(it: Interpreter, f: Frame, ins: Any) -> None:
    v = f.stack.pop()
    it.current_exc = None if v.v is None else v


@op("CHECK_EXC_MATCH")
def _check_exc_match(it: Interpreter, f: Frame, ins: Any) -> None:
    right = f.stack.pop()
    left = f.stack[-1]
    kinds = right.v if isinstance(right.v, tuple) else (right.v,)
    if not all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds):
        raise TypeError("catching classes that do not inherit from BaseException is not allowed")
    f.stack.append(it.policy.const(isinstance(left.v, right.v)))


@op("RAISE_VARARGS")
def _raise_varargs(it: Interpreter, f: Frame, ins: Any) -> None:
    if ins.arg == 0:
        if it.current_exc is None:
            raise RuntimeError("No active exception to reraise")
        raise it.current_exc.v
    if ins.arg == 1:
        raise _instance(f.stack.pop().v)
    cause = f.stack.pop().v
    exc = _instance(f.stack.pop().v)
    raise exc from cause


def _instance(exc: Any) -> Any:
    return exc() if isinstance(exc, type) and issubclass(exc, BaseException) else exc


@op("RERAISE")
def _reraise(it: Interpreter, f: Frame, ins: Any) -> None:
    exc = f.stack.pop()
    if ins.arg:
        f.lasti = f.stack.pop().v
    raise exc.v


@op("LOAD_ASSERTION_ERROR")
def _load_assertion_error(it: Interpreter, f: Frame, ins: Any) -> None:
    f.stack.append(it.policy.const(AssertionError))


# ---- strings, imports ----

_CONVERSIONS = {0: None, 1: "s", 2: "r", 3: "a"}


@op("FORMAT_VALUE")
def _format_value(it: Interpreter, f: Frame, ins: Any) -> None:
    spec = f.stack.pop() if ins.arg & 0x04 else None
    value = f.stack.pop()
    f.stack.append(it.policy.format(value, _CONVERSIONS[ins.arg & 0x03], spec))


@op("IMPORT_NAME")
def _import_name(it: Interpreter, f: Frame, ins: Any) -> None:
    fromlist = f.stack.pop()
    level = f.stack.pop()
    f.stack.append(it.policy.import_name(f, ins.argval, fromlist, level))


@op("IMPORT_FROM")
def _import_from(it: Interpreter, f: Frame, ins: Any) -> None:
    module = f.stack[-1]
    try:
        f.stack.append(it.policy.getattr(module, ins.argval))
    except AttributeError:
        name = getattr(module.v, "__name__", None)
        try:
            f.stack.append(it.policy.const(importlib.import_module(f"{name}.{ins.argval}")))
        except (ImportError, TypeError):
            raise ImportError(f"cannot import name {ins.argval!r} from {name!r}") from None
