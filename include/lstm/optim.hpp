// Optimizers (SGD with momentum, Adam, AdamW), gradient clipping by global norm and learning-rate
// schedules. Semantics follow torch.optim exactly (same update formulas and defaults).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/layers.hpp"
#include "lstm/tensor.hpp"

namespace lstm {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string kind() const = 0;
  // One update of every param (value -= ... using grad) at learning rate lr. Params are keyed by
  // name; state (momentum buffers, moments) is kept per name and created on first use.
  // Params on the GPU are updated by fused multi-tensor kernels (one launch for all tensors).
  virtual void step(const std::vector<Param>& params, double lr) = 0;
  // The same update, skipped when `norm` (a scalar F32/F64 tensor on the parameters' device,
  // e.g. from grad_norm_tensor) is NaN or Inf; step counters then do not advance. On the GPU
  // the kernels read `norm` themselves: no host round trip.
  virtual void step_guarded(const std::vector<Param>& params, double lr, const Tensor& norm) = 0;
  // Optimizer state as named tensors, e.g. "exp_avg.lstm.weight_ih_l0", plus "step" counters,
  // always as CPU tensors (GPU state is copied back; this waits for the GPU), so checkpoints are
  // the same whichever device trained. load_state restores it exactly (throws naming a missing or
  // mis-shaped tensor); tensors from either device are accepted and follow the parameters'
  // device on the next step. On the GPU parameters must be F32.
  virtual std::map<std::string, Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, Tensor>& state) = 0;
  // The keys of state() a param has once it has stepped (e.g. "exp_avg.<param>"; none for SGD
  // without momentum): a resume checks them for every param, since load_state alone cannot
  // tell a param that has not stepped yet from state that was lost.
  virtual std::vector<std::string> state_keys(const std::string& param) const = 0;
  virtual nlohmann::json to_json() const = 0;
};

// torch.optim.SGD(lr, momentum, dampening=0, weight_decay, nesterov).
std::unique_ptr<Optimizer> make_sgd(double momentum = 0.0, double weight_decay = 0.0, bool nesterov = false);
// torch.optim.Adam(betas, eps, weight_decay) (L2 added to the gradient).
std::unique_ptr<Optimizer> make_adam(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                                     double weight_decay = 0.0);
// torch.optim.AdamW(betas, eps, weight_decay=0.01) (decoupled decay: value *= 1 - lr*wd).
std::unique_ptr<Optimizer> make_adamw(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                                      double weight_decay = 0.01);
// {"type": "sgd"|"adam"|"adamw", ...fields above...}; throws naming an unknown type or field.
std::unique_ptr<Optimizer> optimizer_from_json(const nlohmann::json& j);

// torch.nn.utils.clip_grad_norm_: scales every grad by max_norm / (total + 1e-6) when the global
// L2 norm exceeds max_norm. Returns the total norm before clipping (may be NaN/Inf).
double clip_grad_norm(const std::vector<Param>& params, double max_norm);
// Global L2 norm of the gradients.
double grad_norm(const std::vector<Param>& params);
// The global L2 norm as a scalar F32 [1] tensor on the gradients' device (GPU: a multi-tensor
// reduction, nothing synchronised). NaN/Inf when any gradient is.
Tensor grad_norm_tensor(const std::vector<Param>& params);
// clip_grad_norm with the norm given as grad_norm_tensor's result, read where it lives.
void clip_grad_norm_with(const std::vector<Param>& params, double max_norm, const Tensor& norm);

// Learning rate at an optimizer step (0-based).
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr(int64_t step) const = 0;
  virtual nlohmann::json to_json() const = 0;
};
std::unique_ptr<LrSchedule> make_constant_lr(double lr);
// lr * gamma^(step / step_size) (torch StepLR).
std::unique_ptr<LrSchedule> make_step_lr(double lr, int64_t step_size, double gamma);
// Linear warm-up from 0 to lr over warmup steps, then cosine decay to min_lr at total_steps.
std::unique_ptr<LrSchedule> make_cosine_lr(double lr, int64_t warmup_steps, int64_t total_steps,
                                           double min_lr = 0.0);
// {"type": "constant"|"step"|"cosine", "lr": ..., ...}.
std::unique_ptr<LrSchedule> schedule_from_json(const nlohmann::json& j);

}  // namespace lstm
