"""Data parallelism on lazy tensors through torch.distributed (lazy/distributed).

In this process: a one-rank process group, to check how collectives are recorded (graph nodes, in order, in the
cache key) and what is refused. Across processes (tests/dist_worker.py, one process per rank, as torchrun starts
them, gloo on the cpu): every collective against its eager values, DDP and ``all_reduce_gradients`` training equal
to one process on the concatenated batch, a checkpoint of rank 0 loaded here, and the faults (ranks that record
different collectives, a rank that dies or hangs) ending in clear errors within the timeout.
"""
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import lazy
import lazy.distributed as ld
from lazy.cache import graph_cache
from lazy.debug import metrics
from lazy.device.tensor import LazyTensor
from lazy.distributed import collectives
from lazy.ir.graph import linearize
from lazy.trace.views import value

HERE = os.path.dirname(os.path.abspath(__file__))
L = "lazy"


# ---------------------------------------------------------------------------------------------------------------
# One rank, in this process

@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('dist')}/store"
    dist.init_process_group("lazy", init_method=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        lazy.mark_step()
        dist.destroy_process_group()


def test_lazy_backend_is_the_backing_devices(one_rank):
    assert dist.get_backend() == "lazy"
    backing = torch.device(lazy.config.backing_device).type
    assert one_rank._get_backend(torch.device(L)) is one_rank._get_backend(torch.device(backing))
    t = torch.ones(3)
    dist.all_reduce(t)  # cpu tensors run eagerly through the same group
    dist.barrier()
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_collective_is_a_node_run_at_the_sync(one_rank):
    x = torch.arange(4.0, device=L) * 2
    work = dist.all_reduce(x, async_op=True)
    assert work.wait() and metrics.counter("executed_graphs") == 0  # recorded, not run
    node = x._lz_st.value
    assert node.op is collectives.ALL_REDUCE and dict(node.kwargs) == {"group": one_rank.group_name, "reduce": "sum"}
    y = x + 1
    lazy.mark_step()
    assert metrics.counter("executed_graphs") == 1
    assert y.cpu().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_collectives_chain_in_recorded_order(one_rank):
    a, b = torch.ones(2, device=L), torch.ones(3, device=L)
    dist.all_reduce(a)
    dist.broadcast(b, src=0)
    first, second = a._lz_st.value, b._lz_st.value
    assert second.inputs[1] is first  # Note [Collectives run in recorded order]
    lazy.mark_step()
    lazy.wait_device_ops()
    assert collectives._LAST[0]._lz_st.value.is_data  # the broadcast's result, computed
    c = torch.ones(2, device=L)
    dist.all_reduce(c)
    assert len(c._lz_st.value.inputs) == 1  # once run, nothing is left to order against
    lazy.mark_step()


def test_graph_key_includes_collectives(one_rank):
    def step(kind):
        x = torch.ones(4, device=L) * 3
        if kind == "sum":
            dist.all_reduce(x)
        elif kind == "max":
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        else:
            dist.broadcast(x, src=0)
        lazy.mark_step()
        return x.cpu()

    step("sum")  # the previous collective (the token of the next: Note [Collectives run in recorded order]) of
    graph_cache.clear()  # every step below is then a float32[4]
    metrics.reset()
    for kind in ("sum", "max", "broadcast", "sum"):
        assert step(kind).tolist() == [3.0] * 4
    assert metrics.counter("compiles") == 3 and metrics.counter("graph_cache.hit") == 1


def test_compiled_graph_runs_collectives_as_externs(one_rank, cpu_backing):
    with lazy.config.override(compiler="cpp"):
        x = torch.randn(5, 3).to(L)
        y = (x * 2).relu()
        dist.all_reduce(y, op=dist.ReduceOp.AVG)
        z = y.sum(0)
        lazy.mark_step()
        assert graph_cache.latest().backend == "cpp"
        torch.testing.assert_close(z.cpu(), (x.cpu() * 2).relu().sum(0))


def test_unsupported_collectives_raise(one_rank):
    x = torch.ones(2, device=L)
    with pytest.raises(ld.UnsupportedCollective, match="not supported on lazy tensors"):
        dist.all_to_all_single(torch.empty(2, device=L), x)
    with pytest.raises(ld.UnsupportedCollective, match="PREMUL_SUM"):
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    with pytest.raises(ld.UnsupportedCollective, match="mixes lazy and cpu"):
        dist.all_gather_into_tensor(torch.empty(2, device=L), torch.ones(2))
    with pytest.raises(ld.UnsupportedCollective, match="avg"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64, device=L), op=dist.ReduceOp.AVG)
    lazy.mark_step()


def test_all_reduce_gradients_is_one_coalesced_node(one_rank):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).to(L)
    model(torch.randn(2, 4).to(L)).sum().backward()
    want = [p.grad.cpu() for p in model.parameters()]
    ld.all_reduce_gradients(model)
    order = linearize([value(p.grad) for p in model.parameters()]).order
    found = [n for n in order if n.op in collectives.OPS]
    assert [n.op for n in found] == [collectives.ALL_REDUCE_COALESCED] and dict(found[0].kwargs)["count"] == 4
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad.cpu(), w)
    assert isinstance(model[0].weight.grad, LazyTensor)


@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_buckets_are_all_reduced_without_copies(one_rank, as_view):
    """DDP's Reducer on lazy tensors: its bucket views are slices, not the layout-aware as_strided ops that copy the
    whole bucket per view, and each bucket is all-reduced as one ALL_REDUCE_CONCAT of the gradients written into it
    (Note [All-reduce of a buffer written in pieces]); the gradients are eager's."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    from lazy.ir.ops import AS_STRIDED, AS_STRIDED_SCATTER
    sys.path.insert(0, HERE)
    from models import MLP
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(L)
    # a small cap: the buckets rebuilt after the first backward are several (the first one is 1 MiB)
    ddp = DDP(model, bucket_cap_mb=0.002, gradient_as_bucket_view=as_view)
    lazy.mark_step()  # DDP's broadcast of the parameters
    for step in range(2):
        x = torch.randn(6, 20)
        for p, q in zip(model.parameters(), eager.parameters()):
            p.grad = q.grad = None
        ddp(x.to(L)).square().mean().backward()
        eager(x).square().mean().backward()
        ops = [n.op for n in linearize([value(p.grad) for p in model.parameters()]).order]
        assert not {AS_STRIDED, AS_STRIDED_SCATTER, torch.ops.aten.slice_scatter.default} & set(ops)
        buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
        assert [op for op in ops if op in collectives.OPS] == [collectives.ALL_REDUCE_CONCAT] * buckets
        assert buckets == (1 if step == 0 else 2)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad)
        lazy.mark_step()


@pytest.mark.parametrize("between", [False, True], ids=["in-graph", "between-pieces"])
def test_captured_ddp_step_under_reduce_overhead_trains_as_eager(one_rank, monkeypatch, between):
    """Note [Collectives in a CUDA graph]: a DDP step under lazy.compile(mode="reduce-overhead") replays with its
    collectives and trains as eager does; on cuda over one rank as one CUDA graph, and (``between``, as over more
    ranks) as graphed pieces with the all-reduce launched between them."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    from lazy.runtime import cuda_graph
    if between:
        monkeypatch.setattr(cuda_graph, "_ranks", lambda: 2)
    sys.path.insert(0, HERE)
    from models import MLP
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager).to(L)
    ddp = DDP(model)
    lazy.mark_step()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, eager)]

    def train(net, opt, x):
        loss = net(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    def step(net, opt, x):  # compiled itself (Note [Compiled functions are themselves]): eager calls ``train``
        return train(net, opt, x)

    compiled = lazy.compile(step, mode="reduce-overhead")
    metrics.reset()
    cuda = lazy.config.backing_device.startswith("cuda")
    try:
        for i in range(6):
            x = torch.randn(6, 20, generator=torch.Generator().manual_seed(i))
            with lazy.config.override(compiler="triton" if cuda else lazy.config.compiler):  # its kernels at once
                got = compiled(ddp, opts[0], x.to(L))
            torch.testing.assert_close(got.cpu(), train(eager, opts[1], x), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)
        assert metrics.counter("capture.replays") >= 2
        if cuda:
            assert metrics.counter("cuda_graph.replays") >= 1
            assert (metrics.counter("cuda_graph.pieces") >= 2) == between
    finally:
        lazy.compile.reset()


def test_all_reduce_of_a_buffer_written_in_pieces(one_rank):
    """Note [All-reduce of a buffer written in pieces]: blocks no write reached come from the value under the writes;
    overlapping writes keep the plain all-reduce of the chain."""
    def writes(x, blocks):
        for k, (shape, offset) in enumerate(blocks):
            x.as_strided(shape, (shape[1], 1) if len(shape) == 2 else (1,), offset).mul_(k + 2)
        return x

    blocks = [((3,), 0), ((2, 2), 5)]  # [0, 3) and [5, 9): [3, 5) and [9, 10) keep their values
    flat = writes(torch.arange(10.0, device=L), blocks)
    dist.all_reduce(flat)
    node = flat._lz_st.value
    assert node.op is collectives.ALL_REDUCE_CONCAT and dict(node.kwargs)["count"] == 4
    torch.testing.assert_close(flat.cpu(), writes(torch.arange(10.0), blocks))
    overlapping = [((4,), 0), ((2, 2), 2)]
    flat = writes(torch.arange(10.0, device=L), overlapping)
    dist.all_reduce(flat)
    assert flat._lz_st.value.op is collectives.ALL_REDUCE
    torch.testing.assert_close(flat.cpu(), writes(torch.arange(10.0), overlapping))


def test_functional_coalesced_and_inplace_forms(one_rank):
    import torch.distributed._functional_collectives as funcol
    a, b = torch.arange(3.0, device=L), torch.ones(2, 2, device=L)
    ra, rb = funcol.all_reduce_coalesced([a, b], "sum", one_rank)
    c = torch.full((2,), 5.0, device=L)
    torch.ops._c10d_functional.all_reduce_(c, "max", one_rank.group_name)
    d = torch.ones(2, dtype=torch.int32, device=L)
    dist.all_reduce_coalesced([d, torch.zeros(1, dtype=torch.int32, device=L)])
    lazy.mark_step()
    assert ra.cpu().tolist() == [0.0, 1.0, 2.0] and rb.cpu().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert c.cpu().tolist() == [5.0, 5.0] and d.cpu().tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------------------------
# Several processes

def _ranks_fit() -> bool:
    return not lazy.config.backing_device.startswith("cuda") or torch.cuda.device_count() >= 2


needs_ranks = pytest.mark.skipif(not _ranks_fit(), reason="one GPU per rank: a cuda backing device needs 2 GPUs")
gloo_only = pytest.mark.skipif(lazy.config.backing_device.startswith("cuda"),
                               reason="fault handling is gloo's; NCCL's watchdog aborts the process instead")


def launch(scenario: str, tmp_path, world: int = 2, timeout_s: float = 20, wait_s: float = 240) -> list:
    """Run tests/dist_worker.py SCENARIO as ``world`` processes; returns (returncode, output) per rank."""
    env = dict(os.environ, WORLD_SIZE=str(world), LAZY_DIST_INIT=f"file://{tmp_path}/store",
               LAZY_DIST_TIMEOUT=str(timeout_s), LAZY_DIST_OUT=str(tmp_path), OMP_NUM_THREADS="1",
               LAZY_CACHE_DIR=lazy.config.cache_dir or "", PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "dist_worker.py"), scenario],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    deadline = time.monotonic() + wait_s
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{scenario}: a rank hung for {wait_s} s") from None
        results.append((p.returncode, out))
    return results


def _passes(output: str) -> set:
    return {line[5:] for line in output.splitlines() if line.startswith("PASS ")}


@needs_ranks
def test_two_ranks_train_like_one_process(tmp_path):
    results = launch("train", tmp_path)
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{out}"
        assert _passes(out) == {"collectives", "ddp mlp sgd", "explicit mlp adamw"}, out
    # rank 0's checkpoint loads in a plain process, without lazy types, and holds the trained parameters
    state = torch.load(tmp_path / "rank0.pt")
    assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in state.values())
    sys.path.insert(0, HERE)
    import dist_worker
    _, want = dist_worker.reference("mlp", "adamw")
    model = dist_worker.make("mlp")
    model.load_state_dict(state)
    for name, got in model.state_dict().items():
        torch.testing.assert_close(got, want[name], rtol=1e-4, atol=1e-5)


@needs_ranks
def test_captured_ddp_steps_equal_eager_ddp(tmp_path):
    for rank, (code, out) in enumerate(launch("capture", tmp_path)):
        assert code == 0, f"rank {rank}:\n{out}"
        assert _passes(out) == {"captured ddp mlp adamw"}, out


@needs_ranks
def test_graphed_ddp_steps_equal_eager_ddp(tmp_path):
    """Note [Collectives in a CUDA graph]: over two ranks (on cuda: graphed pieces with the all-reduces between
    them), a captured step under mode="reduce-overhead" and a plain mark_step loop train as eager DDP does."""
    for rank, (code, out) in enumerate(launch("graphed", tmp_path)):
        assert code == 0, f"rank {rank}:\n{out}"
        assert _passes(out) == {"captured ddp mlp adamw reduce-overhead", "ddp mlp adamw"}, out


@pytest.mark.slow
@needs_ranks
def test_captured_ddp_gpt(tmp_path):
    for rank, (code, out) in enumerate(launch("capture_more", tmp_path)):
        assert code == 0, f"rank {rank}:\n{out}"
        assert _passes(out) == {"captured ddp gpt adamw",
                                 "captured ddp mlp sgd find_unused_parameters"}, out


@gloo_only
def test_faults_end_in_clear_errors(tmp_path):
    results = launch("faults", tmp_path, timeout_s=5)
    (code0, out0), (code1, out1) = results
    assert code0 == 0 and _passes(out0) == {"mismatch", "dead rank"}, out0
    assert code1 == 3 and _passes(out1) == {"mismatch"}, out1
    assert "lazy.distributed: all_reduce(sum) on process group" in out0


@pytest.mark.slow
@needs_ranks
def test_two_ranks_gpt_and_reference_executor(tmp_path):
    for rank, (code, out) in enumerate(launch("train_more", tmp_path)):
        assert code == 0, f"rank {rank}:\n{out}"
        assert _passes(out) == {"ddp gpt adamw", "explicit gpt sgd", "ddp mlp adamw"}, out


@pytest.mark.slow
@gloo_only
def test_hung_rank_times_out(tmp_path):
    (code0, out0), _ = launch("hung", tmp_path, timeout_s=4)
    assert code0 == 0 and _passes(out0) == {"hung rank"}, out0


@pytest.mark.slow
@needs_ranks
def test_train_gpt_example_under_torchrun():
    """`torchrun --nproc_per_node=2 examples/train_gpt.py --ddp`: trains, and only rank 0 prints."""
    env = dict(os.environ, OMP_NUM_THREADS="1", LAZY_CACHE_DIR=lazy.config.cache_dir or "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(HERE, "..", "examples", "train_gpt.py"), "--ddp", "--steps", "4", "--log-every", "2",
           "--sample-chars", "3", "--layers", "1", "--block", "16", "--batch", "4"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("model:") for line in lines) == 1 and "x 2 ranks" in proc.stdout
    assert sum(line.startswith("step ") for line in lines) == 3  # steps 0, 2, 3: printed by rank 0 alone
    assert sum(line.startswith("done:") for line in lines) == 1
