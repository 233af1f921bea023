"""Programs run in C (Note [Programs run in C], csrc/runner.cpp and lazy/runtime/cpp_native.py): the same results,
errors and layouts as the Python run loop of runtime/cpp.py, which still runs the programs the C runner cannot."""
import pytest
import torch
import torch.nn.functional as F

import lazy
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.runtime import cpp_native

pytestmark = pytest.mark.usefixtures("cpp_compiler")


def _run(fn, inputs, native):
    """``fn`` on lazy copies of ``inputs``, compiled afresh with the C runner on or off; (results, native runs)."""
    graph_cache.clear()
    before = metrics.counter("cpp.native_runs")
    saved, cpp_native.NATIVE = cpp_native.NATIVE, native
    try:
        out = fn(*[x.to("lazy") for x in inputs])
        out = [t.cpu() for t in (out if isinstance(out, (list, tuple)) else [out])]
    finally:
        cpp_native.NATIVE = saved
    return out, metrics.counter("cpp.native_runs") - before


def check(fn, *inputs, runs_in_c=True):
    """The C runner's results equal the Python loop's bit for bit (the same kernels and ATen calls) and eager's."""
    got, native_runs = _run(fn, inputs, True)
    want, python_runs = _run(fn, inputs, False)
    assert python_runs == 0 and (native_runs > 0) == runs_in_c
    eager = fn(*inputs)
    for g, w, e in zip(got, want, eager if isinstance(eager, (list, tuple)) else [eager]):
        assert g.stride() == w.stride() and torch.equal(g, w)
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_externs_between_kernels():
    def mlp(x, w1, w2):
        h = F.gelu(x @ w1, approximate="tanh")     # mm, then a kernel reading its result
        return (h @ w2).softmax(-1), h.t() @ x     # a transposed view as an extern input
    check(mlp, torch.randn(12, 8), torch.randn(8, 16), torch.randn(16, 4))


def test_constants_scalars_defaults_and_several_results():
    def f(x, w, b, g, k):
        y = torch.addmm(b, x, w, beta=0.5, alpha=2.0)   # Scalars given
        z = F.layer_norm(y, (6,), g, None, 1e-3)         # native_layer_norm: three results, a None bias
        c = F.conv2d(z.reshape(1, 1, 4, 6), k, padding=1, stride=(1, 2))  # int lists
        return z, c, torch.sum(z, dim=(0,), dtype=torch.float64)  # a dtype constant
    check(f, torch.randn(4, 5), torch.randn(5, 6), torch.randn(6), torch.randn(6), torch.randn(2, 1, 3, 3))


def test_tensor_lists_with_absent_indices():
    def f(x, i, v):
        y = x * 1
        y[:, i] = v * 2  # index_put_ with the indices [None, i]
        return y + 1
    check(f, torch.randn(3, 5), torch.tensor([0, 4, 4]), torch.randn(3, 3))


def test_attention_that_draws_nothing():
    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2, q, k, v)


def test_random_ops_run_from_python():
    """A seeded extern (it takes a generator) keeps its program in the Python loop, with the same draws."""
    def f(x):
        torch.manual_seed(3)
        return torch.bernoulli(x @ x.t()) + 1
    x = torch.rand(8, 8) / 4
    got, native_runs = _run(f, (x,), True)
    want, _ = _run(f, (x,), False)
    assert native_runs == 0 and torch.equal(got[0], want[0])


def test_aten_errors_keep_their_type():
    x = -torch.eye(3)
    for native in (True, False):
        graph_cache.clear()
        saved, cpp_native.NATIVE = cpp_native.NATIVE, native
        try:
            y = torch.linalg.cholesky_ex(x.to("lazy") * 2, check_errors=True).L + 1  # raises in its ATen kernel
            with pytest.raises(torch.linalg.LinAlgError):
                y.cpu()
            assert (graph_cache.latest()._native is not None) == native  # the error came from the C run
        finally:
            cpp_native.NATIVE = saved


def test_kernel_errors_are_raised():
    x, bad = torch.randn(3), torch.tensor([3])
    y = (torch.gather(x.to("lazy"), 0, bad.to("lazy")) @ torch.ones(1, 2).to("lazy"))
    with pytest.raises((RuntimeError, IndexError)):
        y.cpu()


def test_runs_on_another_thread_while_this_one_records():
    """LAZY_ASYNC: programs run on the worker thread, in C, while the calling thread records the next step."""
    from models import MLP, batch, loss_fn

    def train(asynchronous):
        graph_cache.clear()
        torch.manual_seed(0)
        model = MLP().to("lazy")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with lazy.config.override(async_execution=asynchronous, async_min_run_us=0):
            for i in range(6):
                x, y = batch("mlp", i, "cpu")
                loss = loss_fn("mlp", model(x.to("lazy")), y.to("lazy"))
                loss.backward()
                opt.step()
                opt.zero_grad()
                lazy.mark_step()
            lazy.wait_device_ops()
        return [p.detach().cpu() for p in model.parameters()]

    before = metrics.counter("cpp.native_runs")
    launched = train(True)
    assert metrics.counter("cpp.native_runs") > before and metrics.counter("async.launched") > 0
    # a launched program may run with fewer OpenMP threads than one the caller waits for (Note [Thread budget of
    # the worker]), and a float reduction split over threads rounds differently: equal up to rounding
    for a, b in zip(launched, train(False)):
        torch.testing.assert_close(a, b)


def test_what_the_plan_refuses():
    from lazy.runtime.cpp_native import Unsupported, _constant

    assert _constant(torch.float64, "Optional[int]") == ("i", 7)
    assert _constant([1, 2], "List[int]") == ("il", [1, 2])
    assert _constant(3, "float") == ("f", 3.0)
    for value, kind in ((torch.device("cpu"), "Device"), ([1.5], "List[int]"), (object(), "Any"), (1.5, "int")):
        with pytest.raises(Unsupported):
            _constant(value, kind)
