// The LSTM stack through oneDNN's LSTM primitives (what PyTorch's CPU nn.LSTM runs on).
//
// Layers run one primitive each (oneDNN's multi-layer primitive wants every layer's input as wide
// as its output, and dropout sits between layers); both directions of a layer run in one
// primitive (bidirectional_concat). oneDNN's gate order (i, f, c~, o) is PyTorch's (i, f, g, o)
// and its one bias is b_ih + b_hh.
//
// Variable lengths: oneDNN's RNN primitives run every sequence of a call for the same number of
// steps. A batch whose sequences all have T steps runs on the caller's tensors directly
// (batch_first as oneDNN's ntc layout), both directions in one primitive. Otherwise the batch is
// sorted by length and each layer and direction runs one primitive per time segment between
// consecutive distinct lengths, on the sequences still running there (PyTorch's packed layout, a
// segment at a time; see forward_segmented): h_n/c_n are each sequence's own last state, the
// reverse direction starts at each sequence's own last step, and nothing past a length is read
// (the backward likewise).
//
// Weights: oneDNN wants them in its own layouts (format `any`, e.g. ldigo), which differ between
// the forward and the backward. The backend keeps a copy of the caller's values; on each call it
// compares them with the copy (a read of the weights, much cheaper than a reorder), and reorders
// only when they changed, so inference with fixed weights reorders once. Weight gradients:
// oneDNN's backward accumulates into diff_weights; they go into scratch buffers zeroed per
// backward (one sum over every segment) and are then added into d_weights in PyTorch's layout.
#include "cpu/lstm_onednn.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#if LSTM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace lstm::cpu {

#if LSTM_HAVE_ONEDNN
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using mdt = memory::data_type;

memory::desc md(const memory::dims& dims, tag t) { return memory::desc(dims, mdt::f32, t); }

// Sequences of one length (T), in batch order.
struct Group {
  int64_t T = 0;
  std::vector<int64_t> idx;
};

// Row (t, b) of a [T, B, F] ([B, T, F] when bf) tensor.
inline size_t seq_row(bool bf, int64_t T, int64_t B, int64_t t, int64_t b) {
  return static_cast<size_t>(bf ? b * T + t : t * B + b);
}
// Steps [0, Tg) of sequences idx of src into dst [Tg, n, F].
void gather_seq(const float* src, bool bf, int64_t T, int64_t B, int64_t F, const Group& g, float* dst) {
  const int64_t n = static_cast<int64_t>(g.idx.size());
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + (t * n + j) * F, src + seq_row(bf, T, B, t, g.idx[j]) * F, sizeof(float) * F);
}
void scatter_seq(const float* src, bool bf, int64_t T, int64_t B, int64_t F, const Group& g, float* dst) {
  const int64_t n = static_cast<int64_t>(g.idx.size());
  for (int64_t t = 0; t < g.T; ++t)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + seq_row(bf, T, B, t, g.idx[j]) * F, src + (t * n + j) * F, sizeof(float) * F);
}
// Layer l's D rows of a [L*D, B, W] state tensor, sequences idx, <-> [D, n, W].
void gather_state(const float* full, int64_t l, int64_t D, int64_t B, int64_t W, const Group& g, float* dst) {
  const int64_t n = static_cast<int64_t>(g.idx.size());
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + (d * n + j) * W, full + ((l * D + d) * B + g.idx[j]) * W, sizeof(float) * W);
}
void scatter_state(const float* src, int64_t l, int64_t D, int64_t B, int64_t W, const Group& g, float* full) {
  const int64_t n = static_cast<int64_t>(g.idx.size());
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(full + ((l * D + d) * B + g.idx[j]) * W, src + (d * n + j) * W, sizeof(float) * W);
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.raw()); }

// What one layer's training forward of one group keeps for the backward.
struct LayerRun {
  Tensor src, dst;         // the layer's input (after dropout) and output, [Tg, n, .] (ntc/tnc: see flags)
  bool src_ntc = false, dst_ntc = false;
  Tensor h0, c0, hn, cn;   // [D, n, Hout] / [D, n, H]
  Tensor mask;             // dropout scale applied to the input (layers > 0 with dropout)
  Tensor ws;               // oneDNN's workspace
};
struct GroupRun {
  Group g;
  bool direct = false;  // the whole batch, T steps, on the caller's tensors
  std::vector<LayerRun> layers;
};
// A variable-length batch in segments (see forward_segmented): one direction of one layer over
// one segment keeps its initial and final states, output and workspace.
struct SegRun {
  Tensor h0, c0, hn, cn, dst, ws;
};
struct LayerSegs {
  Tensor mask;                             // dropout scale on the layer input, sorted layout
  std::vector<Tensor> src;                 // per segment: its input [steps, active, In]
  std::vector<std::vector<SegRun>> dirs;   // [direction][segment]
};
// Sequences sorted by length (longest first, stable) and the time segments between distinct
// lengths: segment i is steps [bounds[i], bounds[i+1]) of the first active[i] sorted sequences.
struct Segments {
  std::vector<int64_t> order, len;  // sorted position -> batch index; lengths in sorted order
  std::vector<int64_t> bounds, active;
  int64_t count() const { return static_cast<int64_t>(active.size()); }
};
struct Saved : LstmSaved {
  const void* owner = nullptr;
  int64_t T = 0, B = 0;
  bool has_h0 = false, has_c0 = false;
  std::vector<GroupRun> groups;  // equal lengths: one group on the caller's tensors
  Segments seg;                  // variable lengths: segments
  std::vector<LayerSegs> seg_layers;
};

Segments make_segments(const std::vector<int64_t>& lengths, int64_t B) {
  Segments g;
  g.order.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) g.order[b] = b;
  std::stable_sort(g.order.begin(), g.order.end(), [&](int64_t x, int64_t y) { return lengths[x] > lengths[y]; });
  for (int64_t b : g.order) g.len.push_back(lengths[b]);
  g.bounds.push_back(0);
  for (auto it = g.len.rbegin(); it != g.len.rend(); ++it)
    if (*it > g.bounds.back()) g.bounds.push_back(*it);
  for (size_t i = 0; i + 1 < g.bounds.size(); ++i)
    g.active.push_back(std::count_if(g.len.begin(), g.len.end(), [&](int64_t n) { return n > g.bounds[i]; }));
  return g;
}

// Between a caller's [T, B, F] ([B, T, F] when bf) tensor and the sorted layout [T, B, F]
// (sorted position j holds sequence order[j]); rows past a length are zero in the sorted layout
// and are left alone in the caller's.
void to_sorted(const float* src, bool bf, int64_t T, int64_t B, int64_t F, const Segments& g, float* dst) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < B; ++j) {
      float* d = dst + (t * B + j) * F;
      if (t < g.len[j])
        std::memcpy(d, src + seq_row(bf, T, B, t, g.order[j]) * F, sizeof(float) * F);
      else
        std::memset(d, 0, sizeof(float) * F);
    }
}
void from_sorted(const float* src, bool bf, int64_t T, int64_t B, int64_t F, const Segments& g, float* dst) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < B; ++j)
      if (t < g.len[j]) std::memcpy(dst + seq_row(bf, T, B, t, g.order[j]) * F, src + (t * B + j) * F, sizeof(float) * F);
}
// Columns [c0, c0 + w) of steps [t0, t1) of the first n rows of a sorted [T, B, C] tensor
// <-> a dense [t1 - t0, n, w] block; add_block adds instead of copying.
void get_block(const float* src, int64_t B, int64_t C, int64_t t0, int64_t t1, int64_t n, int64_t c0, int64_t w, float* dst) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + ((t - t0) * n + j) * w, src + (t * B + j) * C + c0, sizeof(float) * w);
}
void put_block(const float* src, int64_t B, int64_t C, int64_t t0, int64_t t1, int64_t n, int64_t c0, int64_t w, float* dst) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + (t * B + j) * C + c0, src + ((t - t0) * n + j) * w, sizeof(float) * w);
}
void add_block(const float* src, int64_t B, int64_t C, int64_t t0, int64_t t1, int64_t n, float* dst) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t j = 0; j < n; ++j) {
      float* d = dst + (t * B + j) * C;
      const float* a = src + ((t - t0) * n + j) * C;
      for (int64_t k = 0; k < C; ++k) d[k] += a[k];
    }
}
// Direction d of layer l of a [L*D, B, W] state tensor <-> sorted [B, W] (zeros when undefined).
void state_to_sorted(const Tensor& full, int64_t idx, int64_t B, int64_t W, const Segments& g, float* dst) {
  for (int64_t j = 0; j < B; ++j) {
    if (full.defined())
      std::memcpy(dst + j * W, full.data<float>() + (idx * B + g.order[j]) * W, sizeof(float) * W);
    else
      std::memset(dst + j * W, 0, sizeof(float) * W);
  }
}
void state_from_sorted(const float* src, int64_t idx, int64_t B, int64_t W, const Segments& g, float* full) {
  for (int64_t j = 0; j < B; ++j) std::memcpy(full + (idx * B + g.order[j]) * W, src + j * W, sizeof(float) * W);
}

enum Which { kWl, kWi, kWp, kBias, kWhich };

class OnednnBackend final : public LstmBackend {
 public:
  OnednnBackend(const LstmSpec& spec, DType dtype)
      : LstmBackend(spec, dtype, Device::CPU), eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
    layers_.resize(static_cast<size_t>(spec.num_layers));
  }
  Algo algo() const override { return Algo::Onednn; }
  std::string name() const override { return "onednn"; }
  std::string last_run() const override { return last_run_; }

  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override {
    auto [T, B] = check_call(in, weights, ctx);
    try {
      return forward_impl(weights, in, T, B, training, rng, saved);
    } catch (const dnnl::error& e) {
      LSTM_THROW("onednn LSTM forward: oneDNN failed: " << e.what() << " (status " << static_cast<int>(e.status) << ")");
    }
  }

  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override {
    LSTM_REQUIRE(ctx.device == Device::CPU,
                 "onednn LSTM backward: runs on the CPU, got a " << device_name(ctx.device) << " execution context");
    const auto* sv = dynamic_cast<const Saved*>(&saved);
    LSTM_REQUIRE(sv && sv->owner == this, "onednn LSTM backward: the saved state does not come from this instance's forward");
    try {
      return backward_impl(weights, *sv, grad, d_weights);
    } catch (const dnnl::error& e) {
      LSTM_THROW("onednn LSTM backward: oneDNN failed: " << e.what() << " (status " << static_cast<int>(e.status) << ")");
    }
  }

 private:
  // ---- Primitives, per (layer, steps, batch, kind, src ntc, dst ntc) ----
  enum Kind { kInfer, kTrain, kBackward };
  static constexpr size_t kMaxPrims = 256;
  // dir: -1 the layer's directions in one primitive; 0 / 1 one direction alone (left to right /
  // right to left), for the segments of a variable-length batch.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, int>;
  struct Prim {
    dnnl::lstm_forward::primitive_desc fwd;
    dnnl::lstm_backward::primitive_desc bwd;
    dnnl::primitive p;
    memory scratch;
  };

  dnnl::rnn_direction direction() const {
    return spec().bidirectional ? dnnl::rnn_direction::bidirectional_concat
                                : dnnl::rnn_direction::unidirectional_left2right;
  }

  Prim& prim(int64_t l, int64_t Tg, int64_t n, Kind kind, bool src_ntc, bool dst_ntc, int dir = -1) {
    const Key key{l, Tg, n, kind, src_ntc, dst_ntc, dir};
    auto it = prims_.find(key);
    if (it != prims_.end()) return it->second;
    // Variable lengths make a new (steps, batch) per segment shape; keep a bounded set (a plan
    // made again costs little: oneDNN caches its own primitives). Cleared before the nested call
    // below, so no reference handed out in this call dangles.
    if (prims_.size() >= kMaxPrims) prims_.clear();
    const LstmSpec& s = spec();
    const int64_t In = s.layer_input_size(l), H = s.hidden_size, P = s.proj_size, Hout = s.out_size(),
                  D = dir < 0 ? s.directions() : 1;
    const dnnl::rnn_direction rd = dir < 0   ? direction()
                                   : dir == 0 ? dnnl::rnn_direction::unidirectional_left2right
                                              : dnnl::rnn_direction::unidirectional_right2left;
    const memory::desc src = md({Tg, n, In}, src_ntc ? tag::ntc : tag::tnc);
    const memory::desc dst = md({Tg, n, D * Hout}, dst_ntc ? tag::ntc : tag::tnc);
    const memory::desc h = md({1, D, n, Hout}, tag::ldnc), c = md({1, D, n, H}, tag::ldnc);
    // Inference gets plain ldigo weights, which selects oneDNN 2.6's gemm-based implementation:
    // `any` selects its brgemm one, measured slower on this Xeon (AVX-512) at every benchmark
    // shape: 1 thread, 100 steps, hidden 512: batch 1 33.6 vs 17.3 ms, batch 32 equal; 2 threads:
    // batch 1 16.5 vs 6.5 ms, batch 32 62.9 vs 52.6 ms; hidden 128 batch 32 4.7 vs 3.9 ms.
    // Training and backward take `any` (oneDNN picks ldigo / ldgoi there).
    const tag wtag = kind == kInfer ? tag::ldigo : tag::any;
    const memory::desc wl = md({1, D, In, 4, H}, wtag), wi = md({1, D, Hout, 4, H}, wtag);
    // (Projection weights as `any` beside plain ones became rnn_packed, and reordering into that
    // crashed inside oneDNN 2.6.)
    const memory::desc wp = P > 0 ? md({1, D, H, P}, kind == kInfer ? tag::ldio : tag::any) : memory::desc();
    const memory::desc bias = md({1, D, 4, H}, tag::any);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    Prim pr;
    if (kind == kBackward) {
      const Prim& f = prim(l, Tg, n, kTrain, src_ntc, dst_ntc, dir);
      dnnl::lstm_backward::desc bd(dnnl::prop_kind::backward, rd, src, h, c, wl, wi, memory::desc(), wp, bias,
                                   dst, h, c, src, h, c, wl, wi, memory::desc(), wp, bias, dst, h, c);
      pr.bwd = dnnl::lstm_backward::primitive_desc(bd, attr, eng_, f.fwd);
      pr.p = dnnl::lstm_backward(pr.bwd);
      pr.scratch = memory(pr.bwd.scratchpad_desc(), eng_);
    } else {
      dnnl::lstm_forward::desc fd(kind == kTrain ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
                                  rd, src, h, c, wl, wi, memory::desc(), wp, bias, dst, h, c);
      pr.fwd = dnnl::lstm_forward::primitive_desc(fd, attr, eng_);
      pr.p = dnnl::lstm_forward(pr.fwd);
      pr.scratch = memory(pr.fwd.scratchpad_desc(), eng_);
    }
    return prims_.emplace(key, std::move(pr)).first->second;
  }

  // ---- Weights ----
  struct Packed {
    int which, dir;
    memory::desc desc;
    memory mem;
    uint64_t version;
  };
  struct LayerWeights {
    std::vector<float> plain[kWhich];  // ldgoi, ldgoi, ldoi, ldgo over both directions
    uint64_t version = 0;
    std::vector<Packed> packed;
  };

  // dir < 0: both directions; else that one.
  memory::dims plain_dims(int64_t l, int which, int dir = -1) const {
    const LstmSpec& s = spec();
    const int64_t In = s.layer_input_size(l), H = s.hidden_size, D = dir < 0 ? s.directions() : 1;
    switch (which) {
      case kWl: return {1, D, In, 4, H};
      case kWi: return {1, D, s.out_size(), 4, H};
      case kWp: return {1, D, H, s.proj_size};
      default: return {1, D, 4, H};
    }
  }
  static tag plain_tag(int which) {
    return which == kWp ? tag::ldoi : which == kBias ? tag::ldgo : tag::ldgoi;
  }

  // Compares the caller's weights with the copy of the last call's; a layer whose values changed
  // gets its plain buffers rebuilt and a new version (its oneDNN layouts are reordered on use).
  void refresh_weights(const std::vector<Tensor>& w) {
    const LstmSpec& s = spec();
    if (copies_.empty()) copies_.resize(w.size());
    for (int64_t l = 0; l < s.num_layers; ++l) {
      bool changed = layers_[l].version == 0;
      for (int64_t d = 0; d < s.directions(); ++d) {
        const auto sl = s.slots(l, d);
        for (int i : {sl.w_ih, sl.w_hh, sl.b_ih, sl.b_hh, sl.w_hr}) {
          if (i < 0) continue;
          auto& copy = copies_[i];
          const size_t bytes = sizeof(float) * static_cast<size_t>(w[i].numel());
          if (copy.size() * sizeof(float) == bytes && std::memcmp(copy.data(), w[i].raw(), bytes) == 0) continue;
          copy.resize(static_cast<size_t>(w[i].numel()));
          std::memcpy(copy.data(), w[i].raw(), bytes);
          changed = true;
        }
      }
      if (!changed) continue;
      LayerWeights& lw = layers_[l];
      const int64_t H = s.hidden_size, G4 = 4 * H, D = s.directions();
      for (int which = 0; which < kWhich; ++which) {
        if (which == kWp && s.proj_size == 0) continue;
        int64_t per = 1;
        const memory::dims dims = plain_dims(l, which);
        for (size_t k = 2; k < dims.size(); ++k) per *= dims[k];
        auto& buf = lw.plain[which];
        buf.assign(static_cast<size_t>(D * per), 0.0f);
        for (int64_t d = 0; d < D; ++d) {
          const auto sl = s.slots(l, d);
          float* dst = buf.data() + d * per;
          if (which == kBias) {
            if (!s.bias) continue;
            const float* bi = copies_[sl.b_ih].data();
            const float* bh = copies_[sl.b_hh].data();
            for (int64_t j = 0; j < G4; ++j) dst[j] = bi[j] + bh[j];
          } else {
            const int i = which == kWl ? sl.w_ih : which == kWi ? sl.w_hh : sl.w_hr;
            std::memcpy(dst, copies_[i].data(), sizeof(float) * static_cast<size_t>(per));
          }
        }
      }
      lw.version = ++next_version_;
    }
  }

  // Layer l's weights `which` (direction dir, or both when dir < 0) in oneDNN's layout `desc`,
  // reordered when the values changed.
  memory& packed(int64_t l, int which, const memory::desc& desc, int dir = -1) {
    LayerWeights& lw = layers_[l];
    Packed* p = nullptr;
    for (auto& q : lw.packed)
      if (q.which == which && q.dir == dir && q.desc == desc) p = &q;
    if (!p) {
      lw.packed.push_back({which, dir, desc, memory(desc, eng_), 0});
      p = &lw.packed.back();
    }
    if (p->version != lw.version) {
      const memory::dims dims = plain_dims(l, which, dir);
      int64_t per = 1;
      for (size_t k = 2; k < dims.size(); ++k) per *= dims[k];
      memory src(md(dims, plain_tag(which)), eng_, lw.plain[which].data() + std::max(dir, 0) * per);
      dnnl::reorder(src, p->mem).execute(strm_, src, p->mem);
      strm_.wait();
      p->version = lw.version;
    }
    return p->mem;
  }

  // ---- Forward ----
  LstmOutput forward_impl(const std::vector<Tensor>& weights, const LstmInput& in, int64_t T, int64_t B, bool training,
                          Rng* rng, std::unique_ptr<LstmSaved>* saved) {
    const LstmSpec& s = spec();
    const int64_t H = s.hidden_size, Hout = s.out_size(), D = s.directions(), L = s.num_layers;
    const bool bf = s.batch_first, train = saved != nullptr;
    refresh_weights(weights);
    const bool direct = std::all_of(in.lengths.begin(), in.lengths.end(), [&](int64_t n) { return n == T; });
    if (!direct) return forward_segmented(in, T, B, training, rng, saved);
    // Every sequence has T steps: one group, the whole batch in order, on the caller's tensors
    // where the layouts allow (the group helpers below are the identity then, but for layouts).
    std::vector<Group> groups(1);
    groups[0].T = T;
    for (int64_t b = 0; b < B; ++b) groups[0].idx.push_back(b);
    LstmOutput out;
    out.output = direct ? Tensor::empty(bf ? Shape{B, T, D * Hout} : Shape{T, B, D * Hout}, DType::F32)
                        : Tensor::zeros(bf ? Shape{B, T, D * Hout} : Shape{T, B, D * Hout}, DType::F32);
    out.h_n = Tensor::empty({L * D, B, Hout}, DType::F32);
    out.c_n = Tensor::empty({L * D, B, H}, DType::F32);
    std::unique_ptr<Saved> sv;
    if (train) {
      sv = std::make_unique<Saved>();
      sv->owner = this;
      sv->T = T;
      sv->B = B;
      sv->has_h0 = in.h0.defined();
      sv->has_c0 = in.c0.defined();
    }
    for (const Group& g : groups) {
      const int64_t n = static_cast<int64_t>(g.idx.size()), Tg = g.T;
      GroupRun gr;
      gr.g = g;
      gr.direct = direct;
      Tensor src;
      bool src_ntc = false;
      if (direct && !(train && bf)) {
        // The saved input must not change with the caller's x before the backward.
        src = train ? in.x.clone() : in.x;
        src_ntc = bf;
      } else {
        // oneDNN 2.6's backward gets the layer-input weight gradient wrong from an ntc input
        // (measured: garbage in d_weight_ih_l0), so training gathers batch_first input into tnc.
        src = Tensor::empty({Tg, n, s.input_size}, DType::F32);
        gather_seq(in.x.data<float>(), bf, T, B, s.input_size, g, src.data<float>());
      }
      for (int64_t l = 0; l < L; ++l) {
        LayerRun run;
        if (l > 0 && training && s.dropout > 0) {
          LSTM_REQUIRE(rng, "onednn LSTM: dropout in training needs an Rng");
          run.mask = Tensor::empty(src.shape(), DType::F32);
          Tensor dropped = Tensor::empty(src.shape(), DType::F32);
          float* m = run.mask.data<float>();
          const float* x = src.data<float>();
          float* y = dropped.data<float>();
          const float keep = static_cast<float>(1.0 / (1.0 - s.dropout));
          for (int64_t i = 0; i < src.numel(); ++i) {
            m[i] = rng->uniform() < s.dropout ? 0.0f : keep;
            y[i] = x[i] * m[i];
          }
          src = dropped;
        }
        const bool last = l == L - 1;
        const bool dst_ntc = last && direct && bf;
        Tensor dst = last && direct ? out.output : Tensor::empty({Tg, n, D * Hout}, DType::F32);
        Tensor h0 = Tensor::empty({D, n, Hout}, DType::F32), c0 = Tensor::empty({D, n, H}, DType::F32);
        if (in.h0.defined())
          gather_state(in.h0.data<float>(), l, D, B, Hout, g, h0.data<float>());
        else
          h0.zero_();
        if (in.c0.defined())
          gather_state(in.c0.data<float>(), l, D, B, H, g, c0.data<float>());
        else
          c0.zero_();
        Tensor hn = Tensor::empty({D, n, Hout}, DType::F32), cn = Tensor::empty({D, n, H}, DType::F32);
        Prim& pr = prim(l, Tg, n, train ? kTrain : kInfer, src_ntc, dst_ntc);
        const auto& pd = pr.fwd;
        auto args = layer_args(pd, l, -1, src, h0, c0, dst, hn, cn, pr.scratch);
        if (train) {
          run.ws = Tensor::empty({static_cast<int64_t>(pd.workspace_desc().get_size())}, DType::U8);
          args.emplace(DNNL_ARG_WORKSPACE, memory(pd.workspace_desc(), eng_, ptr(run.ws)));
        }
        pr.p.execute(strm_, args);
        strm_.wait();
        scatter_state(hn.data<float>(), l, D, B, Hout, g, out.h_n.data<float>());
        scatter_state(cn.data<float>(), l, D, B, H, g, out.c_n.data<float>());
        if (last && !direct) scatter_seq(dst.data<float>(), bf, T, B, D * Hout, g, out.output.data<float>());
        if (train) {
          run.src = src;
          run.src_ntc = src_ntc;
          run.dst = dst;
          run.dst_ntc = dst_ntc;
          run.h0 = h0;
          run.c0 = c0;
          run.hn = hn;
          run.cn = cn;
          gr.layers.push_back(std::move(run));
        }
        src = dst;
        src_ntc = dst_ntc;
      }
      if (train) sv->groups.push_back(std::move(gr));
    }
    last_run_ = groups.size() == 1 ? "onednn" : "onednn, " + std::to_string(groups.size()) + " length groups";
    if (train) *saved = std::move(sv);
    return out;
  }

  // ---- Backward ----
  LstmGrads backward_impl(const std::vector<Tensor>& weights, const Saved& sv, const LstmGradOutput& grad,
                          std::vector<Tensor>& dw) {
    const LstmSpec& s = spec();
    const int64_t T = sv.T, B = sv.B, H = s.hidden_size, Hout = s.out_size(), D = s.directions(), L = s.num_layers,
                  LD = L * D;
    const bool bf = s.batch_first;
    const auto names = s.param_names();
    LSTM_REQUIRE(weights.size() == names.size(),
                 "onednn LSTM backward: expected " << names.size() << " weight tensors, got " << weights.size());
    LSTM_REQUIRE(dw.size() == names.size(),
                 "onednn LSTM backward: expected " << names.size() << " gradient tensors, got " << dw.size());
    for (size_t i = 0; i < names.size(); ++i) {
      LSTM_REQUIRE(weights[i].defined() && weights[i].shape() == s.param_shape(names[i]) &&
                       weights[i].dtype() == DType::F32 && weights[i].device() == Device::CPU,
                   "onednn LSTM backward: weight '" << names[i] << "' must be F32 " << shape_str(s.param_shape(names[i]))
                                                   << " on the CPU");
      LSTM_REQUIRE(dw[i].defined() && dw[i].shape() == weights[i].shape() && dw[i].dtype() == DType::F32 &&
                       dw[i].device() == Device::CPU,
                   "onednn LSTM backward: gradient for '" << names[i] << "' must be F32 " << weights[i].shape_str()
                                                           << " on the CPU, got "
                                                           << (dw[i].defined() ? dtype_name(dw[i].dtype()) : "none")
                                                           << " " << (dw[i].defined() ? dw[i].shape_str() : ""));
    }
    const Shape yshape = bf ? Shape{B, T, D * Hout} : Shape{T, B, D * Hout};
    auto checked = [&](const Tensor& t, const Shape& want, const char* what) {
      if (!t.defined()) return t;
      LSTM_REQUIRE(t.shape() == want, "onednn LSTM backward: " << what << " must be " << shape_str(want) << ", got "
                                                               << t.shape_str());
      LSTM_REQUIRE(t.device() == Device::CPU, "onednn LSTM backward: " << what << " must be on the CPU");
      return t.dtype() == DType::F32 ? t : t.to(DType::F32);
    };
    const Tensor dy = checked(grad.d_output, yshape, "d_output");
    const Tensor dhn = checked(grad.d_h_n, Shape{LD, B, Hout}, "d_h_n");
    const Tensor dcn = checked(grad.d_c_n, Shape{LD, B, H}, "d_c_n");
    refresh_weights(weights);

    if (sv.groups.empty()) return backward_segmented(sv, dy, dhn, dcn, dw);
    const bool direct = sv.groups.size() == 1 && sv.groups[0].direct;
    const Shape xshape = bf ? Shape{B, T, s.input_size} : Shape{T, B, s.input_size};
    LstmGrads r;
    r.d_x = direct ? Tensor::empty(xshape, DType::F32) : Tensor::zeros(xshape, DType::F32);
    Tensor dh0 = Tensor::empty({LD, B, Hout}, DType::F32), dc0 = Tensor::empty({LD, B, H}, DType::F32);
    diffs_.clear();

    for (const GroupRun& gr : sv.groups) {
      const Group& g = gr.g;
      const int64_t n = static_cast<int64_t>(g.idx.size()), Tg = g.T;
      Tensor ddst;
      if (gr.direct && dy.defined()) {
        ddst = dy;
      } else {
        ddst = Tensor::zeros({Tg, n, D * Hout}, DType::F32);
        if (dy.defined()) gather_seq(dy.data<float>(), bf, T, B, D * Hout, g, ddst.data<float>());
      }
      for (int64_t l = L - 1; l >= 0; --l) {
        const LayerRun& run = gr.layers[l];
        const int64_t In = s.layer_input_size(l);
        Tensor dh = Tensor::zeros({D, n, Hout}, DType::F32), dc = Tensor::zeros({D, n, H}, DType::F32);
        if (dhn.defined()) gather_state(dhn.data<float>(), l, D, B, Hout, g, dh.data<float>());
        if (dcn.defined()) gather_state(dcn.data<float>(), l, D, B, H, g, dc.data<float>());
        const bool into_dx = gr.direct && l == 0 && run.src_ntc == bf;
        Tensor dsrc = into_dx ? r.d_x : Tensor::empty({Tg, n, In}, DType::F32);
        Tensor dh_0 = Tensor::empty({D, n, Hout}, DType::F32), dc_0 = Tensor::empty({D, n, H}, DType::F32);
        Prim& pr = prim(l, Tg, n, kBackward, run.src_ntc, run.dst_ntc);
        const auto& pd = pr.bwd;
        auto args = layer_args(pd, l, -1, run.src, run.h0, run.c0, run.dst, run.hn, run.cn, pr.scratch);
        add_backward_args(args, pd, l, -1, run.ws, ddst, dh, dc, dsrc, dh_0, dc_0);
        pr.p.execute(strm_, args);
        strm_.wait();
        scatter_state(dh_0.data<float>(), l, D, B, Hout, g, dh0.data<float>());
        scatter_state(dc_0.data<float>(), l, D, B, H, g, dc0.data<float>());
        if (l > 0) {
          if (run.mask.defined()) {
            float* d = dsrc.data<float>();
            const float* m = run.mask.data<float>();
            for (int64_t i = 0; i < dsrc.numel(); ++i) d[i] *= m[i];
          }
          ddst = dsrc;
        } else if (!into_dx) {
          scatter_seq(dsrc.data<float>(), bf, T, B, s.input_size, g, r.d_x.data<float>());
        }
      }
    }
    add_weight_grads(dw);
    if (sv.has_h0) r.d_h0 = dh0;
    if (sv.has_c0) r.d_c0 = dc0;
    last_run_ = sv.groups.size() == 1 ? "onednn" : "onednn, " + std::to_string(sv.groups.size()) + " length groups";
    return r;
  }

  // ---- Variable lengths: time segments of a shrinking batch ----
  //
  // Sorted longest first, the sequences still running at step t are a prefix of the batch, the
  // same for every step between two consecutive distinct lengths. Each layer and direction runs
  // one primitive per such segment on that prefix (PyTorch's packed layout, a segment at a time):
  // left to right the states carry from segment to segment and a sequence's h_n/c_n is what it
  // holds after its last segment; right to left the segments run latest first and a sequence
  // joins, from h0/c0, at the segment that holds its last step. The backward runs the segments
  // in the opposite order, carrying the state gradients the same way. A layer's input and output
  // live in the sorted layout [T, B, C] with zeros past each length.
  LstmOutput forward_segmented(const LstmInput& in, int64_t T, int64_t B, bool training, Rng* rng,
                               std::unique_ptr<LstmSaved>* saved) {
    const LstmSpec& s = spec();
    const int64_t H = s.hidden_size, Hout = s.out_size(), D = s.directions(), L = s.num_layers;
    const bool bf = s.batch_first, train = saved != nullptr;
    std::unique_ptr<Saved> sv = std::make_unique<Saved>();
    sv->owner = this;
    sv->T = T;
    sv->B = B;
    sv->has_h0 = in.h0.defined();
    sv->has_c0 = in.c0.defined();
    sv->seg = make_segments(in.lengths, B);
    const Segments& g = sv->seg;
    const int64_t m = g.count();
    LstmOutput out;
    out.output = Tensor::zeros(bf ? Shape{B, T, D * Hout} : Shape{T, B, D * Hout}, DType::F32);
    out.h_n = Tensor::empty({L * D, B, Hout}, DType::F32);
    out.c_n = Tensor::empty({L * D, B, H}, DType::F32);
    Tensor cur = Tensor::empty({T, B, s.input_size}, DType::F32);
    to_sorted(in.x.data<float>(), bf, T, B, s.input_size, g, cur.data<float>());
    Tensor h = Tensor::empty({B, Hout}, DType::F32), c = Tensor::empty({B, H}, DType::F32);
    for (int64_t l = 0; l < L; ++l) {
      const int64_t In = s.layer_input_size(l);
      LayerSegs ls;
      if (l > 0 && training && s.dropout > 0) {
        LSTM_REQUIRE(rng, "onednn LSTM: dropout in training needs an Rng");
        ls.mask = Tensor::empty(cur.shape(), DType::F32);
        float* mk = ls.mask.data<float>();
        float* x = cur.data<float>();
        const float keep = static_cast<float>(1.0 / (1.0 - s.dropout));
        for (int64_t i = 0; i < cur.numel(); ++i) {
          mk[i] = rng->uniform() < s.dropout ? 0.0f : keep;
          x[i] *= mk[i];
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        Tensor src = Tensor::empty({g.bounds[i + 1] - g.bounds[i], g.active[i], In}, DType::F32);
        get_block(cur.data<float>(), B, In, g.bounds[i], g.bounds[i + 1], g.active[i], 0, In, src.data<float>());
        ls.src.push_back(src);
      }
      Tensor y = Tensor::zeros({T, B, D * Hout}, DType::F32);
      ls.dirs.resize(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) {
        const int pdir = D == 1 ? -1 : static_cast<int>(d);
        state_to_sorted(in.h0, l * D + d, B, Hout, g, h.data<float>());
        state_to_sorted(in.c0, l * D + d, B, H, g, c.data<float>());
        ls.dirs[d].resize(static_cast<size_t>(m));
        for (int64_t k = 0; k < m; ++k) {
          const int64_t i = d == 0 ? k : m - 1 - k, n = g.active[i], steps = g.bounds[i + 1] - g.bounds[i];
          SegRun r;
          r.h0 = Tensor::empty({1, n, Hout}, DType::F32);
          r.c0 = Tensor::empty({1, n, H}, DType::F32);
          std::memcpy(r.h0.raw(), h.raw(), sizeof(float) * n * Hout);
          std::memcpy(r.c0.raw(), c.raw(), sizeof(float) * n * H);
          r.hn = Tensor::empty({1, n, Hout}, DType::F32);
          r.cn = Tensor::empty({1, n, H}, DType::F32);
          r.dst = Tensor::empty({steps, n, Hout}, DType::F32);
          Prim& pr = prim(l, steps, n, train ? kTrain : kInfer, false, false, pdir);
          const auto& pd = pr.fwd;
          auto args = layer_args(pd, l, pdir, ls.src[i], r.h0, r.c0, r.dst, r.hn, r.cn, pr.scratch);
          if (train) {
            r.ws = Tensor::empty({static_cast<int64_t>(pd.workspace_desc().get_size())}, DType::U8);
            args.emplace(DNNL_ARG_WORKSPACE, memory(pd.workspace_desc(), eng_, ptr(r.ws)));
          }
          pr.p.execute(strm_, args);
          strm_.wait();
          std::memcpy(h.raw(), r.hn.raw(), sizeof(float) * n * Hout);
          std::memcpy(c.raw(), r.cn.raw(), sizeof(float) * n * H);
          put_block(r.dst.data<float>(), B, D * Hout, g.bounds[i], g.bounds[i + 1], n, d * Hout, Hout, y.data<float>());
          if (train) ls.dirs[d][i] = std::move(r);
        }
        state_from_sorted(h.data<float>(), l * D + d, B, Hout, g, out.h_n.data<float>());
        state_from_sorted(c.data<float>(), l * D + d, B, H, g, out.c_n.data<float>());
      }
      if (train) sv->seg_layers.push_back(std::move(ls));
      cur = y;
    }
    from_sorted(cur.data<float>(), bf, T, B, D * Hout, g, out.output.data<float>());
    last_run_ = "onednn, " + std::to_string(m) + " length segments";
    if (train) *saved = std::move(sv);
    return out;
  }

  LstmGrads backward_segmented(const Saved& sv, const Tensor& dy, const Tensor& dhn, const Tensor& dcn,
                               std::vector<Tensor>& dw) {
    const LstmSpec& s = spec();
    const int64_t T = sv.T, B = sv.B, H = s.hidden_size, Hout = s.out_size(), D = s.directions(), L = s.num_layers;
    const bool bf = s.batch_first;
    const Segments& g = sv.seg;
    const int64_t m = g.count();
    diffs_.clear();
    Tensor dcur = Tensor::zeros({T, B, D * Hout}, DType::F32);
    if (dy.defined()) to_sorted(dy.data<float>(), bf, T, B, D * Hout, g, dcur.data<float>());
    Tensor dh0 = Tensor::empty({L * D, B, Hout}, DType::F32), dc0 = Tensor::empty({L * D, B, H}, DType::F32);
    Tensor dh = Tensor::empty({B, Hout}, DType::F32), dc = Tensor::empty({B, H}, DType::F32);
    for (int64_t l = L - 1; l >= 0; --l) {
      const LayerSegs& ls = sv.seg_layers[l];
      const int64_t In = s.layer_input_size(l);
      Tensor dprev = Tensor::zeros({T, B, In}, DType::F32);
      for (int64_t d = 0; d < D; ++d) {
        const int pdir = D == 1 ? -1 : static_cast<int>(d);
        state_to_sorted(dhn, l * D + d, B, Hout, g, dh.data<float>());
        state_to_sorted(dcn, l * D + d, B, H, g, dc.data<float>());
        for (int64_t k = 0; k < m; ++k) {
          const int64_t i = d == 0 ? m - 1 - k : k, n = g.active[i], t0 = g.bounds[i], t1 = g.bounds[i + 1];
          const SegRun& r = ls.dirs[d][i];
          Tensor ddst = Tensor::empty({t1 - t0, n, Hout}, DType::F32);
          get_block(dcur.data<float>(), B, D * Hout, t0, t1, n, d * Hout, Hout, ddst.data<float>());
          Tensor dhi = Tensor::empty({1, n, Hout}, DType::F32), dci = Tensor::empty({1, n, H}, DType::F32);
          std::memcpy(dhi.raw(), dh.raw(), sizeof(float) * n * Hout);
          std::memcpy(dci.raw(), dc.raw(), sizeof(float) * n * H);
          Tensor dsrc = Tensor::empty({t1 - t0, n, In}, DType::F32);
          Tensor dho = Tensor::empty({1, n, Hout}, DType::F32), dco = Tensor::empty({1, n, H}, DType::F32);
          Prim& pr = prim(l, t1 - t0, n, kBackward, false, false, pdir);
          const auto& pd = pr.bwd;
          auto args = layer_args(pd, l, pdir, ls.src[i], r.h0, r.c0, r.dst, r.hn, r.cn, pr.scratch);
          add_backward_args(args, pd, l, pdir, r.ws, ddst, dhi, dci, dsrc, dho, dco);
          pr.p.execute(strm_, args);
          strm_.wait();
          std::memcpy(dh.raw(), dho.raw(), sizeof(float) * n * Hout);
          std::memcpy(dc.raw(), dco.raw(), sizeof(float) * n * H);
          add_block(dsrc.data<float>(), B, In, t0, t1, n, dprev.data<float>());
        }
        state_from_sorted(dh.data<float>(), l * D + d, B, Hout, g, dh0.data<float>());
        state_from_sorted(dc.data<float>(), l * D + d, B, H, g, dc0.data<float>());
      }
      if (ls.mask.defined()) {
        float* x = dprev.data<float>();
        const float* mk = ls.mask.data<float>();
        for (int64_t i = 0; i < dprev.numel(); ++i) x[i] *= mk[i];
      }
      dcur = dprev;
    }
    add_weight_grads(dw);
    LstmGrads r;
    r.d_x = Tensor::zeros(bf ? Shape{B, T, s.input_size} : Shape{T, B, s.input_size}, DType::F32);
    from_sorted(dcur.data<float>(), bf, T, B, s.input_size, g, r.d_x.data<float>());
    if (sv.has_h0) r.d_h0 = dh0;
    if (sv.has_c0) r.d_c0 = dc0;
    last_run_ = "onednn, " + std::to_string(m) + " length segments";
    return r;
  }

  // Scratch gradient of layer l's weights `which` in oneDNN's layout `desc`, zero at the first use
  // in a backward (oneDNN adds into it).
  struct Diff {
    int64_t layer;
    int which, dir;
    memory::desc desc;
    memory mem;
  };
  // The arguments a forward and a backward of one layer (and direction, `dir`; -1: all) share:
  // its input, initial and final states, output, packed weights (the projection's too) and
  // scratchpad. `pd` is either primitive descriptor.
  template <class Pd>
  std::unordered_map<int, memory> layer_args(const Pd& pd, int64_t l, int dir, const Tensor& src, const Tensor& h0,
                                             const Tensor& c0, const Tensor& dst, const Tensor& hn, const Tensor& cn,
                                             const memory& scratch) {
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC_LAYER, memory(pd.src_layer_desc(), eng_, ptr(src))},
        {DNNL_ARG_SRC_ITER, memory(pd.src_iter_desc(), eng_, ptr(h0))},
        {DNNL_ARG_SRC_ITER_C, memory(pd.src_iter_c_desc(), eng_, ptr(c0))},
        {DNNL_ARG_WEIGHTS_LAYER, packed(l, kWl, pd.weights_layer_desc(), dir)},
        {DNNL_ARG_WEIGHTS_ITER, packed(l, kWi, pd.weights_iter_desc(), dir)},
        {DNNL_ARG_BIAS, packed(l, kBias, pd.bias_desc(), dir)},
        {DNNL_ARG_DST_LAYER, memory(pd.dst_layer_desc(), eng_, ptr(dst))},
        {DNNL_ARG_DST_ITER, memory(pd.dst_iter_desc(), eng_, ptr(hn))},
        {DNNL_ARG_DST_ITER_C, memory(pd.dst_iter_c_desc(), eng_, ptr(cn))},
        {DNNL_ARG_SCRATCHPAD, scratch}};
    if (spec().proj_size > 0) args.emplace(DNNL_ARG_WEIGHTS_PROJECTION, packed(l, kWp, pd.weights_projection_desc(), dir));
    return args;
  }

  memory& diff(int64_t l, int which, const memory::desc& desc, int dir = -1) {
    for (auto& q : diffs_)
      if (q.layer == l && q.which == which && q.dir == dir && q.desc == desc) return q.mem;
    memory m(desc, eng_);
    std::memset(m.get_data_handle(), 0, desc.get_size());
    diffs_.push_back({l, which, dir, desc, m});
    return diffs_.back().mem;
  }

  // Adds the scratch gradients into d_weights in PyTorch's layout (both biases get the bias's).
  // What a backward adds to layer_args(): the forward's workspace, the gradients in (of the
  // output and final states) and out (of the input and initial states), and the weight gradients.
  void add_backward_args(std::unordered_map<int, memory>& args, const dnnl::lstm_backward::primitive_desc& pd, int64_t l,
                         int dir, const Tensor& ws, const Tensor& d_dst, const Tensor& d_hn, const Tensor& d_cn,
                         const Tensor& d_src, const Tensor& d_h0, const Tensor& d_c0) {
    args.insert({{DNNL_ARG_WORKSPACE, memory(pd.workspace_desc(), eng_, ptr(ws))},
                 {DNNL_ARG_DIFF_DST_LAYER, memory(pd.diff_dst_layer_desc(), eng_, ptr(d_dst))},
                 {DNNL_ARG_DIFF_DST_ITER, memory(pd.diff_dst_iter_desc(), eng_, ptr(d_hn))},
                 {DNNL_ARG_DIFF_DST_ITER_C, memory(pd.diff_dst_iter_c_desc(), eng_, ptr(d_cn))},
                 {DNNL_ARG_DIFF_SRC_LAYER, memory(pd.diff_src_layer_desc(), eng_, ptr(d_src))},
                 {DNNL_ARG_DIFF_SRC_ITER, memory(pd.diff_src_iter_desc(), eng_, ptr(d_h0))},
                 {DNNL_ARG_DIFF_SRC_ITER_C, memory(pd.diff_src_iter_c_desc(), eng_, ptr(d_c0))},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, diff(l, kWl, pd.diff_weights_layer_desc(), dir)},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, diff(l, kWi, pd.diff_weights_iter_desc(), dir)},
                 {DNNL_ARG_DIFF_BIAS, diff(l, kBias, pd.diff_bias_desc(), dir)}});
    if (spec().proj_size > 0)
      args.emplace(DNNL_ARG_DIFF_WEIGHTS_PROJECTION, diff(l, kWp, pd.diff_weights_projection_desc(), dir));
  }

  void add_weight_grads(std::vector<Tensor>& dw) {
    const LstmSpec& s = spec();
    for (auto& q : diffs_) {
      if (q.which == kBias && !s.bias) continue;
      const memory::dims dims = plain_dims(q.layer, q.which, q.dir);
      int64_t per = 1;
      for (size_t k = 2; k < dims.size(); ++k) per *= dims[k];
      std::vector<float> plain(static_cast<size_t>(dims[1] * per));
      memory dst(md(dims, plain_tag(q.which)), eng_, plain.data());
      dnnl::reorder(q.mem, dst).execute(strm_, q.mem, dst);
      strm_.wait();
      for (int64_t k = 0; k < dims[1]; ++k) {
        const int64_t d = q.dir < 0 ? k : q.dir;
        const auto sl = s.slots(q.layer, d);
        const float* src = plain.data() + k * per;
        auto add = [&](int i) {
          float* t = dw[i].data<float>();
          for (int64_t j = 0; j < per; ++j) t[j] += src[j];
        };
        switch (q.which) {
          case kWl: add(sl.w_ih); break;
          case kWi: add(sl.w_hh); break;
          case kWp: add(sl.w_hr); break;
          default:
            add(sl.b_ih);
            add(sl.b_hh);
        }
      }
    }
    diffs_.clear();
  }

  dnnl::engine eng_;
  dnnl::stream strm_;
  std::map<Key, Prim> prims_;
  std::vector<LayerWeights> layers_;
  std::vector<std::vector<float>> copies_;  // the caller's weights at the last call, per parameter
  uint64_t next_version_ = 0;
  std::vector<Diff> diffs_;
  std::string last_run_;
};

// Whether the CPU has bf16 matrix instructions (AVX512-BF16: CPUID leaf 7 subleaf 1 EAX bit 5;
// AMX-BF16: leaf 7 subleaf 0 EDX bit 22), without which oneDNN's BF16 would emulate and not pay.
bool cpu_has_bf16_units() {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx = (d >> 22) & 1u;
  __cpuid_count(7, 1, a, b, c, d);
  return amx || ((a >> 5) & 1u);
#else
  return false;
#endif
}

}  // namespace

bool onednn_built() { return true; }
std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string onednn_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device) {
  (void)spec;
  if (device != Device::CPU) return "the onednn backend runs on the CPU only";
  if (dtype == DType::F64) return "oneDNN's RNN primitives have no F64 (the reference runs F64)";
  if (dtype == DType::BF16)
    return cpu_has_bf16_units()
               ? "BF16 through oneDNN is not implemented yet (F32 only; the reference has no BF16 either)"
               : "BF16 through oneDNN needs a CPU with AVX512-BF16 or AMX, and this one has neither (F32 runs)";
  if (dtype != DType::F32) return std::string("the onednn backend computes in F32, not ") + dtype_name(dtype);
  return "";
}

std::unique_ptr<LstmBackend> make_onednn_lstm_backend(const LstmSpec& spec, DType dtype) {
  return std::make_unique<OnednnBackend>(spec, dtype);
}

#else  // !LSTM_HAVE_ONEDNN

bool onednn_built() { return false; }
std::string onednn_version() { return ""; }
std::string onednn_lstm_unsupported(const LstmSpec&, DType, Device) {
  return "built without oneDNN (install libdnnl-dev and reconfigure)";
}
std::unique_ptr<LstmBackend> make_onednn_lstm_backend(const LstmSpec&, DType) {
  LSTM_THROW("LSTM backend 'onednn': built without oneDNN (install libdnnl-dev and reconfigure)");
}

#endif

}  // namespace lstm::cpu
