"""Recording overhead of lazy, side by side with eager CPU and torch._lazy (TorchScript LTC), in one run.

Measures, on 16x16 float32 tensors and a pointwise chain ``x * 1.0001 + 0.001 -> relu -> tanh`` (4 ATen ops per
link):
  a) per-op recording cost: record N ops without syncing, divided by N (eager: per-op execution cost);
  b) steady-state step: record a 200-op chain, ``mark_step()``, execute the cached graph; warm-up steps first, so
     every timed step is a graph-cache hit (lazy's counters are printed to prove it).

``torch._lazy.ts_backend.init()`` registers kernels on the same Lazy dispatch key as ``lazy``, so LTC runs in a
subprocess (this script with ``--ltc-worker``, printing JSON); ``lazy`` is imported only in the main process,
after the subprocess has finished.

Run: ``python benchmarks/trace_overhead.py`` (``--quick`` for a shorter run, ``--json`` to also dump the numbers).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

import torch

# steady state from the tier-up on: g++ runs in place, not in the background (Note [C++ compiles in the background])
os.environ.setdefault("LAZY_COMPILE_BACKGROUND", "0")
import machine  # noqa: E402 -- after the environment above

SIZE = 16
RECORD_OPS = 2000  # (a) ops recorded per repeat
STEP_OPS = 200  # (b) ops per step
OPS_PER_LINK = 4  # mul, add, relu, tanh


def chain(x: torch.Tensor, n_ops: int) -> torch.Tensor:
    """``n_ops`` ATen ops (a multiple of 4): mul.Tensor, add.Tensor, relu, tanh, repeated."""
    for _ in range(n_ops // OPS_PER_LINK):
        x = x * 1.0001 + 0.001
        x = x.relu()
        x = torch.tanh(x)
    return x


def median_time(fn: Callable[[], None], repeats: int, setup: Callable[[], None] = lambda: None) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (``setup()`` runs untimed before each). The fastest run is
    kept too (``best()``): on a shared machine the minimum is the cost without interference from other load."""
    times = []
    for _ in range(repeats):
        setup()
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    _best.append(min(times))
    return statistics.median(times)


_best: List[float] = []  # the fastest run of each median_time call, in call order


def best() -> float:
    """The fastest run of the latest ``median_time`` call."""
    return _best[-1]


class Settings:
    def __init__(self, quick: bool) -> None:
        self.repeats = 5 if quick else 15  # median (and min) over this many repeats
        self.record_warmup = 1 if quick else 2
        self.steps = 10 if quick else 30  # steps per repeat in (b)
        self.step_warmup = 3 if quick else 5


# ---------------------------------------------------------------------------------------------------------------
# (a) recording cost per op and (b) steady-state step, per runtime

def measure_eager(s: Settings) -> Dict[str, float]:
    x0 = torch.randn(SIZE, SIZE)
    per_op = median_time(lambda: chain(x0, RECORD_OPS), s.repeats) / RECORD_OPS
    per_op_min = best() / RECORD_OPS
    state = {"x": x0.clone()}

    def steps() -> None:
        x = state["x"]
        for _ in range(s.steps):
            x = chain(x, STEP_OPS)
        state["x"] = x

    for _ in range(s.step_warmup):
        state["x"] = chain(state["x"], STEP_OPS)
    step = median_time(steps, s.repeats) / s.steps
    return {"op_us": per_op * 1e6, "step_us": step * 1e6, "op_min_us": per_op_min * 1e6,
            "step_min_us": best() / s.steps * 1e6}


def measure_lazy(s: Settings) -> Dict[str, object]:
    import lazy  # only here: see the module docstring

    x0 = torch.randn(SIZE, SIZE).to("lazy")
    lazy.mark_step()
    holder: Dict[str, object] = {}

    def record() -> None:
        holder["y"] = chain(x0, RECORD_OPS)

    def drop() -> None:
        holder.clear()  # frees the previous repeat's 2000-node graph outside the timed region

    for _ in range(s.record_warmup):  # fills the shape memo
        record()
        drop()
    per_op = median_time(record, s.repeats, setup=drop) / RECORD_OPS
    per_op_min = best() / RECORD_OPS
    drop()

    state = {"x": torch.randn(SIZE, SIZE).to("lazy")}
    lazy.mark_step()
    rec_times: List[float] = []
    sync_times: List[float] = []

    def one_step(log: bool) -> None:
        t0 = time.perf_counter()
        y = chain(state["x"], STEP_OPS)
        t1 = time.perf_counter()
        lazy.mark_step()
        t2 = time.perf_counter()
        state["x"] = y
        if log:
            rec_times.append(t1 - t0)
            sync_times.append(t2 - t1)

    for _ in range(s.step_warmup):
        one_step(False)
    before = lazy.metrics.counters()

    def steps() -> None:
        for _ in range(s.steps):
            one_step(True)

    step = median_time(steps, s.repeats) / s.steps
    step_min = best() / s.steps
    after = lazy.metrics.counters()
    counts = {k: after.get(k, 0) - before.get(k, 0)
              for k in ("graph_cache.hit", "graph_cache.miss", "compiles", "executed_graphs")}
    return {"op_us": per_op * 1e6, "step_us": step * 1e6, "op_min_us": per_op_min * 1e6, "step_min_us": step_min * 1e6,
            "step_record_us": statistics.median(rec_times) * 1e6,
            "step_sync_us": statistics.median(sync_times) * 1e6,
            "timed_steps": s.repeats * s.steps, "counters": counts}


def measure_ltc(s: Settings) -> Dict[str, object]:
    """Runs in the --ltc-worker subprocess only."""
    import torch._lazy
    import torch._lazy.metrics
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()
    dev = torch.device("lazy")
    x0 = torch.randn(SIZE, SIZE).to(dev)
    torch._lazy.mark_step()
    torch._lazy.wait_device_ops()
    holder: Dict[str, object] = {}

    def record() -> None:
        holder["y"] = chain(x0, RECORD_OPS)

    for _ in range(s.record_warmup):
        record()
        holder.clear()
    per_op = median_time(record, s.repeats, setup=holder.clear) / RECORD_OPS
    per_op_min = best() / RECORD_OPS
    holder.clear()

    state = {"x": torch.randn(SIZE, SIZE).to(dev)}
    torch._lazy.mark_step()
    torch._lazy.wait_device_ops()

    def one_step() -> None:
        y = chain(state["x"], STEP_OPS)
        torch._lazy.mark_step()
        torch._lazy.wait_device_ops()  # LTC may execute asynchronously: time the finished step
        state["x"] = y

    for _ in range(s.step_warmup):
        one_step()

    def counter(name: str) -> int:
        return torch._lazy.metrics.counter_value(name) or 0

    before = {n: counter(n) for n in ("CachedCompile", "UncachedCompile")}

    def steps() -> None:
        for _ in range(s.steps):
            one_step()

    step = median_time(steps, s.repeats) / s.steps
    counts = {n: counter(n) - v for n, v in before.items()}
    return {"op_us": per_op * 1e6, "step_us": step * 1e6, "op_min_us": per_op_min * 1e6,
            "step_min_us": best() / s.steps * 1e6, "counters": counts}


def run_ltc_subprocess(quick: bool) -> Dict[str, object]:
    cmd = [sys.executable, os.path.abspath(__file__), "--ltc-worker"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# Reporting

def ratio(a: object, b: object) -> str:
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def fmt(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) else "-"


def table(eager: dict, lz: dict, ltc: dict, suffix: str = "") -> str:
    rows = [
        (f"(a) record, µs/op (N={RECORD_OPS}, no sync; eager = execute)", "op" + suffix),
        (f"(b) step, µs/step ({STEP_OPS}-op chain + mark_step, cache hit)", "step" + suffix),
    ]
    head = ["measurement", "eager", "lazy", "LTC", "lazy/eager", "lazy/LTC"]
    body = [[name, fmt(eager.get(k)), fmt(lz.get(k)), fmt(ltc.get(k)), ratio(lz.get(k), eager.get(k)),
             ratio(lz.get(k), ltc.get(k))] for name, k in rows]
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]

    def line(r: list) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"

    sep = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(head), sep] + [line(r) for r in body])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    parser.add_argument("--json", action="store_true", help="also print every number as JSON")
    parser.add_argument("--ltc-worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    s = Settings(opts.quick)
    if opts.ltc_worker:
        print(json.dumps(measure_ltc(s)))
        return

    start = time.perf_counter()
    print(f"trace_overhead  {machine.describe()}")
    print(f"{SIZE}x{SIZE} float32, chain x*1.0001+0.001 -> relu -> tanh; {s.repeats} repeats"
          f"{' (--quick)' if opts.quick else ''}\n")
    ltc = run_ltc_subprocess(opts.quick)  # first, and before lazy is imported
    eager = measure_eager(s)
    lz = measure_lazy(s)
    print(f"median of {s.repeats} repeats:")
    print(table(eager, lz, ltc, "_us"))
    print(f"\nfastest of {s.repeats} repeats (what this costs without other load on the machine):")
    print(table(eager, lz, ltc, "_min_us"))
    print(f"\nlazy step split: record {fmt(lz['step_record_us'])} µs + mark_step {fmt(lz['step_sync_us'])} µs "
          f"(medians per step)")
    print(f"lazy counters over {lz['timed_steps']} timed steps: {lz['counters']}")
    if "error" in ltc:
        print(f"LTC worker failed: {ltc['error']}")
    else:
        print(f"LTC counters over the timed steps: {ltc['counters']}")
    print(f"total {time.perf_counter() - start:.1f} s")
    if opts.json:
        print(json.dumps({"eager": eager, "lazy": lz, "ltc": ltc}))


if __name__ == "__main__":
    main()
