// Non-LSTM layers and the softmax cross-entropy loss: finite-difference gradient checks in f64,
// padding behaviour, hand-computed values, dropout statistics, errors and JSON round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "lstm/layers.hpp"
#include "lstm/loss.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

using namespace lstm;

namespace {

constexpr double kEps = 1e-6;
constexpr double kMaxRelErr = 1e-6;

Tensor randn(const Shape& s, DType dt, Rng& rng) {
  Tensor t = Tensor::empty(s, dt);
  rng.fill_normal(t, 0.0, 1.0);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

// ||num - ana|| / ||ana||, or the absolute norm when the analytic gradient is zero.
double grad_error(const std::vector<double>& num, const Tensor& ana) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < num.size(); ++i) {
    const double a = ana.get(static_cast<int64_t>(i));
    diff += (num[i] - a) * (num[i] - a);
    ref += a * a;
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

// Elements that get no gradient by definition although they influence the output (an
// embedding's padding_idx row): their analytic gradient must be exactly zero.
using NoGrad = std::function<bool(const std::string& param, int64_t index)>;

// Central differences of f with respect to every finite element of t (perturbed in place).
// Non-finite elements (deliberate garbage in padded rows) and `skip` ones are reported as 0.
std::vector<double> numeric_grad(Tensor& t, const std::function<double()>& f,
                                 const std::function<bool(int64_t)>& skip = {}) {
  std::vector<double> g(static_cast<size_t>(t.numel()), 0.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.get(i);
    if (!std::isfinite(v) || (skip && skip(i))) continue;
    t.set(i, v + kEps);
    const double up = f();
    t.set(i, v - kEps);
    const double down = f();
    t.set(i, v);
    g[static_cast<size_t>(i)] = (up - down) / (2 * kEps);
  }
  return g;
}

// Checks a built f64 layer's backward against central differences of sum(forward(in) * R) with
// a fresh random R, with respect to the input (when floating) and every parameter. Every
// training forward draws from the same seed so that dropout masks repeat.
void check_layer_grads(Layer& layer, Act in, const NoGrad& no_grad = {}, uint64_t seed = 99) {
  const uint64_t fwd_seed = seed * 7 + 1;
  auto run = [&]() {
    Rng r(fwd_seed);
    return layer.forward(in, /*training=*/true, r);
  };
  Act out = run();
  Rng rng(seed);
  Tensor R = randn(out.data.shape(), DType::F64, rng);
  for (Param& p : layer.params()) p.grad.zero_();
  Act gin = layer.backward({R, out.lengths});
  EXPECT_EQ(gin.lengths, in.lengths);
  std::vector<Tensor> pgrads;
  for (Param& p : layer.params()) pgrads.push_back(p.grad.clone());

  auto loss = [&]() { return dot(run().data, R); };
  if (is_floating(in.data.dtype())) {
    ASSERT_TRUE(gin.data.defined());
    ASSERT_EQ(gin.data.shape(), in.data.shape());
    std::vector<double> num = numeric_grad(in.data, loss);
    EXPECT_LT(grad_error(num, gin.data), kMaxRelErr) << layer.describe() << " d input";
  } else {
    EXPECT_FALSE(gin.data.defined());
  }
  std::vector<Param> ps = layer.params();
  for (size_t k = 0; k < ps.size(); ++k) {
    std::function<bool(int64_t)> skip;
    if (no_grad) skip = [&](int64_t i) { return no_grad(ps[k].name, i); };
    std::vector<double> num = numeric_grad(ps[k].value, loss, skip);
    if (skip)
      for (int64_t i = 0; i < pgrads[k].numel(); ++i)
        if (skip(i)) {
          EXPECT_EQ(pgrads[k].get(i), 0.0) << ps[k].name << " element " << i;
        }
    EXPECT_LT(grad_error(num, pgrads[k]), kMaxRelErr) << layer.describe() << " d " << ps[k].name;
  }
}

// Every feature of rows t >= lengths[b] of a [T, B, F] tensor is exactly zero.
void expect_padded_zero(const Tensor& x, const std::vector<int64_t>& lengths, const std::string& what) {
  const int64_t T = x.size(0), B = x.size(1), F = x.size(2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= lengths[b]) {
        for (int64_t f = 0; f < F; ++f)
          ASSERT_EQ(x.get((t * B + b) * F + f), 0.0) << what << " at t=" << t << " b=" << b << " f=" << f;
      }
}

// Fills padded rows with NaN: layers must neither propagate nor differentiate through them.
void poison_padding(Tensor& x, const std::vector<int64_t>& lengths) {
  const int64_t T = x.size(0), B = x.size(1), F = x.size(2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= lengths[b])
        for (int64_t f = 0; f < F; ++f) x.set((t * B + b) * F + f, std::numeric_limits<double>::quiet_NaN());
}

std::string thrown_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<nothing thrown>";
}

const std::vector<int64_t> kLengths = {5, 2, 1, 4};  // B = 4, T = 5

}  // namespace

// ---- gradient checks ----------------------------------------------------------------------------

TEST(DenseGrad, SequenceWithLengths) {
  for (bool bias : {true, false}) {
    auto d = make_dense(4, bias);
    EXPECT_EQ(d->build({SignalKind::Sequence, 3}, DType::F64).kind, SignalKind::Sequence);
    Rng rng(1);
    d->init(rng);
    Act in{randn({5, 4, 3}, DType::F64, rng), kLengths};
    check_layer_grads(*d, in);
  }
}

TEST(DenseGrad, PaddedRowsZeroAndInert) {
  auto d = make_dense(4);
  d->build({SignalKind::Sequence, 3}, DType::F64);
  Rng rng(2);
  d->init(rng);
  Tensor x = randn({5, 4, 3}, DType::F64, rng);
  poison_padding(x, kLengths);
  Act out = d->forward({x, kLengths}, true, rng);
  EXPECT_EQ(out.lengths, kLengths);
  expect_padded_zero(out.data, kLengths, "dense output");
  // A gradient with garbage in padded rows must be ignored, not propagated.
  Tensor g = randn(out.data.shape(), DType::F64, rng);
  Act gin = d->backward({g, kLengths});
  expect_padded_zero(gin.data, kLengths, "dense d input");
  EXPECT_FALSE(has_non_finite(gin.data));
  for (Param& p : d->params()) EXPECT_FALSE(has_non_finite(p.grad)) << p.name;
  check_layer_grads(*d, {x, kLengths});
}

TEST(DenseGrad, Vector) {
  auto d = make_dense(6);
  d->build({SignalKind::Vector, 5}, DType::F64);
  Rng rng(3);
  d->init(rng);
  check_layer_grads(*d, {randn({7, 5}, DType::F64, rng), {}});
}

TEST(EmbeddingGrad, WeightWithPaddingIdxAndLengths) {
  auto e = make_embedding(9, 4, /*padding_idx=*/2);
  EXPECT_EQ(e->build({SignalKind::Tokens, 9}, DType::F64).features, 4);
  Rng rng(4);
  e->init(rng);
  // Padded positions hold an out-of-vocabulary id: it must be neither read nor rejected.
  std::vector<int64_t> ids = {1, 2, 8, 0, 3, 1, 99, 2, 2, 99, 99, 5, 1, 99, 99, 6, 0, 99, 99, 99};
  Tensor tok = Tensor::from_vector<int64_t>({5, 4}, ids);
  Act out = e->forward({tok, kLengths}, true, rng);
  expect_padded_zero(out.data, kLengths, "embedding output");
  // Token 2 (padding_idx) occurs at real positions: its row is read but never trained.
  check_layer_grads(*e, {tok, kLengths}, [](const std::string&, int64_t i) { return i / 4 == 2; });
}

TEST(DropoutGrad, SequenceAndVector) {
  auto dr = make_dropout(0.4);
  dr->build({SignalKind::Sequence, 3}, DType::F64);
  Rng rng(5);
  Tensor x = randn({5, 4, 3}, DType::F64, rng);
  poison_padding(x, kLengths);
  Act out = dr->forward({x, kLengths}, true, rng);
  expect_padded_zero(out.data, kLengths, "dropout output");
  Act gin = dr->backward({randn(out.data.shape(), DType::F64, rng), {}});
  expect_padded_zero(gin.data, kLengths, "dropout d input");
  check_layer_grads(*dr, {x, kLengths});

  auto dv = make_dropout(0.25);
  dv->build({SignalKind::Vector, 6}, DType::F64);
  check_layer_grads(*dv, {randn({8, 6}, DType::F64, rng), {}});
}

TEST(ActivationGrad, ReluTanhAndSigmoid) {
  for (const char* fn : {"relu", "tanh", "sigmoid"}) {
    auto a = make_activation(fn);
    a->build({SignalKind::Sequence, 3}, DType::F64);
    Rng rng(6);
    Tensor x = randn({5, 4, 3}, DType::F64, rng);
    poison_padding(x, kLengths);
    Act out = a->forward({x, kLengths}, true, rng);
    expect_padded_zero(out.data, kLengths, std::string(fn) + " output");
    Act gin = a->backward({randn(out.data.shape(), DType::F64, rng), {}});
    expect_padded_zero(gin.data, kLengths, std::string(fn) + " d input");
    check_layer_grads(*a, {x, kLengths});

    auto v = make_activation(fn);
    v->build({SignalKind::Vector, 5}, DType::F64);
    check_layer_grads(*v, {randn({6, 5}, DType::F64, rng), {}});
  }
}

TEST(LastStepGrad, WithAndWithoutLengths) {
  auto l = make_last_step();
  Signal out = l->build({SignalKind::Sequence, 3}, DType::F64);
  EXPECT_EQ(out.kind, SignalKind::Vector);
  EXPECT_EQ(out.features, 3);
  Rng rng(7);
  Tensor x = randn({5, 4, 3}, DType::F64, rng);
  Act y = l->forward({x, kLengths}, true, rng);
  ASSERT_EQ(y.data.shape(), (Shape{4, 3}));
  EXPECT_EQ(y.lengths, kLengths);
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t f = 0; f < 3; ++f) EXPECT_EQ(y.data.get(b * 3 + f), x.get(((kLengths[b] - 1) * 4 + b) * 3 + f));
  Act gin = l->backward({randn({4, 3}, DType::F64, rng), {}});
  expect_padded_zero(gin.data, kLengths, "last_step d input");
  check_layer_grads(*l, {x, kLengths});

  Act full = l->forward({x, {}}, false, rng);
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t f = 0; f < 3; ++f) EXPECT_EQ(full.data.get(b * 3 + f), x.get((4 * 4 + b) * 3 + f));
  check_layer_grads(*l, {x, {}});
}

TEST(LossGrad, MatchesFiniteDifferencesWithIgnoreAndMask) {
  Rng rng(8);
  const int64_t N = 7, C = 5;
  Tensor logits = randn({N, C}, DType::F64, rng);
  Tensor targets = Tensor::from_vector<int64_t>({N}, {0, 4, -100, 2, 3, 1, 7});
  // Row 6 has an out-of-range target but is masked, so it is never looked at.
  std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1, 0};
  LossResult res = softmax_cross_entropy(logits, targets, -100, mask);
  EXPECT_EQ(res.count, 4);
  for (int64_t r : {2, 3, 6})
    for (int64_t j = 0; j < C; ++j) EXPECT_EQ(res.grad.get(r * C + j), 0.0) << "row " << r;
  std::vector<double> num =
      numeric_grad(logits, [&]() { return softmax_cross_entropy(logits, targets, -100, mask).loss; });
  EXPECT_LT(grad_error(num, res.grad), kMaxRelErr);
}

TEST(Pipeline, EmbeddingDenseTanhDropoutLastStepDenseLoss) {
  // The layers chained the way a model chains them, checked end to end on the loss.
  Rng rng(9);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_embedding(11, 4, 0));
  layers.push_back(make_dense(5));
  layers.push_back(make_activation("tanh"));
  layers.push_back(make_dropout(0.3));
  layers.push_back(make_last_step());
  layers.push_back(make_dense(3));
  Signal s{SignalKind::Tokens, 11};
  for (auto& l : layers) {
    s = l->build(s, DType::F64);
    l->init(rng);
  }
  EXPECT_EQ(s.kind, SignalKind::Vector);
  EXPECT_EQ(s.features, 3);
  std::vector<int64_t> ids(20);
  for (auto& id : ids) id = 1 + static_cast<int64_t>(rng.below(10));  // 0 is padding_idx
  Act in{Tensor::from_vector<int64_t>({5, 4}, ids), kLengths};
  Tensor targets = Tensor::from_vector<int64_t>({4}, {0, 2, 1, 2});
  auto run = [&](bool backward) {
    Rng r(123);
    Act a = in;
    for (auto& l : layers) a = l->forward(a, true, r);
    LossResult res = softmax_cross_entropy(a.data, targets);
    if (backward) {
      Act g{res.grad, a.lengths};
      for (auto it = layers.rbegin(); it != layers.rend(); ++it) g = (*it)->backward(g);
    }
    return res.loss;
  };
  run(true);
  for (auto& l : layers)
    for (Param& p : l->params()) {
      Tensor ana = p.grad.clone();
      std::vector<double> num = numeric_grad(p.value, [&]() { return run(false); });
      EXPECT_LT(grad_error(num, ana), kMaxRelErr) << l->describe() << " " << p.name;
    }
}

// ---- values -------------------------------------------------------------------------------------

TEST(Dense, MatchesNaiveLoopInF32) {
  const int64_t N = 37, I = 19, O = 23;
  auto d = make_dense(O);
  d->build({SignalKind::Vector, I}, DType::F32);
  Rng rng(10);
  d->init(rng);
  std::vector<Param> ps = d->params();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].name, "weight");
  EXPECT_EQ(ps[0].value.shape(), (Shape{O, I}));
  EXPECT_EQ(ps[1].name, "bias");
  EXPECT_EQ(ps[1].value.shape(), (Shape{O}));
  EXPECT_EQ(ps[0].value.dtype(), DType::F32);
  Tensor x = randn({N, I}, DType::F32, rng);
  Act y = d->forward({x, {}}, true, rng);
  const float* w = ps[0].value.data<float>();
  const float* b = ps[1].value.data<float>();
  const float* xp = x.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < I; ++i) acc += static_cast<double>(xp[n * I + i]) * w[o * I + i];
      EXPECT_NEAR(y.data.get(n * O + o), acc, 1e-5 * (1 + std::abs(acc)));
    }

  Tensor g = randn({N, O}, DType::F32, rng);
  Act gx = d->backward({g, {}});
  const float* gp = g.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < I; ++i) {
      double acc = 0;
      for (int64_t o = 0; o < O; ++o) acc += static_cast<double>(gp[n * O + o]) * w[o * I + i];
      EXPECT_NEAR(gx.data.get(n * I + i), acc, 1e-5 * (1 + std::abs(acc)));
    }
  for (int64_t o = 0; o < O; ++o) {
    double db = 0;
    for (int64_t n = 0; n < N; ++n) db += gp[n * O + o];
    EXPECT_NEAR(ps[1].grad.get(o), db, 1e-5 * (1 + std::abs(db)));
    for (int64_t i = 0; i < I; ++i) {
      double dw = 0;
      for (int64_t n = 0; n < N; ++n) dw += static_cast<double>(gp[n * O + o]) * xp[n * I + i];
      EXPECT_NEAR(ps[0].grad.get(o * I + i), dw, 1e-5 * (1 + std::abs(dw)));
    }
  }
  // Gradients accumulate across backward calls, as in PyTorch.
  const double w0 = ps[0].grad.get(0);
  d->forward({x, {}}, true, rng);
  d->backward({g, {}});
  EXPECT_NEAR(ps[0].grad.get(0), 2 * w0, 1e-5 * (1 + std::abs(w0)));
}

TEST(Dense, InitAndDescribe) {
  auto d = make_dense(10);
  EXPECT_EQ(d->describe(), "Dense(? -> 10)");
  d->build({SignalKind::Sequence, 512}, DType::F32);
  EXPECT_EQ(d->describe(), "Dense(512 -> 10)");
  EXPECT_EQ(d->kind(), "dense");
  Rng rng(11);
  for (Param& p : d->params()) {
    for (int64_t i = 0; i < p.grad.numel(); ++i) ASSERT_EQ(p.grad.get(i), 0.0);
  }
  d->init(rng);
  const double bound = 1.0 / std::sqrt(512.0);
  for (Param& p : d->params()) {
    double mx = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i) mx = std::max(mx, std::abs(p.value.get(i)));
    EXPECT_LE(mx, bound) << p.name;
    if (p.name == "weight") {
      EXPECT_GT(mx, 0.99 * bound);  // 5120 draws reach the edge
    }
  }
  // Uniform on [-b, b] has variance b^2 / 3.
  Tensor w = d->params()[0].value;
  double var = 0;
  for (int64_t i = 0; i < w.numel(); ++i) var += w.get(i) * w.get(i);
  var /= static_cast<double>(w.numel());
  EXPECT_NEAR(var, bound * bound / 3, 0.05 * bound * bound / 3);
}

TEST(Embedding, PaddingIdxAndInit) {
  auto e = make_embedding(300, 16, 7);
  EXPECT_EQ(e->describe(), "Embedding(300, 16, padding_idx=7)");
  e->build({SignalKind::Tokens, 300}, DType::F64);
  Rng rng(12);
  e->init(rng);
  Tensor w = e->params()[0].value;
  EXPECT_EQ(e->params()[0].name, "weight");
  EXPECT_EQ(w.shape(), (Shape{300, 16}));
  double mean = 0, sq = 0;
  int64_t zeros = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    mean += w.get(i);
    sq += w.get(i) * w.get(i);
    zeros += w.get(i) == 0.0;
  }
  EXPECT_EQ(zeros, 16);
  for (int64_t j = 0; j < 16; ++j) EXPECT_EQ(w.get(7 * 16 + j), 0.0);
  const double n = static_cast<double>(w.numel() - 16);
  EXPECT_NEAR(mean / n, 0.0, 0.05);
  EXPECT_NEAR(sq / n, 1.0, 0.05);

  // A padding token looks up its (zero) row and its row gets no gradient; others accumulate.
  Tensor tok = Tensor::from_vector<int64_t>({2, 3}, {7, 1, 1, 7, 2, 1});
  Act y = e->forward({tok, {}}, true, rng);
  for (int64_t j = 0; j < 16; ++j) {
    EXPECT_EQ(y.data.get(0 * 16 + j), 0.0);
    EXPECT_EQ(y.data.get(1 * 16 + j), w.get(1 * 16 + j));
  }
  Tensor g = Tensor::full({2, 3, 16}, 1.0, DType::F64);
  Act gin = e->backward({g, {}});
  EXPECT_FALSE(gin.data.defined());
  Tensor gw = e->params()[0].grad;
  for (int64_t j = 0; j < 16; ++j) {
    EXPECT_EQ(gw.get(7 * 16 + j), 0.0);
    EXPECT_EQ(gw.get(1 * 16 + j), 3.0);
    EXPECT_EQ(gw.get(2 * 16 + j), 1.0);
    EXPECT_EQ(gw.get(0 * 16 + j), 0.0);
  }
}

TEST(Dropout, StatisticsScalingAndEval) {
  const double p = 0.3;
  auto dr = make_dropout(p);
  EXPECT_EQ(dr->describe(), "Dropout(p=0.3)");
  dr->build({SignalKind::Vector, 500}, DType::F32);
  Rng rng(13);
  Tensor x = Tensor::empty({400, 500}, DType::F32);
  rng.fill_uniform(x, 0.5, 1.5);  // never zero, so a zero output means dropped
  Act y = dr->forward({x, {}}, true, rng);
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = y.data.get(i);
    if (v == 0.0)
      ++dropped;
    else
      ASSERT_NEAR(v, x.get(i) / (1 - p), 1e-6) << i;
  }
  const double frac = static_cast<double>(dropped) / static_cast<double>(x.numel());
  EXPECT_NEAR(frac, p, 0.005);  // sd of the fraction is ~0.001 over 200000 draws
  // The backward applies the same mask.
  Act g = dr->backward({Tensor::full({400, 500}, 1.0, DType::F32), {}});
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(g.data.get(i) == 0.0, y.data.get(i) == 0.0) << i;

  Act e = dr->forward({x, {}}, false, rng);
  EXPECT_EQ(max_abs_diff(e.data, x), 0.0);
  EXPECT_THROW(dr->backward({x, {}}), Error);

  auto all = make_dropout(1.0);
  all->build({SignalKind::Vector, 500}, DType::F32);
  Act z = all->forward({x, {}}, true, rng);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(z.data.get(i), 0.0);
  auto none = make_dropout(0.0);
  none->build({SignalKind::Vector, 500}, DType::F32);
  EXPECT_EQ(max_abs_diff(none->forward({x, {}}, true, rng).data, x), 0.0);
}

TEST(Activation, Values) {
  auto r = make_activation("relu");
  auto t = make_activation("tanh");
  EXPECT_EQ(r->describe(), "ReLU");
  EXPECT_EQ(t->describe(), "Tanh");
  r->build({SignalKind::Vector, 4}, DType::F64);
  t->build({SignalKind::Vector, 4}, DType::F64);
  Tensor x = Tensor::from_vector<double>({1, 4}, {-2.0, -0.0, 0.5, 3.0});
  Rng rng(14);
  Act yr = r->forward({x, {}}, true, rng);
  Act yt = t->forward({x, {}}, true, rng);
  std::vector<double> er = {0, 0, 0.5, 3.0};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(yr.data.get(i), er[i]);
    EXPECT_DOUBLE_EQ(yt.data.get(i), std::tanh(x.get(i)));
  }
  // ReLU's gradient at 0 is 0, as torch's threshold_backward gives.
  Act gr = r->backward({Tensor::full({1, 4}, 1.0, DType::F64), {}});
  std::vector<double> eg = {0, 0, 1, 1};
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(gr.data.get(i), eg[i]);
}

// torch.sigmoid's values, also where exp(-x) would overflow (no NaN, 1 - y kept for x < 0);
// the backward is dy * y * (1 - y).
TEST(Activation, SigmoidValuesAndBackward) {
  auto s = make_activation("sigmoid");
  EXPECT_EQ(s->describe(), "Sigmoid");
  EXPECT_TRUE(s->params().empty());
  EXPECT_EQ(s->to_json(), nlohmann::json::parse(R"({"type":"activation","fn":"sigmoid"})"));
  EXPECT_EQ(layer_from_json(s->to_json())->describe(), "Sigmoid");
  s->build({SignalKind::Vector, 6}, DType::F64);
  Tensor x = Tensor::from_vector<double>({1, 6}, {-800.0, -30.0, -1.0, 0.0, 2.0, 800.0});
  Rng rng(15);
  Act y = s->forward({x, {}}, true, rng);
  for (int64_t i = 0; i < 6; ++i) {
    const double want = 1.0 / (1.0 + std::exp(-x.get(i)));
    EXPECT_NEAR(y.data.get(i), want, 1e-15 * std::max(1.0, want)) << x.get(i);
  }
  EXPECT_EQ(y.data.get(0), 0.0);
  EXPECT_EQ(y.data.get(3), 0.5);
  EXPECT_EQ(y.data.get(5), 1.0);
  EXPECT_NEAR(y.data.get(1), std::exp(-30.0), 1e-25);  // relative precision kept far left
  Tensor dy = Tensor::from_vector<double>({1, 6}, {1, 1, 2, 3, -1, 1});
  Act g = s->backward({dy, {}});
  for (int64_t i = 0; i < 6; ++i) {
    const double yi = y.data.get(i);
    EXPECT_DOUBLE_EQ(g.data.get(i), dy.get(i) * yi * (1 - yi)) << i;
  }
  EXPECT_DOUBLE_EQ(g.data.get(3), 0.75);
  // F32 agrees with F64.
  auto s32 = make_activation("sigmoid");
  s32->build({SignalKind::Vector, 6}, DType::F32);
  Act y32 = s32->forward({x.to(DType::F32), {}}, false, rng);
  for (int64_t i = 0; i < 6; ++i) EXPECT_NEAR(y32.data.get(i), y.data.get(i), 1e-7);
}

TEST(Loss, HandComputedValues) {
  // Uniform logits: loss log(C), gradient 1/C - onehot over the count.
  Tensor logits = Tensor::zeros({2, 4}, DType::F32);
  Tensor targets = Tensor::from_vector<int64_t>({2}, {1, 3});
  LossResult res = softmax_cross_entropy(logits, targets);
  EXPECT_NEAR(res.loss, std::log(4.0), 1e-6);
  EXPECT_EQ(res.count, 2);
  EXPECT_EQ(res.grad.dtype(), DType::F32);
  EXPECT_NEAR(res.grad.get(0), 0.125, 1e-7);
  EXPECT_NEAR(res.grad.get(1), (0.25 - 1) / 2, 1e-7);

  // Large logits stay finite (log-sum-exp with the max subtracted).
  Tensor big = Tensor::from_vector<float>({1, 3}, {1000.f, 0.f, -1000.f});
  Tensor t0 = Tensor::from_vector<int64_t>({1}, {1});
  LossResult b = softmax_cross_entropy(big, t0);
  EXPECT_NEAR(b.loss, 1000.0, 1e-3);
  EXPECT_FALSE(has_non_finite(b.grad));
  EXPECT_EQ(b.correct, 0);

  Tensor l2 = Tensor::from_vector<double>({3, 2}, {2.0, 1.0, 0.0, 3.0, 1.0, 1.0});
  LossResult c = softmax_cross_entropy(l2, Tensor::from_vector<int64_t>({3}, {0, 0, 1}));
  const double e = std::log1p(std::exp(-1.0)), f = std::log1p(std::exp(3.0)), g = std::log(2.0);
  EXPECT_NEAR(c.loss, (e + f + g) / 3, 1e-12);
  EXPECT_EQ(c.correct, 1);  // row 2 ties: argmax picks class 0, the target is 1

  // Nothing counted: loss 0 and a zero gradient, not NaN.
  LossResult none = softmax_cross_entropy(l2, Tensor::from_vector<int64_t>({3}, {-100, -100, -100}));
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.loss, 0.0);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(none.grad.get(i), 0.0);

  std::vector<double> p = softmax_row(l2, 0);
  EXPECT_NEAR(p[0], 1 / (1 + std::exp(-1.0)), 1e-12);
  std::vector<double> pt = softmax_row(l2, 0, 2.0);
  EXPECT_NEAR(pt[0], 1 / (1 + std::exp(-0.5)), 1e-12);
  EXPECT_THROW(softmax_row(l2, 3), Error);
  EXPECT_THROW(softmax_row(l2, 0, 0.0), Error);
}

TEST(LargeShapes, ParallelPathsMatchNaiveLoops) {
  // Big enough for the kernels' OpenMP branches; the naive loops are serial.
  const int64_t T = 40, B = 30, V = 500, E = 64;
  Rng rng(17);
  std::vector<int64_t> lengths(B);
  for (auto& l : lengths) l = 1 + static_cast<int64_t>(rng.below(T));
  std::vector<int64_t> ids(T * B);
  for (auto& id : ids) id = static_cast<int64_t>(rng.below(V));
  auto e = make_embedding(V, E, 3);
  e->build({SignalKind::Tokens, V}, DType::F64);
  e->init(rng);
  auto d = make_dense(E);
  d->build({SignalKind::Sequence, E}, DType::F64);
  d->init(rng);
  auto a = make_activation("tanh");
  a->build({SignalKind::Sequence, E}, DType::F64);
  Act x{Tensor::from_vector<int64_t>({T, B}, ids), lengths};
  Act h = a->forward(d->forward(e->forward(x, true, rng), true, rng), true, rng);
  expect_padded_zero(h.data, lengths, "tanh(dense(embedding)) output");
  Tensor g = randn(h.data.shape(), DType::F64, rng);
  Act gd = d->backward(a->backward({g, lengths}));
  expect_padded_zero(gd.data, lengths, "dense d input");
  e->backward(gd);

  // Dense bias gradient: the sum of the tanh-backward gradient over real rows.
  std::vector<double> db(E, 0.0), dw_row(static_cast<size_t>(V * E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      if (t >= lengths[b]) continue;
      for (int64_t f = 0; f < E; ++f) {
        const int64_t i = (t * B + b) * E + f;
        const double y = h.data.get(i);
        db[f] += g.get(i) * (1 - y * y);
        if (ids[t * B + b] != 3) dw_row[ids[t * B + b] * E + f] += gd.data.get(i);
      }
    }
  Tensor dbias = d->params()[1].grad, demb = e->params()[0].grad;
  for (int64_t f = 0; f < E; ++f) EXPECT_NEAR(dbias.get(f), db[f], 1e-10 * (1 + std::abs(db[f])));
  double err = 0;
  for (int64_t i = 0; i < V * E; ++i) err = std::max(err, std::abs(demb.get(i) - dw_row[i]));
  EXPECT_LT(err, 1e-10);
}

// ---- errors -------------------------------------------------------------------------------------

TEST(Errors, BadTokenId) {
  auto e = make_embedding(50, 8);
  e->build({SignalKind::Tokens, 50}, DType::F32);
  Rng rng(15);
  Tensor tok = Tensor::from_vector<int64_t>({2, 2}, {1, 2, 3, 57});
  std::string m = thrown_message([&] { e->forward({tok, {}}, false, rng); });
  EXPECT_NE(m.find("token id 57"), std::string::npos) << m;
  EXPECT_NE(m.find("step 1, sequence 1"), std::string::npos) << m;
  EXPECT_NE(m.find("[0, 50)"), std::string::npos) << m;
  Tensor neg = Tensor::from_vector<int64_t>({1, 1}, {-3});
  m = thrown_message([&] { e->forward({neg, {}}, false, rng); });
  EXPECT_NE(m.find("token id -3"), std::string::npos) << m;
}

TEST(Errors, WrongSignalKind) {
  std::string m = thrown_message([] { make_dense(4)->build({SignalKind::Tokens, 100}, DType::F32); });
  EXPECT_NE(m.find("expected a sequence or a vector"), std::string::npos) << m;
  EXPECT_NE(m.find("got tokens"), std::string::npos) << m;
  m = thrown_message([] { make_embedding(10, 4)->build({SignalKind::Sequence, 16}, DType::F32); });
  EXPECT_NE(m.find("expected tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("got sequence of 16 features"), std::string::npos) << m;
  m = thrown_message([] { make_last_step()->build({SignalKind::Vector, 16}, DType::F32); });
  EXPECT_NE(m.find("expected a sequence"), std::string::npos) << m;
  EXPECT_NE(m.find("got vector of 16 features"), std::string::npos) << m;
  EXPECT_THROW(make_dense(4)->build({SignalKind::Vector, 3}, DType::I64), Error);
}

TEST(Errors, BadTargetAndShapes) {
  Tensor logits = Tensor::zeros({3, 5}, DType::F64);
  std::string m =
      thrown_message([&] { softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({3}, {0, 1, 7})); });
  EXPECT_NE(m.find("target 7"), std::string::npos) << m;
  EXPECT_NE(m.find("row 2"), std::string::npos) << m;
  EXPECT_NE(m.find("[0, 5)"), std::string::npos) << m;
  m = thrown_message([&] { softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({3}, {0, -1, 0})); });
  EXPECT_NE(m.find("target -1"), std::string::npos) << m;
  EXPECT_THROW(softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({2}, {0, 1})), Error);
  EXPECT_THROW(softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({3}, {0, 1, 1}), -100, {1, 1}), Error);
}

TEST(Errors, ForwardShapesLengthsAndBackwardOrder) {
  auto d = make_dense(4);
  Rng rng(16);
  EXPECT_THROW(d->forward({Tensor::zeros({2, 3}), {}}, false, rng), Error);  // not built
  d->build({SignalKind::Sequence, 3}, DType::F32);
  std::string m = thrown_message([&] { d->backward({Tensor::zeros({2, 2, 4}), {}}); });
  EXPECT_NE(m.find("training-mode forward"), std::string::npos) << m;
  m = thrown_message([&] { d->forward({Tensor::zeros({2, 2, 5}), {}}, true, rng); });
  EXPECT_NE(m.find("[T, B, 3]"), std::string::npos) << m;
  m = thrown_message([&] { d->forward({Tensor::zeros({2, 2, 3}, DType::F64), {}}, true, rng); });
  EXPECT_NE(m.find("expected F32 input, got F64"), std::string::npos) << m;
  m = thrown_message([&] { d->forward({Tensor::zeros({2, 2, 3}), {1, 3}}, true, rng); });
  EXPECT_NE(m.find("length 3"), std::string::npos) << m;
  EXPECT_THROW(d->forward({Tensor::zeros({2, 2, 3}), {1}}, true, rng), Error);
  d->forward({Tensor::zeros({2, 2, 3}), {}}, true, rng);
  m = thrown_message([&] { d->backward({Tensor::zeros({2, 2, 3}), {}}); });
  EXPECT_NE(m.find("gradient shape"), std::string::npos) << m;
  d->forward({Tensor::zeros({2, 2, 3}), {}}, false, rng);
  EXPECT_THROW(d->backward({Tensor::zeros({2, 2, 4}), {}}), Error);
  EXPECT_THROW(make_dense(0), Error);
  EXPECT_THROW(make_dropout(1.5), Error);
  EXPECT_THROW(make_activation("gelu"), Error);
  EXPECT_THROW(make_embedding(10, 4, 10), Error);
}

// ---- JSON ---------------------------------------------------------------------------------------

TEST(LayerJson, RoundTrip) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(make_embedding(100, 16, 0));
  layers.push_back(make_embedding(100, 16));
  layers.push_back(make_dense(10));
  layers.push_back(make_dense(7, false));
  layers.push_back(make_dropout(0.25));
  layers.push_back(make_activation("relu"));
  layers.push_back(make_activation("tanh"));
  layers.push_back(make_last_step());
  LstmSpec spec;
  spec.hidden_size = 32;
  spec.num_layers = 2;
  spec.bidirectional = true;
  spec.dropout = 0.1;
  layers.push_back(make_lstm(spec, "h_n"));
  for (auto& l : layers) {
    nlohmann::json j = l->to_json();
    auto back = layer_from_json(j);
    EXPECT_EQ(back->to_json(), j) << j.dump();
    EXPECT_EQ(back->kind(), l->kind());
    EXPECT_EQ(back->describe(), l->describe());
  }
  EXPECT_EQ(make_dense(10)->to_json(), nlohmann::json::parse(R"({"type":"dense","out_features":10,"bias":true})"));
  EXPECT_EQ(make_activation("relu")->to_json(), nlohmann::json::parse(R"({"type":"activation","fn":"relu"})"));

  // Defaults for optional fields.
  auto l = layer_from_json(nlohmann::json::parse(R"({"type":"lstm","hidden_size":8})"));
  EXPECT_EQ(l->kind(), "lstm");
  EXPECT_EQ(l->build({SignalKind::Sequence, 5}, DType::F64).features, 8);
  auto e = layer_from_json(nlohmann::json::parse(R"({"type":"embedding","num_embeddings":5,"embedding_dim":2})"));
  EXPECT_EQ(e->to_json()["padding_idx"], -1);
}

TEST(LayerJson, Errors) {
  auto msg = [](const char* text) {
    return thrown_message([&] { layer_from_json(nlohmann::json::parse(text)); });
  };
  std::string m = msg(R"({"type":"conv","out_features":3})");
  EXPECT_NE(m.find("unknown type \"conv\""), std::string::npos) << m;
  m = msg(R"({"type":"dense"})");
  EXPECT_NE(m.find("\"out_features\""), std::string::npos) << m;
  EXPECT_NE(m.find("missing"), std::string::npos) << m;
  EXPECT_NE(m.find(R"({"type":"dense"})"), std::string::npos) << m;
  m = msg(R"({"type":"dense","out_features":"ten"})");
  EXPECT_NE(m.find("\"out_features\" must be an integer"), std::string::npos) << m;
  m = msg(R"({"type":"dense","out_features":3.5})");
  EXPECT_NE(m.find("must be an integer"), std::string::npos) << m;
  m = msg(R"({"type":"dense","out_features":3,"bais":false})");
  EXPECT_NE(m.find("unknown field \"bais\""), std::string::npos) << m;
  m = msg(R"({"type":"lstm","num_layers":2})");
  EXPECT_NE(m.find("\"hidden_size\""), std::string::npos) << m;
  m = msg(R"({"type":"lstm","hidden_size":4,"bidirectional":"yes"})");
  EXPECT_NE(m.find("\"bidirectional\" must be true or false"), std::string::npos) << m;
  m = msg(R"({"type":"dropout","p":"0.5"})");
  EXPECT_NE(m.find("\"p\" must be a number"), std::string::npos) << m;
  m = msg(R"({"out_features":3})");
  EXPECT_NE(m.find("\"type\""), std::string::npos) << m;
  m = msg(R"([1, 2])");
  EXPECT_NE(m.find("must be an object"), std::string::npos) << m;
}

// ---- Regression losses ---------------------------------------------------------------------------

// torch.nn.MSELoss()(p, y) and torch.nn.HuberLoss(delta=1.0)(p, y) for p = [[0.5, -2], [3, 1]],
// y = [[0, 0], [1, 1]]: differences 0.5, -2, 2, 0 -> MSE (0.25 + 4 + 4 + 0) / 4 = 2.0625;
// Huber (0.125 + 1.5 + 1.5 + 0) / 4 = 0.78125. Gradients: MSE 2 d / 4; Huber clip(d, +-delta) / 4.
TEST(RegressionLoss, HandComputedValuesAndGradients) {
  Tensor p = Tensor::from_vector<double>({2, 2}, {0.5, -2, 3, 1});
  Tensor y = Tensor::from_vector<float>({2, 2}, {0, 0, 1, 1});
  LossResult m = regression_loss(p, y);
  EXPECT_DOUBLE_EQ(m.loss, 2.0625);
  EXPECT_EQ(m.count, 4);
  const std::vector<double> gm = {0.25, -1, 1, 0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(m.grad.get(i), gm[static_cast<size_t>(i)]) << i;
  LossResult h = regression_loss(p, y, RegressionLoss::Huber, 1.0);
  EXPECT_DOUBLE_EQ(h.loss, 0.78125);
  const std::vector<double> gh = {0.125, -0.25, 0.25, 0};
  for (int64_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(h.grad.get(i), gh[static_cast<size_t>(i)]) << i;
  // delta 3: every difference is inside, Huber = MSE / 2.
  EXPECT_DOUBLE_EQ(regression_loss(p, y, RegressionLoss::Huber, 3.0).loss, 2.0625 / 2);
  EXPECT_EQ(m.grad.dtype(), DType::F64);
  EXPECT_THROW(regression_loss(p, Tensor::zeros({4}, DType::F32)), Error);
  EXPECT_THROW(regression_loss(p, y, RegressionLoss::Huber, 0.0), Error);
  EXPECT_THROW(regression_loss(p, Tensor::zeros({2, 2}, DType::I64)), Error);
}

TEST(RegressionLoss, GradientMatchesFiniteDifferences) {
  Rng rng(23);
  Tensor p = randn({3, 4}, DType::F64, rng);
  Tensor y = randn({3, 4}, DType::F64, rng);
  for (RegressionLoss kind : {RegressionLoss::MSE, RegressionLoss::Huber}) {
    LossResult r = regression_loss(p, y, kind, 0.7);
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double eps = 1e-6, x = p.get(i);
      // Steer clear of Huber's kink at |d| = delta, where the two sides differ.
      if (kind == RegressionLoss::Huber && std::abs(std::abs(x - y.get(i)) - 0.7) < 1e-3) continue;
      p.data<double>()[i] = x + eps;
      const double up = regression_loss(p, y, kind, 0.7).loss;
      p.data<double>()[i] = x - eps;
      const double down = regression_loss(p, y, kind, 0.7).loss;
      p.data<double>()[i] = x;
      EXPECT_NEAR(r.grad.get(i), (up - down) / (2 * eps), 1e-8) << i;
    }
  }
}
