"""Time one training step (forward, backward, AdamW) of the test models on lazy, eager CPU, torch.compile and LTC.

    python benchmarks/train_step.py                  # ~3 min on 2 cores, most of it torch.compile compiling
    python benchmarks/train_step.py --quick          # fewer steps
    python benchmarks/train_step.py --models mlp,gpt --backends eager,lazy --size 64 --steps 100
    python benchmarks/train_step.py --device cuda     # eager CUDA, torch.compile on CUDA, lazy backed by CUDA
    python benchmarks/train_step.py --isa native,avx2 # once per instruction set (benchmarks/common.py)

Models, batches and losses are those of tests/models.py (MLP, CNN with BatchNorm/GroupNorm, Transformer encoder
layer, tiny GPT); the batch is moved to the device inside the step. Every backend runs the same steps from the same
initial weights, so the final losses agree up to rounding (a sanity check printed under the table). Time per step
is the median over --steps steps after --warmup steps, wall clock, each step ending in a sync (under the tiered
compiler, the warmup steps count from the last step that ran while its kernels compiled, Triton's on cuda or g++'s
in the background on the cpu, so the timed steps run them; the loss reported is still step warmup + steps's).
With --device cuda, where eager and lazy steps both return before the GPU is done, it is the wall time of all timed
steps, the GPU synchronized at the end, divided by their number:

- eager:         plain PyTorch on the CPU.
- lazy:          this project; lazy.mark_step() per step, asynchronous execution on (the default, LAZY_ASYNC=1:
                 a step's program runs while the next step records; at most two programs in flight, so the median
                 step is the steady-state cost). Compiles and graph-cache hits come from lazy.metrics.counters().
                 With --device cuda a sync returns once its program is enqueued (a CUDA graph once cached), and the
                 GPU runs it while the next step records.
- lazy-sync:     the same with LAZY_ASYNC=0: each step records, then runs its program, on all threads. Its steps are
                 also split into recording alone (the step less its program's run, lazy.metrics' run_time_s) and
                 run alone: an asynchronous step can at best take the larger of the two (the table under the others).
- capture:       the whole step (forward, backward, optimizer) under @lazy.compile: captured at the first step,
                 replayed from the second without recording.
- capture-ro:    the same with mode="reduce-overhead": on a cuda backing device each replay is one CUDA graph
                 launch (lazy/runtime/cuda_graph.py); elsewhere as capture.
- torch.compile: torch.compile(model) with the default (inductor) backend; the optimizer step runs eagerly unless
                 --compile-optimizer. The first step (the compile) is reported separately; inductor's on-disk cache
                 makes it shorter on later runs.
- LTC:           PyTorch's own lazy tensors (torch._lazy, TorchScript backend), torch._lazy.mark_step() per step.
                 NOTE: LTC registers kernels on the same Lazy dispatch key as `lazy`, so it runs in a subprocess
                 (this script with --worker ltc, which never imports lazy) and reports JSON on stdout.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch

import machine
from common import add_isa_argument, isa_line, rerun_per_isa, restrict_inductor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from models import MODELS, TinyGPT, batch, loss_fn  # noqa: E402

# GPU-sized models: the GPT of the project's issues (6 layers of width 384, 6 heads, context 256, tied embeddings)
# and a transformer encoder of the same size (nn.TransformerEncoderLayer, post-norm, ReLU, feed-forward 4x) that
# classifies a sequence of 256 tokens into 3 classes from its mean.
class LargeEncoder(torch.nn.Module):
    def __init__(self, vocab: int = 65, d: int = 384, heads: int = 6, layers: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.embed(idx)).mean(1))


# Client code: transformers' GPT-2 (2 layers of width 64, 4 heads), as a user builds it, trained on the tiny
# GPT's batches; its forward returns the ModelOutput's logits. Only where transformers is installed.
class HFGPT2(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers
        config = transformers.GPT2Config(vocab_size=65, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        self.model = transformers.GPT2LMHeadModel(config)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx).logits


LARGE = {"gpt6x384": lambda: TinyGPT(vocab=65, d=384, heads=6, layers=6, block=256),
         "encoder6x384": LargeEncoder}
CLIENTS = {"hf-gpt2": HFGPT2}
ALL_MODELS = {**MODELS, **LARGE, **CLIENTS}


def make_model(kind: str) -> torch.nn.Module:
    return ALL_MODELS[kind]()


def make_batch(kind: str, step: int, size: int) -> tuple:
    if kind in LARGE:
        g = torch.Generator().manual_seed(1000 + step)
        seq = torch.randint(0, 65, (size, 257), generator=g)
        if kind.startswith("encoder"):
            return seq[:, :-1], torch.randint(0, 3, (size,), generator=g)
        return seq[:, :-1], seq[:, 1:]
    return batch("gpt" if kind in CLIENTS else kind, step, "cpu", size=size)


def loss_of(kind: str, out, y):
    # a large model's loss is its small namesake's; a client GPT's the tiny GPT's
    return loss_fn("gpt" if kind in CLIENTS else kind.split("6x384")[0], out, y)

BACKENDS = ("eager", "lazy", "lazy-sync", "capture", "capture-ro", "compile", "ltc")
RESULT_PREFIX = "RESULT "
WARM_LIMIT_S = 120.0  # how long warmup waits for kernels compiling under the tiered compiler (time_training)


def describe(e: Exception) -> str:
    """The exception's type and first line, for the table's error notes."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def time_training(kind: str, device: str, sync, args, wrap=None, wrap_step=None, compile_step=None,
                  run_clock=None, warming=None) -> dict:
    """Run warmup + timed steps of ``kind`` on ``device``; ``sync()`` ends each step; ``compile_step`` wraps the
    whole step function; ``run_clock()``, if given, is the time spent running programs so far (seconds);
    ``warming()``, if given, counts the runs so far that ran while their kernels compiled (tiered): the warmup
    steps count from the last step that did (for at most WARM_LIMIT_S), so the timed steps are the steady state.
    The loss reported is the one of step ``warmup + steps`` whatever the warmup, so every backend's is comparable.

    Returns the first step's time, the median steady-state step time (both in ms) and the final loss; with
    ``run_clock``, also the median and fastest step split into recording (the step less its program's run) and run.
    """
    torch.manual_seed(0)
    model = make_model(kind).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = wrap(model) if wrap else model
    opt_step = wrap_step(opt.step) if wrap_step else opt.step

    def train_step(x, y):
        loss = loss_of(kind, forward(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt_step()
        return loss

    def finish() -> None:
        """Wait for everything launched: lazy's programs, then the GPU."""
        if device == "lazy" and "lazy" in sys.modules:  # not in the LTC worker, which never imports lazy
            sys.modules["lazy"].wait_device_ops()
        if args.device == "cuda":
            torch.cuda.synchronize()

    step_fn = compile_step(train_step) if compile_step else train_step
    batches = [make_batch(kind, i, args.size) for i in range(8)]
    times, runs = [], []
    warmup, started, warm_runs, reported = args.warmup, time.perf_counter(), 0, None
    step = 0
    while step < warmup + args.steps:
        x, y = batches[step % len(batches)]
        if step == warmup:
            finish()
            timed_start = time.perf_counter()
        ran = run_clock() if run_clock else 0.0
        start = time.perf_counter()
        loss = step_fn(x, y)
        sync()
        times.append(time.perf_counter() - start)
        runs.append((run_clock() - ran) if run_clock else 0.0)
        if step == 0:
            finish()
            times[0] = time.perf_counter() - start
        if step == args.warmup + args.steps - 1:
            reported = loss.detach()
        if warming is not None and step < warmup and time.perf_counter() - started < WARM_LIMIT_S:
            warm_runs, before = warming(), warm_runs
            if warm_runs > before:
                warmup = step + 1 + args.warmup
        step += 1
    finish()
    average = (time.perf_counter() - timed_start) / args.steps
    timed, timed_runs = times[warmup:], runs[warmup:]
    median = statistics.median(timed)
    # on cuda a step's call returns once its work is enqueued: its median is the host time per step
    result = {"first_ms": times[0] * 1e3, "ms": (average if args.device == "cuda" else median) * 1e3,
              "min_ms": min(timed) * 1e3, "host_ms": median * 1e3, "loss": float(reported.cpu()),
              "warm_steps": warmup}
    if run_clock:
        recording = [t - r for t, r in zip(timed, timed_runs)]
        result.update(rec_ms=statistics.median(recording) * 1e3, rec_min_ms=min(recording) * 1e3,
                      run_ms=statistics.median(timed_runs) * 1e3, run_min_ms=min(timed_runs) * 1e3)
    return result


def run_eager(kind: str, args) -> dict:
    return time_training(kind, args.device, lambda: None, args)


def run_lazy(kind: str, args, asynchronous: bool = True, capture: bool = False, mode: str = "default") -> dict:
    import lazy

    lazy.metrics.reset()
    # A synchronous step splits into recording and its program's run (lazy.sync times the run on the calling
    # thread): what an asynchronous step overlaps. Only on the cpu, where a run ends when its kernels do.
    split = not asynchronous and not capture and args.device == "cpu"
    asynchronous = asynchronous and args.device == "cpu"  # on cuda the GPU runs a program while the host records
    with lazy.config.override(async_execution=asynchronous, backing_device=args.device):
        compile_step = (lambda f: lazy.compile(f, mode=mode)) if capture else None
        result = time_training(kind, "lazy", lazy.mark_step, args, compile_step=compile_step,
                               run_clock=(lambda: lazy.metrics.counter("run_time_s")) if split else None,
                               warming=lambda: lazy.metrics.counter("warming_runs"))
        lazy.wait_device_ops()
    counters = lazy.metrics.counters()
    result["compiles"] = int(counters.get("compiles", 0))
    result["hits"] = int(counters.get("graph_cache.hit", 0))
    if capture:
        result["replays"] = int(counters.get("capture.replays", 0))
        result["graph_replays"] = int(counters.get("cuda_graph.replays", 0))
    return result


def run_compile(kind: str, args) -> dict:
    import torch._dynamo
    torch._dynamo.reset()
    return time_training(kind, args.device, lambda: None, args, wrap=torch.compile,
                         wrap_step=torch.compile if args.compile_optimizer else None)


def run_ltc_worker(args) -> None:
    """Subprocess entry: time every model on torch._lazy and print one JSON line. Never imports `lazy`."""
    import torch._lazy
    import torch._lazy.metrics
    import torch._lazy.ts_backend
    torch._lazy.ts_backend.init()

    def sync() -> None:
        torch._lazy.mark_step()
        torch._lazy.wait_device_ops()

    results = {}
    for kind in args.models:
        torch._lazy.metrics.reset()
        try:
            results[kind] = time_training(kind, "lazy", sync, args)
            results[kind]["compiles"] = int(torch._lazy.metrics.counter_value("UncachedCompile") or 0)
            results[kind]["hits"] = int(torch._lazy.metrics.counter_value("CachedCompile") or 0)
        except Exception as e:  # noqa: BLE001 -- a failing model is reported, the others still run
            results[kind] = {"error": describe(e)}
    print(RESULT_PREFIX + json.dumps(results), flush=True)


def run_ltc(args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "ltc", "--models", ",".join(args.models),
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--size", str(args.size),
           "--threads", str(args.threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ltc_timeout)
    except subprocess.TimeoutExpired:
        return {kind: {"error": f"LTC worker timed out after {args.ltc_timeout} s"} for kind in args.models}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {kind: {"error": f"LTC worker exited with {proc.returncode}: {last}"} for kind in args.models}


def fmt_ms(result: dict | None, key: str = "ms") -> str:
    if result is None:
        return "-"
    return "error" if "error" in result else f"{result.get(key, result['ms']):.2f}"


def fmt_ratio(a: dict | None, b: dict | None, key: str = "ms") -> str:
    if not a or not b or "error" in a or "error" in b:
        return "-"
    return f"{a.get(key, a['ms']) / b.get(key, b['ms']):.2f}x"


def print_report(results: dict, args) -> None:
    ratios = [(a, b) for a in ("lazy", "lazy-sync", "capture", "capture-ro") for b in ("eager", "compile")
              if a in args.backends and b in args.backends]
    tables = (("ms", "median ms per step"), ("min_ms", "fastest step, ms (the better estimate on a shared machine)"))
    if args.device == "cuda":
        tables = (("ms", "ms per step (wall time of the timed steps / steps)"),
                  ("host_ms", "host ms per step (median time until a step's call returns)"))
    for key, title in tables:
        print(f"{title}:")
        header = f"{'model':8} " + " ".join(f"{b:>9}" for b in args.backends) + " " + \
            " ".join(f"{a + '/' + b:>17}" for a, b in ratios)
        print(header)
        print("-" * len(header))
        for kind in args.models:
            r = results[kind]
            print(f"{kind:8} " + " ".join(f"{fmt_ms(r.get(b), key):>9}" for b in args.backends) + " " +
                  " ".join(f"{fmt_ratio(r.get(a), r.get(b), key):>17}" for a, b in ratios))
        print()
    if "lazy-sync" in args.backends:
        print_split(results, args)
    print("first step (ms; includes tracing and compiling), compiles / cache hits, final loss:")
    errors = []
    for kind in args.models:
        cells = []
        for backend in BACKENDS:
            r = results[kind].get(backend)
            if r is None:
                continue
            if "error" in r:
                cells.append(f"{backend} error")
                errors.append(f"{kind} on {backend}: {r['error']}")
                continue
            cell = f"{backend} {r['first_ms']:.0f}"
            if "compiles" in r:
                cell += f" ({r['compiles']} compiles / {r['hits']} hits"
                cell += f", {r['graph_replays']} CUDA-graph replays)" if r.get("graph_replays") else ")"
            if r.get("warm_steps", args.warmup) > args.warmup:  # tiered: its Triton kernels compiled meanwhile
                cell += f" timed after {r['warm_steps']} warmup steps"
            cells.append(cell + f" loss {r['loss']:.4f}")
        print(f"  {kind:8} " + "; ".join(cells))
    for line in errors:
        print(f"  error: {line}")


def print_split(results: dict, args) -> None:
    """The plain loop's step split into recording alone and its program's run alone (from the lazy-sync steps), and
    the asynchronous step against the larger of the two: what overlapping them could reach at best."""
    print("plain mark_step loop: recording alone and run alone (lazy-sync steps split), asynchronous step; median "
          "(fastest), ms:")
    header = f"{'model':8} {'record':>13} {'run':>13} {'async':>13} {'sync':>13} {'eager':>13} " \
             f"{'async/max(rec,run)':>19} {'async/eager':>12}"
    print(header)
    print("-" * len(header))
    for kind in args.models:
        r = results[kind]
        sync, lz, eager = r.get("lazy-sync"), r.get("lazy"), r.get("eager")
        if not sync or "error" in sync or "rec_ms" not in sync:
            continue

        def cell(res, key="ms", fastest="min_ms"):
            return f"{res[key]:.2f} ({res[fastest]:.2f})" if res and "error" not in res else "-"

        bound = max(sync["rec_ms"], sync["run_ms"])
        bound_min = max(sync["rec_min_ms"], sync["run_min_ms"])
        ratio = f"{lz['ms'] / bound:.2f} ({lz['min_ms'] / bound_min:.2f})" if lz and "error" not in lz else "-"
        to_eager = f"{lz['ms'] / eager['ms']:.2f}x" if lz and eager and "error" not in lz and "error" not in eager \
            else "-"
        print(f"{kind:8} {cell(sync, 'rec_ms', 'rec_min_ms'):>13} {cell(sync, 'run_ms', 'run_min_ms'):>13} "
              f"{cell(lz):>13} {cell(sync):>13} {cell(eager):>13} {ratio:>19} {to_eager:>12}")
    print()


def merge_rounds(old: dict | None, new: dict) -> dict:
    """Of interleaved rounds of one backend: the round with the lowest median, with the fastest step of all."""
    if old is None or "error" in old:
        return new
    if "error" in new:
        return old
    best = dict(new if new["ms"] < old["ms"] else old)
    for key in ("min_ms", "rec_min_ms", "run_min_ms"):
        if key in old and key in new:
            best[key] = min(old[key], new[key])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {','.join(ALL_MODELS)} (gpt6x384, "
                             "encoder6x384: for a GPU; hf-gpt2: transformers' GPT-2)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, from {','.join(BACKENDS)}")
    parser.add_argument("--size", type=int, default=32, help="batch size")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (median reported)")
    parser.add_argument("--quick", action="store_true", help="2 warmup and 8 timed steps")
    parser.add_argument("--compile-optimizer", action="store_true", help="also torch.compile the AdamW step")
    parser.add_argument("--ltc-timeout", type=int, default=180, help="seconds before the LTC worker is abandoned")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every backend this many times, interleaved; report each one's best round")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: eager's device and lazy's backing device")
    parser.add_argument("--worker", choices=["ltc"], help=argparse.SUPPRESS)
    add_isa_argument(parser)
    args = parser.parse_args()
    args.models = args.models.split(",")
    args.backends = args.backends.split(",")
    for name in args.models:
        if name not in ALL_MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(ALL_MODELS)}")
    for name in args.backends:
        if name not in BACKENDS:
            parser.error(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if args.quick:
        args.warmup, args.steps = 2, 8
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker == "ltc":
        run_ltc_worker(args)
        return
    if rerun_per_isa(args.isa, sys.argv):  # one process per instruction set (benchmarks/common.py)
        return
    restrict_inductor()

    print(machine.describe())
    if args.device == "cpu":
        print(isa_line())
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} (1 min) on {os.cpu_count()} CPUs")
    if load > 0.5 * (os.cpu_count() or 1):
        print(f"NOTE: load average {load:.1f} on {os.cpu_count()} cores: other processes compete, timings are noisy "
              f"(--threads 1 is steadier)")
    print(f"batch size {args.size}, AdamW, median of {args.steps} steps after {args.warmup} warmup steps\n")
    start = time.perf_counter()
    runners = {"eager": run_eager, "lazy": run_lazy, "compile": run_compile,
               "lazy-sync": lambda kind, args: run_lazy(kind, args, asynchronous=False),
               "capture": lambda kind, args: run_lazy(kind, args, capture=True),
               "capture-ro": lambda kind, args: run_lazy(kind, args, capture=True, mode="reduce-overhead")}
    results = {kind: {} for kind in args.models}
    for _ in range(args.rounds):
        for kind in args.models:
            for backend in args.backends:
                if backend == "ltc":
                    continue
                t0 = time.perf_counter()
                try:
                    done = runners[backend](kind, args)
                except Exception as e:  # noqa: BLE001 -- e.g. torch.compile without a working C++ compiler
                    traceback.print_exc(limit=2)
                    done = {"error": describe(e)}
                results[kind][backend] = merge_rounds(results[kind].get(backend), done)
                print(f"  {kind} {backend}: {done['error'] if 'error' in done else fmt_ms(done) + ' ms/step'} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    if "ltc" in args.backends:
        t0 = time.perf_counter()
        for kind, result in run_ltc(args).items():
            results[kind]["ltc"] = result
        print(f"  ltc worker: {time.perf_counter() - t0:.1f} s", flush=True)
    print()
    print_report(results, args)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
