// linearize (lazy/ir/graph.py): the topological order of a graph and its structural key, in C.
//
// Every sync walks its graph once; in Python that walk cost ~2 us per node (id() calls, a list per visit), more
// than running a fused kernel. The order, key encoding and leaf numbering are exactly Note [Graph key]'s.
#include "graph.h"

#include <unordered_map>
#include <vector>

#include "ir.h"

namespace lazy {

PyObject* linearize(PyObject*, PyObject* roots_arg) {
  PyObject* roots = PySequence_Fast(roots_arg, "linearize(roots): roots must be a sequence of nodes");
  if (roots == nullptr) return nullptr;
  Py_ssize_t n_roots = PySequence_Fast_GET_SIZE(roots);
  PyObject** root_items = PySequence_Fast_ITEMS(roots);
  std::unordered_map<PyObject*, Py_ssize_t> pos;
  std::vector<NodeObject*> order;
  std::vector<NodeObject*> stack;
  PyObject* enc = PyList_New(0);
  PyObject* leaves = PyList_New(0);
  PyObject* scalars = PyList_New(0);
  PyObject* result = nullptr;
  auto fail = [&]() -> PyObject* {
    Py_XDECREF(enc);
    Py_XDECREF(leaves);
    Py_XDECREF(scalars);
    Py_DECREF(roots);
    return nullptr;
  };
  auto append_long = [&](PyObject* list, Py_ssize_t v) -> bool {
    PyObject* i = PyLong_FromSsize_t(v);
    if (i == nullptr) return false;
    int rc = PyList_Append(list, i);
    Py_DECREF(i);
    return rc == 0;
  };
  if (!enc || !leaves || !scalars) return fail();
  for (Py_ssize_t r = 0; r < n_roots; ++r) {
    PyObject* root = root_items[r];
    if (Py_TYPE(root) != &NodeType) {
      PyErr_SetString(PyExc_TypeError, "linearize(roots): every root must be a Node");
      return fail();
    }
    if (pos.count(root)) continue;
    stack.push_back(reinterpret_cast<NodeObject*>(root));
    while (!stack.empty()) {
      NodeObject* node = stack.back();
      if (pos.count(reinterpret_cast<PyObject*>(node))) {
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
        if (!pos.count(in)) stack.push_back(reinterpret_cast<NodeObject*>(in));
      }
      if (stack.size() != before) continue;
      stack.pop_back();
      pos.emplace(reinterpret_cast<PyObject*>(node), static_cast<Py_ssize_t>(order.size()));
      order.push_back(node);
      PyObject* sig_id = PyLong_FromVoidPtr(node->sig);
      if (sig_id == nullptr || PyList_Append(enc, sig_id) != 0) {
        Py_XDECREF(sig_id);
        return fail();
      }
      Py_DECREF(sig_id);
      if (node->op == data_op()) {
        if (PyList_Append(leaves, node->data) != 0) return fail();
        continue;
      }
      for (Py_ssize_t k = 0; k < n_in; ++k) {
        if (!append_long(enc, pos[PyTuple_GET_ITEM(inputs, k)])) return fail();
      }
      PyObject* sc = node->scalars;
      if (PyTuple_Check(sc) && PyTuple_GET_SIZE(sc) > 0) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(sc); ++k) {
          if (PyList_Append(scalars, PyTuple_GET_ITEM(sc, k)) != 0) return fail();
        }
      }
    }
  }
  PyObject* outputs = PyList_New(n_roots);
  PyObject* order_list = PyList_New(static_cast<Py_ssize_t>(order.size()));
  PyObject* positions = PyDict_New();
  if (!outputs || !order_list || !positions) {
    Py_XDECREF(outputs);
    Py_XDECREF(order_list);
    Py_XDECREF(positions);
    return fail();
  }
  for (Py_ssize_t r = 0; r < n_roots; ++r) {
    PyList_SET_ITEM(outputs, r, PyLong_FromSsize_t(pos[root_items[r]]));
  }
  bool ok = true;
  for (size_t i = 0; i < order.size() && ok; ++i) {
    PyObject* node = reinterpret_cast<PyObject*>(order[i]);
    Py_INCREF(node);
    PyList_SET_ITEM(order_list, static_cast<Py_ssize_t>(i), node);
    PyObject* key = PyLong_FromVoidPtr(node);
    PyObject* value = PyLong_FromSsize_t(static_cast<Py_ssize_t>(i));
    ok = key && value && PyDict_SetItem(positions, key, value) == 0;
    Py_XDECREF(key);
    Py_XDECREF(value);
  }
  // the key: the body, None, then the outputs
  ok = ok && PyList_Append(enc, Py_None) == 0;
  for (Py_ssize_t r = 0; r < n_roots && ok; ++r) ok = PyList_Append(enc, PyList_GET_ITEM(outputs, r)) == 0;
  PyObject* key = ok ? PyList_AsTuple(enc) : nullptr;
  if (key != nullptr) {
    result = PyTuple_Pack(6, order_list, positions, outputs, key, leaves, scalars);
    Py_DECREF(key);
  }
  Py_DECREF(outputs);
  Py_DECREF(order_list);
  Py_DECREF(positions);
  Py_DECREF(enc);
  Py_DECREF(leaves);
  Py_DECREF(scalars);
  Py_DECREF(roots);
  return result;
}

}  // namespace lazy
