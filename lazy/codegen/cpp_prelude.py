"""The prelude of every translation unit the C++ renderer writes (codegen/cpp.py): the math of cpp_math.py and the
helpers its templates call (integer division and modulo with eager's semantics, half-precision conversions, checked
indices, NaN-propagating max/min, shifts, integer pow, erfinv, digamma, gcd/lcm).
"""
from __future__ import annotations

from . import cpp_math

PRELUDE = "#include <cstdint>\n#include <limits>\n" + cpp_math.CMATH_SHIM + cpp_math.SOURCE + r"""
static int lz_err = 0;
template <typename T> static inline T lz_idiv_trunc(T a, T b) { if (b == 0) { lz_err |= 1; return 0; } return a / b; }
template <typename T> static inline T lz_idiv_floor(T a, T b) {
  if (b == 0) { lz_err |= 1; return 0; }
  T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; }
template <typename T> static inline T lz_imod_floor(T a, T b) {
  if (b == 0) { lz_err |= 1; return 0; }
  T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
template <typename T> static inline T lz_imod_trunc(T a, T b) { if (b == 0) { lz_err |= 1; return 0; } return a % b; }
template <typename T> static inline T lz_fmod_floor(T a, T b) {
  T r = std::fmod(a, b); if (r != 0 && ((b < 0) != (r < 0))) r += b; return r; }
template <typename T> static inline T lz_fdiv_floor(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b); T div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
  T fl;
  if (div != 0) { fl = std::floor(div); if (div - fl > T(0.5)) fl += T(1); } else { fl = std::copysign(T(0), a / b); }
  return fl; }
// Note [Half precision]
static inline float lz_bf16_to_float(uint16_t h) { const uint32_t u = (uint32_t)h << 16; float f;
  __builtin_memcpy(&f, &u, 4); return f; }
static inline uint16_t lz_float_to_bf16(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4);
  const uint32_t r = u + 0x7FFFu + ((u >> 16) & 1u); return f != f ? (uint16_t)0x7FC0 : (uint16_t)(r >> 16); }
static inline float lz_round_bf16(float f) { return lz_bf16_to_float(lz_float_to_bf16(f)); }
#if defined(__FLT16_MAX__)  // _Float16 (g++ >= 12 on x86): a graph without float16 compiles on older compilers too
static inline float lz_round_f16(float f) { return static_cast<float>(static_cast<_Float16>(f)); }
#endif
// Note [Indexed loads] (lower/indexing.py): an index out of range loads element 0 and sets error bit 2
static inline int64_t lz_index_checked(int64_t i, int64_t n, int64_t wrap) {
  if (wrap && i < 0) i += n;
  if (i < 0 || i >= n) { lz_err |= 2; return 0; }
  return i; }
static inline int64_t lz_index_clamp(int64_t i, int64_t hi) { return i < 0 ? 0 : (i > hi ? hi : i); }
template <typename T> static inline T lz_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> static inline T lz_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> static inline T lz_lerp(T a, T b, T w) {
  return std::abs(w) < T(0.5) ? a + w * (b - a) : b - (b - a) * (T(1) - w); }
// Note [Shifts] (lower/pointwise.py): U is T's unsigned type, N its width (lshift) or width - signed (rshift)
template <typename T, typename U, int N> static inline T lz_shl(T a, T b) {
  return (b < 0 || b >= N) ? T(0) : static_cast<T>(static_cast<U>(a) << b); }
template <typename T, int N> static inline T lz_shr(T a, T b) {
  return static_cast<T>(a >> ((b < 0 || b >= N) ? N : b)); }
// eager's integer pow (ATen's powi): wraps on overflow; negative exponents: 1 for 1, +-1 for -1, else 0
template <typename T> static inline T lz_ipow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0));
  T r = 1;
  while (b) { if (b & 1) r = static_cast<T>(r * a); b = static_cast<T>(b / 2); a = static_cast<T>(a * a); }
  return r; }
// Note [Pow with a scalar exponent]
// pow(x, e) with e one number for the whole tensor (pow.Tensor_Scalar: GELU's tanh form cubes with pow(x, 3.0)) is
// eager's kernel: its special exponents as multiplications, square roots and reciprocals (ATen's
// pow_tensor_scalar_kernel: 0.5, -0.5, -1, 2, 3, -2, the last divided in double), else pow. The exponent is
// usually a constant of the graph (Note [Scalars that pick eager's kernel] in lazy/trace/schema.py): the tests fold
// away and the loop vectorizes; where it is a runtime scalar they are loop-invariant and predicted, where a libm
// pow per element cost 20-40 ns (a GPT-2 step's GELU: 0.5 ms of a 5 ms step).
template <typename T> static inline T lz_pow_scalar(T x, double e) {
  if (e == 2.0) return x * x;
  if (e == 3.0) return x * x * x;
  if (e == 0.5) return std::sqrt(x);
  if (e == -0.5) return T(1) / std::sqrt(x);
  if (e == -1.0) return T(1) / x;
  if (e == -2.0) return static_cast<T>(1.0 / static_cast<double>(x * x));
  return std::pow(x, static_cast<T>(e)); }
// erfinv: M. Giles' single-precision guess ("Approximating the erfinv function", GPU Computing Gems, 2010), then
// Newton steps in double on erf, and in the tails (|y| > 0.5) on log(erfc), which stays exact where erf(x) rounds
// to 1 and converges where erfc(x) ~ exp(-x^2) would creep: within 1e-15 of eager's up to |y| = 1 - 2^-53
template <typename T> static inline T lz_erfinv(T v) {
  const double y = v, a = y < 0 ? -y : y;
  if (y != y) return v;
  if (!(a < 1.0)) return a == 1.0 ? T(std::copysign(std::numeric_limits<double>::infinity(), y))
                                  : std::numeric_limits<T>::quiet_NaN();
  double w = -std::log((1.0 - a) * (1.0 + a)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w; p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w; p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * a;
  for (int i = 0; i < 4; ++i) {
    const double d = 0x1.20dd750429b6dp+0 * std::exp(-x * x);  // 2 / sqrt(pi) e^-x^2
    if (a > 0.5) { const double e = std::erfc(x); x += (std::log(e) - std::log1p(-a)) * e / d; }
    else { x -= (std::erf(x) - a) / d; }
  }
  return T(std::copysign(x, y)); }
// digamma in double: psi(x) = psi(1 - x) - pi / tan(pi x) below 0 (pi times the fraction of x, which tan takes
// exactly), psi(x) = psi(x + 1) - 1 / x up to 10, then ln x - 1 / (2x) - sum B_2k / (2k x^2k). As eager: +-0 gives
// -+inf, negative integers and -inf give NaN
template <typename T> static inline T lz_digamma(T v) {
  double x = v, result = 0.0;
  if (x == 0.0) return T(std::copysign(std::numeric_limits<double>::infinity(), -x));
  if (x < 0.0) {
    const double whole = std::trunc(x);
    if (x == whole) return std::numeric_limits<T>::quiet_NaN();
    result = -0x1.921fb54442d18p+1 / std::tan(0x1.921fb54442d18p+1 * (x - whole));
    x = 1.0 - x;
  }
  while (x < 10.0) { result -= 1.0 / x; x += 1.0; }
  const double z = 1.0 / (x * x);
  const double series = z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (
      691.0 / 32760 - z / 12))))));
  return T(result + std::log(x) - 0.5 / x - series); }
// NOTE: not __builtin_signbit: g++ 12 fails (unrecognizable insn) vectorizing it over bfloat16 loads
static inline bool lz_signbit(float x) { uint32_t u; __builtin_memcpy(&u, &x, 4); return (u >> 31) != 0; }
static inline bool lz_signbit(double x) { uint64_t u; __builtin_memcpy(&u, &x, 8); return (u >> 63) != 0; }
// ATen's calc_gcd and lcm: |x| and a / g * b in C++'s promoted type, so int8's -128 and overflow wrap as there.
// gcd(INT_MIN, INT_MIN + 1) is -1 there, and eager's INT_MIN / -1 then traps (SIGFPE): here it wraps to INT_MIN.
template <typename T> static inline T lz_gcd(T a, T b) {
  a = static_cast<T>(a < 0 ? -a : a); b = static_cast<T>(b < 0 ? -b : b);
  while (a != 0) { const T c = a; a = static_cast<T>(b % a); b = c; }
  return b; }
template <typename T> static inline T lz_lcm(T a, T b) {
  const T g = lz_gcd<T>(a, b); if (g == 0) return T(0);
  const auto r = (g == -1 ? -a : a / g) * b; return static_cast<T>(r < 0 ? -r : r); }
"""
