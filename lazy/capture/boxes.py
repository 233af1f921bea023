"""What a box's metadata can be while a compiled function is captured (lazy/capture/policy.py): objects the call
created (``New``), methods bound to a box (``Bound``), iterators the policy steps itself (``BoxIter``); and the
kinds of values the policy tells apart."""
from __future__ import annotations

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
