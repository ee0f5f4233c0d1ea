// This build and the library versions of the GPU stack, for `lstm info`, Algo::Auto's kept choices
// and benchmark reports.
#include <string>

#include "lstm/device.hpp"
#include "lstm_build_id.h"
#if LSTM_HAVE_CUDA
#include "cuda/cublas_util.hpp"
#include "cudnn/cudnn_util.hpp"
#endif

namespace lstm {

std::string engine_build() { return LSTM_BUILD_ID; }

std::string cuda_versions() {
#if LSTM_HAVE_CUDA
  auto ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); };
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  std::string s = "driver " + (drv ? ver(drv) : std::string("none")) + ", runtime " + ver(rt);
  size_t cudnn = cudnnGetVersion();  // e.g. 91900 = 9.19.0
  // cublasGetProperty needs no handle (and no GPU).
  int maj = 0, min = 0, pat = 0;
  cublasGetProperty(MAJOR_VERSION, &maj);
  cublasGetProperty(MINOR_VERSION, &min);
  cublasGetProperty(PATCH_LEVEL, &pat);
  s += ", cuBLAS " + std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(pat);
  s += ", cuDNN " + std::to_string(cudnn / 10000) + "." + std::to_string((cudnn % 10000) / 100) + "." +
       std::to_string(cudnn % 100);
  return s;
#else
  return "";
#endif
}

}  // namespace lstm
