// The data leaves a replay binds, made from templates (leaf_templates.h).
//
// Note [Data leaves from templates]
// A replay binds a new data leaf to every storage it updates and to every tensor it creates (a 6-layer GPT step:
// 228 and 77). A leaf made from scratch (make_data_leaf, replay_io.cpp) reads the tensor's sizes and strides into
// new tuples and its dtype through torch's getter, then interns its signature, hashing the tuples and comparing
// them with the table's entry: about 0.2 us a leaf, a third of that replay's host time on an AMD EPYC core. The
// outputs written at one place of a replay have the same layout at every replay, so each place keeps a template:
// the op, args, shape, dtype and interned signature of the leaf last made there, and the sizes, strides and scalar
// type of the tensor it was made for. An output that is an exact torch.Tensor (no subclass, so ``dtype`` is torch's
// getter over the TensorImpl) with plain sizes and strides equal to the template's and the same scalar type gets a
// leaf of the template's fields: field by field what make_data_leaf builds, equal tuples (shared: tuples are
// immutable) and the same signature object (the interned table only grows, so an equal signature interns to the one
// the template holds, taken from the table). Its data and serial are its own, as a new leaf's. Any other output is
// made from scratch, and its leaf becomes the template of the place; a template held in the wrong place would only
// cost that. The template holds no data: only a leaf's immutable fields.
#include "leaf_templates.h"

#include "alias.h"
#include "ir.h"
#include "replay_io.h"

#include <cstdint>
#include <vector>

namespace lazy {

struct LeafTemplate {
  PyObject* op = nullptr;  // strong references, all set or all NULL (no template yet)
  PyObject* args = nullptr;
  PyObject* kwargs = nullptr;
  PyObject* inputs = nullptr;
  PyObject* scalars = nullptr;
  PyObject* shape = nullptr;
  PyObject* dtype = nullptr;
  PyObject* metas = nullptr;
  PyObject* sig = nullptr;
  std::vector<int64_t> layout;  // sizes, then strides
  int scalar_type = -1;

  void clear() {
    for (PyObject** field : {&op, &args, &kwargs, &inputs, &scalars, &shape, &dtype, &metas, &sig}) Py_CLEAR(*field);
  }
};

namespace {

const char* const kCapsule = "lazy.leaf_templates";

}  // namespace

struct LeafTemplates {
  std::vector<LeafTemplate> places;
};

namespace {

void templates_free(PyObject* capsule) {
  auto* t = static_cast<LeafTemplates*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (t == nullptr) {
    PyErr_Clear();
    return;
  }
  for (LeafTemplate& place : t->places) place.clear();
  delete t;
}

// The template of ``place`` taken from ``leaf``, made for ``out``; or no template where ``out`` is not an exact
// tensor with plain sizes and strides.
void remember(LeafTemplate* place, PyObject* leaf, PyObject* out) {
  place->clear();
  if (!exact_layout(out, &place->layout, &place->scalar_type)) return;
  auto* n = reinterpret_cast<NodeObject*>(leaf);
  place->op = Py_NewRef(n->op);
  place->args = Py_NewRef(n->args);
  place->kwargs = Py_NewRef(n->kwargs);
  place->inputs = Py_NewRef(n->inputs);
  place->scalars = Py_NewRef(n->scalars);
  place->shape = Py_NewRef(n->shape);
  place->dtype = Py_NewRef(n->dtype);
  place->metas = Py_NewRef(n->metas);
  place->sig = Py_NewRef(n->sig);
}

}  // namespace

PyObject* leaf_templates(PyObject*, PyObject* n) {
  Py_ssize_t count = PyLong_AsSsize_t(n);
  if (count < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "leaf_templates(n): n >= 0");
    return nullptr;
  }
  auto* t = new LeafTemplates();
  t->places.resize(static_cast<size_t>(count));
  PyObject* capsule = PyCapsule_New(t, kCapsule, templates_free);
  if (capsule == nullptr) delete t;
  return capsule;
}

LeafTemplates* templates_of(PyObject* capsule, Py_ssize_t n) {
  auto* t = PyCapsule_CheckExact(capsule) ? static_cast<LeafTemplates*>(PyCapsule_GetPointer(capsule, kCapsule))
                                          : nullptr;
  if (t == nullptr || static_cast<Py_ssize_t>(t->places.size()) < n) {
    PyErr_Clear();
    PyErr_SetString(PyExc_TypeError, "lazy: not the leaf templates of this replay (leaf_templates(n))");
    return nullptr;
  }
  return t;
}

PyObject* leaf_at(LeafTemplates* templates, Py_ssize_t j, PyObject* out) {
  if (templates == nullptr) return make_data_leaf(out);
  LeafTemplate* place = &templates->places[static_cast<size_t>(j)];
  if (place->sig != nullptr && place->op == data_op() && exact_layout_is(out, place->layout, place->scalar_type)) {
    return make_node(place->op, place->args, place->kwargs, place->inputs, place->scalars, place->shape,
                     place->dtype, place->metas, out, place->sig);
  }
  PyObject* leaf = make_data_leaf(out);
  if (leaf != nullptr) remember(place, leaf, out);
  return leaf;
}

PyObject* bind_outputs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "bind_outputs(storages: list, outputs: list, start, templates or None)");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(args[0]);
  const Py_ssize_t start = PyLong_AsSsize_t(args[2]);
  if (start < 0 || start + n > PyList_GET_SIZE(args[1])) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "bind_outputs: fewer outputs than storages");
    return nullptr;
  }
  LeafTemplates* places = args[3] != Py_None ? templates_of(args[3], n) : nullptr;
  if (args[3] != Py_None && places == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* st = PyList_GET_ITEM(args[0], k);
    if (Py_TYPE(st) != &StorageType) {
      PyErr_SetString(PyExc_TypeError, "bind_outputs: not a Storage");
      return nullptr;
    }
    PyObject* out = PyList_GET_ITEM(args[1], start + k);
    PyObject* leaf = leaf_at(places, k, out);
    if (leaf == nullptr) return nullptr;
    auto* storage = reinterpret_cast<StorageObject*>(st);
    Py_SETREF(storage->value, leaf);  // the storage's IR goes: its graph is freed here, node by node
    storage->version += 1;
  }
  Py_RETURN_NONE;
}

}  // namespace lazy
