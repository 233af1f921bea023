"""The recorder: every ATen call on lazy tensors becomes IR here (``dispatch`` is ``__torch_dispatch__``).

One handler per kind of op, chosen once per overload: functional ops become a node; views share their base's
storage (trace/views.py); in-place and ``out=`` ops become their functional variant plus a write-back (Note
[Functional variants]); random ops get a seed drawn from the torch generator as a runtime scalar; ops whose
output shape depends on data sync their inputs and run eagerly; ops no shape inference can handle fall back
to eager execution on the backing device, counted and warned about once.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from .. import _C
from ..debug import metrics
from ..device.backing import to_backing
from ..device.tensor import LazyTensor, Storage, adopt, new_tensor, wrap
from ..ir.layout import contiguous_stride, non_overlapping_and_dense, storage_numel
from ..ir.node import DEVICE, GENERATOR, SCALAR_MARKERS, TENSOR, Node, Op, data_leaf, getitem
from ..ir.ops import SEED_KWARG, SEEDED_OPS, functionalized, seeded
from . import views
from .meta import Out, Unrecordable, infer
from .schema import RUNTIME_MEMO_VALUE, STATIC, OpDesc, describe

aten = torch.ops.aten
_value = views.value


class SeedArg(int):
    """A seed drawn at record time for a random op; recorded as a runtime scalar behind a GENERATOR marker."""


class _Syncs:
    """What the recorder calls when an op needs data now (Note [Layers] in lazy/device/tensor.py): a copy out of
    the lazy device, ``.item()``, an op whose output shape depends on data, an op no shape inference can record.
    The sync layer, above the recorder, installs them when imported (``install_sync``)."""

    def __init__(self) -> None:
        self.materialize = self.data_of = self.eager_fallback = self._missing

    @staticmethod
    def _missing(*args: Any) -> Any:
        raise RuntimeError("lazy internal error: the recorder needs data, and lazy.sync is not imported")


SYNC = _Syncs()

# While @lazy.compile captures a function, what the recorder reports to it (lazy/capture/tensors.py, CaptureHooks):
# host tensors snapshotted into the graph, transfers to the lazy device, the seeds random ops draw. Set by the
# capture layer (above this one: Note [Layers]); None otherwise.
CAPTURE: Optional[Any] = None


def install_sync(materialize: Callable[[LazyTensor, str], torch.Tensor],
                 data_of: Callable[[LazyTensor, str], torch.Tensor],
                 eager_fallback: Callable[[Any, tuple, dict, str], Any]) -> None:
    """The sync layer's functions: ``materialize(t, cause)`` (a new cpu tensor with t's strides), ``data_of(t,
    cause)`` (t's value on the backing device) and ``eager_fallback(func, args, kwargs, cause)`` (sync the lazy
    inputs, run func eagerly on the backing device, wrap the results as lazy data)."""
    SYNC.materialize, SYNC.data_of, SYNC.eager_fallback = materialize, data_of, eager_fallback


# Ops that accept cpu tensors beside lazy ones (eager CUDA does too): the cpu tensors become data leaves.
_CPU_ARGS_OK = frozenset((aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                          aten._index_put_impl_.default, aten.copy_.default, aten.copy.default))


# ---------------------------------------------------------------------------------------------------------------
# Flattening arguments into (template, inputs, scalars, memo key) -- see Note [Argument templates]

def _flat(v: Any, kind: int, ins: list, scs: list, memo: list, desc: OpDesc) -> Any:
    tv = type(v)
    if tv is LazyTensor:
        ins.append(_value(v))
        memo.append(v._lz_desc)
        return TENSOR
    if tv is float or tv is int or tv is bool or tv is complex:
        if kind == STATIC:
            return v
        scs.append(v)
        if kind == RUNTIME_MEMO_VALUE:
            memo.append(v)
        return SCALAR_MARKERS[tv]
    if tv is list or tv is tuple:
        return tuple([_flat(x, kind, ins, scs, memo, desc) for x in v])
    if v is None or tv is str or tv is torch.dtype:
        return v
    if isinstance(v, LazyTensor):
        ins.append(_value(v))
        memo.append(v._lz_desc)
        return TENSOR
    if isinstance(v, torch.Tensor):
        ins.append(_constant(v, desc))
        memo.append(("const", tuple(v.shape), v.dtype))
        return TENSOR
    if tv is torch.device:
        return DEVICE if v.type == "lazy" else v
    if tv is SeedArg:
        scs.append(int(v))
        return GENERATOR
    return v


def _constant(t: torch.Tensor, desc: OpDesc) -> Node:
    """A non-lazy tensor argument: eager allows cpu scalars (0-dim) beside device tensors, nothing else."""
    if t.dim() != 0 and desc.op not in _CPU_ARGS_OK:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, lazy:0 "
                           f"and {t.device}! (in {desc.name}; move the {t.device} tensor of shape "
                           f"{list(t.shape)} with .to('lazy') first)")
    data = to_backing(t)  # a snapshot: eager reads the value at call time
    metrics.bump("bytes_to_device", data.numel() * data.element_size())
    leaf = data_leaf(data)
    if CAPTURE is not None:
        CAPTURE.on_constant(t, leaf)
    return leaf


def flatten(desc: OpDesc, args: tuple, kwargs: dict) -> tuple:
    ins: list = []
    scs: list = []
    memo: list = []
    kinds = desc.kinds
    targs: list = []
    for i, v in enumerate(args):
        if type(v) is LazyTensor:  # the common argument, inlined: this loop runs for every recorded op
            ins.append(v._lz_st.value if v._lz_chain is None else _value(v))
            memo.append(v._lz_desc)
            targs.append(TENSOR)
        else:
            targs.append(_flat(v, kinds[i] if i < len(kinds) else STATIC, ins, scs, memo, desc))
    targs = tuple(targs)
    if kwargs:
        kw_kinds = desc.kw_kinds
        tkw = tuple([(k, _flat(v, kw_kinds.get(k, STATIC), ins, scs, memo, desc)) for k, v in kwargs.items()])
    else:
        tkw = ()
    return targs, tkw, ins, scs, memo


# ---------------------------------------------------------------------------------------------------------------
# Building outputs

def _flat_outs(out: Any, acc: list) -> list:
    if type(out) is Out or out is None:
        acc.append(out)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _flat_outs(o, acc)
    return acc


def _rebuild(out: Any, values: list, it: list) -> Any:
    """The return structure of ``out`` with each Out/None replaced by the next of ``values``."""
    if type(out) is Out or out is None:
        i = it[0]
        it[0] += 1
        return values[i]
    if isinstance(out, (list, tuple)):
        return type(out)([_rebuild(o, values, it) for o in out])
    return out


def emit_outputs(op: Any, targs: tuple, tkw: tuple, ins: list, scs: list, out: Any) -> tuple:
    """The node of one call and the value node of each of its tensor outputs (flattened, None kept)."""
    if type(out) is Out:
        node = Node(op, targs, tkw, tuple(ins), tuple(scs), out[0], out[3])
        return node, [node]
    flat = _flat_outs(out, [])
    metas = tuple(None if o is None else (o[0], o[3]) for o in flat)
    node = Node(op, targs, tkw, tuple(ins), tuple(scs), None, None, metas)
    return node, [None if o is None else getitem(node, i) for i, o in enumerate(flat)]


def _new(out: Out, value: Node) -> LazyTensor:
    return new_tensor(out[:4], value, out[4])


def _tensors(out: Any, values: list) -> Any:
    flat = _flat_outs(out, [])
    made = [None if o is None else _new(o, v) for o, v in zip(flat, values)]
    return made[0] if type(out) is Out else _rebuild(out, made, [0])


def _with_seed(desc: OpDesc, kwargs: dict) -> dict:
    gen = kwargs.get("generator")
    kwargs = dict(kwargs)
    kwargs["generator"] = SeedArg(_draw_seed(gen))
    return kwargs


def draws(desc: OpDesc, args: tuple, kwargs: dict) -> bool:
    """Whether a call of a random op without a generator draws randomness (Note [Random ops that draw nothing])."""
    if desc.draws_unless is None:
        return True
    i, name, default, value = desc.draws_unless
    given = args[i] if i < len(args) else kwargs.get(name, default)
    return given != value


_UNSEEDED: Dict[Any, Op] = {}


def unseeded(op: Any) -> Op:
    """A call of a random op that draws nothing (Note [Random ops that draw nothing]) as an internal op: like its
    seeded form, one ATen call in a compiled program, never decomposed (the attention kernel's decomposition is not
    the fused kernel eager runs), but without a seed, so nothing ties it to the calling thread."""
    fn = _UNSEEDED.get(op)
    if fn is None:
        fn = _UNSEEDED[op] = Op(f"unseeded[{op}]", op, op)
    return fn


def _draw_seed(gen: Optional[torch.Generator]) -> int:
    # NOTE: one draw from the user's (or the default cpu) generator per random op: torch.manual_seed(s) makes lazy
    # randomness reproducible, and the seed is a runtime scalar, so new randomness does not recompile.
    seed = int(torch.randint(0, 2 ** 62, (), generator=gen if isinstance(gen, torch.Generator) else None))
    if CAPTURE is not None:
        CAPTURE.on_seed(seed, gen if isinstance(gen, torch.Generator) else None)
    return seed


# ---------------------------------------------------------------------------------------------------------------
# Handlers

def record_functional(func: Any, args: tuple, kwargs: dict) -> Any:
    desc = describe(func)
    op = func
    if desc.random:
        if desc.has_generator:
            kwargs = _with_seed(desc, kwargs)
        else:
            op = seeded(func) if draws(desc, args, kwargs) else unseeded(func)
    targs, tkw, ins, scs, memo = flatten(desc, args, kwargs)
    # NOTE: the OpDesc, not the OpOverload, keys the memo: it hashes by identity in C (OpOverload.__hash__ is Python)
    out = infer((desc, targs, tkw, tuple(memo)), func, args, kwargs)
    if op in SEEDED_OPS:  # Note [The seed of a seeded op]: the last keyword, so the last runtime scalar
        scs.append(_draw_seed(None))
        tkw = tkw + ((SEED_KWARG, SCALAR_MARKERS[int]),)
    if type(out) is Out:  # the common case, without the generic output plumbing
        return new_tensor(out[:4], Node(op, targs, tkw, tuple(ins), tuple(scs), out[0], out[3]), out[4])
    node, values = emit_outputs(op, targs, tkw, ins, scs, out)
    return _tensors(out, values)


# Note [Checks run at the next sync]
# Some ATen ops check tensor data and return nothing: ``_linalg_check_errors`` (linalg.cholesky, inv, solve, ...
# raise through it when the factorization fails), ``_assert_async``. Recorded like any op, their node would be
# reachable from no tensor and never run: the check would vanish and a wrong result go through silently. So each
# becomes a node of its own (an internal op calling the check, then returning an empty marker) kept in
# PENDING_CHECKS, and the next sync computes the pending checks with whatever it computes (a read of data already
# computed runs them first): the check raises there, once, as any error of a graph does (eager raised at the op). A
# check recorded inside ``lazy.compile`` is a sync of the capture, so that function runs plainly.
PENDING_CHECKS: list = []
_CHECKS: Dict[Any, Op] = {}


def _checked(op: Any) -> Op:
    fn = _CHECKS.get(op)
    if fn is None:
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            op(*args, **kwargs)  # raises where the data fails the check
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            return torch.zeros((), dtype=torch.bool, device=device)
        fn = _CHECKS[op] = Op(f"checked[{op}]", run)
    return fn


def record_check(func: Any, args: tuple, kwargs: dict) -> None:
    """A data check that returns nothing (Note [Checks run at the next sync])."""
    if CAPTURE is not None:
        CAPTURE.on_sync(f"{func} checks tensor data")
    desc = describe(func)
    targs, tkw, ins, scs, _ = flatten(desc, args, kwargs)
    PENDING_CHECKS.append(Node(_checked(func), targs, tkw, tuple(ins), tuple(scs), (), torch.bool))
    return None


def take_checks() -> list:
    """The pending checks, which the caller's graph runs (Note [Checks run at the next sync])."""
    checks = PENDING_CHECKS[:]
    PENDING_CHECKS.clear()
    return checks


def record_view(func: Any, args: tuple, kwargs: dict) -> Any:
    desc = describe(func)
    base = args[0]
    targs, tkw, ins, scs, memo = flatten(desc, args, kwargs)
    out = infer((desc, targs, tkw, tuple(memo)), func, args, kwargs)
    st = base._lz_st
    if func is aten.as_strided.default:
        return _view_tensor(out, base, views.as_strided_chain(out[:4], st), reset=True)
    if type(out) is Out:
        step = views.ViewStep(func, targs, tkw, out[0], out[3])
        return _view_tensor(out, base, step)
    steps = views.split_steps(func, targs, out)
    if steps is None:
        return type(out)(_view_tensor(o, base, views.as_strided_chain(o[:4], st), reset=True) for o in out)
    return type(out)(_view_tensor(o, base, s) for o, s in zip(out, steps))


# Note [Aliases of a base are bases]
# ``detach``/``alias`` of a base tensor has the base's metadata and elements: it is made a second base of the same
# storage (no view chain), not a view with an identity step. Reading it is reading the storage value, an in-place
# op on it replaces the storage value, exactly what the identity chain would do, but through the C fast path:
# parameters are such aliases (nn.Parameter detaches its data; so does ``.data``), and the optimizer's in-place
# updates of them would otherwise each take the Python recorder.
def _view_tensor(out: Out, base: LazyTensor, step: Any, reset: bool = False) -> LazyTensor:
    """A view of ``base``: one more ``step`` on its chain, or with ``reset`` a chain of steps (a tuple) from its
    storage's base (as_strided reads the storage)."""
    st = base._lz_st
    if reset:
        chain = step
        value = st.value
        for s in chain:
            value = s.apply(value)
    else:
        if step.op in views.ALIASES and base._lz_chain is None:
            alias = wrap(out[:4], st)
            _C.share_storage(alias, base)
            return alias
        chain = (base._lz_chain or ()) + (step,)
        value = step.apply(_value(base))
    view = wrap(out[:4], st, chain, (st.version, value))
    _C.share_storage(view, base)
    return view


def _arg(desc: OpDesc, args: tuple, kwargs: dict, i: int) -> Any:
    return args[i] if i < len(args) else kwargs.get(desc.arg_names[i])


def _write_back(target: Any, new: Optional[Node]) -> None:
    if target is None or new is None:
        return
    if new.dtype != target.dtype:
        new = Node(aten._to_copy.default, (TENSOR,), (("dtype", target.dtype),), (new,), (), new.shape,
                   target.dtype)
    if new.shape != target._lz_desc[0]:
        new = views.emit(aten.expand.default, (TENSOR, target._lz_desc[0]), (new,), target._lz_desc[0], new.dtype)
    views.write(target, new)


def _returns(desc: OpDesc, args: tuple, kwargs: dict, plain: list) -> Any:
    """An in-place/out= op's return value: the mutated arguments themselves where returns alias them."""
    it = iter(plain)
    rets = [_arg(desc, args, kwargs, src) if src is not None else next(it) for src in desc.return_sources]
    if not rets:
        return None
    return rets[0] if len(rets) == 1 else tuple(rets)


def _padded(desc: OpDesc, args: tuple) -> tuple:
    """``args`` with the positional defaults the functional variant lacks filled in (OpDesc.pad_args)."""
    return args + desc.pad_args[len(args):]


def _start_mutation(func: Any, args: tuple, kwargs: dict) -> tuple:
    """What in-place and out= handlers share: missing defaults, the seed of a random op, the flattened call, and
    the op's own metadata (which also runs eager's checks: broadcasting, casting, out= resizing)."""
    desc = describe(func)
    if desc.pad_args is not None:
        args = _padded(desc, args)
    if desc.random and desc.has_generator:
        kwargs = _with_seed(desc, kwargs)
    targs, tkw, ins, scs, memo = flatten(desc, args, kwargs)
    memo = tuple(memo)
    out = infer((desc, targs, tkw, memo), func, args, kwargs)
    return desc, args, kwargs, targs, tkw, ins, scs, memo, out


def record_inplace(func: Any, args: tuple, kwargs: dict) -> Any:
    desc, args, kwargs, targs, tkw, ins, scs, memo, out = _start_mutation(func, args, kwargs)
    n_plain = sum(1 for s in desc.return_sources if s is None)
    if desc.functional is not None:
        op = desc.functional
        fout = infer((op, targs, tkw, memo), op, args, kwargs)
        if desc.random and not desc.has_generator:
            raise AssertionError(f"lazy internal error: {func} is random without a generator argument")
    else:
        plain_idx = [i for i, s in enumerate(desc.return_sources) if s is None]
        op = functionalized(func, desc.mutated, (), plain_idx)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        mutated_meta = [_meta_of(_arg(desc, args, kwargs, i)) for i in desc.mutated]
        fout = tuple(outs[i] for i in plain_idx) + tuple(mutated_meta)
    node, values = emit_outputs(op, targs, tkw, ins, scs, fout)
    flat_plain = _flat_outs(fout[:n_plain] if n_plain else (), [])
    at = len(flat_plain)
    for i in desc.mutated:
        target = _arg(desc, args, kwargs, i)
        if isinstance(target, (list, tuple)):
            for t in target:
                _write_back(t, values[at])
                at += 1
        else:
            _write_back(target, values[at])
            at += 1
    plain = [_new(o, v) if o is not None else None for o, v in zip(flat_plain, values)]
    return _returns(desc, args, kwargs, plain)


def record_inplace_view(func: Any, args: tuple, kwargs: dict) -> Any:
    """``squeeze_``, ``transpose_``, ``as_strided_``, ...: ``self`` becomes a view of its old self (same storage,
    new metadata), recorded as the out-of-place view op; its value does not change."""
    view = record_view(describe(func).functional, args, kwargs)
    _set_metadata(args[0], view)
    return args[0]


def record_resize(func: Any, args: tuple, kwargs: dict) -> Any:
    """``resize_``/``resize_as_``: new contiguous metadata over the same storage, or over a grown copy of it (the
    new elements are uninitialized in eager; here zeros). A grown storage is new: other views of the old one
    keep the old storage (eager grows it in place under them)."""
    desc = describe(func)
    self = args[0]
    targs, tkw, ins, scs, memo = flatten(desc, args, kwargs)
    out = infer((func, targs, tkw, tuple(memo)), func, args, kwargs)
    if out[:4] == self._lz_desc:
        return self
    st = self._lz_st
    if st.value.dtype != self.dtype:
        raise Unrecordable(f"resizing a {self.dtype} view of a {st.value.dtype} storage")
    if out[4] > st.numel:
        st = _grown(st, out[4])
    step = views.as_strided_step(out[:4], st)
    resized = wrap(out[:4], st, (step,), (st.version, step.apply(st.value)))
    if st is self._lz_st:
        _C.share_storage(resized, self)  # a grown storage is a new one, with a StorageImpl of its own
    _set_metadata(self, resized)
    return self


def _grown(st: Storage, numel: int) -> Storage:
    """A new storage of ``numel`` elements: ``st``'s elements, then zeros."""
    dtype = st.value.dtype
    flat = views.as_strided_step(((st.numel,), (1,), 0, dtype), st).apply(st.value)
    padded = Node(aten.constant_pad_nd.default, (TENSOR, (0, numel - st.numel)), (), (flat,), (), (numel,), dtype)
    return Storage(padded, (numel,), (1,), numel)


def _flat_targets(v: Any, acc: list) -> list:
    """The tensors (and Nones) of mutated arguments, flattened in the order _meta_of describes them."""
    if isinstance(v, (list, tuple)):
        for x in v:
            _flat_targets(x, acc)
    else:
        acc.append(v)
    return acc


def _meta_of(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, (list, tuple)):
        return [_meta_of(x) for x in t]
    return Out(t._lz_desc + (t._lz_st.numel,))


def record_out(func: Any, args: tuple, kwargs: dict) -> Any:
    # `out`: the out tensors' metadata after resize
    desc, args, kwargs, targs, tkw, ins, scs, memo, out = _start_mutation(func, args, kwargs)
    outs: list = []
    _collect([kwargs[name] for name in desc.out_names], outs)  # an out= may be a list (unbind_copy.int_out)
    final = _flat_outs(out, []) if isinstance(out, (tuple, list)) else [out]
    op = desc.functional
    if op is not None:
        fkwargs = {k: v for k, v in kwargs.items() if k not in desc.out_names}
        fdesc = describe(op)
        ftargs, ftkw, fins, fscs, fmemo = flatten(fdesc, args, fkwargs)
        fout = infer((op, ftargs, ftkw, tuple(fmemo)), op, args, fkwargs)
        node, values = emit_outputs(op, ftargs, ftkw, fins, fscs, fout)
    else:
        op = functionalized(func, desc.mutated, desc.out_names, ())
        mutated = [_arg(desc, args, kwargs, i) for i in desc.mutated]
        fout = tuple(_meta_of(t) for t in mutated) + tuple(final)
        node, values = emit_outputs(op, targs, tkw, ins, scs, fout)
        updated = _flat_outs(tuple(_meta_of(t) for t in mutated), [])  # one value per tensor or None, in order
        for target, new in zip(_flat_targets(mutated, []), values):
            _write_back(target, new)
        values = values[len(updated):]
    for target, meta, new in zip(outs, final, values):
        if target._lz_desc != meta[:4]:
            _reset(target, meta)
        _write_back(target, new)
    if not desc.num_returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _reset(t: LazyTensor, meta: Out) -> None:
    """Give ``t`` new metadata and a fresh storage (resize of an out= tensor), keeping the Python object."""
    shape, stride, _, dtype = meta[:4]
    empty = Node(aten.empty_strided.default, (shape, stride), (("dtype", dtype), ("device", DEVICE)), (), (),
                 shape, dtype)
    fresh = new_tensor((shape, stride, 0, dtype), empty, storage_numel(shape, stride))
    _set_metadata(t, fresh)


def _set_metadata(t: LazyTensor, src: LazyTensor) -> None:
    with torch.no_grad():
        torch._C.TensorBase.data.__set__(t, src)
    adopt(t, src)


def record_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    if not isinstance(dst, LazyTensor):  # lazy -> cpu (or another device)
        dst.copy_(SYNC.materialize(src, "cpu"))
        return dst
    desc = describe(func)
    targs, tkw, ins, scs, memo = flatten(desc, args, kwargs)
    infer((func, targs, tkw, tuple(memo)), func, args, kwargs)  # broadcast and dtype checks, as eager
    _write_back(dst, ins[1])
    return dst


def record_to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    device = kwargs.get("device")
    x = args[0]
    if not isinstance(x, LazyTensor):  # another device -> lazy: a snapshot of the data becomes a leaf
        data = to_backing(x, kwargs.get("dtype") or x.dtype, kwargs.get("memory_format") or torch.preserve_format)
        metrics.bump("bytes_to_device", data.numel() * data.element_size())
        out = from_data(data)
        if CAPTURE is not None:
            CAPTURE.on_transfer(x, out._lz_st.value)
        return out
    if device is None or device.type == "lazy":
        return record_functional(func, args, kwargs)
    if not _non_overlapping_and_dense(x):
        # NOTE: eager copies an overlapping (expanded) or gapped tensor into a dense one (empty_like's
        # preserve_format); so does a clone, and the sync then materializes that.
        x = record_functional(aten.clone.default, (x,), {})
    cpu = SYNC.materialize(x, "cpu")
    rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
    return cpu.to(device=device, copy=False, **rest) if rest else cpu.to(device)


def record_item(func: Any, args: tuple, kwargs: dict) -> Any:
    return SYNC.data_of(args[0], "item").item()


def record_set(func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.set_(y)``: x becomes another name for y's storage and metadata."""
    dst = args[0]
    if len(args) == 2 and isinstance(args[1], LazyTensor):
        _set_metadata(dst, args[1])
        return dst
    return SYNC.eager_fallback(func, args, kwargs, "fallback")


def _collect(v: Any, acc: list) -> None:
    if isinstance(v, LazyTensor):
        acc.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _collect(x, acc)
    elif isinstance(v, dict):
        for x in v.values():
            _collect(x, acc)


def from_data(data: torch.Tensor) -> LazyTensor:
    """A new lazy tensor holding ``data`` (already on the backing device), with eager's strides."""
    shape = tuple(data.shape)
    stride = tuple(data.stride()) if _dense(data) else contiguous_stride(shape)
    return new_tensor((shape, stride, 0, data.dtype), data_leaf(data), storage_numel(shape, stride))


def _dense(t: torch.Tensor) -> bool:
    return _non_overlapping_and_dense(t) and t.storage_offset() == 0


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    # NOTE: not torch._prims_common's check: it is symbolic-shape aware, costs ~40 us and imports sympy (~0.6 s in
    # a fresh process) on first use.
    return t.is_contiguous() or non_overlapping_and_dense(t.shape, t.stride())


def data_dependent(func: Any, args: tuple, kwargs: dict) -> Any:
    metrics.bump(f"data_dependent.{func}")
    return SYNC.eager_fallback(func, args, kwargs, "data_dependent")


def record_index(func: Any, args: tuple, kwargs: dict) -> Any:
    """``x[idx]``: static shape with integer indices; boolean masks make it data-dependent."""
    indices = args[1]
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return data_dependent(func, args, kwargs)
    return record_functional(func, args, kwargs)
