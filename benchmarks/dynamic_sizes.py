"""A training step whose batch size and length change from step to step: lazy.compile with and without
dynamic=True against eager and torch.compile(dynamic=True), side by side in one run.

    python benchmarks/dynamic_sizes.py               # ~2 min on 2 cores, most of it torch.compile compiling
    python benchmarks/dynamic_sizes.py --backends eager,static,dynamic --rounds 5

The step is a tiny GPT's (tests/models.py, 2 layers of 64, AdamW): forward, backward, optimizer step; its loss is
read at the end of each step (a sync). The sizes cycle through --sizes (batch x length). For each backend:
- first: its first compiling step (lazy: the second step, as the first creates AdamW's state and runs plainly);
- new size: the mean of the first steps at each later size (a capture, or a graph built and compiled);
- builds left: after two passes through the sizes, how long lazy's background C++ builds still took (Note [C++
  compiles in the background]): until then a size's graph runs on the reference executor;
- step: the median step over the --rounds - 2 passes through the sizes after the one that follows those two, every
  size seen and built, and run compiled once (that pass's steps load the libraries the wait ended with and run
  each program's first time).

- eager:    plain PyTorch on the CPU.
- static:   the step under @lazy.compile: each new size captures the function again (runs its Python under the
            capture interpreter) and compiles its graph.
- dynamic:  @lazy.compile(dynamic=True): captured once, with symbolic sizes; a new size rebuilds the graph from the
            recorded ops, without the function's Python, and compiles it (lazy/capture/dynamic.py).
- compile:  torch.compile(model, dynamic=True) (inductor), the optimizer step eager.

Compile caches start empty (a fresh lazy cache directory for each lazy backend, a fresh inductor cache directory
for the process), so the first and new-size columns are what a size costs the first time it is seen anywhere;
``--warm`` keeps the user's caches (a size compiled by an earlier process is then read from disk).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import machine
from common import restrict_inductor, temp_dir

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from models import TinyGPT  # noqa: E402

BACKENDS = ("eager", "static", "dynamic", "compile")


def make(device: str):
    torch.manual_seed(0)
    model = TinyGPT(vocab=65, d=64, heads=4, layers=2, block=64).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def data(sizes, rounds):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rounds + 1):
        for b, t in sizes:
            seq = torch.randint(0, 65, (b, t + 1), generator=g)
            out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def run(backend: str, sizes, rounds: int, warm: bool) -> dict:
    import lazy
    if backend in ("static", "dynamic") and not warm:
        with lazy.config.override(cache_dir=temp_dir("lazy-bench-cache-")):
            return run(backend, sizes, rounds, True)
    device = "lazy" if backend in ("static", "dynamic") else "cpu"
    model, opt = make(device)
    net = torch.compile(model, dynamic=True) if backend == "compile" else model

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    if backend in ("static", "dynamic"):
        step = lazy.compile(step, dynamic=backend == "dynamic", max_recompiles=64)
    times, losses = [], []
    left = 0.0
    for i, (x, y) in enumerate(data(sizes, rounds)):
        # the steady state: every size seen by a capture (the first size's first step ran plainly: its graph is
        # built in the second pass) and every graph's kernels built
        if i == 2 * len(sizes) and device == "lazy":
            from lazy.runtime import cpp_build
            left = cpp_build.wait_all()[1]
        start = time.perf_counter()
        loss = step(x.to(device), y.to(device))
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    n = len(sizes)
    at = 1 if backend in ("static", "dynamic") else 0  # a capture's first step runs plainly (AdamW's new state)
    return {"first": times[at], "new": statistics.mean(times[at + 1:n]), "step": statistics.median(times[3 * n:]),
            "loss": losses[-1], "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--sizes", default="16x32,12x24,20x40,8x16,16x48")
    parser.add_argument("--rounds", type=int, default=6, help="passes after the first (at least 3)")
    parser.add_argument("--warm", action="store_true", help="keep the user's lazy and inductor compile caches")
    args = parser.parse_args()
    if not args.warm:  # read by inductor when it first compiles
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = temp_dir("inductor-bench-cache-")
    restrict_inductor()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(machine.describe())
    print(f"tiny GPT 2x64, AdamW; sizes (batch x length) {args.sizes}; {args.rounds} rounds; "
          f"{'warm' if args.warm else 'empty'} compile caches")
    results = {}
    for backend in args.backends.split(","):
        results[backend] = run(backend, sizes, args.rounds, args.warm)
    base = results.get("eager")
    comp = results.get("compile")
    print(f"{'backend':<10} {'first (ms)':>11} {'new size (ms)':>14} {'builds left (ms)':>17} {'step (ms)':>10} "
          f"{'/ eager':>8} {'/ compile':>10}  final loss")
    for name, r in results.items():
        ratio = f"{r['step'] / base['step']:.2f}x" if base else "-"
        cratio = f"{r['step'] / comp['step']:.2f}x" if comp else "-"
        print(f"{name:<10} {r['first'] * 1e3:>11.1f} {r['new'] * 1e3:>14.1f} {r['left'] * 1e3:>17.1f} "
              f"{r['step'] * 1e3:>10.2f} {ratio:>8} {cratio:>10}  {r['loss']:.5f}")


if __name__ == "__main__":
    main()
