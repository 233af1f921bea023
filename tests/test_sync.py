"""Sync points: each computes what it needs once, keeps it, and is counted by cause."""
import gc
import io
import contextlib

import pytest
import torch

import lazy
from lazy import _C
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.device.tensor import live_storages
from lazy.ir.node import DATA

L = "lazy"


def pending():
    return [st for st in live_storages() if st.value.op is not DATA]


def test_mark_step_computes_every_live_tensor_in_one_graph():
    x = torch.randn(4, 4).to(L)
    a = x * 2
    b = a.relu()
    c = x.sum()  # noqa: F841 -- a live pending tensor
    assert len(pending()) == 3
    lazy.mark_step()
    assert pending() == []
    assert metrics.counter("sync.mark_step") == 1 and metrics.counter("executed_graphs") == 1
    torch.testing.assert_close(b.cpu(), (x.cpu() * 2).relu())
    assert metrics.counter("executed_graphs") == 1  # b was already data: .cpu() ran no graph


def test_cpu_keeps_intermediates_so_nothing_is_computed_twice():
    x = torch.randn(8).to(L)
    a = x.exp()
    b = a + 1
    b.cpu()
    assert metrics.counter("executed_nodes") == 2
    assert pending() == []  # a (live, computed on the way) kept its value
    lazy.mark_step()
    assert metrics.counter("executed_graphs") == 1


@pytest.mark.parametrize("cause,action", [
    ("cpu", lambda t: t.cpu()),
    ("item", lambda t: t.sum().item()),
    ("tolist", lambda t: t.tolist()),
    ("print", lambda t: repr(t)),
    ("bool", lambda t: bool(t.sum() > -1e9)),
])
def test_sync_causes_are_counted(cause, action):
    t = torch.randn(3).to(L) + 1
    action(t)
    assert metrics.counter(f"sync.{cause}") == 1


def test_if_tensor_and_item_values():
    t = torch.tensor([1.0, -2.0]).to(L)
    if (t > 0).any():
        hit = True
    assert hit
    assert (t.abs().sum()).item() == 3.0
    assert int(t[0]) == 1 and float(t[1]) == -2.0
    assert f"{t.sum():.1f}" == "-1.0"


def test_print_matches_eager_text():
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]])
    text = repr(t.to(L))
    assert text == repr(t)[:-1] + ", device='lazy:0')"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print(torch.ones(2, device=L, requires_grad=True) * 2)
    assert "grad_fn=<MulBackward0>" in buf.getvalue() and "device='lazy:0'" in buf.getvalue()


@pytest.mark.parametrize("fn", [
    lambda x: torch.nonzero(x > 0),
    lambda x: torch.masked_select(x, x > 0),
    lambda x: torch.unique(x.round()),
    lambda x: x[x > 0],
])
def test_data_dependent_ops_sync_and_continue_lazily(fn):
    x = torch.randn(5, 4)
    got = fn(x.to(L))
    assert isinstance(got, lazy.LazyTensor)
    assert metrics.counter("sync.data_dependent") >= 1
    y = got * 2  # continues lazily
    torch.testing.assert_close(y.cpu(), fn(x) * 2)


def test_mark_step_memory_is_flat():
    w = torch.randn(8, 8).to(L)
    lazy.mark_step()
    gc.collect()
    base = len(live_storages())
    for _ in range(50):
        w = (w * 0.9 + 0.01).tanh()
        lazy.mark_step()
    gc.collect()
    assert len(live_storages()) <= base + 1
    assert w._lz_st.value.op is DATA and not w._lz_st.value.inputs  # no IR history is kept
    assert metrics.counter("compiles") == 1


def test_wait_device_ops():
    torch.ones(3, device=L).add_(1)
    lazy.mark_step()
    lazy.wait_device_ops()


def test_strict_mode_raises_on_implicit_sync():
    t = torch.ones(3, device=L) * 2
    with lazy.config.override(strict=True):
        with pytest.raises(lazy.sync.ImplicitSyncError, match="strict"):
            t.cpu()
        lazy.mark_step()  # explicit syncs are fine
    assert t.cpu().sum().item() == 6


def test_sync_log_names_user_line():
    torch.ones(2, device=L).sum().item()
    record = lazy.sync.SYNC_LOG[-1]
    assert record.cause == "item" and "test_sync.py" in record.where


def test_explain_names_causes_lines_and_recompile_reasons():
    for n in (4, 4, 5):
        x = torch.ones(n, device=L) * 2
        lazy.mark_step()
    x.sum().item()
    text = lazy.explain()
    assert "mark_step" in text and "item" in text and "test_sync.py" in text
    assert "first compile at this line" in text
    assert "f32[4] -> aten" in text or "[4] ->" in text  # the shape change that forced the recompile


def test_print_tolist_save_of_expanded_tensor():
    x = torch.arange(3.0).to(L).expand(2, 3)
    assert x.tolist() == [[0.0, 1.0, 2.0]] * 2
    assert "device='lazy:0'" in repr(x)
    assert x.cpu().is_contiguous()


@pytest.mark.usefixtures("cpu_backing")
def test_failed_graph_does_not_poison_later_steps():
    good = torch.ones(3, device=L) * 2
    idx = torch.tensor([5]).to(L)  # out of range: only found when the graph runs
    bad = torch.arange(3.0).to(L).gather(0, idx)
    with pytest.raises(RuntimeError):
        lazy.mark_step()
    lazy.mark_step()  # the failed values are left alone; nothing raises
    with pytest.raises(RuntimeError):
        bad.cpu()  # using a failed value raises again
    assert good.cpu().tolist() == [2.0, 2.0, 2.0]


def test_a_graph_runs_where_its_data_is():
    """Note [A graph runs where its data is]: data synced before the backing device changed is still read where it
    lives, by that device's compiler; a graph whose first leaf is elsewhere and whose leaves disagree raises a
    clear error instead of reaching a kernel."""
    here = lazy.config.backing_device
    elsewhere = "meta" if here != "meta" else "cpu"
    x = torch.randn(5, 3)
    a = x.to("lazy")
    lazy.mark_step()
    y = a * 2 + 1
    with lazy.config.override(backing_device=elsewhere):
        got = y.cpu()
    torch.testing.assert_close(got, (x.to(here) * 2 + 1).cpu())
    ran_on = next(reversed(graph_cache._CACHE))[1]  # the key: (graph, device, ...)
    assert ran_on.type == torch.device(here).type
    with lazy.config.override(backing_device="cpu"):
        b = torch.ones(5, 3).to("lazy")
        lazy.mark_step()
    if torch.device(here).type != "cpu":  # the first leaf on the other device: caught before the program runs
        with pytest.raises(RuntimeError, match="one graph reads data on"):
            (b + a).cpu()


@pytest.mark.parametrize("compiler", ["reference", "cpp"])
def test_data_checks_run_at_the_next_sync(compiler):
    """Note [Checks run at the next sync]: ops that check tensor data and return nothing (linalg's
    _linalg_check_errors, _assert_async) raise at the sync that follows, as eager raises at the op."""
    with lazy.config.override(compiler=compiler):
        with pytest.raises(torch.linalg.LinAlgError):
            (torch.linalg.cholesky(-torch.eye(3).to("lazy")) + 1).cpu()
        with pytest.raises(torch.linalg.LinAlgError):
            torch.linalg.inv(torch.zeros(2, 2).to("lazy")).cpu()
        good = torch.eye(3) * 2 + 0.5
        torch.testing.assert_close(torch.linalg.cholesky(good.to("lazy")).cpu(), torch.linalg.cholesky(good))
        # a failing _assert_async on a GPU is a device-side assert, in eager as here, after which the CUDA context
        # is unusable: only passing ones are run there
        on_cpu = torch.device(lazy.config.backing_device).type == "cpu"
        if on_cpu:
            torch._assert_async(torch.tensor([1.0, 0.0]).to("lazy").all())
            with pytest.raises(RuntimeError):
                lazy.mark_step()  # nothing else pending: the check alone is the graph
        torch._assert_async(torch.ones(2).to("lazy").all())
        lazy.mark_step()
        ready = torch.zeros(2).to("lazy")
        lazy.mark_step()
        if on_cpu:
            torch._assert_async(ready.any())
            with pytest.raises(RuntimeError):
                ready.cpu()  # data already computed: the pending check runs before it is read
        # a check pending beside a partial sync that also computes another live tensor on the way
        x = torch.randn(4)
        a = x.to("lazy") * 2
        b = a + 1
        torch._assert_async(torch.ones(1).to("lazy").all())
        torch.testing.assert_close(b.cpu(), x * 2 + 1)
        torch.testing.assert_close(a.cpu(), x * 2)
        assert not lazy.trace.record.PENDING_CHECKS


def test_a_data_check_inside_a_captured_function_runs_it_plainly():
    @lazy.compile
    def f(m):
        return torch.linalg.cholesky(m) * 2

    good = torch.eye(2) * 4
    for _ in range(3):
        torch.testing.assert_close(f(good.to("lazy")).cpu(), torch.linalg.cholesky(good) * 2)
    with pytest.raises(torch.linalg.LinAlgError):
        f(-good.to("lazy")).cpu()
    assert metrics.counter("capture.replays") == 0


@pytest.mark.parametrize("other", ["stride", "dtype", "sizes", "subclass"])
def test_a_sync_binds_leaves_from_templates_equal_to_leaves_made_from_scratch(other):
    """``_C.bind_outputs`` (Note [Data leaves from templates] in csrc/leaf_templates.cpp): each storage gets the leaf
    ``data_leaf`` would make, its version bumped, whether the output fits the place's template or not."""
    from test_capture_replay_io import _others, assert_scratch_leaf

    device = lazy.config.backing_device
    a, b = torch.zeros(4, 3, device=L), torch.zeros(4, 3, device=L)
    lazy.mark_step()
    storages = [a._lz_st, b._lz_st]
    templates = _C.leaf_templates(2)
    odd = _others(device)[other]
    rounds = [[torch.full((4, 3), 1.0, device=device), torch.full((4, 3), 2.0, device=device)],
              [torch.full((4, 3), 3.0, device=device), odd],
              [torch.full((4, 3), 4.0, device=device), torch.full((4, 3), 5.0, device=device)]]
    made = []
    for outs in rounds:
        versions = [st.version for st in storages]
        _C.bind_outputs(storages, [torch.ones(1), *outs], 1, templates)  # a root's output first
        for st, out, version in zip(storages, outs, versions):
            assert_scratch_leaf(st.value, out)
            assert st.version == version + 1
        made.append(storages[0].value)
    assert made[1].args is made[0].args and made[2].shape is made[0].shape  # place 0 fits its template throughout
    torch.testing.assert_close(a.cpu(), torch.full((4, 3), 4.0))
    with pytest.raises(IndexError):
        _C.bind_outputs(storages, [torch.ones(1)], 0, templates)
    with pytest.raises(TypeError, match="leaf templates"):
        _C.bind_outputs(storages, rounds[0], 0, _C.leaf_templates(1))


def test_repeated_syncs_of_a_program_bind_leaves_from_its_templates():
    x = torch.randn(5, 4)
    lx = x.to(L)
    leaves = []
    for i in range(3):
        y = (lx * (i + 1)).sin()
        lazy.mark_step()
        leaves.append(y._lz_st.value)
        torch.testing.assert_close(y.cpu(), (x * (i + 1)).sin())
    assert leaves[2].shape is leaves[1].shape and leaves[2].sig is leaves[1].sig


def test_cached_mark_steps_take_the_short_path():
    """Note [The short path of a cached sync]: the hooks of the layers above see a graph on its general runs (the
    first, and the tier-up at compile_after), later mark_steps of the compiled graph skip them; every step is
    counted, logged with its line and equal to eager."""
    from lazy import sync
    seen = []
    hook = lambda lin, hit: seen.append(hit)  # noqa: E731
    sync.BEFORE_RUN.append(hook)
    try:
        x = torch.randn(6, 5)
        lx = x.to(L)
        want = x
        with lazy.config.override(compile_after=2):
            for step in range(5):
                lx = (lx * 0.5 + 1.0).tanh()
                want = (want * 0.5 + 1.0).tanh()
                lazy.mark_step()
                torch.testing.assert_close(lx.cpu(), want)
    finally:
        sync.BEFORE_RUN.remove(hook)
    assert seen == [False, True]  # the reference run, then the tier-up run; three short ones
    assert metrics.counter("sync.mark_step") == 5 and metrics.counter("mark_step") == 5
    assert metrics.counter("graph_cache.hit") == 4 and metrics.counter("compiles") == 1
    records = [r for r in lazy.debug.explain.SYNC_LOG if r.cause == "mark_step"][-5:]
    assert [r.hit for r in records] == [False, True, True, True, True]
    assert all("test_sync.py" in r.where and r.nodes == records[0].nodes for r in records)


def test_a_failed_run_on_the_short_path_marks_its_values_failed():
    x = torch.randn(4).to(L)
    for _ in range(3):  # compiled and seen by the hooks: the next mark_step of this graph takes the short path
        y = (x * 2.0).exp()
        lazy.mark_step()
    program = graph_cache.latest()
    assert "_lazy_short_sync" in program.__dict__

    def fail(leaves, scalars):
        raise RuntimeError("the program failed")

    program.run = fail
    try:
        y = (x * 2.0).exp()
        with pytest.raises(RuntimeError, match="the program failed"):
            lazy.mark_step()
        st = y._lz_st
        assert st.failed is st.value and st.value.op is not DATA  # it keeps its IR, marked failed
        lazy.mark_step()  # which later mark_steps leave alone
        assert st.failed is st.value
    finally:
        del program.run
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2.0).exp())  # read, it is computed (by another graph)
