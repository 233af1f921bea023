"""Ops that run eagerly now: their inputs are synced, the op runs on the backing device, its results come back as
lazy data.

Two kinds of op take this path, each counted and visible in ``lazy.explain()``: data-dependent ops, whose output
shape depends on values (``nonzero``, ``masked_select``, boolean-mask indexing: cause ``data_dependent``), and ops
that cannot be recorded because no shape inference handles them (some custom ops: cause ``fallback``, warned about
once). The recorder calls ``eager_fallback`` through the hooks the sync layer installs (Note [Layers] in
lazy/device/tensor.py).
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ..device.backing import backing_device, eager_dispatch
from ..device.tensor import LazyTensor
from ..ir.node import data_leaf
from ..trace import record
from ..trace.meta import UnsupportedLayout
from ..trace.schema import describe
from ..trace.views import value
from . import sync_nodes


def eager_fallback(func: Any, args: tuple, kwargs: dict, cause: str) -> Any:
    """Sync the lazy inputs, run ``func`` eagerly on the backing device, and wrap its results as lazy data."""
    desc = describe(func)
    lazies: list = []
    record._collect(args, lazies)
    record._collect(kwargs, lazies)
    datas = sync_nodes([value(t) for t in lazies], [t._lz_st for t in lazies], cause)
    swap = {id(t): d for t, d in zip(lazies, datas)}
    targets: list = []
    record._collect([record._arg(desc, args, kwargs, i) for i in desc.mutated], targets)
    record._collect([kwargs.get(n) for n in desc.out_names], targets)
    mutated = {id(t) for t in targets}
    cloned: Dict[int, torch.Tensor] = {}

    def real(v: Any) -> Any:
        if isinstance(v, LazyTensor):
            if id(v) in mutated:
                cloned[id(v)] = swap[id(v)].clone()
                return cloned[id(v)]
            return swap[id(v)]
        if isinstance(v, (list, tuple)):
            return type(v)(real(x) for x in v)
        if isinstance(v, torch.device) and v.type == "lazy":
            return backing_device()
        return v

    with eager_dispatch():  # Note [Executing inside __torch_dispatch__]
        result = func(*real(args), **{k: real(v) for k, v in kwargs.items()})
    for t in lazies:
        if id(t) in cloned:
            new = cloned[id(t)]
            if tuple(new.shape) != t._lz_desc[0]:
                record._set_metadata(t, record.from_data(new))
            else:
                record._write_back(t, data_leaf(new))
    by_id = {id(d): t for t, d in zip(lazies, datas)}
    by_id.update({id(c): next(t for t in lazies if id(t) == k) for k, c in cloned.items()})
    return _wrap_result(result, by_id)


def _wrap_result(result: Any, originals: dict) -> Any:
    if isinstance(result, torch.Tensor):
        if id(result) in originals:
            return originals[id(result)]
        if result.layout != torch.strided:
            raise UnsupportedLayout(f"a {result.layout} result: the lazy device holds only strided (dense) tensors; "
                                    "keep sparse or quantized tensors on the cpu")
        return record.from_data(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap_result(r, originals) for r in result)
    return result
