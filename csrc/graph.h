// Walks over the IR in C (see graph.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// linearize(roots) -> (order, positions, outputs, key, leaves, scalars), as lazy/ir/graph.py's Linearized.
PyObject* linearize(PyObject* self, PyObject* roots);

}  // namespace lazy
