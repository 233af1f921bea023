// The per-tensor work of a lazy.compile replay in C.
//
// Note [Replay bookkeeping in C]
// A replayed training step reads the data of every storage it takes (parameters, optimizer state: 50 to a few
// hundred) and binds a new data leaf to every storage it updates. In the replay's generated Python that was about
// 0.5 us a read (an attribute walk and a call) and 1.5 us a write (a data leaf built through Node's constructor,
// tuple(shape), tuple(stride), the version bump), most of what a small step's replay costs besides its program.
// Here a read is the same walk in C (tensor._lz_st.value.data) and a write builds the leaf from the TensorImpl's
// sizes and strides (alias.cpp); both take the whole list in one call. What they do is what the Python did: a read
// of a storage still holding IR raises the replay's Pending (sync, then replay), two inputs that share one storage
// raise Miss (the capture saw distinct ones: its graph does not hold for this call), checked before the replay
// changes anything.
#include "replay_io.h"

#include "alias.h"
#include "ir.h"
#include "record_state.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace lazy {

namespace {

PyObject* s_lz_st = nullptr;
PyObject* s_dtype = nullptr;

// tensor._lz_st as a Storage: a new reference, or NULL with an error set.
StorageObject* storage_of(PyObject* tensor) {
  if (s_lz_st == nullptr) {
    s_lz_st = PyUnicode_InternFromString("_lz_st");
    if (s_lz_st == nullptr) return nullptr;
  }
  PyObject* st = PyObject_GetAttr(tensor, s_lz_st);
  if (st == nullptr) return nullptr;
  if (Py_TYPE(st) != &StorageType) {
    Py_DECREF(st);
    PyErr_SetString(PyExc_TypeError, "lazy: a replay input or output is not a lazy tensor");
    return nullptr;
  }
  return reinterpret_cast<StorageObject*>(st);
}

bool is_sequence(PyObject* x) { return PyTuple_Check(x) || PyList_Check(x); }

}  // namespace

PyObject* make_data_leaf(PyObject* tensor) {
  PyObject *shape = nullptr, *stride = nullptr;
  if (tensor_layout(tensor, &shape, &stride) != 0) return nullptr;
  if (s_dtype == nullptr) s_dtype = PyUnicode_InternFromString("dtype");
  PyObject* dtype = s_dtype != nullptr ? PyObject_GetAttr(tensor, s_dtype) : nullptr;
  PyObject* args = dtype != nullptr ? PyTuple_Pack(1, stride) : nullptr;
  PyObject* empty = PyTuple_New(0);
  PyObject* node = nullptr;
  if (args != nullptr && empty != nullptr && data_op() != nullptr) {
    PyObject* sig = intern_signature(data_op(), args, empty, shape, dtype, Py_None);
    if (sig != nullptr) {
      node = make_node(data_op(), args, empty, empty, empty, shape, dtype, Py_None, tensor, sig);
      Py_DECREF(sig);
    }
  } else if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, "lazy: data leaves before set_data_op");
  }
  Py_XDECREF(empty);
  Py_XDECREF(args);
  Py_XDECREF(dtype);
  Py_DECREF(shape);
  Py_DECREF(stride);
  return node;
}

PyObject* data_leaf_py(PyObject*, PyObject* tensor) { return make_data_leaf(tensor); }

PyObject* replay_inputs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !is_sequence(args[0])) {
    PyErr_SetString(PyExc_TypeError, "replay_inputs(tensors, pending, miss)");
    return nullptr;
  }
  PyObject* seq = args[0];
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  std::vector<StorageObject*> seen(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    StorageObject* st = storage_of(items[i]);
    if (st == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    seen[static_cast<size_t>(i)] = st;
    PyObject* value = st->value;
    PyObject* data = Py_TYPE(value) == &NodeType ? reinterpret_cast<NodeObject*>(value)->data : Py_None;
    Py_DECREF(st);  // held by the tensor, which the caller holds
    if (data == Py_None) {
      Py_DECREF(out);
      PyErr_SetNone(args[1]);
      return nullptr;
    }
    PyList_SET_ITEM(out, i, Py_NewRef(data));
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
    Py_DECREF(out);
    PyErr_SetNone(args[2]);
    return nullptr;
  }
  return out;
}

PyObject* replay_writes(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !is_sequence(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PySequence_Fast_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[2])) {
    PyErr_SetString(PyExc_TypeError, "replay_writes(tensors, outs: list, indices: tuple of the same length)");
    return nullptr;
  }
  PyObject** tensors = PySequence_Fast_ITEMS(args[0]);
  Py_ssize_t n = PyTuple_GET_SIZE(args[2]);
  Py_ssize_t num_outs = PyList_GET_SIZE(args[1]);
  Py_ssize_t made = 0;
  for (Py_ssize_t j = 0; j < n; ++j) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], j));
    if (i < 0 || i >= num_outs) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "replay_writes: output index out of range");
      return nullptr;
    }
    StorageObject* st = storage_of(tensors[j]);
    if (st == nullptr) return nullptr;
    PyObject* out = PyList_GET_ITEM(args[1], i);
    if (Py_TYPE(st->value) == &NodeType && reinterpret_cast<NodeObject*>(st->value)->op == data_op() &&
        reinterpret_cast<NodeObject*>(st->value)->data == out) {
      // Note [Rebinding written in place]: the leaf already holds the tensor the program wrote into
      st->version += 1;
      Py_DECREF(st);
      continue;
    }
    PyObject* leaf = make_data_leaf(out);
    if (leaf == nullptr) {
      Py_DECREF(st);
      return nullptr;
    }
    Py_SETREF(st->value, leaf);
    st->version += 1;
    Py_DECREF(st);
    ++made;
  }
  return PyLong_FromSsize_t(made);
}

// Note [Rebinding written in place]
// A CUDA-graph replay (runtime/cuda_graph.py) writes a step's updated parameters and optimizer state into the
// buffers their storages already hold: the output *is* the data of the storage's leaf. A new leaf over the same
// tensor would mean what the old one means now, so the write keeps the old leaf and bumps the version (300 leaves a
// GPT step, a fifth of its replay's host time). It is sound because the replay ran only after checking that no
// other IR holds that leaf (GraphedProgram._overwritable): nothing saw the values it held before.

PyObject* leaves_unshared(PyObject*, PyObject* pairs) {
  if (!PyList_Check(pairs)) {
    PyErr_SetString(PyExc_TypeError, "leaves_unshared(pairs: list of (storage, leaf))");
    return nullptr;
  }
  PyObject* keep = PyList_New(0);
  if (keep == nullptr) return nullptr;
  bool safe = true;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pairs); ++k) {
    PyObject* pair = PyList_GET_ITEM(pairs, k);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || Py_TYPE(PyTuple_GET_ITEM(pair, 0)) != &StorageType) {
      Py_DECREF(keep);
      PyErr_SetString(PyExc_TypeError, "leaves_unshared: a pair is not (storage, leaf)");
      return nullptr;
    }
    auto* st = reinterpret_cast<StorageObject*>(PyTuple_GET_ITEM(pair, 0));
    PyObject* leaf = PyTuple_GET_ITEM(pair, 1);
    const bool held = st->value == leaf;
    // references: the pair's, and the storage's value while bound; any other is a reader
    const bool shared = Py_REFCNT(leaf) - 1 - (held ? 1 : 0) > 0;
    if (shared) safe = false;
    if ((shared || held) && PyList_Append(keep, pair) != 0) {
      Py_DECREF(keep);
      return nullptr;
    }
  }
  PyObject* result = PyTuple_Pack(2, safe ? Py_True : Py_False, keep);
  Py_DECREF(keep);
  return result;
}

PyObject* stale_inputs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PySequence_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "stale_inputs(leaves, static: list, seen: list)");
    return nullptr;
  }
  PyObject* leaves = PySequence_Fast(args[0], "stale_inputs: leaves must be a sequence");
  if (leaves == nullptr) return nullptr;
  PyObject* statics = args[1];
  PyObject* seen = args[2];
  Py_ssize_t n = PySequence_Fast_GET_SIZE(leaves);
  if (PyList_GET_SIZE(statics) != n || PyList_GET_SIZE(seen) != n) {
    Py_DECREF(leaves);
    PyErr_SetString(PyExc_ValueError, "stale_inputs: leaves, static and seen differ in length");
    return nullptr;
  }
  PyObject* dst = PyList_New(0);
  PyObject* src = PyList_New(0);
  bool ok = dst != nullptr && src != nullptr;
  for (Py_ssize_t k = 0; ok && k < n; ++k) {
    PyObject* t = PySequence_Fast_GET_ITEM(leaves, k);
    PyObject* s = PyList_GET_ITEM(statics, k);
    if (t == s) continue;  // the buffer itself
    PyObject* ref = PyList_GET_ITEM(seen, k);
    if (ref != Py_None && PyWeakref_Check(ref) && PyWeakref_GET_OBJECT(ref) == t) continue;  // copied last run
    PyObject* fresh = PyWeakref_NewRef(t, nullptr);
    ok = fresh != nullptr && PyList_Append(dst, s) == 0 && PyList_Append(src, t) == 0;
    if (fresh != nullptr) PyList_SetItem(seen, k, fresh);  // steals fresh
  }
  Py_DECREF(leaves);
  PyObject* result = ok ? PyTuple_Pack(2, dst, src) : nullptr;
  Py_XDECREF(dst);
  Py_XDECREF(src);
  return result;
}

PyObject* new_tensors(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  using recording::g;
  if (nargs != 4 || !PyTuple_Check(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2]) ||
      !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[0]) ||
      PyTuple_GET_SIZE(args[3]) != PyTuple_GET_SIZE(args[0]) || g.make_wrapper == nullptr) {
    PyErr_SetString(PyExc_TypeError, "new_tensors(descs: tuple, outs: list, indices: tuple, numels: tuple), once "
                                     "configured");
    return nullptr;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  recording::Ref result(PyTuple_New(n));
  for (Py_ssize_t j = 0; result && j < n; ++j) {
    PyObject* desc = PyTuple_GET_ITEM(args[0], j);
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], j));
    if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 4 || i < 0 || i >= PyList_GET_SIZE(args[1])) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "new_tensors: a bad desc or output index");
      return nullptr;
    }
    recording::Ref leaf(make_data_leaf(PyList_GET_ITEM(args[1], i)));
    PyObject* t = leaf ? recording::new_base(desc, leaf.get(), PyTuple_GET_ITEM(args[3], j)) : nullptr;
    if (t == nullptr) return nullptr;
    PyTuple_SET_ITEM(result.get(), j, t);
  }
  return result.release();
}

// Note [Host step counters in C]
// Adam and AdamW (capturable=False, the default) keep each parameter's step count in a cpu tensor and run
// ``step_t += 1`` and ``step_t.item()`` per parameter each step; a replay runs them again as host ops, about 4 us
// each through the dispatcher: 0.6 ms of the replay's 3.5 ms of host time in a GPT step on a GPU. host_steps runs a
// run of consecutive such ops in their order: the one-element add ATen's CPU kernel does (float32 in float), the
// version bump of an in-place op, item's Python number. It checks every tensor first (host_scalar: a plain cpu
// tensor of one float32, float64 or int64 element, no grad) and every value (an int for an int64 tensor, whose
// float add eager refuses; one that converts to int64 or double), and returns None having changed nothing where one
// fails: the replay then runs those ops through torch.
PyObject* host_steps(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[0]) ||
      PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[0])) {
    PyErr_SetString(PyExc_TypeError, "host_steps(tensors, adds: tuple of bools, values: tuple), all of one length");
    return nullptr;
  }
  // Every tensor and value checked, and every value converted, before any counter moves.
  struct Step {
    void* data;
    int kind;  // host_scalar's: 0 float32, 1 float64, 2 int64
    bool add;
    double f;
    long long i;
  };
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  std::vector<Step> steps(static_cast<size_t>(n));
  for (Py_ssize_t j = 0; j < n; ++j) {
    Step& st = steps[static_cast<size_t>(j)];
    st.data = host_scalar(PyTuple_GET_ITEM(args[0], j), &st.kind);
    PyObject* value = PyTuple_GET_ITEM(args[2], j);
    st.add = PyTuple_GET_ITEM(args[1], j) == Py_True;
    if (st.data == nullptr || (st.add && !(PyLong_Check(value) || (PyFloat_Check(value) && st.kind != 2)))) {
      Py_RETURN_NONE;
    }
    if (st.add && st.kind == 2) {
      st.i = PyLong_AsLongLong(value);
    } else if (st.add) {
      st.f = PyFloat_AsDouble(value);
    }
    if (PyErr_Occurred()) {  // an int beyond int64 or double: torch raises; so does the replay, through torch
      PyErr_Clear();
      Py_RETURN_NONE;
    }
  }
  PyObject* out = PyList_New(n);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t j = 0; j < n; ++j) {
    const Step& st = steps[static_cast<size_t>(j)];
    PyObject* tensor = PyTuple_GET_ITEM(args[0], j);
    PyObject* result;
    if (st.add) {
      if (st.kind == 2) {
        *static_cast<int64_t*>(st.data) += st.i;
      } else if (st.kind == 0) {
        *static_cast<float*>(st.data) = *static_cast<float*>(st.data) + static_cast<float>(st.f);
      } else {
        *static_cast<double*>(st.data) += st.f;
      }
      bump_version(tensor);
      result = Py_NewRef(tensor);
    } else {
      result = st.kind == 2 ? PyLong_FromLongLong(*static_cast<int64_t*>(st.data))
                            : PyFloat_FromDouble(st.kind == 0 ? static_cast<double>(*static_cast<float*>(st.data))
                                                              : *static_cast<double*>(st.data));
      if (result == nullptr) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    PyList_SET_ITEM(out, j, result);
  }
  return out;
}

}  // namespace lazy
