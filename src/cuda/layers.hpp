// GPU kernels of the non-LSTM layers and of the softmax cross-entropy loss (internal; CUDA
// builds only). The GPU counterparts of src/cpu/ops.hpp, in F32.
//
// Every function issues its work on the engine stream (cuda::stream()) and returns without
// waiting for the GPU; pointers are device pointers unless a name says host. "Rows" are the
// N = T*B (sequence, [T, B, F] row-major) or B (vector) feature vectors of an activation.
// `lengths` (int32 [B] on the device) marks padded rows: row r = t*B + b is padded when
// t >= lengths[b]; null means no padded row. Functions named *_add accumulate into their
// output; all others overwrite it. Launch errors throw through LSTM_CUDA_CHECK_LAUNCH.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lstm/device.hpp"

namespace lstm::cuda {

// Copies `bytes` from host memory `src` to device memory `dst` on the engine stream without
// waiting for the GPU: the bytes go through a small ring of pinned staging buffers, so `src`
// may be reused as soon as this returns. The host blocks only when the GPU is so far behind
// that the ring's oldest copy has not run yet (back-pressure, not a per-call sync).
void upload_async(void* dst, const void* src, size_t bytes);

// A rows description: `rows` feature vectors of `features` values; `batch` and `lengths` say
// which rows are padded (lengths null: none; batch is then unused).
struct Rows {
  int64_t rows = 0;
  int64_t features = 0;
  int64_t batch = 1;
  const int32_t* lengths = nullptr;
};

// x[r, :] = 0 for every padded row r (in place; other rows are not touched).
void zero_padded_rows(float* x, const Rows& shape);
// dst = src with padded rows zero (dst may not alias src).
void copy_zero_padded(const float* src, float* dst, const Rows& shape);

// out[r, :] = table[ids[r], :], a zero row where ids[r] < 0 (padded positions). ids int32 [n],
// checked against the table size by the caller.
void embedding_gather(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim);
// dtable[ids[r], :] += dy[r, :] for every r with ids[r] >= 0 and ids[r] != padding_idx
// (-1: none), with atomicAdd (the order of additions into one row is not fixed).
void embedding_scatter_add(const int32_t* ids, const float* dy, float* dtable, int64_t n, int64_t dim,
                           int64_t padding_idx);

// Inverted dropout as a pure function of (seed, element index): dst[i] = src[i] * mask(i) with
// mask(i) = 0 with probability p, else 1/(1-p); p >= 1 drops everything. The same call gives
// the forward (src = x) and the backward (src = dy) since the mask is recomputed from the seed.
// apply_mask false: dst = src (only the padded rows are zeroed). Padded rows of dst are zero.
void dropout_apply(const float* src, float* dst, const Rows& shape, double p, uint64_t seed, bool apply_mask);

enum class ActFn { Relu, Tanh, Sigmoid };
// y = fn(x), padded rows zero.
void activation_forward(ActFn fn, const float* x, float* y, const Rows& shape);
// dx = fn'(from the forward's output y) * dy (relu: dy where y > 0), padded rows zero.
void activation_backward(ActFn fn, const float* y, const float* dy, float* dx, const Rows& shape);

// x [steps, batch, f] -> y [batch, f] at each sequence's last valid step (lengths null: steps-1).
void last_step_gather(const float* x, const int32_t* lengths, float* y, int64_t steps, int64_t batch, int64_t f);
// The adjoint: dx [steps, batch, f] = 0 except dx[lengths[b]-1, b, :] = dy[b, :].
void last_step_scatter(const float* dy, const int32_t* lengths, float* dx, int64_t steps, int64_t batch,
                       int64_t f);

// dst[i] += src[i] for i < n.
void add_inplace(float* dst, const float* src, int64_t n);
// y[r, :] = b for r < rows (y [rows, cols]).
void broadcast_rows(const float* b, float* y, int64_t rows, int64_t cols);
// x[i] = v for i < n.
void fill_f32(float* x, float v, int64_t n);

// ---- Dense through cuBLASLt (dense.cpp) -------------------------------------------------------
// Matrix products use the compute type of `precision`: f32 -> CUBLAS_COMPUTE_32F (no TF32),
// tf32 -> _FAST_TF32, bf16 -> _FAST_16BF, f16 -> _FAST_16F; storage stays F32.

// y[n, out] = x[n, in] * w[out, in]^T + b[out] (b null: no bias), the bias fused in the epilogue.
void dense_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in, int64_t out,
                   Precision precision);
// Given dy[n, out]: dx[n, in] = dy * w (skipped when dx is null), dw[out, in] += dy^T * x,
// db[out] += column sums of dy (skipped when db is null; fused into the dw product when
// cuBLASLt supports it for the shape).
void dense_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t n,
                    int64_t in, int64_t out, Precision precision);

// How the epilogues went, counted per call on this thread (tests and benchmarks read it): a
// fused call ran the bias (or bias gradient) inside the cuBLASLt product; an unfused one used
// the fallback (broadcast + accumulate, or a product with a ones vector).
struct DenseEpilogueStats {
  int64_t bias_fused = 0, bias_unfused = 0;
  int64_t bgrad_fused = 0, bgrad_unfused = 0;
};
DenseEpilogueStats dense_epilogue_stats();
// Forces the fallbacks (tests use it to cover both paths on a GPU where fusion works).
void dense_force_unfused(bool on);

// ---- Softmax cross-entropy (loss.cu) ----------------------------------------------------------
// One pass per row of logits [n, c]: max, log-sum-exp, loss, argmax and the gradient
// (softmax - onehot) / count into grad [n, c] (zero rows where not counted); then a fixed-order
// reduction writes stats (F64 [3]: mean loss, count, correct). Nothing is synchronised.
// Targets come in one of two forms:
//   host_targets (int32 [n] on the device, already resolved on the host: a class index, or -1
//     for a row not counted) with host_count their number of counted rows; or
//   dev_targets (I64 [n] on the device, raw) with ignore_index and an optional host mask
//     (uint8 [n] on the host, 0 = not counted; null = all rows); the count is then computed on
//     the device first. A counted target outside [0, c) cannot throw there: it makes its row's
//     loss and gradient NaN (so the mean loss is NaN and a guarded optimizer step skips).
void softmax_cross_entropy(const float* logits, float* grad, double* stats, int64_t n, int64_t c,
                           const int32_t* host_targets, int64_t host_count, const int64_t* dev_targets,
                           const uint8_t* host_mask, int64_t ignore_index);

}  // namespace lstm::cuda
