#include "lstm/layers.hpp"

#include <climits>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <optional>
#include <sstream>

#include "cpu/ops.hpp"
#include "io/config_reader.hpp"
#include "lstm/checked.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cuda/layers.hpp"
#endif

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

  // Moves the parameters (values and gradients) to p.device. What the last forward saved for
  // backward lives on the old device and is dropped: backward needs a new forward.
  void place(const Placement& p) override {
    LSTM_REQUIRE(built_, describe() << ": place() before build()");
    if (p.device == Device::CUDA) {
      require_cuda(describe() + " on the GPU");
      LSTM_REQUIRE(dtype_ == DType::F32, describe() << ": on the GPU parameters and activations are F32, the layer "
                                                    << "was built with " << dtype_name(dtype_));
      LSTM_REQUIRE(p.precision != Precision::F64,
                   describe() << ": f64 runs on the CPU only; on the GPU use f32, tf32, bf16 or f16");
    }
    for (Param* prm : owned_params()) {
      prm->value = prm->value.to_device(p.device);
      prm->grad = prm->grad.to_device(p.device);
    }
    placement_ = p;
    saved_ = false;
    drop_saved();
  }

 protected:
  Placement placement_;
  virtual Signal build_impl(const Signal& in) = 0;
  // The layer's own Param members, for place() to move.
  virtual std::vector<Param*> owned_params() { return {}; }
  // Releases what forward saved for backward.
  virtual void drop_saved() {}

  bool on_gpu() const { return placement_.device == Device::CUDA; }

  // Runs a CPU initialiser (Rng draws on the host) on a parameter wherever it lives: on the GPU
  // the values are drawn into a host tensor and copied, so a seed gives the same weights on both.
  static void init_param(Tensor& value, const std::function<void(Tensor&)>& fill) {
    if (value.device() == Device::CPU) {
      fill(value);
      return;
    }
    Tensor h = Tensor::empty(value.shape(), value.dtype());
    fill(h);
    value.copy_(h);
  }

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
    if (in_.kind != SignalKind::Tokens) {
      LSTM_REQUIRE(x.dtype() == dtype_,
                   name << ": expected " << dtype_name(dtype_) << " input, got " << dtype_name(x.dtype()));
      LSTM_REQUIRE(x.device() == placement_.device, name << ": the input is on the " << device_name(x.device())
                                                         << ", the layer on the " << device_name(placement_.device)
                                                         << " (place() moves a layer)");
    }
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
    LSTM_REQUIRE(g.data.device() == placement_.device, name << ": the gradient is on the "
                                                            << device_name(g.data.device()) << ", the layer on the "
                                                            << device_name(placement_.device));
    LSTM_REQUIRE(g.lengths.empty() || g.lengths == lengths_,
                 name << ": gradient lengths differ from the last forward's lengths");
  }

  // Lengths as a pointer for the kernels: null when no row is padded.
  const int64_t* pad_lengths() const { return padded_ ? lengths_.data() : nullptr; }

#if LSTM_HAVE_CUDA
  static float* fp(Tensor& t) { return static_cast<float*>(t.raw()); }
  static const float* fp(const Tensor& t) { return static_cast<const float*>(t.raw()); }

  // pad_lengths() on the device (int32): uploaded when they differ from the last upload, so a
  // loop of equal batches uploads once. Stream order keeps earlier kernels reading the old values.
  const int32_t* gpu_lengths() {
    if (!padded_) return nullptr;
    std::vector<int32_t> l(lengths_.begin(), lengths_.end());
    const size_t bytes = l.size() * sizeof(int32_t);
    if (l != gpu_lengths_host_ || gpu_lengths_.size() < bytes) {
      gpu_lengths_.ensure(bytes);
      cuda::upload_async(gpu_lengths_.get(), l.data(), bytes);
      gpu_lengths_host_ = std::move(l);
    }
    return gpu_lengths_.as<int32_t>();
  }

  // The rows of the current input (or output) with `features` values each.
  cuda::Rows gpu_rows(int64_t features) {
    cuda::Rows r;
    r.rows = in_.kind == SignalKind::Vector ? batch_ : steps_ * batch_;
    r.features = features;
    r.batch = batch_ > 0 ? batch_ : 1;
    r.lengths = in_.kind == SignalKind::Vector ? nullptr : gpu_lengths();
    return r;
  }

  cuda::DeviceBuffer gpu_lengths_;
  std::vector<int32_t> gpu_lengths_host_;
#endif

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
    init_param(weight_.value, [&](Tensor& w) {
      rng.fill_normal(w, 0.0, 1.0);
      if (padding_idx_ >= 0)
        for (int64_t j = 0; j < dim_; ++j) w.set(padding_idx_ * dim_ + j, 0.0);
    });
  }

  // Token ids may be on the CPU or the GPU wherever the layer runs. They are checked on the host
  // (an id outside the vocabulary throws naming it, as on the CPU), so ids on the GPU are first
  // copied to the host, which waits for the engine stream: a training loop should pass host ids,
  // which are checked and then copied to the GPU without waiting.
  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t n = steps_ * batch_;
    std::vector<int64_t> ids = resolve_ids(in.data);
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      // int32 ids halve the upload.
      LSTM_REQUIRE(num_ <= INT32_MAX, describe() << ": the GPU path takes at most " << INT32_MAX << " embeddings");
      std::vector<int32_t> ids32(ids.begin(), ids.end());
      const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
      gpu_ids_.ensure(bytes);
      cuda::upload_async(gpu_ids_.get(), ids32.data(), bytes);
      Tensor y = Tensor::empty({steps_, batch_, dim_}, dtype_, Device::CUDA);
      cuda::embedding_gather(gpu_ids_.as<int32_t>(), fp(weight_.value), fp(y), n, dim_);
      finish_forward(y, training);
      return {y, in.lengths};
    }
#endif
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      // The ids of the last (training) forward are still in gpu_ids_: forward overwrites them only
      // in a later forward, and stream order runs this scatter before that upload.
      cuda::embedding_scatter_add(gpu_ids_.as<int32_t>(), fp(g.data), fp(weight_.grad), steps_ * batch_, dim_,
                                  padding_idx_);
      return {Tensor(), lengths_};
    }
#endif
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

  std::vector<Param*> owned_params() override { return {&weight_}; }
  void drop_saved() override { ids_.clear(); }

 private:
  // Ids of padded positions become -1 so that the kernels skip them; only real tokens are checked.
  std::vector<int64_t> resolve_ids(const Tensor& data) const {
    const Tensor host = data.device() == Device::CPU ? data : data.cpu();
    const int64_t* tok = host.data<int64_t>();
    std::vector<int64_t> ids(static_cast<size_t>(steps_ * batch_));
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
    return ids;
  }

  int64_t num_, dim_, padding_idx_;
  Param weight_;
  std::vector<int64_t> ids_;
#if LSTM_HAVE_CUDA
  cuda::DeviceBuffer gpu_ids_;
#endif
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
    init_param(weight_.value, [&](Tensor& w) { rng.fill_uniform(w, -bound, bound); });
    if (bias_) init_param(bias_p_.value, [&](Tensor& b) { rng.fill_uniform(b, -bound, bound); });
  }

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
    const int64_t n = in.data.numel() / in_features_;
    Shape ys = in.data.shape();
    ys.back() = out_features_;
#if LSTM_HAVE_CUDA
    if (on_gpu()) return forward_gpu(in, training, n, ys);
#endif
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) return backward_gpu(g, n);
#endif
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

  std::vector<Param*> owned_params() override {
    if (bias_) return {&weight_, &bias_p_};
    return {&weight_};
  }
  void drop_saved() override { x_ = Tensor(); }

 private:
#if LSTM_HAVE_CUDA
  // cuBLASLt with the bias in the epilogue. Padded rows: a training forward multiplies a copy
  // of x with them zeroed (kept for dW, where NaN there would leak); the output's padded rows
  // are then zeroed.
  Act forward_gpu(const Act& in, bool training, int64_t n, const Shape& ys) {
    const bool seq = in_.kind == SignalKind::Sequence;
    Tensor y = Tensor::empty(ys, dtype_, Device::CUDA);
    Tensor x = in.data;
    if (training && seq && padded_) {
      x = Tensor::empty(in.data.shape(), dtype_, Device::CUDA);
      cuda::copy_zero_padded(fp(in.data), fp(x), gpu_rows(in_features_));
    }
    cuda::dense_forward(fp(x), fp(weight_.value), bias_ ? fp(bias_p_.value) : nullptr, fp(y), n, in_features_,
                        out_features_, placement_.precision);
    if (seq && padded_) cuda::zero_padded_rows(fp(y), gpu_rows(out_features_));
    x_ = training ? x : Tensor();
    finish_forward(y, training);
    return {y, in.lengths};
  }

  // The incoming gradient's padded rows are ignored, not trusted to be zero: the products use a
  // copy with them zeroed (the caller's tensor is never written).
  Act backward_gpu(const Act& g, int64_t n) {
    const bool seq = in_.kind == SignalKind::Sequence;
    Tensor dy = g.data;
    if (seq && padded_) {
      dy = Tensor::empty(g.data.shape(), dtype_, Device::CUDA);
      cuda::copy_zero_padded(fp(g.data), fp(dy), gpu_rows(out_features_));
    }
    Tensor dx = Tensor::empty(x_.shape(), dtype_, Device::CUDA);
    cuda::dense_backward(fp(x_), fp(weight_.value), fp(dy), fp(dx), fp(weight_.grad),
                         bias_ ? fp(bias_p_.grad) : nullptr, n, in_features_, out_features_, placement_.precision);
    return {dx, lengths_};
  }
#endif

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
    gpu_masked_ = false;
    if (!training || p_ == 0.0) {
      finish_forward(in.data, training);
      return in;
    }
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      // The mask is a hash of (seed, element index): backward recomputes it instead of reading it.
      seed_ = rng.next_u64();
      gpu_masked_ = true;
      Tensor y = Tensor::empty(in.data.shape(), dtype_, Device::CUDA);
      cuda::dropout_apply(fp(in.data), fp(y), gpu_rows(in_.features), p_, seed_, true);
      finish_forward(y, training);
      return {y, in.lengths};
    }
#endif
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      Tensor dx = Tensor::empty(g.data.shape(), dtype_, Device::CUDA);
      cuda::dropout_apply(fp(g.data), fp(dx), gpu_rows(in_.features), p_, seed_, gpu_masked_);
      return {dx, lengths_};
    }
#endif
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
  void drop_saved() override {
    mask_ = Tensor();
    gpu_masked_ = false;
  }

 private:
  double p_;
  Tensor mask_;
  [[maybe_unused]] uint64_t seed_ = 0;  // the GPU path's mask seed; unread without CUDA
  bool gpu_masked_ = false;
};

// ---- Activation --------------------------------------------------------------------------------

class Activation final : public LayerBase {
 public:
  explicit Activation(const std::string& fn) : fn_(fn) {
    LSTM_REQUIRE(fn == "relu" || fn == "tanh" || fn == "sigmoid",
                 "activation: unknown fn \"" << fn << "\"; expected \"relu\", \"tanh\" or \"sigmoid\"");
  }

  std::string kind() const override { return "activation"; }
  json to_json() const override { return {{"type", "activation"}, {"fn", fn_}}; }
  // torch.nn's module names (ReLU, Tanh, Sigmoid: none has parameters).
  std::string describe() const override { return fn_ == "relu" ? "ReLU" : fn_ == "sigmoid" ? "Sigmoid" : "Tanh"; }
  void init(Rng&) override {}

  Act forward(const Act& in, bool training, Rng&) override {
    check_input(in);
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      Tensor y = Tensor::empty(in.data.shape(), dtype_, Device::CUDA);
      cuda::activation_forward(gpu_fn(), fp(in.data), fp(y), gpu_rows(in_.features));
      y_ = training ? y : Tensor();
      finish_forward(y, training);
      return {y, in.lengths};
    }
#endif
    const int64_t n = in.data.numel();
    Tensor y = Tensor::empty(in.data.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      if (fn_ == "relu")
        cpu::relu_forward<T>(in.data.data<T>(), y.data<T>(), n);
      else if (fn_ == "sigmoid")
        cpu::sigmoid_forward<T>(in.data.data<T>(), y.data<T>(), n);
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      // Padded rows are zeroed by the kernel (tanh'(0) = 1 would pass their gradient).
      Tensor dx = Tensor::empty(y_.shape(), dtype_, Device::CUDA);
      cuda::activation_backward(gpu_fn(), fp(y_), fp(g.data), fp(dx), gpu_rows(in_.features));
      return {dx, lengths_};
    }
#endif
    const int64_t n = y_.numel();
    Tensor dx = Tensor::empty(y_.shape(), dtype_);
    with_float_type(dtype_, [&]<class T>() {
      if (fn_ == "relu")
        cpu::relu_backward<T>(y_.data<T>(), g.data.data<T>(), dx.data<T>(), n);
      else if (fn_ == "sigmoid")
        cpu::sigmoid_backward<T>(y_.data<T>(), g.data.data<T>(), dx.data<T>(), n);
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
  void drop_saved() override { y_ = Tensor(); }

 private:
#if LSTM_HAVE_CUDA
  cuda::ActFn gpu_fn() const {
    return fn_ == "relu" ? cuda::ActFn::Relu : fn_ == "sigmoid" ? cuda::ActFn::Sigmoid : cuda::ActFn::Tanh;
  }
#endif
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      Tensor y = Tensor::empty({batch_, f}, dtype_, Device::CUDA);
      cuda::last_step_gather(fp(in.data), gpu_lengths(), fp(y), steps_, batch_, f);
      finish_forward(y, training);
      return {y, in.lengths};
    }
#endif
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
#if LSTM_HAVE_CUDA
    if (on_gpu()) {
      Tensor dx = Tensor::empty({steps_, batch_, f}, dtype_, Device::CUDA);
      cuda::last_step_scatter(fp(g.data), gpu_lengths(), fp(dx), steps_, batch_, f);
      return {dx, lengths_};
    }
#endif
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

const json* find_field(const json& j, const char* key, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    LSTM_REQUIRE(!required, "layer JSON " << json_excerpt(j, 200) << ": field \"" << key << "\" is required but missing");
    return nullptr;
  }
  return &*it;
}

std::string field_name(const json& j, const char* key) {
  return "layer JSON " + json_excerpt(j, 200) + ": field \"" + key + "\"";
}

// Sizes are bounded here, before a layer multiplies them (lstm/checked.hpp says why kMaxDim).
int64_t get_int(const json& j, const char* key, std::optional<int64_t> def, int64_t lo = 1, int64_t hi = kMaxDim) {
  const json* v = find_field(j, key, !def.has_value());
  return v ? read_int(*v, field_name(j, key), lo, hi) : *def;
}

double get_number(const json& j, const char* key, std::optional<double> def) {
  const json* v = find_field(j, key, !def.has_value());
  return v ? read_number(*v, field_name(j, key), -HUGE_VAL, HUGE_VAL) : *def;
}

bool get_bool(const json& j, const char* key, std::optional<bool> def) {
  const json* v = find_field(j, key, !def.has_value());
  return v ? read_bool(*v, field_name(j, key)) : *def;
}

std::string get_string(const json& j, const char* key, std::optional<std::string> def) {
  const json* v = find_field(j, key, !def.has_value());
  return v ? read_string(*v, field_name(j, key)) : *def;
}

// A misspelt optional field would otherwise be silently replaced by its default.
void reject_unknown_fields(const json& j, std::initializer_list<const char*> known) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string names;
      for (const char* k : known) names += std::string(names.empty() ? "" : ", ") + "\"" + k + "\"";
      LSTM_THROW("layer JSON " << json_excerpt(j, 200) << ": unknown field \"" << it.key() << "\"; this layer accepts " << names);
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
  LSTM_REQUIRE(j.is_object(), "layer JSON must be an object, got " << json_excerpt(j, 200));
  const std::string type = get_string(j, "type", std::nullopt);
  if (type == "embedding") {
    reject_unknown_fields(j, {"type", "num_embeddings", "embedding_dim", "padding_idx"});
    return make_embedding(get_int(j, "num_embeddings", std::nullopt), get_int(j, "embedding_dim", std::nullopt),
                          get_int(j, "padding_idx", -1, -1));
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
    spec.num_layers = get_int(j, "num_layers", 1, 1, kMaxLayers);
    spec.bidirectional = get_bool(j, "bidirectional", false);
    spec.proj_size = get_int(j, "proj_size", 0, 0);
    spec.bias = get_bool(j, "bias", true);
    spec.dropout = get_number(j, "dropout", 0.0);
    spec.input_size = get_int(j, "input_size", 0, 0);
    return make_lstm(spec, get_string(j, "output", "sequence"), algo_from_name(get_string(j, "algo", "reference")));
  }
  LSTM_THROW("layer JSON " << json_excerpt(j, 200) << ": unknown type \"" << type
                           << "\"; expected embedding, lstm, dense, dropout, activation or last_step");
}

}  // namespace lstm
