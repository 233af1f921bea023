"""A bytecode interpreter for CPython 3.11 and 3.12, written in Python: the capture's way of seeing a function run.

Note [Capture interprets the function]
``@lazy.compile`` must learn, from one run of a function, every Python value the recorded graph depended on (to
guard it, or to read it again as a runtime input) and every change the function made to Python state (to replay
it). A plain run shows neither: a learning rate read from ``param_groups``, a step counter incremented in Python, a
flag tested in a branch are all invisible to the recorder, which sees only the numbers that reach ATen. So the first
call of a compiled function is *executed by this interpreter* instead of CPython's eval loop, on the real objects,
with the real side effects (it is the call the user made), while a policy (lazy/capture/policy.py) follows each
value: where it was read from (its source), what was computed from it, where it was stored. This is the design of
lightning-thunder's interpreter and, in spirit, Dynamo's symbolic evaluation, chosen over the alternatives:
  - Dynamo evaluates bytecode *symbolically* and re-generates code; it carries a whole variable tracker (over 100k
    lines) and runs into seconds of tracing per step. Here the run is concrete: every value is the real one, so the
    interpreter needs no model of what operations do, only of where values come from.
  - tinygrad's TinyJit replays what a second call launched and treats every Python input as a constant; it cannot
    see an optimizer's step counter or a scheduler's learning rate, so a replay would be wrong, not slow.
  - Re-running the function's Python on each call with recording short-circuited keeps every per-op dispatch
    (the cost capture exists to remove).
The interpreter itself is value-agnostic: it implements control flow, frames, the call protocol, generators and
exception handling, and delegates every operation on values to a ``Policy`` (the boxes on its stack carry the
policy's metadata). tests/test_capture_interpreter.py runs functions, torch.optim's and torch.nn's among them, both
natively and interpreted and compares every result and side effect.

Code the interpreter cannot execute (class bodies, async code, ``yield from``, pattern matching, star-imports) is
never entered: the policy is asked to call such functions natively (``Policy.native_call``).
"""
from __future__ import annotations

import dis
import linecache
import sys
import types
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

if TYPE_CHECKING:
    from .plain_policy import Policy

PY312 = sys.version_info >= (3, 12)


class Box:
    """A value on the interpreter's stack or in a local: the real object and the policy's metadata about it."""

    __slots__ = ("v", "m")

    def __init__(self, v: Any, m: Any = None) -> None:
        self.v = v
        self.m = m

    def __repr__(self) -> str:
        return f"Box({self.v!r}, {self.m!r})"


class _Null:
    """The NULL CPython pushes below a callable (PUSH_NULL, LOAD_GLOBAL's low bit, method loads)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()

UNSUPPORTED_OPS = frozenset((
    "LOAD_BUILD_CLASS", "LOAD_NAME", "STORE_NAME", "DELETE_NAME", "LOAD_CLASSDEREF", "IMPORT_STAR",
    "SETUP_ANNOTATIONS", "PRINT_EXPR", "GET_AWAITABLE", "GET_AITER", "GET_ANEXT",
    "BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "ASYNC_GEN_WRAP", "MATCH_CLASS", "MATCH_KEYS", "MATCH_MAPPING",
    "MATCH_SEQUENCE", "CHECK_EG_MATCH", "PREP_RERAISE_STAR", "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS",
    "LOAD_LOCALS", "CALL_INTRINSIC_2"))
SUPPORTED_INTRINSICS = (3, 5, 6)  # STOPITERATION_ERROR, UNARY_POSITIVE, LIST_TO_TUPLE
_ASYNC_FLAGS = 0x80 | 0x100 | 0x200  # CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR
CO_GENERATOR = 0x20
CO_VARARGS, CO_VARKEYWORDS = 0x04, 0x08


class Code:
    """A code object decoded once: instructions, jump targets as indices, the exception table, local names."""

    __slots__ = ("code", "instrs", "index_of", "table", "names", "supported", "why", "nlocals")

    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.instrs = list(dis.get_instructions(code))
        self.index_of = {ins.offset: i for i, ins in enumerate(self.instrs)}
        self.table = [(e.start, e.end, self.index_of[e.target], e.depth, e.lasti)
                      for e in dis._parse_exception_table(code)]
        names = []
        while True:
            try:
                names.append(code._varname_from_oparg(len(names)))
            except (IndexError, ValueError):
                break
        self.names = names
        self.nlocals = len(names)
        bad = sorted({i.opname for i in self.instrs} & UNSUPPORTED_OPS |
                     {f"CALL_INTRINSIC_1 {i.arg}" for i in self.instrs
                      if i.opname == "CALL_INTRINSIC_1" and i.arg not in SUPPORTED_INTRINSICS})
        self.why = (f"uses {', '.join(bad)}" if bad else
                    "is asynchronous" if code.co_flags & _ASYNC_FLAGS else "")
        self.supported = not self.why

    def handler(self, offset: int) -> Optional[tuple]:
        """The innermost exception-table entry covering ``offset``: (target index, depth, lasti)."""
        for start, end, target, depth, lasti in self.table:
            if start <= offset < end:
                return target, depth, lasti
        return None


_CODES: Dict[types.CodeType, Code] = {}


def decode(code: types.CodeType) -> Code:
    c = _CODES.get(code)
    if c is None:
        c = _CODES[code] = Code(code)
    return c


class Frame:
    """One activation of an interpreted function."""

    __slots__ = ("code", "func", "globals", "builtins", "locals", "stack", "i", "kwnames", "lasti", "interp")

    def __init__(self, interp: "Interpreter", code: Code, func: types.FunctionType, locals_: List[Any]) -> None:
        self.interp = interp
        self.code = code
        self.func = func
        self.globals = func.__globals__
        builtins = self.globals.get("__builtins__", __builtins__)
        self.builtins = builtins if isinstance(builtins, dict) else builtins.__dict__
        self.locals = locals_
        self.stack: List[Any] = []
        self.i = 0
        self.kwnames: tuple = ()
        self.lasti = 0

    @property
    def line(self) -> Optional[int]:
        """The source line of the instruction being executed."""
        instrs = self.code.instrs
        for k in range(min(self.i - 1, len(instrs) - 1), -1, -1):
            pos = instrs[k].positions
            if pos is not None and pos.lineno is not None:
                return pos.lineno
        return self.code.code.co_firstlineno

    def where(self) -> str:
        return f"{self.code.code.co_filename}:{self.line} in {self.code.code.co_name}"


class _Return:
    __slots__ = ("box",)

    def __init__(self, box: Box) -> None:
        self.box = box


class Generator:
    """A generator whose frame the interpreter runs: a Python iterator for native consumers (``sum(g)``), boxed items
    for interpreted ones (``Policy.next``)."""

    def __init__(self, interp: "Interpreter", frame: Frame) -> None:
        self.interp = interp
        self.frame = frame
        self.run = interp.execute(frame)
        self.started = False
        self.done = False
        self.__name__ = frame.code.code.co_name
        self.__qualname__ = frame.code.code.co_qualname

    def __repr__(self) -> str:
        return f"<interpreted generator {self.__qualname__}>"

    def __iter__(self) -> "Generator":
        return self

    def resume(self, how: str, value: Any) -> tuple:
        """Run to the next yield: ("yield", box) or ("return", box); ``how`` is "send" (a box) or "throw"."""
        if self.done:
            if how == "throw":
                raise value
            return "return", self.interp.policy.const(None)
        try:
            if how == "throw":
                out = self.run.throw(value)
            elif not self.started:
                self.started = True
                out = next(self.run)
            else:
                out = self.run.send(value)
        except StopIteration as stop:
            self.done = True
            return "return", stop.value.box if stop.value is not None else self.interp.policy.const(None)
        except BaseException:
            self.done = True
            raise
        return "yield", out

    def _resume(self, how: str, value: Any) -> Optional[Box]:
        kind, box = self.resume(how, value)
        if kind == "yield":
            return box
        if box.v is not None:
            raise StopIteration(box.v)
        return None

    def next_box(self) -> Optional[Box]:
        kind, box = self.resume("send", self.interp.policy.const(None))
        return box if kind == "yield" else None

    def __next__(self) -> Any:
        box = self.next_box()
        if box is None:
            raise StopIteration
        return box.v

    def send(self, value: Any) -> Any:
        box = self._resume("send", self.interp.policy.const(value))
        if box is None:
            raise StopIteration
        return box.v

    def throw(self, exc: BaseException) -> Any:
        box = self._resume("throw", exc)
        if box is None:
            raise StopIteration
        return box.v

    def close(self) -> None:
        if self.done or not self.started:
            self.done = True
            return
        try:
            self._resume("throw", GeneratorExit())
        except (GeneratorExit, StopIteration):
            return
        raise RuntimeError("generator ignored GeneratorExit")


class Interpreter:
    """Runs Python functions' bytecode, asking ``policy`` about every value."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        policy.interp = self
        self.frames: List[Frame] = []       # the interpreted call stack, innermost last
        self.current_exc: Optional[Box] = None  # the exception being handled (what sys.exc_info() would say)

    # ---- entry points ----

    def run_function(self, func: types.FunctionType, args: List[Box], kwargs: Dict[str, Box]) -> Box:
        """``func(*args, **kwargs)``, interpreted; a generator function returns a Generator without running."""
        code = decode(func.__code__)
        locals_ = self._bind(func, code, args, kwargs)
        frame = Frame(self, code, func, locals_)
        if code.code.co_flags & CO_GENERATOR:
            return self.policy.box(Generator(self, frame))
        run = self.execute(frame)
        try:
            next(run)
        except StopIteration as stop:
            return stop.value.box
        raise RuntimeError("lazy capture internal error: a frame that is not a generator yielded")

    def _bind(self, func: types.FunctionType, code: Code, args: List[Box], kwargs: Dict[str, Box]) -> List[Any]:
        """Arguments bound to the frame's locals as CPython binds them; a call CPython would refuse is made
        natively (it raises before the body runs, with CPython's own message)."""
        co = code.code
        locals_: List[Any] = [None] * code.nlocals
        nargs, nkwonly, nposonly = co.co_argcount, co.co_kwonlyargcount, co.co_posonlyargcount
        names = code.names
        defaults = func.__defaults__ or ()
        kwdefaults = func.__kwdefaults__ or {}
        policy = self.policy
        n = min(len(args), nargs)
        locals_[:n] = args[:n]
        extra = args[nargs:]
        varargs_at = nargs + nkwonly
        varkw_at = varargs_at + (1 if co.co_flags & CO_VARARGS else 0)
        if extra and not co.co_flags & CO_VARARGS:
            self._refused(func, args, kwargs)
        if co.co_flags & CO_VARARGS:
            locals_[varargs_at] = policy.build("tuple", list(extra))
        varkw = {} if co.co_flags & CO_VARKEYWORDS else None
        index = {name: i for i, name in enumerate(names[:nargs + nkwonly])}
        for key, value in kwargs.items():
            i = index.get(key)
            if i is None or i < nposonly:
                if varkw is None:
                    self._refused(func, args, kwargs)
                varkw[key] = value
                continue
            if locals_[i] is not None:
                self._refused(func, args, kwargs)
            locals_[i] = value
        first_default = nargs - len(defaults)
        for i in range(nargs):
            if locals_[i] is None:
                if i < first_default:
                    self._refused(func, args, kwargs)
                locals_[i] = policy.const(defaults[i - first_default])
        for i in range(nargs, nargs + nkwonly):
            if locals_[i] is None:
                if names[i] not in kwdefaults:
                    self._refused(func, args, kwargs)
                locals_[i] = policy.const(kwdefaults[names[i]])
        if varkw is not None:
            locals_[varkw_at] = policy.build_map([policy.const(k) for k in varkw], list(varkw.values()))
        return locals_

    def _refused(self, func: types.FunctionType, args: List[Box], kwargs: Dict[str, Box]) -> None:
        func(*[a.v for a in args], **{k: v.v for k, v in kwargs.items()})  # raises CPython's TypeError
        raise RuntimeError(f"lazy capture internal error: binding the arguments of {func.__qualname__}")

    # ---- the loop ----

    def execute(self, frame: Frame) -> Iterator[Box]:
        """Run ``frame``: a Python generator that yields at each YIELD_VALUE (the sent box comes back) and returns a
        _Return at the end."""
        from .opcodes import HANDLERS
        code = frame.code
        instrs = code.instrs
        self.frames.append(frame)
        try:
            while True:
                ins = instrs[frame.i]
                frame.i += 1
                try:
                    out = HANDLERS[ins.opname](self, frame, ins)
                    if out is not None:
                        if type(out) is _Return:
                            return out
                        try:
                            sent = yield out  # YIELD_VALUE
                        except BaseException:
                            # Thrown into the generator: CPython resumes the frame with None pushed, then raises
                            frame.stack.append(self.policy.const(None))
                            raise
                        frame.stack.append(sent)
                except _Unwound:
                    raise
                except BaseException as exc:  # noqa: BLE001 -- Python's own exception semantics, via the table
                    handled = self.current_exc
                    if handled is not None and exc.__context__ is None and handled.v is not exc:
                        exc.__context__ = handled.v  # what CPython records: the exception being handled
                    if not self._handle(frame, ins.offset, exc):
                        _note_frame(exc, frame)
                        raise
        finally:
            self.frames.pop()

    def _handle(self, frame: Frame, offset: int, exc: BaseException) -> bool:
        """Jump to the handler of ``exc`` raised at ``offset``, as CPython's exception table says; False if the frame
        has none (the exception leaves the frame)."""
        entry = frame.code.handler(offset)
        if entry is None:
            return False
        target, depth, lasti = entry
        del frame.stack[depth:]
        if lasti:
            frame.stack.append(self.policy.const(offset))
        frame.stack.append(self.policy.exception(exc))
        frame.i = target
        return True


def _note_frame(exc: BaseException, frame: Frame) -> None:
    """Remember, on the exception, the interpreted frames it left (innermost first), for ``user_traceback``."""
    try:
        frames = exc.__dict__.setdefault("_lazy_frames", [])
    except AttributeError:
        return
    code = frame.code.code
    frames.append((code.co_filename, frame.line or code.co_firstlineno, code.co_name))


def user_traceback(exc: BaseException) -> Any:
    """A traceback for ``exc`` raised while interpreting: one entry per interpreted frame it left, at the user's
    file, line and function, then the native frames below the innermost one (where the error was raised), without
    the interpreter's own frames."""
    frames = getattr(exc, "_lazy_frames", None)
    if not frames:
        return exc.__traceback__
    tail = None
    tb = exc.__traceback__
    native = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_CAPTURE_DIR):
            native.append(tb)
        tb = tb.tb_next
    for entry in reversed(native):
        tail = types.TracebackType(tail, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    for filename, line, name in frames:  # innermost first: each wraps the ones inside it
        tail = _fake_entry(filename, line, name, tail)
    return tail


_CAPTURE_DIR = __file__.rsplit("/", 1)[0] + "/"


def _fake_entry(filename: str, line: int, name: str, tail: Any) -> Any:
    """A traceback entry at ``filename:line`` in function ``name``: a frame made by raising from code compiled
    under that name (what template engines do for their users' tracebacks)."""
    stripped = linecache.getline(filename, line).strip()
    # NOTE: the raise spans as many columns as the source line's text, so the traceback shows that line without
    # carets under part of it
    statement = "raise(_E" + " " * max(len(stripped) - 9, 0) + ")"
    code = compile("\n" * (max(line, 1) - 1) + statement, filename, "exec").replace(co_name=name)
    try:
        exec(code, {"_E": RuntimeError})  # noqa: S102 -- a constant body: raise
    except RuntimeError as e:
        tb = e.__traceback__.tb_next
        return types.TracebackType(tail, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    raise AssertionError("unreachable")


class _Unwound(BaseException):
    """Raised by a frame's code to leave the interpreter without Python's exception handling (never caught by the
    exception table): the policy's way to stop a run it must not continue."""
