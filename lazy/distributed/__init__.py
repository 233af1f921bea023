"""Data-parallel training on lazy tensors through torch.distributed.

Launch with ``torchrun`` and initialize a process group as usual: ``dist.init_process_group("lazy")`` (gloo for a
cpu backing device, NCCL for cuda; Note [The lazy backend wraps gloo or NCCL]), or any group whose backends cover
the backing device. Then either wrap the lazy model in ``DistributedDataParallel``, or call
``lazy.distributed.all_reduce_gradients(opt)`` before ``opt.step()``. Collectives on lazy tensors
(``dist.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``, and the functional
collectives) are recorded into the step's graph and run at the sync in recorded order (lazy/distributed/
collectives.py), after a check that every rank recorded the same ones (lazy/distributed/check.py).

The top layer (Note [Layers] in lazy/device/tensor.py): it installs its recording rules in the recorder and its
check in the sync layer when imported; nothing below imports it.
"""
from __future__ import annotations

from ..sync import BEFORE_RUN
from . import backend, check, intercept
from .check import CollectiveMismatch
from .collectives import CollectiveError, UnsupportedCollective
from .gradients import all_reduce_gradients

__all__ = ["CollectiveError", "CollectiveMismatch", "UnsupportedCollective", "all_reduce_gradients"]

intercept.install()
backend.register()
if check.before_run not in BEFORE_RUN:
    BEFORE_RUN.append(check.before_run)
