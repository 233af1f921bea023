"""Compiled programs write their outputs into the outputs of their earlier runs that nothing references any more.

Note [Reused outputs]
A graph's outputs become the data of lazy tensors, so every run of a cached program used to write them into fresh
tensors: a ``torch.empty`` each (1.5-2 us from Python: a training step's parameters, optimizer state and gradients
are 50-250 of them, about a tenth of a small captured step), and for large outputs fresh pages that the kernel
faults in and zeroes at first touch (``x * 2 + 1`` at 4096^2 ran at 66 % of ``copy_``'s bandwidth). In a training
loop the outputs of run N-1 are dead by run N+1: the storages they were bound to hold run N's values now. So a
program keeps, per buffer it allocates, the tensors of its last two runs (its *spares*), and a run writes into one
that nothing else can see, else into a fresh tensor (csrc/outputs.cpp):
- **Nothing else can see it** is checked, never assumed: the Python object, its TensorImpl and its StorageImpl
  each have exactly one reference (the spare list's) and no weak one, so no lazy tensor, data leaf, view, user
  variable or C++ holder (autograd, another thread's run) reaches the memory; and it still has its shape,
  contiguous over all of its storage. A spare that fails stays; the oldest goes when a new tensor comes.
- **Memory.** Spares hold at most one extra copy of a program's outputs once they are dead (the other is the live
  one, bound to the storages). All programs together keep at most ``config.spare_bytes`` (LAZY_SPARE_BYTES, 256
  MiB by default; 0 disables it): the programs run last keep theirs, and one that would not fit on its own keeps
  none (``SpareBudget``).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, List, Optional

from ..config import config
from ..debug import metrics


class SpareBudget:
    """The programs holding spares, least recently run first, and their bytes (at most config.spare_bytes)."""

    def __init__(self) -> None:
        self.holders: "OrderedDict[int, tuple]" = OrderedDict()  # id(program) -> (weakref, bytes)
        self.bytes = 0

    def admit(self, program: Any) -> Optional[List[Any]]:
        """The spares list of ``program`` (one entry per buffer id) for this run, or None if it keeps none."""
        limit = config.spare_bytes
        if limit <= 0:
            if self.holders:
                self.clear()
            return None
        key = id(program)
        held = self.holders.get(key)
        if held is not None and held[0]() is program:
            self.holders.move_to_end(key)
            return program._spares
        if program.spare_bytes <= 0 or program.spare_bytes > limit:
            return None
        while self.holders and self.bytes + program.spare_bytes > limit:
            self._evict(next(iter(self.holders)))
        ref = weakref.ref(program, lambda _, key=key: self._forget(key))
        self.holders[key] = (ref, program.spare_bytes)
        self.bytes += program.spare_bytes
        program._spares = [[] for _ in range(program.num_buffers)]
        return program._spares

    def _evict(self, key: int) -> None:
        ref, nbytes = self.holders.pop(key)
        self.bytes -= nbytes
        program = ref()
        if program is not None:
            program._spares = None
            metrics.bump("spares.evicted")

    def _forget(self, key: int) -> None:
        held = self.holders.pop(key, None)
        if held is not None:
            self.bytes -= held[1]

    def clear(self) -> None:
        for key in list(self.holders):
            self._evict(key)


BUDGET = SpareBudget()
