"""The C++/OpenMP renderer: a schedule -> one translation unit of plain C++ (raw pointers, no torch headers).

A table maps each kernel-IR op to a template over its rendered arguments (STYLE.md item 3); a few hooks render
loops, stages and stores. Each kernel is a ``static`` function; each run of consecutive kernels between extern
calls is one ``extern "C"`` entry point ``lz_seg<i>(void** P, const double* F, const int64_t* I)``: ``P`` holds
every buffer's pointer (by buffer id), ``F``/``I`` the runtime scalars as double/int64. The return value is
non-zero if an integer division by zero happened (eager raises there too). Temporaries are declared with their
exact C type so narrow integer results wrap as in eager.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import torch

from ..lower import kir
from ..lower.graph import EXPENSIVE_COST, EXPENSIVE_OPS
from ..lower.kir import Expr
from ..schedule import Kernel, Limits, Schedule, Stage
from . import cpp_math
from .cpp_prelude import PRELUDE

# keep_bytes: stage values kept per outer iteration (Note [Stage values kept for the stores] in schedule/) live in
# an array on the stack, a third of a 48 KB L1: softmax rows of up to 4096 floats
LIMITS = Limits(max_buffers=64, parallel_threshold=1 << 15, keep_bytes=16 << 10, coalesce=True)

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
    "relu": _by_kind("(({0} != {0} || {0} > {T}(0)) ? {0} : {T}(0))", "({0} > 0 ? {0} : {T}(0))"),
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

INIT = {"sum": lambda t: f"{t}(0)", "prod": lambda t: f"{t}(1)",
        "max": lambda t: f"-std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
        else f"std::numeric_limits<{t}>::lowest()",
        "min": lambda t: f"std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
        else f"std::numeric_limits<{t}>::max()"}
INIT["argmax"], INIT["argmin"] = INIT["max"], INIT["min"]
# NOTE: max/min store unconditionally (a select): a conditional store to an accumulator array in lanes would be
# vectorized as a masked store behind an "any lane?" branch, twice the code and no accumulator in a register.
COMBINE = {"sum": "{acc} += {v};", "prod": "{acc} *= {v};",
           "max": "{acc} = ({v} != {v} || {v} > {acc}) ? {v} : {acc};",
           "min": "{acc} = ({v} != {v} || {v} < {acc}) ? {v} : {acc};"}
# Note [Arg reductions] (lower/structure.py): a (value, index) accumulator. Along the loop a value replaces it only
# if it is strictly above (below) it, or a NaN over a number, so the first of equal values (and the first NaN)
# keeps its index: each lane meets its elements in increasing index order (Note [Reductions in lanes]). The tree
# over the lanes takes the other lane's pair if its value is above (below), or equal (both NaN) with a smaller
# index: the first index of the whole loop, whatever the lane count. The initial pair (-inf or the lowest value,
# index 0) loses to every element but an equal one, and if all elements equal it, index 0 is the answer.
_ARG_SET = "{acc} = c ? {v} : {acc}; {idx} = c ? {i} : {idx}; }}"
ARG_COMBINE = {"argmax": "{{ const bool c = ({v} != {v} && {acc} == {acc}) || {v} > {acc}; " + _ARG_SET,
               "argmin": "{{ const bool c = ({v} != {v} && {acc} == {acc}) || {v} < {acc}; " + _ARG_SET}
ARG_TREE = {"argmax": "{{ const bool c = {v} != {v} ? ({acc} == {acc} || {i} < {idx}) : ({v} > {acc} || ({v} == {acc}"
                      " && {i} < {idx})); " + _ARG_SET,
            "argmin": "{{ const bool c = {v} != {v} ? ({acc} == {acc} || {i} < {idx}) : ({v} < {acc} || ({v} == {acc}"
                      " && {i} < {idx})); " + _ARG_SET}


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


def _loop(var_name: str, extent: int, indent: str) -> str:
    return f"{indent}for (int64_t {var_name} = 0; {var_name} < {extent}; ++{var_name}) {{"


# Note [Reductions in lanes]
# Without -ffast-math g++ may not reassociate a floating-point reduction, so a loop ``acc += v`` runs one element
# at a time, bound by the latency of one add. A stage with a floating accumulator (sum, max, min) keeps ``L``
# accumulators instead: the innermost reduced loop runs in blocks of L consecutive elements, lane l of a block
# going to accumulator l. The loop over a block's lanes carries no dependence, so g++ vectorizes it (``omp simd``)
# without reassociating anything; at the end the lanes are combined in a fixed tree (lane l with lane l + w, for
# w = L/2, L/4, ..., 1). The result depends on L alone (the dtype and the loop's extent), never on the vector
# width or the thread count, and is as accurate as the sequential loop: float sums still accumulate in double (short
# ones in float lanes: Note [Short float sums in float lanes]); max and min propagate a NaN through its lane and
# through the tree. Integer sums, max and min (g++ reassociates exact integer arithmetic and vectorizes those loops
# as written), bool reductions and prod keep the sequential loop. Arg reductions run in lanes for every dtype (g++
# does not vectorize the index select as written): each lane keeps a (value, index) pair and the tree prefers the
# smaller index among equals (Note [Arg reductions] below), so the answer is the sequential loop's, exactly (rows
# of 1000 floats: 2.3x faster than the sequential loop).
# Blocks: L is a power of two, LANE_BYTES of accumulators or the largest power of two within a shorter loop, and
# every block holds L elements, so the lane loop has a constant trip count (no vector epilogue to compile; g++
# keeps the accumulators in registers). Where L does not divide the extent, the last block is shifted back to end
# at the extent and overlaps the one before: max and min take its elements again (a repeat changes nothing), a
# sum first computes the block's values and then adds only those of lanes the block before did not take (a select
# on the value inside the first loop would let g++ sink the body into a branch, and a call such as lz_exp in a
# branch is not vectorized).
# LANE_BYTES is 4 AVX-512 registers of accumulators (32 doubles, 64 floats): measured with 1 thread on 256 x 1024
# and 1024 x 1024 float32, 2 to 8 registers ran within noise of each other, 1 register was 2x slower on column sums
# and 3.5x on softmax (8 lanes of double cannot call the 16-lane vector clone of lz_exp), and 8 registers made the
# code, and g++'s time, ~25 % larger. A floating reduction costs g++ more than its sequential loop did: the test
# graph of 180 small reductions (tests/test_codegen_cpp.py) compiles in ~6 s instead of 1.7 s; the training steps
# of tests/models.py, 2 % longer.
# A tiled kernel (Note [Column reductions are tiled] in schedule/) runs in the same blocks of lanes, but a lane is
# one output of the block, with its own sequential accumulator over the whole reduced loop: every kind and dtype
# is tiled, with the results of the untiled loop. The shifted last block computes some outputs again (the same
# values); only the lanes the block owns are stored, after all its values are computed (as above).
LANE_BYTES = 256
LANE_KINDS = frozenset({"sum", "max", "min", "argmax", "argmin"})
IDEMPOTENT = frozenset({"max", "min", "argmax", "argmin"})  # an element combined twice changes nothing
_CSIZE = {"double": 8, "float": 4, "int64_t": 8, "int32_t": 4, "int16_t": 2, "int8_t": 1, "uint8_t": 1, "bool": 1}


def _lanes(types: List[str], extent: int) -> int:
    """Lanes per block: LANE_BYTES of the widest of ``types``, or the largest power of two within ``extent``."""
    most = LANE_BYTES // max(_CSIZE[t] for t in types)
    n = 1
    while n * 2 <= min(extent, most):
        n *= 2
    return n


class _Blocks:
    """Loop ``name`` of ``extent`` in blocks of ``lanes`` consecutive indices (Note [Reductions in lanes]); if
    ``masked``, the last block is shifted back to end at the extent, over lanes that the block before did."""

    def __init__(self, name: str, extent: int, lanes: int) -> None:
        self.name, self.extent, self.lanes = name, extent, lanes
        self.masked = extent % lanes != 0

    def open(self, indent: str) -> List[str]:
        """The loop over blocks, ``{name}k`` the first index the block takes, ``{name}b`` the block's start."""
        k, b, last = f"{self.name}k", f"{self.name}b", self.extent - self.lanes
        start = f"{k} < {last} ? {k} : {last}" if self.masked else k
        return [f"{indent}for (int64_t {k} = 0; {k} < {self.extent}; {k} += {self.lanes}) {{",
                f"{indent}  const int64_t {b} = {start};"]

    def lanes_loop(self, indent: str) -> List[str]:
        """The loop over the lanes of a block; it binds ``name`` to the lane's index."""
        return [f"{indent}#pragma omp simd", f"{indent}for (int64_t l = 0; l < {self.lanes}; ++l) {{",
                f"{indent}  const int64_t {self.name} = {self.name}b + l;"]

    def new(self) -> str:
        """Whether the lane's index is one the block takes (the block before did not)."""
        return f"l >= {self.name}k - {self.name}b"


# Note [Short float sums in float lanes]
# A float32 sum accumulates in double (lower/structure.py): sound for any length without pairwise summation, but
# each element costs a conversion and a double add (half the lanes of a float vector), and on AVX2 the 32 double
# lanes fill half the registers (spilled around the calls of lz_exp). Where a lane takes at most FLOAT_LANE_TERMS
# elements (a row of up to 4096 floats in 64 lanes), the lanes accumulate in float instead: each lane's error is
# that of a sum of <= 64 terms and the fixed tree adds 6 levels, within a few ulps of the terms' magnitude, as
# eager's own float32 sums (a cascade of float accumulators). Longer sums, tiled ones (a lane is then one output's
# whole sequential sum) and sums whose elements are computed in double (var's squared deviations) keep double.
# Measured (1 thread, float lanes vs double): row sums of 4096 x 1024 20 %, softmax 1024^2 6-8 % faster.
FLOAT_LANE_TERMS = 64


def _float_lanes(s: Stage, tile: Optional[_Blocks]) -> bool:
    """Whether stage ``s`` sums in float lanes (Note [Short float sums in float lanes])."""
    red, body = s.red, s.body
    if tile is not None or red.kind != "sum" or red.dtype != torch.float32 or red.acc_dtype != torch.float64 \
            or not s.red_vars or body.op != "cast" or body.args[0].dtype != torch.float32:
        return False
    n = 1
    for k in red.red_shape:
        n *= k
    lanes = _lanes(["float"], s.red_vars[-1].args[1])
    return lanes > 1 and n <= lanes * FLOAT_LANE_TERMS


def _reduced(s: Stage, acc: str) -> str:
    """The stage's result from its accumulator ``acc``: in the result's type, half precision rounded once."""
    value = f"static_cast<{ctype(s.red.dtype)}>({acc})"
    return _ROUND[s.red.dtype].format(value) if s.red.dtype in _ROUND else value


def _render_stage(n: int, s: Stage, scope: _Scope, tile: Optional[_Blocks], arrays: Dict[Expr, str]) -> None:
    """Stage ``n`` at ``scope``'s indent: sequential, in lanes (Note [Reductions in lanes]) or, in a kernel tiled in
    ``tile``'s blocks, one accumulator per lane. Its result is ``red<n>``: a name in ``scope``, or an array of the
    lanes' results (recorded in ``arrays``) in a tiled kernel."""
    lines, indent, red, name = scope.lines, scope.indent, s.red, f"red{n}"
    at, rt, init = ctype(red.acc_dtype), ctype(red.dtype), INIT[red.kind](ctype(red.acc_dtype))
    element = s.body
    if _float_lanes(s, tile):  # Note [Short float sums in float lanes]
        at, init, element = "float", INIT["sum"]("float"), s.body.args[0]
    red_vars = list(s.red_vars)
    blocks = tile
    arg = red.kind in kir.ARG_KINDS  # Note [Arg reductions]: exact in lanes for every dtype
    if tile is None and red.kind in LANE_KINDS and (red.acc_dtype.is_floating_point or arg) and red_vars:
        lanes = _lanes([at, "int64_t"] if arg else [at], red_vars[-1].args[1])
        if lanes > 1:
            blocks = _Blocks(scope.var_names[red_vars[-1]], red_vars[-1].args[1], lanes)
            red_vars = red_vars[:-1]
    acc = f"acc{n}" if blocks is None else f"acc{n}[l]"
    idx = f"idx{n}" if blocks is None else f"idx{n}[l]"
    kept = _kept_arrays(n, s)
    lines.extend(f"{indent}{ctype(e.dtype)} {array}[{size}];" for array, size, e, _ in kept)
    if blocks is None:
        lines.append(f"{indent}{at} acc{n} = {init};")
        if arg:
            lines.append(f"{indent}int64_t idx{n} = 0;")
    else:
        lines.append(f"{indent}{at} acc{n}[{blocks.lanes}];")
        if arg:
            lines.append(f"{indent}int64_t idx{n}[{blocks.lanes}];")
            lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) {idx} = 0;")
        lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) {acc} = {init};")
    ind = indent
    for v in red_vars:
        lines.append(_loop(scope.var_names[v], v.args[1], ind))
        ind += "  "
    masked = blocks is not None and blocks is not tile and blocks.masked and red.kind not in IDEMPOTENT
    if blocks is not tile:
        lines.extend(blocks.open(ind))
        ind += "  "
        if masked:
            lines.append(f"{ind}{at} v{n}[{blocks.lanes}];")
    if blocks is not None:
        lines.extend(blocks.lanes_loop(ind))
        ind += "  "
    body = scope.child(ind)
    body.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
    value = body.emit(element)
    if kept:  # Note [Stage values kept for the stores] (the shifted last block writes some of them again, the same)
        at_index = body.emit(s.keep_index[0])
        lines.extend(f"{ind}{array}[{at_index}] = {body.names[e]};" for array, _, e, _ in kept)
    if masked:  # the block's values, then the lanes it takes
        lines.append(f"{ind}v{n}[l] = {value};")
        ind = ind[:-2]
        combine = COMBINE[red.kind].format(acc=acc, v=f"({blocks.new()} ? v{n}[l] : {init})")
        lines.extend([f"{ind}}}", f"{ind}#pragma omp simd",
                      f"{ind}for (int64_t l = 0; l < {blocks.lanes}; ++l) {combine}"])
    elif arg:  # the lane's flat index: the innermost reduced variable is bound to the lane's
        flat = kir.const(0, kir.INDEX)
        for v in s.red_vars:  # merged loops (Note [Contiguous loops are merged]) give the same row-major index
            flat = kir.iadd(kir.imul(flat, v.args[1]), v)
        lines.append(ind + ARG_COMBINE[red.kind].format(acc=acc, v=value, idx=idx, i=body.emit(flat)))
    else:
        lines.append(ind + COMBINE[red.kind].format(acc=acc, v=value))
    while ind != indent:
        ind = ind[:-2]
        lines.append(ind + "}")
    if tile is not None:
        lines.append(f"{indent}{rt} {name}[{tile.lanes}];")
        lines.append(f"{indent}for (int64_t l = 0; l < {tile.lanes}; ++l) {name}[l] = "
                     f"{_reduced(s, idx if arg else acc)};")
        arrays[s.ref] = name
        return
    if blocks is not None:  # the fixed tree over the lanes
        lines.append(f"{indent}for (int64_t w = {blocks.lanes // 2}; w > 0; w /= 2) {{")
        lines.append(f"{indent}  #pragma omp simd")
        combine = ARG_TREE[red.kind].format(acc=acc, v=f"acc{n}[l + w]", idx=idx, i=f"idx{n}[l + w]") if arg else \
            COMBINE[red.kind].format(acc=acc, v=f"acc{n}[l + w]")
        lines.append(f"{indent}  for (int64_t l = 0; l < w; ++l) {{ {combine} }}")
        lines.append(f"{indent}}}")
    result = (idx if arg else acc) if blocks is None else f"{'idx' if arg else 'acc'}{n}[0]"
    lines.append(f"{indent}const {rt} {name} = {_reduced(s, result)};")
    scope.names[s.ref] = name


# Note [Sibling stages share their loop]
# BatchNorm's backward sums dy and dy * (x - mean) over the same (N, H, W) loops of the same tensors; rendered one
# after the other, each stage loads dy (and recomputes the ReLU mask in front of it) in a loop of its own. Consecutive
# stages of a kernel whose reduced loops have the same extents, none reading another's result, that all run in
# lanes (Note [Reductions in lanes]: floating sum, max or min, no kept values) are rendered as one loop nest with one
# set of accumulator lanes per stage: their bodies are written in the first stage's variables, so a load or a
# value they share is computed once per element. Each stage's lanes, blocks, order of additions and tree are those it
# has alone (the lane count depends on the stage's accumulator type and the loop's extent, not on its siblings), so
# each result is bit-identical to the stage rendered alone. At most MAX_SIBLINGS stages share a loop, so their
# accumulators stay in registers (4 x 4 AVX-512 registers of double lanes).
MAX_SIBLINGS = 4


def _lane_stage(s: Stage) -> Optional[str]:
    """The accumulator type of stage ``s`` if it runs in lanes of that type outside a tile, else None."""
    red = s.red
    if red.kind not in ("sum", "max", "min") or not red.acc_dtype.is_floating_point or s.keep or not s.red_vars:
        return None
    at = "float" if _float_lanes(s, None) else ctype(red.acc_dtype)
    return at if _lanes([at], s.red_vars[-1].args[1]) > 1 else None


def _sibling_stages(k: Kernel, tile: Optional["_Blocks"]) -> List[List[int]]:
    """The kernel's stages in order, in groups rendered in one loop (Note [Sibling stages share their loop])."""
    groups: List[List[int]] = []
    for n, s in enumerate(k.stages):
        if groups and tile is None and len(groups[-1]) < MAX_SIBLINGS:
            first = k.stages[groups[-1][0]]
            at = _lane_stage(s)
            if at is not None and all(_lane_stage(k.stages[m]) == at for m in groups[-1]) \
                    and [v.args[1] for v in s.red_vars] == [v.args[1] for v in first.red_vars]:
                inside = set(kir.walk(s.body))
                if not any(k.stages[m].ref in inside for m in groups[-1]):
                    groups[-1].append(n)
                    continue
        groups.append([n])
    return groups


def _render_siblings(group: List[tuple], scope: _Scope) -> None:
    """Stages ``group`` ((n, stage) pairs) in one loop nest (Note [Sibling stages share their loop]); each result
    ``red<n>`` becomes a name in ``scope``."""
    lines, indent = scope.lines, scope.indent
    first = group[0][1]
    at = _lane_stage(first)
    red_vars = first.red_vars
    last = red_vars[-1]
    blocks = _Blocks(scope.var_names[last], last.args[1], _lanes([at], last.args[1]))
    elements = []
    for n, s in group:
        element = s.body.args[0] if at == "float" and s.red.acc_dtype != torch.float32 else s.body
        elements.append(kir.substitute(element, dict(zip(s.red_vars, red_vars))) if s is not first else element)
        lines.append(f"{indent}{at} acc{n}[{blocks.lanes}];")
        lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) acc{n}[l] = {INIT[s.red.kind](at)};")
    ind = indent
    for v in red_vars[:-1]:
        lines.append(_loop(scope.var_names[v], v.args[1], ind))
        ind += "  "
    lines.extend(blocks.open(ind))
    ind += "  "
    masked = [n for n, s in group if blocks.masked and s.red.kind not in IDEMPOTENT]
    lines.extend(f"{ind}{at} v{n}[{blocks.lanes}];" for n in masked)
    lines.extend(blocks.lanes_loop(ind))
    body = scope.child(ind + "  ")
    for (n, s), element in zip(group, elements):
        value = body.emit(element)
        if n in masked:
            lines.append(f"{ind}  v{n}[l] = {value};")
        else:
            lines.append(f"{ind}  " + COMBINE[s.red.kind].format(acc=f"acc{n}[l]", v=value))
    lines.append(f"{ind}}}")
    for n, s in group:
        if n in masked:  # the lanes the block takes, as in _render_stage
            combine = COMBINE[s.red.kind].format(acc=f"acc{n}[l]", v=f"({blocks.new()} ? v{n}[l] : "
                                                                      f"{INIT[s.red.kind](at)})")
            lines.extend([f"{ind}#pragma omp simd", f"{ind}for (int64_t l = 0; l < {blocks.lanes}; ++l) {combine}"])
    while ind != indent:
        ind = ind[:-2]
        lines.append(ind + "}")
    for n, s in group:
        lines.append(f"{indent}for (int64_t w = {blocks.lanes // 2}; w > 0; w /= 2) {{")
        lines.append(f"{indent}  #pragma omp simd")
        lines.append(f"{indent}  for (int64_t l = 0; l < w; ++l) {{ "
                     f"{COMBINE[s.red.kind].format(acc=f'acc{n}[l]', v=f'acc{n}[l + w]')} }}")
        lines.append(f"{indent}}}")
        lines.append(f"{indent}const {ctype(s.red.dtype)} red{n} = {_reduced(s, f'acc{n}[0]')};")
        scope.names[s.ref] = f"red{n}"


def _kept_arrays(n: int, s: Stage) -> List[tuple]:
    """(array name, size, value in the stage, value in the stores) of each value stage ``n`` keeps for the stores
    (Note [Stage values kept for the stores] in schedule/)."""
    size = 1
    for v in s.red_vars:
        size *= v.args[1]
    return [(f"keep{n}_{j}", size, e, m) for j, (e, m) in enumerate(s.keep)]


def _render_stores(k: Kernel, scope: _Scope, tile: Optional[_Blocks], arrays: Dict[Expr, str]) -> None:
    """The kernel's stores at ``scope``'s indent (inside its inner loops); in a tiled kernel, in a loop over the
    block's lanes, of the lanes the block takes (Note [Reductions in lanes])."""
    lines, indent = scope.lines, scope.indent
    scope_indent = indent
    values: List[str] = []
    if tile is not None:
        if tile.masked:  # the values of every lane first (but a stage's own), then the stores of the lanes it takes
            values = [f"{arrays[e]}[l]" if e in arrays else f"o{j}[l]" for j, (_, _, e) in enumerate(k.stores)]
            computed = [(j, e) for j, (_, _, e) in enumerate(k.stores) if e not in arrays]
            lines.extend(f"{indent}{ctype(e.dtype)} o{j}[{tile.lanes}];" for j, e in computed)
            if computed:
                lines.extend(tile.lanes_loop(indent))
                inner = scope.child(indent + "  ")
                inner.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
                lines.extend(f"{indent}  o{j}[l] = {inner.emit(e)};" for j, e in computed)
                lines.append(f"{indent}}}")
        lines.extend(tile.lanes_loop(indent))
        indent += "  "
        if tile.masked:
            lines.append(f"{indent}if ({tile.new()}) {{")
            indent += "  "
    scope = scope.child(indent)
    scope.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
    for n, s in enumerate(k.stages):
        kept = _kept_arrays(n, s)
        at_index = scope.emit(s.keep_index[1]) if kept else ""
        scope.names.update((m, f"{array}[{at_index}]") for array, _, _, m in kept)
    for j, (buf, idx, e) in enumerate(k.stores):
        val = values[j] if values else scope.emit(e)
        val = _STORE[buf.dtype].format(val) if buf.dtype in _STORE else val
        lines.append(f"{indent}b{buf.id}[{scope.emit(idx)}] = {val};")
    while indent != scope_indent:
        indent = indent[:-2]
        lines.append(indent + "}")


# Note [Interleaved copies]
# A long pointwise chain (the 200-op benchmark: 40 sines between multiplies, adds and relus) is one dependency chain
# per element: a vectorized iteration waits on the latency of every op in turn, and its thousands of instructions
# leave the out-of-order window no room to start the next iteration early. So the innermost loop of a kernel whose
# store values have a long critical path (LATENCY_MIN, in recompute_cost-like units: an expensive op 24, others 1)
# computes INTERLEAVE independent copies per iteration, at i, i + H, ..., i + (K - 1) H (H = extent / K; the last
# extent % K indices in a remainder loop), their statements interleaved in the source: each op of every copy is
# issued before the next op of the first, so the copies' latencies overlap (also across the calls of the vector
# math: each copy's call is independent of the other's). Every copy is its own contiguous vectorized stream, so this
# does not depend on the vector width. Each element is computed by the same expression as before: results are
# bit-identical. Measured on the 200-op chain at 1024^2, 1 thread (benchmarks/pointwise_chain.py): see the README
# of benchmarks. A short innermost loop (below INTERLEAVE_MIN_EXTENT: each copy needs a few vectors) is not split:
# an enclosing inner loop that K divides is instead (copies at rows i, i + H, ... of a 16 x 16 chain), inside which
# the innermost loop runs whole for each copy. Not for kernels with stages (their inner loops read stage values) or
# tiles, nor for short chains (below LATENCY_MIN: memory-bound, nothing to hide; measured: gelu alone, ~30, ran
# 5-8 % slower interleaved, exp(sin(x)), 49, 5-35 % faster).
INTERLEAVE = 4
LATENCY_MIN = 48
INTERLEAVE_MIN_EXTENT = 256


def _latency(roots: List[Expr]) -> int:
    """The critical path of ``roots``: an expensive op counts EXPENSIVE_COST, any other op 1, leaves 0."""
    depth: Dict[Expr, int] = {}
    for root in roots:
        for e in kir.walk(root):
            if e in depth:
                continue
            own = EXPENSIVE_COST if e.op in EXPENSIVE_OPS else (0 if e.op in ("const", "var", "scalar") else 1)
            depth[e] = own + max((depth[a] for a in kir.children(e)), default=0)
    return max((depth[r] for r in roots), default=0)


def _interleave(k: Kernel) -> Optional[Expr]:
    """The loop of ``k`` whose iterations run as INTERLEAVE interleaved copies (Note [Interleaved copies]), or None:
    the innermost loop if long enough, else an enclosing inner loop whose extent INTERLEAVE divides (a 16 x 16 chain
    interleaves 4 rows)."""
    if k.stages or k.tile is not None or not k.inner or _latency([e for _, _, e in k.stores]) < LATENCY_MIN:
        return None
    if k.inner[-1].args[1] >= INTERLEAVE_MIN_EXTENT:
        return k.inner[-1]
    return next((v for v in k.inner[:-1] if v.args[1] % INTERLEAVE == 0), None)


def _render_copies(k: Kernel, scope: _Scope, v: Expr, step: int) -> None:
    """``k``'s stores at ``scope``'s indent, INTERLEAVE copies at ``v`` + c ``step``, statements interleaved."""
    name = scope.var_names[v]
    scope.lines.append(scope.indent + " ".join(f"const int64_t {name}_{c} = {name} + {c * step};"
                                               for c in range(INTERLEAVE)))
    bodies = []
    for c in range(INTERLEAVE):
        body = _Scope(scope.names, [], scope.indent, scope.counter, {**scope.var_names, v: f"{name}_{c}"})
        _render_stores(k, body, None, {})
        bodies.append(body.lines)
    assert len({len(b) for b in bodies}) == 1, "interleaved copies must render alike"
    scope.lines.extend(line for group in zip(*bodies) for line in group)


def render_kernel(k: Kernel) -> str:
    lines: List[str] = [f"static void lz_{k.name}(void** P, const double* F, const int64_t* I) {{"]
    for b in k.buffers():
        t = storage_ctype(b.dtype)
        lines.append(f"  {t}* __restrict b{b.id} = ({t}*)P[{b.id}];")
    lines.append("  (void)F; (void)I;")
    var_names: Dict[Expr, str] = {}
    loops = k.outer + k.inner
    for i, v in enumerate(loops):
        var_names[v] = f"i{i}"
    for s in k.stages:
        for j, v in enumerate(s.red_vars):
            var_names.setdefault(v, f"r{len(var_names)}_{j}")
    tile = None  # the blocks of the tiled loop (Note [Column reductions are tiled] in schedule/)
    if k.tile is not None:
        types = [ctype(d) for s in k.stages for d in (s.red.acc_dtype, s.red.dtype)]
        tile = _Blocks(var_names[k.tile], k.tile.args[1], _lanes(types, k.tile.args[1]))
    counter = [0]
    indent = "  "
    scope = _Scope({}, lines, indent, counter, var_names)
    depth = 0
    for i, v in enumerate(k.outer):
        if i == 0 and k.parallel:
            lines.append(f"{indent}#pragma omp parallel for schedule(static)")
        lines.extend(tile.open(indent) if v is k.tile else [_loop(var_names[v], v.args[1], indent)])
        indent += "  "
        depth += 1
    scope = scope.child(indent)
    arrays: Dict[Expr, str] = {}
    for group in _sibling_stages(k, tile):
        if len(group) == 1:
            _render_stage(group[0], k.stages[group[0]], scope, tile, arrays)
        else:
            _render_siblings([(n, k.stages[n]) for n in group], scope)
    split = _interleave(k)  # Note [Interleaved copies]
    step = split.args[1] // INTERLEAVE if split is not None else 0
    for i, v in enumerate(k.inner):
        last = i == len(k.inner) - 1
        if i == 0 and not k.outer and k.parallel:
            lines.append(f"{indent}#pragma omp parallel for schedule(static)")
        elif last and tile is None:
            lines.append(f"{indent}#pragma GCC ivdep")
        lines.append(_loop(var_names[v], step if v is split else v.args[1], indent))
        indent += "  "
        depth += 1
    if split is None:
        _render_stores(k, scope.child(indent), tile, arrays)
    else:
        _render_copies(k, scope.child(indent), split, step)
        rest = split.args[1] % INTERLEAVE
        if rest:  # the innermost loop's last indices, one copy each
            name, outer = var_names[split], indent[:-2]
            lines.append(outer + "}")
            lines.append(f"{outer}for (int64_t {name} = {split.args[1] - rest}; {name} < {split.args[1]}; ++{name}) {{")
            _render_stores(k, scope.child(indent), None, {})
    for _ in range(depth):
        indent = indent[:-2]
        lines.append(indent + "}")
    lines.append("}")
    return "\n".join(lines)


def render(sched: Schedule, kernel_entries: bool = False) -> tuple:
    """(source, segments): segments are lists of kernels, one ``lz_seg<i>`` entry point each, in step order.
    ``kernel_entries`` adds one ``lz_kernel_<name>`` entry point per kernel (for timing kernels one by one)."""
    parts = [PRELUDE]
    segments: List[List[Kernel]] = []
    current: List[Kernel] = []
    for step in sched.steps:
        if isinstance(step, Kernel):
            parts.append(render_kernel(step))
            current.append(step)
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    for i, seg in enumerate(segments):
        calls = "\n".join(f"  lz_{k.name}(P, F, I);" for k in seg)
        parts.append(f'extern "C" int lz_seg{i}(void** P, const double* F, const int64_t* I) {{\n{calls}\n'
                     f"  int e = lz_err; lz_err = 0; return e;\n}}")
    for k in (sched.kernels if kernel_entries else ()):
        parts.append(f'extern "C" int lz_kernel_{k.name}(void** P, const double* F, const int64_t* I) {{\n'
                     f"  lz_{k.name}(P, F, I);\n  int e = lz_err; lz_err = 0; return e;\n}}")
    parts.append(cpp_math.definitions("\n".join(parts[1:])))  # the sin/cos its kernels call, if any
    return "\n\n".join(parts) + "\n", segments
