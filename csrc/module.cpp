// lazy._C: the C parts of lazy (pybind11 module). Today: the recording hot path (record.cpp), the IR objects it
// creates (ir.cpp), the graph walk of every sync (graph.cpp) and views' storage sharing (alias.cpp). Hot entry
// points are plain CPython functions (METH_FASTCALL): pybind11's argument conversion would cost more than the work
// they do.
#include <pybind11/pybind11.h>

#include "alias.h"
#include "capture_guards.h"
#include "capture_hook.h"
#include "graph.h"
#include "ir.h"
#include "leaf_templates.h"
#include "outputs.h"
#include "record.h"
#include "replay_io.h"
#include "native_launch.h"
#include "runner.h"
#include "upload.h"

namespace py = pybind11;

namespace {

PyObject* live_storages(PyObject*, PyObject*) { return lazy::live_storages(); }
PyObject* pending_storages(PyObject*, PyObject*) { return lazy::pending_storages(); }

PyObject* next_node_serial(PyObject*, PyObject*) { return PyLong_FromLongLong(lazy::next_node_serial()); }

PyObject* signatures(PyObject*, PyObject*) {
  PyObject* table = lazy::signatures();
  Py_INCREF(table);
  return table;
}

#define FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn))

PyObject* set_data_op(PyObject*, PyObject* op) {
  lazy::set_data_op(op);
  Py_RETURN_NONE;
}

// add_counts(counts, (name, amount), ...): lazy/debug/metrics.py's counters, counts[name] += amount for each pair
// (0.0 + amount for a new name). In C each update is one step under the GIL, so counters bumped by the launch worker
// and by the calling thread need no lock (Python's ``d[k] += v`` can switch threads between its read and its write).
PyObject* add_counts(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  static PyObject* zero = PyFloat_FromDouble(0.0);
  if (nargs < 1 || !PyDict_Check(args[0]) || zero == nullptr) {
    PyErr_SetString(PyExc_TypeError, "add_counts(counts: dict, *pairs: (name, amount))");
    return nullptr;
  }
  for (Py_ssize_t i = 1; i < nargs; ++i) {
    if (!PyTuple_Check(args[i]) || PyTuple_GET_SIZE(args[i]) != 2) {
      PyErr_SetString(PyExc_TypeError, "add_counts: each pair is (name, amount)");
      return nullptr;
    }
    PyObject* name = PyTuple_GET_ITEM(args[i], 0);
    PyObject* old = PyDict_GetItemWithError(args[0], name);  // borrowed
    if (old == nullptr && PyErr_Occurred()) return nullptr;
    PyObject* sum = PyNumber_Add(old != nullptr ? old : zero, PyTuple_GET_ITEM(args[i], 1));
    if (sum == nullptr) return nullptr;
    int failed = PyDict_SetItem(args[0], name, sum);
    Py_DECREF(sum);
    if (failed) return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"set_data_op", set_data_op, METH_O, "Tell Node.is_data which op marks data leaves."},
    {"add_counts", FASTCALL(add_counts), METH_FASTCALL, "add_counts(counts, *pairs): counts[name] += amount."},
    {"torch_dispatch", FASTCALL(lazy::torch_dispatch), METH_FASTCALL | METH_KEYWORDS,
     "LazyTensor.__torch_dispatch__(cls, func, types, args=(), kwargs=None): record func (lazy/trace/dispatch.py)."},
    {"configure", FASTCALL(lazy::configure), METH_FASTCALL, "Hand the hot path the Python objects it uses."},
    {"register_op", FASTCALL(lazy::register_op), METH_FASTCALL,
     "register_op(func, desc, kinds, kw_kinds, kind, functional): record func in C once its call is memoized."},
    {"install_methods", FASTCALL(lazy::install_methods), METH_FASTCALL,
     "Give LazyTensor methods that record plain calls without the dispatcher."},
    {"plain_call", lazy::plain_call, METH_O, "Whether a call on this lazy tensor alone may skip the dispatcher."},
    {"clear_fast_cache", lazy::clear_fast_cache, METH_NOARGS, "Forget the fast path's signature cache."},
    {"set_fast_path", lazy::set_fast_path, METH_O, "Enable or disable the fast path."},
    {"traced_ops", lazy::traced_ops, METH_NOARGS, "How many ops reached the recorder."},
    {"bump_traced_ops", lazy::bump_traced_ops, METH_NOARGS, "Count one op that entered through the Lazy key."},
    {"reset_counters", lazy::reset_counters, METH_NOARGS, "Zero traced_ops and the fast-path statistics."},
    {"fast_path_stats", lazy::fast_path_stats, METH_NOARGS, "(hits, misses) of the fast path."},
    {"linearize", lazy::linearize, METH_O,
     "linearize(roots) -> (order, outputs, key, leaves, scalars): see lazy/ir/graph.py."},
    {"stale_inputs", FASTCALL(lazy::stale_inputs), METH_FASTCALL,
     "stale_inputs(leaves, static, seen) -> (dst, src): the inputs a CUDA-graph run copies (csrc/replay_io.cpp)."},
    {"leaves_unshared", lazy::leaves_unshared, METH_O,
     "leaves_unshared(pairs) -> (safe, keep): the reference check of a CUDA-graph replay (csrc/replay_io.cpp)."},
    {"new_tensors", FASTCALL(lazy::new_tensors), METH_FASTCALL,
     "new_tensors(descs, outs, indices, numels[, owners[, templates]]): new lazy tensors over data leaves of "
     "outs[indices[j]], or "
     "owners[j]'s gradient given that value where nothing else sees it (csrc/replay_io.cpp)."},
    {"error_history", FASTCALL(lazy::error_history), METH_FASTCALL,
     "error_history(tensor, message) -> tensor: a history whose backward raises message (csrc/alias.cpp)."},
    {"store_grad", FASTCALL(lazy::store_grad), METH_FASTCALL,
     "store_grad(owner, value): object.__setattr__(owner, 'grad', value) unless it holds value (csrc/replay_io.cpp)."},
    {"store_grads", FASTCALL(lazy::store_grads), METH_FASTCALL,
     "store_grads(owners, values): store_grad of each pair in order, in one call (csrc/replay_io.cpp)."},
    {"reused_grads", lazy::reused_grads, METH_NOARGS,
     "How many gradient wrappers new_tensors gave a new value instead of making a tensor (csrc/replay_io.cpp)."},
    {"grad_holders", lazy::grad_holders, METH_O,
     "grad_holders(tensor) -> (Python references, TensorImpl uses, weak uses, StorageImpl uses) of its gradient."},
    {"probe_hook_fields", lazy::probe_hook_fields, METH_O,
     "probe_hook_fields(tensor): read tensor objects' hook fields directly if tensor (both set) shows where."},
    {"pack_scalars", FASTCALL(lazy::pack_scalars), METH_FASTCALL,
     "pack_scalars(scalars, doubles, int64s): a graph's runtime scalars as its kernels read them."},
    {"make_runner", FASTCALL(lazy::make_runner), METH_FASTCALL,
     "make_runner(steps, num_buffers, include_raw, exclude_raw[, cuda_device, arena_bytes, arena_slots]) -> capsule: "
     "a program's plan for run_program (run_cuda_program with the cuda arguments)."},
    {"placeholders", FASTCALL(lazy::placeholders), METH_FASTCALL,
     "placeholders([(like, shape, stride), ...]) -> empty-storage tensors of those layouts (csrc/native_launch.cpp)."},
    {"adopt_outputs", FASTCALL(lazy::adopt_outputs), METH_FASTCALL,
     "adopt_outputs(placeholders, outputs) -> indices not adopted (another layout): set_ each to its output."},
    {"native_configure", FASTCALL(lazy::native_configure), METH_FASTCALL,
     "native_configure(omp_setter, mkl_setter): the thread-count setters of the launch thread (native_launch.cpp)."},
    {"native_submit", FASTCALL(lazy::native_submit), METH_FASTCALL,
     "native_submit(runner, pointers, scalars, values, forwards, lo, hi, epoch, threads, arena) -> job: "
     "a run queued on the launch thread (csrc/native_launch.cpp)."},
    {"native_done", lazy::native_done, METH_O, "native_done(job) -> whether the launch thread has run it."},
    {"native_wait", lazy::native_wait, METH_O, "native_wait(job): wait (without the GIL) until it has run."},
    {"native_threads", lazy::native_threads, METH_O, "native_threads(job) -> the threads it ran with (0: not yet)."},
    {"caller_threads", FASTCALL(lazy::caller_threads), METH_FASTCALL,
     "caller_threads(omp, mkl) -> the calling thread's (omp, mkl) counts before setting them (native_launch.cpp)."},
    {"native_finish", FASTCALL(lazy::native_finish), METH_FASTCALL,
     "native_finish(job, wanted) -> (error bits, [(id, tensor)]) or None (not run: an earlier job failed)."},
    {"run_program", FASTCALL(lazy::run_program), METH_FASTCALL,
     "run_program(runner, pointers, scalars, values, lo, hi, wanted) -> (error bits, [(id, tensor)]): a "
     "program's segments and extern calls without the GIL (csrc/runner.cpp)."},
    {"run_cuda_program", FASTCALL(lazy::run_cuda_program), METH_FASTCALL,
     "run_cuda_program(runner, scalars, values, stream, wanted) -> [(id, tensor)] or None (a value not 16-byte "
     "aligned: nothing ran): a Triton program's kernels and extern calls without the GIL (csrc/cuda_launch.cpp)."},
    {"upload", FASTCALL(lazy::upload), METH_FASTCALL,
     "upload(tensor, dtype_code, device_index) -> a cuda copy staged in pinned memory, or None (csrc/upload.cpp)."},
    {"upload_scalars", FASTCALL(lazy::upload_scalars), METH_FASTCALL,
     "upload_scalars(device_buffer, scalars, slots, num_floats): a program's scalars to device memory (upload.cpp)."},
    {"call_segment", FASTCALL(lazy::call_segment), METH_FASTCALL,
     "call_segment(function, pointers, doubles, int64s) -> int: a program segment called on addresses "
     "(csrc/graph.cpp)."},
    {"share_storage", FASTCALL(lazy::share_storage_py), METH_FASTCALL,
     "share_storage(view, base): the view's TensorImpl takes the base's C++ StorageImpl."},
    {"probe_layout", FASTCALL(lazy::probe_layout), METH_FASTCALL,
     "probe_layout(*tensors): read TensorImpl addresses directly if that agrees with tensor._cdata."},
    {"live_storages", live_storages, METH_NOARGS, "Every live Storage, oldest first."},
    {"pending_storages", pending_storages, METH_NOARGS,
     "The live Storages whose value is still IR (not data, not a failed value), oldest first."},
    {"next_node_serial", next_node_serial, METH_NOARGS, "The serial the next Node will get."},
    {"signatures", signatures, METH_NOARGS, "The table of interned node signatures."},
    {"guard_program", FASTCALL(lazy::guard_program), METH_FASTCALL,
     "guard_program(instructions, nregs, lazy_type, module_type[, outputs]): an entry's guards, or a replay's loads, "
     "as a C program (csrc/capture_guards.cpp)."},
    {"set_guard_memos", lazy::set_guard_memos, METH_O,
     "set_guard_memos(enabled): whether guard programs' loads reuse what they read while its dicts are unchanged "
     "(Note [Loads memoized by dict versions] in csrc/guard_reads.cpp); on by default."},
    {"set_guard_prefetch", lazy::set_guard_prefetch, METH_O,
     "set_guard_prefetch(enabled): whether guard programs prefetch what their last run read "
     "(csrc/guard_reads.cpp)."},
    {"bind_outputs", FASTCALL(lazy::bind_outputs), METH_FASTCALL,
     "bind_outputs(storages, outputs, start, templates): a sync's values bound to its storages (leaf_templates.cpp)."},
    {"data_leaf", lazy::data_leaf_py, METH_O,
     "data_leaf(tensor): a data leaf Node holding tensor (csrc/replay_io.cpp)."},
    {"replay_inputs", FASTCALL(lazy::replay_inputs), METH_FASTCALL,
     "replay_inputs(tensors, pending, miss) -> the data of each lazy tensor's storage (csrc/replay_io.cpp)."},
    {"host_steps", FASTCALL(lazy::host_steps), METH_FASTCALL,
     "host_steps(tensors, adds, values) -> list or None: step counters updated and read (csrc/replay_io.cpp)."},
    {"replay_writes", FASTCALL(lazy::replay_writes), METH_FASTCALL,
     "replay_writes(tensors, outs, indices[, templates]): bind outs[indices[j]] to tensors[j]'s storage; the number "
     "of new leaves (csrc/replay_io.cpp)."},
    {"leaf_templates", lazy::leaf_templates, METH_O,
     "leaf_templates(n): templates for the data leaves of n places of a replay (csrc/leaf_templates.cpp)."},
    {"take_buffers", FASTCALL(lazy::take_buffers), METH_FASTCALL,
     "take_buffers(allocs, spares, values, ptrs, empty): a program's fresh buffers, spares reused (csrc/outputs.cpp)."},
    {"capture_hook_supported", lazy::capture_hook_supported, METH_NOARGS,
     "Whether this CPython has lazy.compile's frame hook (3.11, 3.12)."},
    {"capture_hook_installed", lazy::capture_hook_installed, METH_NOARGS, "Whether the frame hook is installed now."},
    {"eval_frame_hooked", lazy::eval_frame_hooked, METH_NOARGS,
     "Whether a PEP 523 frame evaluation function is installed (a callee's arguments hold one more reference)."},
    {"capture_configure", lazy::capture_configure, METH_O, "capture_configure(run_plain): the handler's plain result."},
    {"capture_register", FASTCALL(lazy::capture_register), METH_FASTCALL,
     "capture_register(function, handler): the function's frames call handler(bound) (csrc/capture_hook.cpp)."},
    {"capture_unregister", lazy::capture_unregister, METH_O, "capture_unregister(function) -> whether it was."},
    {"capture_handler", lazy::capture_handler, METH_O, "capture_handler(function) -> its handler or None."},
    {"capture_call_plain", FASTCALL(lazy::capture_call_plain), METH_FASTCALL,
     "capture_call_plain(function, args, kwargs): a call whose frame the hook does not intercept."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "lazy's C parts: the recording hot path and the IR objects it creates";
  if (!lazy::init_ir_types() || !lazy::init_guard_types()) throw py::error_already_set();
  m.add_object("Node", py::handle(reinterpret_cast<PyObject*>(&lazy::NodeType)));
  m.add_object("Storage", py::handle(reinterpret_cast<PyObject*>(&lazy::StorageType)));
  if (PyModule_AddFunctions(m.ptr(), methods) != 0) throw py::error_already_set();
}
