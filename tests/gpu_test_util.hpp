// Shared by the GPU tests: skip with the reason when no GPU is usable, random tensors.
#pragma once

#include <gtest/gtest.h>

#include "lstm/device.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

// Skips the test, printing why, when this build or machine cannot run CUDA code.
#define LSTM_REQUIRE_GPU()                                                         \
  do {                                                                             \
    if (!::lstm::cuda_available())                                                 \
      GTEST_SKIP() << "no GPU: " << ::lstm::cuda_unavailable_reason();             \
  } while (0)

namespace lstm::testing {

// Normal(0, sd) values (never zeros) in a CPU tensor of `dtype`.
inline Tensor random_tensor(const Shape& shape, Rng& rng, double sd = 1.0, DType dtype = DType::F32) {
  Tensor t = Tensor::empty(shape, DType::F64);
  rng.fill_normal(t, 0, sd);
  return dtype == DType::F64 ? t : t.to(dtype);
}

}  // namespace lstm::testing
