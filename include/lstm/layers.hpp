// Layers of a network: Embedding, LSTM, Dense (nn.Linear), Dropout, activations and the
// many-to-one head. Each layer has an explicit forward (saving what backward needs, when
// training) and backward (adding into its parameter gradients, returning the input gradient).
//
// What flows between layers is an Act:
//   tokens:   data I64 [T, B]            (token ids)
//   sequence: data [T, B, F]             (sequence-major, F features)
//   vector:   data [B, F]                (one vector per sequence, after a many-to-one head)
// and `lengths` (B values in [1, T]; empty = all T) travels with sequences. Rows of a sequence
// past its length are zero in every layer's output and get no gradient.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

namespace lstm {

enum class SignalKind { Tokens, Sequence, Vector };
const char* signal_kind_name(SignalKind k);

// The type of what flows between layers, checked when a model is built.
struct Signal {
  SignalKind kind = SignalKind::Sequence;
  int64_t features = 0;  // for Tokens: the vocabulary size
  std::string str() const;  // e.g. "sequence of 128 features"
};

struct Act {
  Tensor data;
  std::vector<int64_t> lengths;
};

// A parameter and its gradient (same shape and dtype). Tensors are handles: copies share storage.
struct Param {
  std::string name;  // local name, e.g. "weight", "weight_ih_l0"
  Tensor value;
  Tensor grad;
};

// Where and how a model runs. Parameters and gradients live on `device` (F32 on the GPU);
// `precision` is the compute precision on the GPU (lstm/device.hpp); on the CPU it must match
// the parameter dtype (F32 or F64). lstm.algo Auto keeps a layer's own algo when it runs on
// the device, else picks the device's default (reference on the CPU, cuDNN on the GPU); another
// lstm.algo (e.g. Onednn on the CPU) runs the LSTM layers with that backend.
struct Placement {
  Device device = Device::CPU;
  Precision precision = Precision::F32;
  LstmOptions lstm;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  // The layer's settings as JSON, e.g. {"type":"dense","out_features":10}; from_json inverts it.
  virtual nlohmann::json to_json() const = 0;
  // Checks the input signal (throws naming what was expected and given), allocates parameters
  // and gradients in `dtype` (F32 or F64) and returns the output signal.
  virtual Signal build(const Signal& in, DType dtype) = 0;
  // PyTorch's default initialisation for the equivalent module.
  virtual void init(Rng& rng) = 0;
  virtual Act forward(const Act& in, bool training, Rng& rng) = 0;
  // grad_out has the shape of the last forward's output (training mode). Adds into param grads.
  // Returns the gradient with respect to the input (data undefined for token input).
  virtual Act backward(const Act& grad_out) = 0;
  virtual std::vector<Param> params() { return {}; }
  // Moves parameters and gradients to p.device (copying values) and sets how the layer
  // computes there. Inputs to forward/backward must then be on that device (token ids may be
  // on the CPU: they are copied). Call after build().
  virtual void place(const Placement& p) = 0;
  // Streaming inference (e.g. text generation one step at a time): when on, a recurrent layer
  // starts each forward from the state the previous forward ended in; set_stateful(false) or
  // a change of batch size resets it. Stateless layers ignore it.
  virtual void set_stateful(bool on) { (void)on; }
  // Human-readable one-liner, e.g. "Dense(512 -> 10)".
  virtual std::string describe() const = 0;
  // Elements, beyond its output, that one forward (and backward, when training) of a batch of
  // `batch` sequences of `steps` steps keeps alive at once in this layer: what it saves for
  // backward, its scratch. An estimate for Model::memory_bytes; 0 for layers that keep nothing
  // but their output. Call after build().
  virtual double extra_elements(int64_t batch, int64_t steps, bool training) const {
    (void)batch, (void)steps, (void)training;
    return 0;
  }
};

// nn.Embedding(num_embeddings, embedding_dim[, padding_idx]). Token ids outside
// [0, num_embeddings) throw naming the id and the vocabulary size. Param: "weight".
// On the GPU the ids are checked on the host before they are uploaded: give them as a CPU
// tensor (ids already on the GPU are copied back for the check, which waits for the GPU).
std::unique_ptr<Layer> make_embedding(int64_t num_embeddings, int64_t embedding_dim,
                                      int64_t padding_idx = -1);
// nn.Linear(in, out) on the last dim of a sequence or vector (in is taken from the input
// signal). Params: "weight" [out, in], "bias" [out].
std::unique_ptr<Layer> make_dense(int64_t out_features, bool bias = true);
// Inverted dropout with probability p (identity when not training).
std::unique_ptr<Layer> make_dropout(double p);
// "relu", "tanh" or "sigmoid", elementwise (torch.nn.ReLU / Tanh / Sigmoid: no parameters).
// JSON: {"type": "activation", "fn": "sigmoid"}.
std::unique_ptr<Layer> make_activation(const std::string& fn);
// Many-to-one head: sequence [T, B, F] -> vector [B, F] taken at each sequence's last valid step.
std::unique_ptr<Layer> make_last_step();

// nn.LSTM over a sequence. spec.input_size is taken from the input signal when 0.
// output "sequence": the LSTM output [T, B, D*Hout]; "h_n": the last layer's final hidden state
// (both directions concatenated, forward first) as a vector [B, D*Hout].
// Params: nn.LSTM's names (weight_ih_l0, ...). `algo` picks the backend.
std::unique_ptr<Layer> make_lstm(const LstmSpec& spec, const std::string& output = "sequence",
                                 Algo algo = Algo::Reference);

// Builds a layer from its to_json() form; throws naming an unknown "type" or a bad field.
std::unique_ptr<Layer> layer_from_json(const nlohmann::json& j);

}  // namespace lstm
