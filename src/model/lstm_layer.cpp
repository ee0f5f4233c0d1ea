// The LSTM as a Layer: owns nn.LSTM's parameters, delegates the computation to an LstmBackend.
//
// On the GPU (place with Device::CUDA) the parameters and gradients are F32 views into one flat
// buffer laid out as the backend's weight space (flat_layout), so at f32/tf32 the backend reads
// the weights and adds the gradients in place. At bf16/f16 those F32 buffers are the master
// copies: each forward converts them into a flat half-precision weight space, and each backward's
// half-precision gradients are added into the F32 gradients. Activations arrive and leave as F32.
#include <cmath>
#include <cstring>

#include "lstm/checked.hpp"
#include "lstm/device.hpp"
#include "lstm/layers.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cudnn/lstm_cudnn_kernels.hpp"
#endif

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
    // Each tensor may fit while all of them do not (num_layers 1e6): count them all first.
    const std::string what = "the LSTM's parameters and gradients (hidden_size " + std::to_string(spec_.hidden_size) +
                             ", num_layers " + std::to_string(spec_.num_layers) + ")";
    int64_t numel = 0;
    for (const auto& n : spec_.param_names()) numel = checked_add(numel, shape_numel(spec_.param_shape(n)), what);
    require_memory(static_cast<uint64_t>(checked_mul(numel, 2 * static_cast<int64_t>(dtype_size(dtype)), what)), what);
    weights_.clear();
    grads_.clear();
    for (const auto& n : spec_.param_names()) {
      weights_.push_back(Tensor::zeros(spec_.param_shape(n), dtype));
      grads_.push_back(Tensor::zeros(spec_.param_shape(n), dtype));
    }
    dtype_ = dtype;
    return {output_ == "h_n" ? SignalKind::Vector : SignalKind::Sequence, spec_.directions() * spec_.out_size()};
  }
  double extra_elements(int64_t batch, int64_t steps, bool training) const override {
    // What the reference keeps per layer and direction (the GPU backends keep about as much in
    // their reserve space): the activated gates, the cell state before and after each step, the
    // previous hidden state and, with a projection, o * tanh(c); per layer its input (and the
    // dropout mask) and its output. Inference keeps one layer's input projections of all steps
    // and its output.
    const double BT = static_cast<double>(batch) * static_cast<double>(steps);
    const double H = static_cast<double>(spec_.hidden_size), Hout = static_cast<double>(spec_.out_size());
    const double D = static_cast<double>(spec_.directions()), L = static_cast<double>(spec_.num_layers);
    const double In0 = static_cast<double>(spec_.input_size), In = D * Hout;
    if (!training) return BT * (D * 4 * H + 2 * In);
    const double per_dir = 4 * H + 2 * H + Hout + (spec_.proj_size > 0 ? H : 0);
    const double inputs = In0 + (L - 1) * In * (spec_.dropout > 0 ? 2 : 1);
    // Backward's scratch: the gate gradients of one layer and the gradient of its input.
    return BT * (L * D * per_dir + inputs + L * In + D * 4 * H + In);
  }
  void init(Rng& rng) override {
    if (weights_.empty() || weights_[0].device() == Device::CPU) {
      lstm_init_weights(spec_, weights_, rng);
      return;
    }
    // Drawn on the CPU, so that a model initialises to the same values wherever it is placed.
    std::vector<Tensor> host;
    for (const auto& w : weights_) host.push_back(Tensor::empty(w.shape(), dtype_));
    lstm_init_weights(spec_, host, rng);
    for (size_t i = 0; i < host.size(); ++i) weights_[i].copy_(host[i]);
  }

  Act forward(const Act& in, bool training, Rng& rng) override {
#if LSTM_HAVE_CUDA
    if (placement_.device == Device::CUDA) return forward_gpu(in, training, rng);
#endif
    if (!cpu_ || cpu_->dtype() != in.data.dtype()) {
      // The placement's algorithm when it names one (e.g. --algo onednn), else the layer's own.
      LstmOptions o = placement_.lstm;
      if (o.algo == Algo::Auto) o.algo = algo_;
      cpu_ = make_lstm_backend(o, spec_, in.data.dtype(), Device::CPU);
    }
    LstmInput li{in.data, in.lengths, {}, {}};
    if (stateful_ && state_h_.defined() && state_h_.size(1) == in.data.size(1) && state_h_.dtype() == in.data.dtype()) {
      li.h0 = state_h_;
      li.c0 = state_c_;
    }
    saved_.reset();
    LstmOutput out = cpu_->forward(weights_, li, training, &rng, training ? &saved_ : nullptr, ExecContext::cpu());
    if (stateful_) {
      state_h_ = out.h_n;
      state_c_ = out.c_n;
    }
    B_ = in.data.size(1);
    if (output_ == "sequence") return {out.output, in.lengths};
    return {last_layer_h(out.h_n), in.lengths};
  }

  Act backward(const Act& grad_out) override {
    LSTM_REQUIRE(saved_, "lstm layer: backward called without a training-mode forward");
#if LSTM_HAVE_CUDA
    if (placement_.device == Device::CUDA) return backward_gpu(grad_out);
#endif
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
    LstmGrads r = cpu_->backward(weights_, *saved_, g, grads_, ExecContext::cpu());
    saved_.reset();
    return {r.d_x, grad_out.lengths};
  }

  void place(const Placement& p) override {
    LSTM_REQUIRE(!weights_.empty(), "lstm layer: place() before build()");
    saved_.reset();
    state_h_ = Tensor();
    state_c_ = Tensor();
    if (p.device == Device::CPU) {
      if (weights_[0].device() != Device::CPU) {
        for (auto* ts : {&weights_, &grads_})
          for (auto& t : *ts) {
            Tensor h = Tensor::empty(t.shape(), dtype_);
            h.copy_(t);
            t = h;
          }
      }
      drop_gpu();
      cpu_.reset();  // made anew for the placement's algorithm at the next forward
      placement_ = p;
      return;
    }
#if LSTM_HAVE_CUDA
    require_cuda("placing an LSTM layer on the GPU");
    LSTM_REQUIRE(dtype_ == DType::F32, "lstm layer: on the GPU parameters are F32 (master weights), the layer has "
                                           << dtype_name(dtype_));
    LSTM_REQUIRE(p.precision != Precision::F64, "lstm layer: f64 runs on the CPU only");
    LstmOptions o = p.lstm;
    // Auto keeps the layer's own algorithm when it runs on the GPU; the reference does not.
    if (o.algo == Algo::Auto && algo_ != Algo::Reference) o.algo = algo_;
    o.allow_tf32 = p.precision == Precision::TF32;
    const DType compute = precision_dtype(p.precision);
    std::unique_ptr<LstmBackend> be = make_lstm_backend(o, spec_, compute, Device::CUDA);
    // Master weights and gradients: F32 in the backend's F32 layout (its weight space at f32/tf32).
    layout32_ = be->flat_layout(DType::F32);
    Tensor wf = flat_buffer(layout32_, DType::F32), gf = flat_buffer(layout32_, DType::F32);
    std::vector<Tensor> w = views(wf, layout32_, DType::F32), g = views(gf, layout32_, DType::F32);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i].copy_(weights_[i]);
      g[i].copy_(grads_[i]);
    }
    drop_gpu();
    weights_ = w;
    grads_ = g;
    w_flat_ = wf;
    g_flat_ = gf;
    compute_ = compute;
    if (compute != DType::F32) {
      layout_h_ = be->flat_layout(compute);
      wh_flat_ = flat_buffer(layout_h_, compute);
      gh_flat_ = flat_buffer(layout_h_, compute);
      wh_ = views(wh_flat_, layout_h_, compute);
      gh_ = views(gh_flat_, layout_h_, compute);
      // One conversion over the whole buffer when both layouts put every tensor at the same
      // element offset.
      same_elems_ = w_flat_.defined() && wh_flat_.defined() && w_flat_.numel() == wh_flat_.numel();
      for (size_t i = 0; same_elems_ && i < layout32_.offsets.size(); ++i)
        same_elems_ = layout32_.offsets[i] / 4 == layout_h_.offsets[i] / dtype_size(compute);
    }
    gpu_ = std::move(be);
    placement_ = p;
#else
    require_cuda("placing an LSTM layer on the GPU");
#endif
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
    Tensor v = Tensor::empty({h_n.size(1), spec_.directions() * spec_.out_size()}, h_n.dtype(), h_n.device());
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
    if (states.device() == Device::CUDA) {
#if LSTM_HAVE_CUDA
      // One strided copy per direction: B rows of Hout values, D*Hout apart in the vector.
      for (int64_t d = 0; d < D; ++d) {
        uint8_t* sp = st + static_cast<size_t>(((L - 1) * D + d) * B) * row;
        uint8_t* vp = vc + static_cast<size_t>(d) * row;
        if (to_vector)
          LSTM_CUDA_CHECK(cudaMemcpy2DAsync(vp, D * row, sp, row, row, static_cast<size_t>(B),
                                            cudaMemcpyDeviceToDevice, cuda::stream()));
        else
          LSTM_CUDA_CHECK(cudaMemcpy2DAsync(sp, row, vp, D * row, row, static_cast<size_t>(B),
                                            cudaMemcpyDeviceToDevice, cuda::stream()));
      }
#endif
      return;
    }
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

#if LSTM_HAVE_CUDA
  // A zeroed flat buffer of layout.bytes (undefined when the backend has no flat layout).
  static Tensor flat_buffer(const LstmBackend::FlatLayout& layout, DType dt) {
    if (layout.offsets.empty()) return Tensor();
    return Tensor::zeros({static_cast<int64_t>(layout.bytes / dtype_size(dt))}, dt, Device::CUDA);
  }
  // Tensors of param_names() as views into `flat` at the layout's offsets (separate zeroed tensors
  // when there is no flat buffer).
  std::vector<Tensor> views(const Tensor& flat, const LstmBackend::FlatLayout& layout, DType dt) const {
    std::vector<Tensor> out;
    const auto names = spec_.param_names();
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape shape = spec_.param_shape(names[i]);
      if (!flat.defined()) {
        out.push_back(Tensor::zeros(shape, dt, Device::CUDA));
        continue;
      }
      const int64_t begin = static_cast<int64_t>(layout.offsets[i] / dtype_size(dt));
      out.push_back(flat.slice0(begin, begin + shape_numel(shape)).reshape(shape));
    }
    return out;
  }

  Act forward_gpu(const Act& in, bool training, Rng& rng) {
    LSTM_REQUIRE(in.data.device() == Device::CUDA && in.data.dtype() == DType::F32,
                 "lstm layer: placed on the GPU, expects a CUDA F32 input, got a " << device_name(in.data.device())
                                                                                   << " " << dtype_name(in.data.dtype())
                                                                                   << " tensor");
    LSTM_REQUIRE(in.data.dim() == 3, "lstm layer: expected a sequence [T, B, F], got " << in.data.shape_str());
    const std::vector<Tensor>* w = &weights_;
    if (compute_ != DType::F32) {
      if (same_elems_)
        wh_flat_.copy_(w_flat_);
      else
        for (size_t i = 0; i < wh_.size(); ++i) wh_[i].copy_(weights_[i]);
      w = &wh_;
    }
    LstmInput li{compute_ == DType::F32 ? in.data : in.data.to(compute_), in.lengths, {}, {}};
    if (stateful_ && state_h_.defined() && state_h_.size(1) == in.data.size(1) && state_h_.dtype() == compute_ &&
        state_h_.device() == Device::CUDA) {
      li.h0 = state_h_;
      li.c0 = state_c_;
    }
    saved_.reset();
    LstmOutput out = gpu_->forward(*w, li, training, &rng, training ? &saved_ : nullptr,
                                    ExecContext::current(Device::CUDA));
    if (stateful_) {
      state_h_ = out.h_n;
      state_c_ = out.c_n;
    }
    B_ = in.data.size(1);
    Tensor y = output_ == "sequence" ? out.output : last_layer_h(out.h_n);
    return {y.dtype() == DType::F32 ? y : y.to(DType::F32), in.lengths};
  }

  Act backward_gpu(const Act& grad_out) {
    LSTM_REQUIRE(grad_out.data.device() == Device::CUDA && grad_out.data.dtype() == DType::F32,
                 "lstm layer: placed on the GPU, expects a CUDA F32 gradient, got a "
                     << device_name(grad_out.data.device()) << " " << dtype_name(grad_out.data.dtype()) << " tensor");
    Tensor gd = grad_out.data.dtype() == compute_ ? grad_out.data : grad_out.data.to(compute_);
    LstmGradOutput g;
    if (output_ == "sequence") {
      g.d_output = gd;
    } else {
      const int64_t D = spec_.directions(), Hout = spec_.out_size(), L = spec_.num_layers;
      LSTM_REQUIRE(gd.shape() == (Shape{B_, D * Hout}),
                   "lstm layer: gradient must be " << shape_str({B_, D * Hout}) << ", got " << gd.shape_str());
      g.d_h_n = Tensor::zeros({L * D, B_, Hout}, compute_, Device::CUDA);
      copy_last_layer(g.d_h_n, gd, /*to_vector=*/false);
    }
    LstmGrads r;
    if (compute_ == DType::F32) {
      r = gpu_->backward(weights_, *saved_, g, grads_, ExecContext::current(Device::CUDA));
    } else {
      // The backend adds into its gradients: start them at zero, then add them into the F32 ones.
      if (gh_flat_.defined())
        gh_flat_.zero_();
      else
        for (auto& t : gh_) t.zero_();
      r = gpu_->backward(wh_, *saved_, g, gh_, ExecContext::current(Device::CUDA));
      if (same_elems_)
        cuda::add_into(g_flat_.raw(), DType::F32, gh_flat_.raw(), compute_, g_flat_.numel());
      else
        for (size_t i = 0; i < gh_.size(); ++i)
          cuda::add_into(grads_[i].raw(), DType::F32, gh_[i].raw(), compute_, gh_[i].numel());
    }
    saved_.reset();
    return {r.d_x.dtype() == DType::F32 ? r.d_x : r.d_x.to(DType::F32), grad_out.lengths};
  }
#endif

  // Forgets everything that belongs to a GPU placement (not the parameters).
  void drop_gpu() {
    gpu_.reset();
    w_flat_ = g_flat_ = wh_flat_ = gh_flat_ = Tensor();
    wh_.clear();
    gh_.clear();
    layout32_ = layout_h_ = {};
    same_elems_ = false;
    compute_ = DType::F32;
  }

  Placement placement_;
  LstmSpec spec_;
  std::string output_;
  Algo algo_;
  DType dtype_ = DType::F32;
  std::vector<Tensor> weights_, grads_;
  std::unique_ptr<LstmSaved> saved_;
  std::unique_ptr<LstmBackend> cpu_;  // the CPU backend for the dtype of the last CPU forward
  int64_t B_ = 0;
  bool stateful_ = false;
  Tensor state_h_, state_c_;
  // GPU placement: the backend, the flat F32 master buffers behind weights_/grads_, and at bf16/f16
  // the half-precision weight and gradient spaces.
  std::unique_ptr<LstmBackend> gpu_;
  DType compute_ = DType::F32;
  LstmBackend::FlatLayout layout32_, layout_h_;
  Tensor w_flat_, g_flat_, wh_flat_, gh_flat_;
  std::vector<Tensor> wh_, gh_;
  bool same_elems_ = false;
};

}  // namespace

std::unique_ptr<Layer> make_lstm(const LstmSpec& spec, const std::string& output, Algo algo) {
  return std::make_unique<LstmLayer>(spec, output, algo);
}

}  // namespace lstm
