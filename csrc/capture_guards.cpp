// The guards of a lazy.compile entry as a small register program, evaluated in C (lazy/capture/guards.py builds it).
//
// Note [Guard programs]
// An entry's guards (Note [Guards] in lazy/capture/session.py) are checks on values read from the call's bound
// arguments: A[i], its attributes and items, objects the capture holds. The Python check (lazy/capture/replay.py)
// renders them as one generated expression; a GuardProgram is the same check as a list of instructions over
// registers: loads (an argument, a constant, an attribute, an item) and tests (identity, exact type, equality with
// the expected value's exact type, truth, None-ness, length, absence of a key or an attribute, a dict's keys (Note
// [Key guards in C] in guard_reads.cpp), a lazy tensor's signature, a call of a Python helper compared with its
// expected result, the global state: grad and inference mode read from c10, the rest through the readers
// replay.global_state calls). A program answers what the Python check
// answers: the conjunction of every test, where a load or test that raises counts as false (the Python check's
// ``except Exception: return False``); its tests have no side effects beyond those of the loads the Python check also
// makes, so the order does not change the answer. Each load happens once per call, into its register, as the Python
// check's shared temporaries do. A guard whose expression the program cannot load (arithmetic, calls) stays in a
// residual Python check that runs after the program (guards.py). Failure reasons still come from the Python renderer
// (Entry.failures), which reports each guard on its own.
#include "capture_guards.h"

#include "alias.h"
#include "guard_reads.h"

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
  kKeys,        // tuple(r[src].keys()) holds the keys b, in order; a: torch.Tensor (Note [Key guards in C])
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
  int memo;  // the instruction's slot in its program's loads or tensors memos (Note [Loads memoized by dict
             // versions] in guard_reads.cpp); -1: none
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
  std::vector<LoadMemo>* loads;  // kAttr, kItem and kItemReg instructions' memos
  std::vector<TensorMemo>* tensors;  // kLazyTensor instructions' memos
};

bool g_prefetch = true;  // set_guard_prefetch

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
int step(const Ins& ins, PyObject** r, PyObject* A, GuardProgram* p) {
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
      r[ins.dst] = attr_load(x, ins.a, ins.memo >= 0 ? &(*p->loads)[ins.memo] : nullptr);
      return r[ins.dst] != nullptr ? 1 : -1;
    case kItem:
      return dict_item(x, ins.a, &r[ins.dst], ins.memo >= 0 ? &(*p->loads)[ins.memo] : nullptr);
    case kItemReg:
      return r[ins.n] != nullptr
                 ? dict_item(x, r[ins.n], &r[ins.dst], ins.memo >= 0 ? &(*p->loads)[ins.memo] : nullptr)
                 : 0;
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
      int none = grad_is_none(x, ins.a, ins.b);
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
    case kKeys:
      return keys_are(x, ins.b, ins.a);
    case kLazyTensor:
      return lazy_tensor_matches(x, ins.b, p->lazy_type, ins.memo >= 0 ? &(*p->tensors)[ins.memo] : nullptr);
    case kHostTensor:
      return host_tensor(x, ins.a, ins.b, p->lazy_type);
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
  const bool prefetching = g_prefetch && self->outputs == nullptr;  // guard programs only
  std::vector<const void*>* record = prefetching ? &touched : nullptr;
  if (prefetching) {  // Note [Prefetching what the last run read]
    prefetch(*self->consts);
    prefetch(*self->warm);
    touched.reserve(self->warm->size());
  }
  bool ok = true;
  for (const Ins& ins : *self->code) {
    g_touched = record;  // Note [The record of a run's reads] (guard_reads.cpp)
    if (step(ins, r, A, self) != 1) {
      ok = false;
      break;
    }
    if (ins.dst >= 0 && r[ins.dst] != nullptr) {
      touch(r[ins.dst]);
      touch_instance_dict(r[ins.dst]);
    }
  }
  g_touched = nullptr;
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
  for (LoadMemo& m : *p->loads) Py_XDECREF(m.key);
  delete p->loads;
  delete p->tensors;
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

PyObject* set_guard_memos(PyObject*, PyObject* enabled) {
  int on = PyObject_IsTrue(enabled);
  if (on < 0) return nullptr;
  set_load_memos(on != 0);
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
  return PyType_Ready(&GuardProgramType) == 0 && init_guard_reads();
}

PyObject* guard_program(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if ((nargs != 4 && nargs != 5) || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !PyType_Check(args[2]) ||
      !PyType_Check(args[3]) || (nargs == 5 && !PyTuple_Check(args[4]))) {
    PyErr_SetString(PyExc_TypeError, "guard_program(instructions: list, nregs: int, lazy_type: type, "
                                     "module_type: type[, outputs: tuple of registers])");
    return nullptr;
  }
  set_module_type(reinterpret_cast<PyTypeObject*>(args[3]));  // Note [Module attributes in guard programs]
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
        (ins.op == kKeys && (!PyType_Check(a) || !PyTuple_Check(b))) ||
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
  p->loads = new std::vector<LoadMemo>();
  p->tensors = new std::vector<TensorMemo>();
  for (Ins& ins : *code) {  // Note [Loads memoized by dict versions] (guard_reads.cpp)
    ins.memo = -1;
    if (ins.op == kAttr || ins.op == kItem || ins.op == kItemReg) {
      ins.memo = static_cast<int>(p->loads->size());
      p->loads->emplace_back();
    } else if (ins.op == kLazyTensor) {
      ins.memo = static_cast<int>(p->tensors->size());
      p->tensors->emplace_back();
    }
  }
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
