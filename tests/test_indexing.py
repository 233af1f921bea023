"""Indexed loads under the cpp compiler (lazy/lower/indexing.py, Note [Indexed loads]): gather, advanced
indexing, index_select, embedding, one-slot scatter, cat and constant padding lower to index maps (no extern
call), agree with eager on ordinary, edge (0-size, 1-element), non-contiguous and broadcast inputs, and raise
where eager raises on an index out of range. The movement ops without an index tensor (flip, diagonal, repeat,
roll, tril/triu, diagonal_scatter, the split and unbind family) equal eager exactly in every supported dtype."""
import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics


pytestmark = pytest.mark.usefixtures("cpp_compiler")


def externs() -> dict:
    return {k: v for k, v in metrics.counters().items() if k.startswith("extern.")}


def check(fn, *inputs, allowed_externs=(), exact=False):
    """``fn`` on eager inputs and lazy copies in one graph: equal results (bit for bit with ``exact``), one
    compile, no fallback, and no extern call but those named."""
    want = fn(*inputs)
    want = want if isinstance(want, (list, tuple)) else [want]
    graph_cache.clear()
    metrics.reset()
    got = fn(*[x.to("lazy") for x in inputs])
    got = got if isinstance(got, (list, tuple)) else [got]
    lazy.mark_step()
    got = [g.cpu() for g in got]
    assert metrics.counter("compile_fallback") == 0 and metrics.counter("compiles") == 1
    assert set(externs()) <= {f"extern.{e}" for e in allowed_externs}, externs()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, **(dict(rtol=0, atol=0, equal_nan=True) if exact else {}))


def test_gather_index_select_and_advanced_indexing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g)
    i = torch.randint(0, 5, (4, 3), generator=g)
    j = torch.randint(0, 4, (6,), generator=g)
    neg = torch.tensor([-1, 0, -4, 3])  # advanced indexing wraps negative indices
    rows, cols = torch.tensor([[0], [3]]), torch.tensor([4, 0, 2])  # broadcast against each other
    check(lambda x, i, j, neg, rows, cols: [
        torch.gather(x, 1, i) * 2, torch.gather(x.t(), 0, i.t()[:, :3]), x.index_select(0, j) + 1,
        x.index_select(1, j[:2].to(torch.int32)), x[neg], x[:, neg], x[rows, cols], x.t()[cols, 1:],
        x.unsqueeze(1)[neg[:3], :, cols], x[neg[1:2]]], x, i, j, neg, rows, cols)


def test_embedding_and_cross_entropy_lower_without_externs():
    g = torch.Generator().manual_seed(1)
    w, ids = torch.randn(10, 3, generator=g), torch.randint(0, 10, (2, 4), generator=g)
    logits, target = torch.randn(4, 5, generator=g), torch.randint(0, 5, (4,), generator=g)
    check(lambda w, ids: F.embedding(ids, w) * 3, w, ids)

    def ce_and_grad(x, t):
        x = x.detach().requires_grad_()
        loss = F.cross_entropy(x, t)
        (grad,) = torch.autograd.grad(loss, x)
        return [loss, grad]
    check(ce_and_grad, logits, target)


def test_scatter_of_one_slot_per_row():
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(4, 5, generator=g), torch.randint(0, 5, (4, 1), generator=g)
    src = torch.randn(4, 2, generator=g)
    check(lambda x, t, src: [x.scatter(1, t, 1.5), x.scatter(1, t, src), x.t().scatter(0, t.t(), -2.0)], x, t, src)
    wide = torch.randint(0, 5, (4, 2), generator=g)  # two slots per row: stays an extern call
    check(lambda x, wide: x.scatter(1, wide, 1.5), x, wide, allowed_externs=("aten.scatter.value",))


def test_cat_and_constant_pad():
    g = torch.Generator().manual_seed(3)
    a, b, c = torch.randn(4, 5, generator=g), torch.randn(4, 2, generator=g), torch.randn(3, 5, generator=g)
    empty, i = torch.randn(0), torch.arange(4)
    check(lambda a, b, c, empty, i: [
        torch.cat([a, b * 2, a], 1).exp(), torch.cat([a, c], 0) + 1, torch.cat([a.t(), c.t()], 1),
        torch.cat([a, empty, c]), torch.cat([a[:, :0], b], 1), torch.cat([i, i.double()]) * 2,
        F.pad(a, (1, 2, 0, 3), value=0.5) * 2, F.pad(a, (-1, 2)), F.pad(a.t(), (0, 0, 2, -1)),
        F.pad(i, (1, 1), value=7),
        F.pad(a, (0, 0)), F.pad(a[:0], (1, 1))], a, b, c, empty, i)


def test_slice_and_select_scatter():
    """The backward of slicing and selecting writes into zeros: slice_scatter / select_scatter as index maps."""
    g = torch.Generator().manual_seed(4)
    x, s, r = torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g), torch.randn(5, generator=g)
    check(lambda x, s, r: [torch.slice_scatter(x, s, 1, 1, 3) * 2, torch.slice_scatter(x, s.t()[:, :5], 0, -2),
                           torch.slice_scatter(x.t(), s.t(), 0, 3, 5), torch.select_scatter(x, r, 0, -1),
                           torch.select_scatter(x, s[:, 0], 1, 2), torch.slice_scatter(x, s[:, :0], 1, 2, 2)],
          x, s, r)
    x = torch.randn(4, 3, generator=g).requires_grad_()

    def grads(x):
        x = x.detach().requires_grad_()
        (x[1:3, 1:] * 2 + x[0, :2] * 3).sum().backward()
        return x.grad
    check(grads, x.detach())


def test_one_element_and_empty_index():
    x, one, none = torch.randn(3, 1), torch.tensor([2]), torch.zeros(0, dtype=torch.long)
    check(lambda x, one, none: [x[one], x.index_select(0, none), torch.gather(x, 0, one[:, None]), x[none] + 1],
          x, one, none)


@pytest.mark.parametrize("make", [
    lambda x, i: torch.gather(x, 0, i), lambda x, i: x.index_select(0, i), lambda x, i: x[i],
    lambda x, i: F.embedding(i, x[:, None]), lambda x, i: x[:, None].scatter(0, i[:, None], 1.0)])
def test_index_out_of_range_raises_like_eager(make):
    x = torch.randn(3)
    for bad in (torch.tensor([3]), torch.tensor([-4])):
        with pytest.raises((RuntimeError, IndexError)):
            make(x, bad)
        y = make(x.to("lazy"), bad.to("lazy")) * 2
        with pytest.raises((RuntimeError, IndexError)):
            y.cpu()
        assert metrics.counter("compile_fallback") == 0  # the compiled kernel raised, not a reference fallback
    try:
        want = make(x, torch.tensor([-1]))
    except (RuntimeError, IndexError):  # gather, index_select, embedding and scatter refuse negative indices
        want = None
    if want is not None:
        torch.testing.assert_close(make(x.to("lazy"), torch.tensor([-1]).to("lazy")).cpu(), want)


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool)


def _data(dtype, *shape, seed=0):
    torch.manual_seed(seed)
    return torch.testing.make_tensor(shape, dtype=dtype, device="cpu", low=-9, high=9)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flip_diagonal_repeat_roll_tril_triu_move_data_exactly(dtype):
    """Edge shapes (0-size, 1-element), negative dims and offsets, transposed, strided and expanded inputs, chains
    with other views, and a reduction consumer: all in one graph, none an extern call."""
    x, t = _data(dtype, 3, 4, 5), _data(dtype, 5, 3, seed=1).t()  # t: a non-contiguous leaf
    one, empty, row = _data(dtype, 1, 1), _data(dtype, 0, 3), _data(dtype, 1, 4, seed=2).expand(3, 4)
    dc = torch.diagonal_copy  # x.diagonal() is a view: a graph of its own when read

    def fn(x, t, one, empty, row):
        return [
            x.flip(0), x.flip(-1, 0), x.transpose(0, 2).flip(1), t.flip(0), one.flip(0, 1), empty.flip(0),
            row.flip(1), row.expand(2, 3, 4).flip(0, 2), x[:, ::2].flip(-2), torch.fliplr(t), torch.rot90(t),
            dc(x), dc(x, 1, 1, 2), dc(x, -2, -1, -2), dc(x, 3, 0, 2), dc(x, 9), dc(t, -1), dc(one), dc(empty),
            dc(row, 2), torch.diag(t), dc(x.flip(0)), dc(x.roll(1, 0), -1, 2, 0),
            x.repeat(2, 1, 1), t.repeat(3, 1, 2), one.repeat(2, 3), empty.repeat(2, 2), row.repeat(1, 0),
            x[0, 0].repeat(2), row.repeat(2, 1, 1), t.tile(2),
            x.roll(1, 0), x.roll((-2, 7), (2, -2)), x.roll(2), t.roll(-4), t.roll((1, 1), (0, 0)), one.roll(1),
            empty.roll(2, 1), row.roll(1, 1),
            x.tril(), x.triu(1), t.tril(-1), t.triu(-2), one.triu(1), empty.tril(), row.triu(), x.tril(9),
            torch.diagonal_scatter(x, x.diagonal(1, 0, 2).flip(-1), 1, 0, 2),
            torch.diagonal_scatter(t, t.diagonal(-1) * 0, -1), torch.diagonal_scatter(t, t.diagonal(9), 9)]

    check(fn, x, t, one, empty, row, exact=True)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.int64, torch.bool), ids=str)
def test_split_and_unbind_copies(dtype):
    """The copying and unsafe split/unbind forms are nodes with one (shape, dtype) per output: lowered to slices
    and selects, 0-size pieces included."""
    x, t = _data(dtype, 5, 4), _data(dtype, 4, 6, seed=1).t()

    def fn(x, t):
        # NOTE: unsafe_split's pieces are views of its input (as eager's): flipped here, so that no piece is read
        # by a graph of its own
        unsafe = [*torch.unsafe_split(x, 2, 1), *torch.unsafe_split_with_sizes(t, [3, 1], -1),
                  *torch.unsafe_chunk(t, 3, 0), *torch.unsafe_split(x[:, :0], 2, 0)]
        return [*torch.split_with_sizes_copy(x, [1, 0, 4]), *torch.unbind_copy(x, 1), *torch.unbind_copy(t.flip(0)),
                *[p.flip(0) for p in unsafe]]

    check(fn, x, t, exact=True)


def test_movement_chains_feed_reductions():
    """A reduction reads through flip, diagonal, repeat, roll, tril and a split piece: the index maps compose."""
    g = torch.Generator().manual_seed(5)
    x, s = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.tensor(2.5)  # s: 0-dim
    check(lambda x, s: [x.flip(1).diagonal(1).sum(), x.t().repeat(2, 1)[1:].sum(0), x.roll(3, 1).tril().amax(1),
                        torch.unsafe_split(x.exp(), 4, 1)[1].sum(1), x.triu(-1).flip(0).cumsum(0)[-1],
                        s.flip(0) * 2, s.roll(1) + 1, s.repeat(2, 3).sum(0)], x, s,
          allowed_externs=("aten.cumsum.default",))
