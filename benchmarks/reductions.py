"""Row and column reductions: lazy (cpp backend) vs eager vs torch.compile, measured side by side in one run.

For each workload (softmax and var over the last dim, layer_norm forward, sum over dim 0 and over dim 1, and sum over
dims (0, 2, 3) of the input viewed as NCHW with C=64, H=16, W=32: BatchNorm's per-channel reductions) and size,
prints the fastest of ``--reps`` calls of: lazy's step (record + mark_step + the cached compiled run), lazy's
cached run alone (``Program.run`` on the graph's leaves, no recording or cache lookup), eager, and a cached
``torch.compile``; then the ratios and the load average (the box is shared). Results are checked against eager.

    python benchmarks/reductions.py                 # 1024x1024 and 4096x1024 float32
    python benchmarks/reductions.py --reps 50 --only softmax,sum0 --threads 1
    python benchmarks/reductions.py --isa native,avx2     # once per instruction set (benchmarks/common.py)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from common import add_isa_argument, cached_run, isa_line, rerun_per_isa, restrict_inductor, temp_dir


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="threads of eager, torch.compile and lazy's kernels "
                    "(default: torch's); 1 is the least disturbed by other load on a shared box")
    add_isa_argument(ap)
    return ap


ARGS = _parser().parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads:
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before torch loads libgomp, which lazy's kernels share

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

os.environ.setdefault("LAZY_COMPILER", "cpp")
os.environ["LAZY_CACHE_DIR"] = temp_dir("lazy-bench-cache-")  # every graph really compiles
import lazy  # noqa: E402
import machine  # noqa: E402

SIZES = ((1024, 1024), (4096, 1024))


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


WORKLOADS = {
    "softmax": lambda x, w, b: x.softmax(-1),
    "layer_norm": _layer_norm,
    "sum0": lambda x, w, b: x.sum(0),
    "sum1": lambda x, w, b: x.sum(1),
    "sum023": lambda x, w, b: x.view(-1, 64, 16, 32).sum((0, 2, 3)),
    "var": lambda x, w, b: x.var(-1),
}


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def bench(fn, reps: int) -> float:
    """Fastest seconds per call of ``reps`` calls back to back."""
    # NOTE: not interleaved with the other columns (pointwise_chain.bench is): here each call would then start
    # with its 4-16 MB input evicted from L2 by the others, which measured every column 1.3-3x slower (eager layer_norm 1024^2: 0.44 -> 1.17 ms) and no longer comparable with the figures in the README.
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(name: str, shape: tuple, reps: int) -> tuple:
    fn = WORKLOADS[name]
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    args = (x, w, b)
    lz = [a.to("lazy") for a in args]
    lazy.mark_step()

    def lazy_step():
        y = fn(*lz)
        lazy.mark_step()
        lazy.wait_device_ops()  # the step includes its run (Note [Asynchronous execution])
        return y

    # NOTE: lazy sums in double, eager in float32 (pairwise): both within 1e-4 of the exact sum here
    torch.testing.assert_close(lazy_step().cpu(), fn(*args), rtol=1e-4, atol=1e-4)
    program, run = cached_run(fn, args)
    compiled = torch.compile(fn)
    # NOTE: Inductor sums in float32 in its own order: 1e-4 off eager's sum over 4096 rows
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-3, atol=1e-3)
    for f in (lazy_step, run, lambda: fn(*args), lambda: compiled(*args)):
        f()
    before = load()
    t_step = bench(lazy_step, reps)
    t_run = bench(run, reps)
    t_eager = bench(lambda: fn(*args), reps)
    t_tc = bench(lambda: compiled(*args), reps)
    return (t_step, t_run, t_eager, t_tc, program.num_kernels, program.num_externs, f"{before}-{load()}")


def main() -> None:
    args = ARGS
    if rerun_per_isa(args.isa, sys.argv):
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only.split(",") if args.only else list(WORKLOADS)
    restrict_inductor()
    print(machine.describe())
    print(isa_line())
    print(f"lazy compiler={lazy.config.compiler}, fastest of {args.reps}", file=sys.stderr)
    print("| workload | shape | lazy step ms | lazy run ms | eager ms | compile ms | run/eager | run/compile "
          "| kernels+externs | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for shape in SIZES:
        for name in names:
            t_step, t_run, t_eager, t_tc, kernels, externs, ld = measure(name, shape, args.reps)
            print(f"| {name} | {shape[0]}x{shape[1]} | {t_step * 1e3:.3f} | {t_run * 1e3:.3f} | {t_eager * 1e3:.3f} "
                  f"| {t_tc * 1e3:.3f} | {t_run / t_eager:.2f}x | {t_run / t_tc:.2f}x | {kernels}+{externs} | {ld} |",
                  flush=True)


if __name__ == "__main__":
    main()
