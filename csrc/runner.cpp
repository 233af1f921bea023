// Note [Programs run in C]
// A compiled cpu program alternates kernel segments (C entry points) with extern ATen calls (matmul, convolution,
// ...). Run from Python, every extern is a return to the interpreter, and on the asynchronous worker
// (lazy/sync/launch.py) every return waits for the GIL, which the recording thread holds: measured on 2 cores,
// ~20 us per handover against 0.2 us when nothing records meanwhile, tens per training step, each also stalling the
// recorder. So a program whose externs are all ATen operators with flat arguments runs here in one call with the
// GIL released: segments through their addresses, externs through the dispatcher (boxed, their arguments built
// from the plan lazy/runtime/cpp_native.py made at compile time: buffers, optionally as strided views, runtime
// scalars, constants, schema defaults), under the dispatch key sets of plain eager code (Note [Executing inside
// __torch_dispatch__]). Results are laid out as the Python runner lays them out (runtime/externs.py settle), and
// one that aliases the program's arena is copied out, as there. Python objects are touched only before and after:
// the buffers set before the run come in as a list (None or a tensor per buffer), the extern results the caller
// keeps go back as tensors (torch._C._wrap_tensor_impl); nothing here needs torch's Python headers.
#include "runner.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "alias.h"
#include "cuda_launch.h"
#include "graph.h"

namespace lazy {

namespace {

enum class Kind { Tensor, Scalar, Const, TensorList };

struct Operand {  // a buffer, read whole or as a strided view of it
  int64_t bid = -1;
  bool view = false;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
};

struct Arg {
  Kind kind = Kind::Const;
  Operand tensor;     // Tensor
  int64_t slot = -1;  // Scalar: the runtime scalar, read as double ('f'), int64 ('i') or bool ('b')
  char as = 'f';
  c10::IValue value;  // Const (or a schema default)
  std::vector<std::optional<Operand>> list;  // TensorList: its elements (nullopt: None)
  bool optional_elements = false;             // List[Optional[Tensor]] rather than List[Tensor]
};

struct Out {
  int64_t bid = -1;  // -1: a result the program drops
  bool strided = false;
  std::vector<int64_t> strides;
};

struct Step {
  void* segment = nullptr;  // a kernel segment, else a Triton kernel (cuda), else an extern
  std::optional<CudaLaunch> cuda;
  std::optional<c10::OperatorHandle> op;
  std::vector<Arg> args;
  std::vector<Out> outs;
  std::vector<int64_t> frees;
};

}  // namespace

struct Runner {  // declared in runner.h; its steps' types are this file's own
  std::vector<Step> steps;
  int64_t num_buffers = 0;
  c10::DispatchKeySet include, exclude;
  // a cuda program's (Note [Triton kernels launched in C] in cuda_launch.cpp): its device, and its kernel-only
  // temporaries at offsets of one arena allocated per run (Note [Temporaries in one allocation] in
  // runtime/triton.py)
  int device = -1;
  int64_t arena_bytes = 0;
  std::vector<std::pair<int64_t, int64_t>> arena_slots;
};

std::vector<int64_t> ints_of(PyObject* seq) {
  std::vector<int64_t> out;
  PyObject* fast = PySequence_Fast(seq, "lazy: expected a sequence of ints");
  if (fast == nullptr) throw std::runtime_error("lazy runner: expected a sequence of ints");
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    out.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i)));
  }
  Py_DECREF(fast);
  if (PyErr_Occurred()) throw std::runtime_error("lazy runner: expected ints");
  return out;
}

namespace {

const char* const kCapsule = "lazy.runner";

void destroy(PyObject* capsule) { delete static_cast<Runner*>(PyCapsule_GetPointer(capsule, kCapsule)); }

// A constant argument, tagged by the plan: ("n",) None, ("b", v), ("i", v), ("f", v), ("s", str), ("il", ints),
// ("fl", floats), ("bl", bools).
c10::IValue constant(PyObject* spec) {
  const char* tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
  std::string t = tag == nullptr ? "" : tag;
  PyObject* v = PyTuple_Size(spec) > 1 ? PyTuple_GET_ITEM(spec, 1) : nullptr;
  if (t == "n") return c10::IValue();
  if (t == "b") return c10::IValue(static_cast<bool>(PyObject_IsTrue(v)));
  if (t == "i") return c10::IValue(static_cast<int64_t>(PyLong_AsLongLong(v)));
  if (t == "f") return c10::IValue(PyFloat_AsDouble(v));
  if (t == "s") return c10::IValue(std::string(PyUnicode_AsUTF8(v)));
  if (t == "il") return c10::IValue(ints_of(v));
  if (t == "fl" || t == "bl") {
    PyObject* fast = PySequence_Fast(v, "lazy: expected a sequence");
    if (fast == nullptr) throw std::runtime_error("lazy runner: bad constant list");
    std::vector<double> ds;
    std::vector<bool> bs;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
      PyObject* x = PySequence_Fast_GET_ITEM(fast, i);
      if (t == "fl") ds.push_back(PyFloat_AsDouble(x));
      else bs.push_back(PyObject_IsTrue(x));
    }
    Py_DECREF(fast);
    if (t == "fl") return c10::IValue(ds);
    c10::List<bool> list;
    for (bool b : bs) list.push_back(b);
    return c10::IValue(list);
  }
  throw std::runtime_error("lazy runner: unknown constant tag " + t);
}

// A buffer argument: its id, and None or the (shape, strides, offset) of the view of it the call reads.
Operand operand(PyObject* bid, PyObject* view) {
  Operand o;
  o.bid = PyLong_AsLongLong(bid);
  if (view != Py_None) {
    o.view = true;
    o.shape = ints_of(PyTuple_GET_ITEM(view, 0));
    o.strides = ints_of(PyTuple_GET_ITEM(view, 1));
    o.offset = PyLong_AsLongLong(PyTuple_GET_ITEM(view, 2));
  }
  return o;
}

// One step of the plan: ("seg", address, frees) or ("ext", name, overload, args, outs, frees); an argument is
// ("t", buffer, view or None) with view = (shape, strides, offset), ("s", slot, 'f'|'i'|'b'), ("c", tagged
// constant) or ("d",) (the schema's default); an output is (buffer or -1, strides or None).
Step parse_step(PyObject* spec) {
  Step step;
  const char* kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
  if (kind != nullptr && std::string(kind) == "seg") {
    step.segment = PyLong_AsVoidPtr(PyTuple_GET_ITEM(spec, 1));
    step.frees = ints_of(PyTuple_GET_ITEM(spec, 2));
    return step;
  }
  if (kind != nullptr && std::string(kind) == "cu") {
    step.cuda = parse_cuda_launch(spec);
    step.frees = ints_of(PyTuple_GET_ITEM(spec, 8));
    return step;
  }
  const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 1));
  const char* overload = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 2));
  if (name == nullptr || overload == nullptr) throw std::runtime_error("lazy runner: bad operator name");
  step.op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  const auto& schema = step.op->schema();
  PyObject* args = PyTuple_GET_ITEM(spec, 3);
  if (static_cast<size_t>(PyTuple_Size(args)) != schema.arguments().size()) {
    throw std::runtime_error(std::string("lazy runner: argument count of ") + name);
  }
  for (Py_ssize_t i = 0; i < PyTuple_Size(args); ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    std::string tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a, 0));
    Arg arg;
    if (tag == "t") {
      arg.kind = Kind::Tensor;
      arg.tensor = operand(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(a, 2));
    } else if (tag == "tl") {
      arg.kind = Kind::TensorList;
      PyObject* items = PyTuple_GET_ITEM(a, 1);
      for (Py_ssize_t j = 0; j < PyTuple_Size(items); ++j) {
        PyObject* item = PyTuple_GET_ITEM(items, j);
        if (item == Py_None) {
          arg.list.emplace_back(std::nullopt);
          continue;
        }
        arg.list.emplace_back(operand(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)));
      }
      arg.optional_elements = PyObject_IsTrue(PyTuple_GET_ITEM(a, 2));
    } else if (tag == "s") {
      arg.kind = Kind::Scalar;
      arg.slot = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 1));
      arg.as = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a, 2))[0];
    } else if (tag == "c") {
      arg.value = constant(PyTuple_GET_ITEM(a, 1));
    } else {
      const auto& d = schema.arguments()[i].default_value();
      if (!d.has_value()) throw std::runtime_error(std::string("lazy runner: no default for an argument of ") + name);
      arg.value = *d;
    }
    step.args.push_back(std::move(arg));
  }
  PyObject* outs = PyTuple_GET_ITEM(spec, 4);
  for (Py_ssize_t i = 0; i < PyTuple_Size(outs); ++i) {
    PyObject* o = PyTuple_GET_ITEM(outs, i);
    Out out;
    out.bid = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 0));
    if (PyTuple_GET_ITEM(o, 1) != Py_None) {
      out.strided = true;
      out.strides = ints_of(PyTuple_GET_ITEM(o, 1));
    }
    step.outs.push_back(std::move(out));
  }
  step.frees = ints_of(PyTuple_GET_ITEM(spec, 5));
  if (PyErr_Occurred()) throw std::runtime_error("lazy runner: a malformed step");
  return step;
}

// runtime/externs.py settle: contiguous, or the planned strides.
at::Tensor settle(const at::Tensor& t, const Out& out) {
  if (!out.strided) return t.is_contiguous() ? t : t.contiguous();
  if (t.strides().equals(out.strides)) return t;
  at::Tensor placed = t.new_empty_strided(t.sizes(), out.strides);
  placed.copy_(t);
  return placed;
}

// Runs the steps; returns the error bits of the first segment that reported any (0: none). Throws on ATen errors.
// With ``graveyard``, a freed buffer moves there instead of being dropped (its last reference is then dropped where
// the caller holds the GIL: Note [Launches on a C thread] in native_launch.cpp). A cuda program's kernels go on
// ``stream``.
int execute(const Runner& r, std::vector<at::Tensor>& vals, void** ptrs, const double* fs, const int64_t* is,
            uintptr_t lo, uintptr_t hi, std::vector<at::Tensor>* graveyard, void* stream) {
  c10::impl::ForceDispatchKeyGuard keys(r.include, r.exclude);
  std::optional<c10::DeviceGuard> on_device;
  at::Tensor arena;  // released at the run's end, stream-ordered as every cuda allocation
  if (r.device >= 0) {
    on_device.emplace(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(r.device)));
    enter_cuda(r.device);
    if (r.arena_bytes > 0) {
      arena = at::empty({r.arena_bytes}, at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::CUDA,
                                                                                      r.device));
      char* base = static_cast<char*>(arena.data_ptr());
      for (const auto& [bid, offset] : r.arena_slots) ptrs[bid] = base + offset;
    }
  }
  using Segment = int (*)(void**, const double*, const int64_t*);
  std::vector<c10::IValue> stack;
  auto read = [&](const Operand& o) {
    const at::Tensor& t = vals[o.bid];
    return o.view ? t.as_strided(o.shape, o.strides, t.storage_offset() + o.offset) : t;
  };
  for (const Step& step : r.steps) {
    if (step.cuda) {
      launch_cuda(*step.cuda, r.device, vals, ptrs, fs, is, stream);
    } else if (step.segment != nullptr) {
      int err = reinterpret_cast<Segment>(step.segment)(ptrs, fs, is);
      if (err) return err;
    } else {
      stack.clear();
      for (const Arg& a : step.args) {
        switch (a.kind) {
          case Kind::Tensor:
            stack.emplace_back(read(a.tensor));
            break;
          case Kind::Scalar:
            if (a.as == 'f') stack.emplace_back(fs[a.slot]);
            else if (a.as == 'b') stack.emplace_back(is[a.slot] != 0);
            else stack.emplace_back(is[a.slot]);
            break;
          case Kind::Const:
            stack.push_back(a.value);
            break;
          case Kind::TensorList: {
            if (a.optional_elements) {
              c10::List<std::optional<at::Tensor>> list;
              for (const auto& o : a.list) list.push_back(o ? std::optional<at::Tensor>(read(*o)) : std::nullopt);
              stack.emplace_back(std::move(list));
            } else {
              c10::List<at::Tensor> list;
              for (const auto& o : a.list) list.push_back(read(*o));
              stack.emplace_back(std::move(list));
            }
            break;
          }
        }
      }
      step.op->callBoxed(&stack);
      for (size_t k = 0; k < step.outs.size() && k < stack.size(); ++k) {
        const Out& out = step.outs[k];
        if (out.bid < 0) continue;
        at::Tensor t = settle(stack[k].toTensor(), out);
        uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
        if (lo <= p && p < hi) t = t.clone();  // a view of an arena buffer: later kernels overwrite it
        // kernels are compiled for 16-byte aligned buffers (Note [Pre-bound launches] in runtime/triton.py)
        if (r.device >= 0 && p % 16 != 0) t = t.clone();
        ptrs[out.bid] = t.data_ptr();
        vals[out.bid] = std::move(t);
      }
    }
    for (int64_t i : step.frees) {
      if (graveyard != nullptr && vals[i].defined()) graveyard->push_back(std::move(vals[i]));
      vals[i] = at::Tensor();
    }
  }
  return 0;
}

}  // namespace

PyObject* make_runner(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 && nargs != 7) {
    PyErr_SetString(PyExc_TypeError,
                    "make_runner(steps, num_buffers, include_raw, exclude_raw[, cuda_device, arena_bytes, arena_slots])");
    return nullptr;
  }
  auto* r = new Runner();
  try {
    PyObject* steps = args[0];
    for (Py_ssize_t i = 0; i < PyList_Size(steps); ++i) r->steps.push_back(parse_step(PyList_GET_ITEM(steps, i)));
    r->num_buffers = PyLong_AsLongLong(args[1]);
    r->include = c10::DispatchKeySet(c10::DispatchKeySet::RAW, PyLong_AsUnsignedLongLong(args[2]));
    r->exclude = c10::DispatchKeySet(c10::DispatchKeySet::RAW, PyLong_AsUnsignedLongLong(args[3]));
    if (nargs == 7) {
      r->device = static_cast<int>(PyLong_AsLong(args[4]));
      r->arena_bytes = PyLong_AsLongLong(args[5]);
      for (Py_ssize_t i = 0; i < PyList_Size(args[6]); ++i) {
        PyObject* slot = PyList_GET_ITEM(args[6], i);
        r->arena_slots.emplace_back(PyLong_AsLongLong(PyTuple_GET_ITEM(slot, 0)),
                                    PyLong_AsLongLong(PyTuple_GET_ITEM(slot, 1)));
      }
    }
    if (PyErr_Occurred()) throw std::runtime_error("lazy runner: bad arguments");
  } catch (const std::exception& e) {
    delete r;
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  return PyCapsule_New(r, kCapsule, destroy);
}

PyObject* wrap(const at::Tensor& t) {
  static PyObject* wrap_impl = nullptr;
  if (wrap_impl == nullptr) {
    PyObject* mod = PyImport_ImportModule("torch._C");
    if (mod == nullptr) return nullptr;
    wrap_impl = PyObject_GetAttrString(mod, "_wrap_tensor_impl");
    Py_DECREF(mod);
    if (wrap_impl == nullptr) return nullptr;
  }
  // torch's binding takes the TensorImpl* as a capsule (pybind11's void*), unnamed as _tensor_impl_raw_handle's
  PyObject* address = PyCapsule_New(t.unsafeGetTensorImpl(), nullptr, nullptr);
  if (address == nullptr) return nullptr;
  PyObject* out = PyObject_CallOneArg(wrap_impl, address);
  Py_DECREF(address);
  return out;
}

at::Tensor tensor_of(PyObject* tensor) {
  c10::TensorImpl* impl = tensor_impl(tensor);
  if (impl == nullptr) return at::Tensor();
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
}

Runner* runner_of(PyObject* capsule) { return static_cast<Runner*>(PyCapsule_GetPointer(capsule, kCapsule)); }

int64_t runner_buffers(const Runner& r) { return r.num_buffers; }

// Note [Addresses from the values]
// A run's pointer array holds every buffer's address. The arena's temporaries are set once per arena; the
// leaves, the outputs taken before the run and the arena views externs read are tensors in ``values``, and their
// addresses are read here, in the loop that takes their TensorImpls, rather than by a ``data_ptr()`` attribute
// call each in Python (a GPT step's program has 50 leaves and ~60 taken outputs: launched, its preparation took 41
// us of the calling thread's time against 57 with the addresses, the buffer pairs and the scalars in Python, on an
// AMD EPYC core). A placeholder a launched job forwards (native_launch.cpp) gets its static address here and
// the producing job's output's when the job starts.
bool set_values(const Runner& r, PyObject* values, std::vector<at::Tensor>& vals, void** ptrs) {
  if (!PyList_Check(values) || PyList_GET_SIZE(values) != r.num_buffers) {
    PyErr_SetString(PyExc_ValueError, "lazy runner: values must be a list of one entry (None or a tensor) per buffer");
    return false;
  }
  for (Py_ssize_t bid = 0; bid < r.num_buffers; ++bid) {
    PyObject* item = PyList_GET_ITEM(values, bid);
    if (item == Py_None) continue;
    at::Tensor t = tensor_of(item);
    if (!t.defined()) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "lazy runner: a value is not a tensor");
      return false;
    }
    // Note [Addresses from the values]
    try {
      ptrs[bid] = const_cast<void*>(t.const_data_ptr());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
      return false;
    }
    vals[bid] = std::move(t);
  }
  return true;
}

int execute_guarded(const Runner& r, std::vector<at::Tensor>& vals, void** ptrs, const double* fs, const int64_t* is,
                    uintptr_t lo, uintptr_t hi, std::vector<at::Tensor>* graveyard, Failure* failure, void* stream) {
  try {
    return execute(r, vals, ptrs, fs, is, lo, hi, graveyard, stream);
  } catch (const c10::LinAlgError& e) {
    *failure = {PyExc_RuntimeError, e.what_without_backtrace(), "_LinAlgError"};
  } catch (const c10::OutOfMemoryError& e) {
    *failure = {PyExc_RuntimeError, e.what_without_backtrace(), "OutOfMemoryError"};
  } catch (const c10::IndexError& e) {
    *failure = {PyExc_IndexError, e.what_without_backtrace(), nullptr};
  } catch (const c10::ValueError& e) {
    *failure = {PyExc_ValueError, e.what_without_backtrace(), nullptr};
  } catch (const c10::TypeError& e) {
    *failure = {PyExc_TypeError, e.what_without_backtrace(), nullptr};
  } catch (const c10::NotImplementedError& e) {
    *failure = {PyExc_NotImplementedError, e.what_without_backtrace(), nullptr};
  } catch (const c10::Error& e) {
    *failure = {PyExc_RuntimeError, e.what_without_backtrace(), nullptr};
  } catch (const std::exception& e) {
    *failure = {PyExc_RuntimeError, e.what(), nullptr};
  }
  return 0;
}

PyObject* raise_failure(const Failure& failure) {
  PyObject* mod = failure.torch_type != nullptr ? PyImport_ImportModule("torch._C") : nullptr;
  PyObject* torch_type = mod != nullptr ? PyObject_GetAttrString(mod, failure.torch_type) : nullptr;
  PyErr_Clear();
  PyErr_SetString(torch_type != nullptr ? torch_type : failure.type, failure.message.c_str());
  Py_XDECREF(torch_type);
  Py_XDECREF(mod);
  return nullptr;
}

PyObject* results_of(const Runner& r, const std::vector<at::Tensor>& vals, PyObject* wanted) {
  PyObject* results = PyList_New(0);
  if (results == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_Size(wanted); ++i) {
    PyObject* id = PyTuple_GET_ITEM(wanted, i);
    int64_t bid = PyLong_AsLongLong(id);
    if (bid < 0 || bid >= r.num_buffers || !vals[bid].defined()) continue;
    PyObject* t = wrap(vals[bid]);
    if (t == nullptr) {
      Py_DECREF(results);
      return nullptr;
    }
    PyObject* pair = PyTuple_Pack(2, id, t);
    Py_DECREF(t);
    if (pair == nullptr || PyList_Append(results, pair) < 0) {
      Py_XDECREF(pair);
      Py_DECREF(results);
      return nullptr;
    }
    Py_DECREF(pair);
  }
  return results;
}

namespace {

// The run without the GIL, then its failure raised or the (id, tensor) pairs of ``wanted``; ``*err`` the
// segments' error bits.
PyObject* run_collect(const Runner& r, std::vector<at::Tensor>& vals, void** ptrs, const std::vector<double>& fs,
                      const std::vector<int64_t>& is, uintptr_t lo, uintptr_t hi, void* stream, PyObject* wanted,
                      int* err) {
  Failure failure;
  Py_BEGIN_ALLOW_THREADS
  *err = execute_guarded(r, vals, ptrs, fs.data(), is.data(), lo, hi, nullptr, &failure, stream);
  Py_END_ALLOW_THREADS
  if (failure.type != nullptr) return raise_failure(failure);
  PyObject* results = results_of(r, vals, wanted);
  {
    // the tensors Python holds lose the references taken above with the GIL held (a TensorImpl whose last reference
    // goes may free a Python object)
    std::vector<at::Tensor> drop = std::move(vals);
  }
  return results;
}

}  // namespace

PyObject* run_program(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "run_program(runner, pointers, scalars, values, arena_lo, arena_hi, wanted)");
    return nullptr;
  }
  Runner* r = runner_of(args[0]);
  if (r == nullptr) return nullptr;
  void** ptrs = static_cast<void**>(PyLong_AsVoidPtr(args[1]));
  uintptr_t lo = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(args[4]));
  uintptr_t hi = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(args[5]));
  if (PyErr_Occurred()) return nullptr;
  if (ptrs == nullptr) {
    PyErr_SetString(PyExc_ValueError, "run_program: no pointer array");
    return nullptr;
  }
  std::vector<double> fs;
  std::vector<int64_t> is;
  if (!pack_sequence(args[2], &fs, &is, "run_program: scalars must be a sequence")) return nullptr;
  std::vector<at::Tensor> vals(r->num_buffers);
  if (!set_values(*r, args[3], vals, ptrs)) return nullptr;
  int err = 0;
  PyObject* results = run_collect(*r, vals, ptrs, fs, is, lo, hi, nullptr, args[6], &err);
  if (results == nullptr) return nullptr;
  return Py_BuildValue("(iN)", err, results);
}

PyObject* run_cuda_program(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "run_cuda_program(runner, scalars, values, stream, wanted)");
    return nullptr;
  }
  Runner* r = runner_of(args[0]);
  if (r == nullptr) return nullptr;
  if (r->device < 0) {
    PyErr_SetString(PyExc_ValueError, "run_cuda_program: not a cuda program's runner");
    return nullptr;
  }
  void* stream = PyLong_AsVoidPtr(args[3]);
  if (PyErr_Occurred()) return nullptr;
  std::vector<double> fs;
  std::vector<int64_t> is;
  if (!pack_sequence(args[1], &fs, &is, "run_cuda_program: scalars must be a sequence")) return nullptr;
  std::vector<at::Tensor> vals(r->num_buffers);
  std::vector<void*> ptrs(r->num_buffers, nullptr);
  if (!set_values(*r, args[2], vals, ptrs.data())) return nullptr;
  for (int64_t bid = 0; bid < r->num_buffers; ++bid) {
    if (vals[bid].defined() && reinterpret_cast<uintptr_t>(ptrs[bid]) % 16 != 0) Py_RETURN_NONE;
  }
  int err = 0;
  return run_collect(*r, vals, ptrs.data(), fs, is, 0, 0, stream, args[4], &err);
}

}  // namespace lazy
