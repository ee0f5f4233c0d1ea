#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "lstm/optim.hpp"
#include "lstm/parallel.hpp"
#include "lstm/rng.hpp"

using namespace lstm;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

Param make_param(const std::string& name, const Shape& shape, DType dt) {
  return Param{name, Tensor::zeros(shape, dt), Tensor::zeros(shape, dt)};
}

Param random_param(const std::string& name, const Shape& shape, DType dt, Rng& rng) {
  Param p = make_param(name, shape, dt);
  rng.fill_normal(p.value, 0.0, 1.0);
  rng.fill_normal(p.grad, 0.0, 1.0);
  return p;
}

// Deep copies, so that two optimizers can run side by side on the same starting point.
std::vector<Param> clone_params(const std::vector<Param>& ps) {
  std::vector<Param> out;
  for (const Param& p : ps) out.push_back(Param{p.name, p.value.clone(), p.grad.clone()});
  return out;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

template <class T>
std::vector<T> values_of(const Tensor& t) {
  const T* d = t.data<T>();
  return std::vector<T>(d, d + t.numel());
}

// Agreement to a few rounding steps of T at the values' scale (the values are O(1)). The
// reference does the same operations in the same order, so normally the results are identical;
// the slack only keeps the test valid under a compiler that contracts a*b+c into an FMA.
template <class T>
void expect_close(const Tensor& actual, const std::vector<T>& expected, const std::string& what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  const T* a = actual.data<T>();
  int64_t bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double tol = 4.0 * std::numeric_limits<T>::epsilon() * std::max(1.0, std::abs(double(expected[i])));
    if (!(std::abs(double(a[i]) - double(expected[i])) <= tol)) {
      if (bad++ < 3) ADD_FAILURE() << what << "[" << i << "]: got " << a[i] << ", expected " << expected[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected lstm::Error mentioning " << *parts.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& s : parts) EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
  }
}

template <class T>
constexpr DType dt() {
  return dtype_of<T>();
}

// Shapes covering a 0-d param, a small matrix and one large enough for the OpenMP path.
const std::vector<std::pair<std::string, Shape>> kShapes = {
    {"lstm.bias", {}}, {"lstm.weight_ih_l0", {8, 5}}, {"fc.weight", {70001}}};

// ---------------------------------------------------------------------------------------------
// Reference implementations: torch.optim's single-tensor code, one tensor operation at a time
// (each loop below is one torch call), with Python-float scalars rounded to the tensor's dtype
// as torch does when it applies them to a tensor.

template <class T>
struct RefSgd {
  double momentum, wd;
  bool nesterov;
  std::map<std::string, std::vector<T>> buf;

  void step(std::map<std::string, std::vector<T>>& params, const std::map<std::string, std::vector<T>>& grads,
            double lr) {
    for (auto& [name, p] : params) {
      std::vector<T> g = grads.at(name);
      const size_t n = p.size();
      if (wd != 0)  // grad = grad.add(param, alpha=weight_decay)
        for (size_t i = 0; i < n; ++i) g[i] = g[i] + T(wd) * p[i];
      if (momentum != 0) {
        auto it = buf.find(name);
        if (it == buf.end()) {  // buf = torch.clone(grad)
          it = buf.emplace(name, g).first;
        } else {  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
          std::vector<T>& b = it->second;
          for (size_t i = 0; i < n; ++i) b[i] = b[i] * T(momentum);
          for (size_t i = 0; i < n; ++i) b[i] = b[i] + T(1.0 - 0.0) * g[i];
        }
        const std::vector<T>& b = it->second;
        if (nesterov)  // grad = grad.add(buf, alpha=momentum)
          for (size_t i = 0; i < n; ++i) g[i] = g[i] + T(momentum) * b[i];
        else
          g = b;
      }
      for (size_t i = 0; i < n; ++i) p[i] = p[i] + T(-lr) * g[i];  // param.add_(grad, alpha=-lr)
    }
  }
};

template <class T>
struct RefAdam {
  double b1, b2, eps, wd;
  bool decoupled;
  std::map<std::string, std::vector<T>> m, v;
  std::map<std::string, int64_t> t;

  void step(std::map<std::string, std::vector<T>>& params, const std::map<std::string, std::vector<T>>& grads,
            double lr) {
    for (auto& [name, p] : params) {
      std::vector<T> g = grads.at(name);
      const size_t n = p.size();
      if (!m.count(name)) {
        m[name].assign(n, T(0));
        v[name].assign(n, T(0));
        t[name] = 0;
      }
      std::vector<T>& ea = m[name];
      std::vector<T>& eas = v[name];
      const int64_t step = ++t[name];
      if (wd != 0) {
        if (decoupled)  // param.mul_(1 - lr * weight_decay)
          for (size_t i = 0; i < n; ++i) p[i] = p[i] * T(1 - lr * wd);
        else  // grad = grad.add(param, alpha=weight_decay)
          for (size_t i = 0; i < n; ++i) g[i] = g[i] + T(wd) * p[i];
      }
      // exp_avg = beta1 * exp_avg + (1 - beta1) * grad
      for (size_t i = 0; i < n; ++i) ea[i] = T(b1) * ea[i] + T(1 - b1) * g[i];
      // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
      for (size_t i = 0; i < n; ++i) eas[i] = eas[i] * T(b2);
      for (size_t i = 0; i < n; ++i) eas[i] = eas[i] + T(1 - b2) * g[i] * g[i];
      const double bias_correction1 = 1 - std::pow(b1, double(step));
      const double bias_correction2 = 1 - std::pow(b2, double(step));
      const double step_size = lr / bias_correction1;
      const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
      // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
      std::vector<T> denom(n);
      for (size_t i = 0; i < n; ++i) denom[i] = std::sqrt(eas[i]);
      for (size_t i = 0; i < n; ++i) denom[i] = denom[i] / T(bias_correction2_sqrt);
      for (size_t i = 0; i < n; ++i) denom[i] = denom[i] + T(eps);
      // param.addcdiv_(exp_avg, denom, value=-step_size)
      for (size_t i = 0; i < n; ++i) p[i] = p[i] - T(step_size) * ea[i] / denom[i];
    }
  }
};

// Runs `steps` steps of `opt` and of `ref` on the same random params and grads (new grads every
// step, a different lr every step as a schedule would give) and compares params and state.
template <class T, class Ref>
void run_against_reference(Optimizer& opt, Ref& ref, int steps, uint64_t seed) {
  Rng rng(seed);
  std::vector<Param> params;
  for (const auto& [name, shape] : kShapes) params.push_back(random_param(name, shape, dt<T>(), rng));
  std::map<std::string, std::vector<T>> ref_p, ref_g;
  for (const Param& p : params) ref_p[p.name] = values_of<T>(p.value);
  for (int s = 0; s < steps; ++s) {
    for (Param& p : params) {
      rng.fill_normal(p.grad, 0.0, s == 2 ? 100.0 : 1.0);  // one step with a large gradient
      ref_g[p.name] = values_of<T>(p.grad);
    }
    const double lr = 0.05 * (1.0 + 0.3 * s);
    opt.step(params, lr);
    ref.step(ref_p, ref_g, lr);
    for (const Param& p : params)
      expect_close<T>(p.value, ref_p[p.name], opt.kind() + " step " + std::to_string(s) + " " + p.name);
  }
}

template <class T>
class OptimTyped : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(OptimTyped, FloatTypes);

// ---------------------------------------------------------------------------------------------
// Against the reference

TYPED_TEST(OptimTyped, SgdMatchesTorchFormulas) {
  using T = TypeParam;
  struct Cfg {
    double momentum, wd;
    bool nesterov;
  };
  for (Cfg c : {Cfg{0, 0, false}, Cfg{0, 0.01, false}, Cfg{0.9, 0, false}, Cfg{0.9, 0.05, false},
                Cfg{0.8, 0.01, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " wd " + std::to_string(c.wd) + " nesterov " +
                 std::to_string(c.nesterov));
    auto opt = make_sgd(c.momentum, c.wd, c.nesterov);
    RefSgd<T> ref{c.momentum, c.wd, c.nesterov, {}};
    run_against_reference<T>(*opt, ref, 5, 11);
    for (const auto& [name, buf] : ref.buf) expect_close<T>(opt->state().at("momentum_buffer." + name), buf, name);
    if (c.momentum == 0) {
      EXPECT_TRUE(opt->state().empty());
    }
  }
}

TYPED_TEST(OptimTyped, AdamMatchesTorchFormulas) {
  using T = TypeParam;
  for (double wd : {0.0, 0.02}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    auto opt = make_adam(0.9, 0.999, 1e-8, wd);
    RefAdam<T> ref{0.9, 0.999, 1e-8, wd, false, {}, {}, {}};
    run_against_reference<T>(*opt, ref, 6, 12);
    const auto st = opt->state();
    for (const auto& [name, m] : ref.m) {
      expect_close<T>(st.at("exp_avg." + name), m, "exp_avg." + name);
      expect_close<T>(st.at("exp_avg_sq." + name), ref.v.at(name), "exp_avg_sq." + name);
      EXPECT_EQ(st.at("step." + name).get(0), 6.0);
    }
  }
  // Unusual betas and eps, to catch a swapped hyperparameter.
  auto opt = make_adam(0.5, 0.75, 1e-3, 0.0);
  RefAdam<T> ref{0.5, 0.75, 1e-3, 0.0, false, {}, {}, {}};
  run_against_reference<T>(*opt, ref, 4, 13);
}

TYPED_TEST(OptimTyped, AdamWMatchesTorchFormulas) {
  using T = TypeParam;
  for (double wd : {0.0, 0.01, 0.3}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    auto opt = make_adamw(0.9, 0.99, 1e-6, wd);
    RefAdam<T> ref{0.9, 0.99, 1e-6, wd, true, {}, {}, {}};
    run_against_reference<T>(*opt, ref, 6, 14);
  }
}

// ---------------------------------------------------------------------------------------------
// Tiny cases derived by hand (F64).

TEST(Optim, AdamTwoStepsByHand) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, p = [1, -2]; grads [0.5, -1] then [0.5, 2].
  // Step 1: m = 0.1 g, v = 0.001 g^2, bias corrections 0.1 and 0.001, so m_hat = g and
  //   v_hat = g^2: p -= 0.1 * g / (|g| + 1e-8)  ->  p0 = 1 - 0.05/0.50000001, p1 = -2 + 0.1/1.00000001.
  // Step 2: bias corrections 1 - 0.81 = 0.19 and 1 - 0.998001 = 0.001999.
  //   elem 0: m = 0.9*0.05 + 0.1*0.5 = 0.095, v = 0.999*0.00025 + 0.001*0.25 = 0.00049975,
  //     m_hat = 0.5, v_hat = 0.25: the same update again, p0 = 1 - 0.1/0.50000001 = 0.800000004 (-8e-17).
  //   elem 1: m = 0.9*(-0.1) + 0.1*2 = 0.11, v = 0.999*0.001 + 0.001*4 = 0.004999,
  //     m_hat = 0.11/0.19 = 11/19, v_hat = 4999/1999, sqrt(v_hat) = 1.5813761017504956,
  //     p1 = -2 + 0.1/1.00000001 - 0.1*(11/19)/(1.5813761017504956 + 1e-8) = -1.9366103534720751.
  auto opt = make_adam(0.9, 0.999, 1e-8, 0.0);
  Param p{"w", Tensor::from_vector<double>({2}, {1.0, -2.0}), Tensor::from_vector<double>({2}, {0.5, -1.0})};
  opt->step({p}, 0.1);
  EXPECT_NEAR(p.value.get(0), 0.900000002, 1e-15);
  EXPECT_NEAR(p.value.get(1), -1.900000001, 1e-15);
  p.grad.set(1, 2.0);
  opt->step({p}, 0.1);
  EXPECT_NEAR(p.value.get(0), 0.8000000039999999, 1e-15);
  EXPECT_NEAR(p.value.get(1), -1.9366103534720751, 1e-15);
  const auto st = opt->state();
  // Each moment went through a few roundings, hence a few ulps of slack.
  EXPECT_NEAR(st.at("exp_avg.w").get(0), 0.095, 1e-15 * 0.095);
  EXPECT_NEAR(st.at("exp_avg.w").get(1), 0.11, 1e-15 * 0.11);
  EXPECT_NEAR(st.at("exp_avg_sq.w").get(0), 0.00049975, 1e-15 * 0.00049975);
  EXPECT_NEAR(st.at("exp_avg_sq.w").get(1), 0.004999, 1e-15 * 0.004999);
  EXPECT_EQ(st.at("step.w").get(0), 2.0);
}

TEST(Optim, WeightDecayByHand) {
  // One step, lr 0.1, wd 0.5, p = 2, g = -3; the first Adam step moves by lr * g / (|g| + eps).
  // Adam (L2): g' = -3 + 0.5*2 = -2, p = 2 + 0.1*2/2.00000001 = 2.0999999995.
  // AdamW: p = 2 * (1 - 0.1*0.5) = 1.9, then p = 1.9 + 0.1*3/3.00000001 = 1.99999999966666667.
  for (bool decoupled : {false, true}) {
    auto opt = decoupled ? make_adamw(0.9, 0.999, 1e-8, 0.5) : make_adam(0.9, 0.999, 1e-8, 0.5);
    Param p{"w", Tensor::from_vector<double>({1}, {2.0}), Tensor::from_vector<double>({1}, {-3.0})};
    opt->step({p}, 0.1);
    EXPECT_NEAR(p.value.get(0), decoupled ? 1.9999999996666667 : 2.0999999995, 1e-15) << opt->kind();
  }
}

TEST(Optim, SgdByHand) {
  // Plain momentum 0.5, lr 0.1, p = 1, g = 1 twice: buf = 1, p = 0.9; buf = 0.5 + 1 = 1.5, p = 0.75.
  {
    auto opt = make_sgd(0.5);
    Param p{"w", Tensor::from_vector<double>({1}, {1.0}), Tensor::from_vector<double>({1}, {1.0})};
    opt->step({p}, 0.1);
    EXPECT_NEAR(p.value.get(0), 0.9, 1e-16);
    opt->step({p}, 0.1);
    EXPECT_NEAR(p.value.get(0), 0.75, 1e-16);
    EXPECT_NEAR(opt->state().at("momentum_buffer.w").get(0), 1.5, 1e-16);
  }
  // Nesterov, momentum 0.9, wd 0.1, lr 0.5, p = [1, -1]; grads [2, 0] then [-1, 1].
  // Step 1: d = g + 0.1p = [2.1, -0.1]; buf = d; d += 0.9 buf -> [3.99, -0.19];
  //   p -= 0.5 d -> [-0.995, -0.905].
  // Step 2: d = g + 0.1p = [-1.0995, 0.9095]; buf = 0.9 buf + d = [0.7905, 0.8195];
  //   d += 0.9 buf -> [-0.38805, 1.64705]; p -= 0.5 d -> [-0.800975, -1.728525].
  auto opt = make_sgd(0.9, 0.1, true);
  Param p{"w", Tensor::from_vector<double>({2}, {1.0, -1.0}), Tensor::from_vector<double>({2}, {2.0, 0.0})};
  opt->step({p}, 0.5);
  EXPECT_NEAR(p.value.get(0), -0.995, 1e-15);
  EXPECT_NEAR(p.value.get(1), -0.905, 1e-15);
  p.grad.set(0, -1.0);
  p.grad.set(1, 1.0);
  opt->step({p}, 0.5);
  EXPECT_NEAR(p.value.get(0), -0.800975, 1e-15);
  EXPECT_NEAR(p.value.get(1), -1.728525, 1e-15);
  EXPECT_NEAR(opt->state().at("momentum_buffer.w").get(0), 0.7905, 1e-15);
  EXPECT_NEAR(opt->state().at("momentum_buffer.w").get(1), 0.8195, 1e-15);
}

// ---------------------------------------------------------------------------------------------
// State

TYPED_TEST(OptimTyped, ResumeFromStateIsBitIdentical) {
  using T = TypeParam;
  const std::vector<std::function<std::unique_ptr<Optimizer>()>> factories = {
      [] { return make_sgd(0.9, 0.01, true); }, [] { return make_sgd(0.7); },
      [] { return make_adam(0.9, 0.999, 1e-8, 0.01); }, [] { return make_adamw(); }};
  for (const auto& factory : factories) {
    auto a = factory();
    SCOPED_TRACE(a->to_json().dump());
    Rng rng(21);
    std::vector<Param> pa;
    for (const auto& [name, shape] : kShapes) pa.push_back(random_param(name, shape, dt<T>(), rng));
    // A param that joins late has fewer steps than the others; its counter must survive too.
    Param late = random_param("late", {3, 2}, dt<T>(), rng);
    for (int s = 0; s < 3; ++s) {
      for (Param& p : pa) rng.fill_normal(p.grad, 0, 1);
      std::vector<Param> ps = pa;
      if (s == 2) ps.push_back(late);
      a->step(ps, 0.01 * (s + 1));
    }
    pa.push_back(late);
    // What a checkpoint holds: params and optimizer state, both deep copies.
    const std::map<std::string, Tensor> saved = a->state();
    std::vector<Param> pb = clone_params(pa);
    auto b = factory();
    b->load_state(saved);
    for (const auto& [k, t] : b->state()) EXPECT_TRUE(bit_equal(t, saved.at(k))) << k;
    EXPECT_EQ(b->state().size(), saved.size());
    for (int s = 3; s < 7; ++s) {
      for (size_t i = 0; i < pa.size(); ++i) {
        rng.fill_normal(pa[i].grad, 0, 1);
        pb[i].grad.copy_(pa[i].grad);
      }
      a->step(pa, 0.01 * (s + 1));
      b->step(pb, 0.01 * (s + 1));
    }
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bit_equal(pa[i].value, pb[i].value)) << pa[i].name;
    const auto sa = a->state(), sb = b->state();
    ASSERT_EQ(sa.size(), sb.size());
    for (const auto& [k, t] : sa) EXPECT_TRUE(bit_equal(t, sb.at(k))) << k;
    // The snapshot taken earlier is a copy, not a view of the live state.
    EXPECT_FALSE(bit_equal(saved.begin()->second, sa.at(saved.begin()->first)));
  }
}

TEST(Optim, StateNamesShapesAndStepTensor) {
  Rng rng(3);
  std::vector<Param> ps = {random_param("enc.w", {4, 3}, DType::F32, rng),
                           random_param("b", {5}, DType::F64, rng)};
  auto adam = make_adam();
  adam->step(ps, 1e-3);
  adam->step(ps, 1e-3);
  const auto st = adam->state();
  std::vector<std::string> keys;
  for (const auto& [k, t] : st) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"exp_avg.b", "exp_avg.enc.w", "exp_avg_sq.b", "exp_avg_sq.enc.w",
                                            "step.b", "step.enc.w"}));
  EXPECT_EQ(st.at("exp_avg.enc.w").shape(), (Shape{4, 3}));
  EXPECT_EQ(st.at("exp_avg.enc.w").dtype(), DType::F32);
  EXPECT_EQ(st.at("exp_avg_sq.b").dtype(), DType::F64);
  const Tensor& step = st.at("step.enc.w");
  EXPECT_EQ(step.dtype(), DType::F64);
  EXPECT_EQ(step.dim(), 0);
  EXPECT_EQ(step.numel(), 1);
  EXPECT_EQ(step.get(0), 2.0);

  auto sgd = make_sgd(0.9);
  sgd->step(ps, 0.1);
  EXPECT_EQ(sgd->state().size(), 2u);
  EXPECT_EQ(sgd->state().at("momentum_buffer.enc.w").shape(), (Shape{4, 3}));
  auto plain = make_sgd();
  plain->step(ps, 0.1);
  EXPECT_TRUE(plain->state().empty());
}

TEST(Optim, LoadStateValidates) {
  Rng rng(4);
  std::vector<Param> ps = {random_param("w", {3}, DType::F64, rng)};
  auto src = make_adam();
  src->step(ps, 1e-2);
  const auto good = src->state();

  auto with = [&](const std::string& key, Tensor t) {
    auto s = good;
    s[key] = t;
    return s;
  };
  auto without = [&](const std::string& key) {
    auto s = good;
    s.erase(key);
    return s;
  };
  auto adam = make_adam();
  adam->step(ps, 1e-2);
  adam->step(ps, 1e-2);
  const auto before = adam->state();

  expect_error([&] { adam->load_state(without("exp_avg_sq.w")); }, {"exp_avg_sq.w", "missing"});
  expect_error([&] { adam->load_state(without("step.w")); }, {"step.w", "missing"});
  expect_error([&] { adam->load_state(with("exp_avg_sq.w", Tensor::zeros({4}, DType::F64))); },
               {"exp_avg_sq.w", "[4]", "[3]"});
  expect_error([&] { adam->load_state(with("momentum_buffer.w", Tensor::zeros({3}, DType::F64))); },
               {"momentum_buffer.w"});
  expect_error([&] { adam->load_state(with("exp_avg.", Tensor::zeros({3}, DType::F64))); }, {"\"exp_avg.\""});
  expect_error([&] { adam->load_state(with("step.w", Tensor::full({}, 1.5, DType::F64))); }, {"step.w", "1.5"});
  expect_error([&] { adam->load_state(with("step.w", Tensor::full({2}, 1, DType::F64))); }, {"step.w", "[2]"});
  expect_error([&] { adam->load_state(with("exp_avg.w", Tensor::zeros({3}, DType::BF16))); }, {"exp_avg.w", "BF16"});
  // A failed load leaves the optimizer as it was.
  const auto after = adam->state();
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [k, t] : before) EXPECT_TRUE(bit_equal(t, after.at(k))) << k;

  // Names are checked against params at the next step, where shapes are known.
  auto b = make_adam();
  b->load_state(good);
  std::vector<Param> wrong = {random_param("w", {4}, DType::F64, rng)};
  expect_error([&] { b->step(wrong, 1e-2); }, {"exp_avg.w", "[3]", "[4]"});

  auto sgd = make_sgd(0.9);
  expect_error([&] { sgd->load_state(good); }, {"exp_avg.w"});
  sgd->load_state({{"momentum_buffer.w", Tensor::zeros({2}, DType::F64)}});
  expect_error([&] { sgd->step(ps, 0.1); }, {"momentum_buffer.w", "[2]", "[3]"});
  auto plain = make_sgd();
  expect_error([&] { plain->load_state({{"momentum_buffer.w", Tensor::zeros({3}, DType::F64)}}); },
               {"momentum_buffer.w", "no state"});
  plain->load_state({});
}

TEST(Optim, LoadedStateIsCastToParamDtype) {
  // torch casts loaded state to the param's dtype; an F32 checkpoint resumes an F64 run.
  Rng rng(5);
  std::vector<Param> p32 = {random_param("w", {6}, DType::F32, rng)};
  auto a = make_adam();
  a->step(p32, 1e-2);
  std::vector<Param> p64 = {Param{"w", p32[0].value.to(DType::F64), p32[0].grad.to(DType::F64)}};
  auto b = make_adam();
  b->load_state(a->state());
  b->step(p64, 1e-2);
  EXPECT_EQ(b->state().at("exp_avg.w").dtype(), DType::F64);
  EXPECT_EQ(b->state().at("step.w").get(0), 2.0);
}

// ---------------------------------------------------------------------------------------------
// Step checks

TEST(Optim, StepRejectsBadParamsWithoutTouchingAny) {
  Rng rng(6);
  Param good = random_param("good", {4}, DType::F32, rng);
  const Tensor good_before = good.value.clone();
  auto adam = make_adam();

  Param bad_shape = random_param("bad", {3}, DType::F32, rng);
  bad_shape.grad = Tensor::zeros({4}, DType::F32);
  expect_error([&] { adam->step({good, bad_shape}, 0.1); }, {"\"bad\"", "[3]", "[4]"});
  Param bad_dtype = random_param("bad", {3}, DType::F32, rng);
  bad_dtype.grad = Tensor::zeros({3}, DType::F64);
  expect_error([&] { adam->step({good, bad_dtype}, 0.1); }, {"\"bad\"", "F64"});
  Param half = random_param("half", {3}, DType::F32, rng);
  half.value = half.value.to(DType::BF16);
  half.grad = half.grad.to(DType::BF16);
  expect_error([&] { adam->step({good, half}, 0.1); }, {"\"half\"", "BF16"});
  expect_error([&] { adam->step({good, good}, 0.1); }, {"\"good\"", "unique"});
  expect_error([&] { adam->step({good}, -0.1); }, {"lr", "-0.1"});
  expect_error([&] { make_sgd()->step({good}, std::nan("")); }, {"lr", "nan"});
  EXPECT_TRUE(bit_equal(good.value, good_before));
  EXPECT_TRUE(adam->state().empty());
}

TEST(Optim, ParamsWithoutGradAreSkipped) {
  Rng rng(7);
  Param frozen = random_param("frozen", {5}, DType::F64, rng);
  frozen.grad = Tensor();
  const Tensor before = frozen.value.clone();
  std::unique_ptr<Optimizer> opts[] = {make_sgd(0.9), make_adam(), make_adamw()};
  for (auto& opt : opts) {
    opt->step({frozen}, 0.1);
    EXPECT_TRUE(bit_equal(frozen.value, before)) << opt->kind();
    EXPECT_TRUE(opt->state().empty()) << opt->kind();
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

TEST(ClipGradNorm, ScalesAboveMaxAndReturnsNormBefore) {
  // Grads [3, 4, 0] (F32) and [0, 0, 12, 0] (F64): norm sqrt(9 + 16 + 144) = 13.
  auto make = [] {
    return std::vector<Param>{
        Param{"a", Tensor::zeros({3}, DType::F32), Tensor::from_vector<float>({3}, {3, 4, 0})},
        Param{"b", Tensor::zeros({2, 2}, DType::F64), Tensor::from_vector<double>({2, 2}, {0, 0, 12, 0})}};
  };
  auto ps = make();
  EXPECT_DOUBLE_EQ(grad_norm(ps), 13.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 6.5), 13.0);
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(float(ps[0].grad.get(0)), 3.0f * float(coef));
  EXPECT_FLOAT_EQ(float(ps[0].grad.get(1)), 4.0f * float(coef));
  EXPECT_DOUBLE_EQ(ps[1].grad.get(2), 12.0 * coef);
  EXPECT_NEAR(grad_norm(ps), 6.5, 1e-6);

  // Below max_norm (by more than the 1e-6 that torch adds) the grads are not touched at all.
  auto qs = make();
  EXPECT_DOUBLE_EQ(clip_grad_norm(qs, 13.01), 13.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(qs, 100.0), 13.0);
  const auto fresh = make();
  for (size_t i = 0; i < qs.size(); ++i) EXPECT_TRUE(bit_equal(qs[i].grad, fresh[i].grad));

  EXPECT_EQ(grad_norm({}), 0.0);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
  std::vector<Param> none = {Param{"x", Tensor::zeros({2}), Tensor()}};
  EXPECT_EQ(clip_grad_norm(none, 1.0), 0.0);
  expect_error([&] { clip_grad_norm(ps, 0.0); }, {"max_norm", "0"});
  expect_error([&] { clip_grad_norm(ps, -1.0); }, {"max_norm", "-1"});
}

TEST(ClipGradNorm, NonFiniteNormsBehaveAsTorch) {
  // torch: clip_coef = max_norm / (nan + 1e-6) = nan, clamp keeps nan, every grad becomes nan.
  std::vector<Param> ps = {Param{"a", Tensor::zeros({2}, DType::F32), Tensor::from_vector<float>({2}, {1, NAN})},
                           Param{"b", Tensor::zeros({1}, DType::F64), Tensor::from_vector<double>({1}, {2})}};
  EXPECT_TRUE(std::isnan(clip_grad_norm(ps, 1.0)));
  EXPECT_TRUE(std::isnan(ps[0].grad.get(0)));
  EXPECT_TRUE(std::isnan(ps[1].grad.get(0)));
  // An infinite norm gives clip_coef 0: finite grads become 0, infinite ones nan.
  std::vector<Param> qs = {Param{"a", Tensor::zeros({2}, DType::F64), Tensor::from_vector<double>({2}, {1, INFINITY})}};
  EXPECT_TRUE(std::isinf(clip_grad_norm(qs, 1.0)));
  EXPECT_EQ(qs[0].grad.get(0), 0.0);
  EXPECT_TRUE(std::isnan(qs[0].grad.get(1)));
}

TEST(ClipGradNorm, AccumulatesInDoubleIndependentOfThreads) {
  Rng rng(8);
  std::vector<Param> ps = {random_param("big", {100003}, DType::F32, rng),
                           random_param("small", {7, 3}, DType::F64, rng)};
  double ref = 0;
  for (const Param& p : ps)
    for (int64_t i = 0; i < p.grad.numel(); ++i) ref += p.grad.get(i) * p.grad.get(i);
  ref = std::sqrt(ref);
  const int threads = num_threads();
  set_num_threads(1);
  const double one = grad_norm(ps);
  set_num_threads(2);
  const double two = grad_norm(ps);
  set_num_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, ref, 1e-12 * ref);
  // A float accumulator would be off by far more than this over 1e5 terms.
  EXPECT_NEAR(clip_grad_norm(ps, 1.0), ref, 1e-12 * ref);
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Schedules

TEST(LrSchedule, ValuesAtKeySteps) {
  auto c = make_constant_lr(0.01);
  EXPECT_EQ(c->lr(0), 0.01);
  EXPECT_EQ(c->lr(123456), 0.01);

  auto s = make_step_lr(0.1, 3, 0.5);
  EXPECT_EQ(s->lr(0), 0.1);
  EXPECT_EQ(s->lr(2), 0.1);
  EXPECT_EQ(s->lr(3), 0.05);
  EXPECT_EQ(s->lr(5), 0.05);
  EXPECT_EQ(s->lr(6), 0.025);
  EXPECT_DOUBLE_EQ(s->lr(30), 0.1 / 1024);

  // lr 1, warm-up 4, total 14, min 0.1: warm-up gives 0.25, 0.5, 0.75, 1; then the cosine runs
  // over 10 steps: halfway (step 9) 0.1 + 0.45 * (1 + cos(pi/2)) = 0.55; from step 14 on, 0.1.
  auto cos = make_cosine_lr(1.0, 4, 14, 0.1);
  EXPECT_DOUBLE_EQ(cos->lr(0), 0.25);
  EXPECT_DOUBLE_EQ(cos->lr(1), 0.5);
  EXPECT_DOUBLE_EQ(cos->lr(3), 1.0);
  EXPECT_DOUBLE_EQ(cos->lr(4), 1.0);
  EXPECT_DOUBLE_EQ(cos->lr(9), 0.55);
  EXPECT_DOUBLE_EQ(cos->lr(6), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.2)));
  EXPECT_DOUBLE_EQ(cos->lr(14), 0.1);
  EXPECT_DOUBLE_EQ(cos->lr(1000), 0.1);
  for (int64_t k = 4; k < 14; ++k) EXPECT_LT(cos->lr(k + 1), cos->lr(k)) << k;

  auto nowarm = make_cosine_lr(2.0, 0, 4);
  EXPECT_DOUBLE_EQ(nowarm->lr(0), 2.0);
  EXPECT_DOUBLE_EQ(nowarm->lr(2), 1.0);
  EXPECT_DOUBLE_EQ(nowarm->lr(4), 0.0);
  // warm-up == total: the cosine has no room, so it drops to min_lr right after the warm-up.
  auto edge = make_cosine_lr(1.0, 2, 2, 0.5);
  EXPECT_DOUBLE_EQ(edge->lr(1), 1.0);
  EXPECT_DOUBLE_EQ(edge->lr(2), 1.0);
  EXPECT_DOUBLE_EQ(edge->lr(3), 0.5);

  expect_error([&] { s->lr(-1); }, {"step", "-1"});
}

TEST(LrSchedule, JsonRoundTripAndErrors) {
  for (const json& j : {json{{"type", "constant"}, {"lr", 0.003}},
                        json{{"type", "step"}, {"lr", 0.1}, {"step_size", 100}, {"gamma", 0.3}},
                        json{{"type", "cosine"}, {"lr", 1e-3}, {"warmup_steps", 50}, {"total_steps", 1000},
                             {"min_lr", 1e-5}}}) {
    auto s = schedule_from_json(j);
    EXPECT_EQ(s->to_json(), j);
    auto again = schedule_from_json(s->to_json());
    for (int64_t k : {0, 1, 49, 50, 99, 100, 500, 999, 1000, 5000}) EXPECT_EQ(again->lr(k), s->lr(k)) << j.dump();
  }
  EXPECT_EQ(make_cosine_lr(0.5, 10, 20, 0.0)->to_json(),
            (json{{"type", "cosine"}, {"lr", 0.5}, {"warmup_steps", 10}, {"total_steps", 20}, {"min_lr", 0.0}}));
  // Defaults, and integers written as floats.
  EXPECT_EQ(schedule_from_json(json::parse(R"({"type":"step","lr":1,"step_size":2})"))->lr(2), 0.1);
  EXPECT_EQ(schedule_from_json(json::parse(R"({"type":"cosine","lr":1,"total_steps":1e3})"))->to_json()["total_steps"],
            1000);

  auto bad = [](const char* text, std::initializer_list<std::string> parts) {
    expect_error([&] { schedule_from_json(json::parse(text)); }, parts);
  };
  bad(R"({"type":"linear","lr":1})", {"type", "linear"});
  bad(R"({"lr":1})", {"type"});
  bad(R"([1,2])", {"object"});
  bad(R"({"type":"constant"})", {"lr", "missing"});
  bad(R"({"type":"constant","lr":-1})", {"lr", "-1"});
  bad(R"({"type":"constant","lr":0.1,"warmup":3})", {"warmup", "3"});
  bad(R"({"type":"constant","lr":"0.1"})", {"lr", "\"0.1\""});
  bad(R"({"type":"step","lr":0.1,"step_size":0})", {"step_size", "0"});
  bad(R"({"type":"step","lr":0.1,"step_size":2.5})", {"step_size", "2.5"});
  bad(R"({"type":"step","lr":0.1,"step_size":2,"gamma":-0.5})", {"gamma", "-0.5"});
  bad(R"({"type":"cosine","lr":1,"total_steps":10,"min_lr":2})", {"min_lr", "2"});
  bad(R"({"type":"cosine","lr":1,"total_steps":10,"warmup_steps":11})", {"total_steps", "11", "10"});
  bad(R"({"type":"cosine","lr":1,"total_steps":10,"warmup_steps":-1})", {"warmup_steps", "-1"});
  bad(R"({"type":"cosine","lr":1,"total_steps":0})", {"total_steps", "0"});
}

// ---------------------------------------------------------------------------------------------
// Optimizer JSON

TEST(OptimizerJson, DefaultsAndRoundTrip) {
  EXPECT_EQ(optimizer_from_json(json{{"type", "sgd"}})->to_json(),
            json::parse(R"({"type":"sgd","momentum":0,"weight_decay":0,"nesterov":false})"));
  EXPECT_EQ(optimizer_from_json(json{{"type", "adam"}})->to_json(),
            json::parse(R"({"type":"adam","beta1":0.9,"beta2":0.999,"eps":1e-8,"weight_decay":0})"));
  EXPECT_EQ(optimizer_from_json(json{{"type", "adamw"}})->to_json(),
            json::parse(R"({"type":"adamw","beta1":0.9,"beta2":0.999,"eps":1e-8,"weight_decay":0.01})"));
  EXPECT_EQ(make_adamw()->to_json(), optimizer_from_json(json{{"type", "adamw"}})->to_json());
  EXPECT_EQ(make_sgd()->kind(), "sgd");
  EXPECT_EQ(make_adam()->kind(), "adam");
  EXPECT_EQ(make_adamw()->kind(), "adamw");

  for (const char* text : {R"({"type":"sgd","momentum":0.95,"weight_decay":0.0001,"nesterov":true})",
                           R"({"type":"adam","beta1":0.8,"beta2":0.98,"eps":1e-6,"weight_decay":0.1})",
                           R"({"type":"adamw","beta1":0,"beta2":0.5,"eps":0,"weight_decay":0})"}) {
    const json j = json::parse(text);
    auto o = optimizer_from_json(j);
    EXPECT_EQ(o->kind(), j["type"]);
    EXPECT_EQ(o->to_json(), j);
    EXPECT_EQ(optimizer_from_json(o->to_json())->to_json(), j);
  }
  // The settings survive the round trip in behaviour, too.
  Rng rng(9);
  Param p = random_param("w", {10}, DType::F64, rng);
  std::vector<Param> a = {p}, b = clone_params(a);
  auto o1 = make_adam(0.8, 0.95, 1e-4, 0.05);
  auto o2 = optimizer_from_json(o1->to_json());
  o1->step(a, 0.1);
  o2->step(b, 0.1);
  EXPECT_TRUE(bit_equal(a[0].value, b[0].value));
}

TEST(OptimizerJson, Errors) {
  auto bad = [](const char* text, std::initializer_list<std::string> parts) {
    expect_error([&] { optimizer_from_json(json::parse(text)); }, parts);
  };
  bad(R"({"type":"rmsprop"})", {"type", "rmsprop"});
  bad(R"({"momentum":0.9})", {"type"});
  bad(R"({"type":3})", {"type", "3"});
  bad(R"("adam")", {"object"});
  bad(R"({"type":"sgd","lr":0.1})", {"lr", "0.1", "unknown"});
  bad(R"({"type":"adam","betas":[0.9,0.99]})", {"betas", "unknown"});
  bad(R"({"type":"sgd","momentum":-0.5})", {"momentum", "-0.5"});
  bad(R"({"type":"sgd","weight_decay":-1e-4})", {"weight_decay", "-0.0001"});
  bad(R"({"type":"sgd","nesterov":true})", {"nesterov", "momentum", "0"});
  bad(R"({"type":"sgd","nesterov":"yes"})", {"nesterov", "\"yes\""});
  bad(R"({"type":"sgd","momentum":"0.9"})", {"momentum", "\"0.9\""});
  bad(R"({"type":"adam","beta1":1.0})", {"beta1", "1.0"});
  bad(R"({"type":"adam","beta2":-0.1})", {"beta2", "-0.1"});
  bad(R"({"type":"adamw","beta2":1.5})", {"beta2", "1.5"});
  bad(R"({"type":"adam","eps":-1e-8})", {"eps", "-1e-08"});
  bad(R"({"type":"adamw","weight_decay":-0.01})", {"weight_decay", "-0.01"});
  expect_error([] { make_adam(0.9, 1.0); }, {"beta2", "1.0"});
  expect_error([] { make_sgd(std::nan("")); }, {"momentum", "nan"});
}

}  // namespace
