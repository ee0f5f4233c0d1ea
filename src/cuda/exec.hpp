// An ExecContext made current for the duration of a backend call (internal; CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include "core/cuda_rt.hpp"
#include "lstm/lstm.hpp"

namespace lstm::cuda {

// The calling thread's engine stream on the current device, as an ExecContext.
ExecContext current_context();

// ctx's stream; nullptr stands for the legacy default stream (an engine stream of nullptr would
// mean "make one" to cuda::stream()).
inline cudaStream_t stream_of(const ExecContext& ctx) {
  return ctx.stream ? static_cast<cudaStream_t>(ctx.stream) : cudaStreamLegacy;
}

// Makes ctx's device current and ctx's stream the calling thread's engine stream until it is
// destroyed, so that everything a backend call issues (its kernels, library calls, tensor copies
// and arena allocations) goes onto the caller's stream, whatever stream the thread had before.
// Throws when ctx is not a CUDA context.
class ExecScope {
 public:
  explicit ExecScope(const ExecContext& ctx);
  ~ExecScope();
  ExecScope(const ExecScope&) = delete;
  ExecScope& operator=(const ExecScope&) = delete;
  cudaStream_t stream() const { return stream_; }

 private:
  int prev_device_ = -1;
  cudaStream_t stream_;
  StreamGuard guard_;
};

}  // namespace lstm::cuda
