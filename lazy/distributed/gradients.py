"""``all_reduce_gradients``: data parallelism without DDP, as torch_xla's ``xm.reduce_gradients``.

Call it between ``loss.backward()`` and ``opt.step()``: the gradients of every rank are averaged in place. On lazy
tensors the all-reduces are recorded into the step's graph (one coalesced all-reduce per bucket of at most
``bucket_cap_mb``); on eager tensors they run now, through the functional collectives, so the same loop runs
eagerly for comparison.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional

import torch

from ..device.tensor import LazyTensor
from .collectives import all_reduce_coalesced, group_name

funcol = torch.ops._c10d_functional


def _parameters(optimizer_or_model: Any) -> List[torch.Tensor]:
    if isinstance(optimizer_or_model, torch.optim.Optimizer):
        params: Iterable[torch.Tensor] = (p for g in optimizer_or_model.param_groups for p in g["params"])
    elif isinstance(optimizer_or_model, torch.nn.Module):
        params = optimizer_or_model.parameters()
    else:
        params = optimizer_or_model
    seen, out = set(), []
    for p in params:  # tied parameters (one Parameter in two places) count once
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _buckets(grads: List[torch.Tensor], cap_bytes: int) -> List[List[torch.Tensor]]:
    buckets: List[List[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        last = buckets[-1] if buckets else None
        if last is None or last[0].dtype != g.dtype or last[0].device != g.device or size + nbytes > cap_bytes:
            buckets.append([g])
            size = nbytes
        else:
            last.append(g)
            size += nbytes
    return buckets


@torch.no_grad()
def all_reduce_gradients(optimizer_or_model: Any, group: Optional[Any] = None, bucket_cap_mb: float = 25.0) -> None:
    """Average the ``.grad`` of every parameter of an optimizer, a module or an iterable of tensors over the ranks
    of ``group`` (default: the default group), in place. Parameters without a gradient are skipped, so every rank
    must have gradients for the same parameters. Sparse gradients are not supported."""
    grads = [p.grad for p in _parameters(optimizer_or_model) if p.grad is not None]
    for g in grads:
        if g.layout != torch.strided:
            raise RuntimeError(f"lazy.distributed.all_reduce_gradients: a {g.layout} gradient of shape "
                               f"{list(g.shape)}; only dense gradients are supported")
    name = group_name(group)
    for bucket in _buckets(grads, int(bucket_cap_mb * 2 ** 20)):
        avg = "avg" if bucket[0].is_floating_point() or bucket[0].is_complex() else "sum"
        if isinstance(bucket[0], LazyTensor):  # one collective node per bucket (Note [Coalesced all-reduce])
            reduced = all_reduce_coalesced(bucket, avg, name)
        else:
            flat = funcol.wait_tensor(funcol.all_reduce(torch.cat([g.reshape(-1) for g in bucket]), avg, name))
            reduced = [piece.view_as(g) for g, piece in zip(bucket, flat.split([g.numel() for g in bucket]))]
        for g, r in zip(bucket, reduced):
            g.copy_(r)
