#include "cpu/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/blas.hpp"

namespace lstm::cpu {

namespace {
// Below this many elements a parallel region costs more than the loop it would split.
constexpr int64_t kParallelMin = 1 << 15;
// Columns per task in the column-blocked reductions: each task owns its columns, so sums need
// no atomics and come out the same for any thread count.
constexpr int64_t kColBlock = 64;
}  // namespace

template <class T>
void dense_forward(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out) {
  if (n == 0 || out == 0) return;
  if (b) {
#pragma omp parallel for if (n * out >= kParallelMin)
    for (int64_t r = 0; r < n; ++r) std::memcpy(y + r * out, b, static_cast<size_t>(out) * sizeof(T));
  }
  gemm(false, true, n, out, in, T(1), x, in, w, in, b ? T(1) : T(0), y, out);
}

template <class T>
void dense_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t n, int64_t in,
                    int64_t out) {
  if (dx) gemm(false, false, n, in, out, T(1), dy, out, w, in, T(0), dx, in);
  if (n == 0) return;
  gemm(true, false, out, in, n, T(1), dy, out, x, in, T(1), dw, in);
  if (db) {
    const int64_t blocks = (out + kColBlock - 1) / kColBlock;
#pragma omp parallel for if (n * out >= kParallelMin)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kColBlock, j1 = std::min(out, j0 + kColBlock);
      for (int64_t r = 0; r < n; ++r) {
        const T* row = dy + r * out;
        for (int64_t j = j0; j < j1; ++j) db[j] += row[j];
      }
    }
  }
}

template <class T>
void embedding_gather(const int64_t* ids, const T* table, T* out, int64_t n, int64_t dim) {
#pragma omp parallel for if (n * dim >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    T* dst = out + r * dim;
    if (ids[r] < 0)
      std::fill(dst, dst + dim, T(0));
    else
      std::memcpy(dst, table + ids[r] * dim, static_cast<size_t>(dim) * sizeof(T));
  }
}

template <class T>
void embedding_scatter_add(const int64_t* ids, const T* dy, T* dtable, int64_t n, int64_t dim,
                           int64_t padding_idx) {
  // Several rows may share an id, so tasks split the columns, not the rows.
  const int64_t blocks = (dim + kColBlock - 1) / kColBlock;
#pragma omp parallel for if (n * dim >= kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kColBlock, j1 = std::min(dim, j0 + kColBlock);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t id = ids[r];
      if (id < 0 || id == padding_idx) continue;
      const T* src = dy + r * dim;
      T* dst = dtable + id * dim;
      for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
    }
  }
}

template <class T>
void dropout_mask(Rng& rng, T* mask, int64_t n, double p) {
  if (p >= 1.0) {
    std::fill(mask, mask + n, T(0));
    return;
  }
  const T scale = T(1) / (T(1) - static_cast<T>(p));
  for (int64_t i = 0; i < n; ++i) mask[i] = rng.uniform() < p ? T(0) : scale;
}

template <class T>
void mul(const T* x, const T* mask, T* y, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

template <class T>
void relu_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

template <class T>
void tanh_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

template <class T>
void tanh_backward(const T* y, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (T(1) - y[i] * y[i]);
}

template <class T>
void sigmoid_forward(const T* x, T* y, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // exp of a non-positive number only: no overflow, and 1 - y keeps its precision for x < 0.
    const T e = std::exp(-std::abs(x[i]));
    y[i] = x[i] >= T(0) ? T(1) / (T(1) + e) : e / (T(1) + e);
  }
}

template <class T>
void sigmoid_backward(const T* y, const T* dy, T* dx, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
}

template <class T>
void zero_past_lengths(T* x, const int64_t* lengths, int64_t steps, int64_t batch, int64_t f) {
  if (!lengths) return;
#pragma omp parallel for if (steps * batch * f >= kParallelMin)
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t b = 0; b < batch; ++b)
      if (t >= lengths[b]) std::fill(x + (t * batch + b) * f, x + (t * batch + b + 1) * f, T(0));
}

template <class T>
void last_step_gather(const T* x, const int64_t* lengths, T* y, int64_t steps, int64_t batch, int64_t f) {
#pragma omp parallel for if (batch * f >= kParallelMin)
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t t = (lengths ? lengths[b] : steps) - 1;
    std::memcpy(y + b * f, x + (t * batch + b) * f, static_cast<size_t>(f) * sizeof(T));
  }
}

template <class T>
void last_step_scatter(const T* dy, const int64_t* lengths, T* dx, int64_t steps, int64_t batch,
                       int64_t f) {
  const int64_t total = steps * batch * f;
#pragma omp parallel for simd if (total >= kParallelMin)
  for (int64_t i = 0; i < total; ++i) dx[i] = T(0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t t = (lengths ? lengths[b] : steps) - 1;
    std::memcpy(dx + (t * batch + b) * f, dy + b * f, static_cast<size_t>(f) * sizeof(T));
  }
}

#define LSTM_INSTANTIATE_OPS(T)                                                                       \
  template void dense_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t);        \
  template void dense_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t,        \
                                  int64_t);                                                           \
  template void embedding_gather<T>(const int64_t*, const T*, T*, int64_t, int64_t);                  \
  template void embedding_scatter_add<T>(const int64_t*, const T*, T*, int64_t, int64_t, int64_t);    \
  template void dropout_mask<T>(Rng&, T*, int64_t, double);                                           \
  template void mul<T>(const T*, const T*, T*, int64_t);                                              \
  template void relu_forward<T>(const T*, T*, int64_t);                                               \
  template void relu_backward<T>(const T*, const T*, T*, int64_t);                                    \
  template void tanh_forward<T>(const T*, T*, int64_t);                                               \
  template void tanh_backward<T>(const T*, const T*, T*, int64_t);                                    \
  template void sigmoid_forward<T>(const T*, T*, int64_t);                                            \
  template void sigmoid_backward<T>(const T*, const T*, T*, int64_t);                                 \
  template void zero_past_lengths<T>(T*, const int64_t*, int64_t, int64_t, int64_t);                  \
  template void last_step_gather<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);         \
  template void last_step_scatter<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t);

LSTM_INSTANTIATE_OPS(float)
LSTM_INSTANTIATE_OPS(double)
#undef LSTM_INSTANTIATE_OPS

}  // namespace lstm::cpu
