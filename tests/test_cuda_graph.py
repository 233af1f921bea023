"""CUDA-graph replay (lazy/runtime/cuda_graph.py): ``lazy.compile(mode="reduce-overhead")`` with the Triton backend.

On the cpu backing device the same program (scalars read from device memory, Note [Scalars in device memory]) runs
under Triton's interpreter without a graph; with LAZY_BACKING_DEVICE=cuda the replays are CUDA graphs, and the tests
check they happen, that what they write in place is never read by anything else, and that results equal eager's.
"""
import pytest
import torch

import lazy
from lazy.debug import metrics

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("triton_compiler")
DEVICE = lazy.config.backing_device
CUDA = torch.device(DEVICE).type == "cuda"
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a cuda backing device")


def _train(device, steps, compiled, kind="mlp"):
    from models import MLP, batch, loss_fn

    torch.manual_seed(0)
    model = MLP().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)

    def step(x, y):
        loss = loss_fn(kind, model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        return loss.detach()

    if compiled:
        step = lazy.compile(step, mode="reduce-overhead")
    losses = []
    for i in range(steps):
        x, y = batch(kind, i, "cpu")
        losses.append(step(x.to(device), y.to(device)))
        if device == "lazy" and not compiled:  # the plain mark_step loop
            lazy.mark_step()
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    moments = [s["exp_avg_sq"].cpu() for s in opt.state.values()]
    return torch.stack([loss.cpu() for loss in losses]), state, moments


def test_reduce_overhead_training_steps_equal_eager():
    """AdamW and a cosine schedule (captured twice: before and after the optimizer state exists): bias corrections
    and the learning rate change every step, so the kernels' scalars must be read at each run, not baked in."""
    metrics.reset()
    want_losses, want, want_m = _train(DEVICE, 8, compiled=False)
    got_losses, got, got_m = _train("lazy", 8, compiled=True)
    assert metrics.counter("capture.replays") == 6 and metrics.counter("compile_fallback") == 0
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-4, atol=1e-5)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    for g, w in zip(got_m, want_m):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    if CUDA:
        assert metrics.counter("cuda_graph.captures") == 1
        assert metrics.counter("cuda_graph.replays") >= 5 and metrics.counter("cuda_graph.recaptures") == 0


def test_program_reads_its_scalars_from_memory():
    from lazy.runtime.triton import Program

    @lazy.compile(mode="reduce-overhead")
    def f(x, a):
        return (x * a + 1.5).sin()

    x = torch.randn(64, device=DEVICE)
    for a in (0.3, 0.7, 2.9, 1.3):  # a runtime scalar: one capture, replays with new values
        torch.testing.assert_close(f(x.to("lazy"), a).cpu(), (x * a + 1.5).sin().cpu())
    assert metrics.counter("capture.captures") == 1 and metrics.counter("capture.replays") == 3
    programs = [p for p in _programs(f) if isinstance(getattr(p, "program", p), Program)]
    assert programs and all(getattr(p, "program", p).scalar_memory for p in programs)
    assert "tl.load(SF + " in getattr(programs[-1], "program", programs[-1]).source


def test_scalars_upload_packed_as_the_kernels_read_them():
    """Note [Uploads in C]: float slots as doubles, int slots as int64 (an integral float through int(), as
    Python's int() takes it), pads as 0, in one stream-ordered copy to the device buffer."""
    scalars = (0.25, 7, True, 3.0, -2, 1e300)
    slots = (0, 1, 5, -1, 1, 3, 4, 2, -1)  # four doubles (one a pad), then five int64s (one a pad)
    buf = torch.full((len(slots),), -9, dtype=torch.int64, device=DEVICE)
    lazy._C.upload_scalars(buf, scalars, slots, 4)
    got = buf.cpu()
    assert got[:4].view(torch.float64).tolist() == [0.25, 7.0, 1e300, 0.0]
    assert got[4:].tolist() == [7, 3, -2, 1, 0]
    with pytest.raises(IndexError):
        lazy._C.upload_scalars(buf, scalars[:2], slots, 4)
    with pytest.raises(ValueError):
        lazy._C.upload_scalars(buf[:3], scalars, slots, 4)


def _programs(fn):
    from lazy.capture.function import state_of
    return [e.program for e in state_of(fn).entries if e.program is not None]


@cuda_only
def test_ir_recorded_between_replays_keeps_the_values_it_read():
    """A replay writes parameters in place into the graph's buffers: lazy IR recorded between two calls that still
    reads the old values makes the next call run without the graph (Note [CUDA-graph replay])."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, device="lazy")
    opt = torch.optim.SGD([w.requires_grad_()], lr=0.1)

    @lazy.compile(mode="reduce-overhead")
    def step(x):
        loss = (x @ w).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    x = torch.randn(8, 16, device="lazy")
    for _ in range(4):
        step(x)
    assert metrics.counter("cuda_graph.replays") >= 1
    before = w.detach().cpu()
    snapshot = w.detach() * 1  # recorded, not run: it reads the leaf the last replay bound
    unsafe = metrics.counter("cuda_graph.unsafe_runs")
    step(x)
    assert metrics.counter("cuda_graph.unsafe_runs") == unsafe + 1
    torch.testing.assert_close(snapshot.cpu(), before)
    assert not torch.equal(w.detach().cpu(), before)
    replays = metrics.counter("cuda_graph.replays")
    step(x)
    step(x)
    assert metrics.counter("cuda_graph.replays") > replays  # nothing holds the old values any more


@cuda_only
def test_new_gradients_reuse_dead_copies_and_held_ones_keep_their_values():
    """Note [CUDA-graph replay]: the gradients a step leaves are copied out of the graph into the copies of two steps
    before where nothing references them any more; one the caller holds keeps its values."""
    torch.manual_seed(0)
    w0 = torch.randn(16, 16)
    xs = [torch.randn(8, 16) for _ in range(8)]
    w = w0.to("lazy").requires_grad_()

    @lazy.compile(mode="reduce-overhead")
    def step(x):
        w.grad = None
        (x @ w).square().mean().backward()

    held = None
    for i, x in enumerate(xs):
        step(x.to("lazy"))
        if i == 4:
            held = w.grad
    assert metrics.counter("cuda_graph.replays") >= 4 and metrics.counter("cuda_graph.reused_outputs") >= 1

    def grad_of(x):
        v = w0.to(DEVICE).requires_grad_()
        (x.to(DEVICE) @ v).square().mean().backward()
        return v.grad.cpu()

    torch.testing.assert_close(held.cpu(), grad_of(xs[4]))
    torch.testing.assert_close(w.grad.cpu(), grad_of(xs[-1]))


@cuda_only
def test_returned_tensors_outlive_the_next_replay():
    @lazy.compile(mode="reduce-overhead")
    def f(x, a):
        return x * a

    x = torch.ones(4, device="lazy")
    values = [0.3 + 1.1 * i for i in range(5)]  # runtime scalars (not guarded by value)
    outs = [f(x, v) for v in values]
    assert metrics.counter("cuda_graph.replays") >= 2
    for v, o in zip(values, outs):
        torch.testing.assert_close(o.cpu(), torch.full((4,), v))


@cuda_only
def test_random_ops_run_without_a_graph():
    from lazy.runtime.cuda_graph import GraphedProgram

    @lazy.compile(mode="reduce-overhead")
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + 1

    x = torch.ones(1000, device="lazy")
    draws = [f(x).cpu() for _ in range(4)]
    assert not torch.equal(draws[-1], draws[-2])
    assert all(((d == 1) | (d == 3)).all() for d in draws)
    programs = [p for p in _programs(f) if isinstance(p, GraphedProgram)]
    assert programs and all(p.disabled for p in programs) and metrics.counter("cuda_graph.replays") == 0


def test_which_programs_a_graph_can_replay():
    """Random ops keep a program off CUDA graphs; attention that draws nothing and collectives do not."""
    from types import SimpleNamespace

    from lazy.runtime.cuda_graph import ungraphable

    def program(*names):
        return SimpleNamespace(externs_by_op={n: 1 for n in names})

    assert ungraphable(program("aten.mm.default", "unseeded[aten._scaled_dot_product_efficient_attention]")) is None
    assert "seeded[aten.native_dropout" in ungraphable(program("aten.mm.default", "seeded[aten.native_dropout]"))
    assert ungraphable(program("aten.mm.default", "lazy.c10d_all_reduce")) is None
    assert "seeded[" in ungraphable(program("lazy.c10d_all_reduce", "seeded[aten.native_dropout]"))


@pytest.mark.parametrize("optional", [False, True])
def test_collectives_stay_in_the_graph_over_one_rank_only(monkeypatch, optional):
    """Note [Collectives in a CUDA graph]: over one rank a program's collectives stay in its graph; over more ranks
    the graph stops at each of them (pieces), for a captured step's program and a cached mark_step program alike."""
    from types import SimpleNamespace

    from lazy.runtime import cuda_graph

    program = SimpleNamespace(externs_by_op={"aten.mm.default": 1, "lazy.c10d_all_reduce": 1}, device=None)
    plain = SimpleNamespace(externs_by_op={"aten.mm.default": 1}, device=None)
    one = cuda_graph.GraphedProgram(program, {}, set(), [], optional=optional)
    assert one.disabled is None and not one.between
    monkeypatch.setattr(cuda_graph, "_ranks", lambda: 2)
    two = cuda_graph.GraphedProgram(program, {}, set(), [], optional=optional)
    assert two.disabled is None and two.between
    assert not cuda_graph.GraphedProgram(plain, {}, set(), [], optional=optional).between


def test_a_replay_overwrites_static_memory_only_when_nothing_else_reads_it():
    """Note [CUDA-graph replay]: the reference-count check behind ``cuda_graph.unsafe_runs``, without a GPU: a data
    leaf bound to static memory may be overwritten while only its storage holds it, not while recorded IR does."""
    from types import SimpleNamespace

    from lazy.runtime.cuda_graph import GraphedProgram

    static = torch.zeros(4)
    graphed = GraphedProgram(SimpleNamespace(externs_by_op={}), {}, {0}, [False])
    graphed.static_ids = {id(static)}
    p = torch.ones(4, device="lazy")
    lazy.mark_step()

    def bind(out):  # what a replay's writes do (lazy/capture/replay.py's _write_bound)
        if lazy._C.replay_writes((p,), [out], (0,)):
            graphed.bound((p,), [out], (0,))

    bind(static)
    assert graphed._overwritable()  # bound to its storage only
    leaf, version = p._lz_st.value, p._lz_st.version
    bind(static)  # written in place again: the same leaf, a new version (Note [Rebinding written in place])
    assert p._lz_st.value is leaf and p._lz_st.version == version + 1 and len(graphed.outstanding) == 1
    del leaf
    reader = p * 2  # recorded, not run: it reads the leaf over static memory
    assert not graphed._overwritable()
    del reader
    assert graphed._overwritable()
    bind(static)
    bind(torch.zeros(4))  # the storage moved on (a run without the graph): not remembered
    assert len(graphed.outstanding) == 1 and graphed._overwritable() and not graphed.outstanding


def test_max_autotune_replays_with_more_block_sizes(monkeypatch):
    """mode="max-autotune": the program of reduce-overhead (CUDA graphs on cuda), its kernels rendered with the wider
    set of block sizes (Note [Tuned block sizes]), pointwise kernels included; results equal eager's."""
    from lazy.codegen import triton_blocks
    monkeypatch.setattr(triton_blocks, "TUNE_MIN_WORK", 0)

    @lazy.compile(mode="max-autotune")
    def f(x):
        return x.softmax(-1) * 2 + x.sin()

    x = torch.randn(32, 48, device=DEVICE)
    metrics.reset()
    for _ in range(4):
        torch.testing.assert_close(f(x.to("lazy")).cpu(), (x.softmax(-1) * 2 + x.sin()).cpu())
    program = _programs(f)[-1]
    program = getattr(program, "program", program)
    assert program.scalar_memory and min(len(vs) for vs in program.variants) > 1
    if CUDA:
        assert metrics.counter("cuda_graph.replays") >= 1 and metrics.counter("triton.tuned_kernels") >= 1


@cuda_only
@pytest.mark.parametrize("graphs", [True, False])
def test_a_mark_step_loop_replays_its_cached_program_as_a_cuda_graph(graphs):
    """Note [CUDA graphs for cached programs]: the plain loop's step program is captured at its second compiled
    run and replayed from the third, with the bias corrections and the scheduled learning rate read at each run;
    the losses kept from every step (outputs copied out of the graph's memory) equal eager's."""
    want_losses, want, _ = _train(DEVICE, 8, compiled=False)
    metrics.reset()
    with lazy.config.override(cuda_graphs=graphs):
        got_losses, got, _ = _train("lazy", 8, compiled=False)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-4, atol=1e-5)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    if graphs:
        assert metrics.counter("cuda_graph.captures") >= 1 and metrics.counter("cuda_graph.replays") >= 4
    else:
        assert metrics.counter("cuda_graph.captures") == 0 and metrics.counter("cuda_graph.replays") == 0


def _layers(x, w):
    for act in (torch.tanh, torch.sigmoid, torch.relu):  # 3 matmuls and 3 kernels: a program worth a graph
        x = act(x @ w)
    return x


def test_which_cached_programs_are_graphed():
    """A graph's replay copies its inputs and outputs: worth it for many launches, not for a few large kernels."""
    from lazy.runtime.cuda_graph import COPY_BYTES_PER_STEP, GRAPH_MIN_STEPS, graph_pays

    assert graph_pays(300, 300 << 20)                       # a training step: 300 launches, 300 MB copied
    assert not graph_pays(GRAPH_MIN_STEPS - 1, 4096)        # a kernel or two: a launch is as cheap
    assert not graph_pays(GRAPH_MIN_STEPS, COPY_BYTES_PER_STEP * GRAPH_MIN_STEPS + 1)  # memory-bound kernels


@cuda_only
def test_a_program_not_worth_a_graph_keeps_its_scalars_as_arguments():
    """A single kernel of many runtime scalars is not graphed, and so does not load its scalars from memory."""
    from lazy.cache import graph_cache

    x = torch.randn(64, 64, device="lazy")
    for _ in range(3):
        y = x
        for i in range(20):
            y = (y * (1.0 + i / 100)).sin()
        lazy.mark_step()
    program = graph_cache.latest()
    assert not getattr(program, "scalar_memory", True) and metrics.counter("cuda_graph.captures") == 0


@cuda_only
def test_a_cached_program_graph_copies_inputs_that_change_and_keeps_outputs_apart():
    """The same weight leaf at every call is copied once; a new one (an in-place update binds a new leaf) is copied
    again; results held from earlier calls keep their values after later replays."""
    w = torch.randn(32, 32, device="lazy")
    lazy.mark_step()
    xs = [torch.randn(8, 32) for _ in range(6)]
    outs, wants = [], []
    for i, x in enumerate(xs):
        if i == 4:
            w.mul_(0.5)  # recorded into this step's graph: another graph, then the same one again
        outs.append(_layers(x.to("lazy"), w))
        lazy.mark_step()
        wants.append(_layers(x, w.cpu()))
    assert metrics.counter("cuda_graph.replays") >= 1
    for o, want in zip(outs, wants):
        torch.testing.assert_close(o.cpu(), want, rtol=1e-4, atol=1e-5)


def test_the_inputs_a_graph_run_copies():
    """GraphedProgram._copy_inputs (csrc/replay_io.cpp's stale_inputs): an input is copied into its static buffer
    unless it is that buffer or the tensor copied there at the last run (held by a weak reference only)."""
    static = [torch.zeros(2), torch.zeros(2), torch.zeros(2)]
    a, b = torch.ones(2), torch.full((2,), 2.0)
    seen = [None] * 3
    dst, src = lazy._C.stale_inputs([static[0], a, b], static, seen)
    assert dst == [static[1], static[2]] and src[0] is a and src[1] is b
    assert seen[0] is None and seen[1]() is a and seen[2]() is b
    c = torch.full((2,), 3.0)
    dst, src = lazy._C.stale_inputs([static[0], a, c], static, seen)  # a again: not copied; c new
    assert dst == [static[2]] and src[0] is c and seen[2]() is c
    del c  # dead: its reference no longer names it, so a tensor at its address later is copied
    dst, src = lazy._C.stale_inputs((static[0], a, torch.full((2,), 4.0)), static, seen)
    assert len(dst) == 1 and dst[0] is static[2] and seen[2]() is src[0]
