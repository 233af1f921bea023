"""The lazy device: moving data, factories, metadata without execution."""
import pytest
import torch

import lazy
from lazy.debug import metrics

L = "lazy"


def test_device_identity():
    x = torch.ones(2, device=L)
    assert x.device.type == "lazy"
    assert x.device == torch.device("lazy:0")
    assert torch.zeros(1, device="lazy:0").device == x.device
    assert lazy.is_lazy(x) and not lazy.is_lazy(torch.ones(1))


def test_to_and_back_roundtrip():
    x = torch.randn(5, 7)
    y = x.to(L)
    assert isinstance(y, lazy.LazyTensor)
    torch.testing.assert_close(y.cpu(), x)
    torch.testing.assert_close(y.to("cpu"), x)
    assert y.to(torch.float64).cpu().dtype == torch.float64
    torch.testing.assert_close(y.to(torch.float64).cpu(), x.double())
    torch.testing.assert_close(x.to(L, torch.int32).cpu(), x.to(torch.int32))


def test_to_lazy_takes_a_snapshot():
    x = torch.zeros(3)
    y = x.to(L)
    x.add_(1)  # eager semantics: the copy happened at .to() time
    torch.testing.assert_close(y.cpu(), torch.zeros(3))


def test_cpu_result_is_a_copy():
    y = torch.ones(3, device=L)
    c = y.cpu()
    c.add_(5)
    torch.testing.assert_close(y.cpu(), torch.ones(3))


def test_copy_both_directions():
    src = torch.arange(6.0).reshape(2, 3)
    dst = torch.zeros(2, 3, device=L)
    dst.copy_(src)
    torch.testing.assert_close(dst.cpu(), src)
    back = torch.empty(2, 3)
    back.copy_(dst * 2)
    torch.testing.assert_close(back, src * 2)
    # broadcasting and dtype conversion, as eager
    d2 = torch.zeros(2, 3, dtype=torch.int64, device=L)
    d2.copy_(torch.tensor([1.7, 2.2, 3.9]))
    torch.testing.assert_close(d2.cpu(), torch.zeros(2, 3, dtype=torch.int64).copy_(torch.tensor([1.7, 2.2, 3.9])))


def test_tensor_constructor_and_as_tensor():
    torch.testing.assert_close(torch.tensor([[1, 2], [3, 4]], device=L).cpu(), torch.tensor([[1, 2], [3, 4]]))
    torch.testing.assert_close(torch.as_tensor([1.5, 2.5], device=L).cpu(), torch.tensor([1.5, 2.5]))
    assert torch.tensor(3.0, device=L).item() == 3.0


FACTORIES = [
    ("zeros", lambda d, **k: torch.zeros(2, 3, device=d, **k)),
    ("ones", lambda d, **k: torch.ones(4, device=d, **k)),
    ("full", lambda d, **k: torch.full((2, 2), 7.5, device=d, **k)),
    ("arange", lambda d, **k: torch.arange(1, 10, 2, device=d, **k)),
    ("arange_float", lambda d, **k: torch.arange(0, 1, 0.25, device=d, **k)),
    ("linspace", lambda d, **k: torch.linspace(-1, 1, 9, device=d, **k)),
    ("logspace", lambda d, **k: torch.logspace(0, 2, 5, device=d, **k)),
    ("eye", lambda d, **k: torch.eye(3, 4, device=d, **k)),
    ("tril_indices", lambda d, **k: torch.tril_indices(4, 3, device=d)),
    ("zeros_like", lambda d, **k: torch.zeros_like(torch.empty(3, 2, device=d))),
    ("ones_like", lambda d, **k: torch.ones_like(torch.empty(3, 2, device=d), dtype=torch.int32)),
    ("full_like", lambda d, **k: torch.full_like(torch.empty(3, device=d), 2)),
    ("scalar_tensor", lambda d, **k: torch.scalar_tensor(4.0, device=d)),
]


@pytest.mark.parametrize("name,make", FACTORIES, ids=[f[0] for f in FACTORIES])
def test_factories_match_eager(name, make):
    got = make(L)
    want = make("cpu")
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("name", ["zeros", "ones", "arange", "full", "eye", "linspace"])
def test_factory_out_forms(name):
    calls = {
        "zeros": lambda out: torch.zeros(2, 3, out=out),
        "ones": lambda out: torch.ones(2, 3, out=out),
        "arange": lambda out: torch.arange(6, out=out),
        "full": lambda out: torch.full((2, 3), 4.0, out=out),
        "eye": lambda out: torch.eye(3, out=out),
        "linspace": lambda out: torch.linspace(0, 1, 6, out=out),
    }
    out = torch.empty(0, device=L)
    want = calls[name](torch.empty(0))
    r = calls[name](out)
    assert r is out
    assert out.shape == want.shape
    torch.testing.assert_close(out.cpu(), want)


RANDOM = [
    ("rand", lambda d, g=None: torch.rand(3, 4, device=d, generator=g)),
    ("randn", lambda d, g=None: torch.randn(3, 4, device=d, generator=g)),
    ("randint", lambda d, g=None: torch.randint(0, 10, (5,), device=d, generator=g)),
    ("randperm", lambda d, g=None: torch.randperm(7, device=d, generator=g)),
    ("normal", lambda d, g=None: torch.normal(2.0, 3.0, (4,), device=d, generator=g)),
    ("bernoulli", lambda d, g=None: torch.bernoulli(torch.full((6,), 0.5, device=d), generator=g)),
    ("rand_like", lambda d, g=None: torch.rand_like(torch.empty(2, 2, device=d))),
    ("randn_like", lambda d, g=None: torch.randn_like(torch.empty(2, 2, device=d))),
    ("randint_like", lambda d, g=None: torch.randint_like(torch.empty(2, 2, device=d), 5)),
]


@pytest.mark.parametrize("name,make", RANDOM, ids=[r[0] for r in RANDOM])
def test_random_factories_reproducible_under_manual_seed(name, make):
    torch.manual_seed(123)
    a = make(L).cpu()
    torch.manual_seed(123)
    b = make(L).cpu()
    torch.manual_seed(124)
    c = make(L).cpu()
    want = make("cpu")
    assert a.shape == want.shape and a.dtype == want.dtype
    torch.testing.assert_close(a, b)
    if a.numel() > 3 and name != "randperm":
        assert not torch.equal(a, c)
    if name == "randperm":
        assert sorted(a.tolist()) == list(range(7))


def test_random_with_explicit_generator():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(8, device=L, generator=g).cpu()
    g.manual_seed(5)
    b = torch.randn(8, device=L, generator=g).cpu()
    torch.testing.assert_close(a, b)


def test_random_values_do_not_recompile():
    lazy.mark_step()
    for _ in range(5):
        x = torch.randn(16, device=L)
        y = torch.rand(16, device=L) * x  # noqa: F841 -- alive until the mark_step
        lazy.mark_step()
    assert metrics.counter("compiles") == 1
    assert metrics.counter("graph_cache.hit") == 4


def test_random_distribution_is_sane():
    torch.manual_seed(0)
    x = torch.randn(20000, device=L).cpu()
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    u = torch.rand(20000, device=L).cpu()
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02


def test_metadata_without_execution():
    x = torch.randn(4, 6).to(L)
    metrics.reset()
    y = (x.t() * 2)[1:3]
    z = torch.randn(2, 3, 4, device=L).permute(2, 0, 1)
    w = z + 1
    assert y.shape == (2, 4) and y.dtype == torch.float32
    assert x.t().stride() == (1, 6) and not x.t().is_contiguous()
    assert z.stride() == torch.empty(2, 3, 4).permute(2, 0, 1).stride()
    assert w.stride() == (torch.empty(2, 3, 4).permute(2, 0, 1) + 1).stride()  # eager keeps the layout
    assert w.numel() == 24 and w.dim() == 3
    assert x.requires_grad is False and x.requires_grad_().requires_grad
    assert metrics.counter("executed_graphs") == 0 and metrics.counter("compiles") == 0


def test_cpu_preserves_eager_strides():
    x = torch.randn(3, 4).to(L)
    assert x.t().cpu().stride() == torch.randn(3, 4).t().cpu().stride()
    assert (x.t() * 1).cpu().stride() == (torch.randn(3, 4).t() * 1).stride()


def test_numpy_needs_cpu_first():
    x = torch.ones(2, device=L)
    with pytest.raises(TypeError, match="cpu"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0]


def test_device_mix_raises_like_eager():
    x = torch.ones(3, device=L)
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(3)
    # cpu scalars (0-dim) are allowed beside device tensors, as in eager CUDA
    torch.testing.assert_close((x + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_shape_errors_raised_at_record_time():
    x = torch.ones(3, device=L)
    with pytest.raises(RuntimeError, match="size|broadcast"):
        x + torch.ones(4, device=L)
    with pytest.raises(RuntimeError):
        torch.ones(2, 3, device=L) @ torch.ones(2, 3, device=L)
    assert metrics.counter("executed_graphs") == 0


def test_to_lazy_keeps_eager_strides():
    """.to("lazy") keeps a dense layout's strides (contiguous, transposed, channels_last) and makes others
    contiguous, as .to(another device) does in eager."""
    base = torch.randn(2, 3, 4, 5)
    cases = [base, base.transpose(1, 3), base.contiguous(memory_format=torch.channels_last), base[:, :, ::2],
             base[0].expand(3, 3, 4, 5), base[1:]]
    for t in cases:
        lz = t.to("lazy")
        assert lz.stride() == t.clone().stride()  # clone's preserve_format: eager's rule for a copy
        torch.testing.assert_close(lz.cpu(), t)
    assert cases[1].to("lazy").stride() == cases[1].stride() and cases[3].to("lazy").is_contiguous()


@pytest.mark.skipif(torch.device(lazy.config.backing_device).type != "cuda", reason="uploads to a CUDA backing device")
def test_uploads_do_not_wait_for_the_device():
    """Note [Uploads do not wait]: a host tensor's upload is a snapshot in eager's dtype and layout, taken at the
    call (the source, pinned or not, may change right after), enqueued without waiting for the GPU."""
    x = torch.randn(64, 3, 8, 8)
    ref = x.clone()
    pinned = x.pin_memory()
    for dtype in (torch.float32, torch.float16):  # first allocations (pinned and device blocks) cached beforehand
        x.to(L, dtype).cpu()
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            x.to("cuda")
            flagged = False
        except RuntimeError:
            flagged = True
        ys = [x.to(L), pinned.to(L), x.to(L, torch.float16), x.to(L, memory_format=torch.channels_last)] \
            if flagged else []
    finally:
        torch.cuda.set_sync_debug_mode(0)
    if not flagged:
        pytest.skip("this torch's sync debug mode does not flag a pageable upload")
    x.zero_()
    pinned.zero_()
    for y, dtype, channels_last in zip(ys, (torch.float32, torch.float32, torch.float16, torch.float32),
                                       (False, False, False, True)):
        assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
        got = y.cpu()
        assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert torch.equal(got, ref.to(dtype))  # the values at the call, not the zeros written after it


@pytest.mark.skipif(torch.device(lazy.config.backing_device).type != "cuda", reason="uploads to a CUDA backing device")
def test_uploads_in_c_keep_eager_layouts_and_values():
    """Note [Uploads in C]: one C call stages and copies a plain cpu tensor in eager's layout (a dense one's own
    strides, a non-dense one's preserve_format layout) and dtype; a conjugate view is left to the Python path."""
    x = torch.randn(6, 5, 4)
    index = torch.cuda.current_device()
    for source in (x, x.transpose(0, 2), x[:, ::2], x[:, :1].expand(6, 3, 4), x.to(torch.int64)):
        for dtype in (None, torch.float16):
            code = -1 if dtype is None else 5
            got = lazy._C.upload(source, code, index)
            want = source.to("cuda", dtype=dtype)
            assert got.device == want.device and got.dtype == want.dtype and got.stride() == want.stride()
            assert not got.requires_grad and torch.equal(got.cpu(), want.cpu())
            assert torch.equal(source.to(L, dtype).cpu(), want.cpu())
    leaf = torch.randn(3, requires_grad=True)
    assert not lazy._C.upload(leaf, -1, index).requires_grad
    assert lazy._C.upload(torch.randn(3, dtype=torch.cfloat).conj(), -1, index) is None
    z = torch.randn(3, dtype=torch.cfloat)
    torch.testing.assert_close(z.conj().to(L).cpu(), z.conj())
