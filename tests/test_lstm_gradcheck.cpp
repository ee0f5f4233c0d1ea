// The reference LSTM's backward against central finite differences of its own forward (f64),
// plus the packed-sequence semantics and the user-facing errors of the LSTM op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

using namespace lstm;
using lstm::testing::make_spec;

namespace {

struct Case {
  std::string name;
  LstmSpec spec;
  int64_t T = 4, B = 3;
  std::vector<int64_t> lengths;  // empty: all T
  bool with_h0 = false;
};
// What ctest and gtest print for a case: its name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Everything one forward needs, drawn from a seed.
struct Problem {
  LstmSpec spec;
  std::vector<Tensor> w;
  LstmInput in;
  LstmGradOutput cot;  // the loss is sum(output*d_output) + sum(h_n*d_h_n) + sum(c_n*d_c_n)
};

Tensor randn(const Shape& s, Rng& rng, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F64);
  rng.fill_normal(t, 0.0, scale);
  return t;
}

Shape input_shape(const LstmSpec& s, int64_t T, int64_t B) {
  return s.batch_first ? Shape{B, T, s.input_size} : Shape{T, B, s.input_size};
}

// Flat index of (t, b, k) in a [T, B, F] tensor, or [B, T, F] when batch_first.
int64_t at(const LstmSpec& s, int64_t T, int64_t B, int64_t F, int64_t t, int64_t b, int64_t k) {
  return s.batch_first ? (b * T + t) * F + k : (t * B + b) * F + k;
}

Problem make_problem(const Case& c, uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.spec = c.spec;
  const LstmSpec& s = p.spec;
  for (const auto& n : s.param_names()) p.w.push_back(Tensor::empty(s.param_shape(n), DType::F64));
  // Wider than PyTorch's default init so that the gates leave their linear region and the
  // check exercises the nonlinearities.
  for (auto& w : p.w) rng.fill_uniform(w, -0.8, 0.8);
  p.in.x = randn(input_shape(s, c.T, c.B), rng);
  p.in.lengths = c.lengths;
  const int64_t LD = s.num_layers * s.directions();
  if (c.with_h0) {
    p.in.h0 = randn({LD, c.B, s.out_size()}, rng, 0.5);
    p.in.c0 = randn({LD, c.B, s.hidden_size}, rng, 0.5);
  }
  const int64_t Fo = s.directions() * s.out_size();
  p.cot.d_output = randn(s.batch_first ? Shape{c.B, c.T, Fo} : Shape{c.T, c.B, Fo}, rng);
  p.cot.d_h_n = randn({LD, c.B, s.out_size()}, rng);
  p.cot.d_c_n = randn({LD, c.B, s.hidden_size}, rng);
  return p;
}

double dot(const Tensor& a, const Tensor& b) {
  double acc = 0;
  for (int64_t i = 0; i < a.numel(); ++i) acc += a.get(i) * b.get(i);
  return acc;
}

constexpr uint64_t kDropoutSeed = 777;

double loss(Problem& p) {
  // A fresh Rng with the same seed for every evaluation: the dropout mask is a constant of the loss.
  Rng rng(kDropoutSeed);
  LstmOutput o = lstm::testing::reference_backend(p.spec, DType::F64)->forward(p.w, p.in, /*training=*/true, &rng, nullptr,
                                                                              ExecContext::cpu());
  return dot(o.output, p.cot.d_output) + dot(o.h_n, p.cot.d_h_n) + dot(o.c_n, p.cot.d_c_n);
}

struct Analytic {
  LstmOutput out;
  LstmGrads g;
  std::vector<Tensor> dw;
};

Analytic analytic(Problem& p) {
  auto be_owner = lstm::testing::reference_backend(p.spec, DType::F64);
  LstmBackend& be = *be_owner;
  Rng rng(kDropoutSeed);
  std::unique_ptr<LstmSaved> saved;
  Analytic a;
  a.out = be.forward(p.w, p.in, true, &rng, &saved, ExecContext::cpu());
  for (const auto& w : p.w) a.dw.push_back(Tensor::zeros(w.shape(), DType::F64));
  a.g = be.backward(p.w, *saved, p.cot, a.dw, ExecContext::cpu());
  return a;
}

// Central differences of the loss w.r.t. every element of `t` (a tensor inside p).
Tensor numeric_grad(Problem& p, Tensor& t, double eps = 1e-6) {
  Tensor g = Tensor::zeros(t.shape(), DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.get(i);
    t.set(i, v + eps);
    const double lp = loss(p);
    t.set(i, v - eps);
    const double lm = loss(p);
    t.set(i, v);
    g.set(i, (lp - lm) / (2 * eps));
  }
  return g;
}

void expect_close(const Tensor& analytic_g, const Tensor& numeric_g, const std::string& what) {
  ASSERT_TRUE(analytic_g.defined()) << what;
  ASSERT_EQ(analytic_g.shape(), numeric_g.shape()) << what;
  double err = rel_l2_error(analytic_g, numeric_g);
  EXPECT_LT(err, 1e-6) << what << ": relative L2 error " << err << " (max abs diff "
                       << max_abs_diff(analytic_g, numeric_g) << ")";
}


std::vector<Case> gradcheck_cases() {
  return {
      {"uni_l1", make_spec(3, 4, 1), 4, 3, {}, false},
      {"uni_l2_h0", make_spec(3, 4, 2), 4, 3, {}, true},
      {"bi_l1", make_spec(2, 3, 1, true), 4, 2, {}, true},
      {"bi_l2_varlen", make_spec(3, 3, 2, true), 5, 3, {5, 1, 3}, true},
      {"proj_uni_l2", make_spec(3, 4, 2, false, 2), 4, 2, {}, true},
      {"proj_bi_l2_varlen", make_spec(2, 4, 2, true, 3), 5, 3, {2, 5, 1}, true},
      {"batch_first_bi_varlen", make_spec(3, 3, 2, true, 0, true, true), 5, 3, {4, 1, 5}, true},
      {"varlen_uni_l1", make_spec(2, 3, 1), 6, 4, {6, 1, 3, 2}, false},
      {"nobias_bi_l2", make_spec(3, 3, 2, true, 0, false), 4, 2, {4, 2}, true},
      {"nobias_proj_l2", make_spec(3, 4, 2, false, 2, false), 4, 2, {}, false},
      {"dropout_uni_l3", make_spec(3, 3, 3, false, 0, true, false, 0.4), 4, 3, {4, 2, 3}, true},
      {"dropout_bi_proj_l2_bf", make_spec(2, 4, 2, true, 2, true, true, 0.5), 5, 3, {3, 5, 1}, true},
  };
}

class GradCheck : public ::testing::TestWithParam<Case> {};

TEST_P(GradCheck, BackwardMatchesCentralDifferences) {
  const Case& c = GetParam();
  Problem p = make_problem(c, 1234 + c.T * 17 + c.B);
  Analytic a = analytic(p);
  ASSERT_FALSE(has_non_finite(a.out.output));

  expect_close(a.g.d_x, numeric_grad(p, p.in.x), "d_x");
  if (c.with_h0) {
    expect_close(a.g.d_h0, numeric_grad(p, p.in.h0), "d_h0");
    expect_close(a.g.d_c0, numeric_grad(p, p.in.c0), "d_c0");
  } else {
    EXPECT_FALSE(a.g.d_h0.defined());
    EXPECT_FALSE(a.g.d_c0.defined());
  }
  auto names = p.spec.param_names();
  for (size_t i = 0; i < names.size(); ++i) expect_close(a.dw[i], numeric_grad(p, p.w[i]), "d " + names[i]);
}

TEST_P(GradCheck, GradientsAccumulateIntoDWeights) {
  // backward adds into d_weights: a second backward from the same saved state doubles them.
  const Case& c = GetParam();
  Problem p = make_problem(c, 99);
  auto be_owner = lstm::testing::reference_backend(p.spec, DType::F64);
  LstmBackend& be = *be_owner;
  Rng rng(kDropoutSeed);
  std::unique_ptr<LstmSaved> saved;
  be.forward(p.w, p.in, true, &rng, &saved, ExecContext::cpu());
  std::vector<Tensor> once, twice;
  for (const auto& w : p.w) {
    once.push_back(Tensor::zeros(w.shape(), DType::F64));
    twice.push_back(Tensor::zeros(w.shape(), DType::F64));
  }
  LstmGrads g1 = be.backward(p.w, *saved, p.cot, once, ExecContext::cpu());
  be.backward(p.w, *saved, p.cot, twice, ExecContext::cpu());
  LstmGrads g2 = be.backward(p.w, *saved, p.cot, twice, ExecContext::cpu());
  EXPECT_EQ(max_abs_diff(g1.d_x, g2.d_x), 0.0) << "a backward must not consume its saved state";
  for (size_t i = 0; i < once.size(); ++i) {
    Tensor doubled = once[i].clone();
    for (int64_t k = 0; k < doubled.numel(); ++k) doubled.set(k, 2 * doubled.get(k));
    EXPECT_LT(rel_l2_error(twice[i], doubled), 1e-14) << p.spec.param_names()[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, GradCheck, ::testing::ValuesIn(gradcheck_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- packed-sequence semantics ---------------------------------------------------------------

struct Semantics : ::testing::TestWithParam<Case> {};

TEST_P(Semantics, PoisonPastLengthsChangesNothing) {
  const Case& c = GetParam();
  Problem zeros = make_problem(c, 5);
  Problem poison = make_problem(c, 5);
  const LstmSpec& s = c.spec;
  const double inf = std::numeric_limits<double>::infinity();
  const double poison_values[3] = {std::numeric_limits<double>::quiet_NaN(), inf, -inf};
  int poisoned = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = c.lengths[b]; t < c.T; ++t)
      for (int64_t k = 0; k < s.input_size; ++k) {
        const int64_t i = at(s, c.T, c.B, s.input_size, t, b, k);
        zeros.in.x.set(i, 0.0);
        poison.in.x.set(i, poison_values[poisoned++ % 3]);
      }
  ASSERT_GT(poisoned, 0);
  // d_output past a length is documented as ignored: poison it too.
  const int64_t Fo = s.directions() * s.out_size();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = c.lengths[b]; t < c.T; ++t)
      for (int64_t k = 0; k < Fo; ++k) {
        const int64_t i = at(s, c.T, c.B, Fo, t, b, k);
        zeros.cot.d_output.set(i, 0.0);
        poison.cot.d_output.set(i, poison_values[poisoned++ % 3]);
      }
  Analytic az = analytic(zeros), ap = analytic(poison);
  ASSERT_FALSE(has_non_finite(ap.out.output));
  ASSERT_FALSE(has_non_finite(ap.out.h_n));
  ASSERT_FALSE(has_non_finite(ap.out.c_n));
  ASSERT_FALSE(has_non_finite(ap.g.d_x));
  EXPECT_EQ(max_abs_diff(ap.out.output, az.out.output), 0.0);
  EXPECT_EQ(max_abs_diff(ap.out.h_n, az.out.h_n), 0.0);
  EXPECT_EQ(max_abs_diff(ap.out.c_n, az.out.c_n), 0.0);
  EXPECT_EQ(max_abs_diff(ap.g.d_x, az.g.d_x), 0.0);
  for (size_t i = 0; i < ap.dw.size(); ++i) {
    ASSERT_FALSE(has_non_finite(ap.dw[i])) << s.param_names()[i];
    EXPECT_EQ(max_abs_diff(ap.dw[i], az.dw[i]), 0.0) << s.param_names()[i];
  }
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = c.lengths[b]; t < c.T; ++t)
      for (int64_t k = 0; k < s.input_size; ++k)
        EXPECT_EQ(ap.g.d_x.get(at(s, c.T, c.B, s.input_size, t, b, k)), 0.0) << "t=" << t << " b=" << b;
}

TEST_P(Semantics, OutputPastLengthsIsExactlyZero) {
  const Case& c = GetParam();
  Problem p = make_problem(c, 6);
  Analytic a = analytic(p);
  const LstmSpec& s = c.spec;
  const int64_t Fo = s.directions() * s.out_size();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t k = 0; k < Fo; ++k) {
        double v = a.out.output.get(at(s, c.T, c.B, Fo, t, b, k));
        if (t >= c.lengths[b]) {
          EXPECT_EQ(v, 0.0) << "t=" << t << " b=" << b << " k=" << k;
        } else {
          EXPECT_NE(v, 0.0) << "t=" << t << " b=" << b << " k=" << k;
        }
      }
}

TEST_P(Semantics, HnIsTheOutputAtEachSequencesOwnLastStep) {
  const Case& c = GetParam();
  Problem p = make_problem(c, 7);
  // In inference too: h_n must not depend on whether state is saved.
  LstmOutput o = lstm::testing::reference_backend(c.spec, DType::F64)->forward(p.w, p.in, false, nullptr, nullptr,
                                                                                  ExecContext::cpu());
  const LstmSpec& s = c.spec;
  const int64_t Ho = s.out_size(), D = s.directions(), Fo = D * Ho, top = (s.num_layers - 1) * D;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t k = 0; k < Ho; ++k) {
      EXPECT_EQ(o.h_n.get(((top + 0) * c.B + b) * Ho + k), o.output.get(at(s, c.T, c.B, Fo, c.lengths[b] - 1, b, k)))
          << "forward direction, b=" << b;
      if (D == 2) {
        EXPECT_EQ(o.h_n.get(((top + 1) * c.B + b) * Ho + k), o.output.get(at(s, c.T, c.B, Fo, 0, b, Ho + k)))
            << "reverse direction, b=" << b;
      }
    }
}

TEST_P(Semantics, ReverseDirectionStartsAtEachSequencesOwnEnd) {
  // A sequence run alone, truncated to its length, must give the same numbers as inside the
  // padded batch: nothing past its length may leak into the reverse direction.
  const Case& c = GetParam();
  Problem p = make_problem(c, 8);
  const LstmSpec& s = c.spec;
  auto be_owner = lstm::testing::reference_backend(s, DType::F64);
  LstmBackend& be = *be_owner;
  LstmOutput full = be.forward(p.w, p.in, false, nullptr, nullptr, ExecContext::cpu());
  const int64_t Ho = s.out_size(), H = s.hidden_size, Fo = s.directions() * Ho;
  const int64_t LD = s.num_layers * s.directions();
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t n = c.lengths[b];
    LstmInput one;
    one.x = Tensor::empty(input_shape(s, n, 1), DType::F64);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < s.input_size; ++k)
        one.x.set(at(s, n, 1, s.input_size, t, 0, k), p.in.x.get(at(s, c.T, c.B, s.input_size, t, b, k)));
    if (p.in.h0.defined()) {
      one.h0 = Tensor::empty({LD, 1, Ho}, DType::F64);
      one.c0 = Tensor::empty({LD, 1, H}, DType::F64);
      for (int64_t l = 0; l < LD; ++l) {
        for (int64_t k = 0; k < Ho; ++k) one.h0.set(l * Ho + k, p.in.h0.get((l * c.B + b) * Ho + k));
        for (int64_t k = 0; k < H; ++k) one.c0.set(l * H + k, p.in.c0.get((l * c.B + b) * H + k));
      }
    }
    LstmOutput alone = be.forward(p.w, one, false, nullptr, nullptr, ExecContext::cpu());
    double worst = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < Fo; ++k)
        worst = std::max(worst, std::abs(alone.output.get(at(s, n, 1, Fo, t, 0, k)) -
                                         full.output.get(at(s, c.T, c.B, Fo, t, b, k))));
    for (int64_t l = 0; l < LD; ++l) {
      for (int64_t k = 0; k < Ho; ++k)
        worst = std::max(worst, std::abs(alone.h_n.get(l * Ho + k) - full.h_n.get((l * c.B + b) * Ho + k)));
      for (int64_t k = 0; k < H; ++k)
        worst = std::max(worst, std::abs(alone.c_n.get(l * H + k) - full.c_n.get((l * c.B + b) * H + k)));
    }
    // Only GEMM blocking may differ between a batch of 1 and a batch of B.
    EXPECT_LT(worst, 1e-13) << "sequence " << b << " of length " << n;
  }
}

std::vector<Case> semantics_cases() {
  return {
      {"uni_l1", make_spec(3, 4, 1), 6, 4, {6, 1, 3, 2}, false},
      {"uni_l2_h0", make_spec(3, 4, 2), 6, 4, {2, 6, 1, 5}, true},
      {"bi_l2", make_spec(3, 4, 2, true), 6, 4, {6, 1, 3, 2}, true},
      {"bi_proj_l3_bf", make_spec(2, 5, 3, true, 3, true, true), 7, 3, {1, 7, 4}, true},
      {"bi_nobias_bf", make_spec(3, 3, 1, true, 0, false, true), 5, 3, {5, 2, 1}, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Reference, Semantics, ::testing::ValuesIn(semantics_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(LstmSemantics, EqualLengthsEqualNoLengths) {
  Case c{"bi", make_spec(3, 4, 2, true, 2), 5, 3, {5, 5, 5}, true};
  Problem with = make_problem(c, 11);
  Problem without = make_problem(c, 11);
  without.in.lengths.clear();
  Analytic a = analytic(with), b = analytic(without);
  EXPECT_EQ(max_abs_diff(a.out.output, b.out.output), 0.0);
  EXPECT_EQ(max_abs_diff(a.out.h_n, b.out.h_n), 0.0);
  EXPECT_EQ(max_abs_diff(a.g.d_x, b.g.d_x), 0.0);
  for (size_t i = 0; i < a.dw.size(); ++i) EXPECT_EQ(max_abs_diff(a.dw[i], b.dw[i]), 0.0);
}

TEST(LstmSemantics, DropoutOnlyInTrainingAndNotAfterTheLastLayer) {
  Case c{"drop", make_spec(3, 4, 2, false, 0, true, false, 0.5), 4, 3, {}, false};
  Problem p = make_problem(c, 12);
  auto be_owner = lstm::testing::reference_backend(c.spec, DType::F64);
  LstmBackend& be = *be_owner;
  LstmSpec no_drop = c.spec;
  no_drop.dropout = 0;
  LstmOutput eval = be.forward(p.w, p.in, false, nullptr, nullptr, ExecContext::cpu());
  LstmOutput plain = lstm::testing::reference_backend(no_drop)->forward(p.w, p.in, true, nullptr, nullptr,
                                                                          ExecContext::cpu());
  EXPECT_EQ(max_abs_diff(eval.output, plain.output), 0.0) << "dropout must be off in inference";
  Rng r1(3), r2(3), r3(4);
  LstmOutput t1 = be.forward(p.w, p.in, true, &r1, nullptr, ExecContext::cpu());
  LstmOutput t2 = be.forward(p.w, p.in, true, &r2, nullptr, ExecContext::cpu());
  LstmOutput t3 = be.forward(p.w, p.in, true, &r3, nullptr, ExecContext::cpu());
  EXPECT_EQ(max_abs_diff(t1.output, t2.output), 0.0) << "same seed, same mask";
  EXPECT_GT(max_abs_diff(t1.output, t3.output), 0.0) << "another seed, another mask";
  EXPECT_GT(max_abs_diff(t1.output, plain.output), 0.0);
  // The first layer sees its input undropped.
  const int64_t LB = c.B * c.spec.hidden_size;
  for (int64_t i = 0; i < LB; ++i) EXPECT_EQ(t1.h_n.get(i), plain.h_n.get(i)) << i;

  LstmSpec one = c.spec;
  one.num_layers = 1;
  std::vector<Tensor> w1(p.w.begin(), p.w.begin() + static_cast<std::ptrdiff_t>(one.param_names().size()));
  Rng r4(3);
  LstmOutput single = lstm::testing::reference_backend(one)->forward(w1, p.in, true, &r4, nullptr, ExecContext::cpu());
  LstmSpec one_plain = one;
  one_plain.dropout = 0;
  LstmOutput single_plain =
      lstm::testing::reference_backend(one_plain)->forward(w1, p.in, true, nullptr, nullptr, ExecContext::cpu());
  EXPECT_EQ(max_abs_diff(single.output, single_plain.output), 0.0) << "no dropout after the last layer";
}

TEST(LstmSemantics, F32AgreesWithF64) {
  Case c{"bi_proj", make_spec(3, 5, 2, true, 3), 6, 3, {6, 1, 4}, true};
  Problem p = make_problem(c, 13);
  Analytic a64 = analytic(p);
  Problem q = p;
  for (auto& w : q.w) w = w.to(DType::F32);
  q.in.x = p.in.x.to(DType::F32);
  q.in.h0 = p.in.h0.to(DType::F32);
  q.in.c0 = p.in.c0.to(DType::F32);
  auto be_owner = lstm::testing::reference_backend(q.spec, DType::F32);
  LstmBackend& be = *be_owner;
  std::unique_ptr<LstmSaved> saved;
  LstmOutput o = be.forward(q.w, q.in, true, nullptr, &saved, ExecContext::cpu());
  ASSERT_EQ(o.output.dtype(), DType::F32);
  std::vector<Tensor> dw;
  for (const auto& w : q.w) dw.push_back(Tensor::zeros(w.shape(), DType::F32));
  LstmGrads g = be.backward(q.w, *saved, p.cot, dw, ExecContext::cpu());  // f64 cotangents are converted
  EXPECT_LT(rel_l2_error(o.output, a64.out.output), 1e-5);
  EXPECT_LT(rel_l2_error(o.h_n, a64.out.h_n), 1e-5);
  EXPECT_LT(rel_l2_error(o.c_n, a64.out.c_n), 1e-5);
  EXPECT_LT(rel_l2_error(g.d_x, a64.g.d_x), 1e-5);
  EXPECT_LT(rel_l2_error(g.d_h0, a64.g.d_h0), 1e-5);
  EXPECT_LT(rel_l2_error(g.d_c0, a64.g.d_c0), 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_LT(rel_l2_error(dw[i], a64.dw[i]), 1e-5) << i;
}

// --- errors ----------------------------------------------------------------------------------

template <class F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected lstm::Error containing '" << needles.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

TEST(LstmErrors, BadShapesAndLengthsAreNamed) {
  Case c{"e", make_spec(3, 4, 2, true), 5, 2, {5, 3}, true};
  Problem p = make_problem(c, 21);
  auto be_owner = lstm::testing::reference_backend(c.spec, DType::F64);
  LstmBackend& be = *be_owner;
  auto fwd = [&](const LstmInput& in, const std::vector<Tensor>& w) {
    return [&, in, w] { be.forward(w, in, false, nullptr, nullptr, ExecContext::cpu()); };
  };
  {
    LstmInput in = p.in;
    in.x = Tensor::zeros({5, 2, 4}, DType::F64);
    expect_error(fwd(in, p.w), {"input_size=3", "got 4"});
  }
  {
    LstmInput in = p.in;
    in.x = Tensor::zeros({5, 2}, DType::F64);
    expect_error(fwd(in, p.w), {"[T, B, I]", "[5, 2]"});
  }
  {
    LstmInput in = p.in;
    in.lengths = {0, 3};
    expect_error(fwd(in, p.w), {"lengths[0]", "[1, 5]", "got 0"});
  }
  {
    LstmInput in = p.in;
    in.lengths = {5, 6};
    expect_error(fwd(in, p.w), {"lengths[1]", "[1, 5]", "got 6"});
  }
  {
    LstmInput in = p.in;
    in.lengths = {5, 3, 2};
    expect_error(fwd(in, p.w), {"lengths", "(2)", "got 3"});
  }
  {
    LstmInput in = p.in;
    in.h0 = Tensor::zeros({2, 2, 4}, DType::F64);  // L*D = 4 expected
    expect_error(fwd(in, p.w), {"h0", "[4, 2, 4]", "[2, 2, 4]"});
  }
  {
    LstmInput in = p.in;
    in.c0 = Tensor::zeros({4, 3, 4}, DType::F64);
    expect_error(fwd(in, p.w), {"c0", "[4, 2, 4]", "[4, 3, 4]"});
  }
  {
    std::vector<Tensor> w(p.w.begin(), p.w.end() - 1);
    expect_error(fwd(p.in, w), {"expected 16 weight tensors", "got 15"});
  }
  {
    std::vector<Tensor> w = p.w;
    w[1] = Tensor::zeros({16, 3}, DType::F64);
    expect_error(fwd(p.in, w), {"weight_hh_l0", "[16, 4]", "[16, 3]"});
  }
  {
    std::vector<Tensor> w = p.w;
    w[0] = w[0].to(DType::F32);
    expect_error(fwd(p.in, w), {"weight_ih_l0", "F32", "F64"});
  }
  {
    LstmSpec bad = c.spec;
    bad.proj_size = 4;
    expect_error([&] { bad.validate(); }, {"proj_size", "got 4"});
  }
  expect_error([&] { lstm::testing::reference_backend(c.spec, DType::BF16); }, {"reference", "BF16"});
  {
    LstmSpec drop = c.spec;
    drop.dropout = 0.3;
    expect_error([&] { lstm::testing::reference_backend(drop)->forward(p.w, p.in, true, nullptr, nullptr, ExecContext::cpu()); },
                 {"dropout", "Rng"});
  }
}

// --- LstmSpec::infer ---------------------------------------------------------------------------

std::map<std::string, Shape> shapes_of(const LstmSpec& s, const std::string& prefix = "") {
  std::map<std::string, Shape> m;
  for (const auto& n : s.param_names()) m[prefix + n] = s.param_shape(n);
  return m;
}

TEST(LstmSpecInfer, RoundTrip) {
  for (const LstmSpec& s : {make_spec(3, 4, 1), make_spec(3, 4, 3, true), make_spec(5, 4, 2, false, 2),
                            make_spec(1, 6, 3, true, 5, false), make_spec(4, 4, 2, true, 0, false)}) {
    EXPECT_EQ(LstmSpec::infer(shapes_of(s)), s) << shape_str(s.param_shape("weight_ih_l0"));
    auto prefixed = shapes_of(s, "encoder.lstm.");
    prefixed["encoder.embedding.weight"] = {10, s.input_size};
    prefixed["decoder.weight_ih_l0"] = {8, 1};  // another module's tensors are not ours
    EXPECT_EQ(LstmSpec::infer(prefixed, "encoder.lstm."), s);
  }
  // Fields that the state_dict cannot know come back at their defaults.
  LstmSpec s = make_spec(3, 4, 2, true, 0, true, true, 0.25);
  LstmSpec want = s;
  want.batch_first = false;
  want.dropout = 0.0;
  EXPECT_EQ(LstmSpec::infer(shapes_of(s)), want);
}

TEST(LstmSpecInfer, NamesTheMissingOrWrongTensor) {
  const LstmSpec s = make_spec(3, 4, 2, true, 2);
  expect_error([&] { LstmSpec::infer({}); }, {"weight_ih_l0", "weight_hh_l0"});
  expect_error([&] { LstmSpec::infer(shapes_of(s), "lstm."); }, {"lstm.weight_ih_l0"});
  {
    auto m = shapes_of(s);
    m.erase("weight_hh_l1_reverse");
    expect_error([&] { LstmSpec::infer(m); }, {"missing", "weight_hh_l1_reverse"});
  }
  {
    auto m = shapes_of(s);
    m.erase("bias_hh_l0");
    expect_error([&] { LstmSpec::infer(m); }, {"missing", "bias_hh_l0"});
  }
  {
    auto m = shapes_of(s);
    m.erase("weight_hr_l1");
    expect_error([&] { LstmSpec::infer(m); }, {"missing", "weight_hr_l1"});
  }
  {
    auto m = shapes_of(s);
    m["weight_ih_l1"] = {16, 3};  // layer 1 reads D*P = 4 features
    expect_error([&] { LstmSpec::infer(m); }, {"weight_ih_l1", "expected shape [16, 4]", "got [16, 3]"});
  }
  {
    auto m = shapes_of(s);
    m["weight_hh_l0"] = {16, 4};  // with a projection, W_hh reads P = 2 features
    expect_error([&] { LstmSpec::infer(m); }, {"weight_hh_l0", "[16, 2]", "[16, 4]"});
  }
  {
    auto m = shapes_of(s);
    m["bias_ih_l1_reverse"] = {15};
    expect_error([&] { LstmSpec::infer(m); }, {"bias_ih_l1_reverse", "[16]", "[15]"});
  }
  {
    auto m = shapes_of(s);
    m["weight_ih_l0"] = {15, 3};
    expect_error([&] { LstmSpec::infer(m); }, {"weight_ih_l0", "[4*hidden, input]", "[15, 3]"});
  }
  {
    auto m = shapes_of(s);
    m.erase("weight_ih_l1");  // a hole in the layers: layer 1's other tensors are left over
    expect_error([&] { LstmSpec::infer(m); }, {"unexpected", "_l1"});
  }
  {
    auto m = shapes_of(make_spec(3, 4, 1));
    m["weight_hr_l3"] = {2, 4};
    expect_error([&] { LstmSpec::infer(m); }, {"weight_hr"});
  }
}

}  // namespace
