// The CPU LSTM's multi-threaded step loop (a thread team, each thread owning a block of hidden
// units) computes what the single-threaded loop computes, also from inside a caller's parallel
// region. The golden-file and gradient tests use sizes too small to start a team.
#include <gtest/gtest.h>

#include <omp.h>

#include "gpu_test_util.hpp"
#include "lstm/lstm.hpp"
#include "lstm/parallel.hpp"

using namespace lstm;

namespace {

struct Result {
  LstmOutput out;
  LstmGrads grads;
  std::vector<Tensor> dw;
};

Result run(const LstmSpec& s, const std::vector<Tensor>& w, const LstmInput& in, const LstmGradOutput& g) {
  auto be_owner = lstm::testing::reference_backend(s, in.x.dtype());
  LstmBackend& be = *be_owner;
  std::unique_ptr<LstmSaved> saved;
  Result r;
  r.out = be.forward(w, in, true, nullptr, &saved, ExecContext::cpu());
  for (auto& t : w) r.dw.push_back(Tensor::zeros(t.shape(), t.dtype()));
  r.grads = be.backward(w, *saved, g, r.dw, ExecContext::cpu());
  return r;
}

void expect_close(const Result& a, const Result& b, double tol) {
  EXPECT_LT(rel_l2_error(a.out.output, b.out.output), tol);
  EXPECT_LT(rel_l2_error(a.out.h_n, b.out.h_n), tol);
  EXPECT_LT(rel_l2_error(a.out.c_n, b.out.c_n), tol);
  EXPECT_LT(rel_l2_error(a.grads.d_x, b.grads.d_x), tol);
  EXPECT_LT(rel_l2_error(a.grads.d_h0, b.grads.d_h0), tol);
  EXPECT_LT(rel_l2_error(a.grads.d_c0, b.grads.d_c0), tol);
  for (size_t i = 0; i < a.dw.size(); ++i) EXPECT_LT(rel_l2_error(a.dw[i], b.dw[i]), tol) << i;
}

class Threads : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(Threads, TeamMatchesOneThread) {
  // Sizes large enough for the team: 4*H*Hout*B >= 2^18 and H >= 16 per thread.
  for (int64_t proj : {int64_t{0}, int64_t{40}}) {
    SCOPED_TRACE(proj);
    LstmSpec s{.input_size = 24, .hidden_size = 96, .num_layers = 2, .bidirectional = true, .proj_size = proj};
    const int64_t T = 9, B = 32, D = 2, L = 2;
    Rng rng(static_cast<uint64_t>(17 + proj));
    std::vector<Tensor> w;
    for (const auto& n : s.param_names()) {
      w.push_back(Tensor::empty(s.param_shape(n), DType::F64));
      rng.fill_uniform(w.back(), -0.2, 0.2);
    }
    LstmInput in;
    in.x = Tensor::empty({T, B, 24}, DType::F64);
    rng.fill_normal(in.x, 0, 1);
    for (int64_t b = 0; b < B; ++b) in.lengths.push_back(1 + (b * 5) % T);
    in.h0 = Tensor::empty({L * D, B, s.out_size()}, DType::F64);
    in.c0 = Tensor::empty({L * D, B, 96}, DType::F64);
    rng.fill_normal(in.h0, 0, 0.5);
    rng.fill_normal(in.c0, 0, 0.5);
    LstmGradOutput g;
    g.d_output = Tensor::empty({T, B, D * s.out_size()}, DType::F64);
    g.d_h_n = Tensor::empty(in.h0.shape(), DType::F64);
    g.d_c_n = Tensor::empty(in.c0.shape(), DType::F64);
    rng.fill_normal(g.d_output, 0, 1);
    rng.fill_normal(g.d_h_n, 0, 1);
    rng.fill_normal(g.d_c_n, 0, 1);

    set_num_threads(1);
    Result one = run(s, w, in, g);
    set_num_threads(GetParam());
    Result team = run(s, w, in, g);
    expect_close(team, one, 1e-13);
    // From inside a caller's parallel region the loop runs on one thread and is still right.
    Result nested;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      nested = run(s, w, in, g);
    }
    expect_close(nested, one, 1e-13);
    set_num_threads(0);
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, Threads, ::testing::Values(2, 3, 6),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "threads"; });
