// Reference CPU kernels for the non-LSTM layers (forward and backward). Internal to the library.
//
// All arrays are dense and row-major; T is float or double. "Rows" are the N = T*B (sequence)
// or B (vector) feature vectors a layer maps independently. Functions named *_add accumulate
// into their output; every other function overwrites it. Nothing here allocates.
#pragma once

#include <cstdint>

#include "lstm/rng.hpp"

namespace lstm::cpu {

// y[n, out] = x[n, in] * w[out, in]^T + b[out]; b may be null (no bias).
template <class T>
void dense_forward(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out);

// Given dy[n, out]: dx[n, in] = dy * w (skipped when dx is null), dw[out, in] += dy^T * x,
// db[out] += column sums of dy (skipped when db is null).
template <class T>
void dense_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t n, int64_t in,
                    int64_t out);

// out[r, :] = table[ids[r], :] for r < n; a negative id gives a zero row (a padded position).
// Ids must already be checked against the table size.
template <class T>
void embedding_gather(const int64_t* ids, const T* table, T* out, int64_t n, int64_t dim);

// dtable[ids[r], :] += dy[r, :] for every r with ids[r] >= 0 and ids[r] != padding_idx
// (pass -1 for no padding index). Deterministic: rows are added in order.
template <class T>
void embedding_scatter_add(const int64_t* ids, const T* dy, T* dtable, int64_t n, int64_t dim,
                           int64_t padding_idx);

// Fills mask[n] with 0 (dropped, probability p) or 1/(1-p), drawing one uniform per element in
// order, so a seed gives the same mask whatever the thread count. p == 1 drops everything.
template <class T>
void dropout_mask(Rng& rng, T* mask, int64_t n, double p);

// y[i] = x[i] * mask[i]; also the backward (dx = dy * mask).
template <class T>
void mul(const T* x, const T* mask, T* y, int64_t n);

template <class T>
void relu_forward(const T* x, T* y, int64_t n);
// dx = dy where the forward's output y > 0, else 0 (PyTorch's threshold_backward).
template <class T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n);

template <class T>
void tanh_forward(const T* x, T* y, int64_t n);
// dx = dy * (1 - y^2), from the forward's output y.
template <class T>
void tanh_backward(const T* y, const T* dy, T* dx, int64_t n);

// y = 1 / (1 + exp(-x)), computed without overflow for large |x|.
template <class T>
void sigmoid_forward(const T* x, T* y, int64_t n);
// dx = dy * y * (1 - y), from the forward's output y.
template <class T>
void sigmoid_backward(const T* y, const T* dy, T* dx, int64_t n);

// x is [steps, batch, f]; zeroes x[t, b, :] for t >= lengths[b]. lengths == null: nothing to do.
template <class T>
void zero_past_lengths(T* x, const int64_t* lengths, int64_t steps, int64_t batch, int64_t f);

// y[b, :] = x[lengths[b] - 1, b, :] (x [steps, batch, f]; lengths == null: the last step).
template <class T>
void last_step_gather(const T* x, const int64_t* lengths, T* y, int64_t steps, int64_t batch, int64_t f);

// The adjoint of last_step_gather: dx = 0 except dx[lengths[b] - 1, b, :] = dy[b, :].
template <class T>
void last_step_scatter(const T* dy, const int64_t* lengths, T* dx, int64_t steps, int64_t batch,
                       int64_t f);

}  // namespace lstm::cpu
