// ExecScope and the GPU side of ExecContext::current.
#include "cuda/exec.hpp"

namespace lstm::cuda {

ExecContext current_context() {
  ExecContext c;
  c.device = Device::CUDA;
  LSTM_CUDA_CHECK(cudaGetDevice(&c.device_index));
  c.stream = static_cast<void*>(cuda::stream());
  return c;
}

namespace {
int switch_device(const ExecContext& ctx) {
  LSTM_REQUIRE(ctx.device == Device::CUDA, "a GPU backend's call needs a " << device_name(Device::CUDA)
                                                                          << " execution context, got a "
                                                                          << device_name(ctx.device) << " one");
  int cur = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur == ctx.device_index) return -1;
  LSTM_CUDA_CHECK(cudaSetDevice(ctx.device_index));
  return cur;
}
}  // namespace

ExecScope::ExecScope(const ExecContext& ctx)
    : prev_device_(switch_device(ctx)), stream_(stream_of(ctx)), guard_(stream_of(ctx)) {}

ExecScope::~ExecScope() {
  if (prev_device_ >= 0) cudaSetDevice(prev_device_);
}

}  // namespace lstm::cuda
