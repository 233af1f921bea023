// What the recording hot path (record.cpp) shares with the LazyTensor methods that record without the dispatcher
// (record_methods.cpp): the registered ops, the Python objects configure() gave, and record() itself.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <unordered_map>
#include <vector>

namespace lazy {
namespace recording {

// An owned reference (released on scope exit).
class Ref {
 public:
  Ref() = default;
  explicit Ref(PyObject* p) : p_(p) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref& operator=(Ref&& other) noexcept {
    Py_XSETREF(p_, other.release());
    return *this;
  }
  ~Ref() { Py_XDECREF(p_); }
  PyObject* get() const { return p_; }
  PyObject* release() {
    PyObject* p = p_;
    p_ = nullptr;
    return p;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_ = nullptr;
};

// Scalar kinds, as in lazy/trace/schema.py.
constexpr int kStatic = 0;
constexpr int kRuntimeMemoValue = 2;

// Kinds of fast ops.
constexpr int kFunctional = 0;
constexpr int kView = 1;
constexpr int kInplace = 2;  // ``self`` is the only mutated argument and the only return, a base tensor
constexpr int kAlias = 3;    // a view that is its input itself (detach, alias): of a base, a second base
                             // (Note [Aliases of a base are bases] in lazy/trace/record.py); else a view

struct FastOp {
  PyObject* desc;      // the OpDesc (strong reference; ops are immortal, so are their descs)
  PyObject* kw_kinds;  // dict: keyword-only argument name -> kind
  int kind;            // kFunctional (record_functional), kView/kAlias (record_view), kInplace (record_inplace)
  PyObject* functional;  // kInplace: the functional variant that is recorded (Note [Functional variants])
  std::vector<int> kinds;
};

struct State {
  PyTypeObject* lazy_type = nullptr;
  PyTypeObject* out_type = nullptr;
  PyTypeObject* dtype_type = nullptr;
  PyObject* make_wrapper = nullptr;
  PyObject* device = nullptr;
  PyObject* layout = nullptr;
  PyObject* tensor_marker = nullptr;
  PyObject* float_marker = nullptr;
  PyObject* int_marker = nullptr;
  PyObject* bool_marker = nullptr;
  PyObject* memo = nullptr;           // lazy.trace.meta._MEMO
  PyObject* slow_dispatch = nullptr;  // lazy.trace.dispatch.dispatch_slow(func, args, kwargs)
  PyObject* view_value = nullptr;     // lazy.trace.views.value(tensor)
  PyObject* view_step = nullptr;      // lazy.trace.views.ViewStep
  PyObject* fast_cache = nullptr;     // memo key -> (signature, (shape, stride, offset, dtype), numel, view step),
                                      // or for several outputs (signature, metas, outputs, is_list, None)
  PyObject* getitem_op = nullptr;     // lazy.ir.node.GETITEM: the op of a multi-output node's output nodes
  PyObject* static_types = nullptr;   // tuple of types whose instances are static template items (memory_format)
  PyObject* empty_tuple = nullptr;
  PyObject* name_st = nullptr;
  PyObject* name_chain = nullptr;
  PyObject* name_desc = nullptr;
  PyObject* name_cache = nullptr;
  bool enabled = true;
  long long traced = 0;
  long long hits = 0;
  long long misses = 0;
  long long reused_grads = 0;  // Note [Reused gradient wrappers] in replay_io.cpp
  std::unordered_map<PyObject*, FastOp> ops;  // keyed by the OpOverload's identity
};

extern State g;

// Marks "not handled here": the Python recorder takes the call.
static PyObject* const kBail = reinterpret_cast<PyObject*>(&g);

// Records ``func(*args, **kwargs)`` (a registered op); a new tensor, kBail, or NULL with an error set.
PyObject* record(PyObject* func, const FastOp& op, PyObject* args, PyObject* kwargs);

// A new lazy tensor of metadata ``desc`` (shape, stride, offset, dtype) owning a new storage whose value is ``value``
// (record.py's new_tensor); NULL with an error set.
PyObject* new_base(PyObject* desc, PyObject* value, PyObject* numel);

// False with a RuntimeError set if lazy._C.configure() has not run.
bool configured();

}  // namespace recording
}  // namespace lazy
