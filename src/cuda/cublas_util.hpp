// cuBLAS / cuBLASLt handles of the engine and their status check (internal).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "core/cuda_rt.hpp"

namespace lstm::cuda {

inline void check(cublasStatus_t s, const char* file, int line, const char* expr) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_status(file, line, expr, "cuBLAS", std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s));
}

// Per-thread handles, bound to the engine stream on every call of these functions.
cublasHandle_t cublas_handle();
cublasLtHandle_t cublaslt_handle();
// A workspace for cuBLASLt matmuls (32 MiB, from the arena, per thread).
void* cublaslt_workspace(size_t* bytes);

}  // namespace lstm::cuda
