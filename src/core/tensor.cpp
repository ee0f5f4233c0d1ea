#include "lstm/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "lstm/checked.hpp"
#include "lstm/device.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "core/tensor_cuda.hpp"
#endif

namespace lstm {

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

Device device_from_name(const std::string& n) {
  if (n == "cpu") return Device::CPU;
  if (n == "cuda" || n == "gpu") return Device::CUDA;
  LSTM_THROW("unknown device '" << n << "': expected cpu or cuda");
}

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F64: return 8;
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "F64") return DType::F64;
  if (n == "F32") return DType::F32;
  if (n == "BF16") return DType::BF16;
  if (n == "F16") return DType::F16;
  if (n == "I64") return DType::I64;
  if (n == "I32") return DType::I32;
  if (n == "U8") return DType::U8;
  LSTM_THROW("unsupported dtype '" << n << "': expected one of F64, F32, BF16, F16, I64, I32, U8");
}

bool is_floating(DType dt) {
  return dt == DType::F64 || dt == DType::F32 || dt == DType::BF16 || dt == DType::F16;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  // In order and without a shortcut for a zero dimension, as the safetensors reference counts:
  // [2^62, 4, 0] is refused rather than being an empty tensor whose other sizes overflow later.
  int64_t n = 1;
  for (int64_t d : s) {
    LSTM_REQUIRE(d >= 0, "negative dimension " << d << " in shape " << shape_str(s));
    LSTM_REQUIRE(!__builtin_mul_overflow(n, d, &n),
                 "shape " << shape_str(s) << " has too many elements (the count overflows 64-bit integers)");
  }
  return n;
}

void require_finite(const Tensor& t, const std::string& what) {
  if (!t.defined() || !is_floating(t.dtype())) return;
  const Tensor h = t.cpu();
  auto first_bad = [&]<class T>(const T* p) -> int64_t {
    for (int64_t i = 0; i < h.numel(); ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  };
  int64_t i = -1;
  if (h.dtype() == DType::F32) i = first_bad(h.data<float>());
  else if (h.dtype() == DType::F64) i = first_bad(h.data<double>());
  else
    for (int64_t k = 0; k < h.numel() && i < 0; ++k)
      if (!std::isfinite(h.get(k))) i = k;
  LSTM_REQUIRE(i < 0, what << " holds " << h.get(i) << " at flat index " << i << " (shape " << h.shape_str()
                           << "); expected finite values");
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {                                                 // subnormal or zero
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value = m * 2^(e-150); f16 subnormal unit is 2^-24
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // round to nearest even
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t lo = r & 0x1fffu;
  r >>= 13;
  if (lo > 0x1000u || (lo == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else {  // subnormal: normalise
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      m &= 0x3ffu;
      u = sign | (e << 23) | (m << 13);
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

// Large host blocks are kept when their tensor goes and handed out again for the same size: a
// training or inference call allocates the same buffers every time, and fresh pages from the
// kernel (glibc maps blocks this large, then unmaps or trims them on free) cost page faults and
// zeroing on every call, up to a quarter of a CPU LSTM step (docs/PERFORMANCE.md, CPU). At most
// a bounded number of bytes is kept; beyond it blocks are freed as before. Never destroyed:
// tensors in static storage may outlive any other static object. Off under AddressSanitizer,
// which then still sees every use after free.
class HostBlockCache {
 public:
  static constexpr size_t kMinBytes = 128 * 1024;
  static HostBlockCache& get() {
    static HostBlockCache* cache = new HostBlockCache();
    return *cache;
  }
  static bool enabled() {
#if defined(__SANITIZE_ADDRESS__)
    return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return false;
#else
    return true;
#endif
#else
    return true;
#endif
  }
  // A kept block of exactly `bytes`, or null.
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    kept_ -= bytes;
    return p;
  }
  // Keeps p (of `bytes`) for a later take, or frees it when the cache is full.
  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (kept_ + bytes <= cap_) {
        free_[bytes].push_back(p);
        kept_ += bytes;
        return;
      }
    }
    std::free(p);
  }
  // Frees every kept block (an allocation failed: the memory is wanted elsewhere).
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    kept_ = 0;
  }

 private:
  HostBlockCache() {
    // A quarter of the machine's memory, at most 2 GiB.
    const uint64_t phys = physical_memory_bytes();
    cap_ = static_cast<size_t>(std::min<uint64_t>(uint64_t{2} << 30, phys > 0 ? phys / 4 : uint64_t{256} << 20));
  }
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t kept_ = 0, cap_ = 0;
};

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  // A size from a file or a config ends here as an error naming the tensor, not as std::bad_alloc.
  // (Messages are built only on failure: this runs for every tensor.)
  int64_t want = 0;
  LSTM_REQUIRE(!__builtin_mul_overflow(t.numel_, static_cast<int64_t>(dtype_size(dtype)), &want),
               "a tensor " << lstm::shape_str(shape) << " " << dtype_name(dtype)
                           << " has more bytes than 64-bit integers count");
  // Host memory only: the device arena reports its own limit.
  if (device == Device::CPU && static_cast<uint64_t>(want) > physical_memory_bytes() && physical_memory_bytes() > 0)
    require_memory(static_cast<uint64_t>(want), "a tensor " + lstm::shape_str(shape) + " " + dtype_name(dtype));
  if (device == Device::CUDA) {
    require_cuda("a CUDA tensor");
#if LSTM_HAVE_CUDA
    void* p = cuda::arena_alloc(std::max<size_t>(t.nbytes(), 1));
    t.storage_ = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(p), [](uint8_t* q) { cuda::arena_free(q); });
#endif
    return t;
  }
  const size_t bytes = std::max<size_t>(64, (t.nbytes() + 63) / 64 * 64);
  if (bytes >= HostBlockCache::kMinBytes && HostBlockCache::enabled()) {
    HostBlockCache& cache = HostBlockCache::get();
    void* p = cache.take(bytes);
    if (!p) p = std::aligned_alloc(64, bytes);
    if (!p) {  // the kept blocks of other sizes first go back to the system
      cache.release();
      p = std::aligned_alloc(64, bytes);
    }
    if (!p) throw std::bad_alloc();
    t.storage_ = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(p),
                                            [bytes](uint8_t* q) { HostBlockCache::get().give(q, bytes); });
    return t;
  }
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  t.storage_ = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  LSTM_REQUIRE(data != nullptr || t.numel_ == 0,
               "Tensor::wrap: a null pointer for a tensor of " << t.numel_ << " elements " << lstm::shape_str(shape));
  // A no-op deleter: the memory is the caller's. (A null pointer still makes a defined tensor.)
  static uint8_t empty_storage[64];
  uint8_t* p = data ? static_cast<uint8_t*>(data) : empty_storage;
  t.storage_ = std::shared_ptr<uint8_t[]>(p, [](uint8_t*) {});
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

int64_t Tensor::size(int64_t i) const {
  int64_t d = dim();
  if (i < 0) i += d;
  LSTM_REQUIRE(i >= 0 && i < d, "size(" << i << ") out of range for a tensor of shape " << shape_str());
  return shape_[static_cast<size_t>(i)];
}

template <class T>
T* Tensor::data() {
  LSTM_REQUIRE(defined(), "data(): tensor is undefined");
  LSTM_REQUIRE(device_ == Device::CPU, "data(): the tensor " << shape_str()
                                           << " is on the GPU; copy it with to_device(Device::CPU) first");
  LSTM_REQUIRE(dtype_ == dtype_of<T>(), "data(): tensor has dtype " << dtype_name(dtype_)
                                                                    << ", asked for " << dtype_name(dtype_of<T>()));
  return reinterpret_cast<T*>(storage_.get() + offset_);
}
template <class T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}
template double* Tensor::data<double>();
template float* Tensor::data<float>();
template int64_t* Tensor::data<int64_t>();
template int32_t* Tensor::data<int32_t>();
template uint8_t* Tensor::data<uint8_t>();
template const double* Tensor::data<double>() const;
template const float* Tensor::data<float>() const;
template const int64_t* Tensor::data<int64_t>() const;
template const int32_t* Tensor::data<int32_t>() const;
template const uint8_t* Tensor::data<uint8_t>() const;

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_(*this);
  return t;
}

Tensor Tensor::to_device(Device device) const {
  if (!defined() || device == device_) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_(*this);
  return t;
}

double Tensor::get(int64_t i) const {
  LSTM_REQUIRE(device_ == Device::CPU, "get(): the tensor " << shape_str() << " is on the GPU; copy it to the CPU first");
  const uint8_t* p = static_cast<const uint8_t*>(raw());
  switch (dtype_) {
    case DType::F64: return reinterpret_cast<const double*>(p)[i];
    case DType::F32: return reinterpret_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::I64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::U8: return p[i];
  }
  return 0;
}

void Tensor::set(int64_t i, double v) {
  LSTM_REQUIRE(device_ == Device::CPU, "set(): the tensor " << shape_str() << " is on the GPU; copy it to the CPU first");
  uint8_t* p = static_cast<uint8_t*>(raw());
  switch (dtype_) {
    case DType::F64: reinterpret_cast<double*>(p)[i] = v; break;
    case DType::F32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::BF16: reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::F16: reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v)); break;
    case DType::I64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::I32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::U8: p[i] = static_cast<uint8_t>(v); break;
  }
}

void Tensor::copy_(const Tensor& src) {
  LSTM_REQUIRE(src.numel() == numel(), "copy_: source " << src.shape_str() << " has " << src.numel()
                                                         << " elements, destination " << shape_str()
                                                         << " has " << numel());
  if (device_ == Device::CUDA || src.device() == Device::CUDA) {
#if LSTM_HAVE_CUDA
    if (numel_ == 0) return;
    if (src.dtype() == dtype_) {
      cudaMemcpyKind kind = device_ == Device::CUDA
                                ? (src.device() == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                : cudaMemcpyDeviceToHost;
      LSTM_CUDA_CHECK(cudaMemcpyAsync(raw(), src.raw(), nbytes(), kind, cuda::stream()));
      if (device_ == Device::CPU) LSTM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    } else if (device_ == Device::CUDA && src.device() == Device::CUDA) {
      cuda::convert(raw(), dtype_, src.raw(), src.dtype(), numel_);
    } else if (device_ == Device::CUDA) {  // host -> device, converting on the device
      Tensor staged = src.to_device(Device::CUDA);
      cuda::convert(raw(), dtype_, staged.raw(), staged.dtype(), numel_);
    } else {  // device -> host: convert on the device, then copy
      Tensor conv = empty(src.shape(), dtype_, Device::CUDA);
      cuda::convert(conv.raw(), dtype_, src.raw(), src.dtype(), numel_);
      copy_(conv);
    }
    return;
#else
    require_cuda("copying a CUDA tensor");
#endif
  }
  if (src.dtype() == dtype_) {
    std::memcpy(raw(), src.raw(), nbytes());
    return;
  }
  if (src.dtype() == DType::F32 && dtype_ == DType::F64) {
    const float* s = src.data<float>();
    double* d = data<double>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = s[i];
    return;
  }
  if (src.dtype() == DType::F64 && dtype_ == DType::F32) {
    const double* s = src.data<double>();
    float* d = data<float>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = static_cast<float>(s[i]);
    return;
  }
  for (int64_t i = 0; i < numel_; ++i) set(i, src.get(i));
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype, device_);
  t.copy_(*this);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1;
  int neg = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LSTM_REQUIRE(neg < 0, "reshape: more than one -1 in " << lstm::shape_str(shape));
      neg = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (neg >= 0) {
    LSTM_REQUIRE(known > 0 && numel_ % known == 0,
                 "reshape: cannot reshape " << shape_str() << " to " << lstm::shape_str(shape));
    s[static_cast<size_t>(neg)] = numel_ / known;
  }
  LSTM_REQUIRE(shape_numel(s) == numel_, "reshape: cannot reshape " << shape_str() << " ("
                                                                    << numel_ << " elements) to "
                                                                    << lstm::shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  LSTM_REQUIRE(dim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
               "slice0(" << begin << ", " << end << ") out of range for " << shape_str());
  Tensor t = *this;
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.offset_ = offset_ + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  return t;
}

void Tensor::zero_() {
  if (device_ == Device::CUDA) {
#if LSTM_HAVE_CUDA
    if (nbytes()) LSTM_CUDA_CHECK(cudaMemsetAsync(raw(), 0, nbytes(), cuda::stream()));
#endif
    return;
  }
  std::memset(raw(), 0, nbytes());
}

void Tensor::fill_(double value) {
  if (device_ == Device::CUDA) {
#if LSTM_HAVE_CUDA
    cuda::fill(raw(), dtype_, value, numel_);
#endif
    return;
  }
  if (dtype_ == DType::F32) {
    float* d = data<float>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = static_cast<float>(value);
  } else if (dtype_ == DType::F64) {
    double* d = data<double>();
    for (int64_t i = 0; i < numel_; ++i) d[i] = value;
  } else {
    for (int64_t i = 0; i < numel_; ++i) set(i, value);
  }
}

double max_abs_diff(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = a_in.cpu(), b = b_in.cpu();
  LSTM_REQUIRE(a.numel() == b.numel(), "max_abs_diff: " << a.shape_str() << " vs " << b.shape_str());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = std::abs(a.get(i) - b.get(i));
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

double rel_l2_error(const Tensor& a_in, const Tensor& ref_in) {
  const Tensor a = a_in.cpu(), ref = ref_in.cpu();
  LSTM_REQUIRE(a.numel() == ref.numel(), "rel_l2_error: " << a.shape_str() << " vs " << ref.shape_str());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double r = ref.get(i), d = a.get(i) - r;
    num += d * d;
    den += r * r;
  }
  if (std::isnan(num)) return num;
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

bool has_non_finite(const Tensor& t_in) {
  const Tensor t = t_in.cpu();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i))) return true;
  return false;
}

}  // namespace lstm
