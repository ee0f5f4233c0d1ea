// ExecScope: an ExecContext made current for one backend call (see exec.hpp).
#if LSTM_HAVE_CUDA
#include "cuda/exec.hpp"

namespace lstm::cuda {

namespace {
// Runs in the member initialiser list, before the StreamGuard: the guard may create the thread's
// stream on first use, which must happen on ctx's device.
int enter_device(const ExecContext& ctx) {
  LSTM_REQUIRE(ctx.device == Device::CUDA,
               "a CUDA backend call got an execution context on " << device_name(ctx.device) << ", expected cuda");
  int prev = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != ctx.device_index) LSTM_CUDA_CHECK(cudaSetDevice(ctx.device_index));
  return prev;
}
// ExecContext's null stream is the legacy default stream. Said explicitly, because a null engine
// stream would make cuda::stream() pick the thread's own stream instead (LSTM_CUDA_STREAM=own).
cudaStream_t engine_stream_of(const ExecContext& ctx) { return ctx.stream ? stream_of(ctx) : cudaStreamLegacy; }
}  // namespace

ExecScope::ExecScope(const ExecContext& ctx)
    : prev_device_(enter_device(ctx)), stream_(engine_stream_of(ctx)), guard_(engine_stream_of(ctx)) {}

ExecScope::~ExecScope() {
  int cur = prev_device_;
  // A destructor must not throw; a failing cudaGetDevice leaves the device as it is.
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_device_) (void)cudaSetDevice(prev_device_);
}

}  // namespace lstm::cuda
#endif  // LSTM_HAVE_CUDA
