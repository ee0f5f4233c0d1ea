// The LSTM stack as one op: nn.LSTM semantics, weights in nn.LSTM's layout and names, and
// interchangeable implementations ("backends") chosen by an Algo value.
//
// Shapes (T = steps, B = batch, I = input size, H = hidden size, P = proj_size,
// Hout = P if P > 0 else H, D = 2 if bidirectional else 1, L = num_layers):
//   x        [T, B, I]            ([B, T, I] when spec.batch_first)
//   lengths  B values in [1, T]   (empty: every sequence has T steps)
//   h0       [L*D, B, Hout]       (undefined: zeros)
//   c0       [L*D, B, H]          (undefined: zeros)
//   output   [T, B, D*Hout]       ([B, T, D*Hout] when batch_first); zero past each length
//   h_n      [L*D, B, Hout], c_n [L*D, B, H], each at the sequence's own last step
// Values of x past a sequence's length may be anything (NaN too) and never influence a result;
// their gradient is zero. Gate order is i, f, g, o as in PyTorch.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

namespace lstm {

// Which implementation runs an LSTM. Reference: the CPU (f64/f32) function every other backend
// is tested against. Naive: the per-gate GPU baseline of Appleyard et al. (2016), for
// comparison only. Cudnn: cuDNN's RNN API (LstmOptions::cudnn_algo picks cuDNN's algorithm).
// Fused: our own kernels. Persistent: our persistent kernels (one launch per layer or stack for all
// steps, W_hh held on-chip; docs/KERNELS.md). Onednn: oneDNN's fused LSTM primitives on the CPU
// (F32; when built with oneDNN). Auto: the fastest backend that supports the case, by measurement
// (see make_lstm_backend).
enum class Algo { Reference, Naive, Cudnn, Fused, Persistent, Onednn, Auto };
// "reference", "naive", "cudnn", "fused", "persistent", "onednn", "auto"
const char* algo_name(Algo a);
Algo algo_from_name(const std::string& name);  // throws naming the accepted names

// cuDNN's own algorithm for Algo::Cudnn.
//   Heuristic: PyTorch nn.LSTM's rule (cudnn_heuristic_algo), nothing timed; the default.
//   Standard, PersistStatic, PersistDynamic, PersistStaticSmallH: that cuDNN algorithm.
//   Auto: each cuDNN algorithm that accepts a shape is timed once on its first use (like
//   torch.backends.cudnn.benchmark) and the fastest is kept.
enum class CudnnAlgo { Heuristic, Standard, PersistStatic, PersistDynamic, PersistStaticSmallH, Auto };
// "heuristic", "standard", "persist_static", "persist_dynamic", "persist_static_small_h", "auto".
const char* cudnn_algo_name(CudnnAlgo a);
// Throws "<what>: expected one of heuristic, standard, ..., got '<name>'".
CudnnAlgo cudnn_algo_from_name(const std::string& name, const std::string& what = "cudnn_algo");

// Whether a backend replays its per-call GPU work as CUDA graphs (see LstmOptions::cuda_graphs).
enum class GraphMode { Auto, On, Off };
const char* graph_mode_name(GraphMode m);  // "auto", "on", "off"
// Throws "<what>: expected auto, on or off, got '<name>'".
GraphMode graph_mode_from_name(const std::string& name, const std::string& what = "cuda_graphs");

// Where a forward or backward runs. On a GPU: the device and the stream the call's work is
// issued on, in stream order after what the caller issued before. A backend may fork work onto
// streams of its own; it joins them back onto this stream (events) before it returns, so the
// results are ready in stream order and buffers it hands back may be used on this stream at once.
// The header is CUDA-free: `stream` is a cudaStream_t (nullptr: the legacy default stream).
struct ExecContext {
  Device device = Device::CPU;
  int device_index = 0;    // the CUDA device ordinal
  void* stream = nullptr;  // cudaStream_t
  static ExecContext cpu() { return {}; }
  // The calling host thread's engine stream on the current CUDA device (see lstm/device.hpp), or
  // cpu() for Device::CPU. Throws when `device` is CUDA and no GPU is usable.
  static ExecContext current(Device device);
};

struct LstmSpec {
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bidirectional = false;
  int64_t proj_size = 0;  // 0: no projection (LSTMP when > 0; must be < hidden_size)
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;  // on each layer's output except the last, in training only

  int64_t directions() const { return bidirectional ? 2 : 1; }
  int64_t out_size() const { return proj_size > 0 ? proj_size : hidden_size; }
  int64_t layer_input_size(int64_t layer) const { return layer == 0 ? input_size : directions() * out_size(); }
  // Throws lstm::Error naming the bad field and its value.
  void validate() const;
  // nn.LSTM's parameter names in nn.LSTM's order (layer-major, then direction, then
  // weight_ih, weight_hh, bias_ih, bias_hh, weight_hr), e.g. "weight_ih_l0_reverse".
  std::vector<std::string> param_names() const;
  Shape param_shape(const std::string& name) const;
  // Index into param_names() of a layer/direction's tensors (-1 where absent).
  struct Slots { int w_ih, w_hh, b_ih, b_hh, w_hr; };
  Slots slots(int64_t layer, int64_t direction) const;
  // Reads sizes, layer count, directions, proj_size and bias from nn.LSTM state_dict names and
  // shapes (names start with `prefix`). Throws naming the first missing or inconsistent tensor.
  static LstmSpec infer(const std::map<std::string, Shape>& shapes, const std::string& prefix = "");
  // The prefixes of every nn.LSTM in a state_dict: "" for a bare nn.LSTM's, "lstm." for a model
  // whose attribute `lstm` is one (each name P such that P + "weight_ih_l0" is a tensor), sorted.
  static std::vector<std::string> find_prefixes(const std::map<std::string, Shape>& shapes);
  bool operator==(const LstmSpec&) const = default;
};

struct LstmInput {
  Tensor x;
  std::vector<int64_t> lengths;
  Tensor h0, c0;
};

struct LstmOutput {
  Tensor output, h_n, c_n;
};

// Gradients of a loss with respect to the forward's outputs; an undefined tensor means zero.
// d_output past a sequence's length is ignored.
struct LstmGradOutput {
  Tensor d_output, d_h_n, d_c_n;
};

struct LstmGrads {
  Tensor d_x;         // shape of x; zero past each length
  Tensor d_h0, d_c0;  // defined when the forward got h0 / c0
};

// What a backend saves in a training forward for its backward. Opaque.
class LstmSaved {
 public:
  virtual ~LstmSaved() = default;
};

// One implementation of the LSTM op, made for one spec, compute dtype and device
// (make_lstm_backend). Per (batch, steps) it plans once (validated shapes, descriptors, buffers,
// captured graphs) and reuses the plan, so a call with a planned shape parses, formats and
// allocates nothing of its own. Not thread-safe: one instance per thread.
class LstmBackend {
 public:
  LstmBackend(const LstmSpec& spec, DType dtype, Device device) : spec_(spec), dtype_(dtype), device_(device) {}
  virtual ~LstmBackend() = default;
  LstmBackend(const LstmBackend&) = delete;
  LstmBackend& operator=(const LstmBackend&) = delete;

  const LstmSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }  // of x, weights, outputs and gradients
  Device device() const { return device_; }
  virtual Algo algo() const = 0;
  // The registry row this instance came from, e.g. "reference", "cudnn:persist_static", "fused".
  virtual std::string name() const = 0;

  // weights: aligned with spec().param_names(), each of spec().param_shape(name), dtype(), on
  // device(). saved == nullptr: inference, nothing is kept. Dropout (training && spec().dropout >
  // 0) draws from rng. Work is issued on ctx (device() must be ctx.device). Throws lstm::Error on
  // bad shapes, dtypes, devices or lengths, naming what was expected and what was given.
  virtual LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                             std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) = 0;
  // Adds the weight gradients into d_weights (aligned with weights, same shapes and dtype) and
  // returns the gradients with respect to x, h0 and c0. Once per training forward.
  virtual LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                             std::vector<Tensor>& d_weights, const ExecContext& ctx) = 0;

  // Where the backend wants the weights: one flat buffer of `bytes` holding each tensor of
  // spec().param_names() at offsets[i] (bytes, in `dtype`). When forward/backward get weights (or
  // d_weights) that are views into one such buffer at exactly these offsets, they are used in
  // place (cuDNN's weight space, like PyTorch's flatten_parameters); otherwise they are copied
  // in. Empty offsets: the backend has no flat layout (it reads the tensors where they are).
  struct FlatLayout {
    size_t bytes = 0;
    std::vector<size_t> offsets;
  };
  virtual FlatLayout flat_layout(DType dtype) const {
    (void)dtype;
    return {};
  }

  // What the backend says about its runs (benchmarks, `lstm info`, tests), backend-neutral:
  // how the last forward or backward ran, e.g. "cudnn:persist_static, replayed" ("" before any).
  virtual std::string last_run() const { return ""; }
  // One line per decision made by measurement so far (Algo::Auto's timings and pick, cuDNN's
  // "auto" algorithm choice, CUDA-graph decisions).
  virtual std::string log() const { return ""; }
  // Whether the decisions for the shapes of the last forward and backward are made, so that the
  // same calls keep running as they run now (benchmarks warm up until it holds).
  virtual bool settled() const { return true; }
  // CUDA graphs captured and replays of captured graphs so far, over every shape.
  struct GraphCounts {
    int64_t captures = 0, replays = 0;
  };
  virtual GraphCounts graph_counts() const { return {}; }

 protected:
  // Checks in/weights against spec() and dtype()/device() (check_lstm_input plus dtype and
  // device) and ctx against device(). Returns (T, B).
  std::pair<int64_t, int64_t> check_call(const LstmInput& in, const std::vector<Tensor>& weights,
                                         const ExecContext& ctx) const;

 private:
  LstmSpec spec_;
  DType dtype_;
  Device device_;
};

// Tensors of spec.param_names() as views into one new buffer laid out as `layout` (on `device`,
// uninitialised), or separate tensors when layout.offsets is empty.
std::vector<Tensor> make_flat_weights(const LstmSpec& spec, const LstmBackend::FlatLayout& layout, DType dtype,
                                      Device device);

// How an LSTM runs on a device.
struct LstmOptions {
  // Auto: the fastest registered backend of the device for the case, by measurement (see
  // make_lstm_backend); on the CPU the reference and onednn are the candidates.
  Algo algo = Algo::Auto;
  // For Algo::Cudnn (see CudnnAlgo). Heuristic, the default, runs the algorithm PyTorch's nn.LSTM
  // runs for the shape.
  CudnnAlgo cudnn_algo = CudnnAlgo::Heuristic;
  // F32 data may use TF32 tensor cores (torch.backends.cudnn.allow_tf32). bf16/f16 data always
  // uses tensor cores with fp32 accumulation. The math modes are PyTorch's (see lstm_cudnn.cpp).
  bool allow_tf32 = false;
  // GPU backends replay a call's work (an inference forward, a training forward, a backward) as a
  // CUDA graph: captured once, and later calls with the same shape, lengths and buffers (h0/c0,
  // outputs, gradients, weights) replay it with one graph launch, which saves the host's time to
  // issue per-step kernels (what small batches and hidden sizes over many steps wait for) and
  // closes the gaps between them. x and d_output may be any buffers: they are copied into the
  // graph's own input buffers first. Results are the same bits as without graphs (same kernels).
  // Auto (the default): three eager calls with a shape (after its first) are measured; graphs
  //   are tried when the host took at least half as long to issue a call as the GPU took to run
  //   it, or when the copies are at most 5% of the GPU's time (counted at 80% of the device's
  //   memory bandwidth; cuda_graphs_first_look in cuda/graph_cache.hpp), and kept when the
  //   fastest of three replays took no longer than the fastest eager call;
  // On: replay from the second call with a shape (the first is the warm-up);
  // Off: never.
  // A shape whose capture fails, or whose buffers change on most calls, runs without graphs, and
  // so do cuDNN's training calls with dropout between layers (cuDNN's dropout state lives in it).
  GraphMode cuda_graphs = GraphMode::Auto;
  // For Algo::Auto: the file its choices are kept in across processes, per GPU, library versions,
  // build of the engine (engine_build()), case and shape. "" (the default): $LSTM_AUTO_CACHE, else $XDG_CACHE_HOME/lstm-engine/auto.json,
  // else ~/.cache/lstm-engine/auto.json; "-": none (measure in every process).
  std::string auto_cache;
};

// One row of the backend registry: every implementation of the LSTM op, listed once. `lstm
// info`, Algo::Auto, the conformance tests and the benchmark iterate over it and know no backend
// by name.
struct LstmBackendEntry {
  std::string name;     // "reference", "naive", "cudnn", "cudnn:standard", ..., "fused"
  Algo algo;
  std::string summary;  // one line: what it computes with, and its limits
  bool baseline = false;  // kept for comparison (the naive baseline): Algo::Auto never times it
  // What a call may ask beyond the spec: lengths shorter than T within a batch, and h0/c0. A
  // backend without them refuses such calls with an lstm::Error, and Auto does not time it there.
  bool variable_lengths = true;
  bool initial_state = true;
  // "" when make() can build an instance for spec/dtype/device under these options, otherwise
  // why not (host-side checks only: nothing runs on a GPU). A row whose library this binary was
  // built without says "built without ..." (e.g. onednn without libdnnl-dev).
  std::function<std::string(const LstmSpec&, DType, Device, const LstmOptions&)> why_not;
  std::function<std::unique_ptr<LstmBackend>(const LstmSpec&, DType, Device, const LstmOptions&)> make;
};
// The rows built into this binary, in a fixed order (reference first).
const std::vector<LstmBackendEntry>& lstm_backends();
// The row called `name`; throws naming the registered names when there is none.
const LstmBackendEntry& lstm_backend_entry(const std::string& name);

// A new backend instance (owning its descriptors, plans and workspaces) for spec/dtype/device:
// the row of options.algo (for Cudnn the row "cudnn", which runs options.cudnn_algo), or for
// Algo::Auto an instance that picks per shape: the first call with a (batch, steps, variable
// lengths or not, training or not, h0/c0 or not) times every non-baseline row that accepts the
// case on the device (on a GPU each cuDNN algorithm among them; on the CPU the reference and
// onednn; a case only one row accepts, like F64 on the CPU, runs there unmeasured) and keeps the
// fastest, remembered in options.auto_cache; its log() and last_run() say what it measured and
// picked. Throws with the reason when the chosen row does not support the case (e.g. a cuDNN
// persistent algorithm that rejects the hidden size names the limit).
std::unique_ptr<LstmBackend> make_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                               Device device);
// make_lstm_backend for the row called `name` (options.algo is ignored).
std::unique_ptr<LstmBackend> make_lstm_backend(const std::string& name, const LstmOptions& options,
                                               const LstmSpec& spec, DType dtype, Device device);
// The choices Algo::Auto made for spec and kept in the choice file of `auto_cache` (see
// LstmOptions::auto_cache), one line each: "<GPU> | <versions> | <spec> <dtype> | <shape>:
// <picked backend> (<each backend's time>)". Empty when there are none or no file.
std::vector<std::string> lstm_auto_choices(const LstmSpec& spec, const std::string& auto_cache = "");
// Algorithms with a row in this binary, e.g. {Reference} on a CPU-only build.
std::vector<Algo> available_algos();

// Checks x / lengths / h0 / c0 against spec; throws naming what was expected and what was given.
// Returns (T, B).
std::pair<int64_t, int64_t> check_lstm_input(const LstmSpec& spec, const LstmInput& in,
                                             const std::vector<Tensor>& weights);

// PyTorch's default initialisation: every parameter ~ U(-1/sqrt(H), 1/sqrt(H)).
void lstm_init_weights(const LstmSpec& spec, std::vector<Tensor>& weights, Rng& rng);

}  // namespace lstm
