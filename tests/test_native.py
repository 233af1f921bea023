"""lazy._C (csrc/): the recorder's C fast path and the IR objects it creates.

The fast path must record exactly what the Python recorder records (same nodes, same graph keys, same results),
count every op, and hand everything it does not handle to Python.
"""
import gc

import pytest
import torch

import lazy
from lazy import _C
from lazy.debug import metrics
from lazy.device.tensor import live_storages
from lazy.ir.graph import linearize
from lazy.ir.node import DATA, Node
from lazy.trace import meta
from lazy.trace.views import value

L = "lazy"


def _program(x, w):
    """Functional ops with lazy tensors, runtime and static numbers, int lists, a view argument and a matmul."""
    y = (x * 1.5 + 0.25).relu()
    y = torch.tanh(y) - x.t() * 2
    y = y.sum(1, True) + y.mean([0, 1]) + torch.clamp(y, -0.5, 0.5)
    return (y @ w).exp().softmax(1)


def _views_and_kwargs(x):
    """Views (chained, of views, written through), keyword arguments, a dtype argument."""
    v = x.t().unsqueeze(0).expand(2, 6, 6)
    y = torch.add(v, v.transpose(1, 2), alpha=2).reshape(12, 6)
    s = y.sum(0, dtype=torch.float64) + y[3]
    x2 = x.clone()
    w = x2.view(36)[::2]
    w.mul_(3)  # in place through a view: x2 and every view of it see it
    return s.float() + x2.view(6, 6).t()[0] + w.view(3, 6)[1]


def _fast(enabled):
    _C.set_fast_path(enabled)


@pytest.fixture(autouse=True)
def _restore_fast_path():
    yield
    _C.set_fast_path(lazy.config.debug < 4)


def test_fast_path_records_what_python_records():
    xc, wc = torch.randn(6, 6), torch.randn(6, 3)
    x, w = xc.to(L), wc.to(L)
    _program(x, w)  # first calls: memoized and registered by the Python recorder
    metrics.reset()
    fast = _program(x, w)
    hits, misses = _C.fast_path_stats()
    assert hits >= 10 and misses == 0
    _fast(False)
    slow = _program(x, w)
    assert _C.fast_path_stats() == (hits, misses)  # nothing more went through C
    assert linearize([value(fast)]).key == linearize([value(slow)]).key
    expected = _program(xc, wc)
    torch.testing.assert_close(fast.cpu(), expected)
    torch.testing.assert_close(slow.cpu(), expected)


def test_every_op_is_counted_once():
    x = torch.randn(4, 4).to(L)
    (x * 2 + 1).relu()
    metrics.reset()
    y = x
    for _ in range(100):
        y = (y * 2 + 1).relu()
    assert metrics.counter("traced_ops") == 300
    _fast(False)
    for _ in range(10):
        y = (y * 2 + 1).relu()
    assert metrics.counter("traced_ops") == 330
    torch.zeros(3, device=L)  # through the Lazy dispatch key
    assert metrics.counter("traced_ops") >= 331


def test_runtime_scalars_do_not_recompile_on_the_fast_path():
    x = torch.randn(8).to(L)
    metrics.reset()
    for s in range(20):
        y = (x * float(s) + s).relu()
        torch.testing.assert_close(y.cpu(), (x.cpu() * float(s) + s).relu())
    assert metrics.counter("compiles") == 1
    assert _C.fast_path_stats()[0] >= 50


def test_trace_logging_turns_the_fast_path_off(capsys):
    x = torch.randn(4).to(L)
    x + 1
    with lazy.config.override(debug=4):
        before = _C.fast_path_stats()
        x + 1
        assert _C.fast_path_stats() == before
        assert "trace aten.add.Tensor" in capsys.readouterr().err
    x + 1
    assert _C.fast_path_stats()[0] == before[0] + 1


def test_clearing_the_shape_memo_clears_the_fast_path():
    x = torch.randn(5).to(L)
    x.exp()
    meta.clear()
    before = metrics.counter("shape_inference.meta") + metrics.counter("shape_inference.rule")
    x.exp()
    assert metrics.counter("shape_inference.meta") + metrics.counter("shape_inference.rule") == before + 1


def test_errors_surface_at_the_op():
    a, b = torch.randn(3).to(L), torch.randn(4).to(L)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="aten.add.Tensor: .*broadcast"):
            a + b


def test_node_fields_and_interned_signatures():
    a = Node(torch.ops.aten.neg.default, ("T",), (), (), (1.0,), (2, 3), torch.float32)
    b = Node(torch.ops.aten.neg.default, ("T",), (), (a,), (2.0,), (2, 3), torch.float32)
    assert a.sig is b.sig  # inputs and runtime scalars are not part of the signature
    assert b.inputs == (a,) and b.scalars == (2.0,) and b.metas is None and b.data is None
    assert not a.is_data and "aten::neg" in repr(a) and "inputs=1" in repr(b)
    leaf = Node(DATA, ((1,),), (), (), (), (2,), torch.float32, data=torch.zeros(2))
    assert leaf.is_data and leaf.data.shape == (2,)
    assert not gc.is_tracked(a)  # the garbage collector never walks a graph
    with pytest.raises(TypeError):
        Node(torch.ops.aten.neg.default, (), (), [a], (), (1,), torch.float32)  # inputs must be a tuple
    with pytest.raises(TypeError):
        type("Sub", (Node,), {})


def test_live_storages_in_creation_order_and_freed():
    gc.collect()
    base = len(live_storages())
    xs = [torch.zeros(2, device=L) + i for i in range(5)]
    live = live_storages()
    assert len(live) == base + 5  # the zeros' storages died with their tensors; the sums' live on
    mine = [t._lz_st for t in xs]
    serials = [st.serial for st in live_storages()]
    assert serials == sorted(serials)
    assert [st.serial for st in mine] == sorted(st.serial for st in mine)
    del xs, mine, live
    gc.collect()
    assert len(live_storages()) == base


def test_a_long_graph_is_freed_without_recursion():
    y = torch.zeros(2, device=L)
    for _ in range(100_000):
        y = y.neg()
    del y  # 100k nested node deallocations: CPython's trashcan bounds the C stack
    gc.collect()


def test_views_and_keyword_arguments_on_the_fast_path():
    xc = torch.randn(6, 6)
    x = xc.to(L)
    _views_and_kwargs(x)
    before = _C.fast_path_stats()[0]
    fast = _views_and_kwargs(x)
    assert _C.fast_path_stats()[0] - before >= 10
    _fast(False)
    slow = _views_and_kwargs(x)
    assert linearize([value(fast)]).key == linearize([value(slow)]).key
    torch.testing.assert_close(fast.cpu(), _views_and_kwargs(xc))
    torch.testing.assert_close(slow.cpu(), _views_and_kwargs(xc))


def test_a_fast_view_sees_later_writes_to_its_base():
    x = torch.zeros(3, 4).to(L)
    for expected in (1.0, 3.0):  # the second time through the fast path
        v = x.t()
        x.add_(1)
        torch.testing.assert_close(v.cpu(), torch.full((4, 3), expected))
        v.mul_(2)
    torch.testing.assert_close(x.cpu(), torch.full((3, 4), 6.0))


# ---- operators recorded without the dispatcher (csrc/record.cpp, "Operators") ----

def _ops(x, y):
    return [x + 2, 3.5 + x, x - y, x * y, 2 * x, x / 4, x + True, y * x]


def test_operators_record_the_dispatchers_call():
    xc, yc = torch.randn(3, 4), torch.randn(4)
    x, y = xc.to(L), yc.to(L)
    _ops(x, y)  # registers the ops
    before = _C.fast_path_stats()[0]
    metrics.reset()
    fast = _ops(x, y)
    assert _C.fast_path_stats()[0] - before == 8 and metrics.counter("traced_ops") == 8
    _fast(False)
    slow = _ops(x, y)
    for f, s, e in zip(fast, slow, _ops(xc, yc)):
        assert linearize([value(f)]).key == linearize([value(s)]).key
        torch.testing.assert_close(f.cpu(), e)
        assert f.dtype == e.dtype


def test_operators_keep_autograd():
    x = torch.randn(3).to(L).requires_grad_()
    y = x * 2 + 1
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))
    with torch.no_grad():
        assert (x * 2).grad_fn is None and not (x * 2).requires_grad


def test_operators_are_seen_by_modes():
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(3).to(L)
    x * 2
    with Dispatch():
        x * 2
    assert torch.ops.aten.mul.Tensor in seen
    seen.clear()
    with Function():
        x * 2
    assert seen


def test_operators_under_autocast_and_forward_ad_take_torchs_path():
    import torch.autograd.forward_ad as fwAD
    x = torch.randn(3).to(L)
    x * 2
    before = _C.fast_path_stats()[0]
    with torch.autocast("cpu"):
        x * 2
    with fwAD.dual_level():
        x * 2
    assert _C.fast_path_stats()[0] == before + 2  # recorded by __torch_dispatch__'s fast path, not the operator's
    assert metrics.counter("traced_ops") > 0


def test_operators_with_other_operands():
    x = torch.randn(3).to(L)
    x * 2
    with pytest.raises(OverflowError):  # does not fit int64: torch's own path raises, as eager does
        x + 2 ** 70
    torch.testing.assert_close((x * torch.tensor(2.0)).cpu(), x.cpu() * 2)  # a cpu scalar tensor
    with pytest.raises(TypeError):
        x + "a"
    torch.testing.assert_close((x * 1j).cpu(), x.cpu() * 1j)


# ---- in-place ops on base tensors ----

def _inplace(x, y):
    x.add_(y, alpha=0.5).mul_(2)  # broadcasting y, a keyword argument
    x.clamp_(-1.0, 1.0)
    v = x[1]  # a view sees its base's later in-place updates
    x.sub_(0.25)
    x[0].neg_()  # in place on a view: the Python recorder (scatter through the chain)
    return x, v


def test_inplace_ops_on_the_fast_path():
    xc, yc = torch.randn(3, 4), torch.randn(4)
    x, y = xc.clone().to(L), yc.to(L)
    _inplace(x.clone(), y)  # first calls register and memoize
    before = _C.fast_path_stats()[0]
    fx, fv = _inplace(x.clone(), y)
    assert _C.fast_path_stats()[0] - before >= 4
    _fast(False)
    sx, sv = _inplace(x.clone(), y)
    assert linearize([value(fx), value(fv)]).key == linearize([value(sx), value(sv)]).key
    ex, ev = _inplace(xc.clone(), yc)
    for got in ((fx, fv), (sx, sv)):
        torch.testing.assert_close(got[0].cpu(), ex)
        torch.testing.assert_close(got[1].cpu(), ev)


def test_inplace_errors_and_casts_stay_eagers():
    i = torch.arange(4).to(L)
    for _ in range(2):
        with pytest.raises(RuntimeError):  # eager: "result type Float can't be cast"; meta words it otherwise
            i.add_(1.5)
    a = torch.zeros(3).to(L)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            a.add_(torch.ones(2, 3).to(L))  # the result would not fit self's shape
    f = torch.zeros(3, dtype=torch.float64).to(L)
    for _ in range(2):
        f.add_(torch.ones(3).to(L))  # a float32 result written into float64 self (Python: cast on write-back)
    torch.testing.assert_close(f.cpu(), torch.full((3,), 2.0, dtype=torch.float64))
