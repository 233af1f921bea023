"""The Triton backend on a CUDA backing device: bandwidth-bound kernels against the copy roof, and a 200-op
pointwise chain, side by side with eager and torch.compile in the same run.

    LAZY_BACKING_DEVICE=cuda python benchmarks/gpu_kernels.py [--reps 50]

Rows: softmax and LayerNorm over 8192x8192 float32 (GB/s counts the bytes read and written once: input, output,
LayerNorm's weight and bias; "roof" is a device-to-device copy of the same bytes), and the chain of
benchmarks/pointwise_chain.py at 4096x4096 and 16x16. Times are medians of CUDA-event timed calls. "lazy run" is
the cached program alone (its launches, no recording); "lazy step" records the ops on lazy tensors and syncs them
with mark_step (what a training loop pays), and counts the kernels launched per step. "host us/run" is the host's
time to enqueue one cached run (its allocations and launches), measured by the host clock over many runs;
"step - recording" is the host time of a step until the GPU is done, less the host's time to record its ops
alone: medians by the host clock, the two alternated call by call, in 5 rounds, the round of the fastest recording
taken (the hosts of these machines change speed between phases of a run, by up to 2x, for seconds at a time: a
round's two medians come from one phase).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from common import cached_run, chain, temp_dir

os.environ.setdefault("LAZY_BACKING_DEVICE", "cuda")
os.environ.setdefault("LAZY_COMPILER", "triton")
if "LAZY_CACHE_DIR" not in os.environ:
    os.environ["LAZY_CACHE_DIR"] = temp_dir("lazy-bench-cache-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import lazy  # noqa: E402
import machine  # noqa: E402
from lazy.debug import metrics  # noqa: E402

def timed(fn, reps: int) -> float:
    """Median seconds per call, CUDA events around each call after a warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_time(fn, reps: int) -> float:
    """Median seconds the host spends per call (the GPU is waited for between batches, not per call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps)
        torch.cuda.synchronize()
    return statistics.median(times)


def above_recording(fn, lz, reps: int, rounds: int = 5) -> float:
    """Seconds a step (record, mark_step, wait for the GPU) takes beyond recording alone (its graph dropped
    unsynced), medians of the two alternated, in the round whose recording was fastest."""
    best = None
    for _ in range(rounds):
        steps, records = [], []
        for _ in range(reps):
            start = time.perf_counter()
            fn(*lz)
            mid = time.perf_counter()
            y = fn(*lz)  # noqa: F841 -- kept alive: mark_step syncs live tensors only
            lazy.mark_step()
            lazy.wait_device_ops()
            records.append(mid - start)
            steps.append(time.perf_counter() - mid)
        record = statistics.median(records)
        if best is None or record < best[0]:
            best = (record, statistics.median(steps) - record)
    return best[1]


def row(name: str, fn, args, nbytes: int, reps: int, roof: float) -> None:
    dev = [a.cuda() for a in args]
    want = fn(*dev)
    compiled = torch.compile(fn)
    torch.testing.assert_close(compiled(*dev), want, rtol=1e-3, atol=1e-3)
    program, run = cached_run(fn, args)
    torch.testing.assert_close(run()[0], want, rtol=1e-4, atol=1e-4)
    assert program.backend == "triton", program.backend
    lz = [a.to("lazy") for a in args]
    lazy.mark_step()

    def step():
        y = fn(*lz)
        lazy.mark_step()
        # NOTE: mark_step may hand the program to lazy's worker thread (Note [Asynchronous execution]): wait until
        # its launches are enqueued, so that the CUDA event after the step follows them
        lazy.wait_device_ops()
        return y

    step()
    metrics.reset()
    step()
    launches = metrics.counter("kernels_launched")
    t_eager, t_tc = timed(lambda: fn(*dev), reps), timed(lambda: compiled(*dev), reps)
    t_run, t_step, t_host = timed(run, reps), timed(step, reps), host_time(run, reps)
    above = above_recording(fn, lz, 4 * reps) * 1e6
    gbs = (lambda t: f"{nbytes / t / 1e9:.0f}") if nbytes else (lambda t: "")
    print(f"| {name} | {t_eager * 1e6:.1f} | {t_tc * 1e6:.1f} | {t_run * 1e6:.1f} | {t_step * 1e6:.1f} | "
          f"{gbs(t_eager)} | {gbs(t_tc)} | {gbs(t_run)} | {100 * nbytes / t_run / roof:.0f}% | "
          f"{t_tc / t_run:.2f}x | {program.num_kernels} | {launches} | {t_host * 1e6:.1f} | {above:.1f} |" if nbytes else
          f"| {name} | {t_eager * 1e6:.1f} | {t_tc * 1e6:.1f} | {t_run * 1e6:.1f} | {t_step * 1e6:.1f} | | | | | "
          f"{t_tc / t_run:.2f}x | {program.num_kernels} | {launches} | {t_host * 1e6:.1f} | {above:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    print(machine.describe())
    g = torch.Generator().manual_seed(0)
    n = 8192
    x = torch.randn(n, n, generator=g)
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    src = x.cuda()
    dst = torch.empty_like(src)
    roof = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src), args.reps)
    print(f"copy roof: {roof / 1e9:.0f} GB/s (8192x8192 float32 device-to-device, bytes read + written)")
    print("| workload | eager us | compile us | lazy run us | lazy step us | eager GB/s | compile GB/s | lazy GB/s "
          "| lazy/roof | lazy vs compile | kernels | launches/step | host us/run | step - recording us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    row("softmax 8192x8192 fp32", lambda x: x.softmax(-1), (x,), 2 * x.numel() * 4, args.reps, roof)
    row("layer_norm 8192x8192 fp32", lambda x, w, b: F.layer_norm(x, (n,), w, b), (x, w, b),
        2 * x.numel() * 4 + 2 * n * 4, args.reps, roof)
    row("200-op chain 4096x4096", chain, (torch.randn(4096, 4096, generator=g),), 0, args.reps, roof)
    row("200-op chain 16x16", chain, (torch.randn(16, 16, generator=g),), 0, args.reps, roof)


if __name__ == "__main__":
    sys.exit(main())
