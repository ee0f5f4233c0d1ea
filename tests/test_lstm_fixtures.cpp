// Golden files from PyTorch (scripts/make_fixtures.py): our reference LSTM must reproduce
// nn.LSTM's outputs and gradients for every tests/fixtures/lstm_*.safetensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/tensor.hpp"

using namespace lstm;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fixture_files() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(LSTM_FIXTURE_DIR, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("lstm_", 0) == 0 && e.path().extension() == ".safetensors")
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

const Tensor& need(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors.find(name);
  LSTM_REQUIRE(it != f.tensors.end(), "fixture has no tensor '" << name << "'");
  return it->second;
}

const Tensor* maybe(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors.find(name);
  return it == f.tensors.end() ? nullptr : &it->second;
}

const std::string& meta(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  LSTM_REQUIRE(it != f.metadata.end(), "fixture has no metadata '" << key << "'");
  return it->second;
}

bool meta_bool(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = meta(f, key);
  LSTM_REQUIRE(v == "0" || v == "1", "fixture metadata '" << key << "' must be \"0\" or \"1\", got '" << v << "'");
  return v == "1";
}

LstmSpec spec_from_metadata(const SafetensorsFile& f) {
  LstmSpec s;
  s.input_size = std::stoll(meta(f, "input_size"));
  s.hidden_size = std::stoll(meta(f, "hidden_size"));
  s.num_layers = std::stoll(meta(f, "num_layers"));
  s.proj_size = std::stoll(meta(f, "proj_size"));
  s.bidirectional = meta_bool(f, "bidirectional");
  s.batch_first = meta_bool(f, "batch_first");
  s.bias = meta_bool(f, "bias");
  return s;
}

void expect_match(const Tensor& ours, const Tensor& torch, double tol, const std::string& what) {
  ASSERT_TRUE(ours.defined()) << what << ": we returned nothing";
  ASSERT_EQ(ours.shape(), torch.shape()) << what;
  ASSERT_FALSE(has_non_finite(ours)) << what << ": non-finite values";
  const double err = rel_l2_error(ours, torch);
  EXPECT_LT(err, tol) << what << ": relative L2 error " << err << ", max abs diff " << max_abs_diff(ours, torch);
}

// Forward (training, saved state, no dropout) and backward in `dt`, compared with the file.
void replay(const SafetensorsFile& f, const LstmSpec& spec, DType dt, double tol) {
  std::vector<Tensor> w;
  for (const auto& n : spec.param_names()) w.push_back(need(f, n).to(dt));
  LstmInput in;
  // Used as stored: NaN past each length is part of what is tested.
  in.x = need(f, "input").to(dt);
  if (const Tensor* len = maybe(f, "lengths")) {
    ASSERT_EQ(len->dtype(), DType::I64);
    for (int64_t i = 0; i < len->numel(); ++i) in.lengths.push_back(static_cast<int64_t>(len->get(i)));
  }
  const bool has_h0 = maybe(f, "h0") != nullptr;
  ASSERT_EQ(has_h0, maybe(f, "c0") != nullptr);
  if (has_h0) {
    in.h0 = need(f, "h0").to(dt);
    in.c0 = need(f, "c0").to(dt);
  }

  auto be_owner = lstm::testing::reference_backend(spec, dt);
  LstmBackend& be = *be_owner;
  Rng rng(1);
  std::unique_ptr<LstmSaved> saved;
  LstmOutput out = be.forward(w, in, /*training=*/true, &rng, &saved, ExecContext::cpu());
  ASSERT_TRUE(saved);
  ASSERT_EQ(out.output.dtype(), dt);
  expect_match(out.output, need(f, "output"), tol, "output");
  expect_match(out.h_n, need(f, "h_n"), tol, "h_n");
  expect_match(out.c_n, need(f, "c_n"), tol, "c_n");

  LstmGradOutput cot{need(f, "r_output").to(dt), need(f, "r_h_n").to(dt), need(f, "r_c_n").to(dt)};
  std::vector<Tensor> dw;
  for (const auto& t : w) dw.push_back(Tensor::zeros(t.shape(), dt));
  LstmGrads g = be.backward(w, *saved, cot, dw, ExecContext::cpu());
  expect_match(g.d_x, need(f, "grad_input"), tol, "grad_input");
  // Where the input is poison, the gradient is exactly zero, not merely small.
  for (int64_t i = 0; i < in.x.numel(); ++i)
    if (std::isnan(in.x.get(i))) {
      ASSERT_EQ(g.d_x.get(i), 0.0) << "grad_input at poisoned element " << i;
    }
  if (has_h0) {
    expect_match(g.d_h0, need(f, "grad_h0"), tol, "grad_h0");
    expect_match(g.d_c0, need(f, "grad_c0"), tol, "grad_c0");
  } else {
    EXPECT_FALSE(g.d_h0.defined());
    EXPECT_FALSE(g.d_c0.defined());
  }
  auto names = spec.param_names();
  for (size_t i = 0; i < names.size(); ++i) expect_match(dw[i], need(f, "grad." + names[i]), tol, "grad." + names[i]);
}

class LstmFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LstmFixture, ReferenceMatchesTorch) {
  const SafetensorsFile f = read_safetensors(GetParam());
  const LstmSpec spec = spec_from_metadata(f);
  // The tensor names alone must describe the same LSTM (batch_first is not in a state_dict).
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : f.tensors) shapes[name] = t.shape();
  LstmSpec inferred = LstmSpec::infer(shapes);
  inferred.batch_first = spec.batch_first;
  EXPECT_EQ(inferred, spec) << "metadata and tensor names disagree";

  const DType dt = dtype_from_name(meta(f, "dtype"));
  ASSERT_TRUE(dt == DType::F64 || dt == DType::F32) << meta(f, "dtype");
  for (const auto& [name, t] : f.tensors)
    if (name != "lengths") {
      ASSERT_EQ(t.dtype(), dt) << name;
    }

  {
    SCOPED_TRACE(std::string("run in ") + dtype_name(dt));
    replay(f, spec, dt, dt == DType::F64 ? 1e-10 : 1e-5);
  }
  if (dt == DType::F64) {
    SCOPED_TRACE("f64 fixture run in F32");
    replay(f, spec, DType::F32, 1e-5);
  }
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = fs::path(info.param).stem().string().substr(5);  // drops "lstm_"
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Torch, LstmFixture, ::testing::ValuesIn(fixture_files()), test_name);
// With no fixtures the suite above is empty; the test below turns that into a failure.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(LstmFixture);

TEST(LstmFixtures, AreCommittedAndCoverEveryFeature) {
  const auto files = fixture_files();
  ASSERT_FALSE(files.empty()) << "no lstm_*.safetensors in " << LSTM_FIXTURE_DIR
                              << "; they are committed, made by: python3 scripts/make_fixtures.py";
  // Each feature of nn.LSTM must appear in some file, so that deleting one is noticed.
  std::set<std::string> seen;
  for (const auto& path : files) {
    const SafetensorsFile f = read_safetensors(path);
    const LstmSpec s = spec_from_metadata(f);
    if (s.num_layers == 1) seen.insert("1 layer");
    if (s.num_layers >= 3) seen.insert("3+ layers");
    if (!s.bidirectional) seen.insert("unidirectional");
    if (s.bidirectional) seen.insert("bidirectional");
    if (s.proj_size > 0 && !s.bidirectional) seen.insert("proj uni");
    if (s.proj_size > 0 && s.bidirectional) seen.insert("proj bi");
    if (s.batch_first) seen.insert("batch_first");
    if (!s.bias) seen.insert("bias=false");
    if (s.input_size != s.hidden_size) seen.insert("input != hidden");
    if (maybe(f, "h0")) seen.insert("h0/c0");
    if (!maybe(f, "h0")) seen.insert("no h0/c0");
    if (meta(f, "dtype") == "F32") seen.insert("f32");
    if (const Tensor* len = maybe(f, "lengths")) {
      const int64_t T = s.batch_first ? need(f, "input").size(1) : need(f, "input").size(0);
      bool equal = true, has_one = false;
      for (int64_t i = 0; i < len->numel(); ++i) {
        equal = equal && static_cast<int64_t>(len->get(i)) == T;
        has_one = has_one || len->get(i) == 1;
      }
      seen.insert(equal ? "equal lengths" : "variable lengths");
      if (has_one) seen.insert("a length-1 sequence");
      if (s.num_layers >= 3 && s.bidirectional && s.proj_size > 0 && s.batch_first && !equal && maybe(f, "h0"))
        seen.insert("everything combined");
    }
  }
  for (const char* want : {"1 layer", "3+ layers", "unidirectional", "bidirectional", "proj uni", "proj bi",
                           "batch_first", "bias=false", "input != hidden", "h0/c0", "no h0/c0", "f32",
                           "equal lengths", "variable lengths", "a length-1 sequence", "everything combined"})
    EXPECT_TRUE(seen.count(want)) << "no fixture has: " << want;
}

}  // namespace
