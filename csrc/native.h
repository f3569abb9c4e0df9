// What every file of torch_tpu.runtime._native shares: the interned
// attribute names, the process state the setup functions fill, the call
// counters and DeviceData's slots (Python's C API only: tensors.h has the
// tensor creation the hot path inlines).
// csrc/README.md describes the contract with the Python side.
//
// Every name of the extension lives in torch_tpu::native, hidden from the
// shared object's symbol table: it exports PyInit__native (and the device
// guard's functions), and calls between its files stay direct.
#pragma once

#include <Python.h>

#include <cstdint>

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

// Argument kinds: keys.KIND_OF_TYPE's values (TENSOR, OPT_TENSOR, ... in order).
enum Kind : long { T = 0, OT, LT, LOT, S, OS, X, G, LS, S1 };

// ------------------------------------------------ interned attribute names
// (made by PyInit__native in fastpath.cpp, kept for the process)
extern PyObject *s_key, *s_dyn, *s_slot_data, *s_device;  // keys.Signature
extern PyObject* s_tpu;    // storage._tpu: a storage's DeviceData
extern PyObject* s_shape;  // DeviceData.shape
extern PyObject* s_call;   // jax Compiled._call
extern PyObject *s_fast, *s_move_to_end, *s_value;
// runtime.context.EagerContext's slots (setup_kernel finds their offsets)
extern PyObject *s_fused, *s_launch_blocking, *s_opt_level, *s_precision_state,
    *s_precision_token;

// The dyn list of a memo hit without Scalar inputs (shared, never changed).
extern PyObject* g_empty_list;

// -------------------------------------------------------------- counters
// calls() reports them (tests read them); fastpath.cpp defines them.
extern uint64_t n_classify, n_classify_fallback, n_wrap, n_new_tensor, n_call;
extern uint64_t n_kernel, n_kernel_fallback, n_unboxed, n_memo, n_fused;

// ------------------------------------------------------------ DeviceData
// storage.DeviceData, given by setup() (tensors.cpp). Its slots (raw, index,
// shape, dtype, sig, origin) are read and filled by offset where setup()
// found the class laid out as expected (g_dd_direct), else by name.
extern PyObject* g_device_data;
enum DD : int { DD_RAW, DD_INDEX, DD_SHAPE, DD_DTYPE, DD_SIG, DD_ORIGIN };
extern Py_ssize_t g_dd_offsets[6];
extern bool g_dd_direct;
extern PyObject* g_dd_names[6];

// data.<slot> (a new reference), as PyObject_GetAttr gives it.
inline PyObject* dd_get(PyObject* data, int which) {
  if (g_dd_direct && Py_TYPE(data) == reinterpret_cast<PyTypeObject*>(g_device_data)) {
    PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(data) + g_dd_offsets[which]);
    if (v) return Py_NewRef(v);
  }
  return PyObject_GetAttr(data, g_dd_names[which]);
}

// ------------------------------------------- the module's Python functions
// (fastpath.cpp lists them in the method table; README.md says who calls them)

// classify.cpp
PyObject* classify(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// tensors.cpp
PyObject* new_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* wrap(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* next_address(PyObject*, PyObject* arg);
PyObject* setup(PyObject*, PyObject* arg);
// call.cpp
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* setup_call(PyObject*, PyObject* const* args, Py_ssize_t nargs);
// register.cpp
PyObject* register_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs);
PyObject* setup_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs);
PyObject* take_stats(PyObject*, PyObject*);
PyObject* forget(PyObject*, PyObject*);
PyObject* set_memo(PyObject*, PyObject* on);
// entry.cpp: whether the kernels' cache keys hash in C++ (calls() says).
bool hashed_keys();

}  // namespace torch_tpu::native
#pragma GCC visibility pop
