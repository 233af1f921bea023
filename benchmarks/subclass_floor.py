"""What one recorded op costs under autograd, against the floor of any ``__torch_dispatch__`` subclass.

Times ``h * 2.0``, ``h.relu()`` and ``F.linear`` on small tensors (8×32) for eager CPU, a do-nothing wrapper
subclass (``__torch_dispatch__`` returns a new wrapper at once) and lazy (recording only, no sync), each with and
without ``requires_grad``. Under autograd every op reaches a subclass through the dispatcher's Python key, and
that round trip, not lazy's recorder, sets the per-op cost (benchmarks/README.md, "train_step.py, session 5").

    python benchmarks/subclass_floor.py          # ~15 s
"""
import time

import torch
import torch.nn.functional as F

import lazy
import machine


class DoNothing(torch.Tensor):
    """A wrapper subclass whose ops do no work: the cost of reaching ``__torch_dispatch__`` and making a result."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        a = args[0]
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, a.stride(), a.storage_offset(), None, a.dtype,
                                                   torch.strided, torch.device("meta"))


def fastest_us(fn, n: int = 3000, reps: int = 7) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def tensors(kind: str, grad: bool) -> tuple:
    shapes = ((8, 32), (16, 32), (16,))
    if kind == "subclass":
        made = [torch.Tensor._make_wrapper_subclass(DoNothing, s, torch.empty(s).stride(), 0, None, torch.float32,
                                                    torch.strided, torch.device("meta")) for s in shapes]
    else:
        made = [torch.randn(s).to("lazy" if kind == "lazy" else "cpu") for s in shapes]
        lazy.mark_step()
    return tuple(t.requires_grad_(grad) for t in made)


def main() -> None:
    ops = {"h * 2.0": lambda h, w, b: h * 2.0, "h.relu()": lambda h, w, b: h.relu(),
           "F.linear(h, w, b)": lambda h, w, b: F.linear(h, w, b)}
    torch.set_num_threads(1)
    print(machine.describe())
    print("µs per op, fastest of 7 x 3000")
    print(f"{'op':<20}{'grad':>6}{'eager':>9}{'subclass':>10}{'lazy':>9}{'lazy/eager':>12}{'lazy/subclass':>15}")
    for name, op in ops.items():
        for grad in (False, True):
            row = {}
            for kind in ("eager", "subclass", "lazy"):
                args = tensors(kind, grad)
                row[kind] = fastest_us(lambda: op(*args))
            print(f"{name:<20}{str(grad):>6}{row['eager']:9.2f}{row['subclass']:10.2f}{row['lazy']:9.2f}"
                  f"{row['lazy'] / row['eager']:11.2f}x{row['lazy'] / row['subclass']:14.2f}x")


if __name__ == "__main__":
    main()
