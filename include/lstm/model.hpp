// Model: layers in sequence, in the spirit of nn.Sequential, with explicit forward/backward.
//
//   lstm::Model m;
//   m.add(lstm::make_embedding(vocab, 64))             // named "embedding"
//    .add(lstm::make_lstm({.hidden_size = 256, .num_layers = 2}))   // "lstm"
//    .add(lstm::make_dense(vocab));                    // "fc"
//   m.build({lstm::SignalKind::Tokens, vocab});       // checks every layer's shapes
//
// Parameter names are "<layer name>.<param name>", the PyTorch state_dict names of a module
// holding the same layers as attributes (embedding.weight, lstm.weight_ih_l0, fc.bias, ...).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/layers.hpp"

namespace lstm {

class Model {
 public:
  Model() = default;
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;

  // Appends a layer. An empty name gets a default: "embedding", "lstm", "fc" for dense layers,
  // or the layer kind, with a number appended from the second layer of a kind on ("fc1", ...).
  // Throws if the name is taken or has a '.'.
  Model& add(std::unique_ptr<Layer> layer, std::string name = "");
  // Checks shapes layer by layer (errors say "layer 2 'fc' (dense): expected ..., got ...") and
  // allocates parameters in dtype (F32 or F64). Call once, before anything below.
  void build(const Signal& input, DType dtype = DType::F32);
  bool built() const { return built_; }
  const Signal& input_signal() const { return input_; }
  const Signal& output_signal() const { return output_; }
  DType dtype() const { return dtype_; }

  // PyTorch default initialisation of every layer.
  void init(Rng& rng);
  // Runs every layer. training: dropout on and activations kept for backward.
  Act forward(const Act& in, bool training, Rng& rng);
  // Back through every layer; gradients are added into each Param::grad.
  Act backward(const Act& grad_out);

  // Moves every layer's parameters to p.device and sets how they compute (lstm/layers.hpp).
  // Optimizer state created before a move is not moved: place first, then train.
  void place(const Placement& p);
  const Placement& placement() const { return placement_; }

  // Streaming inference: each forward continues from the recurrent state of the previous one.
  void set_stateful(bool on) {
    for (auto& l : layers_) l->set_stateful(on);
  }

  std::vector<Param> parameters();  // full names
  void zero_grad();
  int64_t num_parameters() const;
  // An estimate of the memory one step takes on a batch of `batch` sequences of `steps` steps, in
  // bytes, with activations of `act_bytes` bytes each: parameters (and when training their
  // gradients and two optimizer buffers), every layer's output (and its gradient) and what the
  // layers keep besides (Layer::extra_elements). Computed in floating point, so any sizes give a
  // (huge) answer rather than an overflow. Used to refuse a job that cannot fit before it starts.
  double memory_bytes(int64_t batch, int64_t steps, bool training, int64_t act_bytes) const;
  // name -> value (shared handles). load_state_dict copies values in, converting dtype; strict:
  // every parameter present and nothing extra. Errors name the tensor and both shapes.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& sd, bool strict = true);

  // {"input": {"kind": "tokens", "features": V}, "dtype": "F32", "layers": [{"name":..., "type":...}]}
  nlohmann::json to_json() const;
  // Builds (and shape-checks) a model from to_json()'s form; parameters are uninitialised.
  static Model from_json(const nlohmann::json& j);
  std::string summary() const;

  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i) { return *layers_.at(i); }
  const std::string& layer_name(size_t i) const { return names_.at(i); }

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
  std::vector<Signal> outputs_;  // each layer's output signal (set by build)
  Signal input_, output_;
  DType dtype_ = DType::F32;
  bool built_ = false;
  Placement placement_;
};

// A model file is a safetensors file of the state_dict whose metadata "lstm_engine.model" holds
// to_json(); extra metadata (a vocabulary, class names) rides along.
void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& extra_metadata = {});
// Loads a model saved by save_model. Throws naming the file if its metadata lacks the model
// description or its tensors do not fit the architecture, and (unless allow_nonfinite, meant
// for inspecting a broken file) if a parameter holds NaN or Inf, naming the tensor and index.
Model load_model(const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
                 DType dtype = DType::F32, bool allow_nonfinite = false);

}  // namespace lstm
