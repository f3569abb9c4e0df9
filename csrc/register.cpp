// register_kernel: the C++ kernel in front of an op's Python kernel, boxed
// or unboxed by the op's signature; setup_kernel, take_stats, forget and
// set_memo: the kernels' state as the executor and programs.py see it.
#include <Python.h>
#include <structmember.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>

#include "entry.h"
#include "kernel.h"
#include "native.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

namespace {

torch::Library* g_lib = nullptr;

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

}  // namespace

// register_kernel(schema_name, overload, op, name, kinds, unboxed) -> bool
PyObject* register_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 6 || !PyUnicode_Check(a[0]) || !PyUnicode_Check(a[1]) || !PyTuple_Check(a[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "register_kernel(schema_name, overload, op, name, kinds, unboxed)");
    return nullptr;
  }
  if (!g_context) {
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

// setup_kernel(context, cache, record_native, narrow, spec_fn, array_type):
// what the kernel reads. `context` is runtime.context.CONTEXT: the offsets of
// its `fused`, `launch_blocking` and `opt_level` slots are found here (the
// kernel reads them on every call) and its precision reader kept.
PyObject* setup_kernel(PyObject*, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 6 || !PyDict_Check(a[1]) || !PyCallable_Check(a[2]) || !PyCallable_Check(a[3])) {
    PyErr_SetString(PyExc_TypeError,
                    "setup_kernel(context, cache, record_native, narrow, spec_fn, array_type)");
    return nullptr;
  }
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(a[0]));
  PyObject* names[3] = {s_fused, s_launch_blocking, s_opt_level};
  Py_ssize_t offsets[3];
  for (int i = 0; i < 3; ++i) {
    PyObject* d = PyObject_GetAttr(type, names[i]);
    if (!d) return nullptr;
    bool ok = Py_TYPE(d) == &PyMemberDescr_Type &&
              reinterpret_cast<PyMemberDescrObject*>(d)->d_member->type == T_OBJECT_EX;
    if (ok) offsets[i] = reinterpret_cast<PyMemberDescrObject*>(d)->d_member->offset;
    Py_DECREF(d);
    if (!ok) {
      PyErr_Format(PyExc_TypeError, "setup_kernel: the context's %U is not a slot", names[i]);
      return nullptr;
    }
  }
  PyObject* state = PyObject_GetAttr(a[0], s_precision_state);
  if (!state) return nullptr;
  PyObject* token = PyObject_GetAttr(a[0], s_precision_token);
  if (!token) {
    Py_DECREF(state);
    return nullptr;
  }
  if (state == Py_None && !PyCallable_Check(token)) {
    Py_DECREF(state);
    Py_DECREF(token);
    PyErr_SetString(PyExc_TypeError, "setup_kernel: the context has no precision reader");
    return nullptr;
  }
  Py_XSETREF(g_context, Py_NewRef(a[0]));
  g_ctx_fused = offsets[0];
  g_ctx_launch_blocking = offsets[1];
  g_ctx_opt_level = offsets[2];
  Py_XSETREF(g_cache, Py_NewRef(a[1]));
  Py_XSETREF(g_record_native, Py_NewRef(a[2]));
  Py_XSETREF(g_narrow, Py_NewRef(a[3]));
  Py_XSETREF(g_precision_state, state);
  Py_XSETREF(g_precision_fn, token);
  Py_XSETREF(g_spec_fn, Py_NewRef(a[4]));
  Py_XSETREF(g_array_type, Py_NewRef(a[5]));
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

}  // namespace torch_tpu::native
#pragma GCC visibility pop
