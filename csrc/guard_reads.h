// How guard programs (capture_guards.cpp) read what their guards test: module attributes, dict items, method
// bindings, gradients and tensor signatures, each as Python would answer, only sooner (guard_reads.cpp); and the
// record of what a run read, for the next run's prefetch (Note [Prefetching what the last run read]).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <vector>

namespace lazy {

// What a load read at its last run, for Note [Loads memoized by dict versions]: the dicts it looked in with their
// version tags, and what it found. Pointers are identities (never dereferenced unless the first dict is unchanged,
// which keeps the others and the value alive), except ``key``, a strong reference.
struct LoadMemo {
  PyTypeObject* type = nullptr;  // attr_load: the object's type, at version tag ``tag``
  unsigned int tag = 0;
  int ndicts = 0;  // 0: nothing recorded
  PyObject* key = nullptr;  // dict_item: the key looked up (strong)
  PyObject* value = nullptr;
  PyObject* dicts[4] = {nullptr, nullptr, nullptr, nullptr};
  uint64_t versions[4] = {0, 0, 0, 0};
};

// What a lazy tensor's signature test read at its last passing run (Note [Loads memoized by dict versions]).
struct TensorMemo {
  PyTypeObject* type = nullptr;
  unsigned int tag = 0;
  PyObject* dict = nullptr;  // the tensor's instance dict, at version ``version``; null: nothing recorded
  uint64_t version = 0;
  PyObject* storage = nullptr;  // its _lz_st (a C Storage), held by that dict
};

// Readies the names the reads look up; false with a Python error set on failure.
bool init_guard_reads();
// torch.nn.Module, whose __getattr__ attr_load reads around (Note [Module attributes in guard programs]).
void set_module_type(PyTypeObject* module_type);
// Whether loads use their memos (on by default; off to measure them).
void set_load_memos(bool enabled);

// getattr(x, name): a new reference, or NULL with an error set.
PyObject* attr_load(PyObject* x, PyObject* name, LoadMemo* memo);
// *out = x[key] (a new reference): 1, or -1 (raised, or a dict without the key).
int dict_item(PyObject* x, PyObject* key, PyObject** out, LoadMemo* memo);
// getattr(getattr(x, name), "__func__") is fn: 1, 0, or -1 on an error (Note [Method guards]).
int method_is(PyObject* x, PyObject* name, PyObject* fn);
// x.grad is None: 1, 0, or -1 on an error; disabled_tf is torch's disabled __torch_function__, grad_descr
// TensorBase.grad (Note [Gradients in guard programs]).
int grad_is_none(PyObject* x, PyObject* disabled_tf, PyObject* grad_descr);
// Python's x == y then bool: 1, 0, or -1 on an error.
int equal(PyObject* x, PyObject* y);
// tuple(d.keys()) holds the keys ``expected`` (a tuple), in order, each the same object or of the same type, equal
// and not an instance of ``tensor_type``: 1, 0, or -1 on an error (Note [Key guards in C]).
int keys_are(PyObject* d, PyObject* expected, PyObject* tensor_type);
// hasattr(x, name): 1, 0, or -1 on an error other than AttributeError.
int has_attr(PyObject* x, PyObject* name);
// t is a lazy tensor whose signature ("lazy", desc, requires_grad, chained, numel) equals expected: 1, 0, or -1.
int lazy_tensor_matches(PyObject* t, PyObject* expected, PyTypeObject* lazy_type, TensorMemo* memo);
// t is not lazy and its signature ("host", ...) equals expected; how is (device type, index, signature function).
int host_tensor(PyObject* t, PyObject* how, PyObject* expected, PyTypeObject* lazy_type);

// Note [Prefetching what the last run read] (guard_reads.cpp): the running program's record of the addresses it
// read (null: none), and the helpers that add to it.
extern std::vector<const void*>* g_touched;

inline void touch_dict(PyObject* d) {
  auto* dict = reinterpret_cast<PyDictObject*>(d);
  g_touched->push_back(d);
  g_touched->push_back(dict->ma_keys);
  if (dict->ma_values != nullptr) g_touched->push_back(dict->ma_values);
}

// Records ``o`` (and, for a dict, its tables) for the next run's prefetch.
inline void touch(PyObject* o) {
  if (g_touched == nullptr || o == nullptr) return;
  if (PyDict_Check(o)) {
    touch_dict(o);
  } else {
    g_touched->push_back(o);
  }
}

// Records where the instance attributes of ``o`` live (it never makes a dict).
void touch_instance_dict(PyObject* o);

inline void prefetch(const std::vector<const void*>& addresses) {
  for (const void* p : addresses) {
    __builtin_prefetch(p);
    __builtin_prefetch(static_cast<const char*>(p) + 64);
  }
}

}  // namespace lazy
