// The data leaves a replay binds, made from the fields of the last leaf made at the same place (Note [Data leaves
// from templates] in leaf_templates.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// leaf_templates(n): n empty templates, for the places of one replay's writes or new tensors (a capsule the replay
// passes to replay_writes or new_tensors).
PyObject* leaf_templates(PyObject* self, PyObject* n);

// The templates a capsule made by leaf_templates holds, at least ``n`` of them (borrowed: the capsule owns them), or
// NULL with an error set.
struct LeafTemplates;
LeafTemplates* templates_of(PyObject* capsule, Py_ssize_t n);

// A data leaf holding ``out`` (what make_data_leaf(out) makes), built from the template of place ``j`` where ``out``
// fits it, else from scratch, which then becomes the template; from scratch where ``templates`` is NULL. A new
// reference, or NULL with an error set.
PyObject* leaf_at(LeafTemplates* templates, Py_ssize_t j, PyObject* out);

// bind_outputs(storages, outputs, start, templates or None): what a sync does with the values it computed: storage k
// gets a data leaf holding outputs[start + k] (from place k of ``templates`` where given) and its version bumped.
PyObject* bind_outputs(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
