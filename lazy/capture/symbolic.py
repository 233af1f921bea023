"""Recording with symbolic sizes: ops recorded once with sizes as symbols, replayed at other sizes.

A ``SymLazy`` tensor pairs a lazy tensor of concrete sizes (``concrete``: ops on it record into the lazy graph as
usual) with a FakeTensor whose sizes are symbols of a ShapeEnv (``fake``). Its own sizes, those Python code and
autograd see, are the symbols: ``x.shape[0]`` is a SymInt, arithmetic on it stays symbolic, and a branch on it
adds a guard to the ShapeEnv. Each op on SymLazy tensors runs on the fakes (symbolic output sizes, FakeTensor's
meta kernels), on the concrete lazy tensors (SymInt arguments at their hints) and into an op list with its
symbolic arguments. ``Recorder.instantiate`` replays the op list on lazy tensors of other sizes, once the
ShapeEnv's guards hold for them: the graph of those sizes, recorded without running the Python that produced the
ops. ``lazy.compile`` does not use it: ``dynamic=True`` raises NotImplementedError.

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
Python state other than sizes is the caller's to guard (a capture's guards, Note [Guards] in capture/session.py).
Limits of the mechanism: only ops with a SymLazy argument are recorded symbolically (a factory called with a
symbolic size, with no tensor argument, reaches the lazy recorder with a SymInt and fails); lazy's own decisions
on a SymLazy's sizes (the attention kernel chosen in lazy/device/sdpa.py) are taken at the concrete twin's sizes;
reading data (``.item()``, ``.cpu()``) raises; kernels are compiled per concrete size.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..device.tensor import LazyTensor

_REF = "__symlazy_ref__"
_META = torch.device("meta")  # where the fakes live (a lazy device argument is theirs)


class Recorder:
    """One symbolic recording: the ShapeEnv and FakeTensorMode, the inputs (with their sources), the op list."""

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.env = ShapeEnv()
        self.mode = FakeTensorMode(shape_env=self.env)
        self.inputs: List[Tuple[str, "SymLazy"]] = []
        self.ops: List[tuple] = []      # (func, args template, kwargs template, output ids)
        self.tensors: List[Any] = []    # id -> the SymLazy (or static LazyTensor) it names
        self._ids: Dict[int, int] = {}
        self._fakes: Dict[int, Tuple[Any, Any]] = {}

    # ---- inputs ----

    def input(self, name: str, t: torch.Tensor, dynamic: Sequence[int]) -> "SymLazy":
        """``t`` (a lazy tensor) as an input whose dims ``dynamic`` are symbols."""
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d in dynamic else DimDynamic.STATIC
                                                      for d in range(t.dim())])
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        fake = self.mode.from_tensor(meta, source=LocalSource(name), symbolic_context=ctx)
        s = SymLazy(t, fake, self)
        self.inputs.append((name, s))
        self._name(s)
        return s

    def _name(self, t: Any) -> int:
        key = id(t)
        if key not in self._ids:
            self._ids[key] = len(self.tensors)
            self.tensors.append(t)
        return self._ids[key]

    def fake_of(self, t: Any) -> Any:
        if isinstance(t, SymLazy):
            return t.fake
        held = self._fakes.get(id(t))
        if held is None:  # a lazy tensor of static sizes (a parameter): its fake once, the tensor held (its id)
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            held = self._fakes[id(t)] = (t, self.mode.from_tensor(meta, static_shapes=True))
        return held[1]

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
        """The first guard of the ShapeEnv the binding breaks (as text), or None."""
        import sympy
        for g in self.env.guards:
            if g.expr.xreplace(binding) is not sympy.true:
                return str(g.expr)
        return None

    def instantiate(self, values: Dict[str, torch.Tensor], static: Dict[int, Any]) -> Dict[int, Any]:
        """Replay the op list on lazy tensors: ``values`` the inputs by name (lazy tensors of their new sizes),
        ``static`` the other tensors the ops read, by id (``Recorder.id_of``). Returns every tensor by id."""
        binding = self.binding(values)
        broken = self.check(binding)
        if broken is not None:
            raise ValueError(f"lazy: these sizes break a guard of the capture: {broken}")
        env: Dict[int, Any] = dict(static)
        for name, s in self.inputs:
            env[self._ids[id(s)]] = values[name]

        def concrete(a: Any) -> Any:
            if isinstance(a, tuple) and len(a) == 2 and a[0] == _REF:
                return env[a[1]]
            if isinstance(a, torch.SymInt):
                return int(a.node.expr.xreplace(binding))
            return a

        is_ref = lambda a: isinstance(a, tuple) and len(a) == 2 and a[0] == _REF  # noqa: E731
        for func, args, kwargs, outs in self.ops:
            result = func(*tree_map(concrete, args, is_leaf=is_ref), **tree_map(concrete, kwargs, is_leaf=is_ref))
            tensors = [r for r in tree_flatten(result)[0] if isinstance(r, torch.Tensor)]
            for i, r in zip(outs, tensors):
                env[i] = r
        return env

    def id_of(self, t: Any) -> int:
        return self._ids[id(t)]


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

    @property
    def _lz_st(self) -> Any:
        # what every read of a lazy tensor's data (.item(), .cpu(), print, bool: lazy/sync) starts from
        raise RuntimeError("lazy: reading the data of a tensor with symbolic sizes: a recording with symbolic sizes "
                           "records ops only")

    def __repr__(self) -> str:
        return f"SymLazy(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        rec = next(a.recorder for a in tree_flatten((args, kwargs))[0] if isinstance(a, SymLazy))
        fake_args = tree_map(lambda a: rec.fake_of(a) if isinstance(a, torch.Tensor) else
                             _META if isinstance(a, torch.device) and a.type == "lazy" else a, (args, kwargs))
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
        try:
            with rec.mode:
                fake_out = func(*fake_args[0], **fake_args[1])
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise RuntimeError(f"lazy: {func} needs data ({type(e).__name__}) while sizes are symbolic: a recording "
                               "with symbolic sizes records ops only") from None
        fakes = tree_flatten(fake_out)[0]
        if any(isinstance(f, torch.Tensor) and f.device.type != "meta" for f in fakes):
            raise RuntimeError(f"lazy: {func} moves a tensor off the lazy device while sizes are symbolic: a "
                               "recording with symbolic sizes records ops only")
        hint = lambda a: (a.concrete if isinstance(a, SymLazy) else  # noqa: E731
                          a.node.hint if isinstance(a, torch.SymInt) else a)
        out = func(*tree_map(hint, args), **tree_map(hint, kwargs))
        template = tree_map(lambda a: (_REF, rec._name(a)) if isinstance(a, torch.Tensor) else a, (args, kwargs))
        wrapped_ids: List[int] = []

        def wrap(pair: Tuple[Any, Any]) -> Any:
            o, f = pair
            if not isinstance(o, torch.Tensor):
                return o
            for a in tree_flatten((args, kwargs))[0]:  # in place: the argument itself
                if isinstance(a, SymLazy) and a.concrete is o:
                    wrapped_ids.append(rec._name(a))
                    return a
            s = SymLazy(o, f, rec)
            wrapped_ids.append(rec._name(s))
            return s

        outs, spec = tree_flatten(out)
        result = [wrap(p) for p in zip(outs, fakes)]
        rec.ops.append((func, template[0], template[1], wrapped_ids))
        return tree_unflatten(result, spec)
