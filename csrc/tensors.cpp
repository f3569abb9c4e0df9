// Tensor creation's Python entry points: new_tensor (storage.empty_tensor),
// wrap (storage.wrap), next_address (storage._address_for), and
// setup(DeviceData), which finds the layout of the class whose slots the C++
// kernel fills (native.h).
#include <Python.h>
#include <structmember.h>

#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "native.h"
#include "tensors.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject* g_device_data = nullptr;  // storage.DeviceData, given by setup()
Py_ssize_t g_dd_offsets[6] = {0};
bool g_dd_direct = false;
PyObject* g_dd_names[6] = {nullptr};
uint64_t g_next_address = uint64_t(1) << 44;

bool int_sequence(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

bool dtype_arg(PyObject* obj, at::ScalarType& out) {
  if (!THPDtype_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
    return false;
  }
  out = reinterpret_cast<THPDtype*>(obj)->scalar_type;
  return true;
}

namespace {

PyObject* new_tensor_impl(PyObject* shape_obj, PyObject* dtype_obj, PyObject* index_obj,
                          PyObject* nbytes_obj, PyObject* stride_obj, at::Tensor* out) {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  if (!int_sequence(shape_obj, sizes) || !dtype_arg(dtype_obj, dtype)) return nullptr;
  if (stride_obj && stride_obj != Py_None) {
    if (!int_sequence(stride_obj, strides)) return nullptr;
    if (strides.size() != sizes.size()) {
      PyErr_SetString(PyExc_ValueError, "new_tensor: shape and stride differ in length");
      return nullptr;
    }
  } else {
    contiguous_strides(sizes, strides);
  }
  long index = PyLong_AsLong(index_obj);
  if (index == -1 && PyErr_Occurred()) return nullptr;
  uint64_t nbytes;
  if (nbytes_obj && nbytes_obj != Py_None) {
    nbytes = PyLong_AsUnsignedLongLong(nbytes_obj);
    if (PyErr_Occurred()) return nullptr;
  } else {
    uint64_t numel = 1;
    for (int64_t s : sizes) numel *= static_cast<uint64_t>(s);
    nbytes = numel * c10::elementSize(dtype);
  }
  try {
    *out = make_tensor(sizes, strides, dtype, static_cast<c10::DeviceIndex>(index), nbytes);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return Py_None;  // success marker (borrowed)
}

}  // namespace

PyObject* new_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3 || nargs > 5) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(shape, dtype, index, nbytes=None, stride=None)");
    return nullptr;
  }
  at::Tensor t;
  if (!new_tensor_impl(args[0], args[1], args[2], nargs > 3 ? args[3] : nullptr,
                       nargs > 4 ? args[4] : nullptr, &t))
    return nullptr;
  ++n_new_tensor;
  return THPVariable_Wrap(std::move(t));
}

PyObject* wrap(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "wrap(array, index, dtype, origin)");
    return nullptr;
  }
  if (!g_device_data) {
    PyErr_SetString(PyExc_RuntimeError, "torch_tpu.runtime._native.setup() was not called");
    return nullptr;
  }
  // DeviceData(array, index, dtype, origin): its __init__ is the one definition.
  PyObject* data = PyObject_Vectorcall(g_device_data, args, 4, nullptr);
  if (!data) return nullptr;
  PyObject* shape = PyObject_GetAttr(data, s_shape);
  at::Tensor t;
  bool ok = shape && new_tensor_impl(shape, args[2], args[1], nullptr, nullptr, &t);
  Py_XDECREF(shape);
  PyObject* storage = ok ? THPStorage_Wrap(t.storage()) : nullptr;
  ok = storage && PyObject_SetAttr(storage, s_tpu, data) == 0;
  Py_XDECREF(storage);
  Py_DECREF(data);
  if (!ok) return nullptr;
  ++n_wrap;
  return THPVariable_Wrap(std::move(t));
}

PyObject* next_address(PyObject*, PyObject* arg) {
  unsigned long long nbytes = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return PyLong_FromUnsignedLongLong(take_address(nbytes));
}

PyObject* setup(PyObject*, PyObject* arg) {
  Py_XSETREF(g_device_data, Py_NewRef(arg));
  // DeviceData's slots, to fill a result's directly (as its __init__ does);
  // any other layout of the class: its __init__ is called instead.
  g_dd_direct = false;
  if (g_device_data && PyType_Check(g_device_data)) {
    bool ok = reinterpret_cast<PyTypeObject*>(g_device_data)->tp_init != nullptr;
    PyObject* slots = PyObject_GetAttrString(g_device_data, "__slots__");
    ok = ok && slots && PyTuple_Check(slots) && PyTuple_GET_SIZE(slots) == 7;
    Py_XDECREF(slots);
    PyErr_Clear();
    for (int i = 0; ok && i < 6; ++i) {
      PyObject* d = PyObject_GetAttr(g_device_data, g_dd_names[i]);
      if (d && Py_TYPE(d) == &PyMemberDescr_Type) {
        PyMemberDef* m = reinterpret_cast<PyMemberDescrObject*>(d)->d_member;
        ok = m->type == T_OBJECT_EX;
        g_dd_offsets[i] = m->offset;
      } else {
        ok = false;
      }
      Py_XDECREF(d);
      PyErr_Clear();
    }
    g_dd_direct = ok;
  }
  return PyBool_FromLong(g_dd_direct);
}

}  // namespace torch_tpu::native
#pragma GCC visibility pop
