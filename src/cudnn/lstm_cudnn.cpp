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
// CUDA graphs (LstmOptions::cuda_graphs) through cuda/graph_cache.hpp, which has the rules. A
// cache serves one kind of call (inference forward, training forward, backward data + weights)
// and one content of the data descriptors (T, lengths); its graphs are keyed on every buffer
// cuDNN bakes into its kernels' arguments: the lengths on the device, h0/c0, the outputs and
// gradients we allocate, the reserve space, the weight and weight-gradient spaces and the
// workspace; x and d_output are staged (copied, or masked past each length). Inference caches
// belong to the plan's data descriptors (new T or lengths drop them); a training call has
// descriptors of its own, so its caches live in the plan, found by kind, T and lengths.
//
// The files: cudnn_rnn.{hpp,cpp} (algorithms, descriptors, refusals, math modes, weight layout,
// data descriptors, plans), cudnn_heuristic.cpp (cudnn_algo "heuristic" and the registry's
// lines), this file (the backend: plans per shape, calls, graphs, cudnn_algo "auto").
//
// Dropout between layers uses cuDNN's own dropout (its masks live in the reserve space): the
// dropout state is seeded once from the caller's Rng on the first training forward with dropout
// and then advances inside cuDNN. GPU masks therefore differ from the CPU reference's masks (same
// probability and 1/(1-p) scaling, different random numbers).
#include "cudnn/lstm_cudnn.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <tuple>
#include <vector>

#include "cudnn/cudnn_rnn.hpp"
#include "cudnn/cudnn_util.hpp"
#include "cuda/exec.hpp"
#include "cuda/graph_cache.hpp"
#include "cuda/timing.hpp"
#include "cudnn/lstm_cudnn_kernels.hpp"
#include "lstm/device.hpp"

namespace lstm {
namespace {
using namespace cudnn;

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

// Why cuDNN's algorithm `algo` cannot run spec in dtype on device ("" when it can): host-side
// descriptor calls only, nothing runs on the GPU.
std::string unsupported(const LstmSpec& spec, DType dtype, Device device, int algo, bool allow_tf32);

class CudnnBackend final : public LstmBackend {
 public:
  CudnnBackend(const LstmSpec& spec, DType dtype, Device device, const LstmOptions& o)
      : LstmBackend(spec, dtype, device),
        options_(o),
        algo_(algo_id(o.cudnn_algo)),
        graphs_(o.cuda_graphs, "cuDNN graphs"),
        param_names_(spec.param_names()) {
    for (const auto& n : param_names_) param_shapes_.push_back(spec.param_shape(n));
  }
  ~CudnnBackend() override {
    plans_.clear();  // their graphs before the runner's capture stream
    last_plan_.reset();
  }
  CudnnBackend(const CudnnBackend&) = delete;
  CudnnBackend& operator=(const CudnnBackend&) = delete;

  Algo algo() const override { return Algo::Cudnn; }
  std::string name() const override {
    return options_.cudnn_algo == CudnnAlgo::Heuristic ? "cudnn" : std::string("cudnn:") + cudnn_algo_name(options_.cudnn_algo);
  }
  // "cudnn:<the algorithm that ran>, <replayed|eager>".
  std::string last_run() const override {
    if (!*last_algo_) return "";
    const std::string how = graphs_.last();
    return std::string("cudnn:") + last_algo_ + (how.empty() ? std::string() : ", " + how);
  }
  std::string log() const override { return auto_log_ + graphs_.log(); }
  bool settled() const override { return settled_fwd_ && settled_bwd_; }
  GraphCounts graph_counts() const override { return graphs_.counts(); }

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

    std::vector<int32_t>& len = len_;
    len.assign(static_cast<size_t>(B), static_cast<int32_t>(T));
    for (size_t b = 0; b < in.lengths.size(); ++b) len[b] = static_cast<int32_t>(in.lengths[b]);

    int a = algo_;
    if (a == kAutoAlgo) a = pick(spec, dt, T, B, len, train_mode, in, weights);
    if (a == kHeuristicAlgo) {
      bool varlen = false;
      for (int32_t l : len) varlen = varlen || l < T;
      const cudaDeviceProp& prop = cuda::device_prop();
      a = heuristic_algo(spec, dt, T, B, varlen, train_mode, prop.major, prop.minor, prop.multiProcessorCount);
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
      graphs_.ran_eager();
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
    const auto& names = param_names_;
    LSTM_REQUIRE(weights.size() == names.size() && d_weights.size() == names.size(),
                 "cuDNN LSTM backward: expected " << names.size() << " weight and gradient tensors, got "
                                                  << weights.size() << " and " << d_weights.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const Shape& want = param_shapes_[i];
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
    cuda::GraphCache* gc = sv->dropout ? nullptr : &train_cache(plan, TrainCall::Backward, T, dd.lengths);
    auto fill_x = [&](void* dst) { copy_device(dst, sv->x.raw(), sv->x.nbytes()); };
    auto graphed_issue = [&](std::span<void* const> st) {
      return under_capture(issue(cuda::cudnn_handle(), st[0], st[1]));
    };
    auto describe = [&] { return what.text() + ", backward, " + kAlgoNames[plan.algo]; };
    const bool graphed =
        gc && graphs_.replay(*gc, {dev_len, sv->y.raw(), hx, cx, dhy, dcy, r.d_x.raw(), dhx, dcx, w, dw, wsp, reserve},
                             {{dy_bytes, fill_dy}, {sv->x.nbytes(), fill_x}}, graphed_issue, describe);
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
        graphs_.eager(*gc, eager);
      } else {
        graphs_.ran_eager();
        eager();
      }
    }
    settled_bwd_ = graphs_.settled(gc);
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
    cuda::GraphCache& gc = train_cache(p, TrainCall::Forward, T, len);
    auto fill_x = [&](void* dst) { copy_device(dst, x.raw(), x.nbytes()); };
    auto graphed = [&](std::span<void* const> st) { return under_capture(issue(cuda::cudnn_handle(), st[0])); };
    auto describe = [&] { return what.text() + ", training forward, " + kAlgoNames[p.algo]; };
    if (graphs_.replay(gc, {dev_len, hx, cx, w, wsp, y, hy, cy, rsp}, {{x.nbytes(), fill_x}}, graphed, describe)) {
      settled_fwd_ = graphs_.settled(&gc);
      return;
    }
    graphs_.eager(gc, [&] { LSTM_CUDNN_ACCEPTS(issue(cuda::cudnn_handle(), x.raw()), p.algo, what, "cudnnRNNForward"); });
    settled_fwd_ = graphs_.settled(&gc);
  }

  // The cache of a training call's kind for T and these lengths (compared as they are: no key
  // is built per call).
  static cuda::GraphCache& train_cache(Plan& p, TrainCall kind, int64_t T, const std::vector<int32_t>& len) {
    for (auto& c : p.train_graphs)
      if (c.kind == kind && c.T == T && c.lengths == len) return c.graphs;
    // Lengths that change on every batch would pile caches up (none of which ever replays).
    if (p.train_graphs.size() >= 16) p.train_graphs.clear();
    p.train_graphs.push_back({kind, T, len, cuda::GraphCache()});
    return p.train_graphs.back().graphs;
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
    auto fill_x = [&](void* dst) { stage_x(p, dd, in.x, dst, T, B); };
    auto graphed = [&](std::span<void* const> st) { return under_capture(issue(cuda::cudnn_handle(), st[0])); };
    auto describe = [&] { return what.text() + ", inference, " + kAlgoNames[p.algo]; };
    if (graphs_.replay(dd.graphs, {dev_len, hx, cx, w, wsp, y, hy, cy}, {{in.x.nbytes(), fill_x}}, graphed, describe)) {
      settled_fwd_ = graphs_.settled(&dd.graphs);
      return;
    }
    Tensor x = in.x;
    if (dd.padded) {
      x = Tensor::empty(in.x.shape(), p.dtype, Device::CUDA);
      stage_x(p, dd, in.x, x.raw(), T, B);
    }
    graphs_.eager(dd.graphs, [&] {
      LSTM_CUDNN_ACCEPTS(issue(cuda::cudnn_handle(), x.raw()), p.algo, what, "cudnnRNNForward");
    });
    settled_fwd_ = graphs_.settled(&dd.graphs);
  }

  // ---- Plans ----
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
    for (const auto& q : plans_)
      if (q->algo == a && q->B == B && q->packed == packed && q->dtype == dt && q->spec == s) return last_plan_ = q;
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
    plans_.push_back(p);
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
      for (auto& pl : plans_) pl->rnn_drop.reset();
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
    dd.graphs = cuda::GraphCache();
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
    const AutoKey key{static_cast<int>(dt), B, T, train_mode, padded};
    auto it = auto_choice_.find(key);
    if (it != auto_choice_.end()) return it->second;

    std::ostringstream log;
    log << "cuDNN auto (" << case_str(s, dt, B, T, padded).text() << ", " << (train_mode ? "training" : "inference") << "):";
    int best = -1;
    float best_ms = 0;
    const cuda::Event e0, e1;
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
        LSTM_CUDA_CHECK(cudaEventRecord(e0.get(), cuda::stream()));
        const int reps = 3;
        for (int r = 0; r < reps; ++r) once();
        LSTM_CUDA_CHECK(cudaEventRecord(e1.get(), cuda::stream()));
        LSTM_CUDA_CHECK(cudaEventSynchronize(e1.get()));
        float ms = 0;
        LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
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
    auto_choice_[key] = best;
    return best;
  }

  LstmOptions options_;
  int algo_;
  cuda::GraphRunner graphs_;  // declared before the plans, whose graphs it captured
  // spec()'s, made once: the per-call checks compare shapes without formatting names.
  std::vector<std::string> param_names_;
  std::vector<Shape> param_shapes_;
  bool settled_fwd_ = true, settled_bwd_ = true;  // see settled()
  // Declared before the plans: RNN descriptors made with these must go first.
  std::unique_ptr<DropoutDesc> nodrop_, drop_;
  cuda::DeviceBuffer drop_states_;
  unsigned long long drop_seed_ = 0;
  double drop_p_ = 0;
  // At most 32, searched in order (compared field by field: no key is built per call).
  std::vector<std::shared_ptr<Plan>> plans_;
  std::shared_ptr<Plan> last_plan_;  // one of plans_
  // cudnn_algo "auto"'s picks per (dtype, batch, steps, training, variable lengths); the spec is
  // the instance's.
  using AutoKey = std::tuple<int, int64_t, int64_t, bool, bool>;
  std::map<AutoKey, int> auto_choice_;
  std::vector<int32_t> len_;  // the call's lengths, reused so that a call allocates no vector
  cuda::DeviceBuffer workspace_, w_copy_, dw_scratch_;
  const char* last_algo_ = "";  // kAlgoNames[the algorithm of the last call]
  std::string auto_log_;
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

}  // namespace lstm
