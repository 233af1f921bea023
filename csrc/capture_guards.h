// Guard programs of lazy.compile entries, evaluated in C (capture_guards.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// Readies the GuardProgram type; false with a Python error set on failure.
bool init_guard_types();

// guard_program(instructions, nregs, lazy_type, module_type[, outputs]) -> GuardProgram: ``instructions`` a list of
// (op, dst, src, n, a, b) (Note [Guard programs]); the program called on the bound arguments returns whether every
// guard holds, or, given ``outputs`` (register indices), the tuple of those registers' values: a replay's loads
// (Note [Replay loads in C]).
PyObject* guard_program(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// set_guard_prefetch(enabled): whether programs prefetch what their last run read (Note [Prefetching what the last
// run read]); on by default, off only to measure it (benchmarks/capture_overhead.py).
PyObject* set_guard_prefetch(PyObject* self, PyObject* enabled);

// set_guard_memos(enabled): whether programs' loads reuse what they read while its dicts are unchanged (Note [Loads
// memoized by dict versions] in guard_reads.cpp); on by default, off only to measure or test them.
PyObject* set_guard_memos(PyObject* self, PyObject* enabled);

}  // namespace lazy
