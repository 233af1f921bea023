// The recording hot path in C: LazyTensor.__torch_dispatch__ itself (see record.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// The __torch_dispatch__ classmethod body: (cls, func, types, args=(), kwargs=None).
PyObject* torch_dispatch(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

// configure(lazy_tensor_type, out_type, dtype_type, make_wrapper, device, layout, tensor_marker, scalar_markers,
//           memo, slow_dispatch, view_value, view_step_type, getitem_op, static_types): the Python objects the hot
//           path uses.
PyObject* configure(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// register_op(func, desc, kinds, kw_kinds, kind, functional): ``func`` is recorded as record_functional (kind 0),
// record_view (1) or record_inplace (2, recording ``functional``) would; ``kinds``/``kw_kinds``: the scalar kind
// of each positional / keyword-only argument.
PyObject* register_op(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// Drops every fast-path cache entry (the shape memo was cleared).
PyObject* clear_fast_cache(PyObject* self, PyObject* unused);

// Enables/disables the fast path (off while every traced op is logged).
PyObject* set_fast_path(PyObject* self, PyObject* enabled);

// The number of ops that reached the recorder; one more (ops entering through the Lazy key); zero it, the
// fast-path statistics and reused_grads.
PyObject* traced_ops(PyObject* self, PyObject* unused);
PyObject* bump_traced_ops(PyObject* self, PyObject* unused);
PyObject* reset_counters(PyObject* self, PyObject* unused);

// Fast-path statistics: (hits, misses) since the last reset.
PyObject* fast_path_stats(PyObject* self, PyObject* unused);

// install_methods(methods, guards, forward_ad): LazyTensor methods (operators such as __mul__, unary methods such as
// sin) that record their ATen call directly when the dispatcher would do nothing else (see record.cpp).
PyObject* install_methods(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// plain_call(x): whether a call on lazy tensor ``x`` alone may skip the dispatcher (the methods' test).
PyObject* plain_call(PyObject* self, PyObject* x);

// How many gradient wrappers replays reused since the last reset (Note [Reused gradient wrappers] in replay_io.cpp).
PyObject* reused_grads(PyObject* self, PyObject* unused);

}  // namespace lazy
