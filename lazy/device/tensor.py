"""The lazy tensor: a wrapper subclass on PyTorch's own ``lazy`` device that holds IR, not data.

Note [Storages and views]
Eager tensors alias through storages; lazy tensors do too, functionally. A ``Storage`` holds the current IR
value of its *base* (the tensor that created it) and a version. A view holds the same Storage plus the chain of
view steps from the base to itself, and caches its value per storage version. An in-place update of any
tensor computes its new value functionally, then writes it back: on a base it replaces the storage value; on
a view it is scattered into the base through the chain (each step's reverse, or one layout-aware
``as_strided_scatter`` when a step has none). The version bump makes every other view of the storage
re-derive its value, which is how a view and its base see each other's updates. The IR stays a pure
dataflow graph (Note [IR values are logical]).

Note [Layers]
lazy is layered, each layer importing only those below it (tests/test_layers.py checks every import, also those
inside functions): the device (this package: the tensor, its storages, the backing device) at the ground floor;
recording (lazy/trace) and the compiler stack (lazy/lower, schedule, codegen, runtime, cache) above it, neither
importing the other; the sync layer (lazy/sync) above both; capture, compatibility and distribution above all.
Where a lower layer needs behaviour of a higher one, the higher one installs it when imported: lazy/sync binds
the LazyTensor methods that sync (``item``, ``__repr__``, ...) and gives the recorder the functions it calls when an
op needs data now (``install_sync`` in lazy/trace/record.py); lazy/trace binds the methods that record without the
dispatcher (``x + y``, ``x.sin()``, ``x.cpu()``).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .. import _C
from ..ir.node import Node

LAZY_DEVICE = torch.device("lazy", 0)

# (shape, stride, storage_offset, dtype): everything the shape memo needs to know about a tensor argument.
Desc = Tuple[tuple, tuple, int, torch.dtype]


# The functional stand-in for a storage: the current value of its base tensor (Note [Storages and views]).
# ``Storage(value, shape, stride, numel)`` has the fields value, version, shape, stride, numel, serial (creation
# order: mark_step orders its outputs by it, for a stable graph key) and failed (a value whose graph raised: later
# mark_steps leave it alone). It is a C type (csrc/ir.cpp) that keeps every live storage in a registry, so
# mark_step finds what to sync without tracking tensors (swap_tensors, behind Module.to, refuses tensors that have
# weak references).
Storage = _C.Storage


class LazyTensor(torch.Tensor):
    """A tensor on the ``lazy`` device. Ops on it are recorded (trace/record.py), never run, until a sync."""

    # Skip the Python-level __torch_function__ of torch.Tensor: ops go straight to __torch_dispatch__.
    __torch_function__ = torch._C._disabled_torch_function_impl

    _lz_st: Storage
    _lz_desc: Desc
    # A base tensor has no view chain and no cached value: class-level defaults, so creating one stores two
    # attributes, not four.
    _lz_chain: Optional[tuple] = None
    _lz_cache: Optional[Tuple[int, Node]] = None

    # The recorder's entry: csrc/record.cpp records the common calls itself and hands the rest to
    # trace/dispatch.py's dispatch_slow (which configures it when imported).
    __torch_dispatch__ = classmethod(_C.torch_dispatch)

    # Traceable-subclass protocol: makes Module._apply swap parameters in place (torch.utils.swap_tensors),
    # which keeps parameter identity and weight tying across model.to("lazy").
    def __tensor_flatten__(self) -> Tuple[list, Any]:
        return [], None

    @staticmethod
    def __tensor_unflatten__(inner: Any, ctx: Any, outer_size: Any, outer_stride: Any) -> "LazyTensor":
        raise RuntimeError("lazy tensors cannot be rebuilt from flattened parts (torch.compile over lazy "
                           "tensors is not supported; use @lazy.compile)")

    # Methods that sync (``item``, ``tolist``, ``__bool__``, ``__repr__``, ``__reduce_ex__``, ...) and ``cpu`` are
    # bound by the layers above (Note [Layers]); the ones here only call them.
    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError("can't convert lazy:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    def __deepcopy__(self, memo: dict) -> "LazyTensor":
        # torch's Tensor.__deepcopy__ would deep-copy lazy's storage bookkeeping out of __dict__: a recorded clone
        # is the copy; the user's own attributes (and _is_param, which makes it a Parameter) are deep-copied.
        if id(self) in memo:
            return memo[id(self)]
        import copy
        with torch.no_grad():
            new = self.clone(memory_format=torch.preserve_format)
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if not name.startswith("_lz_"):
                setattr(new, name, copy.deepcopy(value, memo))
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        return new

    @property
    def data(self) -> "LazyTensor":
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        if not isinstance(new, LazyTensor):
            raise RuntimeError(f"lazy: cannot assign a {new.device} tensor to .data of a lazy tensor; move it "
                               "with .to('lazy') first")
        torch._C.TensorBase.data.__set__(self, new)
        adopt(self, new)


_make = torch.Tensor._make_wrapper_subclass


def wrap(desc: Desc, storage: Storage, chain: Optional[tuple] = None, cache: Optional[Tuple[int, Node]] = None
         ) -> LazyTensor:
    """A new LazyTensor with metadata ``desc`` over ``storage`` (a view when ``chain`` is given)."""
    shape, stride, offset, dtype = desc
    t = _make(LazyTensor, shape, stride, offset, None, dtype, torch.strided, LAZY_DEVICE)
    t._lz_desc = desc
    t._lz_st = storage
    if chain is not None:
        t._lz_chain = chain
        t._lz_cache = cache
    return t


def new_tensor(desc: Desc, value: Node, numel: int) -> LazyTensor:
    """A new base tensor (owning a new storage) whose value is ``value``."""
    return wrap(desc, Storage(value, desc[0], desc[1], numel))


def adopt(dst: LazyTensor, src: LazyTensor) -> None:
    """Make ``dst`` (whose TensorImpl metadata already equals ``src``'s) alias ``src``'s storage."""
    dst._lz_desc = src._lz_desc
    dst._lz_st = src._lz_st
    dst._lz_chain = src._lz_chain
    dst._lz_cache = src._lz_cache


def live_storages() -> list:
    """Every live storage, oldest first."""
    return _C.live_storages()


def pending_storages() -> list:
    """Live storages whose value is still IR (and not a value whose graph already failed), oldest first."""
    return _C.pending_storages()
