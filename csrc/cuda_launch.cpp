// Note [Triton kernels launched in C]
// A compiled Triton program run from Python pays, per run, a Python loop over its steps, an address list built
// per run and, per kernel, a call of torch's static launcher that parses each argument from a tuple (a float()
// or int() per runtime scalar where the kernel has an int slot): the 200-op chain at 16^2, one kernel with 120
// scalars, spent 20-40 us of host time per run so, on H100/H200 hosts, for an 8.6 us kernel. A program whose
// kernels are all loaded by the static launcher and whose externs are plain ATen operators (the cpu's condition:
// Note [Programs run in C] in runner.cpp) runs in the C runner instead: its kernels are steps holding the loaded
// CUfunction, grid, block and parameter plan, launched here with the driver's cuLaunchKernel on the stream the
// caller passes (the current stream, as the Python path uses), its externs through the dispatcher on the same
// thread and stream. Parameters are packed as the static launcher packs them (8 bytes per parameter, the
// kernel reading its own width); an integer parameter reads a runtime scalar's int64 unless that is 0 and its
// double is not (a replay's computed number: an integral float in an int slot, which Python's int() takes).
// The driver is found with dlopen (libcuda.so.1, already loaded by torch's CUDA runtime), so the extension links
// nothing of CUDA and builds against a cpu torch as before.
#include "cuda_launch.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <dlfcn.h>

#include <cstring>
#include <stdexcept>

#include "runner.h"

namespace lazy {

namespace {

using CUresult = int;

struct Driver {
  CUresult (*launch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                     void**) = nullptr;
  CUresult (*ctx_get_current)(void**) = nullptr;
  CUresult (*ctx_set_current)(void*) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*primary_ctx_retain)(void**, int) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
};

template <typename F>
void find(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
}

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == nullptr) return d;
    find(lib, "cuLaunchKernel", &d.launch);
    find(lib, "cuCtxGetCurrent", &d.ctx_get_current);
    find(lib, "cuCtxSetCurrent", &d.ctx_set_current);
    find(lib, "cuDeviceGet", &d.device_get);
    find(lib, "cuDevicePrimaryCtxRetain", &d.primary_ctx_retain);
    find(lib, "cuGetErrorString", &d.error_string);
    return d;
  }();
  return d;
}

void check(const Driver& d, CUresult r, const char* what) {
  if (r == 0) return;
  const char* text = nullptr;
  if (d.error_string != nullptr) d.error_string(r, &text);
  throw std::runtime_error(std::string("lazy: ") + what + " failed: CUDA error " + std::to_string(r) +
                           (text != nullptr ? std::string(" (") + text + ")" : std::string()));
}

}  // namespace

// As torch's static launcher: a thread with no current context gets the device's primary one.
void enter_cuda(int device) {
  const Driver& d = driver();
  if (d.launch == nullptr || d.ctx_get_current == nullptr) {
    throw std::runtime_error("lazy: the CUDA driver (libcuda.so.1, cuLaunchKernel) is not loadable");
  }
  void* ctx = nullptr;
  check(d, d.ctx_get_current(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  int dev = 0;
  check(d, d.device_get(&dev, device), "cuDeviceGet");
  check(d, d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(d, d.ctx_set_current(ctx), "cuCtxSetCurrent");
}

namespace {

template <typename T>
void put(uint64_t* slot, T v) {
  std::memcpy(slot, &v, sizeof(T));
}

}  // namespace

CudaLaunch parse_cuda_launch(PyObject* spec) {
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 9) throw std::runtime_error("lazy runner: a malformed cu step");
  CudaLaunch k;
  k.function = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(spec, 1));
  k.grid = static_cast<unsigned>(PyLong_AsUnsignedLong(PyTuple_GET_ITEM(spec, 2)));
  k.threads = static_cast<unsigned>(PyLong_AsUnsignedLong(PyTuple_GET_ITEM(spec, 3)));
  k.shared = static_cast<unsigned>(PyLong_AsUnsignedLong(PyTuple_GET_ITEM(spec, 4)));
  const char* types = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 5));
  if (types == nullptr) throw std::runtime_error("lazy runner: a cu step's types");
  k.types = types;
  k.params = ints_of(PyTuple_GET_ITEM(spec, 6));
  PyObject* allocs = PyTuple_GET_ITEM(spec, 7);
  for (Py_ssize_t i = 0; i < PyTuple_Size(allocs); ++i) {
    PyObject* a = PyTuple_GET_ITEM(allocs, i);
    CudaAlloc alloc;
    alloc.bid = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 0));
    alloc.shape = ints_of(PyTuple_GET_ITEM(a, 1));
    alloc.dtype = static_cast<c10::ScalarType>(PyLong_AsLong(PyTuple_GET_ITEM(a, 2)));
    k.allocs.push_back(std::move(alloc));
  }
  if (PyErr_Occurred() || k.params.size() != k.types.size() || k.function == 0) {
    throw std::runtime_error("lazy runner: a malformed cu step");
  }
  return k;
}

void launch_cuda(const CudaLaunch& k, int device, std::vector<at::Tensor>& vals, void** ptrs, const double* fs,
                 const int64_t* is, void* stream) {
  for (const CudaAlloc& a : k.allocs) {
    if (vals[a.bid].defined()) continue;
    vals[a.bid] = at::empty(a.shape, at::TensorOptions().dtype(a.dtype).device(c10::DeviceType::CUDA, device));
    ptrs[a.bid] = vals[a.bid].data_ptr();
  }
  if (k.grid == 0) return;  // an empty grid launches nothing (the Python path's ``launch.grid > 0``)
  const size_t n = k.types.size();
  std::vector<uint64_t> storage(n, 0);
  std::vector<void*> params(n);
  for (size_t j = 0; j < n; ++j) {
    const int64_t p = k.params[j];
    uint64_t* slot = &storage[j];
    const char t = k.types[j];
    if (t == 'O') {
      put(slot, p < 0 ? uint64_t{0} : reinterpret_cast<uint64_t>(ptrs[p]));
    } else if (t == 'f') {
      put(slot, static_cast<float>(fs[p]));
    } else if (t == 'd') {
      put(slot, fs[p]);
    } else {
      const int64_t v = is[p] != 0 ? is[p] : static_cast<int64_t>(fs[p]);
      switch (t) {
        case 'b': put(slot, static_cast<int8_t>(v)); break;
        case 'h': put(slot, static_cast<int16_t>(v)); break;
        case 'i': put(slot, static_cast<int32_t>(v)); break;
        case 'l': put(slot, v); break;
        case 'B': put(slot, static_cast<uint8_t>(v)); break;
        case 'H': put(slot, static_cast<uint16_t>(v)); break;
        case 'I': put(slot, static_cast<uint32_t>(v)); break;
        case 'K': put(slot, static_cast<uint64_t>(v)); break;
        default: throw std::runtime_error(std::string("lazy runner: a kernel parameter of type ") + t);
      }
    }
    params[j] = slot;
  }
  const Driver& d = driver();
  check(d, d.launch(reinterpret_cast<void*>(k.function), k.grid, 1, 1, k.threads, 1, 1, k.shared, stream,
                    n ? params.data() : nullptr, nullptr),
        "cuLaunchKernel");
}

}  // namespace lazy
