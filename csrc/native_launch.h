// Asynchronous launches of programs that run in C, on a C++ thread that never takes the GIL (native_launch.cpp,
// Note [Launches on a C thread]).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// native_configure(omp_set_num_threads, mkl_set_num_threads_local): the addresses (or None) of the setters the
// launch thread calls to size its OpenMP teams and MKL calls (Note [Thread budget of the worker]).
PyObject* native_configure(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// native_submit(runner, pointers, scalars, values, forwards, arena_lo, arena_hi, epoch, threads, arena) -> job:
// queues a run of a make_runner program. The pointer array is copied, the scalars packed (float and int of each);
// ``values`` (None or a tensor per buffer) are set before the run, with their addresses; ``forwards`` (buffer id,
// job, its buffer id) read an earlier job's buffer when this one starts; ``arena`` (or None), the memory the
// pointers reach, is held as long as the job.
PyObject* native_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// native_done(job) -> bool; native_wait(job): until it is done (the GIL released); native_threads(job) -> the
// OpenMP/MKL threads it ran with (0 until done), native_submit's ``threads``.
PyObject* native_done(PyObject* self, PyObject* job);
PyObject* native_wait(PyObject* self, PyObject* job);
PyObject* native_threads(PyObject* self, PyObject* job);

// caller_threads(openmp, mkl) -> (openmp, mkl) before: sets the calling thread's own OpenMP count and MKL count
// (MKL_Set_Num_Threads_Local: 0 is MKL's global setting) through native_configure's setters, for a program run in
// place on a thread budget (Note [Thread budget of the worker]); what it returns restores them.
PyObject* caller_threads(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// native_finish(job, wanted) -> (error bits, results) as run_program returns them, None where the job did not run
// (an earlier job of its epoch failed); raises the error an ATen call raised. Waits for the job first.
PyObject* native_finish(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// placeholders([(like, shape, stride), ...]) -> tensors of like's dtype and device with those sizes and strides over
// an empty storage: what a launched program's outputs are until it has run (lazy/sync/launch.py).
PyObject* placeholders(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// adopt_outputs(placeholders, outputs) -> indices left to the caller: placeholders[k].set_(outputs[k]) where the two
// have the same dtype, sizes and strides (the others need a copy into the promised layout).
PyObject* adopt_outputs(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
