#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cudnn/lstm_cudnn_kernels.hpp"
#include "core/cuda_rt.hpp"

namespace lstm::cuda {
namespace {

template <class E>
__global__ void mask_kernel(E* __restrict__ dst, const E* __restrict__ src, int64_t T, int64_t B, int64_t W,
                            bool batch_first, const int32_t* __restrict__ len) {
  const int64_t n = T * B * W;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / W;
    const int64_t t = batch_first ? row % T : row / B;
    const int64_t b = batch_first ? row / T : row % B;
    dst[i] = t < len[b] ? src[i] : E(0);
  }
}

template <class T> __device__ __forceinline__ float to_f(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_f(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

template <class D, class S>
__global__ void add_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if constexpr (std::is_same_v<D, double> || std::is_same_v<S, double>) {
      const double a = std::is_same_v<D, double> ? static_cast<double>(dst[i]) : static_cast<double>(to_f(dst[i]));
      const double b = std::is_same_v<S, double> ? static_cast<double>(src[i]) : static_cast<double>(to_f(src[i]));
      if constexpr (std::is_same_v<D, double>)
        dst[i] = a + b;
      else
        dst[i] = from_f<D>(static_cast<float>(a + b));
    } else {
      dst[i] = from_f<D>(to_f(dst[i]) + to_f(src[i]));
    }
  }
}

constexpr int kChunk = 960;  // 3840 bytes: inside the 4 KiB of kernel parameters every GPU takes
struct Int32Chunk {
  int32_t v[kChunk];
};
__global__ void upload_kernel(int32_t* __restrict__ dst, Int32Chunk c, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = c.v[i];
}

template <class F>
void with_float_type(DType dt, F&& f) {
  switch (dt) {
    case DType::F64: f(double{}); return;
    case DType::F32: f(float{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
    case DType::F16: f(__half{}); return;
    default: break;
  }
  LSTM_CHECK(false, "add_into: not a float dtype: " << dtype_name(dt));
}

}  // namespace

void mask_past_lengths(void* dst, const void* src, size_t elem_size, int64_t T, int64_t B, int64_t W,
                       bool batch_first, const int32_t* len) {
  const int64_t n = T * B * W;
  if (n <= 0) return;
  const unsigned grid = grid_for(n);
  switch (elem_size) {
    case 2:
      mask_kernel<uint16_t><<<grid, 256, 0, stream()>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                                        T, B, W, batch_first, len);
      break;
    case 4:
      mask_kernel<uint32_t><<<grid, 256, 0, stream()>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src),
                                                        T, B, W, batch_first, len);
      break;
    case 8:
      mask_kernel<uint64_t><<<grid, 256, 0, stream()>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src),
                                                        T, B, W, batch_first, len);
      break;
    default: LSTM_CHECK(false, "mask_past_lengths: element size " << elem_size);
  }
  LSTM_CUDA_CHECK_LAUNCH();
}

void add_into(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  if (n <= 0) return;
  with_float_type(dst_dtype, [&](auto d) {
    using D = decltype(d);
    with_float_type(src_dtype, [&](auto s) {
      using S = decltype(s);
      add_kernel<D, S><<<grid_for(n), 256, 0, stream()>>>(static_cast<D*>(dst), static_cast<const S*>(src), n);
    });
  });
  LSTM_CUDA_CHECK_LAUNCH();
}

void upload_int32(int32_t* dst, const int32_t* host, int64_t n) {
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int m = static_cast<int>(n - begin < kChunk ? n - begin : kChunk);
    Int32Chunk c;
    for (int i = 0; i < m; ++i) c.v[i] = host[begin + i];
    upload_kernel<<<1, 256, 0, stream()>>>(dst + begin, c, m);
    LSTM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace lstm::cuda
