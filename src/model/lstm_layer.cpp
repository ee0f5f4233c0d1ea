// The LSTM as a Layer: owns nn.LSTM's parameters, delegates the computation to an LstmBackend.
#include <cmath>
#include <cstring>

#include "lstm/layers.hpp"

namespace lstm {
namespace {

class LstmLayer final : public Layer {
 public:
  LstmLayer(const LstmSpec& spec, std::string output, Algo algo) : spec_(spec), output_(std::move(output)), algo_(algo) {
    LSTM_REQUIRE(output_ == "sequence" || output_ == "h_n",
                 "lstm layer: output must be \"sequence\" or \"h_n\", got \"" << output_ << "\"");
    LSTM_REQUIRE(!spec_.batch_first, "lstm layer: inside a model sequences are sequence-major; batch_first must be false");
  }
  std::string kind() const override { return "lstm"; }
  nlohmann::json to_json() const override {
    return {{"type", "lstm"},           {"input_size", spec_.input_size}, {"hidden_size", spec_.hidden_size},
            {"num_layers", spec_.num_layers}, {"bidirectional", spec_.bidirectional}, {"proj_size", spec_.proj_size},
            {"bias", spec_.bias},       {"dropout", spec_.dropout},       {"output", output_},
            {"algo", algo_name(algo_)}};
  }
  Signal build(const Signal& in, DType dtype) override {
    LSTM_REQUIRE(in.kind == SignalKind::Sequence, "expected a sequence input, got " << in.str());
    LSTM_REQUIRE(spec_.input_size == 0 || spec_.input_size == in.features,
                 "expected input_size " << spec_.input_size << ", got a sequence of " << in.features << " features");
    spec_.input_size = in.features;
    spec_.validate();
    LSTM_REQUIRE(dtype == DType::F32 || dtype == DType::F64, "parameters must be F32 or F64, got " << dtype_name(dtype));
    weights_.clear();
    grads_.clear();
    for (const auto& n : spec_.param_names()) {
      weights_.push_back(Tensor::zeros(spec_.param_shape(n), dtype));
      grads_.push_back(Tensor::zeros(spec_.param_shape(n), dtype));
    }
    dtype_ = dtype;
    return {output_ == "h_n" ? SignalKind::Vector : SignalKind::Sequence, spec_.directions() * spec_.out_size()};
  }
  void init(Rng& rng) override { lstm_init_weights(spec_, weights_, rng); }

  Act forward(const Act& in, bool training, Rng& rng) override {
    LstmBackend& be = lstm_backend(algo_, spec_, in.data.dtype(), Device::CPU);
    LstmInput li{in.data, in.lengths, {}, {}};
    if (stateful_ && state_h_.defined() && state_h_.size(1) == in.data.size(1) && state_h_.dtype() == in.data.dtype()) {
      li.h0 = state_h_;
      li.c0 = state_c_;
    }
    saved_.reset();
    LstmOutput out = be.forward(spec_, weights_, li, training, &rng, training ? &saved_ : nullptr);
    if (stateful_) {
      state_h_ = out.h_n;
      state_c_ = out.c_n;
    }
    backend_ = &be;
    B_ = in.data.size(1);
    if (output_ == "sequence") return {out.output, in.lengths};
    return {last_layer_h(out.h_n), in.lengths};
  }

  Act backward(const Act& grad_out) override {
    LSTM_REQUIRE(saved_, "lstm layer: backward called without a training-mode forward");
    LstmGradOutput g;
    if (output_ == "sequence") {
      g.d_output = grad_out.data;
    } else {
      const int64_t D = spec_.directions(), Hout = spec_.out_size(), L = spec_.num_layers;
      LSTM_REQUIRE(grad_out.data.shape() == (Shape{B_, D * Hout}),
                   "lstm layer: gradient must be " << shape_str({B_, D * Hout}) << ", got " << grad_out.data.shape_str());
      g.d_h_n = Tensor::zeros({L * D, B_, Hout}, grad_out.data.dtype());
      Tensor src = grad_out.data;
      copy_last_layer(g.d_h_n, src, /*to_vector=*/false);
    }
    LstmGrads r = backend_->backward(spec_, weights_, *saved_, g, grads_);
    saved_.reset();
    return {r.d_x, grad_out.lengths};
  }

  void place(const Placement& p) override {
    LSTM_REQUIRE(p.device == Device::CPU, "lstm layer: the GPU path is not built yet");
    placement_ = p;
  }

  void set_stateful(bool on) override {
    stateful_ = on;
    state_h_ = Tensor();
    state_c_ = Tensor();
  }

  std::vector<Param> params() override {
    std::vector<Param> p;
    auto names = spec_.param_names();
    for (size_t i = 0; i < names.size(); ++i) p.push_back({names[i], weights_[i], grads_[i]});
    return p;
  }
  std::string describe() const override {
    std::string s = "LSTM(" + std::to_string(spec_.input_size) + ", " + std::to_string(spec_.hidden_size) +
                    ", num_layers=" + std::to_string(spec_.num_layers);
    if (spec_.bidirectional) s += ", bidirectional";
    if (spec_.proj_size) s += ", proj_size=" + std::to_string(spec_.proj_size);
    if (!spec_.bias) s += ", bias=False";
    if (spec_.dropout > 0) s += ", dropout=" + std::to_string(spec_.dropout);
    if (output_ == "h_n") s += ") -> h_n";
    else s += ")";
    return s;
  }

 private:
  // [L*D, B, Hout] -> [B, D*Hout] for the last layer, forward direction first.
  Tensor last_layer_h(Tensor h_n) const {
    Tensor v = Tensor::empty({h_n.size(1), spec_.directions() * spec_.out_size()}, h_n.dtype());
    copy_last_layer(h_n, v, /*to_vector=*/true);
    return v;
  }
  // Moves the last layer's rows between states [L*D, B, Hout] and a vector [B, D*Hout], one
  // row of Hout values at a time (same dtype on both sides).
  void copy_last_layer(Tensor& states, Tensor& vec, bool to_vector) const {
    const int64_t D = spec_.directions(), Hout = spec_.out_size(), L = spec_.num_layers, B = states.size(1);
    const size_t es = dtype_size(states.dtype()), row = static_cast<size_t>(Hout) * es;
    auto* st = static_cast<uint8_t*>(states.raw());
    auto* vc = static_cast<uint8_t*>(vec.raw());
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b) {
        uint8_t* sp = st + static_cast<size_t>(((L - 1) * D + d) * B + b) * row;
        uint8_t* vp = vc + static_cast<size_t>(b * D + d) * row;
        if (to_vector)
          std::memcpy(vp, sp, row);
        else
          std::memcpy(sp, vp, row);
      }
  }

  Placement placement_;
  LstmSpec spec_;
  std::string output_;
  Algo algo_;
  DType dtype_ = DType::F32;
  std::vector<Tensor> weights_, grads_;
  std::unique_ptr<LstmSaved> saved_;
  LstmBackend* backend_ = nullptr;
  int64_t B_ = 0;
  bool stateful_ = false;
  Tensor state_h_, state_c_;
};

}  // namespace

std::unique_ptr<Layer> make_lstm(const LstmSpec& spec, const std::string& output, Algo algo) {
  return std::make_unique<LstmLayer>(spec, output, algo);
}

}  // namespace lstm
