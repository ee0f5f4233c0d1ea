// CUDA graphs of cuDNN calls (LstmOptions::cuda_graphs): a replayed inference forward, training
// forward or backward gives the same bits as the same call issued eagerly, reads its inputs,
// h0/c0, gradients and weights as they are at the call, recaptures when the descriptors change,
// and falls back to eager calls where graphs cannot help. Fresh random inputs on every call,
// outputs poisoned with NaN before each call, and the float64 CPU reference for one call of each
// case. Without a GPU every test skips and says why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"
#if LSTM_HAVE_CUDA
#include "cudnn/lstm_cudnn.hpp"
#include "cudnn/lstm_cudnn_backend.hpp"
#endif

using namespace lstm;
using lstm::testing::error_of;
using lstm::testing::make_spec;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct GraphCase {
  std::string name;
  LstmSpec spec;
  int64_t T, B;
  std::vector<int64_t> lengths;  // empty: all T
  bool h0;
  std::string algo;  // cuDNN's algorithm
};

#if LSTM_HAVE_CUDA
std::vector<GraphCase> graph_cases() {
  return {
      {"uni_l1_standard", make_spec(32, 64, 1, false), 12, 4, {}, false, "standard"},
      {"bi_l2_h0_standard", make_spec(24, 48, 2, true), 9, 5, {}, true, "standard"},
      {"bi_l2_varlen_h0", make_spec(24, 48, 2, true), 9, 5, {9, 3, 1, 7, 9}, true, "standard"},
      {"proj_l2_varlen", make_spec(20, 48, 2, false, 16), 8, 3, {8, 2, 5}, false, "standard"},
      {"batch_first_l2_h0", make_spec(16, 64, 2, false, 0, true, true), 6, 3, {}, true, "standard"},
      {"uni_l2_small_h", make_spec(32, 64, 2, false), 10, 8, {}, true, "persist_static_small_h"},
      {"uni_l1_persist_static", make_spec(128, 128, 1, false), 10, 8, {}, false, "persist_static"},
  };
}

// Fresh values in place: U(-a, a) in t's dtype.
void refill(Tensor& t, Rng& rng, double a = 1.0) {
  Tensor h = Tensor::empty(t.shape(), DType::F64);
  rng.fill_uniform(h, -a, a);
  t.copy_(h.to(t.dtype()));
}

// Fresh values in place in a [T, B, W] ([B, T, W] with batch_first) tensor such as x or d_output:
// U(-1, 1) within each length, NaN past it.
void refill_x(Tensor& x, Rng& rng, const std::vector<int64_t>& len, const LstmSpec& s, int64_t T, int64_t B) {
  Tensor h = Tensor::empty(x.shape(), DType::F64);
  rng.fill_uniform(h, -1, 1);
  const int64_t W = x.size(2);
  for (int64_t row = 0; row < T * B && !len.empty(); ++row) {
    const int64_t t = s.batch_first ? row % T : row / B;
    const int64_t b = s.batch_first ? row / T : row % B;
    if (t >= len[b])
      for (int64_t j = 0; j < W; ++j) h.set(row * W + j, kNaN);
  }
  x.copy_(h.to(x.dtype()));
}

// Weights as views into the backend's flat buffer (how the engine and the bench hold them),
// U(-k, k) from `rng`.
std::vector<Tensor> flat_weights(LstmBackend& be, const LstmSpec& s, DType dt, Rng& rng) {
  std::vector<Tensor> w = make_flat_weights(s, be.flat_layout(s, dt), dt, Device::CUDA);
  for (auto& t : w) refill(t, rng, 1.0 / std::sqrt(static_cast<double>(s.hidden_size)));
  return w;
}

// Cached arena blocks of these shapes filled with NaN, so the outputs allocated next get them.
void poison_arena(const std::vector<Shape>& shapes, DType dt) {
  std::vector<Tensor> keep;
  for (const auto& s : shapes) {
    Tensor t = Tensor::empty(s, dt, Device::CUDA);
    t.fill_(kNaN);
    keep.push_back(t);
  }
  cuda_synchronize();
}

std::vector<Shape> out_shapes(const LstmSpec& s, int64_t T, int64_t B) {
  const int64_t LD = s.num_layers * s.directions();
  return {s.batch_first ? Shape{B, T, s.directions() * s.out_size()} : Shape{T, B, s.directions() * s.out_size()},
          {LD, B, s.out_size()},
          {LD, B, s.hidden_size}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.cpu(), hb = b.cpu();
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

Tensor f64(const Tensor& t) { return t.defined() ? t.cpu().to(DType::F64) : Tensor(); }

std::unique_ptr<LstmBackend> cudnn(const std::string& algo, const std::string& graphs) {
  LstmOptions o;
  o.algo = Algo::Cudnn;
  o.cudnn_algo = algo;
  o.cuda_graphs = graphs;
  return make_cudnn_lstm_backend(o);
}
const CudnnLstmBackend& info(const LstmBackend& be) { return dynamic_cast<const CudnnLstmBackend&>(be); }

// One problem run by two backends of one cuDNN algorithm: `graphed` (cuda_graphs as given) and
// `eager` (off), each with the same weights as views into its own flat buffer.
struct Pair {
  LstmSpec s;
  int64_t T, B;
  DType dt;
  std::unique_ptr<LstmBackend> graphed, eager;
  std::vector<Tensor> wg, we;
  Rng rng;
  Pair(const LstmSpec& spec, int64_t T_, int64_t B_, const std::string& graphs, uint64_t seed,
       const std::string& algo = "standard", DType dtype = DType::F32)
      : s(spec), T(T_), B(B_), dt(dtype), graphed(cudnn(algo, graphs)), eager(cudnn(algo, "off")), rng(seed) {
    wg = flat_weights(*graphed, s, dt, rng);
    we = make_flat_weights(s, eager->flat_layout(s, dt), dt, Device::CUDA);
    for (size_t i = 0; i < wg.size(); ++i) we[i].copy_(wg[i]);
  }
  Shape x_shape() const { return s.batch_first ? Shape{B, T, s.input_size} : Shape{T, B, s.input_size}; }
  Tensor new_x(const std::vector<int64_t>& len = {}) {
    Tensor x = Tensor::empty(x_shape(), dt, Device::CUDA);
    refill_x(x, rng, len, s, T, B);
    return x;
  }
  // An input with these lengths, and h0/c0 buffers when with_state (filled by refresh).
  LstmInput input(const std::vector<int64_t>& lengths, bool with_state) const {
    LstmInput in;
    in.lengths = lengths;
    if (with_state) {
      const int64_t LD = s.num_layers * s.directions();
      in.h0 = Tensor::empty({LD, B, s.out_size()}, dt, Device::CUDA);
      in.c0 = Tensor::empty({LD, B, s.hidden_size}, dt, Device::CUDA);
    }
    return in;
  }
  // New values for call k: x in x_fixed on even calls and in a new buffer on odd ones (NaN past
  // each length), h0/c0 (when present) in place.
  void refresh(LstmInput& in, const Tensor& x_fixed, int k) {
    in.x = k % 2 == 0 ? x_fixed : Tensor::empty(x_shape(), dt, Device::CUDA);
    refill_x(in.x, rng, in.lengths, s, T, B);
    if (in.h0.defined()) {
      refill(in.h0, rng);
      refill(in.c0, rng);
    }
  }
};

// The float64 CPU reference of a training step (forward, backward of grad into zeroed gradients).
struct RefStep {
  LstmOutput out;
  LstmGrads g;
  std::vector<Tensor> dw;
};
RefStep reference_step(const LstmSpec& s, const std::vector<Tensor>& w, const LstmInput& in,
                       const LstmGradOutput& grad) {
  std::vector<Tensor> w64, dw64;
  for (const auto& t : w) {
    w64.push_back(f64(t));
    dw64.push_back(Tensor::zeros(t.shape(), DType::F64));
  }
  const LstmInput in64{f64(in.x), in.lengths, f64(in.h0), f64(in.c0)};
  LstmBackend& ref = lstm_backend(Algo::Reference, s, DType::F64, Device::CPU);
  Rng r(1);
  std::unique_ptr<LstmSaved> saved;
  RefStep out;
  out.out = ref.forward(s, w64, in64, true, &r, &saved);
  out.g = ref.backward(s, w64, *saved, {f64(grad.d_output), f64(grad.d_h_n), f64(grad.d_c_n)}, dw64);
  out.dw = dw64;
  return out;
}
#endif

}  // namespace

TEST(CudnnGraphs, UnknownSettingListsTheAcceptedOnes) {
#if LSTM_HAVE_CUDA
  LstmOptions o;
  o.algo = Algo::Cudnn;
  o.cuda_graphs = "always";
  const std::string e = error_of([&] { make_cudnn_lstm_backend(o); });
  EXPECT_NE(e.find("always"), std::string::npos) << e;
  for (const char* n : {"auto", "on", "off"}) EXPECT_NE(e.find(n), std::string::npos) << e;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// make_lstm_backend checks the setting for every algorithm and device, the CPU's too.
TEST(CudnnGraphs, TheSettingIsCheckedOnEveryDevice) {
  LstmOptions o;
  o.cuda_graphs = "sometimes";
  const std::string e =
      error_of([&] { make_lstm_backend(o, make_spec(4, 8, 1, false), DType::F64, Device::CPU); });
  EXPECT_NE(e.find("cuda_graphs: expected auto, on or off, got 'sometimes'"), std::string::npos) << e;
  o.cuda_graphs = "off";
  EXPECT_NO_THROW(make_lstm_backend(o, make_spec(4, 8, 1, false), DType::F64, Device::CPU));
}

// Inference. Every call: new x values (alternately in the same buffer and in a new one), new
// h0/c0 values in place, outputs poisoned. The graph backend's results equal the eager backend's
// bit for bit, from the second call on they come from a replayed graph, and one call matches the
// float64 CPU reference.
TEST(CudnnGraphs, InferenceReplayGivesTheEagerBitsOnFreshInputs) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  uint64_t seed = 500;
  for (const GraphCase& c : graph_cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      Pair pr(c.spec, c.T, c.B, "on", ++seed, c.algo, dt);
      const LstmSpec& s = pr.s;
      Tensor x_fixed = pr.new_x();
      LstmInput in = pr.input(c.lengths, c.h0);
      for (int call = 0; call < 6; ++call) {
        SCOPED_TRACE("call " + std::to_string(call));
        pr.refresh(in, x_fixed, call);
        poison_arena(out_shapes(s, c.T, c.B), dt);
        const LstmOutput g = pr.graphed->forward(s, pr.wg, in, false, nullptr, nullptr);
        EXPECT_EQ(info(*pr.graphed).last_graph(), call == 0 ? "eager" : "replayed") << info(*pr.graphed).graph_log();
        poison_arena(out_shapes(s, c.T, c.B), dt);
        const LstmOutput e = pr.eager->forward(s, pr.we, in, false, nullptr, nullptr);
        EXPECT_EQ(info(*pr.eager).last_graph(), "eager");
        EXPECT_FALSE(has_non_finite(g.output));
        EXPECT_TRUE(same_bits(g.output, e.output)) << "output, max abs diff " << max_abs_diff(g.output, e.output);
        EXPECT_TRUE(same_bits(g.h_n, e.h_n)) << "h_n";
        EXPECT_TRUE(same_bits(g.c_n, e.c_n)) << "c_n";
        if (call == 3) {
          const RefStep r = reference_step(s, pr.wg, in, {});
          const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
          EXPECT_LT(rel_l2_error(g.output, r.out.output), tol);
          EXPECT_LT(rel_l2_error(g.h_n, r.out.h_n), tol);
          EXPECT_LT(rel_l2_error(g.c_n, r.out.c_n), tol);
        }
      }
      EXPECT_EQ(info(*pr.graphed).graph_log(), "") << "no graph was given up";
    }
  }
#endif
}

// Training. Every step: a training forward and a backward on both backends with fresh x (in place
// and in new buffers), h0/c0, d_output, d_h_n and d_c_n, gradients zeroed in place, outputs
// poisoned; some steps leave d_output or d_h_n/d_c_n out. Outputs and input gradients equal the
// eager backend's bit for bit, weight gradients too or within rounding of the summation order,
// from the second step on forward and backward come from replayed graphs, and one step matches
// the float64 CPU reference.
TEST(CudnnGraphs, TrainingReplayGivesTheEagerResultsOnFreshInputs) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  uint64_t seed = 900;
  for (const GraphCase& c : graph_cases()) {
    if (c.name == "bi_l2_h0_standard") continue;  // the varlen case covers it
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      Pair pr(c.spec, c.T, c.B, "on", ++seed, c.algo, dt);
      const LstmSpec& s = pr.s;
      const int64_t LD = s.num_layers * s.directions();
      std::vector<Tensor> dwg = make_flat_weights(s, pr.graphed->flat_layout(s, dt), dt, Device::CUDA);
      std::vector<Tensor> dwe = make_flat_weights(s, pr.eager->flat_layout(s, dt), dt, Device::CUDA);
      Tensor x_fixed = pr.new_x();
      const Shape yshape = out_shapes(s, c.T, c.B)[0];
      LstmInput in = pr.input(c.lengths, c.h0);
      for (int step = 0; step < 7; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        pr.refresh(in, x_fixed, step);
        LstmGradOutput grad;
        if (step != 4) {
          grad.d_output = Tensor::empty(yshape, dt, Device::CUDA);
          refill_x(grad.d_output, pr.rng, c.lengths, s, c.T, c.B);  // NaN past each length: ignored
        }
        if (step != 5) {
          grad.d_h_n = Tensor::empty({LD, c.B, s.out_size()}, dt, Device::CUDA);
          grad.d_c_n = Tensor::empty({LD, c.B, s.hidden_size}, dt, Device::CUDA);
          refill(grad.d_h_n, pr.rng);
          refill(grad.d_c_n, pr.rng);
        }
        for (auto& t : dwg) t.zero_();
        for (auto& t : dwe) t.zero_();
        Rng r1(3), r2(3);
        std::unique_ptr<LstmSaved> sg, se;
        poison_arena(out_shapes(s, c.T, c.B), dt);
        const LstmOutput og = pr.graphed->forward(s, pr.wg, in, true, &r1, &sg);
        const std::string fwd_graph = info(*pr.graphed).last_graph();
        poison_arena({pr.x_shape(), {LD, c.B, s.out_size()}, {LD, c.B, s.hidden_size}}, dt);
        const LstmGrads gg = pr.graphed->backward(s, pr.wg, *sg, grad, dwg);
        EXPECT_EQ(fwd_graph, step == 0 ? "eager" : "replayed") << info(*pr.graphed).graph_log();
        EXPECT_EQ(info(*pr.graphed).last_graph(), step == 0 ? "eager" : "replayed") << info(*pr.graphed).graph_log();
        const LstmOutput oe = pr.eager->forward(s, pr.we, in, true, &r2, &se);
        const LstmGrads ge = pr.eager->backward(s, pr.we, *se, grad, dwe);
        EXPECT_FALSE(has_non_finite(og.output));
        EXPECT_FALSE(has_non_finite(gg.d_x));
        EXPECT_TRUE(same_bits(og.output, oe.output)) << "output";
        EXPECT_TRUE(same_bits(og.h_n, oe.h_n)) << "h_n";
        EXPECT_TRUE(same_bits(og.c_n, oe.c_n)) << "c_n";
        EXPECT_TRUE(same_bits(gg.d_x, ge.d_x)) << "d_x, max abs diff " << max_abs_diff(gg.d_x, ge.d_x);
        if (c.h0) {
          EXPECT_TRUE(same_bits(gg.d_h0, ge.d_h0)) << "d_h0";
          EXPECT_TRUE(same_bits(gg.d_c0, ge.d_c0)) << "d_c0";
        }
        for (size_t i = 0; i < dwg.size(); ++i) {
          if (!same_bits(dwg[i], dwe[i])) {
            EXPECT_LT(rel_l2_error(dwg[i], dwe[i]), dt == DType::F32 ? 1e-6 : 5e-3) << "weight gradient " << i;
          }
        }
        if (step == 2) {
          const RefStep r = reference_step(s, pr.wg, in, grad);
          const double tol = dt == DType::F32 ? 1e-5 : 2e-2;
          EXPECT_LT(rel_l2_error(og.output, r.out.output), tol);
          EXPECT_LT(rel_l2_error(gg.d_x, r.g.d_x), tol);
          for (size_t i = 0; i < dwg.size(); ++i) EXPECT_LT(rel_l2_error(dwg[i], r.dw[i]), tol) << "d_w " << i;
        }
      }
      EXPECT_EQ(info(*pr.graphed).graph_log(), "") << "no graph was given up";
    }
  }
#endif
}

// Dropout between layers draws from cuDNN's own state: such training calls are never captured.
TEST(CudnnGraphs, TrainingWithDropoutStaysEager) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  LstmSpec spec = make_spec(16, 32, 2, false);
  spec.dropout = 0.3;
  Pair pr(spec, 6, 3, "on", 71);
  LstmInput in;
  in.x = pr.new_x();
  for (int step = 0; step < 3; ++step) {
    Rng drop(5);
    std::unique_ptr<LstmSaved> saved;
    const LstmOutput o = pr.graphed->forward(pr.s, pr.wg, in, true, &drop, &saved);
    EXPECT_EQ(info(*pr.graphed).last_graph(), "eager");
    std::vector<Tensor> dw = make_flat_weights(pr.s, pr.graphed->flat_layout(pr.s, pr.dt), pr.dt, Device::CUDA);
    for (auto& t : dw) t.zero_();
    LstmGradOutput grad;
    grad.d_output = Tensor::full(o.output.shape(), 0.5, pr.dt, Device::CUDA);
    pr.graphed->backward(pr.s, pr.wg, *saved, grad, dw);
    EXPECT_EQ(info(*pr.graphed).last_graph(), "eager");
  }
#endif
}

// Weights changed in place (as an optimizer step does) reach the next replay.
TEST(CudnnGraphs, ReplayReadsTheWeightsAsTheyAreAtTheCall) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  Pair pr(make_spec(16, 32, 2, true), 7, 3, "on", 61);
  LstmInput in;
  in.x = pr.new_x();
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    for (size_t i = 0; i < pr.wg.size(); ++i) {
      refill(pr.wg[i], pr.rng, 1.0 / std::sqrt(static_cast<double>(pr.s.hidden_size)));
      pr.we[i].copy_(pr.wg[i]);
    }
    const LstmOutput g = pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr);
    const LstmOutput e = pr.eager->forward(pr.s, pr.we, in, false, nullptr, nullptr);
    EXPECT_TRUE(same_bits(g.output, e.output)) << max_abs_diff(g.output, e.output);
    EXPECT_TRUE(same_bits(g.h_n, e.h_n));
  }
  EXPECT_EQ(info(*pr.graphed).last_graph(), "replayed");
#endif
}

// Lengths that change between calls make new descriptors: the graph of the old ones is dropped,
// and each set of lengths gives the eager results (NaN past each length never leaks in).
TEST(CudnnGraphs, NewLengthsAreCapturedAnew) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  Pair pr(make_spec(12, 40, 2, true), 8, 4, "on", 81);
  const std::vector<std::vector<int64_t>> lens = {{8, 3, 5, 1}, {8, 3, 5, 1}, {8, 3, 5, 1}, {2, 8, 8, 6},
                                                  {2, 8, 8, 6}, {},           {},           {8, 3, 5, 1}, {8, 3, 5, 1}};
  for (size_t k = 0; k < lens.size(); ++k) {
    SCOPED_TRACE("call " + std::to_string(k));
    LstmInput in;
    in.lengths = lens[k];
    in.x = pr.new_x(lens[k]);
    poison_arena(out_shapes(pr.s, pr.T, pr.B), pr.dt);
    const LstmOutput g = pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr);
    const bool repeat = k > 0 && lens[k] == lens[k - 1];
    EXPECT_EQ(info(*pr.graphed).last_graph(), repeat ? "replayed" : "eager");
    const LstmOutput e = pr.eager->forward(pr.s, pr.we, in, false, nullptr, nullptr);
    EXPECT_FALSE(has_non_finite(g.output));
    EXPECT_TRUE(same_bits(g.output, e.output)) << max_abs_diff(g.output, e.output);
    EXPECT_TRUE(same_bits(g.h_n, e.h_n));
    EXPECT_TRUE(same_bits(g.c_n, e.c_n));
  }
#endif
}

// Outputs that are all kept alive land in new buffers every call: after enough captures that
// were never replayed the shape goes back to eager calls, says why, and stays correct.
TEST(CudnnGraphs, BuffersThatChangeEveryCallGoBackToEager) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  Pair pr(make_spec(8, 16, 1, false), 5, 2, "on", 91);
  LstmInput in;
  in.x = pr.new_x();
  std::vector<LstmOutput> kept;
  for (int call = 0; call < 24; ++call) {
    refill_x(in.x, pr.rng, {}, pr.s, pr.T, pr.B);
    kept.push_back(pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr));
    const LstmOutput e = pr.eager->forward(pr.s, pr.we, in, false, nullptr, nullptr);
    EXPECT_TRUE(same_bits(kept.back().output, e.output)) << "call " << call;
  }
  EXPECT_EQ(info(*pr.graphed).last_graph(), "eager");
  EXPECT_NE(info(*pr.graphed).graph_log().find("change"), std::string::npos) << info(*pr.graphed).graph_log();
#endif
}

// "auto" measures a few eager calls, tries graphs (or not), measures a few replays and decides;
// whatever it decides, the results are the eager ones, and each step is logged with what was
// measured. Until then the backend says it has not settled.
TEST(CudnnGraphs, AutoDecidesFromMeasuredCalls) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  Pair pr(make_spec(32, 64, 1, false), 40, 2, "auto", 101);
  LstmInput in;
  in.x = pr.new_x();
  bool unsettled_seen = false;
  for (int call = 0; call < 12; ++call) {
    refill_x(in.x, pr.rng, {}, pr.s, pr.T, pr.B);
    const LstmOutput g = pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr);
    unsettled_seen = unsettled_seen || !info(*pr.graphed).graphs_settled();
    const LstmOutput e = pr.eager->forward(pr.s, pr.we, in, false, nullptr, nullptr);
    EXPECT_TRUE(same_bits(g.output, e.output)) << "call " << call;
    cuda_synchronize();  // each measured call's events are done before the next call
  }
  EXPECT_TRUE(unsettled_seen);
  EXPECT_TRUE(info(*pr.graphed).graphs_settled());
  const std::string log = info(*pr.graphed).graph_log();
  EXPECT_NE(log.find("eager calls: host "), std::string::npos) << log;
  auto ends_with = [&](const std::string& tail) {
    return log.size() >= tail.size() && log.compare(log.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool replay = ends_with(": replay\n"), eager = ends_with(": eager\n");
  EXPECT_TRUE(replay || eager) << log;
  EXPECT_EQ(info(*pr.graphed).last_graph(), replay ? "replayed" : "eager") << log;
  EXPECT_TRUE(info(*pr.eager).graphs_settled());
#endif
}

// Replayed calls allocate no device memory once a shape has been seen (the arena's count of
// cudaMalloc calls stays put from the first call on), with outputs dropped between calls as a
// serving or training loop does; training steps included.
TEST(CudnnGraphs, ReplaysDoNotAllocateDeviceMemory) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  Pair pr(make_spec(32, 64, 2, true), 10, 4, "on", 111);
  LstmInput in;
  in.x = pr.new_x();
  std::vector<Tensor> dw = make_flat_weights(pr.s, pr.graphed->flat_layout(pr.s, pr.dt), pr.dt, Device::CUDA);
  LstmGradOutput grad;
  auto train_step = [&] {
    Rng r(1);
    std::unique_ptr<LstmSaved> saved;
    const LstmOutput o = pr.graphed->forward(pr.s, pr.wg, in, true, &r, &saved);
    if (!grad.d_output.defined()) grad.d_output = Tensor::full(o.output.shape(), 0.25, pr.dt, Device::CUDA);
    pr.graphed->backward(pr.s, pr.wg, *saved, grad, dw);
  };
  pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr);
  train_step();
  cuda_synchronize();
  const int64_t mallocs = arena_stats().device_mallocs;
  int64_t captures = 0;
  for (int call = 0; call < 12; ++call) {
    refill_x(in.x, pr.rng, {}, pr.s, pr.T, pr.B);
    pr.graphed->forward(pr.s, pr.wg, in, false, nullptr, nullptr);
    EXPECT_EQ(info(*pr.graphed).last_graph(), "replayed");
    train_step();
    EXPECT_EQ(info(*pr.graphed).last_graph(), "replayed");
    // After a few calls every set of buffers the loop cycles through has its graph.
    if (call == 3) captures = info(*pr.graphed).graph_counts().captures;
  }
  cuda_synchronize();
  EXPECT_EQ(arena_stats().device_mallocs, mallocs);
  EXPECT_EQ(info(*pr.graphed).graph_counts().captures, captures) << "a steady loop kept capturing";
  EXPECT_GE(info(*pr.graphed).graph_counts().replays, 8 * 3);
#endif
}
