// Device discovery and precision names; CPU-only builds answer "no CUDA" here.
#include "lstm/device.hpp"

#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#endif

namespace lstm {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::F64: return "f64";
    case Precision::F32: return "f32";
    case Precision::TF32: return "tf32";
    case Precision::BF16: return "bf16";
    case Precision::F16: return "f16";
  }
  return "?";
}

Precision precision_from_name(const std::string& n) {
  for (Precision p : {Precision::F64, Precision::F32, Precision::TF32, Precision::BF16, Precision::F16})
    if (n == precision_name(p)) return p;
  // The benchmark suites spell them fp32/fp16.
  if (n == "fp64") return Precision::F64;
  if (n == "fp32") return Precision::F32;
  if (n == "fp16") return Precision::F16;
  LSTM_THROW("unknown precision '" << n << "': expected one of f64, f32, tf32, bf16, f16");
}

DType precision_dtype(Precision p) {
  switch (p) {
    case Precision::F64: return DType::F64;
    case Precision::F32:
    case Precision::TF32: return DType::F32;
    case Precision::BF16: return DType::BF16;
    case Precision::F16: return DType::F16;
  }
  return DType::F32;
}

#if LSTM_HAVE_CUDA

namespace {
const std::string& probe() {
  static const std::string reason = [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return std::string("no usable CUDA driver or GPU (cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
             cudaGetErrorString(e) + ")";
    }
    if (n == 0) return std::string("no CUDA GPU found (cudaGetDeviceCount returned 0)");
    return std::string();
  }();
  return reason;
}
}  // namespace

bool cuda_available() { return probe().empty(); }
std::string cuda_unavailable_reason() { return probe(); }

std::vector<GpuInfo> cuda_devices() {
  std::vector<GpuInfo> r;
  if (!cuda_available()) return r;
  int n = 0;
  LSTM_CUDA_CHECK(cudaGetDeviceCount(&n));
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p;
    LSTM_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sms = p.multiProcessorCount;
    g.memory_bytes = p.totalGlobalMem;
    int clock_khz = 0, mem_khz = 0, bus = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, i);
    cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, i);
    cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, i);
    g.clock_ghz = clock_khz / 1e6;
    g.memory_bandwidth_gbs = 2.0 * mem_khz * 1e3 * (bus / 8.0) / 1e9;
    r.push_back(g);
  }
  return r;
}

void cuda_synchronize() {
  if (!cuda_available()) return;
  LSTM_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
}

#else

bool cuda_available() { return false; }
std::string cuda_unavailable_reason() {
  return "this build has no CUDA (configure with -DLSTM_CUDA=ON on a machine with nvcc)";
}
std::vector<GpuInfo> cuda_devices() { return {}; }
void cuda_synchronize() {}
ArenaStats arena_stats() { return {}; }
void arena_reset_peak() {}
void arena_release_cached() {}

#endif

void require_cuda(const std::string& what) {
  LSTM_REQUIRE(cuda_available(), what << " needs a CUDA GPU: " << cuda_unavailable_reason());
}

}  // namespace lstm
