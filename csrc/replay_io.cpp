// The per-tensor work of a lazy.compile replay in C.
//
// Note [Replay bookkeeping in C]
// A replayed training step reads the data of every storage it takes (parameters, optimizer state: 50 to a few
// hundred) and binds a new data leaf to every storage it updates. In the replay's generated Python that was about
// 0.5 us a read (an attribute walk and a call) and 1.5 us a write (a data leaf built through Node's constructor,
// tuple(shape), tuple(stride), the version bump), most of what a small step's replay costs besides its program.
// Here a read is the same walk in C (tensor._lz_st.value.data) and a write builds the leaf from the TensorImpl's
// sizes and strides (alias.cpp), or from the fields of the leaf made at the same place before where the output's
// layout is that leaf's (Note [Data leaves from templates] in leaf_templates.cpp); both take the whole list in one
// call. What they do is what the Python did: a read
// of a storage still holding IR raises the replay's Pending (sync, then replay), two inputs that share one storage
// raise Miss (the capture saw distinct ones: its graph does not hold for this call), checked before the replay
// changes anything.
#include "replay_io.h"

#include "alias.h"
#include "ir.h"
#include "leaf_templates.h"
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
  if ((nargs != 3 && nargs != 4) || !is_sequence(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PySequence_Fast_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[2])) {
    PyErr_SetString(PyExc_TypeError, "replay_writes(tensors, outs: list, indices: tuple of the same length[, "
                                     "templates])");
    return nullptr;
  }
  PyObject** tensors = PySequence_Fast_ITEMS(args[0]);
  Py_ssize_t n = PyTuple_GET_SIZE(args[2]);
  Py_ssize_t num_outs = PyList_GET_SIZE(args[1]);
  LeafTemplates* places = nargs == 4 ? templates_of(args[3], n) : nullptr;  // Note [Data leaves from templates]
  if (nargs == 4 && places == nullptr) return nullptr;
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
    PyObject* leaf = leaf_at(places, j, out);
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

// Note [Reused gradient wrappers]
// A replayed training step makes a new lazy tensor for every gradient backward left (``p.grad = g``: 77 in a 6-layer
// GPT step) and drops the one the step before made: ~0.75 us each on a 2-core AMD EPYC, ~2 us on a GPU host, most of
// it torch's ``Tensor._make_wrapper_subclass`` (0.15-0.38 ms of that GPT step's 1-1.75 ms of host time on H200 hosts).
// Where nothing can tell the difference, new_tensors gives the old gradient's wrapper the new value instead: its
// storage takes a data leaf of the output (as replay_writes rebinds a parameter's), and the wrapper is returned in
// the new tensor's place, which the replay stores to ``p.grad``, where it already is. Only ``p`` may see the old
// wrapper, then, and the wrapper must carry nothing a new tensor would not. Checked at every replay:
// - Python holds it only through its TensorImpl. torch (2.11-2.13) preserves a tensor's object while C++ holds the
//   TensorImpl besides the object (Note [PyObject preservation for Tensor and Storages] in c10/util/intrusive_ptr.h:
//   the TensorImpl then holds one reference to the object), so ``Py_REFCNT == 1`` for a gradient nothing else holds
//   (``sys.getrefcount(p.grad)`` reads 2: that and the argument's), 2 once a user's ``g = p.grad`` holds it; ``g``
//   must keep the old values then, and ``p.grad is g`` turn False. No Python weak reference (``weakref.ref(p.grad)``
//   dies with the old gradient in eager).
// - C++ holds it only as ``p``'s gradient: the TensorImpl's use count is 2 (the object's at::Tensor and ``p``'s
//   AutogradMeta::grad_), none weak (``torch._C._WeakTensorRef``); a view's ``_base``, a tensor autograd saved
//   (``a * p.grad``: the backward reads it, no Python reference shows), a second parameter given the same gradient
//   each add a use. Its C++ StorageImpl, which lazy views and aliases share (alias.cpp) and ``untyped_storage()``
//   hands out (its object then lives as long as the StorageImpl), has one use and no weak one.
// - Lazy holds nothing else of it: its Storage object (``_lz_st``), which views and aliases share, has one
//   reference and no weak one; its value is a data leaf (IR still pending stays the sync's), whose graph did not
//   fail. IR recorded on the old gradient (``n = p.grad.norm()``, unsynced) holds the old leaf, not the storage, so
//   it still computes from the old values: the storage takes a new leaf, the old one is never written into (spares,
//   Note [Reused outputs], reuse a buffer only once nothing holds it). Such a gradient is reused.
// - Nothing is carried over: exactly LazyTensor (not a ``__class__`` assigned since), no instance attributes but
//   ``_lz_desc`` and ``_lz_st`` (``p.grad.note = 1`` stays on the old object), no hook fields (``_backward_hooks``,
//   ``_post_accumulate_grad_hooks``, read where probe_hook_fields found them; torch's setters of both also make
//   AutogradMeta), no AutogradMeta at all (requires_grad, ``.grad``, grad_fn, hooks, views: toggling requires_grad
//   on and off leaves one), not an inference tensor, no negative or conjugate bit, and the sizes, strides, offset,
//   dtype, device and desc of the new tensor. Its version counter reads 0, as a new tensor's (and eager's new
//   gradient's) does: a wrapper updated in place since (``p.grad.mul_(2)``, synced) is not reused, so
//   ``p.grad._version`` never tells.
// - The store is torch's: ``p``'s type finds ``grad`` as TensorBase's own descriptor, its ``__torch_function__`` is
//   torch's disabled one and no TorchFunctionMode is active (as in Note [Gradients in guard programs],
//   guard_reads.cpp), so the gradient read from the TensorImpl is what ``p.grad`` returns and what the store sets.
// What the replay does after new_tensors must not reach the old gradient either; the capture offers a store for
// reuse only where that holds (Note [Reused gradient wrappers] in lazy/capture/replay.py).
// new_tensors holds off garbage collection, whose finalizers could run any code between a check and the rebinding
// it vouches for, and checks again what it offered once it has made a new tensor in between; a wrapper offered
// twice (one owner given twice) goes to the first, whose returned reference fails the second's check. A reused
// storage takes the serial and place among live storages a new one would have (mark_step orders its outputs by
// them), in the order the new tensors would have been made. Left to tell: ``id()`` of the new gradient equals the
// dead old one's, as CPython allows of objects whose lifetimes do not overlap.
namespace {

PyObject* g_grad_descr = nullptr;  // torch._C.TensorBase's ``grad`` descriptor
PyObject* g_disabled_tf = nullptr;  // torch._C._disabled_torch_function_impl
PyObject* s_grad_name = nullptr;
PyObject* s_torch_function_name = nullptr;

// Whether ``owner.grad`` is torch's getter and setter over the TensorImpl's gradient, with nothing to intercept them.
bool plain_grad_slot(PyObject* owner) {
  if (g_grad_descr == nullptr) {
    s_grad_name = PyUnicode_InternFromString("grad");
    s_torch_function_name = PyUnicode_InternFromString("__torch_function__");
    PyObject* torch_c = PyImport_ImportModule("torch._C");
    PyObject* base = torch_c != nullptr ? PyObject_GetAttrString(torch_c, "TensorBase") : nullptr;
    PyObject* descr = base != nullptr && PyType_Check(base)
                          ? PyDict_GetItemWithError(reinterpret_cast<PyTypeObject*>(base)->tp_dict, s_grad_name)
                          : nullptr;
    PyObject* disabled = descr != nullptr ? PyObject_GetAttrString(torch_c, "_disabled_torch_function_impl") : nullptr;
    Py_XDECREF(base);
    Py_XDECREF(torch_c);
    if (disabled == nullptr || s_grad_name == nullptr || s_torch_function_name == nullptr ||
        Py_TYPE(descr) != &PyGetSetDescr_Type) {
      Py_XDECREF(disabled);
      PyErr_Clear();
      return false;
    }
    g_grad_descr = Py_NewRef(descr);
    g_disabled_tf = disabled;
  }
  PyTypeObject* tp = Py_TYPE(owner);
  return _PyType_Lookup(tp, s_grad_name) == g_grad_descr && PyObject_TypeCheck(owner, PyDescr_TYPE(g_grad_descr)) &&
         _PyType_Lookup(tp, s_torch_function_name) == g_disabled_tf && !torch_function_mode_active();
}

bool same_value(PyObject* a, PyObject* b) {
  if (a == b) return true;
  int eq = PyObject_RichCompareBool(a, b, Py_EQ);
  if (eq < 0) PyErr_Clear();
  return eq == 1;
}

// The instance dict of a lazy tensor (borrowed: the tensor holds it; made the first time), or NULL (no error set).
PyObject* instance_dict(PyObject* tensor) {
  PyObject* dict = PyObject_GenericGetDict(tensor, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  Py_DECREF(dict);
  return dict;
}

// The gradient wrapper of ``owner`` that new_tensors may give the value of a new tensor of ``desc`` over ``out``
// (borrowed), or NULL. Never raises.
PyObject* reusable_grad(PyObject* owner, PyObject* desc, PyObject* out, long long numel) {
  PyObject* shape = PyTuple_GET_ITEM(desc, 0);
  PyObject* stride = PyTuple_GET_ITEM(desc, 1);
  if (!PyTuple_Check(shape) || !PyTuple_Check(stride) || !plain_grad_slot(owner)) return nullptr;
  PyObject* grad = sole_grad(owner, out, shape, stride);
  if (grad == nullptr || Py_TYPE(grad) != recording::g.lazy_type) return nullptr;
  PyObject* dict = instance_dict(grad);
  if (dict == nullptr || PyDict_GET_SIZE(dict) != 2) return nullptr;
  PyObject* st_obj = PyDict_GetItem(dict, recording::g.name_st);  // borrowed
  PyObject* old_desc = PyDict_GetItem(dict, recording::g.name_desc);
  if (st_obj == nullptr || old_desc == nullptr || Py_TYPE(st_obj) != &StorageType || Py_REFCNT(st_obj) != 1) {
    return nullptr;
  }
  auto* st = reinterpret_cast<StorageObject*>(st_obj);
  if (st->weakreflist != nullptr || st->failed != Py_None || st->numel != numel || Py_TYPE(st->value) != &NodeType) {
    return nullptr;
  }
  auto* leaf = reinterpret_cast<NodeObject*>(st->value);
  if (leaf->op != data_op() || leaf->data == Py_None || !same_value(st->shape, shape) ||
      !same_value(st->stride, stride) || !same_value(old_desc, desc)) {
    return nullptr;
  }
  return grad;
}

// The reused wrapper takes the new value (reusable_grad vouched for it): its storage a new data leaf, a version no
// cached view value has, and the new tensor's desc object.
void rebind_grad(PyObject* grad, PyObject* leaf, PyObject* desc) {
  PyObject* dict = instance_dict(grad);
  auto* st = reinterpret_cast<StorageObject*>(PyDict_GetItem(dict, recording::g.name_st));
  Py_SETREF(st->value, Py_NewRef(leaf));
  st->version += 1;
  if (PyDict_GetItem(dict, recording::g.name_desc) != desc && PyDict_SetItem(dict, recording::g.name_desc, desc) != 0) {
    PyErr_Clear();  // an equal desc stays (replacing a present key's value allocates nothing)
  }
}

// The storage of a tensor new_tensors returns (borrowed), or NULL with an error set.
StorageObject* storage_in(PyObject* tensor) {
  PyObject* st = PyObject_GetAttr(tensor, recording::g.name_st);
  if (st == nullptr) return nullptr;
  Py_DECREF(st);  // the tensor holds it
  if (Py_TYPE(st) != &StorageType) {
    PyErr_SetString(PyExc_TypeError, "lazy internal error: a new tensor's storage is not a Storage");
    return nullptr;
  }
  return reinterpret_cast<StorageObject*>(st);
}

}  // namespace

// A reused wrapper is ``p.grad`` already: storing it again through torch's setter (~0.36 us: its argument checks)
// binds what is there, so store_grad skips the store where ``owner.grad`` is torch's slot and holds ``value``, and
// else stores as ``object.__setattr__(owner, "grad", value)`` does.
namespace {

// store_grad's store of one value: 0, or -1 with an error set.
int store_one_grad(PyObject* owner, PyObject* value) {
  if (plain_grad_slot(owner) && grad_is(owner, value)) return 0;
  PyObject* name = s_grad_name != nullptr ? Py_NewRef(s_grad_name) : PyUnicode_InternFromString("grad");
  if (name == nullptr) return -1;
  const int failed = PyObject_GenericSetAttr(owner, name, value);
  Py_DECREF(name);
  return failed != 0 ? -1 : 0;
}

}  // namespace

PyObject* store_grad(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "store_grad(owner, value)");
    return nullptr;
  }
  if (store_one_grad(args[0], args[1]) != 0) return nullptr;
  Py_RETURN_NONE;
}

PyObject* store_grads(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "store_grads(owners: tuple, values: tuple of the same length)");
    return nullptr;
  }
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(args[0]); ++j) {
    if (store_one_grad(PyTuple_GET_ITEM(args[0], j), PyTuple_GET_ITEM(args[1], j)) != 0) return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* new_tensors(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  using recording::g;
  if (nargs < 4 || nargs > 6 || !PyTuple_Check(args[0]) || !PyList_Check(args[1]) || !PyTuple_Check(args[2]) ||
      !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[2]) != PyTuple_GET_SIZE(args[0]) ||
      PyTuple_GET_SIZE(args[3]) != PyTuple_GET_SIZE(args[0]) ||
      (nargs >= 5 && args[4] != Py_None &&
       (!PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != PyTuple_GET_SIZE(args[0]))) ||
      g.make_wrapper == nullptr) {
    PyErr_SetString(PyExc_TypeError, "new_tensors(descs: tuple, outs: list, indices: tuple, numels: tuple[, owners: "
                                     "tuple or None[, templates]]), all of one length, once configured");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  PyObject* owners = nargs >= 5 && args[4] != Py_None ? args[4] : nullptr;
  LeafTemplates* places = nargs == 6 ? templates_of(args[5], n) : nullptr;  // Note [Data leaves from templates]
  if (nargs == 6 && places == nullptr) return nullptr;
  struct Item {
    PyObject* desc;
    PyObject* out;
    PyObject* numel;
    long long count;
    PyObject* leaf;   // owned
    PyObject* reuse;  // borrowed: the wrapper to give the value, or NULL
  };
  std::vector<Item> items(static_cast<size_t>(n));
  struct Release {
    std::vector<Item>& items;
    ~Release() {
      for (Item& it : items) Py_XDECREF(it.leaf);
    }
  } release{items};
  // No garbage collection (which runs finalizers: any code) between a check and the rebinding it vouches for
  struct NoCollection {
    int was = PyGC_Disable();
    ~NoCollection() {
      if (was) PyGC_Enable();
    }
  } no_collection;
  recording::Ref result(PyTuple_New(n));
  if (!result) return nullptr;
  for (Py_ssize_t j = 0; j < n; ++j) {  // every data leaf first: what allocates comes before any check
    Item& it = items[static_cast<size_t>(j)];
    it.desc = PyTuple_GET_ITEM(args[0], j);
    it.numel = PyTuple_GET_ITEM(args[3], j);
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], j));
    if (!PyTuple_Check(it.desc) || PyTuple_GET_SIZE(it.desc) != 4 || i < 0 || i >= PyList_GET_SIZE(args[1])) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "new_tensors: a bad desc or output index");
      return nullptr;
    }
    it.count = PyLong_AsLongLong(it.numel);
    if (it.count == -1 && PyErr_Occurred()) return nullptr;
    it.out = PyList_GET_ITEM(args[1], i);
    it.leaf = leaf_at(places, j, it.out);
    if (it.leaf == nullptr) return nullptr;
  }
  bool any = false;
  for (Py_ssize_t j = 0; owners != nullptr && j < n; ++j) {
    Item& it = items[static_cast<size_t>(j)];
    PyObject* owner = PyTuple_GET_ITEM(owners, j);
    it.reuse = owner == Py_None ? nullptr : reusable_grad(owner, it.desc, it.out, it.count);
    any = any || it.reuse != nullptr;
  }
  // New tensors where no wrapper is reused (each check repeated after one: making it runs no code that could take a
  // reference, but nothing in the checks has to rely on that), then the reused ones.
  bool allocated = false;
  for (int pass = 0; pass < 2; ++pass) {
    for (Py_ssize_t j = 0; j < n; ++j) {
      Item& it = items[static_cast<size_t>(j)];
      if ((it.reuse != nullptr) != (pass == 1)) continue;
      if (pass == 1) {
        PyObject* owner = PyTuple_GET_ITEM(owners, j);
        PyObject* grad = it.reuse;
        // one wrapper offered twice (one owner twice) is returned once: the first took a reference
        if ((allocated ? reusable_grad(owner, it.desc, it.out, it.count) == grad : Py_REFCNT(grad) == 1)) {
          rebind_grad(grad, it.leaf, it.desc);
          PyTuple_SET_ITEM(result.get(), j, Py_NewRef(grad));
          ++g.reused_grads;
          continue;
        }
        it.reuse = nullptr;
      }
      PyObject* t = recording::new_base(it.desc, it.leaf, it.numel);
      if (t == nullptr) return nullptr;
      PyTuple_SET_ITEM(result.get(), j, t);
      allocated = true;
    }
  }
  if (any) {  // every storage in the place a new one would take, in order
    for (Py_ssize_t j = 0; j < n; ++j) {
      StorageObject* st = storage_in(PyTuple_GET_ITEM(result.get(), j));
      if (st == nullptr) return nullptr;
      make_newest(st);
    }
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
