"""Counters and timings of everything lazy does: traced ops, syncs by cause, cache hits, compiles, fallbacks.

The recorder's hot path (csrc/record.cpp) counts traced ops in C; everything else goes through ``bump``.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

from .. import _C

# Programs launched asynchronously bump counters from the worker thread: each update is _C.add_counts, one step
# under the GIL (no lock); reads copy the dict in one step too.
_counts: Dict[str, float] = {}
_add = _C.add_counts
SETTLE: Optional[Callable[[], None]] = None  # installed by the sync layer: waits for launched programs


def bump(name: str, amount: float = 1) -> None:
    _add(_counts, (name, amount))


def bump_many(*pairs: tuple) -> None:
    """``bump`` of several (name, amount) pairs in one call (a program's run counts four things)."""
    _add(_counts, *pairs)


def counters() -> Dict[str, float]:
    """A snapshot of every counter: ``traced_ops``, ``sync.<cause>``, ``graph_cache.hit``/``miss``, ``compiles``,
    ``compile_time_s``, ``executed_graphs``, ``executed_nodes``, ``fallback.<op>``, ``bytes_to_device``,
    ``bytes_from_device``, ... Counters never bumped are absent (read them with ``.get(name, 0)``)."""
    items = list(_counts.items())
    snap = {k: (int(v) if float(v).is_integer() else v) for k, v in items if v}
    traced_ops = _C.traced_ops()
    if traced_ops:
        snap["traced_ops"] = traced_ops
    reused = _C.reused_grads()  # counted in C (Note [Reused gradient wrappers] in csrc/replay_io.cpp)
    if reused:
        snap["capture.reused_grads"] = reused
    return dict(sorted(snap.items()))


def counter(name: str) -> float:
    """The value of one counter, 0 if never bumped."""
    return counters().get(name, 0)


def cache_summary() -> str:
    """One line for progress output: ``graph cache hit rate 99.0% (2 compiles)``."""
    hits, misses = _counts.get("graph_cache.hit", 0), _counts.get("graph_cache.miss", 0)
    return f"graph cache hit rate {hits / max(hits + misses, 1):.1%} ({int(misses)} compiles)"


def reset() -> None:
    """Zero every counter, once every launched program has finished (their counts belong before the reset)."""
    if SETTLE is not None:
        SETTLE()
    _counts.clear()
    _C.reset_counters()


def report() -> str:
    """The counters as readable text, grouped by prefix."""
    snap = counters()
    if not snap:
        return "lazy metrics: nothing recorded yet"
    width = max(len(k) for k in snap)
    lines = ["lazy metrics:"]
    for key, value in snap.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        lines.append(f"  {key.ljust(width)}  {shown}")
    return "\n".join(lines)
