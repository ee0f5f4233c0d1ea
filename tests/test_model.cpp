// Model: whole-network gradients against finite differences, names, shape checks, files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "lstm/loss.hpp"
#include "lstm/model.hpp"
#include "lstm/safetensors.hpp"

using namespace lstm;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Loss of a model on a batch: mean cross-entropy over valid positions.
struct Net {
  Model model;
  Act input;
  Tensor targets;
  std::vector<uint8_t> mask;

  LossResult loss(bool training) {
    Rng rng(1);
    Act out = model.forward(input, training, rng);
    if (out.data.dim() == 3) {
      int64_t T = out.data.size(0), B = out.data.size(1), C = out.data.size(2);
      LossResult r = softmax_cross_entropy(out.data.reshape({T * B, C}), targets.reshape({T * B}), -100, mask);
      r.grad = r.grad.reshape({T, B, C});
      return r;
    }
    return softmax_cross_entropy(out.data, targets);
  }
};

// Central differences on every parameter entry (and the input when it is floating).
void check_gradients(Net& net, double tol) {
  // Default-initialised weights give gradients so small that differences of the loss drown in
  // rounding; larger weights make the check meaningful.
  for (auto& p : net.model.parameters())
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.set(i, 4.0 * p.value.get(i));
  net.model.zero_grad();
  LossResult r = net.loss(true);
  Act gin = net.model.backward({r.grad, net.input.lengths});
  const double eps = 1e-5;
  for (auto& p : net.model.parameters()) {
    double num2 = 0, den2 = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      double v = p.value.get(i);
      p.value.set(i, v + eps);
      double lp = net.loss(true).loss;
      p.value.set(i, v - eps);
      double lm = net.loss(true).loss;
      p.value.set(i, v);
      double fd = (lp - lm) / (2 * eps);
      double an = p.grad.get(i);
      num2 += (fd - an) * (fd - an);
      den2 += fd * fd;
    }
    EXPECT_LT(std::sqrt(num2 / std::max(den2, 1e-30)), tol) << p.name << " abs err " << std::sqrt(num2) << " norm " << std::sqrt(den2);
  }
  if (net.input.data.dtype() == DType::F64) {
    ASSERT_TRUE(gin.data.defined());
    double num2 = 0, den2 = 0;
    for (int64_t i = 0; i < net.input.data.numel(); ++i) {
      double v = net.input.data.get(i);
      net.input.data.set(i, v + eps);
      double lp = net.loss(true).loss;
      net.input.data.set(i, v - eps);
      double lm = net.loss(true).loss;
      net.input.data.set(i, v);
      double fd = (lp - lm) / (2 * eps);
      double an = gin.data.get(i);
      num2 += (fd - an) * (fd - an);
      den2 += fd * fd;
    }
    EXPECT_LT(std::sqrt(num2 / std::max(den2, 1e-30)), tol) << "input";
  }
}

}  // namespace

TEST(Model, WholeLanguageModelGradientsMatchFiniteDifferences) {
  const int64_t V = 7, T = 5, B = 3;
  Net net;
  net.model.add(make_embedding(V, 3))
      .add(make_lstm({.hidden_size = 4, .num_layers = 2, .bidirectional = true, .proj_size = 3}))
      .add(make_dense(6))
      .add(make_activation("tanh"))
      .add(make_dense(V));
  net.model.build({SignalKind::Tokens, V}, DType::F64);
  Rng rng(3);
  net.model.init(rng);
  std::vector<int64_t> tok(T * B), tgt(T * B);
  for (auto& t : tok) t = static_cast<int64_t>(rng.below(V));
  for (auto& t : tgt) t = static_cast<int64_t>(rng.below(V));
  net.input = {Tensor::from_vector<int64_t>({T, B}, tok), {5, 1, 3}};
  net.targets = Tensor::from_vector<int64_t>({T, B}, tgt);
  net.mask.assign(T * B, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) net.mask[t * B + b] = t < net.input.lengths[b];
  check_gradients(net, 1e-6);
}

TEST(Model, WholeClassifierGradientsMatchFiniteDifferences) {
  const int64_t T = 6, B = 4, F = 3, C = 3;
  for (const char* head : {"last_step", "h_n"}) {
    Net net;
    if (std::string(head) == "h_n") {
      net.model.add(make_lstm({.hidden_size = 4, .num_layers = 2, .bidirectional = true}, "h_n"));
    } else {
      net.model.add(make_lstm({.hidden_size = 4, .num_layers = 2, .bidirectional = true}));
      net.model.add(make_last_step());
    }
    net.model.add(make_dense(5)).add(make_activation("relu")).add(make_dense(C));
    net.model.build({SignalKind::Sequence, F}, DType::F64);
    Rng rng(11);
    net.model.init(rng);
    Tensor x = Tensor::empty({T, B, F}, DType::F64);
    rng.fill_normal(x, 0, 1);
    net.input = {x, {6, 2, 1, 4}};
    net.targets = Tensor::from_vector<int64_t>({B}, {0, 2, 1, 2});
    SCOPED_TRACE(head);
    check_gradients(net, 1e-6);
  }
}

TEST(Model, StateDictNamesArePyTorchNames) {
  Model m;
  m.add(make_embedding(10, 4)).add(make_lstm({.hidden_size = 8, .bidirectional = true})).add(make_dense(10));
  m.build({SignalKind::Tokens, 10});
  std::vector<std::string> names;
  for (auto& [k, v] : m.state_dict()) names.push_back(k);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(
                         "embedding.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0",
                         "lstm.bias_hh_l0", "lstm.weight_ih_l0_reverse", "lstm.weight_hh_l0_reverse",
                         "lstm.bias_ih_l0_reverse", "lstm.bias_hh_l0_reverse", "fc.weight", "fc.bias"));
  EXPECT_EQ(m.state_dict().at("lstm.weight_ih_l0").shape(), (Shape{32, 4}));
  EXPECT_EQ(m.state_dict().at("fc.weight").shape(), (Shape{10, 16}));
  EXPECT_EQ(m.num_parameters(), 40 + 2 * (32 * 4 + 32 * 8 + 64) + 160 + 10);
}

TEST(Model, BuildErrorsNameTheLayer) {
  Model m;
  m.add(make_lstm({.hidden_size = 8})).add(make_dense(3));
  std::string e = error_of([&] { m.build({SignalKind::Tokens, 10}); });
  EXPECT_THAT(e, HasSubstr("layer 0 'lstm' (lstm)"));
  EXPECT_THAT(e, HasSubstr("tokens"));
  Model m2;
  m2.add(make_lstm({.input_size = 5, .hidden_size = 8}));
  EXPECT_THAT(error_of([&] { m2.build({SignalKind::Sequence, 6}); }),
              ::testing::AllOf(HasSubstr("input_size 5"), HasSubstr("6 features")));
  Model m3;
  m3.add(make_dense(3));
  EXPECT_THAT(error_of([&] { m3.add(make_dense(2), "fc"); }), HasSubstr("taken"));
}

TEST(Model, JsonRoundTripAndStateDictLoad) {
  Model m;
  m.add(make_embedding(12, 5))
      .add(make_lstm({.hidden_size = 6, .num_layers = 2, .proj_size = 4, .dropout = 0.1}))
      .add(make_dropout(0.2))
      .add(make_dense(12));
  m.build({SignalKind::Tokens, 12});
  Rng rng(5);
  m.init(rng);
  Model m2 = Model::from_json(m.to_json());
  EXPECT_EQ(m2.to_json(), m.to_json());
  m2.load_state_dict(m.state_dict());
  Tensor x = Tensor::from_vector<int64_t>({3, 2}, {1, 2, 3, 4, 5, 6});
  Rng r1(0), r2(0);
  Act a = m.forward({x, {}}, false, r1), b = m2.forward({x, {}}, false, r2);
  EXPECT_EQ(max_abs_diff(a.data, b.data), 0.0);
}

TEST(Model, LoadingADifferentArchitectureFailsAndChangesNothing) {
  Model m;
  m.add(make_embedding(12, 5)).add(make_lstm({.hidden_size = 6})).add(make_dense(12));
  m.build({SignalKind::Tokens, 12});
  Rng rng(5);
  m.init(rng);
  auto before = m.state_dict().at("fc.weight").clone();
  Model other;
  other.add(make_embedding(12, 5)).add(make_lstm({.hidden_size = 7})).add(make_dense(12));
  other.build({SignalKind::Tokens, 12});
  other.init(rng);
  std::string e = error_of([&] { m.load_state_dict(other.state_dict()); });
  EXPECT_THAT(e, ::testing::AllOf(HasSubstr("lstm.weight_ih_l0"), HasSubstr("[24, 5]"), HasSubstr("[28, 5]")));
  EXPECT_EQ(max_abs_diff(m.state_dict().at("fc.weight"), before), 0.0);
  auto sd = m.state_dict();
  sd["extra.weight"] = Tensor::zeros({1});
  EXPECT_THAT(error_of([&] { m.load_state_dict(sd); }), HasSubstr("extra.weight"));
  sd.erase("extra.weight");
  sd.erase("fc.bias");
  EXPECT_THAT(error_of([&] { m.load_state_dict(sd); }), HasSubstr("missing 'fc.bias'"));
}

TEST(Model, SaveAndLoadModelFile) {
  fs::path dir = fs::temp_directory_path() / ("lstm_model_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Model m;
  m.add(make_lstm({.hidden_size = 6, .bidirectional = true}, "h_n")).add(make_dense(3));
  m.build({SignalKind::Sequence, 4});
  Rng rng(9);
  m.init(rng);
  std::string p = (dir / "m.safetensors").string();
  save_model(p, m, {{"note", "hello"}});
  std::map<std::string, std::string> meta;
  Model l = load_model(p, &meta);
  EXPECT_EQ(meta.at("note"), "hello");
  for (auto& [k, v] : m.state_dict()) EXPECT_EQ(max_abs_diff(v, l.state_dict().at(k)), 0.0) << k;
  // A bare state_dict (as PyTorch writes it) is not a model file: the error says what to use.
  write_safetensors((dir / "bare.safetensors").string(), m.state_dict());
  EXPECT_THAT(error_of([&] { load_model((dir / "bare.safetensors").string()); }), HasSubstr("lstm forward"));
  fs::remove_all(dir);
}

TEST(Model, StatefulStreamingEqualsOneLongForward) {
  Model m;
  m.add(make_embedding(9, 4)).add(make_lstm({.hidden_size = 5, .num_layers = 2})).add(make_dense(9));
  m.build({SignalKind::Tokens, 9}, DType::F64);
  Rng rng(2);
  m.init(rng);
  std::vector<int64_t> ids = {1, 4, 2, 8, 0, 3, 3, 7};
  Act whole = m.forward({Tensor::from_vector<int64_t>({8, 1}, ids), {}}, false, rng);
  m.set_stateful(true);
  Act first = m.forward({Tensor::from_vector<int64_t>({5, 1}, {1, 4, 2, 8, 0}), {}}, false, rng);
  Act rest = m.forward({Tensor::from_vector<int64_t>({3, 1}, {3, 3, 7}), {}}, false, rng);
  m.set_stateful(false);
  EXPECT_LT(max_abs_diff(first.data, whole.data.slice0(0, 5)), 1e-14);
  EXPECT_LT(max_abs_diff(rest.data, whole.data.slice0(5, 8)), 1e-14);
}
