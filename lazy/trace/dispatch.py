"""The recorder's entry points: which handler of trace/record.py records each overload (chosen once per overload,
registered with the C fast path where it can record the op itself), the fallback for ops no rule records, and the
LazyTensor methods that record without the dispatcher (Note [Methods without the dispatcher]). Importing this
module configures csrc/record.cpp."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional

import torch

from .. import _C
from ..config import config
from ..debug import metrics
from ..debug.log import log
from ..device.tensor import LAZY_DEVICE, LazyTensor
from ..ir.node import GETITEM, SCALAR_MARKERS, TENSOR
from . import views
from .meta import MEMO, Out, Unrecordable
from .record import (SYNC, data_dependent, record_check, record_copy, record_functional, record_index,
                     record_inplace, record_inplace_view, record_item, record_out, record_resize, record_set,
                     record_to_copy, record_view)
from .schema import describe

aten = torch.ops.aten
_value = views.value


_warned: set = set()


def _unrecordable(func: Any, error: Exception) -> None:
    metrics.bump(f"fallback.{func}")
    if config.warn_fallback and func not in _warned:
        _warned.add(func)
        warnings.warn(f"lazy: {func} cannot be recorded ({error}); it runs eagerly on the backing device after "
                      "syncing its inputs. This costs a sync each time: report it if it is on your hot path.",
                      stacklevel=4)


def _out_through_functional(functional: Any) -> Callable[..., Any]:
    """A kernel for an out= op: the functional op, then a copy into ``out`` (resized like eager's out=)."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out")
        with torch._C._AutoDispatchBelowAutograd():
            result = functional(*args, **kwargs)
            if out.shape != result.shape:
                out.resize_(result.shape)
            out.copy_(result)
        return out
    return kernel


# CompositeImplicit out= ops that skip writing ``out`` for any tensor subclass (PyTorch's matrix_rank_impl
# returns a new tensor when isTensorSubclassLike(input)): they get a kernel on the AutogradLazy key, which runs
# before the composite decomposes them, so lazy's out= is written as eager's is.
_SUBCLASS_SKIPS_OUT = (aten.linalg_matrix_rank.atol_rtol_tensor_out, aten.linalg_matrix_rank.atol_rtol_float_out)
_KERNELS = torch.library.Library("aten", "IMPL")
for _op in _SUBCLASS_SKIPS_OUT:
    _KERNELS.impl(_op, _out_through_functional(describe(_op).functional), "AutogradLazy")

_SPECIAL: Dict[Any, Callable[..., Any]] = {
    aten.copy_.default: record_copy,
    aten._to_copy.default: record_to_copy,
    aten._local_scalar_dense.default: record_item,
    aten.index.Tensor: record_index,
    aten.set_.source_Tensor: record_set,
    aten.set_.default: record_set,
    aten.resize_.default: record_resize,
    aten.resize_as_.default: record_resize,
    aten._linalg_check_errors.default: record_check,  # Note [Checks run at the next sync]
    aten._assert_async.default: record_check,
    aten._assert_async.msg: record_check,
}


def register_special(op: Any, handler: Callable[..., Any]) -> None:
    """Record ``op`` with ``handler(func, args, kwargs)`` instead of the rule its schema picks: how a layer above
    (lazy.distributed, for collectives) adds recording rules of its own (Note [Layers] in lazy/device/tensor.py).
    Must run before the op's first call: the C fast path never sees an op with a special handler."""
    _SPECIAL[op] = handler
    _HANDLERS.pop(id(op), None)


_BY_KIND = {"functional": record_functional, "view": record_view, "inplace": record_inplace, "out": record_out,
            "inplace_view": record_inplace_view}


def _choose(func: Any) -> Callable[..., Any]:
    special = _SPECIAL.get(func)
    if special is not None:
        return special
    if not isinstance(func, torch._ops.OpOverload):
        return lambda f, a, k: SYNC.eager_fallback(f, a, k, "fallback")
    desc = describe(func)
    if desc.data_dependent or desc.dynamic_shape:
        return data_dependent
    if desc.kind == "inplace_view" and (desc.functional is None or describe(desc.functional).kind != "view"):
        return _unrecordable_handler
    return _BY_KIND[desc.kind]


def _unrecordable_handler(func: Any, args: tuple, kwargs: dict) -> Any:
    raise Unrecordable("no recording rule for this op")


_HANDLERS: Dict[Any, Callable[..., Any]] = {}


def _handler(func: Any) -> Callable[..., Any]:
    handler = _HANDLERS[id(func)] = _choose(func)
    kind = _fast_kind(func, handler)
    if kind is not None:
        # From now on csrc/record.cpp records the calls of func whose metadata is memoized, exactly as the
        # handler would (same template, memo keys, signature, tensor attributes and storage updates).
        desc = describe(func)
        _C.register_op(func, desc, tuple(desc.kinds), dict(desc.kw_kinds), kind, desc.functional)
    return handler


def _fast_kind(func: Any, handler: Callable[..., Any]) -> Optional[int]:
    """0, 1, 2 if csrc/record.cpp can record ``func`` as record_functional, record_view, record_inplace; 3 for
    record_view of an alias op (Note [Aliases of a base are bases]); else None."""
    if handler is record_functional:
        return None if describe(func).random else 0
    if handler is record_view:
        return None if func is aten.as_strided.default else 3 if func in views.ALIASES else 1
    if handler is record_inplace:
        d = describe(func)
        simple = (d.functional is not None and d.mutated == [0] and not d.out_names and d.return_sources == (0,)
                  and d.pad_args is None and not d.random)
        return 2 if simple else None
    return None


def dispatch_slow(func: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``func`` (see module doc): what ``LazyTensor.__torch_dispatch__`` (csrc/record.cpp) does not record
    itself, which counted the op already."""
    # NOTE: keyed by id(func): OpOverloads live as long as the process and their __hash__ is a Python method.
    handler = _HANDLERS.get(id(func)) or _handler(func)
    if config.debug >= 4:
        log(4, f"trace {func}")
    try:
        return handler(func, args, kwargs)
    except Unrecordable as error:
        _unrecordable(func, error)
        return SYNC.eager_fallback(func, args, kwargs, "fallback")


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """The recorder's entry from the Lazy dispatch key (factories, ``x.to("lazy")``): count the op, record it."""
    _C.bump_traced_ops()
    return dispatch_slow(func, args, kwargs)


_C.configure(LazyTensor, Out, torch.dtype, torch.Tensor._make_wrapper_subclass, LAZY_DEVICE, torch.strided,
             TENSOR, SCALAR_MARKERS, MEMO, dispatch_slow, _value, views.ViewStep, GETITEM,
             (torch.memory_format, torch.layout))  # the types _flat keeps as they are, besides dtype
# Views share their base's C++ StorageImpl (csrc/alias.cpp), reading TensorImpl addresses straight from tensor
# objects where this probe finds that agrees with tensor._cdata.
_C.probe_layout(torch.empty(0), torch.Tensor._make_wrapper_subclass(LazyTensor, (2,), (1,), 0, None, torch.float32,
                                                                    torch.strided, LAZY_DEVICE))
# Note [Methods without the dispatcher]
# ``x + y``, ``x * 2.0``, ``x.sin()``, ...: LazyTensor methods (csrc/record_methods.cpp) that record the ATen call
# the dispatcher would deliver (self first) when nothing between the method and the recorder can act on it, and
# call torch's own method otherwise. Unary methods qualify when the dispatcher delivers their op unchanged: a
# ``(Tensor self) -> Tensor`` overload without a CompositeImplicitAutograd kernel (``square`` decomposes to pow
# before reaching a subclass, so it is not one). Besides ~2 us of dispatcher per op, this keeps plain programs
# away from torch's first Python-subclass dispatch, which imports torch.distributed.tensor (~0.25 s).
_UNARY_METHODS = (
    "abs neg sin cos tan tanh sigmoid exp exp2 expm1 log log1p log2 log10 sqrt rsqrt relu reciprocal floor ceil "
    "round trunc frac sign sgn erf erfc erfinv asin acos atan sinh cosh asinh acosh atanh bitwise_not logical_not "
    "isnan isinf signbit lgamma digamma angle i0").split()
_UNARY_DUNDERS = {"__neg__": "neg", "__abs__": "abs", "__invert__": "bitwise_not"}


def _dispatcher_delivers(op: Any) -> bool:
    """Whether a call of the Tensor method of unary ``op`` reaches __torch_dispatch__ as ``op(self)`` itself."""
    schema = op._schema
    return (len(schema.arguments) == 1 and str(schema.arguments[0].type) == "Tensor" and len(schema.returns) == 1
            and schema.returns[0].alias_info is None
            and not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"))


def _methods() -> dict:
    binary = {"__add__": aten.add.Tensor, "__radd__": aten.add.Tensor, "__sub__": aten.sub.Tensor,
              "__mul__": aten.mul.Tensor, "__rmul__": aten.mul.Tensor, "__truediv__": aten.div.Tensor}
    table = {name: (op, getattr(torch.Tensor, name), 2) for name, op in binary.items()}
    unary = dict(_UNARY_DUNDERS, **{name: name for name in _UNARY_METHODS})
    for name, op_name in unary.items():
        op = getattr(aten, op_name).default
        if _dispatcher_delivers(op):
            table[name] = (op, getattr(torch.Tensor, name), 1)
    return table


def _cpu(self: LazyTensor, memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    # A plain call records what the dispatcher would deliver, without the dispatcher; anything else (autograd,
    # modes) takes torch's method.
    if memory_format is torch.preserve_format and _C.plain_call(self):
        return dispatch(aten._to_copy.default, (self,), {"dtype": self.dtype, "layout": torch.strided,
                                                         "device": _CPU})
    return torch.Tensor.cpu(self, memory_format=memory_format)


_CPU = torch.device("cpu")
LazyTensor.cpu = _cpu
_C.install_methods(
    _methods(),
    (torch.is_grad_enabled, torch._C._len_torch_dispatch_stack, torch._C._is_torch_function_mode_enabled,
     torch._C._is_any_autocast_enabled, torch._C._are_functorch_transforms_active),
    torch.autograd.forward_ad)
