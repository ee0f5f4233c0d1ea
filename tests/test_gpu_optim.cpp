// The fused GPU optimizers, gradient norm and clipping against the CPU implementation (which
// tests/test_optim.cpp holds to torch.optim's formulas). Skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lstm/device.hpp"
#include "lstm/optim.hpp"
#include "lstm/rng.hpp"

using namespace lstm;

namespace {

#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    if (!cuda_available()) GTEST_SKIP() << "no usable GPU: " << cuda_unavailable_reason(); \
  } while (0)

// A 0-d param, an empty one, sizes that are not multiples of 4, one just past a kernel chunk
// (16384 elements) and a big one spread over many blocks.
const std::vector<std::pair<std::string, Shape>> kShapes = {
    {"lstm.bias", {}},         {"empty", {0, 3}},          {"lstm.weight_ih_l0", {7, 5}},
    {"fc.bias", {16385}},      {"fc.weight", {3000017}}};

void fill_normal(Tensor& t, Rng& rng, double scale) {
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(scale * rng.normal());
}

// The same params on the CPU and on the GPU. "flat.view" lives inside larger GPU buffers at
// offsets that are not 16-byte aligned, as weights inside one flat weight buffer may: the kernels
// take their scalar path for it.
struct Twin {
  std::vector<Param> cpu, gpu;
};

Param cpu_param(const std::string& name, const Shape& shape, Rng& rng) {
  Param p{name, Tensor::empty(shape, DType::F32), Tensor::empty(shape, DType::F32)};
  fill_normal(p.value, rng, 1.0);
  fill_normal(p.grad, rng, 1.0);
  return p;
}

Param gpu_copy(const Param& p) { return Param{p.name, p.value.to_device(Device::CUDA), p.grad.to_device(Device::CUDA)}; }

Twin make_twin(Rng& rng) {
  Twin t;
  for (const auto& [name, shape] : kShapes) {
    t.cpu.push_back(cpu_param(name, shape, rng));
    t.gpu.push_back(gpu_copy(t.cpu.back()));
  }
  Param c = cpu_param("flat.view", {1001}, rng);
  Param g{c.name, Tensor::empty({1003}, DType::F32, Device::CUDA).slice0(1, 1002),
          Tensor::empty({1005}, DType::F32, Device::CUDA).slice0(3, 1004)};
  g.value.copy_(c.value);
  g.grad.copy_(c.grad);
  t.cpu.push_back(c);
  t.gpu.push_back(g);
  return t;
}

// New gradients, the same on both sides; the GPU grads are written in place (same pointers).
void new_grads(Twin& t, Rng& rng, double scale) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    fill_normal(t.cpu[i].grad, rng, scale);
    t.gpu[i].grad.copy_(t.cpu[i].grad);
  }
}

// GPU tensor against its CPU counterpart: relative L2 error below tol and nothing non-finite.
// The kernels round exactly as the CPU code does, so normally no element differs at all; the
// count of differing elements is reported to tell rounding apart from a wrong formula.
void expect_close(const Tensor& gpu, const Tensor& cpu, const std::string& what, double tol = 1e-6) {
  const Tensor g = gpu.cpu();
  ASSERT_EQ(g.shape(), cpu.shape()) << what;
  ASSERT_EQ(g.dtype(), DType::F32) << what;
  ASSERT_EQ(cpu.dtype(), DType::F32) << what;
  const float* a = g.data<float>();
  const float* b = cpu.data<float>();
  double num = 0, den = 0;
  int64_t differ = 0, non_finite = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    if (!std::isfinite(a[i])) ++non_finite;
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
    if (a[i] != b[i]) ++differ;
  }
  EXPECT_EQ(non_finite, 0) << what;
  if (cpu.numel() == 0) return;
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LT(rel, tol) << what << ": " << differ << " of " << cpu.numel() << " elements differ";
}

bool bit_equal(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = a_in.cpu(), b = b_in.cpu();
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void expect_params_close(const Twin& t, const std::string& what) {
  for (size_t i = 0; i < t.cpu.size(); ++i) expect_close(t.gpu[i].value, t.cpu[i].value, what + " " + t.cpu[i].name);
}

// Same names, shapes and dtypes; the same step counts; moments within tol.
void expect_state_close(const Optimizer& gpu, const Optimizer& cpu, const std::string& what) {
  const auto sg = gpu.state(), sc = cpu.state();
  std::vector<std::string> kg, kc;
  for (const auto& [k, v] : sg) kg.push_back(k);
  for (const auto& [k, v] : sc) kc.push_back(k);
  ASSERT_EQ(kg, kc) << what;
  for (const auto& [k, c] : sc) {
    const Tensor g = sg.at(k).cpu();
    EXPECT_EQ(g.shape(), c.shape()) << what << " " << k;
    ASSERT_EQ(g.dtype(), c.dtype()) << what << " " << k;
    if (k.rfind("step.", 0) == 0) {
      EXPECT_EQ(g.get(0), c.get(0)) << what << " " << k;
    } else {
      expect_close(g, c, what + " " + k);
    }
  }
}

void expect_state_bit_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                            const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << what << " " << k;
    EXPECT_TRUE(bit_equal(t, b.at(k))) << what << " " << k;
  }
}

std::vector<Tensor> snapshot_values(const std::vector<Param>& ps) {
  std::vector<Tensor> out;
  for (const Param& p : ps) out.push_back(p.value.cpu().clone());
  return out;
}

// Steps `cpu` on the CPU params and `gpu` on the GPU params `steps` times with fresh grads (one
// step with large ones) and a changing lr, comparing params after every step and state at the end.
void run_against_cpu(Optimizer& gpu, Optimizer& cpu, int steps, uint64_t seed) {
  Rng rng(seed);
  Twin t = make_twin(rng);
  for (int s = 0; s < steps; ++s) {
    new_grads(t, rng, s == 2 ? 100.0 : 1.0);
    const double lr = 0.05 * (1.0 + 0.3 * s);
    cpu.step(t.cpu, lr);
    gpu.step(t.gpu, lr);
    expect_params_close(t, gpu.to_json().dump() + " step " + std::to_string(s));
  }
  expect_state_close(gpu, cpu, gpu.to_json().dump());
}

using Factory = std::function<std::unique_ptr<Optimizer>()>;

const std::vector<Factory>& stateful_factories() {
  static const std::vector<Factory> f = {[] { return make_sgd(0.9, 0.01, true); },
                                         [] { return make_sgd(0.7); },
                                         [] { return make_sgd(0.0, 0.05); },
                                         [] { return make_adam(0.9, 0.999, 1e-8, 0.01); },
                                         [] { return make_adamw(); }};
  return f;
}

// ---------------------------------------------------------------------------------------------

TEST(GpuOptim, SgdMatchesCpu) {
  REQUIRE_GPU();
  struct Cfg {
    double momentum, wd;
    bool nesterov;
  };
  for (Cfg c : {Cfg{0, 0, false}, Cfg{0, 0.01, false}, Cfg{0.9, 0, false}, Cfg{0.9, 0.05, false},
                Cfg{0.8, 0.01, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " wd " + std::to_string(c.wd) + " nesterov " +
                 std::to_string(c.nesterov));
    auto gpu = make_sgd(c.momentum, c.wd, c.nesterov);
    auto cpu = make_sgd(c.momentum, c.wd, c.nesterov);
    run_against_cpu(*gpu, *cpu, 5, 31);
    if (c.momentum == 0) {
      EXPECT_TRUE(gpu->state().empty());
    }
  }
}

TEST(GpuOptim, AdamMatchesCpu) {
  REQUIRE_GPU();
  for (double wd : {0.0, 0.02}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    auto gpu = make_adam(0.9, 0.999, 1e-8, wd);
    auto cpu = make_adam(0.9, 0.999, 1e-8, wd);
    run_against_cpu(*gpu, *cpu, 5, 32);
  }
  // Unusual betas and eps, to catch a swapped hyperparameter.
  auto gpu = make_adam(0.5, 0.75, 1e-3, 0.0);
  auto cpu = make_adam(0.5, 0.75, 1e-3, 0.0);
  run_against_cpu(*gpu, *cpu, 5, 33);
}

TEST(GpuOptim, AdamWMatchesCpu) {
  REQUIRE_GPU();
  for (double wd : {0.0, 0.01, 0.3}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    auto gpu = make_adamw(0.9, 0.99, 1e-6, wd);
    auto cpu = make_adamw(0.9, 0.99, 1e-6, wd);
    run_against_cpu(*gpu, *cpu, 5, 34);
  }
}

TEST(GpuOptim, StateLoadsAcrossDevices) {
  REQUIRE_GPU();
  for (const Factory& factory : stateful_factories()) {
    auto cpu = factory();
    SCOPED_TRACE(cpu->to_json().dump());
    Rng rng(41);
    Twin t = make_twin(rng);
    // A param that joins late has fewer steps than the others.
    Param late = cpu_param("late", {3, 2}, rng);
    for (int s = 0; s < 3; ++s) {
      new_grads(t, rng, 1.0);
      std::vector<Param> ps = t.cpu;
      if (s == 2) ps.push_back(late);
      cpu->step(ps, 0.01 * (s + 1));
    }
    t.cpu.push_back(late);
    // Resume on the GPU from the CPU's checkpoint: CPU params copied, CPU state loaded.
    t.gpu.clear();
    for (const Param& p : t.cpu) t.gpu.push_back(gpu_copy(p));
    auto gpu = factory();
    gpu->load_state(cpu->state());
    expect_state_bit_equal(gpu->state(), cpu->state(), "right after load_state");
    for (int s = 3; s < 6; ++s) {
      new_grads(t, rng, 1.0);
      cpu->step(t.cpu, 0.01 * (s + 1));
      gpu->step(t.gpu, 0.01 * (s + 1));
      expect_params_close(t, "resumed step " + std::to_string(s));
    }
    expect_state_close(*gpu, *cpu, "after resuming on the GPU");

    // And back: the GPU's state loads into a CPU optimizer that continues as the CPU one does.
    std::vector<Param> back;
    for (const Param& p : t.gpu) back.push_back(Param{p.name, p.value.cpu().clone(), Tensor()});
    auto cpu2 = factory();
    cpu2->load_state(gpu->state());
    new_grads(t, rng, 1.0);
    for (size_t i = 0; i < back.size(); ++i) back[i].grad = t.cpu[i].grad.clone();
    cpu->step(t.cpu, 0.07);
    cpu2->step(back, 0.07);
    gpu->step(t.gpu, 0.07);
    for (size_t i = 0; i < back.size(); ++i) {
      expect_close(back[i].value, t.cpu[i].value, "CPU resumed from GPU state " + back[i].name);
      expect_close(t.gpu[i].value, t.cpu[i].value, "GPU " + back[i].name);
    }
    // The same optimizer object moved from GPU params to CPU params keeps its state.
    std::vector<Param> moved;
    for (const Param& p : t.gpu) moved.push_back(Param{p.name, p.value.cpu().clone(), Tensor()});
    new_grads(t, rng, 1.0);
    for (size_t i = 0; i < moved.size(); ++i) moved[i].grad = t.cpu[i].grad.clone();
    cpu->step(t.cpu, 0.08);
    gpu->step(moved, 0.08);
    for (size_t i = 0; i < moved.size(); ++i) expect_close(moved[i].value, t.cpu[i].value, "moved " + moved[i].name);
    expect_state_close(*gpu, *cpu, "after moving to the CPU");
  }
}

TEST(GpuOptim, TableFollowsChangingParams) {
  REQUIRE_GPU();
  // Params that come and go, grads that are reallocated and a param without a grad: the cached
  // tensor table must follow every change.
  for (const Factory& factory : stateful_factories()) {
    auto cpu = factory();
    auto gpu = factory();
    SCOPED_TRACE(cpu->to_json().dump());
    Rng rng(42);
    Param a = cpu_param("a", {33}, rng), b = cpu_param("b", {4, 4}, rng), c = cpu_param("c", {20000}, rng);
    Param ga = gpu_copy(a), gb = gpu_copy(b), gc = gpu_copy(c);
    Param frozen = cpu_param("frozen", {5}, rng);
    Param gfrozen = gpu_copy(frozen);
    frozen.grad = Tensor();
    gfrozen.grad = Tensor();
    const Tensor frozen_before = gfrozen.value.cpu().clone();
    const std::vector<std::vector<int>> plan = {{0, 1}, {1, 2}, {0, 1, 2}, {0, 1, 2}, {2}};
    for (size_t s = 0; s < plan.size(); ++s) {
      Param* cs[] = {&a, &b, &c};
      Param* gs[] = {&ga, &gb, &gc};
      std::vector<Param> pc = {frozen}, pg = {gfrozen};
      for (int i : plan[s]) {
        fill_normal(cs[i]->grad, rng, 1.0);
        if (s == 3) {
          gs[i]->grad = cs[i]->grad.to_device(Device::CUDA);  // new grad tensors: new pointers
        } else {
          gs[i]->grad.copy_(cs[i]->grad);
        }
        pc.push_back(*cs[i]);
        pg.push_back(*gs[i]);
      }
      cpu->step(pc, 0.03);
      gpu->step(pg, 0.03);
      for (int i : plan[s]) expect_close(gs[i]->value, cs[i]->value, "step " + std::to_string(s) + " " + cs[i]->name);
    }
    EXPECT_TRUE(bit_equal(gfrozen.value, frozen_before));
    expect_state_close(*gpu, *cpu, "after changing params");
  }
}

// ---------------------------------------------------------------------------------------------
// Norm and clipping

TEST(GpuOptim, GradNormTensorMatchesCpu) {
  REQUIRE_GPU();
  Rng rng(51);
  Twin t = make_twin(rng);
  const Tensor norm = grad_norm_tensor(t.gpu);
  EXPECT_EQ(norm.device(), Device::CUDA);
  EXPECT_EQ(norm.dtype(), DType::F32);
  EXPECT_EQ(norm.shape(), (Shape{1}));
  const double cpu_norm = grad_norm(t.cpu);
  EXPECT_NEAR(norm.cpu().get(0), cpu_norm, 1e-6 * cpu_norm);
  // F64 accumulation on the device: the double result agrees with the CPU's far beyond F32.
  EXPECT_NEAR(grad_norm(t.gpu), cpu_norm, 1e-12 * cpu_norm);
  // Deterministic: the same bits every time.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bit_equal(grad_norm_tensor(t.gpu), norm));
  EXPECT_EQ(grad_norm(t.gpu), grad_norm(t.gpu));

  // NaN and Inf propagate, wherever they sit.
  for (double bad : {std::nan(""), double(INFINITY)}) {
    Tensor g = t.cpu[4].grad.clone();
    g.data<float>()[2999999] = static_cast<float>(bad);
    Tensor keep = t.gpu[4].grad;
    t.gpu[4].grad = g.to_device(Device::CUDA);
    const double n = grad_norm_tensor(t.gpu).cpu().get(0);
    if (std::isnan(bad)) {
      EXPECT_TRUE(std::isnan(n)) << n;
    } else {
      EXPECT_TRUE(std::isinf(n)) << n;
    }
    t.gpu[4].grad = keep;
  }

  // No gradients: zero, on the params' device.
  std::vector<Param> none = {Param{"x", Tensor::zeros({2}, DType::F32, Device::CUDA), Tensor()}};
  const Tensor z = grad_norm_tensor(none);
  EXPECT_EQ(z.device(), Device::CUDA);
  EXPECT_EQ(z.cpu().get(0), 0.0);
  EXPECT_EQ(grad_norm(none), 0.0);
}

TEST(GpuOptim, ClipGradNormWithMatchesCpu) {
  REQUIRE_GPU();
  Rng rng(52);
  Twin t = make_twin(rng);
  const Tensor ng = grad_norm_tensor(t.gpu), nc = grad_norm_tensor(t.cpu);
  const double total = nc.get(0);
  // Above max_norm: every grad scaled by max_norm / (norm + 1e-6).
  clip_grad_norm_with(t.gpu, total / 3, ng);
  clip_grad_norm_with(t.cpu, total / 3, nc);
  for (size_t i = 0; i < t.cpu.size(); ++i) expect_close(t.gpu[i].grad, t.cpu[i].grad, "clipped " + t.cpu[i].name);
  EXPECT_NEAR(grad_norm(t.gpu), total / 3, 1e-5 * total);

  // Below max_norm: nothing changes, not even a rounding step.
  std::vector<Tensor> before;
  for (const Param& p : t.gpu) before.push_back(p.grad.cpu().clone());
  const Tensor ng2 = grad_norm_tensor(t.gpu);
  clip_grad_norm_with(t.gpu, 10 * total, ng2);
  clip_grad_norm_with(t.gpu, 10 * total, Tensor::full({1}, ng2.cpu().get(0), DType::F64, Device::CUDA));
  clip_grad_norm_with(t.gpu, 10 * total, ng2.cpu());  // a norm on the host works too
  for (size_t i = 0; i < t.gpu.size(); ++i) EXPECT_TRUE(bit_equal(t.gpu[i].grad, before[i])) << t.gpu[i].name;

  // The double-returning clip on GPU grads: same norm and grads as on the CPU.
  Rng rng2(53);
  Twin u = make_twin(rng2);
  const double rc = clip_grad_norm(u.cpu, 1.0), rg = clip_grad_norm(u.gpu, 1.0);
  EXPECT_NEAR(rg, rc, 1e-12 * rc);
  for (size_t i = 0; i < u.cpu.size(); ++i) expect_close(u.gpu[i].grad, u.cpu[i].grad, "clip_grad_norm " + u.cpu[i].name);

  // torch: a NaN norm makes every grad NaN; an infinite one turns finite grads into 0.
  clip_grad_norm_with(u.gpu, 1.0, Tensor::full({1}, std::nan(""), DType::F32, Device::CUDA));
  for (const Param& p : u.gpu) {
    const Tensor g = p.grad.cpu();
    int64_t not_nan = 0;
    for (int64_t i = 0; i < g.numel(); ++i) not_nan += !std::isnan(g.get(i));
    EXPECT_EQ(not_nan, 0) << p.name;
  }
  Rng rng3(54);
  Twin w = make_twin(rng3);
  clip_grad_norm_with(w.gpu, 1.0, Tensor::full({1}, INFINITY, DType::F64, Device::CUDA));
  for (const Param& p : w.gpu) {
    const Tensor g = p.grad.cpu();
    int64_t non_zero = 0;
    for (int64_t i = 0; i < g.numel(); ++i) non_zero += g.get(i) != 0.0;
    EXPECT_EQ(non_zero, 0) << p.name;
  }
}

// ---------------------------------------------------------------------------------------------
// Guarded steps

TEST(GpuOptim, GuardedStepSkipsOnNonFiniteNorm) {
  REQUIRE_GPU();
  for (const Factory& factory : stateful_factories()) {
    auto cpu = factory();
    auto gpu = factory();
    SCOPED_TRACE(cpu->to_json().dump());
    Rng rng(61);
    Twin t = make_twin(rng);
    for (int s = 0; s < 2; ++s) {
      new_grads(t, rng, 1.0);
      cpu->step(t.cpu, 0.02);
      gpu->step_guarded(t.gpu, 0.02, grad_norm_tensor(t.gpu));
      expect_params_close(t, "finite guarded step " + std::to_string(s));
    }
    const std::vector<Tensor> values = snapshot_values(t.gpu);
    const auto state = gpu->state();
    new_grads(t, rng, 1.0);
    gpu->step_guarded(t.gpu, 0.02, Tensor::full({1}, std::nan(""), DType::F32, Device::CUDA));
    gpu->step_guarded(t.gpu, 0.02, Tensor::full({1}, INFINITY, DType::F64, Device::CUDA));
    gpu->step_guarded(t.gpu, 0.02, Tensor::full({}, -INFINITY, DType::F32, Device::CUDA));
    gpu->step_guarded(t.gpu, 0.02, Tensor::full({1}, std::nan(""), DType::F32));  // on the host
    for (size_t i = 0; i < t.gpu.size(); ++i) EXPECT_TRUE(bit_equal(t.gpu[i].value, values[i])) << t.gpu[i].name;
    expect_state_bit_equal(gpu->state(), state, "after skipped steps");
    // The next finite step is the CPU's next step (Adam's bias corrections did not advance).
    cpu->step(t.cpu, 0.02);
    gpu->step_guarded(t.gpu, 0.02, grad_norm_tensor(t.gpu));
    expect_params_close(t, "finite step after skipped ones");
    expect_state_close(*gpu, *cpu, "after skipped steps");

    // A first step that is skipped creates no state (the momentum buffer is still the first
    // update's copy when the param really steps).
    auto fresh = factory();
    auto fresh_cpu = factory();
    Rng rng2(62);
    Twin u = make_twin(rng2);
    const std::vector<Tensor> u_values = snapshot_values(u.gpu);
    fresh->step_guarded(u.gpu, 0.02, Tensor::full({1}, std::nan(""), DType::F32, Device::CUDA));
    for (size_t i = 0; i < u.gpu.size(); ++i) EXPECT_TRUE(bit_equal(u.gpu[i].value, u_values[i])) << u.gpu[i].name;
    EXPECT_TRUE(fresh->state().empty());
    fresh->step_guarded(u.gpu, 0.02, grad_norm_tensor(u.gpu));
    fresh_cpu->step(u.cpu, 0.02);
    expect_params_close(u, "first real step after a skipped first step");
    expect_state_close(*fresh, *fresh_cpu, "first real step after a skipped first step");
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

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

TEST(GpuOptim, MixedDevicesAndDtypesThrow) {
  REQUIRE_GPU();
  Rng rng(71);
  Param on_cpu = cpu_param("on_cpu", {4}, rng);
  Param on_gpu = gpu_copy(cpu_param("on_gpu", {4}, rng));
  const Tensor before = on_gpu.value.cpu().clone();
  Param split{"split", Tensor::zeros({4}, DType::F32, Device::CUDA), Tensor::zeros({4}, DType::F32)};
  Param f64{"f64", Tensor::zeros({4}, DType::F64, Device::CUDA), Tensor::zeros({4}, DType::F64, Device::CUDA)};
  std::unique_ptr<Optimizer> opts[] = {make_sgd(0.9), make_adam(), make_adamw()};
  for (auto& opt : opts) {
    SCOPED_TRACE(opt->kind());
    expect_error([&] { opt->step({on_gpu, on_cpu}, 0.1); }, {"different devices", "\"on_gpu\"", "\"on_cpu\""});
    expect_error([&] { opt->step({split}, 0.1); }, {"\"split\"", "cuda", "cpu"});
    expect_error([&] { opt->step({f64}, 0.1); }, {"\"f64\"", "F64", "F32"});
    expect_error([&] { opt->step_guarded({on_gpu}, 0.1, Tensor::zeros({2}, DType::F32, Device::CUDA)); },
                 {"norm", "[2]"});
    EXPECT_TRUE(bit_equal(on_gpu.value, before));
    EXPECT_TRUE(opt->state().empty());
  }
  expect_error([&] { grad_norm_tensor({on_gpu, on_cpu}); }, {"different devices"});
  expect_error([&] { clip_grad_norm_with({on_cpu, on_gpu}, 1.0, Tensor::full({1}, 1.0)); }, {"different devices"});
}

}  // namespace
