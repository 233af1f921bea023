"""One rank of the multi-process tests of tests/test_distributed.py: ``python tests/dist_worker.py SCENARIO``.

The test starts one process per rank (as torchrun would) with RANK, WORLD_SIZE, LAZY_DIST_INIT (a ``file://``
rendezvous), LAZY_DIST_TIMEOUT (seconds) and LAZY_DIST_OUT (a directory for checkpoints) in the environment; each
scenario checks its results against eager single-process training, raises on a mismatch, and prints ``PASS <what>``
lines that the test looks for.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS, batch  # noqa: E402

import lazy  # noqa: E402
import lazy.distributed as ld  # noqa: E402
from lazy.debug import metrics  # noqa: E402

RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "2"))
STEPS = 4


def init(backend: str = "lazy") -> None:
    if lazy.config.backing_device.startswith("cuda"):  # one GPU per rank, as under torchrun
        lazy.config.backing_device = f"cuda:{RANK}"
        torch.cuda.set_device(RANK)
    dist.init_process_group(backend, init_method=os.environ["LAZY_DIST_INIT"], rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=float(os.environ.get("LAZY_DIST_TIMEOUT", "20"))))


def passed(what: str) -> None:
    print(f"PASS {what}", flush=True)


def loss_of(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a plain mean over the batch: the mean of the shards' losses is then the loss of the whole batch
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def make(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[kind]()


def optimizer(name: str, params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9) if name == "sgd" else torch.optim.AdamW(params, lr=0.01)


def reference(kind: str, opt_name: str) -> tuple:
    """One process, eager, on the concatenated batch: losses and final parameters."""
    model = make(kind)
    opt = optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(kind, step, size=4 * WORLD)
        loss = loss_of(kind, model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def data_parallel(kind: str, opt_name: str, how: str) -> tuple:
    """This rank's shard of each batch, on lazy tensors, with DDP or all_reduce_gradients; the losses of the whole
    batch (the mean of the ranks' losses) and the final parameters."""
    model = make(kind).to("lazy")
    net = DDP(model) if how == "ddp" else model
    opt = optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(kind, step, size=4 * WORLD)
        x, y = x.chunk(WORLD)[RANK].to("lazy"), y.chunk(WORLD)[RANK].to("lazy")
        loss = loss_of(kind, net(x), y)
        opt.zero_grad()
        loss.backward()
        if how == "explicit":
            ld.all_reduce_gradients(opt)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # recorded into the step's graph too
        syncs = metrics.counter("sync.mark_step") + metrics.counter("sync.cpu") + metrics.counter("sync.item")
        lazy.mark_step()
        if step == STEPS - 1:  # settled: the whole step, collectives included, is one graph and one sync
            assert metrics.counter("sync.mark_step") + metrics.counter("sync.cpu") + \
                metrics.counter("sync.item") == syncs + 1
        losses.append(mean.item())
    return losses, model


# The attention's key bias has an exact gradient of zero: its computed gradient is rounding noise, which AdamW
# divides by its own running RMS, so two correct summation orders (one batch, or shards averaged) move it apart by up
# to lr per step (GRADIENT_FREE in tests/test_training.py says more). It is held to that bound.
GRADIENT_FREE = {"gpt": {"blocks.0.qkv.bias": slice(16, 32)}}


def check_training(kind: str, opt_name: str, how: str) -> torch.nn.Module:
    want_losses, want_state = reference(kind, opt_name)
    got_losses, model = data_parallel(kind, opt_name, how)
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    free = GRADIENT_FREE.get(kind, {}) if opt_name == "adamw" else {}
    for name, value in model.state_dict().items():
        got, want = value.cpu(), want_state[name]
        if name in free:
            torch.testing.assert_close(got[free[name]], want[free[name]], rtol=0, atol=0.01 * STEPS)
            got[free[name]] = want[free[name]]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    passed(f"{how} {kind} {opt_name}")
    return model


def ddp_steps(kind: str, opt_name: str, device: str, steps: int, compiled: bool, mode: str = "default",
              **ddp_options) -> tuple:
    """``steps`` DDP training steps on this rank's shard of each batch, on ``device``; with ``compiled`` the step
    (forward, backward, optimizer step, zero_grad) is a ``lazy.compile``d function. This rank's losses and final
    parameters."""
    model = make(kind).to(device)
    net = DDP(model, **ddp_options)
    opt = optimizer(opt_name, model.parameters())

    def step(x, y):
        loss = loss_of(kind, net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    if compiled:
        step = lazy.compile(step, mode=mode)
    losses = []
    for i in range(steps):
        x, y = batch(kind, i, size=4 * WORLD)
        loss = step(x.chunk(WORLD)[RANK].to(device), y.chunk(WORLD)[RANK].to(device))
        if device == "lazy":
            lazy.mark_step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}, step


def check_captured_ddp(kind: str, opt_name: str, mode: str = "default", **ddp_options) -> None:
    """Captured DDP steps (lazy.compile) equal eager DDP's, step for step: the replays run the gradient all-reduces.
    The first two calls run plainly (the optimizer creates its state; DDP rebuilds its buckets: Note [DDP's bucket
    rebuild breaks once] in lazy/capture/method_models.py, unless it looks for unused parameters, then it never
    rebuilds), the next one captures, the rest replay."""
    steps = 6
    want_losses, want_state, _ = ddp_steps(kind, opt_name, "cpu", steps, compiled=False, **ddp_options)
    replays = metrics.counter("capture.replays")
    got_losses, got_state, step = ddp_steps(kind, opt_name, "lazy", steps, compiled=True, mode=mode,
                                            **ddp_options)
    plain = 1 if ddp_options.get("find_unused_parameters") else 2
    assert metrics.counter("capture.replays") - replays == steps - plain - 1, lazy.explain(step)
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-5)
    free = GRADIENT_FREE.get(kind, {}) if opt_name == "adamw" else {}
    for name, got in got_state.items():
        want = want_state[name]
        if name in free:
            torch.testing.assert_close(got[free[name]], want[free[name]], rtol=0, atol=0.01 * steps)
            got[free[name]] = want[free[name]]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    passed(" ".join(["captured ddp", kind, opt_name] + sorted(ddp_options) + ([mode] if mode != "default" else [])))


def check_collectives() -> None:
    """Each collective on lazy tensors against the values eager gloo computes, all in one graph."""
    import torch.distributed._functional_collectives as funcol
    before = metrics.counter("executed_graphs")
    a = torch.arange(6.0, device="lazy").view(2, 3) * (RANK + 1)
    dist.all_reduce(a)
    m = torch.full((3,), float(RANK), device="lazy")
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    g = torch.empty(2 * WORLD, device="lazy")
    dist.all_gather_into_tensor(g, torch.tensor([RANK, 10.0 * RANK], device="lazy"))
    parts = [torch.empty(2, device="lazy") for _ in range(WORLD)]
    dist.all_gather(parts, torch.full((2,), RANK + 0.5, device="lazy"))
    rs = torch.empty(2, device="lazy")
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * WORLD, device="lazy") + RANK)
    b = torch.full((4,), float(RANK), device="lazy")
    dist.broadcast(b, src=WORLD - 1)
    f = funcol.all_reduce(torch.ones(3, device="lazy") * RANK, "sum", dist.group.WORLD)
    fg = funcol.all_gather_tensor(torch.full((1, 2), float(RANK), device="lazy"), 0, dist.group.WORLD)
    fr = funcol.reduce_scatter_tensor(torch.arange(2.0 * WORLD, device="lazy"), "avg", 0, dist.group.WORLD)
    view = torch.zeros(3, 4, device="lazy")
    dist.all_reduce(view[1])  # a view: the result is written through to its base
    view[1] += RANK + 1
    dist.all_reduce(view[1])
    lazy.mark_step()
    assert metrics.counter("executed_graphs") == before + 1, "the collectives did not run as one graph"
    ranks = torch.arange(WORLD, dtype=torch.float32)
    total = float(sum(range(1, WORLD + 1)))
    torch.testing.assert_close(a.cpu(), torch.arange(6.0).view(2, 3) * total)
    torch.testing.assert_close(m.cpu(), torch.full((3,), WORLD - 1.0))
    torch.testing.assert_close(g.cpu(), torch.stack([ranks, 10 * ranks], 1).reshape(-1))
    torch.testing.assert_close(torch.stack([p.cpu() for p in parts]), (ranks + 0.5)[:, None].expand(WORLD, 2))
    full = (torch.arange(2.0 * WORLD) * WORLD + ranks.sum())
    torch.testing.assert_close(rs.cpu(), full[2 * RANK: 2 * RANK + 2])
    torch.testing.assert_close(b.cpu(), torch.full((4,), WORLD - 1.0))
    torch.testing.assert_close(f.cpu(), torch.full((3,), ranks.sum().item()))
    torch.testing.assert_close(fg.cpu(), ranks[:, None].expand(WORLD, 2))
    torch.testing.assert_close(fr.cpu(), torch.arange(2.0 * WORLD)[2 * RANK: 2 * RANK + 2])
    torch.testing.assert_close(view.cpu(), torch.zeros(3, 4).index_fill_(0, torch.tensor([1]), total))
    passed("collectives")


def scenario_train() -> None:
    init()
    check_collectives()
    check_training("mlp", "sgd", "ddp")
    model = check_training("mlp", "adamw", "explicit")
    if RANK == 0:  # a checkpoint of rank 0, for the test to load in a single process
        torch.save(model.state_dict(), os.path.join(os.environ["LAZY_DIST_OUT"], "rank0.pt"))
    dist.barrier()
    dist.destroy_process_group()


def scenario_capture() -> None:
    init()
    check_captured_ddp("mlp", "adamw")
    dist.destroy_process_group()


def scenario_graphed() -> None:
    """Note [Collectives in a CUDA graph]: on cuda, a captured step and a cached mark_step program replay as graphed
    pieces with their all-reduces launched between them (on the cpu, the same training without graphs)."""
    init()
    cuda = lazy.config.backing_device.startswith("cuda")
    with lazy.config.override(compiler="triton" if cuda else lazy.config.compiler):  # kernels at the first run
        for check in (lambda: check_captured_ddp("mlp", "adamw", mode="reduce-overhead"),
                      lambda: check_training("mlp", "adamw", "ddp")):
            pieces, replays = metrics.counter("cuda_graph.pieces"), metrics.counter("cuda_graph.replays")
            check()
            if cuda:
                assert metrics.counter("cuda_graph.pieces") - pieces >= 2, metrics.counter("cuda_graph.pieces")
                assert metrics.counter("cuda_graph.replays") > replays
    dist.destroy_process_group()


def scenario_capture_more() -> None:
    init()
    check_captured_ddp("gpt", "adamw")
    check_captured_ddp("mlp", "sgd", find_unused_parameters=True)
    dist.destroy_process_group()


def scenario_train_more() -> None:
    init("cpu:gloo,lazy:lazy")
    check_training("gpt", "adamw", "ddp")
    check_training("gpt", "sgd", "explicit")
    with lazy.config.override(compiler="reference"):
        check_training("mlp", "adamw", "ddp")
    dist.destroy_process_group()


def scenario_faults() -> None:
    init()
    # 1. different collectives (rank 1 all-reduces a longer tensor): caught before any collective runs
    x = torch.ones(4 + RANK, device="lazy")
    dist.all_reduce(x)
    try:
        lazy.mark_step()
    except ld.CollectiveMismatch as error:
        text = str(error)
        assert "rank 0: [all_reduce(sum) float32[4]" in text and "rank 1: [all_reduce(sum) float32[5]" in text, text
        assert metrics.counter("executed_graphs") == 0
        passed("mismatch")
    else:
        raise AssertionError("different collectives were not caught")
    # 2. a rank that dies: the others fail with a clear error within the timeout, in a step whose graph has run
    # before (so the collective itself fails, not the check of a new graph), launched asynchronously or not
    for step in range(4):
        y = torch.ones(3, device="lazy")
        dist.all_reduce(y)
        if step == 3 and RANK == 1:
            os._exit(3)
        if step < 3:
            lazy.mark_step()
            y.cpu()
    start = time.perf_counter()
    expect_collective_error(lambda: (lazy.mark_step(), lazy.wait_device_ops()), start, "dead rank")
    os._exit(0)  # the group is broken: no destroy_process_group


def expect_collective_error(fn, start: float, what: str) -> None:
    """``fn`` raises the CollectiveError of a failed collective: at the sync, or at the next wait when the step was
    launched asynchronously (then as the cause of lazy's StepFailed)."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001 -- checked below
        cause = error if isinstance(error, ld.CollectiveError) else error.__cause__
        assert isinstance(cause, ld.CollectiveError), repr(error)
        elapsed = time.perf_counter() - start
        assert elapsed < float(os.environ["LAZY_DIST_TIMEOUT"]) * 2 + 5, elapsed
        print(f"error after {elapsed:.1f} s: {error}", flush=True)
        passed(what)
    else:
        raise AssertionError(f"{what}: no error")


def scenario_hung() -> None:
    init()
    y = torch.ones(3, device="lazy")
    dist.all_reduce(y)
    if RANK == 1:
        time.sleep(float(os.environ["LAZY_DIST_TIMEOUT"]) * 3)  # alive but never joins the collective
        os._exit(0)
    start = time.perf_counter()
    expect_collective_error(lambda: (lazy.mark_step(), lazy.wait_device_ops()), start, "hung rank")
    os._exit(0)


if __name__ == "__main__":
    globals()[f"scenario_{sys.argv[1]}"]()
