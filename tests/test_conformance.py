"""OpInfo conformance: every op of PyTorch's ``op_db`` on lazy tensors gives eager CPU's results.

For each OpInfo and dtype (float32, int64, where the OpInfo supports it on CPU) the first sample input (every
sample with ``LAZY_CONFORMANCE_ALL=1``, a slow run: ``-m slow``) runs eagerly on CPU, then on lazy copies; every
tensor output is synced with ``.cpu()`` and compared with ``assert_close`` (dtype and shape included). The
in-place variant, where one exists and eager accepts the sample, is compared through the mutated input, and so is
the ``out=`` form, where the OpInfo supports it. Random ops run as PyTorch's harness runs them, through the OpInfo's
own callable (``torch.testing._utils.wrapper_set_seed``, which calls ``torch._lazy.mark_step()``: lazy's, see
lazy/compat.py): their values are lazy's own, so they compare shape, dtype, device, where the values lie (finite,
integers, non-negative, within [0, 1] wherever eager's are) and that a second run under the same seed gives the same
values; uninitialized outputs (``empty``) compare shape and dtype. Pairs eager rejects are skipped and not counted.

Known failures live in ``conformance_known_failures.py``; a known failure may raise, never return a wrong value.
The last test prints the pass rate of the pairs eager accepts and, on a full run, asserts it.
"""
import collections
import gc
import os
import traceback

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import lazy

from conformance_known_failures import KNOWN_FAILURES

# NOTE: a hard import, not importorskip: without OpInfo (it needs the 'expecttest' package) this suite must fail,
# never pass by skipping everything.
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

ALL_SAMPLES = os.environ.get("LAZY_CONFORMANCE_ALL") == "1"
TRACEBACKS = os.environ.get("LAZY_CONFORMANCE_TRACEBACK") == "1"  # triage: lazy errors with their traceback
DTYPES = (torch.float32, torch.int64)
TARGET_PASS_RATE = 0.97
# Looser than assert_close's float32 defaults: lazy inputs may be laid out differently from eager's (.to("lazy")
# densifies), which can change the summation order of reductions and BLAS calls.
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.complex64: dict(rtol=1e-4, atol=1e-5)}

# Ops whose values differ run to run compare only shape and dtype: OpInfo flags only uninitialized outputs
# (has_nondeterministic_output, which torch 2.11's OpInfo lacks: UNINITIALIZED names them), so the random ones are
# named here.
RANDOM_OPS = frozenset((
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "normal.in_place",
    "normal.number_mean", "uniform", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "nn.functional.scaled_dot_product_attention",
    "nn.functional.multi_head_attention_forward", "svd_lowrank", "pca_lowrank"))


UNINITIALIZED = frozenset(("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
                           "torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward"))


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def values_kind(op):
    """None for an op whose values eager's must equal; "random" (compared by support and reproducibility under a
    seed) or "uninitialized" (shape and dtype only)."""
    name = full_name(op)
    if name in UNINITIALIZED:
        return "uninitialized"
    return "random" if getattr(op, "has_nondeterministic_output", False) or name in RANDOM_OPS else None


CASES = [(op, dtype) for op in op_db for dtype in DTYPES if dtype in op.supported_dtypes("cpu")]
# (op name, dtype) -> "pass" | "known" | "fail" | "eager-skip"; read by test_summary.
RESULTS: dict = {}
FALLBACKS: "collections.Counter[str]" = collections.Counter()


class LazyFailure(Exception):
    """The lazy run raised (as opposed to returning a wrong value)."""


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def _oracle() -> torch.device:
    """Where eager computes the expected values: the backing device, whose ATen semantics lazy's executor follows
    (the cpu by default; LAZY_BACKING_DEVICE=cuda compares against eager CUDA, which lacks e.g. int64 matmul)."""
    return torch.device(lazy.config.backing_device)


def _to_oracle(v):
    device = _oracle()
    if isinstance(v, torch.Tensor):
        return v.clone() if device.type == "cpu" else v.to(device, copy=True)
    if device.type != "cpu" and ((isinstance(v, torch.device) and v.type == "cpu") or v == "cpu"):
        return device
    return v


def _eager_sample(pristine):
    return tree_map(_to_oracle, pristine, is_leaf=_is_leaf)


def _to_lazy(v):
    if isinstance(v, torch.Tensor):
        return v.to("lazy")
    # Factories' and .to()'s device: where eager computes on the cpu, lazy computes on lazy.
    if (isinstance(v, torch.device) and v.type == "cpu") or v == "cpu":
        return "lazy"
    return v


def _is_leaf(v) -> bool:
    return isinstance(v, torch.Size)  # pytree would rebuild a Size as a plain tuple


def _lazy_sample(pristine):
    """The sample with every tensor moved to lazy, and factories' ``device=`` pointing at it."""
    return tree_map(_to_lazy, pristine, is_leaf=_is_leaf)


def _call(fn, sample):
    inp, args, kwargs = sample
    return fn(inp, *args, **kwargs)


def _sync(out, on_lazy: bool):
    """Every tensor of ``out`` on the cpu; it must be on lazy if the sample put anything there."""
    def one(v):
        if isinstance(v, torch.Tensor):
            if on_lazy:
                assert v.device.type == "lazy", f"lazy op returned a tensor on {v.device}"
            return v.cpu()
        return v
    return tree_map(one, out, is_leaf=_is_leaf)


def _compare(got, want, random, what: str) -> None:
    """``random``: values_kind(op)."""
    got_flat, got_spec = tree_flatten(got, is_leaf=_is_leaf)
    want_flat, want_spec = tree_flatten(want, is_leaf=_is_leaf)
    assert got_spec == want_spec, f"{what}: output structure {got_spec} != eager {want_spec}"
    for i, (g, w) in enumerate(zip(got_flat, want_flat)):
        where = f"{what} output {i}"
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"{where}: got {type(g).__name__}, eager gave a tensor"
            assert g.dtype == w.dtype and g.shape == w.shape, \
                f"{where}: {g.dtype}{list(g.shape)} != eager {w.dtype}{list(w.shape)}"
            if not random:
                torch.testing.assert_close(g, w, equal_nan=True, check_device=False, msg=lambda m: f"{where}: {m}",
                                           **TOLERANCES.get(w.dtype, {}))
            elif random == "random":
                _check_support(g, w, where)
        elif not random:
            assert g == w or (g != g and w != w), f"{where}: {g!r} != eager {w!r}"


def _check_support(got, want, where):
    """A random op's values (lazy draws numbers of its own, as CUDA does) lie where eager's lie: finite if eager's
    are, integers if eager's are, non-negative, within [0, 1]."""
    if want.numel() == 0 or want.is_complex() or want.dtype == torch.bool:
        return
    w, g = want.double().cpu(), got.double()
    props = [("finite", lambda t: torch.isfinite(t).all()), ("integers", lambda t: (t == t.round()).all())]
    if want.numel() >= 16:  # a few draws lie in [0, 1] by chance (normal with a small std): not the op's support
        props += [("non-negative", lambda t: (t >= 0).all()), ("within [0, 1]", lambda t: ((t >= 0) & (t <= 1)).all())]
    for name, prop in props:
        assert not prop(w) or prop(g), f"{where}: eager's values are {name}, lazy's are not: {g.flatten()[:8].tolist()}"


def _run_lazy(fn, pristine):
    """Run ``fn`` on lazy copies of the sample and sync; a raise becomes LazyFailure, raised once the lazy
    tensors are gone, so none with a broken pending graph outlives the test (the next mark_step would fail)."""
    try:
        return _lazy_call(fn, pristine)
    except Exception as error:  # noqa: BLE001 - reported below
        message = f"{type(error).__name__}: {error}"
        if TRACEBACKS:
            message += "\n" + "".join(traceback.format_exception(error))
    gc.collect()
    raise LazyFailure(message)


def _lazy_call(fn, pristine):
    sample = _lazy_sample(pristine)
    # A factory sample with no tensor and no device (arange(3)) computes on the default device, as in eager.
    on_lazy = _on_lazy(sample)
    # NOTE: a random OpInfo's op is torch.testing._utils.wrapper_set_seed, which calls torch._lazy.mark_step() for a
    # lazy output: that is lazy's mark_step once lazy is imported (lazy/compat.py).
    out = _call(fn, sample)
    return _sync(out, on_lazy), _sync(sample[0], on_lazy)


def _on_lazy(sample) -> bool:
    """Whether the sample holds a lazy tensor or names the lazy device."""
    return any(lazy.is_lazy(v) or v == "lazy" for v in tree_flatten(sample, is_leaf=_is_leaf)[0]
               if isinstance(v, (torch.Tensor, str)))


def _check_sample(op, sample, random) -> bool:
    """Compare one sample; returns False if eager rejects it."""
    pristine = tree_map(_clone, (sample.input, tuple(sample.args), dict(sample.kwargs)), is_leaf=_is_leaf)
    # NOTE: eager runs on clones, as lazy does: .to("lazy") copies a tensor, not the rest of its storage, which
    # as_strided.partial_views reads.
    try:
        want = _call(op, _eager_sample(pristine))
    except Exception:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return False
    got, _ = _run_lazy(op, pristine)
    _compare(got, want, random, full_name(op))
    if random == "random":  # the same seed, the same values (OpInfo's wrapper_set_seed seeds every call)
        torch.manual_seed(0)
        again, _ = _run_lazy(op, pristine)
        _compare(again, got, None, f"{full_name(op)} (a second run under the same seed)")
    _check_inplace(op, pristine, random)
    _check_out(op, pristine, want, random)
    return True


def _check_inplace(op, pristine, random) -> None:
    inplace = op.get_inplace()
    if inplace is None:
        return
    eager_sample = _eager_sample(pristine)
    try:
        _call(inplace, eager_sample)
    except Exception:  # noqa: BLE001 - eager rejects the in-place form (dtype, broadcast): nothing to compare
        return
    _, mutated = _run_lazy(inplace, pristine)
    _compare(mutated, eager_sample[0], random, f"{full_name(op)}_ (in-place, mutated input)")


def _check_out(op, pristine, want, random) -> None:
    """The ``out=`` form, into tensors of the right size, where the OpInfo supports it and eager accepts it."""
    flat, _ = tree_flatten(want)
    if not op.supports_out or not flat or not all(isinstance(t, torch.Tensor) for t in flat):
        return

    def with_out(inp, *args, **kwargs):
        device = "lazy" if _on_lazy((inp, args, kwargs)) else _oracle()
        out = tree_map(lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device), want)
        return op(inp, *args, **kwargs, out=out)

    try:
        expected = _call(with_out, _eager_sample(pristine))
        # Eager's own out= must agree with its functional form (ihfft2 with one dim writes into a temporary:
        # PyTorch passes conj_physical_out its arguments swapped), or there is nothing to hold lazy to.
        _compare(expected, want, random, "eager out= against eager")
    except Exception:  # noqa: BLE001 - eager rejects out= here (the OpInfo's op may take no out): nothing to compare
        return
    got, _ = _run_lazy(with_out, pristine)
    _compare(got, expected, random, f"{full_name(op)} (out=)")


def _samples(op, dtype):
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    if ALL_SAMPLES:
        return list(samples)
    return [next(iter(samples))]


def _params():
    marks = [pytest.mark.slow] if ALL_SAMPLES else []  # every sample: a slow run, selected with -m slow
    return [pytest.param(op, dtype, id=f"{full_name(op)}-{dtype_name(dtype)}", marks=marks) for op, dtype in CASES]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("op,dtype", _params())
def test_op(op, dtype):
    _run_case(op, dtype, RESULTS)


def _run_case(op, dtype, results: dict) -> None:
    key = (full_name(op), dtype_name(dtype))
    known = KNOWN_FAILURES.get(key)
    if known is not None and known.startswith("skip:"):
        results[key] = "known"
        pytest.skip(known)
    torch.manual_seed(0)
    results[key] = "fail"
    checked = 0
    try:
        for sample in _samples(op, dtype):
            checked += _check_sample(op, sample, values_kind(op))
    except LazyFailure as failure:
        if known is not None:
            results[key] = "known"
            pytest.xfail(f"{known} [{failure}]"[:2000])
        raise AssertionError(f"lazy raised where eager did not: {failure}") from None
    finally:
        FALLBACKS.update(k for k in lazy.metrics.counters() if k.startswith(("fallback.", "data_dependent.")))
    # NOTE: a mismatch raised by _compare above is a failure even for a known failure: a wrong result is a bug.
    if not checked:
        results[key] = "eager-skip"
        pytest.skip("eager cpu rejects every sample")
    results[key] = "pass"


@(pytest.mark.slow if ALL_SAMPLES else lambda test: test)
def test_summary(capsys):
    """The pass rate over (op, dtype) pairs eager accepts; asserted when every pair ran."""
    counted = {k: v for k, v in RESULTS.items() if v != "eager-skip"}
    passed = sum(v == "pass" for v in counted.values())
    rate = passed / max(len(counted), 1)
    lines = [f"lazy OpInfo conformance: {passed}/{len(counted)} (op, dtype) pairs pass ({100 * rate:.1f}%), "
             f"{sum(v == 'known' for v in counted.values())} known failures, "
             f"{sum(v == 'fail' for v in counted.values())} failures"]
    if FALLBACKS:
        lines.append("ops run outside the graph (pairs): " + ", ".join(f"{k} x{n}" for k, n in FALLBACKS.most_common()))
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    if len(RESULTS) < len(CASES):
        pytest.skip("a partial run: the pass rate is asserted only when every pair ran")
    assert rate >= TARGET_PASS_RATE, lines[0]
