// Walks over the IR in C (see graph.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <vector>

namespace lazy {

// linearize(roots) -> (order, outputs, key, leaves, scalars), as lazy/ir/graph.py's Linearized.
PyObject* linearize(PyObject* self, PyObject* roots);

// float(s) and int(s) of each of ``n`` numbers into f and i64 (false with an error set where one overflows).
bool pack_numbers(PyObject* const* items, Py_ssize_t n, double* f, int64_t* i64);

// pack_numbers of the sequence ``scalars`` into *f and *i64, resized to its length (at least 1: a kernel's arrays
// are never empty); false with an error set (``who`` names the caller where it is not a sequence).
bool pack_sequence(PyObject* scalars, std::vector<double>* f, std::vector<int64_t>* i64, const char* who);

// pack_scalars(scalars, doubles, int64s): fills the two writable buffers with float(s) and int(s) of each scalar.
PyObject* pack_scalars(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// call_segment(function, pointers, doubles, int64s) -> int: a compiled program's segment entry point (an address:
// ``int (void**, const double*, const int64_t*)``) called on the addresses of its argument arrays, without the GIL.
PyObject* call_segment(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
