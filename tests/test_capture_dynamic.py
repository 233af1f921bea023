"""``lazy.compile(dynamic=True)`` (lazy/capture/dynamic.py): one capture replays at other sizes, each equal to eager
on the backing device; what the recording cannot follow specializes the capture's sizes, never its results."""
import copy

import pytest
import torch
import torch.nn as nn

import lazy
from lazy.debug.metrics import counter
from models import MODELS, TinyGPT, batch, loss_fn

pytestmark = pytest.mark.usefixtures("capture_verified")

EAGER = str(lazy.sync.backing_device())
CLOSE = dict(rtol=1e-4, atol=1e-5)  # compiled kernels and eager's round differently


def close(got, want):
    assert type(got) is lazy.LazyTensor  # never a tensor of the recording
    torch.testing.assert_close(got.cpu(), want.detach().cpu(), **CLOSE)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def test_an_inference_function_captured_once_replays_at_other_batch_sizes():
    ref = mlp().to(EAGER)
    model = copy.deepcopy(ref).to("lazy")

    @lazy.compile(dynamic=True)
    def predict(x):
        with torch.no_grad():
            y = model(x)
            return y.softmax(-1) * x.shape[0], y.sum()  # a size as a number in the graph

    for b in (4, 5, 7, 4, 9, 5):
        x = torch.randn(b, 8)
        probs, total = predict(x.to("lazy"))
        with torch.no_grad():
            want = ref(x.to(EAGER))
        close(probs, want.softmax(-1) * b)
        close(total, want.sum())
    assert counter("capture.captures") == 1
    assert counter("capture.dynamic_compiles") == 3  # 5, 7, 9: each size compiles once
    assert counter("capture.dynamic_replays") == 4


def test_a_gpt_forward_replays_at_other_batch_sizes_and_lengths_up_to_its_block():
    torch.manual_seed(0)
    ref = TinyGPT(vocab=17, d=16, heads=2, layers=2, block=16).eval().to(EAGER)
    model = copy.deepcopy(ref).to("lazy")
    predict = lazy.compile(dynamic=True)(lambda idx: model(idx).detach())
    with torch.no_grad():
        for b, t in ((4, 8), (3, 5), (6, 16), (2, 11), (3, 5)):
            idx = torch.randint(0, 17, (b, t))
            close(predict(idx.to("lazy")), ref(idx.to(EAGER)))
        assert counter("capture.captures") == 1
        assert counter("capture.dynamic_replays") == 4
        idx = torch.randint(0, 17, (2, 17))  # past the positional table: the recorded guard T <= 16 refuses it
        with pytest.raises(Exception):
            ref(idx.to(EAGER))
        with pytest.raises(Exception):
            predict(idx.to("lazy"))


def test_a_training_step_replays_at_other_batch_sizes():
    ref = mlp().to(EAGER)
    model = copy.deepcopy(ref).to("lazy")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(net, optimizer, x, y):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    compiled = lazy.compile(dynamic=True)(lambda x, y: step(model, opt, x, y))
    for b in (4, 4, 6, 6, 4, 6):
        x, y = torch.randn(b, 8), torch.randint(0, 4, (b,))
        close(compiled(x.to("lazy"), y.to("lazy")), step(ref, ref_opt, x.to(EAGER), y.to(EAGER)))
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p, q)
        assert type(p.grad) is type(p)  # no tensor of the recording is left behind
    assert counter("capture.dynamic_replays") == 3  # the 6s; the 4s replay the capture's own sizes


def _gpt_batch(b, t):
    seq = torch.randint(0, 17, (b, t + 1))
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# NOTE: not AdamW for the GPT: the gradient of the attention's key bias is zero but for rounding (softmax does not
# see a constant added to every key), and Adam's normalized step turns any two roundings of it into different steps
@pytest.mark.parametrize("kind", ["mlp_adamw", "gpt_sgd"])
def test_training_steps_with_a_schedule_at_other_sizes(kind):
    torch.manual_seed(0)
    if kind == "gpt_sgd":
        ref = TinyGPT(vocab=17, d=16, heads=2, layers=2, block=16).to(EAGER)
        sizes = ((4, 8), (4, 8), (3, 5), (6, 16), (3, 5), (4, 8), (2, 11))
        data = [_gpt_batch(b, t) for b, t in sizes]
        make = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
    else:
        ref = mlp().to(EAGER)
        data = [(torch.randn(b, 8), torch.randint(0, 4, (b,))) for b in (5, 5, 3, 9, 3, 5, 2)]
        make = lambda params: torch.optim.AdamW(params, lr=1e-2)  # noqa: E731
    model = copy.deepcopy(ref).to("lazy")
    ref_opt, opt = make(ref.parameters()), make(model.parameters())
    ref_sched = torch.optim.lr_scheduler.CosineAnnealingLR(ref_opt, 10)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)

    def step(net, optimizer, scheduler, x, y):
        loss = nn.functional.cross_entropy(net(x).flatten(0, -2), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss.detach()

    compiled = lazy.compile(dynamic=True)(lambda x, y: step(model, opt, sched, x, y))
    for x, y in data:
        close(compiled(x.to("lazy"), y.to("lazy")), step(ref, ref_opt, ref_sched, x.to(EAGER), y.to(EAGER)))
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p, q)
        state = "exp_avg_sq" if kind == "mlp_adamw" else "momentum_buffer"
        close(opt.state[p][state], ref_opt.state[q][state])
        close(p.grad, q.grad)  # close() also asserts: a lazy tensor, never one of the recording
    assert counter("capture.dynamic_replays") >= 3


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_each_test_model_trains_at_changing_batch_sizes_as_eager(kind):
    """SGD with momentum over batch sizes 8, 5, 12, 5, 8, 3 (the first step creates the momentum buffers and runs
    plainly): each step's loss, and the parameters at the end, are eager's."""
    torch.manual_seed(0)
    ref = MODELS[kind]().to(EAGER)
    model = copy.deepcopy(ref).to("lazy")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(net, optimizer, x, y):
        optimizer.zero_grad()
        loss = loss_fn(kind, net(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    compiled = lazy.compile(dynamic=True)(lambda x, y: step(model, opt, x, y))
    for i, size in enumerate((8, 5, 12, 5, 8, 3)):
        x, y = batch(kind, i, size=size)
        close(compiled(x.to("lazy"), y.to("lazy")), step(ref, ref_opt, x.to(EAGER), y.to(EAGER)))
    for p, q in zip(model.parameters(), ref.parameters()):
        close(p, q)
    for b, c in zip(model.buffers(), ref.buffers()):  # BatchNorm's running statistics
        torch.testing.assert_close(b.cpu(), c.cpu(), **CLOSE)
    assert counter("capture.dynamic_replays") >= 2


class Cache:
    pass


def test_what_a_dynamic_capture_stores_is_concrete_and_replays_store_the_new_sizes():
    cache = Cache()
    seen = []

    @lazy.compile(dynamic=True)
    def remember(x):
        y = x * 2 + 1
        cache.last = y
        cache.rows = x.shape[0]
        seen.append(y.sum(0))
        return y.mean()

    for b in (3, 5, 3, 8):
        x = torch.randn(b, 4)
        close(remember(x.to("lazy")), (x * 2 + 1).mean())
        assert type(cache.last).__name__ == "LazyTensor" and type(cache.rows) is int and cache.rows == b
        close(cache.last, x * 2 + 1)
        assert type(seen[-1]).__name__ == "LazyTensor"
        close(seen[-1], (x * 2 + 1).sum(0))
    assert counter("capture.captures") == 1 and counter("capture.dynamic_replays") == 2  # 5, 8: 3 is its own


def test_a_branch_on_a_size_keeps_one_entry_per_side_and_returned_sizes_follow_the_call():
    @lazy.compile(dynamic=True)
    def f(x):
        if x.shape[0] > 8:  # a guard of the recording: s0 > 8
            return x * 2, x.shape[0] * 3
        return x - 1, x.shape[0] + 100

    for b in (10, 12, 4, 6, 10, 16, 5):
        x = torch.randn(b, 3)
        out, n = f(x.to("lazy"))
        close(out, x * 2 if b > 8 else x - 1)
        assert type(n) is int and n == (b * 3 if b > 8 else b + 100)
    assert counter("capture.captures") == 2 and counter("capture.dynamic_replays") == 4


def test_python_counters_of_sizes_replay_as_expressions():
    """``seen += x.shape[0]`` is an expression of the argument's size and of the counter, read at each replay: the
    counter is not guarded by its value (which changes every call), and a replay at another size adds that size."""
    stats = Cache()
    stats.rows, stats.elements = 0, 0

    @lazy.compile(dynamic=True)
    def f(x):
        stats.rows += x.shape[0]
        stats.elements = stats.elements + x.size(0) * x.size(-1) + x.numel() - x.dim() * 0
        return x * 2, x.size()

    rows = elements = 0
    for b in (10, 12, 4, 10, 7):
        x = torch.randn(b, 3)
        out, size = f(x.to("lazy"))
        rows, elements = rows + b, elements + 6 * b
        close(out, x * 2)
        assert (stats.rows, stats.elements) == (rows, elements) and type(stats.rows) is int
        assert size == torch.Size((b, 3)) and type(size) is torch.Size and type(size[0]) is int
    assert counter("capture.captures") == 1 and counter("capture.dynamic_replays") == 3


def test_a_float_of_a_size_scales_as_eager_at_each_size():
    """``x.shape[-1] ** -0.5`` is a SymFloat while the capture runs: the concrete run takes its value (it once
    took the SymFloat itself, and the capture's own result was NaN), a replay at other sizes its value there."""
    @lazy.compile(dynamic=True)
    def f(x):
        return x * (x.shape[1] ** -0.5)

    for b, t in ((4, 9), (5, 16), (3, 4)):
        x = torch.randn(b, t)
        close(f(x.to("lazy")), x * t ** -0.5)
    assert counter("capture.captures") == 1 and counter("capture.dynamic_replays") == 2


def test_a_size_used_as_a_value_specializes_its_capture():
    """A size as a dict key, a loop count, a list length or text is its value (a guard of the recording, as in
    Dynamo): each size captures, with eager's results."""
    table = {10: 1.0, 12: 2.0, 4: 3.0}

    @lazy.compile(dynamic=True)
    def f(x):
        n = x.shape[0]
        return x * table[n], list(range(n))[-1], [0] * n, f"{n} rows"

    for b in (10, 12, 4, 12):
        x = torch.randn(b, 3)
        out, last, zeros, text = f(x.to("lazy"))
        close(out, x * table[b])
        assert (last, len(zeros), text) == (b - 1, b, f"{b} rows") and type(last) is int
    assert counter("capture.captures") == 3 and counter("capture.dynamic_replays") == 0


def test_an_argument_updated_in_place_at_other_sizes():
    @lazy.compile(dynamic=True)
    def scale_(x, s):
        x.mul_(s)
        return x.sum()

    for b in (3, 6, 4):
        x = torch.randn(b, 2)
        lx = x.to("lazy")
        close(scale_(lx, 1.5), (x * 1.5).sum())
        close(lx, x * 1.5)
    assert counter("capture.dynamic_replays") == 2


def test_size_one_and_a_changed_rank_capture_again():
    @lazy.compile(dynamic=True)
    def f(x):
        return (x * 3).sum(-1)

    for shape in ((4, 3), (1, 3), (5, 3), (2, 2, 3)):
        x = torch.randn(*shape)
        close(f(x.to("lazy")), (x * 3).sum(-1))
    assert counter("capture.captures") == 3  # (4, 3); (1, 3): size 1 is no symbol's value; rank 3
    assert counter("capture.dynamic_replays") == 1


def test_random_ops_at_other_sizes_draw_as_plain_runs_do():
    """Building a size's graph records the op list's random ops, which draw seeds: the generator is put back, so
    a run of compiled calls draws what the same plain calls draw."""
    def plain(x):
        return nn.functional.dropout(x, 0.5, training=True) * 2 + torch.rand_like(x)

    compiled = lazy.compile(dynamic=True)(lambda x: plain(x))
    xs = [torch.randn(b, 3) for b in (4, 4, 6, 6, 5, 4)]
    for fn in (plain, compiled):
        torch.manual_seed(0)
        got = [fn(x.to("lazy")).cpu() for x in xs]
        if fn is plain:
            want = got
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert counter("capture.dynamic_replays") == 3


def test_a_data_read_breaks_the_capture_and_the_results_stay_eager():
    @lazy.compile(dynamic=True)
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # a sync inside: the function runs plainly
            return y + 1
        return y - 1

    for b in (3, 5):
        x = torch.randn(b, 2).abs()
        out = f(x.to("lazy"))
        assert type(out).__name__ == "LazyTensor"
        close(out, x * 2 + 1)
    assert counter("capture.dynamic_replays") == 0


def test_a_graph_that_differs_at_other_sizes_is_refused_with_the_node():
    """Note [Dynamic captures]: the graph rebuilt at other sizes must be the entry's node for node, read the same
    storages, or the call captures again; ``lazy.explain`` says where it differs."""
    from lazy.capture.dynamic import _same_graph
    from lazy.capture.finalize import Plan
    from lazy.ir.graph import linearize

    x, y = torch.randn(4, 3).to("lazy"), torch.randn(6, 3).to("lazy")
    recorded = linearize([((x * 2).sin())._lz_st.value])
    plan = Plan(recorded, [("storage", None)], [("const", 2.0)], [], {}, None)
    assert _same_graph(plan, linearize([((y * 2).sin())._lz_st.value]), [y._lz_st.value]) == []
    differs = _same_graph(plan, linearize([((y + 2).sin())._lz_st.value]), [y._lz_st.value])
    assert isinstance(differs, str) and "node 1" in differs and "aten.add" in differs
    elsewhere = _same_graph(plan, linearize([((y * 2).sin())._lz_st.value]), [x._lz_st.value])
    assert "another tensor" in elsewhere
    lazy.mark_step()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_size_builds_without_collections_and_leaves_the_collector_as_it_found_it(enabled, monkeypatch):
    """Note [No collections while a size builds]: the cyclic collector is off while a new size's graph builds, and
    on again after only where it was on; the results are eager's."""
    import gc

    from lazy.capture import dynamic
    seen = []
    inner = dynamic.Shapes._build
    monkeypatch.setattr(dynamic.Shapes, "_build", lambda self, *a: seen.append(gc.isenabled()) or inner(self, *a))
    ref = mlp().to(EAGER)
    model = copy.deepcopy(ref).to("lazy")

    @lazy.compile(dynamic=True)
    def predict(x):
        with torch.no_grad():
            return model(x)

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        for b in (4, 6, 9):
            x = torch.randn(b, 8)
            got = predict(x.to("lazy"))
            assert gc.isenabled() is enabled
            with torch.no_grad():
                close(got, ref(x.to(EAGER)))
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False] and counter("capture.dynamic_compiles") == 2
