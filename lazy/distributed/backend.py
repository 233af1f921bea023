"""The ``lazy`` process-group backend: ``dist.init_process_group("lazy")`` (or ``"cpu:gloo,lazy:lazy"``).

Note [The lazy backend wraps gloo or NCCL]
Collectives on lazy tensors never reach a backend when they are called: the recorder takes them first (the lazy
tensor is a Python subclass, and the dispatcher's Python key is ahead of every backend's), and records them as
graph nodes (lazy/distributed/intercept.py). They run at the sync, on backing tensors, through the group's backend
for the backing device. So the backend registered for the ``lazy`` device is the real one for the backing device:
the creator makes a process group with gloo for cpu tensors and, when the backing device is cuda, NCCL for cuda
tensors, and maps the ``lazy`` device to the backing device's backend. The same group therefore also runs
collectives of plain cpu (and cuda) tensors eagerly, and ``dist.barrier()`` works. Any process group whose
backends cover the backing device runs lazy collectives too (``init_process_group("gloo")`` on the cpu,
``"nccl"`` on cuda): this backend only saves choosing one by hand.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroup

from ..device.backing import backing_device

NAME = "lazy"


def _create(opts: Any, backend_options: Any) -> ProcessGroup:
    """The creator of the ``lazy`` backend (extended API): a process group over gloo, and NCCL on a cuda backing
    device (Note [The lazy backend wraps gloo or NCCL])."""
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=float(opts.timeout))
    pg = ProcessGroup(store, rank, size)
    gloo = dist.ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, timeout=timeout)
    gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
    gloo.options.group_name = opts.group_id
    gloo._set_sequence_number_for_group()
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
    device = backing_device()
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise RuntimeError("lazy.distributed: the backing device is cuda, and this torch has no NCCL; use a "
                               "torch built with NCCL, or LAZY_BACKING_DEVICE=cpu (gloo)")
        nccl_opts = dist.ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        nccl_opts.is_high_priority_stream = False
        nccl_opts.global_ranks_in_group = list(opts.global_ranks_in_group)
        nccl_opts.group_name = opts.group_id
        nccl = dist.ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, nccl_opts)
        nccl._set_sequence_number_for_group()
        pg._register_backend(torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl)
        pg._register_backend(torch.device("lazy"), ProcessGroup.BackendType.NCCL, nccl)
        pg._set_default_backend(ProcessGroup.BackendType.NCCL)
    elif device.type == "cpu":
        pg._register_backend(torch.device("lazy"), ProcessGroup.BackendType.GLOO, gloo)
        pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    else:
        raise RuntimeError(f"lazy.distributed: no collective backend for the backing device {device} (cpu: gloo, "
                           "cuda: NCCL)")
    return pg


def register() -> None:
    """Register the ``lazy`` backend with torch.distributed (once per process)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["lazy"])
