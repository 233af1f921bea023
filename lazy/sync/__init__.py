"""Sync points: where recorded IR is cut into a graph, looked up in the cache (compiled on a miss) and run.

``mark_step`` syncs every live storage with pending IR into one graph; a single tensor's sync (``.cpu()``,
``.item()``, print, bool, a data-dependent op) computes only what that tensor needs, and keeps every live
value the graph computed on the way, so nothing is computed twice. Each sync is counted by cause and logged
with the user's source line (``lazy.explain()`` lists them).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, List, Optional, Sequence

import torch

from .. import _C
from ..cache import graph_cache
from ..config import config
from ..debug import metrics
from ..debug.explain import SYNC_LOG, SyncRecord, explain_miss
from ..debug.log import log, user_frame
from ..device.backing import backing_device
from ..device.tensor import LazyTensor, Storage, pending_storages
from ..ir.graph import Linearized, linearize
from ..ir.layout import non_overlapping_and_dense
from ..ir.node import DATA, Node
from ..runtime.reference import run_node
from ..trace import record
from ..trace.views import value
from . import launch

__all__ = ["ImplicitSyncError", "backing_device", "data_of", "mark_step", "materialize", "sync_nodes",
           "sync_tensors", "wait_device_ops"]


class ImplicitSyncError(RuntimeError):
    """Raised in strict mode (lazy.config.strict) by any sync other than mark_step."""


# Functions called with (linearized graph, cache hit) after a graph is looked up and before it runs, installed by
# the layers above (Note [Layers] in lazy/device/tensor.py): lazy.distributed checks there that every rank runs
# the same collectives (Note [Collective sequences agree] in lazy/distributed/check.py).
BEFORE_RUN: List[Callable[[Any, bool], None]] = []


def sync_nodes(roots: Sequence[Node], storages: Iterable[Storage], cause: str,
               walked: Optional[Linearized] = None) -> List[torch.Tensor]:
    """Compute ``roots`` and the values of ``storages`` in one graph; every live storage whose value the graph
    computes gets it as data. Returns the data of ``roots``. ``walked``: the graph of a mark_step's ``storages``,
    linearized already (by ``_short_sync``)."""
    if record.CAPTURE is not None:
        record.CAPTURE.on_sync(cause)
    if launch.watching():  # Note [Runs that overlap nothing] (sync/launch.py)
        launch.settle_watch()
    where = user_frame()
    if config.strict and cause != "mark_step":
        raise ImplicitSyncError(f"lazy strict mode: implicit sync ({cause}) at {where}; call lazy.mark_step() or "
                                "move the value to the cpu explicitly outside the step")
    metrics.bump(f"sync.{cause}")
    pending = [st for st in storages if st.value.op is not DATA]
    checks = record.take_checks() if record.PENDING_CHECKS else []  # Note [Checks run at the next sync]
    if not pending and not checks and all(r.op is DATA for r in roots):
        SYNC_LOG.append(SyncRecord(cause, where, 0, None))
        return [launch.ready(r.data) for r in roots]
    lin = walked if walked is not None else linearize(list(roots) + [st.value for st in pending] + checks)
    first_pending = len(pending)  # outputs: roots, these storages, the checks, then the storages added below
    if cause != "mark_step":  # every pending storage at a mark_step is among ``storages`` already
        chosen = set(map(id, pending))
        others = [st for st in pending_storages() if id(st) not in chosen]
    else:
        others = ()
    if others:
        computed = [st for st in others if id(st.value) in lin.positions]
        pending.extend(computed)
        lin.add_outputs([lin.positions[id(st.value)] for st in computed])
    device = backing_device()
    if lin.leaves and not _on(lin.leaves[0].device, device):
        device = _device_of_leaves(lin.leaves)
    program, hit = graph_cache.lookup(lin, device)
    try:
        for hook in BEFORE_RUN:
            hook(lin, hit)
    except Exception:
        for st in pending:
            st.failed = st.value
        raise
    held = getattr(program, "__dict__", None)
    if held is not None:  # the hooks have seen its graph (Note [The short path of a cached sync])
        held[_SHORT] = True
    # Note [Asynchronous execution] (sync/launch.py): a sync that returns no data launches and returns, if its
    # program's last run overlapped recording; on the budget then, launched or not (Note [Runs that overlap nothing])
    asynchronous = launch.enabled(device)
    overlaps = asynchronous and not roots and launch.overlaps(program)
    strides = launch.layout_known(program) if overlaps else None
    if strides is not None and record.CAPTURE is None and not checks:
        launch.check_leaves(lin.leaves)
        try:
            outs = launch.launch(program, lin.leaves, lin.scalars, [st.value for st in pending], strides,
                                 [(st, st.value) for st in pending], where, device, launch.budget())
        except Exception:
            for st in pending:  # as below: the graph's values stay IR, later mark_steps skip them
                st.failed = st.value
            raise
    else:
        outs, seconds = _run_here(program, lin, pending, overlaps, asynchronous)
        metrics.bump("run_time_s", seconds)
    if checks:  # the checks' outputs (markers) sit between the storages asked for and those added
        at = len(roots) + first_pending
        outs = outs[:at] + outs[at + len(checks):]
    if pending:  # each storage gets a data leaf of its value (Note [Data leaves from templates])
        templates = _leaf_templates(program, len(pending))
        _C.bind_outputs(pending, outs if type(outs) is list else list(outs), len(roots), templates)
    if not roots and asynchronous:
        launch.watch(program, outs)
    SYNC_LOG.append(SyncRecord(cause, where, len(lin.order), hit, "" if hit else explain_miss(lin, where)))
    if config.debug >= 1:
        log(1, f"sync ({cause}) at {where}: {len(lin.order)} nodes, {'cache hit' if hit else 'compiled'}")
    return outs[:len(roots)]


def _run_here(program: Any, lin: Linearized, pending: List[Storage], overlaps: bool, asynchronous: bool) -> tuple:
    """(outputs, seconds) of ``program``'s run on the calling thread (on the budget where it ``overlaps``)."""
    launch.ready_all(lin.leaves)
    start = time.perf_counter()
    try:
        outs = launch.run_in_place(program, lin.leaves, lin.scalars, overlaps)
    except Exception:
        # Eager would have raised at the op; here the graph raised. Its values stay IR (using them raises
        # again), but later mark_steps skip them, so one failed graph does not make every later step fail.
        for st in pending:
            st.failed = st.value
        raise
    seconds = time.perf_counter() - start
    if asynchronous:  # what launches need to know (Note [Programs too short to launch])
        launch.remember_layout(program, outs, lin.order, seconds)
    return outs, seconds


def _leaf_templates(program: Any, n: int) -> Any:
    """The templates of the data leaves a sync running ``program`` binds to its ``n`` storages (Note [Data leaves
    from templates] in csrc/leaf_templates.cpp): a program's outputs keep their layouts from run to run."""
    held = getattr(program, "__dict__", None)
    if held is None:
        return None
    templates = held.get("_leaf_templates")
    if templates is None or templates[0] < n:
        templates = held["_leaf_templates"] = (n, _C.leaf_templates(n))
    return templates[1]


def data_of(t: LazyTensor, cause: str) -> torch.Tensor:
    """The value of ``t`` as a tensor on the backing device (logical contents; layout not guaranteed)."""
    st = t._lz_st
    if record.CAPTURE is not None:
        record.CAPTURE.on_sync(cause)
    if st.value.op is DATA:
        # Already computed: a view of it is read by running its view ops (no graph, nothing to cache).
        if record.PENDING_CHECKS:  # but checks recorded since run first (Note [Checks run at the next sync])
            sync_nodes((), (), "check")
        data = _count(st.value, cause)
        for step in t._lz_chain or ():
            data = run_node(step.op, step.args, step.kwargs, (data,), (), data.device)
        return data
    if t._lz_chain is None:
        return sync_nodes((st.value,), (st,), cause)[0]
    return sync_nodes((value(t),), (st,), cause)[0]


def _count(node: Node, cause: str) -> torch.Tensor:
    metrics.bump(f"sync.{cause}")
    return launch.ready(node.data)


def materialize(t: LazyTensor, cause: str) -> torch.Tensor:
    """``t`` as a new CPU tensor with ``t``'s strides (what ``.cpu()`` returns)."""
    data = data_of(t, cause)
    shape, stride, _, dtype = t._lz_desc
    # eager's .cpu() layout: the same strides when dense, else empty_like's preserve_format choice (contiguous or
    # channels-last). NOTE: not empty_like of a meta tensor: its Python reference imports sympy (~0.6 s) once.
    if non_overlapping_and_dense(shape, stride):
        out = torch.empty_strided(shape, stride, dtype=dtype)
    else:
        out = torch.empty_like(torch.empty_strided(shape, stride, dtype=dtype))
    out.copy_(data)
    metrics.bump("bytes_from_device", out.numel() * out.element_size())
    return out


def mark_step() -> None:
    """End of a step: compute every live lazy tensor with pending IR in one graph and replace its IR by data,
    so the next step starts from data and the graph does not grow from step to step."""
    capture = record.CAPTURE
    if capture is not None:
        capture.on_sync("mark_step")
    pending = pending_storages()
    if not pending and not record.PENDING_CHECKS:
        metrics.bump_many(("mark_step", 1), ("sync.mark_step", 1))
        SYNC_LOG.append(SyncRecord("mark_step", user_frame(), 0, None))
        return
    lin = None
    if capture is None and not record.PENDING_CHECKS:
        if launch.watching():  # as sync_nodes does first (Note [Runs that overlap nothing] in sync/launch.py)
            launch.settle_watch()
        lin = linearize([st.value for st in pending])
        if _short_sync(pending, lin):
            return
    metrics.bump("mark_step")
    sync_nodes((), pending, "mark_step", lin)


# Note [The short path of a cached sync]
# A training loop's mark_step finds its graph compiled, and then the sync is a walk of the graph, a lookup, the
# program's run and the binding of its outputs to the storages, all in C but the lookup. The general path's
# Python around them (capture, checks, strict mode, the storages a sync of one tensor adds, the hooks of the layers
# above, asynchronous launches, the sync log) cost ~6 us more for the 200-op chain on an AMD EPYC core, ~25 % of the
# sync, and several times that on the slower cores of GPU hosts, where it came before the kernel's launch. So a
# mark_step takes a short path where none of that has anything to do: no capture, no pending checks, a program
# compiled and not warming (Note [Tiered compilation]), whose graph the hooks of BEFORE_RUN have seen once (a
# collective sequence is checked at a graph's first run: Note [Collective sequences agree]) and which runs in place
# (on the cpu, a program that launches goes to the general path: Note [Asynchronous execution]). Its metrics,
# its sync log line and the user's line are taken after the run: on cuda they overlap the kernels.
_SHORT = "_lazy_short_sync"  # set in a program's __dict__ once the hooks have seen its graph


def _short_sync(pending: List[Storage], lin: Linearized) -> bool:
    """Note [The short path of a cached sync]: run a mark_step of ``pending`` (graph ``lin``) and return True, or
    return False, having done nothing, where the general path must run it."""
    device = backing_device()
    leaves = lin.leaves
    if leaves and not _on(leaves[0].device, device):
        return False
    program = graph_cache.compiled(lin.key, device)
    held = getattr(program, "__dict__", None)
    if held is None or _SHORT not in held:
        return False
    asynchronous = launch.enabled(device)
    overlaps = asynchronous and launch.overlaps(program)
    if overlaps and launch.layout_known(program) is not None:
        return False  # it launches
    outs, seconds = _run_here(program, lin, pending, overlaps, asynchronous)
    _C.bind_outputs(pending, outs if type(outs) is list else list(outs), 0, _leaf_templates(program, len(pending)))
    if asynchronous:
        launch.watch(program, outs)
    metrics.bump_many(("mark_step", 1), ("sync.mark_step", 1), ("graph_cache.hit", 1), ("run_time_s", seconds))
    where = user_frame()
    SYNC_LOG.append(SyncRecord("mark_step", where, len(lin.order), True))
    if config.debug >= 1:
        log(1, f"sync (mark_step) at {where}: {len(lin.order)} nodes, cache hit")
    return True


def _on(leaf: torch.device, device: torch.device) -> bool:
    """Whether a graph whose first leaf is on ``leaf`` runs on ``device`` (Note [A graph runs where its data is]):
    'cuda' holds cuda:0's data."""
    return leaf == device or (leaf.type == device.type and device.index is None)


# Note [A graph runs where its data is]
# ``lazy.config.backing_device`` names where new data goes; a graph recorded before the knob changed (a test's
# override, a notebook that switches devices) still reads data on the old device. It runs there, with that
# device's compiler: the knob chosen blindly sent cpu pointers to a Triton kernel. Only the first leaf is compared
# on the hot path. When it is elsewhere, a graph whose leaves disagree raises here; when a later leaf is, the
# kernel or ATen call that reads it raises (ATen's "Expected all tensors to be on the same device").
def _device_of_leaves(leaves: Sequence[torch.Tensor]) -> torch.device:
    devices = {t.device for t in leaves}
    if len(devices) > 1:
        raise RuntimeError(f"lazy: one graph reads data on {sorted(map(str, devices))}: lazy tensors synced under "
                           "different lazy.config.backing_device settings were combined; move them to one device "
                           "first (.cpu() then .to('lazy'))")
    return devices.pop()


def wait_device_ops() -> None:
    """Block until every launched graph has finished (Note [Asynchronous execution]); on cuda, until the device
    has run what they enqueued. Raises the error of a launched graph that failed."""
    launch.wait_all()
    device = backing_device()
    if device.type == "cuda":
        # NOTE: torch.cuda.synchronize(device) enters and leaves the device's context, a few us of Python on the
        # hot path of a loop that waits at each step; 'cuda' is the current device
        if device.index is None or device.index == torch.cuda.current_device():
            torch.cuda.synchronize()
        else:
            torch.cuda.synchronize(device)


def sync_tensors(tensors: Sequence[Any], cause: str) -> None:
    """Compute the given lazy tensors (and whatever live values their graph computes) in one graph."""
    storages = {id(t._lz_st): t._lz_st for t in tensors if isinstance(t, LazyTensor)}
    sync_nodes((), list(storages.values()), cause)


# Note [Layers] (lazy/device/tensor.py): what the layers below call when they need data.
from . import eager, tensor_methods  # noqa: E402 -- both use the functions above

record.install_sync(materialize, data_of, eager.eager_fallback)
tensor_methods.install()
