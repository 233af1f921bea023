"""Split reductions for the Triton backend: a kernel of few long rows becomes two kernels of the same kernel IR,
so that it runs in enough programs to fill the GPU (Note [Split reductions])."""
from __future__ import annotations

import math
from typing import List, Optional

import torch

from ..lower import kir
from ..lower.kir import Expr
from ..schedule import Kernel, Schedule, Stage
from .triton import _acc_dtype
from .triton_blocks import PERSISTENT_ELEMS, _tile_xblock

__all__ = ["split_reductions"]


# Note [Split reductions]
# A reduction kernel runs XBLOCK rows per program, so a few long rows (x.sum() of a large tensor, a gradient's
# norm) would run in a few programs on a GPU of a hundred cores. Such a kernel (at most SPLIT_MAX_ROWS rows, a
# stage of at least SPLIT_MIN_ELEMS elements, no stage reading another, stores of at most PERSISTENT_ELEMS per row,
# kinds sum/prod/max/min) becomes two kernels of the same kernel IR: the first reduces each row's S chunks in S
# programs per row into a scratch buffer [rows, S] (chunk elements past the row's end take the reduction's
# identity); the second is the original kernel with each stage reducing its row of partials instead. Floats are
# combined in another order than one program's would be (a tree of chunks), as eager's CUDA kernels do too.
# A tiled kernel (Note [Column reductions are tiled]) runs TILE_XBLOCK outputs per program, so its few programs are
# the ones of few outputs (a LayerNorm's weight and bias gradients: 384 column sums of 16384 rows ran in 6
# programs, 0.9 ms each on an H100 against eager's 0.08): it splits when it has at most SPLIT_TILED_PROGRAMS
# programs and rows of at least SPLIT_TILED_MIN, into chunks of at least SPLIT_TILED_CHUNK rows, enough of them for
# SPLIT_TILED_TARGET programs. Both of its kernels stay tiled: the scratch buffer is [S, outputs], so a program's
# block of adjacent outputs stores and loads adjacent partials.
SPLIT_MAX_ROWS, SPLIT_MIN_ELEMS, SPLIT_CHUNK, SPLIT_MAX = 64, 1 << 16, 8192, 1024
SPLIT_TILED_PROGRAMS, SPLIT_TILED_MIN, SPLIT_TILED_CHUNK, SPLIT_TILED_TARGET = 64, 4096, 256, 512


def split_reductions(sched: Schedule) -> Schedule:
    """The schedule with each kernel of few long rows split in two (Note [Split reductions])."""
    steps: List[object] = []
    changed = False
    for step in sched.steps:
        parts = _split(step, sched.lowered) if isinstance(step, Kernel) else None
        changed = changed or parts is not None
        steps.extend(parts or [step])
    return Schedule(sched.lowered, steps) if changed else sched


def _chunks(k: Kernel, counts: List[int]) -> int:
    """How many chunks each row of ``k`` splits into (Note [Split reductions]); 0: it does not split."""
    rows = math.prod(v.args[1] for v in k.outer)
    if k.tile is None:
        if rows > SPLIT_MAX_ROWS or max(counts) < SPLIT_MIN_ELEMS:
            return 0
        return min(SPLIT_MAX, -(-max(counts) // SPLIT_CHUNK))
    programs = -(-rows // _tile_xblock(rows))
    if programs > SPLIT_TILED_PROGRAMS or max(counts) < SPLIT_TILED_MIN:
        return 0
    return min(SPLIT_MAX, max(counts) // SPLIT_TILED_CHUNK, -(-SPLIT_TILED_TARGET // programs))


def _split(k: Kernel, lowered: object) -> Optional[List[Kernel]]:
    counts = [math.prod(s.red.red_shape) for s in k.stages]
    if not k.stages or math.prod(v.args[1] for v in k.inner) > PERSISTENT_ELEMS:
        return None
    if any(s.red.kind not in ("sum", "prod", "max", "min") or _acc_dtype(s)[1] is torch.bool
           or any(e.op == "reduce" for e in kir.walk(s.body)) for s in k.stages):
        return None
    chunks = _chunks(k, counts)
    if chunks < 2:
        return None
    tiled = k.tile is not None
    svar = kir.var(f"{k.name}_s", chunks)
    part_stages, part_stores, final_stages, remap = [], [], [], {}
    for s, count in zip(k.stages, counts):
        body, acc = _acc_dtype(s)
        size = -(-count // chunks)
        identity = kir.const(_IDENTITY[s.red.kind](acc), acc)

        def part_body(ov: List[Expr], rv: List[Expr], s=s, body=body, size=size, count=count,
                      identity=identity, acc=acc) -> Expr:
            flat = kir.iadd(kir.imul(ov[-1], size), rv[0])
            at = kir.op("index_clamp", kir.INDEX, flat, kir.const(count - 1, kir.INDEX))
            index, stride = [], count
            for v in s.red.red_vars:
                stride //= v.args[1]
                index.append(kir.imod(kir.ifloordiv(at, stride), v.args[1]) if stride else at)
            inside = kir.op("lt", torch.bool, flat, kir.const(count, kir.INDEX))
            # NOTE: the stage's body already reads the kernel's outer loops; only the chunk index ov[-1] is new
            return kir.op("where", acc, inside, kir.substitute(body, dict(zip(s.red.red_vars, index))), identity)

        bound = list(s.ref.args[1])
        part = kir.Reduction(s.red.kind, acc, acc, list(s.red.out_shape) + [chunks], [size], part_body)
        ref = kir.reduce_ref(part, bound + [svar])
        part_stages.append(Stage(ref, part, kir.reduction_body_at(part, bound + [svar])))
        if tiled:  # [S, outputs]: a block of adjacent outputs stores and reads adjacent partials
            scratch = lowered.buffer([chunks] + list(s.red.out_shape), acc)
            part_stores.append((scratch, _strided(scratch, [svar] + bound), ref))
            final = kir.Reduction(s.red.kind, s.red.dtype, acc, s.red.out_shape, [chunks],
                                  lambda ov, rv, scratch=scratch: kir.load(scratch, list(rv) + list(ov)))
        else:
            scratch = lowered.buffer(list(s.red.out_shape) + [chunks], acc)
            part_stores.append((scratch, _strided(scratch, bound + [svar]), ref))
            final = kir.Reduction(s.red.kind, s.red.dtype, acc, s.red.out_shape, [chunks],
                                  lambda ov, rv, scratch=scratch: kir.load(scratch, list(ov) + list(rv)))
        new_ref = kir.reduce_ref(final, bound)
        final_stages.append(Stage(new_ref, final, kir.reduction_body_at(final, bound)))
        remap[s.ref] = new_ref
    stores = [(b, i, kir.substitute(e, remap)) for b, i, e in k.stores]
    if tiled:  # the tile stays the last outer loop (Note [Column reductions are tiled])
        part_k = Kernel(f"{k.name}p", k.outer[:-1] + [svar, k.tile], [], part_stages, part_stores, k.work,
                        k.parallel, k.tile)
    else:
        part_k = Kernel(f"{k.name}p", k.outer + [svar], [], part_stages, part_stores, k.work, k.parallel)
    return [part_k, Kernel(k.name, k.outer, k.inner, final_stages, stores, k.work, k.parallel, k.tile)]


def _strided(buf: kir.Buffer, index: List[Expr]) -> Expr:
    flat = kir.const(0, kir.INDEX)
    for i, st in zip(index, buf.strides):
        flat = kir.iadd(flat, kir.imul(i, st))
    return flat


_IDENTITY = {"sum": lambda t: 0, "prod": lambda t: 1,
             "max": lambda t: float("-inf") if t.is_floating_point else torch.iinfo(t).min,
             "min": lambda t: float("inf") if t.is_floating_point else torch.iinfo(t).max}
