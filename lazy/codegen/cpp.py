"""The C++/OpenMP renderer: a schedule -> one translation unit of plain C++ (raw pointers, no torch headers).

A table maps each kernel-IR op to a template over its rendered arguments (STYLE.md item 3; cpp_expr.py); a few hooks
render loops, stages (cpp_stages.py) and stores. Each kernel is a ``static`` function; each run of consecutive
kernels between extern calls is one ``extern "C"`` entry point ``lz_seg<i>(void** P, const double* F, const int64_t*
I)``: ``P`` holds every buffer's pointer (by buffer id), ``F``/``I`` the runtime scalars as double/int64. The return
value is non-zero if an integer division by zero happened (eager raises there too). Temporaries are declared with
their exact C type so narrow integer results wrap as in eager.
"""
from __future__ import annotations

import copy
from typing import Dict, List, Optional

from ..lower import kir
from ..lower.graph import LATENCY_MIN, critical_path
from ..lower.kir import Expr
from ..schedule import Kernel, Limits, Schedule
from . import cpp_math
from .cpp_expr import _STORE, CTYPES, TEMPLATES, UnsupportedByRenderer, _loop, _Scope, ctype, storage_ctype
from .cpp_prelude import PRELUDE
from .cpp_stages import _Blocks, _kept_arrays, _lanes, _render_siblings, _render_stage, _sibling_stages

__all__ = ["CTYPES", "INTERLEAVE", "LIMITS", "PRELUDE", "TEMPLATES", "UnsupportedByRenderer", "ctype", "render",
           "render_kernel", "storage_ctype"]

# keep_bytes: stage values kept per outer iteration (Note [Stage values kept for the stores] in schedule/) live in
# an array on the stack, a third of a 48 KB L1: softmax rows of up to 4096 floats
LIMITS = Limits(max_buffers=64, parallel_threshold=1 << 15, keep_bytes=16 << 10, coalesce=True)


def _render_stores(k: Kernel, scope: _Scope, tile: Optional[_Blocks], arrays: Dict[Expr, str]) -> None:
    """The kernel's stores at ``scope``'s indent (inside its inner loops); in a tiled kernel, in a loop over the
    block's lanes, of the lanes the block takes (Note [Reductions in lanes])."""
    lines, indent = scope.lines, scope.indent
    scope_indent = indent
    values: List[str] = []
    if tile is not None:
        if tile.masked:  # the values of every lane first (but a stage's own), then the stores of the lanes it takes
            values = [f"{arrays[e]}[l]" if e in arrays else f"o{j}[l]" for j, (_, _, e) in enumerate(k.stores)]
            computed = [(j, e) for j, (_, _, e) in enumerate(k.stores) if e not in arrays]
            lines.extend(f"{indent}{ctype(e.dtype)} o{j}[{tile.lanes}];" for j, e in computed)
            if computed:
                lines.extend(tile.lanes_loop(indent))
                inner = scope.child(indent + "  ")
                inner.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
                lines.extend(f"{indent}  o{j}[l] = {inner.emit(e)};" for j, e in computed)
                lines.append(f"{indent}}}")
        lines.extend(tile.lanes_loop(indent))
        indent += "  "
        if tile.masked:
            lines.append(f"{indent}if ({tile.new()}) {{")
            indent += "  "
    scope = scope.child(indent)
    scope.names.update((ref, f"{array}[l]") for ref, array in arrays.items())
    for n, s in enumerate(k.stages):
        kept = _kept_arrays(n, s)
        at_index = scope.emit(s.keep_index[1]) if kept else ""
        scope.names.update((m, f"{array}[{at_index}]") for array, _, _, m in kept)
    for j, (buf, idx, e) in enumerate(k.stores):
        val = values[j] if values else scope.emit(e)
        val = _STORE[buf.dtype].format(val) if buf.dtype in _STORE else val
        lines.append(f"{indent}b{buf.id}[{scope.emit(idx)}] = {val};")
    while indent != scope_indent:
        indent = indent[:-2]
        lines.append(indent + "}")


# Note [Interleaved copies]
# A long pointwise chain (the 200-op benchmark: 40 sines between multiplies, adds and relus) is one dependency chain
# per element: a vectorized iteration waits on the latency of every op in turn, and its thousands of instructions
# leave the out-of-order window no room to start the next iteration early. So the innermost loop of a kernel whose
# store values have a long critical path (LATENCY_MIN, in lower/graph.py's critical_path units: an expensive op 24,
# others 1)
# computes INTERLEAVE independent copies per iteration, at i, i + H, ..., i + (K - 1) H (H = extent / K; the last
# extent % K indices in a remainder loop), their statements interleaved in the source: each op of every copy is
# issued before the next op of the first, so the copies' latencies overlap (also across the calls of the vector
# math: each copy's call is independent of the other's). Every copy is its own contiguous vectorized stream, so this
# does not depend on the vector width. Each element is computed by the same expression as before: results are
# bit-identical. Measured on the 200-op chain at 1024^2, 1 thread (benchmarks/pointwise_chain.py): see the README
# of benchmarks. A short innermost loop (below INTERLEAVE_MIN_EXTENT: each copy needs a few vectors) is not split:
# an enclosing inner loop that K divides is instead (copies at rows i, i + H, ... of a 16 x 16 chain), inside which
# the innermost loop runs whole for each copy. Not for kernels with stages (their inner loops read stage values) or
# tiles, nor for short chains (below LATENCY_MIN: memory-bound, nothing to hide; measured: gelu alone, ~30, ran
# 5-8 % slower interleaved, exp(sin(x)), 49, 5-35 % faster).
INTERLEAVE = 4
INTERLEAVE_MIN_EXTENT = 256


def _interleave(k: Kernel) -> Optional[Expr]:
    """The loop of ``k`` whose iterations run as INTERLEAVE interleaved copies (Note [Interleaved copies]), or None:
    the innermost loop if long enough, else an enclosing inner loop whose extent INTERLEAVE divides (a 16 x 16 chain
    interleaves 4 rows)."""
    if k.stages or k.tile is not None or not k.inner or critical_path([e for _, _, e in k.stores]) < LATENCY_MIN:
        return None
    if k.inner[-1].args[1] >= INTERLEAVE_MIN_EXTENT:
        return k.inner[-1]
    return next((v for v in k.inner[:-1] if v.args[1] % INTERLEAVE == 0), None)


def _render_copies(k: Kernel, scope: _Scope, v: Expr, step: int) -> None:
    """``k``'s stores at ``scope``'s indent, INTERLEAVE copies at ``v`` + c ``step``, statements interleaved."""
    name = scope.var_names[v]
    scope.lines.append(scope.indent + " ".join(f"const int64_t {name}_{c} = {name} + {c * step};"
                                               for c in range(INTERLEAVE)))
    bodies = []
    for c in range(INTERLEAVE):
        body = _Scope(scope.names, [], scope.indent, scope.counter, {**scope.var_names, v: f"{name}_{c}"})
        _render_stores(k, body, None, {})
        bodies.append(body.lines)
    assert len({len(b) for b in bodies}) == 1, "interleaved copies must render alike"
    scope.lines.extend(line for group in zip(*bodies) for line in group)


# Note [Invariant values are computed before the inner loops]
# A store often reads values that depend on the outer loops only: BatchNorm's backward reads weight[c], mean[c] and
# invstd[c] inside the loops over (N, H, W). Left in the inner loop, g++'s partial redundancy elimination, in a
# kernel whose stages come first, turns those loads into values carried around the loop, and the loop then has
# control flow that the vectorizer refuses ("control flow in loop"): measured on BatchNorm's grad_input behind a
# ReLU mask, [32, 6, 12, 12], 229 us scalar against 17 us vectorized. So every value of the stores that depends on
# no inner loop variable is computed once, in the outer scope, before the inner loops open (where none of them is
# empty, so nothing runs that would not have run): the same expressions, evaluated fewer times, the same results.
def _hoist_invariants(k: Kernel, scope: _Scope) -> None:
    """Compute in ``scope`` the values of ``k``'s stores that no inner loop variable reaches."""
    inner = set(k.inner)
    varying: Dict[Expr, bool] = {}
    for _, _, root in k.stores:
        for e in kir.walk(root, scope.names):
            if e in varying:
                continue
            varying[e] = e in inner if e.op == "var" else any(varying.get(a, False) for a in kir.children(e))
            if not varying[e] and e not in scope.names and e.op not in ("const", "var", "scalar", "reduce"):
                scope.emit(e)


# Note [Concatenations split their loop]
# A concatenation along the innermost loop lowers to ``where(i < c1, a, where(i < c2, b, c))`` with every piece's
# load clamped into range (lower/indexing.py), so each element computed every piece's index and loaded all of them:
# the [512, 192] gather of a fused q/k/v projection's gradient took 0.22 ms where one copy of its bytes takes a few
# µs. Where the store values compare the innermost loop variable with constants (and nothing else splits the loop:
# no stages, tiles or interleaved copies), that loop runs as one loop per range between the constants, each with
# the comparisons replaced by their value there: g++ folds the selects and drops the other pieces' loads. Each
# element is computed by the same expression as before.
def _ranges(k: Kernel) -> Optional[List[tuple]]:
    """[(start, end, stores)] for the innermost loop split at the constants its variable is compared with, the
    stores' comparisons known in each range; None if there are none."""
    if k.stages or k.tile is not None or not k.inner:
        return None
    v, extent = k.inner[-1], k.inner[-1].args[1]
    tests = {e: e.args[1].args[0] for _, _, root in k.stores for e in kir.walk(root)
             if e.op == "lt" and e.args[0] is v and type(e.args[1]) is Expr and e.args[1].op == "const"}
    cuts = sorted({c for c in tests.values() if 0 < c < extent})
    if not cuts:
        return None
    out = []
    for start, end in zip([0] + cuts, cuts + [extent]):
        known = {e: kir.const(end <= c, e.dtype) for e, c in tests.items()}  # a range lies on one side of each
        out.append((start, end, [(b, idx, _fold_selects(kir.substitute(e, known))) for b, idx, e in k.stores]))
    return out


def _fold_selects(root: Expr) -> Expr:
    """``root`` with every ``where`` whose condition is a constant replaced by the branch it takes."""
    memo: Dict[Expr, Expr] = {}
    for e in kir.walk(root):
        if e.op == "where" and e.args[0].op == "const":
            memo[e] = memo[e.args[1] if e.args[0].args[0] else e.args[2]]
        elif e.op == "reduce":
            memo[e] = e
        else:
            args = tuple(memo[a] if type(a) is Expr else a for a in e.args)
            memo[e] = e if args == e.args else kir.mk(e.op, e.dtype, *args)
    return memo[root]


def _render_ranges(k: Kernel, scope: _Scope, ranges: List[tuple], name: str, pragma: Optional[str],
                   indent: str) -> None:
    """The innermost loop of ``k``, at ``indent``, as one loop per range with its stores; the caller closes the
    last one."""
    lines = scope.lines
    for n, (start, end, stores) in enumerate(ranges):
        if n:
            lines.append(indent + "}")
        lines.extend([pragma] if pragma is not None else [])
        lines.append(f"{indent}for (int64_t {name} = {start}; {name} < {end}; ++{name}) {{")
        _render_stores(_with_stores(k, stores), scope.child(indent + "  "), None, {})


def _with_stores(k: Kernel, stores: list) -> Kernel:
    view = copy.copy(k)
    view.stores = stores
    return view


def render_kernel(k: Kernel) -> str:
    lines: List[str] = [f"static void lz_{k.name}(void** P, const double* F, const int64_t* I) {{"]
    for b in k.buffers():
        t = storage_ctype(b.dtype)
        lines.append(f"  {t}* __restrict b{b.id} = ({t}*)P[{b.id}];")
    lines.append("  (void)F; (void)I;")
    var_names: Dict[Expr, str] = {}
    loops = k.outer + k.inner
    for i, v in enumerate(loops):
        var_names[v] = f"i{i}"
    for s in k.stages:
        for j, v in enumerate(s.red_vars):
            var_names.setdefault(v, f"r{len(var_names)}_{j}")
    tile = None  # the blocks of the tiled loop (Note [Column reductions are tiled] in schedule/)
    if k.tile is not None:
        types = [ctype(d) for s in k.stages for d in (s.red.acc_dtype, s.red.dtype)]
        tile = _Blocks(var_names[k.tile], k.tile.args[1], _lanes(types, k.tile.args[1]))
    counter = [0]
    indent = "  "
    scope = _Scope({}, lines, indent, counter, var_names)
    depth = 0
    for i, v in enumerate(k.outer):
        if i == 0 and k.parallel:
            lines.append(f"{indent}#pragma omp parallel for schedule(static)")
        lines.extend(tile.open(indent) if v is k.tile else [_loop(var_names[v], v.args[1], indent)])
        indent += "  "
        depth += 1
    scope = scope.child(indent)
    arrays: Dict[Expr, str] = {}
    row = k.outer[-1] if k.outer and tile is None else None  # Note [The next row is prefetched] (first stages)
    for i, group in enumerate(_sibling_stages(k, tile)):
        if len(group) == 1:
            _render_stage(group[0], k.stages[group[0]], scope, tile, arrays, row if i == 0 else None)
        else:
            _render_siblings([(n, k.stages[n]) for n in group], scope, row if i == 0 else None)
    if tile is None and k.inner and all(v.args[1] > 0 for v in k.inner):
        _hoist_invariants(k, scope)
    split = _interleave(k)  # Note [Interleaved copies]
    step = split.args[1] // INTERLEAVE if split is not None else 0
    ranges = _ranges(k) if split is None else None  # Note [Concatenations split their loop]
    for i, v in enumerate(k.inner):
        last = i == len(k.inner) - 1
        pragma = None
        if i == 0 and not k.outer and k.parallel:
            pragma = f"{indent}#pragma omp parallel for schedule(static)"
        elif last and tile is None:
            pragma = f"{indent}#pragma GCC ivdep"
        if last and ranges is not None:  # one loop per range, each under the pragma
            _render_ranges(k, scope, ranges, var_names[v], pragma, indent)
        else:
            lines.extend([pragma] if pragma is not None else [])
            lines.append(_loop(var_names[v], step if v is split else v.args[1], indent))
        indent += "  "
        depth += 1
    if split is not None:
        _render_copies(k, scope.child(indent), split, step)
        rest = split.args[1] % INTERLEAVE
        if rest:  # the innermost loop's last indices, one copy each
            name, outer = var_names[split], indent[:-2]
            lines.append(outer + "}")
            lines.append(f"{outer}for (int64_t {name} = {split.args[1] - rest}; {name} < {split.args[1]}; ++{name}) {{")
            _render_stores(k, scope.child(indent), None, {})
    elif ranges is None:  # (split in ranges, the stores are in the range loops)
        _render_stores(k, scope.child(indent), tile, arrays)
    for _ in range(depth):
        indent = indent[:-2]
        lines.append(indent + "}")
    lines.append("}")
    return "\n".join(lines)


def render(sched: Schedule, kernel_entries: bool = False, units: int = 1) -> tuple:
    """(source, segments, unit sources): segments are lists of kernels, one ``lz_seg<i>`` entry point each, in step
    order. ``kernel_entries`` adds one ``lz_kernel_<name>`` entry point per kernel (for timing kernels one by one).
    The source is one translation unit; the unit sources split it in up to ``units`` that compile apart (Note
    [Programs compiled in parallel]), or are [source]."""
    kernels: Dict[str, str] = {}
    segments: List[List[Kernel]] = []
    current: List[Kernel] = []
    for step in sched.steps:
        if isinstance(step, Kernel):
            kernels[step.name] = render_kernel(step)
            current.append(step)
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    entries = []
    for i, seg in enumerate(segments):
        calls = "\n".join(f"  lz_{k.name}(P, F, I);" for k in seg)
        entries.append(f'extern "C" int lz_seg{i}(void** P, const double* F, const int64_t* I) {{\n{calls}\n'
                       f"  int e = lz_err; lz_err = 0; return e;\n}}")
    for k in (sched.kernels if kernel_entries else ()):
        entries.append(f'extern "C" int lz_kernel_{k.name}(void** P, const double* F, const int64_t* I) {{\n'
                       f"  lz_{k.name}(P, F, I);\n  int e = lz_err; lz_err = 0; return e;\n}}")
    body = list(kernels.values()) + entries
    definitions = cpp_math.definitions("\n\n".join(body))  # the sin/cos its kernels call, if any
    source = "\n\n".join([PRELUDE] + body + [definitions]) + "\n"
    groups = _unit_groups(segments, kernels, 1 if kernel_entries else units)
    if len(groups) < 2:
        return source, segments, [source]
    texts = []
    for n, group in enumerate(groups):  # the definitions once, in the first unit (hidden symbols: one library)
        parts = [PRELUDE] + [kernels[k.name] for i in group for k in segments[i]] + [entries[i] for i in group]
        texts.append("\n\n".join(parts + ([definitions] if n == 0 else [])) + "\n")
    return source, segments, texts


# Note [Programs compiled in parallel]
# g++ compiles a translation unit on one core: the captured training step of the 2x64 GPT (88 kernels) took 1.4 s,
# which is most of a new size's cost under lazy.compile(dynamic=True) and of a capture's first call. Its kernels
# and their segments' entry points are independent functions (each segment's entry point calls its own kernels; the
# prelude's helpers are static inline; lz_err, static, is read by the entry point of the same unit), so the source is
# split into up to UNIT_MAX units of about UNIT_MIN_CHARS of kernels or more, segments dealt to the unit with the
# least text so far, compiled at once and linked (a unit costs ~0.04 s of prelude, a link ~0.02 s). The sin/cos
# vector variants (Note [Trig vector variant]) are hidden symbols of the library, defined in the first unit only.
# The graph's source (dumps, the disk cache) stays the one unit it always was: the split is a build detail.
UNIT_MAX = 8
UNIT_MIN_CHARS = 40000


def _unit_groups(segments: List[List[Kernel]], kernels: Dict[str, str], units: int) -> List[List[int]]:
    """Segment indices per translation unit (Note [Programs compiled in parallel]), each in step order."""
    sizes = [sum(len(kernels[k.name]) for k in seg) for seg in segments]
    n = max(1, min(units, UNIT_MAX, len(segments), sum(sizes) // UNIT_MIN_CHARS))
    groups: List[List[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in sorted(range(len(segments)), key=lambda i: -sizes[i]):
        j = load.index(min(load))
        groups[j].append(i)
        load[j] += sizes[i]
    return [sorted(g) for g in groups if g]
