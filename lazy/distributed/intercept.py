"""Recording rules for the collectives of torch.distributed when their tensors are lazy.

``dist.all_reduce(t)`` and its kind reach the dispatcher as c10d ops (``c10d::allreduce_``, ...) with the process
group as an argument; ``torch.distributed._functional_collectives`` calls ``_c10d_functional`` ops with a group name.
Either way a lazy tensor sends the call to the recorder, where the rules here record a collective node (lazy/
distributed/collectives.py) instead of running it, and return what the op returns: the tensors it wrote, and for
c10d ops a Work that is already complete (the collective runs at the sync; ``work.wait()`` waits for nothing, as
``xm.all_reduce`` in torch_xla). Collectives of point-to-point or rooted kinds (send/recv, gather, scatter,
reduce, all_to_all) raise a clear error on lazy tensors.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from ..trace import dispatch, record
from . import collectives as C

c10d_ops = torch.ops.c10d
funcol = torch.ops._c10d_functional


def _bind(func: Any, args: tuple, kwargs: dict) -> Dict[str, Any]:
    names = [a.name for a in func._schema.arguments]
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _done(value: Any) -> Any:
    """A completed Work (boxed, as c10d ops return it) whose future holds ``value``."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut).boxed()


def _group(pg: Any) -> str:
    return dist.ProcessGroup.unbox(pg).group_name if isinstance(pg, torch.ScriptObject) else C.group_name(pg)


def _reduce_op(a: Dict[str, Any]) -> str:
    op = a["reduce_op"]
    # NOTE: the dispatcher hands the ReduceOp over as a boxed custom-class object; its ``op()`` is the RedOpType.
    return C.reduce_name(op.op() if isinstance(op, torch.ScriptObject) else op)


# ---------------------------------------------------------------------------------------------------------------
# c10d ops (dist.all_reduce & co.): in place on their tensors, returning a completed Work

# Note [Tensors native code holds]
# DDP's Reducer (C++) owns its gradient buckets: it writes the gradients into them, all-reduces them through the
# process group (``c10d::allreduce_``, recorded here) and copies them out, all from autograd's hooks. A capture
# (lazy.compile) of a step whose backward does this reaches the buckets through no input, so it would refuse the step
# as one that changes a tensor it cannot name. The Reducer holds the same bucket tensors from step to step, so the
# capture is told to name them as themselves (``held``): a replay writes the all-reduced buckets back into them, as
# the step does, and the Reducer finds them as it left them.
def _allreduce(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    group, reduce = _group(a["process_group"]), _reduce_op(a)
    for t in a["tensors"]:
        C.write(t, C.all_reduce(C.check_lazy(t, "all_reduce"), reduce, group), "all_reduce")
        if record.CAPTURE is not None:
            record.CAPTURE.p.held(t)
    return (a["tensors"], _done(a["tensors"]))


def _coalesced(xs: List[Any], reduce: str, group: str) -> List[Any]:
    """All-reduces of ``xs``: one coalesced collective when they share a dtype (Note [Coalesced all-reduce])."""
    xs = [C.check_lazy(x, "all_reduce_coalesced") for x in xs]
    if len({x.dtype for x in xs}) == 1:
        return C.all_reduce_coalesced(xs, reduce, group)
    return [C.all_reduce(x, reduce, group) for x in xs]


def _allreduce_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    for t, r in zip(a["tensors"], _coalesced(a["tensors"], _reduce_op(a), _group(a["process_group"]))):
        C.write(t, r, "all_reduce_coalesced")
    return _done(a["tensors"])


def _broadcast(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    if len(a["tensors"]) != 1 or a["root_tensor"] != 0:
        raise C.UnsupportedCollective("lazy.distributed: broadcast of several tensors per rank is not supported")
    group = _group(a["process_group"])
    t = a["tensors"][0]
    C.write(t, C.broadcast(C.check_lazy(t, "broadcast"), a["root_rank"], group), "broadcast")
    return (a["tensors"], _done(a["tensors"]))


def _allgather_base(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    out, x = a["output_tensor"], a["input_tensor"]
    C.write(out, C.all_gather(C.check_lazy(x, "all_gather_into_tensor"), _group(a["process_group"])),
            "all_gather_into_tensor")
    return (out, _done([out]))


def _allgather(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    group = _group(a["process_group"])
    for outs, x in zip(a["output_tensors"], a["input_tensors"]):
        gathered = C.all_gather(C.check_lazy(x, "all_gather"), group)
        _scatter_pieces(gathered, outs, "all_gather")
    return (a["output_tensors"], _done(a["output_tensors"]))


def _allgather_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    group = _group(a["process_group"])
    for outs, x in zip(a["outputs"], a["inputs"]):
        C.write(outs, C.all_gather(C.check_lazy(x, "all_gather_into_tensor"), group), "all_gather_into_tensor")
    return _done(a["outputs"])


def _reduce_scatter_base(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    out, x = a["output_tensor"], a["input_tensor"]
    C.write(out, C.reduce_scatter(C.check_lazy(x, "reduce_scatter_tensor"), _reduce_op(a),
                                  _group(a["process_group"])), "reduce_scatter_tensor")
    return (out, _done([out]))


def _reduce_scatter(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    group, reduce = _group(a["process_group"]), _reduce_op(a)
    for out, ins in zip(a["output_tensors"], a["input_tensors"]):
        stacked = C.concat(ins)  # every rank's input, in rank order, as one tensor of n * numel elements
        C.write(out, C.reduce_scatter(stacked, reduce, group), "reduce_scatter")
    return (a["output_tensors"], _done(a["output_tensors"]))


def _reduce_scatter_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    group, reduce = _group(a["process_group"]), _reduce_op(a)
    for out, x in zip(a["outputs"], a["inputs"]):
        C.write(out, C.reduce_scatter(C.check_lazy(x, "reduce_scatter_tensor"), reduce, group),
                "reduce_scatter_tensor")
    return _done(a["outputs"])


def _scatter_pieces(gathered: Any, outs: List[Any], what: str) -> None:
    """Write consecutive pieces of ``gathered`` into the tensors of ``outs`` (one per rank)."""
    shapes = [tuple(o.shape) for o in outs]
    if sum(o.numel() for o in outs) != gathered.numel():
        raise C.UnsupportedCollective(f"lazy.distributed: {what} into outputs of shapes {shapes} from "
                                      f"{gathered.numel()} gathered elements")
    for o, piece in zip(outs, C.pieces(gathered, shapes)):
        record._write_back(C.check_lazy(o, what), piece)


def _unsupported(func: Any, args: tuple, kwargs: dict) -> Any:
    raise C.UnsupportedCollective(
        f"lazy.distributed: {func} is not supported on lazy tensors (supported: all_reduce, broadcast, all_gather, "
        "all_gather_into_tensor, reduce_scatter_tensor and their functional forms); run it on the backing device: "
        "t.cpu() (or .to(lazy.config.backing_device)), then copy the result back with .to('lazy')")


# ---------------------------------------------------------------------------------------------------------------
# Functional collectives: a new tensor (or its in-place and out= forms); wait_tensor has nothing left to wait for

def _f_all_reduce(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    return C.all_reduce(C.check_lazy(a["input"], "all_reduce"), C.reduce_name(a["reduce_op"]), a["group_name"])


def _f_all_reduce_(func: Any, args: tuple, kwargs: dict) -> Any:
    x = _bind(func, args, kwargs)["input"]
    C.write(x, _f_all_reduce(funcol.all_reduce.default, args, kwargs), "all_reduce_")
    return x


def _f_all_reduce_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    return _coalesced(a["inputs"], C.reduce_name(a["reduce_op"]), a["group_name"])


def _f_all_reduce_coalesced_(func: Any, args: tuple, kwargs: dict) -> Any:
    xs = _bind(func, args, kwargs)["inputs"]
    for x, r in zip(xs, _f_all_reduce_coalesced(func, args, kwargs)):
        C.write(x, r, "all_reduce_coalesced_")
    return xs


def _f_broadcast(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    return C.broadcast(C.check_lazy(a["input"], "broadcast"), a["src"], a["group_name"])


def _f_broadcast_(func: Any, args: tuple, kwargs: dict) -> Any:
    x = _bind(func, args, kwargs)["input"]
    C.write(x, _f_broadcast(func, args, kwargs), "broadcast_")
    return x


def _into_out(a: dict, out: Any, what: str) -> Any:
    """An out= variant writes its result into ``out``; a functional one returns it."""
    if "out" in a:
        C.write(a["out"], out, what)
        return a["out"]
    return out


def _f_all_gather(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    out = C.all_gather(C.check_lazy(a["input"], "all_gather_into_tensor"), a["group_name"])
    return _into_out(a, out, "all_gather_into_tensor_out")


def _f_all_gather_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    return [C.all_gather(C.check_lazy(x, "all_gather_into_tensor"), a["group_name"]) for x in a["inputs"]]


def _f_reduce_scatter(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    out = C.reduce_scatter(C.check_lazy(a["input"], "reduce_scatter_tensor"), C.reduce_name(a["reduce_op"]),
                           a["group_name"])
    return _into_out(a, out, "reduce_scatter_tensor_out")


def _f_reduce_scatter_coalesced(func: Any, args: tuple, kwargs: dict) -> Any:
    a = _bind(func, args, kwargs)
    return [C.reduce_scatter(C.check_lazy(x, "reduce_scatter_tensor"), C.reduce_name(a["reduce_op"]),
                             a["group_name"]) for x in a["inputs"]]


def _f_wait(func: Any, args: tuple, kwargs: dict) -> Any:
    return _bind(func, args, kwargs)["tensor"]


_RULES: Dict[Any, Callable[..., Any]] = {
    c10d_ops.allreduce_.default: _allreduce,
    c10d_ops.allreduce_coalesced_.default: _allreduce_coalesced,
    c10d_ops.broadcast_.default: _broadcast,
    c10d_ops._allgather_base_.default: _allgather_base,
    c10d_ops.allgather_.default: _allgather,
    c10d_ops.allgather_into_tensor_coalesced_.default: _allgather_coalesced,
    c10d_ops._reduce_scatter_base_.default: _reduce_scatter_base,
    c10d_ops.reduce_scatter_.default: _reduce_scatter,
    c10d_ops.reduce_scatter_tensor_coalesced_.default: _reduce_scatter_coalesced,
    funcol.all_reduce.default: _f_all_reduce,
    funcol.all_reduce_.default: _f_all_reduce_,
    funcol.all_reduce_coalesced.default: _f_all_reduce_coalesced,
    funcol.all_reduce_coalesced_.default: _f_all_reduce_coalesced_,
    funcol.broadcast.default: _f_broadcast,
    funcol.broadcast_.default: _f_broadcast_,
    funcol.all_gather_into_tensor.default: _f_all_gather,
    funcol.all_gather_into_tensor_out.default: _f_all_gather,
    funcol.all_gather_into_tensor_coalesced.default: _f_all_gather_coalesced,
    funcol.reduce_scatter_tensor.default: _f_reduce_scatter,
    funcol.reduce_scatter_tensor_out.default: _f_reduce_scatter,
    funcol.reduce_scatter_tensor_coalesced.default: _f_reduce_scatter_coalesced,
    funcol.wait_tensor.default: _f_wait,
}
_UNSUPPORTED = ("allgather_coalesced_", "alltoall_", "alltoall_base_", "gather_", "scatter_", "reduce_", "send",
                "recv_", "recv_any_source_")
_F_UNSUPPORTED = ("all_to_all_single", "isend", "irecv", "batch_p2p_ops")


def install() -> None:
    """Give the recorder the rules above (once per process, before any collective is recorded)."""
    for op, rule in _RULES.items():
        dispatch.register_special(op, rule)
    for name in _UNSUPPORTED:
        dispatch.register_special(getattr(c10d_ops, name).default, _unsupported)
    for name in _F_UNSUPPORTED:
        packet = getattr(funcol, name, None)
        if packet is not None:
            dispatch.register_special(packet.default, _unsupported)
