"""Lowering of a linearized graph: every node becomes loop-level kernel IR or an extern ATen call.

``lower(lin)`` walks the nodes in order. A node with a lowering (pointwise.py, structure.py, indexing.py) becomes a
lazy ``TVal``; a composite op is decomposed with torch._decomp (decompose.py) and its core ops lowered the same way;
everything else (matmul, conv, sort, masks, index_put, random and internal lazy ops, unsupported dtypes) becomes an
``Extern`` step whose inputs are realized into buffers and whose outputs are buffers later kernels load from.
No node leaves the graph: each is lowered, decomposed or extern. Values are realized (stored) only where they
must be: graph outputs, extern inputs, and shared values too big to recompute.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..ir.graph import Linearized
from ..ir.node import DATA, DEVICE, GENERATOR, GETITEM, SCALAR_MARKERS, TENSOR, Node, _Marker
from ..runtime.reference import eager_dispatch
from . import indexing, kir, structure, values  # noqa: F401 -- structure and indexing register their lowerings
from .decompose import GETITEM_TARGET, ScalarRef, decompose
from .pointwise import LOWERINGS
from .values import SUPPORTED_DTYPES, ScalarArg, TVal, Unlowerable, from_buffer, vars_for

SHARED_INLINE_LIMIT = 48  # a value used twice is recomputed in each consumer only if it costs less (recompute_cost)
# ... and reads at most this many buffers of its own size (Note [Shared values that read much])
SHARED_FULL_LOADS = 2
# NOTE: a transcendental function costs ~20 simple ops when vectorized, and a consumer may run it in a scalar loop
# (a reduction body, a strided store): recomputing gelu's tanh in four consumers cost 4x a stored value's time.
EXPENSIVE_OPS = {"exp", "log", "tanh", "erf", "sin", "cos", "log1p", "expm1", "sigmoid", "gelu", "gelu_tanh", "pow",
                 "atan2", "log2", "exp2", "atan", "asin", "acos", "sinh", "cosh", "tan", "erfc", "log10", "acosh",
                 "asinh", "atanh", "lgamma", "erfinv", "digamma", "hypot", "gcd", "lcm"}
EXPENSIVE_COST = 24
LATENCY_MIN = 48  # a pointwise kernel whose critical_path is this long is latency-bound (exp(sin(x)): 49; gelu: ~30)


def recompute_cost(root: kir.Expr) -> int:
    """What recomputing an expression in one more consumer costs, in simple ops: transcendental functions count
    EXPENSIVE_COST, a reduction it reads counts its reduced elements (each consumer kernel would redo it)."""
    cost = 0
    for e in kir.walk(root):
        if e.op in EXPENSIVE_OPS:
            cost += EXPENSIVE_COST
        elif e.op == "reduce":
            n = 1
            for k in e.args[0].red_shape:
                n *= k
            cost += n
        else:
            cost += 1
    return cost


def critical_path(roots: List[kir.Expr]) -> int:
    """The longest chain of dependent operations in ``roots``: an expensive op counts EXPENSIVE_COST, any other op
    1, leaves 0. A pointwise kernel with a long one is latency-bound, not memory-bound (Note [Interleaved copies] in
    codegen/cpp.py, Note [Tuned block sizes] in codegen/triton_blocks.py)."""
    depth: Dict[kir.Expr, int] = {}
    for root in roots:
        for e in kir.walk(root):
            if e in depth:
                continue
            own = EXPENSIVE_COST if e.op in EXPENSIVE_OPS else (0 if e.op in ("const", "var", "scalar") else 1)
            depth[e] = own + max((depth[a] for a in kir.children(e)), default=0)
    return max((depth[r] for r in roots), default=0)


# Note [Shared values that read much]
# recompute_cost counts operations, but a value recomputed in each consumer also reads its inputs again in each. A
# transformer's residual stream is such a value: x + attn + bias + mlp + bias, a few adds, read by the next
# LayerNorm and the next residual add, so it stayed inlined and every later consumer summed the whole chain again,
# reading one full tensor per term (a GPT's LayerNorm backward read 8 tensors of [B*T, C] where one was stored).
# Storing a value read by N consumers costs one write and N reads; recomputing it costs N reads of each input of
# its size. So a shared value that reads more than SHARED_FULL_LOADS distinct buffers of at least its own size is
# stored; small loads (a bias, a broadcast row) stay in cache and do not count.
def full_loads(root: kir.Expr, numel: int) -> int:
    """How many distinct buffers of at least ``numel`` elements ``root`` loads."""
    seen = set()
    for e in kir.walk(root):
        if e.op == "load":
            buf = e.args[0]
            if math.prod(buf.shape) >= numel:
                seen.add(buf.id)
    return len(seen)


class Store:
    """Kernel-IR step: ``buffer[vars] = expr`` for every index of the buffer."""

    __slots__ = ("buffer", "vars", "expr")

    def __init__(self, buffer: kir.Buffer, vars_: List[kir.Expr], expr: kir.Expr) -> None:
        self.buffer, self.vars, self.expr = buffer, vars_, expr


class Extern:
    """An ATen call at run time: ``fn`` with argument templates over input buffers and runtime scalar slots.

    ``views[i]`` is None when input ``i`` is its buffer, or ``(shape, strides, offset)`` (in elements of the
    buffer) when the call reads a strided view of it (Note [Extern inputs are views])."""

    __slots__ = ("fn", "args", "kwargs", "inputs", "views", "slots", "outputs", "name")

    def __init__(self, fn: Any, args: tuple, kwargs: tuple, inputs: List[kir.Buffer], slots: List[int],
                 outputs: List[Optional[kir.Buffer]], views: Optional[Sequence[Optional[tuple]]] = None) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.inputs, self.slots, self.outputs = inputs, slots, outputs
        self.views = tuple(views) if views is not None else (None,) * len(inputs)
        self.name = op_name(fn)


class Lowered:
    """The graph as kernel IR: ``steps`` (Store/Extern in order), leaf buffers, output buffers."""

    def __init__(self) -> None:
        self.steps: List[Any] = []
        self.leaves: List[kir.Buffer] = []
        self.outputs: List[kir.Buffer] = []
        self.scalar_kinds: List[type] = []
        self.num_buffers = 0
        self.externs_by_op: Dict[str, int] = {}
        self._extern_inputs: Dict[tuple, kir.Buffer] = {}

    def buffer(self, shape: Sequence[int], dtype: torch.dtype, strides: Optional[Sequence[int]] = None,
               kind: str = "temp") -> kir.Buffer:
        buf = kir.Buffer(self.num_buffers, shape, dtype, strides, kind)
        self.num_buffers += 1
        return buf

    def realize(self, v: TVal, shared: bool = False) -> kir.Buffer:
        if v.buffer is not None:
            return v.buffer
        vs = vars_for(v.shape, "x")
        return self.store(v.shape, v.dtype, vs, v(vs), shared)

    def store(self, shape: Sequence[int], dtype: torch.dtype, vs: List[kir.Expr], e: kir.Expr,
              shared: bool = False) -> kir.Buffer:
        """A new buffer holding ``e`` at the loop indices ``vs``; with ``shared``, the buffer an earlier extern
        input of the same value was stored in (Note [Extern inputs are stored once])."""
        key = (e, tuple(shape), dtype)  # the loop variables carry their extents: equal keys, equal contents
        buf = self._extern_inputs.get(key) if shared else None
        if buf is None:
            buf = self.buffer(shape, dtype)
            self.steps.append(Store(buf, vs, e))
            if shared:
                self._extern_inputs[key] = buf
        return buf


def lower(lin: Linearized, device: Optional[torch.device] = None) -> Lowered:
    """The graph as kernel IR for a backend on ``device`` (whose eager kernels decide which dtypes an op takes:
    Note [Dtypes eager rejects]; the cpu by default)."""
    device = torch.device("cpu") if device is None else device
    kir.reset_names()
    out = Lowered()
    values.REALIZE = lambda v: from_buffer(out.realize(v))
    users: Dict[int, int] = {}
    for node in lin.order:
        for i in node.inputs:
            users[id(i)] = users.get(id(i), 0) + 1
    vals: Dict[int, Any] = {}
    slot = 0
    for node in lin.order:
        if node.op is DATA:
            buf = out.buffer(node.shape, node.dtype, node.args[0], "leaf")
            out.leaves.append(buf)
            vals[id(node)] = from_buffer(buf)
            continue
        ins = [vals[id(i)] for i in node.inputs]
        n = len(node.scalars)
        out.scalar_kinds.extend(type(s) if type(s) in (bool, int, float) else object for s in node.scalars)
        if node.op is GETITEM:
            v = ins[0][node.args[0]]
        else:
            v = _lower_node(out, node, ins, slot, device)
            slot += n
        # NOTE: a getitem's value is shared like any node's: batch_norm_backward's weight and bias gradients are
        # reductions read by each of AdamW's update ops, and inlined they were computed again in every kernel
        if isinstance(v, TVal) and v.buffer is None and users.get(id(node), 0) > 1:
            e = v(vars_for(v.shape, "x"))
            if recompute_cost(e) > SHARED_INLINE_LIMIT or \
                    full_loads(e, math.prod(v.shape)) > SHARED_FULL_LOADS:  # Note [Shared values that read much]
                v = from_buffer(out.realize(v))
        vals[id(node)] = v
    for p in lin.outputs:
        v = vals[id(lin.order[p])]
        buf = out.realize(v)
        if buf.kind == "temp":
            buf.kind = "output"
        vals[id(lin.order[p])] = from_buffer(buf)
        out.outputs.append(buf)
    return out


def op_name(fn: Any) -> str:
    name = getattr(fn, "name", None)
    return name if isinstance(name, str) else str(fn)


def _supported(node: Node) -> bool:
    metas = node.metas if node.shape is None else ((node.shape, node.dtype),)
    return all(m is None or m[1] in SUPPORTED_DTYPES for m in metas or ()) and \
        all(i.dtype in SUPPORTED_DTYPES for i in node.inputs)


def _fill(value: Any, ins: Any, scalar: Callable[[_Marker], Any]) -> Any:
    """A node's argument template with its tensors taken from ``ins`` and each marker replaced by ``scalar(marker)``."""
    if value is TENSOR:
        return next(ins)
    if value is DEVICE:
        return None
    if type(value) is _Marker:
        return scalar(value)
    if type(value) is tuple:
        return [_fill(v, ins, scalar) for v in value]
    return value


def _kind(marker: _Marker) -> type:
    return next(k for k, m in SCALAR_MARKERS.items() if m is marker)


def _scalar_args(slots: Any) -> Callable[[_Marker], ScalarArg]:
    """Markers as the kernel's runtime scalars, numbered from ``slots``."""
    def arg(marker: _Marker) -> ScalarArg:
        if marker is GENERATOR:
            raise Unlowerable("random op")
        s = next(slots)
        kind = _kind(marker)
        if kind not in (int, float, bool):
            raise Unlowerable("complex scalar")
        return ScalarArg(s, int if kind is bool else kind)
    return arg


def _key(op: Any) -> str:
    packet = getattr(op, "overloadpacket", None)
    return str(packet) if packet is not None else ""


def _meta(node: Node) -> tuple:
    return (node.shape, node.dtype) if node.shape is not None else node.metas


# Note [Dtypes eager rejects]
# Meta kernels accept some dtypes that eager's CPU kernels reject ("frac_cpu" not implemented for 'Long'; abs and
# relu of bool): recording succeeds and the reference executor raises at the sync, but a lowered kernel would
# compute a value. A pointwise node is lowered only if eager runs its op on one-element tensors of its inputs'
# dtypes, with placeholder scalars so that the answer never depends on a runtime value; otherwise it stays an
# extern call, which raises at the sync as the reference executor does. The probe runs once per signature, input
# dtypes and device type, on the backing device the graph runs on (eager CUDA takes some that eager CPU rejects).
_EAGER_ACCEPTS: Dict[tuple, bool] = {}


def _eager_accepts(node: Node, device: torch.device) -> bool:
    op = node.op
    if not isinstance(op, torch._ops.OpOverload) or torch.Tag.pointwise not in op.tags:
        return True
    key = (node.sig, tuple(i.dtype for i in node.inputs), device.type)
    ok = _EAGER_ACCEPTS.get(key)
    if ok is None:
        ok = _EAGER_ACCEPTS[key] = _eager_runs(node, device)
    return ok


def _placeholder(marker: _Marker) -> Any:
    return None if marker is GENERATOR else _kind(marker)(1)


def _eager_runs(node: Node, device: torch.device) -> bool:
    ins = iter([torch.ones((1,) * len(i.shape or ()), dtype=i.dtype, device=device) for i in node.inputs])
    try:
        args = _fill(node.args, ins, _placeholder)
        kwargs = {k: _fill(v, ins, _placeholder) for k, v in node.kwargs}
        with eager_dispatch():  # no mode or subclass of the caller sees the probe
            node.op(*args, **kwargs)
    except Exception:  # noqa: BLE001 -- whatever eager raises, the extern call will raise it too
        return False
    return True


def _lower_node(out: Lowered, node: Node, ins: List[Any], slot: int, device: torch.device) -> Any:
    if _supported(node) and _eager_accepts(node, device):
        fn = LOWERINGS.get(_key(node.op))
        if fn is not None:
            try:
                # NOTE: a float16/bfloat16 op computes in float32 and rounds once, as eager's kernels (opmath) do:
                # addcmul, lerp or gelu lowered in half would round between their parts
                half = _has_half(node)
                it = iter(_upcast(ins) if half else ins)
                scalars = _scalar_args(iter(range(slot, slot + len(node.scalars))))
                args = _fill(node.args, it, scalars)
                kwargs = {k: _fill(v, it, scalars) for k, v in node.kwargs}
                return _as_recorded(fn(args, kwargs, _opmath(_meta(node)) if half else _meta(node)), node)
            except Exception:  # noqa: BLE001 -- an overload the table does not cover runs as an extern call
                pass
        dec = decompose(node)
        if dec is not None:
            try:
                upcast = _has_half(node) and all(step[0] is GETITEM_TARGET or _key(step[0]) in LOWERINGS
                                                 for step in dec.steps)
                return _as_recorded(_lower_decomposed(out, dec, ins, slot, upcast), node)
            except Unlowerable:
                pass
    return _extern(out, node.op, node.args, node.kwargs, ins, list(range(slot, slot + len(node.scalars))),
                   _meta(node), node.shape is None)


# Note [Extern inputs are views]
# An extern is an ATen call, and ATen takes strided tensors: an input that only reads a buffer at an affine index
# with non-negative coefficients (a transpose, a slice, a select, an expand of a stored value) is passed as an
# ``as_strided`` view of that buffer instead of being copied by a kernel first. ``F.linear``'s transposed weight is
# the common case: eager passes ``w.t()`` to mm as a view too, so the extern now sees what eager's mm sees. The
# view's buffer counts as the extern's input for lifetimes (it stays alive until the call) and is given a tensor
# at run time like any extern input (runtime/cpp.py).


def _strided_view(v: TVal) -> Optional[tuple]:
    """(buffer, (shape, strides, offset)) if ``v`` reads one buffer at an affine index (Note [Extern inputs are
    views]), with None for the view when it is the whole buffer as laid out; None if ``v`` is no such view."""
    vs = vars_for(v.shape, "x")
    e = v(vs)
    if e.op != "load" or e.dtype is not v.dtype:
        return None
    terms, offset = kir.affine(e.args[1])
    strides = tuple(terms.pop(x, 0) for x in vs)
    if terms or offset < 0 or any(s < 0 for s in strides):
        return None
    buf = e.args[0]
    whole = v.shape == buf.shape and strides == buf.strides and offset == 0
    return buf, None if whole else (v.shape, strides, offset)


# Note [Extern inputs are stored once]
# A value that no kernel keeps (gelu's output: cheap enough to recompute in each kernel that reads it) is stored
# for each extern that reads it: the MLP's second matmul in the forward and its weight gradient in the backward
# read the same gelu output, and each stored it again (a 100 MB pass per layer of a GPT step at batch 64). Extern
# inputs are keyed by what they store (the interned expression, shape and dtype), so the second extern reads the
# first one's buffer; with Note [Matmul inputs in their producer's layout] the transposed read of the backward
# stores the same expression in the same order. Only extern inputs share: two graph outputs stay two buffers.

# Note [Matmul inputs in their producer's layout]
# A matmul's input computed by a kernel is stored in the order its kernel reads memory in, and the matmul reads it
# as a view: the weight gradient of a fused q/k/v projection multiplies the transpose of the cat of the three
# attention grads, which eager stores as the cat ([B*T, 3*C], rows adjacent) and hands to mm as a transpose view.
# Stored in the view's own order instead, every load of the kernel strode a head's width: on an H100 that kernel
# took 0.42 ms of a GPT step at batch 64 where the cat takes 0.05. So the dims are stored in the order of the
# strides the kernel's loads take along them (kir.typical_stride), largest outermost: the order of the memory
# the value is computed from. Only for matmuls, whose results are contiguous whatever their inputs' strides (so
# the buffer plan's layout stays true), and attention (Note [Attention results keep their layout]).
_ANY_LAYOUT = frozenset((torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm))

# Note [Attention results keep their layout]
# The fused attention kernels take q, k and v with any strides (the last one 1) and return results laid out as
# they choose: the output as [B, T, H, D] seen through a transpose, the gradients in their inputs' layout. Stored
# contiguous, as every other extern's results are (runtime/cpp.py run_extern), each cost a copy: 4 of a GPT
# layer's step, 0.8 ms of a 34 ms step at batch 64 on an H100. So their inputs are stored in their producer's
# order (Note [Matmul inputs in their producer's layout]: q, k and v stay the [B, T, H, D] of the projection that
# made them, as eager's are), and their results' buffers take the strides the op's meta kernel gives for those
# inputs. A run whose result has other strides (a meta kernel that disagrees) copies it into the planned layout.
_STRIDED_RESULTS = frozenset(getattr(torch.ops.aten, name) for name in (
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")
    if hasattr(torch.ops.aten, name))


def _result_strides(target: Any, args: tuple, kwargs: tuple, bufs: List[kir.Buffer],
                    views: List[Optional[tuple]], metas: Sequence[Any]) -> List[Optional[tuple]]:
    """The strides of each result of ``target`` as its meta kernel lays them out for these input layouts (Note
    [Attention results keep their layout]); None for a result it does not describe."""
    ins = [torch.empty_strided(*(view[:2] if view is not None else (b.shape, b.strides)), dtype=b.dtype,
                               device="meta") for b, view in zip(bufs, views)]
    it = iter(ins)
    placeholder = lambda marker: _kind(marker)()  # noqa: E731 -- 0, 0.0 or False: no layout depends on them
    try:
        a = _fill(args, it, placeholder)
        kw = {k: _fill(v, it, placeholder) for k, v in kwargs}
        results = target(*a, **kw)
    except Exception:  # noqa: BLE001 -- no meta kernel for these arguments: results stored contiguous
        return [None] * len(metas)
    results = results if isinstance(results, (tuple, list)) else (results,)
    return [tuple(r.stride()) if m is not None and isinstance(r, torch.Tensor) and tuple(r.shape) == tuple(m[0])
            else None for r, m in zip(results, metas)]


def _producer_order(out: Lowered, v: TVal) -> tuple:
    """(buffer, view) of an extern input ``v`` stored with its dims in the order its loads stride through memory,
    largest first (Note [Matmul inputs in their producer's layout]); the view is None when that is ``v``'s own
    order, or when some dim's stride cannot be told (a gather): then ``v`` is stored in its own order."""
    vs = vars_for(v.shape, "x")
    e = v(vs)
    reads = [x.args[1] for x in kir.walk(e) if x.op == "load"]
    strides = []
    for d, x in enumerate(vs):
        steps = [kir.typical_stride(i, x) for i in reads if x in kir.free_vars(i)]
        if None in steps and v.shape[d] > 1:
            break
        strides.append(max((abs(st) for st in steps if st is not None), default=0))
    perm = sorted(range(len(vs)), key=lambda d: -strides[d]) if len(strides) == len(vs) else list(range(len(vs)))
    if perm == list(range(len(vs))):
        return out.store(v.shape, v.dtype, vs, e, shared=True), None
    shape = [v.shape[d] for d in perm]
    stored = vars_for(shape, "x")
    index: List[Any] = [None] * len(vs)
    for j, d in enumerate(perm):
        index[d] = stored[j]
    buf = out.store(shape, v.dtype, stored, v(index), shared=True)
    view_strides = [0] * len(vs)
    for j, d in enumerate(perm):
        view_strides[d] = buf.strides[j]
    return buf, (tuple(v.shape), tuple(view_strides), 0)


def _extern(out: Lowered, fn: Any, args: tuple, kwargs: tuple, ins: List[Any], slots: List[int], meta: Any,
            multi: bool) -> Any:
    bufs: List[kir.Buffer] = []
    views: List[Optional[tuple]] = []
    target = getattr(fn, "target", fn)  # an unseeded op's (Note [Random ops that draw nothing])
    packet = getattr(target, "overloadpacket", None)
    any_layout = packet in _ANY_LAYOUT or packet in _STRIDED_RESULTS
    for v in ins:
        view = _strided_view(v) if v.buffer is None else None
        if view is None and v.buffer is None:
            view = _producer_order(out, v) if any_layout else (out.realize(v, shared=True), None)
        buf, spec = view if view is not None else (v.buffer, None)
        bufs.append(buf)
        views.append(spec)
    metas = meta if multi else (meta,)
    strides = _result_strides(target, args, kwargs, bufs, views, metas) if packet in _STRIDED_RESULTS else \
        [None] * len(metas)
    outs = [out.buffer(m[0], m[1], st, kind="extern") if m is not None else None for m, st in zip(metas, strides)]
    out.steps.append(Extern(fn, args, kwargs, bufs, slots, outs, views))
    name = op_name(fn)
    out.externs_by_op[name] = out.externs_by_op.get(name, 0) + 1
    vals = [from_buffer(b) if b is not None else None for b in outs]
    return vals if multi else vals[0]


def _as_recorded(result: Any, node: Node) -> Any:
    """``result`` with the dtypes the recorder gave the node: a float16/bfloat16 node computed in float32 is cast
    back (rounded once, Note [Half precision] in codegen/cpp_expr.py), and where a decomposition (written against the
    meta kernels) disagrees with eager CPU, eager wins (norm statistics of half inputs, trace/meta.py)."""
    def fix(v: Any, meta: Any) -> Any:
        if not isinstance(v, TVal) or meta is None or v.dtype is meta[1] or tuple(v.shape) != tuple(meta[0]):
            return v
        return TVal(v.shape, meta[1], lambda idx: kir.cast(v(idx), meta[1]))
    if node.shape is not None:
        return fix(result, (node.shape, node.dtype))
    if isinstance(result, (list, tuple)) and node.metas is not None and len(result) == len(node.metas):
        return type(result)(fix(v, m) for v, m in zip(result, node.metas))
    return result


_HALF = (torch.float16, torch.bfloat16)


def _has_half(node: Node) -> bool:
    return node.dtype in _HALF if node.shape is not None else any(m is not None and m[1] in _HALF
                                                                  for m in node.metas or ())


def _upcast(ins: List[Any]) -> List[Any]:
    return [TVal(v.shape, torch.float32, lambda idx, v=v: kir.cast(v(idx), torch.float32))
            if isinstance(v, TVal) and v.dtype in _HALF else v for v in ins]


def _opmath(meta: Any) -> Any:
    """``meta`` ((shape, dtype), or a tuple of them) with float16/bfloat16 computed as float32."""
    if meta is None:
        return None
    if len(meta) == 2 and isinstance(meta[1], torch.dtype):
        return (meta[0], torch.float32) if meta[1] in _HALF else meta
    return tuple(_opmath(m) for m in meta)


def _lower_decomposed(out: Lowered, dec: Any, ins: List[Any], slot: int, upcast: bool = False) -> Any:
    """The decomposition's steps, each lowered (or extern). With ``upcast`` (a float16/bfloat16 node whose steps all
    have lowerings), they compute in float32, rounded once at the end (_as_recorded), as eager's kernels for
    composite ops (softmax, norms, losses) do; decompositions with extern steps (index_put's accumulation) keep
    the node's dtype, so the extern rounds as eager's kernel does."""
    vals: List[Any] = []
    ins = _upcast(ins) if upcast else ins

    def conv(x: Any) -> Any:
        if type(x) is tuple and len(x) == 2 and x[0] in ("in", "val") and type(x[1]) is int:
            return ins[x[1]] if x[0] == "in" else vals[x[1]]
        if isinstance(x, ScalarRef):
            return ScalarArg(slot + x.k, float if out.scalar_kinds[slot + x.k] is float else int)
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, torch.device):
            return None
        return x

    for target, args, kwargs, meta, multi in dec.steps:
        meta = _opmath(meta) if upcast else meta
        a = conv(args)
        kw = {k: conv(v) for k, v in kwargs.items()}
        if target is GETITEM_TARGET:
            vals.append(a[0][a[1]])
            continue
        metas = meta if multi else None
        fn = LOWERINGS.get(_key(target))
        supported = all(m is None or m[1] in SUPPORTED_DTYPES for m in (metas or (meta,)) if m is not None)
        v = None
        if fn is not None and metas is None and meta is not None and supported:
            try:
                v = fn(a, kw, meta)
            except Exception:  # noqa: BLE001 -- as in _lower_node
                v = None
        if v is None:
            v = _extern_fx(out, target, args, kwargs, a, kw, slot, metas if metas is not None else meta,
                           metas is not None)
        vals.append(v)
    return conv(dec.result)


def _extern_fx(out: Lowered, target: Any, args: Any, kwargs: dict, a: Any, kw: dict, slot: int, meta: Any,
               multi: bool) -> Any:
    """An op inside a decomposition with no lowering: an extern call with a template built from its FX args."""
    ins: List[TVal] = []
    slots: List[int] = []

    def tpl(x: Any, filled: Any) -> Any:
        if isinstance(filled, TVal):
            ins.append(filled)
            return TENSOR
        if isinstance(x, ScalarRef):
            slots.append(slot + x.k)
            return SCALAR_MARKERS[out.scalar_kinds[slot + x.k] if out.scalar_kinds[slot + x.k] in (int, float, bool)
                                  else float]
        if isinstance(x, torch.device):
            return DEVICE
        if type(x) is tuple and len(x) == 2 and x[0] in ("in", "val") and type(x[1]) is int:
            raise Unlowerable(f"extern {target} with a non-tensor value argument")
        if isinstance(x, (list, tuple)):
            return tuple(tpl(p, q) for p, q in zip(x, filled))
        return x

    targs = tuple(tpl(x, f) for x, f in zip(args, a))
    tkw = tuple((k, tpl(kwargs[k], kw[k])) for k in kwargs)
    return _extern(out, target, targs, tkw, ins, slots, meta, multi)
