"""Recording with symbolic sizes: ops recorded once with sizes as symbols, replayed at other sizes.

A ``SymLazy`` tensor pairs a lazy tensor of concrete sizes (``concrete``: ops on it record into the lazy graph as
usual) with a FakeTensor whose sizes are symbols of a ShapeEnv (``fake``). Its own sizes, those Python code and
autograd see, are the symbols: ``x.shape[0]`` is a SymInt, arithmetic on it stays symbolic, and a branch on it
adds a guard to the ShapeEnv. Inside ``with recorder:`` every op that reads a lazy tensor, takes a SymInt or makes
a tensor on the lazy device runs on the fakes (symbolic output sizes, FakeTensor's meta kernels), on the concrete
lazy tensors (SymInt arguments at their hints), and into an op list with its symbolic arguments; its tensor
outputs are SymLazy. ``Recorder.instantiate`` replays the op list on lazy tensors of other sizes, once the
ShapeEnv's guards hold for them, reading the lazy tensors the ops read that no op made (parameters, buffers,
optimizer state: the leaves) from those same objects, as they are then: the graph of those sizes, recorded
without running the Python that produced the ops. ``lazy.compile(dynamic=True)`` captures with it (Note [Dynamic
captures] in lazy/capture/dynamic.py), as a recording that may be dropped (Note [Dropping the symbolic recording]).

Note [Symbolic sizes]
Replaying a captured step at new sizes needs every integer the step derived from a size to be known as a function
of the sizes: a ``view(b, t, h, d)`` in the user's code, an ``expand`` to the input's sizes in autograd's
backward, a slice ``pos[:t]`` in a module's forward. Those are computed in Python the capture does not interpret
(torch.nn, torch.optim) and in autograd's C++, so only tensors whose sizes *are* symbols carry them: as Dynamo
does, the sizes are SymInts of a ShapeEnv (torch.fx.experimental.symbolic_shapes), with FakeTensor's meta kernels
for symbolic output sizes, and every decision taken on a size (a comparison, ``int()``) becomes a guard on the
symbols. The lazy graph itself stays concrete: each op also records on a concrete twin, with the recorder
unchanged, so the recording's own sizes run as any graph does; the op list with its SymInts is what replays.
What the replay checks: each input's static dimensions and the ShapeEnv's guards, evaluated on the input sizes;
Python state other than sizes is the caller's to guard (a capture's guards, Note [Guards] in capture/session.py),
and a Python number an op takes is a constant of the op list (Adam's bias corrections, computed from a cpu step
counter, would replay stale: a capture binds such numbers to runtime scalars, Note [Binding scalars]).
A dispatch mode, not only the subclass, sees the ops: a factory called with a symbolic size has no tensor
argument (``torch.arange(t, device=x.device)``), and an op on parameters alone (``weight.t()``) must replay on
their values of the replay, not be kept from the recording. Limits: lazy's own decisions on a SymLazy's sizes (the attention kernel chosen in lazy/device/sdpa.py) are taken at the concrete twin's sizes;
reading data (``.item()``, ``.cpu()``) raises; kernels are compiled per concrete size.

Note [Checks of symbolic sizes]
Evaluating the ShapeEnv's guards with sympy costs 0.1-0.35 ms (two guards of a GPT step), more than a replay's
whole host time. So the check is one generated Python function: each input's rank and static sizes compared,
each symbol read from its source (``values['x'].shape[0]``) and compared with its range (at least 2: as Dynamo's,
a symbol is never 0 or 1, whose broadcasting and empty cases meta kernels branch on), each guard printed as
fully parenthesized Python by ``_python`` (``(s27 <= 16)``, ``((s0 // 2) - 2) % 2``: sympy's own printer wrote
torch's ``Mod(s - 2, 2)`` as ``s - 2 % 2``, which refused every size of a convolution's recording, and could as well
have accepted wrong ones); a form it does not know is evaluated with sympy, and a guard that cannot be evaluated
at some sizes (a zero divisor) refuses them. It returns the symbols' values, the key a replay's per-size entries
are found by.

Note [Python kernels of composite ops]
A composite op (``matmul``, ``linear``) decomposes in C++ before any mode sees it, and torch 2.11's ``matmul``
asks its argument's ``numel()``, which a tensor of symbolic sizes cannot answer (or, through a size query,
specializes the batch to the recording's value). So the recording enables PyTorch's Python dispatcher, as
Dynamo and make_fx do while tracing: composite ops with a Python kernel (torch._decomp's ``matmul``) run it, on
SymInts throughout; newer torch computes the same decomposition either way.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..device.tensor import LazyTensor
from .expr import _SYMBOLIC, value_of

_REF = "__symlazy_ref__"
_META = torch.device("meta")  # where the fakes live (a lazy device argument is theirs)


class Recorder:
    """One symbolic recording (module docstring): the ShapeEnv and FakeTensorMode, the inputs with their sources,
    the op list, and every tensor the ops read or made, by id. Used as ``with recorder:`` around the ops."""

    def __init__(self, droppable: bool = False) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.env = ShapeEnv()
        self.mode = FakeTensorMode(shape_env=self.env)
        self.inputs: List[Tuple[str, "SymLazy"]] = []
        self.ops: List[tuple] = []      # (func, args template, kwargs template, output ids)
        self.tensors: List[Any] = []    # id -> the tensor it names (held: ids of objects must stay theirs)
        self._ids: Dict[int, int] = {}
        self._made: set = set()         # ids of the tensors ops made (and of the inputs)
        self._fakes: Dict[int, Any] = {}
        self._dispatch = _Mode(self)
        self._check: Optional[Callable[[Dict[str, torch.Tensor]], Optional[tuple]]] = None
        self._generators: Tuple[int, List[torch.Generator]] = (0, [])  # generators() of the first n ops
        # Note [Dropping the symbolic recording]
        self.droppable = droppable
        self.dropped: Optional[str] = None  # why the recording was dropped (ops run on the concrete tensors since)

    def __enter__(self) -> "Recorder":
        # Note [Python kernels of composite ops]
        from torch._dispatch.python import enable_python_dispatcher
        self._python_kernels = enable_python_dispatcher()
        self._python_kernels.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._dispatch.__exit__(*exc)
        self._python_kernels.__exit__(*exc)

    # ---- recording ----

    def input(self, name: str, t: torch.Tensor, dynamic: Sequence[int]) -> "SymLazy":
        """``t`` (a lazy tensor) as an input whose dims ``dynamic`` are symbols."""
        if isinstance(t, SymLazy):  # made inside ``with recorder:`` (``x.to("lazy")``): its concrete tensor
            t = t.concrete
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dynamic else DimDynamic.STATIC
                                                      for d in range(t.dim())])
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = self.mode.from_tensor(meta, source=LocalSource(name), symbolic_context=ctx)
        s = SymLazy(t, fake, self)
        self.inputs.append((name, s))
        self._made.add(self._name(s))
        return s

    def _name(self, t: Any) -> int:
        key = id(t)
        if key not in self._ids:
            self._ids[key] = len(self.tensors)
            self.tensors.append(t)
        return self._ids[key]

    def id_of(self, t: Any) -> int:
        return self._ids[id(t)]

    def _fake_of(self, t: Any) -> Any:
        if isinstance(t, SymLazy):
            return t.fake
        fake = self._fakes.get(id(t))
        if fake is None:  # a leaf (static sizes): its fake once (``tensors`` holds it, so its id stays its own)
            self._name(t)
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            fake = self._fakes[id(t)] = self.mode.from_tensor(meta, static_shapes=True)
        return fake

    def record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """One op: on the fakes, on the concrete tensors, into the op list; its tensor outputs as SymLazy (an
        output that is an argument, in place, as that argument)."""
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
        if self.dropped is not None:
            return _concrete_call(func, args, kwargs)
        flat = tree_flatten((args, kwargs))[0]
        if _static(func, flat):  # Note [Ops of static sizes]
            return self._append(func, args, kwargs, _concrete_call(func, args, kwargs), None)
        fake_args = tree_map(lambda a: self._fake_of(a) if isinstance(a, torch.Tensor) else
                             _META if isinstance(a, torch.device) and a.type == "lazy" else a, (args, kwargs))
        # NOTE: a capture watches native calls with a profile function (capture/tensors.py's tripwire), which
        # FakeTensor's Python would call thousands of times an op; the concrete run below stays watched
        watcher = sys.getprofile()
        sys.setprofile(None)
        failed = None
        try:
            with self.mode:
                fake_out = func(*fake_args[0], **fake_args[1])
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            failed = (f"lazy: {func} needs data ({type(e).__name__}) while sizes are symbolic: a recording with "
                      "symbolic sizes records ops only")
        except Exception as e:  # noqa: BLE001 -- an op FakeTensor cannot run: dropped, or raised as it is
            if not self.droppable:
                raise
            failed = f"{func} has no symbolic kernel ({type(e).__name__}: {e})"
        finally:
            sys.setprofile(watcher)
        if failed is None and any(isinstance(f, torch.Tensor) and f.device.type != "meta"
                                  for f in tree_flatten(fake_out)[0]):
            failed = (f"lazy: {func} moves a tensor off the lazy device while sizes are symbolic: a recording with "
                      "symbolic sizes records ops only")
        if failed is not None:
            return self._drop(failed, func, args, kwargs)
        fakes = tree_flatten(fake_out)[0]
        return self._append(func, args, kwargs, _concrete_call(func, args, kwargs), fakes)

    def _append(self, func: Any, args: tuple, kwargs: dict, out: Any, fakes: Optional[list]) -> Any:
        """The op into the op list, its outputs named; each a SymLazy of its fake, or (``fakes`` None: sizes all
        static) the concrete tensor itself."""
        template = tree_map(lambda a: (_REF, self._name(a)) if isinstance(a, torch.Tensor) else a, (args, kwargs))
        flat_args = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs, spec = tree_flatten(out)
        ids: List[int] = []
        result = []
        for k, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                same = next((a for a in flat_args if (a.concrete if isinstance(a, SymLazy) else a) is o), None)
                if same is None:
                    if fakes is not None:
                        o = SymLazy(o, fakes[k], self)
                    self._made.add(self._name(o))
                else:  # in place: a leaf stays a leaf (the replay reads and writes that object)
                    o = same
                ids.append(self._name(o))
            result.append(o)
        self.ops.append((func, template[0], template[1], ids))
        return tree_unflatten(result, spec)

    def generators(self) -> List[torch.Generator]:
        """The generators the op list's random ops take."""
        # NOTE: asked at every new size; the op list only grows (ops are appended), so what its first n ops take is
        # kept and only later ops are read
        n, found = self._generators
        if n != len(self.ops):
            seen = {id(g): g for g in found}
            for _, args, kwargs, _ in self.ops[n:]:
                for g in tree_flatten((args, kwargs))[0]:
                    if isinstance(g, torch.Generator):
                        seen.setdefault(id(g), g)
            self._generators = (len(self.ops), list(seen.values()))
        return list(self._generators[1])

    def _drop(self, reason: str, func: Any, args: tuple, kwargs: dict) -> Any:
        """Note [Dropping the symbolic recording]: raise ``reason`` where the recording is not droppable; else
        drop it and run the op, as every later one, on the concrete tensors."""
        if not self.droppable:
            raise RuntimeError(reason)
        self.dropped = reason
        return _concrete_call(func, args, kwargs)

    # ---- replay at other sizes ----

    def binding(self, values: Dict[str, torch.Tensor]) -> Dict[Any, int]:
        """The symbols' values for inputs ``values`` (by input name), from the ShapeEnv's sources. Raises
        ValueError where a static dimension of an input differs from the recorded one."""
        for name, s in self.inputs:
            t = values[name]
            if t.dim() != s.dim() or any(not isinstance(a, torch.SymInt) and a != b for a, b in zip(s.shape, t.shape)):
                raise ValueError(f"lazy: input {name} of shape {tuple(t.shape)} does not match the recorded "
                                 f"{tuple(s.shape)}")
        out = {}
        for sym, sources in self.env.var_to_sources.items():
            src = sources[0]
            out[sym] = int(values[src.base.local_name].size(src.idx))
        return out

    def check(self, binding: Dict[Any, int]) -> Optional[str]:
        """The first guard of the ShapeEnv the binding breaks (as text), or None: a symbol's range (sizes 0 and 1
        are not symbols' values, as in Dynamo: a size-1 dimension broadcasts), then the guards."""
        import sympy
        for sym, value in binding.items():
            low, high = _bounds(self.env, sym)
            if value < low or (high is not None and value > high):
                return f"{low} <= {sym}" + (f" <= {high}" if high is not None else "")
        for g in self.env.guards:
            if g.expr.xreplace(binding) is not sympy.true:
                return str(g.expr)
        return None

    def compile_check(self) -> Callable[[Dict[str, torch.Tensor]], Optional[tuple]]:
        """The replay's check as one Python function of the inputs by name (Note [Checks of symbolic sizes]): the
        symbols' values, in ``symbols()`` order, or None where a static dimension differs or a guard fails."""
        syms = self.symbols()
        lines = ["def check(values):"]
        for name, s in self.inputs:
            static = " or ".join(f"t.shape[{d}] != {int(n)}" for d, n in enumerate(s.shape)
                                 if not isinstance(n, torch.SymInt))
            lines += [f"    t = values[{name!r}]", f"    if t.dim() != {s.dim()}{' or ' + static if static else ''}:",
                      "        return None"]
        for sym in syms:
            src = self.env.var_to_sources[sym][0]
            lines.append(f"    {sym} = values[{src.base.local_name!r}].shape[{src.idx}]")
            low, high = _bounds(self.env, sym)
            lines += [f"    if {sym} < {low}{f' or {sym} > {high}' if high is not None else ''}:", "        return None"]
        namespace: Dict[str, Any] = {"math": math}
        for k, g in enumerate(self.env.guards):
            try:
                lines.append(f"    if not ({_python(g.expr)}):")
            except _Unprintable:  # a guard the printer cannot write exactly: evaluated with sympy
                namespace[f"_guard{k}"] = (g.expr, syms)
                lines.append(f"    if _slow(_guard{k}, ({', '.join(map(str, syms))},)) is not True:")
            lines.append("        return None")
        lines.append(f"    return ({''.join(f'{x}, ' for x in syms)})")
        # a guard that cannot be evaluated at these sizes (a division by a size expression that is 0) refuses them
        lines = lines[:1] + ["    try:"] + ["    " + line for line in lines[1:]] + [
            "    except (ZeroDivisionError, ArithmeticError):", "        return None"]
        namespace["_slow"] = _slow_guard
        exec(compile("\n".join(lines), "<lazy.capture.symbolic check>", "exec"), namespace)  # noqa: S102
        return namespace["check"]

    def symbols(self) -> List[Any]:
        return sorted(self.env.var_to_sources, key=str)

    def instantiate(self, values: Dict[str, torch.Tensor], sizes: Optional[tuple] = None) -> Dict[int, Any]:
        """Replay the op list on lazy tensors: ``values`` the inputs by name (lazy tensors of their new sizes); the
        leaves are read from their objects. Returns every tensor the replay made, by id (``id_of``). ``sizes``:
        the symbols' values, where the caller has checked them already."""
        if self._check is None:
            self._check = self.compile_check()
        if sizes is None:
            sizes = self._check(values)
        if sizes is None:  # say why: the slow path finds the dimension or the guard
            broken = self.check(self.binding(values))
            raise ValueError(f"lazy: these sizes break a guard of the recording: {broken}")
        binding = dict(zip(self.symbols(), sizes))
        env: Dict[int, Any] = {i: t for i, t in enumerate(self.tensors) if i not in self._made}
        for name, s in self.inputs:
            env[self._ids[id(s)]] = values[name]

        values_at: Dict[Any, Any] = {}  # a symbolic number's value, by its expression and type

        def concrete(a: Any) -> Any:
            if _is_ref(a):
                return env[a[1]]
            if isinstance(a, _SYMBOLIC):
                key = (type(a), a.node.expr)
                v = values_at.get(key)
                if v is None:
                    v = values_at[key] = value_at(a, binding)
                return v
            return a

        def fill(a: Any) -> Any:
            # NOTE: tree_map(concrete, a, is_leaf=_is_ref) for the templates' usual containers (exact tuples, lists
            # and dicts, rebuilt as pytree rebuilds them) and leaves, without its per-node registry lookups: ~3/4
            # of replaying a GPT step's op list at new sizes went to them; any other type takes tree_map itself
            t = type(a)
            if t in _LEAVES:
                return a
            if t is tuple:
                return env[a[1]] if len(a) == 2 and a[0] == _REF else tuple([fill(x) for x in a])
            if t is list:
                return [fill(x) for x in a]
            if t is dict:
                return {k: fill(x) for k, x in a.items()}
            if t in _SYMBOLIC_TYPES:
                return concrete(a)
            return tree_map(concrete, a, is_leaf=_is_ref)

        with torch.no_grad():  # the ops are autograd's already (its backward's among them): none records again
            for func, args, kwargs, outs in self.ops:
                result = func(*fill(args), **fill(kwargs))
                flat = (result,) if isinstance(result, torch.Tensor) else \
                    result if type(result) in (tuple, list) and all(isinstance(r, torch.Tensor) for r in result) \
                    else tree_flatten(result)[0]
                tensors = [r for r in flat if isinstance(r, torch.Tensor)]
                for i, r in zip(outs, tensors):
                    env[i] = r
        return env


def value_at(x: Any, binding: Dict[Any, int]) -> Any:
    """A symbolic number's value where the symbols take ``binding``'s values (``1 / sqrt(head size)`` too)."""
    return type(value_of(x))(x.node.expr.xreplace(binding))


def _bounds(env: Any, sym: Any) -> Tuple[int, Optional[int]]:
    """A symbol's range of values in the ShapeEnv (its upper bound None where unbounded)."""
    vr = env.var_to_range[sym]
    try:
        high: Optional[int] = int(vr.upper)
    except (TypeError, ValueError, OverflowError, AttributeError):  # torch's int_oo (unbounded)
        high = None
    return int(vr.lower), high


class _Unprintable(Exception):
    pass


def _python(e: Any) -> str:
    """A guard's sympy expression as exact Python over int symbols, fully parenthesized; raises _Unprintable for
    anything else. (sympy's own printer wrote torch's ``Mod(s - 2, 2)`` as ``s - 2 % 2``.) Floor division and
    modulus of sizes are Python's ``//`` and ``%`` (torch's Mod assumes nonnegative operands, where they agree)."""
    import sympy
    from torch.utils._sympy import functions as F
    if e.is_Symbol:
        return str(e)
    if e.is_Integer:
        return str(int(e))
    if e is sympy.true or e is sympy.false:
        return str(bool(e))
    args = e.args
    binary = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">=",
              F.FloorDiv: "//", F.Mod: "%", F.PythonMod: "%"}
    op = binary.get(type(e))
    if op is not None and len(args) == 2:
        return f"({_python(args[0])} {op} {_python(args[1])})"
    joined = {sympy.Add: " + ", sympy.Mul: " * ", sympy.And: " and ", sympy.Or: " or "}.get(type(e))
    if joined is not None:
        return "(" + joined.join(_python(a) for a in args) + ")"
    if isinstance(e, sympy.Not):
        return f"(not {_python(args[0])})"
    if isinstance(e, sympy.Pow) and args[1].is_Integer and int(args[1]) >= 0:
        return f"({_python(args[0])} ** {int(args[1])})"
    if type(e) in (sympy.Max, F.Max, sympy.Min, F.Min):
        return f"{'max' if type(e) in (sympy.Max, F.Max) else 'min'}({', '.join(_python(a) for a in args)})"
    raise _Unprintable(type(e).__name__)


def _slow_guard(guard: tuple, values: tuple) -> Any:
    expr, syms = guard
    try:
        return bool(expr.xreplace(dict(zip(syms, values))))
    except (TypeError, ArithmeticError):  # undecidable at these sizes (a zero divisor): refused
        return False


# Note [Ops of static sizes]
# Most ops of a training step have no symbolic size at all: an optimizer's update of a parameter, the head's
# weight gradient once the batch is summed out. Such an op runs on the concrete tensors alone (FakeTensor and
# the ShapeEnv cost ~1-3 ms an op) and its outputs are the concrete lazy tensors themselves, named in the op list
# as any output is: a replay reruns it on that replay's tensors. Only ops that return tensors, read no host tensor
# and take no other device qualify: a read of data takes the symbolic path, which refuses or drops it.
_STATIC_OK: Dict[Any, bool] = {}


def _static(func: Any, flat: list) -> bool:
    ok = _STATIC_OK.get(func)
    if ok is None:
        schema = getattr(func, "_schema", None)
        ok = _STATIC_OK[func] = schema is not None and all(str(r.type).startswith("Tensor") for r in schema.returns) \
            and not any(t in func.tags for t in (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape))
    if not ok:
        return False
    for a in flat:
        if isinstance(a, _SYMBOLIC) or isinstance(a, torch.device) and a.type != "lazy":
            return False
        if isinstance(a, torch.Tensor) and (not isinstance(a, LazyTensor) or
                                            any(isinstance(d, torch.SymInt) for d in a.shape)):
            return False
    return True


def _hint(a: Any) -> Any:
    """An argument as the concrete run takes it: a SymLazy's twin, a symbolic number's value (a SymFloat too:
    ``x.shape[-1] ** -0.5``), without a guard."""
    return a.concrete if isinstance(a, SymLazy) else value_of(a) if isinstance(a, _SYMBOLIC) else a


def _concrete_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """The op run on the concrete twins and the symbolic numbers' values: what the lazy graph records."""
    return func(*tree_map(_hint, args), **tree_map(_hint, kwargs))


_LEAVES = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format))
_SYMBOLIC_TYPES = frozenset(_SYMBOLIC)


def _is_ref(a: Any) -> bool:
    return type(a) is tuple and len(a) == 2 and a[0] == _REF


def _lazy_op(args: tuple, kwargs: dict) -> bool:
    """Whether an op reads a lazy tensor, takes a symbolic size or makes a tensor on the lazy device."""
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, (LazyTensor, torch.SymInt)) or (isinstance(a, torch.device) and a.type == "lazy"):
            return True
    return False


class _Mode(TorchDispatchMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if _lazy_op(args, kwargs):
            return self.recorder.record(func, args, kwargs)
        return func(*args, **kwargs)


class SymLazy(LazyTensor):
    """A lazy tensor with symbolic sizes (module docstring)."""

    @staticmethod
    def __new__(cls, concrete: LazyTensor, fake: Any, recorder: Recorder) -> "SymLazy":
        r = torch.Tensor._make_wrapper_subclass(cls, fake.shape, strides=fake.stride(),
                                                storage_offset=fake.storage_offset(), dtype=fake.dtype,
                                                device=concrete.device, requires_grad=fake.requires_grad)
        r.concrete, r.fake, r.recorder = concrete, fake, recorder
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    # Its lazy state is its concrete twin's, for what reads it directly (a capture's guards and graph). Every read
    # of its data (.item(), .cpu(), print, bool: lazy/sync) starts from ``_lz_st``: it raises where the recording
    # cannot be dropped; in a capture it reads the twin, and the sync breaks the capture.
    @property
    def _lz_st(self) -> Any:
        if not self.recorder.droppable:
            raise RuntimeError("lazy: reading the data of a tensor with symbolic sizes: a recording with symbolic "
                               "sizes records ops only")
        return self.concrete._lz_st

    _lz_desc = property(lambda self: self.concrete._lz_desc)
    _lz_chain = property(lambda self: self.concrete._lz_chain)
    _lz_cache = property(lambda self: self.concrete._lz_cache)

    def __repr__(self) -> str:
        if self.recorder.dropped is not None:  # a capture's tensor left to the caller: it is its twin
            return repr(self.concrete)
        return f"SymLazy(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        # outside ``with recorder:`` (autograd's backward run later, say), ops on SymLazy tensors still record
        rec = next(a.recorder for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, SymLazy))
        return rec.record(func, args, kwargs or {})
