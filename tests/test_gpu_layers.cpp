// The non-LSTM layers and the softmax cross-entropy on the GPU, against the float64 CPU
// reference on fresh random inputs: Embedding, Dense (f32, tf32, bf16, f16), Dropout,
// Activation, LastStep, the loss, whole small models, and no cudaMalloc in a steady loop.
//
// Every test skips (visibly, with the reason) where no GPU is usable. Inputs past a sequence's
// length hold NaN, and the arena is filled with NaN blocks before each run so that an output
// element a kernel forgets to write shows up as NaN (best effort: the arena hands out cached
// blocks of the right size, which the poison provides).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lstm/device.hpp"
#include "lstm/layers.hpp"
#include "lstm/loss.hpp"
#include "lstm/model.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/layers.hpp"
#endif

using namespace lstm;

namespace {

#define REQUIRE_GPU()                                                         \
  do {                                                                        \
    if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason(); \
  } while (0)

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double tolerance(Precision p) {
  switch (p) {
    case Precision::F32: return 1e-5;
    case Precision::TF32: return 1e-3;
    default: return 2e-2;
  }
}

Tensor randn32(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s, DType::F32);
  rng.fill_normal(t, 0.0, 1.0);
  return t;
}

Tensor f64(const Tensor& t) { return t.cpu().to(DType::F64); }
Tensor gpu(const Tensor& t) { return t.to_device(Device::CUDA); }

// Rows t >= lengths[b] of a [T, B, F] host tensor set to NaN.
void poison_padding(Tensor& x, const std::vector<int64_t>& lengths) {
  const int64_t T = x.size(0), B = x.size(1), F = x.numel() / (x.size(0) * x.size(1));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= lengths[b])
        for (int64_t f = 0; f < F; ++f) x.set((t * B + b) * F + f, kNaN);
}

void expect_padded_zero(const Tensor& dev, const std::vector<int64_t>& lengths, const std::string& what) {
  const Tensor x = dev.cpu();
  const int64_t T = x.size(0), B = x.size(1), F = x.numel() / (x.size(0) * x.size(1));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= lengths[b]) {
        for (int64_t f = 0; f < F; ++f)
          ASSERT_EQ(x.get((t * B + b) * F + f), 0.0) << what << " at t=" << t << " b=" << b << " f=" << f;
      }
}

// Leaves NaN-filled blocks of these sizes in the arena's cache for the next allocations.
void poison_arena(const std::vector<Shape>& shapes) {
  std::vector<Tensor> hold;
  for (const Shape& s : shapes)
    for (int i = 0; i < 3; ++i) hold.push_back(Tensor::full(s, kNaN, DType::F32, Device::CUDA));
  cuda_synchronize();
}

// Copies parameter values and gradients from `src` into `dst` (any devices and dtypes).
void copy_params(Layer& src, Layer& dst) {
  auto s = src.params(), d = dst.params();
  ASSERT_EQ(s.size(), d.size());
  for (size_t i = 0; i < s.size(); ++i) {
    d[i].value.copy_(s[i].value);
    d[i].grad.copy_(s[i].grad);
  }
}

// Gives every gradient random values (the same on both layers after copy_params), so that
// backward's accumulation (+=) is checked too.
void randomise_grads(Layer& l, Rng& rng) {
  for (Param& p : l.params()) {
    Tensor h = Tensor::empty(p.grad.shape(), p.grad.dtype());
    rng.fill_normal(h, 0.0, 0.5);
    p.grad.copy_(h);
  }
}

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  EXPECT_FALSE(has_non_finite(got)) << what << " has NaN or Inf";
  EXPECT_LT(rel_l2_error(f64(got), f64(ref)), tol) << what;
}

const std::vector<int64_t> kLengths = {7, 3, 1, 6, 7};  // T = 7, B = 5

// A GPU layer and its float64 CPU reference with the same parameters.
struct Pair {
  std::unique_ptr<Layer> dev, ref;
};

Pair make_layer_pair(const std::function<std::unique_ptr<Layer>()>& make, const Signal& in, Precision p, Rng& rng) {
  Pair pr{make(), make()};
  pr.dev->build(in, DType::F32);
  pr.ref->build(in, DType::F64);
  pr.dev->init(rng);
  pr.dev->place({Device::CUDA, p, {}});
  randomise_grads(*pr.dev, rng);
  copy_params(*pr.dev, *pr.ref);
  return pr;
}

// Forward (training) and backward of a floating-input layer on both, compared.
void check_pair(Pair& pr, const Tensor& x32, const std::vector<int64_t>& lengths, Precision p,
                const std::string& what) {
  Rng r1(5), r2(5);
  poison_arena({x32.shape()});
  Act yd = pr.dev->forward({gpu(x32), lengths}, true, r1);
  Act yr = pr.ref->forward({f64(x32), lengths}, true, r2);
  const double tol = tolerance(p);
  expect_close(yd.data, yr.data, tol, what + " output");
  EXPECT_EQ(yd.lengths, lengths);
  if (!lengths.empty() && yd.data.dim() == 3) expect_padded_zero(yd.data, lengths, what + " output");

  Rng rng(11);
  Tensor g = randn32(yd.data.shape(), rng);
  if (!lengths.empty() && g.dim() == 3) poison_padding(g, lengths);
  poison_arena({x32.shape(), g.shape()});
  Act gd = pr.dev->backward({gpu(g), lengths});
  Act gr = pr.ref->backward({f64(g), lengths});
  expect_close(gd.data, gr.data, tol, what + " d input");
  if (!lengths.empty() && gd.data.dim() == 3) expect_padded_zero(gd.data, lengths, what + " d input");
  auto pd = pr.dev->params(), pref = pr.ref->params();
  for (size_t i = 0; i < pd.size(); ++i) {
    EXPECT_EQ(pd[i].grad.device(), Device::CUDA);
    expect_close(pd[i].grad, pref[i].grad, tol, what + " d " + pd[i].name);
  }
}

std::string thrown_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

}  // namespace

// ---- placement ----------------------------------------------------------------------------------

TEST(GpuLayers, PlaceMovesParamsInitAndBack) {
  REQUIRE_GPU();
  auto d = make_dense(6);
  d->build({SignalKind::Vector, 5}, DType::F32);
  Rng a(3), b(3);
  d->init(a);
  std::vector<Tensor> before;
  for (Param& p : d->params()) before.push_back(p.value.clone());
  d->place({Device::CUDA, Precision::F32, {}});
  auto ps = d->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].value.device(), Device::CUDA) << ps[i].name;
    EXPECT_EQ(ps[i].grad.device(), Device::CUDA) << ps[i].name;
    EXPECT_EQ(ps[i].value.dtype(), DType::F32);
    EXPECT_EQ(max_abs_diff(ps[i].value, before[i]), 0.0) << ps[i].name;
  }
  // init() on the GPU draws the same values as on the CPU from the same seed.
  d->init(b);
  ps = d->params();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(max_abs_diff(ps[i].value, before[i]), 0.0) << ps[i].name;
  auto e = make_embedding(20, 4, 3);
  e->build({SignalKind::Tokens, 20}, DType::F32);
  e->place({Device::CUDA, Precision::F32, {}});
  Rng c(4);
  e->init(c);
  Tensor w = e->params()[0].value.cpu();
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(w.get(3 * 4 + j), 0.0);

  d->place({Device::CPU, Precision::F32, {}});
  ps = d->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].value.device(), Device::CPU);
    EXPECT_EQ(max_abs_diff(ps[i].value, before[i]), 0.0) << ps[i].name;
  }
  // The CPU path runs again after the round trip.
  Rng r(1);
  Act y = d->forward({randn32({3, 5}, r), {}}, false, r);
  EXPECT_EQ(y.data.device(), Device::CPU);

  // Wrong device or an F64 layer are refused with a clear message.
  auto g = make_dense(4);
  g->build({SignalKind::Vector, 3}, DType::F32);
  g->place({Device::CUDA, Precision::F32, {}});
  std::string m = thrown_message([&] { g->forward({Tensor::zeros({2, 3}), {}}, false, r); });
  EXPECT_NE(m.find("the input is on the cpu"), std::string::npos) << m;
  auto h = make_dense(4);
  h->build({SignalKind::Vector, 3}, DType::F64);
  m = thrown_message([&] { h->place({Device::CUDA, Precision::F32, {}}); });
  EXPECT_NE(m.find("F32"), std::string::npos) << m;
}

// ---- Dense --------------------------------------------------------------------------------------

class GpuDense : public ::testing::TestWithParam<Precision> {};

TEST_P(GpuDense, SequenceWithLengthsMatchesCpu) {
  REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  const Precision p = GetParam();
  struct Case {
    int64_t in, out;
    bool bias;
  };
  // Both the fused epilogues (bias, bias gradient) and their fallbacks, forced here since
  // cuBLASLt may support every case on this GPU.
  for (bool unfused : {false, true}) {
    struct Reset {
      ~Reset() { cuda::dense_force_unfused(false); }
    } reset;
    cuda::dense_force_unfused(unfused);
    const cuda::DenseEpilogueStats before = cuda::dense_epilogue_stats();
    // Multiples of 4 (vector loads) and odd sizes; a larger one where split-K is likely.
    for (Case c : {Case{48, 40, true}, Case{13, 7, true}, Case{16, 12, false}, Case{256, 384, true}}) {
      Rng rng(100 + c.in);
      Pair pr = make_layer_pair([&] { return make_dense(c.out, c.bias); }, {SignalKind::Sequence, c.in}, p, rng);
      Tensor x = randn32({7, 5, c.in}, rng);
      poison_padding(x, kLengths);
      const std::string what = pr.dev->describe() + " " + precision_name(p) + (unfused ? " unfused" : "");
      check_pair(pr, x, kLengths, p, what);
      // All sequences full: no masking at all.
      check_pair(pr, randn32({7, 5, c.in}, rng), {}, p, what + " full");
    }
    const cuda::DenseEpilogueStats after = cuda::dense_epilogue_stats();
    std::cout << "[ info     ] " << precision_name(p) << (unfused ? " forced unfused" : "")
              << ": bias fused " << after.bias_fused - before.bias_fused << ", unfused "
              << after.bias_unfused - before.bias_unfused << "; bias gradient fused "
              << after.bgrad_fused - before.bgrad_fused << ", unfused " << after.bgrad_unfused - before.bgrad_unfused
              << "\n";
    if (unfused) {
      EXPECT_EQ(after.bias_fused, before.bias_fused);
      EXPECT_EQ(after.bgrad_fused, before.bgrad_fused);
      EXPECT_GT(after.bgrad_unfused, before.bgrad_unfused);
    }
  }
#endif
}

TEST_P(GpuDense, VectorMatchesCpu) {
  REQUIRE_GPU();
  const Precision p = GetParam();
  Rng rng(7);
  for (int64_t batch : {1, 9, 300}) {
    Pair pr = make_layer_pair([] { return make_dense(33); }, {SignalKind::Vector, 20}, p, rng);
    check_pair(pr, randn32({batch, 20}, rng), {}, p, "vector batch " + std::to_string(batch));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuDense,
                         ::testing::Values(Precision::F32, Precision::TF32, Precision::BF16, Precision::F16),
                         [](const ::testing::TestParamInfo<Precision>& i) { return precision_name(i.param); });

// ---- Embedding ----------------------------------------------------------------------------------

TEST(GpuEmbedding, MatchesCpuWithPaddingIdxAndLengths) {
  REQUIRE_GPU();
  for (int64_t dim : {16, 7}) {
    Rng rng(21);
    const int64_t V = 50;
    Pair pr = make_layer_pair([&] { return make_embedding(V, dim, 2); }, {SignalKind::Tokens, V}, Precision::F32, rng);
    std::vector<int64_t> ids(7 * 5);
    for (auto& id : ids) id = static_cast<int64_t>(rng.below(V));
    ids[0] = 2;  // padding_idx at a real position: read, never trained
    ids[1] = ids[3] = ids[4] = 9;  // a repeated id: its gradient rows add up
    // Padded positions hold out-of-vocabulary ids: neither read nor rejected.
    for (int64_t t = 0; t < 7; ++t)
      for (int64_t b = 0; b < 5; ++b)
        if (t >= kLengths[b]) ids[t * 5 + b] = 999;
    Tensor tok = Tensor::from_vector<int64_t>({7, 5}, ids);
    for (bool ids_on_gpu : {false, true}) {
      Rng r1(1), r2(1);
      poison_arena({{7, 5, dim}});
      Act yd = pr.dev->forward({ids_on_gpu ? gpu(tok) : tok, kLengths}, true, r1);
      Act yr = pr.ref->forward({tok, kLengths}, true, r2);
      expect_close(yd.data, yr.data, 1e-7, "embedding output");
      expect_padded_zero(yd.data, kLengths, "embedding output");
      Tensor g = randn32({7, 5, dim}, rng);
      poison_padding(g, kLengths);
      Act gd = pr.dev->backward({gpu(g), kLengths});
      Act gr = pr.ref->backward({f64(g), kLengths});
      EXPECT_FALSE(gd.data.defined());
      expect_close(pr.dev->params()[0].grad, pr.ref->params()[0].grad, 1e-6, "embedding d weight");
    }
  }
}

TEST(GpuEmbedding, BadTokenIdThrowsAsOnCpu) {
  REQUIRE_GPU();
  auto e = make_embedding(50, 8);
  e->build({SignalKind::Tokens, 50}, DType::F32);
  e->place({Device::CUDA, Precision::F32, {}});
  Rng rng(15);
  Tensor tok = Tensor::from_vector<int64_t>({2, 2}, {1, 2, 3, 57});
  for (bool on_gpu : {false, true}) {
    std::string m = thrown_message([&] { e->forward({on_gpu ? gpu(tok) : tok, {}}, false, rng); });
    EXPECT_NE(m.find("token id 57"), std::string::npos) << m;
    EXPECT_NE(m.find("step 1, sequence 1"), std::string::npos) << m;
    EXPECT_NE(m.find("[0, 50)"), std::string::npos) << m;
  }
}

// ---- Dropout ------------------------------------------------------------------------------------

TEST(GpuDropout, StatisticsMaskReuseAndPadding) {
  REQUIRE_GPU();
  const double p = 0.3;
  auto dr = make_dropout(p);
  dr->build({SignalKind::Vector, 500}, DType::F32);
  dr->place({Device::CUDA, Precision::F32, {}});
  Rng rng(13);
  Tensor x = Tensor::empty({400, 500}, DType::F32);
  rng.fill_uniform(x, 0.5, 1.5);  // never zero, so a zero output means dropped
  poison_arena({x.shape()});
  Act y = dr->forward({gpu(x), {}}, true, rng);
  const Tensor yh = y.data.cpu();
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = yh.get(i);
    if (v == 0.0)
      ++dropped;
    else
      ASSERT_NEAR(v, x.get(i) / (1 - p), 1e-6 * x.get(i)) << i;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(x.numel()), p, 0.005);
  // Backward recomputes the same mask from the seed.
  Tensor ones = Tensor::full({400, 500}, 1.0, DType::F32, Device::CUDA);
  const Tensor gh = dr->backward({ones, {}}).data.cpu();
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(gh.get(i) == 0.0, yh.get(i) == 0.0) << i;
    if (gh.get(i) != 0.0) {
      ASSERT_FLOAT_EQ(static_cast<float>(gh.get(i)), static_cast<float>(1 / (1 - p))) << i;
    }
  }
  // The same Rng state gives the same mask; the next draw another one.
  Rng s1(77), s2(77);
  Tensor m1 = dr->forward({gpu(x), {}}, true, s1).data.cpu();
  Tensor m2 = dr->forward({gpu(x), {}}, true, s2).data.cpu();
  EXPECT_EQ(max_abs_diff(m1, m2), 0.0);
  Tensor m3 = dr->forward({gpu(x), {}}, true, s2).data.cpu();
  EXPECT_GT(max_abs_diff(m1, m3), 0.0);
  // Eval: identity.
  EXPECT_EQ(max_abs_diff(dr->forward({gpu(x), {}}, false, rng).data, x), 0.0);

  // Sequences: padded rows zero in the output and in the input gradient, NaN there never leaks.
  auto ds = make_dropout(0.5);
  ds->build({SignalKind::Sequence, 12}, DType::F32);
  ds->place({Device::CUDA, Precision::F32, {}});
  Tensor xs = randn32({7, 5, 12}, rng);
  poison_padding(xs, kLengths);
  poison_arena({xs.shape()});
  Act ys = ds->forward({gpu(xs), kLengths}, true, rng);
  expect_padded_zero(ys.data, kLengths, "dropout output");
  EXPECT_FALSE(has_non_finite(ys.data));
  Tensor gs = randn32({7, 5, 12}, rng);
  poison_padding(gs, kLengths);
  Act dxs = ds->backward({gpu(gs), kLengths});
  expect_padded_zero(dxs.data, kLengths, "dropout d input");
  EXPECT_FALSE(has_non_finite(dxs.data));
  // dx = dy * mask, the mask read off the forward (x * mask).
  const Tensor yh2 = ys.data.cpu(), dh = dxs.data.cpu();
  for (int64_t t = 0; t < 7; ++t)
    for (int64_t b = 0; b < 5; ++b) {
      if (t >= kLengths[b]) continue;
      for (int64_t f = 0; f < 12; ++f) {
        const int64_t i = (t * 5 + b) * 12 + f;
        const double mask = yh2.get(i) / xs.get(i);
        ASSERT_NEAR(dh.get(i), gs.get(i) * mask, 1e-5 * (1 + std::abs(gs.get(i) * mask))) << i;
      }
    }

  // p = 1 drops everything; p = 0 is the identity (padded rows of its gradient still zero).
  auto all = make_dropout(1.0);
  all->build({SignalKind::Vector, 500}, DType::F32);
  all->place({Device::CUDA, Precision::F32, {}});
  EXPECT_EQ(max_abs_diff(all->forward({gpu(x), {}}, true, rng).data, Tensor::zeros({400, 500})), 0.0);
  auto none = make_dropout(0.0);
  none->build({SignalKind::Sequence, 12}, DType::F32);
  none->place({Device::CUDA, Precision::F32, {}});
  Tensor xs2 = randn32({7, 5, 12}, rng);
  Act yn = none->forward({gpu(xs2), kLengths}, true, rng);
  EXPECT_EQ(max_abs_diff(yn.data, xs2), 0.0);
  Act gn = none->backward({gpu(gs), kLengths});
  expect_padded_zero(gn.data, kLengths, "dropout(0) d input");
  EXPECT_FALSE(has_non_finite(gn.data));
}

// ---- Activation and LastStep --------------------------------------------------------------------

TEST(GpuActivation, ReluTanhAndSigmoidMatchCpu) {
  REQUIRE_GPU();
  for (const char* fn : {"relu", "tanh", "sigmoid"})
    for (int64_t f : {12, 5}) {
      Rng rng(31);
      Pair pr = make_layer_pair([&] { return make_activation(fn); }, {SignalKind::Sequence, f}, Precision::F32, rng);
      Tensor x = randn32({7, 5, f}, rng);
      poison_padding(x, kLengths);
      check_pair(pr, x, kLengths, Precision::F32, std::string(fn) + " sequence");
      Pair pv = make_layer_pair([&] { return make_activation(fn); }, {SignalKind::Vector, f}, Precision::F32, rng);
      check_pair(pv, randn32({6, f}, rng), {}, Precision::F32, std::string(fn) + " vector");
    }
}

TEST(GpuLastStep, MatchesCpuWithAndWithoutLengths) {
  REQUIRE_GPU();
  Rng rng(41);
  Pair pr = make_layer_pair([] { return make_last_step(); }, {SignalKind::Sequence, 9}, Precision::F32, rng);
  Tensor x = randn32({7, 5, 9}, rng);
  poison_padding(x, kLengths);
  check_pair(pr, x, kLengths, Precision::F32, "last_step");
  check_pair(pr, randn32({7, 5, 9}, rng), {}, Precision::F32, "last_step full");
}

// ---- Loss ---------------------------------------------------------------------------------------

namespace {

void check_loss(int64_t n, int64_t c, bool targets_on_gpu, bool with_mask, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(n) + " C=" + std::to_string(c) + (targets_on_gpu ? " gpu targets" : "") +
               (with_mask ? " mask" : ""));
  Rng rng(seed);
  Tensor logits = Tensor::empty({n, c}, DType::F32);
  rng.fill_normal(logits, 0.0, 3.0);
  std::vector<int64_t> tg(static_cast<size_t>(n));
  for (auto& t : tg) t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(c)));
  for (int64_t r = 0; r < n; r += 5) tg[r] = -100;  // ignored
  std::vector<uint8_t> mask;
  if (with_mask) {
    mask.assign(static_cast<size_t>(n), 1);
    for (int64_t r = 1; r < n; r += 3) mask[r] = 0;
    if (n > 1) tg[1] = c + 7;  // masked, so never checked
  }
  // Some rows predicted right, so `correct` is not trivially 0.
  for (int64_t r = 2; r < n; r += 4)
    if (tg[r] >= 0 && tg[r] < c) logits.set(r * c + tg[r], 40.0);
  Tensor targets = Tensor::from_vector<int64_t>({n}, tg);
  LossResult ref = softmax_cross_entropy(f64(logits), targets, -100, mask);
  poison_arena({logits.shape()});
  LossResult got = softmax_cross_entropy(gpu(logits), targets_on_gpu ? gpu(targets) : targets, -100, mask);
  EXPECT_TRUE(got.pending);
  ASSERT_EQ(got.grad.device(), Device::CUDA);
  got.resolve();
  EXPECT_FALSE(got.pending);
  EXPECT_EQ(got.count, ref.count);
  EXPECT_EQ(got.correct, ref.correct);
  EXPECT_NEAR(got.loss, ref.loss, 1e-5 * std::max(1.0, std::abs(ref.loss)));
  expect_close(got.grad, ref.grad, 1e-5, "loss gradient");
  // Rows not counted have an exactly zero gradient.
  const Tensor gh = got.grad.cpu();
  for (int64_t r = 0; r < n; ++r)
    if (tg[r] == -100 || (with_mask && !mask[r])) {
      for (int64_t j = 0; j < c; ++j) ASSERT_EQ(gh.get(r * c + j), 0.0) << "row " << r;
    }
}

}  // namespace

TEST(GpuLoss, MatchesCpuSmallAndLargeVocabulary) {
  REQUIRE_GPU();
  for (bool on_gpu : {false, true})
    for (bool with_mask : {false, true}) {
      check_loss(37, 5, on_gpu, with_mask, 1);        // warp per row, scalar loads
      check_loss(64, 1000, on_gpu, with_mask, 2);     // warp per row, vector loads
      check_loss(48, 50000, on_gpu, with_mask, 3);    // block per row, vector loads
      check_loss(24, 50257, on_gpu, with_mask, 4);    // block per row, scalar loads
      check_loss(1, 3, on_gpu, with_mask, 5);
    }
}

TEST(GpuLoss, DeterministicNothingCountedAndBadDeviceTarget) {
  REQUIRE_GPU();
  Rng rng(51);
  Tensor logits = gpu(randn32({300, 77}, rng));
  std::vector<int64_t> tg(300);
  for (auto& t : tg) t = static_cast<int64_t>(rng.below(77));
  Tensor targets = Tensor::from_vector<int64_t>({300}, tg);
  LossResult a = softmax_cross_entropy(logits, targets), b = softmax_cross_entropy(logits, targets);
  a.resolve();
  b.resolve();
  EXPECT_EQ(a.loss, b.loss);  // bit for bit: no float atomics in the sum
  EXPECT_EQ(max_abs_diff(a.grad, b.grad), 0.0);

  Tensor none = Tensor::full({300}, -100.0, DType::I64);
  for (bool on_gpu : {false, true}) {
    LossResult z = softmax_cross_entropy(logits, on_gpu ? gpu(none) : none);
    z.resolve();
    EXPECT_EQ(z.count, 0);
    EXPECT_EQ(z.loss, 0.0);
    EXPECT_EQ(max_abs_diff(z.grad, Tensor::zeros({300, 77})), 0.0);
  }

  // Host targets are checked as on the CPU; device targets cannot throw: NaN loss instead.
  tg[17] = 77;
  Tensor bad = Tensor::from_vector<int64_t>({300}, tg);
  std::string m = thrown_message([&] { softmax_cross_entropy(logits, bad); });
  EXPECT_NE(m.find("target 77 at row 17"), std::string::npos) << m;
  LossResult nan = softmax_cross_entropy(logits, gpu(bad));
  nan.resolve();
  EXPECT_TRUE(std::isnan(nan.loss));
  EXPECT_EQ(nan.count, 300);

  // softmax_row reads a GPU row.
  std::vector<double> pg = softmax_row(logits, 5, 0.7), pc = softmax_row(logits.cpu(), 5, 0.7);
  ASSERT_EQ(pg.size(), pc.size());
  for (size_t j = 0; j < pg.size(); ++j) EXPECT_EQ(pg[j], pc[j]);
}

// ---- whole models -------------------------------------------------------------------------------

namespace {

// Builds the same model twice (F64 on the CPU, F32 on the GPU with the same weights).
struct ModelPair {
  Model ref, dev;
};

ModelPair make_models(const std::function<void(Model&)>& add, const Signal& in, uint64_t seed) {
  ModelPair m;
  add(m.ref);
  add(m.dev);
  m.ref.build(in, DType::F64);
  m.dev.build(in, DType::F32);
  Rng rng(seed);
  m.ref.init(rng);
  m.dev.load_state_dict(m.ref.state_dict());
  m.dev.place({Device::CUDA, Precision::F32, {}});
  m.ref.zero_grad();
  m.dev.zero_grad();
  return m;
}

// One training step's forward, loss and backward on both; compares logits, loss and every gradient.
void compare_step(ModelPair& m, const Act& in, const Tensor& targets, const std::vector<uint8_t>& mask,
                  const std::string& what) {
  Rng r1(3), r2(3);
  Act yr = m.ref.forward(in, true, r1);
  Act in_dev = in;  // token ids stay on the host: the embedding copies them
  Act yd = m.dev.forward(in_dev, true, r2);
  expect_close(yd.data, yr.data, 1e-5, what + " logits");
  const int64_t c = yr.data.size(-1);
  LossResult lr = softmax_cross_entropy(yr.data.reshape({-1, c}), targets, -100, mask);
  LossResult ld = softmax_cross_entropy(yd.data.reshape({-1, c}), targets, -100, mask);
  ld.resolve();
  EXPECT_EQ(ld.count, lr.count);
  EXPECT_EQ(ld.correct, lr.correct);
  EXPECT_NEAR(ld.loss, lr.loss, 1e-5 * std::abs(lr.loss));
  m.ref.backward({lr.grad.reshape(yr.data.shape()), yr.lengths});
  m.dev.backward({ld.grad.reshape(yd.data.shape()), yd.lengths});
  auto pr = m.ref.parameters(), pd = m.dev.parameters();
  ASSERT_EQ(pr.size(), pd.size());
  for (size_t i = 0; i < pr.size(); ++i) expect_close(pd[i].grad, pr[i].grad, 1e-5, what + " d " + pd[i].name);
}

}  // namespace

TEST(GpuModel, SmallModelsMatchCpu) {
  REQUIRE_GPU();
  const int64_t V = 37, T = 7, B = 5;
  Rng rng(61);
  std::vector<int64_t> ids(T * B);
  for (auto& id : ids) id = 1 + static_cast<int64_t>(rng.below(V - 1));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= kLengths[b]) ids[t * B + b] = 0;  // padding_idx in padded positions
  Act in{Tensor::from_vector<int64_t>({T, B}, ids), kLengths};

  // Language model: every real step predicts the next token; padded rows are masked out.
  ModelPair lm = make_models(
      [&](Model& m) {
        m.add(make_embedding(V, 24, 0)).add(make_dense(32)).add(make_activation("relu")).add(make_dense(V));
      },
      {SignalKind::Tokens, V}, 1);
  std::vector<int64_t> next(T * B);
  std::vector<uint8_t> mask(T * B);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      next[t * B + b] = t + 1 < T ? ids[(t + 1) * B + b] : 1;
      mask[t * B + b] = t < kLengths[b];
    }
  compare_step(lm, in, Tensor::from_vector<int64_t>({T * B}, next), mask, "language model");

  // Classifier: a vector head through last_step.
  ModelPair cls = make_models(
      [&](Model& m) {
        m.add(make_embedding(V, 16, 0))
            .add(make_dense(20))
            .add(make_activation("tanh"))
            .add(make_dense(12))
            .add(make_last_step())
            .add(make_dense(4));
      },
      {SignalKind::Tokens, V}, 2);
  compare_step(cls, in, Tensor::from_vector<int64_t>({B}, {0, 3, 1, 2, 3}), {}, "classifier");
}

TEST(GpuModel, NoDeviceMallocAfterFirstStep) {
  REQUIRE_GPU();
  const int64_t V = 40, T = 9, B = 6;
  Model m;
  m.add(make_embedding(V, 32, 0))
      .add(make_dense(48))
      .add(make_activation("tanh"))
      .add(make_dropout(0.2))
      .add(make_dense(V));
  m.build({SignalKind::Tokens, V}, DType::F32);
  Rng rng(71);
  m.init(rng);
  m.place({Device::CUDA, Precision::TF32, {}});
  const std::vector<int64_t> lengths = {9, 4, 7, 1, 9, 2};
  int64_t mallocs_after_first = -1;
  std::ostringstream per_step;  // for the failure message
  for (int step = 0; step < 6; ++step) {
    std::vector<int64_t> ids(T * B), next(T * B);
    for (auto& id : ids) id = 1 + static_cast<int64_t>(rng.below(V - 1));
    for (auto& t : next) t = static_cast<int64_t>(rng.below(V));
    std::vector<uint8_t> mask(T * B);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B; ++b) mask[t * B + b] = t < lengths[b];
    m.zero_grad();
    Act y = m.forward({Tensor::from_vector<int64_t>({T, B}, ids), lengths}, true, rng);
    LossResult l = softmax_cross_entropy(y.data.reshape({T * B, V}), Tensor::from_vector<int64_t>({T * B}, next),
                                         -100, mask);
    m.backward({l.grad.reshape({T, B, V}), lengths});
    l.resolve();
    EXPECT_TRUE(std::isfinite(l.loss));
    const int64_t mallocs = arena_stats().device_mallocs;
    per_step << " " << mallocs;
    if (step == 0) mallocs_after_first = mallocs;
  }
  cuda_synchronize();
  EXPECT_EQ(arena_stats().device_mallocs, mallocs_after_first) << "cudaMalloc calls so far after each step:"
                                                               << per_step.str();
}
