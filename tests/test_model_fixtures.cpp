// Whole PyTorch models (state_dicts saved by safetensors.torch.save_file) load into Models with
// the same layers and give PyTorch's outputs. Fixtures: scripts/make_model_fixtures.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "lstm/model.hpp"
#include "lstm/safetensors.hpp"

using namespace lstm;

namespace {
std::string fixture(const std::string& name) {
  std::string p = std::string(LSTM_FIXTURE_DIR) + "/" + name;
  EXPECT_TRUE(std::filesystem::exists(p)) << p << " is missing: run scripts/make_model_fixtures.py";
  return p;
}
std::vector<int64_t> lengths_of(const Tensor& t) {
  std::vector<int64_t> l;
  for (int64_t i = 0; i < t.numel(); ++i) l.push_back(static_cast<int64_t>(t.get(i)));
  return l;
}
}  // namespace

TEST(ModelFixtures, PyTorchTaggerLoadsAndMatches) {
  SafetensorsFile w = read_safetensors(fixture("model_tagger.safetensors"));
  SafetensorsFile io = read_safetensors(fixture("model_tagger_io.safetensors"));
  Model m;
  m.add(make_embedding(11, 5)).add(make_lstm({.hidden_size = 7, .num_layers = 2, .bidirectional = true})).add(make_dense(11));
  m.build({SignalKind::Tokens, 11}, DType::F64);
  m.load_state_dict(w.tensors, /*strict=*/true);
  Rng rng(0);
  std::vector<int64_t> len = lengths_of(io.tensors.at("lengths"));
  Act out = m.forward({io.tensors.at("tokens"), len}, false, rng);
  const Tensor& ref = io.tensors.at("logits");
  ASSERT_EQ(out.data.shape(), ref.shape());
  // Compare the valid steps (PyTorch's Linear turns padded zeros into its bias; ours keeps zeros).
  const int64_t T = ref.size(0), B = ref.size(1), C = ref.size(2);
  double num = 0, den = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      if (t >= len[b]) continue;
      for (int64_t c = 0; c < C; ++c) {
        double r = ref.get((t * B + b) * C + c), d = out.data.get((t * B + b) * C + c) - r;
        num += d * d;
        den += r * r;
      }
    }
  EXPECT_LT(std::sqrt(num / den), 1e-10);
}

TEST(ModelFixtures, PyTorchClassifierLoadsAndMatches) {
  SafetensorsFile w = read_safetensors(fixture("model_classifier.safetensors"));
  SafetensorsFile io = read_safetensors(fixture("model_classifier_io.safetensors"));
  Model m;
  m.add(make_lstm({.hidden_size = 6, .num_layers = 2, .bidirectional = true, .proj_size = 3}, "h_n")).add(make_dense(5));
  m.build({SignalKind::Sequence, 4}, DType::F64);
  m.load_state_dict(w.tensors, true);
  Rng rng(0);
  Act out = m.forward({io.tensors.at("input"), lengths_of(io.tensors.at("lengths"))}, false, rng);
  EXPECT_LT(rel_l2_error(out.data, io.tensors.at("logits")), 1e-10);
  // The same file into the F32 model: within the f32 tolerance.
  Model m32;
  m32.add(make_lstm({.hidden_size = 6, .num_layers = 2, .bidirectional = true, .proj_size = 3}, "h_n")).add(make_dense(5));
  m32.build({SignalKind::Sequence, 4}, DType::F32);
  m32.load_state_dict(w.tensors, true);
  Act o32 = m32.forward({io.tensors.at("input").to(DType::F32), lengths_of(io.tensors.at("lengths"))}, false, rng);
  EXPECT_LT(rel_l2_error(o32.data, io.tensors.at("logits")), 1e-5);
}
