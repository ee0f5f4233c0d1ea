#include "cuda/lstm_naive.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>
#include <vector>

#include "core/cuda_rt.hpp"
#include "cuda/cublas_util.hpp"
#include "cuda/exec.hpp"

namespace lstm::cuda {

namespace {

__device__ inline float ld(float v) { return v; }
__device__ inline float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float ld(__half v) { return __half2float(v); }
__device__ inline void st(float* p, float v) { *p = v; }
__device__ inline void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void st(__half* p, float v) { *p = __float2half_rn(v); }
__device__ inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

#define NAIVE_LOOP(n)                                                           \
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < (n); \
       k += int64_t(gridDim.x) * blockDim.x)

// ---- forward pointwise kernels (one job each, as in the baseline) ----
template <class T>
__global__ void k_add_bias(float* pre_x, const float* pre_h, const T* b_ih, const T* b_hh, int64_t H, int64_t n) {
  NAIVE_LOOP(n) {
    const int64_t j = k % H;
    pre_x[k] = pre_x[k] + pre_h[k] + ld(b_ih[j]) + ld(b_hh[j]);
  }
}
__global__ void k_sigmoid(const float* in, float* out, int64_t n) { NAIVE_LOOP(n) out[k] = sigmoidf(in[k]); }
__global__ void k_tanh(const float* in, float* out, int64_t n) { NAIVE_LOOP(n) out[k] = tanhf(in[k]); }
__global__ void k_cell(const float* i, const float* f, const float* g, const float* c_prev, float* c, int64_t n) {
  NAIVE_LOOP(n) c[k] = f[k] * c_prev[k] + i[k] * g[k];
}
template <class T>
__global__ void k_hout(const float* o, const float* tanh_c, T* h, int64_t n) {
  NAIVE_LOOP(n) st(&h[k], o[k] * tanh_c[k]);
}

// ---- backward pointwise kernels ----
__global__ void k_dh(const float* d_out, const float* dh_next, float* dh, int64_t n) {
  NAIVE_LOOP(n) dh[k] = d_out[k] + dh_next[k];
}
template <class T>
__global__ void k_do(const float* dh, const float* tanh_c, const float* o, T* d_o, int64_t n) {
  NAIVE_LOOP(n) st(&d_o[k], dh[k] * tanh_c[k] * o[k] * (1.0f - o[k]));
}
__global__ void k_dc(const float* dh, const float* o, const float* tanh_c, const float* dc_next, float* dc, int64_t n) {
  NAIVE_LOOP(n) dc[k] = dh[k] * o[k] * (1.0f - tanh_c[k] * tanh_c[k]) + dc_next[k];
}
template <class T>
__global__ void k_di(const float* dc, const float* g, const float* i, T* d_i, int64_t n) {
  NAIVE_LOOP(n) st(&d_i[k], dc[k] * g[k] * i[k] * (1.0f - i[k]));
}
template <class T>
__global__ void k_df(const float* dc, const float* c_prev, const float* f, T* d_f, int64_t n) {
  NAIVE_LOOP(n) st(&d_f[k], dc[k] * c_prev[k] * f[k] * (1.0f - f[k]));
}
template <class T>
__global__ void k_dg(const float* dc, const float* i, const float* g, T* d_g, int64_t n) {
  NAIVE_LOOP(n) st(&d_g[k], dc[k] * i[k] * (1.0f - g[k] * g[k]));
}
__global__ void k_dc_next(const float* dc, const float* f, float* dc_next, int64_t n) {
  NAIVE_LOOP(n) dc_next[k] = dc[k] * f[k];
}
// db[j] += sum over the batch of dgate[b, j]; one thread per hidden unit.
template <class T>
__global__ void k_colsum(const T* dgate, int64_t B, float* db, int64_t n /* = H */) {
  NAIVE_LOOP(n) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += ld(dgate[b * n + k]);
    db[k] += s;
  }
}
template <class T>
__global__ void k_add_to(T* dst, const float* src, int64_t n) {
  NAIVE_LOOP(n) st(&dst[k], ld(dst[k]) + src[k]);
}

template <class K, class... A>
void launch(K kernel, int64_t n, A... args) {
  kernel<<<grid_for(n), 256, 0, stream()>>>(args..., n);
  LSTM_CUDA_CHECK_LAUNCH();
}

template <class T> constexpr cudaDataType_t cuda_type();
template <> constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }

int as_int(int64_t v) {
  LSTM_CHECK(v > 0 && v <= INT_MAX, "naive LSTM: dimension " << v << " does not fit cuBLAS");
  return static_cast<int>(v);
}

// What a training forward keeps for backward, per layer.
struct NaiveSaved final : LstmSaved {
  struct Layer {
    Tensor in;      // [T, B, I_l] dtype (layer 0: x)
    Tensor h_seq;   // [T, B, H] dtype
    Tensor c;       // [T + 1, B, H] f32, c[0] = c_{-1} = 0
    Tensor gates;   // [T, 4, B, H] f32, activated i, f, g, o
    Tensor tanh_c;  // [T, B, H] f32
  };
  LstmSpec spec;
  DType dtype = DType::F32;
  int64_t T = 0, B = 0;
  Tensor h0;  // [B, H] dtype zeros: h_{-1}
  std::vector<Layer> layers;
};

struct CublasDestroy {
  void operator()(cublasHandle_t h) const { cublasDestroy(h); }
};
using CublasHandle = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDestroy>;

CublasHandle make_handle() {
  cublasHandle_t h = nullptr;
  LSTM_CUDA_CHECK(cublasCreate(&h));
  CublasHandle owned(h);
  LSTM_CUDA_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  return owned;
}

int current_device() {
  int d = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

class NaiveBackend final : public LstmBackend {
 public:
  NaiveBackend(const LstmSpec& spec, DType dtype, Device device, bool allow_tf32)
      : LstmBackend(spec, dtype, device),
        compute_(dtype == DType::F32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F),
        device_index_(current_device()),
        handle_(make_handle()) {}

  Algo algo() const override { return Algo::Naive; }
  std::string name() const override { return "naive"; }
  std::string last_run() const override { return ran_ ? "naive" : ""; }

  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override {
    (void)training;  // no dropout: naive_lstm_unsupported refuses it
    (void)rng;
    auto [T, B] = check_call(in, weights, ctx);
    for (size_t b = 0; b < in.lengths.size(); ++b)
      LSTM_REQUIRE(in.lengths[b] == T, "LSTM naive: runs every sequence for all T=" << T
                                           << " steps (no variable lengths), got lengths[" << b
                                           << "]=" << in.lengths[b]);
    LSTM_REQUIRE(!in.h0.defined() && !in.c0.defined(),
                 "LSTM naive: starts from h0 = c0 = 0 (no initial state), got "
                     << (in.h0.defined() ? "h0 " + in.h0.shape_str() : std::string())
                     << (in.h0.defined() && in.c0.defined() ? " and " : "")
                     << (in.c0.defined() ? "c0 " + in.c0.shape_str() : std::string()));
    begin_call(ctx);
    ExecScope scope(ctx);
    // The handle is ours, so it follows the caller's stream only when told to.
    LSTM_CUDA_CHECK(cublasSetStream(handle_.get(), stream()));
    std::unique_ptr<NaiveSaved> sv = saved ? std::make_unique<NaiveSaved>() : nullptr;
    LstmOutput out;
    switch (dtype()) {
      case DType::F32: out = forward_impl<float>(weights, in.x, T, B, sv.get()); break;
      case DType::BF16: out = forward_impl<__nv_bfloat16>(weights, in.x, T, B, sv.get()); break;
      default: out = forward_impl<__half>(weights, in.x, T, B, sv.get()); break;
    }
    if (saved) *saved = std::move(sv);
    ran_ = true;
    return out;
  }

  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override {
    const auto* sv = dynamic_cast<const NaiveSaved*>(&saved);
    LSTM_REQUIRE(sv, "LSTM naive backward: the saved state does not come from a naive training forward");
    LSTM_REQUIRE(sv->spec == spec() && sv->dtype == dtype(),
                 "LSTM naive backward: the saved state comes from another backend instance's forward");
    check_backward(weights, *sv, grad, d_weights);
    begin_call(ctx);
    ExecScope scope(ctx);
    LSTM_CUDA_CHECK(cublasSetStream(handle_.get(), stream()));
    LstmGrads r;
    switch (dtype()) {
      case DType::F32: r.d_x = backward_impl<float>(weights, *sv, grad, d_weights); break;
      case DType::BF16: r.d_x = backward_impl<__nv_bfloat16>(weights, *sv, grad, d_weights); break;
      default: r.d_x = backward_impl<__half>(weights, *sv, grad, d_weights); break;
    }
    ran_ = true;
    return r;
  }

 private:
  // A cuBLAS handle belongs to the device it was created on.
  void begin_call(const ExecContext& ctx) const {
    LSTM_REQUIRE(ctx.device != Device::CUDA || ctx.device_index == device_index_,
                 "LSTM naive: the backend was made on CUDA device " << device_index_
                                                                    << ", the call's execution context is on device "
                                                                    << ctx.device_index);
  }

  void check_backward(const std::vector<Tensor>& w, const NaiveSaved& sv, const LstmGradOutput& grad,
                      const std::vector<Tensor>& dw) const {
    const auto names = spec().param_names();
    LSTM_REQUIRE(w.size() == names.size() && dw.size() == names.size(),
                 "LSTM naive backward: expected " << names.size() << " weight and gradient tensors, got " << w.size()
                                                  << " and " << dw.size());
    auto check = [&](const Tensor& t, const Shape& want, const std::string& what) {
      LSTM_REQUIRE(t.shape() == want && t.dtype() == dtype() && t.device() == Device::CUDA,
                   "LSTM naive backward: " << what << " must be a CUDA " << dtype_name(dtype()) << " "
                                           << shape_str(want) << ", got a " << device_name(t.device()) << " "
                                           << dtype_name(t.dtype()) << " " << t.shape_str());
    };
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape want = spec().param_shape(names[i]);
      LSTM_REQUIRE(w[i].defined() && dw[i].defined(),
                   "LSTM naive backward: weight '" << names[i] << "' or its gradient is undefined");
      check(w[i], want, "weight '" + names[i] + "'");
      check(dw[i], want, "the gradient of '" + names[i] + "'");
    }
    const int64_t L = spec().num_layers, H = spec().hidden_size;
    if (grad.d_output.defined()) check(grad.d_output, {sv.T, sv.B, H}, "d_output");
    if (grad.d_h_n.defined()) check(grad.d_h_n, {L, sv.B, H}, "d_h_n");
    if (grad.d_c_n.defined()) check(grad.d_c_n, {L, sv.B, H}, "d_c_n");
  }

  // Row-major C[M, N] (f32, ld ldc) = beta * C + op(A) op(B), A and B in the data type.
  // cuBLAS is column-major: row-major C is column-major C^T = op(B)^T op(A)^T, so the operands swap.
  template <class TT>
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const TT* A, int64_t lda, const TT* Bm, int64_t ldb,
            float beta, float* C, int64_t ldc) {
    const float alpha = 1.0f;
    LSTM_CUDA_CHECK(cublasGemmEx(handle_.get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 as_int(N), as_int(M), as_int(K), &alpha, Bm, cuda_type<TT>(), as_int(ldb), A,
                                 cuda_type<TT>(), as_int(lda), &beta, C, CUDA_R_32F, as_int(ldc), compute_,
                                 CUBLAS_GEMM_DEFAULT));
  }

  template <class TT>
  LstmOutput forward_impl(const std::vector<Tensor>& w, const Tensor& x, int64_t T, int64_t B, NaiveSaved* sv);
  template <class TT>
  Tensor backward_impl(const std::vector<Tensor>& w, const NaiveSaved& sv, const LstmGradOutput& grad,
                       std::vector<Tensor>& dw);

  cublasComputeType_t compute_;
  int device_index_;
  CublasHandle handle_;  // its own: the engine's shared handle may carry another math mode
  bool ran_ = false;
};

template <class TT>
LstmOutput NaiveBackend::forward_impl(const std::vector<Tensor>& w, const Tensor& x, int64_t T, int64_t B,
                                      NaiveSaved* sv) {
  const LstmSpec& spec = this->spec();
  const DType dt = dtype();
  const bool training = sv != nullptr;
  const int64_t H = spec.hidden_size, BH = B * H, L = spec.num_layers;
  Tensor h0 = Tensor::zeros({B, H}, dt, Device::CUDA);
  Tensor pre_x = Tensor::empty({4, B, H}, DType::F32, Device::CUDA);
  Tensor pre_h = Tensor::empty({4, B, H}, DType::F32, Device::CUDA);
  float* px = static_cast<float*>(pre_x.raw());
  float* ph = static_cast<float*>(pre_h.raw());
  LstmOutput out;
  out.h_n = Tensor::empty({L, B, H}, dt, Device::CUDA);
  out.c_n = Tensor::empty({L, B, H}, dt, Device::CUDA);

  Tensor in = x;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t I = spec.layer_input_size(l);
    const auto s = spec.slots(l, 0);
    const TT* w_ih = static_cast<const TT*>(w[s.w_ih].raw());
    const TT* w_hh = static_cast<const TT*>(w[s.w_hh].raw());
    const TT* b_ih = static_cast<const TT*>(w[s.b_ih].raw());
    const TT* b_hh = static_cast<const TT*>(w[s.b_hh].raw());
    Tensor h_seq = Tensor::empty({T, B, H}, dt, Device::CUDA);
    // Inference keeps one step of state; training keeps every step for backward.
    Tensor c = Tensor::empty({training ? T + 1 : 2, B, H}, DType::F32, Device::CUDA);
    Tensor gates = Tensor::empty(training ? Shape{T, 4, B, H} : Shape{4, B, H}, DType::F32, Device::CUDA);
    Tensor tanh_c = Tensor::empty(training ? Shape{T, B, H} : Shape{B, H}, DType::F32, Device::CUDA);
    c.slice0(0, 1).zero_();
    const TT* in_p = static_cast<const TT*>(in.raw());
    TT* h_p = static_cast<TT*>(h_seq.raw());
    float* c_p = static_cast<float*>(c.raw());
    float* g_p = static_cast<float*>(gates.raw());
    float* tc_p = static_cast<float*>(tanh_c.raw());
    for (int64_t t = 0; t < T; ++t) {
      const TT* in_t = in_p + t * B * I;
      const TT* h_prev = t == 0 ? static_cast<const TT*>(h0.raw()) : h_p + (t - 1) * BH;
      for (int g = 0; g < 4; ++g) {
        gemm<TT>(false, true, B, H, I, in_t, I, w_ih + g * H * I, I, 0.0f, px + g * BH, H);
        gemm<TT>(false, true, B, H, H, h_prev, H, w_hh + g * H * H, H, 0.0f, ph + g * BH, H);
      }
      for (int g = 0; g < 4; ++g) launch(k_add_bias<TT>, BH, px + g * BH, ph + g * BH, b_ih + g * H, b_hh + g * H, H);
      float* gt = training ? g_p + t * 4 * BH : g_p;
      launch(k_sigmoid, BH, static_cast<const float*>(px), gt);
      launch(k_sigmoid, BH, static_cast<const float*>(px + BH), gt + BH);
      launch(k_tanh, BH, static_cast<const float*>(px + 2 * BH), gt + 2 * BH);
      launch(k_sigmoid, BH, static_cast<const float*>(px + 3 * BH), gt + 3 * BH);
      const float* c_prev = training ? c_p + t * BH : c_p + (t % 2) * BH;
      float* c_cur = training ? c_p + (t + 1) * BH : c_p + ((t + 1) % 2) * BH;
      launch(k_cell, BH, static_cast<const float*>(gt), static_cast<const float*>(gt + BH),
             static_cast<const float*>(gt + 2 * BH), c_prev, c_cur);
      float* tc = training ? tc_p + t * BH : tc_p;
      launch(k_tanh, BH, static_cast<const float*>(c_cur), tc);
      launch(k_hout<TT>, BH, static_cast<const float*>(gt + 3 * BH), static_cast<const float*>(tc), h_p + t * BH);
    }
    const int64_t c_last = training ? T : T % 2;
    out.h_n.slice0(l, l + 1).copy_(h_seq.slice0(T - 1, T));
    out.c_n.slice0(l, l + 1).copy_(c.slice0(c_last, c_last + 1));
    if (training) sv->layers.push_back({in, h_seq, c, gates, tanh_c});
    in = h_seq;
  }
  out.output = in;
  if (training) {
    sv->spec = spec;
    sv->dtype = dt;
    sv->T = T;
    sv->B = B;
    sv->h0 = h0;
  }
  return out;
}

template <class TT>
Tensor NaiveBackend::backward_impl(const std::vector<Tensor>& w, const NaiveSaved& sv, const LstmGradOutput& grad,
                                   std::vector<Tensor>& dw) {
  const LstmSpec& spec = this->spec();
  const int64_t T = sv.T, B = sv.B, H = spec.hidden_size, BH = B * H;
  Tensor d_out = grad.d_output.defined() ? grad.d_output.to(DType::F32)
                                         : Tensor::zeros({T, B, H}, DType::F32, Device::CUDA);
  Tensor dh = Tensor::empty({B, H}, DType::F32, Device::CUDA);
  Tensor dh_next = Tensor::empty({B, H}, DType::F32, Device::CUDA);
  Tensor dc = Tensor::empty({B, H}, DType::F32, Device::CUDA);
  Tensor dc_next = Tensor::empty({B, H}, DType::F32, Device::CUDA);
  Tensor dgate = Tensor::empty({4, B, H}, dtype(), Device::CUDA);
  float* dh_p = static_cast<float*>(dh.raw());
  float* dhn_p = static_cast<float*>(dh_next.raw());
  float* dc_p = static_cast<float*>(dc.raw());
  float* dcn_p = static_cast<float*>(dc_next.raw());
  TT* dg_p = static_cast<TT*>(dgate.raw());

  for (int64_t l = spec.num_layers - 1; l >= 0; --l) {
    const NaiveSaved::Layer& s = sv.layers[static_cast<size_t>(l)];
    const int64_t I = spec.layer_input_size(l);
    const auto slot = spec.slots(l, 0);
    const TT* w_ih = static_cast<const TT*>(w[slot.w_ih].raw());
    const TT* w_hh = static_cast<const TT*>(w[slot.w_hh].raw());
    Tensor dw_ih = Tensor::zeros({4 * H, I}, DType::F32, Device::CUDA);
    Tensor dw_hh = Tensor::zeros({4 * H, H}, DType::F32, Device::CUDA);
    Tensor db = Tensor::zeros({4 * H}, DType::F32, Device::CUDA);
    Tensor dx = Tensor::empty({T, B, I}, DType::F32, Device::CUDA);
    // The gradients with respect to h_n and c_n enter at the last step, as the recurrent ones do.
    if (grad.d_h_n.defined())
      dh_next.copy_(grad.d_h_n.slice0(l, l + 1));
    else
      dh_next.zero_();
    if (grad.d_c_n.defined())
      dc_next.copy_(grad.d_c_n.slice0(l, l + 1));
    else
      dc_next.zero_();
    const float* dout_p = static_cast<const float*>(d_out.raw());
    const TT* in_p = static_cast<const TT*>(s.in.raw());
    const TT* h_p = static_cast<const TT*>(s.h_seq.raw());
    const float* c_p = static_cast<const float*>(s.c.raw());
    const float* g_p = static_cast<const float*>(s.gates.raw());
    const float* tc_p = static_cast<const float*>(s.tanh_c.raw());
    float* dwih_p = static_cast<float*>(dw_ih.raw());
    float* dwhh_p = static_cast<float*>(dw_hh.raw());
    float* db_p = static_cast<float*>(db.raw());
    float* dx_p = static_cast<float*>(dx.raw());
    for (int64_t t = T - 1; t >= 0; --t) {
      const float* gi = g_p + t * 4 * BH;
      const float *gf = gi + BH, *gg = gi + 2 * BH, *go = gi + 3 * BH;
      const float* tc = tc_p + t * BH;
      const float* c_prev = c_p + t * BH;
      launch(k_dh, BH, dout_p + t * BH, static_cast<const float*>(dhn_p), dh_p);
      launch(k_do<TT>, BH, static_cast<const float*>(dh_p), tc, go, dg_p + 3 * BH);
      launch(k_dc, BH, static_cast<const float*>(dh_p), go, tc, static_cast<const float*>(dcn_p), dc_p);
      launch(k_di<TT>, BH, static_cast<const float*>(dc_p), gg, gi, dg_p);
      launch(k_df<TT>, BH, static_cast<const float*>(dc_p), c_prev, gf, dg_p + BH);
      launch(k_dg<TT>, BH, static_cast<const float*>(dc_p), gi, gg, dg_p + 2 * BH);
      launch(k_dc_next, BH, static_cast<const float*>(dc_p), gf, dcn_p);
      for (int g = 0; g < 4; ++g) launch(k_colsum<TT>, H, static_cast<const TT*>(dg_p + g * BH), B, db_p + g * H);
      const TT* in_t = in_p + t * B * I;
      const TT* h_prev = t == 0 ? static_cast<const TT*>(sv.h0.raw()) : h_p + (t - 1) * BH;
      for (int g = 0; g < 4; ++g)
        gemm<TT>(false, false, B, H, H, dg_p + g * BH, H, w_hh + g * H * H, H, g ? 1.0f : 0.0f, dhn_p, H);
      for (int g = 0; g < 4; ++g)
        gemm<TT>(false, false, B, I, H, dg_p + g * BH, H, w_ih + g * H * I, I, g ? 1.0f : 0.0f, dx_p + t * B * I, I);
      for (int g = 0; g < 4; ++g)
        gemm<TT>(true, false, H, I, B, dg_p + g * BH, H, in_t, I, 1.0f, dwih_p + g * H * I, I);
      for (int g = 0; g < 4; ++g)
        gemm<TT>(true, false, H, H, B, dg_p + g * BH, H, h_prev, H, 1.0f, dwhh_p + g * H * H, H);
    }
    launch(k_add_to<TT>, 4 * H * I, static_cast<TT*>(dw[slot.w_ih].raw()), static_cast<const float*>(dwih_p));
    launch(k_add_to<TT>, 4 * H * H, static_cast<TT*>(dw[slot.w_hh].raw()), static_cast<const float*>(dwhh_p));
    launch(k_add_to<TT>, 4 * H, static_cast<TT*>(dw[slot.b_ih].raw()), static_cast<const float*>(db_p));
    launch(k_add_to<TT>, 4 * H, static_cast<TT*>(dw[slot.b_hh].raw()), static_cast<const float*>(db_p));
    d_out = dx;
  }
  return d_out.to(dtype());
}

}  // namespace

std::string naive_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device) {
  if (device != Device::CUDA) return "runs on CUDA devices only";
  if (spec.bidirectional) return "the naive baseline is unidirectional only";
  if (spec.proj_size > 0) return "the naive baseline has no projection (proj_size)";
  if (!spec.bias) return "the naive baseline needs biases";
  if (spec.batch_first) return "the naive baseline is sequence-major only";
  if (spec.dropout > 0) return "the naive baseline has no dropout";
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    return std::string("the naive baseline runs F32, BF16 or F16, not ") + dtype_name(dtype);
  return "";
}

std::unique_ptr<LstmBackend> make_naive_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options) {
  spec.validate();
  const std::string why = naive_lstm_unsupported(spec, dtype, device);
  LSTM_REQUIRE(why.empty(), "LSTM backend 'naive' cannot run this case: " << why);
  return std::make_unique<NaiveBackend>(spec, dtype, device, options.allow_tf32);
}

}  // namespace lstm::cuda
