// The one translation unit that sees torch's C++ headers: c10's TensorImpl (and ATen's Tensor and torch-function
// state, only to read whether a gradient exists and whether a mode is active; autograd's Error node, to give a
// replay's output the history eager's has, error_history). A lazy view's wrapper tensor is
// created with a StorageImpl of its own (torch.Tensor._make_wrapper_subclass has no storage argument), so ATen's
// aliasing tests (is_alias_of, untyped_storage() identity) would call a view and its base unrelated. matmul
// with out= on a 3-D input relies on one: it reshapes out, writes the product into that view and copies back only
// if the view is not an alias of out. Lazy's own Storage (ir.cpp) is what carries values; this only keeps the C++
// storage identity in step with it.
#include "alias.h"
#include "guard_reads.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <memory>
#include <string>
#include <type_traits>

namespace lazy {

namespace {

// Whether a tensor object's TensorImpl* is the first word after its PyObject header (THPVariable's ``at::Tensor
// cdata`` in torch 2.13; older torches held a MaybeOwned there). probe_layout() checks it against _cdata.
bool g_direct = false;
PyTypeObject* g_tensor_type = nullptr;  // torch.Tensor, from probe_layout's first argument

c10::TensorImpl* raw_impl(PyObject* tensor) {
  return *reinterpret_cast<c10::TensorImpl**>(reinterpret_cast<char*>(tensor) + sizeof(PyObject));
}

// The TensorImpl behind a tensor. torch.Tensor._cdata is its address: reading it costs ~0.5 us on a subclass, so
// the struct is read directly where probe_layout() found that to give the same address. (Both avoid torch's
// Python headers, which bring their own pybind11.)
c10::TensorImpl* impl_of(PyObject* tensor) {
  if (g_direct) return raw_impl(tensor);
  PyObject* address = PyObject_GetAttrString(tensor, "_cdata");
  if (address == nullptr) return nullptr;
  void* impl = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (impl == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "lazy: a tensor without TensorImpl");
  return static_cast<c10::TensorImpl*>(impl);
}

}  // namespace

c10::TensorImpl* tensor_impl(PyObject* tensor) { return impl_of(tensor); }

PyObject* probe_layout(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  g_direct = false;
  bool direct = nargs > 0;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    c10::TensorImpl* slow = impl_of(args[i]);
    if (slow == nullptr) return nullptr;
    direct = direct && raw_impl(args[i]) == slow;
  }
  g_direct = direct;
  if (nargs > 0) g_tensor_type = Py_TYPE(args[0]);
  return PyBool_FromLong(direct);
}

int share_storage(PyObject* view, PyObject* base) {
  c10::TensorImpl* v = impl_of(view);
  c10::TensorImpl* b = v == nullptr ? nullptr : impl_of(base);
  if (b == nullptr) return -1;
  try {
    v->set_storage_keep_dtype(b->storage());
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "lazy: could not share a view's storage with its base: %s", e.what());
    return -1;
  }
  return 0;
}

bool grad_mode_enabled() { return c10::GradMode::is_enabled(); }

bool inference_mode_enabled() { return c10::InferenceMode::is_enabled(); }

int tensor_requires_grad(PyObject* tensor) {
  c10::TensorImpl* impl = impl_of(tensor);
  if (impl == nullptr) return -1;
  if (g_touched != nullptr) {  // Note [Prefetching what the last run read]: the C++ objects the answer reads
    g_touched->push_back(impl);
    if (const void* meta = impl->autograd_meta()) g_touched->push_back(meta);
  }
  return impl->requires_grad() ? 1 : 0;
}

int tensor_grad_defined(PyObject* tensor) {
  c10::TensorImpl* impl = impl_of(tensor);
  if (impl == nullptr) return -1;
  return impl->grad().defined() ? 1 : 0;
}

bool torch_function_mode_active() { return at::impl::torch_function_mode_enabled(); }

namespace {

// torch 2.11 holds autograd nodes in std::shared_ptr, later torches in c10::intrusive_ptr: Edge's own field says.
template <typename Ptr>
Ptr error_node(std::string message) {
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<torch::autograd::Error>(std::move(message), torch::autograd::edge_list());
  } else {
    return c10::make_intrusive<torch::autograd::Error>(std::move(message), torch::autograd::edge_list());
  }
}

}  // namespace

PyObject* error_history(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "error_history(tensor, message)");
    return nullptr;
  }
  const char* message = PyUnicode_AsUTF8(args[1]);
  if (message == nullptr) return nullptr;
  c10::TensorImpl* impl = impl_of(args[0]);
  if (impl == nullptr) return nullptr;
  try {
    at::Tensor var(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
    if (var.requires_grad()) {
      PyErr_SetString(PyExc_ValueError, "error_history: the tensor has an autograd history or requires grad");
      return nullptr;
    }
    using NodePtr = decltype(torch::autograd::Edge().function);
    NodePtr node = error_node<NodePtr>(message);
    const uint32_t input_nr = node->add_input_metadata(var);
    torch::autograd::impl::set_gradient_edge(var, torch::autograd::Edge(std::move(node), input_nr));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_INCREF(args[0]);
  return args[0];
}

namespace {

PyObject* int_tuple(c10::IntArrayRef values) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* v = PyLong_FromLongLong(values[i]);
    if (v == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), v);
  }
  return t;
}

// The TensorImpl of a torch.Tensor whose sizes and strides are plain fields (not symbolic, not answered by a Python
// subclass), or NULL (no error set).
c10::TensorImpl* plain_impl(PyObject* tensor) {
  if (g_tensor_type == nullptr || !PyObject_TypeCheck(tensor, g_tensor_type)) return nullptr;
  c10::TensorImpl* impl = impl_of(tensor);
  if (impl == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  return impl->has_symbolic_sizes_strides() || impl->key_set().has(c10::DispatchKey::Python) ? nullptr : impl;
}

// Whether ``values`` equals ``expected``, a tuple of ints (never raises).
bool same_ints(c10::IntArrayRef values, PyObject* expected) {
  if (static_cast<Py_ssize_t>(values.size()) != PyTuple_GET_SIZE(expected)) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(expected, static_cast<Py_ssize_t>(i))) != values[i]) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

// tuple(x) of a Python sequence attribute or method result (the fallback of tensor_layout).
PyObject* tuple_of_attr(PyObject* tensor, const char* name, bool call) {
  PyObject* v = call ? PyObject_CallMethod(tensor, name, nullptr) : PyObject_GetAttrString(tensor, name);
  if (v == nullptr) return nullptr;
  PyObject* t = PySequence_Tuple(v);
  Py_DECREF(v);
  return t;
}

}  // namespace

int tensor_layout(PyObject* tensor, PyObject** shape, PyObject** stride) {
  *shape = *stride = nullptr;
  c10::TensorImpl* impl = plain_impl(tensor);
  if (impl != nullptr) {
    try {
      *shape = int_tuple(impl->sizes());
      *stride = *shape != nullptr ? int_tuple(impl->strides()) : nullptr;
    } catch (const std::exception& e) {
      Py_CLEAR(*shape);
      PyErr_Format(PyExc_RuntimeError, "lazy: could not read a tensor's sizes: %s", e.what());
    }
  } else {
    *shape = tuple_of_attr(tensor, "shape", false);
    *stride = *shape != nullptr ? tuple_of_attr(tensor, "stride", true) : nullptr;
  }
  if (*stride == nullptr) {
    Py_CLEAR(*shape);
    return -1;
  }
  return 0;
}

bool exact_layout(PyObject* tensor, std::vector<int64_t>* layout, int* scalar_type) {
  c10::TensorImpl* impl = Py_TYPE(tensor) == g_tensor_type ? plain_impl(tensor) : nullptr;
  if (impl == nullptr) return false;
  try {
    c10::IntArrayRef sizes = impl->sizes();
    c10::IntArrayRef strides = impl->strides();
    layout->assign(sizes.begin(), sizes.end());
    layout->insert(layout->end(), strides.begin(), strides.end());
    *scalar_type = static_cast<int>(impl->dtype().toScalarType());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool exact_layout_is(PyObject* tensor, const std::vector<int64_t>& layout, int scalar_type) {
  c10::TensorImpl* impl = Py_TYPE(tensor) == g_tensor_type ? plain_impl(tensor) : nullptr;
  if (impl == nullptr) return false;
  try {
    c10::IntArrayRef sizes = impl->sizes();
    c10::IntArrayRef strides = impl->strides();
    const size_t dim = sizes.size();
    if (layout.size() != 2 * dim || static_cast<int>(impl->dtype().toScalarType()) != scalar_type) return false;
    for (size_t i = 0; i < dim; ++i) {
      if (layout[i] != sizes[i] || layout[dim + i] != strides[i]) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int host_tensor_matches(PyObject* tensor, PyObject* shape, PyObject* stride, long long offset, const char* device,
                        long long index, int requires_grad) {
  c10::TensorImpl* impl = PyTuple_Check(shape) && PyTuple_Check(stride) ? plain_impl(tensor) : nullptr;
  if (impl == nullptr) return -1;
  try {
    if (impl->storage_offset() != offset || impl->requires_grad() != (requires_grad != 0) ||
        !same_ints(impl->sizes(), shape) || !same_ints(impl->strides(), stride)) {
      return 0;
    }
    c10::Device d = impl->device();
    return c10::DeviceTypeName(d.type(), true) == device && (d.has_index() ? d.index() : -1) == index ? 1 : 0;
  } catch (const std::exception&) {
    return -1;
  }
}

void* host_scalar(PyObject* tensor, int* kind) {
  c10::TensorImpl* impl = plain_impl(tensor);
  if (impl == nullptr || Py_TYPE(tensor) != g_tensor_type) return nullptr;
  try {
    if (!impl->device().is_cpu() || impl->numel() != 1 || impl->requires_grad() || impl->is_inference() ||
        !impl->has_storage() || impl->key_set().has(c10::DispatchKey::Conjugate) ||
        impl->key_set().has(c10::DispatchKey::Negative)) {
      return nullptr;
    }
    caffe2::TypeMeta dtype = impl->dtype();
    *kind = dtype == caffe2::TypeMeta::Make<float>() ? 0 : dtype == caffe2::TypeMeta::Make<double>() ? 1
          : dtype == caffe2::TypeMeta::Make<int64_t>() ? 2 : -1;
    return *kind < 0 ? nullptr : const_cast<void*>(impl->data());
  } catch (const std::exception&) {
    return nullptr;
  }
}

void bump_version(PyObject* tensor) {
  c10::TensorImpl* impl = plain_impl(tensor);
  if (impl == nullptr) return;
  try {
    impl->bump_version();
  } catch (const std::exception&) {  // host_scalar refused inference tensors, the ones without a version counter
  }
}

void* tensor_data(PyObject* tensor) {
  c10::TensorImpl* impl = impl_of(tensor);
  if (impl == nullptr) return nullptr;
  try {
    return const_cast<void*>(impl->data());
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "lazy: could not read a tensor's data pointer: %s", e.what());
    return nullptr;
  }
}

namespace {

// Whether weak references to ``obj`` exist. A type's weak-reference list sits at tp_weaklistoffset: a positive offset,
// or on Python 3.12+ a negative one where the interpreter manages it (Py_TPFLAGS_MANAGED_WEAKREF: before the object,
// as CPython's own _PyObject_GET_WEAKREFS_LISTPTR reads it); 0 where the type takes none.
bool has_weakrefs(PyObject* obj) {
  const Py_ssize_t at = Py_TYPE(obj)->tp_weaklistoffset;
  return at != 0 && *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + at) != nullptr;
}

// The weak count of an intrusive_ptr target (raw::weak_intrusive_ptr::use_count answers its strong count).
template <class T>
uint32_t weak_count(T* target) {
  auto ptr = c10::intrusive_ptr<T>::reclaim(target);
  uint32_t n = ptr.weak_use_count();
  ptr.release();
  return n;
}

}  // namespace

int tensor_unshared(PyObject* tensor, PyObject* shape) {
  if (g_tensor_type == nullptr || Py_TYPE(tensor) != g_tensor_type || Py_REFCNT(tensor) != 1 ||
      !PyTuple_Check(shape)) {
    return 0;
  }
  if (has_weakrefs(tensor)) return 0;
  c10::TensorImpl* impl = plain_impl(tensor);
  if (impl == nullptr || c10::raw::intrusive_ptr::use_count(impl) != 1 || weak_count(impl) != 1 ||
      !impl->has_storage() || impl->storage_offset() != 0 ||
      !impl->is_contiguous() || impl->requires_grad()) {
    return 0;
  }
  const c10::Storage& storage = impl->storage();
  c10::StorageImpl* st = storage.unsafeGetStorageImpl();
  if (st == nullptr || c10::raw::intrusive_ptr::use_count(st) != 1 || weak_count(st) != 1) {
    return 0;
  }
  if (!same_ints(impl->sizes(), shape)) return 0;
  return static_cast<size_t>(storage.nbytes()) == static_cast<size_t>(impl->numel()) * impl->itemsize() ? 1 : 0;
}

namespace {

// Where THPVariable keeps ``_backward_hooks`` and ``_post_accumulate_grad_hooks`` (the two words after its at::Tensor
// in torch 2.13), found by probe_hook_fields(); 0 until it has.
Py_ssize_t g_hooks_offset = 0;

}  // namespace

PyObject* probe_hook_fields(PyObject*, PyObject* tensor) {
  g_hooks_offset = 0;
  if (!g_direct || g_tensor_type == nullptr || !PyObject_TypeCheck(tensor, g_tensor_type)) Py_RETURN_FALSE;
  PyObject* hooks = PyObject_GetAttrString(tensor, "_backward_hooks");
  PyObject* post = hooks != nullptr ? PyObject_GetAttrString(tensor, "_post_accumulate_grad_hooks") : nullptr;
  if (post == nullptr) {
    Py_XDECREF(hooks);
    return nullptr;
  }
  const Py_ssize_t at = static_cast<Py_ssize_t>(sizeof(PyObject) + sizeof(void*));
  PyObject** words = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(tensor) + at);
  const bool found = hooks != Py_None && post != Py_None && hooks != post && words[0] == hooks && words[1] == post;
  Py_DECREF(hooks);
  Py_DECREF(post);
  if (found) g_hooks_offset = at;
  return PyBool_FromLong(found);
}

bool grad_is(PyObject* owner, PyObject* value) {
  if (!g_direct) return false;
  try {
    const at::Tensor& grad = raw_impl(owner)->grad();  // a TensorImpl's object is its one Python object
    return grad.defined() && grad.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj() == value;
  } catch (const std::exception&) {
    return false;
  }
}

// Note [Reused gradient wrappers] (replay_io.cpp) says why each test is needed.
PyObject* sole_grad(PyObject* owner, PyObject* out, PyObject* shape, PyObject* stride) {
  if (!g_direct || g_hooks_offset == 0 || Py_TYPE(out) != g_tensor_type) return nullptr;
  try {
    const at::Tensor& grad = raw_impl(owner)->grad();
    if (!grad.defined()) return nullptr;
    c10::TensorImpl* impl = grad.unsafeGetTensorImpl();
    PyObject* obj = impl->pyobj_slot()->load_pyobj();
    // Python: the one reference the TensorImpl holds while C++ holds it too; C++: the object's and the gradient's
    if (obj == nullptr || Py_REFCNT(obj) != 1 || raw_impl(obj) != impl || grad.use_count() != 2 ||
        grad.weak_use_count() != 1) {
      return nullptr;
    }
    if (has_weakrefs(obj)) return nullptr;
    PyObject** hooks = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + g_hooks_offset);
    if (hooks[0] != nullptr || hooks[1] != nullptr) return nullptr;
    // no autograd metadata: requires_grad False, no .grad, no hooks, not a view, no grad_fn, no forward grad
    if (impl->autograd_meta() != nullptr || impl->is_inference() || impl->version_counter().current_version() != 0 ||
        impl->is_conj() || impl->is_neg() || impl->has_symbolic_sizes_strides() || impl->layout() != c10::kStrided ||
        impl->device() != c10::Device(c10::DeviceType::Lazy, 0) || impl->storage_offset() != 0 ||
        impl->dtype() != raw_impl(out)->dtype() || !same_ints(impl->sizes(), shape) ||
        !same_ints(impl->strides(), stride) || !impl->has_storage()) {
      return nullptr;
    }
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    if (c10::raw::intrusive_ptr::use_count(storage) != 1 || weak_count(storage) != 1) return nullptr;
    return obj;
  } catch (const std::exception&) {
    return nullptr;
  }
}

PyObject* grad_holders(PyObject*, PyObject* owner) {
  if (!g_direct || g_tensor_type == nullptr || !PyObject_TypeCheck(owner, g_tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "grad_holders(tensor), after probe_layout found tensor objects readable");
    return nullptr;
  }
  const at::Tensor& grad = raw_impl(owner)->grad();
  if (!grad.defined()) Py_RETURN_NONE;
  PyObject* obj = grad.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  c10::StorageImpl* storage = grad.has_storage() ? grad.storage().unsafeGetStorageImpl() : nullptr;
  return Py_BuildValue("(nkkk)", obj != nullptr ? Py_REFCNT(obj) : Py_ssize_t{-1},
                       static_cast<unsigned long>(grad.use_count()), static_cast<unsigned long>(grad.weak_use_count()),
                       storage != nullptr ? static_cast<unsigned long>(c10::raw::intrusive_ptr::use_count(storage))
                                          : 0ul);
}

PyObject* share_storage_py(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "share_storage(view, base)");
    return nullptr;
  }
  if (g_tensor_type == nullptr || !PyObject_TypeCheck(args[0], g_tensor_type) ||
      !PyObject_TypeCheck(args[1], g_tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "share_storage(view, base) takes two tensors, after probe_layout(tensor, ...)");
    return nullptr;
  }
  if (share_storage(args[0], args[1]) != 0) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace lazy
