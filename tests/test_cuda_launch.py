"""Triton programs run by the C runner (csrc/cuda_launch.cpp, Note [Triton kernels launched in C]): kernels launched
with cuLaunchKernel between extern ATen calls, checked against eager CUDA and against the Python launch path."""
import pytest
import torch

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.device.backing import backing_device
from lazy.ir.graph import linearize
from lazy.runtime import cpp_native, triton_launch

pytest.importorskip("triton")
CUDA = torch.device(lazy.config.backing_device).type == "cuda"
on_gpu = pytest.mark.skipif(not CUDA or not triton_launch.available(),
                            reason="launches kernels on a CUDA backing device with torch's static launcher")


def test_the_runner_parses_kernel_steps_and_rejects_malformed_ones():
    cu = ("cu", 0xDEAD, 4, 128, 0, "OOfl", (0, 1, 0, 1), ((1, (4, 4), cpp_native.dtype_code(torch.float32)),), (0,))
    assert cpp_native.make_runner([cu], 2, (0, 256, [(1, 0)])) is not None
    with pytest.raises(ValueError, match="malformed"):
        cpp_native.make_runner([cu[:5] + ("OO",) + cu[6:]], 2, (0, 0, []))
    with pytest.raises(cpp_native.Unsupported):
        cpp_native.dtype_code(torch.uint32)


def test_a_cpu_runner_is_not_run_as_a_cuda_program():
    runner = cpp_native.make_runner([], 1)
    with pytest.raises(ValueError, match="not a cuda program"):
        lazy._C.run_cuda_program(runner, [], [None], 0, ())


def program_of(y: torch.Tensor):
    """The compiled program and the linearized graph of ``y``'s pending IR (looked up, not run)."""
    lin = linearize([y._lz_st.value])
    program, _ = graph_cache.lookup(lin, backing_device())
    return program, lin


def mixed(a, b, k):
    """Kernels before and after an extern (mm), a runtime scalar read by both."""
    return ((a.sin() * k) @ b).relu() + k


@on_gpu
@pytest.mark.usefixtures("triton_compiler")
def test_kernels_and_externs_run_in_c_and_equal_eager():
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    metrics.reset()
    for k in (0.5, 2.0, -1.5, 3.0):
        torch.testing.assert_close(mixed(a.to("lazy"), b.to("lazy"), k).cpu(), mixed(a.cuda(), b.cuda(), k).cpu())
    assert metrics.counter("triton.native_runs") >= 2
    assert metrics.counter("compile_fallback") == 0


@on_gpu
@pytest.mark.usefixtures("triton_compiler")
def test_the_c_runner_and_the_python_path_agree(monkeypatch):
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    y = mixed(a.to("lazy"), b.to("lazy"), 1.25)
    program, lin = program_of(y)
    for _ in range(2):  # the first run tunes block sizes (Python path); the runner is built after it
        want = program.run(lin.leaves, lin.scalars)
    native = program.run(lin.leaves, lin.scalars)
    assert program._native
    monkeypatch.setattr(program, "_native", False)
    python = program.run(lin.leaves, lin.scalars)
    for n, p, w in zip(native, python, want):
        assert torch.equal(n, p) and torch.equal(n, w)


@on_gpu
@pytest.mark.usefixtures("triton_compiler")
def test_an_integral_float_in_an_int_slot_is_read_as_its_int():
    x = torch.arange(40).reshape(8, 5)
    y = (x.to("lazy") * 3 + 4) % 7
    program, lin = program_of(y)
    assert any(type(s) is int for s in lin.scalars)
    want = program.run(lin.leaves, lin.scalars)
    program.run(lin.leaves, lin.scalars)
    assert program._native
    got = program.run(lin.leaves, [float(s) if type(s) is int else s for s in lin.scalars])
    torch.testing.assert_close(got[0].cpu(), ((x * 3 + 4) % 7))
    assert torch.equal(got[0], want[0])


@on_gpu
@pytest.mark.usefixtures("triton_compiler")
def test_a_leaf_not_16_byte_aligned_takes_the_python_path():
    x = torch.randn(1000)
    y = x.to("lazy") * 2 + 1
    program, lin = program_of(y)
    for _ in range(2):
        program.run(lin.leaves, lin.scalars)
    assert program._native
    unaligned = torch.empty(1001, device=lin.leaves[0].device)[1:]
    unaligned.copy_(lin.leaves[0])
    assert unaligned.data_ptr() % 16
    metrics.reset()
    got = program.run([unaligned], lin.scalars)
    torch.testing.assert_close(got[0].cpu(), x * 2 + 1)
    assert metrics.counter("triton.native_runs") == 0 and metrics.counter("triton.unaligned_runs") == 1


@on_gpu
@pytest.mark.usefixtures("triton_compiler")
def test_programs_run_from_python_where_the_c_runner_is_off(monkeypatch):
    monkeypatch.setattr(cpp_native, "NATIVE", False)
    graph_cache.clear()
    a, b = torch.randn(20, 12), torch.randn(12, 6)
    metrics.reset()
    for k in (0.5, 2.0, 3.0):
        torch.testing.assert_close(mixed(a.to("lazy"), b.to("lazy"), k).cpu(), mixed(a.cuda(), b.cuda(), k).cpu())
    assert metrics.counter("triton.native_runs") == 0 and metrics.counter("kernels_launched") > 0
