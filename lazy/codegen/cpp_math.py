"""Vectorizable math for the generated C++: branch-free exp, expm1, log, log1p, tanh, sin, cos and erf.

Note [Vectorized math]
g++ does not vectorize calls to libm's ``sin``/``exp``/... (it would need glibc's vector ABI, enabled only under
-ffast-math, which would break eager's NaN/inf semantics), so a kernel that calls them runs one element at a time.
These are inline, branch-free implementations (range reduction + polynomial, in the style of fdlibm/Cephes/SLEEF)
that g++ -O3 vectorizes like any other arithmetic: no calls, no tables, no data-dependent branches (special cases
are selects), bit tricks through ``__builtin_memcpy`` and integer arithmetic on lanes as wide as the floating
ones (64-bit for double, 32-bit for float).

- float32 is evaluated in double with polynomials accurate to ~2^-32 and rounded once, so results are within
  ~0.5 ulp of the true value (eager's float kernels are within ~1 ulp: the two differ by at most ~2 ulp). Except
  exp and tanh, evaluated in float (16 lanes per AVX-512 op instead of 8) within 1 and 2 ulp: Notes [Float32 exp]
  and [Float32 tanh]; and sin and cos with |x| < 2^16 under AVX2 or AVX-512, within 0.79 ulp: Note [Float32 trig].
- float64 uses the same algorithms with longer polynomials (exp, expm1, log, log1p, tanh, erf: a few ulp);
  float64 sin/cos keep libm (their large-argument reduction needs a double-double Payne-Hanek, not done yet).
- Special values follow eager: NaN in -> NaN out; exp(+-inf) = inf/0, log(0) = -inf, log(<0) = NaN,
  tanh(+-inf) = +-1, sin(inf) = NaN, erf(+-inf) = +-1; odd functions keep the sign of zero; overflow gives inf and
  underflow gives (correctly rounded) subnormals or 0.
- sin/cos of float32 reduce any argument exactly (Payne-Hanek with four 28-bit chunks of 2/pi picked by the
  exponent: every partial product is exact in double and reduced mod 4 exactly, the rest is a TwoSum; the
  truncation error is < 2^-58 absolute, far below the closest approach of a float32 to a multiple of pi/2).
  With AVX-512 or AVX2, a vector takes that path only if some lane needs it, and evaluates |x| < 2^16 in float
  (Notes [Trig vector variant], [Float32 trig]).

Polynomials are Taylor series (exact coefficients 1/n!, 1/(2k+1)) except erf's, which are Chebyshev fits
(mpmath.chebyfit at 60 digits, relative error 4e-11 / 2.5e-10 for float32, 2.3e-16 / 4.4e-16 for float64), and
the fast sines' (SIN_HALF_PI, SIN_F32, COS_F32). tests/test_cpp_math.py checks every function against eager over dense sweeps and
special values.
"""
from __future__ import annotations

from fractions import Fraction
from math import factorial
from typing import List, Sequence

# fdlibm's ipio2: 2/pi in 24-bit chunks (2/pi = sum d[j] * 2^(-24 (j + 1))); tests/test_cpp_math.py checks them
TWO_OVER_PI_24 = (0xA2F983, 0x6E4E44, 0x1529FC, 0x2757D1, 0xF534DD, 0xC0DB62, 0x95993C, 0x439041, 0xFE5163)

ERF_SMALL_F = ("0x1.20dd7504045d6p+0", "-0x1.81274665754c3p-2", "0x1.ce2f08fec14fdp-4", "-0x1.b829c897922e5p-6",
               "0x1.562a60ddba6e6p-8", "-0x1.bccf664d7f763p-11", "0x1.d887505de3ba6p-14", "-0x1.445f47d33d87bp-17")
ERF_SMALL_D = ("0x1.20dd750429b6dp+0", "-0x1.812746b0379c1p-2", "0x1.ce2f21a040f66p-4", "-0x1.b82ce31203772p-6",
               "0x1.565bccfa44156p-8", "-0x1.c02db0665e53dp-11", "0x1.f9a2be4f731a1p-14", "-0x1.f4ca838adb73bp-17",
               "0x1.b981d78881a5dp-20", "-0x1.5c131500d3f88p-23", "0x1.d76af6ca49787p-27", "-0x1.ac9585a44fe29p-31")
# erfc(x) * exp(x^2) as a polynomial in u = 1/(1 + x/2) - center, for 1 <= x <= 4 (float32) / 6 (float64)
ERFC_F = ("0x1p-1", "0x1.058671b52c776p-2", "0x1.b57034ff400e1p-1", "0x1.eeea7dc4337cfp-1", "0x1.437eee7413278p-1",
          "0x1.e9479bcafa427p-5", "-0x1.ca5b13ceb5e5ap-3", "-0x1.bc6a67e8c91b7p-5", "0x1.ec952a8c770c0p-4",
          "0x1.a2657cdb0f518p-7")
ERFC_D = ("0x1.d555555555555p-2", "0x1.c57cd9cd3f3a9p-3", "0x1.8ddea0419f381p-1", "0x1.c6e106001c02ap-1",
          "0x1.3c74c4a51a176p-1", "0x1.aca523a392b38p-4", "-0x1.a59ad7554ad09p-3", "-0x1.6fbbf78c02688p-4",
          "0x1.dc03026c334c9p-4", "0x1.796df5f0d72d2p-5", "-0x1.841d1f2bf7c82p-4", "-0x1.f4d5da54e732cp-9",
          "0x1.4ef367c71707ep-4", "-0x1.496e2f90bb597p-5", "-0x1.b113c8b44d4ecp-5", "0x1.3a7fc98103617p-4",
          "-0x1.13c66c551fb2bp-9", "-0x1.4b4607134d36ap-4", "0x1.bbcb288472e4ap-5", "0x1.1ff3ece6f55cfp-5")


def _lit(c) -> str:
    return c if isinstance(c, str) else float(c).hex()


def horner(v: str, coeffs: Sequence, fma: str = "LZ_FMA") -> str:
    """``coeffs[0] + v * (coeffs[1] + v * (...))`` with fused multiply-adds (``LZ_FMAF`` for float)."""
    text = _lit(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        text = f"{fma}({v}, {text}, {_lit(c)})"
    return text


def _taylor(first: int, last: int, step: int = 1, sign: bool = False) -> List[float]:
    return [float(Fraction((-1) ** (i if sign else 0), factorial(n)))
            for i, n in enumerate(range(first, last + 1, step))]


_COMMON = r"""
#ifdef __FMA__
#define LZ_FMA(a, b, c) __builtin_fma((a), (b), (c))
#else
#define LZ_FMA(a, b, c) ((a) * (b) + (c))
#endif
#define LZ_INL static inline __attribute__((always_inline))
LZ_INL double lz_asd(int64_t i) { double d; __builtin_memcpy(&d, &i, 8); return d; }
LZ_INL int64_t lz_asi(double d) { int64_t i; __builtin_memcpy(&i, &d, 8); return i; }
// 2^k for an integral double k in [-1022, 1023]; the magic constant puts k in the low mantissa bits
LZ_INL double lz_pow2(double k) { return lz_asd((lz_asi(k + 0x1.8p52) + 1023) << 52); }
// x clamped to [lo, hi]; NaN becomes lo (callers select NaN back at the end)
LZ_INL double lz_clamp(double x, double lo, double hi) { x = x > lo ? x : lo; return x < hi ? x : hi; }
#ifdef __FMA__
#define LZ_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define LZ_FMAF(a, b, c) ((a) * (b) + (c))
#endif
LZ_INL float lz_asf(uint32_t i) { float f; __builtin_memcpy(&f, &i, 4); return f; }
LZ_INL uint32_t lz_asu(float f) { uint32_t i; __builtin_memcpy(&i, &f, 4); return i; }
"""

# Note [Float32 exp]
# exp is the one float32 function evaluated in float: softmax evaluates it twice per element, and in double it
# took 8 lanes per AVX-512 op where float takes 16 (softmax 1024^2 on 1 thread: 3.2 ms, 1.3 ms in float). The
# algorithm is SLEEF's expf_u10 (what ATen's Vectorized<float>::exp calls): x = q ln2 + s with q = rint(x / ln2)
# and ln2 in two floats, exp(s) = 1 + s + s^2 P(s) with SLEEF's degree-5 polynomial P over |s| <= ln2/2, then 2^q
# applied in two multiplies (2^(q>>1) 2^(q - (q>>1))) so that subnormal results round once and overflow gives inf.
# rint is the add and subtract of 1.5 * 2^23 (exact for |x / ln2| < 2^22, the values that matter; q's integer is
# then the low bits of that sum), which g++ vectorizes, where a float -> int conversion of a large value would be
# undefined. x < -104 gives 0 and x > 100 inf (where q and 2^q are garbage); NaN stays NaN.
# Checked over all 2^32 float32 values against exp in double rounded once: at most 1 ulp from the correctly rounded
# value (not correctly rounded for 17.2 M of the 520 M values whose result is neither 0, 1 nor inf: 3.3 %; the
# double evaluation before was within ~0.5 ulp); +-inf, 0 and NaN exactly where eager's are; the vector clone and
# the scalar entry point bit-identical (tests/test_cpp_math.py checks a dense sweep of each). Eager's torch.exp in
# these x86 wheels is MKL's vsExp, not SLEEF: nearly correctly rounded, 1 ulp from ours for 24 M values. Eager's
# sigmoid does call SLEEF's exp: lazy's sigmoid is bit-identical to it over the sweep of tests/test_cpp_math.py.
_EXP_F32 = r"""
LZ_INL float lz_exp_f32(float x) {{
  const float t = x * 0x1.715476p+0f + 0x1.8p23f;  // q = rint(x / ln2): an integer in the low bits of t
  const float q = t - 0x1.8p23f;
  const float s = LZ_FMAF(q, -0x1.7f7d1cp-20f, LZ_FMAF(q, -0x1.62e4p-1f, x));
  const float u = 1.0f + LZ_FMAF(s * s, {P}, s);
  const uint32_t qi = lz_asu(t) - 0x4B400000u, qh = (uint32_t)((int32_t)qi >> 1);
  const float y = u * lz_asf((qh + 127u) << 23) * lz_asf((qi - qh + 127u) << 23);
  return x > 100.0f ? __builtin_inff() : (x < -104.0f ? 0.0f : y);
}}
"""
# Note [Float32 tanh]
# tanh was evaluated in double (expm1 and a division at 8 lanes per AVX-512 op): GELU's tanh form, forward and
# backward, took 4 ns an element on one thread (a tiny GPT's MLP backward, 512 x 256: 0.5 ms a kernel, six of them
# a step). Here it is float, 16 lanes: tanh |x| = em / (em + 2) with em = expm1(2 |x|), where expm1(z) for z = q ln2
# + s is 2^q e + (2^q - 1), e = expm1(s) = s + s^2 P(s) with exp's polynomial (Note [Float32 exp]); 2^q - 1 is exact
# for the q that matter (|x| < 8.3: q <= 24) and 2 |x| is clamped at 18 (tanh(9) rounds to 1). The sign is copied
# back, so odd symmetry and -0 hold; NaN stays NaN. No cancellation: em, em + 2 and the quotient each round once,
# within 2 ulp of tanh (tests/test_cpp_math.py holds it to eager).
_TANH_F32 = r"""
LZ_INL float lz_tanh_f32(float x) {{
  const float a = __builtin_fabsf(x);
  const float z = 2.0f * (a < 9.0f ? a : 9.0f);
  const float t = z * 0x1.715476p+0f + 0x1.8p23f;  // q = rint(z / ln2), as in lz_exp_f32
  const float q = t - 0x1.8p23f;
  const float s = LZ_FMAF(q, -0x1.7f7d1cp-20f, LZ_FMAF(q, -0x1.62e4p-1f, z));
  const float e = LZ_FMAF(s * s, {P}, s);
  const float p2 = lz_asf((lz_asu(t) - 0x4B400000u + 127u) << 23);  // 2^q, 0 <= q <= 26
  const float em = LZ_FMAF(p2, e, p2 - 1.0f);
  const float y = __builtin_copysignf(em / (em + 2.0f), x);
  return a == 0.0f || x != x ? x : y;
}}
"""
# SLEEF's coefficients of P (sleefsimdsp.c, xexpf), as float32
EXP_F32_POLY = ("0x1p-1f", "0x1.555556p-3f", "0x1.5554f4p-5f", "0x1.11114cp-7f", "0x1.6d2d92p-10f",
                "0x1.a057b4p-13f")

_BY_PRECISION = r"""
LZ_INL double lz_exp_{S}(double x) {{
  const double xc = lz_clamp(x, -1100.0, 1100.0);
  const double k = __builtin_rint(xc * 0x1.71547652b82fep0);
  const double r = (xc - k * 0x1.62e42feep-1) - k * 0x1.a39ef35793c76p-33;  // k * ln2_hi is exact
  const double p = {EXP};
  const double k1 = __builtin_rint(k * 0.5);
  const double y = p * lz_pow2(k1) * lz_pow2(k - k1);  // two steps: overflow and subnormals round once
  return x != x ? x : y;
}}
LZ_INL double lz_expm1_core_{S}(double x) {{  // no special cases: callers select them
  const double xc = lz_clamp(x, -800.0, 800.0);
  const double k = __builtin_rint(xc * 0x1.71547652b82fep0);
  const double r = (xc - k * 0x1.62e42feep-1) - k * 0x1.a39ef35793c76p-33;
  const double em = LZ_FMA(r * r, {EXPM1}, r);  // expm1(r) = r + r^2 (1/2 + r/6 + ...)
  const double t = lz_pow2(k > -1000.0 ? (k < 1000.0 ? k : 1000.0) : -1000.0);
  const double small = LZ_FMA(t, em, t - 1.0);  // 2^k expm1(r) + (2^k - 1)
  const double k1 = __builtin_rint(k * 0.5);
  const double big = (em + 1.0) * lz_pow2(k1) * lz_pow2(k - k1) - 1.0;
  return k > 60.0 ? big : small;
}}
LZ_INL double lz_expm1_{S}(double x) {{
  const double y = lz_expm1_core_{S}(x);
  return x != x ? x : (x == 0.0 ? x : y);  // NaN, and the sign of zero
}}
LZ_INL double lz_log_{S}(double x) {{
  const bool sub = x < 0x1p-1022;
  const double xs = sub ? x * 0x1p54 : x;
  const int64_t bits = lz_asi(xs);
  const double e0 = lz_asd(0x4330000000000000LL | (int64_t)((uint64_t)bits >> 52)) - 0x1.00000000003ffp52;
  const double m0 = lz_asd((bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);  // [1, 2)
  const bool hi = m0 > 0x1.6a09e667f3bcdp0;
  const double m = hi ? m0 * 0.5 : m0;
  const double e = e0 + (hi ? 1.0 : 0.0) - (sub ? 54.0 : 0.0);
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double R = z * {LOG};
  const double hfsq = 0.5 * f * f;
  // fdlibm: log(1+f) = f - (hfsq - s (hfsq + R)), plus e ln2 in two parts
  const double y = e * 0x1.62e42feep-1 - ((hfsq - (s * (hfsq + R) + e * 0x1.a39ef35793c76p-33)) - f);
  double out = x == __builtin_inf() ? x : y;
  out = x == 0.0 ? -__builtin_inf() : out;
  out = x < 0.0 ? __builtin_nan("") : out;
  return x != x ? x : out;
}}
LZ_INL double lz_log1p_{S}(double x) {{
  const double u = 1.0 + x;
  const double y = lz_log_{S}(u) * (x / (u - 1.0));  // Goldberg: corrects the rounding of 1 + x
  const double out = u == 1.0 ? x : y;
  return x == __builtin_inf() ? x : out;
}}
LZ_INL double lz_tanh_{S}(double x) {{
  const double em = lz_expm1_core_{S}(2.0 * lz_clamp(x, -20.0, 20.0));  // tanh(20) rounds to 1
  const double y = em / (em + 2.0);
  return x != x ? x : (x == 0.0 ? x : y);
}}
LZ_INL double lz_erf_{S}(double x) {{
  const double ax = __builtin_fabs(x);
  const double small = ax * {ERF_SMALL};  // erf(x)/x as a polynomial in x^2 for |x| < 1
  const double xb = ax < {ERF_CLAMP} ? (ax > 1.0 ? ax : 1.0) : {ERF_CLAMP};
  const double u = 1.0 / LZ_FMA(xb, 0.5, 1.0) - {ERFC_CENTER};
  const double big = 1.0 - lz_exp_{S}(-(xb * xb)) * {ERFC};
  const double y = ax < 1.0 ? small : big;
  return x != x ? x : (x == 0.0 ? x : (x < 0.0 ? -y : y));
}}
"""

_TRIG_F = r"""
// sin/cos of a float32 value (given as double), accurate to ~2^-32: exact Payne-Hanek reduction, see the module doc
LZ_INL double lz_trig_f(double x, const int64_t cosine) {{
  const double ax = __builtin_fabs(x);
{WINDOWS}
  const double s0 = x * T0, s1 = x * T1, s2 = x * T2, s3 = x * T3;  // exact: 24 x 28 bits; |s2| < 1/4
  const double a = s0 - 4.0 * __builtin_rint(0.25 * s0);  // each exact, in [-2, 2]
  const double b = s1 - 4.0 * __builtin_rint(0.25 * s1);
  const double v = a + b, vb = v - a, e1 = (a - (v - vb)) + (b - vb);  // TwoSum
  const double q = __builtin_rint(v);
  const double f = (v - q) + (e1 + (s2 + s3));  // v - q is exact; |f| <= 3/4
  const double y = f * 0x1.921fb54442d18p0;
  const double z = y * y;
  const double sn = LZ_FMA(y * z, {SIN}, y);
  const double cs = LZ_FMA(z, {COS}, 1.0);
  const int64_t qi = lz_asi(q + 0x1.8p52) + cosine;
  const double r = (qi & 1) ? cs : sn;
  return (qi & 2) ? -r : r;
}}
"""

# sin(r) = r + r z P(z), z = r^2, for |r| <= pi/2 + 2^-16: mpmath.chebyfit at 50 digits, relative error 7.6e-16
# (6 coefficients, 3.1e-13, left ~80x more float32 results 1 ulp off the correctly rounded one, for 1.5% less time)
SIN_HALF_PI = ("-0x1.555555555554fp-3", "0x1.1111111110066p-7", "-0x1.a01a019e698bap-13", "0x1.71de394e5354fp-19",
               "-0x1.ae63bdf842d3fp-26", "0x1.60f6f063e618dp-33", "-0x1.a10941a631b6fp-41")
TRIG_FAST_BOUND = 2.0 ** 24  # |x| below it takes the fast path (Note [Trig vector variant])
_BOUND = TRIG_FAST_BOUND.hex() + "f"

_TRIG_FAST_F = r"""
// sin/cos of a float32 value with |x| < TRIG_FAST_BOUND (as double), one polynomial: x = (2m + cosine) pi/2 + r,
// |r| <= pi/2, so the result is (-1)^(m + cosine) sin(r). Written for latency (a kernel's chain of sines waits on
// each): pi/2 = P1 + P2 in doubles, x - 2m P1 is exact (multiples of 2^-52, < 2 where it is small), and so is the
// cosine's - P1 after it; the sign goes on r early, the polynomial is Estrin's scheme.
LZ_INL double lz_trig_fast_f(double x, const int64_t cosine) {{
  const double t = LZ_FMA(x, 0x1.45f306dc9c883p-2, -0.5 * (double)cosine) + 0x1.8p52;  // m = rint(x/pi - c/2) ...
  const double m = t - 0x1.8p52;  // ... in the low bits of t
  const double a = LZ_FMA(-m, 0x1.921fb54442d18p1, x);
  const double r = cosine ? (a - 0x1.921fb54442d18p0) - LZ_FMA(m, 0x1.1a62633145c07p-53, 0x1.1a62633145c07p-54)
                          : LZ_FMA(-m, 0x1.1a62633145c07p-53, a);
  const double rs = lz_asd(lz_asi(r) ^ (int64_t)((uint64_t)(lz_asi(t) + cosine) << 63));  // (-1)^(m + c) r
  const double z = r * r, z2 = z * z, rz = rs * z;
  const double lo = LZ_FMA(rz, LZ_FMA(z, {C1}, {C0}), rs);  // rs + rs z (c0 + c1 z + z2 (c2 + c3 z + z2 (...)))
  const double hi = LZ_FMA(z2, LZ_FMA(z2, {C6}, LZ_FMA(z, {C5}, {C4})), LZ_FMA(z, {C3}, {C2}));
  return LZ_FMA(rz * z2, hi, lo);
}}
"""

# sin(r) = r + r z S(z) and cos(r) = 1 - z/2 + z^2 C(z), z = r^2, for |r| <= 0.7875 (pi/4 and the slack of a
# rounded quotient): mpmath.chebyfit at 50 digits of (sin r - r) / r^3 and (cos r - 1 + z/2) / z^2, rounded to
# float32 (relative error of sin 1.8e-11, absolute of cos 7.8e-10, before rounding)
SIN_F32 = ("-0x1.555556p-3f", "0x1.11110ep-7f", "-0x1.a01396p-13f", "0x1.6db868p-19f")
COS_F32 = ("0x1.555554p-5f", "-0x1.6c12c8p-10f", "0x1.9bd2ccp-16f")
TRIG_F32_BOUND = 2.0 ** 16  # |x| below it takes the float path (Note [Float32 trig])
# pi/2 = P1 + D + D3 + O(2^-76): P1 the float32 below pi/2, D and D3 float32's rounding of what the earlier parts
# leave (tests/test_cpp_math.py checks them)
TRIG_F32_PI2 = ("0x1.921fb4p0f", "0x1.4442d2p-24f", "-0x1.ee59dap-50f")

# Note [Float32 trig]
# The vector variants (Note [Trig vector variant]) evaluate |x| < TRIG_F32_BOUND = 2^16 in float: a ymm holds 8
# floats but 4 doubles, so under AVX2 the double path (lz_trig_fast_f) takes two vectors of every op per call where
# this takes one (1 thread, independent values: 0.47 vs 1.20 ns per element under AVX2, 0.24 vs 0.62 with
# AVX-512), and the pointwise chain computes 40 sines an element (benchmarks/README.md). x = q pi/2 + r with
# q = rint(x 2/pi) (the add of 1.5 * 2^23, as in lz_exp_f32: the low bits of t are q's, the quadrant), |r| <= pi/4
# + 2^-9 (x * float(2/pi) is off by up to 2^-9 below 2^16); r is carried as s + rl:
# - a = x - q P1 is exact (one FMA; P1 is the float32 below pi/2): a multiple of 2^-24 (q != 0 means |x| > 0.78)
#   below 1;
# - q D = ph + pl exactly (the FMA gives the product's rounding error), and s + e = a - ph exactly by Fast2Sum: a is
#   a multiple of ulp(ph) (|ph| < 2^-8), which makes a - ph exact where |a| < |ph|, and Dekker's condition holds
#   elsewhere; e - pl is exact too (multiples of 2^-47 below 2^-24);
# - rl = e - pl - q D3, rounded once. Where r is small (where it matters: s is small, so is e) |rl| < |q| 2^-47, so
#   its rounding error and the rest of pi/2 (|q| 2^-76) stay below |q| 2^-70 <= 2^-54: 2^-26 of the smallest |r| of
#   any float32 below 2^20 (2^-27.8, at x = 0x1.f9cbe2p+7). TRIG_F32_BOUND is where this argument still leaves that
#   margin (measured: no result more than 1 ulp off below 2^22; the first at 0x1.25d7eep+22, where the rint is
#   no longer exact).
# Then sin r = s - (s z (-S(z)) + rl (z/2 - 1)) and cos r = u + ((1 - z/2 - u) - s rl + z^2 C(z)), z = s^2 and
# u = 1 - z/2 rounded (its rounding error exactly, by an FMA), each rounded once at the end; the low bit of the
# quadrant q + cosine picks one (a blend on the sign bit of n << 31), its second bit the sign. Signs of zero: P1
# below pi/2 makes D > 0, so for x = -0 (q = +0) ph = +0 and s = -0 - +0 = -0, the bracket is +0 and sin = -0 - +0
# = -0 with no select (with P1 above pi/2, ph would be -0 and s = -0 - -0 = +0).
# Checked exhaustively by a one-off program (all 2^32 inputs through the vector variant of both builds, AVX2 and
# AVX-512, and every 61st block of 4096 through the scalar entry point too, against libm's double sin/cos rounded
# once): none more than 1 ulp from the correctly rounded value, at most 0.79 ulp from libm's double; not correctly
# rounded for 4962502 sines and 4530984 cosines, nearly all below the bound (0.2 % of its 2.4 G inputs; the double
# paths: ~1 in 10^8); both builds and both entry points bit-identical; zeros keep their sign; inf and NaN give NaN.
_TRIG_F32 = r"""
LZ_INL float lz_trig_f32(float x, const uint32_t cosine) {{
  const float t = LZ_FMAF(x, 0x1.45f306p-1f, 0x1.8p23f);  // q = rint(x 2/pi): an integer in the low bits of t
  const float q = t - 0x1.8p23f;
  const float a = LZ_FMAF(-q, {P1}, x);  // exact
  const float ph = q * {D}, pl = LZ_FMAF(q, {D}, -ph);  // q D exactly
  const float s = a - ph, e = (a - s) - ph;  // Fast2Sum: s + e = a - ph exactly
  const float rl = LZ_FMAF(-q, {D3}, e - pl);  // r = s + rl
  const float z = s * s, z2 = z * z;
  const float sp = LZ_FMAF(z2, LZ_FMAF(z, {S3}, {S2}), LZ_FMAF(z, {S1}, {S0}));  // -S(z), Estrin: latency
  const float sn = s - LZ_FMAF(s * z, sp, LZ_FMAF(0.5f * z, rl, -rl));  // keeps -0: s - (+0)
  const float hs = -0.5f * s, u = LZ_FMAF(hs, s, 1.0f);
  const float cp = LZ_FMAF(z2, {C2}, LZ_FMAF(z, {C1}, {C0}));
  const float cs = u + LZ_FMAF(z2, cp, LZ_FMAF(-s, rl, LZ_FMAF(hs, s, 1.0f - u)));
  const uint32_t n = lz_asu(t) + cosine;  // the quadrant in the low bits
  const float y = (int32_t)(n << 31) < 0 ? cs : sn;  // NOTE: a blend on the sign bit, no compare
  return lz_asf(lz_asu(y) ^ (n >> 1 << 31));
}}
"""

# Note [Trig vector variant]
# An auto-vectorized body cannot branch per vector, so the branch-free float32 sin/cos (lz_trig_f) make every lane
# pay the exact reduction. Where g++ targets AVX-512 or AVX2, lz_sin/lz_cos(float) are instead declared (not
# defined) "declare simd simdlen(W)" (W = 16 floats in a zmm, 8 in a ymm) and their vector variant is written here,
# under its x86-64 vector-function-ABI name (_ZGVeN16v_<mangled name> for AVX-512, _ZGVdN8v_<...> for AVX2): all W
# lanes take the float path (lz_trig_f32, Note [Float32 trig]; NaN for inf and NaN); only when some lane has
# |x| >= TRIG_F32_BOUND (x^2 compared, one mask move) do those lanes take the double path (lz_trig_fast_f: pi/2 in
# two doubles, one polynomial), and the exact path runs only when some lane is finite with |x| >= TRIG_FAST_BOUND,
# for those lanes only. So a lane's result depends on its value only, and the scalar entry point (loop remainders)
# computes the same. Measured on 1 thread, ns per element of independent values, float / double / exact path:
# AVX2 0.47 / 1.20 / 4.07, AVX-512 0.24 / 0.62 / 1.89 (a vector with one lane on a slower path pays that path for
# the vector). Accuracy: within 1 ulp of the correctly rounded value for every float32 (checked exhaustively against
# libm's double sin/cos rounded once), not correctly rounded for 0.2 % of those below TRIG_F32_BOUND (Note [Float32
# trig]) and ~1 in 10^8 above it.
# How it is wired:
# - Under -mprefer-vector-width=512, g++ calls only the 'e' (AVX-512) clone of length 16; with AVX2 (256-bit
#   vectors, 8 floats) only the 'd' clone of length 8: tests/test_cpp_math.py checks the calls of a compiled loop
#   for both. (A simdlen that does not divide the loop's vectorization factor would find no usable clone.)
# - The declaration is ``const`` (no memory touched), else the vectorizer assumes the call clobbers memory.
# - A definition carrying the pragma would make g++ emit clones of its own under the same names, so the scalar is
#   lz_<name>_1, bound to the declared symbol by an assembler .set (hidden: nothing is exported).
# - g++ sees no call to these definitions (the calls go through the declared names), so they cannot be static and
#   would be compiled into every unit: definitions() appends them after the kernels, only where these call them.
#   The compile work of the pointwise chain's unit is unchanged (1.057 vs 1.059 G instructions in cc1plus); the
#   exact paths are shared by sin and cos.
# - Elsewhere (other ISAs, clang, no OpenMP, or -DLZ_NO_TRIG_V) the branch-free definitions are compiled.
# - TRIG_FAST_BOUND = 2^24: below it m = rint(x/pi - c/2) fits easily, x - 2m P1 is exact and the rest of pi/2
#   (|pi/2 - P1 - P2| < 2^-108) adds < 2^-83 absolute, far below the closest approach of a float32 to a multiple of
#   pi/2 (the same argument holds to ~2^32: 2^24 leaves margin, and larger values are rare in practice).
# The double paths, shared by sin and cos (compiled once: they are most of the code), and the entry points.
_TRIG_EXACT = r"""
static __attribute__((noinline)) float lz_trig_mid_1(float x, int64_t cosine) {
  return lz_trig_large(x) ? (float)lz_trig_f(x, cosine) : (float)lz_trig_fast_f(x, cosine);
}
static __attribute__((noinline)) lz_vsf lz_trig_exact_v(lz_vsf v, lz_vsf o, int64_t cosine) {
#pragma omp simd
  for (int i = 0; i < LZ_TRIG_V; ++i) o[i] = lz_trig_large(v[i]) ? (float)lz_trig_f(v[i], cosine) : o[i];
  return o;
}
static __attribute__((noinline)) lz_vsf lz_trig_mid_v(lz_vsf v, lz_vsf o, int64_t cosine) {
  int large = 0;
#pragma omp simd reduction(|:large)
  for (int i = 0; i < LZ_TRIG_V; ++i) {
    o[i] = lz_trig_mid(v[i]) ? (float)lz_trig_fast_f(v[i], cosine) : o[i];
    large |= lz_trig_large(v[i]);
  }
  return __builtin_expect(large, 0) ? lz_trig_exact_v(v, o, cosine) : o;
}
"""
_TRIG_SCALAR = r"""
extern "C" __attribute__((noinline, used, visibility("hidden"))) float lz_{N}_1(float x) {{
  return lz_trig_mid(x) ? lz_trig_mid_1(x, {C}) : lz_trig_f32(x, {C});
}}
__asm__(".globl _Z6lz_{N}f\n\t.hidden _Z6lz_{N}f\n\t.set _Z6lz_{N}f, lz_{N}_1");
"""
# NOTE: lanes are read and written as v[i], not through float[W] copies: g++ spills those to the stack, and the
# failed store forwarding serializes consecutive calls (measured 2.0 vs 0.7 ns per element).
_TRIG_VECTOR = r"""
extern "C" __attribute__((noinline, used, visibility("hidden"))) lz_vsf {CLONE}_Z6lz_{N}f(lz_vsf v) {{
  lz_vsf o;
#pragma omp simd
  for (int i = 0; i < LZ_TRIG_V; ++i) o[i] = lz_trig_f32(v[i], {C});
  return __builtin_expect(lz_trig_any_mid(v), 0) ? lz_trig_mid_v(v, o, {C}) : o;
}}
"""
# the vector-function-ABI prefix of each width's clone: 'e' AVX-512 (zmm), 'd' AVX2 (ymm), unmasked, one vector arg
TRIG_CLONES = {16: "_ZGVeN16v_", 8: "_ZGVdN8v_"}


def definitions(kernels: str) -> str:
    """What a translation unit defines after its kernels (``kernels``: their text): the float32 sin/cos vector
    variants they call, if any (Note [Trig vector variant]: g++ would compile them in every unit otherwise)."""
    used = [(n, c) for n, c in (("sin", 0), ("cos", 1)) if f"lz_{n}(" in kernels]
    if not used:
        return ""
    text = "#if LZ_TRIG_V" + _TRIG_EXACT + "".join(_TRIG_SCALAR.format(N=n, C=c) for n, c in used)
    for i, (width, clone) in enumerate(TRIG_CLONES.items()):
        text += f"#{'el' if i else ''}if LZ_TRIG_V == {width}"
        text += "".join(_TRIG_VECTOR.format(N=n, C=c, CLONE=clone) for n, c in used)
    return text + "#endif\n#endif\n"


_TRIG_GUARD = r"""
#if defined(__x86_64__) && (defined(__AVX512F__) || defined(__AVX2__)) && defined(__FMA__) && defined(__ELF__) \
    && defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__) && !defined(LZ_NO_TRIG_V)
#ifdef __AVX512F__
#define LZ_TRIG_V 16
#else
#define LZ_TRIG_V 8
#endif
typedef float lz_vsf __attribute__((vector_size(LZ_TRIG_V * 4)));
// some lane has |x| >= TRIG_F32_BOUND or is infinite (whose float path result, NaN, lz_trig_mid_v keeps): x^2, a
// compare and a mask move, where the reduction g++ makes of a lane loop's "any" took 10 more instructions
LZ_INL int lz_trig_any_mid(lz_vsf v) {
  const lz_vsf sq = v * v;  // >= TRIG_F32_BOUND^2 (exactly where |x| >= TRIG_F32_BOUND: rounding is monotonic)
#if LZ_TRIG_V == 16
  return __builtin_ia32_cmpps512_mask(sq, (lz_vsf){} + {F32_BOUND_SQ}, 0x1d, 0xffff, 4);  // _CMP_GE_OQ
#else
  return __builtin_ia32_movmskps256((lz_vsf)(sq >= {F32_BOUND_SQ}));
#endif
}
LZ_INL bool lz_trig_large(float x) {  // finite and |x| >= TRIG_FAST_BOUND: the exact path's values
  const float ax = __builtin_fabsf(x);
  return ax >= {BOUND} && ax <= 0x1.fffffep127f;
}
LZ_INL bool lz_trig_mid(float x) {  // finite and |x| >= TRIG_F32_BOUND: the values of the double paths
  const float ax = __builtin_fabsf(x);
  return ax >= {F32_BOUND} && ax <= 0x1.fffffep127f;
}
#else
#define LZ_TRIG_V 0
#endif
"""

# NOTE: the entry points are OpenMP "declare simd" functions, not inlined: g++ compiles each body once as a vector
# clone that a vectorized loop calls (with AVX-512, 16 floats per call). Inlining 40 sines into a 200-op kernel
# instead makes g++ take seconds (measured 3.4 s vs 0.3 s for the pointwise chain) for no speed gain.
# Entry points with a float and a double body of their own (lz_<name>_f / lz_<name>_d above); sin and cos have a
# float one only (float64 keeps libm: see the module doc).
VECTORIZED = ("exp", "expm1", "log", "log1p", "tanh", "erf")
# float32 entry points evaluated in float (Notes [Float32 exp], [Float32 tanh])
FLOAT_BODIES = {"exp": "lz_exp_f32(x)", "tanh": "lz_tanh_f32(x)"}
_TRIG_ENTRIES = r"""
#if LZ_TRIG_V == 16
#pragma omp declare simd simdlen(16) notinbranch
__attribute__((const, visibility("hidden"))) float lz_sin(float x);
#pragma omp declare simd simdlen(16) notinbranch
__attribute__((const, visibility("hidden"))) float lz_cos(float x);
// defined after the kernels that call them: definitions()
#elif LZ_TRIG_V == 8
#pragma omp declare simd simdlen(8) notinbranch
__attribute__((const, visibility("hidden"))) float lz_sin(float x);
#pragma omp declare simd simdlen(8) notinbranch
__attribute__((const, visibility("hidden"))) float lz_cos(float x);
// defined after the kernels that call them: definitions()
#else
LZ_VEC float lz_sin(float x) { const float y = (float)lz_trig_f(x, 0); return x == 0.0f ? x : y; }
LZ_VEC float lz_cos(float x) { return (float)lz_trig_f(x, 1); }
#endif
static inline double lz_sin(double x) { return __builtin_sin(x); }
static inline double lz_cos(double x) { return __builtin_cos(x); }
"""
# NOTE: float32 exp (Note [Float32 exp]: a dozen float ops) is inlined into the loops that call it instead: the call
# of its vector clone spills every live vector register (all are caller-saved), which cost softmax's sum loop ~10 %
# (4096 x 1024, 1 thread, AVX-512 and AVX2 alike), more than the body itself; its compile cost is a few ops per call.
FLOAT_INLINE = frozenset({"exp"})
_PUBLIC = ('\n#define LZ_VEC _Pragma("omp declare simd notinbranch") __attribute__((noinline)) static\n'
           + "".join(f"{'LZ_INL' if n in FLOAT_INLINE else 'LZ_VEC'} float lz_{n}(float x) "
                     f"{{ return {FLOAT_BODIES.get(n, f'(float)lz_{n}_f(x)')}; }}\n"
                     f"LZ_VEC double lz_{n}(double x) {{ return lz_{n}_d(x); }}\n" for n in VECTORIZED)
           + _TRIG_ENTRIES)


# Note [No <cmath>]: parsing <cmath> costs ~0.17 s of every g++ run (more than compiling a 200-op kernel), so the
# prelude declares the few std:: overloads the templates use itself, exactly as libstdc++'s <cmath> defines them
# (inline wrappers of the compiler's builtins). A translation unit must therefore not include <cmath> as well.
_UNARY = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp",
          "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "erf", "erfc", "lgamma", "tgamma", "floor",
          "ceil", "trunc", "round", "nearbyint", "rint", "fabs")
_BINARY = ("pow", "atan2", "fmod", "remainder", "fmax", "fmin", "copysign", "hypot", "nextafter")


def _cmath_shim() -> str:
    lines = ["namespace std {"]
    for n in _UNARY:
        lines.append(f"inline float {n}(float x) {{ return __builtin_{n}f(x); }} "
                     f"inline double {n}(double x) {{ return __builtin_{n}(x); }}")
    for n in _BINARY:
        lines.append(f"inline float {n}(float x, float y) {{ return __builtin_{n}f(x, y); }} "
                     f"inline double {n}(double x, double y) {{ return __builtin_{n}(x, y); }}")
    lines.append("inline float abs(float x) { return __builtin_fabsf(x); } "
                 "inline double abs(double x) { return __builtin_fabs(x); }")
    lines.append("}  // namespace std")
    lines.append("#define M_SQRT1_2 0x1.6a09e667f3bcdp-1\n#define M_SQRT2 0x1.6a09e667f3bcdp+0\n"
                 "#define M_2_SQRTPI 0x1.20dd750429b6dp+0")
    return "\n".join(lines) + "\n"


CMATH_SHIM = _cmath_shim()


def _chunks28() -> List[float]:
    """2/pi in 28-bit chunks, pre-scaled: chunk j is d_j * 2^(-28 (j + 1)), so x * chunk is exact for a float32 x."""
    bits, n = int("".join(f"{d:06x}" for d in TWO_OVER_PI_24), 16), 24 * len(TWO_OVER_PI_24)
    return [float(Fraction((bits >> (n - 28 * (j + 1))) & ((1 << 28) - 1), 1 << (28 * (j + 1)))) for j in range(7)]


def _windows() -> str:
    """The four chunks of 2/pi that matter for |x|: for x = m 2^E, from the first chunk j with E - 28 (j + 1) < 2
    (earlier chunks contribute multiples of 4), i.e. j = 0, 1, 2, 3 from |x| >= 2^53, 2^81, 2^109; the chunks
    left out after them add less than |x| 2^(-28 (j + 4)) < 2^-58 to x 2/pi.
    NOTE: one select per threshold, not a chain on a window index, which g++ turns into a jump table."""
    c = [x.hex() for x in _chunks28()]
    lines = [f"  double T{i} = {c[i]};" for i in range(4)]
    for w, bound in enumerate(("0x1p53", "0x1p81", "0x1p109"), start=1):
        lines.append("  " + " ".join(f"T{i} = ax >= {bound} ? {c[i + w]} : T{i};" for i in range(4)))
    return "\n".join(lines)


def _source() -> str:
    parts = [_COMMON]
    for s, exp_n, expm1_n, log_n, erf_small, erf_clamp, erfc in (
            ("f", 8, 9, 5, ERF_SMALL_F, "4.0", ERFC_F), ("d", 13, 14, 11, ERF_SMALL_D, "6.0", ERFC_D)):
        parts.append(_BY_PRECISION.format(
            S=s, EXP=horner("r", _taylor(0, exp_n)), EXPM1=horner("r", _taylor(2, expm1_n)),
            LOG=horner("z", [float(Fraction(2, 2 * k + 1)) for k in range(1, log_n + 1)]),
            ERF_SMALL=horner("(ax * ax)", erf_small), ERF_CLAMP=erf_clamp, ERFC_CENTER=erfc[0],
            ERFC=horner("u", erfc[1:])))
    parts.append(_EXP_F32.format(P=horner("s", EXP_F32_POLY, fma="LZ_FMAF")))
    parts.append(_TANH_F32.format(P=horner("s", EXP_F32_POLY, fma="LZ_FMAF")))
    parts.append(_TRIG_F.format(WINDOWS=_windows(), SIN=horner("z", [-x for x in _taylor(3, 13, 2, sign=True)]),
                                COS=horner("z", [-x for x in _taylor(2, 14, 2, sign=True)])))
    parts.append(_TRIG_FAST_F.format(**{f"C{i}": c for i, c in enumerate(SIN_HALF_PI)}))
    parts.append(_TRIG_F32.format(P1=TRIG_F32_PI2[0], D=TRIG_F32_PI2[1], D3=TRIG_F32_PI2[2],
                                  **{f"S{i}": c[1:] if c[0] == "-" else "-" + c for i, c in enumerate(SIN_F32)},
                                  **{f"C{i}": c for i, c in enumerate(COS_F32)}))
    parts.append(_TRIG_GUARD.replace("{BOUND}", _BOUND).replace("{F32_BOUND}", TRIG_F32_BOUND.hex() + "f")
                 .replace("{F32_BOUND_SQ}", (TRIG_F32_BOUND ** 2).hex() + "f"))
    parts.append(_PUBLIC)
    return "".join(parts)


SOURCE = _source()
