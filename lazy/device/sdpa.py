"""scaled_dot_product_attention on the lazy device picks the kernel eager would pick on the backing device.

``F.scaled_dot_product_attention`` is a composite op that chooses a fused kernel by device: for a device it
does not know (``lazy``) it falls back to the unfused math path, which rounds differently from the fused CPU
kernel eager uses. Registered on the ``AutogradLazy`` key, this kernel asks the backing device's own selector
(``torch._fused_sdp_choice``, memoized per signature) and records that kernel, so lazy training matches eager
bit for bit; every other case takes the composite path, as before.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .backing import backing_device

_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION
_CHOICE: Dict[Any, int] = {}
_lib = None


def _probe(t: torch.Tensor) -> torch.Tensor:
    # Uninitialized memory of the same metadata: the selector looks at shapes, strides, dtypes and grad only.
    probe = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    return probe.requires_grad_(t.requires_grad)


def _choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, is_causal: bool,
            scale: Optional[float]) -> int:
    grad = torch.is_grad_enabled()
    key = tuple((t.shape, t.stride(), t.dtype, t.requires_grad) for t in (q, k, v)) + (dropout_p > 0, is_causal,
                                                                                         scale is None, grad)
    choice = _CHOICE.get(key)
    if choice is None:
        with torch.set_grad_enabled(grad):
            choice = _CHOICE[key] = int(torch._fused_sdp_choice(_probe(q), _probe(k), _probe(v), None, dropout_p,
                                                                is_causal, scale=scale))
    return choice


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
          dropout_p: float = 0.0, is_causal: bool = False, *, scale: Optional[float] = None,
          enable_gqa: bool = False) -> torch.Tensor:
    if (attn_mask is None and not enable_gqa and backing_device().type == "cpu"
            and _choice(query, key, value, dropout_p, is_causal, scale) == _FLASH):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, scale=scale)[0]
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register() -> None:
    global _lib
    if _lib is None:
        _lib = torch.library.Library("aten", "IMPL")
        _lib.impl("scaled_dot_product_attention", _sdpa, "AutogradLazy")
