// The IR objects of the recording hot path, as C types: Node (lazy/ir/node.py) and Storage (lazy/device/tensor.py).
//
// They were Python classes with __slots__; as C types, creating one runs no Python frame, attribute reads cost
// what slot reads cost, and the registry of live storages is an intrusive list instead of a WeakSet whose
// removal callback is Python. Neither type takes part in garbage collection: a Node references only other
// Nodes, templates, scalars and backing-device data; a Storage references its Node; nothing refers back.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

struct NodeObject {
  PyObject_HEAD
  PyObject* op;
  PyObject* args;
  PyObject* kwargs;
  PyObject* inputs;
  PyObject* scalars;
  PyObject* shape;
  PyObject* dtype;
  PyObject* metas;
  PyObject* data;
  PyObject* sig;
  long long serial;  // creation order (capture attributes each node to the call that recorded it)
  long long walk;    // the last linearize that reached this node (Note [Marks of a walk] in graph.cpp)
  long long walk_pos;  // its position in that walk's order
};

struct StorageObject {
  PyObject_HEAD
  PyObject* value;
  PyObject* shape;
  PyObject* stride;
  PyObject* failed;
  long long version;
  long long numel;
  long long serial;
  StorageObject* prev;  // the live registry: a circular list in creation order, unlinked by dealloc
  StorageObject* next;
  PyObject* weakreflist;
};

extern PyTypeObject NodeType;
extern PyTypeObject StorageType;

// Readies both types; returns false with a Python error set on failure.
bool init_ir_types();

// The table of interned signatures (Note [Interned signatures] in lazy/ir/node.py). Borrowed.
PyObject* signatures();

// The interned signature (op, args, kwargs, shape, dtype, metas): a new reference, or NULL with an error.
PyObject* intern_signature(PyObject* op, PyObject* args, PyObject* kwargs, PyObject* shape, PyObject* dtype,
                           PyObject* metas);

// The op of data leaves (lazy.ir.node.DATA), for Node.is_data; data_op() reads it (borrowed, may be NULL).
void set_data_op(PyObject* op);
PyObject* data_op();

// A new node with every field given; steals nothing.
PyObject* make_node(PyObject* op, PyObject* args, PyObject* kwargs, PyObject* inputs,
                    PyObject* scalars, PyObject* shape, PyObject* dtype, PyObject* metas, PyObject* data,
                    PyObject* sig);

// A new storage holding ``value``, registered as live.
PyObject* make_storage(PyObject* value, PyObject* shape, PyObject* stride, long long numel);

// Gives a live storage the serial and registry place of one made now (a replay's reused gradient wrapper, Note
// [Reused gradient wrappers] in replay_io.cpp, takes the place its new tensor would have had).
void make_newest(StorageObject* st);

// The serial the next node will get (nodes created since a point in time have serials >= its value).
long long next_node_serial();

// Every live storage, oldest first (a new list).
PyObject* live_storages();
// The live storages whose value is still IR (not a data leaf, not a value whose graph failed), oldest first.
PyObject* pending_storages();

}  // namespace lazy
