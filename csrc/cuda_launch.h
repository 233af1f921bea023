// A compiled Triton program's kernel launches, run by the C runner (runner.cpp) between its extern ATen calls
// (Note [Triton kernels launched in C] in cuda_launch.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lazy {

struct CudaAlloc {  // a buffer a kernel stores that no earlier step made: allocated on the program's device
  int64_t bid = -1;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct CudaLaunch {
  uint64_t function = 0;  // a CUfunction, loaded by torch's static launcher (lazy/runtime/triton_launch.py)
  unsigned grid = 0, threads = 0, shared = 0;
  std::string types;             // one character per kernel parameter, as torch's static launcher takes them
  std::vector<int64_t> params;   // per parameter: a buffer id ('O'; -1: a null pointer) or a runtime scalar slot
  std::vector<CudaAlloc> allocs;
};

// The launch of a step ("cu", function, grid, threads, shared, types, params, allocs, frees); ``allocs`` holds
// (buffer id, shape, c10::ScalarType code) triples. Throws std::runtime_error on a malformed spec.
CudaLaunch parse_cuda_launch(PyObject* spec);

// Before a run's first launch: the driver loaded and a context current on the calling thread (the device's primary
// one where it has none). Throws std::runtime_error where the driver is missing or refuses.
void enter_cuda(int device);

// Allocates what the kernel stores first, then launches it on ``stream`` (no GIL needed; enter_cuda first). Throws
// std::runtime_error where the driver refuses the launch.
void launch_cuda(const CudaLaunch& k, int device, std::vector<at::Tensor>& vals, void** ptrs, const double* fs,
                 const int64_t* is, void* stream);

}  // namespace lazy
