"""Collectives on lazy tensors as IR nodes: recorded like any op, run at the sync through the real process group.

A collective node is an internal op (``lazy.ir.node.Op``) whose eager implementation calls the process group's
own collective on the backing tensors (gloo on the cpu, NCCL on cuda): to the executors and the compiler it is an
extern call like any other, so a training step with its gradient all-reduces stays one graph and one sync. Its
static arguments (kind, reduction, group name, root rank) and its shape and dtype are part of the node signature,
so the graph cache keys include the collectives.

Note [Collectives run in recorded order]
Every rank must run the same collectives in the same order, or they pair wrong tensors or wait forever. Each
collective node takes the previous pending collective's result as an extra input (a token, as XLA orders its
collectives), so every topological order of a graph, on every executor, runs them in the order they were
recorded, whatever else the graph holds. The newest result is kept alive (``_LAST``), so a collective whose own
result is dropped still runs at the next ``mark_step``, on every rank alike, instead of silently on some ranks only.
Once that result is computed it stays the token, as a data leaf, while the program that computes it may still run:
with asynchronous execution (Note [Asynchronous execution] in lazy/sync/launch.py) it may be the output of a program
on the worker thread, and a graph that reads it waits for that program before it runs on the calling thread. So
collectives never run on two threads at once, where the ranks could interleave them differently. Once that program
has run, nothing is left to order against, and the next collective takes no token: a captured step (lazy.compile)
then reads no result of an earlier step that its inputs do not reach.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..device.tensor import LazyTensor, new_tensor
from ..ir.layout import contiguous_stride
from ..ir.node import TENSOR, Node, Op, getitem
from ..sync import launch
from ..trace import record

aten = torch.ops.aten


class CollectiveError(RuntimeError):
    """A collective of a lazy graph failed at the sync: another rank died, raised, or timed out."""


class UnsupportedCollective(RuntimeError):
    """A collective (or a reduction) that lazy tensors do not support."""


# Reductions by name (the names of torch.distributed._functional_collectives) and by c10d's RedOpType.
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
               "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
               "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
_BY_TYPE = {getattr(dist.ReduceOp.RedOpType, name.upper()): name for name in _REDUCE_OPS}


def reduce_name(op: Any) -> str:
    """The name of a reduction given as a string, a ``dist.ReduceOp`` or its RedOpType."""
    if isinstance(op, str):
        name = op.lower()
    else:
        red = getattr(op, "op", op)
        name = _BY_TYPE.get(red)
        if name is None:
            raise UnsupportedCollective(f"lazy.distributed: the reduction {op} is not supported on lazy tensors "
                                        f"(supported: {', '.join(_REDUCE_OPS)}); PREMUL_SUM: scale, then sum")
    if name not in _REDUCE_OPS:
        raise UnsupportedCollective(f"lazy.distributed: unknown reduction {op!r} (supported: {', '.join(_REDUCE_OPS)})")
    return name


def resolve_group(name: str) -> Any:
    """The process group of a group name (``pg.group_name``), as functional collectives resolve it."""
    return c10d._resolve_process_group(name)


def group_name(group: Any) -> str:
    """The name of a process group given as an object, a name, or None (the default group)."""
    if isinstance(group, str):
        return group
    if group is None:
        group = c10d._get_default_group()
    return group.group_name


# ---------------------------------------------------------------------------------------------------------------
# Execution at the sync (on backing tensors)

def _wait(work: Any, what: str, group: str) -> None:
    try:
        work.wait()
    except Exception as error:  # noqa: BLE001 -- whatever the backend raises, it is reported with its context
        try:
            pg = resolve_group(group)
            where = f"rank {pg.rank()} of {pg.size()}"
        except Exception:  # noqa: BLE001 -- a group destroyed meanwhile: report the failure without its ranks
            where = "destroyed since"
        raise CollectiveError(
            f"lazy.distributed: {what} on process group {group!r} ({where}) failed at the "
            f"sync: {error}. Another rank probably died, raised, or ran different collectives; the wait is bounded "
            "by the process group's timeout (init_process_group(timeout=...))") from error


def _dense(x: torch.Tensor) -> torch.Tensor:
    # A new contiguous tensor: backends take dense tensors, and the input (a graph value) is never written.
    return x.clone(memory_format=torch.contiguous_format)


def _all_reduce(x: torch.Tensor, *token: torch.Tensor, group: str, reduce: str) -> torch.Tensor:
    return _all_reduce_dense(_dense(x), group, reduce)


def _all_reduce_dense(out: torch.Tensor, group: str, reduce: str) -> torch.Tensor:
    """``out`` (a new dense tensor) reduced over the group in place."""
    pg = resolve_group(group)
    if pg.size() == 1:  # every reduction of one rank's tensor is that tensor; gloo would still hand it to a thread
        return out
    opts = dist.AllreduceOptions()
    opts.reduceOp = _REDUCE_OPS[reduce]
    _wait(pg.allreduce([out], opts), f"all_reduce({reduce})", group)
    if reduce == "avg":  # gloo has no AVG: a sum divided by the group size (what NCCL's AVG computes too)
        out.div_(pg.size())
    return out


def _broadcast(x: torch.Tensor, *token: torch.Tensor, group: str, src: int) -> torch.Tensor:
    out = _dense(x)
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    opts.rootTensor = 0
    _wait(resolve_group(group).broadcast([out], opts), f"broadcast(src={src})", group)
    return out


def _all_gather(x: torch.Tensor, *token: torch.Tensor, group: str) -> torch.Tensor:
    pg = resolve_group(group)
    x = x.contiguous()
    out = x.new_empty((pg.size() * x.shape[0],) + tuple(x.shape[1:]) if x.dim() else (pg.size(),))
    _wait(pg._allgather_base(out, x), "all_gather_into_tensor", group)
    return out


def _reduce_scatter(x: torch.Tensor, *token: torch.Tensor, group: str, reduce: str) -> torch.Tensor:
    pg = resolve_group(group)
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // pg.size(),) + tuple(x.shape[1:]))
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _REDUCE_OPS[reduce]
    _wait(pg._reduce_scatter_base(out, x, opts), f"reduce_scatter_tensor({reduce})", group)
    if reduce == "avg":
        out.div_(pg.size())
    return out


def _all_reduce_coalesced(*xs: torch.Tensor, group: str, reduce: str, count: int) -> tuple:
    xs = xs[:count]  # the rest is the token
    flat = _all_reduce(torch.cat([x.reshape(-1) for x in xs]), group=group, reduce=reduce)
    return tuple(piece.view(x.shape) for piece, x in zip(flat.split([x.numel() for x in xs]), xs))


def _all_reduce_concat(*xs: torch.Tensor, group: str, reduce: str, count: int) -> torch.Tensor:
    return _all_reduce_dense(torch.cat(xs[:count]), group, reduce)  # the rest is the token; cat's result is new


ALL_REDUCE = Op("c10d_all_reduce", _all_reduce)
ALL_REDUCE_CONCAT = Op("c10d_all_reduce_concat", _all_reduce_concat)
ALL_REDUCE_COALESCED = Op("c10d_all_reduce_coalesced", _all_reduce_coalesced)
BROADCAST = Op("c10d_broadcast", _broadcast)
ALL_GATHER = Op("c10d_all_gather_into_tensor", _all_gather)
REDUCE_SCATTER = Op("c10d_reduce_scatter_tensor", _reduce_scatter)
# Note [Coalesced all-reduce]
# Many tensors all-reduced together (``all_reduce_gradients``, ``all_reduce_coalesced``) are one node with one
# output per tensor: at the sync it concatenates them on the backing device, runs one collective and splits the
# result. Concatenating them in the graph instead (``torch.cat``, as DDP's buckets do) would cost the same one
# collective, but the C++ compiler fuses each gradient's computation into the concatenation, where every element
# evaluates the branches of all inputs: a 28-gradient cat of 106 K elements took seconds per step.
# Note [All-reduce of a buffer written in pieces]
# DDP's Reducer writes each gradient into its block of a flat bucket (``bucket_view.mul_(grad, 1 / world)``; the
# views are slices: Note [Dense blocks of a dense storage are slices] in lazy/trace/views.py), all-reduces the bucket
# and reads the blocks back. Recorded as it is written, the bucket's value is a chain of one ``slice_scatter`` per
# gradient, which the C++ compiler fuses into one kernel where every element evaluates every gradient's branch (and
# its producer): over a second per step for 28 gradients. So an all-reduce of a 1-d value that is such a chain is
# recorded as ALL_REDUCE_CONCAT of the pieces, in order (blocks never written are slices of the value under the
# chain), which concatenates them on the backing device inside the collective, as the coalesced all-reduce does. Its
# result is the flat buffer; the reads of the blocks are slices of it, which lower to index maps.
OPS = frozenset((ALL_REDUCE, ALL_REDUCE_CONCAT, ALL_REDUCE_COALESCED, BROADCAST, ALL_GATHER, REDUCE_SCATTER))


def describe_node(node: Node) -> str:
    """One collective node as text: ``all_reduce(sum) float32[8, 4] on group '0'``."""
    kw = dict(node.kwargs)
    extra = kw.get("reduce", f"src={kw['src']}" if "src" in kw else "")
    inputs = node.inputs[:kw.get("count", 1)]
    dtype = str(inputs[0].dtype).replace("torch.", "")
    shapes = ", ".join(str(list(i.shape)) for i in inputs)
    return f"{node.op.name[5:]}({extra}) {dtype}{shapes} on group {kw['group']!r}"


# ---------------------------------------------------------------------------------------------------------------
# Recording

_LAST: List[Optional[LazyTensor]] = [None]  # Note [Collectives run in recorded order]


def _token() -> Optional[Node]:
    last = _LAST[0]
    if last is None:
        return None
    value = last._lz_st.value
    # a failed graph's collectives never run: chaining on one would run it again
    if value is last._lz_st.failed or value.is_data and not launch.in_flight(value.data):
        return None
    return value


def check_lazy(x: Any, what: str) -> LazyTensor:
    if not isinstance(x, LazyTensor):
        raise UnsupportedCollective(f"lazy.distributed: {what} mixes lazy and {getattr(x, 'device', type(x))} "
                                    "tensors; move every tensor of a collective to the lazy device")
    return x


def _emit(op: Op, x: LazyTensor, shape: Tuple[int, ...], kwargs: tuple, what: str) -> LazyTensor:
    check_lazy(x, what)
    token = _token()
    ins = (record._value(x),) if token is None else (record._value(x), token)
    node = Node(op, (TENSOR,) * len(ins), kwargs, ins, (), shape, x.dtype)
    out = new_tensor((shape, contiguous_stride(shape), 0, x.dtype), node, math.prod(shape))
    _LAST[0] = out
    return out



def _group_size(group: str) -> int:
    return resolve_group(group).size()


def all_reduce(x: LazyTensor, reduce: str, group: str) -> LazyTensor:
    """A new lazy tensor: the reduction of ``x`` over the group (recorded, run at the sync)."""
    if reduce == "avg" and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise UnsupportedCollective(f"lazy.distributed: all_reduce(avg) of a {x.dtype} tensor; use sum and divide")
    kwargs = (("group", group), ("reduce", reduce))
    pieces = _written_pieces(record._value(check_lazy(x, "all_reduce")))
    if pieces is None:
        return _emit(ALL_REDUCE, x, tuple(x.shape), kwargs, "all_reduce")
    token = _token()  # Note [All-reduce of a buffer written in pieces]
    ins = tuple(pieces) + (() if token is None else (token,))
    node = Node(ALL_REDUCE_CONCAT, (TENSOR,) * len(ins), kwargs + (("count", len(pieces)),), ins, (),
                tuple(x.shape), x.dtype)
    out = new_tensor((tuple(x.shape), (1,), 0, x.dtype), node, x.numel())
    _LAST[0] = out
    return out


_MIN_PIECES = 2  # a chain of one write is as cheap to lower as the collective's own copy


def _written_pieces(value: Node) -> Optional[List[Node]]:
    """The 1-d pieces that tile ``value``, in order, if it is a chain of slice_scatters into disjoint blocks of a
    1-d value (Note [All-reduce of a buffer written in pieces]); else None."""
    if len(value.shape) != 1:
        return None
    blocks: List[Tuple[int, int, Node]] = []
    node = value
    while node.op is aten.slice_scatter.default and node.inputs[0].shape == value.shape:
        if len(node.args) != 6 or node.kwargs:
            return None
        _, _, dim, start, end, step = node.args
        src = node.inputs[1]
        if dim != 0 or step != 1 or type(start) is not int or type(end) is not int or not \
                0 <= start < end <= value.shape[0] or src.shape != (end - start,) or src.dtype != value.dtype or \
                any(s < end and start < e for s, e, _ in blocks):
            return None
        blocks.append((start, end, src))
        node = node.inputs[0]
    if len(blocks) < _MIN_PIECES:
        return None
    blocks.sort(key=lambda b: b[0])
    pieces: List[Node] = []
    at = 0
    for start, end, src in blocks + [(value.shape[0], value.shape[0], None)]:
        if start > at:  # a block no write reached: the value under the chain
            pieces.append(Node(aten.slice.Tensor, (TENSOR, 0, at, start, 1), (), (node,), (), (start - at,),
                               value.dtype))
        if src is not None:
            pieces.append(src)
        at = end
    return pieces


def all_reduce_coalesced(xs: Sequence[LazyTensor], reduce: str, group: str) -> List[LazyTensor]:
    """New lazy tensors: the reductions of ``xs`` (one dtype) over the group, as one collective on their
    concatenation (Note [Coalesced all-reduce])."""
    if len({x.dtype for x in xs}) != 1:
        raise UnsupportedCollective("lazy.distributed: a coalesced all_reduce of several dtypes; group by dtype")
    if reduce == "avg" and not (xs[0].dtype.is_floating_point or xs[0].dtype.is_complex):
        raise UnsupportedCollective(f"lazy.distributed: all_reduce(avg) of {xs[0].dtype} tensors; use sum")
    token = _token()
    ins = tuple(record._value(check_lazy(x, "all_reduce_coalesced")) for x in xs) + (() if token is None else (token,))
    metas = tuple((tuple(x.shape), x.dtype) for x in xs)
    node = Node(ALL_REDUCE_COALESCED, (TENSOR,) * len(ins), (("group", group), ("reduce", reduce), ("count", len(xs))),
                ins, (), None, None, metas)
    outs = [new_tensor((shape, contiguous_stride(shape), 0, dtype), getitem(node, i), math.prod(shape))
            for i, (shape, dtype) in enumerate(metas)]
    _LAST[0] = outs[-1]
    return outs


def broadcast(x: LazyTensor, src: int, group: str) -> LazyTensor:
    """A new lazy tensor: ``x`` of the group rank ``src`` on every rank."""
    return _emit(BROADCAST, x, tuple(x.shape), (("group", group), ("src", int(src))), "broadcast")


def all_gather(x: LazyTensor, group: str) -> LazyTensor:
    """A new lazy tensor: the ``x`` of every rank, concatenated along dim 0 in group-rank order."""
    n = _group_size(group)
    shape = (n * x.shape[0],) + tuple(x.shape[1:]) if x.dim() else (n,)
    return _emit(ALL_GATHER, x, shape, (("group", group),), "all_gather_into_tensor")


def reduce_scatter(x: LazyTensor, reduce: str, group: str) -> LazyTensor:
    """A new lazy tensor: this rank's part (dim 0 split in group-size parts) of the reduction of ``x``."""
    n = _group_size(group)
    if x.dim() == 0 or x.shape[0] % n:
        raise UnsupportedCollective(f"lazy.distributed: reduce_scatter_tensor of shape {list(x.shape)} over {n} "
                                    f"ranks: dim 0 must be a multiple of the group size")
    if reduce == "avg" and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise UnsupportedCollective(f"lazy.distributed: reduce_scatter(avg) of a {x.dtype} tensor; use sum")
    shape = (x.shape[0] // n,) + tuple(x.shape[1:])
    return _emit(REDUCE_SCATTER, x, shape, (("group", group), ("reduce", reduce)), "reduce_scatter_tensor")


def write(target: Any, result: LazyTensor, what: str) -> None:
    """``target`` (a lazy tensor, maybe a view) takes the elements of ``result`` (same numel), as a collective
    that writes its output tensor in place does."""
    check_lazy(target, what)
    value = record._value(result)
    shape = tuple(target.shape)
    if result.numel() != target.numel():
        raise UnsupportedCollective(f"lazy.distributed: {what} writes {result.numel()} elements into a tensor of "
                                    f"shape {list(shape)}")
    if tuple(result.shape) != shape:
        value = Node(aten.view.default, (TENSOR, shape), (), (value,), (), shape, value.dtype)
    record._write_back(target, value)


def pieces(flat: LazyTensor, shapes: Sequence[Tuple[int, ...]]) -> List[Node]:
    """Consecutive pieces of the elements of ``flat`` (in row-major order), one per shape (a node of that shape)."""
    out: List[Node] = []
    at = 0
    value = record._value(flat)
    if value.shape != (flat.numel(),):
        value = Node(aten.view.default, (TENSOR, (flat.numel(),)), (), (value,), (), (flat.numel(),), value.dtype)
    for shape in shapes:
        n = 1
        for s in shape:
            n *= s
        piece = Node(aten.slice.Tensor, (TENSOR, 0, at, at + n), (), (value,), (), (n,), value.dtype)
        out.append(Node(aten.view.default, (TENSOR, tuple(shape)), (), (piece,), (), tuple(shape), value.dtype))
        at += n
    return out


def concat(tensors: Sequence[LazyTensor]) -> LazyTensor:
    """The 1-d concatenation of ``tensors`` (same dtype), as a new lazy tensor."""
    values = []
    for t in tensors:
        v = record._value(check_lazy(t, "a coalesced collective"))
        n = t.numel()
        values.append(Node(aten.view.default, (TENSOR, (n,)), (), (v,), (), (n,), v.dtype) if v.shape != (n,)
                      else v)
    total = sum(t.numel() for t in tensors)
    dtype = tensors[0].dtype
    node = Node(aten.cat.default, ((TENSOR,) * len(values),), (), tuple(values), (), (total,), dtype)
    return new_tensor(((total,), (1,), 0, dtype), node, total)

