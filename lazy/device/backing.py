"""The backing device: where graphs run and synced data lives, and how ATen is called there.

Part of the device layer (Note [Layers] in lazy/device/tensor.py): the recorder, the executors and the sync layer
all read it, so it sits below all of them.
"""
from __future__ import annotations

from typing import Any

import torch

from ..config import config


def backing_device() -> torch.device:
    """The device that runs graphs and holds synced data (``lazy.config.backing_device``)."""
    return torch.device(config.backing_device)


# Note [Executing inside __torch_dispatch__]
# Syncs usually start inside the recorder (.cpu() is aten._to_copy, .item() is _local_scalar_dense), where the
# dispatcher has excluded the Conjugate, Negative and ZeroTensor keys (among others) from the thread's key set.
# ATen calls made there skip those fallbacks, so a conj or neg view (``_conj``, ``_neg_view``) reaching a kernel
# is read without its conjugation or negation: fft.hfft* returned wrong values. Graphs and eager fallbacks run
# under the dispatch key sets of plain eager code instead, captured here at import (outside any dispatch).
_EAGER_KEYS = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


def eager_dispatch() -> Any:
    """A context in which ATen calls dispatch as in plain eager code (Note [Executing inside __torch_dispatch__])."""
    return torch._C._ForceDispatchKeyGuard(*_EAGER_KEYS)
