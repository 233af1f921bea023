"""lazy.config.cpu_isa (Note [Kernel ISA] in lazy/runtime/cpp_isa.py): kernels built for AVX2 on this machine too
(so CI runs both vector paths where the CPU has AVX-512), equal to eager; the ISA in the disk-cache key; choices the
CPU cannot run are refused with a clear error."""
import shutil
import subprocess
import warnings

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import disk, graph_cache
from lazy.debug import metrics
from lazy.runtime import cpp as runtime

pytestmark = pytest.mark.usefixtures("cpp_compiler")


def _runs(isa):
    try:
        with lazy.config.override(cpu_isa=isa):
            runtime.target()
        return True
    except runtime.IsaError:
        return False


WORKLOADS = {
    "chain": lambda x, w: ((x * 1.01 + 0.1).sin().relu() - 0.05).exp().tanh() * (x.cos() + x.sigmoid()),
    "softmax": lambda x, w: x.softmax(-1),
    "layer_norm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5),
    "sums": lambda x, w: [x.sum(1), x.sum(0), x.var(-1), x.amax(1), x.argmax(0)],
    "math": lambda x, w: [x.erf(), x.log1p().nan_to_num(), x.expm1(), x.abs().log(), torch.atan2(x, w)],
}


@pytest.mark.parametrize("isa", ["avx2", "native"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_kernels_equal_eager(isa, name):
    """Every workload compiled for ``isa`` (with AVX2 on an AVX-512 machine: no AVX-512 instruction in the library)
    gives eager's results."""
    if not _runs(isa):
        pytest.skip(f"this CPU cannot run {isa} kernels")
    torch.manual_seed(0)
    x, w = torch.randn(64, 300) * 3, torch.randn(300)
    with lazy.config.override(cpu_isa=isa):
        got = WORKLOADS[name](x.to("lazy"), w.to("lazy"))
        lazy.mark_step()  # one graph of every output
        program = graph_cache.latest()
        got = [g.cpu() for g in got] if isinstance(got, list) else [got.cpu()]
        assert program.backend == "cpp" and metrics.counter("compile_fallback") == 0
        target = runtime.target()
    want = WORKLOADS[name](x, w)
    for g, e in zip(got, want if isinstance(want, list) else [want]):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, equal_nan=True)
    if isa == "avx2":
        assert target.vector_isa() == "AVX2" and not any(f.startswith("AVX512") for f in target.features)
        if shutil.which("objdump"):
            asm = subprocess.run(["objdump", "-d", program.lib._name], capture_output=True, text=True,
                                 check=True).stdout
            assert "zmm" not in asm  # no AVX-512 instruction anywhere in the library
            if name == "chain":  # plain arithmetic: vectorized at AVX2's width by any g++ (libm calls may not be)
                assert "ymm" in asm


def test_isa_is_in_the_disk_key_and_the_graph_cache():
    """The same graph compiled for two ISAs: two keys, two compiles, and each setting finds its own program."""
    if not _runs("avx2"):
        pytest.skip("this CPU has no AVX2")
    x = torch.randn(8, 8).to("lazy")
    lazy.mark_step()
    keys = {}
    for isa in ("native", "avx2", "native"):
        with lazy.config.override(cpu_isa=isa):
            (x * 3).exp().cpu()
            keys[isa] = runtime.target().key()
    assert keys["native"] != keys["avx2"] and "features=" in keys["avx2"]
    assert metrics.counter("cpp.compiles") == (1 if keys["native"] == keys["avx2"] else 2)
    assert metrics.counter("graph_cache.hit") == 1  # the third run: native's program, from memory


def test_features_not_flags_decide_the_key():
    """-march=native reads the same everywhere: the key holds the features it enables and the compiler's version."""
    target = runtime.target()
    assert target.features and target.compiler
    assert ",".join(sorted(target.features)) in target.key() and target.compiler in target.key()
    assert target.vector_isa() == runtime.target_isa()
    from lazy.ir.graph import linearize
    from lazy.trace.views import value
    lin = linearize([value(torch.zeros(3).to("lazy") + 1)])
    assert disk.graph_digest(lin, "cpp", "a") != disk.graph_digest(lin, "cpp", "b")


def test_unknown_or_unrunnable_isa_falls_back_with_a_clear_warning():
    x0 = torch.randn(5, 5)
    for isa, words in (("avx9000", "choose one of"),) + ((("avx512", "lacks"),) if not _runs("avx512") else ()):
        with lazy.config.override(cpu_isa=isa, cache_dir=""):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y = (x0.to("lazy") * 2.5).tanh().cpu()
        torch.testing.assert_close(y, (x0 * 2.5).tanh())
        msgs = [str(w.message) for w in caught if "cpp backend" in str(w.message)]
        assert len(msgs) == 1 and "cpu_isa" in msgs[0] and words in msgs[0], msgs
        assert graph_cache.latest().backend == "reference"
