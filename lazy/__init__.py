"""lazy: a lazy-tensor runtime for PyTorch.

Tensors on the ``lazy`` device record every ATen op into an IR graph instead of running it; sync points
(``lazy.mark_step()``, ``.cpu()``, ``.item()``, print, bool) hash the graph, look it up in a cache, compile it on
a miss, and run it on the backing device.
"""
from __future__ import annotations

import torch  # noqa: F401 -- first: lazy._C links torch's libc10, which torch's import loads (setup.py)

from . import compat as _compat
from .config import config
from .debug import metrics
from .debug import explain as _explain
from .device import sdpa as _sdpa
from .device.tensor import LAZY_DEVICE, LazyTensor
from .trace import lazy_key as _lazy_key
from .sync import mark_step, sync_tensors, wait_device_ops
from .capture.function import compile

_lazy_key.register()
_sdpa.register()
_compat.install()
if torch.distributed.is_available():
    # collectives on lazy tensors are recorded from the first one on, whether or not the user imports it
    from . import distributed as _distributed  # noqa: F401

__version__ = "0.1.0"
device = LAZY_DEVICE

__all__ = ["LAZY_DEVICE", "LazyTensor", "compile", "config", "device", "explain", "mark_step", "metrics",
           "sync_tensors", "wait_device_ops", "is_lazy"]


def explain(fn: object = None, last: int = 50) -> str:
    """Why things happened. ``lazy.explain()``: the recent syncs by cause and source line, and every compile with
    its reason. ``lazy.explain(fn)`` for a function given to ``lazy.compile``: its captures, guards, replays, guard
    misses (which guard failed: expected and found) and breaks (reason and line)."""
    if fn is None:
        return _explain.explain(last)
    from .capture.function import state_of
    return state_of(fn).explain()


def is_lazy(t: object) -> bool:
    """True if ``t`` is a tensor on the lazy device."""
    return isinstance(t, LazyTensor)
