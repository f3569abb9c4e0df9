// call(compiled, arrays, dyn, device) and setup_call(Compiled, scalar_array, cache).
#include "call.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject* g_compiled_type = nullptr;
PyObject* g_scalar_array = nullptr;
PyObject* g_scalars = nullptr;

// call(compiled, arrays, dyn, device): compiled(arrays, dyn), through the
// jax executable's C++ call path (Compiled._call) with the Python scalars of
// `dyn` as cached device arrays, so no call converts and transfers them again.
// Any other callable is called as it is.
PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "call(compiled, arrays, dyn, device)");
    return nullptr;
  }
  PyObject* compiled = args[0];
  PyObject* dyn = args[2];
  if (!g_compiled_type || Py_TYPE(compiled) != reinterpret_cast<PyTypeObject*>(g_compiled_type) ||
      !PyList_CheckExact(dyn)) {
    PyObject* call_args[2] = {args[1], dyn};
    return PyObject_Vectorcall(compiled, call_args, 2, nullptr);
  }
  PyObject* fn = PyObject_GetAttr(compiled, s_call);
  if (!fn) return nullptr;
  if (fn == Py_None) {  // not called yet: Compiled.__call__ makes its fast path
    Py_DECREF(fn);
    fn = Py_NewRef(compiled);
  }
  Py_ssize_t n = PyList_GET_SIZE(dyn);
  PyObject* inputs = PyList_New(n);
  if (!inputs) {
    Py_DECREF(fn);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = device_scalar(PyList_GET_ITEM(dyn, i), args[3]);
    if (!v) {
      Py_DECREF(inputs);
      Py_DECREF(fn);
      return nullptr;
    }
    PyList_SET_ITEM(inputs, i, v);
  }
  PyObject* call_args[2] = {args[1], inputs};
  PyObject* result = PyObject_Vectorcall(fn, call_args, 2, nullptr);
  Py_DECREF(inputs);
  Py_DECREF(fn);
  if (result) ++n_call;
  return result;
}

PyObject* setup_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyDict_CheckExact(args[2])) {
    PyErr_SetString(PyExc_TypeError, "setup_call(Compiled, scalar_array, cache: dict)");
    return nullptr;
  }
  Py_XSETREF(g_compiled_type, Py_NewRef(args[0]));
  Py_XSETREF(g_scalar_array, Py_NewRef(args[1]));
  Py_XSETREF(g_scalars, Py_NewRef(args[2]));
  Py_RETURN_NONE;
}

}  // namespace torch_tpu::native
#pragma GCC visibility pop
