// cuDNN's side of the cuDNN LSTM backend (internal; CUDA builds only): its algorithms, RAII
// descriptors, refusals that name the limit, the math modes PyTorch asks for, the weight layout,
// the per-call data descriptors and the per-batch plan.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "cuda/graph_cache.hpp"
#include "cudnn/cudnn_util.hpp"
#include "lstm/lstm.hpp"

namespace lstm::cudnn {

// ---- cuDNN's algorithms ----
enum CudnnAlgoId : int {
  kStandard = 0,
  kPersistStatic = 1,
  kPersistDynamic = 2,
  kPersistSmallH = 3,
  kAutoAlgo = 4,
  kHeuristicAlgo = 5
};
inline constexpr const char* kAlgoNames[] = {"standard", "persist_static", "persist_dynamic", "persist_static_small_h"};

cudnnRNNAlgo_t to_cudnn_algo(int a);
int algo_id(CudnnAlgo a);
// cudnn_heuristic_algo as an id (the per-call path builds no string).
int heuristic_algo(const LstmSpec& spec, DType dtype, int64_t T, int64_t B, bool variable_lengths, bool training,
                   int cc_major, int cc_minor, int sms);

// ---- RAII for cuDNN descriptors ----
template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
class Desc {
 public:
  Desc() { LSTM_CUDA_CHECK(Create(&h_)); }
  ~Desc() {
    if (h_) Destroy(h_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  H get() const { return h_; }

 private:
  H h_ = nullptr;
};
using RnnDesc = Desc<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using RnnDataDesc = Desc<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using DropoutDesc = Desc<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;

// A case a cuDNN algorithm does not accept. "auto" skips such algorithms; everywhere else it
// reaches the caller as the lstm::Error it is.
class Rejected : public Error {
 public:
  explicit Rejected(const std::string& what) : Error(what) {}
};

// The case an algorithm is asked to run, for refusals; formatted only when one happens (it is
// passed on every call). `spec` must outlive it.
struct CaseText {
  const LstmSpec* spec = nullptr;
  DType dt = DType::F32;
  int64_t B = 0, T = 0;
  bool varlen = false;
  std::string text() const;
};

inline CaseText case_str(const LstmSpec& s, DType dt, int64_t B, int64_t T, bool varlen) {
  return {&s, dt, B, T, B > 0 && varlen};
}

// Like LSTM_CUDA_CHECK, but a status that means "this algorithm does not do this case" becomes a
// Rejected naming the algorithm, the case and the limit.
void check_accepts(cudnnStatus_t st, int algo, const CaseText& what_case, const char* call, const char* file,
                   int line, const char* expr);
#define LSTM_CUDNN_ACCEPTS(expr, algo, what_case, call) \
  ::lstm::cudnn::check_accepts((expr), (algo), (what_case), (call), __FILE__, __LINE__, #expr)

// What a cuDNN call issued under stream capture returned, as the graph runner takes it: "" or why
// the capture failed, with cuDNN's own detail.
std::string under_capture(cudnnStatus_t st);

cudnnDataType_t data_type(DType dt);
// The math cuDNN may use for dt, as PyTorch's nn.LSTM asks for it (see the definition).
void math_for(DType dt, bool allow_tf32, cudnnDataType_t* prec, cudnnMathType_t* math);
// Padding value cuDNN writes into the outputs past each length (all-zero bits).
extern double g_zero_fill;

// Where each tensor of spec.param_names() lies in the weight space of `rnn`, in bytes.
LstmBackend::FlatLayout compute_layout(cudnnHandle_t h, cudnnRNNDescriptor_t rnn, const LstmSpec& s, DType dt);
// Whether ts are views into one buffer at exactly layout's offsets (then *base is that buffer).
bool in_place(const std::vector<Tensor>& ts, const LstmBackend::FlatLayout& layout, void** base);

// ---- Per-call data descriptors ----
// Set for one (T, lengths); a call with the same ones re-uses them as they are, without touching
// cuDNN or the device (the host work per call is what a launch-bound case waits for).
struct DataDescs {
  RnnDataDesc x, y;
  Tensor dev_len;                // B int32 on the device (cuDNN's devSeqLengths)
  std::vector<int32_t> lengths;  // what dev_len holds
  int64_t T = -1;                // what x and y describe (-1: not set yet)
  bool padded = false;           // some sequence is shorter than T
  // cudnnGetRNNTempSpaceSizes' answers for these descriptors, per RNN descriptor and mode.
  struct Sizes {
    cudnnRNNDescriptor_t rnn;
    cudnnForwardMode_t mode;
    size_t ws, rs;
  };
  std::vector<Sizes> sizes;
  cuda::GraphCache graphs;  // inference only
};

enum class TrainCall { Forward, Backward };

// ---- A plan: everything that depends on (spec, dtype, algorithm, batch) but not on the lengths ----
struct Plan {
  int algo = kStandard;
  LstmSpec spec;
  DType dtype = DType::F32;
  int64_t B = 0;
  // Every sequence has T steps and the layout is sequence-major: the packed layout without
  // padded I/O. (PyTorch passes such a tensor unpacked with padded I/O; the two measured the same
  // on the H200, docs/PERFORMANCE.md.)
  bool packed = false;
  RnnDesc rnn;                                // without dropout
  std::unique_ptr<RnnDesc> rnn_drop;          // with dropout; made on first training use
  TensorDesc hdesc, cdesc;
  LstmBackend::FlatLayout layout;
  // Reused by inference calls. A training call makes its own, which its saved state keeps for
  // the backward (keeping the last one in the plan instead changed which arena blocks are live
  // across steps and cost a cudaMalloc after warm-up in GpuTraining tests).
  DataDescs infer;
  CaseText what;                              // case_str without batch
  // Graph caches of training calls, per kind and descriptor content (T, lengths): a training
  // call's descriptors are its own, so their caches live here. A list (at most 16): std::deque
  // keeps the references train_cache hands out valid while it grows.
  struct TrainGraphs {
    TrainCall kind;
    int64_t T;
    std::vector<int32_t> lengths;
    cuda::GraphCache graphs;
  };
  std::deque<TrainGraphs> train_graphs;
};

void set_rnn_desc(cudnnRNNDescriptor_t d, int algo, const LstmSpec& s, DType dt, bool allow_tf32,
                  cudnnDropoutDescriptor_t drop, const CaseText& what, bool padded_io = true);

}  // namespace lstm::cudnn
