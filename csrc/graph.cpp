// linearize (lazy/ir/graph.py): the topological order of a graph and its structural key, in C; pack_scalars
// (lazy/runtime/cpp.py): a graph's runtime scalars as the double and int64 arrays its kernels read.
//
// Every sync walks its graph once; in Python that walk cost ~2 us per node (id() calls, a list per visit), more
// than running a fused kernel. The order, key encoding and leaf numbering are exactly Note [Graph key]'s.
#include "graph.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "ir.h"

namespace lazy {

namespace {

// Separates the body of a key from its outputs: neither a signature's address nor a position.
constexpr int64_t kKeyOutputs = -1;

// Note [Marks of a walk]
// A walk marks each node it places with its own number and the node's position (NodeObject::walk, walk_pos)
// instead of keeping a hash map from node to position: a sync's walk then costs no hashing, ~5 map operations
// per node before. The walk runs under the GIL and calls no Python code between its first and last mark (list
// appends and int objects only), so no other walk can start meanwhile; the counter is 64-bit, never reused.
long long g_walk = 0;

// Note [Interned graph keys]
// A cached graph's key comes back at every sync of it: a new bytes object of 8 bytes per node and input would cost
// its allocation, its copy and then the dict's SipHash over all of it (~0.8 us for the 200-op chain on an AMD EPYC
// core, several on slower hosts), for a lookup that finds the same key. The walk instead hashes its encoding with a
// cheap four-lane hash and returns the bytes object it returned last time for an equal encoding
// (compared in full, so a collision only costs a new object): its hash is cached in the object, and the graph
// cache's dict finds its entry by identity. The table holds at most kInternedKeys keys of kInternedBytes in all
// (then starts over): a bound on what it keeps alive beside the graph cache's own keys.
constexpr size_t kInternedKeys = 4096;
constexpr Py_ssize_t kInternedBytes = 32 << 20;
std::unordered_map<uint64_t, PyObject*>* g_interned = nullptr;
Py_ssize_t g_interned_bytes = 0;

uint64_t hash_words(const std::vector<int64_t>& enc) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ULL;
  // per lane a rotate and an add on the chain, the multiply off it: ~0.1 us for 400 words
  auto mix = [](uint64_t h, int64_t w) { return ((h << 7) | (h >> 57)) + static_cast<uint64_t>(w) * kMul; };
  uint64_t a = 1, b = 2, c = 3, d = 4;
  const int64_t* p = enc.data();
  const size_t n = enc.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a = mix(a, p[i]);
    b = mix(b, p[i + 1]);
    c = mix(c, p[i + 2]);
    d = mix(d, p[i + 3]);
  }
  for (; i < n; ++i) a = mix(a, p[i]);
  uint64_t out = n;
  for (uint64_t v : {a, b, c, d}) out = ((out ^ v) * kMul) ^ (out >> 29);
  return out;
}

// The bytes object of ``enc``: the interned one where an equal encoding was seen, else a new one (interned).
PyObject* interned_key(const std::vector<int64_t>& enc) {
  const Py_ssize_t size = static_cast<Py_ssize_t>(enc.size() * sizeof(int64_t));
  const char* data = reinterpret_cast<const char*>(enc.data());
  if (g_interned == nullptr) g_interned = new std::unordered_map<uint64_t, PyObject*>();
  const uint64_t h = hash_words(enc);
  auto it = g_interned->find(h);
  if (it != g_interned->end()) {
    PyObject* known = it->second;
    if (PyBytes_GET_SIZE(known) == size && std::memcmp(PyBytes_AS_STRING(known), data, size) == 0) {
      Py_INCREF(known);
      return known;
    }
  }
  PyObject* key = PyBytes_FromStringAndSize(data, size);
  if (key == nullptr) return nullptr;
  if (it != g_interned->end()) {  // a collision: the newer key takes the slot
    g_interned_bytes -= PyBytes_GET_SIZE(it->second);
    Py_DECREF(it->second);
    it->second = key;
  } else {
    if (g_interned->size() >= kInternedKeys || g_interned_bytes + size > kInternedBytes) {
      for (auto& kv : *g_interned) Py_DECREF(kv.second);
      g_interned->clear();
      g_interned_bytes = 0;
    }
    g_interned->emplace(h, key);
  }
  g_interned_bytes += size;
  Py_INCREF(key);
  return key;
}

// A new list of ``items``, each with a new reference.
PyObject* list_of(const std::vector<PyObject*>& items) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    Py_INCREF(items[i]);
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), items[i]);
  }
  return list;
}

}  // namespace

// The walk's scratch space, kept between syncs: sized by the largest graph so far, no allocation per sync. The walk
// itself allocates no Python object (Note [Marks of a walk]); the lists made after it can start a garbage
// collection, whose finalizers may sync (and walk) again: such a nested walk takes scratch space of its own, and
// the outer one has read every node's position before it makes anything.
struct WalkScratch {
  std::vector<NodeObject*> stack;
  std::vector<PyObject*> order;  // the nodes, placed
  std::vector<int64_t> enc;
  std::vector<PyObject*> leaves, scalars;  // borrowed: the graph's nodes hold them for the walk
};

PyObject* linearize(PyObject*, PyObject* roots_arg) {
  PyObject* roots = PySequence_Fast(roots_arg, "linearize(roots): roots must be a sequence of nodes");
  if (roots == nullptr) return nullptr;
  Py_ssize_t n_roots = PySequence_Fast_GET_SIZE(roots);
  PyObject** root_items = PySequence_Fast_ITEMS(roots);
  const long long walk = ++g_walk;
  auto placed = [walk](PyObject* n) { return reinterpret_cast<NodeObject*>(n)->walk == walk; };
  static WalkScratch* shared = new WalkScratch();
  static bool shared_busy = false;
  WalkScratch own;
  WalkScratch* scratch = shared_busy ? &own : shared;
  struct Release {
    bool* busy;
    ~Release() {
      if (busy != nullptr) *busy = false;
    }
  } release{scratch == shared ? &shared_busy : nullptr};
  if (scratch == shared) shared_busy = true;
  std::vector<PyObject*>& order = scratch->order;
  std::vector<NodeObject*>& stack = scratch->stack;
  std::vector<int64_t>& enc = scratch->enc;
  std::vector<PyObject*>& leaf_items = scratch->leaves;
  std::vector<PyObject*>& scalar_items = scratch->scalars;
  order.clear();
  stack.clear();
  enc.clear();
  leaf_items.clear();
  scalar_items.clear();
  auto fail = [&]() -> PyObject* {
    Py_DECREF(roots);
    return nullptr;
  };
  for (Py_ssize_t r = 0; r < n_roots; ++r) {
    PyObject* root = root_items[r];
    if (Py_TYPE(root) != &NodeType) {
      PyErr_SetString(PyExc_TypeError, "linearize(roots): every root must be a Node");
      return fail();
    }
    if (placed(root)) continue;
    stack.push_back(reinterpret_cast<NodeObject*>(root));
    while (!stack.empty()) {
      NodeObject* node = stack.back();
      if (node->walk == walk) {
        stack.pop_back();
        continue;
      }
      PyObject* inputs = node->inputs;
      Py_ssize_t n_in = PyTuple_GET_SIZE(inputs);
      size_t before = stack.size();
      for (Py_ssize_t k = n_in - 1; k >= 0; --k) {  // pushed in reverse: the first input is visited first
        PyObject* in = PyTuple_GET_ITEM(inputs, k);
        if (Py_TYPE(in) != &NodeType) {
          PyErr_SetString(PyExc_TypeError, "lazy internal error: a node input is not a Node");
          return fail();
        }
        if (!placed(in)) stack.push_back(reinterpret_cast<NodeObject*>(in));
      }
      if (stack.size() != before) continue;
      stack.pop_back();
      node->walk = walk;
      node->walk_pos = static_cast<long long>(order.size());
      order.push_back(reinterpret_cast<PyObject*>(node));
      // Interned signatures live as long as the process: their address is their identity.
      enc.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(node->sig)));
      if (node->op == data_op()) {
        leaf_items.push_back(node->data);
        continue;
      }
      for (Py_ssize_t k = 0; k < n_in; ++k) {
        enc.push_back(reinterpret_cast<NodeObject*>(PyTuple_GET_ITEM(inputs, k))->walk_pos);
      }
      PyObject* sc = node->scalars;
      if (PyTuple_Check(sc)) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(sc); ++k) scalar_items.push_back(PyTuple_GET_ITEM(sc, k));
      }
    }
  }
  enc.push_back(kKeyOutputs);  // the key: the body, the separator, then the outputs
  const size_t body = enc.size();
  for (Py_ssize_t r = 0; r < n_roots; ++r) {  // every position read before anything is allocated
    enc.push_back(reinterpret_cast<NodeObject*>(root_items[r])->walk_pos);
  }
  PyObject* outputs = PyList_New(n_roots);
  if (outputs == nullptr) return fail();
  for (Py_ssize_t r = 0; r < n_roots; ++r) {
    PyObject* i = PyLong_FromLongLong(enc[body + static_cast<size_t>(r)]);
    if (i == nullptr) {
      Py_DECREF(outputs);
      return fail();
    }
    PyList_SET_ITEM(outputs, r, i);
  }
  PyObject* order_list = list_of(order);
  PyObject* key = interned_key(enc);  // Note [Interned graph keys]
  PyObject* leaves = list_of(leaf_items);
  PyObject* scalars = list_of(scalar_items);
  PyObject* result = order_list && key && leaves && scalars
                         ? PyTuple_Pack(5, order_list, outputs, key, leaves, scalars)
                         : nullptr;
  Py_XDECREF(order_list);
  Py_DECREF(outputs);
  Py_XDECREF(key);
  Py_XDECREF(leaves);
  Py_XDECREF(scalars);
  Py_DECREF(roots);
  return result;
}

bool pack_numbers(PyObject* const* items, Py_ssize_t n, double* f, int64_t* i64) {
  // As float(s) / int(s) of Python numbers: a float's int slot is 0; other objects (complex scalars, which only
  // extern calls read, from the Python list) are 0 in both.
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* s = items[k];
    if (PyLong_Check(s)) {  // int and bool
      long long v = PyLong_AsLongLong(s);
      if (v == -1 && PyErr_Occurred()) return false;
      i64[k] = v;
      f[k] = static_cast<double>(v);
    } else if (PyFloat_Check(s)) {
      f[k] = PyFloat_AS_DOUBLE(s);
      i64[k] = 0;
    } else {
      f[k] = 0.0;
      i64[k] = 0;
    }
  }
  return true;
}

bool pack_sequence(PyObject* scalars, std::vector<double>* f, std::vector<int64_t>* i64, const char* who) {
  PyObject* seq = PySequence_Fast(scalars, who);
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  f->resize(std::max<Py_ssize_t>(n, 1));
  i64->resize(std::max<Py_ssize_t>(n, 1));
  const bool packed = pack_numbers(PySequence_Fast_ITEMS(seq), n, f->data(), i64->data());
  Py_DECREF(seq);
  return packed;
}

PyObject* pack_scalars(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "pack_scalars(scalars: list, doubles: writable buffer, int64s: writable buffer)");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(args[0], "pack_scalars: scalars must be a sequence");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  Py_buffer fs, is;
  if (PyObject_GetBuffer(args[1], &fs, PyBUF_WRITABLE) != 0) {
    Py_DECREF(seq);
    return nullptr;
  }
  if (PyObject_GetBuffer(args[2], &is, PyBUF_WRITABLE) != 0) {
    PyBuffer_Release(&fs);
    Py_DECREF(seq);
    return nullptr;
  }
  bool ok = fs.len >= n * static_cast<Py_ssize_t>(sizeof(double)) &&
            is.len >= n * static_cast<Py_ssize_t>(sizeof(int64_t));
  if (!ok) PyErr_SetString(PyExc_ValueError, "pack_scalars: the buffers are too small");
  if (ok) ok = pack_numbers(items, n, static_cast<double*>(fs.buf), static_cast<int64_t*>(is.buf));
  PyBuffer_Release(&fs);
  PyBuffer_Release(&is);
  Py_DECREF(seq);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// Note [Segment calls in C]
// A C++ program calls each segment of its kernels once per run. Through ctypes (argtypes converting three arrays)
// the call cost ~0.8 us, as much as the rest of a small replay's bookkeeping; here it is four integers (the entry
// point's address and those of the argument arrays, all fixed or cached by the run) and, like ctypes' CDLL, the GIL
// is released while the kernels run.
PyObject* call_segment(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "call_segment(function, pointers, doubles, int64s): four addresses");
    return nullptr;
  }
  void* addr[4];
  for (int k = 0; k < 4; ++k) {
    addr[k] = PyLong_AsVoidPtr(args[k]);
    if (addr[k] == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "call_segment: a null address");
      return nullptr;
    }
  }
  using Segment = int (*)(void**, const double*, const int64_t*);
  Segment fn = reinterpret_cast<Segment>(addr[0]);
  int err;
  Py_BEGIN_ALLOW_THREADS
  err = fn(static_cast<void**>(addr[1]), static_cast<const double*>(addr[2]), static_cast<const int64_t*>(addr[3]));
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(err);
}

}  // namespace lazy
