"""The C++ renderer's expressions: C types of the dtypes, the table from kernel-IR op to C++ template (STYLE.md item
3) and ``_Scope``, which writes an expression DAG as one ``const`` temporary per node (codegen/cpp.py).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List

import torch

from ..lower import kir
from ..lower.kir import Expr
from . import cpp_math

CTYPES: Dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.float16: "float", torch.bfloat16: "float",  # Note [Half precision]
}

# Note [Half precision]
# float16 and bfloat16 values are computed as float (as eager's CPU kernels do: opmath). Lowering computes each
# half-precision node in float32 and casts its result back (lower/graph.py), so a fused chain rounds once per op,
# as eager's op-by-op run does; any expression still typed half here is rounded to its format too.
# Casts of constants and runtime scalars are not rounded (eager combines them with half tensors in float). In
# memory they are _Float16 (IEEE binary16; g++ converts with F16C where the CPU has it) and the upper 16 bits of a
# float for bfloat16 (converted by bit arithmetic, rounding to nearest even, NaN -> 0x7FC0 as c10 does).
STORAGE: Dict[torch.dtype, str] = {torch.float16: "_Float16", torch.bfloat16: "uint16_t"}
_LOAD = {torch.float16: "static_cast<float>({0})", torch.bfloat16: "lz_bf16_to_float({0})"}
_STORE = {torch.float16: "static_cast<_Float16>({0})", torch.bfloat16: "lz_float_to_bf16({0})"}
_ROUND = {torch.float16: "lz_round_f16({0})", torch.bfloat16: "lz_round_bf16({0})"}
# ops whose result is one of their half-precision operands (or its negation): no rounding needed
_EXACT_IN_HALF = frozenset({"where", "maximum", "minimum", "fmax", "fmin", "clamp_min", "clamp_max", "neg", "abs",
                            "relu"})



def _f(template: str) -> Callable[..., str]:
    return lambda t, *a: template.format(*a, T=t)


def _by_kind(flt: str, integer: str) -> Callable[..., str]:
    def render(t: str, *a: str) -> str:
        return (flt if t in ("float", "double") else integer).format(*a, T=t)
    return render


def _math(fn: str) -> Callable[..., str]:
    return _f(f"std::{fn}({{0}})")


_INT_BITS = {"int8_t": 8, "uint8_t": 8, "int16_t": 16, "int32_t": 32, "int64_t": 64}


def _shift(left: bool) -> Callable[..., str]:
    def render(t: str, a: str, b: str) -> str:
        bits = _INT_BITS[t]
        if left:
            return f"lz_shl<{t}, {'u' + t if t[0] == 'i' else t}, {bits}>({a}, {b})"
        return f"lz_shr<{t}, {bits - (t[0] == 'i')}>({a}, {b})"
    return render


# NOTE: op -> template over the rendered arguments; ``T`` is the C type of the result.
TEMPLATES: Dict[str, Callable[..., str]] = {
    "add": _by_kind("({0} + {1})", "static_cast<{T}>({0} + {1})"),
    "sub": _f("({0} - {1})"),
    "mul": _by_kind("({0} * {1})", "static_cast<{T}>({0} * {1})"),
    "truediv": _f("({0} / {1})"),
    "truncdiv": _by_kind("std::trunc({0} / {1})", "lz_idiv_trunc<{T}>({0}, {1})"),
    "floordiv": _by_kind("lz_fdiv_floor<{T}>({0}, {1})", "lz_idiv_floor<{T}>({0}, {1})"),
    "remainder": _by_kind("lz_fmod_floor<{T}>({0}, {1})", "lz_imod_floor<{T}>({0}, {1})"),
    "fmod": _by_kind("std::fmod({0}, {1})", "lz_imod_trunc<{T}>({0}, {1})"),
    "pow": _by_kind("std::pow({0}, {1})", "lz_ipow<{T}>({0}, {1})"),
    "atan2": _f("std::atan2({0}, {1})"),
    "neg": _f("static_cast<{T}>(-{0})"),
    "abs": _by_kind("std::abs({0})", "static_cast<{T}>({0} < 0 ? -{0} : {0})"),
    # NOTE: !(x <= 0) is true for NaN (kept, as eager) and false for -0.0 (+0.0, as eager): one unordered compare
    # and a mask (vcmpnleps, vandps), where x != x || x > 0 takes two compares and an or (the 200-op chain's latency)
    "relu": _by_kind("(!({0} <= {T}(0)) ? {0} : {T}(0))", "({0} > 0 ? {0} : {T}(0))"),
    # NOTE: eager's sign (and sgn) of NaN is 0 (ATen's (0 < a) - (a < 0)), and of -0.0 is +0.0
    "sign": _by_kind("{T}(({0} > {T}(0)) - ({0} < {T}(0)))", "static_cast<{T}>(({0} > 0) - ({0} < 0))"),
    "sigmoid": _f("({T}(1) / ({T}(1) + lz_exp(-{0})))"),  # eager's formula, vectorized exp
    "rsqrt": _f("({T}(1) / std::sqrt({0}))"),
    "reciprocal": _f("({T}(1) / {0})"),
    "round": _f("std::nearbyint({0})"),
    "gelu": _f("({T}(0.5) * {0} * ({T}(1) + lz_erf({0} * {T}(M_SQRT1_2))))"),
    "gelu_tanh": _f("({T}(0.5) * {0} * ({T}(1) + lz_tanh({T}(M_SQRT2 * M_2_SQRTPI * 0.5) * "
                    "({0} + {T}(0.044715) * {0} * {0} * {0}))))"),
    "maximum": _f("lz_max<{T}>({0}, {1})"),
    "minimum": _f("lz_min<{T}>({0}, {1})"),
    "fmax": _by_kind("std::fmax({0}, {1})", "lz_max<{T}>({0}, {1})"),
    "fmin": _by_kind("std::fmin({0}, {1})", "lz_min<{T}>({0}, {1})"),
    # NOTE: eager's clamp propagates a NaN bound as well as a NaN input
    "clamp_min": _f("lz_max<{T}>({0}, {1})"),
    "clamp_max": _f("lz_min<{T}>({0}, {1})"),
    "lerp": _f("lz_lerp<{T}>({0}, {1}, {2})"),
    "eq": _f("({0} == {1})"), "ne": _f("({0} != {1})"), "lt": _f("({0} < {1})"),
    "le": _f("({0} <= {1})"), "gt": _f("({0} > {1})"), "ge": _f("({0} >= {1})"),
    "and": _f("({0} && {1})"), "or": _f("({0} || {1})"), "not": _f("(!{0})"),
    "bitwise_and": _f("static_cast<{T}>({0} & {1})"), "bitwise_or": _f("static_cast<{T}>({0} | {1})"),
    "bitwise_xor": _f("static_cast<{T}>({0} ^ {1})"), "bitwise_not": _f("static_cast<{T}>(~{0})"),
    "lshift": _shift(left=True), "rshift": _shift(left=False),
    "gcd": _f("lz_gcd<{T}>({0}, {1})"), "lcm": _f("lz_lcm<{T}>({0}, {1})"), "copysign": _f("std::copysign({0}, {1})"),
    "hypot": _f("std::hypot({0}, {1})"), "erfinv": _f("lz_erfinv<{T}>({0})"),
    "digamma": _f("lz_digamma<{T}>({0})"),
    # the argument's type is its own (floating), not T (bool); the builtins take any floating type
    "isinf": _f("__builtin_isinf({0})"), "isfinite": _f("__builtin_isfinite({0})"),
    "isposinf": _f("(__builtin_isinf({0}) && {0} > 0)"), "isneginf": _f("(__builtin_isinf({0}) && {0} < 0)"),
    "signbit": _f("lz_signbit({0})"),
    "where": _f("({0} ? {1} : {2})"),
    "cast": _f("static_cast<{T}>({0})"),
    "index_checked": _f("lz_index_checked({0}, {1}, {2})"), "index_clamp": _f("lz_index_clamp({0}, {1})"),
    "iadd": _f("({0} + {1})"), "imul": _f("({0} * {1})"), "ifloordiv": _f("({0} / {1})"), "imod": _f("({0} % {1})"),
}
for _name in ("exp", "log", "tanh", "sqrt", "sin", "cos", "erf", "log1p", "expm1", "log2", "exp2", "floor", "ceil",
              "trunc", "atan", "asin", "acos", "sinh", "cosh", "tan", "erfc", "log10", "acosh", "asinh", "atanh",
              "lgamma"):
    TEMPLATES[_name] = _math(_name)
for _name in cpp_math.VECTORIZED + ("sin", "cos"):
    TEMPLATES[_name] = _f(f"lz_{_name}({{0}})")  # vectorizable (Note [Vectorized math] in cpp_math.py)
# bool arithmetic is logical, as in eager
BOOL_TEMPLATES: Dict[str, Callable[..., str]] = {"add": _f("({0} || {1})"), "mul": _f("({0} && {1})"),
                                                 "maximum": _f("({0} || {1})"), "minimum": _f("({0} && {1})"),
                                                 "fmax": _f("({0} || {1})"), "fmin": _f("({0} && {1})"),
                                                 "bitwise_not": _f("(!{0})")}  # C++'s ~true is -2, i.e. true


class UnsupportedByRenderer(Exception):
    pass


def ctype(dtype: torch.dtype) -> str:
    try:
        return CTYPES[dtype]
    except KeyError:
        raise UnsupportedByRenderer(f"dtype {dtype} has no C++ type in this renderer") from None


def storage_ctype(dtype: torch.dtype) -> str:
    """The C++ type of a buffer's elements (the value type, but for Note [Half precision])."""
    return STORAGE.get(dtype) or ctype(dtype)


def _const(value, dtype: torch.dtype) -> str:
    t = ctype(dtype)
    if dtype.is_floating_point:
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"{t}({float(value).hex()})"
    if dtype is torch.bool:
        return "true" if value else "false"
    if value == -(1 << 63):
        return "INT64_MIN"
    return f"{t}({value}LL)" if t != "int64_t" else f"int64_t({value}LL)"


class _Scope:
    """Rendered names visible in a block; new temporaries go to ``lines``."""

    def __init__(self, names: Dict[Expr, str], lines: List[str], indent: str, counter: List[int],
                 var_names: Dict[Expr, str]) -> None:
        self.names, self.lines, self.indent, self.counter, self.var_names = dict(names), lines, indent, counter, \
            var_names

    def child(self, indent: str) -> "_Scope":
        return _Scope(self.names, self.lines, indent, self.counter, self.var_names)

    def emit(self, root: Expr) -> str:
        for e in kir.walk(root, self.names):  # a named value needs none of its operands
            if e in self.names:
                continue
            if e.op == "const":
                self.names[e] = _const(e.args[0], e.dtype)
                continue
            if e.op == "var":
                self.names[e] = self.var_names[e]
                continue
            if e.op == "scalar":
                self.names[e] = f"F[{e.args[0]}]" if e.dtype.is_floating_point else f"I[{e.args[0]}]"
                continue
            if e.op == "reduce":
                raise UnsupportedByRenderer("a reduction read outside its stage")
            t = ctype(e.dtype)
            if e.op == "load":
                text = f"b{e.args[0].id}[{self.names[e.args[1]]}]"
                if e.dtype in _LOAD:
                    text = _LOAD[e.dtype].format(text)
            elif e.op == "cast" and e.dtype in _ROUND:
                source = e.args[0]
                text = f"static_cast<float>({self.names[source]})"
                if source.op not in ("const", "scalar"):  # Note [Half precision]
                    text = _ROUND[e.dtype].format(text)
            elif e.op == "pow" and e.dtype.is_floating_point and (exponent := _uniform(e.args[1])) is not None:
                # Note [Pow with a scalar exponent] (codegen/cpp_prelude.py)
                text = f"lz_pow_scalar<{t}>({self.names[e.args[0]]}, static_cast<double>({self.names[exponent]}))"
                if e.dtype in _ROUND:
                    text = _ROUND[e.dtype].format(text)
            else:
                table = BOOL_TEMPLATES if e.dtype is torch.bool and e.op in BOOL_TEMPLATES else TEMPLATES
                fn = table.get(e.op)
                if fn is None:
                    raise UnsupportedByRenderer(f"kernel-IR op {e.op!r} has no C++ template")
                text = fn(t, *[self.names[a] for a in e.args if type(a) is Expr])
                if e.dtype in _ROUND and e.op not in _EXACT_IN_HALF:  # each op's result in its format, as eager
                    text = _ROUND[e.dtype].format(text)
            name = f"t{self.counter[0]}"
            self.counter[0] += 1
            self.lines.append(f"{self.indent}const {t} {name} = {text};")
            self.names[e] = name
        return self.names[root]


def _uniform(e: Expr) -> Expr:
    """The runtime scalar or constant ``e`` is (directly or cast), else None: one value for a whole kernel."""
    if e.op == "cast":
        e = e.args[0]
    return e if e.op in ("scalar", "const") else None


def _loop(var_name: str, extent: int, indent: str) -> str:
    return f"{indent}for (int64_t {var_name} = 0; {var_name} < {extent}; ++{var_name}) {{"
