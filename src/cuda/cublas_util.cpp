#if LSTM_HAVE_CUDA
#include "cuda/cublas_util.hpp"

namespace lstm::cuda {

namespace {
struct Handles {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  DeviceBuffer workspace;
  // Handles live for the thread; destroying them at thread exit may run after the driver shut
  // down, so they are released only when the thread ends normally (the OS reclaims the rest).
  ~Handles() {
    workspace.reset();
    if (blas) cublasDestroy(blas);
    if (lt) cublasLtDestroy(lt);
  }
};
thread_local Handles t_handles;
}  // namespace

cublasHandle_t cublas_handle() {
  if (!t_handles.blas) LSTM_CUDA_CHECK(cublasCreate(&t_handles.blas));
  LSTM_CUDA_CHECK(cublasSetStream(t_handles.blas, stream()));
  return t_handles.blas;
}

cublasLtHandle_t cublaslt_handle() {
  if (!t_handles.lt) LSTM_CUDA_CHECK(cublasLtCreate(&t_handles.lt));
  return t_handles.lt;
}

void* cublaslt_workspace(size_t* bytes) {
  const size_t n = size_t(32) << 20;
  t_handles.workspace.ensure(n);
  *bytes = n;
  return t_handles.workspace.get();
}

}  // namespace lstm::cuda
#endif
