// The C++ kernel's call (see kernel.h): the memo, the key, the executor
// cache lookup, the executable's call or the fused recording, the results.
//
// Every member but run() is defined `inline`, as it was inside the class
// body: run() is their only caller, and the compiler folds them into it.
#include "kernel.h"

#include <c10/core/DefaultDtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>

#include "call.h"
#include "tensors.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject* g_context = nullptr;
Py_ssize_t g_ctx_fused = 0, g_ctx_launch_blocking = 0, g_ctx_opt_level = 0;
PyObject* g_cache = nullptr;
PyObject* g_record_native = nullptr;
PyObject* g_narrow = nullptr;
PyObject* g_precision_state = nullptr;
PyObject* g_precision_fn = nullptr;
PyObject* g_array_type = nullptr;
bool g_memo_on = true;
std::vector<FastKernel*> g_kernels;
const at::Tensor kNotGiven;
uint64_t g_pending_hits = 0;

namespace {

// The truth of a context slot (its owners write bools), or false with a
// Python error set.
bool truthy_slot(Py_ssize_t offset, PyObject* name, int* out) {
  PyObject* v = ctx_slot(offset);  // borrowed
  if (v == Py_True || v == Py_False) {
    *out = v == Py_True;
    return true;
  }
  if (!v) {
    PyErr_SetObject(PyExc_AttributeError, name);
    return false;
  }
  Py_INCREF(v);  // __bool__ may run Python code that rebinds the slot
  int t = PyObject_IsTrue(v);
  Py_DECREF(v);
  if (t < 0) return false;
  *out = t;
  return true;
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

}  // namespace

// 1: done, results in `made`; 0: the Python kernel's call; -1: a Python
// error (cleared by the caller, which then also hands the call to Python).
// The call's arguments: `tens[i]`, unless it is &kNotGiven, is argument i
// as the unboxed kernel received it (a tensor, or null for None); else iv[i].
int FastKernel::run(const c10::IValue* iv, const at::Tensor* const* tens,
                    std::vector<at::Tensor>& made) {
  // Fused mode records a hit (fused.record_native) where strict mode runs
  // it. Work in the background (async_compile.OUTSTANDING) needs no check:
  // what would make the executor launch a call (async_compile.deferred: an
  // entry still compiling, an input still being computed) makes this
  // kernel hand it to Python anyway (no fast spec yet; execute() takes
  // only inputs that are arrays), and any other call runs now there too.
  int fused_on, flag;
  if (!truthy_slot(g_ctx_fused, s_fused, &fused_on)) return -1;
  if (!truthy_slot(g_ctx_launch_blocking, s_launch_blocking, &flag)) return -1;
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
    cache = g_cache;  // borrowed (setup_kernel holds it)
    entry = PyDict_GetItemWithError(cache, tkey);
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
inline int FastKernel::run_memo(Memo& m, MemoCall& mc, std::vector<at::Tensor>& made,
                                bool fused_on) {
  // Python code runs below (the executable's call path) and may empty the
  // memo: what the call needs is held here, and `m` is not used after.
  PyObject* entry = Py_NewRef(m.entry);
  PyObject* key = Py_NewRef(m.key);
  FastSpec* spec = m.spec;
  bool move = ++m.since_move >= kMoveEvery;
  if (move) m.since_move = 0;
  int rc = 1;
  PyObject* cache = nullptr;  // (null: the LRU order is left as it is)
  if (move) cache = g_cache;  // borrowed (setup_kernel holds it)
  if (rc > 0)
    rc = hit(fused_on, entry, spec, mc.datas, mc.ns, mc.dyn, mc.device, cache, key, made);
  if (rc > 0) ++n_memo;
  Py_DECREF(key);
  Py_DECREF(entry);
  return rc;
}

inline void FastKernel::remember(MemoCall& mc, PyObject* entry, PyObject* tkey, FastSpec* spec) {
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
inline int FastKernel::describe(const c10::IValue* iv, const at::Tensor* const* tens, MemoCall& m) {
  for (size_t i = 0; i < args.size(); ++i) {
    int rc = tens && tens[i] != &kNotGiven ? memo_tensor(m, args[i], tens[i])
                                           : memo_value(m, args[i], iv[i]);
    if (rc <= 0) return rc;
  }
  if (m.device < 0) return 0;
  m.prec = g_precision_state != Py_None ? PyObject_GetAttr(g_precision_state, s_value)
                                        : PyObject_CallNoArgs(g_precision_fn);
  if (!m.prec) return -1;
  m.level = ctx_slot(g_ctx_opt_level);  // borrowed (a small int: never freed)
  if (!m.level) return 0;
  auto dt = c10::typeMetaToScalarType(c10::get_default_dtype());
  return m.key.push(m.device) && m.key.push(static_cast<int64_t>(dt)) &&
                 m.key.push(reinterpret_cast<intptr_t>(m.prec)) &&
                 m.key.push(reinterpret_cast<intptr_t>(m.level))
             ? 1
             : 0;
}

inline int FastKernel::memo_tensor(MemoCall& m, const ArgSpec& a, const at::Tensor* t) {
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

inline int FastKernel::memo_value(MemoCall& m, const ArgSpec& a, const c10::IValue& v) {
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

inline int FastKernel::argument(Classifier& c, const ArgSpec& a, const c10::IValue& v) {
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
inline int FastKernel::tensor_arg(Classifier& c, const ArgSpec& a, const at::Tensor* t) {
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
inline int FastKernel::finish_key(long device, PyObject* key) {
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
  PyObject* level = ctx_slot(g_ctx_opt_level);  // borrowed
  if (!level) return 0;
  return PyList_Append(key, level) < 0 ? -1 : 1;
}

// A cache hit: its executable run (strict mode) or the op recorded (fused
// mode) on the call's DeviceData and Scalars (`dyn`; null: none), the
// entry's place in the LRU order kept (unless `cache` is null), the hit
// counted and the result tensors made.
inline int FastKernel::hit(bool fused_on, PyObject* entry, FastSpec* spec,
                           PyObject* const* datas, Py_ssize_t ns, PyObject* dyn, long device,
                           PyObject* cache, PyObject* tkey, std::vector<at::Tensor>& made) {
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
inline int FastKernel::record(PyObject* entry, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn,
                              long device, PyObject** result) {
  PyObject* fn = g_record_native;  // borrowed (setup_kernel holds it)
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

// `dyn` for an entry whose scalars go in as 32 bits (FastSpec.narrow): a
// copy, narrowed by scalars.narrow(copy, device).
static PyObject* narrow_dyn(PyObject* dyn, PyObject* dev) {
  PyObject* copy = PyList_GetSlice(dyn, 0, PyList_GET_SIZE(dyn));
  if (!copy) return nullptr;
  PyObject* r = PyObject_CallFunctionObjArgs(g_narrow, copy, dev, nullptr);
  if (!r) {
    Py_DECREF(copy);
    return nullptr;
  }
  Py_DECREF(r);
  return copy;
}

inline int FastKernel::execute(FastSpec* spec, PyObject* const* datas, Py_ssize_t ns, PyObject* dyn,
                               long device, PyObject** result) {
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
  PyObject* narrowed = nullptr;  // owned: a copy of `dyn` with 32-bit scalars
  if (spec->narrow && PyList_GET_SIZE(dyn)) {
    narrowed = narrow_dyn(dyn, dev);
    if (!narrowed) {
      Py_DECREF(dev);
      Py_DECREF(arrays);
      return -1;
    }
    dyn = narrowed;
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
  Py_XDECREF(narrowed);
  Py_DECREF(dev);
  Py_DECREF(arrays);
  return *result ? 1 : -1;
}

// The entry's place in the LRU order, as _Runner.__call__ keeps it on a
// hit. The hit counts stay in C++ (this kernel's `hits`, g_pending_hits)
// until programs.CacheStats reads them (take_stats): no Python objects per
// call.
inline int FastKernel::move_to_end(PyObject* cache, PyObject* tkey) {
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

inline int FastKernel::push_results(FastSpec* spec, PyObject* result, long device,
                                    std::vector<at::Tensor>& made) {
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

}  // namespace torch_tpu::native
#pragma GCC visibility pop
