"""Every runtime scalar reaches its own parameter, on every executor, at a graph's first run and at its cached runs.

Python numbers passed for ``Scalar`` (and wrapped-number ``Tensor``) arguments, ``float`` arguments and the seeds of
random ops are runtime inputs (Note [Argument templates]): a node's template holds a marker where each was, and the
executors hand the graph's scalars back to the markers in the order of one walk of the template. A plan that walks
in another order swaps scalars silently (SDPA's ``scale=`` and its dropout seed once did: Note [The seed of a seeded
op]). This is the property test of that plan, over every ATen signature PyTorch's ``op_db`` records with a runtime
scalar or a seed:

- **Calls.** Every sample of every OpInfo (float32 and int64) runs on lazy tensors under a dispatch mode that keeps
  one call per signature (overload and the types of its arguments) whose arguments hold a runtime scalar or whose
  op is random, with its tensors copied to the cpu.
- **Reference executor, call by call.** Each call is recorded on lazy tensors and synced twice: once with its own
  scalars (a new graph) and once with every runtime scalar changed to another value (a cache hit). The executor's
  own ATen call is observed (a dispatch mode that sees what the program runs), and each runtime parameter must hold
  the value given for it, and a random op's generator the seed drawn for it at record time. The results must equal
  eager's for the same values; a random op's, eager's under a generator seeded with that seed.
- **C++ compiler, all calls in one graph.** Every call is recorded into one graph, compiled, and run twice the same
  way (new scalars, then a cache hit); outputs are checked against eager as above. Scalars lowered into kernels are
  checked by value; random ops stay ATen calls inside the program.
"""
import contextlib
import math

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import lazy
from lazy.device import backing
from lazy.trace.schema import STATIC, describe

SEED = 1234
NUMBERS = (int, float, bool, complex)


# ---------------------------------------------------------------------------------------------------------------
# Which arguments are runtime scalars, and how to change them

def _kinds(func, args, kwargs):
    """(kind, default, value) per argument, positional then keyword, the kind as the recorder classifies them
    (trace/schema.py)."""
    d = describe(func)
    schema = {a.name: a for a in func._schema.arguments}
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    pos = [(d.kinds[i] if i < len(d.kinds) else STATIC, _default(positional[i]) if i < len(positional) else None, v,
            positional[i].name if i < len(positional) else "")
           for i, v in enumerate(args)]
    return pos, [(d.kw_kinds.get(k, STATIC), _default(schema.get(k)), v, k) for k, v in kwargs.items()]


def _default(arg):
    return arg.default_value if arg is not None and arg.has_default_value() else None


def _map_scalars(v, kind, default, name, fn, counter):
    """``v`` with every runtime number replaced by ``fn(number, k, name)``, k counting them across the call."""
    if kind == STATIC:
        return v
    if type(v) in NUMBERS:
        counter[0] += 1
        new = fn(v, counter[0] - 1, name)
        # NOTE: never the parameter's default: the dispatcher leaves out trailing arguments equal to their defaults,
        # which is another graph (a new signature), not the cached run this is for.
        return new if new != default or new == v else fn(new, counter[0] - 1, name)
    if type(v) in (list, tuple):
        return type(v)(_map_scalars(x, kind, None, name, fn, counter) for x in v)
    return v


def map_scalars(func, args, kwargs, fn):
    pos, kw = _kinds(func, args, kwargs)
    counter = [0]
    new_args = tuple(_map_scalars(v, k, d, n, fn, counter) for k, d, v, n in pos)
    new_kwargs = {name: _map_scalars(v, k, d, n, fn, counter) for name, (k, d, v, n) in zip(kwargs, kw)}
    return new_args, new_kwargs, counter[0]


def _is_resize_scale(name):
    """The scale factors of the upsample ops (``scales_h``, ``scale_factors``...)."""
    return name.startswith("scale") and name != "scale"


def other_value(v, k, name=""):
    """Another value of the same type, different for each position k (so that two swapped scalars never agree), and
    within the ranges ops ask for ([0, 1] probabilities stay there, signs and orders are kept).

    NOTE: an upsample's scale factors only grow. A factor given with an output size maps output pixels onto input
    ones; a smaller one than the sizes imply maps the last pixels past the input, and ATen's antialiased kernels then
    read past the input's memory (with zero weights: eager's result depends on what lies there, NaN included)."""
    if type(v) is bool:
        return not v
    if type(v) is int:
        return v + k + 1 if v >= 0 else v - k - 1
    if type(v) is float:
        if not math.isfinite(v):
            return v
        return v * 1.25 + 0.0625 * (k + 1) if _is_resize_scale(name) else v * 0.75 + 0.0625 * (k + 1)
    return v * 0.75 + 0.0625j * (k + 1)


def _bind(func, args, kwargs):
    """{parameter name: value} of a call."""
    named = {func._schema.arguments[i].name: v for i, v in enumerate(args)}
    named.update(kwargs)
    return named


def runtime_parameters(func, args, kwargs):
    """{parameter name: value} of the runtime numbers of a call."""
    schema = func._schema
    named = _bind(func, args, kwargs)
    d = describe(func)
    kinds = dict(zip([a.name for a in schema.arguments if not a.kwarg_only], d.kinds))
    kinds.update(d.kw_kinds)
    return {name: v for name, v in named.items()
            if kinds.get(name, STATIC) != STATIC and _has_number(v)}


def _has_number(v):
    return type(v) in NUMBERS or (type(v) in (list, tuple) and any(_has_number(x) for x in v))


# ---------------------------------------------------------------------------------------------------------------
# Collecting the calls

class _Collect(TorchDispatchMode):
    """Keeps the first call of each signature that has runtime scalars or is random, its tensors on the cpu."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload) and func.namespace == "aten" and _returns_tensors(func):
            desc = describe(func)
            if not (desc.data_dependent or desc.dynamic_shape) and (
                    desc.random or map_scalars(func, args, kwargs, lambda v, k, name: v)[2]):
                key = (func, _signature(args), _signature(tuple(kwargs.items())))
                if key not in self.calls:
                    # NOTE: inside a mode's handler the mode is off: .cpu() here is lazy's own sync
                    self.calls[key] = (func,) + tree_map(_to_cpu, (args, kwargs))
        return func(*args, **kwargs)


def _returns_tensors(func):
    return all(str(r.type) in ("Tensor", "Tensor[]", "Optional[Tensor]") for r in func._schema.returns)


def _signature(v):
    if isinstance(v, (list, tuple)):
        return tuple(_signature(x) for x in v)
    if isinstance(v, torch.Tensor):
        return ("Tensor", v.dtype)
    return type(v).__name__


def _to_cpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu() if lazy.is_lazy(v) else v.detach().clone()
    return v


def _sample_on_lazy(v):
    if isinstance(v, torch.Tensor):
        return v.to("lazy")
    return "lazy" if (isinstance(v, torch.device) and v.type == "cpu") or v == "cpu" else v


@pytest.fixture(scope="module")
def calls():
    """The calls of every op_db sample that record a runtime scalar or a seed, one per signature."""
    found = {}
    for op in op_db:
        for dtype in (torch.float32, torch.int64):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                samples = list(op.sample_inputs("cpu", dtype))
            except Exception:  # noqa: BLE001 -- an OpInfo that cannot make samples here has nothing to test
                continue
            for s in samples:
                try:
                    sample = tree_map(_sample_on_lazy, (s.input, tuple(s.args), dict(s.kwargs)))
                    with _Collect(found):
                        op.op(sample[0], *sample[1], **sample[2])
                except Exception:  # noqa: BLE001 -- a sample lazy or eager rejects; its calls so far are kept
                    pass
                lazy.mark_step()
    assert len(found) > 200, f"only {len(found)} signatures with runtime scalars found in op_db"
    return list(found.values())


# ---------------------------------------------------------------------------------------------------------------
# Running a call: on lazy, on eager, and what the executor passed

def _backing():
    return torch.device(lazy.config.backing_device)


def _for_lazy(v):
    if isinstance(v, torch.Tensor):
        return v.to("lazy")
    return torch.device("lazy") if isinstance(v, torch.device) else v


def _for_eager(v):
    if isinstance(v, torch.Tensor):
        return v.to(_backing(), copy=True)
    return _backing() if isinstance(v, torch.device) else v


def _draw_seed():
    # The recorder's contract: one draw of a 62-bit seed from the generator per random op, at record time.
    return int(torch.randint(0, 2 ** 62, ()))


def _generator(seed):
    gen = torch.Generator(device=_backing())
    gen.manual_seed(seed)
    return gen


def _default_generator():
    device = _backing()
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def eager(func, args, kwargs, seed):
    """The call on the backing device; a random op draws from a generator seeded with ``seed``, which is what its
    lazy node means (design.md, randomness); ``seed`` None: the call draws nothing."""
    args, kwargs = tree_map(_for_eager, (args, kwargs))
    if seed is not None:
        if describe(func).has_generator:
            kwargs = dict(kwargs, generator=_generator(seed))
        else:
            gen = _default_generator()
            state = gen.get_state()
            gen.manual_seed(seed)
            try:
                return _results(func(*args, **kwargs), args, kwargs)
            finally:
                gen.set_state(state)
    return _results(func(*args, **kwargs), args, kwargs)


def _results(out, args, kwargs):
    """What a call produced: its outputs and its (possibly mutated) tensor arguments."""
    return [t for t in tree_flatten((out, args, kwargs))[0] if isinstance(t, torch.Tensor)]


def draws(func, args, kwargs):
    """Whether recording the call draws a seed: a random op, unless it takes no generator and its arguments make it
    draw nothing in eager (attention with dropout_p == 0, dropout with train=False: Note [Random ops that draw
    nothing] in lazy/trace/schema.py)."""
    d = describe(func)
    if not d.random:
        return False
    if d.has_generator:
        return True
    named = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    named.update(_bind(func, args, kwargs))
    return not (named.get("dropout_p") == 0 or named.get("train") is False)


def recorded_seed(func, args, kwargs):
    """The seed a call draws when recorded right after ``torch.manual_seed(SEED)``; None if it draws none."""
    if not draws(func, args, kwargs):
        return None
    torch.manual_seed(SEED)
    return _draw_seed()


def record(func, args, kwargs):
    """The call recorded on lazy tensors right after ``torch.manual_seed(SEED)`` (nothing runs): its results."""
    torch.manual_seed(SEED)
    args, kwargs = tree_map(_for_lazy, (args, kwargs))
    return _results(func(*args, **kwargs), args, kwargs)


class _Executed(TorchDispatchMode):
    """The ATen calls a graph's program makes, each with the seed its default generator had then."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs, _default_generator().initial_seed()))
        return func(*args, **kwargs)


@contextlib.contextmanager
def executed_calls():
    """Observe the ATen calls programs make. They run under the dispatch keys of plain eager code (Note [Executing
    inside __torch_dispatch__]), which keep modes out; here those keys are the ones of code under this mode."""
    spy = _Executed()
    with spy:
        keys = (torch._C._dispatch_tls_local_include_set(), backing._EAGER_KEYS[1])
    saved = backing._EAGER_KEYS
    backing._EAGER_KEYS = keys
    try:
        with spy:
            yield spy.calls
    finally:
        backing._EAGER_KEYS = saved


_RNG_RESULTS = ("philox_seed", "philox_offset", "rng_state")


def _unspecified(func, args, kwargs):
    """Result positions whose values eager leaves unspecified: an attention kernel called without dropout returns
    its philox seed and offset uninitialized (eager CUDA's ``at::empty``), as nothing was drawn."""
    if not describe(func).random or draws(func, args, kwargs):
        return set()
    return {i for i, r in enumerate(func._schema.returns) if r.name in _RNG_RESULTS}


def _compare(got, want, what, skip=()):
    assert len(got) == len(want), f"{what}: {len(got)} results, eager {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip:
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what} result {i}: {g.dtype}{list(g.shape)} != " \
                                                          f"{w.dtype}{list(w.shape)}"
        torch.testing.assert_close(g.cpu(), w.cpu(), equal_nan=True, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{what} result {i}: {m}")


def _name(call):
    return str(call[0])


def _variants(call):
    """Pairs of calls, a first run and a cached run: the call as collected, then with every runtime scalar changed;
    and, if it omitted some runtime scalar parameters, the same with all of them given."""
    func, args, kwargs = call
    calls = [(args, kwargs)]
    full = filled(func, args, kwargs)
    if full is not None and full != (args, kwargs):
        calls.append(full)
    out = []
    for a, k in calls:
        out += [(a, k), map_scalars(func, a, k, other_value)[:2]]
    return out


_SCALAR_TYPES = ("number", "Optional[number]", "float", "Optional[float]")


def filled(func, args, kwargs):
    """The call with a value for every runtime scalar parameter it left out (SDPA's ``scale``, ``add``'s ``alpha``):
    positional ones up to the last such, keyword ones by name; None if a positional one has no default to pass."""
    d = describe(func)
    positional = [a for a in func._schema.arguments if not a.kwarg_only]
    runtime = [d.kinds[i] != STATIC and str(a.type) in _SCALAR_TYPES for i, a in enumerate(positional)]
    last = max((i for i, r in enumerate(runtime) if r), default=-1)
    args, kwargs, k = list(args), dict(kwargs), 0
    for i in range(len(args), last + 1):
        if not positional[i].has_default_value():
            return None
        args.append(_value_for(positional[i], k) if runtime[i] else positional[i].default_value)
        k += runtime[i]
    for a in func._schema.arguments:
        if a.kwarg_only and a.name not in kwargs and d.kw_kinds.get(a.name, STATIC) != STATIC \
                and str(a.type) in _SCALAR_TYPES:
            kwargs[a.name] = _value_for(a, k)
            k += 1
    return tuple(args), kwargs


def _value_for(arg, k):
    default = arg.default_value if arg.has_default_value() else None
    if type(default) in NUMBERS:
        return other_value(default, k + 7, arg.name)
    return (2.0 if _is_resize_scale(arg.name) else 0.5) + 0.25 * k  # upsample scales: see other_value


def _executed_ops(func):
    d = describe(func)
    return {func, d.functional} - {None}


# ---------------------------------------------------------------------------------------------------------------
# The tests

def test_reference_executor(calls):
    failures = []
    # synchronous: the spy of executed calls (a dispatch mode) sees the calling thread only
    with lazy.config.override(compiler="reference", async_execution=False):
        for call in calls:
            func = call[0]
            variants = _variants(call)
            for i, (args, kwargs) in enumerate(variants):
                run = i % 2
                what = f"{_name(call)}{' (all scalars given)' if i > 1 else ''} " \
                       f"({'cached run, other scalars' if run else 'first run'})"
                # a cached run hits the first run's graph unless its scalars made it draw where that one did not
                # (dropout_p 0 -> 0.0625: Note [Random ops that draw nothing])
                hit = run and draws(func, *variants[i - 1]) == draws(func, args, kwargs)
                try:
                    _check_reference(func, args, kwargs, hit, what)
                except AssertionError as error:
                    failures.append(str(error).split("\n")[0])
                except Exception as error:  # noqa: BLE001 -- compared with eager below
                    if _eager_accepts(func, args, kwargs):
                        failures.append(f"{what}: lazy raised where eager did not: {type(error).__name__}: {error}"
                                        .split("\n")[0])
                lazy.mark_step()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def _eager_accepts(func, args, kwargs):
    try:
        eager(func, args, kwargs, recorded_seed(func, args, kwargs))
    except Exception:  # noqa: BLE001
        return False
    return True


def _check_reference(func, args, kwargs, hit, what):
    seed = recorded_seed(func, args, kwargs)
    try:
        want = eager(func, args, kwargs, seed)
    except Exception:  # noqa: BLE001 -- values eager rejects: lazy must raise too
        with pytest.raises(Exception):
            got = record(func, args, kwargs)
            lazy.sync_tensors(got, "test")
            [g.cpu() for g in got]
        return
    got = record(func, args, kwargs)
    if seed is None:  # drawing nothing, recording left the generator as torch.manual_seed(SEED) did
        drawn = torch.random.get_rng_state()
        torch.manual_seed(SEED)
        assert torch.equal(drawn, torch.random.get_rng_state()), f"{what}: recording drew from the generator"
    hits = lazy.metrics.counter("graph_cache.hit")
    with executed_calls() as seen:
        lazy.sync_tensors(got, "test")
    _compare([g.cpu() for g in got], want, what, _unspecified(func, args, kwargs))
    if hit and seen:
        assert lazy.metrics.counter("graph_cache.hit") > hits, \
            f"{what}: the second run compiled a new graph instead of hitting the cache"
    given = runtime_parameters(func, args, kwargs)
    for op, a, kw, _ in [c for c in seen if c[0] in _executed_ops(func)][-1:]:
        passed = runtime_parameters(op, a, kw)
        for name, value in given.items():
            if name in passed:
                assert _same(passed[name], value), \
                    f"{what}: parameter {name!r} received {passed[name]!r}, the call gave {value!r}"
    if seed is not None:
        # The op itself, or what the Lazy key decomposed it into (rand is empty + uniform_): a random op ran, with
        # the seed drawn at record time.
        random = [c for c in seen if isinstance(c[0], torch._ops.OpOverload) and describe(c[0]).random]
        assert random, f"{what}: the program ran no random op"
        op, a, kw, default_seed = random[-1]
        gen = _bind(op, a, kw).get("generator")
        got_seed = gen.initial_seed() if gen is not None else default_seed
        assert got_seed == seed, f"{what}: {op} ran with seed {got_seed}, the call drew {seed} when recorded"


def _same(a, b):
    if type(a) in (list, tuple):
        return type(b) in (list, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):  # a wrapped number, as the executor may pass one
        a = a.item()
    return a == b or (a != a and b != b)


def test_cpp_compiler_one_graph(calls, tmp_path):
    """All calls in one graph, compiled: its first run, then a cached run with other scalars; then the same for the
    calls with every runtime scalar parameter given."""
    with lazy.config.override(compiler="cpp", backing_device="cpu", cache_dir=str(tmp_path),
                              async_execution=False):  # the spy of executed calls sees the calling thread only
        for pair in range(2):
            usable = [(c, _variants(c)[2 * pair:2 * pair + 2]) for c in calls]
            usable = [(c, v) for c, v in usable if v and all(_eager_accepts(c[0], a, k) for a, k in v)]
            assert len(usable) > (150 if pair == 0 else 25)
            for run in range(2):
                _check_one_graph([(c, v[run]) for c, v in usable], run,
                                 f"{' (all scalars given)' if pair else ''} "
                                 f"({'cached run, other scalars' if run else 'first run'})")


def _check_one_graph(calls, run, label):
    torch.manual_seed(SEED)
    seeds = [_draw_seed() if draws(call[0], *ak) else None for call, ak in calls]
    torch.manual_seed(SEED)
    results = []
    for call, (args, kwargs) in calls:
        lazy_args, lazy_kwargs = tree_map(_for_lazy, (args, kwargs))
        results.append(_results(call[0](*lazy_args, **lazy_kwargs), lazy_args, lazy_kwargs))
    lazy.metrics.reset()
    lazy.sync_tensors([t for r in results for t in r], "test")
    counters = lazy.metrics.counters()
    assert counters.get("cpp.compiles", 0) == (0 if run else 1), counters
    assert counters.get("graph_cache.hit", 0) == run, counters
    assert not any(k.startswith("compile_fallback") for k in counters), counters
    failures = []
    for got, (call, (args, kwargs)), seed in zip(results, calls, seeds):
        try:
            _compare([g.cpu() for g in got], eager(call[0], args, kwargs, seed), _name(call) + label)
        except AssertionError as error:
            failures.append(str(error).split("\n")[0])
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_sdpa_scale_keyword_beside_dropout_seed():
    """The reported case: SDPA's recorded CPU kernel takes ``dropout_p`` positionally and ``scale`` by keyword: each
    must reach its own parameter (at dropout_p == 0 it is recorded without a seed, Note [Random ops that draw
    nothing]; the seed's own slot is checked for every seeded op of op_db above)."""
    q = torch.randn(2, 4, 8, 16)
    ql = q.to("lazy").requires_grad_()
    y = torch.nn.functional.scaled_dot_product_attention(ql, ql, ql, dropout_p=0.0, is_causal=True, scale=0.25)
    y.sum().backward()
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.0, is_causal=True, scale=0.25)
    torch.testing.assert_close(y.cpu(), want.to(y.cpu().device))
