#include "gpu_bench_util.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/cuda_rt.hpp"
#include "lstm/device.hpp"

namespace lstm::bench {

namespace {

// splitmix64 finaliser: a good enough hash of (seed, index) for benchmark data.
__device__ inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ inline void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <class T>
__global__ void fill_uniform_kernel(T* p, int64_t n, float lo, float span, uint64_t seed) {
  const uint64_t key = mix(seed);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    // 24 random bits -> [0, 1) exactly representable in float.
    const float u = float(mix(key ^ uint64_t(i)) >> 40) * (1.0f / 16777216.0f);
    store(p, i, lo + span * u);
  }
}

__device__ inline bool finite(float v) { return isfinite(v); }
__device__ inline bool finite(__nv_bfloat16 v) { return isfinite(__bfloat162float(v)); }
__device__ inline bool finite(__half v) { return isfinite(__half2float(v)); }

template <class T>
__global__ void count_non_finite_kernel(const T* p, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    local += finite(p[i]) ? 0 : 1;
  if (local) atomicAdd(count, local);
}

__global__ void spin_cycles_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace

void spin_cycles(long long cycles) {
  spin_cycles_kernel<<<1, 1, 0, cuda::stream()>>>(cycles);
  LSTM_CUDA_CHECK_LAUNCH();
}

void fill_uniform(void* p, DType dtype, int64_t n, float lo, float hi, uint64_t seed) {
  if (n <= 0) return;
  const unsigned blocks = cuda::grid_for(n, 256, 4096);
  const float span = hi - lo;
  switch (dtype) {
    case DType::F32:
      fill_uniform_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<float*>(p), n, lo, span, seed);
      break;
    case DType::BF16:
      fill_uniform_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<__nv_bfloat16*>(p), n, lo, span, seed);
      break;
    case DType::F16:
      fill_uniform_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<__half*>(p), n, lo, span, seed);
      break;
    default:
      LSTM_THROW("bench fill_uniform: dtype " << dtype_name(dtype) << " is not F32, BF16 or F16");
  }
  LSTM_CUDA_CHECK_LAUNCH();
}

int64_t count_non_finite(const void* p, DType dtype, int64_t n) {
  if (n <= 0) return 0;
  cuda::DeviceBuffer counter(sizeof(unsigned long long));
  auto* c = counter.as<unsigned long long>();
  LSTM_CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(unsigned long long), cuda::stream()));
  const unsigned blocks = cuda::grid_for(n, 256, 4096);
  switch (dtype) {
    case DType::F32:
      count_non_finite_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<const float*>(p), n, c);
      break;
    case DType::BF16:
      count_non_finite_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<const __nv_bfloat16*>(p), n, c);
      break;
    case DType::F16:
      count_non_finite_kernel<<<blocks, 256, 0, cuda::stream()>>>(static_cast<const __half*>(p), n, c);
      break;
    default:
      LSTM_THROW("bench count_non_finite: dtype " << dtype_name(dtype) << " is not F32, BF16 or F16");
  }
  LSTM_CUDA_CHECK_LAUNCH();
  unsigned long long host = 0;
  LSTM_CUDA_CHECK(cudaMemcpyAsync(&host, c, sizeof(host), cudaMemcpyDeviceToHost, cuda::stream()));
  LSTM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
  return static_cast<int64_t>(host);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

EventTimer::~EventTimer() {
  for (auto e : ev_) cudaEventDestroy(e);
}

cudaEvent_t EventTimer::event(size_t i) {
  while (ev_.size() <= i) {
    cudaEvent_t e;
    LSTM_CUDA_CHECK(cudaEventCreate(&e));
    ev_.push_back(e);
  }
  return ev_[i];
}

std::vector<double> EventTimer::time(int first, int count, const std::function<void(int)>& prepare,
                                     const std::function<void(int)>& run, std::vector<double>* host_us) {
  if (host_us) host_us->clear();
  if (count <= 0) return {};
  // Every event is made before the first call, so that none is created inside the timed loop.
  (void)event(2 * static_cast<size_t>(count) - 1);
  cudaStream_t s = cuda::stream();
  for (int k = 0; k < count; ++k) {
    if (prepare) prepare(first + k);
    LSTM_CUDA_CHECK(cudaEventRecord(ev_[2 * static_cast<size_t>(k)], s));
    const auto t0 = std::chrono::steady_clock::now();
    run(first + k);
    if (host_us)
      host_us->push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    LSTM_CUDA_CHECK(cudaEventRecord(ev_[2 * static_cast<size_t>(k) + 1], s));
  }
  LSTM_CUDA_CHECK(cudaEventSynchronize(ev_[2 * static_cast<size_t>(count) - 1]));
  std::vector<double> ms(static_cast<size_t>(count));
  for (size_t k = 0; k < ms.size(); ++k) {
    float t = 0;
    LSTM_CUDA_CHECK(cudaEventElapsedTime(&t, ev_[2 * k], ev_[2 * k + 1]));
    ms[k] = t;
  }
  return ms;
}

double sm_clock_mhz(EventTimer& timer) {
  constexpr long long kCycles = 2'000'000;  // about 1 ms at the H200's 1980 MHz boost
  const double ms = timer.time(0, 1, nullptr, [](int) { spin_cycles(kCycles); })[0];
  return ms > 0 ? static_cast<double>(kCycles) / (ms * 1e3) : 0.0;
}

void idle_gpu(double ms) {
  if (ms <= 0) return;
  cuda_synchronize();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

double Cooldown::before_cell() {
  const double ms = std::min(limit_ms_, busy_ms_);
  idle_gpu(ms);
  busy_ms_ = 0;
  return ms;
}

double Cooldown::after_settling(double warmup_busy_ms) {
  const double ms = std::min(limit_ms_, warmup_busy_ms);
  idle_gpu(ms);
  return ms;
}

Tensor held_mib(int64_t mib) { return mib > 0 ? Tensor::empty({mib << 20}, DType::U8, Device::CUDA) : Tensor(); }

namespace {
int64_t align_up(int64_t n) { return (n + 127) / 128 * 128; }
}  // namespace

InputRotation::InputRotation(int64_t largest_slot_elems)
    : l2_bytes_(static_cast<size_t>(std::max(cuda::device_prop().l2CacheSize, 1 << 20))),
      largest_slot_elems_(largest_slot_elems) {}

int64_t InputRotation::slot_elems(const Shape& x_shape, const Shape& dout_shape) {
  return align_up(shape_numel(x_shape)) + (dout_shape.empty() ? 0 : align_up(shape_numel(dout_shape)));
}

Tensor& InputRotation::pool(DType dt) {
  auto it = pools_.find(dt);
  if (it != pools_.end()) return it->second;
  const int64_t elems = std::max(static_cast<int64_t>(4 * l2_bytes_ / dtype_size(dt)), 2 * largest_slot_elems_);
  Tensor t = Tensor::empty({elems}, dt, Device::CUDA);
  fill_uniform(t.raw(), dt, elems, -1.0f, 1.0f, 1000 + static_cast<uint64_t>(dt));
  return pools_.emplace(dt, t).first->second;
}

InputRotation::Views InputRotation::take(DType dt, const Shape& x_shape, const Shape& dout_shape, int64_t count) {
  Tensor& p = pool(dt);
  const bool with_dout = !dout_shape.empty();
  const int64_t slot = slot_elems(x_shape, dout_shape);
  const int64_t x_n = shape_numel(x_shape), d_n = with_dout ? shape_numel(dout_shape) : 0;
  const int64_t max_slots = p.numel() / slot;
  LSTM_CHECK(max_slots >= 1, "input pool too small for a slot of " << slot << " elements");
  int64_t& cur = cursor_[dt];
  Views v;
  for (int64_t k = 0; k < std::min(max_slots, count); ++k) {
    if (cur + slot > p.numel()) cur = 0;
    v.xs.push_back(p.slice0(cur, cur + x_n).reshape(x_shape));
    if (with_dout) v.douts.push_back(p.slice0(cur + align_up(x_n), cur + align_up(x_n) + d_n).reshape(dout_shape));
    cur += slot;
  }
  v.x0 = p.slice0(0, x_n).reshape(x_shape);
  if (with_dout) v.dout0 = p.slice0(align_up(x_n), align_up(x_n) + d_n).reshape(dout_shape);
  v.x_bytes = v.x0.nbytes();
  v.dout_bytes = with_dout ? v.dout0.nbytes() : 0;
  return v;
}

L2Window::Set L2Window::set(const void* p, size_t bytes) {
  const cudaDeviceProp& prop = cuda::device_prop();
  Set r;
  r.persisting_bytes = std::min<size_t>(static_cast<size_t>(prop.persistingL2CacheMaxSize), bytes);
  r.window_bytes = std::min<size_t>(static_cast<size_t>(prop.accessPolicyMaxWindowSize), bytes);
  r.hit_ratio = r.window_bytes
                    ? std::min(1.0f, static_cast<float>(r.persisting_bytes) / static_cast<float>(r.window_bytes))
                    : 0.0f;
  LSTM_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, r.persisting_bytes));
  cudaStreamAttrValue v{};
  v.accessPolicyWindow.base_ptr = const_cast<void*>(p);
  v.accessPolicyWindow.num_bytes = r.window_bytes;
  v.accessPolicyWindow.hitRatio = r.hit_ratio;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  LSTM_CUDA_CHECK(cudaStreamSetAttribute(cuda::stream(), cudaStreamAttributeAccessPolicyWindow, &v));
  set_ = true;
  return r;
}

L2Window::~L2Window() {
  if (!set_) return;
  cudaStreamAttrValue v{};
  v.accessPolicyWindow.num_bytes = 0;
  (void)cudaStreamSetAttribute(cuda::stream(), cudaStreamAttributeAccessPolicyWindow, &v);
  (void)cudaCtxResetPersistingL2Cache();
  (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
}

}  // namespace lstm::bench
