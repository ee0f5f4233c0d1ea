// The fused LSTM backend: docs/KERNELS.md has the schedule (with a diagram), the kernels' thread
// mapping, what a training forward saves and the limits. In short:
//   per layer and direction: one input-projection GEMM for all steps ([T*B, In] x W_ih^T into fp32
//   gate pre-activations), then per step one recurrent GEMM accumulating h_{t-1} W_hh^T into that
//   step's gates and one fused cell kernel (+ a projection GEMM and a commit kernel with proj_size);
//   the two directions run on two streams of the instance; a unidirectional stack runs its layers
//   on a stream each as a wavefront (layer l+1 projects chunks of kWavefrontSteps steps as soon as
//   layer l has produced them);
//   backward: per layer and direction a reverse sweep (cell backward kernel + one dG W_hh GEMM
//   per step), the layer's input gradient dG W_ih and the weight gradients as GEMMs; a
//   unidirectional stack runs it as a wavefront down the stack (layer l-1 sweeps a chunk of steps
//   once layer l has swept it and formed its rows of dx), a bidirectional one per layer top down
//   with the directions on two streams.
// cuBLAS is column-major; gemm_rm() takes row-major operands like cpu::gemm and swaps them, so
// every product below reads as the CPU reference's (src/cpu/lstm_reference.cpp).
#include "cuda/lstm_fused.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_rt.hpp"
#include "cuda/cublas_util.hpp"
#include "cuda/exec.hpp"
#include "cuda/graph_cache.hpp"
#include "cuda/lstm_fused_kernels.cuh"
#include "cuda/lstm_persistent.cuh"
#include "lstm/device.hpp"
#include "cudnn/lstm_cudnn_kernels.hpp"

namespace lstm::cuda {
namespace {

using namespace fused;

// Steps per wavefront chunk: layer l+1 starts a chunk once layer l has finished it. Smaller
// chunks start the upper layers sooner; larger ones make fewer, bigger input-projection GEMMs
// and fewer events. To be tuned by measurement.
constexpr int64_t kWavefrontSteps = 8;
// cuBLAS workspace per stream of the instance (NVIDIA's recommendation for Hopper).
constexpr size_t kLaneWorkspaceBytes = size_t(32) << 20;
constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }

template <class E> constexpr cudaDataType_t cuda_dtype();
template <> constexpr cudaDataType_t cuda_dtype<float>() { return CUDA_R_32F; }
template <> constexpr cudaDataType_t cuda_dtype<__nv_bfloat16>() { return CUDA_R_16BF; }
template <> constexpr cudaDataType_t cuda_dtype<__half>() { return CUDA_R_16F; }

// Row-major C[M, N] = op(A) op(B) + beta C (alpha 1), op(A) [M, K], op(B) [K, N]; A is [M, K]
// (lda >= K) or, when ta, [K, M] (lda >= M); likewise B. cuBLAS sees the column-major transposes:
// C^T = op(B)^T op(A)^T, so the operands swap and keep their own transposes.
void gemm_rm(cublasHandle_t h, cublasComputeType_t compute, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
             const void* A, cudaDataType_t a_type, int64_t lda, const void* Bm, cudaDataType_t b_type, int64_t ldb,
             float beta, void* C, cudaDataType_t c_type, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const float alpha = 1.f;
  LSTM_CUDA_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                               static_cast<int>(M), static_cast<int>(K), &alpha, Bm, b_type, static_cast<int>(ldb), A,
                               a_type, static_cast<int>(lda), &beta, C, c_type, static_cast<int>(ldc), compute,
                               CUBLAS_GEMM_DEFAULT));
}

uint64_t layer_seed(uint64_t seed, int64_t layer) {
  uint64_t z = seed + (static_cast<uint64_t>(layer) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct DropoutParams {
  uint64_t threshold = 0;  // dropped when the hash's top 32 bits are below p * 2^32
  float scale = 1.f;
};
DropoutParams dropout_params(double p) {
  DropoutParams d;
  d.threshold = p >= 1.0 ? (uint64_t(1) << 32) : static_cast<uint64_t>(std::llround(p * 4294967296.0));
  d.scale = p >= 1.0 ? 0.f : 1.f / (1.f - static_cast<float>(p));
  return d;
}

template <class V>
void launch_dropout(cudaStream_t s, const V* src, V* dst, int64_t begin, int64_t end, uint64_t seed,
                    const DropoutParams& dp) {
  if (end <= begin) return;
  dropout_kernel<V><<<grid_for(end - begin), kThreads, 0, s>>>(src, dst, begin, end, seed, dp.threshold, dp.scale);
  LSTM_CUDA_CHECK_LAUNCH();
}

template <class S, class D>
void launch_relayout(cudaStream_t s, const S* src, D* dst, int64_t Tn, int64_t B, int64_t W, bool src_bf, bool dst_bf,
                     const int32_t* len) {
  if (Tn * B * W == 0) return;
  relayout_kernel<S, D><<<grid_for(Tn * B * W), kThreads, 0, s>>>(src, dst, Tn, B, W, src_bf, dst_bf, len);
  LSTM_CUDA_CHECK_LAUNCH();
}

// ---- Owned CUDA resources ----------------------------------------------------------------

class Event {
 public:
  Event() { LSTM_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// A stream of the instance with its own cuBLAS handle and workspace: a handle shared between
// streams would share one workspace between GEMMs that run at the same time. `mark` is the
// lane's one event: every cross-lane wait is issued right after the record it means (a wait
// binds to the event's latest record at the time it is issued), so one event per lane suffices.
struct Lane {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  cudaEvent_t mark = nullptr;

  Lane() {
    try {
      LSTM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      LSTM_CUDA_CHECK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
      LSTM_CUDA_CHECK(cublasCreate(&blas));
      LSTM_CUDA_CHECK(cublasSetStream(blas, stream));
      LSTM_CUDA_CHECK(cudaMalloc(&workspace, kLaneWorkspaceBytes));
      LSTM_CUDA_CHECK(cublasSetWorkspace(blas, workspace, kLaneWorkspaceBytes));
      // Reductions inside a GEMM (split-K) in fp32 even where the output is bf16/fp16.
      LSTM_CUDA_CHECK(cublasSetMathMode(
          blas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Lane() { release(); }
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

 private:
  void release() {
    // Work of an earlier call may still run on the stream and use the workspace.
    if (stream) cudaStreamSynchronize(stream);
    if (blas) cublasDestroy(blas);
    if (workspace) cudaFree(workspace);
    if (mark) cudaEventDestroy(mark);
    if (stream) cudaStreamDestroy(stream);
    blas = nullptr;
    workspace = nullptr;
    mark = nullptr;
    stream = nullptr;
  }
};

// Forks lanes [0, n) off `main` (they start after everything issued on main so far) and joins
// them back (main continues after everything issued on them), also when issuing throws: buffers
// freed after the join are only reused on `main`, in stream order after the lanes' work.
class LaneFork {
 public:
  LaneFork(cudaStream_t main, cudaEvent_t fork, const std::vector<std::unique_ptr<Lane>>& lanes, size_t n)
      : main_(main), lanes_(lanes), n_(n) {
    LSTM_CUDA_CHECK(cudaEventRecord(fork, main));
    for (size_t k = 0; k < n_; ++k) LSTM_CUDA_CHECK(cudaStreamWaitEvent(lanes_[k]->stream, fork, 0));
  }
  void join() {
    for (size_t k = 0; k < n_; ++k) {
      LSTM_CUDA_CHECK(cudaEventRecord(lanes_[k]->mark, lanes_[k]->stream));
      LSTM_CUDA_CHECK(cudaStreamWaitEvent(main_, lanes_[k]->mark, 0));
    }
    joined_ = true;
  }
  ~LaneFork() {
    if (joined_) return;
    for (size_t k = 0; k < n_; ++k) {
      (void)cudaEventRecord(lanes_[k]->mark, lanes_[k]->stream);
      (void)cudaStreamWaitEvent(main_, lanes_[k]->mark, 0);
    }
  }
  LaneFork(const LaneFork&) = delete;
  LaneFork& operator=(const LaneFork&) = delete;

 private:
  cudaStream_t main_;
  const std::vector<std::unique_ptr<Lane>>& lanes_;
  size_t n_;
  bool joined_ = false;
};

// `after` waits for everything issued on `before` so far.
void lane_wait(const Lane& after, const Lane& before) {
  LSTM_CUDA_CHECK(cudaEventRecord(before.mark, before.stream));
  LSTM_CUDA_CHECK(cudaStreamWaitEvent(after.stream, before.mark, 0));
}

// Hands out 256-byte aligned pieces of one buffer; with a null base it only measures (the plan's
// sizes come from the same code that later hands out the pointers).
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <class V>
  V* take(int64_t count) {
    off_ = (off_ + 255) / 256 * 256;
    V* p = base_ ? reinterpret_cast<V*>(base_ + off_) : nullptr;
    off_ += static_cast<size_t>(count) * sizeof(V);
    return p;
  }
  size_t bytes() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

// ---- What a forward lays out, and what a training forward keeps ---------------------------

// One layer/direction's forward buffers. Training (seq): the state of every step, slot-indexed so
// that a direction's h_{t-1} for t = 0..T-1 is one [T, B, Hout] block (forward direction: step t
// reads slot t, writes slot t+1; reverse: reads t+1, writes t); inference: one slot, updated in
// place, shared by the layers that run on the same lane.
template <class E>
struct DirPtrs {
  float* gates = nullptr;  // [T, B, 4H] pre-activations; training: activated i, f, g, o (saved)
  float* c = nullptr;      // training [T+1, B, H]; inference [B, H]
  E* h = nullptr;          // training [T+1, B, Hout]; inference [B, Hout]
  E* m = nullptr;          // projection: training [T, B, H] o*tanh(c) (saved); inference [B, H]
  E* hp = nullptr;         // projection: [B, P] the GEMM's output before the commit
  bool seq = false;
};

template <class E>
struct ForwardPtrs {
  int32_t* len = nullptr;  // [B] on the device
  E* x0 = nullptr;         // [T, B, I] the input, sequence-major, zero past each length
  std::vector<E*> y;       // per layer: its output [T, B, D*Hout]
  std::vector<E*> in;      // per layer: its input ([0] = x0; dropout: a masked copy of y[l-1]; else y[l-1])
  std::vector<DirPtrs<E>> dirs;  // [L*D]
  unsigned long long* xchg = nullptr;  // persistent: max(D, L) x persistent_exchange_words, the h exchange
  unsigned* flags = nullptr;           // persistent: [kPersistentMaxGroups, kPersistentMaxCtas] (flag exchange)
  unsigned long long* gx = nullptr;    // persistent cluster wavefront: [L-1, T, B, H, 4] tagged x-projections
};

template <class E>
struct FusedSaved final : LstmSaved {
  const void* owner = nullptr;
  int64_t T = 0, B = 0;
  bool has_h0 = false, has_c0 = false, dropout = false;
  uint64_t seed = 0;
  cudaStream_t stream = nullptr;  // the forward's stream: the arena hands `memory` out again there
  mutable DeviceBuffer memory;    // released by backward
  ForwardPtrs<E> p;               // the saved members point into `memory`
  mutable bool used = false;
};

// Backward buffers of one direction (bidirectional) or one layer (unidirectional), on its lane.
template <class E>
struct BackwardLanePtrs {
  E* dg = nullptr;            // [T, B, 4H] pre-activation gate gradients
  E* dht = nullptr;           // projection: [T, B, P] gradient w.r.t. the projected h
  float* dh = nullptr;        // [B, Hout] carried gradient w.r.t. h
  float* dhp = nullptr;       // [B, Hout] the last step's dG W_hh
  float* dc = nullptr;        // [B, H] carried gradient w.r.t. c
  float* dm = nullptr;        // projection: [B, H]
  float* partial = nullptr;   // [splits, 4H] bias-gradient partial sums
  float* db = nullptr;        // [4H]
  float* scratch = nullptr;   // bf16/fp16: fp32 weight gradient before it is added into d_weights
};

template <class E>
struct WeightPtrs {
  const E* ih = nullptr;
  const E* hh = nullptr;
  const E* b_ih = nullptr;
  const E* b_hh = nullptr;
  const E* hr = nullptr;
};

// ---- The backend -------------------------------------------------------------------------

template <class E>
class FusedLstm final : public LstmBackend {
 public:
  // persistent: each layer's recurrence runs as one persistent kernel (Algo::Persistent, see
  // lstm_persistent.cuh) instead of a GEMM and a cell kernel per step; all else is shared.
  FusedLstm(const LstmSpec& spec, DType dtype, Device device, bool allow_tf32, GraphMode graphs, bool persistent)
      : LstmBackend(spec, dtype, device),
        persistent_(persistent),
        graphs_(graphs, persistent ? "persistent graphs" : "fused graphs"),
        L_(spec.num_layers),
        D_(spec.directions()),
        H_(spec.hidden_size),
        P_(spec.proj_size),
        Hout_(spec.out_size()),
        I_(spec.input_size),
        G_(4 * spec.hidden_size),
        allow_tf32_(allow_tf32),
        compute_(std::is_same_v<E, float> && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F),
        n_lanes_(spec.bidirectional ? 2 : static_cast<size_t>(spec.num_layers)) {
    for (int64_t l = 0; l < L_; ++l)
      for (int64_t d = 0; d < D_; ++d) slots_.push_back(spec.slots(l, d));
  }

  ~FusedLstm() override {
    if (lanes_.empty()) return;
    int cur = -1;
    const bool switch_dev = cudaGetDevice(&cur) == cudaSuccess && cur != lane_device_;
    if (switch_dev) (void)cudaSetDevice(lane_device_);
    lanes_.clear();
    fork_.reset();
    release_.reset();
    if (switch_dev) (void)cudaSetDevice(cur);
  }

  Algo algo() const override { return persistent_ ? Algo::Persistent : Algo::Fused; }
  std::string name() const override { return persistent_ ? "persistent" : "fused"; }
  // "fused", "fused:wavefront", "persistent[:wavefront], words|flags" (the exchange; backward:
  // "persistent, fused backward"), then how the call ran: "replayed" (a CUDA graph) or "eager".
  std::string last_run() const override {
    if (!*last_run_) return "";
    return std::string(last_run_) + (*graphs_.last() ? std::string(", ") + graphs_.last() : std::string());
  }
  std::string log() const override { return graphs_.log(); }
  bool settled() const override { return settled_fwd_ && settled_bwd_; }
  GraphCounts graph_counts() const override { return graphs_.counts(); }

  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override;
  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override;

 private:
  int64_t in_size(int64_t l) const { return l == 0 ? I_ : D_ * Hout_; }
  size_t lane_of(int64_t l, int64_t d) const { return D_ == 2 ? static_cast<size_t>(d) : static_cast<size_t>(l); }
  const LstmSpec::Slots& slot(int64_t l, int64_t d) const { return slots_[static_cast<size_t>(l * D_ + d)]; }
  WeightPtrs<E> weights_of(const std::vector<Tensor>& w, int64_t l, int64_t d) const {
    const auto& s = slot(l, d);
    WeightPtrs<E> p;
    p.ih = static_cast<const E*>(w[s.w_ih].raw());
    p.hh = static_cast<const E*>(w[s.w_hh].raw());
    if (s.b_ih >= 0) p.b_ih = static_cast<const E*>(w[s.b_ih].raw());
    if (s.b_hh >= 0) p.b_hh = static_cast<const E*>(w[s.b_hh].raw());
    if (s.w_hr >= 0) p.hr = static_cast<const E*>(w[s.w_hr].raw());
    return p;
  }

  void ensure_lanes(int device);
  // The graph cache of a kind of call for (T, B) and, for forwards, the lengths (their values are
  // kernel arguments, baked into a captured graph). Bounded: lengths that change with every batch
  // would otherwise pile caches up that never replay.
  enum class Call { Infer, TrainForward, Backward };
  GraphCache& graph_cache(Call kind, int64_t Tn, int64_t B, const std::vector<int32_t>* len);
  // The key of a graphed call: the buffers `fixed` plus every weight (and gradient) pointer, in a
  // member vector so that a steady loop allocates nothing for it.
  std::span<const void* const> graph_key(std::initializer_list<const void*> fixed, const std::vector<Tensor>& a,
                                         const std::vector<Tensor>* b);
  void check_dims(int64_t Tn, int64_t B) const;
  void upload_lengths(const LstmInput& in, int64_t Tn, int64_t B, int32_t* dst);

  struct PersistentPlan;
  // The buffers of a forward (sizes only when the carvers have no base); `plan`: the persistent
  // backend's plan of this batch, null for the fused backend.
  ForwardPtrs<E> carve_forward(Carver& saved, Carver& work, int64_t Tn, int64_t B, bool save, bool dropout,
                               const PersistentPlan* plan, E* output) const;
  // Bidirectional: two ping-pong dy buffers [N, max(D*Hout, I)] and a set per direction.
  // Unidirectional (the wavefront): dy[l] [N, Hout] per layer (layer l's gradient w.r.t. its
  // output; dy[l-1] is written by lane l while lane l-1 reads the rows lane l has finished), dy[L]
  // [N, I] layer 0's dx, and a set per layer.
  std::vector<BackwardLanePtrs<E>> carve_backward(Carver& work, int64_t Tn, int64_t B, std::vector<float*>* dy) const;
  int64_t colsum_splits(int64_t rows) const { return std::clamp<int64_t>(rows / 256, 1, 64); }

  // Forward pieces, each issued on one lane.
  void init_state(const Lane& ln, const DirPtrs<E>& dp, int64_t d, int64_t Tn, int64_t B, const E* h0,
                  const E* c0) const;
  void finish_state(const Lane& ln, const DirPtrs<E>& dp, int64_t d, int64_t Tn, int64_t B, E* h_n, E* c_n) const;
  void input_projection(const Lane& ln, const WeightPtrs<E>& w, const E* x, int64_t In, float* gates, int64_t t0,
                        int64_t t1, int64_t B) const;
  void step_forward(const Lane& ln, const WeightPtrs<E>& w, const DirPtrs<E>& dp, int64_t d, int64_t t, int64_t B,
                    E* y, const int32_t* len, bool save) const;

  // Backward pieces. sweep_backward issues steps [s_begin, s_end) of a direction's reverse sweep
  // (step s is the s-th one it processes): the first piece starts the carried gradients from
  // d_h_n/d_c_n, the last one (s_end == T) writes d_h0/d_c0.
  void sweep_backward(const Lane& ln, const WeightPtrs<E>& w, const DirPtrs<E>& dp, const BackwardLanePtrs<E>& bp,
                      int64_t d, int64_t Tn, int64_t B, const float* dy, const int32_t* len, const E* dhn,
                      const E* dcn, E* dh0, E* dc0, int64_t s_begin, int64_t s_end) const;
  // The persistent backend's sweep of one direction, all of it, in one cluster launch
  // (lstm_persistent.cuh, PersistentBackArgs): the same results as sweep_backward over [0, T).
  void sweep_backward_cluster(const Lane& ln, const cuda::PersistentShape& shape, const WeightPtrs<E>& w,
                              const DirPtrs<E>& dp, const BackwardLanePtrs<E>& bp, int64_t d, int64_t Tn, int64_t B,
                              const float* dy, const int32_t* len, const E* dhn, const E* dcn, E* dh0,
                              E* dc0) const;
  // The cluster backward's plan for batch B, or null where it does not take this spec (planned
  // once per B).
  const cuda::PersistentShape* persistent_back_plan(int64_t B);
  void weight_grads(const Lane& ln, const FusedSaved<E>& sv, const BackwardLanePtrs<E>& bp, int64_t l, int64_t d,
                    std::vector<Tensor>& dw) const;

  // How the persistent kernels run a batch of B (with dropout between layers or not): one launch
  // for the whole stack (the wavefront: layers > 0 project their input themselves; unidirectional,
  // no dropout, when the weights of all layers fit the SMs) or one launch per layer.
  struct PersistentPlan {
    bool wavefront = false;
    PersistentShape shape;
    PersistentExchange exchange = PersistentExchange::Words;
  };
  const PersistentPlan& persistent_plan(int64_t B, bool dropout);
  // The persistent forward under `plan`: the input projections, then the launches.
  void persistent_layers(const PersistentPlan& plan, const ForwardPtrs<E>& p, const std::vector<Tensor>& weights,
                         int64_t Tn, int64_t B, const E* h0, const E* c0, E* h_n, E* c_n, bool save, bool dropout,
                         uint64_t seed) const;

  const bool persistent_;
  const int64_t L_, D_, H_, P_, Hout_, I_, G_;
  const bool allow_tf32_;
  const cublasComputeType_t compute_;
  const cudaDataType_t dt_ = cuda_dtype<E>();
  const size_t n_lanes_;
  std::vector<LstmSpec::Slots> slots_;

  GraphRunner graphs_;
  struct CacheEntry {
    Call kind;
    int64_t T, B;
    std::vector<int32_t> len;
    GraphCache cache;
  };
  std::vector<CacheEntry> caches_;
  std::vector<const void*> key_;
  bool settled_fwd_ = true, settled_bwd_ = true;

  int lane_device_ = -1;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<Event> fork_, release_;

  // The plan per (T, B, mode): the byte sizes of a call's buffers (mode: forward saving and/or
  // dropout, or backward).
  struct Sizes {
    size_t saved = 0, work = 0;
  };
  std::map<std::array<int64_t, 3>, Sizes> sizes_;
  std::vector<int32_t> host_len_;
  const char* last_run_ = "";
  std::map<std::pair<int64_t, bool>, PersistentPlan> persistent_plans_;  // per (B, dropout), on lane_device_
  std::map<int64_t, std::pair<bool, cuda::PersistentShape>> persistent_back_plans_;  // per B: taken, shape
};

template <class E>
GraphCache& FusedLstm<E>::graph_cache(Call kind, int64_t Tn, int64_t B, const std::vector<int32_t>* len) {
  for (auto& c : caches_)
    if (c.kind == kind && c.T == Tn && c.B == B && (!len || c.len == *len)) return c.cache;
  if (caches_.size() >= 16) caches_.clear();
  caches_.push_back({kind, Tn, B, len ? *len : std::vector<int32_t>{}, GraphCache()});
  return caches_.back().cache;
}

template <class E>
std::span<const void* const> FusedLstm<E>::graph_key(std::initializer_list<const void*> fixed,
                                                     const std::vector<Tensor>& a, const std::vector<Tensor>* b) {
  key_.assign(fixed.begin(), fixed.end());
  for (const auto& t : a) key_.push_back(t.raw());
  if (b)
    for (const auto& t : *b) key_.push_back(t.raw());
  return {key_.data(), key_.size()};
}

template <class E>
void FusedLstm<E>::ensure_lanes(int device) {
  if (!lanes_.empty()) {
    LSTM_REQUIRE(device == lane_device_, "fused LSTM: this instance runs on CUDA device "
                                             << lane_device_ << " (its first call's), got a call for device "
                                             << device);
    return;
  }
  std::vector<std::unique_ptr<Lane>> lanes;
  for (size_t k = 0; k < n_lanes_; ++k) lanes.push_back(std::make_unique<Lane>());
  fork_ = std::make_unique<Event>();
  release_ = std::make_unique<Event>();
  lanes_ = std::move(lanes);
  lane_device_ = device;
}

template <class E>
void FusedLstm<E>::check_dims(int64_t Tn, int64_t B) const {
  // cuBLAS takes int dimensions, and the per-step kernels index a [B, 4H] block with int.
  const int64_t widest = std::max({G_, I_, D_ * Hout_});
  LSTM_REQUIRE(Tn * B <= INT_MAX && B * widest <= INT_MAX,
               "fused LSTM: T*B = " << Tn * B << " and B*max(4H, I, D*Hout) = " << B * widest
                                    << " must each fit in a 32-bit int");
}

template <class E>
void FusedLstm<E>::upload_lengths(const LstmInput& in, int64_t Tn, int64_t B, int32_t* dst) {
  host_len_.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    host_len_[static_cast<size_t>(b)] =
        static_cast<int32_t>(in.lengths.empty() ? Tn : in.lengths[static_cast<size_t>(b)]);
  if (dst) upload_int32(dst, host_len_.data(), B);
}

template <class E>
ForwardPtrs<E> FusedLstm<E>::carve_forward(Carver& sc, Carver& wc, int64_t Tn, int64_t B, bool save, bool dropout,
                                           const PersistentPlan* plan, E* output) const {
  ForwardPtrs<E> p;
  Carver& keep = save ? sc : wc;
  p.len = keep.take<int32_t>(B);
  if (persistent_) {
    p.xchg = wc.take<unsigned long long>(std::max(D_, L_) * persistent_exchange_words(Tn, B, Hout_, dtype()));
    p.flags = wc.take<unsigned>(kPersistentMaxGroups * kPersistentMaxCtas);
    if (plan && plan->wavefront && plan->shape.cluster) p.gx = wc.take<unsigned long long>((L_ - 1) * Tn * B * G_);
  }
  p.x0 = keep.take<E>(Tn * B * I_);
  // Per-lane state (inference) and projection scratch.
  std::vector<DirPtrs<E>> lane(n_lanes_);
  for (auto& lp : lane) {
    if (!save) {
      lp.gates = wc.take<float>(Tn * B * G_);
      lp.c = wc.take<float>(B * H_);
      lp.h = wc.take<E>(B * Hout_);
      if (P_ > 0) lp.m = wc.take<E>(B * H_);
    }
    if (P_ > 0) lp.hp = wc.take<E>(B * P_);
  }
  p.y.resize(static_cast<size_t>(L_));
  p.in.resize(static_cast<size_t>(L_));
  for (int64_t l = 0; l < L_; ++l) {
    const bool last = l == L_ - 1;
    if (last && !spec().batch_first)
      p.y[l] = output;
    else
      p.y[l] = (save && !dropout && !last ? sc : wc).take<E>(Tn * B * D_ * Hout_);
  }
  p.in[0] = p.x0;
  for (int64_t l = 1; l < L_; ++l) p.in[l] = dropout ? keep.take<E>(Tn * B * in_size(l)) : p.y[l - 1];
  p.dirs.resize(static_cast<size_t>(L_ * D_));
  for (int64_t l = 0; l < L_; ++l)
    for (int64_t d = 0; d < D_; ++d) {
      DirPtrs<E>& dp = p.dirs[static_cast<size_t>(l * D_ + d)];
      const DirPtrs<E>& lp = lane[lane_of(l, d)];
      if (save) {
        dp.gates = sc.take<float>(Tn * B * G_);
        dp.c = sc.take<float>((Tn + 1) * B * H_);
        dp.h = sc.take<E>((Tn + 1) * B * Hout_);
        if (P_ > 0) dp.m = sc.take<E>(Tn * B * H_);
        dp.seq = true;
      } else {
        dp = lp;
        dp.seq = false;
      }
      dp.hp = lp.hp;
    }
  return p;
}

template <class E>
std::vector<BackwardLanePtrs<E>> FusedLstm<E>::carve_backward(Carver& wc, int64_t Tn, int64_t B,
                                                              std::vector<float*>* dy) const {
  const int64_t N = Tn * B;
  dy->clear();
  if (D_ == 2) {
    const int64_t width = std::max(D_ * Hout_, I_);
    dy->push_back(wc.take<float>(N * width));
    dy->push_back(wc.take<float>(N * width));
  } else {
    for (int64_t l = 0; l < L_; ++l) dy->push_back(wc.take<float>(N * Hout_));
    dy->push_back(wc.take<float>(N * I_));
  }
  int64_t in_max = 0;
  for (int64_t l = 0; l < L_; ++l) in_max = std::max(in_max, in_size(l));
  const int64_t scratch = std::max({G_ * in_max, G_ * Hout_, P_ * H_});
  std::vector<BackwardLanePtrs<E>> r(static_cast<size_t>(D_ == 2 ? 2 : L_));
  for (auto& bp : r) {
    bp.dg = wc.take<E>(N * G_);
    if (P_ > 0) {
      bp.dht = wc.take<E>(N * P_);
      bp.dm = wc.take<float>(B * H_);
    }
    bp.dh = wc.take<float>(B * Hout_);
    bp.dhp = wc.take<float>(B * Hout_);
    bp.dc = wc.take<float>(B * H_);
    bp.partial = wc.take<float>(colsum_splits(N) * G_);
    bp.db = wc.take<float>(G_);
    if (!std::is_same_v<E, float>) bp.scratch = wc.take<float>(scratch);
  }
  return r;
}

// ---- Forward -------------------------------------------------------------------------------

template <class E>
void FusedLstm<E>::init_state(const Lane& ln, const DirPtrs<E>& dp, int64_t d, int64_t Tn, int64_t B, const E* h0,
                              const E* c0) const {
  const int64_t slot = dp.seq && d == 1 ? Tn : 0;
  const int nh = static_cast<int>(B * Hout_), nc = static_cast<int>(B * H_);
  init_state_kernel<E><<<blocks_for(std::max(nh, nc)), kThreads, 0, ln.stream>>>(h0, c0, dp.h + slot * B * Hout_,
                                                                                 dp.c + slot * B * H_, nh, nc);
  LSTM_CUDA_CHECK_LAUNCH();
}

template <class E>
void FusedLstm<E>::finish_state(const Lane& ln, const DirPtrs<E>& dp, int64_t d, int64_t Tn, int64_t B, E* h_n,
                                E* c_n) const {
  const int64_t slot = dp.seq && d == 0 ? Tn : 0;
  const int nh = static_cast<int>(B * Hout_), nc = static_cast<int>(B * H_);
  finish_state_kernel<E><<<blocks_for(std::max(nh, nc)), kThreads, 0, ln.stream>>>(dp.h + slot * B * Hout_,
                                                                                   dp.c + slot * B * H_, h_n, c_n, nh, nc);
  LSTM_CUDA_CHECK_LAUNCH();
}

// gates[t0:t1] = x[t0:t1] W_ih^T: rows t*B + b of a sequence-major [T, B, In] input.
template <class E>
void FusedLstm<E>::input_projection(const Lane& ln, const WeightPtrs<E>& w, const E* x, int64_t In, float* gates,
                                    int64_t t0, int64_t t1, int64_t B) const {
  gemm_rm(ln.blas, compute_, false, true, (t1 - t0) * B, G_, In, x + t0 * B * In, dt_, In, w.ih, dt_, In, 0.f,
          gates + t0 * B * G_, CUDA_R_32F, G_);
}

template <class E>
void FusedLstm<E>::step_forward(const Lane& ln, const WeightPtrs<E>& w, const DirPtrs<E>& dp, int64_t d, int64_t t,
                                int64_t B, E* y, const int32_t* len, bool save) const {
  const int64_t r = dp.seq ? (d == 0 ? t : t + 1) : 0;
  const int64_t wr = dp.seq ? (d == 0 ? t + 1 : t) : 0;
  const E* h_in = dp.h + r * B * Hout_;
  E* h_out = dp.h + wr * B * Hout_;
  float* g = dp.gates + t * B * G_;
  // gates_t += h_{t-1} W_hh^T: all four gates in one product, accumulated onto the x-projection.
  gemm_rm(ln.blas, compute_, false, true, B, G_, Hout_, h_in, dt_, Hout_, w.hh, dt_, Hout_, 1.f, g, CUDA_R_32F, G_);

  const int64_t ldy = D_ * Hout_;
  E* y_t = y + t * B * ldy + d * Hout_;
  CellForwardArgs<E> a;
  a.gates = g;
  a.b_ih = w.b_ih;
  a.b_hh = w.b_hh;
  a.c_in = dp.c + r * B * H_;
  a.c_out = dp.c + wr * B * H_;
  a.h_in = h_in;
  a.h_out = h_out;
  a.m = P_ > 0 ? (dp.seq ? dp.m + t * B * H_ : dp.m) : nullptr;
  a.y = y_t;
  a.ldy = ldy;
  a.len = len;
  a.t = static_cast<int>(t);
  a.B = static_cast<int>(B);
  a.H = static_cast<int>(H_);
  a.save_gates = save;
  a.copy_inactive = dp.seq;
  cell_forward_kernel<E><<<blocks_for(B * H_), kThreads, 0, ln.stream>>>(a);
  LSTM_CUDA_CHECK_LAUNCH();
  if (P_ > 0) {
    // hp = m W_hr^T, then active rows take it as their state and output.
    gemm_rm(ln.blas, compute_, false, true, B, P_, H_, a.m, dt_, H_, w.hr, dt_, H_, 0.f, dp.hp, dt_, P_);
    ProjCommitArgs<E> c;
    c.hp = dp.hp;
    c.h_in = h_in;
    c.h_out = h_out;
    c.y = y_t;
    c.ldy = ldy;
    c.len = len;
    c.t = static_cast<int>(t);
    c.B = static_cast<int>(B);
    c.P = static_cast<int>(P_);
    c.copy_inactive = dp.seq;
    proj_commit_kernel<E><<<blocks_for(B * P_), kThreads, 0, ln.stream>>>(c);
    LSTM_CUDA_CHECK_LAUNCH();
  }
}

template <class E>
LstmOutput FusedLstm<E>::forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                                 std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) {
  ExecScope scope(ctx);
  const auto [Tn, B] = check_call(in, weights, ctx);
  check_dims(Tn, B);
  ensure_lanes(ctx.device_index);
  const cudaStream_t s0 = scope.stream();
  const bool save = saved != nullptr;
  const bool dropout = training && spec().dropout > 0 && L_ > 1;
  const bool bf = spec().batch_first;
  uint64_t seed = 0;
  if (dropout) {
    LSTM_REQUIRE(rng, "fused LSTM: dropout in training needs an Rng");
    seed = rng->next_u64();
  }
  const DropoutParams drop = dropout_params(spec().dropout);

  // Throws naming the limit before anything is issued. A map entry: the pointer stays valid.
  const PersistentPlan* plan = persistent_ ? &persistent_plan(B, dropout) : nullptr;
  const std::array<int64_t, 3> key{Tn, B, (save ? 1 : 0) | (dropout ? 2 : 0)};
  auto it = sizes_.find(key);
  if (it == sizes_.end()) {
    Carver sc(nullptr), wc(nullptr);
    (void)carve_forward(sc, wc, Tn, B, save, dropout, plan, nullptr);
    it = sizes_.emplace(key, Sizes{sc.bytes(), wc.bytes()}).first;
  }

  // Everything the call touches is allocated here, on the caller's stream, before the fork.
  LstmOutput out;
  out.output = Tensor::empty(bf ? Shape{B, Tn, D_ * Hout_} : Shape{Tn, B, D_ * Hout_}, dtype(), Device::CUDA);
  out.h_n = Tensor::empty({L_ * D_, B, Hout_}, dtype(), Device::CUDA);
  out.c_n = Tensor::empty({L_ * D_, B, H_}, dtype(), Device::CUDA);
  std::unique_ptr<FusedSaved<E>> sv;
  if (save) {
    sv = std::make_unique<FusedSaved<E>>();
    sv->memory = DeviceBuffer(it->second.saved);
  }
  DeviceBuffer work(it->second.work);
  Carver sc(sv ? sv->memory.get() : nullptr), wc(work.get());
  const ForwardPtrs<E> p = carve_forward(sc, wc, Tn, B, save, dropout, plan, static_cast<E*>(out.output.raw()));

  upload_lengths(in, Tn, B, nullptr);  // the host copy: the graph cache is chosen by it
  const E* h0 = in.h0.defined() ? static_cast<const E*>(in.h0.raw()) : nullptr;
  const E* c0 = in.c0.defined() ? static_cast<const E*>(in.c0.raw()) : nullptr;
  // Everything below issues work only (no allocation, no host reads of the GPU), onto the engine
  // stream (ctx's, or the graph runner's capture stream) and the lanes forked from it, so that a
  // call can be captured as a CUDA graph and replayed. x is read from `x` (the caller's tensor, or
  // the graph cache's staged copy).
  auto issue = [&](const E* x) {
  const cudaStream_t s0 = cuda::stream();
  upload_int32(p.len, host_len_.data(), B);
  launch_relayout<E, E>(s0, x, p.x0, Tn, B, I_, bf, false, p.len);

  E* h_n = static_cast<E*>(out.h_n.raw());
  E* c_n = static_cast<E*>(out.c_n.raw());
  auto dir_of = [&](int64_t l, int64_t d) -> const DirPtrs<E>& { return p.dirs[static_cast<size_t>(l * D_ + d)]; };
  auto h0_of = [&](int64_t idx) { return h0 ? h0 + idx * B * Hout_ : nullptr; };
  auto c0_of = [&](int64_t idx) { return c0 ? c0 + idx * B * H_ : nullptr; };
  if (persistent_) {
    persistent_layers(*plan, p, weights, Tn, B, h0, c0, h_n, c_n, save, dropout, seed);
  } else {
    LaneFork fork(s0, fork_->get(), lanes_, n_lanes_);
    if (D_ == 2) {
      // Layer by layer; the directions of a layer run at once on lanes 0 and 1, and both need
      // all of the previous layer's output.
      const Lane& l0 = *lanes_[0];
      const Lane& l1 = *lanes_[1];
      for (int64_t l = 0; l < L_; ++l) {
        const int64_t In = in_size(l);
        if (l > 0) {
          LSTM_CUDA_CHECK(cudaStreamWaitEvent(l0.stream, l1.mark, 0));  // l1's record at the end of layer l-1
          if (dropout)
            launch_dropout<E>(l0.stream, p.y[l - 1], p.in[l], 0, Tn * B * In, layer_seed(seed, l), drop);
          lane_wait(l1, l0);
        }
        const WeightPtrs<E> w[2] = {weights_of(weights, l, 0), weights_of(weights, l, 1)};
        for (int64_t d = 0; d < 2; ++d) {
          const Lane& ln = *lanes_[d];
          init_state(ln, dir_of(l, d), d, Tn, B, h0_of(l * 2 + d), c0_of(l * 2 + d));
          input_projection(ln, w[d], p.in[l], In, dir_of(l, d).gates, 0, Tn, B);
        }
        // Steps interleaved so that neither lane waits for the host to issue the other's steps.
        for (int64_t s = 0; s < Tn; ++s) {
          step_forward(l0, w[0], dir_of(l, 0), 0, s, B, p.y[l], p.len, save);
          step_forward(l1, w[1], dir_of(l, 1), 1, Tn - 1 - s, B, p.y[l], p.len, save);
        }
        for (int64_t d = 0; d < 2; ++d)
          finish_state(*lanes_[d], dir_of(l, d), d, Tn, B, h_n + (l * 2 + d) * B * Hout_, c_n + (l * 2 + d) * B * H_);
        LSTM_CUDA_CHECK(cudaEventRecord(l1.mark, l1.stream));
      }
    } else {
      // Wavefront: layer l on lane l; after each chunk of steps lane l records its mark, and
      // lane l+1 (issued right after, before lane l records again) waits for it, dropout-masks and
      // projects that chunk of layer l's output, and runs the same steps.
      const int64_t chunk = L_ > 1 ? kWavefrontSteps : Tn;
      std::vector<WeightPtrs<E>> w(static_cast<size_t>(L_));
      for (int64_t l = 0; l < L_; ++l) {
        w[l] = weights_of(weights, l, 0);
        init_state(*lanes_[l], dir_of(l, 0), 0, Tn, B, h0_of(l), c0_of(l));
      }
      input_projection(*lanes_[0], w[0], p.in[0], I_, dir_of(0, 0).gates, 0, Tn, B);
      for (int64_t t0 = 0; t0 < Tn; t0 += chunk) {
        const int64_t t1 = std::min(Tn, t0 + chunk);
        for (int64_t l = 0; l < L_; ++l) {
          const Lane& ln = *lanes_[l];
          if (l > 0) {
            const int64_t In = in_size(l);
            LSTM_CUDA_CHECK(cudaStreamWaitEvent(ln.stream, lanes_[l - 1]->mark, 0));
            if (dropout)
              launch_dropout<E>(ln.stream, p.y[l - 1], p.in[l], t0 * B * In, t1 * B * In, layer_seed(seed, l), drop);
            input_projection(ln, w[l], p.in[l], In, dir_of(l, 0).gates, t0, t1, B);
          }
          for (int64_t t = t0; t < t1; ++t) step_forward(ln, w[l], dir_of(l, 0), 0, t, B, p.y[l], p.len, save);
          LSTM_CUDA_CHECK(cudaEventRecord(ln.mark, ln.stream));
        }
      }
      for (int64_t l = 0; l < L_; ++l)
        finish_state(*lanes_[l], dir_of(l, 0), 0, Tn, B, h_n + l * B * Hout_, c_n + l * B * H_);
    }
    fork.join();
  }
  if (bf) launch_relayout<E, E>(s0, p.y[L_ - 1], static_cast<E*>(out.output.raw()), Tn, B, D_ * Hout_, false, true, p.len);
  };

  // Dropout's seed is a kernel argument: such calls stay eager (a replay would reuse the mask).
  if (graphs_.mode() != GraphMode::Off && !dropout) {
    GraphCache& gc = graph_cache(save ? Call::TrainForward : Call::Infer, Tn, B, &host_len_);
    const auto key = graph_key({out.output.raw(), out.h_n.raw(), out.c_n.raw(), work.get(),
                                sv ? sv->memory.get() : nullptr, h0, c0},
                               weights, nullptr);
    auto fill_x = [&](void* dst) {
      LSTM_CUDA_CHECK(cudaMemcpyAsync(dst, in.x.raw(), in.x.nbytes(), cudaMemcpyDeviceToDevice, cuda::stream()));
    };
    auto graphed = [&](std::span<void* const> st) -> std::string {
      try {
        issue(static_cast<const E*>(st[0]));
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    };
    auto describe = [&] {
      return "T " + std::to_string(Tn) + ", B " + std::to_string(B) + (save ? ", training forward" : ", inference");
    };
    if (!graphs_.replay(gc, key, {{in.x.nbytes(), fill_x}}, graphed, describe))
      graphs_.eager(gc, [&] { issue(static_cast<const E*>(in.x.raw())); });
    settled_fwd_ = graphs_.settled(&gc);
  } else {
    issue(static_cast<const E*>(in.x.raw()));
    graphs_.ran_eager();
    settled_fwd_ = true;
  }

  if (sv) {
    sv->owner = this;
    sv->T = Tn;
    sv->B = B;
    sv->has_h0 = h0 != nullptr;
    sv->has_c0 = c0 != nullptr;
    sv->dropout = dropout;
    sv->seed = seed;
    sv->stream = s0;
    sv->p = p;
    *saved = std::move(sv);
  }
  if (plan) {
    const bool words = plan->exchange == PersistentExchange::Words;
    last_run_ = plan->shape.cluster ? (plan->wavefront ? "persistent:cluster, wavefront" : "persistent:cluster")
                : plan->wavefront       ? (words ? "persistent:wavefront, words" : "persistent:wavefront, flags")
                                        : (words ? "persistent, words" : "persistent, flags");
  } else {
    last_run_ = D_ == 1 && L_ > 1 ? "fused:wavefront" : "fused";
  }
  return out;
}

template <class E>
const typename FusedLstm<E>::PersistentPlan& FusedLstm<E>::persistent_plan(int64_t B, bool dropout) {
  const auto key = std::make_pair(B, dropout);
  auto it = persistent_plans_.find(key);
  if (it != persistent_plans_.end()) return it->second;
  PersistentPlan plan;
  // $LSTM_PERSISTENT_WAVEFRONT=0 runs a stack layer by layer (for measurement).
  if (D_ == 1 && L_ > 1 && !dropout && !persistent_knobs().no_wavefront) {
    // The stack in one launch: one cluster per layer and one per layer above the first for its
    // input projection, where the cluster kernels take it, else the grid-wide kernel's wavefront.
    PersistentShape cluster;
    if (plan_persistent_cluster(H_, Hout_, Hout_, 2 * L_ - 1, B, dtype(), lane_device_, &cluster).empty()) {
      plan.shape = cluster;
      plan.wavefront = true;
    } else {
      plan.wavefront = plan_persistent(H_, Hout_, Hout_, L_, B, dtype(), lane_device_, &plan.shape).empty();
    }
  }
  if (!plan.wavefront) {
    PersistentShape cluster;
    if (plan_persistent_cluster(H_, Hout_, 0, D_, B, dtype(), lane_device_, &cluster).empty()) {
      plan.shape = cluster;
    } else {
      const std::string why = plan_persistent(H_, Hout_, 0, D_, B, dtype(), lane_device_, &plan.shape);
      LSTM_REQUIRE(why.empty(), "persistent LSTM: " << why);
    }
  }
  // The cluster kernels hand h to the layer above as tagged words (no fence on their step's path).
  plan.exchange = plan.shape.cluster ? PersistentExchange::Words : persistent_exchange_for(B);
  return persistent_plans_.emplace(key, plan).first->second;
}

// On lane 0. The wavefront (a unidirectional stack without dropout whose weights fit): the
// states' init, layer 0's input projection (one GEMM), then one launch for all layers, layer l > 0
// projecting each step of layer l-1's output itself as it arrives. Otherwise layer by layer:
// dropout of the layer below's output (training), init, the input projection of all steps (one
// GEMM per direction), then one launch for the layer's directions. The launches write h_n, c_n.
template <class E>
void FusedLstm<E>::persistent_layers(const PersistentPlan& plan, const ForwardPtrs<E>& p,
                                     const std::vector<Tensor>& weights, int64_t Tn, int64_t B, const E* h0,
                                     const E* c0, E* h_n, E* c_n, bool save, bool dropout, uint64_t seed) const {
  const cudaStream_t s0 = cuda::stream();
  LaneFork fork(s0, fork_->get(), lanes_, 1);
  const Lane& ln = *lanes_[0];
  const DropoutParams drop = dropout_params(spec().dropout);
  const size_t xwords = persistent_exchange_words(Tn, B, Hout_, dtype());
  PersistentArgs<E> a;
  a.len = p.len;
  a.T = static_cast<int>(Tn);
  a.B = static_cast<int>(B);
  a.H = static_cast<int>(H_);
  a.Hout = static_cast<int>(Hout_);
  a.ldy = static_cast<int>(D_ * Hout_);
  a.seq = save ? 1 : 0;
  a.fp32_split = std::is_same_v<E, float> && !allow_tf32_ ? 1 : 0;
  a.skip = persistent_knobs().skip;
  a.cluster_barrier = persistent_knobs().cluster_barrier ? 1 : 0;
  const bool flags = plan.exchange == PersistentExchange::Flags;
  const size_t flag_bytes = kPersistentMaxGroups * kPersistentMaxCtas * sizeof(unsigned);
  // Group g of a launch: layer l, direction d; `exchange`: its h_t goes to other CTAs through the
  // exchange words in global memory (the grid kernels; the cluster wavefront's layers below the
  // top), not only through shared memory.
  auto fill = [&](int g, int64_t l, int64_t d, const WeightPtrs<E>& w, bool exchange) {
    const DirPtrs<E>& dp = p.dirs[static_cast<size_t>(l * D_ + d)];
    const int64_t idx = l * D_ + d;
    init_state(ln, dp, d, Tn, B, h0 ? h0 + idx * B * Hout_ : nullptr, c0 ? c0 + idx * B * H_ : nullptr);
    PersistentGroup<E>& ga = a.group[g];
    ga = PersistentGroup<E>();
    ga.w_hh = w.hh;
    ga.b_ih = w.b_ih;
    ga.b_hh = w.b_hh;
    ga.gates = dp.gates;
    ga.h = dp.h;
    ga.c = dp.c;
    ga.y = p.y[l] + d * Hout_;
    ga.h_n = h_n + idx * B * Hout_;
    ga.c_n = c_n + idx * B * H_;
    if (exchange) ga.xchg = p.xchg + g * xwords;
    if (exchange && flags) ga.flags = p.flags + g * kPersistentMaxCtas;
    ga.reverse = static_cast<int>(d);
  };
  if (plan.wavefront && plan.shape.cluster) {
    // Groups 0 .. L-1: the layers; L + l - 1: layer l's input projection (W_ih times layer l-1's
    // exchange words, step by step, into the tagged words layer l reads).
    const size_t gx_words = static_cast<size_t>(Tn * B * G_);
    for (int64_t l = 0; l < L_; ++l) {
      const WeightPtrs<E> w = weights_of(weights, l, 0);
      fill(static_cast<int>(l), l, 0, w, l + 1 < L_);
      if (l == 0) {
        input_projection(ln, w, p.in[0], I_, a.group[0].gates, 0, Tn, B);
        continue;
      }
      unsigned long long* gx = p.gx + (l - 1) * gx_words;
      a.group[l].gx_in = gx;
      PersistentGroup<E>& pg = a.group[L_ + l - 1];
      pg = PersistentGroup<E>();
      pg.w_ih = w.ih;
      pg.in_size = static_cast<int>(Hout_);
      pg.in_xchg = a.group[l - 1].xchg;
      pg.gx_out = gx;
    }
    LSTM_CUDA_CHECK(cudaMemsetAsync(p.xchg, 0, (L_ - 1) * xwords * sizeof(unsigned long long), ln.stream));
    LSTM_CUDA_CHECK(cudaMemsetAsync(p.gx, 0, (L_ - 1) * gx_words * sizeof(unsigned long long), ln.stream));
    launch_persistent<E>(a, static_cast<int>(2 * L_ - 1), plan.shape, ln.stream);
  } else if (plan.wavefront) {
    for (int64_t l = 0; l < L_; ++l) {
      const WeightPtrs<E> w = weights_of(weights, l, 0);
      fill(static_cast<int>(l), l, 0, w, true);
      if (l == 0) {
        input_projection(ln, w, p.in[0], I_, a.group[0].gates, 0, Tn, B);
      } else {
        a.group[l].w_ih = w.ih;
        a.group[l].in_size = static_cast<int>(Hout_);
        a.group[l].in_xchg = a.group[l - 1].xchg;
        a.group[l].in_flags = a.group[l - 1].flags;
      }
    }
    LSTM_CUDA_CHECK(cudaMemsetAsync(p.xchg, 0, L_ * xwords * sizeof(unsigned long long), ln.stream));
    if (flags) LSTM_CUDA_CHECK(cudaMemsetAsync(p.flags, 0, flag_bytes, ln.stream));
    launch_persistent<E>(a, static_cast<int>(L_), plan.shape, ln.stream);
  } else {
    for (int64_t l = 0; l < L_; ++l) {
      const int64_t In = in_size(l);
      if (l > 0 && dropout) launch_dropout<E>(ln.stream, p.y[l - 1], p.in[l], 0, Tn * B * In, layer_seed(seed, l), drop);
      for (int64_t d = 0; d < D_; ++d) {
        const WeightPtrs<E> w = weights_of(weights, l, d);
        fill(static_cast<int>(d), l, d, w, !plan.shape.cluster);
        input_projection(ln, w, p.in[l], In, a.group[d].gates, 0, Tn, B);
      }
      if (!plan.shape.cluster) {  // the cluster kernels' h goes through shared memory only
        LSTM_CUDA_CHECK(cudaMemsetAsync(p.xchg, 0, D_ * xwords * sizeof(unsigned long long), ln.stream));
        if (flags) LSTM_CUDA_CHECK(cudaMemsetAsync(p.flags, 0, flag_bytes, ln.stream));
      }
      launch_persistent<E>(a, static_cast<int>(D_), plan.shape, ln.stream);
    }
  }
  fork.join();
}

// ---- Backward ------------------------------------------------------------------------------

template <class E>
void FusedLstm<E>::sweep_backward(const Lane& ln, const WeightPtrs<E>& w, const DirPtrs<E>& dp,
                                  const BackwardLanePtrs<E>& bp, int64_t d, int64_t Tn, int64_t B, const float* dy,
                                  const int32_t* len, const E* dhn, const E* dcn, E* dh0, E* dc0, int64_t s_begin,
                                  int64_t s_end) const {
  const int nh = static_cast<int>(B * Hout_), nc = static_cast<int>(B * H_);
  if (s_begin == 0) {
    grad_init_kernel<E><<<blocks_for(std::max(nh, nc)), kThreads, 0, ln.stream>>>(dhn, dcn, bp.dh, bp.dc, nh, nc);
    LSTM_CUDA_CHECK_LAUNCH();
  }
  const int64_t ldy = D_ * Hout_;
  for (int64_t s = s_begin; s < s_end; ++s) {
    // Reverse of the forward's order: forward direction T-1 .. 0, reverse direction 0 .. T-1.
    const int64_t t = d == 0 ? Tn - 1 - s : s;
    const int64_t tp = d == 0 ? t + 1 : t - 1;
    const float* dy_t = dy + t * B * ldy + d * Hout_;
    E* dg_t = bp.dg + t * B * G_;
    if (P_ > 0) {
      DhTotalArgs<E> a;
      a.dy = dy_t;
      a.ldy = ldy;
      a.dhp = bp.dhp;
      a.dh = bp.dh;
      a.dht = bp.dht + t * B * P_;
      a.len = len;
      a.t = static_cast<int>(t);
      a.tp = static_cast<int>(tp);
      a.B = static_cast<int>(B);
      a.P = static_cast<int>(P_);
      a.has_prev = s > 0;
      dh_total_kernel<E><<<blocks_for(B * P_), kThreads, 0, ln.stream>>>(a);
      LSTM_CUDA_CHECK_LAUNCH();
      // dm = dht W_hr: [B, P] x [P, H].
      gemm_rm(ln.blas, compute_, false, false, B, H_, P_, a.dht, dt_, P_, w.hr, dt_, H_, 0.f, bp.dm, CUDA_R_32F, H_);
    }
    CellBackwardArgs<E> a;
    a.gates = dp.gates + t * B * G_;
    a.c_t = dp.c + (d == 0 ? t + 1 : t) * B * H_;
    a.c_prev = dp.c + (d == 0 ? t : t + 1) * B * H_;
    a.dm = P_ > 0 ? bp.dm : nullptr;
    a.dy = dy_t;
    a.ldy = ldy;
    a.dhp = bp.dhp;
    a.dh = bp.dh;
    a.dc = bp.dc;
    a.dg = dg_t;
    a.len = len;
    a.t = static_cast<int>(t);
    a.tp = static_cast<int>(tp);
    a.B = static_cast<int>(B);
    a.H = static_cast<int>(H_);
    a.has_prev = s > 0;
    cell_backward_kernel<E><<<blocks_for(B * H_), kThreads, 0, ln.stream>>>(a);
    LSTM_CUDA_CHECK_LAUNCH();
    // dhp = dG_t W_hh: [B, 4H] x [4H, Hout], the gradient w.r.t. h_{t-1} of the active rows.
    gemm_rm(ln.blas, compute_, false, false, B, Hout_, G_, dg_t, dt_, G_, w.hh, dt_, Hout_, 0.f, bp.dhp, CUDA_R_32F,
            Hout_);
  }
  if (s_end == Tn && (dh0 || dc0)) {
    GradFinishArgs<E> f;
    f.dhp = bp.dhp;
    f.dh = bp.dh;
    f.dc = bp.dc;
    f.dh0 = dh0;
    f.dc0 = dc0;
    f.len = len;
    f.tl = static_cast<int>(d == 0 ? 0 : Tn - 1);
    f.B = static_cast<int>(B);
    f.Hout = static_cast<int>(Hout_);
    f.H = static_cast<int>(H_);
    grad_finish_kernel<E><<<blocks_for(std::max(nh, nc)), kThreads, 0, ln.stream>>>(f);
    LSTM_CUDA_CHECK_LAUNCH();
  }
}

template <class E>
const cuda::PersistentShape* FusedLstm<E>::persistent_back_plan(int64_t B) {
  auto it = persistent_back_plans_.find(B);
  if (it == persistent_back_plans_.end()) {
    cuda::PersistentShape shape;
    // The whole sweep of a direction in one launch: every direction of a bidirectional stack, or a
    // single layer (a unidirectional stack's backward is the fused wavefront, in chunks of steps).
    const bool taken = persistent_ && P_ == 0 && (D_ == 2 || L_ == 1) &&
                       cuda::plan_persistent_cluster_backward(H_, B, dtype(), lane_device_, &shape).empty();
    it = persistent_back_plans_.emplace(B, std::make_pair(taken, shape)).first;
  }
  return it->second.first ? &it->second.second : nullptr;
}

template <class E>
void FusedLstm<E>::sweep_backward_cluster(const Lane& ln, const cuda::PersistentShape& shape, const WeightPtrs<E>& w,
                                          const DirPtrs<E>& dp, const BackwardLanePtrs<E>& bp, int64_t d, int64_t Tn,
                                          int64_t B, const float* dy, const int32_t* len, const E* dhn, const E* dcn,
                                          E* dh0, E* dc0) const {
  cuda::PersistentBackArgs<E> a;
  a.w_hh = w.hh;
  a.gates = dp.gates;
  a.c = dp.c;
  a.dy = dy + d * Hout_;
  a.ldy = D_ * Hout_;
  a.len = len;
  a.dhn = dhn;
  a.dcn = dcn;
  a.dg = bp.dg;
  a.dh0 = dh0;
  a.dc0 = dc0;
  a.T = static_cast<int>(Tn);
  a.B = static_cast<int>(B);
  a.H = static_cast<int>(H_);
  a.reverse = d == 1 ? 1 : 0;
  cuda::launch_persistent_backward<E>(a, shape, ln.stream);
}

template <class E>
void FusedLstm<E>::weight_grads(const Lane& ln, const FusedSaved<E>& sv, const BackwardLanePtrs<E>& bp, int64_t l,
                                int64_t d, std::vector<Tensor>& dw) const {
  const int64_t N = sv.T * sv.B, In = in_size(l);
  const DirPtrs<E>& dp = sv.p.dirs[static_cast<size_t>(l * D_ + d)];
  const auto& s = slot(l, d);
  // h_{t-1} for t = 0..T-1 in time order (see DirPtrs).
  const E* h_prev = dp.h + (d == 0 ? 0 : sv.B * Hout_);
  StreamGuard guard(ln.stream);  // add_into issues on the engine stream
  // dW += A^T Bm over all N rows: straight into d_weights in F32, through fp32 scratch otherwise.
  auto accumulate = [&](int64_t rows_out, int64_t cols, const E* A, int64_t lda, const E* Bm, Tensor& target) {
    if (std::is_same_v<E, float>) {
      gemm_rm(ln.blas, compute_, true, false, rows_out, cols, N, A, dt_, lda, Bm, dt_, cols, 1.f, target.raw(),
              CUDA_R_32F, cols);
    } else {
      gemm_rm(ln.blas, compute_, true, false, rows_out, cols, N, A, dt_, lda, Bm, dt_, cols, 0.f, bp.scratch,
              CUDA_R_32F, cols);
      add_into(target.raw(), dtype(), bp.scratch, DType::F32, rows_out * cols);
    }
  };
  accumulate(G_, In, bp.dg, G_, sv.p.in[l], dw[s.w_ih]);
  accumulate(G_, Hout_, bp.dg, G_, h_prev, dw[s.w_hh]);
  if (P_ > 0) accumulate(P_, H_, bp.dht, P_, dp.m, dw[s.w_hr]);
  if (s.b_ih >= 0) {
    const int64_t splits = colsum_splits(N);
    const int64_t per = (N + splits - 1) / splits;
    colsum_partial_kernel<E><<<dim3(static_cast<unsigned>((G_ + 31) / 32), static_cast<unsigned>(splits)), dim3(32, 8),
                               0, ln.stream>>>(bp.dg, N, static_cast<int>(G_), per, bp.partial);
    LSTM_CUDA_CHECK_LAUNCH();
    colsum_final_kernel<<<blocks_for(G_), kThreads, 0, ln.stream>>>(bp.partial, static_cast<int>(splits),
                                                                    static_cast<int>(G_), bp.db);
    LSTM_CUDA_CHECK_LAUNCH();
    add_into(dw[s.b_ih].raw(), dtype(), bp.db, DType::F32, G_);
    add_into(dw[s.b_hh].raw(), dtype(), bp.db, DType::F32, G_);
  }
}

template <class E>
LstmGrads FusedLstm<E>::backward(const std::vector<Tensor>& weights, const LstmSaved& saved,
                                 const LstmGradOutput& grad, std::vector<Tensor>& d_weights, const ExecContext& ctx) {
  ExecScope scope(ctx);
  const auto* svp = dynamic_cast<const FusedSaved<E>*>(&saved);
  LSTM_REQUIRE(svp && svp->owner == this, "fused LSTM backward: the saved state does not come from this backend's forward");
  const FusedSaved<E>& sv = *svp;
  LSTM_REQUIRE(!sv.used, "fused LSTM backward: runs once per training forward; this forward's state was used already");
  LSTM_REQUIRE(ctx.device == device(), "fused LSTM backward: expected a cuda execution context");
  ensure_lanes(ctx.device_index);
  const int64_t Tn = sv.T, B = sv.B, LD = L_ * D_;
  const bool bf = spec().batch_first;
  const size_t n_params = slots_.empty() ? 0 : static_cast<size_t>(std::max({slots_.back().w_ih, slots_.back().w_hh,
                                                                           slots_.back().b_ih, slots_.back().b_hh,
                                                                           slots_.back().w_hr})) + 1;
  LSTM_REQUIRE(weights.size() == n_params && d_weights.size() == n_params,
               "fused LSTM backward: expected " << n_params << " weight and gradient tensors, got " << weights.size()
                                                << " and " << d_weights.size());
  for (size_t i = 0; i < n_params; ++i)
    LSTM_REQUIRE(d_weights[i].defined() && d_weights[i].shape() == weights[i].shape() &&
                     d_weights[i].dtype() == dtype() && d_weights[i].device() == Device::CUDA,
                 "fused LSTM backward: d_weights[" << i << "] must be " << weights[i].shape_str() << " "
                                                   << dtype_name(dtype()) << " on cuda");
  // Gradients of another dtype are converted (on the caller's stream) rather than refused.
  auto as_dtype = [&](const Tensor& t, const Shape& shape, const char* what) -> Tensor {
    if (!t.defined()) return t;
    LSTM_REQUIRE(t.shape() == shape && t.device() == Device::CUDA,
                 "fused LSTM backward: " << what << " must be " << shape_str(shape) << " on cuda, got "
                                         << t.shape_str() << " on " << device_name(t.device()));
    return t.dtype() == dtype() ? t : t.to(dtype());
  };
  const Tensor d_out = as_dtype(grad.d_output, bf ? Shape{B, Tn, D_ * Hout_} : Shape{Tn, B, D_ * Hout_}, "d_output");
  const Tensor d_hn = as_dtype(grad.d_h_n, Shape{LD, B, Hout_}, "d_h_n");
  const Tensor d_cn = as_dtype(grad.d_c_n, Shape{LD, B, H_}, "d_c_n");
  sv.used = true;

  const cudaStream_t s0 = scope.stream();
  const std::array<int64_t, 3> key{Tn, B, 4};
  auto it = sizes_.find(key);
  if (it == sizes_.end()) {
    Carver wc(nullptr);
    std::vector<float*> dy;
    (void)carve_backward(wc, Tn, B, &dy);
    it = sizes_.emplace(key, Sizes{0, wc.bytes()}).first;
  }
  LstmGrads r;
  r.d_x = Tensor::empty(bf ? Shape{B, Tn, I_} : Shape{Tn, B, I_}, dtype(), Device::CUDA);
  if (sv.has_h0) r.d_h0 = Tensor::empty({LD, B, Hout_}, dtype(), Device::CUDA);
  if (sv.has_c0) r.d_c0 = Tensor::empty({LD, B, H_}, dtype(), Device::CUDA);
  DeviceBuffer work(it->second.work);
  Carver wc(work.get());
  std::vector<float*> dyb;
  const std::vector<BackwardLanePtrs<E>> bps = carve_backward(wc, Tn, B, &dyb);
  const int32_t* len = sv.p.len;
  const E* dhn = d_hn.defined() ? static_cast<const E*>(d_hn.raw()) : nullptr;
  const E* dcn = d_cn.defined() ? static_cast<const E*>(d_cn.raw()) : nullptr;
  E* dh0 = r.d_h0.defined() ? static_cast<E*>(r.d_h0.raw()) : nullptr;
  E* dc0 = r.d_c0.defined() ? static_cast<E*>(r.d_c0.raw()) : nullptr;
  const DropoutParams drop = dropout_params(spec().dropout);
  const cuda::PersistentShape* back_plan = persistent_back_plan(B);
  auto dhn_of = [&](int64_t idx) { return dhn ? dhn + idx * B * Hout_ : nullptr; };
  auto dcn_of = [&](int64_t idx) { return dcn ? dcn + idx * B * H_ : nullptr; };
  auto dh0_of = [&](int64_t idx) { return dh0 ? dh0 + idx * B * Hout_ : nullptr; };
  auto dc0_of = [&](int64_t idx) { return dc0 ? dc0 + idx * B * H_ : nullptr; };

  // Bidirectional: per layer top down, the directions at once on lanes 0 and 1; dy ping-pongs
  // between dyb[0] and dyb[1]. Returns the buffer that holds layer 0's dx.
  auto issue_bidirectional = [&]() -> float* {
    float* dy_cur = dyb[0];
    float* dy_next = dyb[1];
    LaneFork fork(cuda::stream(), fork_->get(), lanes_, 2);
    const Lane& l0 = *lanes_[0];
    for (int64_t l = L_ - 1; l >= 0; --l) {
      const int64_t In = in_size(l);
      WeightPtrs<E> w[2];
      for (int64_t d = 0; d < D_; ++d) {
        w[d] = weights_of(weights, l, d);
        const Lane& ln = *lanes_[d];
        // Lane 1 starts a lower layer once lane 0 has formed its dy (lane 0's latest record).
        if (d == 1 && l < L_ - 1) LSTM_CUDA_CHECK(cudaStreamWaitEvent(ln.stream, l0.mark, 0));
        const int64_t idx = l * D_ + d;
        if (back_plan)
          sweep_backward_cluster(ln, *back_plan, w[d], sv.p.dirs[static_cast<size_t>(idx)], bps[d], d, Tn, B, dy_cur,
                                 len, dhn_of(idx), dcn_of(idx), dh0_of(idx), dc0_of(idx));
        else
          sweep_backward(ln, w[d], sv.p.dirs[static_cast<size_t>(idx)], bps[d], d, Tn, B, dy_cur, len, dhn_of(idx),
                         dcn_of(idx), dh0_of(idx), dc0_of(idx), 0, Tn);
      }
      // Lane 1's weight gradients overlap lane 0's input gradient.
      const Lane& l1 = *lanes_[1];
      LSTM_CUDA_CHECK(cudaEventRecord(l1.mark, l1.stream));
      weight_grads(l1, sv, bps[1], l, 1, d_weights);
      LSTM_CUDA_CHECK(cudaStreamWaitEvent(l0.stream, l1.mark, 0));
      // dx = sum over directions of dG W_ih ([N, 4H] x [4H, In]), fp32; zero past each length
      // because dG is. For l > 0 it becomes the layer below's dy after dropout's mask.
      const int64_t N = Tn * B;
      for (int64_t d = 0; d < D_; ++d)
        gemm_rm(l0.blas, compute_, false, false, N, In, G_, bps[d].dg, dt_, G_, w[d].ih, dt_, In, d == 0 ? 0.f : 1.f,
                dy_next, CUDA_R_32F, In);
      if (l > 0 && sv.dropout) launch_dropout<float>(l0.stream, dy_next, dy_next, 0, N * In, layer_seed(sv.seed, l), drop);
      LSTM_CUDA_CHECK(cudaEventRecord(l0.mark, l0.stream));
      weight_grads(l0, sv, bps[0], l, 0, d_weights);
      std::swap(dy_cur, dy_next);
    }
    fork.join();
    return dy_cur;
  };

  // Unidirectional: a wavefront, layer l on lane l, down the stack and backwards in time. Per
  // chunk of steps [t0, t1) (from the last chunk to the first) lane l sweeps those steps, forms
  // their rows of dx = dG W_ih into dyb[l-1] (dropout-masked; layer 0: dyb[L]) and records its
  // mark; lane l-1, issued right after (before lane l records again), waits for it and sweeps
  // the same steps. Each layer's weight gradients follow its sweep on its lane.
  auto issue_wavefront = [&]() -> float* {
    const int64_t chunk = L_ > 1 ? kWavefrontSteps : Tn;
    LaneFork fork(cuda::stream(), fork_->get(), lanes_, static_cast<size_t>(L_));
    std::vector<WeightPtrs<E>> w(static_cast<size_t>(L_));
    for (int64_t l = 0; l < L_; ++l) w[l] = weights_of(weights, l, 0);
    for (int64_t t1 = Tn; t1 > 0; t1 -= chunk) {
      const int64_t t0 = std::max<int64_t>(0, t1 - chunk);
      for (int64_t l = L_ - 1; l >= 0; --l) {
        const Lane& ln = *lanes_[l];
        const int64_t In = in_size(l);
        if (l < L_ - 1) LSTM_CUDA_CHECK(cudaStreamWaitEvent(ln.stream, lanes_[l + 1]->mark, 0));
        if (back_plan)  // a single layer: one chunk, the whole sweep
          sweep_backward_cluster(ln, *back_plan, w[l], sv.p.dirs[static_cast<size_t>(l)], bps[l], 0, Tn, B, dyb[l],
                                 len, dhn_of(l), dcn_of(l), dh0_of(l), dc0_of(l));
        else
          sweep_backward(ln, w[l], sv.p.dirs[static_cast<size_t>(l)], bps[l], 0, Tn, B, dyb[l], len, dhn_of(l),
                         dcn_of(l), dh0_of(l), dc0_of(l), Tn - t1, Tn - t0);
        // The chunk's rows of dx: [(t1-t0)*B, 4H] x [4H, In], fp32, zero past each length.
        float* dx = l > 0 ? dyb[l - 1] : dyb[L_];
        gemm_rm(ln.blas, compute_, false, false, (t1 - t0) * B, In, G_, bps[l].dg + t0 * B * G_, dt_, G_, w[l].ih, dt_,
                In, 0.f, dx + t0 * B * In, CUDA_R_32F, In);
        if (l > 0) {
          if (sv.dropout)
            launch_dropout<float>(ln.stream, dx, dx, t0 * B * In, t1 * B * In, layer_seed(sv.seed, l), drop);
          LSTM_CUDA_CHECK(cudaEventRecord(ln.mark, ln.stream));
        }
      }
    }
    for (int64_t l = L_ - 1; l >= 0; --l) weight_grads(*lanes_[l], sv, bps[l], l, 0, d_weights);
    fork.join();
    return dyb[L_];
  };

  // Issues the whole backward (see the forward's issue); d_output is read from `dy_in`.
  auto issue = [&](const E* dy_in) {
    const cudaStream_t s0 = cuda::stream();
    float* const dy_top = D_ == 2 ? dyb[0] : dyb[L_ - 1];
    if (dy_in)
      launch_relayout<E, float>(s0, dy_in, dy_top, Tn, B, D_ * Hout_, bf, false, len);
    else
      LSTM_CUDA_CHECK(cudaMemsetAsync(dy_top, 0, static_cast<size_t>(Tn * B * D_ * Hout_) * sizeof(float), s0));
    float* const dx0 = D_ == 2 ? issue_bidirectional() : issue_wavefront();
    launch_relayout<float, E>(s0, dx0, static_cast<E*>(r.d_x.raw()), Tn, B, I_, false, bf, len);
  };

  const E* dy_user = d_out.defined() ? static_cast<const E*>(d_out.raw()) : nullptr;
  if (graphs_.mode() != GraphMode::Off && !sv.dropout) {
    GraphCache& gc = graph_cache(Call::Backward, Tn, B, nullptr);
    const auto key = graph_key({r.d_x.raw(), dh0, dc0, dhn, dcn, work.get(), sv.memory.get(), dy_user ? "dy" : nullptr},
                               weights, &d_weights);
    auto graphed = [&](std::span<void* const> st) -> std::string {
      try {
        issue(st.empty() ? nullptr : static_cast<const E*>(st[0]));
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    };
    auto describe = [&] { return "T " + std::to_string(Tn) + ", B " + std::to_string(B) + ", backward"; };
    auto fill_dy = [&](void* dst) {
      LSTM_CUDA_CHECK(cudaMemcpyAsync(dst, d_out.raw(), d_out.nbytes(), cudaMemcpyDeviceToDevice, cuda::stream()));
    };
    const bool replayed = dy_user ? graphs_.replay(gc, key, {{d_out.nbytes(), fill_dy}}, graphed, describe)
                                  : graphs_.replay(gc, key, {}, graphed, describe);
    if (!replayed) graphs_.eager(gc, [&] { issue(dy_user); });
    settled_bwd_ = graphs_.settled(&gc);
  } else {
    issue(dy_user);
    graphs_.ran_eager();
    settled_bwd_ = true;
  }

  // The saved buffers go back to the arena now. The arena hands them out again on the forward's
  // stream, so that stream must not run ahead of this backward when it is another one.
  if (sv.stream != s0) {
    LSTM_CUDA_CHECK(cudaEventRecord(release_->get(), s0));
    LSTM_CUDA_CHECK(cudaStreamWaitEvent(sv.stream, release_->get(), 0));
  }
  sv.memory.reset();
  last_run_ = back_plan   ? "persistent, cluster backward"
              : persistent_ ? "persistent, fused backward"
              : D_ == 1 && L_ > 1 ? "fused:wavefront"
                                  : "fused";
  return r;
}

std::unique_ptr<LstmBackend> make_instance(const LstmSpec& spec, DType dtype, Device device,
                                           const LstmOptions& options, bool persistent) {
  switch (dtype) {
    case DType::F32:
      return std::make_unique<FusedLstm<float>>(spec, dtype, device, options.allow_tf32, options.cuda_graphs,
                                                persistent);
    case DType::BF16:
      return std::make_unique<FusedLstm<__nv_bfloat16>>(spec, dtype, device, false, options.cuda_graphs, persistent);
    default: return std::make_unique<FusedLstm<__half>>(spec, dtype, device, false, options.cuda_graphs, persistent);
  }
}

}  // namespace

std::string fused_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device) {
  if (device != Device::CUDA) return "the fused backend runs on CUDA devices only";
  if (dtype == DType::F64) return "the fused backend computes in F32, BF16 or F16, not F64 (the reference covers F64)";
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    return std::string("the fused backend computes in F32, BF16 or F16, not ") + dtype_name(dtype);
  const int64_t widest = std::max({4 * spec.hidden_size, spec.input_size, spec.directions() * spec.out_size()});
  if (widest > INT_MAX / 1024) return "the fused backend needs 4*hidden_size, input_size and D*out_size below 2^21";
  return "";
}

std::unique_ptr<LstmBackend> make_fused_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options) {
  spec.validate();
  const std::string why = fused_lstm_unsupported(spec, dtype, device);
  LSTM_REQUIRE(why.empty(), "fused LSTM: " << why);
  return make_instance(spec, dtype, device, options, false);
}

std::string persistent_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device) {
  std::string why = fused_lstm_unsupported(spec, dtype, device);
  if (!why.empty()) return why;
  if (spec.proj_size > 0) return "proj_size > 0 is not in the persistent kernels yet (the fused backend runs it)";
  // The limits come from the device's properties: without a usable GPU there is nothing to plan on.
  if (!cuda_available()) return cuda_unavailable_reason();
  int dev = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&dev));
  PersistentShape shape;
  return plan_persistent(spec.hidden_size, spec.out_size(), 0, spec.directions(), 1, dtype, dev, &shape);
}

std::unique_ptr<LstmBackend> make_persistent_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                          const LstmOptions& options) {
  spec.validate();
  const std::string why = persistent_lstm_unsupported(spec, dtype, device);
  LSTM_REQUIRE(why.empty(), "persistent LSTM: " << why);
  return make_instance(spec, dtype, device, options, true);
}

}  // namespace lstm::cuda
