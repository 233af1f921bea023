// The per-tensor work of a lazy.compile replay in C (Note [Replay bookkeeping in C] in replay_io.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// A data leaf (lazy.ir.node.data_leaf) holding ``tensor``, a backing-device tensor: a new reference, or NULL with
// an error set.
PyObject* make_data_leaf(PyObject* tensor);

// data_leaf(tensor) for Python.
PyObject* data_leaf_py(PyObject* self, PyObject* tensor);

// replay_inputs(tensors, pending, miss) -> list: the data of each lazy tensor's storage; raises ``pending`` if
// one holds pending IR, ``miss`` if two share a storage.
PyObject* replay_inputs(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// replay_writes(tensors, outs, indices[, templates]) -> int: binds outs[indices[j]] as a data leaf to tensors[j]'s
// storage and bumps its version, for each j, keeping a leaf that already holds that tensor (Note [Rebinding written
// in place]); returns the number of new leaves. ``templates`` (leaf_templates(len(indices))) makes the leaves from
// the fields of those made at the same place before (Note [Data leaves from templates] in leaf_templates.cpp).
PyObject* replay_writes(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// new_tensors(descs, outs, indices, numels[, owners[, templates]]) -> tuple: lazy/device/tensor.py's
// new_tensor(descs[j], a data leaf of outs[indices[j]], numels[j]) for each j, in C and in one call (a replay's new
// tensors: a step's gradients). Where owners (a tuple, or None) has at j a tensor whose gradient nothing else can
// see, that gradient's wrapper takes the value instead and is returned (Note [Reused gradient wrappers] in
// replay_io.cpp). ``templates`` as for replay_writes.
PyObject* new_tensors(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// store_grad(owner, value): ``object.__setattr__(owner, "grad", value)``, skipped where owner's gradient is value
// already (a reused wrapper: Note [Reused gradient wrappers] in replay_io.cpp).
PyObject* store_grad(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
// store_grads(owners, values): store_grad(owners[j], values[j]) for each j in order, in one call (a replay's stores
// of its new gradients); what raises stops it there, as the calls one by one would.
PyObject* store_grads(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// leaves_unshared(pairs) -> (safe, keep): for the (storage, data leaf) pairs a CUDA-graph program bound to its
// static memory (runtime/cuda_graph.py's GraphedProgram._overwritable), whether none is referenced beyond the pair
// and its storage, and the pairs to remember: those still bound or still referenced.
PyObject* leaves_unshared(PyObject* self, PyObject* pairs);

// stale_inputs(leaves, static, seen) -> (dst, src): for a CUDA-graph program's run (GraphedProgram._copy_inputs),
// the static buffers and the inputs to copy into them: each input that is not its buffer and not the tensor
// ``seen`` (weak references, updated here) says was copied there at the last run.
PyObject* stale_inputs(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// host_steps(tensors, adds, values) -> list or None: for each j in order, tensors[j] += values[j] (adds[j] True;
// the tensor is the result) or tensors[j].item(); None, having done nothing, unless every tensor is a host step
// counter it can update (Note [Host step counters in C] in replay_io.cpp).
PyObject* host_steps(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
