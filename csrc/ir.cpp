// Node and Storage as C types; see ir.h.
#include "ir.h"

#include <structmember.h>

#include <vector>

namespace lazy {

namespace {

PyObject* g_signatures = nullptr;  // dict: signature tuple -> itself
long long g_serial = 0;            // creation order of storages
long long g_node_serial = 0;       // creation order of nodes
StorageObject g_live_head;         // sentinel of the live registry (only prev/next are used)
PyObject* g_data_op = nullptr;     // lazy.ir.node.DATA: the op of data leaves

inline void set_field(PyObject** slot, PyObject* value) {
  Py_INCREF(value);
  *slot = value;
}

// ---- Node ----------------------------------------------------------------------------------------------------

PyObject* node_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* names[] = {"op", "args", "kwargs", "inputs", "scalars", "shape", "dtype", "metas", "data",
                                nullptr};
  PyObject *op, *targs, *tkw, *inputs, *scalars, *shape, *dtype, *metas = Py_None, *data = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!OOO|OO", const_cast<char**>(names), &op, &targs, &tkw,
                                   &PyTuple_Type, &inputs, &scalars, &shape, &dtype, &metas, &data)) {
    return nullptr;
  }
  PyObject* sig = intern_signature(op, targs, tkw, shape, dtype, metas);
  if (sig == nullptr) return nullptr;
  if (type != &NodeType) {
    PyErr_SetString(PyExc_TypeError, "lazy._C.Node cannot be subclassed");
    return nullptr;
  }
  PyObject* node = make_node(op, targs, tkw, inputs, scalars, shape, dtype, metas, data, sig);
  Py_DECREF(sig);
  return node;
}

// Note [Nodes freed without recursion]
// A graph dies from its roots: a node's last reference goes, its inputs tuple goes, and that drops the last
// reference of each input, so freeing a 200-op chain recursed 400 frames deep (node, tuple, node, ...), and
// CPython's trashcan parks every object past a nesting of 50 on a list to free it later. A node whose last
// reference goes while this thread is already freeing nodes is instead pushed on a stack and freed by the
// outermost call's loop: the recursion is one tuple deep at most (dropping the 200-op chain: 7.9 -> 7.0 us on an
// AMD EPYC core). The stack is per thread: freeing a node's data can release the GIL (a tensor's deleter), and
// another thread's nodes then go on its own stack.
thread_local bool t_freeing_nodes = false;
thread_local std::vector<NodeObject*> t_nodes_to_free;

void free_node(NodeObject* self) {
  Py_XDECREF(self->op);
  Py_XDECREF(self->args);
  Py_XDECREF(self->kwargs);
  Py_XDECREF(self->inputs);
  Py_XDECREF(self->scalars);
  Py_XDECREF(self->shape);
  Py_XDECREF(self->dtype);
  Py_XDECREF(self->metas);
  Py_XDECREF(self->data);
  Py_XDECREF(self->sig);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

void node_dealloc(NodeObject* self) {
  if (t_freeing_nodes) {
    t_nodes_to_free.push_back(self);
    return;
  }
  t_freeing_nodes = true;
  free_node(self);
  while (!t_nodes_to_free.empty()) {
    NodeObject* next = t_nodes_to_free.back();
    t_nodes_to_free.pop_back();
    free_node(next);
  }
  t_freeing_nodes = false;
}

PyObject* node_is_data(NodeObject* self, void*) {
  return PyBool_FromLong(g_data_op != nullptr && self->op == g_data_op);
}

PyGetSetDef node_getset[] = {
    {"is_data", reinterpret_cast<getter>(node_is_data), nullptr, "True for a leaf holding data", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* node_repr(NodeObject* self) {
  // Node(aten.add.Tensor, shape=(4, 4), dtype=torch.float32, inputs=2); an Op's name, an overload's name().
  PyObject* name = PyObject_GetAttrString(self->op, "name");
  if (name == nullptr) {
    PyErr_Clear();
  } else if (PyCallable_Check(name)) {
    Py_SETREF(name, PyObject_CallNoArgs(name));
    if (name == nullptr) return nullptr;
  }
  PyObject* text = PyUnicode_FromFormat("Node(%S, shape=%R, dtype=%R, inputs=%zd)", name ? name : self->op,
                                        self->shape, self->dtype,
                                        PyTuple_Check(self->inputs) ? PyTuple_GET_SIZE(self->inputs) : 0);
  Py_XDECREF(name);
  return text;
}

PyMemberDef node_members[] = {
    {"op", T_OBJECT, offsetof(NodeObject, op), 0, "the ATen overload or internal Op"},
    {"args", T_OBJECT, offsetof(NodeObject, args), 0, "positional argument template"},
    {"kwargs", T_OBJECT, offsetof(NodeObject, kwargs), 0, "keyword argument template: ((name, value), ...)"},
    {"inputs", T_OBJECT, offsetof(NodeObject, inputs), 0, "input nodes, in template order"},
    {"scalars", T_OBJECT, offsetof(NodeObject, scalars), 0, "runtime scalars, in template order"},
    {"shape", T_OBJECT, offsetof(NodeObject, shape), 0, "output shape (None for several outputs)"},
    {"dtype", T_OBJECT, offsetof(NodeObject, dtype), 0, "output dtype (None for several outputs)"},
    {"metas", T_OBJECT, offsetof(NodeObject, metas), 0, "(shape, dtype) of each output of a multi-output op"},
    {"data", T_OBJECT, offsetof(NodeObject, data), 0, "backing-device data of a data leaf"},
    {"sig", T_OBJECT, offsetof(NodeObject, sig), READONLY, "the interned signature"},
    {"serial", T_LONGLONG, offsetof(NodeObject, serial), READONLY, "creation order"},
    {nullptr, 0, 0, 0, nullptr},
};

// ---- Storage -------------------------------------------------------------------------------------------------

PyObject* storage_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* names[] = {"value", "shape", "stride", "numel", nullptr};
  PyObject *value, *shape, *stride;
  long long numel;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOL", const_cast<char**>(names), &value, &shape, &stride,
                                   &numel)) {
    return nullptr;
  }
  if (type != &StorageType) {
    PyErr_SetString(PyExc_TypeError, "lazy._C.Storage cannot be subclassed");
    return nullptr;
  }
  return make_storage(value, shape, stride, numel);
}

void storage_dealloc(StorageObject* self) {
  if (self->weakreflist != nullptr) PyObject_ClearWeakRefs(reinterpret_cast<PyObject*>(self));
  self->prev->next = self->next;
  self->next->prev = self->prev;
  Py_XDECREF(self->value);
  Py_XDECREF(self->shape);
  Py_XDECREF(self->stride);
  Py_XDECREF(self->failed);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMemberDef storage_members[] = {
    {"value", T_OBJECT, offsetof(StorageObject, value), 0, "the current IR value of the base tensor"},
    {"shape", T_OBJECT, offsetof(StorageObject, shape), 0, "shape of the base tensor"},
    {"stride", T_OBJECT, offsetof(StorageObject, stride), 0, "stride of the base tensor"},
    {"failed", T_OBJECT, offsetof(StorageObject, failed), 0, "a value whose graph raised (later syncs skip it)"},
    {"version", T_LONGLONG, offsetof(StorageObject, version), 0, "bumped by every in-place update"},
    {"numel", T_LONGLONG, offsetof(StorageObject, numel), 0, "elements of the storage"},
    {"serial", T_LONGLONG, offsetof(StorageObject, serial), READONLY, "creation order"},
    {nullptr, 0, 0, 0, nullptr},
};

}  // namespace

PyTypeObject NodeType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject StorageType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool init_ir_types() {
  // NOTE: not a base type: a Python subclass would be a heap type, and heap types take part in garbage
  // collection, whose passes over a growing graph cost more than everything else recording does.
  NodeType.tp_name = "lazy._C.Node";
  NodeType.tp_basicsize = sizeof(NodeObject);
  NodeType.tp_flags = Py_TPFLAGS_DEFAULT;
  NodeType.tp_doc =
      "Node(op, args, kwargs, inputs, scalars, shape, dtype, metas=None, data=None): an immutable IR node "
      "(lazy/ir/node.py).";
  NodeType.tp_new = node_new;
  NodeType.tp_dealloc = reinterpret_cast<destructor>(node_dealloc);
  NodeType.tp_members = node_members;
  NodeType.tp_getset = node_getset;
  NodeType.tp_repr = reinterpret_cast<reprfunc>(node_repr);

  StorageType.tp_name = "lazy._C.Storage";
  StorageType.tp_basicsize = sizeof(StorageObject);
  StorageType.tp_flags = Py_TPFLAGS_DEFAULT;
  StorageType.tp_doc = "The functional stand-in for a storage (Note [Storages and views], lazy/device/tensor.py).";
  StorageType.tp_new = storage_new;
  StorageType.tp_dealloc = reinterpret_cast<destructor>(storage_dealloc);
  StorageType.tp_members = storage_members;
  StorageType.tp_weaklistoffset = offsetof(StorageObject, weakreflist);

  g_live_head.prev = g_live_head.next = &g_live_head;
  g_signatures = PyDict_New();
  return g_signatures != nullptr && PyType_Ready(&NodeType) == 0 && PyType_Ready(&StorageType) == 0;
}

PyObject* signatures() { return g_signatures; }

PyObject* data_op() { return g_data_op; }

void set_data_op(PyObject* op) {
  Py_INCREF(op);
  Py_XSETREF(g_data_op, op);
}

PyObject* intern_signature(PyObject* op, PyObject* args, PyObject* kwargs, PyObject* shape, PyObject* dtype,
                           PyObject* metas) {
  // id(op), not op: ops are immortal and OpOverload.__hash__ is a Python method.
  PyObject* op_id = PyLong_FromVoidPtr(op);
  if (op_id == nullptr) return nullptr;
  PyObject* sig = PyTuple_Pack(6, op_id, args, kwargs, shape, dtype, metas);
  Py_DECREF(op_id);
  if (sig == nullptr) return nullptr;
  PyObject* interned = PyDict_SetDefault(g_signatures, sig, sig);  // borrowed
  Py_XINCREF(interned);
  Py_DECREF(sig);
  return interned;
}

PyObject* make_node(PyObject* op, PyObject* args, PyObject* kwargs, PyObject* inputs,
                    PyObject* scalars, PyObject* shape, PyObject* dtype, PyObject* metas, PyObject* data,
                    PyObject* sig) {
  auto* node = reinterpret_cast<NodeObject*>(NodeType.tp_alloc(&NodeType, 0));
  if (node == nullptr) return nullptr;
  set_field(&node->op, op);
  set_field(&node->args, args);
  set_field(&node->kwargs, kwargs);
  set_field(&node->inputs, inputs);
  set_field(&node->scalars, scalars);
  set_field(&node->shape, shape);
  set_field(&node->dtype, dtype);
  set_field(&node->metas, metas);
  set_field(&node->data, data);
  set_field(&node->sig, sig);
  node->serial = g_node_serial++;
  return reinterpret_cast<PyObject*>(node);
}

long long next_node_serial() { return g_node_serial; }

PyObject* make_storage(PyObject* value, PyObject* shape, PyObject* stride, long long numel) {
  auto* st = reinterpret_cast<StorageObject*>(StorageType.tp_alloc(&StorageType, 0));
  if (st == nullptr) return nullptr;
  set_field(&st->value, value);
  set_field(&st->shape, shape);
  set_field(&st->stride, stride);
  set_field(&st->failed, Py_None);
  st->version = 0;
  st->numel = numel;
  st->serial = g_serial++;
  st->weakreflist = nullptr;
  st->prev = g_live_head.prev;
  st->next = &g_live_head;
  g_live_head.prev->next = st;
  g_live_head.prev = st;
  return reinterpret_cast<PyObject*>(st);
}

void make_newest(StorageObject* st) {
  st->prev->next = st->next;
  st->next->prev = st->prev;
  st->prev = g_live_head.prev;
  st->next = &g_live_head;
  g_live_head.prev->next = st;
  g_live_head.prev = st;
  st->serial = g_serial++;
}

PyObject* live_storages() {
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (StorageObject* st = g_live_head.next; st != &g_live_head; st = st->next) {
    if (PyList_Append(out, reinterpret_cast<PyObject*>(st)) != 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

PyObject* pending_storages() {
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  PyObject* data = data_op();
  for (StorageObject* st = g_live_head.next; st != &g_live_head; st = st->next) {
    PyObject* value = st->value;
    if (value == st->failed) continue;  // a value whose graph raised: later syncs leave it alone
    if (Py_TYPE(value) != &NodeType) {
      PyErr_SetString(PyExc_TypeError, "lazy: a storage's value is not a Node");
      Py_DECREF(out);
      return nullptr;
    }
    if (reinterpret_cast<NodeObject*>(value)->op == data) continue;  // synced: data on the backing device
    if (PyList_Append(out, reinterpret_cast<PyObject*>(st)) != 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
  return out;
}

}  // namespace lazy
