// How guard programs read what their guards test (guard_reads.h): module attributes and dict items memoized by the
// dicts' version tags, method bindings, gradients and tensor signatures read where Python would give the same answer.
#include "guard_reads.h"

#include "alias.h"
#include "ir.h"

#include <cstdint>
#include <vector>

namespace lazy {

// Note [Prefetching what the last run read]
// A guard program reads a thousand and more objects scattered over the heap (modules, their dicts and those dicts'
// tables, parameters, optimizer state), one load depending on the one before. Between two calls of a training step
// the caches are refilled with other data (the step itself, the GPU driver), so the next check misses on most of
// them one after the other. So each run records the addresses it read (the objects it loaded, every dict's table
// and values, a module's attribute dicts, a tensor's instance dict), and the next run first issues a prefetch for
// each (and for the instructions' constants), so that the memory system fetches them in parallel before the loads
// wait on them one by one. The addresses are only prefetched, never read: an object freed since (a step's old
// gradients) costs a useless prefetch, never a wrong answer, and the program holds no reference that would keep
// anything alive. Measured on a 6-layer GPT step's 1,716 guards (benchmarks/capture_overhead.py, section 5, five
// runs): after a 64 MB sweep 0.24-0.49 ms without the prefetch, 0.23-0.30 ms with it (5-40 % less, the more the
// colder the check); with warm caches the recording costs 0.13 -> 0.15 ms. A replay's load program (Note [Replay
// loads in C]) runs right after its entry's guard program, which has just read the same objects: it neither
// prefetches nor records.
//
// Note [The record of a run's reads]
// The running program's record is a plain global, not a thread_local (whose every access from a shared library is a
// call of __tls_get_addr: ~8 % of a warm check): programs run under the GIL. A run points it at its own record
// before each instruction and clears it when it ends; an instruction that calls Python may let another thread's run
// (or a nested one) repoint or clear it meanwhile, which only moves a few prefetch hints. The pointer never outlives
// the record it names: only a run sets it to its record, and only while that run is alive; the run clears it at its
// end.
std::vector<const void*>* g_touched = nullptr;

// Records where the instance attributes of ``o`` live (it never makes a dict). Modules and tensors are instances of
// Python classes with managed dicts: the dict, or an array of values, hangs off the two slots before the object
// (CPython 3.11: dict at -3, values at -4; 3.12: one tagged slot at -3, its low bit set for values). The slots are
// read while ``o`` is alive (the run holds it), only to learn what to prefetch.
void touch_instance_dict(PyObject* o) {
  if (g_touched == nullptr) return;
  PyTypeObject* tp = Py_TYPE(o);
  uintptr_t slot = 0;
  if (tp->tp_flags & Py_TPFLAGS_MANAGED_DICT) {
#if PY_VERSION_HEX >= 0x030D0000
    return;  // another layout (inline values): the objects themselves are still prefetched
#endif
    const uintptr_t* pre = reinterpret_cast<const uintptr_t*>(o);
    slot = pre[-3];
#if PY_VERSION_HEX >= 0x030C0000
    if (slot & 1) {  // values, not a dict
      g_touched->push_back(reinterpret_cast<const void*>(slot & ~static_cast<uintptr_t>(1)));
      return;
    }
#else
    if (pre[-4] != 0) g_touched->push_back(reinterpret_cast<const void*>(pre[-4]));
#endif
  } else if (tp->tp_dictoffset > 0) {
    slot = *reinterpret_cast<const uintptr_t*>(reinterpret_cast<const char*>(o) + tp->tp_dictoffset);
  }
  PyObject* d = reinterpret_cast<PyObject*>(slot);
  if (d != nullptr && PyDict_Check(d)) touch_dict(d);
}

namespace {

// Note [Loads memoized by dict versions]
// Most of a training step's guard loads read the same module tree every call: ``model.blocks[3].attn.weight``,
// ``opt.state[p]["exp_avg"]``. CPython gives every dict a version tag, a global counter's next value, stamped anew
// at the dict's creation and at every change of its contents; two tags are equal only for one dict in one state (a
// dict freed and another made at its address gets a new tag). Each load remembers the dicts it looked in with their
// tags and what it found; the next run, seeing the same dicts at the same tags, reuses the value without hashing
// (the value is alive: the unchanged dict still holds it). A module attribute's lookup also depends on the class (a
// property or a __getattr__ of that name would win): it is remembered with the type's version tag, which CPython
// resets when the class or a base changes. A lazy tensor's signature test remembers the tensor's instance dict in
// the same way (its _lz_desc, _lz_chain and _lz_st are then the same objects) and still reads what lives outside
// any dict: requires_grad from the TensorImpl and the storage's numel. An item is remembered with its key (held,
// compared by identity), so ``opt.state[p]`` skips even the key's hash (a Python __hash__ for tensors: 152 calls a
// GPT step); a dict subclass that keeps dict's __getitem__ (the optimizer's defaultdict) is read as a dict.
// Anything else (another mapping, a lookup that fell back to Python) is looked up as before. CPython
// 3.11 and 3.12 only (ma_version_tag is gone in 3.14). A 6-layer GPT step's 1,716 guards (benchmarks/
// capture_overhead.py, section 5, an AMD EPYC core, prefetch off): 61 -> 39 us warm, 149 -> 83 us after a 64 MB
// sweep.
#if PY_VERSION_HEX < 0x030D0000
constexpr bool kVersionTags = true;
inline uint64_t dict_version(PyObject* d) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(d)->ma_version_tag;
#pragma GCC diagnostic pop
}
#else
constexpr bool kVersionTags = false;
inline uint64_t dict_version(PyObject*) { return 0; }
#endif

bool g_memos = true;  // set_load_memos

// The type's version tag, 0 where it has none (no memo then).
inline unsigned int type_tag(PyTypeObject* tp) {
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
  if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
#endif
  return tp->tp_version_tag;
}

// Whether the dicts ``m`` recorded are unchanged, given ``first``, the live first dict.
inline bool dicts_unchanged(const LoadMemo& m, PyObject* first) {
  if (first != m.dicts[0] || dict_version(first) != m.versions[0]) return false;
  for (int i = 1; i < m.ndicts; ++i) {  // held by the unchanged first dict
    if (dict_version(m.dicts[i]) != m.versions[i]) return false;
  }
  return true;
}

PyObject* s_lz_desc = nullptr;
PyObject* s_lz_chain = nullptr;
PyObject* s_lz_st = nullptr;
PyObject* s_numel = nullptr;
PyObject* s_dtype = nullptr;
PyObject* s_getattr = nullptr;
PyObject* s_getattribute = nullptr;
PyObject* s_module_dicts[3] = {nullptr, nullptr, nullptr};  // "_parameters", "_buffers", "_modules"
PyObject* s_module_getattr = nullptr;     // torch.nn.Module.__getattr__ (strong; set by the first program)
PyObject* s_object_getattribute = nullptr;  // object.__getattribute__ (strong)
PyObject* s_module_getattribute = nullptr;  // types.ModuleType.__getattribute__ (strong)
PyObject* s_func = nullptr;  // "__func__"
PyObject* s_grad = nullptr;  // "grad"
PyObject* s_torch_function = nullptr;  // "__torch_function__"

}  // namespace

// Note [Module attributes in guard programs]
// Most loads of a training step's guards are submodules and parameters: ``model.blocks``, ``block.attn.weight``.
// Python finds them through Module.__getattr__, a Python function called after the instance dict misses: about
// 0.4 us a load, most of a GPT step's guard time. ``attr_load`` follows Python's generic lookup itself where the
// class's ``__getattribute__`` is object's (or the module type's, which does the generic lookup first): a data
// descriptor of that name on the class wins (it is called, through PyObject_GetAttr), then the instance dict, then
// the class attribute (a method or other non-data descriptor is called through PyObject_GetAttr; a plain value,
// such as Module's ``_compiled_call_impl = None``, is the answer). Where all of these miss and the class's
// ``__getattr__`` is Module's own, it reads the dicts Module.__getattr__ reads, in its order (_parameters,
// _buffers, _modules). Any other object, or a name found nowhere (an AttributeError to raise), takes
// PyObject_GetAttr. The answer is Python's, only sooner; what a plain answer was read from is remembered (Note
// [Loads memoized by dict versions]).
PyObject* attr_load(PyObject* x, PyObject* name, LoadMemo* memo) {
  PyTypeObject* tp = Py_TYPE(x);
  // a memo is recorded only for a lookup this function made itself, for this type at this version tag
  const bool same_type = g_memos && memo != nullptr && memo->ndicts > 0 && memo->type == tp && memo->tag != 0 &&
                         type_tag(tp) == memo->tag;
  PyObject* getattribute = same_type ? nullptr : _PyType_Lookup(tp, s_getattribute);
  if (!same_type && getattribute != s_object_getattribute && getattribute != s_module_getattribute) {
    return PyObject_GetAttr(x, name);
  }
  PyObject* descr = same_type ? nullptr : _PyType_Lookup(tp, name);  // borrowed
  if (descr != nullptr && Py_TYPE(descr)->tp_descr_set != nullptr) return PyObject_GetAttr(x, name);  // data
  PyObject* dict = PyObject_GenericGetDict(x, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();
    return PyObject_GetAttr(x, name);
  }
  touch(dict);
  if (same_type && dicts_unchanged(*memo, dict)) {  // Note [Loads memoized by dict versions]
    for (int i = 1; i < memo->ndicts; ++i) touch(memo->dicts[i]);
    Py_DECREF(dict);
    return Py_NewRef(memo->value);
  }
  if (same_type) {  // the dicts changed: the type's lookups again (a memo is only made where they pass)
    Py_DECREF(dict);
    memo->ndicts = 0;
    return attr_load(x, name, memo);
  }
  LoadMemo fresh;
  fresh.type = tp;
  fresh.dicts[0] = dict;
  fresh.versions[0] = dict_version(dict);
  fresh.ndicts = 1;
  bool memoizable = kVersionTags && g_memos && memo != nullptr;
  PyObject* v = PyDict_GetItemWithError(dict, name);
  if (v == nullptr && !PyErr_Occurred() && descr != nullptr) {
    if (Py_TYPE(descr)->tp_descr_get != nullptr) {  // a method: bound anew at every call
      Py_DECREF(dict);
      return PyObject_GetAttr(x, name);
    }
    v = descr;  // a plain class attribute, held by the class
  }
  if (v == nullptr && !PyErr_Occurred()) {
    if (s_module_getattr == nullptr || _PyType_Lookup(tp, s_getattr) != s_module_getattr) {
      Py_DECREF(dict);
      return PyObject_GetAttr(x, name);  // another __getattr__, or an AttributeError to raise
    }
    for (int i = 0; v == nullptr && !PyErr_Occurred() && i < 3; ++i) {
      PyObject* d = PyDict_GetItemWithError(dict, s_module_dicts[i]);
      if (d != nullptr && PyDict_CheckExact(d)) {
        touch(d);
        fresh.dicts[fresh.ndicts] = d;
        fresh.versions[fresh.ndicts++] = dict_version(d);
        v = PyDict_GetItemWithError(d, name);
      } else {
        memoizable = false;  // a module without that dict: looked up as before
      }
    }
  }
  fresh.tag = type_tag(tp);  // after the lookups, which give the type a tag if it has none
  if (v != nullptr && memoizable && fresh.tag != 0) {
    fresh.value = v;
    fresh.key = memo->key;  // (unused by attributes; kept with its reference)
    *memo = fresh;
  }
  Py_XINCREF(v);
  Py_DECREF(dict);
  if (v != nullptr || PyErr_Occurred()) return v;
  return PyObject_GetAttr(x, name);
}

// Note [Method guards]
// The capture guards a method it calls by the function it binds: getattr(getattr(m, name), "__func__") is F (each
// module's forward and _call_impl: 134 of a 6-layer GPT step's guards). Evaluated as written, each makes a bound
// method object and drops it. Where the answer needs none it is read directly: the class's __getattribute__ is
// object's and its attribute of that name a plain function (a non-data descriptor, so an instance attribute of
// that name would win: the instance dict must have none); the bound method's __func__ is then that function. Any
// other case takes the two getattr calls; both give Python's answer.
int method_is(PyObject* x, PyObject* name, PyObject* fn) {
  PyTypeObject* tp = Py_TYPE(x);
  PyObject* descr = _PyType_Lookup(tp, name);  // borrowed
  if (descr != nullptr && PyFunction_Check(descr) && _PyType_Lookup(tp, s_getattribute) == s_object_getattribute) {
    PyObject* dict = PyObject_GenericGetDict(x, nullptr);
    if (dict != nullptr) {
      int shadowed = PyDict_Contains(dict, name);
      Py_DECREF(dict);
      if (shadowed < 0) return -1;
      if (shadowed == 0) return descr == fn;
    } else {
      PyErr_Clear();  // no instance dict: the generic path decides
    }
  }
  PyObject* bound = PyObject_GetAttr(x, name);
  if (bound == nullptr) return -1;
  PyObject* func = PyObject_GetAttr(bound, s_func);
  Py_DECREF(bound);
  if (func == nullptr) return -1;
  int same = func == fn;
  Py_DECREF(func);
  return same;
}

// Note [Gradients in guard programs]
// A training step's guards test every parameter's ``.grad`` for None (76 of a 6-layer GPT step's). Through Python's
// attribute machinery that costs ~0.4 us on a lazy tensor, most of it torch's test for __torch_function__ before the
// getter runs. Where nothing can intercept the read, the answer is read from the TensorImpl instead: the object's
// type finds ``grad`` as TensorBase's own descriptor (no subclass overrides it; the object is then a tensor) and its
// ``__torch_function__`` is torch's disabled one (what lazy tensors and Parameters have), and no TorchFunctionMode is
// active: then torch's getter returns the TensorImpl's gradient, None exactly when it is undefined. Any other case
// reads the attribute as Python does.
int grad_is_none(PyObject* x, PyObject* disabled_tf, PyObject* grad_descr) {
  PyTypeObject* tp = Py_TYPE(x);
  if (_PyType_Lookup(tp, s_grad) == grad_descr && PyObject_TypeCheck(x, PyDescr_TYPE(grad_descr)) &&
      _PyType_Lookup(tp, s_torch_function) == disabled_tf && !torch_function_mode_active()) {
    int defined = tensor_grad_defined(x);
    return defined < 0 ? -1 : !defined;
  }
  PyObject* grad = PyObject_GetAttr(x, s_grad);
  if (grad == nullptr) return -1;
  int none = grad == Py_None;
  Py_DECREF(grad);
  return none;
}

// 1 if equal, 0 if not, -1 on an error (Python's ``==`` then ``bool``, no identity shortcut: nan != nan).
int equal(PyObject* x, PyObject* y) {
  PyObject* r = PyObject_RichCompare(x, y, Py_EQ);
  if (r == nullptr) return -1;
  int truth = PyObject_IsTrue(r);
  Py_DECREF(r);
  return truth;
}

// Note [Key guards in C]
// A guard on a dict's keys (a ModuleList's ``_modules``, an optimizer's hook dicts: 11 in a 6-layer GPT step) holds
// where ``tuple(d.keys())`` has the expected keys in order, each the same object or of the same type, equal and not
// a tensor (replay.py's _keys_same, which the Python check calls). keys_are does exactly that in C: PyMapping_Keys is
// ``list(d.keys())`` (dict's own keys for an exact dict, the ``keys`` method of anything else, an OrderedDict's
// order included), taken whole before any comparison as the tuple is, then the same comparison in the same order:
// identity, exact type, ``==`` and its truth, isinstance of torch.Tensor. What raises makes it false, as the Python
// check's except does.
int keys_are(PyObject* d, PyObject* expected, PyObject* tensor_type) {
  PyObject* keys = PyMapping_Keys(d);
  if (keys == nullptr) return -1;
  const Py_ssize_t n = PyList_GET_SIZE(keys);
  int same = n == PyTuple_GET_SIZE(expected) ? 1 : 0;
  for (Py_ssize_t i = 0; same == 1 && i < n; ++i) {
    PyObject* a = PyList_GET_ITEM(keys, i);
    PyObject* b = PyTuple_GET_ITEM(expected, i);
    if (a == b) continue;
    if (Py_TYPE(a) != Py_TYPE(b)) {
      same = 0;
      break;
    }
    same = equal(a, b);
    if (same == 1) {
      const int tensor = PyObject_IsInstance(a, tensor_type);
      same = tensor < 0 ? -1 : !tensor;
    }
  }
  Py_DECREF(keys);
  return same;
}

// hasattr(x, name): 1, 0, or -1 on an error other than AttributeError.
int has_attr(PyObject* x, PyObject* name) {
  PyObject* v = PyObject_GetAttr(x, name);
  if (v != nullptr) {
    Py_DECREF(v);
    return 1;
  }
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  return 0;
}

namespace {

// An attribute compared with an expected value; 1 if equal.
int attr_equal(PyObject* x, PyObject* name, PyObject* expected) {
  PyObject* v = PyObject_GetAttr(x, name);
  if (v == nullptr) return -1;
  touch(v);
  int r = v == expected ? 1 : equal(v, expected);
  Py_DECREF(v);
  return r;
}

// The storage's numel (a C Storage's field, else its attribute) equals ``expected``: 1, 0, or -1.
int numel_matches(PyObject* st, PyObject* expected) {
  if (Py_TYPE(st) == &StorageType) {  // the C Storage (csrc/ir.cpp): its numel is a field
    long long numel = PyLong_Check(expected) ? PyLong_AsLongLong(expected) : -1;
    return numel == reinterpret_cast<StorageObject*>(st)->numel && !PyErr_Occurred();
  }
  return attr_equal(st, s_numel, expected);
}

// Whether the generic lookup reads _lz_desc, _lz_chain and _lz_st of a ``tp`` instance from its instance dict or as
// plain class values (no descriptor of those names): then they change only with that dict or the class.
bool plain_lazy_attrs(PyTypeObject* tp) {
  if (tp->tp_getattro != PyObject_GenericGetAttr) return false;
  for (PyObject* name : {s_lz_desc, s_lz_chain, s_lz_st}) {
    PyObject* d = _PyType_Lookup(tp, name);
    if (d != nullptr && Py_TYPE(d)->tp_descr_get != nullptr) return false;
  }
  return true;
}

// The tensor's requires_grad (from its TensorImpl) is the signature's: 1, 0, or -1.
int requires_grad_matches(PyObject* t, PyObject* expected) {
  int requires_grad = tensor_requires_grad(t);
  if (requires_grad < 0) return -1;
  return (requires_grad ? Py_True : Py_False) == PyTuple_GET_ITEM(expected, 2);
}

// ("lazy", desc, requires_grad, chained, numel) == expected, read field by field without building the tuple.
int read_lazy_signature(PyObject* t, PyObject* expected, PyObject** storage) {
  if (attr_equal(t, s_lz_desc, PyTuple_GET_ITEM(expected, 1)) != 1) return 0;
  int grad = requires_grad_matches(t, expected);
  if (grad != 1) return grad;
  PyObject* chain = PyObject_GetAttr(t, s_lz_chain);
  if (chain == nullptr) return -1;
  bool chained = chain != Py_None;
  Py_DECREF(chain);
  if (chained != (PyTuple_GET_ITEM(expected, 3) == Py_True)) return 0;
  PyObject* st = PyObject_GetAttr(t, s_lz_st);
  if (st == nullptr) return -1;
  touch(st);
  int r = numel_matches(st, PyTuple_GET_ITEM(expected, 4));
  *storage = st;  // borrowed: t holds it
  Py_DECREF(st);
  return r;
}

}  // namespace

int lazy_tensor_matches(PyObject* t, PyObject* expected, PyTypeObject* lazy_type, TensorMemo* memo) {
  if (!PyObject_TypeCheck(t, lazy_type) || !PyTuple_CheckExact(expected) || PyTuple_GET_SIZE(expected) != 5) return 0;
  PyTypeObject* tp = Py_TYPE(t);
  PyObject* dict = nullptr;
  if (kVersionTags && g_memos && memo != nullptr) {
    dict = PyObject_GenericGetDict(t, nullptr);
    if (dict == nullptr) PyErr_Clear();  // no instance dict: read as before
  }
  if (dict != nullptr && dict == memo->dict && memo->type == tp && memo->tag != 0 && type_tag(tp) == memo->tag &&
      dict_version(dict) == memo->version) {
    // Note [Loads memoized by dict versions]: desc and chain are last run's, which matched
    touch(dict);
    touch(memo->storage);
    Py_DECREF(dict);
    int grad = requires_grad_matches(t, expected);
    return grad != 1 ? grad : numel_matches(memo->storage, PyTuple_GET_ITEM(expected, 4));
  }
  const uint64_t version = dict != nullptr ? dict_version(dict) : 0;
  PyObject* st = nullptr;
  int r = read_lazy_signature(t, expected, &st);
  if (r == 1 && dict != nullptr && Py_TYPE(st) == &StorageType && plain_lazy_attrs(tp) && type_tag(tp) != 0) {
    memo->type = tp;
    memo->tag = type_tag(tp);
    memo->dict = dict;
    memo->version = version;
    memo->storage = st;
  }
  Py_XDECREF(dict);
  return r;
}

// ("host", shape, stride, offset, dtype, device, requires_grad) == expected for a tensor that is not lazy.
int host_tensor(PyObject* t, PyObject* how, PyObject* e, PyTypeObject* lazy_type) {
  if (PyObject_TypeCheck(t, lazy_type)) return 0;  // its signature is a "lazy" one
  PyObject* dtype = PyObject_GetAttr(t, s_dtype);
  if (dtype == nullptr) {
    PyErr_Clear();
  } else {
    bool same_dtype = dtype == PyTuple_GET_ITEM(e, 4);  // torch.dtype objects are singletons
    Py_DECREF(dtype);
    const char* device = PyUnicode_AsUTF8(PyTuple_GET_ITEM(how, 0));
    if (device == nullptr) return -1;
    int r = host_tensor_matches(t, PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2),
                                PyLong_AsLongLong(PyTuple_GET_ITEM(e, 3)), device,
                                PyLong_AsLongLong(PyTuple_GET_ITEM(how, 1)), PyTuple_GET_ITEM(e, 6) == Py_True);
    if (PyErr_Occurred()) return -1;
    if (r >= 0) return same_dtype && r == 1;
  }
  PyObject* sig = PyObject_CallOneArg(PyTuple_GET_ITEM(how, 2), t);  // what the TensorImpl cannot tell
  if (sig == nullptr) return -1;
  int eq = equal(sig, e);
  Py_DECREF(sig);
  return eq;
}

int dict_item(PyObject* x, PyObject* key, PyObject** out, LoadMemo* memo) {
  // what x[key] does for a dict, or a subclass that keeps dict's __getitem__ (an optimizer's state, a
  // defaultdict), where the key is there; a missing key (__missing__) takes the method call
  if (PyDict_CheckExact(x) ||
      (PyDict_Check(x) && Py_TYPE(x)->tp_as_mapping->mp_subscript == PyDict_Type.tp_as_mapping->mp_subscript)) {
    const uint64_t version = dict_version(x);
    if (g_memos && memo != nullptr && memo->ndicts == 1 && memo->key == key && memo->dicts[0] == x &&
        memo->versions[0] == version) {  // Note [Loads memoized by dict versions]
      *out = Py_NewRef(memo->value);
      return 1;
    }
    PyObject* v = PyDict_GetItemWithError(x, key);
    if (v == nullptr) {
      if (PyErr_Occurred() || PyDict_CheckExact(x)) return -1;
      *out = PyObject_GetItem(x, key);  // __missing__
      return *out != nullptr ? 1 : -1;
    }
    if (kVersionTags && g_memos && memo != nullptr) {  // the key is held (compared by identity next time)
      Py_INCREF(key);
      Py_XSETREF(memo->key, key);
      memo->type = nullptr;
      memo->ndicts = 1;
      memo->dicts[0] = x;
      memo->versions[0] = version;
      memo->value = v;
    }
    *out = Py_NewRef(v);
    return 1;
  }
  *out = PyObject_GetItem(x, key);
  return *out != nullptr ? 1 : -1;
}

bool init_guard_reads() {
  s_lz_desc = PyUnicode_InternFromString("_lz_desc");
  s_lz_chain = PyUnicode_InternFromString("_lz_chain");
  s_lz_st = PyUnicode_InternFromString("_lz_st");
  s_numel = PyUnicode_InternFromString("numel");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_getattr = PyUnicode_InternFromString("__getattr__");
  s_getattribute = PyUnicode_InternFromString("__getattribute__");
  s_module_dicts[0] = PyUnicode_InternFromString("_parameters");
  s_module_dicts[1] = PyUnicode_InternFromString("_buffers");
  s_module_dicts[2] = PyUnicode_InternFromString("_modules");
  s_func = PyUnicode_InternFromString("__func__");
  s_grad = PyUnicode_InternFromString("grad");
  s_torch_function = PyUnicode_InternFromString("__torch_function__");
  s_object_getattribute = s_getattribute ? _PyType_Lookup(&PyBaseObject_Type, s_getattribute) : nullptr;
  Py_XINCREF(s_object_getattribute);
  s_module_getattribute = s_getattribute ? _PyType_Lookup(&PyModule_Type, s_getattribute) : nullptr;
  Py_XINCREF(s_module_getattribute);
  return s_module_getattribute && s_lz_desc && s_lz_chain && s_lz_st && s_numel && s_dtype && s_getattr && s_func &&
         s_grad && s_torch_function && s_object_getattribute && s_module_dicts[0] && s_module_dicts[1] &&
         s_module_dicts[2];
}

void set_module_type(PyTypeObject* module_type) {
  if (s_module_getattr == nullptr) {  // Note [Module attributes in guard programs]
    s_module_getattr = _PyType_Lookup(module_type, s_getattr);
    Py_XINCREF(s_module_getattr);
  }
}

void set_load_memos(bool enabled) { g_memos = enabled; }

}  // namespace lazy
