// Note [Uploads in C]
// A host tensor's snapshot on a cuda backing device (``x.to("lazy")``, a captured step's batch) is staged in
// pinned memory and copied asynchronously (Note [Uploads do not wait] in lazy/device/backing.py). From Python that
// is four ATen calls (empty_like for eager's layout, a pinned empty_strided, copy_, to), each parsed from Python
// arguments: on an H200 host a captured GPT step's two batch uploads took ~0.16 ms of its ~1 ms of host time.
// Here it is one call: the layout is the tensor's own where it is dense (empty_like's preserve_format), the pinned
// buffer comes from the same caching host allocator, and the copy to the device is the same non-blocking copy, so
// the result and the waiting are the Python path's. A tensor this does not cover (not a plain strided cpu tensor, a
// conjugate or negative view, a Python subclass's) gets None: the caller copies it in Python.
// A program replayed as a CUDA graph loads its runtime scalars into device memory before each replay (Note
// [Scalars in device memory] in lazy/runtime/triton.py): packed here into one host array and copied with one
// non-blocking copy, where Python's struct packing and a copy_ from a frombuffer view took ~0.065 ms per GPT step.
#include "upload.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DispatchKeySet.h>

#include <exception>
#include <cstring>
#include <string>
#include <vector>

#include "runner.h"

namespace lazy {

namespace {

bool uploadable(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided) return false;
  const c10::DispatchKeySet keys = t.key_set();
  return !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::Conjugate) &&
         !keys.has(c10::DispatchKey::Negative) && !keys.has(c10::DispatchKey::ZeroTensor) &&
         !keys.has(c10::DispatchKey::Functionalize);
}

}  // namespace

PyObject* upload(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyLong_Check(args[1]) || !PyLong_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "upload(tensor, dtype_code, device_index)");
    return nullptr;
  }
  const long long code = PyLong_AsLongLong(args[1]);
  const long long index = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) return nullptr;
  at::Tensor source = tensor_of(args[0]);
  if (!source.defined()) return nullptr;
  if (!uploadable(source) || index < 0 || index > 127) Py_RETURN_NONE;
  at::Tensor out;
  std::string error;
  Py_BEGIN_ALLOW_THREADS
  try {
    // a snapshot, not a differentiable copy: what to_backing's detach() gives
    at::AutoDispatchBelowADInplaceOrView no_autograd;
    const c10::ScalarType dtype = code < 0 ? source.scalar_type() : static_cast<c10::ScalarType>(code);
    const auto pinned = at::TensorOptions().dtype(dtype).pinned_memory(true);
    at::Tensor staged = source.is_non_overlapping_and_dense()
                            ? at::empty_strided(source.sizes(), source.strides(), pinned)
                            : at::empty_strided(source.sizes(), at::empty_like(source).strides(), pinned);
    staged.copy_(source);  // converted on the host, as eager converts a copy to cuda
    out = staged.to(at::TensorOptions().device(c10::Device(c10::DeviceType::CUDA, static_cast<int8_t>(index))),
                    /*non_blocking=*/true, /*copy=*/false);
  } catch (const std::exception& e) {
    error = e.what();
  }
  Py_END_ALLOW_THREADS
  if (!out.defined()) {
    PyErr_SetString(PyExc_RuntimeError, error.empty() ? "lazy upload failed" : error.c_str());
    return nullptr;
  }
  return wrap(out);
}

PyObject* upload_scalars(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) || !PyLong_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "upload_scalars(device_buffer, scalars: tuple, slots: tuple, num_floats)");
    return nullptr;
  }
  at::Tensor dst = tensor_of(args[0]);
  if (!dst.defined()) return nullptr;
  const Py_ssize_t n = PyTuple_GET_SIZE(args[2]), nf = PyLong_AsSsize_t(args[3]);
  const Py_ssize_t count = PyTuple_GET_SIZE(args[1]);
  if (nf < 0 || nf > n || dst.scalar_type() != at::kLong || !dst.is_contiguous() || dst.numel() != n) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "upload_scalars: the buffer does not fit the slots");
    return nullptr;
  }
  std::vector<int64_t> host(static_cast<size_t>(n), 0);
  for (Py_ssize_t k = 0; k < n; ++k) {
    const Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], k));
    if (slot < 0) {
      if (PyErr_Occurred()) return nullptr;
      continue;  // an alignment pad
    }
    if (slot >= count) {
      PyErr_SetString(PyExc_IndexError, "upload_scalars: a slot past the scalars");
      return nullptr;
    }
    PyObject* x = PyTuple_GET_ITEM(args[1], slot);
    if (k < nf) {
      const double d = PyFloat_AsDouble(x);
      if (d == -1.0 && PyErr_Occurred()) return nullptr;
      std::memcpy(&host[static_cast<size_t>(k)], &d, sizeof d);
    } else if (PyLong_Check(x)) {
      host[static_cast<size_t>(k)] = PyLong_AsLongLong(x);
      if (PyErr_Occurred()) return nullptr;
    } else {  // an integral float in an int slot (a replay's computed number): int(), as Python's path takes it
      PyObject* i = PyNumber_Long(x);
      if (i == nullptr) return nullptr;
      host[static_cast<size_t>(k)] = PyLong_AsLongLong(i);
      Py_DECREF(i);
      if (PyErr_Occurred()) return nullptr;
    }
  }
  try {
    at::AutoDispatchBelowADInplaceOrView no_autograd;
    // from pageable memory: the copy is staged before it returns, so ``host`` may go (as Python's bytearray did)
    dst.copy_(at::from_blob(host.data(), {n}, at::TensorOptions().dtype(at::kLong)), /*non_blocking=*/true);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

}  // namespace lazy
