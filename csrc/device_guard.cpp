// PyTorch's device guard for `tpu` (PrivateUse1), in C++.
//
// The guard that torch's Python backend API registers (torch._C._acc) reports
// one device and ignores set_device. PyTorch's autograd engine sizes its
// per-device ready queues (one worker thread each) from the guard's
// deviceCount() at the first backward of the process, so a backward through
// tpu:1 and up failed an internal assert there. This guard reports the
// runtime's real device count and keeps a per-thread current device (the
// engine's worker for tpu:N sets N), as CUDA's does. torch_tpu has no
// streams or events of its own (XLA orders the work of a device), so every
// device has one default stream and events are already complete.

#include "device_guard.h"

#include <atomic>

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torch_tpu {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

thread_local c10::DeviceIndex t_current = 0;

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  std::atomic<c10::DeviceIndex> count{1};

  c10::DeviceType type() const override { return kTpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(kTpu, t_current);
    if (d.has_index()) t_current = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kTpu, t_current); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) t_current = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) t_current = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d.has_index() ? d : getDevice());
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    return getStream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override { return count.load(); }

  // No events: the work of a device runs in order, so there is nothing to wait for.
  void record(void** /*event*/, const c10::Stream& /*stream*/,
              const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/)
      const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
};

TpuGuard* g_guard = nullptr;  // registered once, never freed (PyTorch keeps a pointer)

bool index_of(PyObject* obj, long lo, c10::DeviceIndex* out) {
  long v = PyLong_AsLong(obj);
  if (v == -1 && PyErr_Occurred()) return false;
  if (v < lo || v > 127) {
    PyErr_Format(PyExc_ValueError, "tpu device index or count out of range: %ld", v);
    return false;
  }
  *out = static_cast<c10::DeviceIndex>(v);
  return true;
}

}  // namespace

PyObject* install_device_guard(PyObject* /*self*/, PyObject* count) {
  c10::DeviceIndex n;
  if (!index_of(count, 1, &n)) return nullptr;
  if (g_guard == nullptr) {
    g_guard = new TpuGuard();
    g_guard->count.store(n);
    c10::impl::registerDeviceGuard(kTpu, g_guard);
  } else {
    g_guard->count.store(n);
  }
  Py_RETURN_NONE;
}

PyObject* set_device_index(PyObject* /*self*/, PyObject* index) {
  c10::DeviceIndex i;
  if (!index_of(index, 0, &i)) return nullptr;
  t_current = i;
  Py_RETURN_NONE;
}

PyObject* device_index(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyLong_FromLong(t_current);
}

}  // namespace torch_tpu
