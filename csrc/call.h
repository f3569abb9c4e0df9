// Calling an entry's executable: the Python scalar inputs of a call as
// cached device arrays (device_scalar, inline for the C++ kernel's hits),
// and call() (call.cpp), JAX's C++ call path of a jax.stages.Compiled.
#pragma once

#include <Python.h>

#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

extern PyObject* g_compiled_type;  // jax.stages.Compiled, given by setup_call()
extern PyObject* g_scalar_array;   // fastpath._scalar_array, given by setup_call()
extern PyObject* g_scalars;        // fastpath.SCALAR_ARRAYS: {(type, value, device): array}

// The device array a jitted call would make of Python scalar `v` on
// `device` (same aval: weak type and all), or a new reference to `v` itself
// when it is not cached (zeros, whose sign equality cannot tell, NaNs,
// complex numbers, anything not a Python int/float/bool).
inline PyObject* device_scalar(PyObject* v, PyObject* device) {
  if (PyFloat_CheckExact(v)) {
    double x = PyFloat_AS_DOUBLE(v);
    if (x == 0.0 || x != x) return Py_NewRef(v);
  } else if (!PyLong_CheckExact(v) && !PyBool_Check(v)) {
    return Py_NewRef(v);
  }
  PyObject* key = PyTuple_Pack(3, reinterpret_cast<PyObject*>(Py_TYPE(v)), v, device);
  if (!key) return nullptr;
  PyObject* hit = PyDict_GetItemWithError(g_scalars, key);  // borrowed
  if (hit) {
    Py_DECREF(key);
    return Py_NewRef(hit);
  }
  if (PyErr_Occurred()) {
    Py_DECREF(key);
    return nullptr;
  }
  // A miss: fastpath._scalar_array makes the array and remembers it in the
  // bounded table (fastpath.ScalarArrays: its eviction policy lives there).
  Py_DECREF(key);
  return PyObject_CallFunctionObjArgs(g_scalar_array, v, device, nullptr);
}

}  // namespace torch_tpu::native
#pragma GCC visibility pop
