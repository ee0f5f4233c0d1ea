// Softmax + cross-entropy, fused and numerically stable (log-sum-exp with the max subtracted);
// mean squared error and Huber loss for regression.
#pragma once

#include <cstdint>
#include <vector>

#include "lstm/tensor.hpp"

namespace lstm {

struct LossResult {
  double loss = 0;       // mean over counted targets
  int64_t count = 0;     // targets counted (not ignored, not past a length)
  int64_t correct = 0;   // counted targets where argmax(logits) == target
  Tensor grad;           // d loss / d logits, same shape, dtype and device as logits; zero where not counted
  // For CUDA logits loss/count/correct stay on the device until resolve(): `pending` is true
  // and `stats` (F64 [3] on the GPU) holds {mean loss, count, correct}.
  bool pending = false;
  Tensor stats;
  // Copies stats to the host (waits for the engine stream) and fills loss/count/correct.
  void resolve();
};

// logits: [N, C] (F32 or F64 on the CPU, F32 on the GPU); targets: I64 [N] on the CPU or on
// the logits' device; mask (host) as below. A target equal to ignore_index is not counted; any
// other target outside [0, C) throws naming the target and C (targets on the GPU cannot be
// checked without waiting: such a row gets a NaN loss and gradient instead, which a guarded
// optimizer step then skips). When `mask` is non-empty (size N), rows with mask 0 are not
// counted. Returns the mean loss and its gradient. On the GPU: one fused pass per row (max,
// log-sum-exp, loss, argmax, gradient), a fixed-order reduction of the loss (bit-reproducible),
// nothing synchronised.
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                                 const std::vector<uint8_t>& mask = {});

enum class RegressionLoss { MSE, Huber };

// torch.nn.MSELoss() / torch.nn.HuberLoss(delta=delta) with mean reduction over every element:
// predictions and targets have the same shape ([N, K]; F32 or F64 predictions, F32 or F64
// targets, on the CPU or the GPU; a GPU prediction is read back and its gradient copied to the
// GPU, which waits for the engine stream). Huber: 0.5 x^2 where |x| < delta, else
// delta (|x| - 0.5 delta), with x = prediction - target; delta > 0. Returns the mean loss, count
// = the number of elements (correct = 0) and the gradient (prediction's shape, dtype, device).
LossResult regression_loss(const Tensor& predictions, const Tensor& targets, RegressionLoss kind = RegressionLoss::MSE,
                           double delta = 1.0);

// Row-wise softmax of logits [N, C] divided by `temperature` (> 0), as f64 probabilities.
std::vector<double> softmax_row(const Tensor& logits, int64_t row, double temperature = 1.0);

}  // namespace lstm
