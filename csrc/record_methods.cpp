// LazyTensor methods -- ``x * 2``, ``x.sin()``, ... -- that record their ATen call without the dispatcher.
//
// ``x * 2.0`` normally goes Tensor.__mul__ -> argument parsing -> the dispatcher (autograd, the Python key) ->
// __torch_dispatch__ with ``aten.mul.Tensor(x, 2.0)``; ``x.sin()`` likewise with ``aten.sin.default(x)``. When
// nothing between the method and the recorder can act on the call -- autograd has nothing to record, no dispatch
// or function mode, no autocast, no functorch transform, no forward-mode AD level -- lazy's own methods record
// that same ATen call directly: in C once the call is memoized, through the Python recorder before (what
// __torch_dispatch__ would do). Any other case, and any operand that is not a lazy tensor or a plain number,
// takes torch's own method. lazy/trace/dispatch.py chooses the methods (operators, and unary methods whose ATen op
// the dispatcher delivers unchanged).

#include "record.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "record_state.h"

namespace lazy {

using namespace recording;

namespace {

struct MethodOp {
  PyObject* op = nullptr;        // the ATen overload the dispatcher would deliver, with ``self`` first
  PyObject* fallback = nullptr;  // torch.Tensor's own method
};

constexpr int kMaxMethods = 64;
MethodOp g_methods[kMaxMethods];
PyMethodDef g_method_defs[kMaxMethods];
std::string g_method_names[kMaxMethods];
int g_n_methods = 0;

struct Guards {
  PyObject* grad_enabled = nullptr;           // torch.is_grad_enabled
  PyObject* dispatch_stack_len = nullptr;     // torch._C._len_torch_dispatch_stack
  PyObject* function_mode = nullptr;          // torch._C._is_torch_function_mode_enabled
  PyObject* autocast = nullptr;               // torch._C._is_any_autocast_enabled
  PyObject* functorch = nullptr;              // torch._C._are_functorch_transforms_active
  PyObject* forward_ad = nullptr;             // the torch.autograd.forward_ad module (_current_level)
  PyObject* name_requires_grad = nullptr;
  PyObject* name_level = nullptr;
} g_guards;

// 1 if the call can skip the dispatcher, 0 if not, -1 on error. ``other`` may be nullptr (a unary method).
int call_is_plain(PyObject* self, PyObject* other) {
  auto truth = [](PyObject* fn) -> int {
    Ref r(PyObject_CallNoArgs(fn));
    return r ? PyObject_IsTrue(r.get()) : -1;
  };
  int t;
  if ((t = truth(g_guards.function_mode)) != 0) return t < 0 ? -1 : 0;
  if ((t = truth(g_guards.autocast)) != 0) return t < 0 ? -1 : 0;
  if ((t = truth(g_guards.functorch)) != 0) return t < 0 ? -1 : 0;
  if ((t = truth(g_guards.dispatch_stack_len)) != 0) return t < 0 ? -1 : 0;
  Ref level(PyObject_GetAttr(g_guards.forward_ad, g_guards.name_level));
  if (!level) return -1;
  long lv = PyLong_AsLong(level.get());
  if (lv == -1 && PyErr_Occurred()) return -1;
  if (lv != -1) return 0;
  if ((t = truth(g_guards.grad_enabled)) <= 0) return t < 0 ? -1 : 1;
  PyObject* operands[] = {self, other};
  for (PyObject* v : operands) {
    if (v == nullptr || Py_TYPE(v) != g.lazy_type) continue;
    Ref rg(PyObject_GetAttr(v, g_guards.name_requires_grad));
    if (!rg) return -1;
    if (rg.get() != Py_False) return 0;
  }
  return 1;
}

// Records method ``m`` on (self[, other]) if the call is plain; kBail if torch's method must take it.
PyObject* record_method(const MethodOp& m, PyObject* self, PyObject* other) {
  if (!g.enabled || Py_TYPE(self) != g.lazy_type) return kBail;
  int plain = call_is_plain(self, other);
  if (plain <= 0) return plain < 0 ? nullptr : kBail;
  Ref args(other == nullptr ? PyTuple_Pack(1, self) : PyTuple_Pack(2, self, other));
  if (!args) return nullptr;
  ++g.traced;
  auto it = g.ops.find(m.op);
  if (it != g.ops.end()) {
    PyObject* result = record(m.op, it->second, args.get(), nullptr);
    if (result != kBail) return result;
  }
  // Not memoized yet: the Python recorder, as __torch_dispatch__ would call it (and the dispatcher never sees
  // the call: its first Python dispatch imports torch.distributed.tensor, ~0.25 s).
  Ref kwargs(PyDict_New());
  if (!kwargs) return nullptr;
  PyObject* call[] = {m.op, args.get(), kwargs.get()};
  return PyObject_Vectorcall(g.slow_dispatch, call, 3, nullptr);
}

template <int K>
PyObject* binary_method(PyObject* self, PyObject* other) {
  const MethodOp& m = g_methods[K];
  PyTypeObject* to = Py_TYPE(other);
  bool number = to == &PyFloat_Type || to == &PyBool_Type;
  if (to == &PyLong_Type) {
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(other, &overflow);
    number = overflow == 0;
  }
  if (number || to == g.lazy_type) {
    PyObject* result = record_method(m, self, other);
    if (result != kBail) return result;
  }
  PyObject* call[] = {self, other};
  return PyObject_Vectorcall(m.fallback, call, 2, nullptr);
}

// ``x.sin()``; any argument (``x.round(decimals=2)`` is another overload) goes to torch's method.
template <int K>
PyObject* unary_method(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const MethodOp& m = g_methods[K];
  if (nargs == 0 && kwnames == nullptr) {
    PyObject* result = record_method(m, self, nullptr);
    if (result != kBail) return result;
  }
  Py_ssize_t n = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  std::vector<PyObject*> call(static_cast<size_t>(n) + 1);
  call[0] = self;
  for (Py_ssize_t i = 0; i < n; ++i) call[static_cast<size_t>(i) + 1] = args[i];
  return PyObject_Vectorcall(m.fallback, call.data(), static_cast<size_t>(nargs) + 1, kwnames);
}

template <size_t... K>
std::array<PyCFunction, sizeof...(K)> binary_table(std::index_sequence<K...>) {
  return {binary_method<static_cast<int>(K)>...};
}

template <size_t... K>
std::array<PyCFunction, sizeof...(K)> unary_table(std::index_sequence<K...>) {
  return {reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(unary_method<static_cast<int>(K)>))...};
}

const auto kBinaryMethods = binary_table(std::make_index_sequence<kMaxMethods>{});
const auto kUnaryMethods = unary_table(std::make_index_sequence<kMaxMethods>{});

}  // namespace

PyObject* plain_call(PyObject*, PyObject* self) {
  if (!configured()) return nullptr;
  if (g_guards.grad_enabled == nullptr) Py_RETURN_FALSE;  // install_methods has not run: nothing is plain yet
  int plain = g.enabled && Py_TYPE(self) == g.lazy_type ? call_is_plain(self, nullptr) : 0;
  if (plain < 0) return nullptr;
  return PyBool_FromLong(plain);
}

PyObject* install_methods(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  // install_methods(methods: dict name -> (aten overload, torch's method, arity), guards: tuple of 5 callables,
  //                 forward_ad module)
  if (nargs != 3 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 5) {
    PyErr_SetString(PyExc_TypeError, "install_methods(methods: dict, guards: tuple of 5, forward_ad module)");
    return nullptr;
  }
  if (!configured()) return nullptr;
  PyObject** guard_slots[] = {&g_guards.grad_enabled, &g_guards.dispatch_stack_len, &g_guards.function_mode,
                              &g_guards.autocast, &g_guards.functorch};
  for (int i = 0; i < 5; ++i) {
    Py_INCREF(PyTuple_GET_ITEM(args[1], i));
    Py_XSETREF(*guard_slots[i], PyTuple_GET_ITEM(args[1], i));
  }
  Py_INCREF(args[2]);
  Py_XSETREF(g_guards.forward_ad, args[2]);
  if (g_guards.name_requires_grad == nullptr) {
    g_guards.name_requires_grad = PyUnicode_InternFromString("requires_grad");
    g_guards.name_level = PyUnicode_InternFromString("_current_level");
  }
  Py_ssize_t pos = 0;
  PyObject *name, *spec;
  while (PyDict_Next(args[0], &pos, &name, &spec)) {
    long arity = 0;
    if (!PyUnicode_Check(name) || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3 ||
        ((arity = PyLong_AsLong(PyTuple_GET_ITEM(spec, 2))) != 1 && arity != 2)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "install_methods: name -> (op, fallback, 1 or 2)");
      return nullptr;
    }
    const char* utf8 = PyUnicode_AsUTF8(name);
    if (utf8 == nullptr) return nullptr;
    int k = 0;
    while (k < g_n_methods && g_method_names[k] != utf8) ++k;  // reinstalling a name reuses its slot
    if (k == g_n_methods) {
      if (g_n_methods == kMaxMethods) {
        PyErr_SetString(PyExc_ValueError, "install_methods: too many methods (raise kMaxMethods)");
        return nullptr;
      }
      ++g_n_methods;
      g_method_names[k] = utf8;
    }
    Py_INCREF(PyTuple_GET_ITEM(spec, 0));
    Py_INCREF(PyTuple_GET_ITEM(spec, 1));
    Py_XSETREF(g_methods[k].op, PyTuple_GET_ITEM(spec, 0));
    Py_XSETREF(g_methods[k].fallback, PyTuple_GET_ITEM(spec, 1));
    g_method_defs[k] = {g_method_names[k].c_str(), arity == 2 ? kBinaryMethods[k] : kUnaryMethods[k],
                        arity == 2 ? METH_O : METH_FASTCALL | METH_KEYWORDS,
                        "Recorded without the dispatcher when nothing else would see the call (lazy/_C)."};
    Ref method(PyDescr_NewMethod(g.lazy_type, &g_method_defs[k]));
    if (!method || PyObject_SetAttr(reinterpret_cast<PyObject*>(g.lazy_type), name, method.get()) != 0) {
      return nullptr;
    }
  }
  Py_RETURN_NONE;
}

}  // namespace lazy
