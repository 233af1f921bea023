"""``LAZY_CAPTURE_VERIFY=1``: every replay is checked against a plain run of the same call.

Note [Verified replays]
With ``lazy.config.capture_verify`` a call that hits an entry runs twice: first the replay, whose outputs and
effects are observed and then undone, then the function itself, plainly (recorded and synced as any lazy code). The
outputs and everything the replay writes must agree, or ``CaptureMismatch`` names the first difference; the plain
run's state is the one that stays. What the replay writes is known from the entry (its targets are expressions over
the call's arguments): the storages it updates, the Python objects its effects store into, the host tensors its host
ops update, and the generators its random ops draw from; those are what is saved before and restored after. The
tests run with it; users debug a suspicious replay with it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..config import config
from ..device.tensor import live_storages
from ..sync import mark_step
from .expr import E, Renderer, compile_function


class CaptureMismatch(AssertionError):
    """A replay disagreed with a plain run of the same call (LAZY_CAPTURE_VERIFY)."""


_MISSING = object()


def _targets(entry: Any) -> Any:
    """A function of the arguments returning what the replay writes: effect targets, storages' tensors, host
    tensors (rendered once per entry)."""
    fn = getattr(entry, "_verify_targets", None)
    if fn is None:
        r = Renderer()
        effects = "(" + "".join(f"({r.expr(e.target)}, {r.expr(e.key) if type(e.key) is E else r.const(e.key)}), "
                                for e in entry.effects) + ")"
        tensors = "(" + "".join(f"{r.expr(e)}, " for e in entry.storage_exprs) + ")"
        hosts = "(" + "".join(f"{r.expr(e)}, " for e in entry.host_tensor_exprs) + ")"
        fn = compile_function("targets", "A", [f"return {effects}, {tensors}, {hosts}"], r.consts)
        entry._verify_targets = fn
    return fn


def _read_effect(kind: str, target: Any, key: Any) -> Any:
    try:
        if kind in ("setattr", "delattr"):
            return getattr(target, key)
        if kind in ("setitem", "delitem"):
            return target[key]
        if kind == "cell_set":
            return target.cell_contents
        if kind == "list_method":
            return list(target)
    except (AttributeError, KeyError, IndexError, ValueError):
        return _MISSING
    return _MISSING


def _write_effect(kind: str, target: Any, key: Any, value: Any) -> None:
    if kind in ("setattr", "delattr"):
        if value is _MISSING:
            if hasattr(target, key):
                object.__delattr__(target, key)
        else:
            object.__setattr__(target, key, value)
    elif kind in ("setitem", "delitem"):
        if value is _MISSING:
            target.pop(key, None)
        else:
            target[key] = value
    elif kind == "cell_set":
        if value is _MISSING:
            try:
                del target.cell_contents
            except ValueError:
                pass
        else:
            target.cell_contents = value
    elif kind == "list_method":
        target[:] = value


class _Snapshot:
    """What a replay or a plain run may change, saved so that it can be put back."""

    def __init__(self, entry: Any, A: tuple) -> None:
        self.entry = entry
        effects, self.tensors, self.hosts = _targets(entry)(A)
        self.effects = [(e.kind, t, k, _read_effect(e.kind, t, k)) for e, (t, k) in zip(entry.effects, effects)]
        self.storages = [(st, st.value, st.version) for st in live_storages()]
        self.hosts = [h if isinstance(h, torch.Tensor) else None for h in self.hosts]
        self.host_data = [h.detach().clone() if h is not None else None for h in self.hosts]
        self.generators = [torch.default_generator] + [g for g in entry.generators if g is not None]
        self.rng = [g.get_state() for g in self.generators]

    def restore(self) -> None:
        for kind, target, key, value in reversed(self.effects):
            _write_effect(kind, target, key, value)
        for st, value, version in self.storages:
            st.value = value
            st.version = max(st.version, version) + 1  # a version no view has cached a value for
        for h, data in zip(self.hosts, self.host_data):
            if h is not None:
                with torch.no_grad():
                    h.copy_(data)
        for g, state in zip(self.generators, self.rng):
            g.set_state(state)

    def observe(self, result: Any) -> Dict[str, Any]:
        """The outputs and what the call wrote, as cpu values."""
        # on all of the calling thread's threads, as the replay ran (Note [Thread budget of the worker])
        with config.override(async_execution=False):
            mark_step()
        seen: Dict[str, Any] = {"result": _cpu(result)}
        for i, t in enumerate(self.tensors):
            seen[f"tensor {i} ({self.entry.storage_exprs[i]!r})"] = _cpu(t)
        for (kind, target, key, _), e in zip(self.effects, self.entry.effects):
            seen[f"{kind} {e.target!r} [{key!r}]"] = _cpu(_read_effect(kind, target, key))
        for i, h in enumerate(self.hosts):
            if h is not None:
                seen[f"host tensor {self.entry.host_tensor_exprs[i]!r}"] = h.detach().clone()
        seen["rng"] = [g.get_state() for g in self.generators]
        return seen


def _cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu(x) for x in v) if not hasattr(v, "_fields") else tuple(_cpu(x) for x in v)
    if isinstance(v, dict):
        return {k: _cpu(x) for k, x in v.items()}
    return v


def _compare(got: Any, want: Any, where: str) -> Optional[str]:
    if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor):
        if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
            return f"{where}: {type(got).__name__} against {type(want).__name__}"
        try:
            torch.testing.assert_close(got, want, equal_nan=True)
        except AssertionError as e:
            return f"{where}: {str(e).splitlines()[0]}"
        return None
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want)):
            diff = _compare(g, w, f"{where}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        for k in want:
            diff = _compare(got[k], want[k], f"{where}[{k!r}]")
            if diff:
                return diff
        return None
    if got is want or got == want:
        return None
    return f"{where}: {got!r} against {want!r}"


def verified_replay(cf: Any, entry: Any, A: tuple, replay: Any, missed: Any) -> Any:
    """The replay, then a plain run of the same call from the same state; returns the plain run's result, or
    ``missed`` where the replay returned it (a check at replay failed, before it changed anything)."""
    snapshot = _Snapshot(entry, A)
    out = replay()
    if out is missed:
        return missed
    got = snapshot.observe(out)
    snapshot.restore()
    result = cf.run_plainly(A)
    want = snapshot.observe(result)
    for key in want:
        diff = _compare(got.get(key), want[key], key)
        if diff:
            raise CaptureMismatch(f"lazy.compile: the replay of {cf!r} differs from a plain run: {diff}")
    return result


_ = (List, Tuple)
