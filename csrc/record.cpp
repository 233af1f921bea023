// The recording hot path: LazyTensor.__torch_dispatch__ in C.
//
// Every op on a lazy tensor enters here. A functional op, a single-output view or an in-place op on a base tensor
// (registered by lazy/trace/dispatch.py after its first call) whose arguments are lazy tensors, Python numbers, int
// and bool lists, None, strings, dtypes, memory formats and layouts is recorded without running Python: the
// argument template and shape-memo key are built exactly as record.py's ``flatten`` builds them, the memoized
// output metadata and interned signature are found in one dict, and the Node(s), Storage(s) and wrapper
// tensor(s) are made directly. Anything else -- a first call whose metadata is not memoized yet, lists of
// tensors, in-place ops on views, random ops, nested outputs -- goes to the Python recorder (``dispatch_slow``),
// which stays the reference for what recording means. LazyTensor methods that skip the dispatcher altogether
// (``x * 2``, ``x.sin()``) record through record() too: record_methods.cpp.
#include "record.h"
#include "record_state.h"

#include <array>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "alias.h"
#include "ir.h"
#include "replay_io.h"

namespace lazy {

namespace recording {

State g;

}  // namespace recording

using namespace recording;

namespace {

constexpr int kMaxArgs = 16;

// Arguments collected while building the template; owned references, released on destruction.
struct Collected {
  PyObject* ins[kMaxArgs];
  PyObject* scalars[kMaxArgs];
  PyObject* memo[kMaxArgs];
  int n_ins = 0, n_scalars = 0, n_memo = 0;
  // The first lazy tensor argument's storage and view chain (for views and in-place ops: ``self``).
  PyObject* first_st = nullptr;
  PyObject* first_chain = nullptr;
  ~Collected() {
    Py_XDECREF(first_st);
    Py_XDECREF(first_chain);
    for (int i = 0; i < n_ins; ++i) Py_DECREF(ins[i]);
    for (int i = 0; i < n_scalars; ++i) Py_DECREF(scalars[i]);
    for (int i = 0; i < n_memo; ++i) Py_DECREF(memo[i]);
  }
};

PyObject* tuple_of(PyObject* const* items, int n) {
  PyObject* t = PyTuple_New(n);
  if (t == nullptr) return nullptr;
  for (int i = 0; i < n; ++i) {
    Py_INCREF(items[i]);
    PyTuple_SET_ITEM(t, i, items[i]);
  }
  return t;
}

// A tuple of the list's/tuple's elements if every one is an exact int or a bool (a static int[] or bool[]
// argument, such as an output mask), else kBail.
PyObject* static_int_list(PyObject* v) {
  Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
  PyObject** items = PySequence_Fast_ITEMS(v);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PyLong_CheckExact(items[i]) && !PyBool_Check(items[i])) return kBail;
  }
  if (PyTuple_CheckExact(v)) {
    Py_INCREF(v);
    return v;
  }
  return PyList_AsTuple(v);
}

// Adds a lazy tensor argument: its current IR value to ins, its (shape, stride, offset, dtype) to memo.
bool add_tensor(PyObject* v, Collected& c) {
  Ref chain(PyObject_GetAttr(v, g.name_chain));
  if (!chain) return false;
  Ref st;
  if (chain.get() == Py_None || c.n_ins == 0) {  // the first tensor's storage is kept for views and in-place ops
    st = Ref(PyObject_GetAttr(v, g.name_st));
    if (!st) return false;
    if (Py_TYPE(st.get()) != &StorageType || (chain.get() != Py_None && !PyTuple_CheckExact(chain.get()))) {
      PyErr_SetString(PyExc_TypeError, "lazy internal error: a lazy tensor's storage or view chain is malformed");
      return false;
    }
  }
  PyObject* node;
  if (chain.get() == Py_None) {
    node = reinterpret_cast<StorageObject*>(st.get())->value;
    Py_INCREF(node);
  } else {
    node = PyObject_CallOneArg(g.view_value, v);
    if (node == nullptr) return false;
  }
  if (c.n_ins == 0) {
    c.first_st = st.release();
    c.first_chain = chain.release();
  }
  c.ins[c.n_ins++] = node;
  PyObject* desc = PyObject_GetAttr(v, g.name_desc);
  if (desc == nullptr) return false;
  c.memo[c.n_memo++] = desc;
  return true;
}

// The template item of one argument (a new reference), flattened as record.py's ``_flat`` does; kBail for
// anything the fast path leaves to Python.
PyObject* flatten_value(PyObject* v, int kind, Collected& c) {
  PyTypeObject* tv = Py_TYPE(v);
  if (tv == g.lazy_type) {
    if (c.n_ins == kMaxArgs || c.n_memo == kMaxArgs) return kBail;
    if (!add_tensor(v, c)) return nullptr;
    Py_INCREF(g.tensor_marker);
    return g.tensor_marker;
  }
  if (tv == &PyFloat_Type || tv == &PyLong_Type || tv == &PyBool_Type) {
    if (kind == kStatic) {
      Py_INCREF(v);
      return v;
    }
    if (c.n_scalars == kMaxArgs || c.n_memo == kMaxArgs) return kBail;
    Py_INCREF(v);
    c.scalars[c.n_scalars++] = v;
    if (kind == kRuntimeMemoValue) {
      Py_INCREF(v);
      c.memo[c.n_memo++] = v;
    }
    PyObject* marker = tv == &PyFloat_Type ? g.float_marker : tv == &PyLong_Type ? g.int_marker : g.bool_marker;
    Py_INCREF(marker);
    return marker;
  }
  if (v == Py_None || tv == &PyUnicode_Type || tv == g.dtype_type) {
    Py_INCREF(v);
    return v;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(g.static_types); ++i) {  // as record.py's _flat: kept as is
    if (reinterpret_cast<PyObject*>(tv) == PyTuple_GET_ITEM(g.static_types, i)) {
      Py_INCREF(v);
      return v;
    }
  }
  if ((tv == &PyList_Type || tv == &PyTuple_Type) && kind == kStatic) return static_int_list(v);
  return kBail;
}

// The fast-cache entry of a functional op with several outputs (record.py's emit_outputs): a flat tuple or list
// of tensors (each Out) and Nones (outputs masked off); anything else (nesting) is left to Python. The entry holds
// the node's signature and metas and, per output, None or the signature of its getitem node, its metadata, numel
// and index.
PyObject* multi_entry(PyObject* func, PyObject* key, PyObject* targs, PyObject* tkw, PyObject* out) {
  bool is_list = PyList_CheckExact(out);
  if (!is_list && !PyTuple_CheckExact(out)) return kBail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(out);
  PyObject** items = PySequence_Fast_ITEMS(out);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (items[i] != Py_None && (Py_TYPE(items[i]) != g.out_type || PyTuple_GET_SIZE(items[i]) != 5)) return kBail;
  }
  Ref metas(PyTuple_New(n));
  Ref outs(PyTuple_New(n));
  if (!metas || !outs) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = items[i];
    if (o == Py_None) {
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(metas.get(), i, Py_None);
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(outs.get(), i, Py_None);
      continue;
    }
    PyObject* shape = PyTuple_GET_ITEM(o, 0);
    PyObject* dtype = PyTuple_GET_ITEM(o, 3);
    PyObject* meta = PyTuple_Pack(2, shape, dtype);
    if (meta == nullptr) return nullptr;
    PyTuple_SET_ITEM(metas.get(), i, meta);
    Ref index(PyLong_FromSsize_t(i));
    Ref index_args(index ? PyTuple_Pack(1, index.get()) : nullptr);
    Ref sig(index_args ? intern_signature(g.getitem_op, index_args.get(), g.empty_tuple, shape, dtype, Py_None)
                       : nullptr);
    Ref desc(sig ? PyTuple_GetSlice(o, 0, 4) : nullptr);
    PyObject* entry = desc ? PyTuple_Pack(4, sig.get(), desc.get(), PyTuple_GET_ITEM(o, 4), index_args.get())
                           : nullptr;
    if (entry == nullptr) return nullptr;
    PyTuple_SET_ITEM(outs.get(), i, entry);
  }
  Ref sig(intern_signature(func, targs, tkw, Py_None, Py_None, metas.get()));
  if (!sig) return nullptr;
  Ref made(PyTuple_Pack(5, sig.get(), metas.get(), outs.get(), is_list ? Py_True : Py_False, Py_None));
  if (!made || PyDict_SetItem(g.fast_cache, key, made.get()) != 0) return nullptr;
  return made.get();  // the cache holds it now
}

// The fast-cache entry of a call, made from the shape memo on first use; borrowed, kBail, or NULL with an error.
PyObject* cache_entry(PyObject* func, const FastOp& op, PyObject* key, PyObject* targs, PyObject* tkw) {
  PyObject* entry = PyDict_GetItemWithError(g.fast_cache, key);  // borrowed
  if (entry != nullptr || PyErr_Occurred()) return entry;
  PyObject* out = PyDict_GetItemWithError(g.memo, key);  // borrowed
  if (out == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    return kBail;  // first call of this signature: the Python recorder infers and memoizes it
  }
  Ref functional_key;
  if (op.kind == kInplace) {
    // The in-place op's own metadata was checked (key above); the recorded node is its functional variant's,
    // memoized under (variant, template, memo) by record_inplace, and must have self's shape and dtype.
    functional_key = Ref(PyTuple_Pack(4, op.functional, targs, tkw, PyTuple_GET_ITEM(key, 3)));
    if (!functional_key) return nullptr;
    out = PyDict_GetItemWithError(g.memo, functional_key.get());
    if (out == nullptr) return PyErr_Occurred() ? nullptr : kBail;
    PyObject* self_desc = PyTuple_GET_ITEM(PyTuple_GET_ITEM(key, 3), 0);
    if (Py_TYPE(out) != g.out_type || PyTuple_GET_SIZE(out) != 5 ||
        PyTuple_GET_ITEM(out, 3) != PyTuple_GET_ITEM(self_desc, 3)) {
      return kBail;
    }
    int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(out, 0), PyTuple_GET_ITEM(self_desc, 0), Py_EQ);
    if (same <= 0) return same < 0 ? nullptr : kBail;  // a cast or an expand on write-back: Python
    func = op.functional;
  }
  if (Py_TYPE(out) != g.out_type && op.kind == kFunctional) return multi_entry(func, key, targs, tkw, out);
  if (Py_TYPE(out) != g.out_type || PyTuple_GET_SIZE(out) != 5) return kBail;
  PyObject* shape = PyTuple_GET_ITEM(out, 0);
  PyObject* dtype = PyTuple_GET_ITEM(out, 3);
  Ref sig(intern_signature(func, targs, tkw, shape, dtype, Py_None));
  if (!sig) return nullptr;
  Ref desc(PyTuple_GetSlice(out, 0, 4));
  if (!desc) return nullptr;
  Ref step;
  if (op.kind == kView || op.kind == kAlias) {
    PyObject* step_args[] = {func, targs, tkw, shape, dtype};
    step = Ref(PyObject_Vectorcall(g.view_step, step_args, 5, nullptr));
  } else {
    Py_INCREF(Py_None);
    step = Ref(Py_None);
  }
  if (!step) return nullptr;
  Ref made(PyTuple_Pack(4, sig.get(), desc.get(), PyTuple_GET_ITEM(out, 4), step.get()));
  if (!made || PyDict_SetItem(g.fast_cache, key, made.get()) != 0) return nullptr;
  return made.get();  // the cache holds it now
}

// A new LazyTensor wrapper of metadata ``desc`` (shape, stride, offset, dtype), with ``_lz_desc`` set and no
// storage yet (record.py's wrap before its storage is given).
PyObject* new_wrapper(PyObject* desc) {
  PyObject* wrapper_args[] = {reinterpret_cast<PyObject*>(g.lazy_type), PyTuple_GET_ITEM(desc, 0),
                              PyTuple_GET_ITEM(desc, 1), PyTuple_GET_ITEM(desc, 2), Py_None,
                              PyTuple_GET_ITEM(desc, 3), g.layout, g.device};
  Ref t(PyObject_Vectorcall(g.make_wrapper, wrapper_args, 8, nullptr));
  if (!t || PyObject_SetAttr(t.get(), g.name_desc, desc) != 0) return nullptr;
  return t.release();
}

// The outputs of a multi-output functional call (record.py's emit_outputs and _tensors): one node with metas, a
// getitem node per output, a new base tensor per output, in a tuple or list as the op returns them.
PyObject* make_outputs(PyObject* func, PyObject* targs, PyObject* tkw, const Collected& c, PyObject* entry) {
  Ref inputs(tuple_of(c.ins, c.n_ins));
  Ref scalars(tuple_of(c.scalars, c.n_scalars));
  if (!inputs || !scalars) return nullptr;
  Ref node(make_node(func, targs, tkw, inputs.get(), scalars.get(), Py_None, Py_None, PyTuple_GET_ITEM(entry, 1),
                     Py_None, PyTuple_GET_ITEM(entry, 0)));
  Ref node_in(node ? PyTuple_Pack(1, node.get()) : nullptr);
  if (!node_in) return nullptr;
  PyObject* outs = PyTuple_GET_ITEM(entry, 2);
  Py_ssize_t n = PyTuple_GET_SIZE(outs);
  Ref result(PyList_New(n));
  if (!result) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PyTuple_GET_ITEM(outs, i);  // (getitem signature, desc, numel, (index,)) or None
    PyObject* t = Py_None;
    if (o == Py_None) {
      Py_INCREF(Py_None);
    } else {
      PyObject* desc = PyTuple_GET_ITEM(o, 1);
      Ref value(make_node(g.getitem_op, PyTuple_GET_ITEM(o, 3), g.empty_tuple, node_in.get(), g.empty_tuple,
                          PyTuple_GET_ITEM(desc, 0), PyTuple_GET_ITEM(desc, 3), Py_None, Py_None,
                          PyTuple_GET_ITEM(o, 0)));
      t = value ? new_base(desc, value.get(), PyTuple_GET_ITEM(o, 2)) : nullptr;
      if (t == nullptr) return nullptr;
    }
    PyList_SET_ITEM(result.get(), i, t);
  }
  return PyTuple_GET_ITEM(entry, 3) == Py_True ? result.release() : PyList_AsTuple(result.get());
}

}  // namespace

PyObject* recording::new_base(PyObject* desc, PyObject* value, PyObject* numel_obj) {
  Ref t(new_wrapper(desc));
  if (!t) return nullptr;
  long long numel = PyLong_AsLongLong(numel_obj);
  if (numel == -1 && PyErr_Occurred()) return nullptr;
  Ref st(make_storage(value, PyTuple_GET_ITEM(desc, 0), PyTuple_GET_ITEM(desc, 1), numel));
  if (!st || PyObject_SetAttr(t.get(), g.name_st, st.get()) != 0) return nullptr;
  return t.release();
}

PyObject* recording::record(PyObject* func, const FastOp& op, PyObject* args, PyObject* kwargs) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  Collected c;
  Ref targs(PyTuple_New(n));
  if (!targs) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    int kind = i < static_cast<Py_ssize_t>(op.kinds.size()) ? op.kinds[i] : kStatic;
    PyObject* item = flatten_value(PyTuple_GET_ITEM(args, i), kind, c);
    if (item == kBail || item == nullptr) return item;
    PyTuple_SET_ITEM(targs.get(), i, item);
  }
  Ref tkw;
  if (kwargs == nullptr) {
    Py_INCREF(g.empty_tuple);
    tkw = Ref(g.empty_tuple);
  } else {
    tkw = Ref(PyTuple_New(PyDict_GET_SIZE(kwargs)));
    if (!tkw) return nullptr;
    Py_ssize_t pos = 0, at = 0;
    PyObject *name, *v;
    while (PyDict_Next(kwargs, &pos, &name, &v)) {
      PyObject* k = PyDict_GetItemWithError(op.kw_kinds, name);  // borrowed
      if (k == nullptr && PyErr_Occurred()) return nullptr;
      PyObject* item = flatten_value(v, k == nullptr ? kStatic : static_cast<int>(PyLong_AsLong(k)), c);
      if (item == kBail || item == nullptr) return item;
      PyObject* pair = PyTuple_Pack(2, name, item);
      Py_DECREF(item);
      if (pair == nullptr) return nullptr;
      PyTuple_SET_ITEM(tkw.get(), at++, pair);
    }
  }
  PyObject* self = n > 0 ? PyTuple_GET_ITEM(args, 0) : nullptr;
  if (op.kind != kFunctional && (self == nullptr || Py_TYPE(self) != g.lazy_type)) return kBail;
  if ((op.kind == kView || op.kind == kAlias) && (c.n_ins != 1 || c.n_scalars != 0)) return kBail;
  // ``self`` (args[0], a lazy tensor) was the first tensor flattened: c.first_st and c.first_chain are its own.
  // In place, only a base tensor: a view's write-back scatters through its chain (Python).
  if (op.kind == kInplace && c.first_chain != Py_None) return kBail;
  Ref memo(tuple_of(c.memo, c.n_memo));
  if (!memo) return nullptr;
  Ref key(PyTuple_Pack(4, op.desc, targs.get(), tkw.get(), memo.get()));
  if (!key) return nullptr;
  PyObject* entry = cache_entry(func, op, key.get(), targs.get(), tkw.get());
  if (entry == kBail || entry == nullptr) {
    if (entry == kBail) ++g.misses;
    return entry;
  }
  ++g.hits;
  if (PyTuple_GET_SIZE(entry) == 5) return make_outputs(func, targs.get(), tkw.get(), c, entry);
  PyObject* sig = PyTuple_GET_ITEM(entry, 0);
  PyObject* desc = PyTuple_GET_ITEM(entry, 1);
  PyObject* shape = PyTuple_GET_ITEM(desc, 0);
  PyObject* dtype = PyTuple_GET_ITEM(desc, 3);

  if (op.kind == kAlias && c.first_chain == Py_None) {  // a second base of self's storage: no node, no chain
    Ref t(new_wrapper(desc));
    if (!t || PyObject_SetAttr(t.get(), g.name_st, c.first_st) != 0 || share_storage(t.get(), self) != 0) {
      return nullptr;
    }
    return t.release();
  }
  Ref inputs(tuple_of(c.ins, c.n_ins));
  Ref scalars(tuple_of(c.scalars, c.n_scalars));
  if (!inputs || !scalars) return nullptr;
  Ref node(make_node(op.kind == kInplace ? op.functional : func, targs.get(), tkw.get(), inputs.get(),
                     scalars.get(), shape, dtype, Py_None, Py_None, sig));
  if (!node) return nullptr;
  if (op.kind == kInplace) {  // views.write for a base: the storage takes the new value; its views re-derive
    auto* st = reinterpret_cast<StorageObject*>(c.first_st);
    Py_SETREF(st->value, node.release());
    ++st->version;
    Py_INCREF(self);
    return self;
  }
  if (op.kind == kFunctional) return new_base(desc, node.get(), PyTuple_GET_ITEM(entry, 2));
  Ref t(new_wrapper(desc));
  if (!t) return nullptr;
  // A view (record.py's _view_tensor): the base's storage, the base's chain plus this step, the value cached
  // for the storage's current version.
  PyObject* step = PyTuple_GET_ITEM(entry, 3);
  Ref one(PyTuple_Pack(1, step));
  Ref longer(!one ? nullptr : c.first_chain == Py_None ? (Py_INCREF(one.get()), one.get())
                                                       : PySequence_Concat(c.first_chain, one.get()));
  Ref version(longer ? PyLong_FromLongLong(reinterpret_cast<StorageObject*>(c.first_st)->version) : nullptr);
  Ref cache(version ? PyTuple_Pack(2, version.get(), node.get()) : nullptr);
  if (!cache || PyObject_SetAttr(t.get(), g.name_st, c.first_st) != 0 ||
      PyObject_SetAttr(t.get(), g.name_chain, longer.get()) != 0 ||
      PyObject_SetAttr(t.get(), g.name_cache, cache.get()) != 0 || share_storage(t.get(), self) != 0) {
    return nullptr;
  }
  return t.release();
}

bool recording::configured() {
  if (g.lazy_type != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "lazy internal error: lazy._C.configure() was not called");
  return false;
}

PyObject* torch_dispatch(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  // (cls, func, types, args=(), kwargs=None), positionally or by keyword
  PyObject* slots[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  static const char* names[5] = {"cls", "func", "types", "args", "kwargs"};
  if (nargs > 5) {
    PyErr_SetString(PyExc_TypeError, "__torch_dispatch__ takes at most 5 arguments");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
  if (kwnames != nullptr) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
      const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
      if (name == nullptr) return nullptr;
      int at = -1;
      for (int j = 0; j < 5; ++j) {
        if (strcmp(name, names[j]) == 0) at = j;
      }
      if (at < 0 || slots[at] != nullptr) {
        PyErr_Format(PyExc_TypeError, "__torch_dispatch__ got an unexpected keyword argument '%s'", name);
        return nullptr;
      }
      slots[at] = args[nargs + k];
    }
  }
  if (slots[1] == nullptr) {
    PyErr_SetString(PyExc_TypeError, "__torch_dispatch__ needs func");
    return nullptr;
  }
  if (!configured()) return nullptr;
  PyObject* func = slots[1];
  PyObject* fargs = slots[3] != nullptr ? slots[3] : g.empty_tuple;
  PyObject* fkwargs = slots[4];
  ++g.traced;
  bool plain_kwargs = fkwargs == nullptr || fkwargs == Py_None || PyDict_CheckExact(fkwargs);
  if (g.enabled && PyTuple_CheckExact(fargs) && plain_kwargs) {
    auto it = g.ops.find(func);
    if (it != g.ops.end()) {
      PyObject* kw = fkwargs == nullptr || fkwargs == Py_None || PyDict_GET_SIZE(fkwargs) == 0 ? nullptr : fkwargs;
      PyObject* result = record(func, it->second, fargs, kw);
      if (result != kBail) return result;
    }
  }
  Ref kwargs(fkwargs == nullptr || fkwargs == Py_None ? PyDict_New() : (Py_INCREF(fkwargs), fkwargs));
  if (!kwargs) return nullptr;
  PyObject* call[] = {func, fargs, kwargs.get()};
  return PyObject_Vectorcall(g.slow_dispatch, call, 3, nullptr);
}

PyObject* configure(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 14 || !PyTuple_Check(args[13])) {
    PyErr_SetString(PyExc_TypeError, "configure() takes 14 arguments (the last a tuple of types)");
    return nullptr;
  }
  for (int i = 0; i < 3; ++i) {
    if (!PyType_Check(args[i])) {
      PyErr_SetString(PyExc_TypeError, "configure(): the first three arguments are types");
      return nullptr;
    }
  }
  PyObject* markers = args[7];
  if (!PyDict_Check(markers) || !PyDict_Check(args[8])) {
    PyErr_SetString(PyExc_TypeError, "configure(): the scalar markers and the memo are dicts");
    return nullptr;
  }
  PyObject* fm = PyDict_GetItem(markers, reinterpret_cast<PyObject*>(&PyFloat_Type));
  PyObject* im = PyDict_GetItem(markers, reinterpret_cast<PyObject*>(&PyLong_Type));
  PyObject* bm = PyDict_GetItem(markers, reinterpret_cast<PyObject*>(&PyBool_Type));
  if (fm == nullptr || im == nullptr || bm == nullptr) {
    PyErr_SetString(PyExc_TypeError, "configure(): scalar markers for float, int and bool are needed");
    return nullptr;
  }
  PyObject* objs[] = {args[0], args[1], args[2], args[3], args[4], args[5], args[6], fm,
                      im,      bm,      args[8], args[9], args[10], args[11], args[12], args[13]};
  for (PyObject* o : objs) Py_INCREF(o);  // held for the life of the process
  g.lazy_type = reinterpret_cast<PyTypeObject*>(args[0]);
  g.out_type = reinterpret_cast<PyTypeObject*>(args[1]);
  g.dtype_type = reinterpret_cast<PyTypeObject*>(args[2]);
  g.make_wrapper = args[3];
  g.device = args[4];
  g.layout = args[5];
  g.tensor_marker = args[6];
  g.float_marker = fm;
  g.int_marker = im;
  g.bool_marker = bm;
  g.memo = args[8];
  g.slow_dispatch = args[9];
  g.view_value = args[10];
  g.view_step = args[11];
  g.getitem_op = args[12];
  g.static_types = args[13];
  if (g.fast_cache == nullptr) {
    g.fast_cache = PyDict_New();
    g.empty_tuple = PyTuple_New(0);
    g.name_st = PyUnicode_InternFromString("_lz_st");
    g.name_chain = PyUnicode_InternFromString("_lz_chain");
    g.name_desc = PyUnicode_InternFromString("_lz_desc");
    g.name_cache = PyUnicode_InternFromString("_lz_cache");
    if (!g.fast_cache || !g.empty_tuple || !g.name_st || !g.name_chain || !g.name_desc || !g.name_cache) {
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

PyObject* register_op(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3]) || !PyLong_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "register_op(func, desc, kinds: tuple, kw_kinds: dict, kind: int, functional_variant)");
    return nullptr;
  }
  if (g.ops.count(args[0]) != 0) Py_RETURN_NONE;
  FastOp op;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[2]); ++i) {
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(args[2], i));
    if (kind == -1 && PyErr_Occurred()) return nullptr;
    op.kinds.push_back(static_cast<int>(kind));
  }
  op.kind = static_cast<int>(PyLong_AsLong(args[4]));
  if (op.kind < kFunctional || op.kind > kAlias || (op.kind == kInplace && args[5] == Py_None)) {
    PyErr_SetString(PyExc_ValueError,
                    "register_op: kind is 0 (functional), 1 (view), 2 (in-place, with variant) or 3 (alias view)");
    return nullptr;
  }
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  Py_INCREF(args[3]);
  Py_INCREF(args[5]);
  op.desc = args[1];
  op.kw_kinds = args[3];
  op.functional = args[5];
  g.ops.emplace(args[0], std::move(op));
  Py_RETURN_NONE;
}

PyObject* clear_fast_cache(PyObject*, PyObject*) {
  if (g.fast_cache != nullptr) PyDict_Clear(g.fast_cache);
  Py_RETURN_NONE;
}

PyObject* set_fast_path(PyObject*, PyObject* enabled) {
  int on = PyObject_IsTrue(enabled);
  if (on < 0) return nullptr;
  g.enabled = on != 0;
  Py_RETURN_NONE;
}

PyObject* traced_ops(PyObject*, PyObject*) { return PyLong_FromLongLong(g.traced); }

PyObject* bump_traced_ops(PyObject*, PyObject*) {
  ++g.traced;
  Py_RETURN_NONE;
}

PyObject* reset_counters(PyObject*, PyObject*) {
  g.traced = g.hits = g.misses = g.reused_grads = 0;
  Py_RETURN_NONE;
}

PyObject* fast_path_stats(PyObject*, PyObject*) { return Py_BuildValue("(LL)", g.hits, g.misses); }

PyObject* reused_grads(PyObject*, PyObject*) { return PyLong_FromLongLong(g.reused_grads); }

}  // namespace lazy
