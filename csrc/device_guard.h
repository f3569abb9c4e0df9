// The tpu device guard (csrc/device_guard.cpp): Python entry points that
// csrc/fastpath.cpp lists in the _native module's method table.
#pragma once

#include <Python.h>

namespace torch_tpu {

// install_device_guard(count): make PyTorch's PrivateUse1 guard this one,
// reporting `count` devices.
PyObject* install_device_guard(PyObject* self, PyObject* count);
// set_device_index(index): the calling thread's current tpu device for C++.
PyObject* set_device_index(PyObject* self, PyObject* index);
// device_index(): the calling thread's current tpu device as C++ sees it.
PyObject* device_index(PyObject* self, PyObject* unused);

}  // namespace torch_tpu
