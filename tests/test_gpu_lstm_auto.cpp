// Algo::Auto: on a GPU (and on the CPU, among the CPU rows) the first call with a shape times every
// registered backend that runs it and keeps the fastest, in a choice file reused by later instances
// and processes. Without a GPU the GPU tests skip and say why; the CPU tests and where the choice
// file is kept are tested everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "model/lstm_auto.hpp"
#include "test_util.hpp"

using namespace lstm;
using lstm::testing::make_spec;
using lstm::testing::random_tensor;
namespace fs = std::filesystem;

namespace {

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

double rel_l2(const Tensor& got, const Tensor& want) {
  const Tensor a = got.cpu().to(DType::F64), b = want.cpu().to(DType::F64);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (a.get(i) - b.get(i)) * (a.get(i) - b.get(i));
    den += b.get(i) * b.get(i);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Restores an environment variable when it goes.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

struct Problem {
  LstmSpec spec;
  std::vector<Tensor> w64;  // CPU F64
  LstmInput in64;           // CPU F64
};

Problem make_problem(const LstmSpec& s, int64_t T, int64_t B, uint64_t seed) {
  Problem p;
  p.spec = s;
  Rng rng(seed);
  for (const auto& n : s.param_names()) p.w64.push_back(random_tensor(s.param_shape(n), rng, 0.2, DType::F64));
  p.in64.x = random_tensor({T, B, s.input_size}, rng, 1.0, DType::F64);
  return p;
}

std::vector<Tensor> on_gpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const auto& t : ts) out.push_back(t.to(DType::F32).to_device(Device::CUDA));
  return out;
}

LstmOptions auto_options(const fs::path& cache) {
  LstmOptions o;
  o.algo = Algo::Auto;
  o.auto_cache = cache.string();
  return o;
}

}  // namespace

TEST(LstmAuto, ChoiceFileLocation) {
  EXPECT_EQ(auto_cache_path("-"), "");
  EXPECT_EQ(auto_cache_path("/tmp/x.json"), "/tmp/x.json");
  {
    EnvVar e("LSTM_AUTO_CACHE", "/some/where.json");
    EXPECT_EQ(auto_cache_path(""), "/some/where.json");
  }
  {
    EnvVar e("LSTM_AUTO_CACHE", "-");
    EXPECT_EQ(auto_cache_path(""), "");
  }
  {
    EnvVar e("LSTM_AUTO_CACHE", nullptr), x("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(auto_cache_path(""), "/xdg/lstm-engine/auto.json");
  }
  {
    EnvVar e("LSTM_AUTO_CACHE", nullptr), x("XDG_CACHE_HOME", nullptr), h("HOME", "/home/u");
    EXPECT_EQ(auto_cache_path(""), "/home/u/.cache/lstm-engine/auto.json");
  }
}

// On the CPU in F64 only the reference runs the case: Auto runs it and measures nothing.
TEST(LstmAuto, OnTheCpuF64RunsTheReferenceUnmeasured) {
  LstmOptions o;
  o.auto_cache = "-";
  const LstmSpec s = make_spec(4, 8, 1);
  auto be = make_lstm_backend(o, s, DType::F64, Device::CPU);
  EXPECT_EQ(be->name(), "auto");
  const Problem p = make_problem(s, 5, 2, 1);
  const LstmOutput got = be->forward(p.w64, p.in64, false, nullptr, nullptr, ExecContext::cpu());
  auto ref = lstm::testing::reference_backend(s);
  const LstmOutput want = ref->forward(p.w64, p.in64, false, nullptr, nullptr, ExecContext::cpu());
  EXPECT_EQ(rel_l2(got.output, want.output), 0.0);
  EXPECT_EQ(be->last_run(), "auto: reference");
  EXPECT_NE(be->log().find("reference, the only backend that runs it"), std::string::npos) << be->log();
}

// On the CPU in F32 Auto times the CPU rows (the reference and, when built in, onednn) on the
// first call of a shape, keeps the fastest, and gives the reference's numbers, in inference and
// in training (gradients included, with variable lengths); the next call measures nothing.
TEST(LstmAuto, OnTheCpuF32MeasuresTheCpuRows) {
  const fs::path dir = lstm::testing::temp_dir("lstm_auto", "cpu");
  const LstmSpec s = make_spec(16, 32, 2, true);
  auto be = make_lstm_backend(auto_options(dir / "auto.json"), s, DType::F32, Device::CPU);
  EXPECT_EQ(be->name(), "auto");
  const Problem p = make_problem(s, 7, 4, 1);
  std::vector<Tensor> w;
  for (const auto& t : p.w64) w.push_back(t.to(DType::F32));
  LstmInput in{p.in64.x.to(DType::F32), {7, 3, 7, 1}, {}, {}};
  LstmInput in64 = p.in64;
  in64.lengths = in.lengths;
  auto ref = lstm::testing::reference_backend(s);
  const LstmOutput want = ref->forward(p.w64, in64, false, nullptr, nullptr, ExecContext::cpu());
  const LstmOutput got = be->forward(w, in, false, nullptr, nullptr, ExecContext::cpu());
  EXPECT_LT(rel_l2(got.output, want.output), 1e-5);
  EXPECT_LT(rel_l2(got.h_n, want.h_n), 1e-5);
  EXPECT_LT(rel_l2(got.c_n, want.c_n), 1e-5);
  const std::string log1 = be->log();
  std::cout << "[ info ] " << log1;
  EXPECT_EQ(count_of(log1, "auto ("), 1u) << log1;
  const bool measured = lstm_backend_entry("onednn").why_not(s, DType::F32, Device::CPU, LstmOptions{}).empty();
  if (measured) {
    EXPECT_NE(log1.find(" reference "), std::string::npos) << "the reference was not timed: " << log1;
    EXPECT_NE(log1.find(" onednn "), std::string::npos) << "onednn was not timed: " << log1;
    EXPECT_NE(log1.find("picked "), std::string::npos) << log1;
  } else {
    EXPECT_NE(log1.find("reference, the only backend that runs it"), std::string::npos) << log1;
  }
  be->forward(w, in, false, nullptr, nullptr, ExecContext::cpu());
  EXPECT_EQ(count_of(be->log(), "auto ("), 1u) << be->log();
  EXPECT_EQ(fs::exists(dir / "auto.json"), measured) << "the choice file holds measured choices only";
  if (measured) {
    // The kept choice names this build of the engine: a build with other kernels measures again.
    const std::vector<std::string> kept = lstm_auto_choices(s, (dir / "auto.json").string());
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_NE(kept[0].find("lstm-engine " + engine_build() + ", "), std::string::npos) << kept[0];
    EXPECT_FALSE(engine_build().empty());
  }

  // Training: another key, measured anew; gradients match the reference's.
  std::unique_ptr<LstmSaved> saved;
  Rng r(1);
  const LstmOutput out = be->forward(w, in, true, &r, &saved, ExecContext::cpu());
  EXPECT_EQ(count_of(be->log(), "auto ("), 2u) << be->log();
  Rng dyr(4);
  Tensor dy64 = random_tensor(out.output.shape(), dyr, 1.0, DType::F64);
  std::vector<Tensor> dw, dw64;
  for (const auto& t : w) dw.push_back(Tensor::zeros(t.shape(), DType::F32));
  for (const auto& t : p.w64) dw64.push_back(Tensor::zeros(t.shape(), DType::F64));
  const LstmGrads g = be->backward(w, *saved, {dy64.to(DType::F32), {}, {}}, dw, ExecContext::cpu());
  std::unique_ptr<LstmSaved> rs;
  ref->forward(p.w64, in64, true, &r, &rs, ExecContext::cpu());
  const LstmGrads wg = ref->backward(p.w64, *rs, {dy64, {}, {}}, dw64, ExecContext::cpu());
  EXPECT_LT(rel_l2(g.d_x, wg.d_x), 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_LT(rel_l2(dw[i], dw64[i]), 5e-5) << s.param_names()[i];
  fs::remove_all(dir);
}

// The first call of a shape measures, picks a row that runs the case, says so, and gives the
// reference's numbers; the next call of the shape measures nothing; a new shape measures again.
TEST(LstmAuto, PicksPerShapeAndMatchesTheReference) {
  LSTM_REQUIRE_GPU();
  const fs::path dir = lstm::testing::temp_dir("lstm_auto", "pick");
  const LstmSpec s = make_spec(16, 32, 2, true);
  auto be = make_lstm_backend(auto_options(dir / "auto.json"), s, DType::F32, Device::CUDA);
  EXPECT_EQ(be->name(), "auto");
  const Problem p = make_problem(s, 7, 3, 1);
  auto ref = lstm::testing::reference_backend(s);
  const LstmOutput want = ref->forward(p.w64, p.in64, false, nullptr, nullptr, ExecContext::cpu());
  const std::vector<Tensor> w = on_gpu(p.w64);
  LstmInput in{p.in64.x.to(DType::F32).to_device(Device::CUDA), {}, {}, {}};
  const ExecContext ctx = ExecContext::current(Device::CUDA);
  const LstmOutput got = be->forward(w, in, false, nullptr, nullptr, ctx);
  EXPECT_LT(rel_l2(got.output, want.output), 1e-5);
  EXPECT_LT(rel_l2(got.h_n, want.h_n), 1e-5);
  const std::string log1 = be->log();
  EXPECT_EQ(count_of(log1, "auto ("), 1u) << log1;
  EXPECT_NE(log1.find("picked "), std::string::npos) << log1;
  EXPECT_EQ(be->last_run().rfind("auto: ", 0), 0u) << be->last_run();
  std::cout << "[ info ] " << log1;
  be->forward(w, in, false, nullptr, nullptr, ctx);
  EXPECT_EQ(count_of(be->log(), "auto ("), 1u) << be->log();
  // Another batch is another shape.
  LstmInput in2{random_tensor({7, 5, 16}, *std::make_unique<Rng>(2)).to_device(Device::CUDA), {}, {}, {}};
  be->forward(w, in2, false, nullptr, nullptr, ctx);
  EXPECT_EQ(count_of(be->log(), "auto ("), 2u) << be->log();
  // The choices are in the file, and a new instance takes them from there.
  EXPECT_TRUE(fs::exists(dir / "auto.json"));
  auto again = make_lstm_backend(auto_options(dir / "auto.json"), s, DType::F32, Device::CUDA);
  again->forward(w, in, false, nullptr, nullptr, ctx);
  EXPECT_NE(again->log().find("measured earlier"), std::string::npos) << again->log();
  // A damaged file is measured over, not trusted.
  { std::ofstream(dir / "bad.json") << "{\"not json"; }
  auto fresh = make_lstm_backend(auto_options(dir / "bad.json"), s, DType::F32, Device::CUDA);
  const LstmOutput g3 = fresh->forward(w, in, false, nullptr, nullptr, ctx);
  EXPECT_LT(rel_l2(g3.output, want.output), 1e-5);
  EXPECT_NE(fresh->log().find("picked "), std::string::npos) << fresh->log();
  fs::remove_all(dir);
}

// Training through Auto: gradients match the reference, and measuring draws nothing from the
// caller's Rng (dropout's random stream is the same as with the picked backend alone).
TEST(LstmAuto, TrainingMatchesAndLeavesTheRngAlone) {
  LSTM_REQUIRE_GPU();
  const LstmSpec s = make_spec(12, 24, 2, false);
  LstmOptions o = auto_options("");
  o.auto_cache = "-";
  auto be = make_lstm_backend(o, s, DType::F32, Device::CUDA);
  const Problem p = make_problem(s, 6, 4, 3);
  const std::vector<Tensor> w = on_gpu(p.w64);
  LstmInput in{p.in64.x.to(DType::F32).to_device(Device::CUDA), {6, 2, 5, 1}, {}, {}};
  LstmInput in64 = p.in64;
  in64.lengths = in.lengths;
  const ExecContext ctx = ExecContext::current(Device::CUDA);
  Rng r1(9);
  std::unique_ptr<LstmSaved> saved;
  const LstmOutput out = be->forward(w, in, true, &r1, &saved, ctx);
  Rng dyr(4);
  const Tensor dy64 = random_tensor(out.output.shape(), dyr, 1.0, DType::F64);
  std::vector<Tensor> dw;
  for (const auto& t : w) dw.push_back(Tensor::zeros(t.shape(), DType::F32, Device::CUDA));
  const LstmGrads g = be->backward(w, *saved, {dy64.to(DType::F32).to_device(Device::CUDA), {}, {}}, dw, ctx);

  auto ref = lstm::testing::reference_backend(s);
  std::unique_ptr<LstmSaved> rs;
  Rng r0(9);
  const LstmOutput want = ref->forward(p.w64, in64, true, &r0, &rs, ExecContext::cpu());
  std::vector<Tensor> dw64;
  for (const auto& t : p.w64) dw64.push_back(Tensor::zeros(t.shape(), DType::F64));
  const LstmGrads wg = ref->backward(p.w64, *rs, {dy64, {}, {}}, dw64, ExecContext::cpu());
  EXPECT_LT(rel_l2(out.output, want.output), 1e-5);
  EXPECT_LT(rel_l2(g.d_x, wg.d_x), 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_LT(rel_l2(dw[i], dw64[i]), 1e-4) << s.param_names()[i];

  // With dropout, the row Auto picked, run alone from the same seed, leaves the Rng where Auto
  // left it.
  LstmSpec sd = s;
  sd.dropout = 0.25;
  LstmOptions od = o;
  auto drop_auto = make_lstm_backend(od, sd, DType::F32, Device::CUDA);
  Rng ra(21);
  drop_auto->forward(w, in, true, &ra, nullptr, ctx);
  const std::string dlog = drop_auto->log();
  const size_t dat = dlog.find("picked ");
  ASSERT_NE(dat, std::string::npos) << dlog;
  const std::string dpicked = dlog.substr(dat + 7, dlog.find('\n', dat) - dat - 7);
  auto direct = make_lstm_backend(dpicked, od, sd, DType::F32, Device::CUDA);
  Rng rb(21);
  direct->forward(w, in, true, &rb, nullptr, ctx);
  EXPECT_EQ(ra.state(), rb.state()) << "Auto's trials drew from the caller's Rng (" << dlog << ")";
}
