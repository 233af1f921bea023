// The PEP 523 frame hook of lazy.compile: a registered function's call runs its handler instead of its bytecode.
//
// Note [The frame hook]
// ``lazy.compile(fn)`` registers ``fn`` here and returns ``fn`` itself. While at least one function is registered,
// the interpreter's frame evaluation function (``_PyInterpreterState_SetEvalFrameFunc``, CPython 3.11 and 3.12) is
// ``hook``. Every frame passes through it; a frame whose code object carries no co_extra (the one pointer compare)
// goes straight on to the evaluation function that was installed before (``_PyEval_EvalFrameDefault``). A code
// object with a registered function carries, at lazy's code-extra index, a dict {function: handler}: registrations
// are keyed by the function object (the frame's f_func/f_funcobj), so two closures of one ``def`` keep their own
// captures, and an uncompiled closure of a compiled one's code runs plainly. For a registered frame the hook reads
// the argument locals (the first ``nargs`` slots of localsplus: positional, keyword-only, the *args tuple, the
// **kwargs dict: Note [Bound arguments] in lazy/capture/function.py), calls ``handler(bound)`` and either
// evaluates the frame normally (the handler returned RUN_PLAIN) or returns the handler's result (or its exception)
// without running the frame, which it then must dispose of:
// - 3.11: the caller (``_PyEval_Vector``) clears and pops the frame after the evaluation function returns, so the
//   hook returns the result and nothing else.
// - 3.12: the evaluation function clears and pops its frame itself (at RETURN_VALUE or when unwinding), so a frame
//   that is not evaluated is cleared and popped here (``drop_frame``), as CPython's ``clear_thread_frame`` does and
//   as torch/_dynamo's ``clear_old_frame_if_python_312_plus`` does. The frame was pushed and initialized by
//   ``_PyEvalFramePushAndInit`` and nothing else has seen it: it is not linked into the thread's frame chain yet
//   (``_PyEval_EvalFrameDefault`` links it), so no frame object can exist for it (checked before the handler runs)
//   and clearing is releasing its locals, function and code, then returning its space to the thread's data stack.
//   (Throwing an exception into the frame so that CPython unwinds it would also work, but it reports a throw, a
//   raise and an unwind to sys.monitoring and trace functions for a call that never ran.)
// Frames are evaluated normally, never intercepted, when: a trace or profile function is running (tstate->tracing),
// the frame belongs to a generator (lazy.compile refuses generator functions; their code is never registered), an
// exception is thrown into it, or it is a frame of the function ``capture_call_plain`` is running (a thread-local
// pointer, for the dynamic extent of that call: the plain run of a verification, Note [Verified replays], is the
// function as it runs uncompiled, its recursive calls included). Everything runs under the GIL; the only state not
// guarded by it is that thread-local pointer. A handler may call other registered functions, or its own recursively:
// each frame is decided on its own.
#include "capture_hook.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define LAZY_HAS_HOOK 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#if PY_VERSION_HEX >= 0x030C0000  // the names of 3.12 (the underscored ones are deprecated aliases there)
#define LAZY_GET_EXTRA PyUnstable_Code_GetExtra
#define LAZY_SET_EXTRA PyUnstable_Code_SetExtra
#define LAZY_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#else
#define LAZY_GET_EXTRA _PyCode_GetExtra
#define LAZY_SET_EXTRA _PyCode_SetExtra
#define LAZY_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#endif
#else
#define LAZY_HAS_HOOK 0
#endif

namespace lazy {

namespace {

PyObject* g_run_plain = nullptr;  // the handler result that means "evaluate the frame" (strong reference)
Py_ssize_t g_count = 0;           // registered functions

#if LAZY_HAS_HOOK

Py_ssize_t g_index = -1;  // lazy's code-extra index (the value there: a dict {function: handler})
_PyFrameEvalFunction g_previous = nullptr;  // the evaluation function the hook was installed over
thread_local PyObject* t_skip = nullptr;    // the function capture_call_plain is running plainly

void free_extra(void* extra) { Py_XDECREF(static_cast<PyObject*>(extra)); }

PyObject* frame_function(_PyInterpreterFrame* frame) {
#if PY_VERSION_HEX >= 0x030C0000
  return frame->f_funcobj;
#else
  return reinterpret_cast<PyObject*>(frame->f_func);
#endif
}

PyObject* eval_default(PyThreadState* ts, _PyInterpreterFrame* frame, int throw_flag) {
  if (g_previous != nullptr && g_previous != _PyEval_EvalFrameDefault) return g_previous(ts, frame, throw_flag);
  return _PyEval_EvalFrameDefault(ts, frame, throw_flag);
}

#if PY_VERSION_HEX >= 0x030C0000
// Clears and pops a frame that was pushed but never evaluated (3.12; see the Note): CPython's clear_thread_frame
// for a frame without a frame object.
void drop_frame(PyThreadState* ts, _PyInterpreterFrame* frame) {
  // Release what the frame holds before popping it: a finalizer run by a release pushes its frames above this one.
  for (int i = 0; i < frame->stacktop; ++i) Py_CLEAR(frame->localsplus[i]);
  frame->stacktop = 0;
  Py_CLEAR(frame->f_locals);
  Py_DECREF(frame->f_funcobj);
  Py_DECREF(frame->f_code);
  PyObject** base = reinterpret_cast<PyObject**>(frame);
  _PyStackChunk* chunk = ts->datastack_chunk;
  if (base == &chunk->data[0]) {  // the frame opened this chunk: return to the previous one and free it
    _PyStackChunk* previous = chunk->previous;
    ts->datastack_top = &previous->data[previous->top];
    ts->datastack_chunk = previous;
    ts->datastack_limit = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(previous) + previous->size);
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    arena.free(arena.ctx, chunk, chunk->size);
  } else {
    ts->datastack_top = base;
  }
}
#endif

// A frame whose code carries lazy's extra: intercept it if its function is registered.
PyObject* registered_frame(PyThreadState* ts, _PyInterpreterFrame* frame, int throw_flag) {
  void* extra = nullptr;
  PyCodeObject* code = frame->f_code;
  if (g_index >= 0 && LAZY_GET_EXTRA(reinterpret_cast<PyObject*>(code), g_index, &extra) != 0) {
    PyErr_Clear();  // (cannot happen: a code object and a valid index) never evaluate with an error set
    extra = nullptr;
  }
  if (extra == nullptr || throw_flag || frame->owner != FRAME_OWNED_BY_THREAD || frame->frame_obj != nullptr ||
      ts->tracing) {
    return eval_default(ts, frame, throw_flag);
  }
  PyObject* function = frame_function(frame);
  if (function == t_skip) return eval_default(ts, frame, throw_flag);
  PyObject* handler = PyDict_GetItemWithError(static_cast<PyObject*>(extra), function);
  if (handler == nullptr) {
    if (PyErr_Occurred()) PyErr_Clear();  // a function's hash cannot fail; run it plainly regardless
    return eval_default(ts, frame, throw_flag);
  }
  int flags = code->co_flags;
  Py_ssize_t nargs = code->co_argcount + code->co_kwonlyargcount + ((flags & CO_VARARGS) ? 1 : 0) +
                     ((flags & CO_VARKEYWORDS) ? 1 : 0);
  PyObject* bound = PyTuple_New(nargs);
  if (bound == nullptr) {  // out of memory: the call fails, as the frame would not have run either
#if PY_VERSION_HEX >= 0x030C0000
    drop_frame(ts, frame);
#endif
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* value = frame->localsplus[i];
    if (value == nullptr) {  // not an initialized call frame: never intercept what is not understood
      Py_DECREF(bound);
      return eval_default(ts, frame, throw_flag);
    }
    Py_INCREF(value);
    PyTuple_SET_ITEM(bound, i, value);
  }
  Py_INCREF(handler);  // a handler may unregister itself (lazy.compile.reset() inside the call)
  PyObject* result = PyObject_Vectorcall(handler, &bound, 1, nullptr);
  Py_DECREF(handler);
  Py_DECREF(bound);
  if (result == g_run_plain) {
    Py_DECREF(result);
    return eval_default(ts, frame, 0);
  }
#if PY_VERSION_HEX >= 0x030C0000
  drop_frame(ts, frame);
#endif
  return result;  // the call's result, or nullptr with the handler's exception set
}

PyObject* hook(PyThreadState* ts, _PyInterpreterFrame* frame, int throw_flag) {
  if (frame->f_code->co_extra == nullptr) return eval_default(ts, frame, throw_flag);
  return registered_frame(ts, frame, throw_flag);
}

void install() {
  PyInterpreterState* interp = PyThreadState_Get()->interp;
  _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
  if (current == hook) return;
  g_previous = current;
  _PyInterpreterState_SetEvalFrameFunc(interp, hook);
}

void uninstall() {
  PyInterpreterState* interp = PyThreadState_Get()->interp;
  // Another hook installed over this one keeps calling it as its previous function: leave that chain as it is.
  if (_PyInterpreterState_GetEvalFrameFunc(interp) != hook) return;
  _PyInterpreterState_SetEvalFrameFunc(interp, g_previous != nullptr ? g_previous : _PyEval_EvalFrameDefault);
}

// The registry dict of ``function``'s code, created when ``create``; borrowed; nullptr without an error if none.
PyObject* registry(PyObject* function, bool create) {
  if (!PyFunction_Check(function)) {
    PyErr_Format(PyExc_TypeError, "lazy.compile's frame hook registers Python functions, not %s",
                 Py_TYPE(function)->tp_name);
    return nullptr;
  }
  if (g_index < 0) {
    g_index = LAZY_EXTRA_INDEX(free_extra);
    if (g_index < 0) {
      PyErr_SetString(PyExc_RuntimeError, "lazy.compile: no code-extra index left for the frame hook");
      return nullptr;
    }
  }
  PyObject* code = PyFunction_GET_CODE(function);
  void* extra = nullptr;
  if (LAZY_GET_EXTRA(code, g_index, &extra) != 0) return nullptr;
  if (extra == nullptr && create) {
    PyObject* table = PyDict_New();
    if (table == nullptr) return nullptr;
    if (LAZY_SET_EXTRA(code, g_index, table) != 0) {
      Py_DECREF(table);
      return nullptr;
    }
    extra = table;  // the code object owns it (free_extra); emptied, never replaced, when unregistered
  }
  return static_cast<PyObject*>(extra);
}

#endif  // LAZY_HAS_HOOK

}  // namespace

PyObject* capture_hook_supported(PyObject*, PyObject*) { return PyBool_FromLong(LAZY_HAS_HOOK); }

PyObject* capture_hook_installed(PyObject*, PyObject*) {
#if LAZY_HAS_HOOK
  return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(PyThreadState_Get()->interp) == hook);
#else
  Py_RETURN_FALSE;
#endif
}

PyObject* eval_frame_hooked(PyObject*, PyObject*) {
  return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(PyThreadState_Get()->interp) !=
                         _PyEval_EvalFrameDefault);
}

PyObject* capture_configure(PyObject*, PyObject* run_plain) {
  Py_INCREF(run_plain);
  Py_XSETREF(g_run_plain, run_plain);
  Py_RETURN_NONE;
}

PyObject* capture_register(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "capture_register(function, handler)");
    return nullptr;
  }
#if LAZY_HAS_HOOK
  if (g_run_plain == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "capture_register before capture_configure");
    return nullptr;
  }
  PyObject* table = registry(args[0], true);
  if (table == nullptr) return nullptr;
  int known = PyDict_Contains(table, args[0]);
  if (known < 0 || PyDict_SetItem(table, args[0], args[1]) != 0) return nullptr;
  if (!known && g_count++ == 0) install();
  Py_RETURN_NONE;
#else
  (void)args;
  PyErr_SetString(PyExc_RuntimeError, "lazy.compile's frame hook needs CPython 3.11 or 3.12");
  return nullptr;
#endif
}

PyObject* capture_unregister(PyObject*, PyObject* function) {
#if LAZY_HAS_HOOK
  PyObject* table = registry(function, false);
  if (table == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_FALSE;
  }
  int known = PyDict_Contains(table, function);
  if (known < 0 || (known && PyDict_DelItem(table, function) != 0)) return nullptr;
  if (known && --g_count == 0) uninstall();
  return PyBool_FromLong(known);
#else
  (void)function;
  Py_RETURN_FALSE;
#endif
}

PyObject* capture_handler(PyObject*, PyObject* function) {
#if LAZY_HAS_HOOK
  if (!PyFunction_Check(function)) Py_RETURN_NONE;
  PyObject* table = registry(function, false);
  if (table == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  PyObject* handler = PyDict_GetItemWithError(table, function);
  if (handler == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  Py_INCREF(handler);
  return handler;
#else
  (void)function;
  Py_RETURN_NONE;
#endif
}

PyObject* capture_call_plain(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[1]) || !PyDict_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "capture_call_plain(function, args: tuple, kwargs: dict)");
    return nullptr;
  }
#if LAZY_HAS_HOOK
  PyObject* function = args[0];
  if (PyMethod_Check(function)) function = PyMethod_GET_FUNCTION(function);
  PyObject* saved = t_skip;
  t_skip = function;
  PyObject* result = PyObject_Call(args[0], args[1], args[2]);
  t_skip = saved;
  return result;
#else
  return PyObject_Call(args[0], args[1], args[2]);
#endif
}

}  // namespace lazy
