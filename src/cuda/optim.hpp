// Fused multi-tensor optimizer, gradient-norm and clipping kernels (internal; CUDA builds only).
//
// Every kernel here covers all tensors of a step in one launch: the host describes the tensors
// in a table (MtTable) that lives on the device and is uploaded only when the set of pointers
// changes, and each block walks fixed-size chunks of that table. Everything runs on the engine
// stream; nothing here synchronises with the host. All tensors are F32 (the GPU keeps master
// weights, gradients and optimizer state in F32).
#pragma once

#include <cstdint>
#include <vector>

#include "core/cuda_rt.hpp"

namespace lstm::cuda {

// Elements per chunk of a multi-tensor launch. A multiple of 4 so that a chunk of a 16-byte
// aligned tensor starts 16-byte aligned; large enough that small per-chunk work (reading the
// step counter, the bias corrections) is negligible, small enough to spread a big tensor over
// every SM.
constexpr int64_t kMtChunk = int64_t{1} << 14;

// One tensor of a multi-tensor launch. Pointers a kernel does not use are null.
struct MtTensor {
  float* value = nullptr;
  float* grad = nullptr;
  float* s1 = nullptr;  // SGD momentum_buffer, Adam exp_avg
  float* s2 = nullptr;  // Adam exp_avg_sq
  // The param's step counter on the device, a tagged word: (launch id << 32) | count. See
  // optim.cu (advance_step) for why the launch id is in the word.
  unsigned long long* step = nullptr;
  int64_t numel = 0;
  int32_t vec4 = 0;  // every used pointer is 16-byte aligned: float4 loads and stores
  int32_t pad = 0;

  bool operator==(const MtTensor&) const = default;
};

// A chunk: elements [index * kMtChunk, min(numel, (index + 1) * kMtChunk)) of tensor `tensor`.
struct MtChunk {
  uint32_t tensor;
  uint32_t index;
};

// The device copy of a list of MtTensor plus its chunk list, cached: set() uploads only when the
// list differs from the one already on the device (or the engine stream changed, since arena
// blocks belong to a stream). The upload is one cudaMemcpyAsync from host memory.
class MtTable {
 public:
  // `tensors` must not contain empty tensors (numel 0); set vec4 with mt_aligned().
  void set(const std::vector<MtTensor>& tensors);
  const MtTensor* tensors() const { return dev_.as<const MtTensor>(); }
  const MtChunk* chunks() const { return reinterpret_cast<const MtChunk*>(dev_.as<const char>() + chunk_offset_); }
  int64_t num_tensors() const { return static_cast<int64_t>(host_.size()); }
  int64_t num_chunks() const { return num_chunks_; }
  // Scratch for one double per chunk (the norm's partial sums); valid until the next set().
  double* partials();

 private:
  std::vector<MtTensor> host_;
  cudaStream_t stream_ = nullptr;
  bool valid_ = false;
  int64_t num_chunks_ = 0;
  size_t chunk_offset_ = 0;
  DeviceBuffer dev_;
  DeviceBuffer partials_;
};

// True when every non-null pointer of t is 16-byte aligned (views may start anywhere).
int32_t mt_aligned(const MtTensor& t);

// A scalar the kernels read on the device: null (treated as finite), or one F32/F64 value.
struct DeviceScalar {
  const void* ptr = nullptr;
  bool f64 = false;
};

// torch.optim.SGD on every tensor of `table` (value, grad, s1 = momentum buffer when momentum is
// used, step = counter used only to recognise a param's first step). Scalars are already rounded
// to F32 by the caller exactly as the CPU optimizer rounds them.
struct SgdArgs {
  float lr, momentum, weight_decay;
  bool decay, use_momentum, nesterov;
};
// Adam / AdamW. The bias corrections come from each param's device step counter: the F32
// scalars are the CPU optimizer's, and lr, beta1, beta2 are the doubles it starts from.
struct AdamArgs {
  float b1, one_minus_b1, b2, one_minus_b2, eps, weight_decay, keep;
  bool l2, shrink;
  double lr, beta1, beta2;
};

// When `guard` is non-finite the launch changes nothing and the step counters keep their
// count; otherwise every param's counter advances by one. `launch` is the optimizer's launch id:
// unique among the launches that touch these counters, never 0.
void sgd_step(const MtTable& table, const SgdArgs& args, DeviceScalar guard, uint32_t launch);
void adam_step(const MtTable& table, const AdamArgs& args, DeviceScalar guard, uint32_t launch);

// sqrt(sum of grad^2) over the grads of `table` (MtTensor::grad), accumulated in double with a
// fixed reduction order (per-chunk partials, then one block), so the result does not depend on
// scheduling. Writes out_f32[0], and out_f64[0] when not null. NaN/Inf propagate.
void grad_norm(MtTable& table, float* out_f32, double* out_f64);
// Scales every grad of `table` by min(1, max_norm / (norm + 1e-6)) (torch clip_grad_norm_),
// reading `norm` on the device: a coefficient >= 1 leaves the grads untouched; a NaN norm makes
// every grad NaN, an infinite one makes finite grads 0.
void clip_grads(const MtTable& table, double max_norm, DeviceScalar norm);

// The calling thread's table for the free functions (grad_norm_tensor, clip_grad_norm_with):
// both describe the same grads, so one cached table serves the pair.
MtTable& grad_table();

}  // namespace lstm::cuda
