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
    mine = [t._lz_st for t in xs]
    ids = {st.serial for st in mine}
    # the sums' storages live on, the zeros' died with their tensors (storages of earlier tests may be freed
    # meanwhile, by an asynchronous run finishing: never more are live)
    assert ids <= {st.serial for st in live} and len(live) <= base + 5
    serials = [st.serial for st in live_storages()]
    assert serials == sorted(serials)
    assert [st.serial for st in mine] == sorted(st.serial for st in mine)
    del xs, mine, live
    gc.collect()
    after = live_storages()
    assert not ids & {st.serial for st in after} and len(after) <= base


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
    metrics.reset()  # NOTE: also zeroes the fast path's counters, so it comes first
    before = _C.fast_path_stats()[0]
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


def _unary(x, b, i):
    return [x.sin(), x.relu(), x.exp(), -x, abs(x), x.sigmoid(), x.rsqrt(), x.isnan(), ~b, b.logical_not(),
            ~i, i.sign(), x.round(), x.lgamma()]


def test_unary_methods_record_the_dispatchers_call():
    """Note [Methods without the dispatcher]: the same nodes as torch's method through __torch_dispatch__."""
    xc, ic = torch.randn(3, 4), torch.randint(-5, 5, (4,))
    bc = xc > 0
    x, b, i = xc.to(L), bc.to(L), ic.to(L)
    _unary(x, b, i)  # registers and memoizes the ops
    metrics.reset()  # NOTE: also zeroes the fast path's counters, so it comes first
    before = _C.fast_path_stats()[0]
    fast = _unary(x, b, i)
    assert _C.fast_path_stats()[0] - before == 14 and metrics.counter("traced_ops") == 14
    _fast(False)
    slow = _unary(x, b, i)
    for f, s, e in zip(fast, slow, _unary(xc, bc, ic)):
        assert linearize([value(f)]).key == linearize([value(s)]).key
        torch.testing.assert_close(f.cpu(), e, equal_nan=True)
        assert f.dtype == e.dtype


def test_unary_methods_keep_autograd_modes_and_errors():
    from torch.utils._python_dispatch import TorchDispatchMode

    x = torch.randn(3).to(L).requires_grad_()
    y = x.sin()
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x.detach().cpu().cos())
    seen = []

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Dispatch():
        x.detach().exp()
    assert torch.ops.aten.exp.default in seen
    with pytest.raises(RuntimeError, match="bool"):  # eager's error, raised where the op is called
        -(torch.ones(2).to(L) > 0)
    xc = torch.randn(5) * 10  # arguments mean another overload (round.decimals) or an error: torch's method
    torch.testing.assert_close(xc.to(L).round(decimals=1).cpu(), xc.round(decimals=1))
    with pytest.raises(TypeError):
        xc.to(L).sin(3)


def test_composite_methods_are_not_taken():
    """``square`` is CompositeImplicitAutograd: the dispatcher delivers pow, so lazy leaves it to torch."""
    from lazy.trace.dispatch import _dispatcher_delivers

    aten = torch.ops.aten
    assert "square" not in vars(type(torch.randn(1).to(L)))
    assert not _dispatcher_delivers(aten.square.default) and _dispatcher_delivers(aten.sin.default)
    x = torch.randn(4)
    torch.testing.assert_close(x.to(L).square().cpu(), x.square())


@pytest.mark.parametrize("compiler", ["auto", "cpp"])
def test_plain_programs_import_nothing_heavy(compiler, tmp_path):
    """A chain of methods and .cpu() skip the dispatcher's Python key: in a fresh process, torch never imports
    torch.distributed.tensor (its first Python-subclass dispatch does, ~0.25 s; pointwise_chain.py's fresh run),
    and neither recording, syncing nor compiling imports sympy (torch's symbolic shapes, ~0.6 s)."""
    import os
    import subprocess
    import sys
    code = ("import sys, torch, lazy\n"
            "x = torch.randn(4, 4).to('lazy')\n"
            "y = ((x * 1.01 + 0.1).sin().relu() - 0.05).exp()\n"
            "assert torch.allclose(y.cpu(), ((x.cpu() * 1.01 + 0.1).sin().relu() - 0.05).exp())\n"
            "print(lazy.metrics.counter('cpp.compiles'), 'torch.distributed.tensor' in sys.modules, "
            "'sympy' in sys.modules)\n")
    # the cpu backing device: a compile happens there only (the suite may run with LAZY_BACKING_DEVICE=cuda)
    env = dict(os.environ, LAZY_COMPILER=compiler, LAZY_CACHE_DIR=str(tmp_path), LAZY_BACKING_DEVICE="cpu")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["1" if compiler == "cpp" else "0", "False", "False"]


def test_cpu_method_takes_torchs_path_when_autograd_records():
    x = torch.randn(3).to(L).requires_grad_()
    y = (x * 2).cpu()
    assert y.grad_fn is not None and y.device.type == "cpu"
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 2.0))
    zc = torch.randn(2, 3).t()
    z = zc.to(L).t().contiguous().t()  # eager's strides survive .cpu(), with and without a memory format
    for fmt in (torch.preserve_format, torch.contiguous_format):
        assert z.cpu(memory_format=fmt).stride() == zc.cpu(memory_format=fmt).stride()


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


# ---- several outputs, static memory formats and bool lists ----

def _multi(x, w, b):
    v, i = x.max(1)
    s, idx = torch.sort(x, dim=0)
    var, mean = torch.var_mean(x, dim=1)
    ln = torch.nn.functional.layer_norm(x, (6,), w, b)  # native_layer_norm: three outputs
    c = x.clone(memory_format=torch.contiguous_format)
    return [v, i, s, idx, var, mean, ln, c]


def test_multi_output_ops_on_the_fast_path():
    xc, wc, bc = torch.randn(4, 6), torch.randn(6), torch.randn(6)
    x, w, b = xc.to(L), wc.to(L), bc.to(L)
    _multi(x, w, b)  # first calls: memoized and registered by the Python recorder
    hits, misses = _C.fast_path_stats()
    fast = _multi(x, w, b)
    assert _C.fast_path_stats()[1] == misses and _C.fast_path_stats()[0] - hits >= 5
    assert isinstance(fast, list) and type(torch.sort(x, dim=0)) is type(torch.sort(xc, dim=0))
    _fast(False)
    slow = _multi(x, w, b)
    assert linearize([value(t) for t in fast]).key == linearize([value(t) for t in slow]).key
    for f, e in zip(fast, _multi(xc, wc, bc)):
        torch.testing.assert_close(f.cpu(), e)
        assert f.dtype == e.dtype and f.shape == e.shape and f.stride() == e.stride()


def test_backward_with_output_masks_on_the_fast_path():
    """native_layer_norm_backward's bool[3] output mask is a static template item in C as in Python."""
    xc, wc = torch.randn(4, 6), torch.randn(6)

    def grads(x, w):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        torch.nn.functional.layer_norm(x, (6,), w).pow(2).sum().backward()
        return x.grad, w.grad

    grads(xc.to(L), wc.to(L))
    misses = _C.fast_path_stats()[1]
    gx, gw = grads(xc.to(L), wc.to(L))
    assert _C.fast_path_stats()[1] == misses
    _fast(False)
    sx, sw = grads(xc.to(L), wc.to(L))
    assert linearize([value(gx), value(gw)]).key == linearize([value(sx), value(sw)]).key
    ex, ew = grads(xc, wc)
    torch.testing.assert_close(gx.cpu(), ex)
    torch.testing.assert_close(gw.cpu(), ew)


# ---- aliases of a base (Note [Aliases of a base are bases]) ----

def test_aliases_of_a_base_are_bases_and_share_updates():
    xc = torch.randn(3, 4)
    for fast in (True, False):
        _fast(fast)
        x = xc.clone().to(L)
        for _ in range(2):  # the second round on the fast path
            p = x.detach()
            q = p.detach().t()  # a view of the alias: a chain of one step
            assert p._lz_chain is None and p._lz_st is x._lz_st
            p.mul_(2)
            x.add_(1)
            torch.testing.assert_close(p.cpu(), x.cpu())
        torch.testing.assert_close(q.cpu(), (xc * 2 + 1).mul(2).add(1).t())
        torch.testing.assert_close(x.cpu(), (xc * 2 + 1).mul(2).add(1))


def test_parameter_updates_take_the_fast_path():
    model = torch.nn.Linear(4, 3).to(L)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for p in model.parameters():
        assert p._lz_chain is None
    for step in range(3):
        model(torch.randn(2, 4).to(L)).sum().backward()
        before = _C.fast_path_stats()[1]
        opt.step()
        if step == 2:  # memoized by then: no in-place update of a parameter bails to Python
            assert _C.fast_path_stats()[1] == before
        opt.zero_grad()
        lazy.mark_step()


def test_pack_scalars_matches_float_and_int():
    import ctypes
    scalars = [1.5, -3, True, False, 2 ** 62, -0.0, float("inf"), 1j]
    fs, is_ = (ctypes.c_double * 8)(), (ctypes.c_int64 * 8)()
    _C.pack_scalars(scalars, fs, is_)
    assert list(fs)[:7] == [1.5, -3.0, 1.0, 0.0, float(2 ** 62), -0.0, float("inf")] and fs[7] == 0.0
    assert list(is_) == [0, -3, 1, 0, 2 ** 62, 0, 0, 0]
    with pytest.raises(OverflowError):
        _C.pack_scalars([2 ** 70], fs, is_)
    with pytest.raises(ValueError):
        _C.pack_scalars(scalars + [1.0], fs, is_)  # more scalars than the buffers hold


def test_new_tensors_in_c_equal_pythons():
    """lazy._C.new_tensors (a replay's new results) makes what lazy/device/tensor.py's new_tensor makes of a data
    leaf of each output."""
    from lazy.device.tensor import new_tensor
    from lazy.ir.node import data_leaf
    outs = [torch.randn(5), torch.randn(3, 4)]
    descs = (((3, 4), (4, 1), 0, torch.float32), ((5,), (1,), 0, torch.float32))
    made = lazy._C.new_tensors(descs, outs, (1, 0), (12, 5))  # in another order than the outputs
    want = [new_tensor(descs[0], data_leaf(outs[1]), 12), new_tensor(descs[1], data_leaf(outs[0]), 5)]
    for t, w, desc, numel in zip(made, want, descs, (12, 5)):
        assert type(t) is lazy.LazyTensor and t._lz_desc == desc and t._lz_st.value.is_data
        assert (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) == desc
        assert t._lz_chain is None and t._lz_st.numel == numel
        torch.testing.assert_close(t.cpu(), w.cpu())
    with pytest.raises(ValueError):
        lazy._C.new_tensors((((3, 4), (4, 1), 0),), outs, (0,), (12,))
    with pytest.raises(ValueError):
        lazy._C.new_tensors((descs[0],), outs, (2,), (12,))  # no output 2
