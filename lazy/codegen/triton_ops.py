"""The Triton renderer's table: kernel-IR op -> Triton expression over the rendered arguments (STYLE.md item 3).

The mirror of codegen/cpp.py's TEMPLATES. A template takes the expression (for its dtype and its operands'
dtypes) and the rendered operands, and returns Triton source. Math functions are called through ``M``: CUDA's
libdevice when the kernel is compiled for a GPU (the functions eager's CUDA kernels call: ``expf``, ``tanhf``,
...), and codegen/triton_interp.py under the interpreter (TRITON_INTERPRET=1, the cpu backing device), whose
functions run eager's own CPU kernels on the interpreter's arrays. HELPERS are jitted functions emitted into every
generated module. An op with no template raises UnsupportedByRenderer: the graph
falls back to the reference executor, never to a wrong value.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List

import torch

from ..lower.kir import Expr


class UnsupportedByRenderer(Exception):
    """The Triton renderer cannot express this kernel (an op, a dtype or a shape it has no template for)."""


TL: Dict[torch.dtype, str] = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
_BITS = {torch.int64: 64, torch.int32: 32, torch.int16: 16, torch.int8: 8, torch.uint8: 8}
_SIGNED_INT = {torch.float64: "tl.int64", torch.float32: "tl.int32", torch.float16: "tl.int16",
               torch.bfloat16: "tl.int16"}
HALF = (torch.float16, torch.bfloat16)


def tl_type(dtype: torch.dtype) -> str:
    try:
        return TL[dtype]
    except KeyError:
        raise UnsupportedByRenderer(f"dtype {dtype} has no Triton type in this renderer") from None


def const(value, dtype: torch.dtype) -> str:
    """A constant of ``dtype`` (a 0-d tensor: Triton's literals would take the type of the other operand)."""
    t = tl_type(dtype)
    if dtype.is_floating_point:
        if math.isnan(value):
            text = 'float("nan")'
        elif math.isinf(value):
            text = 'float("inf")' if value > 0 else 'float("-inf")'
        else:
            text = repr(float(value))
    elif dtype is torch.bool:
        text = "True" if value else "False"
    else:
        if not -(1 << 63) <= value < (1 << 63):
            raise UnsupportedByRenderer(f"integer constant {value} out of int64's range")
        text = str(int(value)) if value != -(1 << 63) else "-9223372036854775807 - 1"
    return f"tl.full([], {text}, {t})"


Template = Callable[[Expr, List[str]], str]


def _f(text: str) -> Template:
    return lambda e, a: text.format(*a, T=tl_type(e.dtype))


def _by_kind(flt: str, integer: str) -> Template:
    return lambda e, a: (flt if e.dtype.is_floating_point else integer).format(*a, T=tl_type(e.dtype))


def _math(name: str) -> Template:
    return lambda e, a: f"M.{name}({', '.join(a)})"


def _zero(e: Expr) -> str:
    return const(0, e.dtype)


def _shift(left: bool) -> Template:
    def render(e: Expr, a: List[str]) -> str:
        bits = _BITS.get(e.dtype)
        if bits is None:
            raise UnsupportedByRenderer(f"shift of {e.dtype}")
        out = f"(({a[1]} < 0) | ({a[1]} >= {bits}))"
        if left:  # eager: a shift by the width or more (or negative) gives 0
            return f"tl.where({out}, {_zero(e)}, {a[0]} << tl.where({out}, 0, {a[1]}).to({tl_type(e.dtype)}))"
        if e.dtype is torch.uint8:
            return f"tl.where({out}, {_zero(e)}, {a[0]} >> tl.where({out}, 0, {a[1]}).to({tl_type(e.dtype)}))"
        return f"({a[0]} >> tl.where({out}, {bits - 1}, {a[1]}).to({tl_type(e.dtype)}))"  # sign fill
    return render


def _isinf(e: Expr, a: List[str]) -> str:
    return f"(({a[0]} == float('inf')) | ({a[0]} == float('-inf')))"


def _signbit(e: Expr, a: List[str]) -> str:
    t = e.args[0].dtype
    if t not in _SIGNED_INT:
        raise UnsupportedByRenderer(f"signbit of {t}")
    return f"({a[0]}.to({_SIGNED_INT[t]}, bitcast=True) < 0)"


def _or_nan(e: Expr, a: List[str], i: int) -> str:
    """``(x != x) | `` for operand ``i``, a NaN test, where it may be NaN: a constant other than NaN is not (and a
    test of two constants, a scalar bool or'ed with a block, is what Triton's interpreter rejects)."""
    if e.args[i].op == "const" and "nan" not in a[i]:
        return ""
    return f"({a[i]} != {a[i]}) | "


def _nan_max(gt: str) -> Template:
    """maximum/minimum (and clamp): a NaN operand propagates, as in eager."""
    def render(e: Expr, a: List[str]) -> str:
        if e.dtype.is_floating_point:
            return f"tl.where({_or_nan(e, a, 0)}({a[0]} {gt} {a[1]}), {a[0]}, {a[1]})"
        return f"tl.where({a[0]} {gt} {a[1]}, {a[0]}, {a[1]})"
    return render


def _num_max(gt: str) -> Template:
    """fmax/fmin: a NaN operand is ignored unless both are NaN."""
    return lambda e, a: f"tl.where({_or_nan(e, a, 1)}({a[0]} {gt} {a[1]}), {a[0]}, {a[1]})"


def _div_guard(fn: str) -> Template:
    """Integer division helpers take the divisor guarded: a zero divisor gives 0 (eager CPU raises, CUDA gives
    an unspecified value); floating ones follow IEEE."""
    def render(e: Expr, a: List[str]) -> str:
        if e.dtype.is_floating_point:
            return f"{fn}_f({a[0]}, {a[1]})"
        return f"{fn}_i({a[0]}, {a[1]})"
    return render


def _relu(e: Expr, a: List[str]) -> str:
    if e.dtype.is_floating_point:
        return f"tl.where({_or_nan(e, a, 0)}({a[0]} > 0), {a[0]}, {_zero(e)})"
    return f"tl.where({a[0]} > 0, {a[0]}, {_zero(e)})"


def _sign(e: Expr, a: List[str]) -> str:
    if e.dtype == torch.bool:  # its own sign; a difference of booleans is refused by Triton's interpreter (numpy)
        return a[0]
    t = tl_type(e.dtype)
    return f"(({a[0]} > 0).to({t}) - ({a[0]} < 0).to({t}))"


def _one(e: Expr) -> str:
    return const(1, e.dtype)


def _pow(e: Expr, a: List[str]) -> str:
    if not e.dtype.is_floating_point:
        return f"ipow({a[0]}, {a[1]})"
    value = getattr(e.args[1], "value", None)  # a constant exponent (Note [Scalars that pick eager's kernel])
    if type(value) in (int, float):  # eager's arithmetic for these exponents
        x, one = a[0], _one(e)
        special = {2: f"({x} * {x})", 3: f"({x} * {x} * {x})", -1: f"M.div_rn({one}, {x})",
                   -2: f"M.div_rn({one}, {x} * {x})", 0.5: f"M.sqrt({x})", -0.5: f"M.div_rn({one}, M.sqrt({x}))"}
        if value in special:
            return special[value]
    return f"M.pow({a[0]}, {a[1]})"


TEMPLATES: Dict[str, Template] = {
    "add": _f("({0} + {1})"),
    "sub": _f("({0} - {1})"),
    "mul": _f("({0} * {1})"),
    "truediv": _f("M.div_rn({0}, {1})"),
    "truncdiv": _div_guard("truncdiv"),
    "floordiv": _div_guard("floordiv"),
    "remainder": _div_guard("remainder"),
    "fmod": _div_guard("fmod"),
    "pow": _pow,
    "neg": _f("(-{0})"),
    "abs": _by_kind("tl.abs({0})", "tl.where({0} < 0, -{0}, {0})"),
    "relu": _relu,
    "sign": _sign,
    "sigmoid": lambda e, a: f"M.div_rn({_one(e)}, {_one(e)} + M.exp(-{a[0]}))",
    "rsqrt": lambda e, a: f"M.div_rn({_one(e)}, M.sqrt({a[0]}))",
    "reciprocal": lambda e, a: f"M.div_rn({_one(e)}, {a[0]})",
    "round": _math("nearbyint"),
    "gelu": lambda e, a: f"({const(0.5, e.dtype)} * {a[0]} * ({_one(e)} + M.erf({a[0]} * "
                         f"{const(math.sqrt(0.5), e.dtype)})))",
    "gelu_tanh": lambda e, a: f"({const(0.5, e.dtype)} * {a[0]} * ({_one(e)} + M.tanh("
                              f"{const(math.sqrt(2.0 / math.pi), e.dtype)} * ({a[0]} + {const(0.044715, e.dtype)} * "
                              f"{a[0]} * {a[0]} * {a[0]}))))",
    "maximum": _nan_max(">"), "minimum": _nan_max("<"),
    "clamp_min": _nan_max(">"), "clamp_max": _nan_max("<"),
    "fmax": _by_kind("", ""), "fmin": _by_kind("", ""),  # replaced below
    "lerp": lambda e, a: f"tl.where(tl.abs({a[2]}) < 0.5, {a[0]} + {a[2]} * ({a[1]} - {a[0]}), "
                         f"{a[1]} - ({a[1]} - {a[0]}) * ({_one(e)} - {a[2]}))",
    "eq": _f("({0} == {1})"), "ne": _f("({0} != {1})"), "lt": _f("({0} < {1})"),
    "le": _f("({0} <= {1})"), "gt": _f("({0} > {1})"), "ge": _f("({0} >= {1})"),
    "and": _f("({0} & {1})"), "or": _f("({0} | {1})"), "not": _f("({0} == 0)"),
    "bitwise_and": _f("({0} & {1})"), "bitwise_or": _f("({0} | {1})"), "bitwise_xor": _f("({0} ^ {1})"),
    "bitwise_not": _f("(~{0})"),
    "lshift": _shift(left=True), "rshift": _shift(left=False),
    "copysign": _math("copysign"), "hypot": _math("hypot"), "atan2": _math("atan2"),
    "erfinv": _math("erfinv"),
    "isinf": _isinf, "isfinite": lambda e, a: f"(({a[0]} == {a[0]}) & (tl.abs({a[0]}) != float('inf')))",
    "isposinf": lambda e, a: f"({a[0]} == float('inf'))", "isneginf": lambda e, a: f"({a[0]} == float('-inf'))",
    "signbit": _signbit,
    "where": _f("tl.where({0}, {1}, {2})"),
    "index_checked": _f("index_checked({0}, {1}, {2}, {3})"),  # {3}: the lanes that hold elements
    "index_clamp": _f("tl.minimum(tl.maximum({0}, 0), {1})"),
    "iadd": _f("({0} + {1})"), "imul": _f("({0} * {1})"), "ifloordiv": _f("({0} // {1})"), "imod": _f("({0} % {1})"),
}
TEMPLATES["fmax"], TEMPLATES["fmin"] = _num_max(">"), _num_max("<")
for _name in ("exp", "log", "tanh", "sqrt", "sin", "cos", "erf", "log1p", "expm1", "log2", "exp2", "floor", "ceil",
              "trunc", "atan", "asin", "acos", "sinh", "cosh", "tan", "erfc", "log10", "acosh", "asinh", "atanh",
              "lgamma"):
    TEMPLATES[_name] = _math(_name)
# bool arithmetic is logical, as in eager
BOOL_TEMPLATES: Dict[str, Template] = {
    "add": _f("({0} | {1})"), "mul": _f("({0} & {1})"), "maximum": _f("({0} | {1})"), "minimum": _f("({0} & {1})"),
    "fmax": _f("({0} | {1})"), "fmin": _f("({0} & {1})"), "bitwise_not": _f("({0} == 0)"),
    "clamp_min": _f("({0} | {1})"), "clamp_max": _f("({0} & {1})")}
# Helpers every generated module defines (jitted device functions; ``_jit`` is triton.jit, or the interpreter's).
HELPERS = r'''
@_jit
def truncdiv_f(a, b):
    return M.trunc(M.div_rn(a, b))


@_jit
def truncdiv_i(a, b):
    return tl.where(b == 0, 0, a // tl.where(b == 0, 1, b)).to(a.dtype)


@_jit
def floordiv_i(a, b):
    d = tl.where(b == 0, 1, b)
    q = a // d
    r = a % d
    q = tl.where((r != 0) & ((r < 0) != (d < 0)), q - 1, q)
    return tl.where(b == 0, 0, q).to(a.dtype)


@_jit
def floordiv_f(a, b):
    # eager's div_floor_floating: (a - fmod(a, b)) / b, corrected by one and rounded to the nearest integer
    mod = M.fmod(a, b)
    div = M.div_rn(a - mod, b)
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = M.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1, fl)
    fl = tl.where(div != 0, fl, M.copysign(tl.zeros_like(div), M.div_rn(a, b)))
    return tl.where(b == 0, M.div_rn(a, b), fl)


@_jit
def remainder_i(a, b):
    d = tl.where(b == 0, 1, b)
    r = a % d
    r = tl.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return tl.where(b == 0, 0, r).to(a.dtype)


@_jit
def remainder_f(a, b):
    r = M.fmod(a, b)
    return tl.where((r != 0) & ((b < 0) != (r < 0)), r + b, r)


@_jit
def fmod_i(a, b):
    return tl.where(b == 0, 0, a % tl.where(b == 0, 1, b)).to(a.dtype)


@_jit
def fmod_f(a, b):
    return M.fmod(a, b)


@_jit
def ipow(a, b):
    # eager's integer pow: wraps on overflow; the exponent is a non-negative constant (lower/pointwise.py)
    r = tl.full(a.shape, 1, a.dtype)
    e = b + tl.zeros_like(a)
    x = a + tl.zeros_like(e)
    for _ in range(64):
        r = tl.where((e & 1) != 0, r * x, r)
        e = e >> 1
        x = x * x
    return r


@_jit
def index_checked(i, n, wrap, live):
    # Note [Indexed loads] (lower/indexing.py): an index out of range is an error, as in eager; only in the lanes
    # that hold elements (``live``, the mask of the index's loops): a masked lane's index is whatever its loads'
    # ``other`` or a reduction's identity made it (an argmax over no element is 2^30)
    j = tl.where((i < 0) & (wrap != 0), i + n, i)
    ok = (j >= 0) & (j < n)
    tl.device_assert(ok | (live == 0), "lazy: index out of range in a compiled kernel")
    return tl.where(ok, j, 0)


@_jit
def max_nan(a, b):
    return tl.where((a != a) | (a > b), a, b)


@_jit
def min_nan(a, b):
    return tl.where((a != a) | (a < b), a, b)


@_jit
def prod_(a, b):
    return a * b


@_jit
def argmax_(a, ia, b, ib):
    # Note [Arg reductions]: the larger value, a NaN above every number, the smaller index among equals
    an = a != a
    bn = b != b
    take = (~an & (bn | (b > a))) | (((a == b) | (an & bn)) & (ib < ia))
    return tl.where(take, b, a), tl.where(take, ib, ia)


@_jit
def argmin_(a, ia, b, ib):
    an = a != a
    bn = b != b
    take = (~an & (bn | (b < a))) | (((a == b) | (an & bn)) & (ib < ia))
    return tl.where(take, b, a), tl.where(take, ib, ia)
'''
