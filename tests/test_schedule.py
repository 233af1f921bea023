"""Fusion: kernel counts (asserted through lazy.metrics), no stored intermediates, horizontal fusion."""
import re

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics


@pytest.fixture(autouse=True, scope="module")
def cpp_backend(tmp_path_factory):
    with lazy.config.override(compiler="cpp", cache_dir=str(tmp_path_factory.mktemp("lazy-cache"))):
        yield


def run(fn, *inputs):
    """Run ``fn`` lazily in one graph; returns (kernels, externs, program) and checks against eager."""
    want = fn(*inputs)
    lz = fn(*[x.to("lazy") for x in inputs])
    lazy.mark_step()
    metrics.reset()
    lz = fn(*[x.to("lazy") for x in inputs])
    lazy.mark_step()
    got = [t.cpu() for t in (lz if isinstance(lz, (list, tuple)) else [lz])]
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(g, w)
    program = next(reversed(graph_cache._CACHE.values()))
    assert program.backend == "cpp"
    return metrics.counter("kernels_launched"), program.num_externs, program


def chain(x):
    for i in range(200):
        x = [lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05][i % 5](x)
    return x


def test_200_op_chain_is_one_kernel_without_stored_intermediates():
    kernels, externs, program = run(chain, torch.randn(16, 16))
    assert (kernels, externs) == (1, 0)
    assert program.num_kernels == 1
    stores = re.findall(r"\bb\d+\[[^\]]*\] = ", program.source)
    assert len(stores) == 1  # only the output is stored: no fused intermediate touches memory


def test_softmax_and_layer_norm_kernel_counts():
    x = torch.randn(32, 64)
    assert run(lambda x: x.softmax(-1), x)[0] <= 2
    assert run(lambda x: x.log_softmax(0), x)[0] <= 2
    w, b = torch.randn(64), torch.randn(64)
    assert run(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b)[0] <= 2


def test_linear_relu_is_one_extern_and_one_kernel():
    x, w, b = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
    kernels, externs, program = run(lambda x, w, b: (x @ w + b).relu(), x, w, b)
    assert (kernels, externs) == (1, 1)
    kernels, externs, _ = run(lambda x, w, b: F.linear(x, w.t(), b).relu(), x, w, b)
    # NOTE: the transposed weight an extern reads is copied by one kernel today (views are not yet passed to
    # extern calls as strided tensors).
    assert externs == 1 and kernels <= 2


def test_pointwise_into_reduction_and_epilogue():
    x = torch.randn(16, 32)
    kernels, _, program = run(lambda x: ((x * 2).exp().sum(1) + 1).sqrt(), x)
    assert kernels == 1
    kernels, _, _ = run(lambda x: x - x.mean(1, keepdim=True) / x.std(1, keepdim=True), x)
    assert kernels == 1


def test_horizontal_fusion_of_same_shape_outputs():
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    kernels, _, _ = run(lambda x, y: [x * y, x + y, (x - y).exp()], x, y)
    assert kernels == 1


def test_broadcast_is_never_materialized():
    x, b = torch.randn(64, 64), torch.randn(64)
    kernels, _, program = run(lambda x, b: x * b.expand(64, 64) + b[:, None], x, b)
    assert kernels == 1 and len(re.findall(r"\bb\d+\[[^\]]*\] = ", program.source)) == 1


def test_kernel_ir_is_dumped(tmp_path):
    with lazy.config.override(dump_dir=str(tmp_path)):
        x = torch.randn(4, 4).to("lazy")
        (x.exp() * 3).softmax(1).cpu()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 1 and names[0].endswith("_cpp.txt")
    text = (tmp_path / names[0]).read_text()
    assert "kernel k0" in text and "stage max" in text and 'extern "C"' in text
