// A compiled program's fresh buffers, taken from its spares where nothing else can see one (Note [Reused outputs]
// in lazy/runtime/spares.py).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// take_buffers(allocs, spares, values, ptrs, empty): for each (i, shape, dtype) of ``allocs``, values[i] becomes a
// tensor of that shape and dtype and the c_void_p array at address ``ptrs`` gets its data pointer at i: a tensor of
// the list spares[i] that nothing else references (tensor_unshared), else empty(shape, dtype); spares[i] keeps the
// tensor taken first and at most one other. ``spares`` None: always empty(shape, dtype). Returns how many were
// spares.
PyObject* take_buffers(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
