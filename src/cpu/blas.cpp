// OpenBLAS, loaded at first use rather than linked.
//
// Why: Debian's OpenBLAS 0.3.21 picks its kernels from the CPU model number and falls back to
// generic SSE3 code ("Prescott", 4x slower) on CPUs newer than it knows, e.g. Emerald Rapids.
// OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded, so we choose a kernel family from
// the CPU's features first (unless the user set it) and load the library afterwards. We prefer
// the OpenMP build of OpenBLAS so that its threads and our OpenMP loops share one thread pool
// instead of competing for the cores.
#include "cpu/blas.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "lstm/error.hpp"

namespace lstm::cpu {
namespace {

// cblas enums (values fixed by the CBLAS standard).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using sgemm_t = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using sgemv_t = void (*)(int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using dgemv_t = void (*)(int, int, int, int, double, const double*, int, const double*, int, double, double*, int);
using dgemm_t = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                         double*, int);

struct Blas {
  sgemm_t sgemm = nullptr;
  dgemm_t dgemm = nullptr;
  sgemv_t sgemv = nullptr;
  dgemv_t dgemv = nullptr;
  void (*set_threads)(int) = nullptr;
  char* (*corename)() = nullptr;
  std::string path;
};

const char* kernel_family_for_this_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;  // let OpenBLAS decide
}

Blas load() {
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* fam = kernel_family_for_this_cpu()) ::setenv("OPENBLAS_CORETYPE", fam, 0);
  std::string tried;
  const char* user = std::getenv("LSTM_OPENBLAS");
  const char* candidates[] = {user, "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                              "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0",
                              "libopenblas.so"};
  for (const char* c : candidates) {
    if (!c) continue;
    void* h = ::dlopen(c, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      tried += std::string("\n  ") + c + ": " + ::dlerror();
      continue;
    }
    Blas b;
    b.sgemm = reinterpret_cast<sgemm_t>(::dlsym(h, "cblas_sgemm"));
    b.dgemm = reinterpret_cast<dgemm_t>(::dlsym(h, "cblas_dgemm"));
    b.sgemv = reinterpret_cast<sgemv_t>(::dlsym(h, "cblas_sgemv"));
    b.dgemv = reinterpret_cast<dgemv_t>(::dlsym(h, "cblas_dgemv"));
    b.set_threads = reinterpret_cast<void (*)(int)>(::dlsym(h, "openblas_set_num_threads"));
    b.corename = reinterpret_cast<char* (*)()>(::dlsym(h, "openblas_get_corename"));
    b.path = c;
    if (b.sgemm && b.dgemm && b.sgemv && b.dgemv) return b;
    tried += std::string("\n  ") + c + ": no cblas_sgemm/dgemm/sgemv/dgemv in it";
  }
  LSTM_THROW("cannot load OpenBLAS (install libopenblas0-openmp or libopenblas0, or point LSTM_OPENBLAS at "
             "libopenblas.so.0); tried:" << tried);
}

const Blas& blas() {
  static const Blas b = load();
  return b;
}

}  // namespace

namespace {
// Row-major C = alpha op(A) op(B) + beta C through the cblas functions of one precision.
template <class T, class Gemm, class Gemv>
void gemm_impl(Gemm gemm_fn, Gemv gemv_fn, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int inc_a = ta ? static_cast<int>(lda) : 1;
  if (m == 1) {  // one row (batch 1): OpenBLAS's gemv is several times faster than its gemm here
    if (tb)
      gemv_fn(kRowMajor, kNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b, static_cast<int>(ldb), a, inc_a,
              beta, c, 1);
    else
      gemv_fn(kRowMajor, kTrans, static_cast<int>(k), static_cast<int>(n), alpha, b, static_cast<int>(ldb), a, inc_a,
              beta, c, 1);
    return;
  }
  gemm_fn(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n),
          static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
          static_cast<int>(ldc));
}
}  // namespace

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_impl(blas().sgemm, blas().sgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_impl(blas().dgemm, blas().dgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_set_num_threads(int n) {
  if (blas().set_threads) blas().set_threads(n);
}

std::string blas_description() {
  const Blas& b = blas();
  std::string s = "OpenBLAS " + b.path;
  if (b.corename) s += std::string(" (kernels: ") + b.corename() + ")";
  return s;
}

}  // namespace lstm::cpu
