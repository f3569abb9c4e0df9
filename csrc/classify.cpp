// classify(sig, kinds, vals): keys.classify's hit path (see classify.h).
#include "classify.h"

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

PyObject* g_tag_one = nullptr;

PyObject* load_tag_one() {
  PyObject* mod = PyImport_ImportModule("torch_tpu.runtime.programs");
  PyObject* tags = mod ? PyObject_GetAttrString(mod, "KeyTag") : nullptr;
  PyObject* one = tags ? PyObject_GetAttrString(tags, "ONE") : nullptr;
  Py_XDECREF(tags);
  Py_XDECREF(mod);
  g_tag_one = one;  // (kept for the process)
  return one;
}

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

}  // namespace torch_tpu::native
#pragma GCC visibility pop
