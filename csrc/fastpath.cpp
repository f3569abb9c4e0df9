// torch_tpu.runtime._native: the eager hot path's per-call bookkeeping in C++.
//
// Behaviour stays in Python (runtime/executor.py, runtime/storage.py); these
// functions do the same bookkeeping without the interpreter's per-step cost,
// and hand anything unusual back to Python rather than implement a second
// copy of the rules. csrc/README.md is the contract with the Python side and
// the map of the files; this one is the module: its interned names, its
// counters, its method table and PyInit__native.
#include <Python.h>

#include "device_guard.h"
#include "native.h"

#ifndef TORCH_TPU_TORCH_VERSION
#define TORCH_TPU_TORCH_VERSION "unknown"
#endif

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject *s_key, *s_dyn, *s_slot_data, *s_device, *s_tpu, *s_shape, *s_call;
PyObject *s_fast, *s_move_to_end, *s_value;
PyObject *s_fused, *s_launch_blocking, *s_opt_level, *s_precision_state, *s_precision_token;
PyObject* g_empty_list = nullptr;
uint64_t n_classify = 0, n_classify_fallback = 0, n_wrap = 0, n_new_tensor = 0, n_call = 0;
uint64_t n_kernel = 0, n_kernel_fallback = 0, n_unboxed = 0, n_memo = 0, n_fused = 0;

namespace {

PyObject* calls(PyObject*, PyObject*) {
  return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsN}", "classify", (unsigned long long)n_classify,
                       "classify_fallback", (unsigned long long)n_classify_fallback,
                       "wrap", (unsigned long long)n_wrap, "new_tensor",
                       (unsigned long long)n_new_tensor, "call", (unsigned long long)n_call,
                       "kernel", (unsigned long long)n_kernel, "kernel_fallback",
                       (unsigned long long)n_kernel_fallback, "unboxed",
                       (unsigned long long)n_unboxed, "memo", (unsigned long long)n_memo,
                       "fused", (unsigned long long)n_fused, "hashed_keys",
                       PyBool_FromLong(hashed_keys()));
}

PyMethodDef methods[] = {
    {"classify", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(classify)),
     METH_FASTCALL, "Fill an executor signature for a cache lookup; False: use Python."},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(new_tensor)),
     METH_FASTCALL, "new_tensor(shape, dtype, index, nbytes=None, stride=None)"},
    {"wrap", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(wrap)), METH_FASTCALL,
     "wrap(array, index, dtype, origin): a new tpu tensor whose value is array"},
    {"next_address", next_address, METH_O, "A fresh virtual storage address for nbytes."},
    {"setup", setup, METH_O, "setup(DeviceData): the class wrap() instantiates."},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
     "call(compiled, arrays, dyn, device): run an executor entry's executable"},
    {"setup_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup_call)),
     METH_FASTCALL, "setup_call(Compiled, scalar_array, cache): what call() needs from JAX, and the scalar cache it shares."},
    {"register_kernel",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_kernel)), METH_FASTCALL,
     "register_kernel(schema_name, overload, op, name, kinds, unboxed): the C++ kernel in front of the "
     "op's Python kernel (which must be registered for PrivateUse2); False: not handled"},
    {"setup_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup_kernel)),
     METH_FASTCALL, "setup_kernel(context, cache, record_native, narrow, spec_fn, "
     "array_type): what the C++ kernel reads"},
    {"take_stats", take_stats, METH_NOARGS,
     "take_stats() -> None or (hits, {op name: hits}) of the C++ kernel since the last call"},
    {"forget", forget, METH_NOARGS, "Empty the C++ kernels' memos of recent hits."},
    {"set_memo", set_memo, METH_O, "set_memo(on): whether the C++ kernels remember hits."},
    {"calls", calls, METH_NOARGS, "Call counters of the fast paths (tests read them)."},
    {"install_device_guard", torch_tpu::install_device_guard, METH_O,
     "install_device_guard(count): PyTorch's tpu device guard, with count devices."},
    {"set_device_index", torch_tpu::set_device_index, METH_O,
     "set_device_index(i): this thread's current tpu device, as C++ sees it."},
    {"device_index", torch_tpu::device_index, METH_NOARGS,
     "This thread's current tpu device, as C++ sees it."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native",
                          "torch_tpu's eager hot path in C++ (csrc/README.md).", -1, methods};

}  // namespace
}  // namespace torch_tpu::native
#pragma GCC visibility pop

PyMODINIT_FUNC PyInit__native() {
  using namespace torch_tpu::native;
  s_key = PyUnicode_InternFromString("key");
  s_dyn = PyUnicode_InternFromString("dyn");
  s_slot_data = PyUnicode_InternFromString("slot_data");
  s_device = PyUnicode_InternFromString("device");
  s_tpu = PyUnicode_InternFromString("_tpu");
  s_shape = PyUnicode_InternFromString("shape");
  s_call = PyUnicode_InternFromString("_call");
  {
    const char* names[6] = {"raw", "index", "shape", "dtype", "sig", "origin"};
    for (int i = 0; i < 6; ++i) g_dd_names[i] = PyUnicode_InternFromString(names[i]);
  }
  s_fast = PyUnicode_InternFromString("fast");
  s_move_to_end = PyUnicode_InternFromString("move_to_end");
  s_value = PyUnicode_InternFromString("value");
  s_fused = PyUnicode_InternFromString("fused");
  s_launch_blocking = PyUnicode_InternFromString("launch_blocking");
  s_opt_level = PyUnicode_InternFromString("opt_level");
  s_precision_state = PyUnicode_InternFromString("precision_state");
  s_precision_token = PyUnicode_InternFromString("precision_token");
  g_empty_list = PyList_New(0);
  PyObject* m = PyModule_Create(&module_def);
  // The torch it was compiled against: runtime/fastpath.py uses it with no other.
  if (m && PyModule_AddStringConstant(m, "TORCH_VERSION", TORCH_TPU_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  // The module's Python API version: runtime/fastpath.py uses a build only
  // with the one it calls (4: scalar_array remembers what it makes, call()
  // only reads the scalar cache; 3: setup_call takes the scalar cache it shares;
  // 2: setup_kernel takes the eager context object).
  if (m && PyModule_AddIntConstant(m, "KERNEL_API", 4) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
