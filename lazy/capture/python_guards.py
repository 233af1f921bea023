"""A capture's guards as Python (lazy/capture/replay.py's ``Entry``): the global state a recording depends on,
one guard as a Python expression, a list of them as one check function (the guards a guard program cannot express,
and the slow path that says which guard failed and why).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..config import config
from .expr import E, Renderer, compile_function
from .guards import tensor_signature


def global_state() -> tuple:
    """The global state a recording depends on: grad mode, inference mode, autocast, the default dtype, and the
    backing device of lazy. (A guard program reads the first two from c10 and calls STATE_CALLS for the others.)"""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), _autocast_enabled(), _autocast_dtype(),
            torch.get_default_dtype(), config.backing_device)


_autocast_enabled = functools.partial(torch.is_autocast_enabled, "cpu")
_autocast_dtype = functools.partial(torch.get_autocast_dtype, "cpu")
STATE_CALLS = (_autocast_enabled, _autocast_dtype, torch.get_default_dtype, lambda: config.backing_device)


def _keys_same(d: Any, keys: tuple) -> bool:
    k = tuple(d.keys())
    return len(k) == len(keys) and all(a is b or (type(a) is type(b) and a == b and not isinstance(a, torch.Tensor))
                                       for a, b in zip(k, keys))



_GUARD_HELPERS = dict(_global_state=global_state, _keys_same=_keys_same, _tensor_sig=tensor_signature)


def _python_check(r: Renderer, guards: list, state: Any) -> Callable[[tuple], bool]:
    """``check(A)``: the guards (and ``global_state() == state`` unless ``state`` is None) as one expression."""
    r.share([e for (kind, e), _ in guards])
    terms = [f"_global_state() == {r.const(state)}"] if state is not None else []
    for (kind, e), expected in guards:
        terms.append(_guard(r, kind, e, expected))
    body = ["try:"] + ["    " + line for line in r.preamble] + [
        "    return (" + "\n            and ".join(terms or ["True"]) + ")", "except Exception:", "    return False"]
    fn = compile_function("check", "A", body, r.consts)
    fn.__globals__.update(_GUARD_HELPERS)
    return fn


def _describe_now(text: str, A: tuple, consts: list) -> str:
    try:
        fn = compile_function("now", "A", [f"return {text}"] if text != "_global_state()" else
                              ["return _global_state()"], consts)
        fn.__globals__.update(_GUARD_HELPERS)
        value = fn(A)
        return repr(tensor_signature(value) if isinstance(value, torch.Tensor) else value)[:200]
    except Exception as e:  # noqa: BLE001 -- reporting only
        return f"unreadable ({type(e).__name__})"


def _guard(r: Renderer, kind: str, e: E, expected: Any) -> str:
    x = r.expr(e)
    if kind == "id":
        return f"{x} is {r.const(expected)}"
    if kind == "same":
        return f"{x} is {r.expr(expected)}"
    if kind == "type":
        return f"type({x}) is {r.const(expected)}"
    if kind == "eq":
        if isinstance(expected, torch.Tensor):
            return f"{x} is {r.const(expected)}"
        return f"(type({x}) is {r.const(type(expected))} and {x} == {r.const(expected)})"
    if kind == "truth":
        return f"bool({x}) is {expected}"
    if kind == "isnone":
        return f"({x} is None) is {expected}"
    if kind == "len":
        return f"len({x}) == {expected}"
    if kind == "keys":
        return f"_keys_same({x}, {r.const(expected)})"
    if kind == "tensor":
        return f"_tensor_sig({x}) == {r.const(expected)}"
    if kind == "absent":
        return f"{r.const(expected)} not in {x}"
    if kind == "noattr":
        return f"not hasattr({x}, {expected!r})"
    if kind == "hasattr":
        name, present = expected
        return f"hasattr({x}, {name!r}) is {present}"
    raise ValueError(f"lazy capture internal error: guard kind {kind}")
