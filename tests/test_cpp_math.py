"""lazy/codegen/cpp_math.py: the vectorizable math of the generated C++ (Note [Vectorized math]) against eager, and
the float32 sin/cos vector variant (Note [Trig vector variant]): both paths, their boundary, and which clone g++ calls.
"""
import ctypes
import math
import shlex
import shutil
import subprocess

import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.codegen import cpp, cpp_math
from lazy.debug import metrics
from lazy.runtime import cpp as runtime


pytestmark = pytest.mark.usefixtures("cpp_compiler")


MATH_FNS = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "sin", "cos", "erf")
BOUND = cpp_math.TRIG_FAST_BOUND
F32_BOUND = cpp_math.TRIG_F32_BOUND


def _around_bound(dtype=torch.float32):
    """+-TRIG_F32_BOUND and +-TRIG_FAST_BOUND and their float32 neighbours: the last values of the float path and the
    first of the double one, the last of the double fast path and the first of the exact one."""
    b = torch.tensor([F32_BOUND, BOUND], dtype=torch.float32)
    below, above = torch.nextafter(b, torch.zeros_like(b)), torch.nextafter(b, torch.full_like(b, math.inf))
    near = torch.cat([below, b, above, above * 3, below * 0.75])
    return torch.cat([near, -near]).to(dtype)


def _sweep(dtype):
    """Random bit patterns (every exponent, both signs, NaNs, subnormals), dense ranges, near-multiples of pi/2, the
    special values of each function (overflow/underflow thresholds, +-0, +-inf, NaN) and the trig fast-path bound."""
    g = torch.Generator().manual_seed(0)
    fi = torch.finfo(dtype)
    if dtype is torch.float32:
        bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 17,), generator=g, dtype=torch.int64).to(torch.int32)
    else:
        bits = torch.randint(-2 ** 63, 2 ** 63 - 1, (1 << 16,), generator=g, dtype=torch.int64)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), fi.tiny, -fi.tiny, fi.max, -fi.max,
                            fi.tiny * 2 ** -10, 1.0, -1.0, 0.5, 2.0, 88.72, 89.0, -87.3, -103.9, -104.0, -150.0,
                            709.7, 709.8, -745.1, -746.0, 20.0, -20.0, 9.0, 4.0, 3.9, 6.0, 5.9, 1e-8, -1e-8,
                            -0.99999, -1.0 + 1e-7], dtype=torch.float64).to(dtype)
    lin = torch.linspace(-10, 10, 40001, dtype=dtype)
    logs = torch.logspace(math.log10(fi.tiny) - 5, math.log10(fi.max), 20001, dtype=torch.float64).to(dtype)
    near = (torch.arange(-3000, 3000, dtype=torch.float64) * (math.pi / 2)).to(dtype)
    up = torch.nextafter(near, torch.full_like(near, float("inf")))
    down = torch.nextafter(near, torch.full_like(near, -float("inf")))
    return torch.cat([bits.view(dtype), special, lin, lin * 1e-3, lin * 100, logs, -logs, near, up, down,
                      _around_bound(dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", MATH_FNS)
def test_vectorized_math_matches_eager(name, dtype):
    """Within 4 eps relative (<= 4-8 ulp; measured: float32 <= 1 ulp, sigmoid bit-identical (Note [Float32 exp]),
    float64 <= 3 ulp) of eager, 4 subnormal steps absolute, with eager's NaNs, infinities (overflow) and zeros
    (underflow) exactly."""
    x = _sweep(dtype)
    fn = getattr(torch, name)
    got = fn(x.to("lazy")).cpu()
    assert metrics.counter("compile_fallback") == 0 and not [k for k in metrics.counters() if k.startswith("extern.")]
    assert "lz_" + ("exp" if name == "sigmoid" else name) in graph_cache.latest().source
    want = fn(x)
    fi = torch.finfo(dtype)
    torch.testing.assert_close(got, want, rtol=4 * fi.eps, atol=4 * fi.tiny * fi.eps, equal_nan=True)
    # signs of zero exactly (where both are zero: eager's log1p flushes x = +-2^-149 to +0, ours returns x)
    zeros = (want == 0) & (got == 0)
    assert torch.equal(got[zeros].signbit(), want[zeros].signbit())


def test_math_loops_vectorize(tmp_path):
    """g++ vectorizes a loop over each math function (the point of cpp_math.py); double sin/cos stay libm calls."""
    fns = [n for n in MATH_FNS if n != "sigmoid"]
    loops = [f"void k_{n}_{t}(const {t}* __restrict a, {t}* __restrict b, int64_t n) {{\n"
             f"  for (int64_t i = 0; i < n; ++i) b[i] = lz_{n}(a[i]);\n}}"
             for t in ("float", "double") for n in fns if not (t == "double" and n in ("sin", "cos"))]
    src = tmp_path / "m.cpp"
    src.write_text(cpp.PRELUDE + "\n".join(loops) + "\n" + cpp_math.definitions("\n".join(loops)))
    flags = [f for f in runtime.flags() if f != "-shared"]
    out = subprocess.run(["g++", *flags, "-c", "-fopt-info-vec-optimized", "-o", str(tmp_path / "m.o"), str(src)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    prelude_lines = cpp.PRELUDE.count("\n")
    in_loops = range(prelude_lines + 1, prelude_lines + 2 + "\n".join(loops).count("\n"))
    vectorized = {int(line.split(":")[1]) - prelude_lines - 1 for line in out.stderr.splitlines()
                  if "loop vectorized" in line and int(line.split(":")[1]) in in_loops}
    assert len(vectorized) == len(loops), out.stderr


def test_two_over_pi_chunks_and_no_cmath():
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(100):
        bits = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** (24 * len(cpp_math.TWO_OVER_PI_24))))
    assert bits == int("".join(f"{d:06x}" for d in cpp_math.TWO_OVER_PI_24), 16)
    assert "<cmath>" not in cpp.PRELUDE  # Note [No <cmath>]: it costs ~0.17 s of every compile


# ---- float32 sin/cos: vector variant and portable fallback (Note [Trig vector variant]) -------------------------

_LOOPS = r"""
extern "C" int lz_test_width() { return LZ_TRIG_V; }
extern "C" void lz_test_sin(const float* __restrict a, float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = lz_sin(a[i]); }
extern "C" void lz_test_cos(const float* __restrict a, float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = lz_cos(a[i]); }
extern "C" void lz_test_exp(const float* __restrict a, float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = lz_exp(a[i]); }
"""


# the builds: (lazy.config.cpu_isa, defines); 'avx2' is the AVX2 vector variant where the CPU has AVX2 (on an
# AVX-512 machine too: Note [Kernel ISA])
VARIANTS = {"vector": ("native", []), "portable": ("native", ["-DLZ_NO_TRIG_V"]), "avx2": ("avx2", [])}


class MathLib:
    """The prelude and loops over float32 sin, cos and exp compiled as the runtime compiles a graph (flags()), loaded
    with ctypes."""

    def __init__(self, tmp_path, variant: str):
        src, self.path = tmp_path / f"{variant}.cpp", str(tmp_path / f"{variant}.so")
        src.write_text(cpp.PRELUDE + _LOOPS + cpp_math.definitions(_LOOPS))
        isa, defines = VARIANTS[variant]
        with lazy.config.override(cpu_isa=isa):
            flags = runtime.flags()
        out = subprocess.run(shlex.split(lazy.config.cxx) + flags + defines
                             + ["-fopt-info-vec-optimized", "-o", self.path, str(src)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        loops = range(cpp.PRELUDE.count("\n") + 1, cpp.PRELUDE.count("\n") + _LOOPS.count("\n") + 1)
        self.vectorized_lines = {int(line.split(":")[1]) for line in out.stderr.splitlines()
                                 if "loop vectorized" in line and int(line.split(":")[1]) in loops}
        self.lib = ctypes.CDLL(self.path)
        self.width = self.lib.lz_test_width()  # lanes of the vector variant; 0: the portable definitions

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        getattr(self.lib, f"lz_test_{name}")(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                             ctypes.c_int64(x.numel()))
        return out


@pytest.fixture(scope="module")
def math_libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trig")
    libs = {}
    for v in VARIANTS:
        try:
            libs[v] = MathLib(tmp, v)
        except runtime.IsaError:  # a CPU without AVX2: that build cannot run here
            pass
    return libs


def _lib(math_libs, variant):
    if variant not in math_libs:
        pytest.skip(f"this CPU cannot run the {variant!r} build")
    return math_libs[variant]


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """float32 bits as integers in the order of the values, so that a difference counts ulps (across zero too)."""
    b = x.view(torch.int32).to(torch.int64)
    return torch.where(b < 0, -(b & 0x7FFFFFFF), b)


def _assert_within_one_ulp(got: torch.Tensor, x: torch.Tensor, name: str):
    """Against ``name`` in float64 rounded once to float32 (correctly rounded but for rare double roundings)."""
    want = getattr(torch, name)(x.double()).float()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), x[got.isnan() != nan]
    ulps = (_ordered(got[~nan]) - _ordered(want[~nan])).abs()
    assert ulps.max() <= 1, (x[~nan][ulps.argmax()].item(), got[~nan][ulps.argmax()].item())
    zeros = (want == 0) & (got == 0)
    assert torch.equal(got[zeros].signbit(), want[zeros].signbit())


def _small_and_mixed():
    """256 values with |x| < TRIG_F32_BOUND (random, near multiples of pi/2), and the same with lane k of the k-th
    group of 16 replaced by a value a double path takes (the fast one below TRIG_FAST_BOUND, the exact one above),
    or inf/NaN (which the float path gives NaN for)."""
    g = torch.Generator().manual_seed(1)
    small = torch.cat([(torch.rand(128, generator=g) - 0.5) * 200,
                       (torch.randint(-4000, 4000, (64,), generator=g) * (math.pi / 2)).float(),
                       (torch.rand(64, generator=g) - 0.5) * 2 * F32_BOUND * 0.999])
    large = torch.tensor([BOUND, -BOUND, 1e30, -3.4e38, torch.finfo(torch.float32).max, 2.0 ** 60, F32_BOUND,
                          float("inf"), -float("inf"), float("nan"), 2.0 ** 100 * math.pi, -F32_BOUND * 3, 3.0 * BOUND,
                          -7.5e9, 12345678.0, 2.0 ** 31], dtype=torch.float32)
    mixed = small.clone()
    lanes = torch.arange(16) * 17  # group k, lane k
    mixed[lanes] = large
    return small, mixed, lanes


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_within_one_ulp(math_libs, variant, name):
    """Every build (the vector variant of the machine's widest vectors, the AVX2 one, and the portable definitions
    they replace) vectorizes and gives results within 1 ulp of the correctly rounded value, with NaN for +-inf/NaN
    and sin(+-0) = +-0, over the sweep, the values around TRIG_FAST_BOUND and vectors mixing both paths."""
    lib = _lib(math_libs, variant)
    assert len(lib.vectorized_lines) == 3
    if variant == "portable":
        assert lib.width == 0
    if variant == "avx2":
        assert lib.width == 8
    small, mixed, _ = _small_and_mixed()
    x = torch.cat([_sweep(torch.float32), small, mixed])
    _assert_within_one_ulp(lib(name, x), x, name)


@pytest.mark.parametrize("variant", ["vector", "avx2"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_lane_depends_on_its_value_only(math_libs, variant, name):
    """A lane's result does not depend on which path the other lanes of its vector take, nor on whether it is
    computed by the vector variant or the scalar entry point (a loop's remainder)."""
    lib = _lib(math_libs, variant)
    small, mixed, lanes = _small_and_mixed()
    clean, dirty = lib(name, small), lib(name, mixed)
    keep = torch.ones(len(small), dtype=torch.bool)
    keep[lanes] = False
    _assert_same(clean[keep], dirty[keep])
    _assert_within_one_ulp(dirty[lanes], mixed[lanes], name)
    # the scalar entry point (calls of fewer than 16 values), also on values that the fast path rounds differently
    # from the exact one (1 ulp; found by comparing both over every float32 in [0.5, 4): 24 sines, 10 cosines)
    differ = torch.tensor([float.fromhex(h) for h in ("0x1.4fd68p-1", "0x1.23beb6p+0", "0x1.8c8b3ap-1",
                                                      "0x1.896084p+1")], dtype=torch.float32)
    x = torch.cat([differ, _sweep(torch.float32)[::50], _around_bound()])
    scalar = torch.cat([lib(name, part) for part in x.split(15)])
    _assert_same(scalar, lib(name, x))


@pytest.mark.parametrize("variant", ["vector", "avx2"])
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_float_path_within_one_ulp(math_libs, variant, name):
    """The float path (|x| < TRIG_F32_BOUND, Note [Float32 trig]) within 1 ulp of the correctly rounded value, with
    the sign of zero, over every 2053rd float32 below the bound, every float32 around pi/4 (the first quadrant's
    end) and around the bound, and the float32 values nearest to multiples of pi/2 (the smallest reduced arguments:
    0x1.f9cbe2p+7 is the nearest below 2^20); the scalar entry point gives the same bits."""
    lib = _lib(math_libs, variant)
    top = int(torch.tensor([F32_BOUND], dtype=torch.float32).view(torch.int32))
    every = torch.arange(0, top, 2053, dtype=torch.int32).view(torch.float32)
    near = (torch.arange(-41000, 41000, dtype=torch.float64) * (math.pi / 2)).to(torch.float32)
    x = torch.cat([every, _every_float(0.78, 0.79), _every_float(F32_BOUND * 0.9999, F32_BOUND * 1.0001), near,
                   torch.nextafter(near, torch.full_like(near, math.inf)),
                   torch.nextafter(near, torch.full_like(near, -math.inf)),
                   torch.tensor([float.fromhex("0x1.f9cbe2p+7"), float.fromhex("0x1.2d97c8p+2"), 0.0, -0.0, 1e-45,
                                 float("inf"), -float("inf"), float("nan")])])
    x = torch.cat([x, -x])
    got = lib(name, x)
    _assert_within_one_ulp(got, x, name)
    assert got[x.isinf() | x.isnan()].isnan().all()
    if name == "sin":
        assert torch.equal(got[x == 0].signbit(), x[x == 0].signbit())
    part = x[::7]
    _assert_same(torch.cat([lib(name, p) for p in part.split(15)]), lib(name, part))


def test_trig_float_path_constants():
    """pi/2 = P1 + D + D3 + (less than 2^-75): P1 the float32 below pi/2 (D > 0: Note [Float32 trig]), D and D3
    float32's rounding of what the earlier parts leave."""
    mpmath = pytest.importorskip("mpmath")
    p1, d, d3 = (float.fromhex(c.rstrip("f")) for c in cpp_math.TRIG_F32_PI2)
    with mpmath.workdps(60):
        half_pi = mpmath.pi / 2
        nearest = torch.tensor(float(half_pi), dtype=torch.float32)
        below = torch.nextafter(nearest, torch.zeros(())) if float(nearest) > half_pi else nearest
        assert p1 == float(below) and p1 < half_pi
        rest = half_pi - p1
        assert d == float(torch.tensor(float(rest), dtype=torch.float32)) and d > 0
        rest -= d
        assert d3 == float(torch.tensor(float(rest), dtype=torch.float32))
        assert abs(rest - d3) < mpmath.mpf(2) ** -75


def _assert_same(a: torch.Tensor, b: torch.Tensor):
    nan = a.isnan()
    assert torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


@pytest.mark.parametrize("variant", ["vector", "avx2"])
def test_trig_vector_variant_is_the_clone_gcc_calls(math_libs, variant):
    """Under the project's flags the vectorized loops call exactly the vector variants defined in cpp_math.py (a
    clone of another ISA or length would be an undefined symbol), and the scalar entry points."""
    lib = _lib(math_libs, variant)
    if not lib.width:
        pytest.skip("neither AVX-512 nor AVX2 (or not g++): the portable definitions are compiled, checked above")
    if not shutil.which("objdump"):
        pytest.skip("objdump not found")
    asm = subprocess.run(["objdump", "-d", lib.path], capture_output=True, text=True, check=True).stdout
    called = {line.split("<")[1].split(">")[0] for line in asm.splitlines() if "\tcall " in line and "<" in line}
    # the vector variants (main loops) and the scalar entry points (remainders)
    clone = cpp_math.TRIG_CLONES[lib.width]
    assert {c for c in called if "lz_sin" in c or "lz_cos" in c} == {
        f"{clone}_Z6lz_sinf", f"{clone}_Z6lz_cosf", "_Z6lz_sinf", "_Z6lz_cosf"}


def test_trig_definitions_only_where_called():
    """The vector variants are compiled into a graph's unit only if its kernels call them (g++ compiles them even when
    unused: it cannot see the calls, which go through vector-ABI names)."""
    x = torch.randn(64)
    (x.to("lazy") * 2).cpu()
    assert "lz_sin_1" not in graph_cache.latest().source and "lz_cos_1" not in graph_cache.latest().source
    torch.testing.assert_close(x.to("lazy").sin().cpu(), x.sin())
    src = graph_cache.latest().source
    assert "lz_sin_1" in src and "lz_cos_1" not in src and src.index("lz_sin_1") > src.index("lz_seg0")


# ---- float32 exp (Note [Float32 exp]) ------------------------------------------------------------------------------

def _every_float(lo: float, hi: float) -> torch.Tensor:
    """Every float32 in [lo, hi] (lo and hi of the same sign)."""
    a, b = sorted(torch.tensor([lo, hi], dtype=torch.float32).view(torch.int32).tolist())
    return torch.arange(a, b + 1, dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("variant", ["vector", "avx2"])
def test_float32_exp_within_one_ulp(math_libs, variant):
    """float32 exp is evaluated in float: within 1 ulp of the correctly rounded value over every 1021st float32 and
    every float32 around its thresholds (overflow at 88.72, subnormal results below -87.34, 0 below -103.97, and the
    selects at -104 and 100), with inf, 0 and NaN exactly where eager's are; the vector clone and the scalar entry
    point (calls of fewer than 16 values) give the same bits."""
    lib = _lib(math_libs, variant)
    fi = torch.finfo(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), fi.max, -fi.max, fi.tiny, -fi.tiny,
                            1e-45, -1e-45, 1.0, -1.0], dtype=torch.float32)
    x = torch.cat([torch.arange(-2 ** 31, 2 ** 31, 1021, dtype=torch.int64).to(torch.int32).view(torch.float32),
                   special, *[_every_float(lo, hi) for lo, hi in ((88.5, 89.0), (-87.5, -87.0), (-104.5, -103.5),
                                                                 (99.99, 100.01))]])
    got, want = lib("exp", x), torch.exp(x)
    _assert_within_one_ulp(got, x, "exp")
    for where in (torch.isnan, torch.isinf, lambda t: t == 0):
        assert torch.equal(where(got), where(want)), x[where(got) != where(want)]
    assert lib("exp", special[:4]).tolist() == [1.0, 1.0, float("inf"), 0.0]  # exp(+-0), exp(+-inf)
    part = x[::97]
    _assert_same(torch.cat([lib("exp", p) for p in part.split(15)]), lib("exp", part))

