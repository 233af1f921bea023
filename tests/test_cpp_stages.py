"""The C++ renderer's reductions (lazy/codegen/cpp_stages.py): the order of a reduction in lanes and its tree."""
import re

import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics

pytestmark = pytest.mark.usefixtures("cpp_compiler")


def _sum_in_lanes(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """Row sums of float32 ``x`` in the order of Note [Reductions in lanes], in float (Note [Short float sums in
    float lanes]): blocks of ``lanes`` elements, the last shifted back to end at the row's end and adding only the
    lanes the block before did not take; then the tree, lane l with lane l + w for w = lanes/2, ..., 1."""
    n = x.shape[1]
    acc = torch.zeros(x.shape[0], lanes, dtype=torch.float32)
    for k in range(0, n, lanes):
        b = min(k, n - lanes)
        block = x[:, b:b + lanes].clone()
        block[:, :k - b] = 0
        acc = acc + block
    w = lanes // 2
    while w > 0:
        acc = acc[:, :w] + acc[:, w:2 * w]
        w //= 2
    return acc[:, 0]


@pytest.mark.parametrize("n", [1000, 1024, 77])
def test_float_row_sums_add_in_the_order_of_the_lanes_and_the_tree(n):
    """Note [The lane tree is unrolled]: the tree's levels are loops of constant width (no loop over the levels),
    and a float32 row sum is bit-identical to the emulation of its lanes, blocks and tree."""
    torch.manual_seed(0)
    x = torch.randn(37, n)
    got = x.to("lazy").sum(1).cpu()
    assert metrics.counter("compile_fallback") == 0
    source = graph_cache.latest().source
    assert "w /= 2" not in source
    lanes = 64 if n >= 64 else 64 >> (64 // n).bit_length() - 1
    widths = [int(w) for w in re.findall(r"for \(int64_t l = 0; l < (\d+); \+\+l\) \{ acc0\[l\] \+= acc0\[l \+", source)]
    assert widths == [lanes >> k for k in range(1, lanes.bit_length())], source
    assert torch.equal(got, _sum_in_lanes(x, lanes))
    torch.testing.assert_close(got, x.sum(1), rtol=1e-5, atol=1e-4)  # eager adds in another order


def test_every_lane_kind_reduces_its_tree_as_before():
    """The trees of max, min, argmax (a (value, index) pair) and of sibling stages sharing a loop (mean and variance
    of BatchNorm) give eager's values, NaN and the first index among equals included."""
    torch.manual_seed(0)
    x = torch.randn(33, 700)
    x[3, 5] = float("nan")
    x[4, 100] = x[4, 600] = 50.0
    y = torch.randn(16, 8, 9, 10)
    ops = {"amax": lambda t: t.amax(1), "amin": lambda t: t.amin(1), "argmax": lambda t: t.argmax(1),
           "argmin": lambda t: (-t).argmin(1)}
    lz = {k: f(x.to("lazy")) for k, f in ops.items()}
    bn = torch.nn.functional.batch_norm(y.to("lazy"), None, None, training=True)
    lazy.mark_step()
    assert metrics.counter("compile_fallback") == 0
    for k, f in ops.items():
        torch.testing.assert_close(lz[k].cpu(), f(x), equal_nan=True, msg=k)
    torch.testing.assert_close(bn.cpu(), torch.nn.functional.batch_norm(y, None, None, training=True))


def _prefetched(source: str) -> list:
    return re.findall(r"__builtin_prefetch\(&b(\d+)\[", source)


def test_the_next_row_is_prefetched_in_the_first_stage_of_long_rows():
    """Note [The next row is prefetched]: a softmax, layer_norm and row sum over rows of 1024 floats prefetch the next
    row's lines in their first stage only (4 lines per block of 64 float lanes), with eager's values (the last row's
    prefetch clamped to it); rows of 256 floats, column sums (tiled), a single row and a reduction over (N, H, W)
    per channel prefetch nothing."""
    torch.manual_seed(0)
    x, w = torch.randn(37, 1024), torch.randn(1024)
    fns = {"softmax": lambda x, w: x.softmax(-1), "layer_norm": lambda x, w: F.layer_norm(x, x.shape[-1:], w, w),
           "sum": lambda x, w: (x * w).sum(-1)}
    for name, fn in fns.items():
        got = fn(x.to("lazy"), w.to("lazy")).cpu()
        assert metrics.counter("compile_fallback") == 0
        torch.testing.assert_close(got, fn(x, w), msg=name)
        source = graph_cache.latest().source
        assert len(_prefetched(source)) == 4 and source.count("i0n = i0 + 1 < 37 ? i0 + 1 : i0;") == 1, source
        first_stage = source[source.index("acc0[64]"):source.index("acc1[") if "acc1[" in source else None]
        assert "__builtin_prefetch" in first_stage, name
    for x in (torch.randn(37, 256), torch.randn(1, 1024), torch.randn(1024, 37).t()):
        got = x.to("lazy").softmax(-1).cpu()
        torch.testing.assert_close(got, x.softmax(-1))
        assert _prefetched(graph_cache.latest().source) == []
    got = torch.randn(4096, 64)
    torch.testing.assert_close((got.to("lazy") * 2).sum(0).cpu(), (got * 2).sum(0), rtol=1e-5, atol=1e-4)
    assert _prefetched(graph_cache.latest().source) == []
    nchw = torch.randn(8, 64, 16, 32)  # a channel's reduction nests the block loop in the loop over N
    torch.testing.assert_close(nchw.to("lazy").sum((0, 2, 3)).cpu(), nchw.sum((0, 2, 3)), rtol=1e-5, atol=1e-4)
    assert _prefetched(graph_cache.latest().source) == []
