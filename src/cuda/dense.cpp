// Dense (nn.Linear) forward and backward through cuBLASLt (cuda/layers.hpp says what each computes).
//
// cuBLASLt is column-major: a row-major [rows, cols] matrix is a column-major [cols, rows] one
// with leading dimension cols. With X [N, in], W [out, in], Y [N, out] row-major:
//   forward  Y^T[out, N]  = op(W)[out, in] * X^T[in, N]        A = W (T, lda in),  B = X (N, ldb in)
//            + bias[out] broadcast over the columns (CUBLASLT_EPILOGUE_BIAS: bias length = rows of D)
//   dX       dX^T[in, N]  = W^T[in, out] * dY^T[out, N]        A = W (N, lda in),  B = dY (N, ldb out)
//   dW       dW^T[in, out] += X^T[in, N] * dY[N, out]          A = X (N, lda in),  B = dY (T, ldb out)
//            with CUBLASLT_EPILOGUE_BGRADB the same call reduces B over k = N: the bias gradient,
//            one value per column of D (out values). The epilogue writes it (no accumulation),
//            so it goes to scratch and is added into db; where cuBLASLt has no BGRADB algorithm
//            for the case, db += dY^T * ones (a matrix-vector product with beta = 1) instead.
//
// Descriptors and the heuristic's algorithm are cached per thread for each problem (shapes,
// operations, epilogue, compute type and the pointers' alignments, which the heuristic
// depends on); only the pointer attributes are set per call.
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>

#include "cuda/cublas_util.hpp"
#include "cuda/layers.hpp"

namespace lstm::cuda {

namespace {

cublasComputeType_t compute_type(Precision p) {
  switch (p) {
    case Precision::F32: return CUBLAS_COMPUTE_32F;
    case Precision::TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case Precision::BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case Precision::F16: return CUBLAS_COMPUTE_32F_FAST_16F;
    case Precision::F64: break;
  }
  LSTM_THROW("dense layer on the GPU: precision " << precision_name(p) << " is not available there (use f32, tf32, "
                                                  << "bf16 or f16)");
}

// The largest power of two (up to 256) that divides the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

struct Problem {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  cublasComputeType_t compute;
  cublasLtEpilogue_t epilogue;
  bool accumulate;  // beta = 1
  uint32_t align_a, align_b, align_d, align_bias;

  auto key() const {
    return std::make_tuple(ta, tb, m, n, k, lda, ldb, ldd, static_cast<int>(compute), static_cast<int>(epilogue),
                           accumulate, align_a, align_b, align_d, align_bias);
  }
  bool operator<(const Problem& o) const { return key() < o.key(); }
};

// One cached matmul: descriptors and algorithm, or `supported` false when cuBLASLt has no
// algorithm for it (only epilogue variants may be unsupported; the plain product must work).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::string describe(const Problem& p) {
  std::ostringstream os;
  os << "m=" << p.m << " n=" << p.n << " k=" << p.k << " op(A)=" << (p.ta ? "T" : "N") << " op(B)=" << (p.tb ? "T" : "N")
     << " lda=" << p.lda << " ldb=" << p.ldb << " ldd=" << p.ldd << " epilogue=" << static_cast<int>(p.epilogue)
     << " compute=" << static_cast<int>(p.compute);
  return os.str();
}

// Builds the descriptors and asks the heuristic. `bias` is the epilogue's vector (its value
// matters only through its alignment here).
std::unique_ptr<Plan> make_plan(const Problem& p, const void* bias) {
  auto plan = std::make_unique<Plan>();
  LSTM_CUDA_CHECK(cublasLtMatmulDescCreate(&plan->desc, p.compute, CUDA_R_32F));
  const cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LSTM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LSTM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LSTM_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)));
  // The bias (or bias-gradient) vector is F32 like D, the default type; only its pointer is set.
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    LSTM_CUDA_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  // Stored shapes: op(A) is m x k, so A is stored k x m when transposed; likewise B.
  const uint64_t a_rows = static_cast<uint64_t>(p.ta ? p.k : p.m), a_cols = static_cast<uint64_t>(p.ta ? p.m : p.k);
  const uint64_t b_rows = static_cast<uint64_t>(p.tb ? p.n : p.k), b_cols = static_cast<uint64_t>(p.tb ? p.k : p.n);
  LSTM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_32F, a_rows, a_cols, p.lda));
  LSTM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_32F, b_rows, b_cols, p.ldb));
  LSTM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, static_cast<uint64_t>(p.m),
                                             static_cast<uint64_t>(p.n), p.ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  LSTM_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  size_t ws_bytes = 0;
  cublaslt_workspace(&ws_bytes);
  const uint64_t ws = ws_bytes;
  LSTM_CUDA_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  LSTM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p.align_a,
                                                       sizeof(p.align_a)));
  LSTM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p.align_b,
                                                       sizeof(p.align_b)));
  LSTM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p.align_d,
                                                       sizeof(p.align_d)));
  LSTM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p.align_d,
                                                       sizeof(p.align_d)));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), plan->desc, plan->a, plan->b, plan->d,
                                                           plan->d, pref, 1, &result, &returned);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0) {
    plan->algo = result.algo;
    plan->supported = true;
  } else if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_SUCCESS) {
    LSTM_CUDA_CHECK(st);  // a real error (bad value, no memory, ...), not "no algorithm"
  }
  if (!plan->supported && p.epilogue == CUBLASLT_EPILOGUE_DEFAULT)
    LSTM_THROW("dense layer on the GPU: cuBLASLt has no algorithm for the product " << describe(p));
  return plan;
}

std::map<Problem, std::unique_ptr<Plan>>& plans() {
  thread_local std::map<Problem, std::unique_ptr<Plan>> cache;
  return cache;
}

// D = op(A) op(B) (+ D when accumulate), with the epilogue writing/reading `bias`.
// Returns false (and computes nothing) when cuBLASLt cannot run this epilogue for the case.
bool matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
            int64_t ldb, bool accumulate, float* D, int64_t ldd, cublasComputeType_t compute,
            cublasLtEpilogue_t epilogue, const void* bias) {
  Problem p{ta,
            tb,
            m,
            n,
            k,
            lda,
            ldb,
            ldd,
            compute,
            epilogue,
            accumulate,
            alignment_of(A),
            alignment_of(B),
            alignment_of(D),
            epilogue == CUBLASLT_EPILOGUE_DEFAULT ? 256u : alignment_of(bias)};
  auto& cache = plans();
  auto it = cache.find(p);
  if (it == cache.end()) it = cache.emplace(p, make_plan(p, bias)).first;
  Plan& plan = *it->second;
  if (!plan.supported) return false;
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    LSTM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(&ws_bytes);
  const cublasStatus_t st = cublasLtMatmul(cublaslt_handle(), plan.desc, &alpha, A, plan.a, B, plan.b, &beta, D,
                                           plan.d, D, plan.d, &plan.algo, ws, ws_bytes, stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    // The heuristic offered an algorithm that then refused the case: remember, fall back.
    plan.supported = false;
    return false;
  }
  LSTM_CUDA_CHECK(st);
  return true;
}

thread_local DenseEpilogueStats t_stats;
thread_local bool t_force_unfused = false;

// A vector of ones for the bias-gradient fallback (db += dY^T * ones), grown on demand.
const float* ones(int64_t n) {
  thread_local DeviceBuffer buf;
  thread_local int64_t have = 0;
  if (have < n) {
    buf.ensure(static_cast<size_t>(n) * sizeof(float));
    fill_f32(buf.as<float>(), 1.f, n);
    have = n;
  }
  return buf.as<float>();
}

}  // namespace

DenseEpilogueStats dense_epilogue_stats() { return t_stats; }
void dense_force_unfused(bool on) { t_force_unfused = on; }

void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in, int64_t out,
                   Precision precision) {
  if (n <= 0) return;
  const cublasComputeType_t ct = compute_type(precision);
  if (b && !t_force_unfused &&
      matmul(true, false, out, n, in, w, in, x, in, false, y, out, ct, CUBLASLT_EPILOGUE_BIAS, b)) {
    ++t_stats.bias_fused;
    return;
  }
  if (b) {
    // No fused-bias algorithm for this case: start D from the broadcast bias and accumulate.
    ++t_stats.bias_unfused;
    broadcast_rows(b, y, n, out);
    matmul(true, false, out, n, in, w, in, x, in, true, y, out, ct, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
    return;
  }
  matmul(true, false, out, n, in, w, in, x, in, false, y, out, ct, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
}

void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t n,
                    int64_t in, int64_t out, Precision precision) {
  if (n <= 0) return;
  const cublasComputeType_t ct = compute_type(precision);
  if (dx) matmul(false, false, in, n, out, w, in, dy, out, false, dx, in, ct, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
  if (db) {
    DeviceBuffer scratch(static_cast<size_t>(out) * sizeof(float));
    if (!t_force_unfused && matmul(false, true, in, out, n, x, in, dy, out, true, dw, in, ct,
                                   CUBLASLT_EPILOGUE_BGRADB, scratch.get())) {
      ++t_stats.bgrad_fused;
      add_inplace(db, scratch.as<float>(), out);
      return;
    }
    ++t_stats.bgrad_unfused;
    // db[out] += dY^T[out, N] * ones[N], always in full fp32: the sum over many rows is the
    // part that would lose the most to reduced-precision inputs.
    matmul(false, false, out, 1, n, dy, out, ones(n), n, true, db, out, CUBLAS_COMPUTE_32F,
           CUBLASLT_EPILOGUE_DEFAULT, nullptr);
  }
  matmul(false, true, in, out, n, x, in, dy, out, true, dw, in, ct, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
}

}  // namespace lstm::cuda
