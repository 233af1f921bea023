"""Block sizes of Triton kernels (Note [Triton kernel shapes] in codegen/triton.py): the default ones of each kind
of kernel, and the candidates a kernel is tuned over (Note [Tuned block sizes])."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

from ..lower.graph import LATENCY_MIN, critical_path
from ..schedule import Kernel

__all__ = ["Blocks", "TUNE_MIN_WORK", "candidates", "default_blocks"]

PERSISTENT_ELEMS = 8192   # a row of up to this many elements is one block (Note [Triton kernel shapes])
POINTWISE_BLOCK = 1024
LOOP_RBLOCK = 2048
TILE_XBLOCK, TILE_RBLOCK = 64, 32


@dataclass(frozen=True)
class Blocks:
    """A kernel's block sizes (Note [Triton kernel shapes]): ``x`` flat indices (pointwise) or rows (reductions)
    per program, ``r`` the chunk of a looped or tiled reduction (the row of a persistent one), and Triton's
    ``warps``."""
    x: int
    r: int
    warps: int


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _warps(elems: int) -> int:
    return max(1, min(16, elems // 256)) if elems >= 512 else (2 if elems >= 128 else 1)


def default_blocks(k: Kernel) -> Blocks:
    """The block sizes a kernel renders with unless tuned (Note [Triton kernel shapes])."""
    loops = k.outer + k.inner
    if not k.stages:
        n = math.prod(v.args[1] for v in loops)
        x = min(POINTWISE_BLOCK, _pow2(max(n, 1)))
        if SPREAD_BLOCK < x and n <= SPREAD_MAX and _latency_bound(k):  # Note [Short latency-bound kernels]
            return Blocks(SPREAD_BLOCK, 0, SPREAD_BLOCK // 32)
        return Blocks(x, 0, _warps(x))
    outer_n, longest = _extents(k)
    if _persistent(k, longest):
        p = _pow2(longest)
        x = max(1, min(_pow2(max(outer_n, 1)), 4096 // p))
        return Blocks(x, p, _warps(x * p))
    if k.tile is not None:
        x = _tile_xblock(outer_n)
        return Blocks(x, TILE_RBLOCK, _warps(x * TILE_RBLOCK))
    return Blocks(1, LOOP_RBLOCK, _warps(LOOP_RBLOCK))


# Note [Short latency-bound kernels]
# A pointwise kernel of few elements, each a long chain of dependent operations (Note [Latency-bound pointwise
# kernels]), takes the chain's latency however its elements are laid out; but laid out as the default block (up to
# 8 elements a thread, one program) it runs on one SM, its threads interleaving their elements' chains. Spread over
# programs of SPREAD_BLOCK elements on as many threads (two warps), it runs on several SMs, an element per thread:
# the 200-op chain at 16^2 (256 elements, 40 sines each) took 36.3-36.6 us from launch to done on an H200 in 4 or 8
# programs of one element a thread, against 40.4-40.6 us as one program (of 256 elements on 2 or 8 warps), and
# 23.7-25.0 us for ``x * 2`` (the launch and the wait alone). Up to SPREAD_MAX elements (256 programs): larger
# kernels fill the GPU anyway, and those of TUNE_MIN_WORK or more are tuned.
SPREAD_BLOCK, SPREAD_MAX = 64, 16384


def _latency_bound(k: Kernel) -> bool:
    return critical_path([e for _, _, e in k.stores]) >= LATENCY_MIN


def _extents(k: Kernel) -> Tuple[int, int]:
    """(rows, the longest of the row's loops: a stage's reduced elements or the inner loops') of a reduction."""
    inner_n = math.prod(v.args[1] for v in k.inner)
    red_ns = [math.prod(s.red.red_shape) for s in k.stages]
    return math.prod(v.args[1] for v in k.outer), max(red_ns + [inner_n, 1])


def _persistent(k: Kernel, longest: int) -> bool:
    return k.tile is None and _pow2(longest) <= PERSISTENT_ELEMS


def _tile_xblock(outputs: int) -> int:
    """The outputs a program of a tiled kernel holds (Note [Column reductions are tiled])."""
    return min(TILE_XBLOCK, _pow2(max(outputs, 1)))


# Note [Tuned block sizes]
# Block sizes decide how fast a kernel runs and no fixed rule fits every shape (a LayerNorm's rows of 384 want
# other rows per program than a softmax's of 8192), so a kernel worth it is compiled with a few Blocks and the
# runtime times them once on the run's own buffers and keeps the fastest (runtime/triton.py, Note [Tuning on the
# first run]). ``tune`` (lazy.config.autotune, or lazy.compile's mode="max-autotune"): "off" renders the default
# blocks only; "default" tries a few for each reduction of at least TUNE_MIN_WORK elements (below that a kernel is
# launch-bound, and each candidate is one more Triton compile, 0.1-0.3 s of a core); "max" tries more, pointwise
# kernels included. The default blocks are always the first candidate, so tuning never picks a slower kernel than
# the untuned one by more than the timing's noise.

# Note [Latency-bound pointwise kernels]
# A pointwise kernel is memory-bound unless each element runs a long chain of dependent operations (critical_path of
# its stores at least LATENCY_MIN, as for the cpu's Note [Interleaved copies]): the 200-op benchmark chain is 40
# sines and 160 arithmetic ops per element. Such a kernel is timed at "default" too, with one more candidate: half
# the elements per program on twice the warps (2 per thread instead of 8), which is Inductor's second pointwise
# config. Measured on an H200 (benchmarks/gpu_kernels.py, 4096^2 chain): see benchmarks/README.md.
TUNE_MIN_WORK = 1 << 22  # 16 MB of float32: about 5 us of an H100's bandwidth, a launch's order


def candidates(k: Kernel, tune: str = "off") -> List[Blocks]:
    """The block sizes to try for ``k``, its default ones first (Note [Tuned block sizes]): at "default" at most
    three more per reduction (each is one more Triton compile), at "max" a grid of them, pointwise kernels too."""
    d = default_blocks(k)
    if tune == "off" or k.work < TUNE_MIN_WORK:
        return [d]
    wide = tune == "max"
    if not k.stages:
        half = Blocks(max(d.x // 2, 1), 0, d.warps * 2)  # Note [Latency-bound pointwise kernels]
        if not wide:
            return [d, half] if _latency_bound(k) else [d]
        out = [d, half, Blocks(d.x * 2, 0, _warps(d.x * 2)), Blocks(d.x, 0, d.warps * 2),
               Blocks(max(d.x // 2, 1), 0, d.warps), Blocks(max(d.x // 4, 1), 0, d.warps)]
        return _distinct_blocks([b for b in out if b.x <= 4096 and b.warps <= 16])
    outer_n, longest = _extents(k)
    if _persistent(k, longest):  # rows per program and warps
        rows = _pow2(max(outer_n, 1))
        if wide:
            shapes = [(x, w) for x in (d.x * 2, d.x, d.x // 2, d.x // 4, d.x // 8)
                      for w in (_warps(x * d.r), _warps(x * d.r) // 2, _warps(x * d.r) * 2)]
        elif d.x == 1:  # one long row per program: fewer warps
            shapes = [(1, d.warps // 2), (1, d.warps // 4)]
        else:
            shapes = [(d.x, d.warps // 2), (d.x // 2, _warps(d.x // 2 * d.r)), (d.x // 4, _warps(d.x // 4 * d.r))]
        out = [d] + [Blocks(x, d.r, w) for x, w in shapes
                     if 1 <= x <= rows and x * d.r <= 2 * PERSISTENT_ELEMS and w >= 1]
    elif k.tile is not None:  # outputs per program against rows per chunk
        shapes = [(32, 64), (128, 16)] + ([(16, 128), (64, 64), (128, 32)] if wide else [])
        outputs = _pow2(max(outer_n, 1))  # no more outputs per program than there are
        out = [d] + [Blocks(min(x, outputs), r, _warps(min(x, outputs) * r)) for x, r in shapes]
    else:  # the chunk of a long row
        rs = [1024, 4096] + ([512, 2048, 8192] if wide else [])
        out = [d] + [Blocks(1, r, w) for r in rs for w in ([_warps(r), _warps(r) // 2] if wide else [_warps(r)])
                     if w >= 1]
    return _distinct_blocks([b for b in out if b.warps <= 16])


def _distinct_blocks(blocks: List[Blocks]) -> List[Blocks]:
    return list(dict.fromkeys(blocks))
