// A compiled program run in C, without the GIL: its kernel segments (cpu) or Triton kernels (cuda) and its extern
// ATen calls (runner.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lazy {

struct Runner;

// An error an ATen call raised during a run, kept until the GIL is held to raise it.
struct Failure {
  PyObject* type = nullptr;
  std::string message;
  const char* torch_type = nullptr;  // a torch._C exception class, looked up once the GIL is back
};

// The pieces of run_program, for runs started elsewhere (native_launch.cpp). runner_of: the Runner of a
// make_runner capsule (NULL with an error set); set_values: vals[id] = values[id] and ptrs[id] its address for each
// entry of ``values`` (a list, None or a tensor per buffer) that is a tensor (GIL held);
// execute_guarded: the run, without the GIL, ATen errors caught into *failure (frees of buffers go to graveyard
// when given); raise_failure: sets the Python error, returns NULL; results_of: the (id, tensor) pairs of ``wanted``.
Runner* runner_of(PyObject* capsule);
int64_t runner_buffers(const Runner& r);
bool set_values(const Runner& r, PyObject* values, std::vector<at::Tensor>& vals, void** ptrs);
int execute_guarded(const Runner& r, std::vector<at::Tensor>& vals, void** ptrs, const double* fs, const int64_t* is,
                    uintptr_t lo, uintptr_t hi, std::vector<at::Tensor>* graveyard, Failure* failure,
                    void* stream = nullptr);
PyObject* raise_failure(const Failure& failure);
PyObject* results_of(const Runner& r, const std::vector<at::Tensor>& vals, PyObject* wanted);
// The ints of a Python sequence; throws std::runtime_error (the Python error cleared by the caller) otherwise.
std::vector<int64_t> ints_of(PyObject* seq);
// A Python tensor of ``t`` (torch._C._wrap_tensor_impl); NULL with an error set.
PyObject* wrap(const at::Tensor& t);
// The at::Tensor of a Python tensor (a new reference to its TensorImpl); undefined with an error set where it is
// not one.
at::Tensor tensor_of(PyObject* tensor);

// make_runner(steps, num_buffers, include_raw, exclude_raw[, cuda_device, arena_bytes, arena_slots]) -> capsule: the
// plan of a program whose externs are all
// ATen operators called with flat arguments (lazy/runtime/cpp_native.py builds ``steps``; the raw dispatch key sets
// are those eager code runs under: Note [Executing inside __torch_dispatch__]).
PyObject* make_runner(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// run_program(runner, pointers, scalars, values, arena_lo, arena_hi, wanted) -> (error bits, results): packs the
// scalars (float and int of each: graph.cpp's pack_numbers) and runs every step with the GIL released. ``values``:
// None or the tensor of each buffer set before the run (leaves, allocated outputs, arena views), whose addresses it
// writes into ``pointers``; ``wanted``: the buffer ids of extern results to return, as (id, tensor) pairs.
PyObject* run_program(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// run_cuda_program(runner, scalars, values, stream, wanted) -> results, or None where a value is not 16-byte
// aligned (nothing ran; the caller takes the Python path): a cuda program (make_runner's seven-argument form) run
// with its kernels on ``stream`` (Note [Triton kernels launched in C] in cuda_launch.cpp). ``values`` and
// ``wanted`` as for run_program; the pointer array and the arena are the run's own.
PyObject* run_cuda_program(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
