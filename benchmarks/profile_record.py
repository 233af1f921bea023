"""Where the recording and mark_step time of lazy goes (the numbers behind benchmarks/README.md).

  python benchmarks/profile_record.py              cProfile of recording 2000 ops and of 50 cached mark_steps, and a
                                                   timed split of one mark_step (linearize / lookup / run / rest)
  python benchmarks/profile_record.py --callgrind  instructions per recorded op and per mark_step under valgrind's
                                                   callgrind, for eager, a do-nothing __torch_dispatch__ subclass,
                                                   lazy and torch._lazy (each in its own process; ~5 minutes)

Instruction counts are deterministic (±0.3 % run to run), unlike timings on a shared machine: use them to compare
two versions of the hot path. Counts are differential (2N ops minus N ops), so start-up and the valgrind control
calls cancel out; callgrind_control switches instrumentation on only around the measured code.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import os
import pstats
import statistics
import subprocess
import sys
import time

import torch

# steady state from the tier-up on: g++ runs in place, not in the background (Note [C++ compiles in the background])
os.environ.setdefault("LAZY_COMPILE_BACKGROUND", "0")
import machine  # noqa: E402 -- after the environment above

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_overhead import STEP_OPS, chain  # noqa: E402

N = 200  # ops per callgrind phase (and 2N)


# ---------------------------------------------------------------------------------------------------------------
# cProfile and a timed split of mark_step

def profile() -> None:
    import lazy
    from lazy import sync
    from lazy.cache import graph_cache
    from lazy.debug.log import user_frame
    from lazy.device.tensor import pending_storages
    from lazy.ir.graph import linearize

    x0 = torch.randn(16, 16).to("lazy")
    lazy.mark_step()
    chain(x0, 2000)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        chain(x0, 2000)
    prof.disable()
    print("== recording 5 x 2000 ops (cProfile, by own time) ==")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)

    x = torch.randn(16, 16).to("lazy")
    for _ in range(5):
        x = chain(x, STEP_OPS)
        lazy.mark_step()
    prof = cProfile.Profile()
    for _ in range(50):
        x = chain(x, STEP_OPS)
        prof.enable()
        lazy.mark_step()
        prof.disable()
    print(f"== 50 cached mark_steps of a {STEP_OPS}-op graph (cProfile, by own time) ==")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    # The same steps as sync_nodes, timed one by one (medians over 40 steps).
    parts: dict = {k: [] for k in ("user_frame", "linearize", "cache lookup", "executor run", "mark_step total")}
    xe = torch.randn(16, 16)
    eager = []
    for _ in range(40):
        y = chain(x, STEP_OPS)
        pending = pending_storages()
        t0 = time.perf_counter()
        user_frame()
        t1 = time.perf_counter()
        lin = linearize([st.value for st in pending])
        t2 = time.perf_counter()
        program, hit = graph_cache.lookup(lin, sync.backing_device())
        t3 = time.perf_counter()
        program.run(lin.leaves, lin.scalars)
        t4 = time.perf_counter()
        assert hit, "not a cache hit: the split below would include a compile"
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v)
        t0 = time.perf_counter()
        lazy.mark_step()  # the real one (the graph is the same: it hits the cache)
        parts["mark_step total"].append(time.perf_counter() - t0)
        x = y
        t0 = time.perf_counter()
        chain(xe, STEP_OPS)
        eager.append(time.perf_counter() - t0)
    print(f"== one cached mark_step of {len(lin.order)} nodes, medians of 40 ==")
    for k, v in parts.items():
        print(f"  {statistics.median(v) * 1e6:8.1f} µs  {k}")
    print(f"  {statistics.median(eager) * 1e6:8.1f} µs  (eager: the same {STEP_OPS} ops run directly)")


# ---------------------------------------------------------------------------------------------------------------
# callgrind: instructions per op

def _ctl(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)


def _phase(label: str, fn) -> None:  # noqa: ANN001
    gc.collect()
    _ctl("-i", "on")
    _ctl("-z")
    fn()
    _ctl("-d", label)
    _ctl("-i", "off")


def callgrind_worker(which: str) -> None:
    """Runs under valgrind: dumps one profile per phase, labelled ``<which>:<what>``."""
    if which == "ltc":
        ltc = importlib.import_module("torch._lazy")
        importlib.import_module("torch._lazy.ts_backend").init()
        x0 = torch.randn(16, 16).to("lazy")

        def sync() -> None:
            ltc.mark_step()
            ltc.wait_device_ops()
    elif which == "lazy":
        import lazy
        x0 = torch.randn(16, 16).to("lazy")
        sync = lazy.mark_step
    elif which == "subclass":
        class Noop(torch.Tensor):
            """Records nothing: what the dispatcher's round trip into Python costs by itself."""
            __torch_function__ = torch._C._disabled_torch_function_impl

            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
                return x0

        x0 = torch.Tensor._make_wrapper_subclass(Noop, (16, 16), (16, 1), 0, None, torch.float32, torch.strided,
                                                 torch.device("lazy", 0))
        sync = None
    else:
        x0 = torch.randn(16, 16)
        sync = None
    if sync is not None:
        sync()
    chain(x0, N)  # warm: shape memo, handler tables
    for n in (N, 2 * N):
        _phase(f"{which}:{n}", lambda: chain(x0, n))
    if sync is None:
        return
    x = torch.randn(16, 16).to("lazy")
    for _ in range(4):
        x = chain(x, STEP_OPS)
        sync()
    for what in ("empty", "sync"):
        y = chain(x, STEP_OPS)
        _phase(f"{which}:{what}", sync if what == "sync" else (lambda: None))
        x = y
        sync()


def callgrind() -> None:
    import glob
    import re
    import tempfile
    python = os.path.realpath(sys.executable)  # not a pyenv shim: valgrind must run the interpreter itself
    out = tempfile.mkdtemp(prefix="lazy_callgrind_")
    counts: dict = {}
    for which in ("eager", "subclass", "lazy", "ltc"):
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/{which}.%p",
               python, os.path.abspath(__file__), "--callgrind-worker", which]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        for path in glob.glob(f"{out}/{which}.*"):
            text = open(path).read()
            label = re.search(r"desc: Trigger: dump (\S+)", text)
            if label:
                counts[label.group(1)] = int(re.search(r"summary: (\d+)", text).group(1))
    print(f"instructions (callgrind; profiles in {out}):")
    for which in ("eager", "subclass", "lazy", "ltc"):
        per_op = (counts[f"{which}:{2 * N}"] - counts[f"{which}:{N}"]) / N
        line = f"  {which:9s} {per_op:9,.0f} per op"
        if f"{which}:sync" in counts:
            line += f"   mark_step of {STEP_OPS} ops: {counts[f'{which}:sync'] - counts[f'{which}:empty']:,}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callgrind", action="store_true", help="instruction counts under valgrind (slow)")
    parser.add_argument("--callgrind-worker", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.callgrind_worker:
        callgrind_worker(opts.callgrind_worker)
    elif opts.callgrind:
        print(machine.describe())
        callgrind()
    else:
        print(machine.describe())
        profile()


if __name__ == "__main__":
    main()
