// Tensor: a dense, contiguous, row-major n-dimensional array with a dtype and a device tag.
//
// Storage is shared between copies of a Tensor (like torch.Tensor); clone() makes a deep copy.
// Only contiguous tensors exist: reshape() shares storage, everything else copies.
// Half types (bf16, f16) are storage formats: arithmetic on the CPU converts them to f32.
//
// CUDA tensors (Device::CUDA, builds with LSTM_CUDA) live in the device arena (lstm/device.hpp);
// every operation on them is issued on the calling thread's engine stream, asynchronously,
// except those that return host values. data<T>(), get() and set() are CPU-only: move a tensor
// with to_device(Device::CPU) first. raw() is the storage pointer on either device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lstm/error.hpp"

namespace lstm {

enum class DType : uint8_t { F64, F32, BF16, F16, I64, I32, U8 };
enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

const char* device_name(Device d);  // "cpu", "cuda"
Device device_from_name(const std::string& name);  // throws naming the accepted names

size_t dtype_size(DType dt);
// Names as safetensors spells them: "F64", "F32", "BF16", "F16", "I64", "I32", "U8".
const char* dtype_name(DType dt);
// Parses a safetensors dtype name; throws lstm::Error naming the accepted names otherwise.
DType dtype_from_name(const std::string& name);
bool is_floating(DType dt);
std::string shape_str(const Shape& s);
// Element count; throws naming the shape when a dimension is negative or the count overflows.
int64_t shape_numel(const Shape& s);

// Maps a C++ element type to its DType (double, float, int64_t, int32_t, uint8_t).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

// bf16 / f16 <-> f32 conversions (round to nearest even).
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

class Tensor;
// Throws "<what> holds <nan|inf|-inf> at flat index <i>" for the first non-finite element of a
// floating tensor (copied to the host when on the GPU); integer tensors pass.
void require_finite(const Tensor& t, const std::string& what);

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage (CPU memory is 64-byte aligned, CUDA memory 256-byte aligned).
  // Device::CUDA throws when the build or the machine has no usable GPU.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::CPU);
  // Copies `values` (numel must match the shape) into a new CPU tensor of dtype_of<T>().
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);
  // A non-owning tensor over memory the caller owns (e.g. a PyTorch tensor's storage, through the
  // C API): `data` holds shape_numel(shape) contiguous elements of `dtype` on `device` and must
  // stay valid while this tensor or a copy, view or reshape of it lives; nothing is freed when the
  // last one goes. data == nullptr is allowed only for an empty shape. Operations work as on any
  // tensor of that device (CUDA ones are issued on the engine stream).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return static_cast<bool>(storage_); }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // size(i) accepts negative i (from the end) like torch.
  int64_t size(int64_t i) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  std::string shape_str() const { return lstm::shape_str(shape_); }

  // Typed access to CPU data; throws if T does not match dtype() or the tensor is not on the CPU.
  template <class T> T* data();
  template <class T> const T* data() const;
  void* raw() { return storage_.get() + offset_; }
  const void* raw() const { return storage_.get() + offset_; }

  // A deep copy on the same device.
  Tensor clone() const;
  // Converts element type (any float/int dtype to any other, rounding for bf16/f16), on the
  // tensor's device.
  Tensor to(DType dtype) const;
  // The same values on `device`: *this (shared) when already there, otherwise a copy. A copy to
  // the CPU waits for the engine stream.
  Tensor to_device(Device device) const;
  Tensor cpu() const { return to_device(Device::CPU); }
  // A view with a new shape and the same storage; one dimension may be -1.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice0(int64_t begin, int64_t end) const;

  void zero_();
  void fill_(double value);
  // Copies src into this tensor (shapes must have equal numel), converting dtype, across
  // devices too (a CUDA -> CPU copy waits for the engine stream).
  void copy_(const Tensor& src);

  // Reads element `i` (flat index) as double, whatever the dtype. Slow; for tests and I/O.
  // CPU tensors only.
  double get(int64_t i) const;
  void set(int64_t i, double v);

  bool same_storage(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  std::shared_ptr<uint8_t[]> storage_;
  size_t offset_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Max over elements of |a - b|, and ||a - b|| / ||b|| (L2), computed in f64 (CUDA tensors are
// copied to the CPU first).
double max_abs_diff(const Tensor& a, const Tensor& b);
double rel_l2_error(const Tensor& a, const Tensor& ref);
// True if any element is NaN or +-Inf.
bool has_non_finite(const Tensor& t);

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  Tensor t = empty(shape, dtype_of<T>());
  LSTM_REQUIRE(static_cast<int64_t>(values.size()) == t.numel(),
               "from_vector: shape " << lstm::shape_str(shape) << " needs " << t.numel()
                                     << " values, got " << values.size());
  T* d = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) d[i] = values[i];
  return t;
}

}  // namespace lstm
