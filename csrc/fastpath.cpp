// torch_tpu.runtime._native: the eager hot path's per-call bookkeeping in C++.
//
// Behaviour stays in Python (runtime/executor.py, runtime/storage.py); these
// functions do the same bookkeeping without the interpreter's per-step cost,
// and hand anything unusual back to Python (`classify` returns False) rather
// than implement a second copy of the rules:
//
//   classify(sig, kinds, vals) -> bool
//       executor._classify's hit path: fills sig.key, sig.dyn, sig.slot_data
//       and sig.device for calls whose arguments are plain tpu tensors (the
//       storage's whole array), Scalars, static values and None. Returns
//       False, having touched only `sig`, for anything else (views, lists of
//       tensors, CPU tensors, lazy conj/neg views, device mismatches): the
//       caller then runs the Python classifier on a fresh signature.
//   new_tensor(shape, dtype, index, nbytes, stride) -> Tensor
//       storage.empty_tensor: a PrivateUse1 tensor with its own sized storage
//       at a fresh virtual address, in one step.
//   wrap(array, index, dtype, origin) -> Tensor
//       storage.wrap: new_tensor plus the DeviceData on its storage.
//   call(compiled, arrays, dyn, device) -> outputs
//       an entry's executable called through JAX's C++ path, its Python
//       scalar inputs as cached device arrays (no conversion per call).
//   next_address(nbytes) -> int
//       the virtual address counter (storage._address_for) both share.
//   setup(DeviceData) / calls() -> dict of call counters (tests read them).
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

#ifndef TORCH_TPU_TORCH_VERSION
#define TORCH_TPU_TORCH_VERSION "unknown"
#endif

namespace {

// Argument kinds: executor._KIND_OF_TYPE's values (_T, _OT, ... in order).
enum Kind : long { T = 0, OT, LT, LOT, S, OS, X, G, LS };

PyObject* s_key;
PyObject* s_dyn;
PyObject* s_slot_data;
PyObject* s_device;
PyObject* s_tpu;
PyObject* s_index;
PyObject* s_sig;
PyObject* s_dtype;
PyObject* s_shape;
PyObject* g_device_data = nullptr;  // storage.DeviceData, given by setup()
PyObject* g_compiled_type = nullptr;  // jax.stages.Compiled, given by setup_call()
PyObject* g_scalar_array = nullptr;   // fastpath._scalar_array, given by setup_call()
PyObject* g_scalars = nullptr;        // {(type, value, device): jax.Array or value}
PyObject* s_call;
constexpr Py_ssize_t kMaxScalars = 4096;

uint64_t g_next_address = uint64_t(1) << 44;
uint64_t n_classify = 0, n_classify_fallback = 0, n_wrap = 0, n_new_tensor = 0, n_call = 0;

uint64_t take_address(uint64_t nbytes) {
  // As storage._address_for: blocks of 64 bytes, at least one per storage.
  uint64_t start = g_next_address;
  uint64_t blocks = (nbytes + 63) / 64;
  g_next_address += (blocks > 1 ? blocks : 1) * 64;
  return start;
}

at::Tensor make_tensor(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                       at::ScalarType dtype, c10::DeviceIndex index, uint64_t nbytes) {
  c10::Device device(c10::DeviceType::PrivateUse1, index);
  void* address = reinterpret_cast<void*>(take_address(nbytes));
  // As torch._C._construct_storage_from_data_pointer: a non-owning, fixed-size
  // storage at a virtual address that is never dereferenced.
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
                       c10::DataPtr(address, device), /*allocator=*/nullptr,
                       /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::fromScalarType(dtype));
  impl->set_sizes_and_strides(sizes, strides);
  return at::Tensor(std::move(impl));
}

void contiguous_strides(const std::vector<int64_t>& sizes, std::vector<int64_t>& strides) {
  strides.resize(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= sizes[i] > 1 ? sizes[i] : 1;
  }
}

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

// ---------------------------------------------------------------- classify

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
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1)
      return 0;  // a CPU tensor (a 0-dim one is a scalar) or no storage: Python decides
    if (t.is_conj() || t.is_neg()) return 0;
    PyObject* storage = THPStorage_Wrap(t.storage());
    if (!storage) return -1;
    PyObject* data = PyObject_GetAttr(storage, s_tpu);
    Py_DECREF(storage);
    if (!data) {
      PyErr_Clear();
      return 0;  // no device data: Python raises its error
    }
    int result = with_data(t, data);
    Py_DECREF(data);  // the signature's slot_data list holds it from here
    return result;
  }

  int with_data(const at::Tensor& t, PyObject* data) {
    PyObject* index_obj = PyObject_GetAttr(data, s_index);
    if (!index_obj) return -1;
    long index = PyLong_AsLong(index_obj);
    Py_DECREF(index_obj);
    if (index == -1 && PyErr_Occurred()) return -1;
    if (device != index) {
      if (device != -1) return 0;  // two devices: Python raises PyTorch's error
      device = index;
    }
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
      PyObject* sig = PyObject_GetAttr(data, s_sig);
      if (!sig) return -1;
      int rc = PyList_Append(key, sig);
      Py_DECREF(sig);
      if (rc < 0) return -1;
    }
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    PyObject* data_dtype = PyObject_GetAttr(data, s_dtype);
    if (!data_dtype) return -1;
    bool same_dtype = data_dtype == dtype;
    Py_DECREF(data_dtype);
    if (same_dtype && t.storage_offset() == 0 && t.is_contiguous()) {
      PyObject* shape = PyObject_GetAttr(data, s_shape);
      if (!shape) return -1;
      bool same_shape = PyTuple_Check(shape);
      auto sizes = t.sizes();
      if (same_shape && PyTuple_GET_SIZE(shape) == static_cast<Py_ssize_t>(sizes.size())) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
          if (s != sizes[i]) {
            same_shape = false;
            break;
          }
        }
      } else {
        same_shape = false;
      }
      Py_DECREF(shape);
      if (PyErr_Occurred()) return -1;
      if (same_shape) {
        PyObject* s = PyLong_FromLong(slot);
        if (!s) return -1;
        int rc = PyList_Append(key, s);
        Py_DECREF(s);
        return rc < 0 ? -1 : 1;
      }
    }
    // A view: its key part and runtime inputs are _Signature.tensor's (the
    // layout rules live in Python, storage.view_layout): hand the call back.
    return 0;
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

PyObject* classify(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "classify(sig, kinds, vals)");
    return nullptr;
  }
  PyObject* sig = args[0];
  PyObject* kinds = args[1];
  if (!PyTuple_Check(kinds)) {
    PyErr_SetString(PyExc_TypeError, "classify: kinds must be a tuple");
    return nullptr;
  }
  PyObject* vals = PySequence_Fast(args[2], "classify: vals must be a sequence");
  if (!vals) return nullptr;
  Classifier c;
  c.key = PyObject_GetAttr(sig, s_key);
  c.dyn = c.key ? PyObject_GetAttr(sig, s_dyn) : nullptr;
  c.slot_data = c.dyn ? PyObject_GetAttr(sig, s_slot_data) : nullptr;
  int rc = c.slot_data && PyList_CheckExact(c.key) && PyList_CheckExact(c.dyn) &&
                   PyList_CheckExact(c.slot_data)
               ? 1
               : -1;
  if (rc < 0 && !PyErr_Occurred())
    PyErr_SetString(PyExc_TypeError, "classify: the signature's parts must be lists");
  if (rc > 0) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(vals);
    Py_ssize_t nk = PyTuple_GET_SIZE(kinds);
    if (nk < n) n = nk;
    PyObject** items = PySequence_Fast_ITEMS(vals);
    try {
      for (Py_ssize_t i = 0; i < n && rc > 0; ++i) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
        if (kind == -1 && PyErr_Occurred()) {
          rc = -1;
          break;
        }
        rc = c.argument(kind, items[i]);
      }
    } catch (const std::exception&) {
      rc = 0;  // e.g. symbolic sizes: the Python path knows what to do
    }
    if (rc > 0 && c.device != -1) {
      PyObject* d = PyLong_FromLong(c.device);
      rc = d && PyObject_SetAttr(sig, s_device, d) == 0 ? 1 : -1;
      Py_XDECREF(d);
    }
  }
  Py_XDECREF(c.key);
  Py_XDECREF(c.dyn);
  Py_XDECREF(c.slot_data);
  Py_DECREF(vals);
  if (rc < 0) return nullptr;
  if (rc == 0) {
    ++n_classify_fallback;
    Py_RETURN_FALSE;
  }
  ++n_classify;
  Py_RETURN_TRUE;
}

// ------------------------------------------------------------ tensor creation

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


// ------------------------------------------------------------ calling

// The device array a jitted call would make of Python scalar `v` on
// `device` (same aval: weak type and all), or a new reference to `v` itself
// when it is not cached (zeros, whose sign equality cannot tell, NaNs,
// complex numbers, anything not a Python int/float/bool).
PyObject* device_scalar(PyObject* v, PyObject* device) {
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
  PyObject* made = PyObject_CallFunctionObjArgs(g_scalar_array, v, device, nullptr);
  if (!made) {
    Py_DECREF(key);
    return nullptr;
  }
  if (PyDict_GET_SIZE(g_scalars) >= kMaxScalars) PyDict_Clear(g_scalars);
  int rc = PyDict_SetItem(g_scalars, key, made);
  Py_DECREF(key);
  if (rc < 0) {
    Py_DECREF(made);
    return nullptr;
  }
  return made;
}

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
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "setup_call(Compiled, scalar_array)");
    return nullptr;
  }
  Py_XSETREF(g_compiled_type, Py_NewRef(args[0]));
  Py_XSETREF(g_scalar_array, Py_NewRef(args[1]));
  if (!g_scalars && !(g_scalars = PyDict_New())) return nullptr;
  PyDict_Clear(g_scalars);
  Py_RETURN_NONE;
}

PyObject* setup(PyObject*, PyObject* arg) {
  Py_XSETREF(g_device_data, Py_NewRef(arg));
  Py_RETURN_NONE;
}

PyObject* calls(PyObject*, PyObject*) {
  return Py_BuildValue("{sKsKsKsKsK}", "classify", (unsigned long long)n_classify,
                       "classify_fallback", (unsigned long long)n_classify_fallback,
                       "wrap", (unsigned long long)n_wrap, "new_tensor",
                       (unsigned long long)n_new_tensor, "call", (unsigned long long)n_call);
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
     METH_FASTCALL, "setup_call(Compiled, scalar_array): what call() needs from JAX."},
    {"calls", calls, METH_NOARGS, "Call counters of the fast paths (tests read them)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_native",
                          "torch_tpu's eager hot path in C++ (csrc/fastpath.cpp).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native() {
  s_key = PyUnicode_InternFromString("key");
  s_dyn = PyUnicode_InternFromString("dyn");
  s_slot_data = PyUnicode_InternFromString("slot_data");
  s_device = PyUnicode_InternFromString("device");
  s_tpu = PyUnicode_InternFromString("_tpu");
  s_index = PyUnicode_InternFromString("index");
  s_sig = PyUnicode_InternFromString("sig");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_shape = PyUnicode_InternFromString("shape");
  s_call = PyUnicode_InternFromString("_call");
  PyObject* m = PyModule_Create(&module_def);
  // The torch it was compiled against: runtime/fastpath.py uses it with no other.
  if (m && PyModule_AddStringConstant(m, "TORCH_VERSION", TORCH_TPU_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
