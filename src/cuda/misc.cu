#include "core/cuda_rt.hpp"
#include "cuda/misc.hpp"

namespace lstm::cuda {
namespace {
__global__ void accumulate_scalar_kernel(float* acc, const float* x) { acc[0] += x[0]; }
}  // namespace

void accumulate_scalar(Tensor& acc, const Tensor& x) {
  LSTM_CHECK(acc.device() == Device::CUDA && x.device() == Device::CUDA && acc.dtype() == DType::F32 &&
                 x.dtype() == DType::F32 && acc.numel() == 1 && x.numel() == 1,
             "accumulate_scalar: expected two F32 [1] CUDA tensors");
  accumulate_scalar_kernel<<<1, 1, 0, stream()>>>(static_cast<float*>(acc.raw()), static_cast<const float*>(x.raw()));
  LSTM_CUDA_CHECK_LAUNCH();
}

}  // namespace lstm::cuda
