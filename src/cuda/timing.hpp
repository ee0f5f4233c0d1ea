// GPU time of host-issued work, by CUDA events on a stream (internal; CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "core/cuda_rt.hpp"

namespace lstm::cuda {

// An owned CUDA event (default flags: it can time).
class Event {
 public:
  Event() { LSTM_CUDA_CHECK(cudaEventCreate(&h_)); }
  ~Event() {
    if (h_) cudaEventDestroy(h_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return h_; }

 private:
  cudaEvent_t h_ = nullptr;
};

// Microseconds the GPU spent on what work() issues onto `stream` (waits for it).
inline double time_us(cudaStream_t stream, const std::function<void()>& work) {
  Event a, b;
  LSTM_CUDA_CHECK(cudaEventRecord(a.get(), stream));
  work();
  LSTM_CUDA_CHECK(cudaEventRecord(b.get(), stream));
  LSTM_CUDA_CHECK(cudaEventSynchronize(b.get()));
  float ms = 0;
  LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return 1e3 * static_cast<double>(ms);
}

}  // namespace lstm::cuda
