"""What a box's metadata can be while a compiled function is captured (lazy/capture/policy.py): objects the call
created (``New``), methods bound to a box (``Bound``), iterators the policy steps itself (``BoxIter``); and the
kinds of values the policy tells apart."""
from __future__ import annotations

import collections
import sys
import types
from typing import Any, Dict

import torch

from ..device.tensor import LazyTensor
from .interpreter import Box

NUMBERS = (bool, int, float)
# what arithmetic keeps an expression of: numbers, and a capture's symbolic sizes (Note [Dynamic captures])
SIZES = frozenset(NUMBERS) | {torch.SymInt, torch.SymFloat}
CONSTANT_TYPES = (str, bytes, type(None), type(Ellipsis), torch.dtype, torch.device, torch.layout,
                  torch.memory_format, types.CodeType)


class New:
    """Metadata of an object the call created: ``items`` shadows a list/tuple's elements (boxes), a dict's
    ``{key: box}``, a cell's contents; ``attrs`` an object's stored attributes."""

    __slots__ = ("kind", "items", "attrs")

    def __init__(self, kind: str, items: Any = None) -> None:
        self.kind = kind
        self.items = items
        self.attrs: Dict[str, Box] = {}

    def __repr__(self) -> str:
        return f"New({self.kind})"


class Bound:
    __slots__ = ("recv", "name")

    def __init__(self, recv: Box, name: str) -> None:
        self.recv, self.name = recv, name


class BoxIter:
    """Metadata of an iterator the policy steps itself: a Python iterator of boxes."""

    __slots__ = ("it",)

    def __init__(self, it: Any) -> None:
        self.it = it


# Note [Dicts of a subclass the call creates]
# A dict the call creates is shadowed item by item (New("dict")), so that what it stores reads back as the boxes
# stored. An instance of a dict subclass (an OrderedDict, transformers' ModelOutput) is shadowed so too when its
# class leaves iteration, length, membership and the views to dict's C methods, which read the shadow; its Python
# __getitem__/__setitem__/__delitem__ are interpreted (policy.py), and the base class's methods they reach through
# super() run natively with the shadow kept in step (lookaside.py's call_method). Any other subclass stays an
# opaque New("object"), whose item stores break.
_SHADOW_BYPASSES = ("__iter__", "__len__", "__bool__", "__reversed__", "keys", "values", "items")
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


def shadowable_dict(v: Any) -> bool:
    """Whether ``v`` (made by the call, still empty) can be shadowed as a dict (Note [Dicts of a subclass the call
    creates]): a dict, an OrderedDict, or a Python subclass of either that overrides none of what the shadow
    answers in their place (iteration, length, truth, the views) and has no ``__missing__`` (a defaultdict's read
    of a missing key stores)."""
    if not isinstance(v, dict) or len(v) or hasattr(type(v), "__missing__"):
        return False
    for c in type(v).__mro__:
        if c is dict:
            return True
        if c is collections.OrderedDict:
            continue
        if not c.__flags__ & _HEAPTYPE or any(name in c.__dict__ for name in _SHADOW_BYPASSES):
            return False
    return False


def python_method(kind: type, name: str) -> Any:
    """``kind``'s attribute ``name`` where it is a Python function (a method the capture interprets), else None."""
    f = getattr(kind, name, None)
    return f if type(f) is types.FunctionType else None


def is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def is_lazy(v: Any) -> bool:
    return isinstance(v, LazyTensor)


LIBRARY_ROOTS = tuple(p for p in {
    torch.__file__.rsplit("/", 1)[0] + "/",
    __file__.rsplit("/", 2)[0] + "/",
    sys.prefix + "/lib/", sys.base_prefix + "/lib/",
} if p)


def library_code(filename: str) -> bool:
    """Whether code in ``filename`` is torch's, lazy's or the standard library's (not the user's)."""
    # NOTE: "<string>"-like names are generated code (dataclasses' __init__, namedtuples), made by libraries
    return filename.startswith(LIBRARY_ROOTS) or filename.startswith("<")
