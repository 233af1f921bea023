"""Memory over a long training run on the lazy device: process RSS, live lazy storages, graph-cache entries.

    python benchmarks/memory.py            # 1000 steps of a small MLP with AdamW
    python benchmarks/memory.py --steps 200

A flat profile means mark_step leaves no IR history behind and the graph cache stops growing.
"""
import argparse
import gc
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
# steady state from the tier-up on: g++ runs in place, not in the background (Note [C++ compiles in the background])
os.environ.setdefault("LAZY_COMPILE_BACKGROUND", "0")

import lazy  # noqa: E402
import machine  # noqa: E402
from lazy.cache import graph_cache  # noqa: E402
from lazy.device.tensor import live_storages  # noqa: E402
from models import MLP, batch  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    print(machine.describe())
    torch.manual_seed(0)
    model = MLP().to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    checkpoints = sorted({10, args.steps // 10, args.steps // 4, args.steps // 2, args.steps})
    print(f"{'step':>6} {'RSS MiB':>9} {'live storages':>14} {'cache entries':>14} {'compiles':>9} {'s':>6}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batch("mlp", step % 16, "lazy", size=32)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        lazy.mark_step()
        if step in checkpoints:
            gc.collect()
            print(f"{step:6d} {rss_mib():9.1f} {len(live_storages()):14d} {graph_cache.size():14d} "
                  f"{int(lazy.metrics.counter('compiles')):9d} {time.perf_counter() - start:6.1f}")


if __name__ == "__main__":
    main()
