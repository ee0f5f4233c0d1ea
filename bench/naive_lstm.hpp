// The naive GPU LSTM of Appleyard, Kocisky and Blunsom, "Optimizing Performance of Recurrent
// Neural Networks on GPUs" (2016): the starting point their optimisations are measured from, kept
// here only as a benchmark baseline for the `paper` suite (CUDA builds only).
//
// Per layer and step, forward: 8 separate cuBLAS GEMMs (input and recurrent product of each of the
// 4 gates), then unfused pointwise kernels: a bias/sum kernel per gate, an activation kernel per
// gate, the cell update, tanh of the cell and the output product (11 launches). Backward, per layer
// and step: unfused pointwise kernels for dh, each gate's gradient, dc and dc_next, a bias
// reduction per gate, and 16 GEMMs (dh_prev, dx and both weight gradients, per gate). Nothing is
// fused, batched over steps or streamed: that is the point of the baseline.
//
// Semantics are nn.LSTM's (gates i, f, g, o; weights in nn.LSTM's layout, aligned with
// spec.param_names()), with h0 = c0 = 0 and every sequence T steps long. Precision: F32 data with
// fp32 GEMMs (or TF32 GEMMs when allow_tf32), BF16/F16 data with fp32 accumulation; the cell
// state, gate activations and gradient accumulators are fp32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lstm/lstm.hpp"
#include "lstm/tensor.hpp"

namespace lstm::bench {

class NaiveLstm {
 public:
  // Throws lstm::Error with unsupported_reason() when the case is not supported.
  NaiveLstm(const LstmSpec& spec, DType dtype, bool allow_tf32);
  ~NaiveLstm();
  NaiveLstm(const NaiveLstm&) = delete;
  NaiveLstm& operator=(const NaiveLstm&) = delete;

  // "" when supported: unidirectional, with bias, no projection, sequence-major, dropout 0,
  // dtype F32, BF16 or F16.
  static std::string unsupported_reason(const LstmSpec& spec, DType dtype);

  // x [T, B, I] in dtype on the GPU; weights as in LstmBackend::forward. Returns the last layer's
  // output [T, B, H] in dtype. training: keeps what backward() needs (until the next forward).
  Tensor forward(const std::vector<Tensor>& weights, const Tensor& x, bool training);
  // After a training forward with the same weights: d_output [T, B, H] in dtype. Adds the weight
  // gradients into d_weights (aligned with weights, same dtype) and returns d_x [T, B, I].
  Tensor backward(const std::vector<Tensor>& weights, const Tensor& d_output, std::vector<Tensor>& d_weights);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lstm::bench
