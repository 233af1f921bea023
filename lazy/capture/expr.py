"""Where a captured value came from: expressions over the function's entry state, rendered as Python for replay.

A value the capture interpreter reads from state the function did not create (an argument, a global, an attribute of
a module, an item of an optimizer's ``param_groups``) carries an ``E`` saying how to read it again: ``A[0].lr``,
``A[1].param_groups[0]['lr']``. Numbers computed from such values carry the computation (``1 - K[3] ** R[0]``), and the
results of host (non-lazy) tensor ops replayed at each call are registers ``R[k]``. Guards and the replay prologue
are these expressions rendered as Python source and compiled once (``render``): evaluating them costs what the same
attribute reads and arithmetic cost in plain Python, with no interpretation per call.
"""
from __future__ import annotations

import keyword
from typing import Any, Dict, List, Optional, Tuple

import torch


class E:
    """An expression over the entry state: ``op`` and its operands (other E's or plain values)."""

    __slots__ = ("op", "args", "_hash")

    def __init__(self, op: str, *args: Any) -> None:
        self.op = op
        self.args = args
        self._hash = hash((op,) + tuple(_key(a) for a in args))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return (type(other) is E and self._hash == other._hash and self.op == other.op
                and len(self.args) == len(other.args)
                and all(_same(a, b) for a, b in zip(self.args, other.args)))

    def __repr__(self) -> str:
        return Renderer().expr(self)


def _key(a: Any) -> Any:
    if type(a) is E:
        return a
    if type(a) is tuple:
        return tuple(_key(x) for x in a)
    try:
        hash(a)
        return (type(a), a)
    except TypeError:
        return ("id", id(a))


def _same(a: Any, b: Any) -> bool:
    if type(a) is E or type(b) is E:
        return a == b
    if type(a) is tuple and type(b) is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return type(a) is type(b) and (a is b or a == b) is True
    except Exception:  # noqa: BLE001 -- objects whose == is not a bool (tensors) compare by identity
        return a is b


def arg(i: int) -> E:
    return E("arg", i)


def pinned(obj: Any) -> E:
    """The object itself, held by the capture: for objects reached without a path (a function's globals dict)."""
    return E("obj", obj)


def attr(base: E, name: str) -> E:
    return E("attr", base, name)


def item(base: E, key: Any) -> E:
    return E("item", base, key)


def reg(k: int) -> E:
    return E("reg", k)


def binary(op: str, a: Any, b: Any) -> E:
    return E("bin", op, a, b)


def unary(op: str, a: Any) -> E:
    return E("un", op, a)


def call(fn: Any, args: tuple = (), kwargs: tuple = ()) -> E:
    """``fn(*args, **dict(kwargs))``: ``args`` a tuple of operands, ``kwargs`` a tuple of (name, operand)."""
    return E("call", fn, tuple(args), tuple(kwargs))


def method(base: Any, name: str, args: tuple = (), kwargs: tuple = ()) -> E:
    return E("meth", base, name, tuple(args), tuple(kwargs))


def seq(kind: str, items: tuple) -> E:
    """A tuple or list built from operands at replay."""
    return E(kind, *items)


_PREFIX_UNARY = {"-": "-", "+": "+", "~": "~", "not": "not "}


class Renderer:
    """Renders expressions as Python source over ``A`` (the call's arguments), ``K`` (constants the capture holds)
    and ``R`` (registers of the replay prologue). One renderer per generated function shares its ``consts``."""

    def __init__(self) -> None:
        self.consts: List[Any] = []
        self._const_at: Dict[int, int] = {}
        self.shared: set = set()          # subexpressions rendered once into a temporary (see ``share``)
        self.temps: Dict[E, str] = {}
        self.preamble: List[str] = []
        self.sized = ""  # rendering a replay at other sizes (what, for errors): symbolic constants refused

    def share(self, exprs: List[Any]) -> None:
        """Common subexpressions of ``exprs``: each read of state (an attribute, an item, arithmetic over them) used
        more than once is computed once into a temporary, in ``preamble``. Expressions over registers are left
        in place: registers exist only once the host ops that fill them have run."""
        counts: Dict[E, int] = {}

        def visit(e: Any) -> None:
            if type(e) is tuple:
                for x in e:
                    visit(x)
                return
            if type(e) is not E or e.op in ("arg", "obj", "reg"):
                return
            if e.op in ("call", "meth"):  # a call may draw a seed or update a tensor: each runs where it is
                for x in e.args:
                    visit(x)
                return
            counts[e] = counts.get(e, 0) + 1
            if counts[e] == 1:
                for x in e.args:
                    visit(x)
        for e in exprs:
            visit(e)
        self.shared = {e for e, n in counts.items() if n > 1 and not any(r.op == "reg" for r in roots(e))}

    def const(self, value: Any) -> str:
        """``value`` as source: a literal for plain immutable values, else a slot of ``K``."""
        if value is None or value is True or value is False or value is Ellipsis:
            return repr(value)
        if type(value) in (int, str) or (type(value) is float and value == value and abs(value) != float("inf")):
            return repr(value)
        if isinstance(value, _SYMBOLIC):  # a size of a capture with symbolic sizes (Note [Dynamic captures])
            if self.sized:
                raise Unsized(f"a symbolic number ({value}) among the constants of {self.sized}")
            return self.const(value_of(value))
        k = self._const_at.get(id(value))
        if k is None:
            k = self._const_at[id(value)] = len(self.consts)
            self.consts.append(value)
        return f"K[{k}]"

    def expr(self, e: Any) -> str:
        if type(e) is not E:
            return self.const(e)
        if e in self.shared:
            name = self.temps.get(e)
            if name is None:
                text = self._render(e)
                name = self.temps[e] = f"_t{len(self.temps)}"
                self.preamble.append(f"{name} = {text}")
            return name
        return self._render(e)

    def _render(self, e: E) -> str:
        op, a = e.op, e.args
        if op == "arg":
            return f"A[{a[0]}]"
        if op == "obj":
            return self.const(a[0])
        if op == "reg":
            return f"R[{a[0]}]"
        if op == "attr":
            base, name = self.expr(a[0]), a[1]
            if name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("__"):
                return f"{base}.{name}"
            return f"getattr({base}, {name!r})"
        if op == "item":
            return f"{self.expr(a[0])}[{self.expr(a[1])}]"
        if op == "bin":
            return f"({self.expr(a[1])} {a[0]} {self.expr(a[2])})"
        if op == "un":
            return f"({_PREFIX_UNARY[a[0]]}{self.expr(a[1])})"
        if op == "cmp":
            return f"({self.expr(a[1])} {a[0]} {self.expr(a[2])})"
        if op == "call":
            return f"{self.expr(a[0])}({self._arguments(a[1], a[2])})"
        if op == "meth":
            return f"{self.expr(a[0])}.{a[1]}({self._arguments(a[2], a[3])})"
        if op == "tuple":
            inner = ", ".join(self.expr(x) for x in a)
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        if op == "list":
            return f"[{', '.join(self.expr(x) for x in a)}]"
        if op == "dict":
            return "{" + ", ".join(f"{self.expr(k)}: {self.expr(v)}" for k, v in a) + "}"
        raise ValueError(f"lazy capture internal error: no rendering for {op}")

    def _arguments(self, args: tuple, kwargs: tuple) -> str:
        parts = [self.expr(x) for x in args] + [f"{k}={self.expr(v)}" if k.isidentifier() else
                                                f"**{{{k!r}: {self.expr(v)}}}" for k, v in kwargs]
        return ", ".join(parts)


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class Unsized(Exception):
    """A replay at other sizes would take a number of the recording's sizes as a constant."""


def value_of(x: Any) -> Any:
    """A symbolic number's value at the recording's sizes, as a Python number (no guard added)."""
    h = x.node.hint
    return int(h) if isinstance(x, torch.SymInt) else float(h) if isinstance(x, torch.SymFloat) else bool(h)


def specialized(x: Any) -> Any:
    """A symbolic number's value, made a guard of its ShapeEnv (``int()``): for a size used as a value."""
    return int(x) if isinstance(x, torch.SymInt) else float(x) if isinstance(x, torch.SymFloat) else bool(x)


def compile_function(name: str, params: str, body: List[str], consts: List[Any]) -> Any:
    """``def name(params): body`` compiled, with ``K`` bound to ``consts``."""
    source = f"def {name}({params}):\n" + "\n".join("    " + line for line in body or ["pass"])
    scope: Dict[str, Any] = {"K": consts}
    exec(compile(source, f"<lazy.capture {name}>", "exec"), scope)  # noqa: S102 -- source built from E's only
    fn = scope.pop(name)  # its globals need not hold it: no reference cycle, freed with its last user
    fn.__lazy_source__ = source
    return fn


def roots(e: Any, acc: Optional[set] = None) -> set:
    """The ``arg``/``obj``/``reg`` leaves of an expression."""
    acc = set() if acc is None else acc
    if type(e) is E:
        if e.op in ("arg", "obj", "reg"):
            acc.add(e)
        for x in e.args:
            roots(x, acc)
    elif type(e) is tuple:
        for x in e:
            roots(x, acc)
    return acc


def depends_on_state(e: Any) -> bool:
    """Whether ``e`` reads anything (an argument, an object's attribute, a register), as opposed to constants."""
    return type(e) is E and bool(roots(e))


Pair = Tuple[E, Any]
