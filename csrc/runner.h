// A compiled cpu program run in C, without the GIL: its kernel segments and its extern ATen calls (runner.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// make_runner(steps, num_buffers, include_raw, exclude_raw) -> capsule: the plan of a program whose externs are all
// ATen operators called with flat arguments (lazy/runtime/cpp_native.py builds ``steps``; the raw dispatch key sets
// are those eager code runs under: Note [Executing inside __torch_dispatch__]).
PyObject* make_runner(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// run_program(runner, pointers, doubles, int64s, values, arena_lo, arena_hi, wanted) -> (error bits, results):
// runs every step with the GIL released. ``values``: (buffer id, tensor) of every buffer set before the run (leaves,
// allocated outputs, arena views); ``wanted``: the buffer ids of extern results to return, as (id, tensor) pairs.
PyObject* run_program(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
