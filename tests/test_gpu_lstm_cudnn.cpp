// The cuDNN LSTM backend and the LSTM layer on the GPU, against the CPU reference in float64 on
// fresh random inputs (and against PyTorch's golden files). Without a GPU every test skips and
// says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/device.hpp"
#include "lstm/layers.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/tensor.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cudnn/lstm_cudnn.hpp"
#include "cudnn/lstm_cudnn_backend.hpp"
#endif

using namespace lstm;
using lstm::testing::error_of;
using lstm::testing::make_spec;
namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    if (!cuda_available()) GTEST_SKIP() << "no usable GPU: " << cuda_unavailable_reason(); \
  } while (0)

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- Precisions as the backend sees them ----
struct Prec {
  const char* name;
  DType dt;
  bool tf32;
  double tol;  // rel L2 against the float64 reference (docs/DESIGN.md)
};
const Prec kF64{"f64", DType::F64, false, 1e-9};
const Prec kF32{"f32", DType::F32, false, 1e-5};
const Prec kTF32{"tf32", DType::F32, true, 1e-3};
const Prec kBF16{"bf16", DType::BF16, false, 2e-2};
const Prec kF16{"f16", DType::F16, false, 2e-2};

// ---- Cases ----
struct Case {
  std::string name;
  LstmSpec spec;
  int64_t T = 0, B = 0;
  std::vector<int64_t> lengths;  // empty: all T
  bool h0 = false;
  bool d_output = true, d_h_n = true, d_c_n = true;
};

// The [[maybe_unused]] helpers are called only from test bodies under #if LSTM_HAVE_CUDA.
// Small shapes that the persistent algorithms take too (hidden 64, batch up to 8).
[[maybe_unused]] std::vector<Case> all_cases() {
  std::vector<Case> c;
  c.push_back({"uni_l1", make_spec(32, 64, 1, false), 9, 4, {}, false});
  c.push_back({"bi_l2_h0_varlen", make_spec(32, 64, 2, true), 9, 5, {9, 3, 1, 7, 9}, true});
  c.push_back({"bi_l2_h0", make_spec(32, 64, 2, true), 5, 4, {}, true});
  c.push_back({"uni_l3_b8_h0", make_spec(24, 64, 3, false), 6, 8, {}, true});
  c.push_back({"proj_uni_l2_varlen", make_spec(20, 48, 2, false, 24), 8, 3, {8, 2, 5}, false});
  c.push_back({"proj_uni_l1", make_spec(20, 48, 1, false, 16), 5, 2, {}, false});
  c.push_back({"proj_bi_l1_h0", make_spec(20, 48, 1, true, 16), 5, 2, {}, true});
  c.push_back({"nobias_bi_l2_varlen", make_spec(16, 64, 2, true, 0, false), 7, 4, {7, 6, 1, 4}, false});
  c.push_back({"batch_first_bi_varlen_h0", make_spec(16, 64, 2, true, 0, true, true), 6, 3, {2, 6, 4}, true});
  c.push_back({"batch_first_l2_h0", make_spec(16, 64, 2, false, 0, true, true), 6, 3, {}, true});
  c.push_back({"nobias_uni_l1", make_spec(16, 64, 1, false, 0, false), 5, 2, {}, false});
  Case only_hn{"only_d_h_n_varlen", make_spec(16, 64, 2, false), 6, 3, {6, 1, 3}, true};
  only_hn.d_output = false;
  only_hn.d_c_n = false;
  c.push_back(only_hn);
  return c;
}

// ---- Random problem in float64 on the CPU ----
struct Problem {
  LstmSpec spec;
  std::vector<Tensor> w;   // F64 CPU
  LstmInput in;            // F64 CPU; NaN past each length
  LstmGradOutput grad;     // F64 CPU; d_output NaN past each length
  std::vector<Tensor> dw0; // F64 CPU: what d_weights hold before the backward (gradients add into it)
};

bool past_length(const LstmSpec& s, const std::vector<int64_t>& len, int64_t T, int64_t B, int64_t row) {
  const int64_t t = s.batch_first ? row % T : row / B;
  const int64_t b = s.batch_first ? row / T : row % B;
  return !len.empty() && t >= len[b];
}

void poison_rows(Tensor& t, const LstmSpec& s, const std::vector<int64_t>& len, int64_t T, int64_t B) {
  const int64_t W = t.size(2);
  for (int64_t row = 0; row < T * B; ++row)
    if (past_length(s, len, T, B, row))
      for (int64_t j = 0; j < W; ++j) t.set(row * W + j, kNaN);
}

[[maybe_unused]] Problem make_problem(const Case& c, uint64_t seed) {
  Rng rng(seed);
  Problem p;
  p.spec = c.spec;
  const LstmSpec& s = c.spec;
  const double k = 1.0 / std::sqrt(static_cast<double>(s.hidden_size));
  for (const auto& n : s.param_names()) {
    Tensor w = Tensor::empty(s.param_shape(n), DType::F64);
    rng.fill_uniform(w, -k, k);
    p.w.push_back(w);
    Tensor d = Tensor::empty(s.param_shape(n), DType::F64);
    rng.fill_uniform(d, -0.01, 0.01);
    p.dw0.push_back(d);
  }
  const int64_t T = c.T, B = c.B, LD = s.num_layers * s.directions();
  p.in.x = Tensor::empty(s.batch_first ? Shape{B, T, s.input_size} : Shape{T, B, s.input_size}, DType::F64);
  rng.fill_uniform(p.in.x, -1, 1);
  poison_rows(p.in.x, s, c.lengths, T, B);
  p.in.lengths = c.lengths;
  if (c.h0) {
    p.in.h0 = Tensor::empty({LD, B, s.out_size()}, DType::F64);
    p.in.c0 = Tensor::empty({LD, B, s.hidden_size}, DType::F64);
    rng.fill_uniform(p.in.h0, -1, 1);
    rng.fill_uniform(p.in.c0, -1, 1);
  }
  const int64_t Y = s.directions() * s.out_size();
  if (c.d_output) {
    p.grad.d_output = Tensor::empty(s.batch_first ? Shape{B, T, Y} : Shape{T, B, Y}, DType::F64);
    rng.fill_uniform(p.grad.d_output, -1, 1);
    poison_rows(p.grad.d_output, s, c.lengths, T, B);
  }
  if (c.d_h_n) {
    p.grad.d_h_n = Tensor::empty({LD, B, s.out_size()}, DType::F64);
    rng.fill_uniform(p.grad.d_h_n, -1, 1);
  }
  if (c.d_c_n) {
    p.grad.d_c_n = Tensor::empty({LD, B, s.hidden_size}, DType::F64);
    rng.fill_uniform(p.grad.d_c_n, -1, 1);
  }
  return p;
}

// Everything a forward + backward produces, in F64 on the CPU. dw is the gradient added (d_weights
// after minus before).
struct Result {
  LstmOutput out;
  LstmGrads g;
  std::vector<Tensor> dw;
};

Tensor f64(const Tensor& t) { return t.defined() ? t.cpu().to(DType::F64) : Tensor(); }

[[maybe_unused]] Result run_reference(const Problem& p) {
  LstmBackend& be = lstm_backend(Algo::Reference, p.spec, DType::F64, Device::CPU);
  Rng rng(3);
  std::unique_ptr<LstmSaved> saved;
  Result r;
  r.out = be.forward(p.spec, p.w, p.in, true, &rng, &saved);
  std::vector<Tensor> dw;
  for (const auto& t : p.w) dw.push_back(Tensor::zeros(t.shape(), DType::F64));
  r.g = be.backward(p.spec, p.w, *saved, p.grad, dw);
  r.dw = dw;
  return r;
}

Tensor on_gpu(const Tensor& t, DType dt) { return t.defined() ? t.to(dt).to_device(Device::CUDA) : Tensor(); }

// Fills cached arena blocks of these sizes with NaN, so that outputs allocated next get them:
// anything the backend leaves unwritten shows as NaN.
void poison_arena(const std::vector<Shape>& shapes, DType dt) {
  std::vector<Tensor> keep;
  for (int rep = 0; rep < 2; ++rep)
    for (const auto& s : shapes) {
      Tensor t = Tensor::empty(s, dt, Device::CUDA);
      t.fill_(kNaN);
      keep.push_back(t);
    }
  cuda_synchronize();
}

// Forward (training, saved) + backward on the GPU. flat: weights and d_weights as views into the
// backend's flat layout (used in place); otherwise separate tensors (copied in, added out).
[[maybe_unused]] Result run_gpu(LstmBackend& be, const Problem& p, DType dt, bool flat) {
  const LstmSpec& s = p.spec;
  std::vector<Tensor> w, dw;
  const auto layout = flat ? be.flat_layout(s, dt) : LstmBackend::FlatLayout{};
  if (flat) {
    EXPECT_EQ(layout.offsets.size(), s.param_names().size());
    w = make_flat_weights(s, layout, dt, Device::CUDA);
    dw = make_flat_weights(s, layout, dt, Device::CUDA);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i].copy_(p.w[i]);
      dw[i].copy_(p.dw0[i]);
    }
  } else {
    for (size_t i = 0; i < p.w.size(); ++i) {
      w.push_back(on_gpu(p.w[i], dt));
      dw.push_back(on_gpu(p.dw0[i], dt));
    }
  }
  LstmInput in{on_gpu(p.in.x, dt), p.in.lengths, on_gpu(p.in.h0, dt), on_gpu(p.in.c0, dt)};
  LstmGradOutput grad{on_gpu(p.grad.d_output, dt), on_gpu(p.grad.d_h_n, dt), on_gpu(p.grad.d_c_n, dt)};
  const int64_t LD = s.num_layers * s.directions();
  const int64_t B = s.batch_first ? p.in.x.size(0) : p.in.x.size(1);
  const int64_t T = s.batch_first ? p.in.x.size(1) : p.in.x.size(0);
  const Shape yshape = s.batch_first ? Shape{B, T, s.directions() * s.out_size()}
                                     : Shape{T, B, s.directions() * s.out_size()};
  poison_arena({yshape, {LD, B, s.out_size()}, {LD, B, s.hidden_size}, p.in.x.shape()}, dt);
  Rng rng(3);
  std::unique_ptr<LstmSaved> saved;
  LstmOutput out = be.forward(s, w, in, true, &rng, &saved);
  EXPECT_TRUE(saved);
  EXPECT_EQ(out.output.device(), Device::CUDA);
  EXPECT_EQ(out.output.dtype(), dt);
  poison_arena({p.in.x.shape(), {LD, B, s.out_size()}, {LD, B, s.hidden_size}}, dt);
  LstmGrads g = be.backward(s, w, *saved, grad, dw);
  Result r;
  r.out = {f64(out.output), f64(out.h_n), f64(out.c_n)};
  r.g = {f64(g.d_x), f64(g.d_h0), f64(g.d_c0)};
  for (size_t i = 0; i < dw.size(); ++i) {
    Tensor d = f64(dw[i]);
    Tensor before = f64(p.dw0[i].to(dt));  // what the GPU tensor started from
    for (int64_t j = 0; j < d.numel(); ++j) d.set(j, d.get(j) - before.get(j));
    r.dw.push_back(d);
  }
  return r;
}

// An inference forward of p (weights, x, lengths, h0/c0) through `be`, in dtype dt on the GPU.
[[maybe_unused]] LstmOutput infer_gpu(LstmBackend& be, const Problem& p, DType dt) {
  std::vector<Tensor> w;
  for (const auto& t : p.w) w.push_back(on_gpu(t, dt));
  const LstmInput in{on_gpu(p.in.x, dt), p.in.lengths, on_gpu(p.in.h0, dt), on_gpu(p.in.c0, dt)};
  return be.forward(p.spec, w, in, false, nullptr, nullptr);
}

void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": nothing returned";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_FALSE(has_non_finite(got)) << what << ": non-finite values";
  const double err = rel_l2_error(got, want);
  EXPECT_LT(err, tol) << what << ": relative L2 error " << err << ", max abs diff " << max_abs_diff(got, want);
}

// Rows past each length are exactly zero in a [T, B, W] (or [B, T, W]) tensor.
void expect_zero_past_lengths(const Tensor& t, const LstmSpec& s, const std::vector<int64_t>& len, int64_t T,
                              int64_t B, const std::string& what) {
  const int64_t W = t.size(2);
  for (int64_t row = 0; row < T * B; ++row) {
    if (!past_length(s, len, T, B, row)) continue;
    for (int64_t j = 0; j < W; ++j) {
      ASSERT_EQ(t.get(row * W + j), 0.0) << what << " row " << row << " col " << j;
    }
  }
}

[[maybe_unused]] void compare(const Result& gpu, const Result& ref, const Problem& p, double tol) {
  const LstmSpec& s = p.spec;
  const int64_t B = s.batch_first ? p.in.x.size(0) : p.in.x.size(1);
  const int64_t T = s.batch_first ? p.in.x.size(1) : p.in.x.size(0);
  expect_close(gpu.out.output, ref.out.output, tol, "output");
  expect_close(gpu.out.h_n, ref.out.h_n, tol, "h_n");
  expect_close(gpu.out.c_n, ref.out.c_n, tol, "c_n");
  expect_close(gpu.g.d_x, ref.g.d_x, tol, "d_x");
  if (gpu.out.output.defined()) expect_zero_past_lengths(gpu.out.output, s, p.in.lengths, T, B, "output");
  if (gpu.g.d_x.defined()) expect_zero_past_lengths(gpu.g.d_x, s, p.in.lengths, T, B, "d_x");
  if (p.in.h0.defined()) {
    expect_close(gpu.g.d_h0, ref.g.d_h0, tol, "d_h0");
    expect_close(gpu.g.d_c0, ref.g.d_c0, tol, "d_c0");
  } else {
    EXPECT_FALSE(gpu.g.d_h0.defined());
    EXPECT_FALSE(gpu.g.d_c0.defined());
  }
  const auto names = s.param_names();
  for (size_t i = 0; i < names.size(); ++i) expect_close(gpu.dw[i], ref.dw[i], tol, "d_" + names[i]);
}

#if LSTM_HAVE_CUDA
std::unique_ptr<LstmBackend> cudnn(const std::string& algo, const Prec& pr, const LstmSpec& spec) {
  LstmOptions o;
  o.algo = Algo::Cudnn;
  o.cudnn_algo = algo;
  o.allow_tf32 = pr.tf32;
  return make_lstm_backend(o, spec, pr.dt, Device::CUDA);
}
#endif

}  // namespace

// ---- Backend: options and refusals ----

TEST(CudnnLstm, UnknownAlgorithmNameListsTheAcceptedOnes) {
#if LSTM_HAVE_CUDA
  LstmOptions o;
  o.algo = Algo::Cudnn;
  o.cudnn_algo = "fastest";
  const std::string e = error_of([&] { make_cudnn_lstm_backend(o); });
  EXPECT_NE(e.find("fastest"), std::string::npos) << e;
  for (const char* n : {"standard", "persist_static", "persist_dynamic", "persist_static_small_h", "auto"})
    EXPECT_NE(e.find(n), std::string::npos) << e;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(CudnnLstm, UnsupportedReasons) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const LstmSpec s = make_spec(8, 16, 1, false);
  LstmOptions o;
  o.algo = Algo::Cudnn;
  auto be = make_cudnn_lstm_backend(o);
  EXPECT_EQ(be->unsupported_reason(s, DType::F32, Device::CUDA), "");
  EXPECT_EQ(be->unsupported_reason(s, DType::BF16, Device::CUDA), "");
  EXPECT_EQ(be->unsupported_reason(s, DType::F16, Device::CUDA), "");
  EXPECT_EQ(be->unsupported_reason(s, DType::F64, Device::CUDA), "");
  EXPECT_NE(be->unsupported_reason(s, DType::F32, Device::CPU), "");
  EXPECT_NE(be->unsupported_reason(s, DType::I64, Device::CUDA), "");
  o.cudnn_algo = "persist_static";
  auto ps = make_cudnn_lstm_backend(o);
  const std::string f64 = ps->unsupported_reason(s, DType::F64, Device::CUDA);
  EXPECT_NE(f64.find("persist_static"), std::string::npos) << f64;
  EXPECT_NE(f64.find("F64"), std::string::npos) << f64;
  // The same through the public factory.
  const std::string e = error_of([&] { make_lstm_backend(o, s, DType::F64, Device::CUDA); });
  EXPECT_NE(e.find("persist_static"), std::string::npos) << e;
#endif
}

TEST(CudnnLstm, InputsOnTheWrongDeviceAreRefused) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const Case c{"uni", make_spec(8, 16, 1, false), 4, 2, {}, false};
  Problem p = make_problem(c, 11);
  auto be = cudnn("standard", kF32, c.spec);
  std::vector<Tensor> w;
  for (auto& t : p.w) w.push_back(on_gpu(t, DType::F32));
  LstmInput cpu_in{p.in.x.to(DType::F32), {}, {}, {}};
  EXPECT_NE(error_of([&] { be->forward(c.spec, w, cpu_in, false, nullptr, nullptr); }), "");
  std::vector<Tensor> wcpu;
  for (auto& t : p.w) wcpu.push_back(t.to(DType::F32));
  LstmInput gpu_in{on_gpu(p.in.x, DType::F32), {}, {}, {}};
  const std::string e = error_of([&] { be->forward(c.spec, wcpu, gpu_in, false, nullptr, nullptr); });
  EXPECT_NE(e.find("weight"), std::string::npos) << e;
#endif
}

// ---- Backend against the float64 reference: every algorithm, every precision ----

struct AlgoPrec {
  std::string algo;
  Prec prec;
};
// Readable parameters in test listings (ctest names).
void PrintTo(const AlgoPrec& p, std::ostream* os) { *os << p.algo << " " << p.prec.name; }

class CudnnLstmMatches : public ::testing::TestWithParam<AlgoPrec> {};

TEST_P(CudnnLstmMatches, Reference) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const std::string algo = GetParam().algo;
  const Prec pr = GetParam().prec;
  // persist_dynamic compiles a kernel per shape at run time: a few cases keep the test short.
  const std::vector<std::string> dynamic_cases = {"uni_l1", "bi_l2_h0_varlen", "bi_l2_h0", "uni_l3_b8_h0",
                                                   "batch_first_l2_h0"};
  // What every persistent algorithm was seen to run (cuDNN 9.19, H200): equal lengths, biases, no
  // projection; bidirectional, several layers, h0/c0 and batch_first included.
  const std::vector<std::string> must_accept = {"uni_l1", "bi_l2_h0", "uni_l3_b8_h0", "batch_first_l2_h0"};
  int accepted = 0;
  std::string rejected;
  uint64_t seed = 100;
  for (const Case& c : all_cases()) {
    ++seed;
    if (algo == "persist_dynamic" &&
        std::find(dynamic_cases.begin(), dynamic_cases.end(), c.name) == dynamic_cases.end())
      continue;
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, seed);
    const Result ref = run_reference(p);
    std::unique_ptr<LstmBackend> be;
    Result got;
    const std::string e = error_of([&] {
      be = cudnn(algo, pr, c.spec);
      got = run_gpu(*be, p, pr.dt, /*flat=*/true);
    });
    if (!e.empty()) {
      // Only an algorithm's own refusal is acceptable, and it must say whose it is.
      EXPECT_NE(algo, "standard") << e;
      EXPECT_NE(e.find("cuDNN " + algo), std::string::npos) << e;
      const bool must = algo != "auto" && std::find(must_accept.begin(), must_accept.end(), c.name) != must_accept.end();
      EXPECT_FALSE(must) << e;
      // The refusal names the limit that was hit (projection and biases are refused with the
      // descriptor, before the lengths are known).
      if (c.spec.proj_size > 0) {
        EXPECT_NE(e.find("projection"), std::string::npos) << e;
      } else if (!c.spec.bias) {
        EXPECT_NE(e.find("bias"), std::string::npos) << e;
      } else if (!c.lengths.empty()) {
        EXPECT_NE(e.find("same length"), std::string::npos) << e;
      }
      std::cout << "[ info ] " << c.name << ": " << e << "\n";
      rejected += " " + c.name;
      continue;
    }
    ++accepted;
    compare(got, ref, p, pr.tol);
  }
  if (!rejected.empty()) std::cout << "[ info ] cuDNN " << algo << " " << pr.name << " rejected:" << rejected << "\n";
  EXPECT_GT(accepted, 0) << "cuDNN " << algo << " accepted none of the cases in " << pr.name;
#endif
}

std::vector<AlgoPrec> algo_precs() {
  std::vector<AlgoPrec> v{{"standard", kF64}};
  for (const char* a : {"standard", "persist_static", "persist_dynamic", "persist_static_small_h", "auto", "heuristic"})
    for (const Prec& p : {kF32, kTF32, kBF16, kF16}) v.push_back({a, p});
  return v;
}

std::string algo_prec_name(const ::testing::TestParamInfo<AlgoPrec>& i) {
  return i.param.algo + "_" + i.param.prec.name;
}

INSTANTIATE_TEST_SUITE_P(Cudnn, CudnnLstmMatches, ::testing::ValuesIn(algo_precs()), algo_prec_name);

// ---- PyTorch's golden files through cuDNN ----

TEST(CudnnLstm, TorchFixtures) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(LSTM_FIXTURE_DIR)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("lstm_", 0) == 0 && e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (const auto& path : files) {
    SCOPED_TRACE(path);
    const SafetensorsFile f = read_safetensors(path);
    auto meta = [&](const char* k) { return f.metadata.at(k); };
    LstmSpec s;
    s.input_size = std::stoll(meta("input_size"));
    s.hidden_size = std::stoll(meta("hidden_size"));
    s.num_layers = std::stoll(meta("num_layers"));
    s.proj_size = std::stoll(meta("proj_size"));
    s.bidirectional = meta("bidirectional") == "1";
    s.batch_first = meta("batch_first") == "1";
    s.bias = meta("bias") == "1";
    auto t = [&](const std::string& n) -> const Tensor* {
      auto it = f.tensors.find(n);
      return it == f.tensors.end() ? nullptr : &it->second;
    };
    for (const Prec& pr : {kF64, kF32}) {
      SCOPED_TRACE(pr.name);
      Problem p;
      p.spec = s;
      for (const auto& n : s.param_names()) {
        p.w.push_back(t(n)->to(DType::F64));
        p.dw0.push_back(Tensor::full(t(n)->shape(), 0.01, DType::F64));
      }
      p.in.x = t("input")->to(DType::F64);  // NaN past each length, as stored
      if (const Tensor* len = t("lengths"))
        for (int64_t i = 0; i < len->numel(); ++i) p.in.lengths.push_back(static_cast<int64_t>(len->get(i)));
      if (t("h0")) {
        p.in.h0 = t("h0")->to(DType::F64);
        p.in.c0 = t("c0")->to(DType::F64);
      }
      p.grad = {t("r_output")->to(DType::F64), t("r_h_n")->to(DType::F64), t("r_c_n")->to(DType::F64)};
      auto be = cudnn("standard", pr, s);
      const Result got = run_gpu(*be, p, pr.dt, /*flat=*/false);
      // An F32 file holds PyTorch's float32 results: those are good to 1e-5 whatever we compute in.
      const double tol = pr.dt == DType::F64 && f.metadata.at("dtype") == "F64" ? 1e-9 : 1e-5;
      expect_close(got.out.output, t("output")->to(DType::F64), tol, "output");
      expect_close(got.out.h_n, t("h_n")->to(DType::F64), tol, "h_n");
      expect_close(got.out.c_n, t("c_n")->to(DType::F64), tol, "c_n");
      expect_close(got.g.d_x, t("grad_input")->to(DType::F64), tol, "grad_input");
      if (p.in.h0.defined()) {
        expect_close(got.g.d_h0, t("grad_h0")->to(DType::F64), tol, "grad_h0");
        expect_close(got.g.d_c0, t("grad_c0")->to(DType::F64), tol, "grad_c0");
      }
      const auto names = s.param_names();
      for (size_t i = 0; i < names.size(); ++i)
        expect_close(got.dw[i], t("grad." + names[i])->to(DType::F64), tol, "grad." + names[i]);
    }
  }
#endif
}

// ---- Weights in place and copied ----

TEST(CudnnLstm, FlatAndCopiedWeightsAgree) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  for (const Prec& pr : {kF32, kBF16}) {
    SCOPED_TRACE(pr.name);
    const Case c{"proj_bi_varlen_h0", make_spec(12, 40, 2, true, 20), 7, 4, {7, 2, 5, 1}, true};
    const Problem p = make_problem(c, 7);
    auto be = cudnn("standard", pr, c.spec);
    const Result a = run_gpu(*be, p, pr.dt, /*flat=*/true);
    const Result b = run_gpu(*be, p, pr.dt, /*flat=*/false);
    EXPECT_EQ(max_abs_diff(a.out.output, b.out.output), 0.0);
    EXPECT_EQ(max_abs_diff(a.out.h_n, b.out.h_n), 0.0);
    EXPECT_EQ(max_abs_diff(a.out.c_n, b.out.c_n), 0.0);
    EXPECT_EQ(max_abs_diff(a.g.d_x, b.g.d_x), 0.0);
    EXPECT_EQ(max_abs_diff(a.g.d_h0, b.g.d_h0), 0.0);
    // In place cuDNN adds into the starting values; copied, the sum is formed afterwards: the
    // same up to the rounding of one addition.
    for (size_t i = 0; i < a.dw.size(); ++i) expect_close(a.dw[i], b.dw[i], pr.dt == DType::F32 ? 1e-6 : 1e-2, "dw");
    // And both match the reference.
    compare(a, run_reference(p), p, pr.tol);
  }
#endif
}

// ---- The same backend over changing lengths and batches ----

TEST(CudnnLstm, LengthsAndBatchChangeBetweenCalls) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const LstmSpec s = make_spec(10, 32, 2, true);
  auto be = cudnn("standard", kF32, s);
  const std::vector<Case> cs = {{"a", s, 6, 3, {6, 2, 4}, true},
                                {"b", s, 6, 3, {1, 6, 6}, false},
                                {"c", s, 6, 3, {}, true},
                                {"d", s, 9, 5, {9, 1, 2, 3, 8}, true},
                                {"e", s, 6, 3, {6, 2, 4}, false}};
  uint64_t seed = 40;
  for (const Case& c : cs) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, ++seed);
    compare(run_gpu(*be, p, DType::F32, true), run_reference(p), p, kF32.tol);
    // Inference on the same backend: same outputs as the training forward.
    const LstmOutput o = infer_gpu(*be, p, DType::F32);
    const Result ref = run_reference(p);
    expect_close(f64(o.output), ref.out.output, kF32.tol, "inference output");
    expect_close(f64(o.h_n), ref.out.h_n, kF32.tol, "inference h_n");
  }
#endif
}

// ---- Refusals name the algorithm ----

TEST(CudnnLstm, RejectedShapeNamesTheAlgorithm) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  // persist_static_small_h is for small hidden sizes; 2048 is far past its limit. The refusal may
  // come from the factory (descriptor probe) or from the first forward (query time).
  const Case c{"big", make_spec(16, 2048, 1, false), 3, 2, {}, false};
  const Problem p = make_problem(c, 5);
  const std::string e = error_of([&] {
    auto be = cudnn("persist_static_small_h", kF32, c.spec);
    run_gpu(*be, p, DType::F32, true);
  });
  ASSERT_NE(e, "") << "cuDNN persist_static_small_h accepted hidden_size 2048";
  EXPECT_NE(e.find("persist_static_small_h"), std::string::npos) << e;
  EXPECT_NE(e.find("2048"), std::string::npos) << e;
  // A projection is for the standard algorithm only.
  const LstmSpec proj = make_spec(16, 64, 1, false, 32);
  for (const char* a : {"persist_static", "persist_static_small_h"}) {
    const Case pc{"proj", proj, 4, 2, {}, false};
    const Problem pp = make_problem(pc, 6);
    const std::string pe = error_of([&] {
      auto be = cudnn(a, kF32, proj);
      run_gpu(*be, pp, DType::F32, true);
    });
    if (!pe.empty()) {
      EXPECT_NE(pe.find(a), std::string::npos) << pe;
    }
  }
#endif
}

// ---- auto ----

TEST(CudnnLstm, AutoPicksAnAlgorithmThatAcceptsTheCase) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const Case c{"uni_b8", make_spec(32, 64, 1, false), 10, 8, {}, true};
  const Problem p = make_problem(c, 9);
  auto be = cudnn("auto", kF16, c.spec);
  compare(run_gpu(*be, p, DType::F16, true), run_reference(p), p, kF16.tol);
  auto* cb = dynamic_cast<CudnnLstmBackend*>(be.get());
  ASSERT_TRUE(cb);
  const auto names = cudnn_algo_names();
  EXPECT_NE(std::find(names.begin(), names.end(), cb->last_algo()), names.end()) << cb->last_algo();
  EXPECT_NE(cb->auto_log().find("picked " + cb->last_algo()), std::string::npos) << cb->auto_log();
  std::cout << "[ info ] " << cb->auto_log();
  // A second call of the same case does not time again.
  const std::string log = cb->auto_log();
  run_gpu(*be, p, DType::F16, true);
  EXPECT_EQ(cb->auto_log(), log);
  // Variable lengths: only the standard algorithm runs them.
  const Case v{"uni_b8_varlen", make_spec(32, 64, 1, false), 10, 8, {10, 1, 4, 10, 7, 2, 9, 5}, true};
  const Problem pv = make_problem(v, 10);
  compare(run_gpu(*be, pv, DType::F16, true), run_reference(pv), pv, kF16.tol);
  EXPECT_EQ(cb->last_algo(), "standard");
  EXPECT_NE(cb->auto_log().find("skipped (variable lengths)"), std::string::npos) << cb->auto_log();
#endif
}

// "heuristic" runs the algorithm PyTorch's rule names: persist_static_small_h for small hidden sizes
// (up to 192 in inference, 128 in training), persist_static for single-layer fp16, standard
// otherwise and for variable lengths; each call's results match the float64 reference.
TEST(CudnnLstm, HeuristicRunsTheAlgorithmPytorchsRuleNames) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  struct H {
    Case c;
    Prec pr;
    bool training;
    std::string want;
  };
  const std::vector<H> hs = {
      {{"small_h_infer", make_spec(32, 64, 2, true), 9, 8, {}, true}, kF32, false, "persist_static_small_h"},
      {{"small_h_train", make_spec(32, 64, 2, true), 9, 8, {}, true}, kF32, true, "persist_static_small_h"},
      {{"mid_h_infer", make_spec(32, 160, 1, false), 9, 8, {}, false}, kTF32, false, "persist_static_small_h"},
      {{"mid_h_train", make_spec(32, 160, 1, false), 9, 8, {}, false}, kTF32, true, "standard"},
      {{"small_h_varlen", make_spec(32, 64, 1, false), 9, 4, {9, 2, 5, 9}, false}, kBF16, false, "standard"},
      {{"f16_one_layer", make_spec(128, 256, 1, false), 12, 16, {}, false}, kF16, false, "persist_static"},
      {{"f16_one_layer_train", make_spec(128, 256, 1, false), 12, 16, {}, false}, kF16, true, "persist_static"},
      {{"f16_two_layers", make_spec(128, 256, 2, false), 12, 16, {}, false}, kF16, false, "standard"},
  };
  const cudaDeviceProp& prop = cuda::device_prop();
  uint64_t seed = 500;
  for (const H& h : hs) {
    SCOPED_TRACE(h.c.name);
    const std::string want = cudnn_heuristic_algo(h.c.spec, h.pr.dt, h.c.T, h.c.B, !h.c.lengths.empty(), h.training,
                                                  prop.major, prop.minor, prop.multiProcessorCount);
    // The expectations above are the rule's answers on sm_80 and newer with at least 100 SMs.
    if (prop.major >= 8 && prop.multiProcessorCount >= 100) {
      EXPECT_EQ(want, h.want);
    }
    const Problem p = make_problem(h.c, ++seed);
    const Result ref = run_reference(p);
    auto be = cudnn("heuristic", h.pr, h.c.spec);
    auto* cb = dynamic_cast<CudnnLstmBackend*>(be.get());
    ASSERT_TRUE(cb);
    if (h.training) {
      compare(run_gpu(*be, p, h.pr.dt, true), ref, p, h.pr.tol);
    } else {
      const LstmOutput out = infer_gpu(*be, p, h.pr.dt);
      expect_close(f64(out.output), ref.out.output, h.pr.tol, "output");
      expect_close(f64(out.h_n), ref.out.h_n, h.pr.tol, "h_n");
      expect_close(f64(out.c_n), ref.out.c_n, h.pr.tol, "c_n");
    }
    EXPECT_EQ(cb->last_algo(), want);
  }
#endif
}

// TF32 keeps fp32's exponent range: inputs far beyond fp16's largest value (65504) give the same
// result as in float64, in every algorithm that accepts the case (a math mode that converted F32
// data to half precision would turn them into inf).
TEST(CudnnLstm, Tf32KeepsTheFp32Range) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  const Case c{"wide_range", make_spec(32, 64, 1, false), 8, 8, {}, false};
  Problem p = make_problem(c, 77);
  // x ~ U(-1e6, 1e6), the input weights scaled down by 1e-6: pre-activations stay O(1).
  for (int64_t i = 0; i < p.in.x.numel(); ++i) p.in.x.set(i, p.in.x.get(i) * 1e6);
  for (size_t i = 0; i < p.w.size(); ++i)
    if (c.spec.param_names()[i].rfind("weight_ih", 0) == 0)
      for (int64_t j = 0; j < p.w[i].numel(); ++j) p.w[i].set(j, p.w[i].get(j) * 1e-6);
  const Result ref = run_reference(p);
  for (const char* algo : {"standard", "persist_static", "persist_static_small_h", "heuristic"}) {
    SCOPED_TRACE(algo);
    auto be = cudnn(algo, kTF32, c.spec);
    const LstmOutput out = infer_gpu(*be, p, DType::F32);
    expect_close(f64(out.output), ref.out.output, 3 * kTF32.tol, "output");
    expect_close(f64(out.c_n), ref.out.c_n, 3 * kTF32.tol, "c_n");
  }
#endif
}

// ---- Dropout between layers ----

TEST(CudnnLstm, DropoutTrainingDiffersInferenceIsDeterministic) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  LstmSpec s = make_spec(16, 32, 3, true);
  s.dropout = 0.4;
  // Standard with variable lengths; the default algorithm (PyTorch's rule) with equal lengths,
  // which takes persist_static_small_h at this hidden size, in training too.
  for (const auto& [algo, lengths] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"standard", {8, 3, 6, 1}}, {LstmOptions{}.cudnn_algo, {}}}) {
    SCOPED_TRACE(algo);
    const Case c{"drop", s, 8, 4, lengths, true};
    const Problem p = make_problem(c, 21);
    auto be = cudnn(algo, kF32, s);
    std::vector<Tensor> w;
    for (auto& t : p.w) w.push_back(on_gpu(t, DType::F32));
    LstmInput in{on_gpu(p.in.x, DType::F32), p.in.lengths, on_gpu(p.in.h0, DType::F32), on_gpu(p.in.c0, DType::F32)};
    Rng rng(5);
    const Tensor inf1 = f64(be->forward(s, w, in, false, &rng, nullptr).output);
    const Tensor inf2 = f64(be->forward(s, w, in, false, &rng, nullptr).output);
    EXPECT_EQ(max_abs_diff(inf1, inf2), 0.0) << "inference must not drop";
    // Inference equals the reference without dropout.
    LstmSpec nodrop = s;
    nodrop.dropout = 0;
    Problem pn = p;
    pn.spec = nodrop;
    expect_close(inf1, run_reference(pn).out.output, kF32.tol, "inference output");

    std::unique_ptr<LstmSaved> saved;
    const Tensor tr1 = f64(be->forward(s, w, in, true, &rng, &saved).output);
    const Tensor tr2 = f64(be->forward(s, w, in, true, &rng, nullptr).output);
    EXPECT_GT(max_abs_diff(tr1, inf1), 1e-3) << "training must drop";
    EXPECT_GT(max_abs_diff(tr1, tr2), 1e-3) << "masks must change from call to call";
    if (algo != "standard") {
      EXPECT_EQ(dynamic_cast<CudnnLstmBackend&>(*be).last_algo(), "persist_static_small_h");
    }
    EXPECT_FALSE(has_non_finite(tr1));
    expect_zero_past_lengths(tr1, s, p.in.lengths, c.T, c.B, "training output");
    std::vector<Tensor> dw;
    for (auto& t : w) dw.push_back(Tensor::zeros(t.shape(), DType::F32, Device::CUDA));
    LstmGradOutput g{on_gpu(p.grad.d_output, DType::F32), {}, {}};
    LstmGrads r = be->backward(s, w, *saved, g, dw);
    EXPECT_FALSE(has_non_finite(r.d_x.cpu()));
    expect_zero_past_lengths(r.d_x.cpu(), s, p.in.lengths, c.T, c.B, "d_x");
    for (auto& t : dw) EXPECT_FALSE(has_non_finite(t.cpu()));
    // The saved state is spent.
    EXPECT_NE(error_of([&] { be->backward(s, w, *saved, g, dw); }), "");
  }
#endif
}

// ---- The LSTM layer on the GPU ----

struct LayerCase {
  Precision prec;
  std::string output;
  std::string cudnn_algo = "standard";
};
void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << precision_name(c.prec) << " " << c.output << " " << c.cudnn_algo;
}

class CudnnLstmLayer : public ::testing::TestWithParam<LayerCase> {};

namespace {
double layer_tol(Precision p) {
  switch (p) {
    case Precision::F32: return 1e-5;
    case Precision::TF32: return 1e-3;
    default: return 2e-2;
  }
}

// An F64 CPU copy of `src` (same spec and weights), the reference.
std::unique_ptr<Layer> cpu_twin(Layer& src, const LstmSpec& spec, const std::string& output) {
  auto l = make_lstm(spec, output);
  l->build({SignalKind::Sequence, spec.input_size}, DType::F64);
  auto ps = src.params(), pd = l->params();
  for (size_t i = 0; i < ps.size(); ++i) pd[i].value.copy_(ps[i].value);
  return l;
}
}  // namespace

TEST_P(CudnnLstmLayer, GpuMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Precision prec = GetParam().prec;
  const std::string output = GetParam().output;
  LstmOptions opts;
  opts.cudnn_algo = GetParam().cudnn_algo;
  LstmSpec spec = make_spec(0, 48, 2, true);
  auto gpu = make_lstm(spec, output);
  gpu->build({SignalKind::Sequence, 20}, DType::F32);
  Rng init(17);
  gpu->init(init);
  spec.input_size = 20;
  auto cpu = cpu_twin(*gpu, spec, output);
  gpu->place({Device::CUDA, prec, opts});
  for (auto& p : gpu->params()) {
    EXPECT_EQ(p.value.device(), Device::CUDA) << p.name;
    EXPECT_EQ(p.value.dtype(), DType::F32) << p.name;
    EXPECT_EQ(p.grad.device(), Device::CUDA) << p.name;
  }
  const int64_t T = 7, B = 4;
  const std::vector<int64_t> len{7, 3, 5, 1};
  Rng rng(23);
  Tensor x = Tensor::empty({T, B, 20}, DType::F64);
  rng.fill_uniform(x, -1, 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (t >= len[b])
        for (int64_t j = 0; j < 20; ++j) x.set((t * B + b) * 20 + j, 0.0);  // a model's rows past a length are zero
  Rng r1(1), r2(1);
  Act yc = cpu->forward({x, len}, true, r1);
  Act yg = gpu->forward({x.to(DType::F32).to_device(Device::CUDA), len}, true, r2);
  ASSERT_EQ(yg.data.device(), Device::CUDA);
  ASSERT_EQ(yg.data.dtype(), DType::F32);
  const double tol = layer_tol(prec);
  expect_close(f64(yg.data), yc.data, tol, "layer output");
  Tensor gy = Tensor::empty(yc.data.shape(), DType::F64);
  rng.fill_uniform(gy, -1, 1);
  Act gc = cpu->backward({gy, len});
  Act gg = gpu->backward({gy.to(DType::F32).to_device(Device::CUDA), len});
  expect_close(f64(gg.data), gc.data, tol, "layer d_x");
  auto pc = cpu->params(), pg = gpu->params();
  for (size_t i = 0; i < pc.size(); ++i) expect_close(f64(pg[i].grad), pc[i].grad, tol, "grad " + pc[i].name);
  // Gradients accumulate over calls, as on the CPU.
  Rng r3(1), r4(1);
  cpu->forward({x, len}, true, r3);
  gpu->forward({x.to(DType::F32).to_device(Device::CUDA), len}, true, r4);
  cpu->backward({gy, len});
  gpu->backward({gy.to(DType::F32).to_device(Device::CUDA), len});
  for (size_t i = 0; i < pc.size(); ++i)
    expect_close(f64(pg[i].grad), pc[i].grad, tol, "accumulated grad " + pc[i].name);
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudnnLstmLayer,
                         ::testing::Values(LayerCase{Precision::F32, "sequence"}, LayerCase{Precision::F32, "h_n"},
                                           LayerCase{Precision::TF32, "sequence"}, LayerCase{Precision::BF16, "sequence"},
                                           LayerCase{Precision::BF16, "h_n"}, LayerCase{Precision::F16, "sequence"},
                                           LayerCase{Precision::F16, "h_n"},
                                           LayerCase{Precision::F32, "sequence", "auto"}),
                         [](const ::testing::TestParamInfo<LayerCase>& i) {
                           return std::string(precision_name(i.param.prec)) + "_" + i.param.output + "_" +
                                  i.param.cudnn_algo;
                         });

TEST(CudnnLstmLayerPlacement, BackToCpuAndInitOnEitherDevice) {
  SKIP_WITHOUT_GPU();
  LstmSpec spec = make_spec(0, 16, 1, false, 8);
  auto a = make_lstm(spec, "sequence");
  auto b = make_lstm(spec, "sequence");
  a->build({SignalKind::Sequence, 6}, DType::F32);
  b->build({SignalKind::Sequence, 6}, DType::F32);
  b->place({Device::CUDA, Precision::F32, {}});
  Rng ra(3), rb(3);
  a->init(ra);
  b->init(rb);  // drawn on the CPU, copied to the GPU: the same values
  auto pa = a->params(), pb = b->params();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].value.device(), Device::CUDA);
    EXPECT_EQ(max_abs_diff(pa[i].value, pb[i].value), 0.0) << pa[i].name;
  }
  b->place({Device::CPU, Precision::F32, {}});
  pb = b->params();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].value.device(), Device::CPU);
    EXPECT_EQ(max_abs_diff(pa[i].value, pb[i].value), 0.0) << pa[i].name;
  }
  // And runs there with the reference backend.
  Tensor x = Tensor::empty({3, 2, 6}, DType::F32);
  Rng rx(4);
  rx.fill_uniform(x, -1, 1);
  Rng r1(1), r2(1);
  EXPECT_EQ(max_abs_diff(a->forward({x, {}}, false, r1).data, b->forward({x, {}}, false, r2).data), 0.0);
  // Back to the GPU at bf16: the weights travel again.
  b->place({Device::CUDA, Precision::BF16, {}});
  Rng r3(1);
  Act y = b->forward({x.to_device(Device::CUDA), {}}, false, r3);
  Rng r4(1);
  expect_close(f64(y.data), f64(a->forward({x, {}}, false, r4).data), 2e-2, "bf16 output after moves");
}

TEST(CudnnLstmLayerPlacement, StatefulOnGpuCarriesTheState) {
  SKIP_WITHOUT_GPU();
  LstmSpec spec = make_spec(0, 24, 2, false);
  auto cpu = make_lstm(spec, "h_n");
  cpu->build({SignalKind::Sequence, 5}, DType::F32);
  Rng init(8);
  cpu->init(init);
  auto gpu = make_lstm(spec, "h_n");
  gpu->build({SignalKind::Sequence, 5}, DType::F32);
  auto pc = cpu->params(), pg = gpu->params();
  for (size_t i = 0; i < pc.size(); ++i) pg[i].value.copy_(pc[i].value);
  gpu->place({Device::CUDA, Precision::F32, {}});
  cpu->set_stateful(true);
  gpu->set_stateful(true);
  Rng rx(9);
  for (int step = 0; step < 3; ++step) {
    Tensor x = Tensor::empty({1, 3, 5}, DType::F32);
    rx.fill_uniform(x, -1, 1);
    Rng r1(1), r2(1);
    Act yc = cpu->forward({x, {}}, false, r1);
    Act yg = gpu->forward({x.to_device(Device::CUDA), {}}, false, r2);
    expect_close(f64(yg.data), f64(yc.data), 1e-5, "stateful step " + std::to_string(step));
  }
}

// Not a check: prints which shapes each persistent algorithm accepts on this GPU and cuDNN, for
// the limits quoted in refusals and docs. Run with --gtest_also_run_disabled_tests.
TEST(CudnnLstm, DISABLED_ProbeAlgorithmLimits) {
  SKIP_WITHOUT_GPU();
#if LSTM_HAVE_CUDA
  std::cout << cuda_versions() << "\n";
  for (const char* a : {"persist_static", "persist_dynamic", "persist_static_small_h"})
    for (const Prec& pr : {kF32, kF16})
      for (int64_t B : {1, 8, 64})
        for (int64_t H : {64, 128, 192, 256, 384, 512, 768, 1024, 2048}) {
          if (std::string(a) == "persist_dynamic" && B != 8) continue;
          const Case c{"probe", make_spec(H, H, 1, false), 4, B, {}, false};
          const Problem p = make_problem(c, 1);
          std::string inf = error_of([&] {
            auto be = cudnn(a, pr, c.spec);
            infer_gpu(*be, p, pr.dt);
          });
          std::string tr = error_of([&] {
            auto be = cudnn(a, pr, c.spec);
            run_gpu(*be, p, pr.dt, true);
          });
          std::cout << "[ probe ] " << a << " " << pr.name << " B=" << B << " H=" << H
                    << " inference=" << (inf.empty() ? "ok" : "REFUSED") << " training=" << (tr.empty() ? "ok" : "REFUSED")
                    << "\n";
        }
#endif
}
