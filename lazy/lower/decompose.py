"""Decomposition of composite ATen ops to core ops with PyTorch's own ``torch._decomp`` tables.

Note [Decompositions keep runtime scalars]
A node is decomposed by tracing its decomposition with ``make_fx`` on meta tensors, memoized per signature (op,
argument templates, input shapes and dtypes). Runtime scalars (Note [Argument templates]) must stay runtime
inputs of the decomposed graph, not constants baked into it: the trace is run twice with two different sets of
sentinel values for the scalar slots (once where the node has none), and an FX argument that equals slot k's
sentinel in both traces, at the same place, becomes ``ScalarRef(k)``. If the two traces differ anywhere else (a
scalar was transformed, or decided control flow), the node is not decomposed and runs as an extern call.
"""
from __future__ import annotations

import collections
import functools
import operator
from typing import Any, Dict, List, Optional

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..ir.node import DEVICE, GENERATOR, SCALAR_MARKERS, TENSOR, Node, Op, _Marker
from ..ir.ops import functionalized
from . import op_trace

aten = torch.ops.aten

_EXTRA = ("_softmax", "_log_softmax", "native_layer_norm", "var", "var_mean", "std", "std_mean",
          "_softmax_backward_data", "_log_softmax_backward_data", "gelu_backward", "sigmoid_backward",
          "tanh_backward", "threshold_backward", "addmm", "mse_loss", "mse_loss_backward", "silu_backward",
          "leaky_relu", "leaky_relu_backward", "elu", "softplus", "logsumexp", "hardtanh_backward", "hardsigmoid",
          "hardswish", "mish", "native_dropout_backward", "log_sigmoid_forward", "logit", "xlogy", "nan_to_num",
          "native_layer_norm_backward", "linalg_vector_norm", "norm", "frac", "hypot", "sgn", "native_group_norm")


@functools.lru_cache(maxsize=1)
def table() -> Dict[Any, Any]:
    from torch._decomp import core_aten_decompositions, get_decompositions
    d = dict(core_aten_decompositions())
    d.update(get_decompositions([getattr(aten, n) for n in _EXTRA if hasattr(aten, n)]))
    d[functionalized(aten.native_batch_norm.default, *_BN_FUNCTIONALIZED)] = _batch_norm_training
    d[aten._softmax.default] = functools.partial(_softmax, d[aten._softmax.default])
    return d


def _softmax(pytorch: Any, x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    """aten._softmax as eager's CPU kernel computes it: ``exp(x - max)`` times the reciprocal of its sum.

    Note [Softmax multiplies by the reciprocal]
    PyTorch's decomposition (``pytorch``) divides each ``exp(x - max)`` by the row's sum; eager's CPU kernel
    (_vec_softmax_lastdim) computes ``1 / sum`` once per row and multiplies, which is what this does. A division
    is the slowest vector op: on the AMD EPYC (1 thread) a float division of a vector costs several multiplies'
    throughput, and softmax 4096 x 1024 ran 7 % faster with the multiply (AVX2 and AVX-512 alike). Each value is
    within 1.5 ulp of the quotient (two roundings; the division's 0.5), as eager's. The same decomposition serves a
    cuda backing device, whose eager kernel divides: within assert_close's tolerances of it. Empty rows keep
    PyTorch's decomposition (its padding of the max)."""
    if x.numel() == 0 or x.dim() == 0:
        return pytorch(x, dim, half_to_float)
    x = x.contiguous()  # eager returns a contiguous tensor
    computation, result_dtype = elementwise_dtypes(x, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    x = x.to(computation)
    unnormalized = torch.exp(x - torch.amax(x, dim, keepdim=True))
    result = unnormalized * torch.reciprocal(torch.sum(unnormalized, dim, keepdim=True))
    return result if half_to_float else result.to(result_dtype)


_BN_FUNCTIONALIZED = ((3, 4), (), (0, 1, 2))  # the running stats it updates; its three returns


def _batch_norm_training(input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                         training: bool, momentum: float, eps: float) -> tuple:
    """native_batch_norm in training mode, functionalized (lazy/ir/ops.py): (out, save_mean, save_invstd, new
    running_mean, new running_var), as CPU eager computes them.

    Note [Batch norm's forward as kernels]
    PyTorch's decomposition of the functional batch norm computes ``(1 - momentum) * running_mean`` in Python, so
    its traces differ with the momentum and the node stayed an extern call (a captured CNN step spent 135 us in
    two of them). Here the momentum and eps reach ops as arguments, runtime scalars as in eager: the statistics
    are a biased var_mean over every dimension but the channels, the update ``running + momentum * (stat -
    running)`` with the unbiased variance (``n / (n - 1)`` a static factor of the shape). Eval mode (no update)
    and half-precision inputs (eager keeps float statistics) stay extern calls."""
    if not training or running_mean is None or running_var is None or \
            input.dtype not in (torch.float32, torch.float64) or input.dim() < 2:
        raise NotImplementedError("an extern call")
    dims = [0] + list(range(2, input.dim()))
    n = input.numel() // input.shape[1]
    var, mean = torch.var_mean(input, dims, correction=0, keepdim=True)
    invstd = torch.rsqrt(var + eps)
    out = (input - mean) * invstd
    shape = [1, input.shape[1]] + [1] * (input.dim() - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    save_mean, save_invstd = mean.reshape(-1), invstd.reshape(-1)
    unbiased = var.reshape(-1) * (n / (n - 1)) if n > 1 else var.reshape(-1) * float("inf")
    new_mean = torch.add(running_mean, save_mean - running_mean, alpha=momentum)
    new_var = torch.add(running_var, unbiased - running_var, alpha=momentum)
    return out, save_mean, save_invstd, new_mean, new_var


class ScalarRef:
    """The k-th runtime scalar of the decomposed node (its slot relative to the node's first scalar)."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k

    def __repr__(self) -> str:
        return f"ScalarRef({self.k})"


class Decomposed:
    """A node's decomposition: ``steps`` of (target, args, kwargs, meta, multi) where meta is (shape, dtype) or,
    if multi, a tuple of them; args hold
    ``("in", i)`` for the node's i-th input, ``("val", j)`` for step j's value, ScalarRef and constants."""

    __slots__ = ("steps", "result")

    def __init__(self, steps: List[tuple], result: Any) -> None:
        self.steps = steps
        self.result = result


# The traces by op, arguments and input shapes, the most recently used last: a process that meets ever new shapes
# (a dynamic capture's sizes, a stream of models) keeps the MEMO_SIZE latest, not every trace it ever made.
MEMO_SIZE = 4096
_MEMO: "collections.OrderedDict[tuple, Optional[Decomposed]]" = collections.OrderedDict()


def decompose(node: Node) -> Optional[Decomposed]:
    if node.op not in table():
        return None
    key = (node.op, node.args, node.kwargs, tuple((i.shape, i.dtype) for i in node.inputs))
    memo = _MEMO
    if key in memo:
        memo.move_to_end(key)
        return memo[key]
    try:
        traced = _trace(node)
    except Exception:  # noqa: BLE001 -- a decomposition that does not trace runs as an extern call
        traced = None
    memo[key] = traced
    while len(memo) > MEMO_SIZE:
        memo.popitem(last=False)
    return traced


def _sentinels(node: Node, salt: int) -> List[Any]:
    out = []
    for k, s in enumerate(_scalar_markers(node)):
        if s is SCALAR_MARKERS[float]:
            out.append(1.0 + (salt * 7919 + k * 104729) * 1.1920929e-3 + 0.123456789)
        elif s is SCALAR_MARKERS[int]:
            out.append(900001 + salt * 7919 + k * 104729)
        else:
            raise ValueError("bool/complex runtime scalars are not traced")
    return out


def _scalar_markers(node: Node) -> List[_Marker]:
    found: List[_Marker] = []

    def visit(v: Any) -> None:
        if type(v) is _Marker and v is not TENSOR and v is not DEVICE:
            if v is GENERATOR:
                raise ValueError("random op")
            found.append(v)
        elif type(v) is tuple:
            for x in v:
                visit(x)
    visit(node.args)
    for _, v in node.kwargs:
        visit(v)
    return found


def _trace_once(node: Node, sentinels: List[Any], use_make_fx: bool = False) -> list:
    """The nodes of the node's decomposition traced on meta tensors: by the light tracer (Note [Tracing
    decompositions without FX] in lazy/lower/op_trace.py), or by make_fx where it cannot follow the function."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fill(v: Any, ins: Any, sc: Any) -> Any:
        if v is TENSOR:
            return next(ins)
        if v is DEVICE:
            return torch.device("meta")
        if type(v) is _Marker:
            return next(sc)
        if type(v) is tuple:
            return [fill(x, ins, sc) for x in v]
        return v

    # an internal op (functionalized native_batch_norm) is traced through its entry of the table
    target = table()[node.op] if isinstance(node.op, Op) else node.op

    def fn(*tensors: torch.Tensor) -> Any:
        ins, sc = iter(tensors), iter(sentinels)
        args = fill(node.args, ins, sc)
        kwargs = {k: fill(v, ins, sc) for k, v in node.kwargs}
        return target(*args, **kwargs)

    metas = [torch.empty(i.shape, dtype=i.dtype, device="meta") for i in node.inputs]
    if not use_make_fx and LIGHT_TRACE:
        try:
            return op_trace.trace(fn, metas, table())
        except op_trace.Untraceable:
            pass
    return list(make_fx(fn, decomposition_table=table())(*metas).graph.nodes)


LIGHT_TRACE = True  # False: every trace through make_fx (tests compare the two)
_NODES = (torch.fx.Node, op_trace.Step)


# NOTE: two sentinel traces catch a scalar that is transformed, not one a decomposition compares with a special
# value: vector_norm(ord) returns abs(x) over size-1 dims unless ord == 0; addmm drops self if beta == 0. The
# decomposition is kept only if the traces with every scalar at each of these values take the sentinels' branch.
SPECIAL_VALUES = ((0.0, 0), (1.0, 1), (float("inf"), -1), (float("-inf"), 2))


def _special_trace(node: Node, values: tuple) -> Optional[list]:
    scalars = [values[0] if m is SCALAR_MARKERS[float] else values[1] for m in _scalar_markers(node)]
    try:
        return _trace_once(node, scalars)
    except Exception:  # noqa: BLE001 -- a value the decomposition rejects: not the same branch
        return None


def _same_branch(na: list, ns: Optional[list], sentinel_slots: Dict[Any, int]) -> bool:
    """Whether trace ``ns`` (special scalar values) has the ops of trace ``na`` (sentinels), with equal static
    arguments everywhere but where ``na`` passes a sentinel on."""
    if ns is None or len(na) != len(ns):
        return False
    index = {x: i for i, x in enumerate(na)}
    index_s = {y: i for i, y in enumerate(ns)}

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, _NODES):
            return isinstance(y, _NODES) and index[x] == index_s[y]
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
        if type(x) in (int, float) and x in sentinel_slots:
            return True
        return type(x) is type(y) and x == y

    return all(x.op == y.op and x.target == y.target and same(tuple(x.args), tuple(y.args)) and
               x.kwargs.keys() == y.kwargs.keys() and all(same(v, y.kwargs[k]) for k, v in x.kwargs.items())
               for x, y in zip(na, ns))


def _trace(node: Node) -> Optional[Decomposed]:
    a, b = _sentinels(node, 0), _sentinels(node, 1)
    # NOTE: without runtime scalars the second trace would run the same function on the same inputs: the first
    # serves as both (a trace is deterministic: random ops are not traced, _scalar_markers)
    na = _trace_once(node, a)
    nb = _trace_once(node, b) if a else na
    if len(na) != len(nb):
        return None
    ref_a = {v: k for k, v in enumerate(a)}
    pos: Dict[Any, Any] = {}
    steps: List[tuple] = []
    n_in = 0
    result = None

    def conv(x: Any, y: Any) -> Any:
        if isinstance(x, _NODES):
            return pos[x]
        if isinstance(x, (list, tuple)):
            if not isinstance(y, (list, tuple)) or len(x) != len(y):
                raise ValueError("diverging traces")
            return type(x)(conv(p, q) for p, q in zip(x, y))
        if type(x) in (int, float) and x in ref_a and y == b[ref_a[x]]:
            return ScalarRef(ref_a[x])
        if type(x) is not type(y) or x != y:
            raise ValueError("diverging traces")
        return x

    if a and not all(_same_branch(na, _special_trace(node, v), ref_a) for v in SPECIAL_VALUES):
        return None
    for x, y in zip(na, nb):
        if x.op != y.op or x.target != y.target:
            return None
        if x.op == "placeholder":
            pos[x] = ("in", n_in)
            n_in += 1
        elif x.op == "call_function":
            args = conv(tuple(x.args), tuple(y.args))
            kwargs = {k: conv(v, y.kwargs[k]) for k, v in x.kwargs.items()}
            val = x.meta.get("val")
            multi = isinstance(val, (tuple, list))
            meta = tuple((tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None for v in val) \
                if multi else ((tuple(val.shape), val.dtype) if isinstance(val, torch.Tensor) else None)
            pos[x] = ("val", len(steps))
            steps.append((x.target, args, kwargs, meta, multi))
        elif x.op == "output":
            result = conv(x.args[0], y.args[0])
        else:
            return None
    return Decomposed(steps, result)


GETITEM_TARGET = operator.getitem
