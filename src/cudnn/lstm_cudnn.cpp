// The LSTM stack through cuDNN 9's RNN API: cudnnRNNForward, cudnnRNNBackwardData_v8 and
// cudnnRNNBackwardWeights_v8 on the engine stream.
//
// Variable lengths use the unpacked layouts (SEQ_MAJOR_UNPACKED, BATCH_MAJOR_UNPACKED with
// batch_first) with per-sequence lengths and padded I/O, so the batch is never repacked on the
// host: cuDNN starts the reverse direction at each sequence's own last step and returns h_n/c_n
// there. What cuDNN may read past a length is zeroed into a scratch copy first (x in the forward,
// d_output in the backward), so NaN there cannot reach a product; d_x past a length is zeroed
// after the call.
//
// Weights: cuDNN wants one "weight space". nn.LSTM's tensors map onto it one to one: cuDNN keeps
// the four gate matrices of W_ih (and of W_hh, and the gate biases) next to each other in the
// order i, f, g, o, which is PyTorch's row order (compute_layout checks it for every tensor). When
// the caller's tensors are views at exactly those offsets of one buffer (make_flat_weights with
// flat_layout()), that buffer is the weight space (and the d_weights buffer the weight-gradient
// space, which cuDNN adds into); otherwise the tensors are copied into a cached weight space and
// the gradients are formed in a scratch space and added into d_weights.
//
// CUDA graphs (LstmOptions::cuda_graphs): a call can be replayed instead of issued. cuDNN's host
// work per call grows with the steps (a few kernels per step and layer; the H200's host took
// about 20 us per step and layer to issue the standard algorithm, docs/PERFORMANCE.md), and for
// small batches and hidden sizes the GPU waits for it; where it does not, a graph still closes
// the gaps between the dependent per-step kernels. A graph is captured on a private stream (the
// legacy default stream cannot be captured) for one kind of call (inference forward, training
// forward, backward data + weights) and one content of the data descriptors (T, lengths), and
// keyed on every buffer cuDNN bakes into its kernels' arguments: the lengths on the device,
// h0/c0, the outputs and gradients we allocate, the reserve space, the weight and weight-gradient
// spaces and the workspace. The inputs that move from call to call (x, d_output) are copied (or
// masked) into the cache's own buffers first, so they may live anywhere. The arena hands a steady
// stream of calls the same blocks, so later calls find their graph; a call whose buffers match
// none is captured anew (at most kMaxGraphs per cache, least recently used first out), and a
// cache whose buffers keep changing goes back to eager calls. Inference caches belong to the
// plan's data descriptors (new T or lengths drop them); a training call has descriptors of its
// own, so its caches live in the plan, keyed by T and lengths.
//
// Dropout between layers uses cuDNN's own dropout (its masks live in the reserve space): the
// dropout state is seeded once from the caller's Rng on the first training forward with dropout
// and then advances inside cuDNN. GPU masks therefore differ from the CPU reference's masks (same
// probability and 1/(1-p) scaling, different random numbers).
#include "cudnn/lstm_cudnn.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "cudnn/cudnn_util.hpp"
#include "cuda/exec.hpp"
#include "cudnn/lstm_cudnn_kernels.hpp"
#include "lstm/device.hpp"

namespace lstm {
namespace {

// ---- cuDNN's algorithms ----
enum CudnnAlgoId : int {
  kStandard = 0,
  kPersistStatic = 1,
  kPersistDynamic = 2,
  kPersistSmallH = 3,
  kAutoAlgo = 4,
  kHeuristicAlgo = 5
};
constexpr const char* kAlgoNames[] = {"standard", "persist_static", "persist_dynamic", "persist_static_small_h"};

cudnnRNNAlgo_t to_cudnn_algo(int a) {
  switch (a) {
    case kPersistStatic: return CUDNN_RNN_ALGO_PERSIST_STATIC;
    case kPersistDynamic: return CUDNN_RNN_ALGO_PERSIST_DYNAMIC;
    case kPersistSmallH: return CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H;
    default: return CUDNN_RNN_ALGO_STANDARD;
  }
}

int algo_id(CudnnAlgo a) {
  switch (a) {
    case CudnnAlgo::Standard: return kStandard;
    case CudnnAlgo::PersistStatic: return kPersistStatic;
    case CudnnAlgo::PersistDynamic: return kPersistDynamic;
    case CudnnAlgo::PersistStaticSmallH: return kPersistSmallH;
    case CudnnAlgo::Auto: return kAutoAlgo;
    case CudnnAlgo::Heuristic: return kHeuristicAlgo;
  }
  return kStandard;
}
// cudnn_heuristic_algo's answer (one of kAlgoNames) as an id.
int algo_from_name(const std::string& name) {
  for (int a = 0; a < 4; ++a)
    if (name == kAlgoNames[a]) return a;
  LSTM_THROW("not a cuDNN algorithm: '" << name << "'");
}

// ---- CUDA graphs of cuDNN calls (LstmOptions::cuda_graphs) ----
constexpr GraphMode kGraphsAuto = GraphMode::Auto, kGraphsOn = GraphMode::On, kGraphsOff = GraphMode::Off;

// Owning handles (destroying an executable graph that is still running frees it when it ends;
// events also time cudnn_algo "auto"'s candidates).
struct GraphExec {
  cudaGraphExec_t h = nullptr;
  GraphExec() = default;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : h(o.h) { o.h = nullptr; }
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(h, o.h);
    return *this;
  }
  ~GraphExec() {
    if (h) cudaGraphExecDestroy(h);
  }
};
struct Event {
  cudaEvent_t h = nullptr;
  Event() { LSTM_CUDA_CHECK(cudaEventCreate(&h)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (h) cudaEventDestroy(h);
  }
};

// One captured piece of cuDNN work: every buffer its kernels were recorded with (the cache's own
// input buffers included) and the executable graph.
struct GraphEntry {
  std::vector<const void*> key;
  GraphExec exec;
  uint64_t last_use = 0;
};

// The graphs of one kind of call (inference forward, training forward, backward) for one content
// of the data descriptors (T and lengths): a graph holds the kernels' arguments as cuDNN derived
// them from the descriptors and the buffers.
struct GraphCache {
  // kTrial ("auto"): replaying, until a measured replay says whether graphs beat eager calls.
  enum State { kUndecided, kTrial, kReplay, kEager };
  State state = kUndecided;
  int eager_calls = 0;
  // "auto" measures kSamples eager calls (from the second on: host time to issue each, GPU time
  // between two events), then kSamples replays (from the second on: GPU time).
  struct Mark {
    std::unique_ptr<Event> begin, end;
    double host_us = 0;
  };
  std::vector<Mark> marks;
  double eager_us = 0;  // the fastest measured eager call's GPU time
  // The cache's own input buffers (x; d_output and x for a backward), copied into before each
  // replay, so the caller's inputs may live anywhere.
  std::vector<cuda::DeviceBuffer> stages;
  std::vector<GraphEntry> entries;
  uint64_t clock = 0;
  int captures = 0, replays = 0;
};
// Graphs kept per cache; a call whose buffers match none is captured anew (the least recently
// used graph goes when the cache is full).
constexpr size_t kMaxGraphs = 8;
// Calls "auto" measures each way (eager, then replayed) before it keeps graphs or not.
constexpr size_t kSamples = 3;

// An input a replay reads from a cache buffer: its size and how to fill it (on the engine stream).
struct Staged {
  size_t bytes;
  std::function<void(void* dst)> fill;
};

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
  std::string text() const {
    const LstmSpec& s = *spec;
    std::ostringstream os;
    os << "input_size " << s.input_size << ", hidden_size " << s.hidden_size << ", proj_size " << s.proj_size << ", "
       << s.num_layers << " layer(s), " << (s.bidirectional ? "bidirectional" : "unidirectional")
       << (s.bias ? "" : ", no bias") << ", " << dtype_name(dt);
    if (B > 0) os << ", batch " << B << ", " << T << " steps, " << (varlen ? "variable lengths" : "equal lengths");
    return os.str();
  }
};

CaseText case_str(const LstmSpec& s, DType dt, int64_t B, int64_t T, bool varlen) {
  return {&s, dt, B, T, B > 0 && varlen};
}

// The limit a refusal most likely hit, from what cuDNN 9 was seen to refuse on an H200 (the
// DISABLED_ProbeAlgorithmLimits test prints it) and PyTorch's notes, so that the message names it
// and not only cuDNN's status.
std::string limit_hint(int a, const CaseText& c) {
  if (a == kStandard) return "";
  const std::string name = kAlgoNames[a];
  const std::string h = std::to_string(c.spec->hidden_size);
  if (c.varlen)
    return "cuDNN's persistent algorithms run only batches whose sequences all have the same length; this batch has "
           "variable lengths";
  if (c.spec->proj_size > 0) return name + " has no projection (proj_size) support; only standard has";
  if (!c.spec->bias) return name + " needs the biases (bias=true); only standard runs bias=false";
  switch (a) {
    case kPersistSmallH:
      return name + " is for small hidden sizes: up to 192 for inference and 128 for training (cuDNN 9.19 on an "
                    "H200); hidden_size " + h + " is past that";
    case kPersistStatic:
      return name + " keeps the recurrent weights on chip: hidden sizes up to 1024 ran, 2048 was refused (cuDNN "
                    "9.19 on an H200); hidden_size " + h + " is past what it takes here";
    default:
      return name + " compiles a persistent kernel for the shape (hidden sizes up to 2048 ran with cuDNN 9.19 on an "
                    "H200); hidden_size " + h + " with this batch is past what it takes here";
  }
}

bool is_rejection(cudnnStatus_t st, int algo) {
  if (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED) return true;
  // A persistent algorithm answers some shapes it cannot run with BAD_PARAM; for the standard
  // algorithm BAD_PARAM would be our bug and is reported as such.
  return algo != kStandard && CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_BAD_PARAM;
}

// Like LSTM_CUDA_CHECK, but a status that means "this algorithm does not do this case" becomes a
// Rejected naming the algorithm, the case and the limit.
void check_accepts(cudnnStatus_t st, int algo, const CaseText& what_case, const char* call, const char* file,
                   int line, const char* expr) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  if (is_rejection(st, algo)) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    std::ostringstream os;
    os << "cuDNN " << kAlgoNames[algo] << " does not support this LSTM (" << what_case.text() << "): " << call
       << " returned " << cudnnGetErrorString(st);
    if (detail[0]) os << " (" << detail << ")";
    const std::string lim = limit_hint(algo, what_case);
    if (!lim.empty()) os << ". " << lim;
    os << ". cudnn_algo \"standard\" runs every case; \"auto\" picks the fastest algorithm that accepts it";
    throw Rejected(os.str());
  }
  cuda::check(st, file, line, expr);
}
#define LSTM_CUDNN_ACCEPTS(expr, algo, what_case, call) \
  check_accepts((expr), (algo), (what_case), (call), __FILE__, __LINE__, #expr)

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: break;
  }
  LSTM_THROW("the cuDNN LSTM computes in F32, BF16, F16 or F64, not " << dtype_name(dt));
}

// The math cuDNN may use, as PyTorch's nn.LSTM asks for it (aten/src/ATen/cudnn/Descriptors.h):
// compute precision fp32 for every float dtype; F16 data on tensor cores (TENSOR_OP); BF16 data
// and TF32-allowed F32 data with DEFAULT_MATH, which on Ampere and newer runs F32 GEMMs as TF32;
// F32 without TF32 in plain FMA. Never TENSOR_OP_MATH_ALLOW_CONVERSION: it lets cuDNN convert F32
// data to half precision (faster, but inputs beyond fp16's range +-65504 become inf; measured with
// bench/probe_cudnn_settings, docs/PERFORMANCE.md).
void math_for(DType dt, bool allow_tf32, cudnnDataType_t* prec, cudnnMathType_t* math) {
  switch (dt) {
    case DType::F64:
      *prec = CUDNN_DATA_DOUBLE;
      *math = CUDNN_DEFAULT_MATH;
      return;
    case DType::F32:
      *prec = CUDNN_DATA_FLOAT;
      *math = allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
      return;
    case DType::BF16:
      *prec = CUDNN_DATA_FLOAT;
      *math = CUDNN_DEFAULT_MATH;
      return;
    default:
      *prec = CUDNN_DATA_FLOAT;
      *math = CUDNN_TENSOR_OP_MATH;
      return;
  }
}

// Padding value cuDNN writes into the outputs past each length: all-zero bits, which reads as 0 in
// every float dtype (cuDNN reads it as the data descriptor's type).
double g_zero_fill = 0.0;

// ---- Weight layout ----

int64_t desc_numel(cudnnTensorDescriptor_t d) {
  cudnnDataType_t t;
  int nb = 0;
  int dims[8], strides[8];
  LSTM_CUDA_CHECK(cudnnGetTensorNdDescriptor(d, 8, &t, &nb, dims, strides));
  int64_t n = 1;
  for (int i = 0; i < nb; ++i) n *= dims[i];
  return n;
}

// Where each tensor of spec.param_names() lies in the weight space of `rnn`, in bytes.
LstmBackend::FlatLayout compute_layout(cudnnHandle_t h, cudnnRNNDescriptor_t rnn, const LstmSpec& s, DType dt) {
  LstmBackend::FlatLayout out;
  LSTM_CUDA_CHECK(cudnnGetRNNWeightSpaceSize(h, rnn, &out.bytes));
  // cudnnGetRNNWeightParams returns addresses inside the buffer it is given; a real (arena)
  // buffer keeps that within what the API documents.
  cuda::DeviceBuffer probe(out.bytes);
  const char* base = static_cast<const char*>(probe.get());
  TensorDesc mdesc, bdesc;
  const size_t es = dtype_size(dt);
  const int64_t H = s.hidden_size, P = s.proj_size, Hout = s.out_size(), D = s.directions();
  out.offsets.assign(s.param_names().size(), 0);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const int32_t pseudo = static_cast<int32_t>(l * D + d);
      const int64_t In = s.layer_input_size(l);
      auto where = [&](int32_t lin, bool bias, int64_t numel) -> size_t {
        void* addr = nullptr;
        if (bias)
          LSTM_CUDA_CHECK(cudnnGetRNNWeightParams(h, rnn, pseudo, out.bytes, base, lin, nullptr, nullptr, bdesc.get(),
                                                  &addr));
        else
          LSTM_CUDA_CHECK(cudnnGetRNNWeightParams(h, rnn, pseudo, out.bytes, base, lin, mdesc.get(), &addr, nullptr,
                                                  nullptr));
        LSTM_CHECK(addr, "cuDNN returned no address for linLayerID " << lin << " of pseudo-layer " << pseudo);
        LSTM_CHECK(desc_numel(bias ? bdesc.get() : mdesc.get()) == numel,
                   "cuDNN's linLayerID " << lin << " of pseudo-layer " << pseudo << " has "
                                         << desc_numel(bias ? bdesc.get() : mdesc.get()) << " elements, expected "
                                         << numel);
        const size_t off = static_cast<size_t>(static_cast<const char*>(addr) - base);
        LSTM_CHECK(off % es == 0 && off + static_cast<size_t>(numel) * es <= out.bytes,
                   "cuDNN weight offset " << off << " is outside the weight space");
        return off;
      };
      // One nn.LSTM tensor = cuDNN's four gates (linLayerIDs first..first+3, gate order i, f, g, o)
      // back to back.
      auto gates = [&](int32_t first, bool bias, int64_t per_gate) -> size_t {
        const size_t off = where(first, bias, per_gate);
        for (int32_t g = 1; g < 4; ++g)
          LSTM_CHECK(where(first + g, bias, per_gate) == off + static_cast<size_t>(g * per_gate) * es,
                     "cuDNN's gate " << g << " of linLayerID " << first << " (pseudo-layer " << pseudo
                                     << ") does not follow gate " << g - 1 << "; nn.LSTM's layout cannot map onto it");
        return off;
      };
      const auto sl = s.slots(l, d);
      out.offsets[sl.w_ih] = gates(0, false, H * In);
      out.offsets[sl.w_hh] = gates(4, false, H * Hout);
      if (s.bias) {
        out.offsets[sl.b_ih] = gates(0, true, H);
        out.offsets[sl.b_hh] = gates(4, true, H);
      }
      if (P > 0) out.offsets[sl.w_hr] = where(8, false, P * H);
    }
  }
  return out;
}

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
  GraphCache graphs;  // inference only
};

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
  // Graph caches of training calls, per kind and descriptor content ("f" or "b", T, lengths): a
  // training call's descriptors are its own, so their caches live here.
  std::map<std::string, GraphCache> train_graphs;
};

void set_rnn_desc(cudnnRNNDescriptor_t d, int algo, const LstmSpec& s, DType dt, bool allow_tf32,
                  cudnnDropoutDescriptor_t drop, const CaseText& what, bool padded_io = true) {
  cudnnDataType_t prec;
  cudnnMathType_t math;
  math_for(dt, allow_tf32, &prec, &math);
  // projSize == hiddenSize turns the projection off; padded I/O admits the unpacked layouts.
  LSTM_CUDNN_ACCEPTS(
      cudnnSetRNNDescriptor_v8(d, to_cudnn_algo(algo), CUDNN_LSTM, s.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
                               s.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT,
                               data_type(dt), prec, math, static_cast<int32_t>(s.input_size),
                               static_cast<int32_t>(s.hidden_size), static_cast<int32_t>(s.out_size()),
                               static_cast<int32_t>(s.num_layers), drop,
                               padded_io ? CUDNN_RNN_PADDED_IO_ENABLED : CUDNN_RNN_PADDED_IO_DISABLED),
      algo, what, "cudnnSetRNNDescriptor_v8");
}

struct CudnnSaved : LstmSaved {
  std::shared_ptr<Plan> plan;
  std::shared_ptr<DataDescs> data;
  bool dropout = false;
  LstmSpec spec;
  int64_t T = 0, B = 0;
  DType dtype = DType::F32;
  Tensor x;      // what cuDNN read (zero past each length)
  Tensor y;      // the output
  Tensor h0, c0; // undefined: zeros
  cuda::DeviceBuffer reserve;
  size_t reserve_bytes = 0;
  mutable bool used = false;
};

bool in_place(const std::vector<Tensor>& ts, const LstmBackend::FlatLayout& layout, void** base) {
  if (ts.empty() || layout.offsets.size() != ts.size()) return false;
  char* b = static_cast<char*>(const_cast<void*>(ts[0].raw())) - layout.offsets[0];
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i].same_storage(ts[0]) || static_cast<const char*>(ts[i].raw()) != b + layout.offsets[i]) return false;
  *base = b;
  return true;
}

// Why cuDNN's algorithm `algo` cannot run spec in dtype on device ("" when it can): host-side
// descriptor calls only, nothing runs on the GPU.
std::string unsupported(const LstmSpec& spec, DType dtype, Device device, int algo, bool allow_tf32);

class CudnnBackend final : public LstmBackend {
 public:
  CudnnBackend(const LstmSpec& spec, DType dtype, Device device, const LstmOptions& o)
      : LstmBackend(spec, dtype, device), options_(o), algo_(algo_id(o.cudnn_algo)), graphs_(o.cuda_graphs) {}
  ~CudnnBackend() override {
    plans_.clear();  // their graphs first
    last_plan_.reset();
    if (capture_stream_) cudaStreamDestroy(capture_stream_);
  }
  CudnnBackend(const CudnnBackend&) = delete;
  CudnnBackend& operator=(const CudnnBackend&) = delete;

  Algo algo() const override { return Algo::Cudnn; }
  std::string name() const override {
    return options_.cudnn_algo == CudnnAlgo::Heuristic ? "cudnn" : std::string("cudnn:") + cudnn_algo_name(options_.cudnn_algo);
  }
  // "cudnn:<the algorithm that ran>, <replayed|eager>".
  std::string last_run() const override {
    if (last_algo_.empty()) return "";
    return "cudnn:" + last_algo_ + (last_graph_.empty() ? std::string() : ", " + last_graph_);
  }
  std::string log() const override { return auto_log_ + graph_log_; }
  bool settled() const override { return settled_fwd_ && settled_bwd_; }
  GraphCounts graph_counts() const override { return counts_; }

  FlatLayout flat_layout(DType dtype) const override {
    // "auto" may run any algorithm; every one is handed the standard layout and copies when its
    // own differs (compute_layout is checked per plan).
    const int a = algo_ == kAutoAlgo || algo_ == kHeuristicAlgo ? kStandard : algo_;
    cudnnHandle_t h = cuda::cudnn_handle();
    DropoutDesc nodrop;
    LSTM_CUDA_CHECK(cudnnSetDropoutDescriptor(nodrop.get(), h, 0.0f, nullptr, 0, 0));
    RnnDesc rnn;
    set_rnn_desc(rnn.get(), a, spec(), dtype, options_.allow_tf32, nodrop.get(), case_str(spec(), dtype, 0, 0, false));
    return compute_layout(h, rnn.get(), spec(), dtype);
  }

  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override {
    auto [T, B] = check_call(in, weights, ctx);
    cuda::ExecScope scope(ctx);
    const LstmSpec& spec = this->spec();
    const DType dt = in.x.dtype();
    (void)data_type(dt);
    const bool with_dropout = training && spec.dropout > 0 && spec.num_layers > 1;
    const bool train_mode = saved != nullptr || with_dropout;
    if (with_dropout) ensure_dropout(spec.dropout, rng);

    std::vector<int32_t> len(static_cast<size_t>(B), static_cast<int32_t>(T));
    for (size_t b = 0; b < in.lengths.size(); ++b) len[b] = static_cast<int32_t>(in.lengths[b]);

    int a = algo_;
    if (a == kAutoAlgo) a = pick(spec, dt, T, B, len, train_mode, in, weights);
    if (a == kHeuristicAlgo) {
      bool varlen = false;
      for (int32_t l : len) varlen = varlen || l < T;
      const cudaDeviceProp& prop = cuda::device_prop();
      a = algo_from_name(
          cudnn_heuristic_algo(spec, dt, T, B, varlen, train_mode, prop.major, prop.minor, prop.multiProcessorCount));
    }
    std::shared_ptr<Plan> plan = get_plan(spec, dt, a, B, packs(spec, T, len));

    std::shared_ptr<DataDescs> fresh;
    DataDescs* dd = nullptr;
    if (train_mode) {
      fresh = std::make_shared<DataDescs>();
      dd = fresh.get();
    } else {
      dd = &plan->infer;
    }
    set_data(*plan, *dd, T, len);

    const void* w = weight_space(*plan, weights);
    const int64_t LD = spec.num_layers * spec.directions();
    LstmOutput out;
    out.output = Tensor::empty(spec.batch_first ? Shape{B, T, spec.directions() * spec.out_size()}
                                                : Shape{T, B, spec.directions() * spec.out_size()},
                               dt, Device::CUDA);
    out.h_n = Tensor::empty({LD, B, spec.out_size()}, dt, Device::CUDA);
    out.c_n = Tensor::empty({LD, B, spec.hidden_size}, dt, Device::CUDA);
    last_algo_ = kAlgoNames[a];
    if (!train_mode) {
      infer(*plan, *dd, in, w, out, T, B);
      return out;
    }

    // x as cuDNN reads it (zero past each length), which the backward reads too.
    Tensor x = in.x;
    if (dd->padded) {
      x = Tensor::empty(in.x.shape(), dt, Device::CUDA);
      stage_x(*plan, *dd, in.x, x.raw(), T, B);
    }
    cuda::DeviceBuffer reserve;
    size_t rs = 0;
    const void* hx = in.h0.defined() ? in.h0.raw() : nullptr;
    const void* cx = in.c0.defined() ? in.c0.raw() : nullptr;
    if (with_dropout) {
      // cuDNN's dropout state advances inside cuDNN from call to call: not captured.
      last_graph_ = "eager";
      settled_fwd_ = true;
      run_forward(*plan, dropout_rnn(*plan), *dd, true, x.raw(), out.output.raw(), hx, out.h_n.raw(), cx,
                  out.c_n.raw(), w, &reserve, &rs, T, B);
    } else {
      train_forward(*plan, *dd, x, hx, cx, w, out, &reserve, &rs, T, B, len);
    }

    if (saved) {
      auto sv = std::make_unique<CudnnSaved>();
      sv->plan = plan;
      sv->data = fresh;
      sv->dropout = with_dropout;
      sv->spec = spec;
      sv->T = T;
      sv->B = B;
      sv->dtype = dt;
      sv->x = x;
      sv->y = out.output;
      sv->h0 = in.h0;
      sv->c0 = in.c0;
      sv->reserve = std::move(reserve);
      sv->reserve_bytes = rs;
      *saved = std::move(sv);
    }
    return out;
  }

  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override {
    LSTM_REQUIRE(ctx.device == Device::CUDA, "cuDNN LSTM backward: runs on the GPU, got a "
                                                 << device_name(ctx.device) << " execution context");
    cuda::ExecScope scope(ctx);
    const LstmSpec& spec = this->spec();
    const auto* sv = dynamic_cast<const CudnnSaved*>(&saved);
    LSTM_REQUIRE(sv, "cuDNN LSTM backward: the saved state does not come from a cuDNN forward");
    LSTM_REQUIRE(!sv->used, "cuDNN LSTM backward: runs once per training forward (cuDNN's backward consumes the "
                            "forward's reserve space)");
    LSTM_REQUIRE(spec == sv->spec, "cuDNN LSTM backward: the spec differs from the forward's");
    const int64_t T = sv->T, B = sv->B, H = spec.hidden_size, Hout = spec.out_size(), D = spec.directions(),
                  LD = spec.num_layers * D;
    const DType dt = sv->dtype;
    Plan& plan = *sv->plan;
    DataDescs& dd = *sv->data;
    const auto names = spec.param_names();
    LSTM_REQUIRE(weights.size() == names.size() && d_weights.size() == names.size(),
                 "cuDNN LSTM backward: expected " << names.size() << " weight and gradient tensors, got "
                                                  << weights.size() << " and " << d_weights.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape want = spec.param_shape(names[i]);
      LSTM_REQUIRE(weights[i].defined() && weights[i].shape() == want && weights[i].dtype() == dt &&
                       weights[i].device() == Device::CUDA,
                   "cuDNN LSTM backward: weight '" << names[i] << "' must be a CUDA " << dtype_name(dt) << " "
                                                   << shape_str(want));
      LSTM_REQUIRE(d_weights[i].defined() && d_weights[i].shape() == want && d_weights[i].dtype() == dt &&
                       d_weights[i].device() == Device::CUDA,
                   "cuDNN LSTM backward: gradient for '" << names[i] << "' must be a CUDA " << dtype_name(dt) << " "
                                                         << shape_str(want));
    }
    auto check_grad = [&](const Tensor& t, const Shape& want, const char* what) {
      if (!t.defined()) return;
      LSTM_REQUIRE(t.shape() == want && t.dtype() == dt && t.device() == Device::CUDA,
                   "cuDNN LSTM backward: " << what << " must be a CUDA " << dtype_name(dt) << " " << shape_str(want)
                                           << ", got a " << device_name(t.device()) << " " << dtype_name(t.dtype())
                                           << " " << t.shape_str());
    };
    const Shape yshape = sv->y.shape();
    check_grad(grad.d_output, yshape, "d_output");
    check_grad(grad.d_h_n, {LD, B, Hout}, "d_h_n");
    check_grad(grad.d_c_n, {LD, B, H}, "d_c_n");
    sv->used = true;

    LstmGrads r;
    r.d_x = Tensor::empty(sv->x.shape(), dt, Device::CUDA);
    if (sv->h0.defined()) r.d_h0 = Tensor::empty({LD, B, Hout}, dt, Device::CUDA);
    if (sv->c0.defined()) r.d_c0 = Tensor::empty({LD, B, H}, dt, Device::CUDA);

    const void* w = weight_space(plan, weights);
    cudnnRNNDescriptor_t rnn = sv->dropout ? dropout_rnn(plan) : plan.rnn.get();
    const CaseText what = case_str(spec, dt, B, T, dd.padded);
    const auto [ws, rs] = temp_sizes(dd, rnn, CUDNN_FWD_MODE_TRAINING, plan.algo, what);
    LSTM_CHECK(rs == sv->reserve_bytes, "cuDNN reserve space changed between forward and backward");
    workspace_.ensure(std::max<size_t>(ws, 1));
    void* wsp = workspace_.get();
    void* reserve = sv->reserve.get();
    const void* hx = sv->h0.defined() ? sv->h0.raw() : nullptr;
    const void* cx = sv->c0.defined() ? sv->c0.raw() : nullptr;
    const void* dhy = grad.d_h_n.defined() ? grad.d_h_n.raw() : nullptr;
    const void* dcy = grad.d_c_n.defined() ? grad.d_c_n.raw() : nullptr;
    void* dhx = r.d_h0.defined() ? r.d_h0.raw() : nullptr;
    void* dcx = r.d_c0.defined() ? r.d_c0.raw() : nullptr;
    const int32_t* dev_len = static_cast<const int32_t*>(dd.dev_len.raw());

    // cuDNN adds into the weight-gradient space (CUDNN_WGRAD_MODE_ADD), which is our contract when
    // d_weights is that space; otherwise it adds into a zeroed scratch space that is then added
    // into each tensor.
    void* dw = nullptr;
    const bool dw_in_place = in_place(d_weights, plan.layout, &dw);
    if (!dw_in_place) {
      dw_scratch_.ensure(plan.layout.bytes);
      dw = dw_scratch_.get();
      LSTM_CUDA_CHECK(cudaMemsetAsync(dw, 0, plan.layout.bytes, cuda::stream()));
    }
    auto issue = [&](cudnnHandle_t h, const void* dy, const void* x) {
      cudnnStatus_t st = cudnnRNNBackwardData_v8(h, rnn, dev_len, dd.y.get(), sv->y.raw(), dy, dd.x.get(), r.d_x.raw(),
                                                 plan.hdesc.get(), hx, dhy, dhx, plan.cdesc.get(), cx, dcy, dcx,
                                                 plan.layout.bytes, w, ws, wsp, rs, reserve);
      if (st != CUDNN_STATUS_SUCCESS) return st;
      return cudnnRNNBackwardWeights_v8(h, rnn, CUDNN_WGRAD_MODE_ADD, dev_len, dd.x.get(), x, plan.hdesc.get(), hx,
                                        dd.y.get(), sv->y.raw(), plan.layout.bytes, dw, ws, wsp, rs, reserve);
    };
    // dy as cuDNN reads it: zero past each length (d_output there is ignored, NaN included).
    const size_t dy_bytes = static_cast<size_t>(shape_numel(yshape)) * dtype_size(dt);
    auto fill_dy = [&](void* dst) {
      if (!grad.d_output.defined())
        LSTM_CUDA_CHECK(cudaMemsetAsync(dst, 0, dy_bytes, cuda::stream()));
      else if (dd.padded)
        cuda::mask_past_lengths(dst, grad.d_output.raw(), dtype_size(dt), T, B, D * Hout, spec.batch_first, dev_len);
      else
        copy_device(dst, grad.d_output.raw(), dy_bytes);
    };
    GraphCache* gc = sv->dropout ? nullptr : &train_cache(plan, 'b', T, dd.lengths);
    const bool graphed =
        gc && run_graph(*gc, {dev_len, sv->y.raw(), hx, cx, dhy, dcy, r.d_x.raw(), dhx, dcx, w, dw, wsp, reserve},
                        {{dy_bytes, fill_dy}, {sv->x.nbytes(), [&](void* dst) { copy_device(dst, sv->x.raw(), sv->x.nbytes()); }}},
                        [&](cudnnHandle_t h, const std::vector<void*>& st) { return issue(h, st[0], st[1]); },
                        what.text() + ", backward, " + kAlgoNames[plan.algo]);
    if (!graphed) {
      Tensor dy = grad.d_output;
      if (!dy.defined() || dd.padded) {
        dy = Tensor::empty(yshape, dt, Device::CUDA);
        fill_dy(dy.raw());
      }
      auto eager = [&] {
        LSTM_CUDNN_ACCEPTS(issue(cuda::cudnn_handle(), dy.raw(), sv->x.raw()), plan.algo, what,
                           "cudnnRNNBackwardData_v8 / cudnnRNNBackwardWeights_v8");
      };
      if (gc) {
        run_eager(*gc, eager);
      } else {
        last_graph_ = "eager";
        eager();
      }
    }
    settled_bwd_ = settled(gc);
    if (!dw_in_place)
      for (size_t i = 0; i < names.size(); ++i)
        cuda::add_into(d_weights[i].raw(), dt, static_cast<const char*>(dw) + plan.layout.offsets[i], dt,
                       d_weights[i].numel());
    if (dd.padded)
      cuda::mask_past_lengths(r.d_x.raw(), r.d_x.raw(), dtype_size(dt), T, B, spec.input_size, spec.batch_first,
                              static_cast<const int32_t*>(dd.dev_len.raw()));
    return r;
  }

 private:
  static void copy_device(void* dst, const void* src, size_t bytes) {
    LSTM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
  }

  // x as cuDNN reads it, into dst: zero past each length (a copy when every sequence has T steps).
  static void stage_x(const Plan& p, const DataDescs& dd, const Tensor& x, void* dst, int64_t T, int64_t B) {
    if (dd.padded)
      cuda::mask_past_lengths(dst, x.raw(), dtype_size(p.dtype), T, B, p.spec.input_size, p.spec.batch_first,
                              static_cast<const int32_t*>(dd.dev_len.raw()));
    else
      copy_device(dst, x.raw(), x.nbytes());
  }

  // A training forward without dropout: replayed, or issued eagerly. x is what cuDNN reads (zero
  // past each length). The reserve space is allocated into *reserve.
  void train_forward(Plan& p, DataDescs& dd, const Tensor& x, const void* hx, const void* cx, const void* w,
                     LstmOutput& out, cuda::DeviceBuffer* reserve, size_t* reserve_bytes, int64_t T, int64_t B,
                     const std::vector<int32_t>& len) {
    const CaseText what = case_str(p.spec, p.dtype, B, T, dd.padded);
    const auto [ws, rs] = temp_sizes(dd, p.rnn.get(), CUDNN_FWD_MODE_TRAINING, p.algo, what);
    workspace_.ensure(std::max<size_t>(ws, 1));
    *reserve = cuda::DeviceBuffer(std::max<size_t>(rs, 1));
    *reserve_bytes = rs;
    void* y = out.output.raw();
    void* hy = out.h_n.raw();
    void* cy = out.c_n.raw();
    void* wsp = workspace_.get();
    void* rsp = reserve->get();
    const int32_t* dev_len = static_cast<const int32_t*>(dd.dev_len.raw());
    auto issue = [&](cudnnHandle_t h, const void* xp) {
      return cudnnRNNForward(h, p.rnn.get(), CUDNN_FWD_MODE_TRAINING, dev_len, dd.x.get(), xp, dd.y.get(), y,
                             p.hdesc.get(), hx, hy, p.cdesc.get(), cx, cy, p.layout.bytes, w, ws, wsp, rs, rsp);
    };
    GraphCache& gc = train_cache(p, 'f', T, len);
    if (run_graph(gc, {dev_len, hx, cx, w, wsp, y, hy, cy, rsp},
                  {{x.nbytes(), [&](void* dst) { copy_device(dst, x.raw(), x.nbytes()); }}},
                  [&](cudnnHandle_t h, const std::vector<void*>& st) { return issue(h, st[0]); },
                  what.text() + ", training forward, " + kAlgoNames[p.algo])) {
      settled_fwd_ = settled(&gc);
      return;
    }
    run_eager(gc, [&] { LSTM_CUDNN_ACCEPTS(issue(cuda::cudnn_handle(), x.raw()), p.algo, what, "cudnnRNNForward"); });
    settled_fwd_ = settled(&gc);
  }

  // ---- CUDA graphs (LstmOptions::cuda_graphs) ----

  // Runs `eager` (one call's cuDNN work on the engine stream), measuring it when it is one of the
  // measured calls of an undecided cache under "auto" (the second to the (kSamples+1)-th).
  void run_eager(GraphCache& gc, const std::function<void()>& eager) {
    last_graph_ = "eager";
    const bool measure = graphs_ == kGraphsAuto && gc.state == GraphCache::kUndecided && gc.eager_calls >= 1 &&
                         gc.marks.size() < kSamples;
    ++gc.eager_calls;
    if (!measure) {
      eager();
      return;
    }
    GraphCache::Mark& m = begin_mark(gc);
    const auto t0 = std::chrono::steady_clock::now();
    eager();
    m.host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    LSTM_CUDA_CHECK(cudaEventRecord(m.end->h, cuda::stream()));
  }

  static GraphCache::Mark& begin_mark(GraphCache& gc) {
    gc.marks.emplace_back();
    GraphCache::Mark& m = gc.marks.back();
    m.begin = std::make_unique<Event>();
    m.end = std::make_unique<Event>();
    LSTM_CUDA_CHECK(cudaEventRecord(m.begin->h, cuda::stream()));
    return m;
  }

  // The fastest GPU time (and host time) of kSamples marks, once all of them have happened
  // (false before: never waits).
  static bool fastest(const GraphCache& gc, double* gpu_us, double* host_us) {
    if (gc.marks.size() < kSamples) return false;
    const cudaError_t q = cudaEventQuery(gc.marks.back().end->h);
    if (q == cudaErrorNotReady) return false;
    LSTM_CUDA_CHECK(q);
    *gpu_us = *host_us = 1e300;
    for (const auto& m : gc.marks) {
      float ms = 0;
      LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, m.begin->h, m.end->h));
      *gpu_us = std::min(*gpu_us, 1e3 * static_cast<double>(ms));
      *host_us = std::min(*host_us, m.host_us);
    }
    return true;
  }

  // Runs one call through `gc` as a graph when the cache replays: the stages are filled, then the
  // graph recorded for `key` (capturing `issue` first when none is) is launched. False when the
  // call is to run eagerly (graphs off, undecided, eager, or given up just now). `issue` makes the
  // cuDNN calls on the handle it gets, reading the stage buffers it gets.
  bool run_graph(GraphCache& gc, std::vector<const void*> key, const std::vector<Staged>& stages,
                 const std::function<cudnnStatus_t(cudnnHandle_t, const std::vector<void*>&)>& issue,
                 const std::string& what) {
    if (graphs_ == kGraphsOff || gc.state == GraphCache::kEager) return false;
    // The stages are taken on a cache's first call, so that the calls after warm-up allocate
    // nothing (a training loop's steps never call cudaMalloc); a cache that goes eager returns them.
    size_t staged_bytes = 0;
    if (gc.stages.size() != stages.size()) gc.stages.resize(stages.size());
    std::vector<void*> bufs;
    for (size_t i = 0; i < stages.size(); ++i) {
      staged_bytes += stages[i].bytes;
      gc.stages[i].ensure(std::max<size_t>(stages[i].bytes, 1));
      bufs.push_back(gc.stages[i].get());
      key.push_back(bufs.back());
    }
    if (gc.state == GraphCache::kUndecided) decide(gc, staged_bytes, what);
    if (gc.state == GraphCache::kTrial) judge_trial(gc, what);
    if (gc.state == GraphCache::kEager) gc.stages.clear();
    if (gc.state != GraphCache::kReplay && gc.state != GraphCache::kTrial) return false;
    GraphEntry* hit = nullptr;
    for (auto& e : gc.entries)
      if (e.key == key) hit = &e;
    const bool was_hit = hit != nullptr;
    if (hit) {
      ++gc.replays;
      ++counts_.replays;
    } else {
      // A capture costs about an eager call's host time and more: a cache that keeps capturing
      // (buffers that cycle through more sets than it keeps) is slower than eager calls.
      if (gc.captures >= static_cast<int>(2 * kMaxGraphs) && 4 * gc.captures > gc.replays) {
        give_up_graphs(gc, what, "the output, h0/c0 or reserve buffers change too often");
        return false;
      }
      if (gc.entries.size() >= kMaxGraphs)
        gc.entries.erase(std::min_element(gc.entries.begin(), gc.entries.end(),
                                          [](const GraphEntry& a, const GraphEntry& b) { return a.last_use < b.last_use; }));
      GraphEntry e;
      e.key = std::move(key);
      const std::string why = capture([&](cudnnHandle_t h) { return issue(h, bufs); }, e.exec);
      if (!why.empty()) {
        give_up_graphs(gc, what, why);
        return false;
      }
      ++gc.captures;
      ++counts_.captures;
      gc.entries.push_back(std::move(e));
      hit = &gc.entries.back();
    }
    hit->last_use = ++gc.clock;
    // The trial times kSamples replays of graphs captured on an earlier call, copies included.
    const bool measure = gc.state == GraphCache::kTrial && was_hit && gc.marks.size() < kSamples;
    if (measure) begin_mark(gc);
    for (size_t i = 0; i < stages.size(); ++i) stages[i].fill(bufs[i]);
    LSTM_CUDA_CHECK(cudaGraphLaunch(hit->exec.h, cuda::stream()));
    if (measure) LSTM_CUDA_CHECK(cudaEventRecord(gc.marks.back().end->h, cuda::stream()));
    last_graph_ = "replayed";
    return true;
  }

  // "auto"'s second look: the measured replays against the measured eager calls, the fastest of
  // each. Graphs stay when a replay took no longer than an eager call's GPU time (which, where the
  // host sets the pace, includes the GPU's waiting for it). A guard: on the H200 graphs ran up to
  // 1.9x slower than eager calls while most calls captured anew (the arena then cycled outputs
  // through every cached block of their size, docs/PERFORMANCE.md); nothing says a replay cannot
  // lose for another reason on another GPU or cuDNN.
  void judge_trial(GraphCache& gc, const std::string& what) {
    double graph_us = 0, host_us = 0;
    if (!fastest(gc, &graph_us, &host_us)) return;
    gc.marks.clear();
    const bool keep = graph_us <= gc.eager_us;
    std::ostringstream os;
    os << "cuDNN graphs (" << what << "): the fastest of " << kSamples << " replays took " << graph_us
       << " us against " << gc.eager_us << " us for the fastest eager call: " << (keep ? "replay" : "eager") << '\n';
    note_graph(os.str());
    if (keep) {
      gc.state = GraphCache::kReplay;
    } else {
      gc = GraphCache();
      gc.state = GraphCache::kEager;
    }
  }

  // Moves an undecided cache on when it can (never waits for the GPU): "on" to replay, "auto" to
  // eager or to a trial of graphs (cuda_graphs_first_look; judge_trial has the last word).
  void decide(GraphCache& gc, size_t staged_bytes, const std::string& what) {
    if (graphs_ == kGraphsOn) {
      if (gc.eager_calls >= 1) gc.state = GraphCache::kReplay;
      return;
    }
    double gpu_us = 0, host_us = 0;
    if (!fastest(gc, &gpu_us, &host_us)) return;
    if (copy_gbs_ < 0) copy_gbs_ = device_copy_gbs();  // here, not in the constructor: a GPU is there
    const GraphFirstLook look = cuda_graphs_first_look(host_us, gpu_us, staged_bytes, copy_gbs_);
    gc.state = look.try_graphs() ? GraphCache::kTrial : GraphCache::kEager;
    gc.eager_us = gpu_us;
    gc.marks.clear();
    std::ostringstream os;
    os << "cuDNN graphs (" << what << "): the fastest of " << kSamples << " eager calls: host " << host_us
       << " us to issue, GPU " << gpu_us << " us, copies into the graph's inputs about " << look.copy_us
       << " us: " << (gc.state == GraphCache::kTrial ? "try graphs" : "eager") << '\n';
    note_graph(os.str());
  }

  // What "auto" counts a device copy at: 80% of the device's theoretical memory bandwidth (an
  // H200 copied at 4245 of its 4814 GB/s, bytes read + written). 0 (the rule's fallback) when
  // the device does not say.
  static double device_copy_gbs() {
    int dev = 0;
    LSTM_CUDA_CHECK(cudaGetDevice(&dev));
    for (const GpuInfo& g : cuda_devices())
      if (g.index == dev) return 0.8 * g.memory_bandwidth_gbs;
    return 0;
  }

  void give_up_graphs(GraphCache& gc, const std::string& what, const std::string& why) {
    gc = GraphCache();
    gc.state = GraphCache::kEager;
    note_graph("cuDNN graphs (" + what + "): eager from now on: " + why + '\n');
  }

  // Records issue(handle) into `out` on a stream of our own (the legacy default stream cannot be
  // captured). Returns why it failed ("" on success).
  std::string capture(const std::function<cudnnStatus_t(cudnnHandle_t)>& issue, GraphExec& out) {
    if (!capture_stream_) LSTM_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
    cudnnHandle_t h = cuda::cudnn_handle();
    LSTM_CUDA_CHECK(cudnnSetStream(h, capture_stream_));
    // Thread-local mode: a call cuDNN may not make while capturing (a synchronisation, an
    // allocation) fails the capture instead of running outside the graph.
    const cudaError_t begin = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    char detail[512] = {0};
    if (begin == cudaSuccess) {
      st = issue(h);
      if (st != CUDNN_STATUS_SUCCESS) cudnnGetLastErrorString(detail, sizeof(detail));
    }
    cudaGraph_t g = nullptr;
    const cudaError_t end = begin == cudaSuccess ? cudaStreamEndCapture(capture_stream_, &g) : begin;
    LSTM_CUDA_CHECK(cudnnSetStream(h, cuda::stream()));
    std::string why;
    if (begin != cudaSuccess)
      why = std::string("cudaStreamBeginCapture failed: ") + cudaGetErrorString(begin);
    else if (st != CUDNN_STATUS_SUCCESS)
      why = std::string("cuDNN under stream capture returned ") + cudnnGetErrorString(st) +
            (detail[0] ? std::string(" (") + detail + ")" : std::string());
    else if (end != cudaSuccess || !g)
      why = std::string("cudaStreamEndCapture failed: ") + cudaGetErrorString(end);
    if (why.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&out.h, g, 0);
      if (inst != cudaSuccess) why = std::string("cudaGraphInstantiate failed: ") + cudaGetErrorString(inst);
    }
    if (g) cudaGraphDestroy(g);
    if (!why.empty()) {
      (void)cudaGetLastError();  // the failed capture's error must not be blamed on a later call
      return why;
    }
    LSTM_CUDA_CHECK(cudaGraphUpload(out.h, cuda::stream()));
    return "";
  }

  void note_graph(const std::string& line) {
    // Bounded: a process that keeps changing shapes would otherwise grow it without end.
    if (graph_log_.size() > (1u << 16)) graph_log_.erase(0, graph_log_.size() / 2);
    graph_log_ += line;
  }

  // The cache of a training call's kind ('f' forward, 'b' backward) for T and these lengths.
  static GraphCache& train_cache(Plan& p, char kind, int64_t T, const std::vector<int32_t>& len) {
    std::string k(1, kind);
    k += std::to_string(T);
    for (int32_t l : len) k += ',' + std::to_string(l);
    // Lengths that change on every batch would pile caches up (none of which ever replays).
    if (p.train_graphs.size() >= 16 && !p.train_graphs.count(k)) p.train_graphs.clear();
    return p.train_graphs[k];
  }

  // The inference call: replayed, or issued eagerly.
  void infer(const Plan& p, DataDescs& dd, const LstmInput& in, const void* w, LstmOutput& out, int64_t T,
             int64_t B) {
    const void* hx = in.h0.defined() ? in.h0.raw() : nullptr;
    const void* cx = in.c0.defined() ? in.c0.raw() : nullptr;
    const CaseText what = case_str(p.spec, p.dtype, B, T, dd.padded);
    const size_t ws = temp_sizes(dd, p.rnn.get(), CUDNN_FWD_MODE_INFERENCE, p.algo, what).first;
    workspace_.ensure(std::max<size_t>(ws, 1));
    void* y = out.output.raw();
    void* hy = out.h_n.raw();
    void* cy = out.c_n.raw();
    void* wsp = workspace_.get();
    const int32_t* dev_len = static_cast<const int32_t*>(dd.dev_len.raw());
    auto issue = [&](cudnnHandle_t h, const void* x) {
      return cudnnRNNForward(h, p.rnn.get(), CUDNN_FWD_MODE_INFERENCE, dev_len, dd.x.get(), x, dd.y.get(), y,
                             p.hdesc.get(), hx, hy, p.cdesc.get(), cx, cy, p.layout.bytes, w, ws, wsp, 0, nullptr);
    };
    if (run_graph(dd.graphs, {dev_len, hx, cx, w, wsp, y, hy, cy},
                  {{in.x.nbytes(), [&](void* dst) { stage_x(p, dd, in.x, dst, T, B); }}},
                  [&](cudnnHandle_t h, const std::vector<void*>& st) { return issue(h, st[0]); },
                  what.text() + ", inference, " + kAlgoNames[p.algo])) {
      settled_fwd_ = settled(&dd.graphs);
      return;
    }
    Tensor x = in.x;
    if (dd.padded) {
      x = Tensor::empty(in.x.shape(), p.dtype, Device::CUDA);
      stage_x(p, dd, in.x, x.raw(), T, B);
    }
    run_eager(dd.graphs, [&] {
      LSTM_CUDNN_ACCEPTS(issue(cuda::cudnn_handle(), x.raw()), p.algo, what, "cudnnRNNForward");
    });
    settled_fwd_ = settled(&dd.graphs);
  }

  // Whether a cache has made its graph decision (so later calls run as the steady state will).
  bool settled(const GraphCache* gc) const {
    return !gc || graphs_ == kGraphsOff || gc->state == GraphCache::kReplay || gc->state == GraphCache::kEager;
  }

  // ---- Plans ----
  std::string plan_key(const LstmSpec& s, DType dt, int a, int64_t B, bool packed = false) const {
    std::ostringstream os;
    os << s.input_size << ',' << s.hidden_size << ',' << s.num_layers << ',' << s.bidirectional << ',' << s.proj_size
       << ',' << s.bias << ',' << s.batch_first << ',' << s.dropout << ',' << static_cast<int>(dt) << ',' << a << ','
       << B << ',' << packed;
    return os.str();
  }

  // Whether a call takes the packed layout (see Plan::packed).
  static bool packs(const LstmSpec& s, int64_t T, const std::vector<int32_t>& len) {
    if (s.batch_first) return false;
    for (int32_t l : len)
      if (l != T) return false;
    return true;
  }

  std::shared_ptr<Plan> get_plan(const LstmSpec& s, DType dt, int a, int64_t B, bool packed) {
    // The previous call's plan, without building a key (host time is what launch-bound cases wait for).
    const Plan* lp = last_plan_.get();
    if (lp && lp->algo == a && lp->B == B && lp->packed == packed && lp->dtype == dt && lp->spec == s) return last_plan_;
    const std::string key = plan_key(s, dt, a, B, packed);
    auto it = plans_.find(key);
    if (it != plans_.end()) return last_plan_ = it->second;
    // Shapes that come and go (e.g. the last partial batch) should not pile up; a saved forward
    // keeps its own plan alive.
    if (plans_.size() >= 32) {
      plans_.clear();
      last_plan_.reset();
    }
    auto p = std::make_shared<Plan>();
    p->algo = a;
    p->spec = s;
    p->dtype = dt;
    p->B = B;
    p->packed = packed;
    p->what = case_str(p->spec, dt, 0, 0, false);
    LSTM_REQUIRE(dt != DType::F64 || a == kStandard,
                 "cuDNN " << kAlgoNames[a] << " does not compute in F64; only \"standard\" does");
    cudnnHandle_t h = cuda::cudnn_handle();
    set_rnn_desc(p->rnn.get(), a, s, dt, options_.allow_tf32, nodrop_desc(), p->what, !packed);
    size_t wbytes = 0;
    LSTM_CUDNN_ACCEPTS(cudnnGetRNNWeightSpaceSize(h, p->rnn.get(), &wbytes), a, p->what, "cudnnGetRNNWeightSpaceSize");
    p->layout = compute_layout(h, p->rnn.get(), s, dt);
    if (a == kPersistDynamic)
      LSTM_CUDNN_ACCEPTS(cudnnBuildRNNDynamic(h, p->rnn.get(), static_cast<int>(B)), a,
                         case_str(s, dt, B, 0, false), "cudnnBuildRNNDynamic");
    const int64_t LD = s.num_layers * s.directions();
    const int hdims[3] = {static_cast<int>(LD), static_cast<int>(B), static_cast<int>(s.out_size())};
    const int hstr[3] = {static_cast<int>(B * s.out_size()), static_cast<int>(s.out_size()), 1};
    LSTM_CUDA_CHECK(cudnnSetTensorNdDescriptor(p->hdesc.get(), data_type(dt), 3, hdims, hstr));
    const int cdims[3] = {static_cast<int>(LD), static_cast<int>(B), static_cast<int>(s.hidden_size)};
    const int cstr[3] = {static_cast<int>(B * s.hidden_size), static_cast<int>(s.hidden_size), 1};
    LSTM_CUDA_CHECK(cudnnSetTensorNdDescriptor(p->cdesc.get(), data_type(dt), 3, cdims, cstr));
    plans_[key] = p;
    return last_plan_ = p;
  }

  cudnnDropoutDescriptor_t nodrop_desc() {
    if (!nodrop_) {
      nodrop_ = std::make_unique<DropoutDesc>();
      LSTM_CUDA_CHECK(cudnnSetDropoutDescriptor(nodrop_->get(), cuda::cudnn_handle(), 0.0f, nullptr, 0, 0));
    }
    return nodrop_->get();
  }

  // cuDNN's dropout state: allocated and seeded (from the caller's Rng) once; a new probability
  // re-uses the state without re-seeding.
  void ensure_dropout(double p, Rng* rng) {
    cudnnHandle_t h = cuda::cudnn_handle();
    if (!drop_) {
      LSTM_REQUIRE(rng, "LSTM: dropout in training needs an Rng");
      size_t bytes = 0;
      LSTM_CUDA_CHECK(cudnnDropoutGetStatesSize(h, &bytes));
      drop_states_ = cuda::DeviceBuffer(bytes);
      drop_seed_ = rng->next_u64();
      drop_ = std::make_unique<DropoutDesc>();
      LSTM_CUDA_CHECK(cudnnSetDropoutDescriptor(drop_->get(), h, static_cast<float>(p), drop_states_.get(), bytes,
                                                drop_seed_));
      drop_p_ = p;
    } else if (p != drop_p_) {
      LSTM_CUDA_CHECK(cudnnRestoreDropoutDescriptor(drop_->get(), h, static_cast<float>(p), drop_states_.get(),
                                                    drop_states_.size(), drop_seed_));
      drop_p_ = p;
      // Descriptors made with the old probability must not be used again.
      for (auto& [k, pl] : plans_) pl->rnn_drop.reset();
    }
  }

  cudnnRNNDescriptor_t dropout_rnn(Plan& p) {
    LSTM_CHECK(drop_, "dropout descriptor used before it was made");
    if (!p.rnn_drop) {
      auto d = std::make_unique<RnnDesc>();
      set_rnn_desc(d->get(), p.algo, p.spec, p.dtype, options_.allow_tf32, drop_->get(), p.what, !p.packed);
      if (p.algo == kPersistDynamic)
        LSTM_CUDNN_ACCEPTS(cudnnBuildRNNDynamic(cuda::cudnn_handle(), d->get(), static_cast<int>(p.B)), p.algo,
                           p.what, "cudnnBuildRNNDynamic");
      p.rnn_drop = std::move(d);
    }
    return p.rnn_drop->get();
  }

  void set_data(const Plan& p, DataDescs& dd, int64_t T, const std::vector<int32_t>& len) {
    if (dd.T == T && dd.lengths == len) return;
    const LstmSpec& s = p.spec;
    const int64_t B = static_cast<int64_t>(len.size());
    bool padded = false;
    for (int32_t l : len) padded = padded || l < T;
    LSTM_CHECK(!p.packed || !padded, "a packed-layout plan got variable lengths");
    const cudnnRNNDataLayout_t layout =
        p.packed ? CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED
                 : (s.batch_first ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED);
    void* fill = p.packed ? nullptr : &g_zero_fill;
    LSTM_CUDA_CHECK(cudnnSetRNNDataDescriptor(dd.x.get(), data_type(p.dtype), layout, static_cast<int>(T),
                                              static_cast<int>(B), static_cast<int>(s.input_size), len.data(), fill));
    LSTM_CUDA_CHECK(cudnnSetRNNDataDescriptor(dd.y.get(), data_type(p.dtype), layout, static_cast<int>(T),
                                              static_cast<int>(B), static_cast<int>(s.directions() * s.out_size()),
                                              len.data(), fill));
    if (!dd.dev_len.defined() || dd.dev_len.numel() != B) {
      dd.dev_len = Tensor::empty({B}, DType::I32, Device::CUDA);
      dd.lengths.clear();
    }
    if (dd.lengths != len) {
      cuda::upload_int32(static_cast<int32_t*>(dd.dev_len.raw()), len.data(), B);
      dd.lengths = len;
    }
    dd.T = T;
    dd.padded = padded;
    dd.sizes.clear();
    dd.graphs = GraphCache();
  }

  // Workspace and reserve sizes for a call with these descriptors (asked of cuDNN once).
  std::pair<size_t, size_t> temp_sizes(DataDescs& dd, cudnnRNNDescriptor_t rnn, cudnnForwardMode_t mode, int algo,
                                       const CaseText& what) {
    for (const auto& z : dd.sizes)
      if (z.rnn == rnn && z.mode == mode) return {z.ws, z.rs};
    size_t ws = 0, rs = 0;
    LSTM_CUDNN_ACCEPTS(cudnnGetRNNTempSpaceSizes(cuda::cudnn_handle(), rnn, mode, dd.x.get(), &ws, &rs), algo, what,
                       "cudnnGetRNNTempSpaceSizes");
    dd.sizes.push_back({rnn, mode, ws, rs});
    return {ws, rs};
  }

  // The weight space for `weights`: their own buffer when they are views at the plan's offsets,
  // else a cached buffer they are copied into.
  const void* weight_space(const Plan& p, const std::vector<Tensor>& weights) {
    void* base = nullptr;
    if (in_place(weights, p.layout, &base)) return base;
    if (w_copy_.size() < p.layout.bytes) {
      w_copy_.ensure(p.layout.bytes);
      // Gaps between tensors (if cuDNN leaves any) hold zeros rather than arena leftovers.
      LSTM_CUDA_CHECK(cudaMemsetAsync(w_copy_.get(), 0, w_copy_.size(), cuda::stream()));
    }
    for (size_t i = 0; i < weights.size(); ++i)
      LSTM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(w_copy_.get()) + p.layout.offsets[i], weights[i].raw(),
                                      weights[i].nbytes(), cudaMemcpyDeviceToDevice, cuda::stream()));
    return w_copy_.get();
  }

  // One cudnnRNNForward. In training mode the reserve space is allocated into *reserve.
  void run_forward(const Plan& p, cudnnRNNDescriptor_t rnn, DataDescs& dd, bool train_mode, const void* x,
                   void* y, const void* hx, void* hy, const void* cx, void* cy, const void* w,
                   cuda::DeviceBuffer* reserve, size_t* reserve_bytes, int64_t T, int64_t B) {
    cudnnHandle_t h = cuda::cudnn_handle();
    const cudnnForwardMode_t mode = train_mode ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
    const CaseText what = case_str(p.spec, p.dtype, B, T, dd.padded);
    auto [ws, rs] = temp_sizes(dd, rnn, mode, p.algo, what);
    workspace_.ensure(std::max<size_t>(ws, 1));
    void* rptr = nullptr;
    if (train_mode) {
      *reserve = cuda::DeviceBuffer(std::max<size_t>(rs, 1));
      rptr = reserve->get();
    } else {
      rs = 0;
    }
    *reserve_bytes = rs;
    LSTM_CUDNN_ACCEPTS(cudnnRNNForward(h, rnn, mode, static_cast<const int32_t*>(dd.dev_len.raw()), dd.x.get(), x,
                                       dd.y.get(), y, p.hdesc.get(), hx, hy, p.cdesc.get(), cx, cy, p.layout.bytes, w,
                                       ws, workspace_.get(), rs, rptr),
                       p.algo, what, "cudnnRNNForward");
  }

  // ---- "auto": time each algorithm that accepts the case once, keep the fastest ----
  int pick(const LstmSpec& s, DType dt, int64_t T, int64_t B, const std::vector<int32_t>& len, bool train_mode,
           const LstmInput& in, const std::vector<Tensor>& weights) {
    bool padded = false;
    for (int32_t l : len) padded = padded || l < T;
    std::ostringstream ks;
    ks << plan_key(s, dt, 0, B) << ',' << T << ',' << train_mode << ',' << padded;
    auto it = auto_choice_.find(ks.str());
    if (it != auto_choice_.end()) return it->second;

    std::ostringstream log;
    log << "cuDNN auto (" << case_str(s, dt, B, T, padded).text() << ", " << (train_mode ? "training" : "inference") << "):";
    int best = -1;
    float best_ms = 0;
    const Event e0, e1;
    const int64_t LD = s.num_layers * s.directions();
    Tensor x = in.x;
    if (padded) x = Tensor::zeros(in.x.shape(), dt, Device::CUDA);  // timing only: values do not matter
    Tensor y = Tensor::empty(s.batch_first ? Shape{B, T, s.directions() * s.out_size()}
                                           : Shape{T, B, s.directions() * s.out_size()},
                             dt, Device::CUDA);
    Tensor hy = Tensor::empty({LD, B, s.out_size()}, dt, Device::CUDA);
    Tensor cy = Tensor::empty({LD, B, s.hidden_size}, dt, Device::CUDA);
    Tensor dy = train_mode ? Tensor::zeros(y.shape(), dt, Device::CUDA) : Tensor();
    Tensor dx = train_mode ? Tensor::empty(x.shape(), dt, Device::CUDA) : Tensor();
    for (int a = 0; a < 4; ++a) {
      if (dt == DType::F64 && a != kStandard) continue;
      // cuDNN 9 refuses variable lengths in the persistent algorithms at the first call; asking
      // would only cost persist_dynamic's run-time compilation.
      if (padded && a != kStandard) {
        log << ' ' << kAlgoNames[a] << " skipped (variable lengths);";
        continue;
      }
      try {
        std::shared_ptr<Plan> p = get_plan(s, dt, a, B, packs(s, T, len));
        DataDescs dd;
        set_data(*p, dd, T, len);
        const void* w = weight_space(*p, weights);
        cuda::DeviceBuffer dwb;
        if (train_mode) {
          dwb = cuda::DeviceBuffer(p->layout.bytes);
          LSTM_CUDA_CHECK(cudaMemsetAsync(dwb.get(), 0, p->layout.bytes, cuda::stream()));
        }
        auto once = [&]() {
          cuda::DeviceBuffer reserve;
          size_t rs = 0;
          run_forward(*p, p->rnn.get(), dd, train_mode, x.raw(), y.raw(), nullptr, hy.raw(), nullptr, cy.raw(), w,
                      &reserve, &rs, T, B);
          if (!train_mode) return;
          cudnnHandle_t h = cuda::cudnn_handle();
          const CaseText what = case_str(s, dt, B, T, padded);
          size_t ws = workspace_.size();
          LSTM_CUDNN_ACCEPTS(cudnnRNNBackwardData_v8(h, p->rnn.get(), static_cast<const int32_t*>(dd.dev_len.raw()),
                                                     dd.y.get(), y.raw(), dy.raw(), dd.x.get(), dx.raw(),
                                                     p->hdesc.get(), nullptr, nullptr, nullptr, p->cdesc.get(),
                                                     nullptr, nullptr, nullptr, p->layout.bytes, w, ws,
                                                     workspace_.get(), rs, reserve.get()),
                             a, what, "cudnnRNNBackwardData_v8");
          LSTM_CUDNN_ACCEPTS(cudnnRNNBackwardWeights_v8(h, p->rnn.get(), CUDNN_WGRAD_MODE_ADD,
                                                        static_cast<const int32_t*>(dd.dev_len.raw()), dd.x.get(),
                                                        x.raw(), p->hdesc.get(), nullptr, dd.y.get(), y.raw(),
                                                        p->layout.bytes, dwb.get(), ws, workspace_.get(), rs,
                                                        reserve.get()),
                             a, what, "cudnnRNNBackwardWeights_v8");
        };
        once();  // warm-up; also where a rejection at call time shows
        LSTM_CUDA_CHECK(cudaEventRecord(e0.h, cuda::stream()));
        const int reps = 3;
        for (int r = 0; r < reps; ++r) once();
        LSTM_CUDA_CHECK(cudaEventRecord(e1.h, cuda::stream()));
        LSTM_CUDA_CHECK(cudaEventSynchronize(e1.h));
        float ms = 0;
        LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.h, e1.h));
        ms /= reps;
        log << ' ' << kAlgoNames[a] << ' ' << ms << " ms;";
        if (best < 0 || ms < best_ms) {
          best = a;
          best_ms = ms;
        }
      } catch (const Rejected&) {
        log << ' ' << kAlgoNames[a] << " rejects the case;";
      }
    }
    LSTM_CHECK(best >= 0, "cuDNN auto: no algorithm accepted the case, not even standard");
    log << " picked " << kAlgoNames[best] << '\n';
    auto_log_ += log.str();
    auto_choice_[ks.str()] = best;
    return best;
  }

  LstmOptions options_;
  int algo_;
  GraphMode graphs_;
  double copy_gbs_ = -1;  // device_copy_gbs() once "auto" first needs it
  cudaStream_t capture_stream_ = nullptr;
  bool settled_fwd_ = true, settled_bwd_ = true;  // see graphs_settled()
  GraphCounts counts_;
  // Declared before the plans: RNN descriptors made with these must go first.
  std::unique_ptr<DropoutDesc> nodrop_, drop_;
  cuda::DeviceBuffer drop_states_;
  unsigned long long drop_seed_ = 0;
  double drop_p_ = 0;
  std::map<std::string, std::shared_ptr<Plan>> plans_;
  std::shared_ptr<Plan> last_plan_;  // one of plans_
  std::map<std::string, int> auto_choice_;
  cuda::DeviceBuffer workspace_, w_copy_, dw_scratch_;
  std::string last_algo_, auto_log_, last_graph_, graph_log_;
};

std::string unsupported(const LstmSpec& spec, DType dtype, Device device, int algo, bool allow_tf32) {
  if (device != Device::CUDA) return "the cuDNN backend runs on CUDA devices only";
  if (!cuda_available()) return cuda_unavailable_reason();
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16 && dtype != DType::F64)
    return std::string("the cuDNN backend computes in F32, BF16, F16 or F64, not ") + dtype_name(dtype);
  if (dtype == DType::F64 && algo != kStandard && algo != kAutoAlgo && algo != kHeuristicAlgo)
    return std::string("cuDNN ") + kAlgoNames[algo] + " does not compute in F64; only \"standard\" does";
  try {
    spec.validate();
  } catch (const Error& e) {
    return e.what();
  }
  if (algo == kAutoAlgo || algo == kStandard || algo == kHeuristicAlgo) return "";
  // Ask cuDNN with descriptors (host-side calls, no GPU work): the RNN descriptor, the weight
  // space and the temporary space for one step of one sequence. persist_dynamic is not probed
  // past the descriptor: its temp-space query needs the NVRTC build for a batch size.
  try {
    cudnnHandle_t h = cuda::cudnn_handle();
    DropoutDesc nodrop;
    LSTM_CUDA_CHECK(cudnnSetDropoutDescriptor(nodrop.get(), h, 0.0f, nullptr, 0, 0));
    RnnDesc rnn;
    const CaseText what = case_str(spec, dtype, 0, 0, false);
    set_rnn_desc(rnn.get(), algo, spec, dtype, allow_tf32, nodrop.get(), what);
    size_t wbytes = 0;
    LSTM_CUDNN_ACCEPTS(cudnnGetRNNWeightSpaceSize(h, rnn.get(), &wbytes), algo, what, "cudnnGetRNNWeightSpaceSize");
    if (algo != kPersistDynamic) {
      RnnDataDesc x;
      int32_t one = 1;
      LSTM_CUDA_CHECK(cudnnSetRNNDataDescriptor(x.get(), data_type(dtype), CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 1,
                                                1, static_cast<int>(spec.input_size), &one, &g_zero_fill));
      for (cudnnForwardMode_t m : {CUDNN_FWD_MODE_INFERENCE, CUDNN_FWD_MODE_TRAINING}) {
        size_t ws = 0, rs = 0;
        LSTM_CUDNN_ACCEPTS(cudnnGetRNNTempSpaceSizes(h, rnn.get(), m, x.get(), &ws, &rs), algo, what,
                           "cudnnGetRNNTempSpaceSizes");
      }
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::string cudnn_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device, const LstmOptions& options) {
  return unsupported(spec, dtype, device, algo_id(options.cudnn_algo), options.allow_tf32);
}

std::unique_ptr<LstmBackend> make_cudnn_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options) {
  return std::make_unique<CudnnBackend>(spec, dtype, device, options);
}

std::string cudnn_algo_summary(CudnnAlgo a) {
  switch (a) {
    case CudnnAlgo::Standard: return "GPU, F64/F32/TF32/BF16/F16: cuDNN's standard algorithm, CUDA graphs";
    case CudnnAlgo::PersistStatic:
      return "GPU, F32/TF32/F16 (cuDNN 9 has no BF16 persistence): cuDNN's persistent kernel; hidden and batch "
             "limits set by cuDNN per device; no variable lengths, projection or bias-free layers";
    case CudnnAlgo::PersistDynamic:
      return "GPU, F32/TF32/F16: cuDNN's run-time compiled persistent kernel (one compile per batch size); "
             "no variable lengths, projection or bias-free layers";
    case CudnnAlgo::PersistStaticSmallH:
      return "GPU, F32/TF32/F16: cuDNN's persistent kernel for small hidden sizes (up to 192 in inference, "
             "128 in training, per cuDNN); no variable lengths, projection or bias-free layers";
    default: return "GPU: cuDNN";
  }
}

bool cudnn_algo_varlen(CudnnAlgo a) { return a == CudnnAlgo::Standard || a == CudnnAlgo::Heuristic || a == CudnnAlgo::Auto; }

GraphFirstLook cuda_graphs_first_look(double host_us, double gpu_us, size_t staged_bytes, double copy_gbs) {
  GraphFirstLook r;
  const double gbs = copy_gbs > 0 ? copy_gbs : 1000.0;
  r.copy_us = 2.0 * static_cast<double>(staged_bytes) / (gbs * 1e3);  // GB/s = 1e3 bytes per us
  r.host_bound = host_us >= 0.5 * gpu_us;
  r.cheap_copy = r.copy_us <= 0.05 * gpu_us;
  return r;
}

std::string cudnn_heuristic_algo(const LstmSpec& spec, DType dtype, int64_t T, int64_t B, bool variable_lengths,
                                 bool training, int cc_major, int cc_minor, int sms) {
  // Where cuDNN 9 refuses every persistent algorithm (measured on cuDNN 9.19, see the tests).
  if (variable_lengths || spec.proj_size > 0 || !spec.bias || dtype == DType::F64) return "standard";
  // The backward pass takes persist_static_small_h only up to hidden 128; a training forward
  // must use the algorithm its backward will.
  if (cc_major >= 6 && spec.hidden_size <= (training ? 128 : 192)) return "persist_static_small_h";
  if (dtype != DType::F16) return "standard";
  const bool shape_ok = spec.num_layers == 1 && !spec.bidirectional && spec.hidden_size <= 1024 &&
                        spec.hidden_size % 128 == 0 && spec.input_size % 128 == 0;
  if (!shape_ok) return "standard";
  bool device_ok = false;
  if (cc_major == 7 && cc_minor != 5) {
    // Volta: batches that are multiples of 16 (but not 80 or 112) or exactly 8, long enough.
    device_ok = ((B % 16 == 0 && B != 80 && B != 112) || B == 8) &&
                ((T >= 40 && B <= 128) || (T >= 20 && B <= 96) || (T >= 10 && B <= 32));
  } else if (cc_major >= 8 && sms >= 98 && cc_minor != 6) {
    // Large Ampere and newer (not sm_86, not the 56-SM A30 class).
    device_ok = B % 8 == 0 && B <= 128;
  }
  return device_ok ? "persist_static" : "standard";
}

}  // namespace lstm
