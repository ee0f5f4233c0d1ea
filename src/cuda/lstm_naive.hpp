// The naive GPU LSTM of Appleyard, Kocisky and Blunsom, "Optimizing Performance of Recurrent
// Neural Networks on GPUs" (2016): the starting point their optimisations are measured from, kept
// as a registered baseline ("naive", LstmBackendEntry::baseline) so that the benchmark and the
// conformance tests reach it through the registry like every other backend (CUDA builds only).
//
// Per layer and step, forward: 8 separate cuBLAS GEMMs (input and recurrent product of each of the
// 4 gates), then unfused pointwise kernels: a bias/sum kernel per gate, an activation kernel per
// gate, the cell update, tanh of the cell and the output product (11 launches). Backward, per layer
// and step: unfused pointwise kernels for dh, each gate's gradient, dc and dc_next, a bias
// reduction per gate, and 16 GEMMs (dh_prev, dx and both weight gradients, per gate). Nothing is
// fused, batched over steps, streamed or captured: that is the point of the baseline.
//
// Semantics are nn.LSTM's (gates i, f, g, o; weights in nn.LSTM's layout, aligned with
// spec.param_names()) within its limits: h0 = c0 = 0 and every sequence T steps long (calls with
// h0/c0 or shorter lengths are refused). Precision: F32 data with fp32 GEMMs (TF32 GEMMs when
// options.allow_tf32), BF16/F16 data with fp32 accumulation; the cell state, gate activations and
// gradient accumulators are fp32.
#pragma once

#include <memory>
#include <string>

#include "lstm/lstm.hpp"

namespace lstm::cuda {

// "" when the baseline runs spec in dtype on device: a CUDA device, unidirectional, with bias, no
// projection, sequence-major, no dropout, F32, BF16 or F16; else why not.
std::string naive_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device);
// Throws lstm::Error with naive_lstm_unsupported's reason when the case is not supported.
std::unique_ptr<LstmBackend> make_naive_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options);

}  // namespace lstm::cuda
