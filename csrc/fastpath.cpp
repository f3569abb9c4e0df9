// torch_tpu.runtime._native: the eager hot path's per-call bookkeeping in C++.
//
// Behaviour stays in Python (runtime/executor.py, runtime/storage.py); these
// functions do the same bookkeeping without the interpreter's per-step cost,
// and hand anything unusual back to Python (`classify` returns False) rather
// than implement a second copy of the rules:
//
//   classify(sig, kinds, vals) -> bool
//       executor._classify's hit path: fills sig.key, sig.dyn, sig.slot_data
//       and sig.device for calls whose arguments are tpu tensors (the
//       storage's whole array, or a view of it), Scalars, static values and
//       None. Returns False, having touched only `sig`, for anything else
//       (lists of tensors, CPU tensors, lazy conj/neg and complex32 views,
//       device mismatches): the caller then runs the Python classifier on a
//       fresh signature.
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
//   register_kernel(schema_name, overload, op, name, kinds, unboxed) -> bool
//       a C++ kernel (unboxed for the common signatures where `unboxed`) for the op at PrivateUse1 that runs its cache hits
//       from the dispatcher without entering Python-level kernel code (see
//       "the C++ kernel" below); every other call goes to the op's Python
//       kernel, which executor.install_kernel registered for PrivateUse2.
//   setup_kernel(...): the executor's state the kernel reads.
//   setup(DeviceData) / calls() -> dict of call counters (tests read them).
#include <Python.h>
#include <structmember.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "device_guard.h"

#ifndef TORCH_TPU_TORCH_VERSION
#define TORCH_TPU_TORCH_VERSION "unknown"
#endif

namespace {

// Argument kinds: executor._KIND_OF_TYPE's values (_T, _OT, ... in order).
enum Kind : long { T = 0, OT, LT, LOT, S, OS, X, G, LS, S1 };

// programs.KeyTag.ONE (borrowed from the module; looked up once): the key
// part of an alpha (kind S1) that is the int 1, which is not an input then.
PyObject* g_tag_one = nullptr;
PyObject* tag_one() {
  if (g_tag_one) return g_tag_one;
  PyObject* mod = PyImport_ImportModule("torch_tpu.runtime.programs");
  PyObject* tags = mod ? PyObject_GetAttrString(mod, "KeyTag") : nullptr;
  PyObject* one = tags ? PyObject_GetAttrString(tags, "ONE") : nullptr;
  Py_XDECREF(tags);
  Py_XDECREF(mod);
  g_tag_one = one;  // (kept for the process)
  return one;
}

bool is_int_one(PyObject* v) {
  if (!PyLong_CheckExact(v)) return false;
  int overflow = 0;
  long x = PyLong_AsLongAndOverflow(v, &overflow);
  return !overflow && x == 1;
}

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
PyObject* g_empty_list = nullptr;     // the dyn list of a memo hit without Scalar inputs
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

// DeviceData's slots (raw, index, shape, dtype, sig, origin), read and
// filled by offset where setup() found the class laid out as expected.
enum DD : int { DD_RAW, DD_INDEX, DD_SHAPE, DD_DTYPE, DD_SIG, DD_ORIGIN };
Py_ssize_t g_dd_offsets[6] = {0};
bool g_dd_direct = false;
PyObject* g_dd_names[6] = {nullptr};

// data.<slot> (a new reference), as PyObject_GetAttr gives it.
PyObject* dd_get(PyObject* data, int which) {
  if (g_dd_direct && Py_TYPE(data) == reinterpret_cast<PyTypeObject*>(g_device_data)) {
    PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(data) + g_dd_offsets[which]);
    if (v) return Py_NewRef(v);
  }
  return PyObject_GetAttr(data, g_dd_names[which]);
}

// ---------------------------------------------------------------- classify

// The DeviceData on t's storage (a new reference), or null with no error
// where there is none (Python raises its error for that tensor).
PyObject* storage_data(const at::Tensor& t) {
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
int tensor_data(const at::Tensor& t, PyObject** data) {
  if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::PrivateUse1)
    return 0;
  if (t.is_conj() || t.is_neg()) return 0;
  *data = storage_data(t);
  return *data ? 1 : PyErr_Occurred() ? -1 : 0;
}

// Make data's device the call's: 1, or 0 for a second device (Python raises
// PyTorch's error), or -1 with an error set.
int take_device(PyObject* data, long& device) {
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
int whole_array(const at::Tensor& t, PyObject* data) {
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

  // A view of the storage: _Signature.tensor's view branch. Its key part is
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

// ------------------------------------------------------------ the C++ kernel
//
// register_kernel(schema_name, overload, op, name, kinds) puts a boxed C++
// kernel in front of an op's Python kernel (runtime/executor.py _Runner):
// the Python kernel moves to the PrivateUse2 key, which no tensor carries,
// and this kernel, at PrivateUse1, runs a call itself only when it is a hit
// of the executor's cache whose entry the executor marked fast
// (executor._fast_spec): plain tpu tensors, Python scalars and static values
// in; tensors out. It builds the executor's key (the same tuple as
// _Runner.__call__), finds the entry in the same LRU, updates the same
// statistics, calls the executable as call() does and makes the result
// tensors as wrap() does. In fused mode it records the hit instead
// (fused.record_native: the same recording as the executor's, without its
// Python path) and wraps the result nodes. Anything else (a miss, complex32
// and lazy conj/neg views, CPU tensors, a recording that would run the trace,
// an entry still compiling or
// an input still being computed in the background, LAUNCH_BLOCKING, any
// Python error) redispatches to the Python kernel, which stays the
// definition of behaviour.

enum Conv : int { C_TENSOR, C_SCALAR, C_SCALAR1, C_STATIC_INT, C_STATIC_FLOAT, C_STATIC_BOOL,
                  C_STATIC_STR, C_STATIC_DTYPE, C_STATIC_INTLIST, C_STATIC_SCALAR };

struct ArgSpec {
  long kind;
  int conv;
};

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

const char* kSpecCapsule = "torch_tpu.fastspec";

PyObject* g_executor_dict = nullptr;   // executor module's __dict__
PyObject* g_fused_dict = nullptr;
PyObject* g_olevel_dict = nullptr;
PyObject* g_precision_state = nullptr; // jax config state (its .value) or None
PyObject* g_precision_fn = nullptr;    // precision.cache_token
PyObject* g_spec_fn = nullptr;         // executor._fast_spec(entry)
PyObject* g_array_type = nullptr;      // jax's ArrayImpl
PyObject *s_cache, *s_launch_blocking, *s_active, *s_level, *s_fast,
    *s_raw, *s_move_to_end, *s_value, *s_record_native;
uint64_t n_kernel = 0, n_kernel_fallback = 0, n_unboxed = 0, n_memo = 0, n_fused = 0;
bool g_memo_on = true;  // fastpath.MEMO (TORCH_TPU_NATIVE_MEMO=0: off)

torch::Library* g_lib = nullptr;

bool truthy_global(PyObject* dict, PyObject* name, int* out) {
  PyObject* v = PyDict_GetItemWithError(dict, name);  // borrowed
  if (!v) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
    return false;
  }
  int t = PyObject_IsTrue(v);
  if (t < 0) return false;
  *out = t;
  return true;
}

// DeviceData(array, index, dtype, origin) for a result whose shape and
// dtype the entry knows: the object __init__ makes, slots filled directly.
PyObject* device_data(PyObject* array, PyObject* index, const OutSpec& o, PyObject* origin) {
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

FastSpec* spec_from(PyObject* desc) {
  // desc: (compiled, ((dtype, shape), ...)) from executor._fast_spec.
  if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 2 ||
      !PyTuple_Check(PyTuple_GET_ITEM(desc, 1))) {
    PyErr_SetString(PyExc_TypeError, "_fast_spec: expected (compiled, ((dtype, shape), ...))");
    return nullptr;
  }
  auto* spec = new FastSpec();
  spec->compiled = Py_NewRef(PyTuple_GET_ITEM(desc, 0));
  PyObject* outs = PyTuple_GET_ITEM(desc, 1);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); ++i) {
    PyObject* item = PyTuple_GET_ITEM(outs, i);
    OutSpec o{};
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
        !dtype_arg(PyTuple_GET_ITEM(item, 0), o.dtype)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "_fast_spec: bad output");
      delete spec;
      return nullptr;
    }
    o.dtype_obj = Py_NewRef(PyTuple_GET_ITEM(item, 0));
    o.shape = PySequence_Tuple(PyTuple_GET_ITEM(item, 1));
    o.sig = o.shape ? PyTuple_Pack(2, o.shape, o.dtype_obj) : nullptr;
    spec->outs.push_back(o);
    if (!o.sig || !int_sequence(o.shape, spec->outs.back().sizes)) {
      delete spec;
      return nullptr;
    }
    OutSpec& b = spec->outs.back();
    contiguous_strides(b.sizes, b.strides);
    uint64_t numel = 1;
    for (int64_t s : b.sizes) numel *= static_cast<uint64_t>(s);
    b.nbytes = numel * c10::elementSize(b.dtype);
  }
  return spec;
}

void spec_capsule_free(PyObject* cap) {
  delete static_cast<FastSpec*>(PyCapsule_GetPointer(cap, kSpecCapsule));
}

// The entry's FastSpec (borrowed from its capsule), or null with no error
// when the entry is not (or not yet) one the kernel runs.
FastSpec* entry_spec(PyObject* entry) {
  PyObject* fast = PyObject_GetAttr(entry, s_fast);
  if (!fast) return nullptr;
  if (fast == Py_None) {
    Py_DECREF(fast);
    PyObject* desc = PyObject_CallOneArg(g_spec_fn, entry);
    if (!desc) return nullptr;
    if (desc == Py_None) {  // not yet (e.g. still compiling): ask again next time
      Py_DECREF(desc);
      return nullptr;
    }
    if (desc == Py_False) {
      fast = desc;
    } else {
      FastSpec* spec = spec_from(desc);
      Py_DECREF(desc);
      if (!spec) return nullptr;
      fast = PyCapsule_New(spec, kSpecCapsule, spec_capsule_free);
      if (!fast) {
        delete spec;
        return nullptr;
      }
    }
    if (PyObject_SetAttr(entry, s_fast, fast) < 0) {
      Py_DECREF(fast);
      return nullptr;
    }
  }
  FastSpec* spec = PyCapsule_CheckExact(fast)
                       ? static_cast<FastSpec*>(PyCapsule_GetPointer(fast, kSpecCapsule))
                       : nullptr;
  Py_DECREF(fast);  // the entry keeps it
  return spec;
}

PyObject* scalar_ivalue(const c10::IValue& v) {
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return Py_NewRef(v.toBool() ? Py_True : Py_False);
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    return PyComplex_FromDoubles(c.real(), c.imag());
  }
  return nullptr;  // symbolic: not here (no error set)
}

// A CPU wrapped number (`x + 2`): the Python scalar the dispatcher hands a
// Python kernel for it (torch::jit::toPyObject), or null with no error.
PyObject* wrapped_number(const at::Tensor& t) {
  if (!t.unsafeGetTensorImpl()->is_wrapped_number() || !t.device().is_cpu()) return nullptr;
  switch (t.scalar_type()) {
    case at::ScalarType::Double:
      return PyFloat_FromDouble(*t.const_data_ptr<double>());
    case at::ScalarType::Long:
      return PyLong_FromLongLong(*t.const_data_ptr<int64_t>());
    case at::ScalarType::Bool:
      return Py_NewRef(*t.const_data_ptr<bool>() ? Py_True : Py_False);
    default:
      return nullptr;
  }
}

// The kernel's cache keys: tuples whose hash is the plain tuple's (CPython's
// tuplehash) with the op's hash known in advance. An OpOverload hashes in
// Python (OpOverload.__hash__), and a lookup hashes its key twice (the get
// and OrderedDict.move_to_end): that alone cost more than the rest of the key.
// The cache stores the Python kernel's plain tuples; these compare equal to
// them (tuple equality), and setup checks that the hashes agree.
PyTypeObject* g_key_type = nullptr;
std::unordered_map<PyObject*, Py_hash_t>* g_op_hashes = nullptr;

Py_hash_t key_hash(PyObject* self) {
#if SIZEOF_PY_UHASH_T > 4
  const Py_uhash_t p1 = 11400714785074694791ULL, p2 = 14029467366897019727ULL,
                   p5 = 2870177450012600261ULL;
#define TPU_XXROTATE(x) ((x << 31) | (x >> 33))
#else
  const Py_uhash_t p1 = 2654435761UL, p2 = 2246822519UL, p5 = 374761393UL;
#define TPU_XXROTATE(x) ((x << 13) | (x >> 19))
#endif
  Py_ssize_t n = PyTuple_GET_SIZE(self);
  Py_uhash_t acc = p5;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(self, i);
    Py_uhash_t lane;
    auto known = i == 0 ? g_op_hashes->find(item) : g_op_hashes->end();
    if (known != g_op_hashes->end()) {
      lane = static_cast<Py_uhash_t>(known->second);
    } else {
      Py_hash_t h = PyObject_Hash(item);
      if (h == -1) return -1;
      lane = static_cast<Py_uhash_t>(h);
    }
    acc += lane * p2;
    acc = TPU_XXROTATE(acc);
    acc *= p1;
  }
#undef TPU_XXROTATE
  acc += static_cast<Py_uhash_t>(n) ^ (p5 ^ 3527539UL);
  if (acc == static_cast<Py_uhash_t>(-1)) return 1546275796;
  return static_cast<Py_hash_t>(acc);
}

// A key of the list's items: a Key where hashes agree, else a plain tuple.
PyObject* make_key(PyObject* list) {
  if (!g_key_type) return PyList_AsTuple(list);
  Py_ssize_t n = PyList_GET_SIZE(list);
  PyObject* k = g_key_type->tp_alloc(g_key_type, n);
  if (!k) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(k, i, Py_NewRef(PyList_GET_ITEM(list, i)));
  return k;
}

// Make the Key type and check it against tuple's own hash on `sample`
// (a list whose first item is a registered op); no Key type if they differ.
bool setup_key_type(PyObject* sample) {
  if (!g_key_type) {
    PyType_Slot slots[] = {{Py_tp_hash, reinterpret_cast<void*>(key_hash)},
                           {Py_tp_doc, const_cast<char*>("An executor cache key (a tuple).")},
                           {0, nullptr}};
    PyType_Spec spec = {"torch_tpu.runtime._native.Key", 0, 0,
                        Py_TPFLAGS_DEFAULT, slots};  // (GC support: tuple's)
    PyObject* bases = PyTuple_Pack(1, reinterpret_cast<PyObject*>(&PyTuple_Type));
    PyObject* t = bases ? PyType_FromSpecWithBases(&spec, bases) : nullptr;
    Py_XDECREF(bases);
    if (!t) {
      PyErr_Clear();  // plain tuples, then
      return false;
    }
    g_key_type = reinterpret_cast<PyTypeObject*>(t);
  }
  PyObject* plain = PyList_AsTuple(sample);
  PyObject* key = plain ? make_key(sample) : nullptr;
  bool same = key && Py_TYPE(key) == g_key_type && PyObject_Hash(plain) == PyObject_Hash(key) &&
              PyObject_RichCompareBool(plain, key, Py_EQ) == 1;
  Py_XDECREF(plain);
  Py_XDECREF(key);
  PyErr_Clear();
  if (!same) Py_CLEAR(g_key_type);  // plain tuples from here on
  return same;
}

// -------------------------------------------------------------- the memo
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

void memo_clear(std::unordered_map<MemoKey, Memo, MemoKeyHash>& memo) {
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

struct FastKernel;
std::vector<FastKernel*> g_kernels;  // every registered kernel (they live as long as g_lib)
const at::Tensor kNotGiven;          // run()'s "this argument is in iv[]" marker
uint64_t g_pending_hits = 0;         // hits not yet handed to programs.STATS

struct FastKernel final : c10::OperatorKernel {
  PyObject* op;    // owned: the key's head
  PyObject* name;  // owned: str(op)
  uint64_t hits = 0;  // hits since the last take_stats()
  std::vector<ArgSpec> args;
  size_t n_returns;
  std::unordered_map<MemoKey, Memo, MemoKeyHash> memo;  // recent hits (see "the memo")

  // 1: done, results in `made`; 0: the Python kernel's call; -1: a Python
  // error (cleared by the caller, which then also hands the call to Python).
  // The call's arguments: `tens[i]`, unless it is &kNotGiven, is argument i
  // as the unboxed kernel received it (a tensor, or null for None); else iv[i].
  int run(const c10::IValue* iv, const at::Tensor* const* tens, std::vector<at::Tensor>& made) {
    // Fused mode records a hit (fused.record_native) where strict mode runs
    // it. Work in the background (async_compile.OUTSTANDING) needs no check:
    // what would make the executor launch a call (async_compile.deferred: an
    // entry still compiling, an input still being computed) makes this
    // kernel hand it to Python anyway (no fast spec yet; execute() takes
    // only inputs that are arrays), and any other call runs now there too.
    int fused_on, flag;
    if (!truthy_global(g_fused_dict, s_active, &fused_on)) return -1;
    if (!truthy_global(g_executor_dict, s_launch_blocking, &flag)) return -1;
    if (flag) return 0;

    MemoCall mc;
    int memoable = 0;
    try {
      if (g_memo_on) memoable = describe(iv, tens, mc);
    } catch (const std::exception&) {
      memoable = 0;
    }
    if (memoable < 0) return -1;
    if (memoable > 0) {
      auto it = memo.find(mc.key);
      if (it != memo.end()) return run_memo(it->second, mc, made, fused_on);
    }

    const size_t n = args.size();
    PyObject* key = PyList_New(1);
    PyObject* dyn = PyList_New(0);
    PyObject* slot_data = PyList_New(0);
    int rc = key && dyn && slot_data ? 1 : -1;
    if (rc > 0) PyList_SET_ITEM(key, 0, Py_NewRef(op));
    Classifier c;
    c.key = key;
    c.dyn = dyn;
    c.slot_data = slot_data;
    try {
      for (size_t i = 0; i < n && rc > 0; ++i)
        rc = tens && tens[i] != &kNotGiven ? tensor_arg(c, args[i], tens[i])
                                           : argument(c, args[i], iv[i]);
    } catch (const std::exception&) {
      rc = 0;
    }
    if (rc > 0 && c.device < 0) rc = 0;  // no tpu tensor: _factory_device decides
    if (rc > 0) rc = finish_key(c.device, key);
    PyObject* tkey = rc > 0 ? make_key(key) : nullptr;
    if (rc > 0 && !tkey) rc = -1;
    PyObject* cache = nullptr;
    PyObject* entry = nullptr;  // owned from here, whatever the call's Python code does
    FastSpec* spec = nullptr;
    if (rc > 0) {
      cache = PyDict_GetItemWithError(g_executor_dict, s_cache);  // borrowed
      entry = cache ? PyDict_GetItemWithError(cache, tkey) : nullptr;
      if (!entry) {
        rc = PyErr_Occurred() ? -1 : 0;  // a miss: Python compiles
      } else {
        Py_INCREF(entry);
        spec = entry_spec(entry);  // the entry holds the capsule
        if (!spec) rc = PyErr_Occurred() ? -1 : 0;
        else if (spec->outs.size() != n_returns) rc = 0;
      }
    }
    if (rc > 0)
      rc = hit(fused_on, entry, spec, PySequence_Fast_ITEMS(c.slot_data),
               PyList_GET_SIZE(c.slot_data), c.dyn, c.device, cache, tkey, made);
    if (rc > 0 && memoable > 0) remember(mc, entry, tkey, spec);
    Py_XDECREF(entry);
    Py_XDECREF(tkey);
    Py_XDECREF(key);
    Py_XDECREF(dyn);
    Py_XDECREF(slot_data);
    return rc;
  }

  // A hit the memo knows: the entry's executable on this call's arrays.
  int run_memo(Memo& m, MemoCall& mc, std::vector<at::Tensor>& made, bool fused_on) {
    // Python code runs below (the executable's call path) and may empty the
    // memo: what the call needs is held here, and `m` is not used after.
    PyObject* entry = Py_NewRef(m.entry);
    PyObject* key = Py_NewRef(m.key);
    FastSpec* spec = m.spec;
    bool move = ++m.since_move >= kMoveEvery;
    if (move) m.since_move = 0;
    int rc = 1;
    PyObject* cache = nullptr;  // (null: the LRU order is left as it is)
    if (move) {
      cache = PyDict_GetItemWithError(g_executor_dict, s_cache);  // borrowed
      if (!cache) rc = PyErr_Occurred() ? -1 : 0;
    }
    if (rc > 0)
      rc = hit(fused_on, entry, spec, mc.datas, mc.ns, mc.dyn, mc.device, cache, key, made);
    if (rc > 0) ++n_memo;
    Py_DECREF(key);
    Py_DECREF(entry);
    return rc;
  }

  void remember(MemoCall& mc, PyObject* entry, PyObject* tkey, FastSpec* spec) {
    if (memo.size() >= kMemoMax) memo_clear(memo);
    Memo m{Py_NewRef(entry), Py_NewRef(tkey), Py_NewRef(mc.prec), Py_NewRef(mc.level), spec, 0};
    if (!memo.emplace(mc.key, m).second) {  // (looked up before the call: not there)
      Py_DECREF(m.entry);
      Py_DECREF(m.key);
      Py_DECREF(m.prec);
      Py_DECREF(m.level);
    }
  }

  // The call's memo key (1), or 0 where the memo cannot describe it, or -1.
  int describe(const c10::IValue* iv, const at::Tensor* const* tens, MemoCall& m) {
    for (size_t i = 0; i < args.size(); ++i) {
      int rc = tens && tens[i] != &kNotGiven ? memo_tensor(m, args[i], tens[i])
                                             : memo_value(m, args[i], iv[i]);
      if (rc <= 0) return rc;
    }
    if (m.device < 0) return 0;
    m.prec = g_precision_state != Py_None ? PyObject_GetAttr(g_precision_state, s_value)
                                          : PyObject_CallNoArgs(g_precision_fn);
    if (!m.prec) return -1;
    m.level = PyDict_GetItemWithError(g_olevel_dict, s_level);  // borrowed
    if (!m.level) return PyErr_Occurred() ? -1 : 0;
    auto dt = c10::typeMetaToScalarType(c10::get_default_dtype());
    return m.key.push(m.device) && m.key.push(static_cast<int64_t>(dt)) &&
                   m.key.push(reinterpret_cast<intptr_t>(m.prec)) &&
                   m.key.push(reinterpret_cast<intptr_t>(m.level))
               ? 1
               : 0;
  }

  int memo_tensor(MemoCall& m, const ArgSpec& a, const at::Tensor* t) {
    if (a.conv != C_TENSOR) return 0;
    if (!t || !t->defined()) return a.kind == OT && m.key.push(M_NONE) ? 1 : 0;
    if (t->unsafeGetTensorImpl()->is_wrapped_number()) {
      PyObject* s = wrapped_number(*t);
      if (!s) return PyErr_Occurred() ? -1 : 0;
      int r = m.scalar(s);
      Py_DECREF(s);
      return r;
    }
    return m.tensor(*t);
  }

  int memo_value(MemoCall& m, const ArgSpec& a, const c10::IValue& v) {
    MemoKey& k = m.key;
    if (a.conv != C_TENSOR && a.conv != C_SCALAR && a.conv != C_SCALAR1 && v.isNone())
      return k.push(M_NONE) ? 1 : 0;
    switch (a.conv) {
      case C_TENSOR:
        if (v.isNone()) return memo_tensor(m, a, nullptr);
        return v.isTensor() ? memo_tensor(m, a, &v.toTensor()) : 0;
      case C_SCALAR1:
        if (v.isInt() && v.toInt() == 1) return k.push(M_ONE) ? 1 : 0;
        [[fallthrough]];
      case C_SCALAR: {
        if (v.isNone()) return a.kind == OS && k.push(M_NONE) ? 1 : 0;
        PyObject* s = scalar_ivalue(v);
        if (!s) return PyErr_Occurred() ? -1 : 0;
        int r = m.scalar(s);
        Py_DECREF(s);
        return r;
      }
      case C_STATIC_INT:
      case C_STATIC_DTYPE:
        return v.isInt() && k.push(M_VALUE) && k.push(v.toInt()) ? 1 : 0;
      case C_STATIC_BOOL:
        return v.isBool() && k.push(M_VALUE) && k.push(v.toBool()) ? 1 : 0;
      case C_STATIC_FLOAT: {
        if (!v.isDouble()) return 0;
        double d = v.toDouble();
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        return k.push(M_VALUE) && k.push(bits) ? 1 : 0;
      }
      case C_STATIC_INTLIST: {
        if (!v.isIntList()) return 0;
        auto list = v.toIntList();
        bool ok = k.push(M_VALUE) && k.push(static_cast<int64_t>(list.size()));
        for (size_t i = 0; ok && i < list.size(); ++i) ok = k.push(list.get(i));
        return ok ? 1 : 0;
      }
      default:
        return 0;  // strings, static Scalars: the dict path
    }
  }

  int argument(Classifier& c, const ArgSpec& a, const c10::IValue& v) {
    if (a.conv != C_TENSOR && a.conv != C_SCALAR && a.conv != C_SCALAR1 && v.isNone())
      return PyList_Append(c.key, Py_None) < 0 ? -1 : 1;
    switch (a.conv) {
      case C_TENSOR:
        if (v.isNone()) return tensor_arg(c, a, nullptr);
        if (!v.isTensor()) return 0;
        return tensor_arg(c, a, &v.toTensor());
      case C_SCALAR1:
        if (v.isInt() && v.toInt() == 1) {  // (a Python bool is isBool: an input)
          PyObject* one = tag_one();
          if (!one) return -1;
          return PyList_Append(c.key, one) < 0 ? -1 : 1;
        }
        [[fallthrough]];
      case C_SCALAR: {
        if (v.isNone()) return a.kind == OS ? (PyList_Append(c.key, Py_None) < 0 ? -1 : 1) : 0;
        PyObject* s = scalar_ivalue(v);
        if (!s) return PyErr_Occurred() ? -1 : 0;
        int r = c.scalar(s);
        Py_DECREF(s);
        return r;
      }
      default:
        break;
    }
    PyObject* s = nullptr;
    switch (a.conv) {
      case C_STATIC_INT:
        if (!v.isInt()) return 0;
        s = PyLong_FromLongLong(v.toInt());
        break;
      case C_STATIC_FLOAT:
        if (!v.isDouble()) return 0;
        s = PyFloat_FromDouble(v.toDouble());
        break;
      case C_STATIC_BOOL:
        if (!v.isBool()) return 0;
        s = Py_NewRef(v.toBool() ? Py_True : Py_False);
        break;
      case C_STATIC_STR: {
        if (!v.isString()) return 0;
        auto str = v.toStringRef();
        s = PyUnicode_FromStringAndSize(str.data(), static_cast<Py_ssize_t>(str.size()));
        break;
      }
      case C_STATIC_DTYPE:
        if (!v.isInt()) return 0;
        s = Py_NewRef(reinterpret_cast<PyObject*>(
            torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
        break;
      case C_STATIC_INTLIST: {
        if (!v.isIntList()) return 0;
        auto list = v.toIntList();
        s = PyTuple_New(static_cast<Py_ssize_t>(list.size()));
        for (size_t i = 0; s && i < list.size(); ++i) {
          PyObject* x = PyLong_FromLongLong(list.get(i));
          if (!x) {
            Py_CLEAR(s);
            break;
          }
          PyTuple_SET_ITEM(s, static_cast<Py_ssize_t>(i), x);
        }
        break;
      }
      case C_STATIC_SCALAR:
        s = scalar_ivalue(v);
        if (!s) return PyErr_Occurred() ? -1 : 0;
        break;
      default:
        return 0;
    }
    if (!s) return -1;
    int r = PyList_Append(c.key, s);
    Py_DECREF(s);
    return r < 0 ? -1 : 1;
  }

  // A tensor argument (null: None).
  int tensor_arg(Classifier& c, const ArgSpec& a, const at::Tensor* t) {
    if (a.conv != C_TENSOR) return 0;
    if (!t || !t->defined())
      return a.kind == OT ? (PyList_Append(c.key, Py_None) < 0 ? -1 : 1) : 0;
    if (t->unsafeGetTensorImpl()->is_wrapped_number()) {
      PyObject* s = wrapped_number(*t);
      if (!s) return 0;
      int r = c.scalar(s);
      Py_DECREF(s);
      return r;
    }
    return c.tensor_value(*t);
  }

  // The key's context parts, as _Runner.__call__ appends them.
  int finish_key(long device, PyObject* key) {
    PyObject* d = PyLong_FromLong(device);
    if (!d) return -1;
    int r = PyList_Append(key, d);
    Py_DECREF(d);
    if (r < 0) return -1;
    PyObject* dt = reinterpret_cast<PyObject*>(
        torch::getTHPDtype(c10::typeMetaToScalarType(c10::get_default_dtype())));
    if (PyList_Append(key, dt) < 0) return -1;
    PyObject* tok = g_precision_state != Py_None ? PyObject_GetAttr(g_precision_state, s_value)
                                                 : PyObject_CallNoArgs(g_precision_fn);
    if (!tok) return -1;
    r = PyList_Append(key, tok);
    Py_DECREF(tok);
    if (r < 0) return -1;
    PyObject* level = PyDict_GetItemWithError(g_olevel_dict, s_level);
    if (!level) return PyErr_Occurred() ? -1 : 0;
    return PyList_Append(key, level) < 0 ? -1 : 1;
  }

  // A cache hit: its executable run (strict mode) or the op recorded (fused
  // mode) on the call's DeviceData and Scalars (`dyn`; null: none), the
  // entry's place in the LRU order kept (unless `cache` is null), the hit
  // counted and the result tensors made.
  int hit(bool fused_on, PyObject* entry, FastSpec* spec, PyObject* const* datas, Py_ssize_t ns,
          PyObject* dyn, long device, PyObject* cache, PyObject* tkey,
          std::vector<at::Tensor>& made) {
    PyObject* result = nullptr;
    int rc = fused_on ? record(entry, datas, ns, dyn, device, &result)
                      : execute(spec, datas, ns, dyn ? dyn : g_empty_list, device, &result);
    if (rc > 0 && cache) rc = move_to_end(cache, tkey);
    if (rc > 0) {
      ++hits;
      ++g_pending_hits;
      rc = push_results(spec, result, device, made);
    }
    Py_XDECREF(result);
    return rc;
  }

  // Fused mode's hit: fused.record_native(entry, datas, dyn, device, name)
  // records the op and returns (result nodes, ()) as the executable returns
  // its arrays; 0 (nothing recorded) where the executor's path must decide
  // (no program, or the recording would run the trace and may raise the
  // recorded ops' errors, which reach the user from there).
  int record(PyObject* entry, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn, long device,
             PyObject** result) {
    PyObject* fn = PyDict_GetItemWithError(g_fused_dict, s_record_native);  // borrowed
    if (!fn) return PyErr_Occurred() ? -1 : 0;
    PyObject* slots = PyTuple_New(ns);
    if (!slots) return -1;
    for (Py_ssize_t i = 0; i < ns; ++i) PyTuple_SET_ITEM(slots, i, Py_NewRef(datas[i]));
    // The trace keeps the list: its own, never the shared empty one.
    PyObject* d = dyn ? Py_NewRef(dyn) : PyList_New(0);
    PyObject* dev = d ? PyLong_FromLong(device) : nullptr;
    if (dev) {
      PyObject* a[5] = {entry, slots, d, dev, name};
      *result = PyObject_Vectorcall(fn, a, 5, nullptr);
    }
    Py_XDECREF(dev);
    Py_XDECREF(d);
    Py_DECREF(slots);
    if (!*result) return -1;
    if (*result == Py_None) {
      Py_CLEAR(*result);
      return 0;
    }
    ++n_fused;
    return 1;
  }

  int execute(FastSpec* spec, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn, long device,
              PyObject** result) {
    if (!g_compiled_type || Py_TYPE(spec->compiled) != reinterpret_cast<PyTypeObject*>(g_compiled_type))
      return 0;
    PyObject* arrays = PyList_New(ns);
    if (!arrays) return -1;
    for (Py_ssize_t i = 0; i < ns; ++i) {
      PyObject* raw = dd_get(datas[i], DD_RAW);
      if (!raw) {
        Py_DECREF(arrays);
        return -1;
      }
      PyList_SET_ITEM(arrays, i, raw);
      if (Py_TYPE(raw) != reinterpret_cast<PyTypeObject*>(g_array_type)) {
        Py_DECREF(arrays);  // a deferred value: Python resolves or launches it
        return 0;
      }
    }
    PyObject* dev = PyLong_FromLong(device);
    if (!dev) {
      Py_DECREF(arrays);
      return -1;
    }
    if (!spec->fn) {  // Compiled._call: JAX's C++ call path, made by its first call
      PyObject* fn = PyObject_GetAttr(spec->compiled, s_call);
      if (fn && fn != Py_None) spec->fn = fn;
      else Py_XDECREF(fn);
      PyErr_Clear();
    }
    if (!spec->fn) {  // not called yet: call() calls it the first time
      PyObject* a[4] = {spec->compiled, arrays, dyn, dev};
      *result = call(nullptr, a, 4);
    } else {
      // call()'s work, with the entry's executable call path at hand.
      Py_ssize_t nd = PyList_GET_SIZE(dyn);
      PyObject* inputs = PyList_New(nd);
      for (Py_ssize_t i = 0; inputs && i < nd; ++i) {
        PyObject* v = device_scalar(PyList_GET_ITEM(dyn, i), dev);
        if (!v) Py_CLEAR(inputs);
        else PyList_SET_ITEM(inputs, i, v);
      }
      if (inputs) {
        PyObject* a[2] = {arrays, inputs};
        *result = PyObject_Vectorcall(spec->fn, a, 2, nullptr);
        Py_DECREF(inputs);
        if (*result) ++n_call;
      }
    }
    Py_DECREF(dev);
    Py_DECREF(arrays);
    return *result ? 1 : -1;
  }

  // The entry's place in the LRU order, as _Runner.__call__ keeps it on a
  // hit. The hit counts stay in C++ (this kernel's `hits`, g_pending_hits)
  // until programs.CacheStats reads them (take_stats): no Python objects per
  // call.
  int move_to_end(PyObject* cache, PyObject* tkey) {
    // OrderedDict.move_to_end, looked up once per cache type.
    static PyTypeObject* mte_type = nullptr;
    static PyObject* mte = nullptr;
    if (Py_TYPE(cache) != mte_type) {
      PyObject* m = PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(cache)), s_move_to_end);
      if (!m) return -1;
      Py_XSETREF(mte, m);
      mte_type = Py_TYPE(cache);
    }
    PyObject* mte_args[2] = {cache, tkey};
    PyObject* moved = PyObject_Vectorcall(mte, mte_args, 2, nullptr);
    if (!moved) return -1;
    Py_DECREF(moved);
    return 1;
  }

  int push_results(FastSpec* spec, PyObject* result, long device, std::vector<at::Tensor>& made) {
    // The program returns (outs, new_bases); the entry writes no storage.
    PyObject* outs = PySequence_Check(result) && PySequence_Size(result) == 2
                         ? PySequence_GetItem(result, 0)
                         : nullptr;
    if (!outs) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "unexpected executable result");
      return -1;
    }
    PyObject* fast = PySequence_Fast(outs, "executable outputs");
    Py_DECREF(outs);
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != static_cast<Py_ssize_t>(spec->outs.size())) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_RuntimeError, "executable returned another number of outputs");
      return -1;
    }
    PyObject* index = PyLong_FromLong(device);
    made.clear();
    int r = index ? 1 : -1;
    for (size_t i = 0; r > 0 && i < spec->outs.size(); ++i) {
      const OutSpec& o = spec->outs[i];
      PyObject* data = device_data(PySequence_Fast_GET_ITEM(fast, i), index, o, name);
      if (!data) {
        r = -1;
        break;
      }
      at::Tensor t = make_tensor(o.sizes, o.strides, o.dtype, static_cast<c10::DeviceIndex>(device),
                                 o.nbytes);
      PyObject* storage = THPStorage_Wrap(t.storage());
      r = storage && PyObject_SetAttr(storage, s_tpu, data) == 0 ? 1 : -1;
      Py_XDECREF(storage);
      Py_DECREF(data);
      made.push_back(std::move(t));
    }
    Py_XDECREF(index);
    Py_DECREF(fast);
    return r;
  }

  // Run the call in C++ (true, results in `made`), or false: the caller
  // hands it to the Python kernel.
  bool try_run(const c10::IValue* iv, const at::Tensor* const* tens, std::vector<at::Tensor>& made) {
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = run(iv, tens, made);
    if (rc < 0) PyErr_Clear();  // the Python kernel redoes the call and raises its error
    if (rc > 0) ++n_kernel, n_unboxed += tens != nullptr;
    else ++n_kernel_fallback;
    PyGILState_Release(gil);
    return rc > 0;
  }

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    std::vector<at::Tensor> made;
    if (try_run(stack->data() + (stack->size() - args.size()), nullptr, made)) {
      torch::jit::drop(*stack, args.size());
      for (auto& t : made) torch::jit::push(*stack, std::move(t));
      return;
    }
    handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
  }
};

// The unboxed kernel: for the common signatures below, the kernel the
// dispatcher calls with the op's C++ arguments. A boxed kernel would have
// them copied onto an IValue stack first, and copying a tensor that Python
// holds takes the GIL (its PyObject is increfed) while the dispatcher runs
// without it: twice per binary op, before this kernel takes the GIL itself.
c10::IValue iv_of(const at::Tensor&) { return c10::IValue(); }
c10::IValue iv_of(const c10::Scalar& s) { return c10::IValue(s); }
c10::IValue iv_of(std::optional<at::ScalarType> d) { return d ? c10::IValue(*d) : c10::IValue(); }
const at::Tensor* tensor_of(const at::Tensor& t) { return &t; }
const at::Tensor* tensor_of(const c10::Scalar&) { return &kNotGiven; }
const at::Tensor* tensor_of(std::optional<at::ScalarType>) { return &kNotGiven; }

template <class... A>
torch::CppFunction unboxed_kernel(FastKernel* k, const c10::OperatorHandle& handle) {
  auto typed = handle.typed<at::Tensor(A...)>();
  return torch::CppFunction([k, typed](A... a) -> at::Tensor {
    c10::IValue iv[] = {iv_of(a)...};
    const at::Tensor* tens[] = {tensor_of(a)...};
    std::vector<at::Tensor> made;
    if (k->try_run(iv, tens, made)) return std::move(made[0]);
    return typed.redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), a...);
  });
}

// The schema's argument types as letters (T tensor, S scalar, D optional
// dtype, ? anything else), to pick an unboxed signature.
std::string signature_letters(const c10::FunctionSchema& schema) {
  std::string out;
  for (const auto& arg : schema.arguments()) {
    const c10::TypePtr& t = arg.real_type();
    if (t->kind() == c10::TypeKind::TensorType) out += 'T';
    else if (t->kind() == c10::TypeKind::NumberType) out += 'S';
    else if (auto opt = t->cast<c10::OptionalType>();
             opt && opt->getElementType()->kind() == c10::TypeKind::ScalarTypeType)
      out += 'D';
    else out += '?';
  }
  return out;
}

// The conversion of one schema argument, or -1 where the kernel does not
// handle that type (the op then keeps only its Python kernel).
int conv_of(long kind, const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();  // (type() says int for a ScalarType)
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (kind) {
    case T:
    case OT:
      return t->kind() == c10::TypeKind::TensorType ? C_TENSOR : -1;
    case S:
    case OS:
      return t->kind() == c10::TypeKind::NumberType ? C_SCALAR : -1;
    case S1:
      return t->kind() == c10::TypeKind::NumberType ? C_SCALAR1 : -1;
    case X:
      break;
    default:
      return -1;
  }
  switch (t->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return C_STATIC_INT;
    case c10::TypeKind::FloatType:
      return C_STATIC_FLOAT;
    case c10::TypeKind::BoolType:
      return C_STATIC_BOOL;
    case c10::TypeKind::StringType:
      return C_STATIC_STR;
    case c10::TypeKind::ScalarTypeType:
      return C_STATIC_DTYPE;
    case c10::TypeKind::NumberType:
      return C_STATIC_SCALAR;
    case c10::TypeKind::ListType: {
      auto e = t->castRaw<c10::ListType>()->getElementType()->kind();
      return e == c10::TypeKind::IntType || e == c10::TypeKind::SymIntType ? C_STATIC_INTLIST : -1;
    }
    default:
      return -1;
  }
}

// register_kernel(schema_name, overload, op, name, kinds, unboxed) -> bool
PyObject* register_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 6 || !PyUnicode_Check(a[0]) || !PyUnicode_Check(a[1]) || !PyTuple_Check(a[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "register_kernel(schema_name, overload, op, name, kinds, unboxed)");
    return nullptr;
  }
  if (!g_executor_dict) {
    PyErr_SetString(PyExc_RuntimeError, "torch_tpu.runtime._native.setup_kernel() was not called");
    return nullptr;
  }
  const char* schema_name = PyUnicode_AsUTF8(a[0]);
  const char* overload = PyUnicode_AsUTF8(a[1]);
  if (!schema_name || !overload) return nullptr;
  try {
    auto handle = c10::Dispatcher::singleton().findSchema({schema_name, overload});
    if (!handle) Py_RETURN_FALSE;
    const auto& schema = handle->schema();
    if (schema.is_mutable() || schema.is_vararg() || schema.returns().empty()) Py_RETURN_FALSE;
    for (const auto& r : schema.returns())
      if (r.type()->kind() != c10::TypeKind::TensorType || r.alias_info()) Py_RETURN_FALSE;
    const auto& sargs = schema.arguments();
    if (static_cast<size_t>(PyTuple_GET_SIZE(a[4])) != sargs.size()) Py_RETURN_FALSE;
    auto kernel = std::make_unique<FastKernel>();
    for (size_t i = 0; i < sargs.size(); ++i) {
      long kind = PyLong_AsLong(PyTuple_GET_ITEM(a[4], static_cast<Py_ssize_t>(i)));
      if (kind == -1 && PyErr_Occurred()) return nullptr;
      int conv = conv_of(kind, sargs[i]);
      if (conv < 0) Py_RETURN_FALSE;
      kernel->args.push_back({kind, conv});
    }
    kernel->n_returns = schema.returns().size();
    Py_hash_t op_hash = PyObject_Hash(a[2]);
    if (op_hash == -1) return nullptr;
    if (!g_op_hashes) g_op_hashes = new std::unordered_map<PyObject*, Py_hash_t>();
    (*g_op_hashes)[a[2]] = op_hash;  // (the op lives as long as the kernel)
    if (g_op_hashes->size() == 1) {
      PyObject* sample = Py_BuildValue("[O(ii)OsO]", a[2], 64, 64, Py_None, "highest",
                                       reinterpret_cast<PyObject*>(&PyLong_Type));
      if (!sample) return nullptr;
      setup_key_type(sample);
      Py_DECREF(sample);
    }
    kernel->op = Py_NewRef(a[2]);
    kernel->name = Py_NewRef(a[3]);
    std::string qualified = std::string(schema_name).substr(std::string(schema_name).find("::") + 2);
    if (*overload) qualified += std::string(".") + overload;
    if (!g_lib)
      g_lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                 __FILE__, __LINE__);
    FastKernel* raw = kernel.get();
    int unboxed = PyObject_IsTrue(a[5]);
    if (unboxed < 0) return nullptr;
    std::string letters = signature_letters(schema);
    using T = const at::Tensor&;
    using S = const c10::Scalar&;
    using D = std::optional<at::ScalarType>;
    if (schema.returns().size() == 1 && unboxed &&
        (letters == "T" || letters == "TT" || letters == "TTS" || letters == "TS" ||
         letters == "TSS" || letters == "TD")) {
      kernel.release();  // lives as long as the library, as the boxed ones do
      const c10::OperatorHandle& h = *handle;
      g_lib->impl(qualified.c_str(),
                  letters == "T"     ? unboxed_kernel<T>(raw, h)
                  : letters == "TT"  ? unboxed_kernel<T, T>(raw, h)
                  : letters == "TTS" ? unboxed_kernel<T, T, S>(raw, h)
                  : letters == "TS"  ? unboxed_kernel<T, S>(raw, h)
                  : letters == "TSS" ? unboxed_kernel<T, S, S>(raw, h)
                                     : unboxed_kernel<T, D>(raw, h));
    } else {
      g_lib->impl(qualified.c_str(),
                  torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
    }
    g_kernels.push_back(raw);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_TRUE;
}

// setup_kernel(executor, fused, opt_level, precision_state, precision_fn,
//              spec_fn, array_type): what the kernel reads.
PyObject* setup_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "setup_kernel(executor, fused, opt_level, "
                                     "precision_state, precision_fn, spec_fn, array_type)");
    return nullptr;
  }
  PyObject* dicts[3];
  for (int i = 0; i < 3; ++i) {
    dicts[i] = PyModule_Check(a[i]) ? PyModule_GetDict(a[i]) : nullptr;
    if (!dicts[i]) {
      PyErr_SetString(PyExc_TypeError, "setup_kernel: expected modules");
      return nullptr;
    }
  }
  Py_XSETREF(g_executor_dict, Py_NewRef(dicts[0]));
  Py_XSETREF(g_fused_dict, Py_NewRef(dicts[1]));
  Py_XSETREF(g_olevel_dict, Py_NewRef(dicts[2]));
  Py_XSETREF(g_precision_state, Py_NewRef(a[3]));
  Py_XSETREF(g_precision_fn, Py_NewRef(a[4]));
  Py_XSETREF(g_spec_fn, Py_NewRef(a[5]));
  Py_XSETREF(g_array_type, Py_NewRef(a[6]));
  Py_RETURN_NONE;
}

// take_stats() -> None, or (hits, {op name: hits}) since the last call, which
// then start again from zero: programs.CacheStats adds them to its counters
// whenever they are read (requests and hits count alike: every kernel call it
// counts is a hit).
PyObject* take_stats(PyObject*, PyObject*) {
  if (!g_pending_hits) Py_RETURN_NONE;
  PyObject* per_op = PyDict_New();
  if (!per_op) return nullptr;
  for (FastKernel* k : g_kernels) {
    if (!k->hits) continue;
    PyObject* prev = PyDict_GetItemWithError(per_op, k->name);  // borrowed
    if (!prev && PyErr_Occurred()) {
      Py_DECREF(per_op);
      return nullptr;
    }
    unsigned long long n = k->hits + (prev ? PyLong_AsUnsignedLongLong(prev) : 0);
    PyObject* v = PyLong_FromUnsignedLongLong(n);
    if (!v || PyDict_SetItem(per_op, k->name, v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(per_op);
      return nullptr;
    }
    Py_DECREF(v);
  }
  PyObject* r = Py_BuildValue("(KN)", static_cast<unsigned long long>(g_pending_hits), per_op);
  if (!r) return nullptr;
  for (FastKernel* k : g_kernels) k->hits = 0;
  g_pending_hits = 0;
  return r;
}

// forget(): every kernel's memo emptied (programs.py: an entry was dropped or
// replaced, so a memo may hold one the executor cache no longer has).
PyObject* forget(PyObject*, PyObject*) {
  for (FastKernel* k : g_kernels) memo_clear(k->memo);
  Py_RETURN_NONE;
}

// set_memo(on): whether kernels remember hits (fastpath.MEMO).
PyObject* set_memo(PyObject*, PyObject* on) {
  int t = PyObject_IsTrue(on);
  if (t < 0) return nullptr;
  g_memo_on = t;
  if (!t) forget(nullptr, nullptr);
  Py_RETURN_NONE;
}

PyObject* calls(PyObject*, PyObject*) {
  return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsN}", "classify", (unsigned long long)n_classify,
                       "classify_fallback", (unsigned long long)n_classify_fallback,
                       "wrap", (unsigned long long)n_wrap, "new_tensor",
                       (unsigned long long)n_new_tensor, "call", (unsigned long long)n_call,
                       "kernel", (unsigned long long)n_kernel, "kernel_fallback",
                       (unsigned long long)n_kernel_fallback, "unboxed",
                       (unsigned long long)n_unboxed, "memo", (unsigned long long)n_memo,
                       "fused", (unsigned long long)n_fused, "hashed_keys",
                       PyBool_FromLong(g_key_type != nullptr));
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
    {"register_kernel",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_kernel)), METH_FASTCALL,
     "register_kernel(schema_name, overload, op, name, kinds, unboxed): the C++ kernel in front of the "
     "op's Python kernel (which must be registered for PrivateUse2); False: not handled"},
    {"setup_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setup_kernel)),
     METH_FASTCALL, "setup_kernel(executor, fused, opt_level, precision_state, "
     "precision_fn, spec_fn, array_type): what the C++ kernel reads"},
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
  {
    const char* names[6] = {"raw", "index", "shape", "dtype", "sig", "origin"};
    for (int i = 0; i < 6; ++i) g_dd_names[i] = PyUnicode_InternFromString(names[i]);
  }
  s_cache = PyUnicode_InternFromString("_CACHE");
  s_launch_blocking = PyUnicode_InternFromString("LAUNCH_BLOCKING");
  s_active = PyUnicode_InternFromString("ACTIVE");
  s_record_native = PyUnicode_InternFromString("record_native");
  s_level = PyUnicode_InternFromString("LEVEL");
  s_fast = PyUnicode_InternFromString("fast");
  s_raw = PyUnicode_InternFromString("raw");
  s_move_to_end = PyUnicode_InternFromString("move_to_end");
  s_value = PyUnicode_InternFromString("value");
  g_empty_list = PyList_New(0);
  PyObject* m = PyModule_Create(&module_def);
  // The torch it was compiled against: runtime/fastpath.py uses it with no other.
  if (m && PyModule_AddStringConstant(m, "TORCH_VERSION", TORCH_TPU_TORCH_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
