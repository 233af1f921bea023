// Lazy views share their base's C++ StorageImpl (alias.cpp), so ATen's own aliasing checks see what eager sees.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <vector>

namespace c10 {
struct TensorImpl;
}  // namespace c10

namespace lazy {

// The TensorImpl behind a torch.Tensor (its ``_cdata``, read from the object where probe_layout() allows), or NULL
// with a Python error set.
c10::TensorImpl* tensor_impl(PyObject* tensor);

// Make the TensorImpl of ``view`` (a LazyTensor just created) use the StorageImpl of ``base``'s. Returns 0, or -1
// with a Python error set.
int share_storage(PyObject* view, PyObject* base);

// probe_layout(*tensors): read TensorImpl addresses straight from tensor objects from now on if that gives
// tensor._cdata for every one of them; returns whether it does.
PyObject* probe_layout(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// Whether ``tensor`` (a torch.Tensor) requires grad, read from its TensorImpl: 1, 0, or -1 with a Python error set.
// (``tensor.requires_grad`` from Python goes through torch's attribute machinery: ~0.2 us; this is a load.)
int tensor_requires_grad(PyObject* tensor);

// Whether ``tensor`` (a torch.Tensor) has a gradient (``tensor.grad is not None``), read from its TensorImpl: 1, 0,
// or -1 with a Python error set. Python's ``tensor.grad`` may answer otherwise where a subclass or __torch_function__
// intercepts it: callers check that nothing does (Note [Gradients in guard programs] in guard_reads.cpp).
int tensor_grad_defined(PyObject* tensor);
// error_history(tensor, message) -> tensor: give a tensor without autograd history (a replay's new output) one whose
// backward raises RuntimeError(message), as eager's output whose graph a backward already freed does (autograd's
// Error node; Plan.backward_consumed in lazy/capture/finalize.py).
PyObject* error_history(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
// Whether a TorchFunctionMode is active on this thread (torch's test before ``tensor.grad`` calls the mode).
bool torch_function_mode_active();
// torch.is_grad_enabled() and torch.is_inference_mode_enabled(), read from c10's thread-local state as torch does.
bool grad_mode_enabled();
bool inference_mode_enabled();

// tuple(tensor.shape) and tuple(tensor.stride()) of a tensor with plain sizes and strides, read from its TensorImpl
// (any other tensor: through Python). Returns 0 with two new references, or -1 with a Python error set.
int tensor_layout(PyObject* tensor, PyObject** shape, PyObject** stride);

// The sizes then the strides of an exact torch.Tensor (no subclass) with plain sizes and strides, and its dtype's
// c10::ScalarType, into *layout and *scalar_type: true; false for any other tensor (never raises).
bool exact_layout(PyObject* tensor, std::vector<int64_t>* layout, int* scalar_type);
// Whether exact_layout(tensor) holds and gives ``layout`` and ``scalar_type`` (never raises).
bool exact_layout_is(PyObject* tensor, const std::vector<int64_t>& layout, int scalar_type);

// Whether a plain torch.Tensor has these sizes, strides, storage offset, device (type name as torch.device.type
// gives it, index or -1) and requires_grad: 1 or 0; -1 where it cannot tell from the TensorImpl (not a tensor, a
// Python subclass, symbolic sizes). Never raises.
int host_tensor_matches(PyObject* tensor, PyObject* shape, PyObject* stride, long long offset, const char* device,
                        long long index, int requires_grad);

// The data of a host step counter (an optimizer's ``state["step"]``): a plain torch.Tensor (no subclass) on the
// cpu with one element of float32, float64 or int64 (*kind 0, 1, 2), not requiring grad, not an inference tensor,
// no conjugate or negative view. NULL for any other tensor (never raises).
void* host_scalar(PyObject* tensor, int* kind);

// Counts an in-place update of a host_scalar tensor in its version counter, as ATen's in-place ops do.
void bump_version(PyObject* tensor);

// tensor.data_ptr() of a tensor with storage, or NULL with a Python error set (NULL without one: an empty tensor).
void* tensor_data(PyObject* tensor);

// Whether nothing but its one reference (the caller's container) can see ``tensor`` or its memory: a plain
// torch.Tensor whose Python object, TensorImpl and StorageImpl each have one reference and no weak ones, contiguous
// from offset 0 over all of its storage, with sizes ``shape`` (a tuple), not requiring grad. 1 or 0; never raises.
int tensor_unshared(PyObject* tensor, PyObject* shape);

// probe_hook_fields(tensor): read a tensor object's ``_backward_hooks`` and ``_post_accumulate_grad_hooks`` straight
// from it from now on if ``tensor`` (both set, to distinct objects) shows where they are; returns whether it does.
PyObject* probe_hook_fields(PyObject* self, PyObject* tensor);

// The Python object of ``owner``'s gradient (borrowed) if, on torch's side, nothing but ``owner`` can see it and it
// is what a new lazy tensor over ``out`` with sizes ``shape`` and strides ``stride`` (tuples) would be; else NULL.
// ``owner`` is a torch.Tensor (the caller checks). Never raises. Note [Reused gradient wrappers] in replay_io.cpp.
PyObject* sole_grad(PyObject* owner, PyObject* out, PyObject* shape, PyObject* stride);

// Whether ``owner``'s gradient is the tensor object ``value`` (``owner`` a torch.Tensor, the caller checks). Never
// raises; false where the layout is not known.
bool grad_is(PyObject* owner, PyObject* value);

// grad_holders(tensor) -> (Python references of its gradient's object, the gradient's TensorImpl use count and weak
// count, its StorageImpl's use count), or None without a gradient: what sole_grad reads, for tests.
PyObject* grad_holders(PyObject* self, PyObject* owner);

// share_storage(view, base) for Python (record.py's slow path).
PyObject* share_storage_py(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
