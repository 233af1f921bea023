// Note [Launches on a C thread]
// An asynchronous mark_step (lazy/sync/launch.py) hands its program to a worker while the calling thread records the
// next step. A Python worker needs the GIL to pick a program up and again to settle it after its kernels, and the
// recorder holds the GIL nearly all the time: measured on 2 cores (AMD EPYC, a GPT step's program of 0.35 ms), the
// worker waited a switch interval for each, and the handovers cost the recorder as much time as the program ran
// (a step of 1.6 ms recording and 0.35 ms run took 2.0 ms launched, as long as in place). A program that runs in C
// (Note [Programs run in C] in runner.cpp) therefore launches onto a C++ thread that never takes the GIL: the calling
// thread prepares the run (its buffers, pointers and scalars, copied into the job), the thread runs it, and the
// calling thread settles it (its results as tensors) when it next needs them. Leaves that a job in flight produces
// are forwarded: the job reads the earlier job's output when it starts (jobs run in launch order). A job keeps every
// tensor it touched until the calling thread drops it, with the GIL held (a TensorImpl's last reference may free a
// Python object), and the thread drops its own reference to a job before it marks it done. A job whose epoch is at
// most that of a failed one does not run (it may read the failed one's outputs): as the Python worker does.
#include "native_launch.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "graph.h"
#include "runner.h"

namespace lazy {

namespace {

struct Job {
  PyObject* runner_capsule = nullptr;  // strong; dropped with the job, GIL held
  const Runner* runner = nullptr;
  std::vector<at::Tensor> vals;
  std::vector<void*> ptrs;
  std::vector<double> fs;
  std::vector<int64_t> is;
  uintptr_t lo = 0, hi = 0;
  long long epoch = 0;
  int threads = 1;       // OpenMP/MKL threads it runs with (Note [Thread budget of the worker])
  int used_threads = 0;  // what it ran with
  std::vector<std::pair<int64_t, std::pair<std::shared_ptr<Job>, int64_t>>> forwards;  // bid <- (job, its bid)
  std::vector<at::Tensor> graveyard;  // buffers the run freed, and memory its pointers reach: dropped with the job
  // results, written by the thread before ``done``
  int err = 0;
  Failure failure;
  bool poisoned = false;  // not run: an earlier job of its epoch failed
  bool failed = false;
  bool done = false;  // under g_mutex
  ~Job() { Py_XDECREF(runner_capsule); }
};

// Never destroyed: the launch thread waits on them until the process ends (a static's destructor at exit would
// block on a condition variable the thread is waiting on).
std::mutex& g_mutex = *new std::mutex();
std::condition_variable& g_work = *new std::condition_variable();  // a job was queued
std::condition_variable& g_done = *new std::condition_variable();  // a job is done
std::deque<std::shared_ptr<Job>>* g_queue = nullptr;
long long g_failed_epoch = -1;  // under g_mutex
pid_t g_pid = 0;
void (*g_omp_set)(int) = nullptr;
int (*g_mkl_set)(int) = nullptr;  // MKL_Set_Num_Threads_Local: returns the calling thread's previous setting

const char* const kJob = "lazy.native_job";

void serve(std::deque<std::shared_ptr<Job>>* queue) {
  at::init_num_threads();  // ATen's once-per-thread setup first, so it cannot undo the counts set below
  int threads = 0;
  while (true) {
    std::shared_ptr<Job> job;
    long long failed_epoch;
    {
      std::unique_lock<std::mutex> lock(g_mutex);
      g_work.wait(lock, [&] { return !queue->empty(); });
      job = std::move(queue->front());
      queue->pop_front();
      failed_epoch = g_failed_epoch;
    }
    Job& j = *job;
    if (j.epoch <= failed_epoch) {
      j.poisoned = true;
    } else {
      for (auto& [bid, source] : j.forwards) {
        const Job& src = *source.first;
        if (src.failed || src.poisoned || !src.vals[source.second].defined()) {
          j.poisoned = true;
          break;
        }
        j.vals[bid] = src.vals[source.second];
        j.ptrs[bid] = j.vals[bid].data_ptr();
      }
      if (!j.poisoned) {
        const int want = j.threads;
        if (want != threads) {  // Note [Thread budget of the worker] in lazy/sync/launch.py
          if (g_omp_set != nullptr) g_omp_set(want);
          if (g_mkl_set != nullptr) g_mkl_set(want);
          threads = want;
        }
        j.used_threads = want;
        j.err = execute_guarded(*j.runner, j.vals, j.ptrs.data(), j.fs.data(), j.is.data(), j.lo, j.hi,
                                &j.graveyard, &j.failure);
        j.failed = j.failure.type != nullptr || j.err != 0;
      }
    }
    Job* raw = job.get();
    job.reset();  // the calling thread holds the job until it has settled it: never the last reference here
    std::lock_guard<std::mutex> lock(g_mutex);
    if (raw->failed || raw->poisoned) g_failed_epoch = std::max(g_failed_epoch, raw->epoch);
    raw->done = true;
    g_done.notify_all();
  }
}

// The queue the thread serves, started on first use (again in a forked child, which has no such thread).
std::deque<std::shared_ptr<Job>>* queue() {
  if (g_queue == nullptr || g_pid != getpid()) {
    g_queue = new std::deque<std::shared_ptr<Job>>();  // a forked child's copy of the old one is left alone
    g_pid = getpid();
    g_failed_epoch = -1;
    std::thread(serve, g_queue).detach();
  }
  return g_queue;
}

std::shared_ptr<Job>* job_of(PyObject* capsule) {
  return static_cast<std::shared_ptr<Job>*>(PyCapsule_GetPointer(capsule, kJob));
}

void wait_done(Job& j) {
  Py_BEGIN_ALLOW_THREADS
  {
    std::unique_lock<std::mutex> lock(g_mutex);
    g_done.wait(lock, [&] { return j.done; });
  }
  Py_END_ALLOW_THREADS
}

void drop_job(PyObject* capsule) {
  auto* job = job_of(capsule);
  if (job == nullptr) {
    PyErr_Clear();
    return;
  }
  wait_done(**job);  // the thread's reference is gone once it is done: this one is dropped here, GIL held
  delete job;
}

}  // namespace

PyObject* native_configure(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "native_configure(omp_set_num_threads address, mkl setter address)");
    return nullptr;
  }
  g_omp_set = reinterpret_cast<void (*)(int)>(args[0] == Py_None ? nullptr : PyLong_AsVoidPtr(args[0]));
  g_mkl_set = reinterpret_cast<int (*)(int)>(args[1] == Py_None ? nullptr : PyLong_AsVoidPtr(args[1]));
  if (PyErr_Occurred()) return nullptr;
  Py_RETURN_NONE;
}

PyObject* native_submit(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10 || !PyList_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "native_submit(runner, pointers, scalars, values, forwards, arena_lo, arena_hi, "
                                     "epoch, threads, arena)");
    return nullptr;
  }
  Runner* r = runner_of(args[0]);
  if (r == nullptr) return nullptr;
  auto job = std::make_shared<Job>();
  job->runner = r;
  const int64_t n = runner_buffers(*r);
  void** ptrs = static_cast<void**>(PyLong_AsVoidPtr(args[1]));
  job->lo = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(args[5]));
  job->hi = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(args[6]));
  job->epoch = PyLong_AsLongLong(args[7]);
  job->threads = static_cast<int>(PyLong_AsLong(args[8]));
  if (PyErr_Occurred()) return nullptr;
  if (ptrs == nullptr || job->threads < 1) {
    PyErr_SetString(PyExc_ValueError, "native_submit: bad pointers or thread count");
    return nullptr;
  }
  if (!pack_sequence(args[2], &job->fs, &job->is, "native_submit: scalars must be a sequence")) return nullptr;
  job->ptrs.assign(ptrs, ptrs + n);
  job->vals.resize(n);
  if (!set_values(*r, args[3], job->vals, job->ptrs.data())) return nullptr;
  if (args[9] != Py_None) {  // the arena its pointers reach: alive until the job is dropped
    at::Tensor arena = tensor_of(args[9]);
    if (!arena.defined()) return nullptr;
    job->graveyard.push_back(std::move(arena));
  }
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(args[4]); ++k) {
    PyObject* f = PyList_GET_ITEM(args[4], k);
    auto* source = PyTuple_Check(f) && PyTuple_GET_SIZE(f) == 3 ? job_of(PyTuple_GET_ITEM(f, 1)) : nullptr;
    int64_t bid = source != nullptr ? PyLong_AsLongLong(PyTuple_GET_ITEM(f, 0)) : -1;
    int64_t from = source != nullptr ? PyLong_AsLongLong(PyTuple_GET_ITEM(f, 2)) : -1;
    if (source == nullptr || bid < 0 || bid >= n || from < 0 ||
        from >= static_cast<int64_t>((*source)->vals.size())) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "native_submit: a bad forward");
      return nullptr;
    }
    job->forwards.push_back({bid, {*source, from}});
  }
  job->runner_capsule = Py_NewRef(args[0]);
  auto* held = new std::shared_ptr<Job>(job);
  PyObject* capsule = PyCapsule_New(held, kJob, drop_job);
  if (capsule == nullptr) {
    delete held;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    queue()->push_back(std::move(job));
  }
  g_work.notify_one();
  return capsule;
}

PyObject* native_done(PyObject*, PyObject* capsule) {
  auto* job = job_of(capsule);
  if (job == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  return Py_NewRef((*job)->done ? Py_True : Py_False);
}

PyObject* native_threads(PyObject*, PyObject* capsule) {
  auto* job = job_of(capsule);
  if (job == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  return PyLong_FromLong((*job)->done ? (*job)->used_threads : 0);
}

PyObject* caller_threads(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "caller_threads(openmp count, mkl count)");
    return nullptr;
  }
  const int omp = static_cast<int>(PyLong_AsLong(args[0]));
  const int mkl = static_cast<int>(PyLong_AsLong(args[1]));
  if (PyErr_Occurred()) return nullptr;
  if (omp < 1 || mkl < 0) {
    PyErr_SetString(PyExc_ValueError, "caller_threads: counts must be >= 1 (OpenMP) and >= 0 (MKL)");
    return nullptr;
  }
  const int omp_before = at::get_num_threads();  // omp_get_max_threads() of this thread, where ATen uses OpenMP
  int mkl_before = 0;
  if (g_omp_set != nullptr) g_omp_set(omp);
  if (g_mkl_set != nullptr) mkl_before = g_mkl_set(mkl);
  return Py_BuildValue("(ii)", omp_before, mkl_before);
}

PyObject* native_wait(PyObject*, PyObject* capsule) {
  auto* job = job_of(capsule);
  if (job == nullptr) return nullptr;
  wait_done(**job);
  Py_RETURN_NONE;
}

PyObject* native_finish(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "native_finish(job, wanted)");
    return nullptr;
  }
  auto* held = job_of(args[0]);
  if (held == nullptr) return nullptr;
  Job& j = **held;
  wait_done(j);
  if (j.poisoned) Py_RETURN_NONE;
  if (j.failure.type != nullptr) return raise_failure(j.failure);
  PyObject* results = results_of(*j.runner, j.vals, args[1]);
  if (results == nullptr) return nullptr;
  std::vector<at::Tensor> drop = std::move(j.graveyard);  // dropped here, GIL held
  return Py_BuildValue("(iN)", j.err, results);
}

// Note [Placeholders without the dispatcher]
// A launched GPT step makes and adopts 65 placeholders. Through ATen (new_empty, then set_ to the promised layout,
// which also resizes the empty storage to fit it: an allocation nothing reads) that took 57 us of the calling
// thread's ~420 us per step (AMD EPYC, 1 thread), and set_(output) at adoption 23 us. A cpu placeholder is a plain
// TensorImpl made here instead: like's dispatch keys and dtype, the promised sizes and strides, over a storage of
// zero bytes that nothing reads (readers wait for the adoption: Note [Asynchronous execution]; a later job reads
// the producing job's buffer, not the placeholder: Note [Launches on a C thread]); adopting an output of the same
// dtype, device and layout sets its storage, sizes, strides and offset on the TensorImpl and bumps the version, as
// set_ would. Outputs of another layout are left to Python, which copies.
// A plain tensor of the same dtype as ``like`` with these sizes and strides over an empty storage.
PyObject* placeholders(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "placeholders([(like, shape, stride), ...])");
    return nullptr;
  }
  PyObject* specs = args[0];
  PyObject* out = PyList_New(PyList_GET_SIZE(specs));
  if (out == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(specs); ++k) {
    PyObject* spec = PyList_GET_ITEM(specs, k);
    at::Tensor like = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 3 ? tensor_of(PyTuple_GET_ITEM(spec, 0))
                                                                        : at::Tensor();
    if (!like.defined()) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "placeholders: a bad spec");
      Py_DECREF(out);
      return nullptr;
    }
    std::vector<int64_t> shape, stride;
    for (int which = 1; which <= 2; ++which) {
      PyObject* seq = PyTuple_GET_ITEM(spec, which);
      auto& dst = which == 1 ? shape : stride;
      for (Py_ssize_t i = 0; PyTuple_Check(seq) && i < PyTuple_GET_SIZE(seq); ++i) {
        dst.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i)));
      }
    }
    if (PyErr_Occurred() || shape.size() != stride.size()) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "placeholders: shape and stride differ in length");
      Py_DECREF(out);
      return nullptr;
    }
    PyObject* t = nullptr;
    try {
      if (like.device().is_cpu()) {  // Note [Placeholders without the dispatcher]
        static char nothing = 0;  // what the empty storage points at: at::Tensor refuses a null one with elements
        c10::Storage empty(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(&nothing, like.device()), nullptr,
                           /*resizable=*/false);
        at::Tensor p(c10::make_intrusive<c10::TensorImpl>(std::move(empty), like.key_set(), like.dtype()));
        p.unsafeGetTensorImpl()->set_sizes_and_strides(shape, stride);
        t = wrap(p);
      } else {
        at::Tensor p = like.new_empty({0});
        p.set_(p.storage(), 0, shape, stride);
        t = wrap(p);
      }
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    if (t == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, k, t);
  }
  return out;
}

PyObject* adopt_outputs(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "adopt_outputs(placeholders, outputs), lists of one length");
    return nullptr;
  }
  PyObject* rest = PyList_New(0);
  if (rest == nullptr) return nullptr;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(args[0]); ++k) {
    at::Tensor p = tensor_of(PyList_GET_ITEM(args[0], k));
    at::Tensor o = p.defined() ? tensor_of(PyList_GET_ITEM(args[1], k)) : at::Tensor();
    if (!o.defined()) {
      Py_DECREF(rest);
      return nullptr;
    }
    const bool same = p.dtype() == o.dtype() && p.sizes().equals(o.sizes()) && p.strides().equals(o.strides()) &&
                      p.device() == o.device();
    if (same) {  // Note [Placeholders without the dispatcher]: what set_(o) does to a plain tensor
      c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      impl->set_storage_keep_dtype(o.storage());
      impl->set_sizes_and_strides(o.sizes(), o.strides(), o.storage_offset());
      impl->bump_version();
    }
    if (!same) {
      PyObject* index = PyLong_FromSsize_t(k);
      if (index == nullptr || PyList_Append(rest, index) < 0) {
        Py_XDECREF(index);
        Py_DECREF(rest);
        return nullptr;
      }
      Py_DECREF(index);
    }
  }
  return rest;
}

}  // namespace lazy
