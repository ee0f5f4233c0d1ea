// Shared by the GPU tests: skip with the reason when no GPU is usable, random tensors, specs, errors.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

// Skips the test, printing why, when this build or machine cannot run CUDA code.
#define LSTM_REQUIRE_GPU()                                                         \
  do {                                                                             \
    if (!::lstm::cuda_available())                                                 \
      GTEST_SKIP() << "no GPU: " << ::lstm::cuda_unavailable_reason();             \
  } while (0)

namespace lstm::testing {

// The message of the lstm::Error that f throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}


// Normal(0, sd) values (never zeros) in a CPU tensor of `dtype`.
inline Tensor random_tensor(const Shape& shape, Rng& rng, double sd = 1.0, DType dtype = DType::F32) {
  Tensor t = Tensor::empty(shape, DType::F64);
  rng.fill_normal(t, 0, sd);
  return dtype == DType::F64 ? t : t.to(dtype);
}

// An LstmSpec from its sizes (gpu_test_util.hpp needs no GPU: CPU tests use this too).
inline LstmSpec make_spec(int64_t I, int64_t H, int64_t L, bool bi = false, int64_t P = 0, bool bias = true,
                          bool batch_first = false, double dropout = 0.0) {
  LstmSpec s;
  s.input_size = I;
  s.hidden_size = H;
  s.num_layers = L;
  s.bidirectional = bi;
  s.proj_size = P;
  s.bias = bias;
  s.batch_first = batch_first;
  s.dropout = dropout;
  return s;
}

// A reference backend instance for spec in dtype (CPU).
inline std::unique_ptr<LstmBackend> reference_backend(const LstmSpec& spec, DType dtype = DType::F64) {
  LstmOptions o;
  o.algo = Algo::Reference;
  return make_lstm_backend(o, spec, dtype, Device::CPU);
}

}  // namespace lstm::testing
