"""Lowering table, pointwise part: ATen/prims op -> expression builder (Note [Lowered values are loaders]).

Each entry takes the op's filled arguments (``TVal`` for tensors, ``ScalarArg`` for runtime numbers, Python
values for static ones), its keyword arguments and the node's ``(shape, dtype)``, and returns a ``TVal``.
Arithmetic is done in the node's result dtype (eager's type promotion, recorded in the IR); comparisons in the
promoted dtype of their operands. Expression op names are the renderer's table keys (codegen/).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict

import torch

from . import kir
from .values import ScalarArg, TVal, Unlowerable, pointwise, promote

LOWERINGS: Dict[str, Callable[..., TVal]] = {}


def register(*names: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        for name in names:
            LOWERINGS[name] = fn
        return fn
    return deco


def _any(dtype: torch.dtype) -> bool:
    return True


def _floating(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def _integral(dtype: torch.dtype) -> bool:
    """Integers and bool: eager's bitwise kernels have no floating-point version."""
    return not dtype.is_floating_point


def _integer(dtype: torch.dtype) -> bool:
    """Integers only: eager's shift kernels have no bool (nor floating-point) version."""
    return not dtype.is_floating_point and dtype is not torch.bool


def _unary(expr_op: str, float_only: bool = False, accepts: Callable[[torch.dtype], bool] = _any
           ) -> Callable[..., TVal]:
    accepts = _floating if float_only else accepts

    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if not accepts(out):
            # NOTE: eager raises "not implemented for <dtype>" here: the extern call raises the same
            raise Unlowerable(f"{expr_op} on {out}")
        if len(args) > 1 or kwargs:
            # NOTE: an overload with more arguments (round.decimals) means something else: never drop them.
            raise Unlowerable(f"{expr_op} with extra arguments {args[1:]} {kwargs}")
        return pointwise(lambda a: kir.op(expr_op, out, a), out, out, args[0])
    return lower


def _integral_valued(expr_op: str) -> Callable[..., TVal]:
    """floor, ceil, trunc, round: on integers eager returns a copy (bool raises: "not implemented for 'Bool'")."""
    on_float = _unary(expr_op, float_only=True)

    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if out.is_floating_point:
            return on_float(args, kwargs, meta)
        if not _integer(out) or len(args) > 1 or kwargs.get("decimals", 0) != 0:
            raise Unlowerable(f"{expr_op} on {out} with {args[1:]} {kwargs}")  # round(decimals=) raises on ints
        return pointwise(lambda a: a, out, out, args[0])
    return lower


for _name in ("exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "sin", "cos", "erf", "log1p", "expm1", "log2",
              "exp2", "reciprocal", "atan", "asin", "acos", "sinh", "cosh", "tan", "erfc", "log10", "acosh", "asinh",
              "atanh", "lgamma", "erfinv", "digamma"):
    register(f"aten.{_name}", f"prims.{_name}")(_unary(_name, float_only=True))
for _name in ("floor", "ceil", "trunc", "round"):
    register(f"aten.{_name}", f"prims.{_name}")(_integral_valued(_name))
for _name in ("neg", "abs", "relu", "sign"):
    register(f"aten.{_name}", f"prims.{_name}")(_unary(_name))


@register("aten.round")
def _round(args: list, kwargs: dict, meta: tuple) -> TVal:
    """round, and round.decimals as eager computes it: nearbyint(x * 10^d) / 10^d (d < 0: x / 10^-d, then *)."""
    decimals = kwargs.get("decimals", 0)
    out = meta[1]
    if not out.is_floating_point:
        return _integral_valued("round")(args, kwargs, meta)
    if len(args) > 1 or type(decimals) is not int:
        raise Unlowerable(f"round on {out} with decimals={decimals!r}")
    if decimals == 0:
        return pointwise(lambda a: kir.op("round", out, a), out, out, args[0])
    ten = kir.const(float(10 ** abs(decimals)), out)
    if decimals > 0:
        return pointwise(lambda a: kir.op("truediv", out, kir.op("round", out, kir.op("mul", out, a, ten)), ten),
                         out, out, args[0])
    return pointwise(lambda a: kir.op("mul", out, kir.op("round", out, kir.op("truediv", out, a, ten)), ten),
                     out, out, args[0])


def _bool_kernel(*xs: Any) -> bool:
    """Whether eager's kernel for ``xs`` might run in bool (the operands' promoted dtype, not the result's): pow of
    bools and shifts of bools raise there. An integer runtime scalar may be a bool (the recorder keeps its kind as
    int), so bool tensors with one count as bool too."""
    tensors = [x for x in xs if isinstance(x, TVal)]
    return all(x.dtype is torch.bool for x in tensors) and \
        (promote(*xs) is torch.bool or any(isinstance(x, ScalarArg) and x.kind is int for x in xs))


def _binary(expr_op: str, accepts: Callable[[torch.dtype], bool] = _any) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if not accepts(out) or (accepts is _integer and _bool_kernel(*args[:2])):
            raise Unlowerable(f"{expr_op} on {out}")
        return pointwise(lambda a, b: kir.op(expr_op, out, a, b), out, out, args[0], args[1])
    return lower


register("aten.mul", "prims.mul")(_binary("mul"))
register("aten.maximum", "prims.maximum")(_binary("maximum"))
register("aten.minimum", "prims.minimum")(_binary("minimum"))
register("aten.fmax", "prims.fmax")(_binary("fmax"))  # NaN-ignoring, unlike maximum
register("aten.fmin", "prims.fmin")(_binary("fmin"))
register("aten.fmod", "prims.fmod")(_binary("fmod"))
register("aten.remainder", "prims.remainder")(_binary("remainder"))
register("aten.atan2", "prims.atan2")(_binary("atan2"))
register("aten.floor_divide")(_binary("floordiv"))
# Bitwise ops compute in the result dtype (both operands cast to it, as TensorIterator does); on bool they are
# logical. The dunder overloads (x << 2 records aten.__lshift__.Scalar) run the same kernels in eager.
register("aten.bitwise_and", "aten.__and__", "prims.bitwise_and")(_binary("bitwise_and", _integral))
register("aten.bitwise_or", "aten.__or__", "prims.bitwise_or")(_binary("bitwise_or", _integral))
register("aten.bitwise_xor", "aten.__xor__", "prims.bitwise_xor")(_binary("bitwise_xor", _integral))
register("aten.bitwise_not", "prims.bitwise_not")(_unary("bitwise_not", accepts=_integral))
register("aten.gcd")(_binary("gcd", _integer))
register("aten.lcm")(_binary("lcm", _integer))
register("aten.copysign", "prims.copysign")(_binary("copysign", _floating))
register("aten.hypot", "prims.hypot")(_binary("hypot", _floating))
# Note [Shifts]: eager's lshift of an amount < 0 or >= the bit width is 0; rshift by such an amount (or by the
# width - 1 for signed types) fills with the sign bit: codegen's lz_shl / lz_shr, from ATen's BinaryOpsKernel.cpp
register("aten.bitwise_left_shift", "aten.__lshift__", "prims.shift_left")(_binary("lshift", _integer))
register("aten.bitwise_right_shift", "aten.__rshift__", "prims.shift_right_arithmetic")(_binary("rshift", _integer))


def _add_sub(which: str, reverse: bool = False) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if reverse:
            a, b = b, a
        if alpha is None or (type(alpha) in (int, float) and alpha == 1):
            return pointwise(lambda x, y: kir.op(which, out, x, y), out, out, a, b)
        return pointwise(lambda x, y, k: kir.op(which, out, x, kir.op("mul", out, k, y)), out, out, a, b, alpha)
    return lower


LOWERINGS["aten.add"] = LOWERINGS["prims.add"] = _add_sub("add")
LOWERINGS["aten.sub"] = LOWERINGS["prims.sub"] = _add_sub("sub")
LOWERINGS["aten.rsub"] = _add_sub("sub", reverse=True)


@register("aten.div", "aten.true_divide")
def _div(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    name = {None: "truediv", "trunc": "truncdiv", "floor": "floordiv"}[mode]
    return pointwise(lambda a, b: kir.op(name, out, a, b), out, out, args[0], args[1])


@register("prims.div")
def _prims_div(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    name = "truediv" if out.is_floating_point else "truncdiv"
    return pointwise(lambda a, b: kir.op(name, out, a, b), out, out, args[0], args[1])


@register("aten.pow", "prims.pow")
def _pow(args: list, kwargs: dict, meta: tuple) -> TVal:
    """pow; on integers eager's powi (codegen's lz_ipow): repeated squaring that wraps, and a negative exponent
    gives 1 for base 1, +-1 for base -1 and 0 otherwise."""
    out = meta[1]
    base, exponent = args[0], args[1]
    if _bool_kernel(base, exponent):
        raise Unlowerable("pow of bools")  # eager: "pow" not implemented for 'Bool'
    if not out.is_floating_point and not isinstance(exponent, TVal) and isinstance(base, TVal):
        # NOTE: pow.Tensor_Scalar on integers raises for a negative exponent or one out of the dtype's range (the
        # scalar is converted with a check). A runtime scalar's value is unknown here, and a kernel has no error
        # for it: only a constant exponent that passes both checks is lowered.
        info = torch.iinfo(out)
        if type(exponent) is bool:
            exponent = int(exponent)
        if type(exponent) is not int or exponent < 0 or exponent > info.max:
            raise Unlowerable(f"integer pow with exponent {exponent!r} ({out})")
    return pointwise(lambda a, b: kir.op("pow", out, a, b), out, out, base, exponent)


def _compare(expr_op: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        compute = promote(args[0], args[1])
        return pointwise(lambda a, b: kir.op(expr_op, torch.bool, a, b), torch.bool, compute, args[0], args[1])
    return lower


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(f"aten.{_name}", f"prims.{_name}")(_compare(_name))


def _logical(expr_op: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        return pointwise(lambda *xs: kir.op(expr_op, torch.bool, *xs), meta[1], torch.bool, *args[:2])
    return lower


register("aten.logical_and")(_logical("and"))
register("aten.logical_or")(_logical("or"))
register("aten.logical_xor")(_logical("ne"))
register("aten.logical_not")(_logical("not"))


@register("aten.isnan")
def _isnan(args: list, kwargs: dict, meta: tuple) -> TVal:
    return pointwise(lambda a: kir.op("ne", torch.bool, a, a), torch.bool, None, args[0])


def _float_class(expr_op: str, on_integers: Callable[[kir.Expr], kir.Expr]) -> Callable[..., TVal]:
    """A test of a float's class or sign bit (read from the input's own dtype: the sign of -0.0 and of a NaN
    counts); integers and bool are finite, and negative only if signed and < 0."""
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        x = args[0]
        if not isinstance(x, TVal) or len(args) > 1 or kwargs:
            raise Unlowerable(f"{expr_op} of {x!r}")
        if x.dtype.is_floating_point:
            return pointwise(lambda a: kir.op(expr_op, torch.bool, a), torch.bool, None, x)
        return pointwise(on_integers, torch.bool, None, x)
    return lower


register("aten.isinf")(_float_class("isinf", lambda a: kir.const(False, torch.bool)))
register("aten.isposinf")(_float_class("isposinf", lambda a: kir.const(False, torch.bool)))
register("aten.isneginf")(_float_class("isneginf", lambda a: kir.const(False, torch.bool)))
register("aten.isfinite")(_float_class("isfinite", lambda a: kir.const(True, torch.bool)))
register("aten.signbit", "prims.signbit")(_float_class("signbit", lambda a: kir.op(
    "lt", torch.bool, a, kir.const(0, a.dtype))))


@register("aten.where", "prims.where")
def _where(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    return pointwise(lambda c, a, b: kir.op("where", out, kir.cast(c, torch.bool), kir.cast(a, out), kir.cast(b, out)),
                     out, None, *args[:3])


@register("aten.masked_fill")
def _masked_fill(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    return pointwise(lambda x, m, v: kir.op("where", out, kir.cast(m, torch.bool), kir.cast(v, out), kir.cast(x, out)),
                     out, None, args[0], args[1], args[2])


def _nan_bound_wins() -> bool:
    """Whether eager's aten.clamp with a NaN *number* bound returns NaN: torch 2.13 does, torch 2.11 returns the
    input unchanged (clamp_min/clamp_max and tensor bounds propagate NaN on both)."""
    x = torch.ones(17)
    return bool(torch.clamp(x, min=float("nan")).isnan().all() and torch.clamp(x, max=float("nan")).isnan().all())


_SCALAR_NAN_BOUND_WINS = _nan_bound_wins()


def _clamp_of(kind: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if kind == "clamp":
            lo = kwargs.get("min", args[1] if len(args) > 1 else None)
            hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        elif kind == "hardtanh":
            lo = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
            hi = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
        else:
            lo, hi = (args[1], None) if kind == "clamp_min" else (None, args[1])
        xs = [args[0]] + [b for b in (lo, hi) if b is not None]
        # NOTE: whether a NaN number bound of aten.clamp wins follows the running torch (_SCALAR_NAN_BOUND_WINS)
        nan_number_loses = kind == "clamp" and not _SCALAR_NAN_BOUND_WINS

        def fn(x: kir.Expr, *bs: kir.Expr) -> kir.Expr:
            it = iter(bs)
            for bound, op in ((lo, "clamp_min"), (hi, "clamp_max")):
                if bound is not None:
                    b = next(it)
                    clamped = kir.op(op, out, x, b)
                    if nan_number_loses and not isinstance(bound, TVal):
                        clamped = kir.op("where", out, kir.op("ne", torch.bool, b, b), x, clamped)
                    x = clamped
            return x
        return pointwise(fn, out, out, *xs)
    return lower


for _kind in ("clamp", "clamp_min", "clamp_max", "hardtanh"):
    LOWERINGS[f"aten.{_kind}"] = _clamp_of(_kind)


@register("aten.gelu")
def _gelu(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    name = "gelu_tanh" if approx == "tanh" else "gelu"
    if not out.is_floating_point:
        raise Unlowerable("gelu on integers")
    return pointwise(lambda a: kir.op(name, out, a), out, out, args[0])


@register("aten.polygamma")
def _polygamma(args: list, kwargs: dict, meta: tuple) -> TVal:
    """polygamma(0, x) is digamma; higher orders stay extern calls."""
    out = meta[1]
    if args[0] != 0 or not out.is_floating_point or type(args[0]) is not int:
        raise Unlowerable(f"polygamma of order {args[0]!r} on {out}")
    return pointwise(lambda a: kir.op("digamma", out, a), out, out, args[1])


@register("aten.softshrink")
def _softshrink(args: list, kwargs: dict, meta: tuple) -> TVal:
    """x - l above l, x + l below -l, else x * 0 as eager's scalar loop (NaN stays NaN, -0.0 and -0.3 give -0.0;
    eager's vectorized loop computes x - clamp(x, -l, l), +0.0 there: a sign of zero assert_close ignores)."""
    out = meta[1]
    lambd = args[1] if len(args) > 1 else kwargs.get("lambd", 0.5)
    if not out.is_floating_point:
        raise Unlowerable(f"softshrink on {out}")

    def fn(x: kir.Expr, lam: kir.Expr) -> kir.Expr:
        low = kir.op("neg", out, lam)
        inner = kir.op("where", out, kir.op("lt", torch.bool, x, low), kir.op("add", out, x, lam),
                       kir.op("mul", out, x, kir.const(0, out)))
        return kir.op("where", out, kir.op("gt", torch.bool, x, lam), kir.op("sub", out, x, lam), inner)
    return pointwise(fn, out, out, args[0], lambd)


def _elu_of(celu: bool) -> Callable[..., TVal]:
    """eager's kernel: x * scale above 0, else expm1(x * input_scale) * (alpha * scale), the coefficients converted
    to the compute type first; celu(x, alpha) is elu(x, alpha, 1, 1 / alpha), 1 / alpha in double. A direct
    lowering: the decompositions multiply or divide runtime scalars, which a traced decomposition cannot keep as
    runtime inputs (Note [Decompositions keep runtime scalars])."""
    names = ("alpha",) if celu else ("alpha", "scale", "input_scale")

    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if not out.is_floating_point:
            raise Unlowerable(f"elu on {out}")
        coefs = [args[i + 1] if len(args) > i + 1 else kwargs.get(name, 1.0) for i, name in enumerate(names)]

        def fn(x: kir.Expr, alpha: kir.Expr, *rest: kir.Expr) -> kir.Expr:
            if celu:
                one = kir.const(1.0, torch.float64)
                scale, input_scale = one, kir.op("truediv", torch.float64, one, kir.cast(alpha, torch.float64))
            else:
                scale, input_scale = rest
            x, alpha, scale, input_scale = (kir.cast(e, out) for e in (x, alpha, scale, input_scale))
            negative = kir.op("mul", out, kir.op("expm1", out, kir.op("mul", out, x, input_scale)),
                              kir.op("mul", out, alpha, scale))
            return kir.op("where", out, kir.op("gt", torch.bool, x, kir.const(0, out)), kir.op("mul", out, x, scale),
                          negative)
        return pointwise(fn, out, None, args[0], *coefs)
    return lower


LOWERINGS["aten.elu"] = _elu_of(celu=False)
LOWERINGS["aten.celu"] = _elu_of(celu=True)


@register("aten.angle")
def _angle(args: list, kwargs: dict, meta: tuple) -> TVal:
    """The angle of a real number: pi below 0 (-inf too), 0 at or above (-0.0 too), NaN stays NaN."""
    out = meta[1]
    if not out.is_floating_point:
        raise Unlowerable(f"angle on {out}")
    pi = kir.const(math.pi, out)

    def fn(x: kir.Expr) -> kir.Expr:
        zero = kir.const(0, out)
        return kir.op("where", out, kir.op("ne", torch.bool, x, x), x,
                      kir.op("where", out, kir.op("lt", torch.bool, x, zero), pi, zero))
    return pointwise(fn, out, out, args[0])


def _xlog_of(log_op: str) -> Callable[..., TVal]:
    """x * log(y) (xlogy) or x * log1p(y) (xlog1py): 0 where x == 0 unless y is NaN (eager's order of the tests)."""
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if not out.is_floating_point:
            raise Unlowerable(f"{log_op} product on {out}")

        def fn(x: kir.Expr, y: kir.Expr) -> kir.Expr:
            product = kir.op("where", out, kir.op("eq", torch.bool, x, kir.const(0, out)), kir.const(0, out),
                             kir.op("mul", out, x, kir.op(log_op, out, y)))
            return kir.op("where", out, kir.op("ne", torch.bool, y, y), y, product)
        return pointwise(fn, out, out, args[0], args[1])
    return lower


register("aten.xlogy", "aten.special_xlogy")(_xlog_of("log"))
register("aten.special_xlog1py")(_xlog_of("log1p"))


@register("aten.silu")
def _silu(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    return pointwise(lambda a: kir.op("mul", out, a, kir.op("sigmoid", out, a)), out, out, args[0])


@register("aten.square")
def _square(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    return pointwise(lambda a: kir.op("mul", out, a, a), out, out, args[0])


@register("aten.lerp")
def _lerp(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    return pointwise(lambda a, b, w: kir.op("lerp", out, a, b, w), out, out, *args[:3])


def _addc_of(which: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        out = meta[1]
        if which == "truediv" and not out.is_floating_point:
            raise Unlowerable("integer addcdiv")
        value = kwargs.get("value", args[3] if len(args) > 3 else 1)
        return pointwise(lambda s, a, b, v: kir.op("add", out, s, kir.op("mul", out, v, kir.op(which, out, a, b))),
                         out, out, args[0], args[1], args[2], value)
    return lower


LOWERINGS["aten.addcmul"] = _addc_of("mul")
LOWERINGS["aten.addcdiv"] = _addc_of("truediv")


# ---- casts, copies and constants -------------------------------------------------------------------------------

@register("aten._to_copy", "prims.convert_element_type", "aten.clone", "aten.alias", "aten.lift_fresh_copy",
          "aten.detach", "aten.contiguous", "aten.to", "aten._conj", "aten.positive", "aten.conj_physical")
def _copy(args: list, kwargs: dict, meta: tuple) -> TVal:
    x = args[0]
    if not isinstance(x, TVal):
        raise Unlowerable("copy of a non-tensor")
    out = meta[1]
    return pointwise(lambda a: a, out, out, x)


@register("aten.copy")
def _copy_into(args: list, kwargs: dict, meta: tuple) -> TVal:
    out = meta[1]
    dst, src = args[0], args[1]
    return pointwise(lambda d, s: s, out, out, dst, src)


def _full_value(shape: tuple, out: torch.dtype, value: Any) -> TVal:
    return pointwise(lambda v: v, out, out, value) if not shape else \
        TVal(shape, out, lambda idx, ld=pointwise(lambda v: v, out, out, value): ld(()))


def _full_of(which: str) -> Callable[..., TVal]:
    def lower(args: list, kwargs: dict, meta: tuple) -> TVal:
        shape, out = meta
        if which in ("full", "fill", "new_full"):
            value = args[1] if which != "new_full" else args[2]
        elif which == "full_like":
            value = args[1]
        elif which == "scalar_tensor":
            value = args[0]
        elif which in ("ones", "ones_like", "new_ones"):
            value = 1
        else:
            value = 0
        return _full_value(tuple(shape), out, value)
    return lower


# NOTE: _efficientzerotensor (autograd's zero gradients of a double backward) is ATen's ZeroTensor, which has no
# storage: as an extern its null pointer reached the kernels that read it; lowered, it is the constant 0
for _kind in ("full", "full_like", "fill", "scalar_tensor", "zeros", "ones", "zeros_like", "ones_like", "empty_like",
              "empty", "new_zeros", "new_ones", "new_full", "new_empty", "empty_strided", "new_empty_strided",
              "_efficientzerotensor"):
    LOWERINGS[f"aten.{_kind}"] = _full_of(_kind)
