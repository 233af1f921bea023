"""The IR's internal ops: what ATen has no single op for (layout-aware as_strided, seeded randomness, running
a mutating op on copies). Each is an ``Op`` with a name and an eager implementation the executor calls."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from .node import Op


def _storage_of(base: torch.Tensor, base_stride: Sequence[int], numel: int) -> torch.Tensor:
    """A flat buffer laid out like the lazy storage ``base`` lives in (Note [IR values are logical])."""
    flat = torch.empty(numel, dtype=base.dtype, device=base.device)
    flat.as_strided(base.shape, base_stride, 0).copy_(base)
    return flat


def _as_strided(base: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int,
                base_stride: Sequence[int], numel: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    flat = _storage_of(base, base_stride, numel)
    if dtype is not None:  # the view reads the storage's bytes as another dtype (size, stride in its units)
        flat = flat.view(dtype)
    return flat.as_strided(size, stride, offset).clone()


def _as_strided_scatter(base: torch.Tensor, src: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                        offset: int, base_stride: Sequence[int], numel: int) -> torch.Tensor:
    flat = _storage_of(base, base_stride, numel)
    target = flat.view(src.dtype) if src.dtype != flat.dtype else flat  # same bytes, in the view's dtype
    view = target.as_strided(size, stride, offset)
    if 0 in view.stride() and view.numel() > 1:
        # An overlapping view (expand, stride 0): any one of the aliased writes may win, as in eager.
        index = torch.arange(target.numel(), device=flat.device).as_strided(size, stride, offset)
        target.index_put_((index.reshape(-1),), src.expand(size).reshape(-1))
    else:
        view.copy_(src)
    return flat.as_strided(base.shape, base_stride, 0).clone()


# as_strided over the storage of a lazy tensor whose base has strides `base_stride` in `numel` elements.
AS_STRIDED = Op("as_strided_layout", _as_strided)
AS_STRIDED_SCATTER = Op("as_strided_scatter_layout", _as_strided_scatter)

_FUNCTIONALIZED: Dict[Any, Op] = {}


def functionalized(op: Any, mutated: Sequence[int], out_names: Sequence[str], plain_returns: Sequence[int]) -> Op:
    """``op`` (which mutates arguments) as a pure function: it runs on copies of the mutated arguments and
    returns its non-aliased returns followed by the new values of the mutated arguments (or the out= tensors)."""
    key = (op, tuple(mutated), tuple(out_names))
    if key in _FUNCTIONALIZED:
        return _FUNCTIONALIZED[key]
    mutated = tuple(mutated)
    out_names = tuple(out_names)

    def run(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for i in mutated:
            if i < len(args):
                args[i] = _clone(args[i])
            else:
                name = op._schema.arguments[i].name
                kwargs[name] = _clone(kwargs.get(name))
        for name in out_names:
            kwargs[name] = _clone(kwargs[name])
        result = op(*args, **kwargs)
        result = result if isinstance(result, tuple) else (result,)
        news = [args[i] if i < len(args) else kwargs[op._schema.arguments[i].name] for i in mutated]
        news += [kwargs[name] for name in out_names]
        return tuple(result[i] for i in plain_returns) + tuple(news)

    fn = _FUNCTIONALIZED[key] = Op(f"functionalized[{op}]", run, op)
    return fn


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return [_clone(v) for v in value]
    return value


_SEEDED: Dict[Any, Op] = {}

# Note [The seed of a seeded op]
# A random op without a generator argument (native_dropout, the attention kernels' dropout) is recorded as
# ``seeded(op)`` with the seed as one more keyword argument, SEED_KWARG, placed after the op's own keywords. Runtime
# scalars are numbered by one walk of the argument template, positional arguments first, then keywords in order
# (Note [Argument templates]); the seed's keyword is last in the template, so its scalar is last in that walk too,
# wherever the op's own scalars are. (A seed appended as a positional argument while the op had a keyword scalar
# took that keyword's slot: SDPA's ``scale=`` became the seed and the seed ``scale``.) The name is no identifier,
# so it can never be one of the op's own parameters.
SEED_KWARG = "lazy.seed"


def seeded(op: Any) -> Op:
    """A random op that takes no generator, run under the backing device's RNG seeded with ``kwargs[SEED_KWARG]``
    (Note [The seed of a seeded op])."""
    if op in _SEEDED:
        return _SEEDED[op]

    def run(*args: Any, **kwargs: Any) -> Any:
        seed = kwargs.pop(SEED_KWARG)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        # NOTE: only the generator the op draws from is seeded and restored: torch.manual_seed + fork_rng would
        # also queue a CUDA seeding call (with a captured traceback) on every run, ~300 us on a cpu-only build.
        if device.type == "cuda":
            torch.cuda.init()  # default_generators is empty until CUDA is initialized
            gen = torch.cuda.default_generators[device.index if device.index is not None else
                                                torch.cuda.current_device()]
        else:
            gen = torch.default_generator
        state = gen.get_state()
        gen.manual_seed(seed)
        try:
            return op(*args, **kwargs)
        finally:
            gen.set_state(state)

    fn = _SEEDED[op] = Op(f"seeded[{op}]", run, op)
    SEEDED_OPS.add(fn)
    return fn


SEEDED_OPS: set = set()  # every op made by ``seeded``
