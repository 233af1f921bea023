// The guards of a lazy.compile entry as a small register program, evaluated in C (lazy/capture/guards.py builds it).
//
// Note [Guard programs]
// An entry's guards (Note [Guards] in lazy/capture/session.py) are checks on values read from the call's bound
// arguments: A[i], its attributes and items, objects the capture holds. The Python check (lazy/capture/replay.py)
// renders them as one generated expression; a GuardProgram is the same check as a list of instructions over
// registers: loads (an argument, a constant, an attribute, an item) and tests (identity, exact type, equality with
// the expected value's exact type, truth, None-ness, length, absence of a key or an attribute, a lazy tensor's
// signature, a call of a Python helper compared with its expected result, the global state: grad and inference mode
// read from c10, the rest through the readers replay.global_state calls). A program answers what the Python check
// answers: the conjunction of every test, where a load or test that raises counts as false (the Python check's
// ``except Exception: return False``); its tests have no side effects beyond those of the loads the Python check also
// makes, so the order does not change the answer. Each load happens once per call, into its register, as the Python
// check's shared temporaries do. A guard whose expression the program cannot load (arithmetic, calls) stays in a
// residual Python check that runs after the program (guards.py). Failure reasons still come from the Python renderer
// (Entry.failures), which reports each guard on its own.
#include "capture_guards.h"

#include "alias.h"
#include "ir.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lazy {

namespace {

// The instruction set; lazy/capture/guards.py's OPS lists the same names in the same order.
enum Op : int {
  kArg,         // r[dst] = A[n]
  kConst,       // r[dst] = a
  kAttr,        // r[dst] = getattr(r[src], a)
  kItem,        // r[dst] = r[src][a]
  kIs,          // r[src] is a
  kTypeIs,      // type(r[src]) is a
  kEq,          // type(r[src]) is b and r[src] == a
  kTruth,       // bool(r[src]) is bool(n)
  kIsNone,      // (r[src] is None) is bool(n)
  kLen,         // len(r[src]) == n
  kAbsent,      // a not in r[src]
  kHasAttr,     // hasattr(r[src], a) is bool(n) (an exception other than AttributeError: false)
  kCallEq,      // a(r[src]) == b; a() == b when src < 0
  kCallTrue,    // a(r[src], b) is True
  kLazyTensor,  // r[src] is a lazy tensor whose signature (policy.tensor_signature) equals b
  kState,       // replay.global_state() == b: grad and inference mode from c10, b[2:] == tuple(f() for f in a)
  kItemReg,     // r[dst] = r[src][r[n]] (a key the program loaded: optimizer.state[param])
  kHostTensor,  // r[src] is not a lazy tensor and policy.tensor_signature(r[src]) == b ("host"); a is (device type,
                // device index or -1, tensor_signature): the TensorImpl is read where it can be, else a's call
  kBinary,      // r[dst] = r[src] <a> r[n], a an operator of Binary (Note [Arithmetic in guard programs])
  kCall,        // r[dst] = a(r[src]) (a function the capture called: len)
  kIsReg,       // r[src] is r[n] (one object reached along two paths: Note [Objects reached twice] in policy.py)
  kMethodIs,    // getattr(getattr(r[src], a), "__func__") is b (Note [Method guards])
  kGradIsNone,  // (r[src].grad is None) is bool(n); a, b: torch's disabled __torch_function__ and TensorBase.grad
                // (Note [Gradients in guard programs])
  kNumOps,
};

// Note [Arithmetic in guard programs]
// A guard on a value computed from loads (``384 // block.heads`` where the capture split heads, ``drop.p < 0.0``
// where F.dropout checked its argument) used to be checked by the entry's Python renderer after the program: a
// hundred such guards were a sixth of a 6-layer GPT step's guard time. kBinary computes Python's binary operators
// through the C API (the same number protocol, rich comparison and membership test ``a < b`` and ``a in b`` run),
// and kCall a function of one loaded value (``len(opt.state[p]) == 0``), so these guards stay in the program; one
// raising makes the guard fail, as the Python check's except does.
enum Binary : int { kAdd, kSub, kMul, kTrueDiv, kFloorDiv, kMod, kLt, kLe, kGt, kGe, kEqOp, kNe, kIn, kNotIn,
                    kNumBinary };

struct Ins {
  int op;
  int dst;
  int src;
  int sub;  // kBinary: the operator (a, as an int)
  long long n;
  PyObject* a;  // strong references, owned by the program
  PyObject* b;
};

struct GuardProgram {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  std::vector<Ins>* code;
  int nregs;
  PyTypeObject* lazy_type;  // strong reference
  std::vector<int>* outputs;  // a load program's registers to return (Note [Replay loads in C]); null for guards
  std::vector<const void*>* warm;  // Note [Prefetching what the last run read]: addresses, never dereferenced
  std::vector<const void*>* consts;  // the instructions' constants and their items: prefetched at every run
};

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
thread_local std::vector<const void*>* t_touched = nullptr;  // the running program's record (null: none)
bool g_prefetch = true;  // set_guard_prefetch

inline void touch_dict(PyObject* d) {
  auto* dict = reinterpret_cast<PyDictObject*>(d);
  t_touched->push_back(d);
  t_touched->push_back(dict->ma_keys);
  if (dict->ma_values != nullptr) t_touched->push_back(dict->ma_values);
}

// Records ``o`` (and, for a dict, its tables) for the next run's prefetch.
inline void touch(PyObject* o) {
  if (t_touched == nullptr || o == nullptr) return;
  if (PyDict_Check(o)) {
    touch_dict(o);
  } else {
    t_touched->push_back(o);
  }
}

// Records where the instance attributes of ``o`` live (it never makes a dict). Modules and tensors are instances of
// Python classes with managed dicts: the dict, or an array of values, hangs off the two slots before the object
// (CPython 3.11: dict at -3, values at -4; 3.12: one tagged slot at -3, its low bit set for values). The slots are
// read while ``o`` is alive (the run holds it), only to learn what to prefetch.
inline void touch_instance_dict(PyObject* o) {
  if (t_touched == nullptr) return;
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
      t_touched->push_back(reinterpret_cast<const void*>(slot & ~static_cast<uintptr_t>(1)));
      return;
    }
#else
    if (pre[-4] != 0) t_touched->push_back(reinterpret_cast<const void*>(pre[-4]));
#endif
  } else if (tp->tp_dictoffset > 0) {
    slot = *reinterpret_cast<const uintptr_t*>(reinterpret_cast<const char*>(o) + tp->tp_dictoffset);
  }
  PyObject* d = reinterpret_cast<PyObject*>(slot);
  if (d != nullptr && PyDict_Check(d)) touch_dict(d);
}

void prefetch(const std::vector<const void*>& addresses) {
  for (const void* p : addresses) {
    __builtin_prefetch(p);
    __builtin_prefetch(static_cast<const char*>(p) + 64);
  }
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
PyObject* s_func = nullptr;  // "__func__"
PyObject* s_grad = nullptr;  // "grad"
PyObject* s_torch_function = nullptr;  // "__torch_function__"

// Note [Module attributes in guard programs]
// Most loads of a training step's guards are submodules and parameters: ``model.blocks``, ``block.attn.weight``.
// Python finds them through Module.__getattr__, a Python function called after the instance dict misses: about
// 0.4 us a load, most of a GPT step's guard time. ``module_attr`` reads the same dicts Module.__getattr__ reads,
// in its order (_parameters, _buffers, _modules), after the two steps of the generic lookup that come first: a
// class attribute or descriptor of that name (then it takes the generic path, which may run a property), and the
// instance dict. It does so only for a class whose ``__getattr__`` is Module's own and whose ``__getattribute__``
// is object's, checked on every load through the type's attribute cache; any other object, or a name found in
// none of the dicts (an AttributeError to raise), takes PyObject_GetAttr. The answer is Python's, only sooner.
PyObject* module_attr(PyObject* x, PyObject* name) {
  PyTypeObject* tp = Py_TYPE(x);
  if (s_module_getattr == nullptr || _PyType_Lookup(tp, s_getattr) != s_module_getattr ||
      _PyType_Lookup(tp, s_getattribute) != s_object_getattribute || _PyType_Lookup(tp, name) != nullptr) {
    return PyObject_GetAttr(x, name);
  }
  PyObject* dict = PyObject_GenericGetDict(x, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();
    return PyObject_GetAttr(x, name);
  }
  touch(dict);
  PyObject* v = PyDict_GetItemWithError(dict, name);
  for (int i = 0; v == nullptr && !PyErr_Occurred() && i < 3; ++i) {
    PyObject* d = PyDict_GetItemWithError(dict, s_module_dicts[i]);
    if (d != nullptr && PyDict_CheckExact(d)) {
      touch(d);
      v = PyDict_GetItemWithError(d, name);
    }
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
int grad_is_none(PyObject* x, const Ins& ins) {
  PyTypeObject* tp = Py_TYPE(x);
  if (_PyType_Lookup(tp, s_grad) == ins.b && PyObject_TypeCheck(x, PyDescr_TYPE(ins.b)) &&
      _PyType_Lookup(tp, s_torch_function) == ins.a && !torch_function_mode_active()) {
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

// An attribute compared with an expected value; 1 if equal.
int attr_equal(PyObject* x, PyObject* name, PyObject* expected) {
  PyObject* v = PyObject_GetAttr(x, name);
  if (v == nullptr) return -1;
  touch(v);
  int r = v == expected ? 1 : equal(v, expected);
  Py_DECREF(v);
  return r;
}

// ("lazy", desc, requires_grad, chained, numel) == expected, read field by field without building the tuple.
int lazy_tensor_matches(PyObject* t, PyObject* expected, PyTypeObject* lazy_type) {
  if (!PyObject_TypeCheck(t, lazy_type) || !PyTuple_CheckExact(expected) || PyTuple_GET_SIZE(expected) != 5) return 0;
  if (attr_equal(t, s_lz_desc, PyTuple_GET_ITEM(expected, 1)) != 1) return 0;
  int requires_grad = tensor_requires_grad(t);
  if (requires_grad < 0) return -1;
  if ((requires_grad ? Py_True : Py_False) != PyTuple_GET_ITEM(expected, 2)) return 0;
  PyObject* chain = PyObject_GetAttr(t, s_lz_chain);
  if (chain == nullptr) return -1;
  bool chained = chain != Py_None;
  Py_DECREF(chain);
  if (chained != (PyTuple_GET_ITEM(expected, 3) == Py_True)) return 0;
  PyObject* st = PyObject_GetAttr(t, s_lz_st);
  if (st == nullptr) return -1;
  touch(st);
  int r;
  if (Py_TYPE(st) == &StorageType) {  // the C Storage (csrc/ir.cpp): its numel is a field
    PyObject* expected_numel = PyTuple_GET_ITEM(expected, 4);
    long long numel = PyLong_Check(expected_numel) ? PyLong_AsLongLong(expected_numel) : -1;
    r = numel == reinterpret_cast<StorageObject*>(st)->numel && !PyErr_Occurred();
  } else {
    r = attr_equal(st, s_numel, PyTuple_GET_ITEM(expected, 4));
  }
  Py_DECREF(st);
  return r;
}

// ("host", shape, stride, offset, dtype, device, requires_grad) == expected for a tensor that is not lazy.
int host_tensor(PyObject* t, const Ins& ins, PyTypeObject* lazy_type) {
  PyObject* e = ins.b;
  if (PyObject_TypeCheck(t, lazy_type)) return 0;  // its signature is a "lazy" one
  PyObject* dtype = PyObject_GetAttr(t, s_dtype);
  if (dtype == nullptr) {
    PyErr_Clear();
  } else {
    bool same_dtype = dtype == PyTuple_GET_ITEM(e, 4);  // torch.dtype objects are singletons
    Py_DECREF(dtype);
    const char* device = PyUnicode_AsUTF8(PyTuple_GET_ITEM(ins.a, 0));
    if (device == nullptr) return -1;
    int r = host_tensor_matches(t, PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2),
                                PyLong_AsLongLong(PyTuple_GET_ITEM(e, 3)), device,
                                PyLong_AsLongLong(PyTuple_GET_ITEM(ins.a, 1)), PyTuple_GET_ITEM(e, 6) == Py_True);
    if (PyErr_Occurred()) return -1;
    if (r >= 0) return same_dtype && r == 1;
  }
  PyObject* sig = PyObject_CallOneArg(PyTuple_GET_ITEM(ins.a, 2), t);  // what the TensorImpl cannot tell
  if (sig == nullptr) return -1;
  int eq = equal(sig, e);
  Py_DECREF(sig);
  return eq;
}

// *out = x[key]: 1 (loaded) or -1 (raised, or a dict without the key).
int get_item(PyObject* x, PyObject* key, PyObject** out) {
  if (PyDict_CheckExact(x)) {  // what x[key] does for a dict, without the method call
    PyObject* v = PyDict_GetItemWithError(x, key);
    if (v == nullptr) return -1;
    *out = Py_NewRef(v);
    return 1;
  }
  *out = PyObject_GetItem(x, key);
  return *out != nullptr ? 1 : -1;
}

// r[src] <op> r[n] (Note [Arithmetic in guard programs]); a new reference or NULL with an error set.
PyObject* binary(int op, PyObject* x, PyObject* y) {
  switch (op) {
    case kAdd: return PyNumber_Add(x, y);
    case kSub: return PyNumber_Subtract(x, y);
    case kMul: return PyNumber_Multiply(x, y);
    case kTrueDiv: return PyNumber_TrueDivide(x, y);
    case kFloorDiv: return PyNumber_FloorDivide(x, y);
    case kMod: return PyNumber_Remainder(x, y);
    case kLt: return PyObject_RichCompare(x, y, Py_LT);
    case kLe: return PyObject_RichCompare(x, y, Py_LE);
    case kGt: return PyObject_RichCompare(x, y, Py_GT);
    case kGe: return PyObject_RichCompare(x, y, Py_GE);
    case kEqOp: return PyObject_RichCompare(x, y, Py_EQ);
    case kNe: return PyObject_RichCompare(x, y, Py_NE);
    case kIn:
    case kNotIn: {
      int in = PySequence_Contains(y, x);
      if (in < 0) return nullptr;
      return PyBool_FromLong((in == 1) == (op == kIn));
    }
    default:
      PyErr_SetString(PyExc_ValueError, "guard program: unknown operator");
      return nullptr;
  }
}

// One instruction: 1 (holds / loaded), 0 (fails), -1 (raised: fails).
int step(const Ins& ins, PyObject** r, PyObject* A, PyTypeObject* lazy_type) {
  PyObject* x = ins.src >= 0 ? r[ins.src] : nullptr;
  if (ins.src >= 0 && x == nullptr) return 0;  // (never: loads come first; a program is built that way)
  switch (ins.op) {
    case kArg:
      if (ins.n < 0 || ins.n >= PyTuple_GET_SIZE(A)) return 0;
      r[ins.dst] = Py_NewRef(PyTuple_GET_ITEM(A, ins.n));
      return 1;
    case kConst:
      r[ins.dst] = Py_NewRef(ins.a);
      return 1;
    case kAttr:
      r[ins.dst] = module_attr(x, ins.a);
      return r[ins.dst] != nullptr ? 1 : -1;
    case kItem:
      return get_item(x, ins.a, &r[ins.dst]);
    case kItemReg:
      return r[ins.n] != nullptr ? get_item(x, r[ins.n], &r[ins.dst]) : 0;
    case kBinary:
      if (r[ins.n] == nullptr) return 0;
      r[ins.dst] = binary(ins.sub, x, r[ins.n]);
      return r[ins.dst] != nullptr ? 1 : -1;
    case kCall:
      r[ins.dst] = PyObject_CallOneArg(ins.a, x);
      return r[ins.dst] != nullptr ? 1 : -1;
    case kIs:
      return x == ins.a;
    case kIsReg:
      return r[ins.n] != nullptr && x == r[ins.n];
    case kMethodIs:
      return method_is(x, ins.a, ins.b);
    case kTypeIs:
      return reinterpret_cast<PyObject*>(Py_TYPE(x)) == ins.a;
    case kEq:
      if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != ins.b) return 0;
      return equal(x, ins.a);
    case kTruth: {
      int truth = PyObject_IsTrue(x);
      return truth < 0 ? -1 : truth == (ins.n != 0);
    }
    case kIsNone:
      return (x == Py_None) == (ins.n != 0);
    case kGradIsNone: {
      int none = grad_is_none(x, ins);
      return none < 0 ? -1 : none == (ins.n != 0);
    }
    case kLen: {
      Py_ssize_t n = PyObject_Length(x);
      return n < 0 ? -1 : n == ins.n;
    }
    case kAbsent: {
      int in = PySequence_Contains(x, ins.a);
      return in < 0 ? -1 : !in;
    }
    case kHasAttr: {
      int has = has_attr(x, ins.a);
      return has < 0 ? -1 : has == (ins.n != 0);
    }
    case kCallEq: {
      PyObject* v = x != nullptr ? PyObject_CallOneArg(ins.a, x) : PyObject_CallNoArgs(ins.a);
      if (v == nullptr) return -1;
      int eq = equal(v, ins.b);
      Py_DECREF(v);
      return eq;
    }
    case kCallTrue: {
      PyObject* v = PyObject_CallFunctionObjArgs(ins.a, x, ins.b, nullptr);
      if (v == nullptr) return -1;
      int ok = v == Py_True;
      Py_DECREF(v);
      return ok;
    }
    case kLazyTensor:
      return lazy_tensor_matches(x, ins.b, lazy_type);
    case kHostTensor:
      return host_tensor(x, ins, lazy_type);
    case kState: {
      Py_ssize_t n = PyTuple_GET_SIZE(ins.a);
      if ((grad_mode_enabled() ? Py_True : Py_False) != PyTuple_GET_ITEM(ins.b, 0) ||
          (inference_mode_enabled() ? Py_True : Py_False) != PyTuple_GET_ITEM(ins.b, 1)) {
        return 0;
      }
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* v = PyObject_CallNoArgs(PyTuple_GET_ITEM(ins.a, i));
        if (v == nullptr) return -1;
        PyObject* want = PyTuple_GET_ITEM(ins.b, i + 2);
        int eq = v == want ? 1 : equal(v, want);
        Py_DECREF(v);
        if (eq != 1) return eq;
      }
      return 1;
    }
    default:
      return 0;
  }
}

// Runs the program on A: a guard program's answer (Py_True / Py_False), or a load program's tuple of its output
// registers (NULL with an error set where a load raised or found nothing).
PyObject* run(GuardProgram* self, PyObject* A) {
  PyObject* stack_regs[32];
  std::vector<PyObject*> heap_regs;
  PyObject** r = stack_regs;
  if (self->nregs > 32) {
    heap_regs.resize(self->nregs);
    r = heap_regs.data();
  }
  for (int i = 0; i < self->nregs; ++i) r[i] = nullptr;
  std::vector<const void*> touched;
  std::vector<const void*>* outer = t_touched;  // a program run by a guard's Python call records its own
  const bool prefetching = g_prefetch && self->outputs == nullptr;  // guard programs only
  if (prefetching) {  // Note [Prefetching what the last run read]
    prefetch(*self->consts);
    prefetch(*self->warm);
    touched.reserve(self->warm->size());
    t_touched = &touched;
  } else {
    t_touched = nullptr;
  }
  bool ok = true;
  for (const Ins& ins : *self->code) {
    if (step(ins, r, A, self->lazy_type) != 1) {
      ok = false;
      break;
    }
    if (ins.dst >= 0 && r[ins.dst] != nullptr) {
      touch(r[ins.dst]);
      touch_instance_dict(r[ins.dst]);
    }
  }
  t_touched = outer;
  if (ok && prefetching) self->warm->swap(touched);
  PyObject* result;
  if (self->outputs == nullptr) {
    if (!ok && PyErr_Occurred()) PyErr_Clear();  // a guard that raises does not hold (the Python check's except)
    result = Py_NewRef(ok ? Py_True : Py_False);
  } else if (!ok) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_LookupError, "lazy: a replay could not read the state it reads");
    result = nullptr;
  } else {
    result = PyTuple_New(static_cast<Py_ssize_t>(self->outputs->size()));
    for (size_t k = 0; result != nullptr && k < self->outputs->size(); ++k) {
      PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(k), Py_NewRef(r[(*self->outputs)[k]]));
    }
  }
  for (int i = 0; i < self->nregs; ++i) Py_XDECREF(r[i]);
  return result;
}

PyObject* program_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != nullptr || !PyTuple_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "a guard program takes the bound arguments, a tuple");
    return nullptr;
  }
  return run(reinterpret_cast<GuardProgram*>(self), args[0]);
}

// Drops an instruction list (its constants' references with it).
void free_code(std::vector<Ins>* code) {
  for (Ins& done : *code) {
    Py_XDECREF(done.a);
    Py_XDECREF(done.b);
  }
  delete code;
}

void program_dealloc(PyObject* self) {
  auto* p = reinterpret_cast<GuardProgram*>(self);
  if (p->code != nullptr) free_code(p->code);
  delete p->outputs;
  delete p->warm;
  delete p->consts;
  Py_XDECREF(reinterpret_cast<PyObject*>(p->lazy_type));
  Py_TYPE(self)->tp_free(self);
}

PyObject* program_size(PyObject* self, void*) {
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(reinterpret_cast<GuardProgram*>(self)->code->size()));
}

PyObject* program_prefetched(PyObject* self, void*) {
  auto* p = reinterpret_cast<GuardProgram*>(self);
  return PyLong_FromSize_t(p->warm->size() + p->consts->size());
}

PyGetSetDef program_getset[] = {
    {"size", program_size, nullptr, "the number of instructions", nullptr},
    {"prefetched", program_prefetched, nullptr, "the addresses a run prefetches (Note [Prefetching what the last "
     "run read])", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject GuardProgramType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

PyObject* set_guard_prefetch(PyObject*, PyObject* enabled) {
  int on = PyObject_IsTrue(enabled);
  if (on < 0) return nullptr;
  g_prefetch = on != 0;
  Py_RETURN_NONE;
}

bool init_guard_types() {
  GuardProgramType.tp_name = "lazy._C.GuardProgram";
  GuardProgramType.tp_basicsize = sizeof(GuardProgram);
  GuardProgramType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  GuardProgramType.tp_vectorcall_offset = offsetof(GuardProgram, vectorcall);
  GuardProgramType.tp_call = PyVectorcall_Call;
  GuardProgramType.tp_dealloc = program_dealloc;
  GuardProgramType.tp_getset = program_getset;
  GuardProgramType.tp_doc =
      "guard_program(instructions, nregs, lazy_type, module_type): an entry's guards, callable on A (bool)";
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
  return PyType_Ready(&GuardProgramType) == 0 && s_lz_desc && s_lz_chain && s_lz_st && s_numel && s_dtype &&
         s_getattr && s_func && s_grad && s_torch_function &&
         s_object_getattribute && s_module_dicts[0] && s_module_dicts[1] && s_module_dicts[2];
}

PyObject* guard_program(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if ((nargs != 4 && nargs != 5) || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !PyType_Check(args[2]) ||
      !PyType_Check(args[3]) || (nargs == 5 && !PyTuple_Check(args[4]))) {
    PyErr_SetString(PyExc_TypeError, "guard_program(instructions: list, nregs: int, lazy_type: type, "
                                     "module_type: type[, outputs: tuple of registers])");
    return nullptr;
  }
  if (s_module_getattr == nullptr) {  // Note [Module attributes in guard programs]
    s_module_getattr = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(args[3]), s_getattr);
    Py_XINCREF(s_module_getattr);
  }
  long nregs = PyLong_AsLong(args[1]);
  if (nregs < 0 || nregs > 1 << 20) {
    PyErr_SetString(PyExc_ValueError, "guard_program: nregs out of range");
    return nullptr;
  }
  auto* code = new std::vector<Ins>();
  Py_ssize_t n = PyList_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* t = PyList_GET_ITEM(args[0], i);
    Ins ins{};
    PyObject *a = nullptr, *b = nullptr;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iiiLOO", &ins.op, &ins.dst, &ins.src, &ins.n, &a, &b) ||
        ins.op < 0 || ins.op >= kNumOps || ins.dst >= nregs || ins.src >= nregs ||
        ((ins.op == kArg || ins.op == kConst || ins.op == kAttr || ins.op == kItem || ins.op == kItemReg ||
          ins.op == kBinary || ins.op == kCall) && ins.dst < 0) ||
        (ins.op == kCall && !PyCallable_Check(a)) || (ins.op == kMethodIs && !PyUnicode_Check(a)) ||
        (ins.op == kGradIsNone && !Py_IS_TYPE(b, &PyGetSetDescr_Type)) ||
        ((ins.op == kItemReg || ins.op == kBinary || ins.op == kIsReg) && (ins.n < 0 || ins.n >= nregs)) ||
        (ins.op == kBinary && (!PyLong_Check(a) || PyLong_AsLong(a) < 0 || PyLong_AsLong(a) >= kNumBinary)) ||
        (ins.op != kArg && ins.op != kConst && ins.op != kCallEq && ins.op != kState && ins.src < 0) ||
        (ins.op == kState && (!PyTuple_Check(a) || !PyTuple_Check(b) ||
                              PyTuple_GET_SIZE(b) != PyTuple_GET_SIZE(a) + 2)) ||
        (ins.op == kHostTensor && (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 3 ||
                                   !PyUnicode_Check(PyTuple_GET_ITEM(a, 0)) || !PyLong_Check(PyTuple_GET_ITEM(a, 1)) ||
                                   !PyTuple_Check(b) || PyTuple_GET_SIZE(b) != 7 ||
                                   !PyLong_Check(PyTuple_GET_ITEM(b, 3))))) {
      free_code(code);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "guard_program: bad instruction %zd", i);
      return nullptr;
    }
    if (ins.op == kBinary) ins.sub = static_cast<int>(PyLong_AsLong(a));
    ins.a = Py_NewRef(a);
    ins.b = Py_NewRef(b);
    code->push_back(ins);
  }
  std::vector<int>* outputs = nullptr;
  if (nargs == 5) {  // a load program (Note [Replay loads in C])
    outputs = new std::vector<int>();
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args[4]); ++k) {
      long reg = PyLong_AsLong(PyTuple_GET_ITEM(args[4], k));
      if (reg < 0 || reg >= nregs) {
        delete outputs;
        outputs = nullptr;
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "guard_program: an output register out of range");
        break;
      }
      outputs->push_back(static_cast<int>(reg));
    }
    if (outputs == nullptr) {
      free_code(code);
      return nullptr;
    }
  }
  auto* p = PyObject_New(GuardProgram, &GuardProgramType);
  if (p == nullptr) {
    delete outputs;
    free_code(code);
    return nullptr;
  }
  p->vectorcall = program_vectorcall;
  p->code = code;
  p->nregs = static_cast<int>(nregs);
  p->lazy_type = reinterpret_cast<PyTypeObject*>(Py_NewRef(args[2]));
  p->outputs = outputs;
  p->warm = new std::vector<const void*>();
  p->consts = new std::vector<const void*>();
  if (outputs == nullptr) {  // a guard program prefetches its constants (a load program prefetches nothing)
    for (const Ins& ins : *code) {
      for (PyObject* c : {ins.a, ins.b}) {
        if (c == nullptr || c == Py_None) continue;
        p->consts->push_back(c);
        if (PyTuple_Check(c)) {
          for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(c); ++k) p->consts->push_back(PyTuple_GET_ITEM(c, k));
        }
      }
    }
  }
  return reinterpret_cast<PyObject*>(p);
}

}  // namespace lazy
