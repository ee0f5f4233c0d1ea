// Device helpers shared by our LSTM kernels (the fused backend's and the persistent ones):
// conversions between the storage type E (float, __nv_bfloat16, __half) and fp32, the gate
// activations, and the hash dropout's masks come from. Header-only, inline device functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lstm::cuda::fused {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class V> __device__ __forceinline__ V from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <class D, class S> __device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>)
    return v;
  else
    return from_f<D>(to_f(v));
}

// Accurate expf/tanhf, not the fast intrinsics: F32 is held to 1e-5 against the float64 reference.
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// SplitMix64 of (seed, i): a dropout mask that any element can recompute on its own, so backward
// regenerates the forward's mask from the seed instead of storing it.
__device__ __forceinline__ uint64_t mix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace lstm::cuda::fused
