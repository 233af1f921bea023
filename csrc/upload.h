// Host data to a cuda backing device in one call each (upload.cpp; Note [Uploads in C]): a host tensor's snapshot,
// a program's runtime scalars.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// upload(tensor, dtype_code, device_index) -> a cuda tensor, or None where the Python path must copy (not a plain
// dense cpu tensor, a conjugate or negative view): lazy/device/backing.py's to_backing for memory_format=preserve.
// dtype_code: a c10::ScalarType code, -1 for the tensor's own dtype; device_index: the cuda device.
PyObject* upload(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// upload_scalars(device_buffer, scalars, slots, num_floats): device_buffer (an int64 cuda tensor of len(slots)
// elements) gets, stream-ordered, float(scalars[slots[k]]) as a double for k < num_floats and int() of it as an
// int64 after, 0 where slots[k] is -1 (Note [Scalars in device memory] in lazy/runtime/triton.py).
PyObject* upload_scalars(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
