"""Every rank must run the same collectives: checked once per new graph, before its first collective runs.

Note [Collective sequences agree]
A rank whose graph holds other collectives than its peers' (another shape, another reduction, one more or one
less) would pair wrong tensors or wait until the process group's timeout. So the first time a process runs a graph
(by its key) that holds collectives, it exchanges a digest of the graph's collective sequence with the other
ranks of each group involved, before anything of the graph runs; on a mismatch every rank raises
``CollectiveMismatch`` naming the sequences and the ranks that recorded each. Graphs seen before are not
checked again: their sequences were already found equal, so a step served from the graph cache costs no extra
collective. The check assumes every rank cuts its graphs at the same sync points; a rank that reads a value that
depends on a collective (``.item()``) where the others do not has a graph of other collectives, and the check
reports it (read it on every rank, or after ``lazy.mark_step()``).
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any, Dict, List, Tuple

import torch

from ..debug import metrics
from ..device.backing import backing_device, eager_dispatch
from ..sync import launch
from . import collectives as C

# hash of a graph key -> the graph's collective sequence (empty for a graph without collectives). NOTE: the hash, not
# the key (tens of KB for a training step): the graph cache has already computed it, and bytes keep their hash. Two
# keys of one hash would only skip a check. Graphs without collectives are forgotten beyond _MAX_PLAIN (forgetting
# one costs a rescan, never an exchange).
_SEEN: Dict[int, Tuple[str, ...]] = {}
_MAX_PLAIN = 65536


class CollectiveMismatch(RuntimeError):
    """Ranks of one process group recorded different collectives for the same step."""


def before_run(lin: Any, hit: bool) -> None:
    """The sync layer's hook (lazy.sync.BEFORE_RUN): check a new graph's collectives against the other ranks'."""
    key = hash(lin.key)
    seq = _SEEN.get(key)
    if seq is not None:
        return
    nodes = [n for n in lin.order if n.op in C.OPS]
    seq = tuple(C.describe_node(n) for n in nodes)
    if not seq and len(_SEEN) >= _MAX_PLAIN:
        for key in [k for k, v in _SEEN.items() if not v]:
            del _SEEN[key]
    if seq:
        # the exchange is a collective of the calling thread: programs launched before must have run theirs
        launch.wait_all()
        groups: List[str] = []
        for n in nodes:
            group = dict(n.kwargs)["group"]
            if group not in groups:
                groups.append(group)
        for group in groups:
            mine = tuple(d for n, d in zip(nodes, seq) if dict(n.kwargs)["group"] == group)
            _agree(group, mine)
    _SEEN[key] = seq


def _agree(group: str, seq: Tuple[str, ...]) -> None:
    pg = C.resolve_group(group)
    n = pg.size()
    if n == 1:
        return
    text = "\n".join(seq).encode()
    digest = struct.unpack("<2q", hashlib.sha256(text).digest()[:16])
    device = backing_device()
    metrics.bump("distributed.sequence_checks")
    with eager_dispatch():
        mine = torch.tensor([digest[0], digest[1], len(text)], dtype=torch.int64, device=device)
        rows = _gather(pg, mine, group).view(n, 3).tolist()
        if all(r[:2] == rows[0][:2] for r in rows):
            return
        width = max(r[2] for r in rows)
        buf = torch.zeros(width, dtype=torch.uint8)
        buf[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else buf[:0]
        texts = _gather(pg, buf.to(device), group).view(n, width).cpu()
    by_seq: Dict[str, List[int]] = {}
    for rank, (row, data) in enumerate(zip(rows, texts)):
        by_seq.setdefault(bytes(data[:row[2]].tolist()).decode(), []).append(rank)
    listing = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: "
                        f"[{', '.join(s.splitlines()) or 'no collective'}]" for s, r in by_seq.items())
    raise CollectiveMismatch(
        f"lazy.distributed: the ranks of process group {group!r} recorded different collectives for one graph "
        f"(this is rank {pg.rank()}); {listing}. Every rank must record the same collectives in the same order "
        "(same model, same tensor shapes) and sync at the same points (read a value on every rank, or after "
        "lazy.mark_step()). Nothing of this graph ran.")


def _gather(pg: Any, x: torch.Tensor, group: str) -> torch.Tensor:
    out = x.new_empty((pg.size() * x.numel(),))
    C._wait(pg._allgather_base(out, x), "the check of the collective sequence", group)
    return out
