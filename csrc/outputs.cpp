// A compiled program's fresh buffers (outputs, and temporaries externs read), reused from its last runs where nothing
// else can see them; see outputs.h and Note [Reused outputs] in lazy/runtime/spares.py.
#include "outputs.h"

#include "alias.h"

#include <cstdint>

namespace lazy {

namespace {

// A spare of ``pair`` that nothing else references and has ``shape``, moved to the front: a new reference, or NULL.
PyObject* take_spare(PyObject* pair, PyObject* shape) {
  Py_ssize_t n = PyList_GET_SIZE(pair);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* t = PyList_GET_ITEM(pair, k);
    if (tensor_unshared(t, shape)) {
      if (k > 0) {  // the one taken goes first (the other is the older, dropped when a new one comes): a swap
        PyList_SET_ITEM(pair, k, PyList_GET_ITEM(pair, 0));
        PyList_SET_ITEM(pair, 0, t);
      }
      return Py_NewRef(t);
    }
  }
  return nullptr;
}

}  // namespace

PyObject* take_buffers(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyTuple_Check(args[0]) || (args[1] != Py_None && !PyList_Check(args[1])) ||
      !PyList_Check(args[2]) || !PyLong_Check(args[3]) || !PyCallable_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "take_buffers(allocs: tuple, spares: list | None, values: list, ptrs: int, "
                                     "empty)");
    return nullptr;
  }
  PyObject* allocs = args[0];
  PyObject* spares = args[1];
  PyObject* values = args[2];
  auto** ptrs = static_cast<void**>(PyLong_AsVoidPtr(args[3]));
  if (ptrs == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "take_buffers: a null pointer array");
    return nullptr;
  }
  Py_ssize_t reused = 0;
  for (Py_ssize_t a = 0; a < PyTuple_GET_SIZE(allocs); ++a) {
    PyObject* spec = PyTuple_GET_ITEM(allocs, a);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
      PyErr_SetString(PyExc_TypeError, "take_buffers: an alloc is (buffer id, shape, dtype)");
      return nullptr;
    }
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
    if (i < 0 || i >= PyList_GET_SIZE(values) || (spares != Py_None && i >= PyList_GET_SIZE(spares))) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "take_buffers: buffer id out of range");
      return nullptr;
    }
    PyObject* shape = PyTuple_GET_ITEM(spec, 1);
    PyObject* pair = spares != Py_None ? PyList_GET_ITEM(spares, i) : nullptr;
    if (pair != nullptr && !PyList_Check(pair)) pair = nullptr;
    PyObject* t = pair != nullptr ? take_spare(pair, shape) : nullptr;
    reused += t != nullptr;
    if (t == nullptr) {
      t = PyObject_CallFunctionObjArgs(args[4], shape, PyTuple_GET_ITEM(spec, 2), nullptr);
      if (t == nullptr) return nullptr;
      if (pair != nullptr) {
        if (PyList_Insert(pair, 0, t) != 0 || PyList_SetSlice(pair, 2, PY_SSIZE_T_MAX, nullptr) != 0) {
          Py_DECREF(t);
          return nullptr;
        }
      }
    }
    void* data = tensor_data(t);
    if (data == nullptr && PyErr_Occurred()) {
      Py_DECREF(t);
      return nullptr;
    }
    ptrs[i] = data;
    PyList_SetItem(values, i, t);  // steals t
  }
  return PyLong_FromSsize_t(reused);
}

}  // namespace lazy
