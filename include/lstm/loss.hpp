// Softmax + cross-entropy, fused and numerically stable (log-sum-exp with the max subtracted).
#pragma once

#include <cstdint>
#include <vector>

#include "lstm/tensor.hpp"

namespace lstm {

struct LossResult {
  double loss = 0;       // mean over counted targets
  int64_t count = 0;     // targets counted (not ignored, not past a length)
  int64_t correct = 0;   // counted targets where argmax(logits) == target
  Tensor grad;           // d loss / d logits, same shape and dtype as logits; zero where not counted
};

// logits: [N, C] (F32 or F64); targets: I64 [N]. A target equal to ignore_index is not counted;
// any other target outside [0, C) throws naming the target and C. When `mask` is non-empty
// (size N), rows with mask 0 are not counted. Returns the mean loss and its gradient.
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                                 const std::vector<uint8_t>& mask = {});

// Row-wise softmax of logits [N, C] divided by `temperature` (> 0), as f64 probabilities.
std::vector<double> softmax_row(const Tensor& logits, int64_t row, double temperature = 1.0);

}  // namespace lstm
