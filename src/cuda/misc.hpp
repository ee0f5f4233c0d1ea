// Small device helpers for the training loop (internal; CUDA builds only).
#pragma once

#include "lstm/tensor.hpp"

namespace lstm::cuda {

// acc[0] += x[0] for scalar F32 tensors on the GPU, on the engine stream (no host round trip).
// The trainer keeps a running sum of gradient norms: it is non-finite from the first step whose
// norm was, which makes the guarded optimizer skip that step and every later one.
void accumulate_scalar(Tensor& acc, const Tensor& x);

}  // namespace lstm::cuda
