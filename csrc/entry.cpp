// Entries (FastSpec from executor._fast_spec) and the kernel's cache keys;
// see entry.h.
#include "entry.h"

#include "tensors.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject* g_spec_fn = nullptr;
PyTypeObject* g_key_type = nullptr;
std::unordered_map<PyObject*, Py_hash_t>* g_op_hashes = nullptr;

bool hashed_keys() { return g_key_type != nullptr; }

namespace {

const char* kSpecCapsule = "torch_tpu.fastspec";

FastSpec* spec_from(PyObject* desc) {
  // desc: (compiled, ((dtype, shape), ...), narrow) from executor._fast_spec.
  if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 3 ||
      !PyTuple_Check(PyTuple_GET_ITEM(desc, 1))) {
    PyErr_SetString(PyExc_TypeError,
                    "_fast_spec: expected (compiled, ((dtype, shape), ...), narrow)");
    return nullptr;
  }
  int narrow = PyObject_IsTrue(PyTuple_GET_ITEM(desc, 2));
  if (narrow < 0) return nullptr;
  auto* spec = new FastSpec();
  spec->narrow = narrow != 0;
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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace torch_tpu::native
#pragma GCC visibility pop
