// The conformance suite of the LSTM op: every row of lstm_backends(), at every precision its
// why_not accepts, in inference and in training, against the float64 CPU reference and PyTorch's
// golden files, on fresh random inputs with NaN past each length and outputs poisoned before each
// call. A new backend gets all of it by registering: nothing here names a backend (the reference
// is what everything is compared with). GPU rows skip, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm_conformance_util.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

using namespace lstm;
using namespace lstm::testing;

namespace {

// ---- Cases ----

// Small shapes (fast on the CPU) within every cuDNN persistent limit where the feature allows a
// persistent algorithm at all (hidden 64, batch up to 8). Every row takes the first two.
std::vector<Case> semantic_cases() {
  std::vector<Case> c;
  c.push_back({"uni_l1", make_spec(32, 64, 1), 9, 4, {}});
  c.push_back({"uni_l3", make_spec(24, 64, 3), 6, 8, {}});
  c.push_back({"bi_l2_h0", make_spec(32, 64, 2, true), 5, 4, {}, true, true});
  c.push_back({"batch_first_uni_l2_h0", make_spec(16, 64, 2, false, 0, true, true), 6, 3, {}, true, true});
  c.push_back({"proj_uni_l2", make_spec(20, 48, 2, false, 24), 5, 2, {}});
  c.push_back({"nobias_uni_l1", make_spec(16, 64, 1, false, 0, false), 5, 2, {}});
  // Variable lengths, T and 1 among them.
  c.push_back({"varlen_uni_l1", make_spec(16, 64, 1), 7, 4, {7, 1, 4, 2}});
  c.push_back({"varlen_bi_l2_h0", make_spec(32, 64, 2, true), 9, 5, {9, 3, 1, 7, 9}, true, true});
  c.push_back({"varlen_proj_bi_l3_batch_first_h0", make_spec(20, 48, 3, true, 16, true, true), 7, 4, {5, 1, 7, 3},
               true, true});
  c.push_back({"varlen_nobias_bi_l2", make_spec(16, 64, 2, true, 0, false), 7, 4, {7, 6, 1, 4}});
  // h0 without c0, and c0 without h0: each is optional on its own.
  c.push_back({"varlen_proj_uni_l2_h0_only", make_spec(20, 48, 2, false, 24), 8, 3, {8, 2, 5}, true, false});
  // Only some of the cotangents given.
  Case only_hn{"varlen_uni_l2_only_d_h_n", make_spec(16, 64, 2), 6, 3, {6, 1, 3}, true, true};
  only_hn.d_output = only_hn.d_c_n = false;
  c.push_back(only_hn);
  Case only_out{"bi_l1_c0_only_only_d_output", make_spec(16, 64, 1, true), 5, 3, {}, false, true};
  only_out.d_h_n = only_out.d_c_n = false;
  c.push_back(only_out);
  Case only_cn{"uni_l2_only_d_c_n", make_spec(16, 64, 2), 5, 3, {}};
  only_cn.d_output = only_cn.d_h_n = false;
  c.push_back(only_cn);
  return c;
}

// The semantic cases called `names`, in that order.
std::vector<Case> cases_named(const std::vector<std::string>& names) {
  std::vector<Case> r;
  for (const auto& n : names)
    for (const Case& c : semantic_cases())
      if (c.name == n) r.push_back(c);
  EXPECT_EQ(r.size(), names.size()) << "a case name is not in semantic_cases()";
  return r;
}

uint64_t seed_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a seed per case name, stable across runs
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

class LstmConformance : public ::testing::TestWithParam<Target> {
 protected:
  void SetUp() override {
    if (t().device == Device::CUDA && !cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  }
  const Target& t() const { return GetParam(); }
  double tol() const { return t().prec.tol; }
  // The cases of `cases` the target takes; prints the others with the reason.
  std::vector<Case> taken(const std::vector<Case>& cases) const {
    std::vector<Case> r;
    for (const Case& c : cases) {
      const std::string why = case_skip_reason(t(), c);
      if (why.empty()) {
        r.push_back(c);
      } else {
        std::cout << "[ not run  ] " << c.name << ": " << why << "\n";
      }
    }
    return r;
  }
  Result run(LstmBackend& be, const Problem& p, bool flat = false) const {
    return run_backend(be, p, {t().training, flat, 3, true}, t().context());
  }
  // Each case on fresh inputs through a fresh instance, against the float64 reference.
  void against_reference(const std::vector<Case>& cases) const {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      const Problem p = make_problem(c, t().prec.dtype, seed_of(c.name));
      auto be = make_target_backend(t(), c.spec, t().options());
      compare(run(*be, p), run_reference(p, t().training), p, t().training, tol());
    }
  }
};

// ---- PyTorch's golden files ----

// Each file that the row takes, through a fresh instance: outputs, h_n, c_n (and in training
// d_x, d_h0, d_c0 and every weight gradient, added into nonzero d_weights) match PyTorch's.
TEST_P(LstmConformance, GoldenFixtures) {
  const auto files = lstm_fixture_paths();
  ASSERT_FALSE(files.empty()) << "no lstm_*.safetensors in " << LSTM_FIXTURE_DIR;
  int ran = 0;
  for (const auto& path : files) {
    const std::string name = std::filesystem::path(path).stem().string();
    const FixtureCase fc = load_fixture(path, t().prec.dtype);
    const Problem& p = fc.p;
    const bool varlen = std::any_of(p.in.lengths.begin(), p.in.lengths.end(), [&](int64_t n) { return n != p.T(); });
    const std::string why = case_skip_reason(t(), p.spec, varlen, p.in.h0.defined() || p.in.c0.defined());
    if (!why.empty()) {
      std::cout << "[ not run  ] " << name << ": " << why << "\n";
      continue;
    }
    SCOPED_TRACE(name);
    auto be = make_target_backend(t(), p.spec, t().options());
    // A float32 file holds PyTorch's float32 results: good to about 1e-6, whatever we compute in.
    compare(run(*be, p), fc.torch, p, t().training, std::max(tol(), fc.f32_file ? 1e-5 : 0.0));
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "the row takes none of the golden files";
}

// ---- Against the float64 reference ----

// Every semantic case the row takes, each through a fresh instance, against the float64 reference:
// variable lengths (1 and T among them) with NaN in x and d_output past them, outputs exactly zero
// there, d_x too, h0/c0 given or not, proj_size, bias=false, batch_first, 1-3 layers,
// bidirectional, only some cotangents; outputs poisoned before each call (every element
// written), gradients added into nonzero d_weights.
TEST_P(LstmConformance, MatchesTheReference) {
  const auto cases = taken(semantic_cases());
  if (cases.empty()) GTEST_SKIP() << "the row takes none of the cases";
  against_reference(cases);
}

// Row `t` of a [T, B, W] tensor (or [B, T, W] with batch_first): its W values at (t, b).
std::vector<double> seq_row(const Tensor& x, const LstmSpec& s, int64_t T, int64_t B, int64_t t, int64_t b) {
  const int64_t W = x.size(2), row = s.batch_first ? b * T + t : t * B + b;
  std::vector<double> v(static_cast<size_t>(W));
  for (int64_t j = 0; j < W; ++j) v[static_cast<size_t>(j)] = x.get(row * W + j);
  return v;
}
void set_seq_row(Tensor& x, const LstmSpec& s, int64_t T, int64_t B, int64_t t, int64_t b,
                 const std::vector<double>& v) {
  const int64_t W = x.size(2), row = s.batch_first ? b * T + t : t * B + b;
  for (int64_t j = 0; j < W; ++j) x.set(row * W + j, v[static_cast<size_t>(j)]);
}
// Sequence b of a [L*D, B, W] state tensor as a [L*D, 1, W] one, and back.
Tensor state_of(const Tensor& h, int64_t b) {
  if (!h.defined()) return {};
  const int64_t LD = h.size(0), B = h.size(1), W = h.size(2);
  Tensor r = Tensor::empty({LD, 1, W}, DType::F64);
  for (int64_t l = 0; l < LD; ++l)
    for (int64_t j = 0; j < W; ++j) r.set(l * W + j, h.get((l * B + b) * W + j));
  return r;
}
void put_state(Tensor& h, int64_t b, const Tensor& one) {
  const int64_t LD = h.size(0), B = h.size(1), W = h.size(2);
  for (int64_t l = 0; l < LD; ++l)
    for (int64_t j = 0; j < W; ++j) h.set((l * B + b) * W + j, one.get(l * W + j));
}

// Packed-sequence semantics as properties of the backend's own results (so they bind the
// reference too): h_n is the top layer's output at each sequence's own last step (the reverse
// direction's at step 0), and each sequence run alone, truncated to its length, gives what it
// gets inside the padded batch (the reverse direction starts at its own end; nothing past a
// length leaks in), gradients included.
TEST_P(LstmConformance, PackedSequenceSemantics) {
  std::vector<Case> varlen;
  for (const Case& c : semantic_cases())
    if (c.variable_lengths()) varlen.push_back(c);
  const auto cases = taken(varlen);
  if (cases.empty()) GTEST_SKIP() << "the row takes no variable lengths";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const LstmSpec& s = c.spec;
    const Problem p = make_problem(c, t().prec.dtype, seed_of(c.name) + 1);
    auto be = make_target_backend(t(), s, t().options());
    const Result full = run(*be, p);
    ASSERT_TRUE(full.out.output.defined() && full.out.h_n.defined());
    ASSERT_FALSE(has_non_finite(full.out.output));

    // h_n at each sequence's own last step.
    const int64_t Ho = s.out_size(), D = s.directions(), top = (s.num_layers - 1) * D;
    Tensor h_top = Tensor::empty({D, c.B, Ho}, DType::F64), y_last = Tensor::empty({D, c.B, Ho}, DType::F64);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < c.B; ++b) {
        const auto y = seq_row(full.out.output, s, c.T, c.B, d == 0 ? c.lengths[b] - 1 : 0, b);
        for (int64_t k = 0; k < Ho; ++k) {
          h_top.set((d * c.B + b) * Ho + k, full.out.h_n.get(((top + d) * c.B + b) * Ho + k));
          y_last.set((d * c.B + b) * Ho + k, y[static_cast<size_t>(d * Ho + k)]);
        }
      }
    expect_close(h_top, y_last, tol(), "top layer's h_n against the output at each own last step");

    // Each sequence alone, reassembled into the batch's shapes.
    Result alone;
    alone.out = {Tensor::zeros(full.out.output.shape(), DType::F64), Tensor::zeros(full.out.h_n.shape(), DType::F64),
                 Tensor::zeros(full.out.c_n.shape(), DType::F64)};
    if (t().training) {
      alone.g.d_x = Tensor::zeros(p.in.x.shape(), DType::F64);
      if (p.in.h0.defined()) alone.g.d_h0 = Tensor::zeros(p.in.h0.shape(), DType::F64);
      if (p.in.c0.defined()) alone.g.d_c0 = Tensor::zeros(p.in.c0.shape(), DType::F64);
    }
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t n = c.lengths[b];
      Problem one;
      one.spec = s;
      one.w = p.w;
      one.dw0 = p.dw0;
      one.in.x = Tensor::empty(seq_shape(s, n, 1, s.input_size), DType::F64);
      for (int64_t step = 0; step < n; ++step) set_seq_row(one.in.x, s, n, 1, step, 0, seq_row(p.in.x, s, c.T, c.B, step, b));
      one.in.h0 = state_of(p.in.h0, b);
      one.in.c0 = state_of(p.in.c0, b);
      if (p.grad.d_output.defined()) {
        one.grad.d_output = Tensor::empty(output_shape(s, n, 1), DType::F64);
        for (int64_t step = 0; step < n; ++step)
          set_seq_row(one.grad.d_output, s, n, 1, step, 0, seq_row(p.grad.d_output, s, c.T, c.B, step, b));
      }
      one.grad.d_h_n = state_of(p.grad.d_h_n, b);
      one.grad.d_c_n = state_of(p.grad.d_c_n, b);
      const Result r = run(*be, one);
      for (int64_t step = 0; step < n; ++step)
        set_seq_row(alone.out.output, s, c.T, c.B, step, b, seq_row(r.out.output, s, n, 1, step, 0));
      put_state(alone.out.h_n, b, r.out.h_n);
      put_state(alone.out.c_n, b, r.out.c_n);
      if (!t().training) continue;
      for (int64_t step = 0; step < n; ++step)
        set_seq_row(alone.g.d_x, s, c.T, c.B, step, b, seq_row(r.g.d_x, s, n, 1, step, 0));
      if (alone.g.d_h0.defined()) put_state(alone.g.d_h0, b, r.g.d_h0);
      if (alone.g.d_c0.defined()) put_state(alone.g.d_c0, b, r.g.d_c0);
    }
    expect_close(alone.out.output, full.out.output, tol(), "output, each sequence alone vs in the batch");
    expect_close(alone.out.h_n, full.out.h_n, tol(), "h_n, each sequence alone vs in the batch");
    expect_close(alone.out.c_n, full.out.c_n, tol(), "c_n, each sequence alone vs in the batch");
    if (!t().training) continue;
    expect_close(alone.g.d_x, full.g.d_x, tol(), "d_x, each sequence alone vs in the batch");
    if (p.in.h0.defined()) expect_close(alone.g.d_h0, full.g.d_h0, tol(), "d_h0, each sequence alone vs in the batch");
    if (p.in.c0.defined()) expect_close(alone.g.d_c0, full.g.d_c0, tol(), "d_c0, each sequence alone vs in the batch");
  }
}

// ---- Gradients ----

double dot_finite(const Tensor& a, const Tensor& b) {
  // Cotangents are NaN past each length where outputs are zero: those terms are not in the loss.
  double acc = 0;
  if (!a.defined() || !b.defined()) return 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(b.get(i))) acc += a.get(i) * b.get(i);
  return acc;
}

// In float64: the derivative of loss = <output, d_output> + <h_n, d_h_n> + <c_n, d_c_n> along a
// random direction of every input (x within its lengths, h0, c0, each weight), by central
// differences of the backend's own inference forward, equals the backward's gradient dotted with
// that direction. Independent of the reference: it checks the reference itself too.
TEST_P(LstmConformance, DirectionalDerivativesMatchTheBackward) {
  if (!t().training) GTEST_SKIP() << "a training-mode check (it needs the backward)";
  if (t().prec.dtype != DType::F64) GTEST_SKIP() << "finite differences need float64";
  const auto cases = taken(cases_named({"uni_l1", "varlen_bi_l2_h0", "varlen_proj_bi_l3_batch_first_h0",
                                        "varlen_nobias_bi_l2", "varlen_proj_uni_l2_h0_only",
                                        "bi_l1_c0_only_only_d_output"}));
  if (cases.empty()) GTEST_SKIP() << "the row takes none of the cases";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Problem p = make_problem(c, DType::F64, seed_of(c.name) + 2);
    auto be = make_target_backend(t(), c.spec, t().options());
    const Result an = run(*be, p);
    auto loss = [&] {
      const Result r = run_backend(*be, p, {false, false, 3, true}, t().context());
      return dot_finite(r.out.output, p.grad.d_output) + dot_finite(r.out.h_n, p.grad.d_h_n) +
             dot_finite(r.out.c_n, p.grad.d_c_n);
    };
    auto check = [&](Tensor& x, const Tensor& grad, const std::string& what) {
      ASSERT_TRUE(grad.defined()) << what;
      Rng rng(seed_of(what));
      Tensor v = Tensor::empty(x.shape(), DType::F64);
      rng.fill_uniform(v, -1, 1);
      const Tensor x0 = x.clone();
      const double eps = 1e-5;
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, x0.get(i) + eps * v.get(i));
      const double lp = loss();
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, x0.get(i) - eps * v.get(i));
      const double lm = loss();
      x.copy_(x0);
      const double numeric = (lp - lm) / (2 * eps), analytic = dot_finite(grad, v);
      EXPECT_NE(analytic, 0.0) << what;
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << what;
    };
    check(p.in.x, an.g.d_x, "x");  // NaN past the lengths stays NaN: x + eps * v
    if (p.in.h0.defined()) check(p.in.h0, an.g.d_h0, "h0");
    if (p.in.c0.defined()) check(p.in.c0, an.g.d_c0, "c0");
    const auto names = c.spec.param_names();
    for (size_t i = 0; i < names.size(); ++i) check(p.w[i], an.dw[i], names[i]);
  }
}

// ---- Dropout ----

struct DropoutStats {
  double scale = 0, variance = 0;
};
// Over n training forwards of p through be (Rng seeds seed, seed+1, ...; each followed by its
// backward when `backward`): the mean least-squares scale of the output against the dropout-free
// output `plain`, and the mean squared residual relative to plain's. Everything must be finite.
DropoutStats dropout_stats(LstmBackend& be, const Problem& p, const Tensor& plain, int n, uint64_t seed,
                           bool backward, const ExecContext& ctx) {
  DropoutStats st;
  const double pp = dot_finite(plain, plain);
  for (int i = 0; i < n; ++i) {
    const Result r = run_backend(be, p, {true, false, seed + static_cast<uint64_t>(i), backward}, ctx);
    EXPECT_FALSE(has_non_finite(r.out.output));
    if (backward) {
      EXPECT_FALSE(has_non_finite(r.g.d_x));
    }
    for (const auto& d : r.dw) EXPECT_FALSE(has_non_finite(d));
    const double beta = dot_finite(r.out.output, plain) / pp;
    Tensor resid = r.out.output.clone();
    for (int64_t j = 0; j < resid.numel(); ++j) resid.set(j, resid.get(j) - beta * plain.get(j));
    st.scale += beta / n;
    st.variance += dot_finite(resid, resid) / pp / n;
  }
  return st;
}

// Dropout between layers (spec.dropout = 0.3, two layers). Inference: deterministic, and the
// dropout-free result. Training: two forwards with different Rng states differ; over several
// forwards the output keeps the dropout-free scale (each kept input is scaled by 1/(1-p)) and
// varies more than the reference does at p = 0.2 and less than at p = 0.4. Small weights and zero
// biases keep the second layer nearly linear in its (dropped) input, where the scale is 1 in
// expectation and the variance grows with p/(1-p); a bias would add a part dropout leaves alone.
TEST_P(LstmConformance, DropoutBetweenLayers) {
  LstmSpec s = make_spec(32, 64, 2);
  s.dropout = 0.3;
  const Case c{"dropout_uni_l2", s, 8, 16, {}};
  if (const std::string why = case_skip_reason(t(), c); !why.empty()) GTEST_SKIP() << why;
  auto be = make_target_backend(t(), s, t().options());
  if (!t().training) {
    Problem p = make_problem(c, t().prec.dtype, 78);
    const Result a = run_backend(*be, p, {false, false, 1, true}, t().context());
    const Result b = run_backend(*be, p, {false, false, 2, true}, t().context());
    EXPECT_EQ(max_abs_diff(a.out.output, b.out.output), 0.0) << "inference must not drop";
    p.spec.dropout = 0;
    compare(a, run_reference(p, false), p, false, tol());
    return;
  }
  Problem p = make_problem(c, t().prec.dtype, 77, 0.4);
  for (size_t i = 0; i < p.w.size(); ++i)
    if (s.param_names()[i].rfind("bias", 0) == 0) p.w[i].zero_();
  {
    const Result a = run_backend(*be, p, {true, false, 1, true}, t().context());
    const Result b = run_backend(*be, p, {true, false, 2, true}, t().context());
    EXPECT_GT(rel_l2_error(a.out.output, b.out.output), 0.05) << "two Rng states, the same dropout";
  }
  Problem plain = p;
  plain.spec.dropout = 0;
  const Tensor y = run_reference(plain, false).out.output;
  const int n = 8;
  const DropoutStats got = dropout_stats(*be, p, y, n, 100, true, t().context());
  DropoutStats at[2];
  for (int k = 0; k < 2; ++k) {
    Problem q = p;
    q.spec.dropout = k == 0 ? 0.2 : 0.4;
    auto ref = make_lstm_backend("reference", LstmOptions{}, q.spec, DType::F64, Device::CPU);
    at[k] = dropout_stats(*ref, q, y, n, 200, false, ExecContext::cpu());
  }
  std::cout << "[ dropout  ] scale " << got.scale << ", relative variance " << got.variance
            << " (the reference's at p = 0.2: " << at[0].variance << ", at p = 0.4: " << at[1].variance << ")\n";
  EXPECT_NEAR(got.scale, 1.0, 0.05) << "kept inputs must be scaled by 1/(1-p)";
  EXPECT_GT(got.variance, at[0].variance) << "less variation than the reference shows at p = 0.2";
  EXPECT_LT(got.variance, at[1].variance) << "more variation than the reference shows at p = 0.4";
}

// ---- Long sequences ----

// 128 steps, two layers: outputs, every layer's h_n and c_n (and in training every gradient)
// within the precision's tolerance. In bf16/f16 docs/DESIGN.md states the tolerance of the layer
// outputs over 100 steps and none of gradients over so many: there the gradients must be finite
// and zero past each length, and their error is printed.
TEST_P(LstmConformance, LongSequences) {
  const auto cases = taken({{"long_uni_l2", make_spec(32, 64, 2), 128, 8, {}},
                            {"long_varlen_bi_l2_h0", make_spec(32, 128, 2, true), 128, 4, {128, 100, 1, 64}, true, true}});
  if (cases.empty()) GTEST_SKIP() << "the row takes none of the cases";
  if (t().prec.dtype != DType::BF16 && t().prec.dtype != DType::F16) return against_reference(cases);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, t().prec.dtype, seed_of(c.name));
    auto be = make_target_backend(t(), c.spec, t().options());
    const Result got = run(*be, p), ref = run_reference(p, t().training);
    compare(got, ref, p, /*training=*/false, tol());
    if (!t().training) continue;
    ASSERT_FALSE(has_non_finite(got.g.d_x));
    expect_zero_past_lengths(got.g.d_x, c.spec, c.lengths, c.T, c.B, "d_x");
    double worst = rel_l2_error(got.g.d_x, ref.g.d_x);
    for (size_t i = 0; i < got.dw.size(); ++i) {
      ASSERT_FALSE(has_non_finite(got.dw[i])) << c.spec.param_names()[i];
      worst = std::max(worst, rel_l2_error(got.dw[i], ref.dw[i]));
    }
    std::cout << "[ info     ] " << c.name << ": largest relative L2 error of a gradient " << worst << "\n";
  }
}

// ---- Weights in place ----

// Weights and d_weights as views into the backend's flat_layout buffer (used in place) and as
// separate tensors (copied in) give the same outputs, and both match the reference.
TEST_P(LstmConformance, FlatAndSeparateWeightsAgree) {
  const auto cases = taken({{"varlen_proj_bi_l2_h0", make_spec(12, 40, 2, true, 20), 7, 4, {7, 2, 5, 1}, true, true},
                            {"uni_l2", make_spec(16, 64, 2), 6, 3, {}}});
  if (cases.empty()) GTEST_SKIP() << "the row takes none of the cases";
  const Case& c = cases.front();
  auto be = make_target_backend(t(), c.spec, t().options());
  if (be->flat_layout(t().prec.dtype).offsets.empty()) GTEST_SKIP() << "no flat layout: the backend reads the tensors where they are";
  SCOPED_TRACE(c.name);
  const Problem p = make_problem(c, t().prec.dtype, seed_of(c.name));
  const Result ref = run_reference(p, t().training);
  const Result flat = run(*be, p, true);
  const Result separate = run(*be, p, false);
  {
    SCOPED_TRACE("flat");
    compare(flat, ref, p, t().training, tol());
  }
  {
    SCOPED_TRACE("separate");
    compare(separate, ref, p, t().training, tol());
  }
  EXPECT_EQ(max_abs_diff(flat.out.output, separate.out.output), 0.0);
  EXPECT_EQ(max_abs_diff(flat.out.h_n, separate.out.h_n), 0.0);
  EXPECT_EQ(max_abs_diff(flat.out.c_n, separate.out.c_n), 0.0);
}

// ---- One instance over changing calls ----

// One instance per cuda_graphs setting (off, on, auto), called repeatedly with changing batch,
// steps, lengths and h0/c0 (each shape three times in a row, the first shape again at the end),
// new weight values written in place into the same weight tensors and new inputs on every call:
// every call matches the reference (a stale plan, or a graph replaying stale buffers, does not).
TEST_P(LstmConformance, RepeatedCallsWithChangingShapes) {
  const bool takes_varlen = t().entry().variable_lengths, takes_state = t().entry().initial_state;
  LstmSpec s = make_spec(10, 32, 2, true);
  if (!t().entry().why_not(s, t().prec.dtype, t().device, t().options()).empty()) s = make_spec(10, 32, 2);
  if (const std::string why = t().entry().why_not(s, t().prec.dtype, t().device, t().options()); !why.empty())
    GTEST_SKIP() << why;
  struct Call {
    int64_t T, B;
    std::vector<int64_t> lengths;
    bool h0;
  };
  const std::vector<Call> calls = {{6, 3, {6, 2, 4}, true}, {6, 3, {1, 6, 6}, false}, {6, 3, {}, true},
                                   {9, 5, {9, 1, 2, 3, 8}, true}, {4, 2, {}, false}, {6, 3, {6, 2, 4}, true}};
  for (GraphMode mode : {GraphMode::Off, GraphMode::On, GraphMode::Auto}) {
    SCOPED_TRACE(std::string("cuda_graphs=") + graph_mode_name(mode));
    LstmOptions o = t().options();
    o.cuda_graphs = mode;
    auto be = make_target_backend(t(), s, o);
    // Placed once, like a model's parameters; values change in place.
    Problem first = make_problem({"w", s, 2, 1, {}}, t().prec.dtype, 1);
    std::vector<Tensor> w = place_weights(*be, first.w, true), dw = place_weights(*be, first.dw0, true);
    uint64_t seed = 1000;
    for (size_t k = 0; k < calls.size(); ++k)
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE("call " + std::to_string(k) + " repeat " + std::to_string(rep));
        const bool h0 = calls[k].h0 && takes_state;
        const Case c{"call", s, calls[k].T, calls[k].B, takes_varlen ? calls[k].lengths : std::vector<int64_t>{}, h0, h0};
        const Problem p = make_problem(c, t().prec.dtype, ++seed);
        for (size_t i = 0; i < w.size(); ++i) {
          w[i].copy_(p.w[i]);
          dw[i].copy_(p.dw0[i]);
        }
        const Result got = run_placed(*be, p, w, dw, {t().training, true, 3, true}, t().context());
        compare(got, run_reference(p, t().training), p, t().training, tol());
        if (HasFatalFailure() || HasNonfatalFailure()) return;  // one broken call says it; the rest repeat it
      }
    const auto g = be->graph_counts();
    std::cout << "[ info     ] cuda_graphs=" << graph_mode_name(mode) << ": last run '" << be->last_run() << "', "
              << g.captures << " captures, " << g.replays << " replays\n";
  }
}

// ---- Refusals ----

bool contains_ci(std::string hay, std::string needle) {
  auto lower = [](std::string& s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  };
  lower(hay);
  lower(needle);
  return hay.find(needle) != std::string::npos;
}

void expect_error_naming(const std::string& e, const std::vector<std::string>& names, const std::string& what) {
  ASSERT_NE(e, "") << what << ": accepted";
  for (const auto& n : names) EXPECT_TRUE(contains_ci(e, n)) << what << ": '" << n << "' not in: " << e;
}

// A call the row's flag says it takes runs; one it says it does not take is refused.
void expect_refused_unless(bool takes, const std::string& error, const std::string& what) {
  if (takes) {
    EXPECT_EQ(error, "") << "the row says it takes " << what;
  } else {
    EXPECT_NE(error, "") << "the row says it takes no " << what << ", and ran them";
  }
}

// Inputs or weights of another dtype, inputs on another device, and an execution context on
// another device are refused with an lstm::Error naming both; variable lengths and h0/c0 are
// refused exactly by the rows that declare they do not take them (and taken by the others).
TEST_P(LstmConformance, RefusesWhatItCannotRun) {
  const LstmSpec s = plain_spec();
  const Case c{"plain", s, 5, 3, {}};
  const DType dt = t().prec.dtype, other = dt == DType::F64 ? DType::F32 : DType::F64;
  const Device dev = t().device, other_dev = dev == Device::CPU ? Device::CUDA : Device::CPU;
  const Problem p = make_problem(c, dt, 5);
  auto be = make_target_backend(t(), s, t().options());
  const std::vector<Tensor> w = place_weights(*be, p.w, false);
  const LstmInput in{on(p.in.x, dt, dev), {}, {}, {}};
  auto forward = [&](const std::vector<Tensor>& weights, const LstmInput& input, const ExecContext& ctx) {
    return error_of([&] {
      Rng rng(1);
      std::unique_ptr<LstmSaved> saved;
      be->forward(weights, input, t().training, &rng, t().training ? &saved : nullptr, ctx);
    });
  };
  ASSERT_EQ(forward(w, in, t().context()), "") << "the plain call must run";

  LstmInput bad_x = in;
  bad_x.x = on(p.in.x, other, dev);
  expect_error_naming(forward(w, bad_x, t().context()), {dtype_name(dt), dtype_name(other)}, "x of another dtype");
  std::vector<Tensor> bad_w = w;
  bad_w[0] = on(p.w[0], other, dev);
  expect_error_naming(forward(bad_w, in, t().context()), {dtype_name(dt), dtype_name(other), "weight_ih_l0"},
                      "a weight of another dtype");
  ExecContext bad_ctx;
  bad_ctx.device = other_dev;  // no stream is touched: the call must refuse before
  expect_error_naming(forward(w, in, bad_ctx), {device_name(dev), device_name(other_dev)},
                      "an execution context on another device");
  if (cuda_available()) {
    LstmInput moved = in;
    moved.x = on(p.in.x, dt, other_dev);
    expect_error_naming(forward(w, moved, t().context()), {device_name(dev), device_name(other_dev)},
                        "x on another device");
  } else {
    std::cout << "[ not run  ] x on another device: no GPU to put it on (" << cuda_unavailable_reason() << ")\n";
  }

  const Case v{"varlen", s, 5, 3, {5, 2, 1}};
  const Problem pv = make_problem(v, dt, 6);
  LstmInput varlen = in;
  varlen.lengths = pv.in.lengths;
  varlen.x = on(pv.in.x, dt, dev);
  expect_refused_unless(t().entry().variable_lengths, forward(w, varlen, t().context()), "variable lengths");
  const Problem ps = make_problem({"state", s, 5, 3, {}, true, true}, dt, 7);
  LstmInput state = in;
  state.h0 = on(ps.in.h0, dt, dev);
  state.c0 = on(ps.in.c0, dt, dev);
  expect_refused_unless(t().entry().initial_state, forward(w, state, t().context()), "h0/c0");
}

INSTANTIATE_TEST_SUITE_P(Registry, LstmConformance, ::testing::ValuesIn(target_list().targets),
                         [](const ::testing::TestParamInfo<Target>& i) { return test_name_of(i.param); });

// Says which (row, precision) pairs the suite runs and which it does not, with the rows' reasons;
// fails when a registered row is tested at no precision, or the reference not in f64 and f32.
TEST(LstmConformanceRegistry, EveryRowIsTestedOrSaysWhyNot) {
  const TargetList& l = target_list();
  std::cout << "[ targets  ]";
  for (const Target& t : l.targets)
    if (!t.training) std::cout << " " << t.row << "/" << device_name(t.device) << "/" << t.prec.name;
  std::cout << "\n";
  for (const Skipped& s : l.skipped) {
    std::cout << "[ not run  ] " << s.row << " " << s.prec << ": " << s.reason << "\n";
    EXPECT_NE(s.reason, "") << s.row << " " << s.prec;
  }
  for (const auto& row : lstm_backends()) {
    if (std::any_of(l.targets.begin(), l.targets.end(), [&](const Target& t) { return t.row == row.name; })) continue;
    // A row that is listed in every build but whose library this binary was built without (its
    // why_not says "built without ...") runs nowhere here; say so rather than fail.
    const std::string why = row.why_not(plain_spec(), DType::F32, Device::CPU, LstmOptions{});
    if (why.find("built without") != std::string::npos) {
      std::cout << "[ not run  ] " << row.name << ": " << why << "\n";
      continue;
    }
    ADD_FAILURE() << "row '" << row.name << "' is tested at no precision";
  }
  for (const std::string p : {"f64", "f32"})
    EXPECT_TRUE(std::any_of(l.targets.begin(), l.targets.end(), [&](const Target& t) {
      return t.entry().algo == Algo::Reference && t.device == Device::CPU && t.prec.name == p;
    })) << "the reference is not tested in " << p;
}

}  // namespace
