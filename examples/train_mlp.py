"""Train a small MLP classifier on synthetic data on the lazy device.

    python examples/train_mlp.py            # ~10 s on 2 cores
    python examples/train_mlp.py --steps 2000 --hidden 256

Each step is recorded, cut by lazy.mark_step() into one graph, and, after the first steps, served from the graph
cache: the progress line shows the hit rate.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy


def make_data(n: int, features: int, classes: int, seed: int) -> tuple:
    """Gaussian blobs: one center per class, so the task is learnable."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 0.6
    labels = torch.randint(0, classes, (n,), generator=g)
    points = centers[labels] + torch.randn(n, features, generator=g) * 1.5
    return points, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(0)
    points, labels = make_data(20000, args.features, args.classes, seed=1)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.GELU(), nn.Linear(args.hidden, args.hidden),
                          nn.GELU(), nn.Linear(args.hidden, args.classes)).to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    start = last = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, points.shape[0], (args.batch,))
        xb, yb = points[idx].to("lazy"), labels[idx].to("lazy")
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        lazy.mark_step()
        if step % args.log_every == 0 or step == args.steps - 1:
            now = time.perf_counter()
            rate = (args.log_every if step else 1) / (now - last)
            last = now
            print(f"step {step:5d}  loss {loss.item():.4f}  {rate:7.1f} steps/s  "
                  f"{lazy.metrics.cache_summary()}")
    with torch.no_grad():
        xb, yb = points[:2000].to("lazy"), labels[:2000].to("lazy")
        accuracy = (model(xb).argmax(1) == yb).float().mean().item()
    print(f"done in {time.perf_counter() - start:.1f} s, accuracy {accuracy:.1%}")
    print(lazy.metrics.report())


if __name__ == "__main__":
    main()
