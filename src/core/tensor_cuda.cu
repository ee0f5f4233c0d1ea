#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_rt.hpp"
#include "core/tensor_cuda.hpp"

namespace lstm::cuda {
namespace {

template <class T> __device__ __forceinline__ double load_as_double(const T* p, int64_t i) { return static_cast<double>(p[i]); }
template <> __device__ __forceinline__ double load_as_double<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return static_cast<double>(__bfloat162float(p[i]));
}
template <> __device__ __forceinline__ double load_as_double<__half>(const __half* p, int64_t i) {
  return static_cast<double>(__half2float(p[i]));
}

template <class T> __device__ __forceinline__ T from_double(double v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ float from_double<float>(double v) { return __double2float_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(__double2float_rn(v));
}
template <> __device__ __forceinline__ __half from_double<__half>(double v) { return __float2half_rn(__double2float_rn(v)); }

// Float -> narrower float goes through f32 when the source is f32 (exact same rounding as the
// CPU's f32_to_bf16/f32_to_f16); f64 -> bf16/f16 rounds twice like the CPU path does.
template <class D, class S>
__global__ void convert_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if constexpr (std::is_same_v<S, float> && std::is_same_v<D, __nv_bfloat16>)
      dst[i] = __float2bfloat16_rn(src[i]);
    else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, __half>)
      dst[i] = __float2half_rn(src[i]);
    else if constexpr ((std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>) && std::is_same_v<D, float>)
      dst[i] = static_cast<float>(load_as_double(src, i));
    else
      dst[i] = from_double<D>(load_as_double(src, i));
  }
}

template <class D>
__global__ void fill_kernel(D* __restrict__ dst, D v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) dst[i] = v;
}

template <class F>
void with_type(DType dt, F&& f) {
  switch (dt) {
    case DType::F64: f(double{}); return;
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    case DType::I64: f(int64_t{}); return;
    case DType::I32: f(int32_t{}); return;
    case DType::U8: f(uint8_t{}); return;
  }
}

}  // namespace

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  if (n <= 0) return;
  with_type(dst_dtype, [&](auto d) {
    using D = decltype(d);
    with_type(src_dtype, [&](auto s) {
      using S = decltype(s);
      convert_kernel<D, S><<<grid_for(n), 256, 0, stream()>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  LSTM_CUDA_CHECK_LAUNCH();
}

void fill(void* dst, DType dtype, double value, int64_t n) {
  if (n <= 0) return;
  with_type(dtype, [&](auto d) {
    using D = decltype(d);
    D v;
    if constexpr (std::is_same_v<D, __nv_bfloat16>)
      v = __float2bfloat16_rn(static_cast<float>(value));
    else if constexpr (std::is_same_v<D, __half>)
      v = __float2half_rn(static_cast<float>(value));
    else
      v = static_cast<D>(value);
    fill_kernel<D><<<grid_for(n), 256, 0, stream()>>>(static_cast<D*>(dst), v, n);
  });
  LSTM_CUDA_CHECK_LAUNCH();
}

}  // namespace lstm::cuda
