// Devices: which GPUs this build and machine can use, compute precisions, and the device
// memory arena's statistics.
//
// Every GPU operation of the engine runs on one CUDA stream per host thread (the "engine
// stream", created on first use); results are ordered on that stream and only the calls that
// return host values (Tensor::to_device(Device::CPU), LossResult::resolve(), ...) synchronise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lstm/tensor.hpp"

namespace lstm {

// True when this binary was built with CUDA (LSTM_CUDA=ON) and a GPU with a working driver is
// present. Never throws.
bool cuda_available();
// "" when cuda_available(); otherwise why not, e.g. "built without CUDA (LSTM_CUDA=OFF)" or
// "no CUDA driver or GPU: cudaGetDeviceCount: CUDA driver version is insufficient ...".
std::string cuda_unavailable_reason();
// Throws lstm::Error with cuda_unavailable_reason() unless cuda_available().
void require_cuda(const std::string& what);

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  size_t memory_bytes = 0;
  double clock_ghz = 0;
  double memory_bandwidth_gbs = 0;  // theoretical, from the memory clock and bus width
};
// Empty when !cuda_available().
std::vector<GpuInfo> cuda_devices();
// e.g. "driver 13.0, runtime 13.0, cuBLAS 13.1.0, cuDNN 9.19.0"; "" without CUDA.
std::string cuda_versions();
// This build of the engine: its version and, when built from a git checkout, the commit, e.g.
// "0.1.0 (622114e)" ("+dirty" after the commit when the tree had uncommitted changes).
std::string engine_build();
// Waits for the engine stream of this thread.
void cuda_synchronize();

// Compute precision: storage dtype of activations/weights inside the GPU kernels and what the
// matrix units may use. Parameters (master weights) and optimizer state stay F32; F64 exists
// on the CPU only.
//   f64  : double everywhere (CPU reference)
//   f32  : fp32 FMA math, no tensor-core conversion
//   tf32 : fp32 storage, matrix products on TF32 tensor cores (torch allow_tf32)
//   bf16 / f16 : LSTM runs with bf16/f16 inputs, weights and outputs, fp32 accumulation and
//          fp32 cell state; dense layers use fp32 storage with bf16/f16 matrix products.
enum class Precision : uint8_t { F64, F32, TF32, BF16, F16 };
const char* precision_name(Precision p);                 // "f64", "f32", "tf32", "bf16", "f16"
Precision precision_from_name(const std::string& name);  // throws naming the accepted names
// The dtype tensors have at this precision inside the LSTM: F64, F32, F32, BF16, F16.
DType precision_dtype(Precision p);

// The caching device-memory arena every CUDA tensor comes from. After the first step of a
// training or inference loop, steps are served from the cache and cudaMalloc is not called.
struct ArenaStats {
  size_t in_use_bytes = 0;     // held by live tensors
  size_t reserved_bytes = 0;   // obtained from cudaMalloc (in use + cached)
  size_t peak_in_use_bytes = 0;
  int64_t device_mallocs = 0;  // cudaMalloc calls so far
  int64_t allocations = 0;     // arena allocations so far
};
ArenaStats arena_stats();
void arena_reset_peak();
// Returns cached (unused) blocks to the driver.
void arena_release_cached();

}  // namespace lstm
