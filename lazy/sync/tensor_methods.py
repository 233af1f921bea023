"""The LazyTensor methods that sync, bound to the class by the sync layer (Note [Layers] in lazy/device/tensor.py).

Each reads data, so each is a sync point with a named cause (``lazy.explain()`` lists them): ``print``/``repr``,
``bool()``/``if t:``, ``.item()`` (and ``float()``, ``int()``, formatting), ``.tolist()``, ``__index__``, and
pickling (``torch.save``), which stores a lazy tensor as a plain CPU tensor that loads without lazy.
"""
from __future__ import annotations

from typing import Any

import torch

from ..device.tensor import LazyTensor
from . import materialize


def _repr(self: LazyTensor, *, tensor_contents: Any = None) -> str:
    cpu = materialize(self, "print")
    contents = torch._tensor_str._tensor_str(cpu.detach(), len("tensor("))
    text = torch._tensor_str._str(self, tensor_contents=contents)
    text = "tensor(" + text[len(type(self).__name__) + 1:] if text.startswith(type(self).__name__) else text
    return "Parameter containing:\n" + text if getattr(self, "_is_param", False) else text


def _bool(self: LazyTensor) -> bool:
    return bool(materialize(self, "bool"))


def _item(self: LazyTensor) -> Any:
    return materialize(self, "item").item()


def _tolist(self: LazyTensor) -> Any:
    return materialize(self, "tolist").tolist()


def _index(self: LazyTensor) -> int:
    return materialize(self, "item").__index__()


def _reduce_ex(self: LazyTensor, protocol: int) -> Any:
    # torch.save / pickle store lazy tensors as plain CPU tensors, loadable without importing lazy.
    cpu = materialize(self, "save").detach()
    cpu.requires_grad_(self.requires_grad)
    if getattr(self, "_is_param", False):
        cpu = torch.nn.Parameter(cpu, requires_grad=self.requires_grad)
    return cpu.__reduce_ex__(protocol)


METHODS = {"__repr__": _repr, "__bool__": _bool, "item": _item, "tolist": _tolist, "__index__": _index,
           "__reduce_ex__": _reduce_ex}


def install() -> None:
    for name, fn in METHODS.items():
        setattr(LazyTensor, name, fn)
