// The "fused" LSTM backend (Algo::Fused): our own pointwise kernels around cuBLAS GEMMs, one
// recurrent GEMM and one fused cell kernel per step, the input projection of a layer as one GEMM,
// the two directions of a layer on two streams and, for unidirectional stacks, a wavefront
// across layers. docs/KERNELS.md describes the schedule, what is saved and the limits.
// Internal; the header is CUDA-free so that the registry can include it in any build, the
// definitions exist in CUDA builds only.
#pragma once

#include <memory>
#include <string>

#include "lstm/lstm.hpp"

namespace lstm::cuda {

// "" when make_fused_lstm_backend can build an instance for spec/dtype/device, otherwise why not
// (host-side checks only). Runs F32 (TF32 with LstmOptions::allow_tf32), BF16 and F16 on CUDA.
std::string fused_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device);

// A new fused backend instance. Streams, events and cuBLAS handles are created on the first call
// (on that call's device) and owned by the instance. Throws with fused_lstm_unsupported's reason.
std::unique_ptr<LstmBackend> make_fused_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options);

// The persistent backend (Algo::Persistent): the fused backend with each layer's recurrence run by
// one persistent kernel that keeps its W_hh slices in shared memory (src/cuda/lstm_persistent.cuh);
// the backward is the fused backend's. "" when it can run spec/dtype/device at batch 1, otherwise
// why not: the limits come from the current CUDA device's properties (SMs, shared memory per
// block), so without a usable GPU it says so. Larger batches are checked per call (up to 32 rows).
std::string persistent_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device);
std::unique_ptr<LstmBackend> make_persistent_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                          const LstmOptions& options);

}  // namespace lstm::cuda
