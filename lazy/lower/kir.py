"""The loop-level kernel IR: hash-consed scalar expressions over loop indices, buffers and reductions.

Note [Kernel IR]
A kernel computes, for every index of an iteration space, a scalar ``Expr``. Expressions are interned (equal
structure -> the same object, hash computed once), so a value used twice in a kernel is one DAG node and the
renderer computes it once. Leaves of an expression are ``load`` (a buffer at a flat index expression),
``const``, ``scalar`` (a runtime scalar argument: never baked into the source, so a new learning rate does not
recompile), ``var`` (a loop index) and ``reduce`` (the result of a ``Reduction`` at an output index). Index
arithmetic (``iadd``, ``imul``, ``ifloordiv``, ``imod``) is simplified as it is built, so the index maps of
views, reshapes and broadcasts (Note [Movement ops are index maps]) fold back to plain strided loads.
Nothing here knows a backend: renderers (codegen/) turn each op into text through their own tables.
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Any, Callable, Container, Dict, List, Optional, Sequence, Tuple

import torch

from ..ir.layout import contiguous_stride

INDEX = torch.int64


class Expr:
    """One interned node: ``op`` (a name), ``dtype`` (torch dtype of the value) and ``args`` (Exprs or statics)."""

    __slots__ = ("op", "dtype", "args", "_hash", "_below", "_lin", "__weakref__")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"{self.op}:{str(self.dtype)[6:]}({', '.join(map(repr, self.args))})"


_INTERN: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()


def mk(op: str, dtype: torch.dtype, *args: Any) -> Expr:
    """The interned expression ``op(args)`` of ``dtype``."""
    key = (op, dtype, args)
    e = _INTERN.get(key)
    if e is None:
        e = Expr()
        e.op, e.dtype, e.args, e._hash, e._below, e._lin = op, dtype, args, hash(key), None, None
        _INTERN[key] = e
    return e


class Buffer:
    """A tensor in memory: a graph leaf, an extern's output, or a kernel's output. ``strides`` in elements."""

    __slots__ = ("id", "shape", "dtype", "strides", "kind", "__weakref__")

    def __init__(self, id_: int, shape: Sequence[int], dtype: torch.dtype, strides: Optional[Sequence[int]] = None,
                 kind: str = "temp") -> None:
        self.id = id_
        self.shape = tuple(shape)
        self.dtype = dtype
        self.strides = tuple(strides) if strides is not None else contiguous_stride(self.shape)
        self.kind = kind  # "leaf" | "extern" | "temp" | "output"

    def __repr__(self) -> str:
        return f"buf{self.id}"


# The reductions whose result is an index (Note [Arg reductions] in structure.py): the int64 row-major flat index,
# over ``red_shape``, of the first maximal (minimal) value of the body, a NaN above (below) every number.
ARG_KINDS = frozenset({"argmax", "argmin"})


class Reduction:
    """``kind`` over ``red_shape`` for every index of ``out_shape``; ``body(out_idx, red_idx) -> Expr``. Kinds:
    sum, prod, max, min, and ARG_KINDS (``dtype`` int64, ``acc_dtype`` the type of the values compared).

    The body is built once over symbolic out/red variables (``out_vars``/``red_vars``, named after a tag unique in
    the lowering). Build reductions with ``reduction()``, which returns one object for equal ones."""

    __slots__ = ("kind", "dtype", "acc_dtype", "out_shape", "red_shape", "out_vars", "red_vars", "body",
                 "_hash", "__weakref__")

    def __init__(self, kind: str, dtype: torch.dtype, acc_dtype: torch.dtype, out_shape: Sequence[int],
                 red_shape: Sequence[int], fn: Callable[[List[Expr], List[Expr]], Expr]) -> None:
        self.kind, self.dtype, self.acc_dtype = kind, dtype, acc_dtype
        self.out_shape, self.red_shape = tuple(out_shape), tuple(red_shape)
        tag = next(_NAMES)
        self.out_vars = [var(f"o{tag}_{i}", n) for i, n in enumerate(self.out_shape)]
        self.red_vars = [var(f"r{tag}_{i}", n) for i, n in enumerate(self.red_shape)]
        self.body = fn(self.out_vars, self.red_vars)
        self._hash = hash((kind, dtype, self.out_shape, self.red_shape, self.body))

    def __repr__(self) -> str:
        return f"Reduction({self.kind}, out={list(self.out_shape)}, red={list(self.red_shape)}, {self.body!r})"


_NAMES = itertools.count()

# Note [Equal reductions are one object]
# Decompositions compute the same reduction more than once: layer_norm's var_mean sums x for the variance's mean
# and again for the mean it returns. Each Reduction names its variables after a tag of its own, so two equal
# reductions have different bodies, different ``reduce`` refs, and the scheduler would run both as stages (layer
# norm: three passes over each row instead of two). ``reduction()`` looks a new reduction up by its body over
# canonical variables (out variable i -> ``o_i``, reduced variable i -> ``r_i``) with its kind, dtypes and shapes,
# and returns the one built before if they are equal: its refs are then the same interned expressions, and every
# later pass (fusion, stages, the renderers) computes it once without knowing. Sound because a body depends on
# its own variables, loads of buffers (each written once, by one step) and runtime scalars only; a body that
# also read other variables would keep them in the key. The table lives for one lowering (``reset_names``), so
# variable names, and the generated source, do not depend on what was compiled before in the process.
_REDUCTIONS: "weakref.WeakValueDictionary[tuple, Reduction]" = weakref.WeakValueDictionary()


def reduction(kind: str, dtype: torch.dtype, acc_dtype: torch.dtype, out_shape: Sequence[int],
              red_shape: Sequence[int], fn: Callable[[List[Expr], List[Expr]], Expr]) -> Reduction:
    """``Reduction(...)``, or the equal one built before in this lowering (Note [Equal reductions are one object])."""
    red = Reduction(kind, dtype, acc_dtype, out_shape, red_shape, fn)
    canonical = dict(zip(red.out_vars, (var(f"o_{i}", n) for i, n in enumerate(red.out_shape))))
    canonical.update(zip(red.red_vars, (var(f"r_{i}", n) for i, n in enumerate(red.red_shape))))
    key = (kind, dtype, acc_dtype, red.out_shape, red.red_shape, substitute(red.body, canonical))
    return _REDUCTIONS.setdefault(key, red)


def reset_names() -> None:
    """Restart variable numbering (a compile then names its variables the same way in every process) and forget
    the reductions of the previous lowering."""
    global _NAMES
    _NAMES = itertools.count()
    _REDUCTIONS.clear()


# ---- leaves -----------------------------------------------------------------------------------------------

def const(value: Any, dtype: torch.dtype) -> Expr:
    if dtype.is_floating_point:
        value = float(value)
    elif dtype is torch.bool:
        value = bool(value)
    else:
        value = int(value)
    return mk("const", dtype, value)


def var(name: str, extent: int) -> Expr:
    return mk("var", INDEX, name, extent)


def scalar(slot: int, dtype: torch.dtype) -> Expr:
    """The runtime scalar number ``slot`` of the graph, as float64 or int64."""
    return mk("scalar", dtype, slot)


def load(buf: Buffer, index: Sequence[Expr]) -> Expr:
    flat = const(0, INDEX)
    for i, s, n in zip(index, buf.strides, buf.shape):
        if n != 1:
            flat = iadd(flat, imul(i, s))
    return mk("load", buf.dtype, buf, flat)


def reduce_ref(red: Reduction, index: Sequence[Expr]) -> Expr:
    return mk("reduce", red.dtype, red, tuple(index))


def cast(x: Expr, dtype: torch.dtype) -> Expr:
    if x.dtype is dtype:
        return x
    if x.op == "const" and not (x.dtype.is_floating_point and not dtype.is_floating_point):
        return const(x.args[0], dtype) if dtype is not torch.bool else const(x.args[0] != 0, dtype)
    if dtype is torch.uint8 and x.dtype.is_floating_point:
        # NOTE: eager converts floating -> uint8 through int64 (c10 static_cast_with_inter_type): -1.5 -> 255
        x = cast(x, torch.int64)
    return mk("cast", dtype, x)


def op(name: str, dtype: torch.dtype, *args: Expr) -> Expr:
    return mk(name, dtype, *args)


# ---- index arithmetic (simplified as built) ------------------------------------------------------------------

def _linear(e: Expr) -> Tuple[Dict[Expr, int], int]:
    """``e`` as (coefficient by atom, constant). NOTE: the dict may be kept on ``e`` (``_lin``): never change it.
    Sums and products are computed once per expression (interned, immutable): left-nested sums of n terms cost
    O(n^2) to take apart again at every use. Atoms are not kept (their dict would refer back to themselves)."""
    if e._lin is not None:
        return e._lin
    if e.op == "const":
        return {}, e.args[0]
    if e.op == "iadd":
        (ta, ca), (tb, cb) = _linear(e.args[0]), _linear(e.args[1])
        out = dict(ta)
        for k, v in tb.items():
            out[k] = out.get(k, 0) + v
        e._lin = ({k: v for k, v in out.items() if v}, ca + cb)
        return e._lin
    if e.op == "imul" and e.args[1].op == "const":
        t, c = _linear(e.args[0])
        k = e.args[1].args[0]
        e._lin = ({a: v * k for a, v in t.items() if v * k}, c * k)
        return e._lin
    return {e: 1}, 0


def affine(e: Expr) -> Tuple[Dict[Expr, int], int]:
    """An index expression as (coefficient by atom, constant): atoms are variables or non-affine subexpressions."""
    terms, c = _linear(e)
    return dict(terms), c


def _fold_divmod(terms: Dict[Expr, int]) -> Dict[Expr, int]:
    """``k*m*(a // k) + m*(a % k)`` -> ``m*a``: a split index recombined (reshape (i*C + j) -> (i, j) -> flat)."""
    for f, cf in list(terms.items()):
        if f.op != "ifloordiv" or f not in terms:
            continue
        a, k = f.args[0], f.args[1].args[0]
        for m, cm in list(terms.items()):
            if m.op == "imod" and m.args[0].op == "ifloordiv" and m.args[0].args[0] is a \
                    and m.args[0].args[1].args[0] * m.args[1].args[0] == k and cf == cm * m.args[1].args[0]:
                # k*m*(a // k) + m*((a // p) % (k/p)) -> m*(a // p): a flattened view's index (Note [Nested
                # divisions] in ifloordiv), then folded on by the rule below
                terms = dict(terms)
                del terms[f], terms[m]
                terms[m.args[0]] = terms.get(m.args[0], 0) + cm
                return _fold_divmod({x: v for x, v in terms.items() if v})
            if m.op == "imod" and m.args[0] is a and m.args[1].args[0] == k and cf == cm * k:
                terms = dict(terms)
                del terms[f], terms[m]
                ta, ca = _linear(a)
                for x, v in ta.items():
                    terms[x] = terms.get(x, 0) + v * cm
                terms = {x: v for x, v in terms.items() if v}
                if ca:
                    terms[const(ca * cm, INDEX)] = 1  # folded back into the constant by _build
                return _fold_divmod(terms)
    return terms


def _build(terms: Dict[Expr, int], c: int) -> Expr:
    if len(terms) > 1:
        terms = _fold_divmod(terms)
        for atom in [a for a in terms if a.op == "const"]:
            c += atom.args[0] * terms.pop(atom)
    out: Optional[Expr] = None
    for atom, k in sorted(terms.items(), key=lambda t: _order(t[0])):
        term = atom if k == 1 else mk("imul", INDEX, atom, const(k, INDEX))
        out = term if out is None else mk("iadd", INDEX, out, term)
    if out is None:
        return const(c, INDEX)
    return out if c == 0 else mk("iadd", INDEX, out, const(c, INDEX))


def _order(atom: Expr) -> tuple:
    # NOTE: a deterministic order keeps equal index maps equal objects (and the source stable across processes).
    return (0, atom.args[0]) if atom.op == "var" else (1, repr(atom))


def bounds(e: Expr) -> Tuple[int, int]:
    """Inclusive (lo, hi) of an index expression."""
    if e.op == "const":
        return e.args[0], e.args[0]
    if e.op == "var":
        return 0, max(e.args[1] - 1, 0)
    if e.op in ("index_checked", "index_clamp"):  # lowering/indexing.py: within [0, n - 1] / [0, hi]
        return 0, max(e.args[1].args[0] - (e.op == "index_checked"), 0)
    terms, c = _linear(e)
    if len(terms) == 1 and c == 0 and terms.get(e) == 1:
        if e.op == "imod":
            return 0, e.args[1].args[0] - 1
        if e.op == "ifloordiv":
            lo, hi = bounds(e.args[0])
            k = e.args[1].args[0]
            return lo // k, hi // k
        return -(1 << 62), 1 << 62
    lo = hi = c
    for atom, k in terms.items():
        a, b = bounds(atom)
        lo += min(a * k, b * k)
        hi += max(a * k, b * k)
    return lo, hi


def iadd(a: Expr, b: Expr) -> Expr:
    (ta, ca), (tb, cb) = _linear(a), _linear(b)
    for k, v in tb.items():
        ta = dict(ta)
        ta[k] = ta.get(k, 0) + v
    return _build({k: v for k, v in ta.items() if v}, ca + cb)


def imul(a: Expr, k: int) -> Expr:
    t, c = _linear(a)
    return _build({x: v * k for x, v in t.items() if v * k}, c * k)


def ifloordiv(a: Expr, k: int) -> Expr:
    if k == 1:
        return a
    t, c = _linear(a)
    keep = {x: v // k for x, v in t.items() if v % k == 0}
    rest = _build({x: v for x, v in t.items() if v % k}, 0)
    lo, hi = bounds(rest)
    # split the constant so the remainder part stays in [0, k)
    q, r = divmod(c, k)
    lo, hi = lo + r, hi + r
    if 0 <= lo and hi < k:
        return _build(keep, q)
    if rest.op == "const" and not keep:
        return const((c + rest.args[0]) // k, INDEX)
    split = _split_by_gcd(t, c, k)
    if split is not None:  # (g*A + s) // k == A // (k/g) when g | k and 0 <= s < g
        big, _, g = split
        return ifloordiv(big, k // g)
    # Note [Nested divisions]
    # Unravelling a flat index (a view of a reshape: flatten(1) of an NCHW tensor) divides (k*K + R) by k and by
    # multiples of k. Where both K and R are never negative (so the renderers' truncating division is floor
    # division), (k*K + R) // k == K + R // k and (R // p) // q == R // (p*q): the quotient keeps its own loop
    # variables, and _fold_divmod can put the parts of R back together (k*(R // k) + R % k == R), so a view that
    # only regroups dims loads at an affine index again, which the loops vectorize.
    if keep:
        small = _build({x: v for x, v in t.items() if v % k}, c)
        whole = _build(keep, 0)
        if bounds(small)[0] >= 0 and bounds(whole)[0] >= 0:
            return iadd(whole, ifloordiv(small, k))
    if a.op == "ifloordiv" and bounds(a.args[0])[0] >= 0:
        return ifloordiv(a.args[0], a.args[1].args[0] * k)
    return mk("ifloordiv", INDEX, a, const(k, INDEX))


def _split_by_gcd(t: Dict[Expr, int], c: int, k: int) -> Optional[Tuple[Expr, Expr, int]]:
    """``sum(t) + c == g*big + small`` with ``g`` a divisor of ``k`` (> 1) and ``0 <= small < g``, or None."""
    for g in sorted({math.gcd(v, k) for v in t.values()} - {1, k}, reverse=True):
        q, r = divmod(c, g)
        small = _build({x: v for x, v in t.items() if v % g}, r)
        lo, hi = bounds(small)
        big = _build({x: v // g for x, v in t.items() if v % g == 0}, q)
        # NOTE: only for big >= 0, where the renderers' truncating / and % agree with floor division
        if 0 <= lo and hi < g and bounds(big)[0] >= 0:
            return big, small, g
    return None


def imod(a: Expr, k: int) -> Expr:
    if k == 1:
        return const(0, INDEX)
    t, c = _linear(a)
    rest = _build({x: v % k for x, v in t.items() if v % k}, c % k)
    lo, hi = bounds(rest)
    if 0 <= lo and hi < k:
        return rest
    t, c = _linear(rest)
    split = _split_by_gcd(t, c, k)
    if split is not None:  # (g*A + s) % k == g*(A % (k/g)) + s when g | k and 0 <= s < g
        big, small, g = split
        return iadd(imul(imod(big, k // g), g), small)
    return mk("imod", INDEX, rest, const(k, INDEX))


def walk(root: Expr, stop: Container = ()) -> List[Expr]:
    """Every expression reachable from ``root`` (not into reduction bodies, nor into the operands of expressions in
    ``stop``), children before parents, ``root`` last."""
    if stop:
        return _walk(root, stop)
    # NOTE: expressions are interned and immutable, so a root's walk is computed once (the passes walk the same
    # kernel bodies again and again: a GPT step's build walked 6.5x the nodes of its distinct roots); it is kept
    # without the root itself, so no expression refers back to itself
    below = root._below
    if below is None:
        below = root._below = tuple(_walk(root, ())[:-1])
    return [*below, root]


def _walk(root: Expr, stop: Container) -> List[Expr]:
    seen: Dict[Expr, None] = {}
    stack: List[Tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, done = stack.pop()
        if e in seen:
            continue
        if done or e in stop:
            seen[e] = None
            continue
        stack.append((e, True))
        for a in children(e):
            if a not in seen:
                stack.append((a, False))
    return list(seen)


def children(e: Expr) -> List[Expr]:
    if e.op == "reduce":
        return list(e.args[1])
    return [a for a in e.args if type(a) is Expr]


def substitute(root: Expr, mapping: Dict[Expr, Expr]) -> Expr:
    """``root`` with every key of ``mapping`` replaced (index arithmetic re-simplified)."""
    memo: Dict[Expr, Expr] = dict(mapping)
    for e in walk(root):
        if e in memo:
            continue
        if e.op == "reduce":
            memo[e] = reduce_ref(e.args[0], [memo[i] for i in e.args[1]])
            continue
        args = tuple(memo[a] if type(a) is Expr else a for a in e.args)
        if args == e.args:
            memo[e] = e
        elif e.op == "iadd":
            memo[e] = iadd(args[0], args[1])
        elif e.op == "imul":
            memo[e] = imul(args[0], args[1].args[0])
        elif e.op == "ifloordiv":
            memo[e] = ifloordiv(args[0], args[1].args[0])
        elif e.op == "imod":
            memo[e] = imod(args[0], args[1].args[0])
        else:
            memo[e] = mk(e.op, e.dtype, *args)
    return memo[root]


def free_vars(root: Expr) -> set:
    """Loop variables an expression depends on (through reduce indices, not into reduction bodies)."""
    return {e for e in walk(root) if e.op == "var"}


def evaluate(e: Expr, env: Dict[Expr, int]) -> Optional[int]:
    """The value of an index expression at the loop indices ``env``; None where it reads memory or a scalar."""
    memo: Dict[Expr, Optional[int]] = {}
    for x in walk(e):
        a = [memo[c] for c in children(x)]
        if x.op == "const":
            memo[x] = x.args[0]
        elif x.op == "var":
            memo[x] = env.get(x)
        elif None in a or x.op not in _INT_OPS:
            memo[x] = None
        else:
            memo[x] = _INT_OPS[x.op](*a)
    return memo[e]


_INT_OPS = {"iadd": lambda a, b: a + b, "imul": lambda a, b: a * b, "ifloordiv": lambda a, b: a // b,
            "imod": lambda a, b: a % b, "index_clamp": lambda a, hi: min(max(a, 0), hi),
            "index_checked": lambda a, n: a}


# Note [Probed strides]
# An index built by a concatenation, a clamp or a split dim (``imod``/``ifloordiv``) has no constant stride in a
# loop variable, but at most indices it moves as an affine one does: the cat of q, k and v grads moves by one
# element as its column grows, except where one piece ends (and by none in the pieces a clamp pins). Layout
# decisions (which loop to tile, which dim to store innermost) read such an index at a few spread points
# instead: the steps it takes there are its probed strides.
_PROBES = 16


def probed_strides(index: Expr, v: Expr) -> Optional[List[int]]:
    """How far ``index`` moves when ``v`` grows by one, at ``_PROBES`` spread points of the other variables (Note
    [Probed strides]); None where the index is not integer arithmetic of loop variables."""
    n = v.args[1]
    if n < 2:
        return None
    others = sorted(free_vars(index) - {v}, key=lambda u: u.args[0])
    steps = []
    for p in range(_PROBES):
        env = {u: (p * 40503 + 7 * k + 3) * 2654435761 % u.args[1] for k, u in enumerate(others)}
        env[v] = p * (n - 1) // _PROBES
        here = evaluate(index, env)
        env[v] += 1
        there = evaluate(index, env)
        if here is None or there is None:
            return None
        steps.append(there - here)
    return steps


def stride(index: Expr, v: Expr) -> Optional[int]:
    """How far ``index`` moves when ``v`` grows by one: a constant, or None where that depends on the indices."""
    terms, _ = _linear(index)
    if all(a.op == "var" for a in terms):  # affine in the loop variables (most indices): its coefficient
        return terms.get(v, 0)
    step = iadd(substitute(index, {v: iadd(v, const(1, INDEX))}), imul(index, -1))
    return step.args[0] if step.op == "const" else None


def adjacent(index: Expr, v: Expr) -> bool:
    """Whether ``index`` moves one element as ``v`` grows: a constant stride of 1, or (Note [Probed strides]) by 0
    or 1 at three in four probes and by 1 at some: a concatenation's pieces, a clamped index."""
    k = stride(index, v)
    if k is not None:
        return k == 1
    steps = probed_strides(index, v)
    return steps is not None and 1 in steps and 4 * sum(st in (0, 1) for st in steps) >= 3 * len(steps)


def typical_stride(index: Expr, v: Expr) -> Optional[int]:
    """The stride of ``index`` in ``v``: the constant one, or the step its probes take most often other than 0
    (Note [Probed strides]); 0 where it never moves; None where it cannot be told."""
    k = stride(index, v)
    if k is not None:
        return k
    steps = probed_strides(index, v)
    if steps is None:
        return None
    moves = [st for st in steps if st != 0]
    return max(set(moves), key=moves.count) if moves else 0


def reduction_body_at(red: Reduction, index: Sequence[Expr]) -> Expr:
    """The reduction's body with its output variables bound to ``index``."""
    return substitute(red.body, dict(zip(red.out_vars, index)))


def format_expr(root: Expr) -> str:
    """Readable text of an expression DAG: one line per shared node."""
    names: Dict[Expr, str] = {}
    lines = []
    for e in walk(root):
        if e.op in ("const", "var", "scalar"):
            names[e] = str(e.args[0]) if e.op != "scalar" else f"s{e.args[0]}"
            continue
        args = ", ".join(names[a] if type(a) is Expr else repr(a) for a in children(e)) if e.op != "load" else \
            f"{e.args[0]!r}, {names[e.args[1]]}"
        if e.op == "reduce":
            args = f"{e.args[0].kind}#{id(e.args[0]) & 0xFFFF:x}, " + args
        names[e] = f"t{len(lines)}"
        lines.append(f"  t{len(lines)} = {e.op}({args}) : {str(e.dtype)[6:]}")
    lines.append(f"  -> {names[root]}")
    return "\n".join(lines)
