"""A 200-op pointwise chain: lazy (cpp backend) vs eager vs torch.compile, measured side by side in one run.

Reports the steady state (lazy: record + mark_step + cached compiled run; fastest of ``--reps`` rounds, 10x as many
at 16x16, each round one call of lazy, eager and torch.compile), the first-compile time of lazy (with an empty disk
cache; split into recording, g++ and the rest) and of torch.compile, the time to the first result in a fresh
process whose disk cache already holds the graph, and the bytes each run allocates for intermediates. Every figure
is printed with the load average at the time (the box is shared).

Also the memory-bound ``x * 2 + 1`` at 4096x4096 against torch's ``copy_`` of the same size (the bandwidth any
pointwise kernel can reach), and with ``--isa``, all of it once per instruction set (benchmarks/common.py).

    python benchmarks/pointwise_chain.py            # 16x16 and 1024x1024
    python benchmarks/pointwise_chain.py --large    # also 4096x4096
    python benchmarks/pointwise_chain.py --isa native,avx2
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
from common import add_isa_argument, cached_run, chain, isa_line, rerun_per_isa, restrict_inductor, temp_dir

os.environ.setdefault("LAZY_COMPILER", "cpp")
os.environ["LAZY_CACHE_DIR"] = temp_dir("lazy-bench-cache-")  # first compile really compiles
import lazy  # noqa: E402
import machine  # noqa: E402
from lazy.cache import graph_cache  # noqa: E402

def bench(fns, reps: int) -> list:
    """Fastest seconds per call of each of ``fns``, measured interleaved (one call of each per round), so a burst
    of load on the shared box hits every column alike."""
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


FRESH = """
import time, torch, lazy
from lazy.debug import metrics
OPS = (lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05)
x = torch.randn({n}, {n}).to("lazy")
lazy.mark_step()
t0 = time.perf_counter()
y = x
for i in range(200):
    y = OPS[i % 5](y)
t1 = time.perf_counter()
y.cpu()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, metrics.counter("disk_cache.hit"), metrics.counter("cpp.compiles"))
"""


def fresh_process(n: int, runs: int = 3) -> None:
    """(b): a new process whose disk cache holds the graph: time to record the chain and to sync it (disk hit)."""
    env = dict(os.environ, LAZY_CACHE_DIR=temp_dir("lazy-bench-cache-"))
    cmd = [sys.executable, "-c", FRESH.format(n=n)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)  # fills the cache
    best = None
    for _ in range(runs):
        rec, sync, hit, compiles = subprocess.run(cmd, env=env, check=True, capture_output=True,
                                                  text=True).stdout.split()
        assert int(hit) == 1 and int(compiles) == 0
        if best is None or float(rec) + float(sync) < sum(best):
            best = (float(rec), float(sync))
    print(f"  warm disk cache, fresh process: record {best[0] * 1e3:.1f} ms + sync (hit) {best[1] * 1e3:.1f} ms "
          f"= first result {sum(best) * 1e3:.1f} ms   ({load()}, fastest of {runs})")


def run(n: int, reps: int) -> None:
    x = torch.randn(n, n)
    xl = x.to("lazy")
    lazy.mark_step()

    def lazy_step():
        y = chain(xl)
        lazy.mark_step()
        lazy.wait_device_ops()  # the step includes its run (Note [Asynchronous execution])
        return y

    lazy.metrics.reset()
    t = time.perf_counter()
    y = chain(xl)
    recorded = time.perf_counter() - t
    lazy.mark_step()
    lazy_first = time.perf_counter() - t
    gxx = lazy.metrics.counter("cpp.compile_time_s")
    torch.testing.assert_close(y.cpu(), chain(x), rtol=1e-4, atol=1e-4)
    program = graph_cache.latest()
    compiled = torch.compile(chain)
    t = time.perf_counter()
    torch.testing.assert_close(compiled(x), chain(x), rtol=1e-4, atol=1e-4)
    tc_first = time.perf_counter() - t
    _, kernel_run = cached_run(chain, (x,))
    for f in (lazy_step, kernel_run, lambda: chain(x), lambda: compiled(x)):
        f()
    t_lazy, t_run, t_eager, t_tc = bench([lazy_step, kernel_run, lambda: chain(x), lambda: compiled(x)], reps)
    elem = x.element_size() * x.numel()
    # a segment step is (kind, label, entry, allocs, ...): allocs are (buffer, shape, dtype) of its fresh tensors
    lazy_bytes = sum(torch.Size(shape).numel() * dtype.itemsize
                     for s in program.steps if s[0] == "seg" for _, shape, dtype in s[3])
    print(f"{n}x{n}: kernels={program.num_kernels} backend={program.backend}")
    print(f"  steady state  lazy {t_lazy * 1e3:9.3f} ms   eager {t_eager * 1e3:9.3f} ms   torch.compile "
          f"{t_tc * 1e3:9.3f} ms   eager/lazy {t_eager / t_lazy:5.2f}x   lazy/compile {t_lazy / t_tc:5.2f}x   "
          f"({load()})")
    print(f"  cached run alone (kernels, no recording) {t_run * 1e3:9.3f} ms   run/eager {t_run / t_eager:5.2f}x   "
          f"run/compile {t_run / t_tc:5.2f}x")
    print(f"  first compile lazy {lazy_first:6.2f} s (record {recorded:.2f} s, g++ {gxx:.2f} s, rest "
          f"{lazy_first - recorded - gxx:.2f} s)    torch.compile {tc_first:6.2f} s   ({load()})")
    print(f"  bytes allocated per run: lazy {lazy_bytes / 1e6:.3f} MB (outputs only, no intermediate); eager "
          f"{200 * elem / 1e6:.3f} MB over 200 intermediates (at most 2 live: peak {2 * elem / 1e6:.3f} MB)")


def memory_bound(n: int, reps: int) -> None:
    """``x * 2 + 1`` at n x n: lazy's cached run and step vs eager, torch.compile and ``copy_`` (read n^2 floats,
    write n^2: the same traffic), interleaved rounds; bandwidth in GB/s of those 2 n^2 floats."""
    x = torch.randn(n, n)
    dst = torch.empty_like(x)
    fn = lambda t: t * 2 + 1  # noqa: E731
    program, kernel_run = cached_run(fn, (x,))
    xl = x.to("lazy")
    lazy.mark_step()

    def lazy_step():
        y = fn(xl)
        lazy.mark_step()
        lazy.wait_device_ops()  # the step includes its run (Note [Asynchronous execution])
        return y

    compiled = torch.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    cols = {"lazy run": kernel_run, "lazy step": lazy_step, "eager": lambda: fn(x),
            "torch.compile": lambda: compiled(x), "copy_": lambda: dst.copy_(x)}
    for f in cols.values():
        f()
    times = dict(zip(cols, bench(list(cols.values()), reps)))
    gbs = {k: 2 * x.numel() * x.element_size() / t / 1e9 for k, t in times.items()}
    print(f"{n}x{n} x * 2 + 1 (memory-bound; kernels={program.num_kernels}): "
          + "   ".join(f"{k} {t * 1e3:.2f} ms ({gbs[k]:.1f} GB/s)" for k, t in times.items()))
    share = {k: f"{v / gbs['copy_'] * 100:.0f}%" for k, v in gbs.items()}
    print(f"  of copy_'s bandwidth: lazy run {share['lazy run']}, lazy step {share['lazy step']}, torch.compile "
          f"{share['torch.compile']}, eager {share['eager']}   ({load()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also run 4096x4096")
    ap.add_argument("--reps", type=int, default=20)
    add_isa_argument(ap)
    args = ap.parse_args()
    if rerun_per_isa(args.isa, sys.argv):
        return
    restrict_inductor()
    print(machine.describe())
    print(isa_line())
    print(f"lazy compiler={lazy.config.compiler}", file=sys.stderr)
    sizes = [16, 1024] + ([4096] if args.large else [])
    for n in sizes:
        run(n, args.reps * 10 if n <= 64 else args.reps if n < 4096 else max(3, args.reps // 5))
    memory_bound(4096, max(5, args.reps // 2))
    fresh_process(16)


if __name__ == "__main__":
    main()
