// The cuDNN handle of the engine and its status check (internal).
#pragma once

#include <cudnn.h>

#include "core/cuda_rt.hpp"

namespace lstm::cuda {

inline void check(cudnnStatus_t s, const char* file, int line, const char* expr) {
  if (s != CUDNN_STATUS_SUCCESS) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    std::string msg = cudnnGetErrorString(s);
    if (detail[0]) msg += std::string(" (") + detail + ")";
    throw_status(file, line, expr, "cuDNN", msg);
  }
}

// Per-thread handle, bound to the engine stream on every call.
cudnnHandle_t cudnn_handle();

}  // namespace lstm::cuda
