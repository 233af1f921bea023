// linearize (lazy/ir/graph.py): the topological order of a graph and its structural key, in C; pack_scalars
// (lazy/runtime/cpp.py): a graph's runtime scalars as the double and int64 arrays its kernels read.
//
// Every sync walks its graph once; in Python that walk cost ~2 us per node (id() calls, a list per visit), more
// than running a fused kernel. The order, key encoding and leaf numbering are exactly Note [Graph key]'s.
#include "graph.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ir.h"

namespace lazy {

namespace {

// Separates the body of a key from its outputs: neither a signature's address nor a position.
constexpr int64_t kKeyOutputs = -1;

// Note [Marks of a walk]
// A walk marks each node it places with its own number and the node's position (NodeObject::walk, walk_pos)
// instead of keeping a hash map from node to position: a sync's walk then costs no hashing, ~5 map operations
// per node before. The walk runs under the GIL and calls no Python code between its first and last mark (list
// appends and int objects only), so no other walk can start meanwhile; the counter is 64-bit, never reused.
long long g_walk = 0;

}  // namespace

PyObject* linearize(PyObject*, PyObject* roots_arg) {
  PyObject* roots = PySequence_Fast(roots_arg, "linearize(roots): roots must be a sequence of nodes");
  if (roots == nullptr) return nullptr;
  Py_ssize_t n_roots = PySequence_Fast_GET_SIZE(roots);
  PyObject** root_items = PySequence_Fast_ITEMS(roots);
  const long long walk = ++g_walk;
  auto placed = [walk](PyObject* n) { return reinterpret_cast<NodeObject*>(n)->walk == walk; };
  std::vector<NodeObject*> order;
  std::vector<NodeObject*> stack;
  std::vector<int64_t> enc;
  PyObject* leaves = PyList_New(0);
  PyObject* scalars = PyList_New(0);
  auto fail = [&]() -> PyObject* {
    Py_XDECREF(leaves);
    Py_XDECREF(scalars);
    Py_DECREF(roots);
    return nullptr;
  };
  if (!leaves || !scalars) return fail();
  for (Py_ssize_t r = 0; r < n_roots; ++r) {
    PyObject* root = root_items[r];
    if (Py_TYPE(root) != &NodeType) {
      PyErr_SetString(PyExc_TypeError, "linearize(roots): every root must be a Node");
      return fail();
    }
    if (placed(root)) continue;
    stack.push_back(reinterpret_cast<NodeObject*>(root));
    while (!stack.empty()) {
      NodeObject* node = stack.back();
      if (node->walk == walk) {
        stack.pop_back();
        continue;
      }
      PyObject* inputs = node->inputs;
      Py_ssize_t n_in = PyTuple_GET_SIZE(inputs);
      size_t before = stack.size();
      for (Py_ssize_t k = n_in - 1; k >= 0; --k) {  // pushed in reverse: the first input is visited first
        PyObject* in = PyTuple_GET_ITEM(inputs, k);
        if (Py_TYPE(in) != &NodeType) {
          PyErr_SetString(PyExc_TypeError, "lazy internal error: a node input is not a Node");
          return fail();
        }
        if (!placed(in)) stack.push_back(reinterpret_cast<NodeObject*>(in));
      }
      if (stack.size() != before) continue;
      stack.pop_back();
      node->walk = walk;
      node->walk_pos = static_cast<long long>(order.size());
      order.push_back(node);
      // Interned signatures live as long as the process: their address is their identity.
      enc.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(node->sig)));
      if (node->op == data_op()) {
        if (PyList_Append(leaves, node->data) != 0) return fail();
        continue;
      }
      for (Py_ssize_t k = 0; k < n_in; ++k) {
        enc.push_back(reinterpret_cast<NodeObject*>(PyTuple_GET_ITEM(inputs, k))->walk_pos);
      }
      PyObject* sc = node->scalars;
      if (PyTuple_Check(sc)) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(sc); ++k) {
          if (PyList_Append(scalars, PyTuple_GET_ITEM(sc, k)) != 0) return fail();
        }
      }
    }
  }
  PyObject* outputs = PyList_New(n_roots);
  PyObject* order_list = PyList_New(static_cast<Py_ssize_t>(order.size()));
  if (!outputs || !order_list) {
    Py_XDECREF(outputs);
    Py_XDECREF(order_list);
    return fail();
  }
  enc.push_back(kKeyOutputs);  // the key: the body, the separator, then the outputs
  bool ok = true;
  for (Py_ssize_t r = 0; r < n_roots && ok; ++r) {
    int64_t at = reinterpret_cast<NodeObject*>(root_items[r])->walk_pos;
    enc.push_back(at);
    PyObject* i = PyLong_FromLongLong(at);
    ok = i != nullptr;
    if (ok) PyList_SET_ITEM(outputs, r, i);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    Py_INCREF(order[i]);
    PyList_SET_ITEM(order_list, static_cast<Py_ssize_t>(i), reinterpret_cast<PyObject*>(order[i]));
  }
  PyObject* key = ok ? PyBytes_FromStringAndSize(reinterpret_cast<const char*>(enc.data()),
                                                 static_cast<Py_ssize_t>(enc.size() * sizeof(int64_t)))
                     : nullptr;
  PyObject* result = key != nullptr ? PyTuple_Pack(5, order_list, outputs, key, leaves, scalars) : nullptr;
  Py_XDECREF(key);
  Py_DECREF(outputs);
  Py_DECREF(order_list);
  Py_DECREF(leaves);
  Py_DECREF(scalars);
  Py_DECREF(roots);
  return result;
}

bool pack_numbers(PyObject* const* items, Py_ssize_t n, double* f, int64_t* i64) {
  // As float(s) / int(s) of Python numbers: a float's int slot is 0; other objects (complex scalars, which only
  // extern calls read, from the Python list) are 0 in both.
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* s = items[k];
    if (PyLong_Check(s)) {  // int and bool
      long long v = PyLong_AsLongLong(s);
      if (v == -1 && PyErr_Occurred()) return false;
      i64[k] = v;
      f[k] = static_cast<double>(v);
    } else if (PyFloat_Check(s)) {
      f[k] = PyFloat_AS_DOUBLE(s);
      i64[k] = 0;
    } else {
      f[k] = 0.0;
      i64[k] = 0;
    }
  }
  return true;
}

bool pack_sequence(PyObject* scalars, std::vector<double>* f, std::vector<int64_t>* i64, const char* who) {
  PyObject* seq = PySequence_Fast(scalars, who);
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  f->resize(std::max<Py_ssize_t>(n, 1));
  i64->resize(std::max<Py_ssize_t>(n, 1));
  const bool packed = pack_numbers(PySequence_Fast_ITEMS(seq), n, f->data(), i64->data());
  Py_DECREF(seq);
  return packed;
}

PyObject* pack_scalars(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "pack_scalars(scalars: list, doubles: writable buffer, int64s: writable buffer)");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(args[0], "pack_scalars: scalars must be a sequence");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  Py_buffer fs, is;
  if (PyObject_GetBuffer(args[1], &fs, PyBUF_WRITABLE) != 0) {
    Py_DECREF(seq);
    return nullptr;
  }
  if (PyObject_GetBuffer(args[2], &is, PyBUF_WRITABLE) != 0) {
    PyBuffer_Release(&fs);
    Py_DECREF(seq);
    return nullptr;
  }
  bool ok = fs.len >= n * static_cast<Py_ssize_t>(sizeof(double)) &&
            is.len >= n * static_cast<Py_ssize_t>(sizeof(int64_t));
  if (!ok) PyErr_SetString(PyExc_ValueError, "pack_scalars: the buffers are too small");
  if (ok) ok = pack_numbers(items, n, static_cast<double*>(fs.buf), static_cast<int64_t*>(is.buf));
  PyBuffer_Release(&fs);
  PyBuffer_Release(&is);
  Py_DECREF(seq);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// Note [Segment calls in C]
// A C++ program calls each segment of its kernels once per run. Through ctypes (argtypes converting three arrays)
// the call cost ~0.8 us, as much as the rest of a small replay's bookkeeping; here it is four integers (the entry
// point's address and those of the argument arrays, all fixed or cached by the run) and, like ctypes' CDLL, the GIL
// is released while the kernels run.
PyObject* call_segment(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "call_segment(function, pointers, doubles, int64s): four addresses");
    return nullptr;
  }
  void* addr[4];
  for (int k = 0; k < 4; ++k) {
    addr[k] = PyLong_AsVoidPtr(args[k]);
    if (addr[k] == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "call_segment: a null address");
      return nullptr;
    }
  }
  using Segment = int (*)(void**, const double*, const int64_t*);
  Segment fn = reinterpret_cast<Segment>(addr[0]);
  int err;
  Py_BEGIN_ALLOW_THREADS
  err = fn(static_cast<void**>(addr[1]), static_cast<const double*>(addr[2]), static_cast<const int64_t*>(addr[3]));
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(err);
}

}  // namespace lazy
