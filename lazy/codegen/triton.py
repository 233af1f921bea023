"""The Triton renderer: a schedule -> one Python module of ``@triton.jit`` kernels, one per fused kernel.

The same kernel IR and schedule as the C++ renderer (codegen/cpp.py); what differs is in hooks: block sizes and
grids (``_blocks``), masks for ragged tails, reductions across a block, and how many elements a row may hold in
registers (PERSISTENT_ELEMS). Expressions are rendered through the table of codegen/triton_ops.py.

Note [Triton kernel shapes]
A kernel without stages (pointwise) is one flat loop: a program takes XBLOCK consecutive flat indices of its
loops, masked at the tail. A kernel with stages runs XBLOCK outer iterations ("rows") per program, as a
[XBLOCK, 1] block of outer indices; each stage reduces a [XBLOCK, RBLOCK] block of its reduced loop, and the
stores take [XBLOCK, IBLOCK] blocks of the inner loops. Rows of up to PERSISTENT_ELEMS elements are *persistent*:
the whole row is one block and nothing loops; a stage whose reduced loops have the inner loops' extents then
reads its element at the inner loops' own index (its variables are substituted), so the values it computes are
the stores' (softmax keeps exp(x - max) and reads x once: Note [Stage values kept for the stores] in schedule/,
which needs no copy here, so ``LIMITS.keep_bytes`` is 0). Longer rows loop over RBLOCK chunks with an
accumulator block, reduced across the block after the loop. A tiled kernel (Note [Column reductions are tiled])
puts its tiled loop last in the outer block, so a program's XBLOCK outputs are adjacent and each load of the
reduced loop is coalesced. Reductions across a block: tl.sum, and tl.reduce with the NaN-propagating max/min and
the first-index arg combine of triton_ops.HELPERS (Note [Arg reductions]). Float sums accumulate in the body's
type (float32 for float32 and half inputs: eager's CUDA kernels do the same), not in double as on the cpu.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..lower import kir
from ..lower.kir import Expr
from ..schedule import Kernel, Limits, Schedule, Stage
from .triton_blocks import LOOP_RBLOCK, POINTWISE_BLOCK, Blocks, _persistent, _pow2, candidates, default_blocks
from .triton_ops import BOOL_TEMPLATES, HALF, HELPERS, TEMPLATES, UnsupportedByRenderer, const, tl_type

__all__ = ["LIMITS", "Launch", "UnsupportedByRenderer", "render", "render_kernel"]

LIMITS = Limits(max_buffers=64, parallel_threshold=0, keep_bytes=0)
_INDEX_OPS = frozenset({"iadd", "imul", "ifloordiv", "imod", "index_clamp", "index_checked"})
_INIT = {"sum": 0, "prod": 1}
_TL_SCALAR = {"fp32": "tl.float32", "fp64": "tl.float64", "i64": "tl.int64"}
_COMBINE = {"prod": "prod_", "max": "max_nan", "min": "min_nan"}  # triton_ops.HELPERS


def _scalar_type(slot: int, is_float: bool, float32: frozenset) -> str:
    """The Triton type of a runtime scalar argument: the kernel's signature and its launch both ask here."""
    return "fp32" if slot in float32 else "fp64" if is_float else "i64"


@dataclass
class Launch:
    """How the runtime launches one kernel: its function ``name``, the buffer ids and runtime scalar slots it
    takes (in argument order; ``floats[i]``: slot i is float64, else int64), the grid, and Triton's options.
    With ``memory``, the kernel reads its scalars from the program's scalar buffers instead (Note [Scalars in
    device memory]): its arguments end with its region of the float64 buffer if it reads a float slot (its float
    slots in order), then its region of the int64 one if it reads an int slot."""
    name: str
    buffers: List[int]
    scalars: List[int]
    floats: List[bool]
    grid: int
    num_warps: int
    debug: bool
    memory: bool = False
    inplace: bool = False  # it loads a buffer it stores: running it twice is not running it once
    float32: frozenset = frozenset()  # float slots it takes as float32 (Note [Scalars read as float32])

    def scalar_types(self) -> List[str]:
        """The Triton types of its runtime scalar arguments, in order (without ``memory``)."""
        return [_scalar_type(s, f, self.float32) for s, f in zip(self.scalars, self.floats)]

    def scalar_buffers(self) -> List[torch.dtype]:
        """The dtypes of the scalar buffers the kernel takes (``memory``), in argument order."""
        if not self.memory:
            return []
        return [dt for dt, want in ((torch.float64, True), (torch.int64, False)) if want in self.floats]


class _Scope:
    """Rendered names visible in a block of the kernel; ``ctx`` picks the mask and shape of a load by the loop
    variables its index depends on."""

    def __init__(self, names: Dict[Expr, str], lines: List[str], indent: str, counter: List[int],
                 ctx: "_Contexts") -> None:
        self.names, self.lines, self.indent, self.counter, self.ctx = dict(names), lines, indent, counter, ctx

    def child(self, indent: str) -> "_Scope":
        return _Scope(self.names, self.lines, indent, self.counter, self.ctx)

    def emit(self, root: Expr) -> str:
        for e in kir.walk(root, self.names):
            if e in self.names:
                continue
            text = self._render(e)
            if e.op in ("var", "scalar", "const"):  # inline: no statement for a leaf
                self.names[e] = text
                continue
            name = f"t{self.counter[0]}"
            self.counter[0] += 1
            self.lines.append(f"{self.indent}{name} = {text}")
            self.names[e] = name
        return self.names[root]

    def arg(self, a: Expr, index: bool) -> str:
        if a.op == "const" and index:
            return str(int(a.args[0]))
        return self.names[a]

    def _render(self, e: Expr) -> str:
        op = e.op
        if op == "const":
            return const(e.args[0], e.dtype)
        if op == "var":
            raise UnsupportedByRenderer(f"loop variable {e.args[0]} outside the loops that define it")
        if op == "scalar":
            return f"s{e.args[0]}"
        if op == "reduce":
            raise UnsupportedByRenderer("a reduction read outside its stage")
        if op == "load":
            buf, idx = e.args
            zero, mask = self.ctx.of(kir.free_vars(idx))
            return f"tl.load(b{buf.id} + ({self.arg(idx, True)} + {zero}), mask={mask}, other=0)"
        index = op in _INDEX_OPS
        args = [self.arg(a, index) for a in e.args if type(a) is Expr]
        if op == "index_checked":  # checked where its loops' lanes hold elements
            args.append(self._live(e))
        if op == "cast":
            src = e.args[0].dtype
            if src in HALF:
                args = [f"{args[0]}.to(tl.float32)"]
                src = torch.float32
            if e.dtype is torch.bool:
                return f"({args[0]} != 0)"
            if src is torch.bool or e.dtype != src:
                return f"{args[0]}.to({tl_type(e.dtype)})"
            return args[0]
        operands = [a for a in e.args if type(a) is Expr]
        have = [a.dtype for a in operands]
        if not index:
            # loop variables are int32 (or int64) index blocks: as data they take their type; an operand of another
            # type than the op computes in is converted (the C++ renderer's implicit conversions)
            args = [f"{s}.to({tl_type(a.dtype)})" if _is_index(a) and a.op != "const" else s
                    for s, a in zip(args, operands)]
            want = _operand_types(e, have)
            args = [_convert(s, h, w) for s, h, w in zip(args, have, want)]
            have = want
        table = BOOL_TEMPLATES if e.dtype is torch.bool and op in BOOL_TEMPLATES else TEMPLATES
        fn = table.get(op)
        if fn is None:
            raise UnsupportedByRenderer(f"kernel-IR op {op!r} has no Triton template")
        if e.dtype in HALF or any(h in HALF for h in have):
            # NOTE: float16/bfloat16 values are computed in float32 and rounded once per op, as eager's kernels
            # compute them (opmath; exact for compares, selects, min/max; correctly rounded for + - * /)
            wide = [f"{s}.to(tl.float32)" if h in HALF else s for s, h in zip(args, have)]
            text = fn(_View(e, [_f32(h) for h in have], _f32(e.dtype)), wide)
            return f"{text}.to({tl_type(e.dtype)})" if e.dtype in HALF else text
        return fn(_View(e, have, e.dtype), args)

    def _live(self, e: Expr) -> str:
        """The mask of the lanes where ``e``'s loop variables are in range."""
        try:
            mask = self.ctx.of(kir.free_vars(e))[1]
        except UnsupportedByRenderer:
            mask = self.ctx.base[1]
        return "1" if mask == "None" else mask


_COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_OWN_TYPE = frozenset({"isinf", "isfinite", "isposinf", "isneginf", "signbit"})


def _operand_types(e: Expr, have: List[torch.dtype]) -> List[torch.dtype]:
    """The types an op's operands are converted to before it runs."""
    if e.op in _COMPARE:
        common = have[0]
        for h in have[1:]:
            common = torch.promote_types(common, h)
        return [common] * len(have)
    if e.op == "where":
        return [torch.bool, e.dtype, e.dtype]
    if e.op in ("and", "or", "not"):
        return [torch.bool] * len(have)
    if e.op in _OWN_TYPE:
        return have
    return [e.dtype] * len(have)


def _convert(text: str, have: torch.dtype, want: torch.dtype) -> str:
    if have is want:
        return text
    if want is torch.bool:
        return f"({text}.to(tl.float32) != 0)" if have in HALF else f"({text} != 0)"
    return f"{text}.to({tl_type(want)})"


def _f32(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def _is_index(e: Expr) -> bool:
    return e.op == "var" or e.op in _INDEX_OPS


class _View:
    """What a template sees of an expression: its op, its result type and its operands' types (float32 in place
    of float16/bfloat16 where the op is computed in float)."""

    def __init__(self, e: Expr, operand_types: List[torch.dtype], dtype: torch.dtype) -> None:
        self.op, self.dtype = e.op, dtype
        types = iter(operand_types)
        self.args = tuple(_Operand(a, next(types)) if type(a) is Expr else a for a in e.args)


class _Operand:
    """An operand as a template sees it: its op, its type and, for a constant (or a cast of one), its value."""

    __slots__ = ("op", "dtype", "value")

    def __init__(self, e: Expr, dtype: torch.dtype) -> None:
        self.op, self.dtype = e.op, dtype
        source = e.args[0] if e.op == "cast" and type(e.args[0]) is Expr else e
        self.value = source.args[0] if source.op == "const" else None


class _Contexts:
    """For each group of loop variables (the outer ones, each stage's reduced ones, the inner ones): the names of a
    zero block of the group's shape and of its mask. A load takes the context of the variables it depends on."""

    def __init__(self) -> None:
        self.group: Dict[Expr, Tuple[str, str]] = {}
        self.base: Tuple[str, str] = ("0", "None")

    def of(self, free: set) -> Tuple[str, str]:
        found = {self.group[v] for v in free if v in self.group}
        if len(found) > 1:
            raise UnsupportedByRenderer("an index mixing the loop variables of two stages")
        return found.pop() if found else self.base


def _decompose(lines: List[str], indent: str, flat: str, vs: Sequence[Expr], names: Dict[Expr, str],
               prefix: str) -> None:
    """Bind each of ``vs`` (row-major over their extents) to its index within the flat index block ``flat``."""
    stride = 1
    parts = []
    for j in range(len(vs) - 1, -1, -1):
        n = vs[j].args[1]
        name = f"{prefix}{j}"
        text = flat if stride == 1 else f"({flat} // {stride})"
        if j > 0:
            text = f"({text} % {n})"
        parts.append(f"{indent}{name} = {text}")
        names[vs[j]] = name
        stride *= n
    lines.extend(reversed(parts))


# Note [Scalars read as float32]
# A runtime scalar is a float64 slot, but a float32 kernel reads most of its float scalars only as float32 (x * 1.01
# computes in float32, as eager's opmath does: the lowering casts the scalar). Taken as float64, each was
# converted by every thread of every program: 120 conversions per thread in the 200-op chain, on the GPU's slow
# float64 path. A float slot whose every use in the kernel is that cast is declared float32 instead; the launcher
# rounds the Python float to float32 once per launch (round to nearest even, as the kernel's conversion did), so
# the values are the same bits. Slots read any other way (float64 arithmetic, a store) stay float64; scalars
# loaded from device memory (Note [Scalars in device memory]) stay float64 too.
def _scalars(roots: List[Expr]) -> Tuple[Dict[int, bool], frozenset]:
    """The runtime scalar slots under ``roots`` (slot -> whether it is a float one), and the float slots every use
    of which is a cast to float32 (Note [Scalars read as float32])."""
    found: Dict[int, bool] = {}
    wide = {e.args[0] for e in roots if e.op == "scalar"}  # read other than through a cast to float32
    todo, seen = list(roots), set()
    while todo:
        for e in kir.walk(todo.pop()):
            if e.op == "scalar":
                found[e.args[0]] = e.dtype.is_floating_point
            elif e.op == "reduce" and e.args[0] not in seen:
                seen.add(e.args[0])
                todo.append(e.args[0].body)
            if not (e.op == "cast" and e.dtype is torch.float32):
                wide.update(c.args[0] for c in kir.children(e) if c.op == "scalar")
    return dict(sorted(found.items())), frozenset(s for s, f in found.items() if f and s not in wide)


def _index_type(k: Kernel) -> str:
    big = max([math.prod(b.shape) for b in k.buffers()] + [k.work, 1])
    return "tl.int64" if big >= (1 << 31) - POINTWISE_BLOCK * 4 else "tl.int32"


def render_kernel(k: Kernel, memory: bool = False, blocks: Optional[Blocks] = None) -> Tuple[str, Launch]:
    """The source of one ``@_kernel`` function and how to launch it (Note [Triton kernel shapes]), with
    ``blocks`` (``default_blocks(k)`` if None); with ``memory``, its runtime scalars are loads from the scalar
    buffers (Note [Scalars in device memory])."""
    blocks = blocks or default_blocks(k)
    bufs = k.buffers()
    roots = [e for _, _, e in k.stores] + [s.body for s in k.stages]
    scalars, float32 = _scalars(roots)
    debug = any(e.op == "index_checked" for r in roots for e in kir.walk(r))
    params = [f"b{b.id}" for b in bufs]
    if memory:  # offsets into the kernel's own regions of the scalar buffers, float slots and int slots apart
        kinds = set(scalars.values())
        params += [name for name, f in (("SF", True), ("SI", False)) if f in kinds]
        lines = [f"@_kernel([], {debug})", f"def {k.name}({', '.join(params)}):"]
        at = {True: 0, False: 0}
        for s, f in scalars.items():
            lines.append(f"    s{s} = tl.load({'SF' if f else 'SI'} + {at[f]})")
            at[f] += 1
    else:
        types = {s: _scalar_type(s, f, float32) for s, f in scalars.items()}
        params += [f"s{s}: \"{t}\"" for s, t in types.items()]
        lines = [f"@_kernel({[f's{s}' for s in scalars]!r}, {debug})", f"def {k.name}({', '.join(params)}):"]
        for s, t in types.items():
            lines.append(f"    s{s} = tl.full([], s{s}, {_TL_SCALAR[t]})")
    itype = _index_type(k)
    if k.stages:
        grid = _render_reduction(k, lines, itype, blocks)
    else:
        grid = _render_pointwise(k, lines, itype, blocks)
    stored = {b.id for b, _, _ in k.stores}
    inplace = any(e.op == "load" and e.args[0].id in stored for r in roots for e in kir.walk(r))
    launch = Launch(k.name, [b.id for b in bufs], list(scalars), list(scalars.values()), grid, blocks.warps, debug,
                    memory, inplace, frozenset() if memory else float32)
    return "\n".join(lines), launch


def _render_pointwise(k: Kernel, lines: List[str], itype: str, blocks: Blocks) -> int:
    loops = k.outer + k.inner
    n = math.prod(v.args[1] for v in loops)
    block = blocks.x
    lines.append(f"    xindex = tl.program_id(0).to({itype}) * {block} + tl.arange(0, {block}).to({itype})")
    lines.append(f"    xmask = xindex < {n}")
    lines.append(f"    xzero = tl.zeros([{block}], {itype})")
    names: Dict[Expr, str] = {}
    _decompose(lines, "    ", "xindex", loops, names, "x")
    ctx = _Contexts()
    ctx.base = ("xzero", "xmask")
    scope = _Scope(names, lines, "    ", [0], ctx)
    for buf, idx, e in k.stores:
        _store(scope, buf, idx, e, "xzero", "xmask")
    return -(-n // block)


def _store(scope: _Scope, buf: kir.Buffer, idx: Expr, e: Expr, zero: str, mask: str) -> None:
    value = scope.emit(e)
    at = scope.emit(idx) if idx.op != "const" else str(idx.args[0])
    if buf.dtype is not e.dtype:
        value = f"{value}.to({tl_type(buf.dtype)})"
    scope.lines.append(f"{scope.indent}tl.store(b{buf.id} + ({at} + {zero}), {value}, mask={mask})")


def _acc_dtype(s: Stage) -> Tuple[Expr, torch.dtype]:
    """The stage's element and accumulator type: float sums of float32 (or half) values accumulate in float32."""
    body, acc = s.body, s.red.acc_dtype
    if s.red.kind == "sum" and body.op == "cast" and acc is torch.float64 and s.red.dtype is not torch.float64 \
            and body.args[0].dtype in (torch.float32,) + HALF:
        body, acc = body.args[0], torch.float32
    return body, acc


def _init(kind: str, dtype: torch.dtype) -> str:
    """The reduction's identity over ``dtype`` (what masked lanes hold), as a Triton literal."""
    if kind in _INIT:
        return str(_INIT[kind] if not dtype.is_floating_point else float(_INIT[kind]))
    high = kind in ("min", "argmin")
    if dtype.is_floating_point:
        return 'float("inf")' if high else 'float("-inf")'
    info = torch.iinfo(dtype)
    value = info.max if high else info.min
    return str(value) if value != -(1 << 63) else "-9223372036854775807 - 1"


def _render_reduction(k: Kernel, lines: List[str], itype: str, blocks: Blocks) -> int:
    outer_n = math.prod(v.args[1] for v in k.outer)
    inner_n = math.prod(v.args[1] for v in k.inner)
    red_ns = [math.prod(s.red.red_shape) for s in k.stages]
    persistent = _persistent(k, max(red_ns + [inner_n, 1]))
    xblock = blocks.x
    ind = "    "
    lines.append(f"{ind}xindex = tl.program_id(0).to({itype}) * {xblock} + tl.arange(0, {xblock}).to({itype})[:, None]")
    lines.append(f"{ind}xmask = xindex < {max(outer_n, 1)}")
    lines.append(f"{ind}xzero = tl.zeros([{xblock}, 1], {itype})")
    names: Dict[Expr, str] = {}
    _decompose(lines, ind, "xindex", k.outer, names, "x")
    ctx = _Contexts()
    ctx.base = ("xzero", "xmask")  # the outer variables' (every block has the outer dimension)
    counter = [0]
    scope = _Scope(names, lines, ind, counter, ctx)
    inner_ext = [v.args[1] for v in k.inner]
    iblock = _pow2(max(inner_n, 1)) if persistent else min(LOOP_RBLOCK, _pow2(max(inner_n, 1)))
    if persistent:
        _index_block(lines, ind, "i", k.inner, inner_n, iblock, itype, scope, ctx)
    for n, s in enumerate(k.stages):
        body, acc = _acc_dtype(s)
        red = list(s.red.red_vars)
        if persistent and [v.args[1] for v in red] == inner_ext and red:
            body = kir.substitute(body, dict(zip(red, k.inner)))  # Note [Triton kernel shapes]
            red = list(k.inner)
            rblock = iblock
            zero, mask = "izero", "imask"
        else:
            rblock = _pow2(max(red_ns[n], 1))
            if not persistent:
                rblock = min(rblock, blocks.r)
            zero, mask = f"r{n}zero", f"r{n}mask"
        _render_stage(n, s, body, acc, red, red_ns[n], rblock, zero, mask, persistent, scope, itype, xblock)
    if persistent:
        for buf, idx, e in k.stores:
            _store(scope, buf, idx, e, "izero", "imask")
    else:
        lines.append(f"{ind}for i0ff in range(0, {max(inner_n, 1)}, {iblock}):")
        loop = scope.child(ind + "    ")
        _index_block(lines, ind + "    ", "i", k.inner, inner_n, iblock, itype, loop, ctx, offset="i0ff")
        for buf, idx, e in k.stores:
            _store(loop, buf, idx, e, "izero", "imask")
    return -(-max(outer_n, 1) // xblock)


def _index_block(lines: List[str], ind: str, prefix: str, vs: Sequence[Expr], n: int, block: int, itype: str,
                 scope: _Scope, ctx: _Contexts, offset: Optional[str] = None) -> None:
    """Define ``{prefix}index`` (a [1, block] block of flat indices over ``vs``, from ``offset``), its mask and zero
    block, and bind the variables."""
    start = f"{offset} + " if offset else ""
    lines.append(f"{ind}{prefix}index = {start}tl.arange(0, {block}).to({itype})[None, :]")
    lines.append(f"{ind}{prefix}mask = xmask & ({prefix}index < {max(n, 0)})")
    lines.append(f"{ind}{prefix}zero = xzero + tl.zeros([1, {block}], {itype})")
    _decompose(lines, ind, f"{prefix}index", vs, scope.names, f"{prefix}_")
    for v in vs:
        ctx.group[v] = (f"{prefix}zero", f"{prefix}mask")


def _render_stage(n: int, s: Stage, body: Expr, acc: torch.dtype, red: List[Expr], count: int, rblock: int,
                  zero: str, mask: str, persistent: bool, scope: _Scope, itype: str, xblock: int) -> None:
    """Stage ``n``: its reduction over ``red`` (``count`` elements) into ``red{n}``, a [XBLOCK, 1] block."""
    lines, ind, kind = scope.lines, scope.indent, s.red.kind
    arg = kind in kir.ARG_KINDS
    val_t = acc if not arg else body.dtype
    if val_t is torch.bool:
        val_t = torch.int8
    literal = _init(kind, val_t)
    init = f"tl.full([], {literal}, {tl_type(val_t)})"
    prefix = zero[:-4]
    if persistent:
        if zero != "izero":
            _index_block(lines, ind, prefix, red, count, rblock, itype, scope, scope.ctx)
        v = scope.emit(body)
        value = _as(v, body.dtype, val_t)
        lines.append(f"{ind}v{n} = tl.where({mask}, {value}, {init})")
        if arg:
            lines.append(f"{ind}ix{n} = tl.where({mask}, {_flat(scope, red)}, {1 << 30})")
            lines.append(f"{ind}_, red{n} = tl.reduce((v{n}, ix{n}), 1, {kind}_)")
            result = f"red{n}[:, None]"
        else:
            result = f"{_combine_all(kind, f'v{n}')}[:, None]"
    else:
        lines.append(f"{ind}a{n} = tl.full([{xblock}, {rblock}], {literal}, {tl_type(val_t)})")
        if arg:
            lines.append(f"{ind}ai{n} = tl.full([{xblock}, {rblock}], {1 << 30}, {itype})")
        lines.append(f"{ind}for r{n}off in range(0, {max(count, 1)}, {rblock}):")
        loop = scope.child(ind + "    ")
        _index_block(lines, ind + "    ", prefix, red, count, rblock, itype, loop, scope.ctx, offset=f"r{n}off")
        v = loop.emit(body)
        value = _as(v, body.dtype, val_t)
        li = ind + "    "
        lines.append(f"{li}v{n} = tl.where({mask}, {value}, {init})")
        if arg:
            lines.append(f"{li}ix{n} = tl.where({mask}, {_flat(loop, red)}, {1 << 30})")
            lines.append(f"{li}a{n}, ai{n} = {kind}_(a{n}, ai{n}, v{n}, ix{n})")
            lines.append(f"{ind}_, red{n} = tl.reduce((a{n}, ai{n}), 1, {kind}_)")
            result = f"red{n}[:, None]"
        else:
            lines.append(f"{li}a{n} = {_combine_two(kind, f'a{n}', f'v{n}')}")
            result = f"{_combine_all(kind, f'a{n}')}[:, None]"
    if arg:
        result = f"{result}.to(tl.int64)"
    lines.append(f"{ind}red{n} = {_as(result, val_t if not arg else torch.int64, s.red.dtype)}")
    scope.names[s.ref] = f"red{n}"


def _as(text: str, have: torch.dtype, want: torch.dtype) -> str:
    if have is want:
        return text
    if want is torch.bool:
        return f"({text} != 0)"
    return f"{text}.to({tl_type(want)})"


def _flat(scope: _Scope, red: List[Expr]) -> str:
    """The row-major flat index of the reduced variables (what an arg reduction returns)."""
    flat = kir.const(0, kir.INDEX)
    for v in red:
        flat = kir.iadd(kir.imul(flat, v.args[1]), v)
    return scope.emit(flat) if flat.op != "const" else str(flat.args[0])


def _combine_all(kind: str, block: str) -> str:
    if kind == "sum":
        return f"tl.sum({block}, 1)"
    return f"tl.reduce({block}, 1, {_COMBINE[kind]})"


def _combine_two(kind: str, a: str, b: str) -> str:
    if kind == "sum":
        return f"{a} + {b}"
    return f"{_COMBINE[kind]}({a}, {b})"


HEADER = ("import triton\nimport triton.language as tl\n"
          "# _kernel, _jit and M are set by the loader (runtime/triton_build.py)\n")


# Note [One function per distinct kernel]
# A model's repeated layers schedule into kernels that differ only in their buffer ids and scalar slots (a GPT step
# of 251 kernels has 72 distinct ones), and a Triton compile costs a second or more per function. So a kernel's
# source is made canonical (buffers and scalars renamed b0, b1, ... and s0, s1, ... in order of first use; in device
# memory, scalars are read at offsets into the kernel's own region of the scalar buffers), and the module defines
# each distinct source once, under the name of the first kernel that has it: its launches share the function and
# its compiles (Triton compiles a function once per signature, i.e. per buffer dtypes; its cache is keyed by source,
# so a graph whose kernels another graph already compiled compiles nothing).
_PARAM = re.compile(r"\b([bs])(\d+)\b")


def _canonical(text: str, name: str) -> str:
    """``text`` with its buffers and scalars renumbered by first use and its name replaced by a placeholder."""
    seen: Dict[str, str] = {}
    counts = {"b": 0, "s": 0}

    def rename(m: "re.Match[str]") -> str:
        token = m.group(0)
        if token not in seen:
            seen[token] = f"{m.group(1)}{counts[m.group(1)]}"
            counts[m.group(1)] += 1
        return seen[token]

    return _PARAM.sub(rename, text.replace(f"def {name}(", "def @NAME@(", 1))


def render(sched: Schedule, memory: bool = False, tune: str = "off") -> Tuple[str, List[List[Launch]]]:
    """(module source, for each kernel in schedule order its launches: the default one first, then the variants
    ``tune`` asks for (Note [Tuned block sizes])); ``memory``: Note [Scalars in device memory]. Kernels of the same
    canonical source share one function (Note [One function per distinct kernel])."""
    parts = [HEADER, HELPERS]
    launches = []
    names: Dict[str, str] = {}
    for k in sched.kernels:
        variants = []
        for j, blocks in enumerate(candidates(k, tune)):
            name = k.name if j == 0 else f"{k.name}_v{j}"
            text, launch = render_kernel(k, memory, blocks)
            canon = _canonical(text, k.name)  # the name is a placeholder there: a variant takes its own
            if canon not in names:
                names[canon] = name
                parts.append(canon.replace("@NAME@", name))
            launch.name = names[canon]
            variants.append(launch)
        launches.append(variants)
    return "\n\n".join(parts) + "\n", launches
