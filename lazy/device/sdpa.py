"""scaled_dot_product_attention on the lazy device picks the kernel eager would pick on the backing device.

``F.scaled_dot_product_attention`` is a composite op that chooses a fused kernel by device: for a device it
does not know (``lazy``) it falls back to the unfused math path, which rounds differently from the fused kernels
eager uses and, on a GPU, materializes the whole attention matrix (a GPT step at batch 64 spent 3.3 ms of GPU
time per step in its softmax kernels alone, where eager's fused kernel spends 3.2 ms on all of attention). Registered
on the ``AutogradLazy`` key, this kernel asks the backing device's own selector (``torch._fused_sdp_choice``,
memoized per signature) and records the kernel it names: the CPU flash kernel on the cpu, the flash or
memory-efficient kernel on cuda (an extern of the graph, its backward recorded by autograd as eager's is). So
lazy training matches eager bit for bit; every other case (a mask, dropout, grouped queries, the cuDNN or math
choice) takes the composite path.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .backing import backing_device

_FLASH, _EFFICIENT = 1, 2  # torch.nn.attention.SDPBackend.FLASH_ATTENTION, EFFICIENT_ATTENTION
_CHOICE: Dict[Any, int] = {}
_lib = None


def _probe(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Uninitialized memory of the same metadata: the selector looks at shapes, strides, dtypes and grad only.
    probe = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    return probe.requires_grad_(t.requires_grad)


def _choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, is_causal: bool,
            scale: Optional[float], device: torch.device) -> int:
    grad = torch.is_grad_enabled()
    q, k, v = (getattr(t, "concrete", t) for t in (q, k, v))  # a SymLazy's concrete twin (capture/symbolic.py)
    key = tuple((t.shape, t.stride(), t.dtype, t.requires_grad) for t in (q, k, v)) + (dropout_p > 0, is_causal,
                                                                                         scale is None, grad, device)
    choice = _CHOICE.get(key)
    if choice is None:
        with torch.set_grad_enabled(grad):
            probes = [_probe(t, device) for t in (q, k, v)]
            choice = _CHOICE[key] = int(torch._fused_sdp_choice(*probes, None, dropout_p, is_causal, scale=scale))
    return choice


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
          dropout_p: float = 0.0, is_causal: bool = False, *, scale: Optional[float] = None,
          enable_gqa: bool = False) -> torch.Tensor:
    device = backing_device()
    # On cuda only without dropout: the fused kernels draw from the CUDA generator's philox state there.
    if attn_mask is None and not enable_gqa and (device.type == "cpu" or dropout_p == 0.0):
        choice = _choice(query, key, value, dropout_p, is_causal, scale, device)
        if device.type == "cpu" and choice == _FLASH:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, dropout_p, is_causal, scale=scale)[0]
        if device.type == "cuda" and choice == _FLASH:
            return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                                      scale=scale)[0]
        if device.type == "cuda" and choice == _EFFICIENT:
            # eager's condition for the log-sum-exp its backward needs (aten/src/ATen/native/transformers)
            lse = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
            return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, lse, dropout_p,
                                                                          is_causal, scale=scale)[0]
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register() -> None:
    global _lib
    if _lib is None:
        _lib = torch.library.Library("aten", "IMPL")
        _lib.impl("scaled_dot_product_attention", _sdpa, "AutogradLazy")
