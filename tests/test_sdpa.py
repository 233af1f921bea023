"""scaled_dot_product_attention on the lazy device (lazy/device/sdpa.py): the fused kernel eager picks on the
backing device is the one recorded, an extern of the compiled graph, and forward and backward equal eager's bit
for bit; what no fused kernel takes (a mask, dropout on cuda) runs the composite path, equal within tolerance."""
import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.debug import metrics

DEVICE = torch.device(lazy.config.backing_device)
COMPILER = "triton" if DEVICE.type == "cuda" else "cpp"
# the kernel eager's selector names for these float32 shapes on each device type
FUSED = {"cpu": "_scaled_dot_product_flash_attention_for_cpu", "cuda": "_scaled_dot_product_efficient_attention"}


def _attention(device, q, k, v, **kw):
    leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kw)
    (out * torch.linspace(-1, 1, out.shape[-1], device=device)).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def _fused_externs():
    """The fused attention kernels among the externs of the graphs compiled since the last metrics reset."""
    names = [name[len("extern."):] for name in metrics.counters()
             if name.startswith("extern.") and any(f in name for f in FUSED.values())]
    # recorded unseeded where the kernel takes a dropout_p (Note [Random ops that draw nothing])
    return sorted(name.removeprefix("unseeded[").removesuffix("]") for name in names)


@pytest.mark.parametrize("is_causal", [False, True])
def test_the_fused_kernel_is_recorded_and_equals_eager(is_causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 64, 32, generator=g) for _ in range(3))
    want = _attention(DEVICE, q, k, v, is_causal=is_causal)
    with lazy.config.override(compiler=COMPILER):
        metrics.reset()
        got = _attention("lazy", q, k, v, is_causal=is_causal)
        lazy.mark_step()
        for w, t in zip(want, got):
            assert torch.equal(t.cpu(), w.cpu())
    assert _fused_externs() == [f"aten.{FUSED[DEVICE.type]}.default", f"aten.{FUSED[DEVICE.type]}_backward.default"]
    assert metrics.counter("compile_fallback") == 0


def test_a_mask_takes_the_composite_path():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=g) for _ in range(3))
    mask = torch.rand(16, 16, generator=g) > 0.3
    want = _attention(DEVICE, q, k, v, attn_mask=mask.to(DEVICE))
    with lazy.config.override(compiler=COMPILER):
        metrics.reset()
        got = _attention("lazy", q, k, v, attn_mask=mask.to("lazy"))
        lazy.mark_step()
        for w, t in zip(want, got):
            torch.testing.assert_close(t.cpu(), w.cpu(), rtol=1e-5, atol=1e-5)
    assert _fused_externs() == []
