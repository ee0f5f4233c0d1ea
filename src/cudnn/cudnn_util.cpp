#if LSTM_HAVE_CUDA
#include "cudnn/cudnn_util.hpp"

namespace lstm::cuda {

namespace {
struct Handle {
  cudnnHandle_t h = nullptr;
  ~Handle() {
    if (h) cudnnDestroy(h);
  }
};
thread_local Handle t_cudnn;
}  // namespace

cudnnHandle_t cudnn_handle() {
  if (!t_cudnn.h) LSTM_CUDA_CHECK(cudnnCreate(&t_cudnn.h));
  LSTM_CUDA_CHECK(cudnnSetStream(t_cudnn.h, stream()));
  return t_cudnn.h;
}

}  // namespace lstm::cuda
#endif
