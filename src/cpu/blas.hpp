// Row-major GEMM on the CPU through OpenBLAS (cblas), loaded at first use (see blas.cpp for why).
// Internal to the library.
#pragma once

#include <cstdint>
#include <string>

namespace lstm::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C, all row-major.
// op(A) is [M,K]: A is [M,K] (lda >= K) or, when trans_a, [K,M] (lda >= M). Likewise B.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

void blas_set_num_threads(int n);
// Which library file and kernel family are in use, e.g. "OpenBLAS /usr/lib/... (kernels: SkylakeX)".
std::string blas_description();

}  // namespace lstm::cpu
