#include "lstm/optim.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <optional>
#include <set>
#include <string>
#include <utility>

#if LSTM_HAVE_CUDA
#include "cuda/optim.hpp"
#endif
#include "io/config_reader.hpp"
#include "lstm/device.hpp"

namespace lstm {
namespace {

using json = nlohmann::json;

// Below this many elements a parallel region costs more than the loop it would split.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// Doubles printed so that the message shows exactly the value given (shortest round-trip form).
std::string num_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return json(v).dump();
}

void require_nonneg(const char* who, const char* field, double v) {
  LSTM_REQUIRE(std::isfinite(v) && v >= 0,
               who << ": " << field << " must be a finite number >= 0, got " << num_str(v));
}

void require_beta(const char* who, const char* field, double v) {
  LSTM_REQUIRE(v >= 0 && v < 1, who << ": " << field << " must be in [0, 1), got " << num_str(v));
}

void require_lr(const char* who, double lr) {
  LSTM_REQUIRE(std::isfinite(lr) && lr >= 0, who << ": lr must be a finite number >= 0, got " << num_str(lr));
}

bool is_param_dtype(DType dt) { return dt == DType::F32 || dt == DType::F64; }

// All params are checked before any is touched, so a bad one leaves every value and all state as
// they were. Params without a gradient are skipped (torch skips p.grad is None). Returns the
// device of the params that have a gradient (the CPU when none has): one step runs on one device.
Device check_params(const char* who, const std::vector<Param>& params) {
  std::set<std::string> seen;
  const Param* first = nullptr;
  for (const Param& p : params) {
    LSTM_REQUIRE(!p.name.empty(), who << ": a param has an empty name; optimizer state is kept per name");
    LSTM_REQUIRE(seen.insert(p.name).second,
                 who << ": two params are named \"" << p.name
                     << "\"; optimizer state is kept per name, so names must be unique");
    LSTM_REQUIRE(p.value.defined(), who << ": param \"" << p.name << "\" has no value tensor");
    if (!p.grad.defined()) continue;
    LSTM_REQUIRE(is_param_dtype(p.value.dtype()),
                 who << ": param \"" << p.name << "\" has dtype " << dtype_name(p.value.dtype())
                     << ", expected F32 or F64");
    LSTM_REQUIRE(p.grad.dtype() == p.value.dtype(),
                 who << ": param \"" << p.name << "\" has dtype " << dtype_name(p.value.dtype())
                     << " but its grad has dtype " << dtype_name(p.grad.dtype()));
    LSTM_REQUIRE(p.grad.shape() == p.value.shape(),
                 who << ": param \"" << p.name << "\" has shape " << p.value.shape_str()
                     << " but its grad has shape " << p.grad.shape_str());
    LSTM_REQUIRE(p.grad.device() == p.value.device(),
                 who << ": param \"" << p.name << "\" is on " << device_name(p.value.device())
                     << " but its grad is on " << device_name(p.grad.device()));
    if (!first) first = &p;
    LSTM_REQUIRE(p.value.device() == first->value.device(),
                 who << ": params are on different devices (\"" << first->name << "\" on "
                     << device_name(first->value.device()) << ", \"" << p.name << "\" on "
                     << device_name(p.value.device()) << "); one optimizer updates params on one device");
    LSTM_REQUIRE(p.value.device() == Device::CPU || p.value.dtype() == DType::F32,
                 who << ": param \"" << p.name << "\" is " << dtype_name(p.value.dtype())
                     << " on the GPU; GPU params, grads and optimizer state are F32");
  }
  return first ? first->value.device() : Device::CPU;
}

// The guard of step_guarded: one F32 or F64 number, on either device.
void check_norm(const char* who, const Tensor& norm) {
  LSTM_REQUIRE(norm.defined() && norm.numel() == 1 && (norm.dtype() == DType::F32 || norm.dtype() == DType::F64),
               who << ": the norm must be one F32 or F64 number (e.g. grad_norm_tensor's result), got "
                   << (norm.defined() ? std::string(dtype_name(norm.dtype())) + " " + norm.shape_str()
                                      : std::string("an undefined tensor")));
}

// A CPU copy that shares nothing with t (state() hands out snapshots, not views).
Tensor host_copy(const Tensor& t) { return t.device() == Device::CPU ? t.clone() : t.cpu(); }

void check_state_shape(const char* who, const std::string& key, const Tensor& s, const Param& p) {
  LSTM_REQUIRE(s.shape() == p.value.shape(),
               who << ": state tensor \"" << key << "\" has shape " << s.shape_str() << " but param \""
                   << p.name << "\" has shape " << p.value.shape_str());
}

// torch casts loaded optimizer state to the param's dtype; doing it lazily here gives the same.
void match_dtype(Tensor& s, DType dt) {
  if (s.dtype() != dt) s = s.to(dt);
}

// Splits "exp_avg.lstm.weight_ih_l0" into ("exp_avg", "lstm.weight_ih_l0").
std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos) return {key, ""};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

// Loaded tensors may be on either device; the next step moves them to their param's device.
void check_loaded_buffer(const char* who, const std::string& key, const Tensor& t) {
  LSTM_REQUIRE(t.defined(), who << ": state tensor \"" << key << "\" is undefined");
  LSTM_REQUIRE(is_param_dtype(t.dtype()), who << ": state tensor \"" << key << "\" has dtype "
                                              << dtype_name(t.dtype()) << ", expected F32 or F64");
}

// ---------------------------------------------------------------------------------------------
// Update kernels. Hyperparameters are rounded to T first and every operation runs in T, in the
// order torch's single-tensor implementation uses, so F32 params round as torch's do.

template <class T>
void sgd_update(T* p, const T* g, T* buf, int64_t n, bool first, double lr, double momentum, double wd,
                bool nesterov) {
  const T lr_t = static_cast<T>(lr);
  const T mom = static_cast<T>(momentum);
  const T wd_t = static_cast<T>(wd);
  // torch skips these terms when the coefficient is 0, which matters for Inf/NaN and -0.0.
  const bool decay = wd != 0;
  const bool use_mom = momentum != 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if (decay) d = d + wd_t * p[i];
    if (use_mom) {
      const T b = first ? d : mom * buf[i] + d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] = p[i] - lr_t * d;
  }
}

struct AdamHyper {
  double beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW
};

template <class T>
void adam_update(T* p, const T* g, T* m, T* v, int64_t n, int64_t step, double lr, const AdamHyper& h) {
  const double t = static_cast<double>(step);
  const double bias_c1 = 1.0 - std::pow(h.beta1, t);
  const double bias_c2 = 1.0 - std::pow(h.beta2, t);
  const T step_size = static_cast<T>(lr / bias_c1);
  // torch's Python computes `bias_correction2 ** 0.5`, i.e. pow, which may differ from sqrt by an ulp.
  const T bias_c2_sqrt = static_cast<T>(std::pow(bias_c2, 0.5));
  const T b1 = static_cast<T>(h.beta1);
  const T one_minus_b1 = static_cast<T>(1.0 - h.beta1);
  const T b2 = static_cast<T>(h.beta2);
  const T one_minus_b2 = static_cast<T>(1.0 - h.beta2);
  const T eps = static_cast<T>(h.eps);
  const T wd = static_cast<T>(h.weight_decay);
  const T keep = static_cast<T>(1.0 - lr * h.weight_decay);
  const bool l2 = !h.decoupled && h.weight_decay != 0;
  const bool shrink = h.decoupled && h.weight_decay != 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    if (shrink) pi = pi * keep;
    T gi = g[i];
    if (l2) gi = gi + wd * pi;
    const T mi = b1 * m[i] + one_minus_b1 * gi;
    const T vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bias_c2_sqrt + eps;
    p[i] = pi - step_size * mi / denom;
  }
}

// ---------------------------------------------------------------------------------------------

#if LSTM_HAVE_CUDA
// Ids of one optimizer's GPU launches: each launch tags the step counters it writes with its id
// (never 0, the tag of a new counter), see src/cuda/optim.cu.
class LaunchIds {
 public:
  uint32_t next() {
    if (++id_ == 0) ++id_;
    return id_;
  }

 private:
  uint32_t id_ = 0;
};

// The guard of a GPU step as the kernels read it. False when the step is skipped outright: a
// norm that is on the host is read here, and a non-finite one skips the step.
bool device_guard(const Tensor* norm, cuda::DeviceScalar& guard) {
  guard = cuda::DeviceScalar{};
  if (!norm) return true;
  if (norm->device() == Device::CPU) return std::isfinite(norm->get(0));
  guard.ptr = norm->raw();
  guard.f64 = norm->dtype() == DType::F64;
  return true;
}

// The GPU keeps one step counter per param in a 64-bit word, (launch id << 32) | count (see
// advance_step in src/cuda/optim.cu); the count advances on the device, and only when the
// guard is finite, so the host knows it only by reading it back (state(), device changes).
Tensor new_step_word(int64_t count) { return Tensor::full({1}, static_cast<double>(count), DType::I64, Device::CUDA); }
constexpr int64_t kMaxGpuStep = 0xffffffffLL;
#endif

int64_t read_step_word(const Tensor& word) {
  return static_cast<int64_t>(static_cast<uint64_t>(word.cpu().data<int64_t>()[0]) & 0xffffffffu);
}

// Optimizer state lives on its param's device: a step of CPU params brings state left on the GPU
// to the CPU and the other way round, so load_state may hand over tensors on either device.
class Sgd final : public Optimizer {
 public:
  Sgd(double momentum, double weight_decay, bool nesterov)
      : momentum_(momentum), weight_decay_(weight_decay), nesterov_(nesterov) {
    require_nonneg("sgd", "momentum", momentum);
    require_nonneg("sgd", "weight_decay", weight_decay);
    LSTM_REQUIRE(!nesterov || momentum > 0,
                 "sgd: nesterov = true requires momentum > 0, got momentum " << num_str(momentum));
  }

  std::string kind() const override { return "sgd"; }

  void step(const std::vector<Param>& params, double lr) override { run(params, lr, nullptr); }
  void step_guarded(const std::vector<Param>& params, double lr, const Tensor& norm) override {
    check_norm("sgd", norm);
    run(params, lr, &norm);
  }

  std::map<std::string, Tensor> state() const override {
    std::map<std::string, Tensor> out;
    for (const auto& [name, slot] : bufs_) {
      // A GPU buffer whose first step was skipped does not exist for torch (nor on the CPU) yet.
      if (slot.word.defined() && read_step_word(slot.word) == 0) continue;
      out.emplace(key(name), host_copy(slot.buf));
    }
    return out;
  }

  std::vector<std::string> state_keys(const std::string& param) const override {
    if (momentum_ == 0) return {};
    return {key(param)};
  }

  void load_state(const std::map<std::string, Tensor>& state) override {
    std::map<std::string, Slot> next;
    for (const auto& [k, t] : state) {
      const auto [prefix, name] = split_key(k);
      LSTM_REQUIRE(momentum_ != 0, "sgd: unexpected state tensor \"" << k
                                       << "\": SGD without momentum keeps no state");
      LSTM_REQUIRE(prefix == "momentum_buffer" && !name.empty(),
                   "sgd: unexpected state tensor \"" << k << "\", expected momentum_buffer.<param name>");
      check_loaded_buffer("sgd", k, t);
      next.emplace(name, Slot{t.clone(), Tensor()});
    }
    bufs_ = std::move(next);
  }

  json to_json() const override {
    return json{{"type", "sgd"}, {"momentum", momentum_}, {"weight_decay", weight_decay_}, {"nesterov", nesterov_}};
  }

 private:
  // A momentum buffer. On the GPU it comes with a step counter (`word`), because the buffer
  // starts as torch.clone(update) on the param's first step and only the device knows whether a
  // guarded step ran. A buffer without a counter has stepped (on the CPU, or it was loaded).
  struct Slot {
    Tensor buf;
    Tensor word;
  };

  static std::string key(const std::string& name) { return "momentum_buffer." + name; }

  // Brings a buffer to the CPU; false when it never stepped on the GPU (the caller drops it).
  static bool slot_to_host(Slot& s) {
    if (s.word.defined()) {
      if (read_step_word(s.word) == 0) return false;
      s.word = Tensor();
    }
    if (s.buf.device() != Device::CPU) s.buf = s.buf.cpu();
    return true;
  }

  void run(const std::vector<Param>& params, double lr, const Tensor* norm) {
    require_lr("sgd", lr);
    const Device device = check_params("sgd", params);
    const bool use_mom = momentum_ != 0;
    if (use_mom) {
      for (const Param& p : params) {
        if (!p.grad.defined()) continue;
        auto it = bufs_.find(p.name);
        if (it != bufs_.end()) check_state_shape("sgd", key(p.name), it->second.buf, p);
      }
    }
    if (device == Device::CUDA) {
      run_cuda(params, lr, norm);
      return;
    }
    if (norm && !std::isfinite(norm->cpu().get(0))) return;
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      Tensor value = p.value;
      bool first = false;
      Tensor buf;
      if (use_mom) {
        auto it = bufs_.find(p.name);
        if (it != bufs_.end() && !slot_to_host(it->second)) {
          bufs_.erase(it);
          it = bufs_.end();
        }
        if (it == bufs_.end()) {
          first = true;
          it = bufs_.emplace(p.name, Slot{Tensor::empty(p.value.shape(), p.value.dtype()), Tensor()}).first;
        }
        match_dtype(it->second.buf, p.value.dtype());
        buf = it->second.buf;
      }
      if (value.dtype() == DType::F64) {
        sgd_update<double>(value.data<double>(), p.grad.data<double>(), use_mom ? buf.data<double>() : nullptr,
                           value.numel(), first, lr, momentum_, weight_decay_, nesterov_);
      } else {
        sgd_update<float>(value.data<float>(), p.grad.data<float>(), use_mom ? buf.data<float>() : nullptr,
                          value.numel(), first, lr, momentum_, weight_decay_, nesterov_);
      }
    }
  }

  // One fused launch for every param (checked F32 on the GPU by run()).
  void run_cuda(const std::vector<Param>& params, double lr, const Tensor* norm) {
#if LSTM_HAVE_CUDA
    cuda::DeviceScalar guard;
    if (!device_guard(norm, guard)) return;
    const bool use_mom = momentum_ != 0;
    std::vector<cuda::MtTensor> ts;
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      Tensor value = p.value, grad = p.grad;
      cuda::MtTensor t;
      t.value = static_cast<float*>(value.raw());
      t.grad = static_cast<float*>(grad.raw());
      t.numel = value.numel();
      if (use_mom) {
        auto it = bufs_.find(p.name);
        if (it == bufs_.end()) {
          it = bufs_.emplace(p.name, Slot{Tensor::zeros(p.value.shape(), DType::F32, Device::CUDA), new_step_word(0)})
                   .first;
        } else {
          Slot& s = it->second;
          if (s.buf.device() != Device::CUDA) s.buf = s.buf.to_device(Device::CUDA);
          match_dtype(s.buf, DType::F32);
          if (!s.word.defined()) s.word = new_step_word(1);
        }
        t.s1 = static_cast<float*>(it->second.buf.raw());
        t.step = static_cast<unsigned long long*>(it->second.word.raw());
      }
      t.vec4 = cuda::mt_aligned(t);
      ts.push_back(t);
    }
    table_.set(ts);
    const cuda::SgdArgs args{static_cast<float>(lr), static_cast<float>(momentum_), static_cast<float>(weight_decay_),
                             weight_decay_ != 0, use_mom, nesterov_};
    cuda::sgd_step(table_, args, guard, launches_.next());
#else
    require_cuda("sgd: a step of GPU params");
#endif
  }

  double momentum_, weight_decay_;
  bool nesterov_;
  std::map<std::string, Slot> bufs_;  // by param name; present once the param has stepped
#if LSTM_HAVE_CUDA
  cuda::MtTable table_;  // the last launch's tensors, re-uploaded only when they change
  LaunchIds launches_;
#endif
};

class Adam final : public Optimizer {
 public:
  Adam(double beta1, double beta2, double eps, double weight_decay, bool decoupled)
      : h_{beta1, beta2, eps, weight_decay, decoupled} {
    const char* w = who();
    require_beta(w, "beta1", beta1);
    require_beta(w, "beta2", beta2);
    require_nonneg(w, "eps", eps);
    require_nonneg(w, "weight_decay", weight_decay);
  }

  std::string kind() const override { return who(); }

  void step(const std::vector<Param>& params, double lr) override { run(params, lr, nullptr); }
  void step_guarded(const std::vector<Param>& params, double lr, const Tensor& norm) override {
    check_norm(who(), norm);
    run(params, lr, &norm);
  }

  std::map<std::string, Tensor> state() const override {
    std::map<std::string, Tensor> out;
    for (const auto& [name, s] : state_) {
      int64_t step = s.step;
      if (s.word.defined()) {
        step = read_step_word(s.word);
        // Created by a GPU step that was skipped: torch (and the CPU) would have no state yet.
        if (s.fresh && step == 0) continue;
      }
      out.emplace("exp_avg." + name, host_copy(s.exp_avg));
      out.emplace("exp_avg_sq." + name, host_copy(s.exp_avg_sq));
      out.emplace("step." + name, Tensor::from_vector<double>({}, {static_cast<double>(step)}));
    }
    return out;
  }

  std::vector<std::string> state_keys(const std::string& param) const override {
    return {"exp_avg." + param, "exp_avg_sq." + param, "step." + param};
  }

  void load_state(const std::map<std::string, Tensor>& state) override {
    const char* w = who();
    std::map<std::string, Moments> next;
    for (const auto& [k, t] : state) {
      const auto [prefix, name] = split_key(k);
      LSTM_REQUIRE((prefix == "exp_avg" || prefix == "exp_avg_sq" || prefix == "step") && !name.empty(),
                   w << ": unexpected state tensor \"" << k
                     << "\", expected exp_avg.<param name>, exp_avg_sq.<param name> or step.<param name>");
      Moments& s = next.try_emplace(name, Moments{Tensor(), Tensor(), -1, Tensor(), false}).first->second;
      if (prefix == "step") {
        LSTM_REQUIRE(t.defined() && t.numel() == 1 && t.dim() <= 1,
                     w << ": state tensor \"" << k << "\" must hold one number (shape []), got shape "
                       << (t.defined() ? t.shape_str() : std::string("undefined")));
        const double v = t.cpu().get(0);
        // 2^53: beyond it a double no longer counts every step.
        LSTM_REQUIRE(v >= 0 && v <= 9007199254740992.0 && v == std::floor(v),
                     w << ": state tensor \"" << k << "\" must be a step count (an integer >= 0), got "
                       << num_str(v));
        s.step = static_cast<int64_t>(v);
      } else {
        check_loaded_buffer(w, k, t);
        (prefix == "exp_avg" ? s.exp_avg : s.exp_avg_sq) = t.clone();
      }
    }
    for (const auto& [name, s] : next) {
      LSTM_REQUIRE(s.exp_avg.defined(), w << ": state tensor \"exp_avg." << name << "\" is missing");
      LSTM_REQUIRE(s.exp_avg_sq.defined(), w << ": state tensor \"exp_avg_sq." << name << "\" is missing");
      LSTM_REQUIRE(s.step >= 0, w << ": state tensor \"step." << name << "\" is missing");
      LSTM_REQUIRE(s.exp_avg_sq.shape() == s.exp_avg.shape(),
                   w << ": state tensor \"exp_avg_sq." << name << "\" has shape " << s.exp_avg_sq.shape_str()
                     << " but \"exp_avg." << name << "\" has shape " << s.exp_avg.shape_str());
    }
    state_ = std::move(next);
  }

  json to_json() const override {
    return json{{"type", kind()},          {"beta1", h_.beta1}, {"beta2", h_.beta2},
                {"eps", h_.eps},           {"weight_decay", h_.weight_decay}};
  }

 private:
  struct Moments {
    Tensor exp_avg, exp_avg_sq;
    int64_t step;  // the step count; while `word` is defined, an upper bound of the device's count
    Tensor word;   // the step counter while the moments are on the GPU
    bool fresh = false;  // created by a GPU step (neither loaded nor brought from the CPU)
  };

  const char* who() const { return h_.decoupled ? "adamw" : "adam"; }

  // Brings moments to the CPU; false when they never stepped on the GPU (the caller drops them).
  static bool moments_to_host(Moments& s) {
    if (s.word.defined()) {
      const int64_t n = read_step_word(s.word);
      if (s.fresh && n == 0) return false;
      s.step = n;
      s.word = Tensor();
      s.fresh = false;
    }
    if (s.exp_avg.device() != Device::CPU) s.exp_avg = s.exp_avg.cpu();
    if (s.exp_avg_sq.device() != Device::CPU) s.exp_avg_sq = s.exp_avg_sq.cpu();
    return true;
  }

  void run(const std::vector<Param>& params, double lr, const Tensor* norm) {
    const char* w = who();
    require_lr(w, lr);
    const Device device = check_params(w, params);
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      auto it = state_.find(p.name);
      if (it == state_.end()) continue;
      check_state_shape(w, "exp_avg." + p.name, it->second.exp_avg, p);
      check_state_shape(w, "exp_avg_sq." + p.name, it->second.exp_avg_sq, p);
    }
    if (device == Device::CUDA) {
      run_cuda(params, lr, norm);
      return;
    }
    if (norm && !std::isfinite(norm->cpu().get(0))) return;
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      auto it = state_.find(p.name);
      if (it != state_.end() && !moments_to_host(it->second)) {
        state_.erase(it);
        it = state_.end();
      }
      if (it == state_.end()) {
        it = state_.emplace(p.name, Moments{Tensor::zeros(p.value.shape(), p.value.dtype()),
                                            Tensor::zeros(p.value.shape(), p.value.dtype()), 0, Tensor(), false})
                 .first;
      }
      Moments& s = it->second;
      match_dtype(s.exp_avg, p.value.dtype());
      match_dtype(s.exp_avg_sq, p.value.dtype());
      ++s.step;
      Tensor value = p.value;
      if (value.dtype() == DType::F64) {
        adam_update<double>(value.data<double>(), p.grad.data<double>(), s.exp_avg.data<double>(),
                            s.exp_avg_sq.data<double>(), value.numel(), s.step, lr, h_);
      } else {
        adam_update<float>(value.data<float>(), p.grad.data<float>(), s.exp_avg.data<float>(),
                           s.exp_avg_sq.data<float>(), value.numel(), s.step, lr, h_);
      }
    }
  }

  // One fused launch for every param (checked F32 on the GPU by run()). The bias corrections
  // come from each param's device step counter, so a skipped step leaves them where they were.
  void run_cuda(const std::vector<Param>& params, double lr, const Tensor* norm) {
#if LSTM_HAVE_CUDA
    const char* w = who();
    cuda::DeviceScalar guard;
    if (!device_guard(norm, guard)) return;
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      auto it = state_.find(p.name);
      if (it == state_.end()) continue;
      LSTM_REQUIRE(it->second.step < kMaxGpuStep,
                   w << ": param \"" << p.name << "\" has taken " << it->second.step
                     << " steps; the GPU step counter stops at " << kMaxGpuStep);
    }
    std::vector<cuda::MtTensor> ts;
    for (const Param& p : params) {
      if (!p.grad.defined()) continue;
      auto it = state_.find(p.name);
      if (it == state_.end()) {
        it = state_.emplace(p.name, Moments{Tensor::zeros(p.value.shape(), DType::F32, Device::CUDA),
                                            Tensor::zeros(p.value.shape(), DType::F32, Device::CUDA), 0,
                                            new_step_word(0), true})
                 .first;
      } else {
        Moments& s = it->second;
        if (s.exp_avg.device() != Device::CUDA) s.exp_avg = s.exp_avg.to_device(Device::CUDA);
        if (s.exp_avg_sq.device() != Device::CUDA) s.exp_avg_sq = s.exp_avg_sq.to_device(Device::CUDA);
        match_dtype(s.exp_avg, DType::F32);
        match_dtype(s.exp_avg_sq, DType::F32);
        if (!s.word.defined()) s.word = new_step_word(s.step);
      }
      Moments& s = it->second;
      ++s.step;  // an upper bound: the device does not count a skipped step
      Tensor value = p.value, grad = p.grad;
      cuda::MtTensor t;
      t.value = static_cast<float*>(value.raw());
      t.grad = static_cast<float*>(grad.raw());
      t.s1 = static_cast<float*>(s.exp_avg.raw());
      t.s2 = static_cast<float*>(s.exp_avg_sq.raw());
      t.step = static_cast<unsigned long long*>(s.word.raw());
      t.numel = value.numel();
      t.vec4 = cuda::mt_aligned(t);
      ts.push_back(t);
    }
    table_.set(ts);
    // The F32 scalars exactly as adam_update rounds them.
    cuda::AdamArgs a;
    a.b1 = static_cast<float>(h_.beta1);
    a.one_minus_b1 = static_cast<float>(1.0 - h_.beta1);
    a.b2 = static_cast<float>(h_.beta2);
    a.one_minus_b2 = static_cast<float>(1.0 - h_.beta2);
    a.eps = static_cast<float>(h_.eps);
    a.weight_decay = static_cast<float>(h_.weight_decay);
    a.keep = static_cast<float>(1.0 - lr * h_.weight_decay);
    a.l2 = !h_.decoupled && h_.weight_decay != 0;
    a.shrink = h_.decoupled && h_.weight_decay != 0;
    a.lr = lr;
    a.beta1 = h_.beta1;
    a.beta2 = h_.beta2;
    cuda::adam_step(table_, a, guard, launches_.next());
#else
    require_cuda(std::string(who()) + ": a step of GPU params");
#endif
  }

  AdamHyper h_;
  std::map<std::string, Moments> state_;  // by param name; present once the param has stepped
#if LSTM_HAVE_CUDA
  cuda::MtTable table_;  // the last launch's tensors, re-uploaded only when they change
  LaunchIds launches_;
#endif
};

// ---------------------------------------------------------------------------------------------
// JSON settings: every field is checked for its type, and fields we do not know are an error
// rather than silently ignored (a typo in a config should not train with defaults).

class Fields {
 public:
  Fields(const json& j, std::string what, std::initializer_list<const char*> allowed)
      : j_(j), what_(std::move(what)) {
    for (const auto& [k, v] : j.items()) {
      bool known = k == "type";
      for (const char* a : allowed) known = known || k == a;
      if (known) continue;
      std::string list = "type";
      for (const char* a : allowed) list += std::string(", ") + a;
      LSTM_THROW(what_ << ": unknown field \"" << k << "\" = " << json_excerpt(v) << " (expected: " << list << ")");
    }
  }

  double number(const char* key, std::optional<double> def) const {
    if (!j_.contains(key)) return required(key, def);
    return read_number(j_.at(key), name(key), -HUGE_VAL, HUGE_VAL);
  }

  // Step counts: 2^53 bounds the doubles that still count every step.
  int64_t integer(const char* key, std::optional<int64_t> def) const {
    if (!j_.contains(key)) return required(key, def);
    return read_int(j_.at(key), name(key), -(int64_t{1} << 53), int64_t{1} << 53);
  }

  bool boolean(const char* key, bool def) const {
    if (!j_.contains(key)) return def;
    return read_bool(j_.at(key), name(key));
  }

 private:
  template <class T>
  T required(const char* key, std::optional<T> def) const {
    LSTM_REQUIRE(def.has_value(), what_ << ": missing field \"" << key << "\"");
    return *def;
  }

  std::string name(const char* key) const { return what_ + ": field \"" + key + "\""; }

  const json& j_;
  std::string what_;
};

std::string type_of(const json& j, const char* what, const char* expected) {
  LSTM_REQUIRE(j.is_object(), what << " json: expected an object with a \"type\" field, got " << json_excerpt(j));
  LSTM_REQUIRE(j.contains("type"), what << " json: missing field \"type\" (expected " << expected << ")");
  return read_string(j.at("type"), std::string(what) + " json: field \"type\"");
}

// ---------------------------------------------------------------------------------------------

template <class T>
double sum_squares(const T* g, int64_t n) {
  // Fixed blocks summed in a fixed order: the norm, and so clipping, does not depend on how many
  // threads ran.
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    double s = 0;
    for (int64_t i = b * kBlock; i < end; ++i) {
      const double x = static_cast<double>(g[i]);
      s += x * x;
    }
    part[static_cast<size_t>(b)] = s;
  }
  double s = 0;
  for (double x : part) s += x;
  return s;
}

template <class T>
void scale(T* g, int64_t n, T c) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * c;
}

// The device of the params' gradients (none when no param has one); every gradient must be on
// it, and GPU gradients are F32.
std::optional<Device> grads_device(const char* who, const std::vector<Param>& params) {
  const Param* first = nullptr;
  for (const Param& p : params) {
    if (!p.grad.defined()) continue;
    LSTM_REQUIRE(is_param_dtype(p.grad.dtype()), who << ": grad of \"" << p.name << "\" has dtype "
                                                     << dtype_name(p.grad.dtype()) << ", expected F32 or F64");
    if (!first) first = &p;
    LSTM_REQUIRE(p.grad.device() == first->grad.device(),
                 who << ": grads are on different devices (\"" << first->name << "\" on "
                     << device_name(first->grad.device()) << ", \"" << p.name << "\" on "
                     << device_name(p.grad.device()) << ")");
    LSTM_REQUIRE(p.grad.device() == Device::CPU || p.grad.dtype() == DType::F32,
                 who << ": grad of \"" << p.name << "\" is " << dtype_name(p.grad.dtype())
                     << " on the GPU; GPU grads are F32");
  }
  if (!first) return std::nullopt;
  return first->grad.device();
}

#if LSTM_HAVE_CUDA
// The calling thread's cached table of the params' grads (all checked F32 on the GPU).
cuda::MtTable& gpu_grad_table(const std::vector<Param>& params) {
  std::vector<cuda::MtTensor> ts;
  for (const Param& p : params) {
    if (!p.grad.defined() || p.grad.numel() == 0) continue;
    Tensor g = p.grad;
    cuda::MtTensor t;
    t.grad = static_cast<float*>(g.raw());
    t.numel = g.numel();
    t.vec4 = cuda::mt_aligned(t);
    ts.push_back(t);
  }
  cuda::MtTable& table = cuda::grad_table();
  table.set(ts);
  return table;
}

// The global norm of GPU grads as F32 [1] on the GPU; also as F64 [1] in *f64 when asked.
Tensor gpu_grad_norm(const std::vector<Param>& params, Tensor* f64) {
  cuda::MtTable& table = gpu_grad_table(params);
  Tensor out = Tensor::empty({1}, DType::F32, Device::CUDA);
  if (f64) *f64 = Tensor::empty({1}, DType::F64, Device::CUDA);
  cuda::grad_norm(table, static_cast<float*>(out.raw()), f64 ? static_cast<double*>(f64->raw()) : nullptr);
  return out;
}

void gpu_clip(const std::vector<Param>& params, double max_norm, const Tensor& norm) {
  // A norm on the host is copied over (the kernel reads it where it runs); the copy outlives the
  // kernel as far as the stream-ordered arena is concerned.
  Tensor n = norm.to_device(Device::CUDA);
  cuda::MtTable& table = gpu_grad_table(params);
  cuda::clip_grads(table, max_norm, cuda::DeviceScalar{n.raw(), n.dtype() == DType::F64});
}
#else
Tensor gpu_grad_norm(const std::vector<Param>&, Tensor*) {
  require_cuda("the norm of GPU gradients");
  return Tensor();
}
void gpu_clip(const std::vector<Param>&, double, const Tensor&) { require_cuda("clipping GPU gradients"); }
#endif

void require_max_norm(double max_norm) {
  LSTM_REQUIRE(std::isfinite(max_norm) && max_norm > 0,
               "clip_grad_norm: max_norm must be a finite number > 0, got " << num_str(max_norm));
}

void scale_grads(const std::vector<Param>& params, double coef) {
  for (const Param& p : params) {
    if (!p.grad.defined()) continue;
    Tensor g = p.grad;
    if (g.dtype() == DType::F64) {
      scale(g.data<double>(), g.numel(), coef);
    } else {
      scale(g.data<float>(), g.numel(), static_cast<float>(coef));
    }
  }
}

// ---------------------------------------------------------------------------------------------

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) { require_nonneg("constant lr schedule", "lr", lr); }
  double lr(int64_t step) const override {
    LSTM_REQUIRE(step >= 0, "constant lr schedule: step must be >= 0, got " << step);
    return lr_;
  }
  json to_json() const override { return json{{"type", "constant"}, {"lr", lr_}}; }

 private:
  double lr_;
};

class StepLr final : public LrSchedule {
 public:
  StepLr(double lr, int64_t step_size, double gamma) : lr_(lr), step_size_(step_size), gamma_(gamma) {
    require_nonneg("step lr schedule", "lr", lr);
    LSTM_REQUIRE(step_size >= 1, "step lr schedule: step_size must be >= 1, got " << step_size);
    LSTM_REQUIRE(std::isfinite(gamma) && gamma > 0,
                 "step lr schedule: gamma must be a finite number > 0, got " << num_str(gamma));
  }
  double lr(int64_t step) const override {
    LSTM_REQUIRE(step >= 0, "step lr schedule: step must be >= 0, got " << step);
    return lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
  }
  json to_json() const override {
    return json{{"type", "step"}, {"lr", lr_}, {"step_size", step_size_}, {"gamma", gamma_}};
  }

 private:
  double lr_;
  int64_t step_size_;
  double gamma_;
};

class CosineLr final : public LrSchedule {
 public:
  CosineLr(double lr, int64_t warmup_steps, int64_t total_steps, double min_lr)
      : lr_(lr), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
    const char* who = "cosine lr schedule";
    require_nonneg(who, "lr", lr);
    LSTM_REQUIRE(warmup_steps >= 0, who << ": warmup_steps must be >= 0, got " << warmup_steps);
    LSTM_REQUIRE(total_steps >= 1, who << ": total_steps must be >= 1, got " << total_steps);
    LSTM_REQUIRE(total_steps >= warmup_steps, who << ": total_steps must be >= warmup_steps (" << warmup_steps
                                                  << "), got " << total_steps);
    LSTM_REQUIRE(min_lr >= 0 && min_lr <= lr,
                 who << ": min_lr must be in [0, lr] = [0, " << num_str(lr) << "], got " << num_str(min_lr));
  }
  double lr(int64_t step) const override {
    LSTM_REQUIRE(step >= 0, "cosine lr schedule: step must be >= 0, got " << step);
    if (step < warmup_) return lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    const double span = static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
    const double progress = std::clamp(static_cast<double>(step - warmup_) / span, 0.0, 1.0);
    return min_lr_ + 0.5 * (lr_ - min_lr_) * (1.0 + std::cos(std::numbers::pi * progress));
  }
  json to_json() const override {
    return json{{"type", "cosine"},
                {"lr", lr_},
                {"warmup_steps", warmup_},
                {"total_steps", total_},
                {"min_lr", min_lr_}};
  }

 private:
  double lr_;
  int64_t warmup_, total_;
  double min_lr_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(double momentum, double weight_decay, bool nesterov) {
  return std::make_unique<Sgd>(momentum, weight_decay, nesterov);
}

std::unique_ptr<Optimizer> make_adam(double beta1, double beta2, double eps, double weight_decay) {
  return std::make_unique<Adam>(beta1, beta2, eps, weight_decay, false);
}

std::unique_ptr<Optimizer> make_adamw(double beta1, double beta2, double eps, double weight_decay) {
  return std::make_unique<Adam>(beta1, beta2, eps, weight_decay, true);
}

std::unique_ptr<Optimizer> optimizer_from_json(const nlohmann::json& j) {
  const std::string type = type_of(j, "optimizer", "\"sgd\", \"adam\" or \"adamw\"");
  const std::string what = "optimizer \"" + type + "\"";
  if (type == "sgd") {
    Fields f(j, what, {"momentum", "weight_decay", "nesterov"});
    return make_sgd(f.number("momentum", 0.0), f.number("weight_decay", 0.0), f.boolean("nesterov", false));
  }
  if (type == "adam" || type == "adamw") {
    Fields f(j, what, {"beta1", "beta2", "eps", "weight_decay"});
    const double b1 = f.number("beta1", 0.9), b2 = f.number("beta2", 0.999), eps = f.number("eps", 1e-8);
    if (type == "adam") return make_adam(b1, b2, eps, f.number("weight_decay", 0.0));
    return make_adamw(b1, b2, eps, f.number("weight_decay", 0.01));
  }
  LSTM_THROW("optimizer json: unknown type \"" << type << "\" (expected \"sgd\", \"adam\" or \"adamw\")");
}

double grad_norm(const std::vector<Param>& params) {
  if (grads_device("grad_norm", params) == Device::CUDA) {
    Tensor f64;
    gpu_grad_norm(params, &f64);
    return f64.cpu().get(0);
  }
  double total = 0;
  for (const Param& p : params) {
    if (!p.grad.defined()) continue;
    total += p.grad.dtype() == DType::F64 ? sum_squares(p.grad.data<double>(), p.grad.numel())
                                          : sum_squares(p.grad.data<float>(), p.grad.numel());
  }
  return std::sqrt(total);
}

double clip_grad_norm(const std::vector<Param>& params, double max_norm) {
  require_max_norm(max_norm);
  if (grads_device("clip_grad_norm", params) == Device::CUDA) {
    // Clipped with the F64 norm, as the CPU does.
    Tensor f64;
    gpu_grad_norm(params, &f64);
    gpu_clip(params, max_norm, f64);
    return f64.cpu().get(0);
  }
  const double total = grad_norm(params);
  const double coef = max_norm / (total + 1e-6);
  // torch multiplies by clamp(coef, max=1): a NaN norm turns every grad into NaN, which a
  // trainer checking the returned norm then skips. Multiplying by exactly 1 is skipped as a no-op.
  if (coef >= 1.0) return total;
  scale_grads(params, coef);
  return total;
}

Tensor grad_norm_tensor(const std::vector<Param>& params) {
  const std::optional<Device> device = grads_device("grad_norm_tensor", params);
  if (device == Device::CUDA) return gpu_grad_norm(params, nullptr);
  if (!device) {
    // No gradients: a zero norm where the params are.
    for (const Param& p : params)
      if (p.value.defined() && p.value.device() == Device::CUDA) return Tensor::zeros({1}, DType::F32, Device::CUDA);
  }
  return Tensor::full({1}, grad_norm(params), DType::F32);
}

void clip_grad_norm_with(const std::vector<Param>& params, double max_norm, const Tensor& norm) {
  require_max_norm(max_norm);
  const std::optional<Device> device = grads_device("clip_grad_norm_with", params);
  if (!device) return;
  check_norm("clip_grad_norm_with", norm);
  if (device == Device::CUDA) {
    gpu_clip(params, max_norm, norm);
    return;
  }
  const double total = norm.cpu().get(0);
  const double coef = max_norm / (total + 1e-6);
  if (coef >= 1.0) return;
  scale_grads(params, coef);
}

std::unique_ptr<LrSchedule> make_constant_lr(double lr) { return std::make_unique<ConstantLr>(lr); }

std::unique_ptr<LrSchedule> make_step_lr(double lr, int64_t step_size, double gamma) {
  return std::make_unique<StepLr>(lr, step_size, gamma);
}

std::unique_ptr<LrSchedule> make_cosine_lr(double lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  return std::make_unique<CosineLr>(lr, warmup_steps, total_steps, min_lr);
}

std::unique_ptr<LrSchedule> schedule_from_json(const nlohmann::json& j) {
  const std::string type = type_of(j, "lr schedule", "\"constant\", \"step\" or \"cosine\"");
  const std::string what = "lr schedule \"" + type + "\"";
  if (type == "constant") {
    Fields f(j, what, {"lr"});
    return make_constant_lr(f.number("lr", std::nullopt));
  }
  if (type == "step") {
    Fields f(j, what, {"lr", "step_size", "gamma"});
    return make_step_lr(f.number("lr", std::nullopt), f.integer("step_size", std::nullopt),
                        f.number("gamma", 0.1));
  }
  if (type == "cosine") {
    Fields f(j, what, {"lr", "warmup_steps", "total_steps", "min_lr"});
    return make_cosine_lr(f.number("lr", std::nullopt), f.integer("warmup_steps", 0),
                          f.integer("total_steps", std::nullopt), f.number("min_lr", 0.0));
  }
  LSTM_THROW("lr schedule json: unknown type \"" << type << "\" (expected \"constant\", \"step\" or \"cosine\")");
}

}  // namespace lstm
