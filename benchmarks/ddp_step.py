"""Time a data-parallel training step (DistributedDataParallel, AdamW) on lazy, eager and torch.compile, over gloo.

    python benchmarks/ddp_step.py                 # ~3 min on 2 cores, most of it torch.compile compiling
    python benchmarks/ddp_step.py --no-compile    # eager and lazy only
    python benchmarks/ddp_step.py --d 128 --batch 32 --steps 30
    python benchmarks/ddp_step.py --device cuda --d 256 --batch 64   # 2 GPUs: one per rank, NCCL

The script starts the ranks itself, as torchrun would (one process per rank, 1 thread each, a ``file://``
rendezvous, gloo on the cpu), once with 1 process and once with 2. Every rank trains the same GPT (tests/models.py's
TinyGPT, sized by the flags) on its own batch of --batch sequences; each step is forward, backward (DDP all-reduces
the gradients: inside the step's graph on lazy), AdamW, and a sync (lazy: ``lazy.mark_step()``); ``capture`` is
lazy with forward, backward, optimizer step and zero_grad in one ``lazy.compile``d function (captured at its third
call, after the optimizer's first step and DDP's bucket rebuild; replayed from then on, collectives included);
``capture-ro`` (on cuda) is the same under ``mode="reduce-overhead"``: with 1 rank the step replays as one CUDA
graph; with 2 as CUDA graphs between which its all-reduces are launched (Note [Collectives in a CUDA graph] in
lazy/runtime/cuda_graph.py). ``--backends`` picks some of them. Time
per step is the median (and the fastest: "best ms") over --steps steps after --warmup steps on rank 0; "cpu ms" is
the median CPU time of rank 0's process per step (its threads together: on a shared machine it moves less than the
wall time with other work). Samples/s = ranks x batch / step time; scaling is
samples/s with 2 processes over samples/s with 1, per backend (2.0 would be perfect; on a 2-core machine both
processes also share the cores with the backend's own work). torch.compile: ``torch.compile(DDP(model))`` (inductor,
DDP's graph-break optimizer), the optimizer step eager; its first step (the compile) is not in the median.
With --device cuda each rank uses its own GPU (cuda:RANK): eager and torch.compile over NCCL, lazy with that GPU as
its backing device and the ``lazy`` backend (NCCL); each step then ends in a device synchronization too.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# steady state from the tier-up on: g++ runs in place, not in the background (Note [C++ compiles in the background])
os.environ.setdefault("LAZY_COMPILE_BACKGROUND", "0")
import machine  # noqa: E402 -- after the environment above
from common import temp_dir

RESULT = "RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from models import TinyGPT

    import lazy

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = args.worker
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        lazy.config.backing_device = f"cuda:{rank}"
    eager_pg = "nccl" if cuda else "gloo"
    on_lazy = backend in ("lazy", "capture", "capture-ro")
    dist.init_process_group("lazy" if on_lazy else eager_pg, init_method=os.environ["DIST_INIT"],
                            rank=rank, world_size=world)
    device = "lazy" if on_lazy else f"cuda:{rank}" if cuda else "cpu"
    torch.manual_seed(0)
    model = TinyGPT(vocab=args.vocab, d=args.d, heads=4, layers=args.layers, block=args.block).to(device)
    net = DDP(model)
    if backend == "compile":
        net = torch.compile(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, args.vocab, (args.batch, args.block + 1), generator=g) for _ in range(4)]

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = net(x)
        loss = F.cross_entropy(out.reshape(-1, args.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    if backend in ("capture", "capture-ro"):
        train_step = lazy.compile(train_step, mode="reduce-overhead" if backend == "capture-ro" else "default")
    def split(seq: torch.Tensor) -> tuple:
        return seq[:, :-1].to(device), seq[:, 1:].to(device)

    times, cpu = [], []
    for step in range(args.warmup + args.steps):
        seq = batches[step % len(batches)]
        start, cpu_start = time.perf_counter(), time.process_time()
        x, y = split(seq)
        loss = train_step(x, y)
        if on_lazy:
            lazy.mark_step()
            lazy.wait_device_ops()
        elif cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu_start)
    final = float(loss)
    steady = times[args.warmup:]
    kernels = profile_kernels(lambda k: train_step(*split(batches[k % len(batches)])), args.profile,
                              on_lazy) if cuda and args.profile else None
    if rank == 0:
        print(RESULT + json.dumps({"kernels": kernels,
                                   "first_ms": times[0] * 1e3, "step_ms": statistics.median(steady) * 1e3,
                                   "best_ms": min(steady) * 1e3,
                                   "cpu_ms": statistics.median(cpu[args.warmup:]) * 1e3,
                                   "loss": final,
                                   "graphs": lazy.metrics.counter("compiles") if on_lazy else None,
                                   "replays": lazy.metrics.counter("capture.replays") if on_lazy else None,
                                   "cuda_graphs": {k[len("cuda_graph."):]: v for k, v in lazy.metrics.counters().items()
                                              if k.startswith("cuda_graph.")} if on_lazy and cuda else None}),
              flush=True)
    dist.destroy_process_group()


def profile_kernels(step, steps: int, on_lazy: bool) -> dict:
    """GPU kernel time per step over ``steps`` steps (torch profiler): all kernels, NCCL's, and how much of NCCL's
    time other kernels ran at the same time (the collectives' overlap with compute)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import lazy
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(steps):
            step(k)
            if on_lazy:
                lazy.mark_step()
        if on_lazy:
            lazy.wait_device_ops()
        torch.cuda.synchronize()
    spans: dict = {True: [], False: []}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            spans["nccl" in e.name.lower()].append((e.time_range.start, e.time_range.end))
    us = 1e3 * steps  # profiler times are in us; per step in ms
    return {"gpu_ms": sum(b - a for a, b in spans[True] + spans[False]) / us,
            "nccl_ms": sum(b - a for a, b in spans[True]) / us,
            "overlap_ms": _overlap(_union(spans[True]), _union(spans[False])) / us}


def _union(spans: list) -> list:
    out: list = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(xs: list, ys: list) -> float:
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += min(b, ys[k][1]) - max(a, ys[k][0])
            k += 1
    return total


def launch(backend: str, world: int, args: argparse.Namespace) -> dict:
    """Run ``world`` ranks of the worker for ``backend``; rank 0's result."""
    tmp = temp_dir("lazy-ddp-bench-")
    flags = [f"--{k}={getattr(args, k)}" for k in ("d", "layers", "block", "vocab", "batch", "steps", "warmup",
                                                      "device", "profile")]
    env = dict(os.environ, WORLD_SIZE=str(world), DIST_INIT=f"file://{tmp}/store", OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", backend] + flags,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise RuntimeError(f"{backend} x{world}: no result within {args.timeout} s") from None
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{backend} x{world} failed:\n{err[-3000:]}")
    line = next(line for line in outs[0][0].splitlines() if line.startswith(RESULT))
    return json.loads(line[len(RESULT):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: one GPU per rank, NCCL")
    parser.add_argument("--backends", help="a comma-separated subset of eager,lazy,capture,capture-ro,compile")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run of one backend may take")
    parser.add_argument("--profile", type=int, default=0,
                        help="cuda: profile this many more steps for the GPU kernel time per step, NCCL's share of "
                             "it and NCCL's overlap with other kernels")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.device == "cuda":
        os.environ["LAZY_BACKING_DEVICE"] = "cuda"  # for the machine line's GPU (the workers pick cuda:RANK)
    print(machine.describe())
    print(f"TinyGPT d={args.d} layers={args.layers} block={args.block} vocab={args.vocab}, batch {args.batch} per "
          f"rank, DDP + AdamW, {'NCCL' if args.device == 'cuda' else 'gloo'}, 1 thread per process; median of "
          f"{args.steps} steps after {args.warmup}")
    backends = ["eager", "lazy", "capture"] + (["capture-ro"] if args.device == "cuda" else []) + \
        ([] if args.no_compile else ["compile"])
    if args.backends:
        backends = [b for b in args.backends.split(",") if b]
        if "eager" not in backends:
            backends.insert(0, "eager")  # the ratios' reference
    del args.no_compile, args.backends
    results = {(b, w): launch(b, w, args) for w in (1, 2) for b in backends}
    print(f"{'backend':<11}{'ranks':>6}{'step ms':>10}{'best ms':>9}{'cpu ms':>8}{'samples/s':>11}{'vs eager':>10}"
          f"{'first ms':>10}{'loss':>9}")
    for w in (1, 2):
        for b in backends:
            r = results[(b, w)]
            sps = w * args.batch / (r["step_ms"] / 1e3)
            ratio = results[("eager", w)]["step_ms"] / r["step_ms"]
            print(f"{b:<11}{w:>6}{r['step_ms']:>10.2f}{r['best_ms']:>9.2f}{r['cpu_ms']:>8.2f}{sps:>11.0f}{ratio:>9.2f}x"
                  f"{r['first_ms']:>10.0f}{r['loss']:>9.4f}")
    print("vs eager: eager's step time over the backend's (above 1: faster than eager DDP)")
    for w in (1, 2):
        for b in backends:
            if results[(b, w)].get("cuda_graphs"):
                print(f"{b} x{w}: CUDA graphs " + ", ".join(f"{k} {v:g}" for k, v in
                                                          sorted(results[(b, w)]["cuda_graphs"].items())))
            k = results[(b, w)].get("kernels")
            if k:
                print(f"{b} x{w}: GPU kernels {k['gpu_ms']:.2f} ms per step, of which NCCL {k['nccl_ms']:.2f} ms "
                      f"({k['overlap_ms']:.2f} ms of it overlapped by other kernels)")
    for b in backends:
        scaling = 2 * results[(b, 1)]["step_ms"] / results[(b, 2)]["step_ms"]
        print(f"scaling 1 -> 2 processes, {b}: {scaling:.2f}x samples/s")


if __name__ == "__main__":
    main()
