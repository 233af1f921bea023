// The PEP 523 frame hook of lazy.compile (capture_hook.cpp).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace lazy {

// capture_hook_supported() -> bool: whether this CPython (3.11, 3.12) has the hook.
PyObject* capture_hook_supported(PyObject* self, PyObject* unused);

// capture_hook_installed() -> bool: whether the interpreter's frame evaluation function is the hook now.
PyObject* capture_hook_installed(PyObject* self, PyObject* unused);

// eval_frame_hooked() -> bool: whether any PEP 523 frame evaluation function (this hook, torch._dynamo's) is
// installed. CPython then calls Python functions through vectorcall, not inline, and a callee's arguments hold one
// more reference each while it runs (lazy/capture/lookaside.py's wrap_native counts references).
PyObject* eval_frame_hooked(PyObject* self, PyObject* unused);

// capture_configure(run_plain): the handler result that means "evaluate the frame normally".
PyObject* capture_configure(PyObject* self, PyObject* run_plain);

// capture_register(function, handler): frames of ``function`` call ``handler(bound)`` instead of running (Note
// [The frame hook] in capture_hook.cpp); the hook is installed while at least one function is registered.
PyObject* capture_register(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

// capture_unregister(function) -> bool: whether it was registered; frames of ``function`` run plainly again.
PyObject* capture_unregister(PyObject* self, PyObject* function);

// capture_handler(function) -> the handler registered for ``function``, or None.
PyObject* capture_handler(PyObject* self, PyObject* function);

// capture_call_plain(function, args, kwargs): ``function(*args, **kwargs)`` whose frame is not intercepted.
PyObject* capture_call_plain(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

}  // namespace lazy
