// An executor cache entry as the C++ kernel runs it, and the kernel's keys
// into the executor cache.
//
// FastSpec: what executor._fast_spec(entry) says of an entry (its executable,
// its outputs' dtypes and shapes, whether its scalars are narrowed), kept in a capsule on the entry's `fast`
// attribute (entry_spec). Key: a tuple subclass whose hash is tuple's, with
// the op's hash known in advance (make_key; setup_key_type checks them).
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <vector>

#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

struct OutSpec {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  uint64_t nbytes;
  PyObject* dtype_obj;  // owned
  PyObject* shape;      // owned: the DeviceData's shape tuple
  PyObject* sig;        // owned: (shape, dtype)
};

struct FastSpec {
  PyObject* compiled;  // owned
  PyObject* fn = nullptr;  // owned: compiled._call, once JAX made it
  std::vector<OutSpec> outs;
  // Its Python floats and complex numbers go in as 32-bit device scalars
  // (runtime/scalars.py narrow; Entry.narrow): execute() narrows `dyn` first.
  bool narrow = false;
  ~FastSpec() {
    Py_XDECREF(compiled);
    Py_XDECREF(fn);
    for (auto& o : outs) {
      Py_XDECREF(o.dtype_obj);
      Py_XDECREF(o.shape);
      Py_XDECREF(o.sig);
    }
  }
};

extern PyObject* g_spec_fn;  // executor._fast_spec(entry), given by setup_kernel()

// The entry's FastSpec (borrowed from its capsule), or null with no error
// when the entry is not (or not yet) one the kernel runs.
FastSpec* entry_spec(PyObject* entry);

// DeviceData(array, index, dtype, origin) for a result whose shape and
// dtype the entry knows: the object __init__ makes, slots filled directly.
inline PyObject* device_data(PyObject* array, PyObject* index, const OutSpec& o, PyObject* origin) {
  if (!g_dd_direct) {
    PyObject* a[4] = {array, index, o.dtype_obj, origin};
    return PyObject_Vectorcall(g_device_data, a, 4, nullptr);
  }
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(g_device_data);
  PyObject* d = type->tp_alloc(type, 0);
  if (!d) return nullptr;
  PyObject* vals[6] = {array, index, o.shape, o.dtype_obj, o.sig, origin};
  for (int i = 0; i < 6; ++i)
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(d) + g_dd_offsets[i]) =
        Py_NewRef(vals[i]);
  return d;
}

// The kernel's cache keys: tuples whose hash is the plain tuple's (CPython's
// tuplehash) with the op's hash known in advance. An OpOverload hashes in
// Python (OpOverload.__hash__), and a lookup hashes its key twice (the get
// and OrderedDict.move_to_end): that alone cost more than the rest of the key.
// The cache stores the Python kernel's plain tuples; these compare equal to
// them (tuple equality), and setup checks that the hashes agree.
extern PyTypeObject* g_key_type;
extern std::unordered_map<PyObject*, Py_hash_t>* g_op_hashes;

// A key of the list's items: a Key where hashes agree, else a plain tuple.
inline PyObject* make_key(PyObject* list) {
  if (!g_key_type) return PyList_AsTuple(list);
  Py_ssize_t n = PyList_GET_SIZE(list);
  PyObject* k = g_key_type->tp_alloc(g_key_type, n);
  if (!k) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(k, i, Py_NewRef(PyList_GET_ITEM(list, i)));
  return k;
}

// Make the Key type and check it against tuple's own hash on `sample`
// (a list whose first item is a registered op); no Key type if they differ.
bool setup_key_type(PyObject* sample);

}  // namespace torch_tpu::native
#pragma GCC visibility pop
