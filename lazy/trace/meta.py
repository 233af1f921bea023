"""Output metadata of an ATen call without running it: a memo in front of PyTorch's meta kernels.

Each distinct call signature (op, static arguments, runtime-scalar types, and the shape/stride/offset/dtype of
each tensor) is inferred once, with meta tensors; ops without a meta kernel go through FakeTensorMode, which
can decompose them or run them on zero-filled tensors. Training loops repeat the same signatures every step, so
after the first step shape inference is one dict lookup per op.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ..config import config
from ..debug import metrics

MEMO: Dict[Any, Any] = {}


class Out(tuple):
    """Metadata of one tensor result: (shape, stride, storage_offset, dtype, storage numel)."""

    __slots__ = ()


class Unrecordable(Exception):
    """Neither a meta kernel nor FakeTensorMode can infer this call's output metadata."""


def infer(key: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """The memoized output metadata of ``func(*args, **kwargs)``: an ``Out``, None, a tuple/list of them, or a
    plain value. Raises the eager error for invalid calls, ``Unrecordable`` when inference is impossible."""
    try:
        return MEMO[key]
    except KeyError:
        pass
    result = own_rule(func, args, kwargs)
    if result is None:
        try:
            result = _infer(func, args, kwargs)
        except (RuntimeError, ValueError, IndexError, TypeError) as error:
            if type(error) not in _NAMED_ERRORS:
                raise
            # The eager error type, raised at the op that caused it, naming that op (meta kernels often don't).
            raise type(error)(f"{func}: {error}") from None
    else:
        metrics.bump("shape_inference.rule")
    rule = CPU_RULES.get(func)
    if rule is not None and config.backing_device.startswith("cpu"):
        result = rule(result, args, kwargs)
    MEMO[key] = result
    return result


# Where the cpu kernel's outputs differ from the meta kernel's (which follow CUDA's): op -> fix(outs, args, kwargs).
# NOTE: the memo does not key on the backing device; a process changes it before recording anything.
def _empty_batch_norm_stats(training_at: Any) -> Any:
    """Outside training, cpu batch norm returns empty save_mean/save_invstd; meta (CUDA) returns them [C]."""
    def fix(outs: tuple, args: tuple, kwargs: dict) -> tuple:
        if training_at is not None and args[training_at]:
            return outs
        empty = Out(((0,), (1,), 0, outs[1][3], 0))
        return type(outs)((outs[0], empty, empty) + tuple(outs[3:]))
    return fix


def _untouched_batch_norm_stats(outs: tuple, args: tuple, kwargs: dict) -> tuple:
    """Outside training, cpu native_batch_norm.out leaves its save_mean/save_invstd out= tensors as they were."""
    if args[5]:
        return outs
    kept = [Out(kwargs[name]._lz_desc + (kwargs[name]._lz_st.numel,)) for name in ("save_mean", "save_invstd")]
    return type(outs)((outs[0], *kept))


def _half_stats(fix: Any = None) -> Any:
    """cpu norm kernels give the statistics (and running stats) of a float16/bfloat16 input the dtype of the
    parameters (weight, else bias, running mean or var: eager refuses a mix), or the input's if there are none;
    meta (CUDA) makes them float32. Applied after ``fix``."""
    def rule(outs: tuple, args: tuple, kwargs: dict) -> tuple:
        outs = fix(outs, args, kwargs) if fix else outs
        if outs[0][3] not in (torch.float16, torch.bfloat16):
            return outs
        param = next((a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        dtype = outs[0][3] if param is None else param.dtype
        stats = (Out(o[:3] + (dtype,) + o[4:]) if type(o) is Out and o[3] == torch.float32 else o for o in outs[1:])
        return type(outs)((outs[0], *stats))
    return rule


aten = torch.ops.aten
CPU_RULES: Dict[Any, Any] = {
    aten.native_layer_norm.default: _half_stats(),
    aten.native_batch_norm.default: _half_stats(_empty_batch_norm_stats(5)),
    aten.native_batch_norm.out: _untouched_batch_norm_stats,
    aten._native_batch_norm_legit.default: _half_stats(_empty_batch_norm_stats(5)),
    aten._native_batch_norm_legit_functional.default: _half_stats(_empty_batch_norm_stats(5)),
    aten._native_batch_norm_legit_no_training.default: _half_stats(_empty_batch_norm_stats(None)),
    aten._batch_norm_with_update.default: _half_stats(),
    aten._batch_norm_with_update_functional.default: _half_stats(),
    aten._batch_norm_no_update.default: _half_stats(_empty_batch_norm_stats(None)),
}


_NAMED_ERRORS = (RuntimeError, ValueError, IndexError, TypeError)


def own_rule(func: Any, args: tuple, kwargs: dict) -> Any:
    """The output metadata from lazy's own rule for ``func`` (trace/shapes.py), or None."""
    from .shapes import RULES
    rule = RULES.get(func)
    return None if rule is None else rule(args, kwargs)


def _infer(func: Any, args: tuple, kwargs: dict) -> Any:
    metrics.bump("shape_inference.meta")
    try:
        margs, mkwargs = _convert(args, "meta"), _convert(kwargs, "meta")
        return _describe(_returned(func(*margs, **mkwargs), mkwargs), func)
    except UnsupportedLayout:
        raise
    except Exception as meta_error:  # noqa: BLE001 - classified below
        if not _maybe_missing_kernel(meta_error):
            raise
    metrics.bump("shape_inference.fake")
    try:
        return _infer_fake(func, args, kwargs)
    except UnsupportedLayout:
        raise
    except Exception as fake_error:  # noqa: BLE001
        raise Unrecordable(f"{func}: no meta kernel, and FakeTensorMode failed with {fake_error!r}") from fake_error


def _maybe_missing_kernel(error: Exception) -> bool:
    text = str(error)
    lowered = text.lower()
    return (isinstance(error, NotImplementedError) or "meta" in lowered or "fake impl" in lowered
            or "data-dependent" in lowered)


def _infer_fake(func: Any, args: tuple, kwargs: dict) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=False)

    def fake(meta: torch.Tensor) -> torch.Tensor:
        return FakeTensor(mode, meta, torch.device("cpu"))

    fargs, fkwargs = _convert(args, "meta", fake), _convert(kwargs, "meta", fake)
    with mode:
        return _describe(_returned(func(*fargs, **fkwargs), fkwargs), func)


def _returned(result: Any, kwargs: dict) -> Any:
    """What a call returned, or for an out= op that returns nothing (a list out=: unbind_copy.int_out) its out."""
    return kwargs["out"] if result is None and kwargs.get("out") is not None else result


def _convert(value: Any, device: str, wrap: Any = None) -> Any:
    """Arguments with every tensor replaced by a meta tensor of the same metadata (and storage size)."""
    from ..device.tensor import LazyTensor
    if isinstance(value, LazyTensor):
        shape, stride, offset, dtype = value._lz_desc
        st = value._lz_st
        # The storage counts elements of its base's dtype; a dtype view (view_as_real) counts in its own.
        numel = st.numel if st.value.dtype == dtype else st.numel * st.value.dtype.itemsize // dtype.itemsize
        meta = torch.empty(numel, dtype=dtype, device="meta").as_strided(shape, stride, offset)
        return wrap(meta) if wrap else meta
    if isinstance(value, torch.Tensor):
        meta = value.detach().to("meta")
        return wrap(meta) if wrap else meta
    if isinstance(value, (list, tuple)):
        return type(value)(_convert(v, device, wrap) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, device, wrap) for k, v in value.items()}
    if isinstance(value, torch.device) and value.type == "lazy":
        return torch.device("meta") if wrap is None else torch.device("cpu")
    if isinstance(value, torch.Generator) or type(value).__name__ == "SeedArg":
        return None
    return value


def _describe(result: Any, func: Any) -> Any:
    if isinstance(result, torch.Tensor):
        if result.layout != torch.strided:
            raise UnsupportedLayout(f"{func} returns a {result.layout} tensor; the lazy device holds only strided "
                                    "(dense) tensors: keep sparse or quantized tensors on the cpu")
        numel = result.untyped_storage().nbytes() // max(result.element_size(), 1)
        return Out((tuple(result.shape), tuple(result.stride()), result.storage_offset(), result.dtype, numel))
    if isinstance(result, (list, tuple)):
        return type(result)(_describe(r, func) for r in result)
    return result


class UnsupportedLayout(RuntimeError):
    """A result in a layout the lazy device cannot hold (sparse, mkldnn, quantized)."""


def clear() -> None:
    """Forget every memoized signature (tests use it to measure the cold path)."""
    from .. import _C
    MEMO.clear()
    _C.clear_fast_cache()  # the recorder's fast path caches what it found in MEMO
