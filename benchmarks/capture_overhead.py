"""What a cached ``@lazy.compile`` call costs around its kernel, side by side with eager and a cached torch.compile.

Measured in one run, each figure the fastest of interleaved rounds (the box is shared):
  1. a trivial function ``x + 1`` at 16x16: eager, the cached lazy.compile call (frame hook, guard program, replay,
     program) and the cached torch.compile call; lazy's call split into its guard check, its replay without the
     program, and the program's run (the kernel), so "overhead" is the call minus the program;
  2. guard checks: the guard program (C) and the Python check of the same entry, per entry and per guard, for the
     trivial function and for a function of 10 tensor arguments;
  3. a 200-op pointwise chain at 16x16: eager, cached lazy.compile, cached torch.compile (lazy's overhead apart from
     its kernel, as in 1);
  4. the frame hook's cost on a plain Python call that is not compiled (the hook installed vs not);
  5. the guard check of a captured training step (the 6x384 GPT of benchmarks/train_step.py, AdamW): with warm
     caches, and after a 64 MB sweep has evicted them (as a step's own work does between two checks), with and
     without the prefetch of what the last check read (Note [Prefetching what the last run read]) and the loads'
     memos (Note [Loads memoized by dict versions], both in csrc/guard_reads.cpp).

    python benchmarks/capture_overhead.py          # ~1 min
"""
from __future__ import annotations

import os
import statistics
import time

import torch
from common import chain, temp_dir

os.environ.setdefault("LAZY_COMPILER", "cpp")
os.environ["LAZY_CACHE_DIR"] = temp_dir("lazy-bench-cache-")
import lazy  # noqa: E402
import machine  # noqa: E402
from lazy import _C  # noqa: E402
from lazy.capture.function import state_of  # noqa: E402

L = "lazy"


def bench(fns: list, reps: int, inner: int = 20) -> list:
    """Fastest µs per call of each of ``fns``, interleaved (one batch of ``inner`` calls of each per round)."""
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t) / inner * 1e6)
    return best


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def program_arguments(fn, args: tuple) -> tuple:
    """(program, inputs, scalars) of one replay of ``fn``'s first entry on ``args``: what its program runs on."""
    entry = state_of(fn).entries[0]
    program, seen = entry.program, []
    run = program.run
    program.run = lambda inputs, scalars: seen.append((inputs, scalars)) or run(inputs, scalars)
    try:
        entry.run(args)
    finally:
        del program.run
    return program, seen[0][0], seen[0][1]


def lazy_split(fn, args: tuple) -> list:
    """µs per call of: the guard check, the replay (its program included) and the program alone, for ``fn``'s first
    entry on ``args``."""
    entry = state_of(fn).entries[0]
    program, inputs, scalars = program_arguments(fn, args)
    return [lambda: entry.check(args), lambda: entry.run(args), lambda: program.run(inputs, scalars)]


def row(name: str, eager: float, lazy_us: float, compiled: float) -> str:
    return f"{name:<42}{eager:10.2f}{lazy_us:14.2f}{compiled:16.2f}{lazy_us / eager:11.2f}x{lazy_us / compiled:9.2f}x"


def cached_call(title: str, f, plain, reps: int, inner: int = 20, **tolerance) -> None:
    """A cached call of ``lazy.compile(f)`` at 16x16 against eager and a cached torch.compile of ``plain`` (the same
    function, another object: ``f`` itself is compiled), and the lazy call split into its parts."""
    x = torch.randn(16, 16)
    xl = x.to(L)
    lazy.compile(f)
    tc = torch.compile(plain)
    for _ in range(3):
        f(xl)
        tc(x)
    torch.testing.assert_close(f(xl).cpu(), tc(x), **tolerance)
    torch.testing.assert_close(plain(x), tc(x), **tolerance)
    eager, lz, compiled, check, replay, kernel = bench(
        [lambda: plain(x), lambda: f(xl), lambda: tc(x)] + lazy_split(f, (xl,)), reps=reps, inner=inner)
    scalars = len(program_arguments(f, (xl,))[2])
    print(f"\n{title}, µs per cached call ({load()})")
    print(f"{'':<42}{'eager':>10}{'lazy.compile':>14}{'torch.compile':>16}{'lazy/eager':>12}{'lazy/tc':>10}")
    print(row("call", eager, lz, compiled))
    print(f"  lazy: overhead apart from the program {lz - kernel:.2f} µs: guard check {check:.2f}, replay without its "
          f"program {replay - kernel:.2f} ({scalars} runtime scalars), hook and handler {lz - check - replay:.2f}; "
          f"the program {kernel:.2f}")


def trivial() -> None:
    def f(x):
        return x + 1

    def plain(x):
        return x + 1

    cached_call("1. trivial function x + 1 at 16x16", f, plain, reps=300)


def guard_checks() -> None:
    names = [f"a{i}" for i in range(10)]
    src = f"def g({', '.join(names)}):\n    return {' + '.join(names)}\n"
    scope: dict = {}
    exec(compile(src, "<capture_overhead>", "exec"), scope)  # noqa: S102 -- a 10-argument function
    g = lazy.compile(scope["g"])
    args = tuple(torch.randn(16, 16).to(L) for _ in range(10))
    g(*args)
    g(*args)

    def f(x):
        return x * 2

    lazy.compile(f)
    x = torch.randn(16, 16).to(L)
    f(x)
    print(f"\n2. guard checks, µs per entry check ({load()})")
    print(f"{'entry':<34}{'guards':>8}{'C program':>12}{'Python':>10}{'C per guard':>14}{'residual':>10}")
    for name, fn, A in (("x * 2 (1 tensor)", f, (x,)), ("10 tensor arguments", g, args)):
        entry = state_of(fn).entries[0]
        assert entry.check(A) and entry.python_check(A)
        c, py = bench([lambda: entry.check(A), lambda: entry.python_check(A)], reps=300)
        print(f"{name:<34}{entry.num_guards:>8}{c:12.2f}{py:10.2f}{c / entry.num_guards:14.3f}"
              f"{len(entry.residual_guards):>10}")


def chain_200() -> None:
    def f(x):
        return chain(x)

    def plain(x):
        return chain(x)

    cached_call("3. 200-op pointwise chain at 16x16", f, plain, reps=100, inner=5, rtol=1e-4, atol=1e-5)


def hook_on_plain_calls() -> None:
    def callee(a, b):
        return a

    def caller():
        for i in range(100):
            callee(i, i)

    lazy.compile.reset()
    off = bench([caller], reps=200)[0]

    def registered(x):
        return x

    lazy.compile(registered)
    assert _C.capture_hook_installed()
    on = bench([caller], reps=200)[0]
    lazy.compile.reset()
    print(f"\n4. a plain Python call (not compiled), ns per call ({load()})")
    print(f"hook not installed {off * 10:.1f} ns, installed {on * 10:.1f} ns ({on / off:.2f}x: CPython calls Python "
          "functions through vectorcall, not inline, while any PEP 523 hook is installed)")


def step_guards() -> None:
    from train_step import loss_of, make_batch, make_model  # the benchmarks' directory is the script's
    torch.manual_seed(0)
    model = make_model("gpt6x384").to(L)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [make_batch("gpt6x384", i, 1) for i in range(3)]

    def step(x, y):
        loss = loss_of("gpt6x384", model(x.to(L)), y.to(L))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    lazy.compile(step)
    for b in batches:
        step(*b)
    entry = state_of(step).entries[-1]
    program, A = entry.guard_program, batches[0]
    assert program(A)
    sweep = torch.empty(64 << 20, dtype=torch.uint8)
    print(f"\n5. a captured 6x384 GPT step's guard check ({entry.num_guards} guards, {program.size} instructions), µs "
          f"({load()})")
    for prefetch, memos in ((False, False), (True, False), (False, True), (True, True)):
        _C.set_guard_prefetch(prefetch)
        _C.set_guard_memos(memos)
        warm, cold = [], []
        for _ in range(40):
            program(A)
            start = time.perf_counter()
            program(A)
            warm.append(time.perf_counter() - start)
            sweep.add_(1)  # evicts the caches
            start = time.perf_counter()
            program(A)
            cold.append(time.perf_counter() - start)
        print(f"prefetch {'on ' if prefetch else 'off'}, memos {'on ' if memos else 'off'}: warm "
              f"{min(warm) * 1e6:7.1f} (median {statistics.median(warm) * 1e6:7.1f}), after a 64 MB sweep "
              f"{min(cold) * 1e6:7.1f} (median {statistics.median(cold) * 1e6:7.1f})")
    _C.set_guard_prefetch(True)
    _C.set_guard_memos(True)
    lazy.compile.reset()


def main() -> None:
    print(machine.describe())
    lazy.config.capture_verify = False
    trivial()
    guard_checks()
    chain_200()
    hook_on_plain_calls()
    step_guards()


if __name__ == "__main__":
    main()
