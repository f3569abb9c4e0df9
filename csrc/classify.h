// The signature of a call: keys.Signature's hit path in C++.
//
// A call's arguments (tpu tensors, views of them, Python scalars, static
// values, None) become the executor's cache key parts, its runtime inputs
// (`dyn`: Scalars, view offsets) and its storages in slot order. classify()
// (classify.cpp) fills a Python signature with them; the C++ kernel
// (kernel.cpp) and its memo (memo.h) use the same helpers inline. Anything
// else returns 0: the Python classifier decides.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

// programs.KeyTag.ONE (borrowed from the module; looked up once): the key
// part of an alpha (kind S1) that is the int 1, which is not an input then.
extern PyObject* g_tag_one;
PyObject* load_tag_one();  // classify.cpp: the first lookup
inline PyObject* tag_one() { return g_tag_one ? g_tag_one : load_tag_one(); }

inline bool is_int_one(PyObject* v) {
  if (!PyLong_CheckExact(v)) return false;
  int overflow = 0;
  long x = PyLong_AsLongAndOverflow(v, &overflow);
  return !overflow && x == 1;
}

// The DeviceData on t's storage (a new reference), or null with no error
// where there is none (Python raises its error for that tensor).
inline PyObject* storage_data(const at::Tensor& t) {
  PyObject* storage = THPStorage_Wrap(t.storage());
  if (!storage) return nullptr;
  PyObject* data = PyObject_GetAttr(storage, s_tpu);
  Py_DECREF(storage);
  if (!data) PyErr_Clear();
  return data;
}

// The DeviceData of tensor argument t (a new reference in *data): 1; or 0
// where Python decides (a CPU tensor, a 0-dim one being a scalar; no storage;
// a lazy conj/neg view; no device data, for which Python raises its error);
// or -1 with an error set.
inline int tensor_data(const at::Tensor& t, PyObject** data) {
  if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1)
    return 0;
  if (t.is_conj() || t.is_neg()) return 0;
  *data = storage_data(t);
  return *data ? 1 : PyErr_Occurred() ? -1 : 0;
}

// Make data's device the call's: 1, or 0 for a second device (Python raises
// PyTorch's error), or -1 with an error set.
inline int take_device(PyObject* data, long& device) {
  PyObject* index_obj = dd_get(data, DD_INDEX);
  if (!index_obj) return -1;
  long index = PyLong_AsLong(index_obj);
  Py_DECREF(index_obj);
  if (index == -1 && PyErr_Occurred()) return -1;
  if (device != index) {
    if (device != -1) return 0;
    device = index;
  }
  return 1;
}

// Is t its storage's whole array (data's dtype and shape, contiguous from
// offset 0)? 1 yes, 0 no (a view: Python's layout rules apply), -1 error.
inline int whole_array(const at::Tensor& t, PyObject* data) {
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
  PyObject* data_dtype = dd_get(data, DD_DTYPE);
  if (!data_dtype) return -1;
  bool same = data_dtype == dtype;
  Py_DECREF(data_dtype);
  if (!same || t.storage_offset() != 0 || !t.is_contiguous()) return 0;
  PyObject* shape = dd_get(data, DD_SHAPE);
  if (!shape) return -1;
  auto sizes = t.sizes();
  same = PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == static_cast<Py_ssize_t>(sizes.size());
  for (size_t i = 0; same && i < sizes.size(); ++i)
    same = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i)) == sizes[i];
  Py_DECREF(shape);
  if (PyErr_Occurred()) return -1;
  return same ? 1 : 0;
}

struct Classifier {
  PyObject* key;        // borrowed lists of the signature
  PyObject* dyn;
  PyObject* slot_data;
  long device = -1;     // -1: no tpu tensor seen yet
  std::vector<PyObject*> slots;  // borrowed: DeviceData objects, in slot order

  // 1: done; 0: hand back to Python; -1: a Python error is set.
  int scalar(PyObject* v) {
    if (THPVariable_Check(v)) return tensor(v);
    if (PyList_Append(dyn, v) < 0) return -1;
    return PyList_Append(key, reinterpret_cast<PyObject*>(Py_TYPE(v))) < 0 ? -1 : 1;
  }

  int tensor(PyObject* obj) {
    if (!THPVariable_Check(obj)) return scalar(obj);
    return tensor_value(THPVariable_Unpack(obj));
  }

  int tensor_value(const at::Tensor& t) {
    PyObject* data = nullptr;
    int rc = tensor_data(t, &data);
    if (rc <= 0) return rc;
    int result = with_data(t, data);
    Py_DECREF(data);  // the signature's slot_data list holds it from here
    return result;
  }

  int with_data(const at::Tensor& t, PyObject* data) {
    int rc = take_device(data, device);
    if (rc <= 0) return rc;
    long slot = -1;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] == data) {
        slot = static_cast<long>(i);
        break;
      }
    }
    if (slot < 0) {
      slot = static_cast<long>(slots.size());
      slots.push_back(data);
      if (PyList_Append(slot_data, data) < 0) return -1;
      PyObject* sig = dd_get(data, DD_SIG);
      if (!sig) return -1;
      rc = PyList_Append(key, sig);
      Py_DECREF(sig);
      if (rc < 0) return -1;
    }
    rc = whole_array(t, data);
    if (rc < 0) return -1;
    if (rc == 0) return view(t, data, slot);
    PyObject* s = PyLong_FromLong(slot);
    if (!s) return -1;
    rc = PyList_Append(key, s);
    Py_DECREF(s);
    return rc < 0 ? -1 : 1;
  }

  // A view of the storage: Signature.tensor's view branch. Its key part is
  // (slot, (dtype, sizes, strides, None)) (storage.view_layout made dynamic
  // by storage.dynamic_layout) and its storage offset a runtime input, so
  // x[i] for every i shares one program. complex32 layouts (which may carry
  // the storage's dtype as well) are left to Python.
  int view(const at::Tensor& t, PyObject* data, long slot) {
    PyObject* half = reinterpret_cast<PyObject*>(torch::getTHPDtype(at::kComplexHalf));
    PyObject* data_dtype = dd_get(data, DD_DTYPE);
    if (!data_dtype) return -1;
    bool complex32 = data_dtype == half;
    Py_DECREF(data_dtype);
    if (complex32 || t.scalar_type() == at::kComplexHalf) return 0;
    auto sizes = t.sizes();
    auto strides = t.strides();
    PyObject* sz = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
    PyObject* sd = PyTuple_New(static_cast<Py_ssize_t>(strides.size()));
    bool ok = sz && sd;
    for (size_t i = 0; ok && i < sizes.size(); ++i) {
      PyObject* a = PyLong_FromLongLong(sizes[i]);
      PyObject* b = PyLong_FromLongLong(strides[i]);
      if (a) PyTuple_SET_ITEM(sz, i, a);
      if (b) PyTuple_SET_ITEM(sd, i, b);
      ok = a && b;
    }
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    PyObject* layout = ok ? PyTuple_Pack(4, dtype, sz, sd, Py_None) : nullptr;
    Py_XDECREF(sz);
    Py_XDECREF(sd);
    PyObject* s = layout ? PyLong_FromLong(slot) : nullptr;
    PyObject* part = s ? PyTuple_Pack(2, s, layout) : nullptr;
    Py_XDECREF(s);
    Py_XDECREF(layout);
    PyObject* offset = part ? PyLong_FromLongLong(t.storage_offset()) : nullptr;
    int rc = offset && PyList_Append(key, part) == 0 && PyList_Append(dyn, offset) == 0 ? 1 : -1;
    Py_XDECREF(part);
    Py_XDECREF(offset);
    return rc;
  }

  int static_value(PyObject* v) {
    if (PyList_CheckExact(v)) {
      PyObject* t = PyList_AsTuple(v);
      if (!t) return -1;
      int rc = PyList_Append(key, t);
      Py_DECREF(t);
      return rc < 0 ? -1 : 1;
    }
    if (THPDevice_Check(v)) {
      PyObject* s = PyObject_Str(v);
      if (!s) return -1;
      int rc = PyList_Append(key, s);
      Py_DECREF(s);
      return rc < 0 ? -1 : 1;
    }
    return PyList_Append(key, v) < 0 ? -1 : 1;
  }

  int argument(long kind, PyObject* v) {
    switch (kind) {
      case T:
        return tensor(v);
      case X:
        return static_value(v);
      case S:
        return scalar(v);
      case S1: {
        if (!is_int_one(v)) return scalar(v);
        PyObject* one = tag_one();
        if (!one) return -1;
        return PyList_Append(key, one) < 0 ? -1 : 1;
      }
      default:
        break;
    }
    if (v == Py_None) return PyList_Append(key, Py_None) < 0 ? -1 : 1;
    switch (kind) {
      case OT:
        return tensor(v);
      case OS:
        return scalar(v);
      case G:
        return PyList_Append(key, Py_None) < 0 ? -1 : 1;
      default:
        return 0;  // lists of tensors or scalars: Python
    }
  }
};

}  // namespace torch_tpu::native
#pragma GCC visibility pop
