// Tensor creation: a PrivateUse1 tensor with its own fixed-size storage at a
// fresh virtual address (storage.empty_tensor's tensor), inline for the C++
// kernel's results; tensors.cpp has the Python entry points.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <vector>

#pragma GCC visibility push(hidden)
namespace torch_tpu::native {

// The virtual address counter storage._address_for shares (next_address).
extern uint64_t g_next_address;

inline uint64_t take_address(uint64_t nbytes) {
  // As storage._address_for: blocks of 64 bytes, at least one per storage.
  uint64_t start = g_next_address;
  uint64_t blocks = (nbytes + 63) / 64;
  g_next_address += (blocks > 1 ? blocks : 1) * 64;
  return start;
}

inline at::Tensor make_tensor(const std::vector<int64_t>& sizes,
                              const std::vector<int64_t>& strides, at::ScalarType dtype,
                              c10::DeviceIndex index, uint64_t nbytes) {
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

inline void contiguous_strides(const std::vector<int64_t>& sizes, std::vector<int64_t>& strides) {
  strides.resize(sizes.size());
  int64_t acc = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= sizes[i] > 1 ? sizes[i] : 1;
  }
}

// Argument conversions (tensors.cpp): false with a Python error set.
bool int_sequence(PyObject* seq, std::vector<int64_t>& out);
bool dtype_arg(PyObject* obj, at::ScalarType& out);

}  // namespace torch_tpu::native
#pragma GCC visibility pop
