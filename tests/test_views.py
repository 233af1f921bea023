"""Views and in-place ops behave exactly as in eager, aliasing included (Note [Storages and views])."""
import pytest
import torch

import lazy

L = "lazy"


def both(fn, *shapes, seed=0):
    """Run ``fn`` on eager cpu tensors and on lazy copies; return (eager results, lazy results synced)."""
    g = torch.Generator().manual_seed(seed)
    eager = [torch.randn(*s, generator=g) for s in shapes]
    lz = [e.clone().to(L) for e in eager]
    want = fn(*eager)
    got = fn(*lz)
    return eager, [t.cpu() for t in lz], want, got


def check(fn, *shapes):
    eager, lz, want, got = both(fn, *shapes)
    for e, lz_out in zip(eager, lz):
        torch.testing.assert_close(lz_out, e)
    if want is not None:
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = got if isinstance(got, (tuple, list)) else (got,)
        for w, g in zip(want, got):
            torch.testing.assert_close(g.cpu(), w)
            assert g.shape == w.shape and g.stride() == w.stride(), (g.stride(), w.stride())


CASES = {
    "view_then_inplace": lambda x: (x.view(4, 6).mul_(2), None)[1],
    "inplace_on_view_seen_by_base": lambda x: (x[1].add_(100), x)[1],
    "inplace_on_base_seen_by_view": lambda x: (lambda v: (x.mul_(3), v)[1])(x[:, 2:5]),
    "transpose_chain": lambda x: (x.t()[2:4].add_(1), x)[1],
    "permute_select": lambda x: (x.view(2, 3, 4).permute(2, 0, 1)[1].zero_(), x)[1],
    "reshape_slice_step": lambda x: (x.reshape(24)[::5].fill_(7), x)[1],
    "squeeze_unsqueeze": lambda x: (x.unsqueeze(0).squeeze(0)[0].sub_(1), x)[1],
    "diagonal": lambda x: (x.diagonal().mul_(0), x)[1],
    "diagonal_offset": lambda x: (x.diagonal(1).add_(5), x)[1],
    "unfold": lambda x: (x.unfold(1, 2, 2).mul_(-1), x)[1],
    "as_strided": lambda x: (x.as_strided((2, 2), (1, 6), 3).add_(10), x)[1],
    "expand_read": lambda x: x[0:1].expand(3, 6) * 2,
    "split_write": lambda x: (x.split(2, dim=1)[1].mul_(0), x)[1],
    "unbind_write": lambda x: (x.unbind(0)[2].fill_(1), x)[1],
    "chunk_write": lambda x: (x.chunk(2, dim=0)[1].add_(3), x)[1],
    "narrow": lambda x: (x.narrow(1, 1, 3).mul_(2), x)[1],
    "view_of_view_of_view": lambda x: (x.view(6, 4)[1:5].view(2, 8)[:, ::2].add_(1), x)[1],
    "detach_aliases": lambda x: (x.detach().add_(1), x)[1],
    "two_views_see_each_other": lambda x: (lambda a, b: (a.add_(1), b.clone())[1])(x[1], x[:, 0]),
    "copy_into_view": lambda x: (x[:, 1].copy_(torch.arange(4.0).to(x.device)), x)[1],
    "out_into_view": lambda x: (torch.add(x[0], 1, out=x[1]), x)[1],
    "setitem": lambda x: (x.__setitem__((slice(None), 0), 5.0), x)[1],
    "setitem_tensor_index": lambda x: (x.__setitem__(torch.tensor([0, 2]).to(x.device), 9.0), x)[1],
    "masked_fill_inplace_view": lambda x: (x[1:].masked_fill_(x[1:] > 0, 0.0), x)[1],
    "index_put": lambda x: (x.index_put_((torch.tensor([0, 3]).to(x.device),), torch.tensor(1.0).to(x.device)),
                            x)[1],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_semantics(name):
    check(CASES[name], (4, 6))


def test_view_dtype_and_contiguous():
    check(lambda x: (x.view(torch.int32).bitwise_and_(0x7FFFFFFF), x)[1], (4, 6))
    check(lambda x: x.t().contiguous(), (4, 6))


def test_inplace_returns_self_and_versions():
    x = torch.zeros(3, device=L)
    assert x.add_(1) is x
    assert x.mul_(2) is x
    assert x._version == 2
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))


def test_data_assignment_and_param_data_copy():
    p = torch.nn.Parameter(torch.zeros(2, 2).to(L))
    p.data = torch.ones(3, device=L)
    assert p.shape == (3,)
    torch.testing.assert_close(p.cpu(), torch.ones(3))
    p.data.copy_(torch.full((3,), 4.0))
    torch.testing.assert_close(p.cpu(), torch.full((3,), 4.0))
    q = torch.nn.Parameter(torch.zeros(2).to(L))
    with torch.no_grad():
        q.add_(5)
    torch.testing.assert_close(q.cpu(), torch.full((2,), 5.0))


def test_out_resize_like_eager():
    out = torch.empty(0, device=L)
    torch.add(torch.ones(2, 3, device=L), 1, out=out)
    assert out.shape == (2, 3)
    torch.testing.assert_close(out.cpu(), torch.full((2, 3), 2.0))
    vals, idx = torch.empty(0, device=L), torch.empty(0, dtype=torch.long, device=L)
    x = torch.tensor([[1.0, 5.0], [7.0, 2.0]])
    r = torch.max(x.to(L), 1, out=(vals, idx))
    assert r[0] is vals and r[1] is idx
    torch.testing.assert_close(idx.cpu(), torch.tensor([1, 0]))


def test_inplace_dtype_rules_like_eager():
    x = torch.ones(3, dtype=torch.int64, device=L)
    with pytest.raises(RuntimeError):
        x.add_(1.5)  # result type Float can't be cast to Long, as eager
    y = torch.ones(3, device=L)
    y.add_(torch.ones(3, dtype=torch.float64, device=L))
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))


def test_views_survive_mark_step():
    x = torch.arange(6.0).to(L)
    v = x[2:]
    x.add_(1)
    lazy.mark_step()
    v.mul_(10)
    lazy.mark_step()
    torch.testing.assert_close(x.cpu(), torch.tensor([1.0, 2.0, 30.0, 40.0, 50.0, 60.0]))
    torch.testing.assert_close(v.cpu(), torch.tensor([30.0, 40.0, 50.0, 60.0]))


@pytest.mark.parametrize("fast_path", [True, False])
def test_views_share_their_base_storage_impl(fast_path):
    """ATen's own aliasing tests see lazy views as eager's: is_alias_of, untyped_storage() (csrc/alias.cpp)."""
    from lazy import _C
    _C.set_fast_path(fast_path)
    try:
        x = torch.zeros(4, 6).to(L)
        for _ in range(2):  # the second round takes the fast path once the first memoized the calls
            views = [x.t(), x.view(24), x[1], x[:, 2:], x.transpose(0, 1).unsqueeze(0), x.expand(2, 4, 6),
                     x.t().t(), x.diagonal()]
            for v in views:
                assert torch._C._is_alias_of(v, x) and torch._C._is_alias_of(x, v)
                assert v.untyped_storage().nbytes() == x.untyped_storage().nbytes() == 96
        assert not torch._C._is_alias_of(x * 1, x) and not torch._C._is_alias_of(x.clone(), x)
        grown = x.t()
        grown.resize_(100)  # a grown storage is a new one
        assert not torch._C._is_alias_of(grown, x)
        shrunk = x.view(24)
        shrunk.resize_(5)
        assert torch._C._is_alias_of(shrunk, x)
    finally:
        _C.set_fast_path(True)


def test_tensor_address_probe_agrees_with_cdata():
    from lazy import _C
    t, v = torch.zeros(3), torch.zeros(3).to(L).t()
    if _C.probe_layout(t, v):  # then share_storage reads addresses directly; check it on a fresh pair
        x = torch.zeros(2, 2).to(L)
        assert torch._C._is_alias_of(x.t(), x)


def test_matmul_out_with_a_folded_3d_input():
    """matmul(out=) on a 3-D input writes into out.reshape(...) and copies back only if that is not an alias of
    out: with unrelated C++ storages it copied a [25] result into [5, 5]."""
    a, b = torch.randn(5, 5, 5), torch.randn(5, 5)
    want = torch.empty(5, 5, 5)
    torch.matmul(a, b, out=want)
    out = torch.empty(5, 5, 5).to(L)
    torch.matmul(a.to(L), b.to(L), out=out)
    torch.testing.assert_close(out.cpu(), want)


def test_dense_as_strided_blocks_are_slices():
    """Note [Dense blocks of a dense storage are slices]: DDP's bucket views, as_strided blocks of a flat buffer, read
    and write without the layout-aware as_strided ops (which copy the whole storage), and still as in eager."""
    from lazy.ir.graph import linearize
    from lazy.ir.ops import AS_STRIDED, AS_STRIDED_SCATTER
    from lazy.trace.views import value

    def buckets(flat):
        pieces = [flat.as_strided((2, 3), (3, 1), 0), flat.as_strided((4,), (1,), 6), flat.as_strided((1, 2), (5, 1), 10)]
        for k, p in enumerate(pieces):
            p.mul_(k + 2)
        flat.as_strided((3,), (1,), 3).add_(1)  # overlaps two blocks
        return [flat.as_strided((2, 3), (3, 1), 0) * 1, flat.as_strided((4,), (1,), 6) + 0]

    check(buckets, (12,))
    check(lambda x: x.view(2, 6).as_strided((2, 2), (2, 1), 5).add_(1), (12,))  # a 2-d dense base
    check(lambda x: (x.as_strided((2, 2), (1, 2), 1).add_(1), x)[1], (12,))  # not dense: the as_strided step
    flat = torch.randn(12).to(L)
    block = flat.as_strided((2, 3), (3, 1), 4)
    block.add_(1)
    ops = {n.op for n in linearize([value(flat), value(block)]).order}
    assert not ops & {AS_STRIDED, AS_STRIDED_SCATTER}, ops

    def column_major(x):  # a storage whose base is not row-major keeps the layout-aware step
        return torch.empty_strided((3, 4), (1, 3), device=x.device).copy_(x.view(3, 4)).as_strided((2, 2), (1, 3), 1)

    check(lambda x: column_major(x) * 1, (12,))
    assert AS_STRIDED in {n.op for n in linearize([value(column_major(flat))]).order}
    lazy.mark_step()
