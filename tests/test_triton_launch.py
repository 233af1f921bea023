"""Launching compiled Triton kernels (runtime/triton_launch.py, Note [One launcher for every signature]): on cuda a
program's kernels launch through PyTorch's static launcher, without Triton's per-signature launchers."""
import pytest
import torch

import lazy
from lazy.debug import metrics
from lazy.runtime import triton_launch

pytest.importorskip("triton")
CUDA = torch.device(lazy.config.backing_device).type == "cuda"


def test_only_kernels_with_argument_types_launch_statically():
    info = {"hash": "h", "name": "k0", "shared": 0, "num_warps": 4, "types": None, "hidden": 0}
    assert not triton_launch.statically(info)
    assert triton_launch.statically({**info, "types": "OOd"}) == triton_launch.available()


@pytest.mark.skipif(not CUDA, reason="launches on a CUDA backing device")
@pytest.mark.usefixtures("triton_compiler")
def test_programs_launch_their_kernels_statically():
    if not triton_launch.available():
        pytest.skip("this torch has no static CUDA launcher")
    metrics.reset()
    x = torch.randn(300, 70)
    got = (x.to("lazy").softmax(-1) * 3 + x.to("lazy").sum(0)).cpu()
    torch.testing.assert_close(got, x.softmax(-1) * 3 + x.sum(0))
    assert metrics.counter("kernels_launched") >= 1
    assert metrics.counter("triton.triton_launchers") == 0


@pytest.mark.skipif(not CUDA, reason="loads compiled kernels on a CUDA backing device")
@pytest.mark.usefixtures("triton_compiler")
def test_a_kernel_whose_file_is_gone_is_compiled_again(monkeypatch, tmp_path):
    from lazy.runtime import triton_build
    compile_share = triton_build.triton_worker.compile_share

    def gone(path, kernels, target):  # the first compile's files vanish before they are loaded
        answer = compile_share(path, kernels, target)
        if not gone.done:
            gone.done = True
            answer["infos"][0]["cubin"] = str(tmp_path / "missing.cubin")
        return answer
    gone.done = False
    monkeypatch.setattr(triton_build.triton_worker, "compile_share", gone)
    metrics.reset()
    x = torch.randn(37, 11)
    torch.testing.assert_close((x.to("lazy").exp() * 2 + 1).cpu(), x.exp() * 2 + 1)
    assert gone.done and metrics.counter("triton.compiles") >= 2 and metrics.counter("compile_fallback") == 0
