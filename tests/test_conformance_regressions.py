"""Small regression tests for recorder bugs the OpInfo conformance suite found (tests/test_conformance.py)."""
import pytest
import torch

import lazy

aten = torch.ops.aten
pytestmark = pytest.mark.usefixtures("cpu_backing")  # regressions against eager CPU's own semantics


def same(fn, *tensors):
    """``fn`` on eager tensors and on lazy copies: values, shapes and dtypes equal, inputs mutated alike."""
    eager = [t.clone() for t in tensors]
    lz = [t.clone().to("lazy") for t in tensors]
    want = fn(*eager)
    got = fn(*lz)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for w, g in zip(want, got):
        if w is None:
            continue
        assert g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w)
    for e, lz_out in zip(eager, lz):
        torch.testing.assert_close(lz_out.cpu(), e)


def test_dims_minus_one_and_minus_two_get_different_graphs():
    # CPython hashes -1 like -2: the graph cache once ran sum(x, -2)'s graph for sum(x, -1).
    x = torch.randn(3, 4)
    torch.testing.assert_close(x.to("lazy").sum(-2).cpu(), x.sum(-2))
    torch.testing.assert_close(x.to("lazy").sum(-1).cpu(), x.sum(-1))


@pytest.mark.parametrize("fn", [
    lambda x: x.t_(),
    lambda x: x.unsqueeze_(0).transpose_(0, 2),
    lambda x: x.view(2, 1, 6).squeeze_(1),
    lambda x: x[1:].as_strided_((2, 2), (1, 3)),
    lambda x: x.resize_(3, 4),
    lambda x: x.resize_(2, 2),
], ids=["t_", "unsqueeze_transpose_", "squeeze_", "as_strided_", "resize_same", "resize_shrink"])
def test_inplace_view_ops_change_metadata(fn):
    same(lambda x: fn(x).mul_(2), torch.randn(4, 3))


def test_inplace_view_keeps_aliasing_with_base():
    same(lambda x: (x[1:].t_().mul_(10), x)[1], torch.randn(3, 4))


def test_resize_grows_storage():
    x = torch.randn(2, 3).to("lazy")
    x.resize_(4, 4)
    assert x.shape == (4, 4)
    torch.testing.assert_close(x.cpu().flatten()[6:], torch.zeros(10))


def test_cpu_of_expanded_tensor():
    same(lambda x: x[:, :1].expand(4, 5), torch.randn(4, 3))


def test_conj_views_resolve_inside_syncs():
    # .cpu() syncs from inside __torch_dispatch__, where the Conjugate key is off: hfft read an unconjugated input.
    x = torch.randn(5, 6, 7)
    torch.testing.assert_close(torch.fft.hfft2(x.to("lazy"), dim=(-3, -2, -1)).cpu(),
                               torch.fft.hfft2(x, dim=(-3, -2, -1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fn", [
    lambda z: z.conj().mul_(2),
    lambda z: aten._neg_view(z).mul_(2),
    lambda z: torch.view_as_real(z).mul_(2),
    lambda z: torch.view_as_real(z)[1:3, 1].fill_(7),
    lambda z: z.imag.add_(1),
    lambda z: torch.view_as_real(z).as_strided((3,), (3,), 1).fill_(5),
    lambda z: torch.view_as_real(z.conj().resolve_conj()),
], ids=["conj", "neg_view", "view_as_real", "real_slice", "imag", "as_strided_real", "view_as_real_of_conj"])
def test_complex_views_read_and_write(fn):
    same(fn, torch.randn(4, dtype=torch.complex64))


def test_view_as_complex_write():
    same(lambda x: torch.view_as_complex(x).mul_(2), torch.randn(4, 2))


def test_batch_norm_eval_stats_are_empty_on_cpu():
    x, w, b, mean, var = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)
    same(lambda *t: aten.native_batch_norm(*t, False, 0.1, 1e-5), x, w, b, mean, var)
    same(lambda *t: aten._native_batch_norm_legit_no_training(*t, 0.1, 1e-5), x, w, b, mean, var)


def test_bernoulli_inplace_default_p():
    x = torch.empty(2000).to("lazy")
    x.bernoulli_()
    assert 0.4 < x.cpu().mean().item() < 0.6
    y = torch.ones(2000).to("lazy")
    torch.nn.functional.dropout(y, 0.5, True, inplace=True)
    assert set(y.cpu().unique().tolist()) <= {0.0, 2.0}


def test_fallback_runs_with_eager_dispatch_keys():
    z = torch.randn(6, dtype=torch.complex64)
    lz = z.to("lazy")
    torch.testing.assert_close(torch.masked_select(lz.conj(), lz.real > 0).cpu(),
                               torch.masked_select(z.conj(), z.real > 0))
    assert lazy.metrics.counter("sync.data_dependent") >= 1


def test_out_written_through_unsafe_view():
    # kron writes its result through _unsafe_view(out): that view's schema declares no alias.
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    out = torch.empty(6, 6).to("lazy")
    assert torch.kron(a.to("lazy"), b.to("lazy"), out=out) is out
    torch.testing.assert_close(out.cpu(), torch.kron(a, b))


def test_out_of_data_dependent_op():
    x = torch.randn(8)
    out = torch.empty(0).to("lazy")
    torch.masked_select(x.to("lazy"), (x > 0).to("lazy"), out=out)
    torch.testing.assert_close(out.cpu(), torch.masked_select(x, x > 0))


def test_list_out():
    x = torch.randn(3, 4)
    outs = [torch.empty(0).to("lazy") for _ in range(3)]
    assert aten.unbind_copy.int_out(x.to("lazy"), 0, out=outs) is None
    for o, e in zip(outs, x.unbind(0)):
        torch.testing.assert_close(o.cpu(), e)


def test_matrix_rank_out_is_written():
    # PyTorch's composite skips writing out= for tensor subclasses; lazy routes it through the functional op.
    x = torch.randn(3, 5, 5)
    out = torch.full((3,), 7, dtype=torch.long).to("lazy")
    torch.linalg.matrix_rank(x.to("lazy"), atol=0.1, out=out)
    torch.testing.assert_close(out.cpu(), torch.linalg.matrix_rank(x, atol=0.1))


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_out_updates_running_stats_and_outs(training):
    x, w, b, mean, var = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)

    def run(x, w, b, mean, var, out, save_mean, save_invstd):
        aten.native_batch_norm.out(x, w, b, mean, var, training, 0.1, 1e-5, out=out, save_mean=save_mean,
                                   save_invstd=save_invstd)

    same(run, x, w, b, mean, var, torch.zeros(3, 2, 4), torch.full((2,), 3.0), torch.zeros(2))


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_batch_norm_out_eval_leaves_stats_outs_alone():
    x, w, b, mean, var = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)

    def run(x, w, b, mean, var, out, save_mean, save_invstd):
        aten.native_batch_norm.out(x, w, b, mean, var, False, 0.1, 1e-5, out=out, save_mean=save_mean,
                                   save_invstd=save_invstd)

    same(run, x, w, b, mean, var, torch.zeros(3, 2, 4), torch.zeros(0), torch.full((5,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_statistics_of_half_inputs_keep_their_dtype_on_cpu(dtype):
    """cpu layer/batch norm return float16/bfloat16 mean and rstd for such inputs; the meta kernels say float32."""
    x, w = torch.randn(2, 3, 4, dtype=dtype), torch.randn(4, dtype=dtype)
    expected = torch.ops.aten.native_layer_norm(x, [4], w, w, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to("lazy"), [4], w.to("lazy"), w.to("lazy"), 1e-5)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e)
    for training in (True, False):
        rm, rv = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
        expected = torch.ops.aten.native_batch_norm(x, w[:3], w[:3], rm.clone(), rv.clone(), training, 0.1, 1e-5)
        got = torch.ops.aten.native_batch_norm(x.to("lazy"), w[:3].to("lazy"), w[:3].to("lazy"), rm.to("lazy"),
                                               rv.to("lazy"), training, 0.1, 1e-5)
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g.cpu(), e)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("param_dtype", ["input", torch.float32, None])
def test_norm_statistics_take_the_parameters_dtype_on_cpu(dtype, param_dtype):
    """Mixed precision (a half input, float32 weight and running stats, as CPU autocast leaves a BatchNorm): cpu
    kernels give the statistics the parameters' dtype; without parameters, the input's."""
    x = torch.randn(2, 3, 4, dtype=dtype)
    pd = dtype if param_dtype == "input" else param_dtype

    def params(n):
        if pd is None:
            return None, None, None, None
        return torch.randn(n, dtype=pd), torch.randn(n, dtype=pd), torch.zeros(n, dtype=pd), torch.ones(n, dtype=pd)

    def lz(t):
        return None if t is None else t.clone().to("lazy")

    w, b, rm, rv = params(3)
    calls = [lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5),
             lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update_functional(x, w, b, rm, rv, 0.1, 1e-5),
             lambda x, w, b, rm, rv: torch.ops.aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)]
    if pd is None:
        calls = calls[2:]  # the _batch_norm_with_update ops require running stats
    else:
        calls.append(lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_no_update(x, w, b, rm, rv, 0.1, 1e-5))
    for call in calls:
        expected = call(x, *[None if t is None else t.clone() for t in (w, b, rm, rv)])
        got = call(x.to("lazy"), lz(w), lz(b), lz(rm), lz(rv))
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g.cpu(), e)
    lw = None if pd is None else torch.randn(4, dtype=pd)
    expected = torch.ops.aten.native_layer_norm(x, [4], lw, lw, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to("lazy"), [4], lz(lw), lz(lw), 1e-5)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e)
