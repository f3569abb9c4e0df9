// The memo: each C++ kernel's recent hits under a key of plain numbers.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "classify.h"
#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

struct FastSpec;

// Each kernel remembers its recent hits under a key of plain numbers made
// from the C++ arguments (per argument: a tag, then the storage slot, dtype
// and sizes of a tensor, the type of a Scalar, a static value; then the
// device, default dtype and the identity of the precision token and the opt
// level objects), so a repeated call builds no Python key, hashes no tuple
// and looks nothing up in the executor's dict. A memo holds the entry and its
// key; programs.py calls forget() whenever it drops or replaces an entry,
// which empties every kernel's memo (the next hit goes through the dict
// again). A call the memo cannot describe (a view, a string argument) takes
// the dict path as before.
constexpr uint32_t kMemoWords = 32;
constexpr int kMemoSlots = 4;         // distinct storages a memoized call reads
constexpr size_t kMemoMax = 64;       // memos per kernel (then it starts over)
constexpr uint32_t kMoveEvery = 16;   // LRU order refreshed every 16 memo hits

enum MemoTag : int64_t { M_NONE = -1, M_ONE = -2, M_INT = -3, M_FLOAT = -4, M_BOOL = -5,
                         M_COMPLEX = -6, M_TENSOR = -7, M_VALUE = -8 };

struct MemoKey {
  uint32_t n = 0;
  int64_t v[kMemoWords];
  bool push(int64_t x) {
    if (n >= kMemoWords) return false;
    v[n++] = x;
    return true;
  }
  bool operator==(const MemoKey& o) const {
    return n == o.n && std::memcmp(v, o.v, n * sizeof(int64_t)) == 0;
  }
};

struct MemoKeyHash {
  size_t operator()(const MemoKey& k) const {
    uint64_t h = 1469598103934665603ULL ^ k.n;
    for (uint32_t i = 0; i < k.n; ++i) {
      h ^= static_cast<uint64_t>(k.v[i]);
      h *= 1099511628211ULL;
      h ^= h >> 29;
    }
    return static_cast<size_t>(h);
  }
};

struct Memo {
  PyObject* entry;   // owned: the executor entry
  PyObject* key;     // owned: its key in the executor cache
  PyObject* prec;    // owned: the precision token and opt level the key
  PyObject* level;   //   holds (owned, so their identity stays theirs)
  FastSpec* spec;    // the entry's (its capsule lives as long as the entry)
  uint32_t since_move = 0;
};

inline void memo_clear(std::unordered_map<MemoKey, Memo, MemoKeyHash>& memo) {
  std::vector<PyObject*> drop;
  for (auto& kv : memo) {
    drop.push_back(kv.second.entry);
    drop.push_back(kv.second.key);
    drop.push_back(kv.second.prec);
    drop.push_back(kv.second.level);
  }
  memo.clear();  // before the references go: a finalizer may call forget()
  for (PyObject* o : drop) Py_XDECREF(o);
}

// One call's memo key and what a memo hit needs to run it.
struct MemoCall {
  MemoKey key;
  long device = -1;
  PyObject* datas[kMemoSlots];  // owned: DeviceData objects, in slot order
  int ns = 0;
  PyObject* dyn = nullptr;      // owned: the Scalar inputs (null: none yet)
  PyObject* prec = nullptr;     // owned
  PyObject* level = nullptr;    // borrowed from the opt_level module
  ~MemoCall() {
    for (int i = 0; i < ns; ++i) Py_DECREF(datas[i]);
    Py_XDECREF(dyn);
    Py_XDECREF(prec);
  }

  // 1: described; 0: not memoizable (the dict path decides); -1: error set.
  int scalar(PyObject* s) {
    int64_t tag = PyBool_Check(s) ? M_BOOL : PyLong_CheckExact(s) ? M_INT
                  : PyFloat_CheckExact(s) ? M_FLOAT : PyComplex_CheckExact(s) ? M_COMPLEX : 0;
    if (!tag || !key.push(tag)) return 0;
    if (!dyn && !(dyn = PyList_New(0))) return -1;
    return PyList_Append(dyn, s) < 0 ? -1 : 1;
  }

  int tensor(const at::Tensor& t) {
    PyObject* data = nullptr;
    int rc = tensor_data(t, &data);
    if (rc <= 0) return rc;
    rc = with_data(t, data);
    Py_DECREF(data);
    return rc;
  }

  int with_data(const at::Tensor& t, PyObject* data) {
    int rc = whole_array(t, data);  // (a view: the dict path)
    if (rc <= 0) return rc;
    auto sizes = t.sizes();
    for (int i = 0; i < ns; ++i)
      if (datas[i] == data) return key.push(M_TENSOR) && key.push(i) ? 1 : 0;
    if (ns >= kMemoSlots) return 0;
    rc = take_device(data, device);
    if (rc <= 0) return rc;
    datas[ns] = Py_NewRef(data);
    bool ok = key.push(M_TENSOR) && key.push(ns++) &&
              key.push(static_cast<int64_t>(t.scalar_type())) &&
              key.push(static_cast<int64_t>(sizes.size()));
    for (size_t i = 0; ok && i < sizes.size(); ++i) ok = key.push(sizes[i]);
    return ok ? 1 : 0;
  }
};

}  // namespace torch_tpu::native
#pragma GCC visibility pop
