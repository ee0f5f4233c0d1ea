#include "lstm/layers.hpp"

#include <cmath>
#include <initializer_list>
#include <optional>
#include <sstream>

#include "cpu/ops.hpp"

namespace lstm {

const char* signal_kind_name(SignalKind k) {
  switch (k) {
    case SignalKind::Tokens: return "tokens";
    case SignalKind::Sequence: return "sequence";
    case SignalKind::Vector: return "vector";
  }
  return "?";
}

std::string Signal::str() const {
  std::ostringstream os;
  if (kind == SignalKind::Tokens)
    os << "tokens from a vocabulary of " << features;
  else
    os << signal_kind_name(kind) << " of " << features << " features";
  return os.str();
}

namespace {

using nlohmann::json;

// Runs f.template operator()<T>() with T the C++ type of a floating dtype the layers compute in.
template <class F>
void with_float_type(DType dt, F&& f) {
  if (dt == DType::F64)
    f.template operator()<double>();
  else if (dt == DType::F32)
    f.template operator()<float>();
  else
    LSTM_THROW("layers compute in F32 or F64, got " << dtype_name(dt));
}

// What every layer shares: the built signals and dtype, the checks on forward inputs and
// backward gradients, and the lengths of the last forward.
class LayerBase : public Layer {
 public:
  Signal build(const Signal& in, DType dtype) override {
    LSTM_REQUIRE(dtype == DType::F32 || dtype == DType::F64,
                 describe() << ": parameters and activations must be F32 or F64, got " << dtype_name(dtype));
    // A token signal may leave its vocabulary size unknown (0); every other signal needs features.
    LSTM_REQUIRE(in.features > 0 || (in.kind == SignalKind::Tokens && in.features == 0),
                 describe() << ": input " << in.str() << " has no features");
    in_ = in;
    dtype_ = dtype;
    out_ = build_impl(in);
    built_ = true;
    saved_ = false;
    return out_;
  }

  // Layers without parameters only record where they run.
  void place(const Placement& p) override {
    LSTM_REQUIRE(p.device == Device::CPU, describe() << ": the GPU path of this layer is not built yet");
    placement_ = p;
  }

 protected:
  Placement placement_;
  virtual Signal build_impl(const Signal& in) = 0;

  void require_kind(const Signal& in, std::initializer_list<SignalKind> kinds) const {
    for (SignalKind k : kinds)
      if (in.kind == k) return;
    std::ostringstream want;
    const char* sep = "";
    for (SignalKind k : kinds) {
      want << sep << (k == SignalKind::Tokens ? "" : "a ") << signal_kind_name(k);
      sep = " or ";
    }
    LSTM_THROW(describe() << ": expected " << want.str() << " as input, got " << in.str());
  }

  // Checks `in` against the built input signal; records its steps, batch and lengths.
  void check_input(const Act& in) {
    LSTM_REQUIRE(built_, describe() << ": forward() before build()");
    const std::string name = describe();
    LSTM_REQUIRE(in.data.defined(), name << ": input data is undefined");
    const Tensor& x = in.data;
    switch (in_.kind) {
      case SignalKind::Tokens:
        LSTM_REQUIRE(x.dtype() == DType::I64 && x.dim() == 2,
                     name << ": expected token ids I64 [T, B], got " << dtype_name(x.dtype()) << " "
                          << x.shape_str());
        break;
      case SignalKind::Sequence:
        LSTM_REQUIRE(x.dim() == 3 && x.size(2) == in_.features,
                     name << ": expected a sequence [T, B, " << in_.features << "], got " << x.shape_str());
        break;
      case SignalKind::Vector:
        LSTM_REQUIRE(x.dim() == 2 && x.size(1) == in_.features,
                     name << ": expected a vector [B, " << in_.features << "], got " << x.shape_str());
        break;
    }
    if (in_.kind != SignalKind::Tokens)
      LSTM_REQUIRE(x.dtype() == dtype_,
                   name << ": expected " << dtype_name(dtype_) << " input, got " << dtype_name(x.dtype()));
    if (in_.kind == SignalKind::Vector) {
      steps_ = 1;
      batch_ = x.size(0);
    } else {
      steps_ = x.size(0);
      batch_ = x.size(1);
    }
    LSTM_REQUIRE(in.lengths.empty() || static_cast<int64_t>(in.lengths.size()) == batch_,
                 name << ": expected " << batch_ << " lengths (one per sequence), got " << in.lengths.size());
    if (in_.kind != SignalKind::Vector) {
      for (size_t b = 0; b < in.lengths.size(); ++b)
        LSTM_REQUIRE(in.lengths[b] >= 1 && in.lengths[b] <= steps_,
                     name << ": length " << in.lengths[b] << " of sequence " << b << " is outside [1, " << steps_
                          << "]");
    }
    lengths_ = in.lengths;
    // Padding work is skipped when every sequence is full.
    padded_ = false;
    if (in_.kind != SignalKind::Vector)
      for (int64_t l : lengths_) padded_ = padded_ || l < steps_;
  }

  // Call at the end of forward: a training forward enables backward for `out`'s shape.
  void finish_forward(const Tensor& out, bool training) {
    saved_ = training;
    out_shape_ = out.shape();
  }

  void check_grad(const Act& g) const {
    const std::string name = describe();
    LSTM_REQUIRE(saved_, name << ": backward() needs a training-mode forward() first (the last forward was "
                              << (built_ ? "in eval mode or absent" : "never run; the layer is not built") << ")");
    LSTM_REQUIRE(g.data.defined(), name << ": backward() got an undefined gradient");
    LSTM_REQUIRE(g.data.shape() == out_shape_, name << ": gradient shape " << g.data.shape_str()
                                                    << " does not match the last forward's output "
                                                    << shape_str(out_shape_));
    LSTM_REQUIRE(g.data.dtype() == dtype_,
                 name << ": expected an " << dtype_name(dtype_) << " gradient, got " << dtype_name(g.data.dtype()));
    LSTM_REQUIRE(g.lengths.empty() || g.lengths == lengths_,
                 name << ": gradient lengths differ from the last forward's lengths");
  }

  // Lengths as a pointer for the kernels: null when no row is padded.
  const int64_t* pad_lengths() const { return padded_ ? lengths_.data() : nullptr; }

  Signal in_, out_;
  DType dtype_ = DType::F32;
  bool built_ = false;
  bool saved_ = false;
  bool padded_ = false;
  int64_t steps_ = 0, batch_ = 0;
  std::vector<int64_t> lengths_;
  Shape out_shape_;
};

// ---- Embedding ---------------------------------------------------------------------------------

class Embedding final : public LayerBase {
 public:
  Embedding(int64_t num, int64_t dim, int64_t padding_idx) : num_(num), dim_(dim), padding_idx_(padding_idx) {
    LSTM_REQUIRE(num > 0, "Embedding: num_embeddings must be positive, got " << num);
    LSTM_REQUIRE(dim > 0, "Embedding: embedding_dim must be positive, got " << dim);
    LSTM_REQUIRE(padding_idx == -1 || (padding_idx >= 0 && padding_idx < num),
                 "Embedding: padding_idx must be -1 (none) or in [0, " << num << "), got " << padding_idx);
  }

  std::string kind() const override { return "embedding"; }
  json to_json() const override {
    return {{"type", "embedding"}, {"num_embeddings", num_}, {"embedding_dim", dim_}, {"padding_idx", padding_idx_}};
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "Embedding(" << num_ << ", " << dim_;
    if (padding_idx_ >= 0) os << ", padding_idx=" << padding_idx_;
    os << ")";
    return os.str();
  }

  void init(Rng& rng) override {
    LSTM_REQUIRE(built_, describe() << ": init() before build()");
    rng.fill_normal(weight_.value, 0.0, 1.0);
    if (padding_idx_ >= 0)
      for (int64_t j = 0; j < dim_; ++j) weight_.value.set(padding_idx_ * dim_ + j, 0.0);
  }

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t n = steps_ * batch_;
    const int64_t* tok = in.data.data<int64_t>();
    // Ids of padded positions become -1 so that the kernels skip them; only real tokens are checked.
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t t = 0; t < steps_; ++t)
      for (int64_t b = 0; b < batch_; ++b) {
        const int64_t r = t * batch_ + b;
        if (!lengths_.empty() && t >= lengths_[b]) {
          ids[r] = -1;
          continue;
        }
        LSTM_REQUIRE(tok[r] >= 0 && tok[r] < num_,
                     describe() << ": token id " << tok[r] << " at step " << t << ", sequence " << b
                                << " is outside the vocabulary [0, " << num_ << ")");
        ids[r] = tok[r];
      }
    Tensor y = Tensor::empty({steps_, batch_, dim_}, dtype_);
    with_float_type(dtype_, [&]<class T>() {
      cpu::embedding_gather<T>(ids.data(), weight_.value.data<T>(), y.data<T>(), n, dim_);
    });
    if (training)
      ids_ = std::move(ids);
    else
      ids_.clear();
    finish_forward(y, training);
    return {y, in.lengths};
  }

  Act backward(const Act& g) override {
    check_grad(g);
    with_float_type(dtype_, [&]<class T>() {
      cpu::embedding_scatter_add<T>(ids_.data(), g.data.data<T>(), weight_.grad.data<T>(),
                                    static_cast<int64_t>(ids_.size()), dim_, padding_idx_);
    });
    return {Tensor(), lengths_};
  }

  std::vector<Param> params() override { return {weight_}; }

 protected:
  Signal build_impl(const Signal& in) override {
    require_kind(in, {SignalKind::Tokens});
    LSTM_REQUIRE(in.features <= num_, describe() << ": the input's vocabulary of " << in.features
                                                 << " tokens does not fit in " << num_ << " embeddings");
    weight_ = {"weight", Tensor::zeros({num_, dim_}, dtype_), Tensor::zeros({num_, dim_}, dtype_)};
    return {SignalKind::Sequence, dim_};
  }

 private:
  int64_t num_, dim_, padding_idx_;
  Param weight_;
  std::vector<int64_t> ids_;
};

// ---- Dense -------------------------------------------------------------------------------------

class Dense final : public LayerBase {
 public:
  Dense(int64_t out, bool bias) : out_features_(out), bias_(bias) {
    LSTM_REQUIRE(out > 0, "Dense: out_features must be positive, got " << out);
  }

  std::string kind() const override { return "dense"; }
  json to_json() const override { return {{"type", "dense"}, {"out_features", out_features_}, {"bias", bias_}}; }
  std::string describe() const override {
    std::ostringstream os;
    os << "Dense(";
    if (in_features_ > 0)
      os << in_features_;
    else
      os << "?";
    os << " -> " << out_features_ << (bias_ ? "" : ", no bias") << ")";
    return os.str();
  }

  void init(Rng& rng) override {
    LSTM_REQUIRE(built_, describe() << ": init() before build()");
    // nn.Linear's kaiming_uniform_(a=sqrt(5)) and its bias init both reduce to this bound.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
    rng.fill_uniform(weight_.value, -bound, bound);
    if (bias_) rng.fill_uniform(bias_p_.value, -bound, bound);
  }

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t n = in.data.numel() / in_features_;
    Shape ys = in.data.shape();
    ys.back() = out_features_;
    Tensor y = Tensor::empty(ys, dtype_);
    const bool seq = in_.kind == SignalKind::Sequence;
    with_float_type(dtype_, [&]<class T>() {
      cpu::dense_forward<T>(in.data.data<T>(), weight_.value.data<T>(), bias_ ? bias_p_.value.data<T>() : nullptr,
                            y.data<T>(), n, in_features_, out_features_);
      if (seq) cpu::zero_past_lengths<T>(y.data<T>(), pad_lengths(), steps_, batch_, out_features_);
    });
    x_ = Tensor();
    if (training) {
      x_ = in.data;
      // Padded input rows may hold anything (NaN too); zeroed they cannot leak into dW.
      if (seq && padded_) {
        x_ = in.data.clone();
        with_float_type(dtype_, [&]<class T>() {
          cpu::zero_past_lengths<T>(x_.data<T>(), lengths_.data(), steps_, batch_, in_features_);
        });
      }
    }
    finish_forward(y, training);
    return {y, in.lengths};
  }

  Act backward(const Act& g) override {
    check_grad(g);
    const int64_t n = x_.numel() / in_features_;
    Tensor dy = g.data;
    const bool seq = in_.kind == SignalKind::Sequence;
    Tensor dx = Tensor::empty(x_.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      // The gradient of padded outputs is ignored, not trusted to be zero.
      if (seq && padded_) {
        dy = g.data.clone();
        cpu::zero_past_lengths<T>(dy.data<T>(), lengths_.data(), steps_, batch_, out_features_);
      }
      cpu::dense_backward<T>(x_.data<T>(), weight_.value.data<T>(), dy.data<T>(), dx.data<T>(),
                             weight_.grad.data<T>(), bias_ ? bias_p_.grad.data<T>() : nullptr, n, in_features_,
                             out_features_);
    });
    return {dx, lengths_};
  }

  std::vector<Param> params() override {
    if (bias_) return {weight_, bias_p_};
    return {weight_};
  }

 protected:
  Signal build_impl(const Signal& in) override {
    require_kind(in, {SignalKind::Sequence, SignalKind::Vector});
    in_features_ = in.features;
    weight_ = {"weight", Tensor::zeros({out_features_, in_features_}, dtype_),
               Tensor::zeros({out_features_, in_features_}, dtype_)};
    if (bias_) bias_p_ = {"bias", Tensor::zeros({out_features_}, dtype_), Tensor::zeros({out_features_}, dtype_)};
    return {in.kind, out_features_};
  }

 private:
  int64_t out_features_;
  bool bias_;
  int64_t in_features_ = 0;
  Param weight_, bias_p_;
  Tensor x_;
};

// ---- Dropout -----------------------------------------------------------------------------------

class Dropout final : public LayerBase {
 public:
  explicit Dropout(double p) : p_(p) {
    LSTM_REQUIRE(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got " << p);
  }

  std::string kind() const override { return "dropout"; }
  json to_json() const override { return {{"type", "dropout"}, {"p", p_}}; }
  std::string describe() const override {
    std::ostringstream os;
    os << "Dropout(p=" << p_ << ")";
    return os.str();
  }
  void init(Rng&) override {}

  Act forward(const Act& in, bool training, Rng& rng) override {
    check_input(in);
    mask_ = Tensor();
    if (!training || p_ == 0.0) {
      finish_forward(in.data, training);
      return in;
    }
    const int64_t n = in.data.numel();
    mask_ = Tensor::empty(in.data.shape(), dtype_);
    Tensor y = Tensor::empty(in.data.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      cpu::dropout_mask<T>(rng, mask_.data<T>(), n, p_);
      cpu::mul<T>(in.data.data<T>(), mask_.data<T>(), y.data<T>(), n);
      if (in_.kind == SignalKind::Sequence)
        cpu::zero_past_lengths<T>(y.data<T>(), pad_lengths(), steps_, batch_, in_.features);
    });
    finish_forward(y, training);
    return {y, in.lengths};
  }

  Act backward(const Act& g) override {
    check_grad(g);
    Tensor dx = g.data.clone();
    with_float_type(dtype_, [&]<class T>() {
      if (mask_.defined()) cpu::mul<T>(g.data.data<T>(), mask_.data<T>(), dx.data<T>(), dx.numel());
      if (in_.kind == SignalKind::Sequence)
        cpu::zero_past_lengths<T>(dx.data<T>(), pad_lengths(), steps_, batch_, in_.features);
    });
    return {dx, lengths_};
  }

 protected:
  Signal build_impl(const Signal& in) override {
    require_kind(in, {SignalKind::Sequence, SignalKind::Vector});
    return in;
  }

 private:
  double p_;
  Tensor mask_;
};

// ---- Activation --------------------------------------------------------------------------------

class Activation final : public LayerBase {
 public:
  explicit Activation(const std::string& fn) : fn_(fn) {
    LSTM_REQUIRE(fn == "relu" || fn == "tanh", "activation: unknown fn \"" << fn << "\"; expected \"relu\" or \"tanh\"");
  }

  std::string kind() const override { return "activation"; }
  json to_json() const override { return {{"type", "activation"}, {"fn", fn_}}; }
  std::string describe() const override { return fn_ == "relu" ? "ReLU" : "Tanh"; }
  void init(Rng&) override {}

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t n = in.data.numel();
    Tensor y = Tensor::empty(in.data.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      if (fn_ == "relu")
        cpu::relu_forward<T>(in.data.data<T>(), y.data<T>(), n);
      else
        cpu::tanh_forward<T>(in.data.data<T>(), y.data<T>(), n);
      if (in_.kind == SignalKind::Sequence)
        cpu::zero_past_lengths<T>(y.data<T>(), pad_lengths(), steps_, batch_, in_.features);
    });
    y_ = training ? y : Tensor();
    finish_forward(y, training);
    return {y, in.lengths};
  }

  Act backward(const Act& g) override {
    check_grad(g);
    const int64_t n = y_.numel();
    Tensor dx = Tensor::empty(y_.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      if (fn_ == "relu")
        cpu::relu_backward<T>(y_.data<T>(), g.data.data<T>(), dx.data<T>(), n);
      else
        cpu::tanh_backward<T>(y_.data<T>(), g.data.data<T>(), dx.data<T>(), n);
      // tanh'(0) = 1, so padded rows need zeroing even though their outputs are zero.
      if (in_.kind == SignalKind::Sequence)
        cpu::zero_past_lengths<T>(dx.data<T>(), pad_lengths(), steps_, batch_, in_.features);
    });
    return {dx, lengths_};
  }

 protected:
  Signal build_impl(const Signal& in) override {
    require_kind(in, {SignalKind::Sequence, SignalKind::Vector});
    return in;
  }

 private:
  std::string fn_;
  Tensor y_;
};

// ---- LastStep ----------------------------------------------------------------------------------

class LastStep final : public LayerBase {
 public:
  std::string kind() const override { return "last_step"; }
  json to_json() const override { return {{"type", "last_step"}}; }
  std::string describe() const override { return "LastStep"; }
  void init(Rng&) override {}

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t f = in_.features;
    Tensor y = Tensor::empty({batch_, f}, dtype_);
    with_float_type(dtype_, [&]<class T>() {
      cpu::last_step_gather<T>(in.data.data<T>(), lengths_.empty() ? nullptr : lengths_.data(), y.data<T>(), steps_,
                               batch_, f);
    });
    finish_forward(y, training);
    return {y, in.lengths};
  }

  Act backward(const Act& g) override {
    check_grad(g);
    const int64_t f = in_.features;
    Tensor dx = Tensor::empty({steps_, batch_, f}, dtype_);
    with_float_type(dtype_, [&]<class T>() {
      cpu::last_step_scatter<T>(g.data.data<T>(), lengths_.empty() ? nullptr : lengths_.data(), dx.data<T>(), steps_,
                                batch_, f);
    });
    return {dx, lengths_};
  }

 protected:
  Signal build_impl(const Signal& in) override {
    require_kind(in, {SignalKind::Sequence});
    return {SignalKind::Vector, in.features};
  }
};

// ---- JSON --------------------------------------------------------------------------------------

[[noreturn]] void bad_field(const json& j, const char* key, const std::string& what) {
  LSTM_THROW("layer JSON " << j.dump() << ": field \"" << key << "\" " << what);
}

const json* find_field(const json& j, const char* key, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) bad_field(j, key, "is required but missing");
    return nullptr;
  }
  return &*it;
}

int64_t get_int(const json& j, const char* key, std::optional<int64_t> def) {
  const json* v = find_field(j, key, !def.has_value());
  if (!v) return *def;
  if (v->is_number_integer()) return v->get<int64_t>();
  // 3.0 is an integer written by a tool that knows only floats; 3.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<int64_t>(d);
  }
  bad_field(j, key, "must be an integer, got " + v->dump());
}

double get_number(const json& j, const char* key, std::optional<double> def) {
  const json* v = find_field(j, key, !def.has_value());
  if (!v) return *def;
  if (!v->is_number()) bad_field(j, key, "must be a number, got " + v->dump());
  return v->get<double>();
}

bool get_bool(const json& j, const char* key, std::optional<bool> def) {
  const json* v = find_field(j, key, !def.has_value());
  if (!v) return *def;
  if (!v->is_boolean()) bad_field(j, key, "must be true or false, got " + v->dump());
  return v->get<bool>();
}

std::string get_string(const json& j, const char* key, std::optional<std::string> def) {
  const json* v = find_field(j, key, !def.has_value());
  if (!v) return *def;
  if (!v->is_string()) bad_field(j, key, "must be a string, got " + v->dump());
  return v->get<std::string>();
}

// A misspelt optional field would otherwise be silently replaced by its default.
void reject_unknown_fields(const json& j, std::initializer_list<const char*> known) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string names;
      for (const char* k : known) names += std::string(names.empty() ? "" : ", ") + "\"" + k + "\"";
      LSTM_THROW("layer JSON " << j.dump() << ": unknown field \"" << it.key() << "\"; this layer accepts " << names);
    }
  }
}

}  // namespace

std::unique_ptr<Layer> make_embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx) {
  return std::make_unique<Embedding>(num_embeddings, embedding_dim, padding_idx);
}

std::unique_ptr<Layer> make_dense(int64_t out_features, bool bias) {
  return std::make_unique<Dense>(out_features, bias);
}

std::unique_ptr<Layer> make_dropout(double p) { return std::make_unique<Dropout>(p); }

std::unique_ptr<Layer> make_activation(const std::string& fn) { return std::make_unique<Activation>(fn); }

std::unique_ptr<Layer> make_last_step() { return std::make_unique<LastStep>(); }

std::unique_ptr<Layer> layer_from_json(const json& j) {
  LSTM_REQUIRE(j.is_object(), "layer JSON must be an object, got " << j.dump());
  const std::string type = get_string(j, "type", std::nullopt);
  if (type == "embedding") {
    reject_unknown_fields(j, {"type", "num_embeddings", "embedding_dim", "padding_idx"});
    return make_embedding(get_int(j, "num_embeddings", std::nullopt), get_int(j, "embedding_dim", std::nullopt),
                          get_int(j, "padding_idx", -1));
  }
  if (type == "dense") {
    reject_unknown_fields(j, {"type", "out_features", "bias"});
    return make_dense(get_int(j, "out_features", std::nullopt), get_bool(j, "bias", true));
  }
  if (type == "dropout") {
    reject_unknown_fields(j, {"type", "p"});
    return make_dropout(get_number(j, "p", std::nullopt));
  }
  if (type == "activation") {
    reject_unknown_fields(j, {"type", "fn"});
    return make_activation(get_string(j, "fn", std::nullopt));
  }
  if (type == "last_step") {
    reject_unknown_fields(j, {"type"});
    return make_last_step();
  }
  if (type == "lstm") {
    reject_unknown_fields(j, {"type", "input_size", "hidden_size", "num_layers", "bidirectional", "proj_size", "bias",
                              "dropout", "output", "algo"});
    LstmSpec spec;
    spec.hidden_size = get_int(j, "hidden_size", std::nullopt);
    spec.num_layers = get_int(j, "num_layers", 1);
    spec.bidirectional = get_bool(j, "bidirectional", false);
    spec.proj_size = get_int(j, "proj_size", 0);
    spec.bias = get_bool(j, "bias", true);
    spec.dropout = get_number(j, "dropout", 0.0);
    spec.input_size = get_int(j, "input_size", 0);
    return make_lstm(spec, get_string(j, "output", "sequence"), algo_from_name(get_string(j, "algo", "reference")));
  }
  LSTM_THROW("layer JSON " << j.dump() << ": unknown type \"" << type
                           << "\"; expected embedding, lstm, dense, dropout, activation or last_step");
}

}  // namespace lstm
