"""Scheduling: kernel-IR steps -> fused kernels, their order and the buffer plan. Backend agnostic.

Note [Fusion by loop nest]
Lowering already inlined every pointwise and movement op into its consumers (Note [Lowered values are loaders]),
so a ``Store`` is one pointwise kernel with its whole producer chain and no stored intermediate. The scheduler
then (1) gives each kernel a loop nest: the loop variables that the indices of its reductions depend on become
the *outer* loops, and each reduction (with the reductions its body reads, nested) is computed once per outer
iteration as a *stage*, before the *inner* loops that store the results: softmax or layer norm is one kernel
whose row loop runs max, sum and the normalized store; (2) merges consecutive stores of the same shape that do
not read each other into one kernel (horizontal fusion); (3) plans buffers: which step defines each one and after
which step it is dead. A backend is asked for its limits through ``Limits``; the scheduler never imports one.

Note [Column reductions are tiled]
A reduction over a dim that is not contiguous in memory (a column sum, the bias gradient: ``x.sum(0)`` of an
[N, C] tensor) reads its reduced loop with a large stride, so no backend can vectorize that loop. Its outputs,
though, are adjacent: one of the kernel's outer loops moves through memory one element at a time. ``_tile`` makes
such a loop the kernel's last outer loop and its ``tile``: the backend runs it in blocks of adjacent indices and
puts the block innermost in every stage and store, so the reduced loop runs once per block, outside, and the
block's outputs are computed side by side with one accumulator each (contiguous loads, a vector of accumulators).
Each output still adds its elements one by one in the original order, so the results are those of the untiled
loop, bit for bit. This is a loop-order decision over the kernel IR's index maps, made here and not in a renderer
because every backend needs it (Triton: the tile is the block of outputs a program holds, with a loop over the
reduced dim inside; C++: a block of lanes); how many indices a block holds is the backend's choice. A reduction
whose reduced loop is contiguous (a row sum, softmax) is not tiled: how to vectorize a reduction along its own loop
without reassociating it is a backend matter (codegen/cpp_stages.py, Note [Reductions in lanes]; Triton reduces a block
in a tree of its own).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..lower import kir
from ..lower.graph import EXPENSIVE_OPS, SHARED_INLINE_LIMIT, Extern, Lowered, Store
from ..lower.kir import Expr


@dataclass(frozen=True)
class Limits:
    """What a backend can take: buffers per kernel, the work below which a kernel runs serially, and the bytes of
    stage values it can keep per outer iteration (Note [Stage values kept for the stores]; 0: none); ``coalesce``:
    whether adjacent loops that move through memory as one are merged (Note [Contiguous loops are merged])."""
    max_buffers: int = 64
    parallel_threshold: int = 1 << 15
    keep_bytes: int = 0
    coalesce: bool = False


class Stage:
    """One reduction computed per outer iteration: ``ref`` (the reduce expression it defines) and ``body`` (its
    element expression over the outer and its own reduction variables ``red_vars``: the reduction's, or fewer where
    contiguous ones are merged (Note [Contiguous loops are merged])). ``keep``: values of the body that the stores
    read again, as (the value in the stage's variables, the same value in the stores'), kept at ``keep_index``
    (the flat index over the stage's reduced variables, and the same over the kernel's inner ones) (Note [Stage
    values kept for the stores])."""

    __slots__ = ("ref", "red", "body", "red_vars", "keep", "keep_index")

    def __init__(self, ref: Expr, red: kir.Reduction, body: Expr) -> None:
        self.ref, self.red, self.body = ref, red, body
        self.red_vars: List[Expr] = list(red.red_vars)
        self.keep: List[Tuple[Expr, Expr]] = []
        self.keep_index: Optional[Tuple[Expr, Expr]] = None


class Kernel:
    """A loop nest: ``outer`` loops, then ``stages``, then ``inner`` loops storing ``stores`` (buffer, index, value).
    ``tile``: the last outer loop when it runs in blocks innermost in every stage and store (Note [Column reductions
    are tiled]), else None."""

    __slots__ = ("name", "outer", "inner", "stages", "stores", "work", "parallel", "tile")

    def __init__(self, name: str, outer: List[Expr], inner: List[Expr], stages: List[Stage],
                 stores: List[Tuple[kir.Buffer, Expr, Expr]], work: int, parallel: bool,
                 tile: Optional[Expr] = None) -> None:
        self.name, self.outer, self.inner, self.stages, self.stores = name, outer, inner, stages, stores
        self.work, self.parallel, self.tile = work, parallel, tile

    def buffers(self) -> List[kir.Buffer]:
        found: Dict[int, kir.Buffer] = {}
        roots = [v for _, _, v in self.stores] + [s.body for s in self.stages]
        for root in roots:
            for e in kir.walk(root):
                if e.op == "load":
                    found[e.args[0].id] = e.args[0]
        for b, _, _ in self.stores:
            found[b.id] = b
        return [found[k] for k in sorted(found)]


class Schedule:
    """Steps (``Kernel`` or ``Extern``) in order, with each buffer's last use (step index), and the outputs."""

    def __init__(self, lowered: Lowered, steps: List[Any]) -> None:
        self.lowered = lowered
        self.steps = steps
        self.kernels = [s for s in steps if isinstance(s, Kernel)]
        self.last_use: Dict[int, int] = {}
        for i, step in enumerate(steps):
            used = step.buffers() if isinstance(step, Kernel) else step.inputs
            for b in used:
                self.last_use[b.id] = i
        keep = {b.id for b in lowered.outputs}
        self.frees: Dict[int, List[int]] = {}
        for b, i in self.last_use.items():
            if b not in keep:
                self.frees.setdefault(i, []).append(b)


def schedule(lowered: Lowered, limits: Limits = Limits()) -> Schedule:
    """The pipeline's fuse + plan passes (Note [Fusion by loop nest])."""
    groups = _share_reductions(_merge_horizontal(lowered.steps, limits), lowered)
    steps: List[Any] = []
    for g in groups:
        if isinstance(g, Extern):
            steps.append(g)
        else:
            steps.append(_kernel(f"k{len(steps)}", g, limits))
    return Schedule(lowered, steps)


def _loads(root: Expr) -> set:
    """Buffers an expression reads, including inside the bodies of the reductions it uses."""
    found, todo, seen = set(), [root], set()
    while todo:
        e = todo.pop()
        for x in kir.walk(e):
            if x.op == "load":
                found.add(x.args[0].id)
            elif x.op == "reduce" and x.args[0] not in seen:
                seen.add(x.args[0])
                todo.append(x.args[0].body)
    return found


def _merge_horizontal(steps: List[Any], limits: Limits) -> List[Any]:
    out: List[Any] = []
    for step in steps:
        if isinstance(step, Store) and out and isinstance(out[-1], list):
            group = out[-1]
            first = group[0]
            written = {s.buffer.id for s in group}
            if step.buffer.shape == first.buffer.shape and not (_loads(step.expr) & written) \
                    and len(group) < limits.max_buffers // 4:
                group.append(step)
                continue
        out.append([step] if isinstance(step, Store) else step)
    return out


# Note [Reductions shared by kernels are stored once]
# Lowering inlines a value into each of its consumers unless it is shared by several graph nodes and costly
# (lower/graph.py), but a decomposition's internal values are not nodes: batch_norm_backward's per-channel sums feed
# its grad_input, and the same sums (one object, Note [Equal reductions are one object]) are its weight and bias
# gradients. Each kernel that reads a reduction computes it as a stage, so the BatchNorm2d backward of the CNN in
# tests/models.py ran its two sums over (N, H, W) once for grad_input and again in the gradients' kernel. Here, a
# reduction whose result the stores of two or more kernels read, and that reduces more than SHARED_INLINE_LIMIT
# elements, is stored once, by a kernel of its own placed before the first kernel that reads it, and those kernels
# load it. The values are the same (the same stage code computes them) and a cheap reduction is still recomputed.
def _share_reductions(groups: List[Any], lowered: Lowered) -> List[Any]:
    """``groups`` with each costly reduction read by several of them stored once (Note [Reductions shared by
    kernels are stored once])."""
    users: Dict[kir.Reduction, List[int]] = {}
    for g, group in enumerate(groups):
        if isinstance(group, Extern):
            continue
        # NOTE: in walk order, not a set's: reductions hash by identity, and the order names their buffers and
        # stores, which the generated source (and so the disk cache's key) must not vary with from run to run
        found = dict.fromkeys(e.args[0] for st in group for e in kir.walk(st.expr) if e.op == "reduce")
        for red in found:
            users.setdefault(red, []).append(g)
    shared = {red: gs for red, gs in users.items() if len(gs) > 1 and _size(red.red_shape) > SHARED_INLINE_LIMIT}
    if not shared:
        return groups
    before: Dict[int, List[Store]] = {}
    stored: Dict[kir.Reduction, kir.Buffer] = {}
    for red, gs in shared.items():
        buf = lowered.buffer(red.out_shape, red.dtype)
        stored[red] = buf
        before.setdefault(gs[0], []).append(Store(buf, red.out_vars, kir.reduce_ref(red, red.out_vars)))
    out: List[Any] = []
    for g, group in enumerate(groups):
        by_shape: Dict[tuple, List[Store]] = {}  # one kernel per shape: sums over the same loops run side by side
        for st in before.get(g, ()):
            by_shape.setdefault(st.buffer.shape, []).append(st)
        out.extend(by_shape.values())
        if isinstance(group, Extern):
            out.append(group)
            continue
        out.append([Store(st.buffer, st.vars, _load_stored(st.expr, stored)) for st in group])
    return out


def _size(shape: Any) -> int:
    n = 1
    for k in shape:
        n *= k
    return n


def _load_stored(root: Expr, stored: Dict[kir.Reduction, kir.Buffer]) -> Expr:
    """``root`` with each reduce of a reduction in ``stored`` replaced by a load of its buffer."""
    mapping: Dict[Expr, Expr] = {}
    for e in kir.walk(root):
        if e.op == "reduce" and e.args[0] in stored:
            index = [kir.substitute(i, mapping) if mapping else i for i in e.args[1]]
            mapping[e] = kir.load(stored[e.args[0]], index)
    return kir.substitute(root, mapping) if mapping else root


def _kernel(name: str, group: List[Store], limits: Limits) -> Kernel:
    vars_ = group[0].vars
    values = []
    for st in group:
        e = st.expr if st.vars is vars_ else kir.substitute(st.expr, dict(zip(st.vars, vars_)))
        values.append((st.buffer, e))
    refs: List[Expr] = []
    for _, e in values:
        refs.extend(x for x in kir.walk(e) if x.op == "reduce" and x not in refs)
    dep = set()
    for r in refs:
        for i in r.args[1]:
            dep |= kir.free_vars(i)
    outer = [v for v in vars_ if v in dep]
    inner = [v for v in vars_ if v not in dep]
    stages: List[Stage] = []
    seen: Dict[Expr, None] = {}

    def visit(ref: Expr) -> None:
        if ref in seen:
            return
        seen[ref] = None
        red, index = ref.args
        body = kir.reduction_body_at(red, index)
        for x in kir.walk(body):
            if x.op == "reduce":
                visit(x)
        stages.append(Stage(ref, red, body))

    for r in refs:
        visit(r)
    n = 1
    for v in vars_:
        n *= v.args[1]
    work = n
    for s in stages:
        m = 1
        for k in s.red.red_shape:
            m *= k
        outer_n = 1
        for v in outer:
            outer_n *= v.args[1]
        work += m * outer_n
    stores = []
    for buf, e in values:
        idx = kir.const(0, kir.INDEX)
        for v, s in zip(vars_, buf.strides):
            idx = kir.iadd(idx, kir.imul(v, s))
        stores.append((buf, idx, e))
    tile = _tile(outer, stages)
    if tile is not None:
        outer = [v for v in outer if v is not tile] + [tile]
    else:
        _keep(stages, inner, [e for _, e in values], limits.keep_bytes)
        if limits.coalesce:
            inner, stores = _coalesce_kernel(stages, inner, stores)
    first = (outer or inner)
    parallel = work >= limits.parallel_threshold and bool(first) and first[0].args[1] > 1
    return Kernel(name, outer, inner, stages, stores, work, parallel, tile)


# Note [Stage values kept for the stores]
# A stage's body and the kernel's stores often compute the same expensive value: softmax sums exp(x - max) over a
# row and then stores exp(x - max) / sum. Recomputing it in the store (the scheduler's default, and Inductor's) costs
# a second exp per element (measured on 1 thread, softmax 1024^2 with cpp_math's float exp: 1.26 ms recomputed,
# 1.06 ms kept; the kept values are written and read back in L1). Where a stage's reduced loops match
# the kernel's inner loops (same extents, in order) and a store reads a value of the body that is an expensive op
# (lower.graph.EXPENSIVE_OPS) with the reduced variables replaced by the inner ones, the stage keeps that value for
# every index of its reduced loops (``Stage.keep``), and the stores read it instead of computing it again: one
# evaluation per element. It is the same value computed by the same code, so the results are bit-identical. Only the
# largest such values are kept (not an exp inside a kept tanh), and only while they fit in the backend's
# ``Limits.keep_bytes`` per outer iteration (C++: an array on the stack; a Triton backend would hold the row's block
# in registers); larger rows recompute as before. Not in a tiled kernel, whose stages run over outputs in blocks.
def _keep(stages: List[Stage], inner: List[Expr], stores: List[Expr], limit: int) -> None:
    """Set ``keep`` and ``keep_index`` of the stages whose values the stores read again (Note [Stage values kept
    for the stores])."""
    in_stores: set = set()
    for e in stores:
        in_stores.update(kir.walk(e))
    for s in stages:
        red = s.red.red_vars
        if not red or [v.args[1] for v in red] != [v.args[1] for v in inner]:
            continue
        to_inner = dict(zip(red, inner))
        found = {e: m for e in kir.walk(s.body) if e.op in EXPENSIVE_OPS
                 for m in [kir.substitute(e, to_inner)] if m in in_stores}
        inside = {x for e in found for x in kir.walk(e) if x is not e}
        keep = [(e, m) for e, m in found.items() if e not in inside]
        n = 1
        for v in red:
            n *= v.args[1]
        if not keep or n * sum(e.dtype.itemsize for e, _ in keep) > limit:
            continue
        s.keep, s.keep_index = keep, (_flat(red), _flat(inner))
        limit -= n * sum(e.dtype.itemsize for e, _ in keep)


# Note [Contiguous loops are merged]
# A loop nest keeps the dims of the tensors it reads, and the innermost dim is often short: a reduction over (N, H, W)
# of an NCHW tensor (BatchNorm's statistics and gradients) runs loops of N, H and W = 12 elements, though H and W are
# one run of H * W contiguous elements. A 12-iteration loop fills less than one vector of 16 floats per pass, and a
# reduction in lanes (codegen/cpp_stages.py) rounds its blocks to the innermost extent (8 lanes, then a shifted block
# that computes 4 of them again). Where two adjacent loops a, b (b inner, extent E) move every index they read or
# write as one loop does (the stride of a is E times the stride of b in each), they are replaced by one loop m of
# their combined extent, with a = m // E and b = m % E substituted: the index arithmetic folds back to affine indices
# in m (kir._fold_divmod), and the iterations run in the same order, so every value and every sum is what it was. A
# merge whose indices do not fold is not made; a loop of one iteration is dropped (its variable is 0). For the stages'
# own loops, and for the inner loops of a kernel (not where a stage keeps values for the stores: Note [Stage values
# kept for the stores], indexed by the inner loops). A backend asks for it (``Limits.coalesce``); Triton's kernels
# shape their blocks from the loops as they are.
def _indices(root: Expr) -> List[Expr]:
    return [e.args[1] for e in kir.walk(root) if e.op == "load"]


def _coalesce(vs: List[Expr], indices: List[Expr]) -> Tuple[List[Expr], Dict[Expr, Expr]]:
    """(loops, substitution): ``vs`` with adjacent loops merged where every index in ``indices`` moves as one loop
    through them (Note [Contiguous loops are merged])."""
    mapping: Dict[Expr, Expr] = {v: kir.const(0, kir.INDEX) for v in vs if v.args[1] == 1}
    vs = [v for v in vs if v not in mapping] or list(vs[-1:])  # a loop of one iteration is no loop
    mapping.pop(vs[-1], None)
    if mapping:
        indices = [kir.substitute(idx, mapping) for idx in indices]
    i = len(vs) - 2
    while i >= 0:
        a, b = vs[i], vs[i + 1]
        extent = b.args[1]
        ok = bool(indices)
        for idx in indices:
            sa, sb = kir.stride(idx, a), kir.stride(idx, b)
            if sa is None or sb is None or sa != extent * sb:
                ok = False
                break
        if ok:
            m = kir.var(f"{a.args[0]}_{b.args[0]}", a.args[1] * extent)
            step = {a: kir.ifloordiv(m, extent), b: kir.imod(m, extent)}
            merged = [kir.substitute(idx, step) for idx in indices]
            if all(kir.stride(idx, m) is not None for idx in merged):
                indices = merged
                mapping = {k: kir.substitute(v, step) for k, v in mapping.items()}
                mapping.update(step)
                vs[i:i + 2] = [m]
        i -= 1
    return vs, mapping


def _coalesce_kernel(stages: List[Stage], inner: List[Expr], stores: List[tuple]) -> Tuple[List[Expr], List[tuple]]:
    """Merge the contiguous loops of ``stages`` and the inner loops of ``stores`` (Note [Contiguous loops are
    merged]); returns the inner loops and the stores."""
    for s in stages:
        if s.keep or len(s.red_vars) < 2:
            continue
        s.red_vars, mapping = _coalesce(s.red_vars, _indices(s.body))
        if mapping:
            s.body = kir.substitute(s.body, mapping)
    if len(inner) < 2 or any(s.keep for s in stages):
        return inner, stores
    indices = [i for buf, idx, e in stores for i in [idx] + _indices(e)]
    inner, mapping = _coalesce(inner, indices)
    if not mapping:
        return inner, stores
    return inner, [(buf, kir.substitute(idx, mapping), kir.substitute(e, mapping)) for buf, idx, e in stores]


def _flat(vs: List[Expr]) -> Expr:
    """The row-major flat index of loop variables ``vs`` over their extents."""
    idx = kir.const(0, kir.INDEX)
    for v in vs:
        idx = kir.iadd(kir.imul(idx, v.args[1]), v)
    return idx


def _tile(outer: List[Expr], stages: List[Stage]) -> Optional[Expr]:
    """The outer loop to tile (Note [Column reductions are tiled]): in a kernel where some stage reads its reduced
    loop with a stride (neither 0 nor 1 element), an outer loop in which every load of the stages that depends on
    it is contiguous; None if there is none."""
    loads = [(s, e.args[1]) for s in stages for e in kir.walk(s.body) if e.op == "load"]
    if not any(s.red.red_vars and kir.stride(i, s.red.red_vars[-1]) not in (0, 1, -1) for s, i in loads):
        return None
    for v in reversed(outer):
        reads = [i for _, i in loads if v in kir.free_vars(i)]
        if v.args[1] > 1 and reads and all(kir.adjacent(i, v) for i in reads):
            return v
    return None


def format_schedule(sched: Schedule) -> str:
    """The fused kernel IR as text (what LAZY_DUMP_DIR writes next to the source)."""
    lines = []
    for step in sched.steps:
        if isinstance(step, Extern):
            ins = ", ".join(map(repr, step.inputs))
            outs = ", ".join(map(repr, step.outputs))
            lines.append(f"extern {step.name}({ins}) -> {outs}")
            continue
        loops = lambda vs: " ".join(f"{v.args[0]}<{v.args[1]}" for v in vs)  # noqa: E731
        tile = f" tile={step.tile.args[0]}" if step.tile is not None else ""
        lines.append(f"kernel {step.name}: outer[{loops(step.outer)}] inner[{loops(step.inner)}] "
                     f"work={step.work} parallel={step.parallel}{tile}")
        for s in step.stages:
            kept = f" (keeps {', '.join(e.op for e, _ in s.keep)})" if s.keep else ""
            lines.append(f" stage {s.red.kind} over {list(s.red.red_shape)}{kept}:")
            lines.append(kir.format_expr(s.body))
        for buf, _, e in step.stores:
            lines.append(f" store {buf!r} {buf.dtype} {list(buf.shape)}:")
            lines.append(kir.format_expr(e))
    return "\n".join(lines)
