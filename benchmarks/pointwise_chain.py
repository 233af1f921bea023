"""A 200-op pointwise chain: lazy (cpp backend) vs eager vs torch.compile, measured side by side in one run.

Reports the steady state (lazy: record + mark_step + cached compiled run), the first-compile time of lazy (with
an empty disk cache) and of torch.compile, and the bytes each run allocates for intermediates.

    python benchmarks/pointwise_chain.py            # 16x16 and 1024x1024
    python benchmarks/pointwise_chain.py --large    # also 4096x4096
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("LAZY_COMPILER", "cpp")
os.environ["LAZY_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazy-bench-cache-")  # first compile really compiles
import lazy  # noqa: E402
from lazy.cache import graph_cache  # noqa: E402

OPS = (lambda t: t * 1.01, lambda t: t + 0.1, lambda t: t.sin(), lambda t: t.relu(), lambda t: t - 0.05)


def chain(x: torch.Tensor) -> torch.Tensor:
    for i in range(200):
        x = OPS[i % 5](x)
    return x


def bench(fn, reps: int) -> float:
    """Median seconds per call."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(n: int, reps: int) -> None:
    x = torch.randn(n, n)
    xl = x.to("lazy")
    lazy.mark_step()

    def lazy_step():
        y = chain(xl)
        lazy.mark_step()
        return y

    t = time.perf_counter()
    y = lazy_step()
    lazy_first = time.perf_counter() - t
    torch.testing.assert_close(y.cpu(), chain(x), rtol=1e-4, atol=1e-4)
    program = next(reversed(graph_cache._CACHE.values()))
    compiled = torch.compile(chain)
    t = time.perf_counter()
    compiled(x)
    tc_first = time.perf_counter() - t
    for f in (lazy_step, lambda: chain(x), lambda: compiled(x)):
        f()
    t_lazy, t_eager, t_tc = bench(lazy_step, reps), bench(lambda: chain(x), reps), bench(lambda: compiled(x), reps)
    elem = x.element_size() * x.numel()
    lazy_bytes = sum(elem for s in program.steps if s[0] == "seg" for _ in s[1])
    print(f"{n}x{n}: kernels={program.num_kernels} backend={program.backend}")
    print(f"  steady state  lazy {t_lazy * 1e3:9.3f} ms   eager {t_eager * 1e3:9.3f} ms   torch.compile "
          f"{t_tc * 1e3:9.3f} ms   eager/lazy {t_eager / t_lazy:5.2f}x   compile/lazy {t_tc / t_lazy:5.2f}x")
    print(f"  first compile lazy {lazy_first:6.2f} s    torch.compile {tc_first:6.2f} s")
    print(f"  bytes allocated per run: lazy {lazy_bytes / 1e6:.3f} MB (outputs only, no intermediate); eager "
          f"{200 * elem / 1e6:.3f} MB over 200 intermediates (at most 2 live: peak {2 * elem / 1e6:.3f} MB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also run 4096x4096")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, lazy compiler={lazy.config.compiler}",
          file=sys.stderr)
    sizes = [16, 1024] + ([4096] if args.large else [])
    for n in sizes:
        run(n, args.reps if n < 4096 else max(3, args.reps // 5))


if __name__ == "__main__":
    main()
