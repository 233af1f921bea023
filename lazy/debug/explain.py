"""``lazy.explain()``: why each sync, compile and recompile happened, and where in the user's code.

Every sync appends a ``SyncRecord``. A compile (cache miss) also records what changed against the previous
graph compiled at the same source line: the first node whose op, shape or dtype differs, or the node count.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir.graph import Linearized


@dataclass
class SyncRecord:
    cause: str  # mark_step, cpu, item, tolist, print, bool, data_dependent, fallback, save
    where: str  # the user's file:line (function)
    nodes: int  # nodes in the graph (0: nothing to compute)
    hit: Optional[bool]  # graph cache hit; None when nothing was compiled or run
    why: str = ""  # on a miss: what differs from the previous graph compiled at the same line


SYNC_LOG: "collections.deque[SyncRecord]" = collections.deque(maxlen=1000)
_LAST_AT: Dict[str, Tuple[Tuple[str, tuple, str], ...]] = {}


def _signature(lin: Linearized) -> Tuple[Tuple[str, tuple, str], ...]:
    return tuple((str(n.op), n.shape if n.shape is not None else (), str(n.dtype)) for n in lin.order)


def explain_miss(lin: Linearized, where: str) -> str:
    """What differs between this graph and the last one compiled at ``where`` (called on cache misses only)."""
    sig = _signature(lin)
    prev = _LAST_AT.get(where)
    _LAST_AT[where] = sig
    if prev is None:
        return "first compile at this line"
    for i, (a, b) in enumerate(zip(prev, sig)):
        if a != b:
            return f"node {i} changed: {_fmt(a)} -> {_fmt(b)}"
    if len(prev) != len(sig):
        return f"graph has {len(sig)} nodes (was {len(prev)})"
    return "same ops, shapes and dtypes: static arguments, scalar types, sharing or output set changed"


def _fmt(entry: Tuple[str, tuple, str]) -> str:
    op, shape, dtype = entry
    return f"{op} {dtype.replace('torch.', '')}{list(shape)}"


def explain(last: int = 50) -> str:
    """A report of the recent syncs: counts by cause and line, then the compiles with their reasons."""
    records: Sequence[SyncRecord] = list(SYNC_LOG)[-last:] if last else list(SYNC_LOG)
    if not records:
        return "lazy.explain: no syncs yet"
    by_site: Dict[Tuple[str, str], List[SyncRecord]] = collections.defaultdict(list)
    for r in records:
        by_site[(r.cause, r.where)].append(r)
    lines = [f"lazy.explain: last {len(records)} syncs"]
    for (cause, where), rs in sorted(by_site.items(), key=lambda kv: -len(kv[1])):
        misses = sum(1 for r in rs if r.hit is False)
        lines.append(f"  {len(rs):5d} x {cause:<14} at {where}  (graphs of {max(r.nodes for r in rs)} nodes, "
                     f"{misses} compiled)")
    compiles = [r for r in records if r.hit is False]
    if compiles:
        lines.append("compiles:")
        lines.extend(f"  {r.cause} at {r.where}: {r.why}" for r in compiles)
    return "\n".join(lines)
