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

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

namespace lstm {

enum class Algo { Reference, Cudnn, Fused, Persistent, Auto };
const char* algo_name(Algo a);  // "reference", "cudnn", "fused", "persistent", "auto"
Algo algo_from_name(const std::string& name);  // throws naming the accepted names

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

class LstmBackend {
 public:
  virtual ~LstmBackend() = default;
  virtual Algo algo() const = 0;
  // "" when this backend computes `spec` in `dtype` on `device`; otherwise why not.
  virtual std::string unsupported_reason(const LstmSpec& spec, DType dtype, Device device) const = 0;
  // weights: aligned with spec.param_names(), each of spec.param_shape(name), dtype of x.
  // saved == nullptr: inference, nothing is kept. Dropout (training && spec.dropout > 0) draws
  // from rng. Throws lstm::Error on bad shapes or lengths.
  virtual LstmOutput forward(const LstmSpec& spec, const std::vector<Tensor>& weights,
                             const LstmInput& in, bool training, Rng* rng,
                             std::unique_ptr<LstmSaved>* saved) = 0;
  // Adds the weight gradients into d_weights (aligned with weights, same shapes) and returns
  // the gradients with respect to x, h0 and c0.
  virtual LstmGrads backward(const LstmSpec& spec, const std::vector<Tensor>& weights,
                             const LstmSaved& saved, const LstmGradOutput& grad,
                             std::vector<Tensor>& d_weights) = 0;

  // Where the backend wants the weights: one flat buffer of `bytes` holding each tensor of
  // spec.param_names() at offsets[i] (bytes, in `dtype`). When forward/backward get weights (or
  // d_weights) that are views into one such buffer at exactly these offsets, they are used in
  // place (cuDNN's weight space, like PyTorch's flatten_parameters); otherwise they are copied
  // in. Empty offsets: the backend has no flat layout (it reads the tensors where they are).
  struct FlatLayout {
    size_t bytes = 0;
    std::vector<size_t> offsets;
  };
  virtual FlatLayout flat_layout(const LstmSpec& spec, DType dtype) const {
    (void)spec;
    (void)dtype;
    return {};
  }
};

// Tensors of spec.param_names() as views into one new buffer laid out as `layout` (on `device`,
// uninitialised), or separate tensors when layout.offsets is empty.
std::vector<Tensor> make_flat_weights(const LstmSpec& spec, const LstmBackend::FlatLayout& layout, DType dtype,
                                      Device device);

// The backend for `algo` (Auto: the fastest one that supports the case). Throws with the
// reason when the chosen algo does not support spec/dtype/device. Returns a process-wide
// instance: only for stateless backends (the CPU reference); GPU backends keep descriptors and
// workspaces per instance, so use make_lstm_backend for them.
LstmBackend& lstm_backend(Algo algo, const LstmSpec& spec, DType dtype, Device device);

// How an LSTM runs on a device.
struct LstmOptions {
  // Auto: reference on the CPU; on the GPU the fastest built-in backend that supports the case.
  Algo algo = Algo::Auto;
  // For Algo::Cudnn: cuDNN's own algorithm, "standard", "persist_static", "persist_dynamic",
  // "persist_static_small_h", "auto" (each algorithm that accepts the shape is timed once per
  // shape and mode on first use, like torch.backends.cudnn.benchmark, and the fastest is kept),
  // or "heuristic" (the default: PyTorch nn.LSTM's rule, so a model runs the algorithm it runs
  // under PyTorch: small-hidden and fp16 single-layer shapes take the persistent algorithms,
  // everything else standard; nothing is timed).
  std::string cudnn_algo = "heuristic";
  // F32 data may use TF32 tensor cores (torch.backends.cudnn.allow_tf32). bf16/f16 data always
  // uses tensor cores with fp32 accumulation. The math modes are PyTorch's (see lstm_cudnn.cpp).
  bool allow_tf32 = false;
  // For Algo::Cudnn: replay cuDNN's work as CUDA graphs. A call's cuDNN work (an inference
  // forward, a training forward, a backward) is captured once, and later calls with the same
  // shape, lengths and buffers (h0/c0, outputs, gradients, weight buffer) replay it with one graph
  // launch, which saves the host's time to issue cuDNN's per-step kernels (what small batches and
  // hidden sizes over many steps wait for) and closes the gaps between them. x and d_output may be
  // any buffers: they are copied into the graph's own input buffers first (one device copy of
  // each per call, and of x again in the backward). Results are the same bits as without graphs
  // (same kernels).
  // "auto" (the default): three eager calls with a shape (after its first) are measured; graphs
  //   are tried when the host took at least half as long to issue a call as the GPU took to run
  //   it, or when the copies are at most 5% of the GPU's time (counted at 80% of the device's
  //   memory bandwidth; cuda_graphs_first_look in cudnn/lstm_cudnn.hpp), and kept when the fastest of three
  //   replays took no longer than the fastest eager call (GPU time, waiting for the host
  //   included);
  // "on": replay from the second call with a shape (the first is the warm-up);
  // "off": never.
  // A shape whose capture fails, or whose buffers change on most calls, runs without graphs, and
  // so do training calls with dropout between layers (cuDNN's dropout state lives in cuDNN).
  std::string cuda_graphs = "auto";
};
// Throws "<what>: expected auto, on or off, got '<value>'" unless value is a cuda_graphs setting.
void check_cuda_graphs(const std::string& value, const std::string& what);

// A new backend instance (owning its descriptors, plans and workspaces) for spec/dtype/device.
// Throws with the reason when the chosen algorithm does not support the case, e.g. a cuDNN
// persistent algorithm that rejects the hidden size names the limit.
std::unique_ptr<LstmBackend> make_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                               Device device);
// cuDNN's algorithm names, in cuDNN's order: standard, persist_static, persist_dynamic,
// persist_static_small_h.
std::vector<std::string> cudnn_algo_names();
// Algorithms built into this binary, e.g. {Reference} on a CPU-only build.
std::vector<Algo> available_algos();

// Checks x / lengths / h0 / c0 against spec; throws naming what was expected and what was given.
// Returns (T, B).
std::pair<int64_t, int64_t> check_lstm_input(const LstmSpec& spec, const LstmInput& in,
                                             const std::vector<Tensor>& weights);

// PyTorch's default initialisation: every parameter ~ U(-1/sqrt(H), 1/sqrt(H)).
void lstm_init_weights(const LstmSpec& spec, std::vector<Tensor>& weights, Rng& rng);

}  // namespace lstm
