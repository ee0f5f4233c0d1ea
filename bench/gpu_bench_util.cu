#include "gpu_bench_util.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_rt.hpp"

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

}  // namespace lstm::bench
