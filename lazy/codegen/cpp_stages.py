"""The C++ renderer's reductions: a stage's accumulators, in lanes (Note [Reductions in lanes]) or in a tiled kernel's
blocks, sibling stages in one loop, and the values a stage keeps for the stores (codegen/cpp.py renders the rest).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from ..lower import kir
from ..lower.kir import Expr
from ..schedule import Kernel, Stage
from .cpp_expr import _ROUND, _loop, _Scope, ctype

INIT = {"sum": lambda t: f"{t}(0)", "prod": lambda t: f"{t}(1)",
        "max": lambda t: f"-std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
        else f"std::numeric_limits<{t}>::lowest()",
        "min": lambda t: f"std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
        else f"std::numeric_limits<{t}>::max()"}
INIT["argmax"], INIT["argmin"] = INIT["max"], INIT["min"]
# NOTE: max/min store unconditionally (a select): a conditional store to an accumulator array in lanes would be
# vectorized as a masked store behind an "any lane?" branch, twice the code and no accumulator in a register. The
# two tests are or-ed bitwise: with ``||`` g++ 12 tests ``v == v && v > acc || v != v`` (three compares, an and, an
# or and the blend per vector); with ``|`` two compares, an or and the blend (softmax 4096 x 1024, AVX2, 1 thread:
# 4 % faster). The same values: ``v > acc`` is false for a NaN v.
COMBINE = {"sum": "{acc} += {v};", "prod": "{acc} *= {v};",
           "max": "{acc} = (({v} != {v}) | ({v} > {acc})) ? {v} : {acc};",
           "min": "{acc} = (({v} != {v}) | ({v} < {acc})) ? {v} : {acc};"}
# Note [Arg reductions] (lower/structure.py): a (value, index) accumulator. Along the loop a value replaces it only
# if it is strictly above (below) it, or a NaN over a number, so the first of equal values (and the first NaN)
# keeps its index: each lane meets its elements in increasing index order (Note [Reductions in lanes]). The tree
# over the lanes takes the other lane's pair if its value is above (below), or equal (both NaN) with a smaller
# index: the first index of the whole loop, whatever the lane count. The initial pair (-inf or the lowest value,
# index 0) loses to every element but an equal one, and if all elements equal it, index 0 is the answer.
_ARG_SET = "{acc} = c ? {v} : {acc}; {idx} = c ? {i} : {idx}; }}"
ARG_COMBINE = {"argmax": "{{ const bool c = ({v} != {v} && {acc} == {acc}) || {v} > {acc}; " + _ARG_SET,
               "argmin": "{{ const bool c = ({v} != {v} && {acc} == {acc}) || {v} < {acc}; " + _ARG_SET}
ARG_TREE = {"argmax": "{{ const bool c = {v} != {v} ? ({acc} == {acc} || {i} < {idx}) : ({v} > {acc} || ({v} == {acc}"
                      " && {i} < {idx})); " + _ARG_SET,
            "argmin": "{{ const bool c = {v} != {v} ? ({acc} == {acc} || {i} < {idx}) : ({v} < {acc} || ({v} == {acc}"
                      " && {i} < {idx})); " + _ARG_SET}


# Note [Reductions in lanes]
# Without -ffast-math g++ may not reassociate a floating-point reduction, so a loop ``acc += v`` runs one element
# at a time, bound by the latency of one add. A stage with a floating accumulator (sum, max, min) keeps ``L``
# accumulators instead: the innermost reduced loop runs in blocks of L consecutive elements, lane l of a block
# going to accumulator l. The loop over a block's lanes carries no dependence, so g++ vectorizes it (``omp simd``)
# without reassociating anything; at the end the lanes are combined in a fixed tree (lane l with lane l + w, for
# w = L/2, L/4, ..., 1). The result depends on L alone (the dtype and the loop's extent), never on the vector
# width or the thread count, and is as accurate as the sequential loop: float sums still accumulate in double (short
# ones in float lanes: Note [Short float sums in float lanes]); max and min propagate a NaN through its lane and
# through the tree. Integer sums, max and min (g++ reassociates exact integer arithmetic and vectorizes those loops
# as written), bool reductions and prod keep the sequential loop. Arg reductions run in lanes for every dtype (g++
# does not vectorize the index select as written): each lane keeps a (value, index) pair and the tree prefers the
# smaller index among equals (Note [Arg reductions] below), so the answer is the sequential loop's, exactly (rows
# of 1000 floats: 2.3x faster than the sequential loop).
# Blocks: L is a power of two, LANE_BYTES of accumulators or the largest power of two within a shorter loop, and
# every block holds L elements, so the lane loop has a constant trip count (no vector epilogue to compile; g++
# keeps the accumulators in registers). Where L does not divide the extent, the last block is shifted back to end
# at the extent and overlaps the one before: max and min take its elements again (a repeat changes nothing), a
# sum first computes the block's values and then adds only those of lanes the block before did not take (a select
# on the value inside the first loop would let g++ sink the body into a branch, and a call such as lz_exp in a
# branch is not vectorized).
# LANE_BYTES is 4 AVX-512 registers of accumulators (32 doubles, 64 floats): measured with 1 thread on 256 x 1024
# and 1024 x 1024 float32, 2 to 8 registers ran within noise of each other, 1 register was 2x slower on column sums
# and 3.5x on softmax (8 lanes of double cannot call the 16-lane vector clone of lz_exp), and 8 registers made the
# code, and g++'s time, ~25 % larger. A floating reduction costs g++ more than its sequential loop did: the test
# graph of 180 small reductions (tests/test_codegen_cpp.py) compiles in ~6 s instead of 1.7 s; the training steps
# of tests/models.py, 2 % longer.
# A tiled kernel (Note [Column reductions are tiled] in schedule/) runs in the same blocks of lanes, but a lane is
# one output of the block, with its own sequential accumulator over the whole reduced loop: every kind and dtype
# is tiled, with the results of the untiled loop. The shifted last block computes some outputs again (the same
# values); only the lanes the block owns are stored, after all its values are computed (as above).
LANE_BYTES = 256
LANE_KINDS = frozenset({"sum", "max", "min", "argmax", "argmin"})
IDEMPOTENT = frozenset({"max", "min", "argmax", "argmin"})  # an element combined twice changes nothing
_CSIZE = {"double": 8, "float": 4, "int64_t": 8, "int32_t": 4, "int16_t": 2, "int8_t": 1, "uint8_t": 1, "bool": 1}


def _lanes(types: List[str], extent: int) -> int:
    """Lanes per block: LANE_BYTES of the widest of ``types``, or the largest power of two within ``extent``."""
    most = LANE_BYTES // max(_CSIZE[t] for t in types)
    n = 1
    while n * 2 <= min(extent, most):
        n *= 2
    return n


class _Blocks:
    """Loop ``name`` of ``extent`` in blocks of ``lanes`` consecutive indices (Note [Reductions in lanes]); if
    ``masked``, the last block is shifted back to end at the extent, over lanes that the block before did."""

    def __init__(self, name: str, extent: int, lanes: int) -> None:
        self.name, self.extent, self.lanes = name, extent, lanes
        self.masked = extent % lanes != 0

    def open(self, indent: str) -> List[str]:
        """The loop over blocks, ``{name}k`` the first index the block takes, ``{name}b`` the block's start."""
        k, b, last = f"{self.name}k", f"{self.name}b", self.extent - self.lanes
        start = f"{k} < {last} ? {k} : {last}" if self.masked else k
        return [f"{indent}for (int64_t {k} = 0; {k} < {self.extent}; {k} += {self.lanes}) {{",
                f"{indent}  const int64_t {b} = {start};"]

    def lanes_loop(self, indent: str) -> List[str]:
        """The loop over the lanes of a block; it binds ``name`` to the lane's index."""
        return [f"{indent}#pragma omp simd", f"{indent}for (int64_t l = 0; l < {self.lanes}; ++l) {{",
                f"{indent}  const int64_t {self.name} = {self.name}b + l;"]

    def new(self) -> str:
        """Whether the lane's index is one the block takes (the block before did not)."""
        return f"l >= {self.name}k - {self.name}b"


# Note [Short float sums in float lanes]
# A float32 sum accumulates in double (lower/structure.py): sound for any length without pairwise summation, but
# each element costs a conversion and a double add (half the lanes of a float vector), and on AVX2 the 32 double
# lanes fill half the registers (spilled around the calls of lz_exp). Where a lane takes at most FLOAT_LANE_TERMS
# elements (a row of up to 4096 floats in 64 lanes), the lanes accumulate in float instead: each lane's error is
# that of a sum of <= 64 terms and the fixed tree adds 6 levels, within a few ulps of the terms' magnitude, as
# eager's own float32 sums (a cascade of float accumulators). Longer sums, tiled ones (a lane is then one output's
# whole sequential sum) and sums whose elements are computed in double (var's squared deviations) keep double.
# Measured (1 thread, float lanes vs double): row sums of 4096 x 1024 20 %, softmax 1024^2 6-8 % faster.
FLOAT_LANE_TERMS = 64


def _float_lanes(s: Stage, tile: Optional[_Blocks]) -> bool:
    """Whether stage ``s`` sums in float lanes (Note [Short float sums in float lanes])."""
    red, body = s.red, s.body
    if tile is not None or red.kind != "sum" or red.dtype != torch.float32 or red.acc_dtype != torch.float64 \
            or not s.red_vars or body.op != "cast" or body.args[0].dtype != torch.float32:
        return False
    n = 1
    for k in red.red_shape:
        n *= k
    lanes = _lanes(["float"], s.red_vars[-1].args[1])
    return lanes > 1 and n <= lanes * FLOAT_LANE_TERMS


# Note [The lane tree is unrolled]
# The tree over a stage's lanes (Note [Reductions in lanes]) is one loop per level, each with its width ``w`` a
# constant: g++ then keeps the lanes in registers and combines them with in-register shuffles (a 64-lane float
# sum: 3 vector adds, then an extract and add per halving). A loop over the levels with ``w`` a variable, as a
# single loop nest, was compiled as a runtime loop over the accumulator array on the stack: each level stored the
# lanes and loaded them back at another offset (a store-to-load forwarding stall), ~100 cycles a row on the
# critical path of a row's stages (layer_norm's mean, then its variance, then the stores). Measured on the AMD
# EPYC, 1 thread, the kernels alone: layer_norm 4096 x 1024 16 %, softmax 6 % faster (the additions and their
# order are the same: results are bit-identical).
def _tree(indent: str, lanes: int, combine: Callable[[str], str]) -> List[str]:
    """The fixed tree over ``lanes`` lanes (lane l with lane l + w, w = lanes/2, ..., 1), one loop per level with
    ``w`` a constant (Note [The lane tree is unrolled]); ``combine(other)`` combines lane ``other`` into lane l."""
    lines = []
    w = lanes // 2
    while w > 0:
        lines.append(f"{indent}#pragma omp simd")
        lines.append(f"{indent}for (int64_t l = 0; l < {w}; ++l) {{ {combine(f'l + {w}')} }}")
        w //= 2
    return lines


# Note [The next row is prefetched]
# A row reduction's kernel runs its stages one after the other over each row (softmax: the max, then the sum of
# exp(x - max) and the stores; layer_norm: the mean, the variance, the stores), so the first pass over a row waits
# for the row to come from L3 or memory and the later passes leave nothing in flight: the out-of-order window does
# not reach the next row's loads before the row ends, and the hardware prefetchers restart at each 4 KB page (a
# row of 1024 floats). In each block of lanes of the kernel's first stage, every load that walks the lanes
# contiguously prefetches the cache lines of the same block of the next row (the kernel's innermost outer loop,
# clamped to its last row), a row ahead. Measured on the AMD EPYC, 1 thread, 4096 x 1024 (benchmarks/reductions.py,
# the cached run, 4 runs alternating with the code without it): layer_norm 36 % (AVX-512) and 30 % (AVX2) faster,
# softmax 22 % and 17 %, row sums 19 % with AVX2 and within noise (+-5 %) with AVX-512. Prefetching the whole next
# row at the row's start instead (kernels alone) gained as much on layer_norm with AVX-512, nothing on softmax, and
# made layer_norm with AVX2 30 % slower (64 prefetches at once). Rows shorter than PREFETCH_MIN_ROW_BYTES are not
# prefetched: the hardware streams across them and a pass over one is short enough for the out-of-order window to
# reach the next; measured (kernels alone), rows of 64 and 256 floats ran up to 10 % slower prefetched (layer_norm
# 16384 x 256), rows of 512 floats 12-14 % faster (row sums, layer_norm), rows of 2048 floats 14 % faster (layer_norm)
# and 1-6 % slower (softmax). Only a stage with one reduced loop prefetches: where the
# block loop is nested in another reduced loop (BatchNorm's sum over (N, H, W) of a channel), the next outer
# iteration's data is read only after the whole reduction, long evicted by then (sum over (0, 2, 3) of [4096, 64,
# 16, 32] ran 8 % slower with it). A prefetch never faults, and changes no value.
PREFETCH_LINE = 64  # bytes of a cache line
PREFETCH_MIN_ROW_BYTES = 2048


def _prefetch_next_row(elements: List[Expr], red_vars: List[Expr], row: Optional[Expr], blocks: _Blocks,
                       scope: _Scope) -> None:
    """The prefetches of Note [The next row is prefetched] at ``scope``'s indent, inside the loop over ``blocks``
    (of the stage's one reduced loop ``red_vars``), for the loads of ``elements`` that walk the lanes contiguously
    and move a block and at least PREFETCH_MIN_ROW_BYTES with ``row``, the kernel's innermost outer loop (None: no
    prefetch)."""
    if row is None or row.args[1] < 2 or len(red_vars) != 1:
        return
    red_var = red_vars[0]
    row_name = scope.var_names[row]
    nxt, start = kir.var(f"{row_name}n", row.args[1]), kir.var(f"{blocks.name}k", red_var.args[1])
    targets: Dict[tuple, kir.Buffer] = {}
    for element in elements:
        for e in kir.walk(element):
            step = kir.stride(e.args[1], row) if e.op == "load" else None
            if step is None or abs(step) < blocks.lanes or abs(step) * e.dtype.itemsize < PREFETCH_MIN_ROW_BYTES:
                continue
            if kir.stride(e.args[1], red_var) == 1:
                targets.setdefault((e.args[0].id, kir.substitute(e.args[1], {row: nxt, red_var: start})), e.args[0])
    if not targets:
        return
    indent = scope.indent
    scope.lines.append(f"{indent}const int64_t {row_name}n = {row_name} + 1 < {row.args[1]} ? {row_name} + 1 : "
                       f"{row_name};")
    at = _Scope(scope.names, scope.lines, indent, scope.counter, {**scope.var_names, nxt: f"{row_name}n",
                                                                  start: f"{blocks.name}k"})
    for (bid, index), buf in targets.items():
        first = at.emit(index)
        per_line = max(PREFETCH_LINE // buf.dtype.itemsize, 1)
        scope.lines.extend(f"{indent}__builtin_prefetch(&b{bid}[{first} + {o}]);"
                           for o in range(0, blocks.lanes, per_line))


def _reduced(s: Stage, acc: str) -> str:
    """The stage's result from its accumulator ``acc``: in the result's type, half precision rounded once."""
    value = f"static_cast<{ctype(s.red.dtype)}>({acc})"
    return _ROUND[s.red.dtype].format(value) if s.red.dtype in _ROUND else value


def _render_stage(n: int, s: Stage, scope: _Scope, tile: Optional[_Blocks], arrays: Dict[Expr, str],
                  row: Optional[Expr] = None) -> None:
    """Stage ``n`` at ``scope``'s indent: sequential, in lanes (Note [Reductions in lanes]) or, in a kernel tiled in
    ``tile``'s blocks, one accumulator per lane. Its result is ``red<n>``: a name in ``scope``, or an array of the
    lanes' results (recorded in ``arrays``) in a tiled kernel. In lanes, the loads of the next ``row`` are prefetched
    (Note [The next row is prefetched])."""
    lines, indent, red, name = scope.lines, scope.indent, s.red, f"red{n}"
    at, rt, init = ctype(red.acc_dtype), ctype(red.dtype), INIT[red.kind](ctype(red.acc_dtype))
    element = s.body
    if _float_lanes(s, tile):  # Note [Short float sums in float lanes]
        at, init, element = "float", INIT["sum"]("float"), s.body.args[0]
    red_vars = list(s.red_vars)
    blocks = tile
    arg = red.kind in kir.ARG_KINDS  # Note [Arg reductions]: exact in lanes for every dtype
    if tile is None and red.kind in LANE_KINDS and (red.acc_dtype.is_floating_point or arg) and red_vars:
        lanes = _lanes([at, "int64_t"] if arg else [at], red_vars[-1].args[1])
        if lanes > 1:
            blocks = _Blocks(scope.var_names[red_vars[-1]], red_vars[-1].args[1], lanes)
            red_vars = red_vars[:-1]
    acc = f"acc{n}" if blocks is None else f"acc{n}[l]"
    idx = f"idx{n}" if blocks is None else f"idx{n}[l]"
    kept = _kept_arrays(n, s)
    lines.extend(f"{indent}{ctype(e.dtype)} {array}[{size}];" for array, size, e, _ in kept)
    if blocks is None:
        lines.append(f"{indent}{at} acc{n} = {init};")
        if arg:
            lines.append(f"{indent}int64_t idx{n} = 0;")
    else:
        lines.append(f"{indent}{at} acc{n}[{blocks.lanes}];")
        if arg:
            lines.append(f"{indent}int64_t idx{n}[{blocks.lanes}];")
            lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) {idx} = 0;")
        lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) {acc} = {init};")
    ind = indent
    for v in red_vars:
        lines.append(_loop(scope.var_names[v], v.args[1], ind))
        ind += "  "
    masked = blocks is not None and blocks is not tile and blocks.masked and red.kind not in IDEMPOTENT
    if blocks is not tile:
        lines.extend(blocks.open(ind))
        ind += "  "
        _prefetch_next_row([element], s.red_vars, row, blocks, scope.child(ind))
        if masked:
            lines.append(f"{ind}{at} v{n}[{blocks.lanes}];")
    if blocks is not None:
        lines.extend(blocks.lanes_loop(ind))
        ind += "  "
    body = scope.child(ind)
    body.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
    value = body.emit(element)
    if kept:  # Note [Stage values kept for the stores] (the shifted last block writes some of them again, the same)
        at_index = body.emit(s.keep_index[0])
        lines.extend(f"{ind}{array}[{at_index}] = {body.names[e]};" for array, _, e, _ in kept)
    if masked:  # the block's values, then the lanes it takes
        lines.append(f"{ind}v{n}[l] = {value};")
        ind = ind[:-2]
        combine = COMBINE[red.kind].format(acc=acc, v=f"({blocks.new()} ? v{n}[l] : {init})")
        lines.extend([f"{ind}}}", f"{ind}#pragma omp simd",
                      f"{ind}for (int64_t l = 0; l < {blocks.lanes}; ++l) {combine}"])
    elif arg:  # the lane's flat index: the innermost reduced variable is bound to the lane's
        flat = kir.const(0, kir.INDEX)
        for v in s.red_vars:  # merged loops (Note [Contiguous loops are merged]) give the same row-major index
            flat = kir.iadd(kir.imul(flat, v.args[1]), v)
        lines.append(ind + ARG_COMBINE[red.kind].format(acc=acc, v=value, idx=idx, i=body.emit(flat)))
    else:
        lines.append(ind + COMBINE[red.kind].format(acc=acc, v=value))
    while ind != indent:
        ind = ind[:-2]
        lines.append(ind + "}")
    if tile is not None:
        lines.append(f"{indent}{rt} {name}[{tile.lanes}];")
        lines.append(f"{indent}for (int64_t l = 0; l < {tile.lanes}; ++l) {name}[l] = "
                     f"{_reduced(s, idx if arg else acc)};")
        arrays[s.ref] = name
        return
    if blocks is not None:  # the fixed tree over the lanes
        def combine(other: str) -> str:
            return ARG_TREE[red.kind].format(acc=acc, v=f"acc{n}[{other}]", idx=idx, i=f"idx{n}[{other}]") if arg \
                else COMBINE[red.kind].format(acc=acc, v=f"acc{n}[{other}]")
        lines.extend(_tree(indent, blocks.lanes, combine))
    result = (idx if arg else acc) if blocks is None else f"{'idx' if arg else 'acc'}{n}[0]"
    lines.append(f"{indent}const {rt} {name} = {_reduced(s, result)};")
    scope.names[s.ref] = name


# Note [Sibling stages share their loop]
# BatchNorm's backward sums dy and dy * (x - mean) over the same (N, H, W) loops of the same tensors; rendered one
# after the other, each stage loads dy (and recomputes the ReLU mask in front of it) in a loop of its own. Consecutive
# stages of a kernel whose reduced loops have the same extents, none reading another's result, that all run in
# lanes (Note [Reductions in lanes]: floating sum, max or min, no kept values) are rendered as one loop nest with one
# set of accumulator lanes per stage: their bodies are written in the first stage's variables, so a load or a
# value they share is computed once per element. Each stage's lanes, blocks, order of additions and tree are those it
# has alone (the lane count depends on the stage's accumulator type and the loop's extent, not on its siblings), so
# each result is bit-identical to the stage rendered alone. At most MAX_SIBLINGS stages share a loop, so their
# accumulators stay in registers (4 x 4 AVX-512 registers of double lanes).
MAX_SIBLINGS = 4


def _lane_stage(s: Stage) -> Optional[str]:
    """The accumulator type of stage ``s`` if it runs in lanes of that type outside a tile, else None."""
    red = s.red
    if red.kind not in ("sum", "max", "min") or not red.acc_dtype.is_floating_point or s.keep or not s.red_vars:
        return None
    at = "float" if _float_lanes(s, None) else ctype(red.acc_dtype)
    return at if _lanes([at], s.red_vars[-1].args[1]) > 1 else None


def _sibling_stages(k: Kernel, tile: Optional["_Blocks"]) -> List[List[int]]:
    """The kernel's stages in order, in groups rendered in one loop (Note [Sibling stages share their loop])."""
    groups: List[List[int]] = []
    for n, s in enumerate(k.stages):
        if groups and tile is None and len(groups[-1]) < MAX_SIBLINGS:
            first = k.stages[groups[-1][0]]
            at = _lane_stage(s)
            if at is not None and all(_lane_stage(k.stages[m]) == at for m in groups[-1]) \
                    and [v.args[1] for v in s.red_vars] == [v.args[1] for v in first.red_vars]:
                inside = set(kir.walk(s.body))
                if not any(k.stages[m].ref in inside for m in groups[-1]):
                    groups[-1].append(n)
                    continue
        groups.append([n])
    return groups


def _render_siblings(group: List[tuple], scope: _Scope, row: Optional[Expr] = None) -> None:
    """Stages ``group`` ((n, stage) pairs) in one loop nest (Note [Sibling stages share their loop]); each result
    ``red<n>`` becomes a name in ``scope``; the loads of the next ``row`` are prefetched (Note [The next row is
    prefetched])."""
    lines, indent = scope.lines, scope.indent
    first = group[0][1]
    at = _lane_stage(first)
    red_vars = first.red_vars
    last = red_vars[-1]
    blocks = _Blocks(scope.var_names[last], last.args[1], _lanes([at], last.args[1]))
    elements = []
    for n, s in group:
        element = s.body.args[0] if at == "float" and s.red.acc_dtype != torch.float32 else s.body
        elements.append(kir.substitute(element, dict(zip(s.red_vars, red_vars))) if s is not first else element)
        lines.append(f"{indent}{at} acc{n}[{blocks.lanes}];")
        lines.append(f"{indent}for (int64_t l = 0; l < {blocks.lanes}; ++l) acc{n}[l] = {INIT[s.red.kind](at)};")
    ind = indent
    for v in red_vars[:-1]:
        lines.append(_loop(scope.var_names[v], v.args[1], ind))
        ind += "  "
    lines.extend(blocks.open(ind))
    ind += "  "
    _prefetch_next_row(elements, red_vars, row, blocks, scope.child(ind))
    masked = [n for n, s in group if blocks.masked and s.red.kind not in IDEMPOTENT]
    lines.extend(f"{ind}{at} v{n}[{blocks.lanes}];" for n in masked)
    lines.extend(blocks.lanes_loop(ind))
    body = scope.child(ind + "  ")
    for (n, s), element in zip(group, elements):
        value = body.emit(element)
        if n in masked:
            lines.append(f"{ind}  v{n}[l] = {value};")
        else:
            lines.append(f"{ind}  " + COMBINE[s.red.kind].format(acc=f"acc{n}[l]", v=value))
    lines.append(f"{ind}}}")
    for n, s in group:
        if n in masked:  # the lanes the block takes, as in _render_stage
            combine = COMBINE[s.red.kind].format(acc=f"acc{n}[l]", v=f"({blocks.new()} ? v{n}[l] : "
                                                                      f"{INIT[s.red.kind](at)})")
            lines.extend([f"{ind}#pragma omp simd", f"{ind}for (int64_t l = 0; l < {blocks.lanes}; ++l) {combine}"])
    while ind != indent:
        ind = ind[:-2]
        lines.append(ind + "}")
    for n, s in group:
        combine = COMBINE[s.red.kind]
        lines.extend(_tree(indent, blocks.lanes, lambda other: combine.format(acc=f"acc{n}[l]", v=f"acc{n}[{other}]")))
        lines.append(f"{indent}const {ctype(s.red.dtype)} red{n} = {_reduced(s, f'acc{n}[0]')};")
        scope.names[s.ref] = f"red{n}"


def _kept_arrays(n: int, s: Stage) -> List[tuple]:
    """(array name, size, value in the stage, value in the stores) of each value stage ``n`` keeps for the stores
    (Note [Stage values kept for the stores] in schedule/)."""
    size = 1
    for v in s.red_vars:
        size *= v.args[1]
    return [(f"keep{n}_{j}", size, e, m) for j, (e, m) in enumerate(s.keep)]
