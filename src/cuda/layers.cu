// GPU kernels of the non-LSTM layers (cuda/layers.hpp says what each computes).
//
// Most kernels walk rows: a block is 32 lanes x 8 rows, each warp owns one row at a time and
// its lanes stride over the row's features (float4 when the row length and the pointers allow
// it). Whether a row is padded is then decided once per row, not once per element, and reads
// and writes stay coalesced.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstring>

#include "core/cuda_rt.hpp"
#include "cuda/layers.hpp"

namespace lstm::cuda {

// ---- host -> device staging ---------------------------------------------------------------------

namespace {

// A ring of pinned buffers, each with the event recorded after the copy that last read it.
// Pageable cudaMemcpyAsync may stage through the driver and wait for the stream; pinned
// memory lets the copy be truly asynchronous, and the event says when a slot may be rewritten.
struct StagingRing {
  static constexpr int kSlots = 32;
  struct Slot {
    void* host = nullptr;
    size_t cap = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  std::array<Slot, kSlots> slots;
  int next = 0;

  // Freed only at normal thread exit (like the cuBLAS handles): errors then are ignored.
  ~StagingRing() {
    for (Slot& s : slots) {
      if (s.done) {
        cudaEventSynchronize(s.done);
        cudaEventDestroy(s.done);
      }
      if (s.host) cudaFreeHost(s.host);
    }
  }

  Slot& acquire(size_t bytes) {
    Slot& s = slots[static_cast<size_t>(next)];
    next = (next + 1) % kSlots;
    if (!s.done) LSTM_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    if (s.pending) {
      LSTM_CUDA_CHECK(cudaEventSynchronize(s.done));
      s.pending = false;
    }
    if (s.cap < bytes) {
      if (s.host) LSTM_CUDA_CHECK(cudaFreeHost(s.host));
      s.host = nullptr;
      s.cap = 0;
      size_t cap = 256;
      while (cap < bytes) cap *= 2;
      LSTM_CUDA_CHECK(cudaMallocHost(&s.host, cap));
      s.cap = cap;
    }
    return s;
  }
};

thread_local StagingRing t_ring;

}  // namespace

void upload_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  StagingRing::Slot& s = t_ring.acquire(bytes);
  std::memcpy(s.host, src, bytes);
  LSTM_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream()));
  LSTM_CUDA_CHECK(cudaEventRecord(s.done, stream()));
  s.pending = true;
}

// ---- kernels ------------------------------------------------------------------------------------

namespace {

constexpr int kLanes = 32;
constexpr int kRowsPerBlock = 8;

dim3 row_block() { return dim3(kLanes, kRowsPerBlock); }
unsigned row_grid(int64_t rows) { return grid_for(rows, kRowsPerBlock); }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ bool is_padded(int64_t r, int64_t batch, const int32_t* __restrict__ len) {
  if (!len) return false;
  const int64_t t = r / batch;
  return t >= len[r - t * batch];
}

__device__ __forceinline__ int64_t first_row() { return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t row_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.y; }

// out[r, j] = op(a[r, j], b[r, j], flat index, j), or 0 in a padded row. a or b may be null
// (then 0 is passed). Element-wise ops of the layers are all this kernel with another Op.
template <class Op, bool kVec>
__global__ void map_rows_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                                int64_t rows, int64_t f, int64_t batch, const int32_t* __restrict__ len, Op op) {
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const bool pad = is_padded(r, batch, len);
    const int64_t base = r * f;
    if constexpr (kVec) {
      const int64_t fv = f / 4;
      for (int64_t j = threadIdx.x; j < fv; j += blockDim.x) {
        const int64_t i = base + 4 * j;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        if (!pad) {
          const float4 av = a ? *reinterpret_cast<const float4*>(a + i) : o;
          const float4 bv = b ? *reinterpret_cast<const float4*>(b + i) : o;
          o.x = op(av.x, bv.x, i, 4 * j);
          o.y = op(av.y, bv.y, i + 1, 4 * j + 1);
          o.z = op(av.z, bv.z, i + 2, 4 * j + 2);
          o.w = op(av.w, bv.w, i + 3, 4 * j + 3);
        }
        *reinterpret_cast<float4*>(out + i) = o;
      }
    } else {
      for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
        const int64_t i = base + j;
        out[i] = pad ? 0.f : op(a ? a[i] : 0.f, b ? b[i] : 0.f, i, j);
      }
    }
  }
}

template <class Op>
void map_rows(const float* a, const float* b, float* out, const Rows& s, Op op) {
  if (s.rows <= 0 || s.features <= 0) return;
  const bool vec = s.features % 4 == 0 && aligned16(out) && (!a || aligned16(a)) && (!b || aligned16(b));
  const int64_t batch = s.batch > 0 ? s.batch : 1;
  if (vec)
    map_rows_kernel<Op, true><<<row_grid(s.rows), row_block(), 0, stream()>>>(a, b, out, s.rows, s.features, batch,
                                                                              s.lengths, op);
  else
    map_rows_kernel<Op, false><<<row_grid(s.rows), row_block(), 0, stream()>>>(a, b, out, s.rows, s.features, batch,
                                                                               s.lengths, op);
  LSTM_CUDA_CHECK_LAUNCH();
}

struct CopyOp {
  __device__ float operator()(float a, float, int64_t, int64_t) const { return a; }
};
struct ReluFwdOp {
  __device__ float operator()(float x, float, int64_t, int64_t) const { return x > 0.f ? x : 0.f; }
};
struct TanhFwdOp {
  __device__ float operator()(float x, float, int64_t, int64_t) const { return tanhf(x); }
};
// PyTorch's threshold_backward: the gradient passes where the output is positive.
struct ReluBwdOp {
  __device__ float operator()(float y, float dy, int64_t, int64_t) const { return y > 0.f ? dy : 0.f; }
};
struct TanhBwdOp {
  __device__ float operator()(float y, float dy, int64_t, int64_t) const { return dy * (1.f - y * y); }
};
// exp of a non-positive number only, as the CPU reference computes it.
struct SigmoidFwdOp {
  __device__ float operator()(float x, float, int64_t, int64_t) const {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
  }
};
struct SigmoidBwdOp {
  __device__ float operator()(float y, float dy, int64_t, int64_t) const { return dy * y * (1.f - y); }
};
struct BiasOp {
  const float* bias;
  __device__ float operator()(float, float, int64_t, int64_t col) const { return bias[col]; }
};

// SplitMix64: a Weyl sequence through a strong 64-bit mixer; element i of a seed's stream is
// mix(seed + (i + 1) * gamma), so any element is computed on its own, in any order.
__device__ __forceinline__ uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Dropped when the top 32 bits of the hash fall below p * 2^32 (p = 1: threshold 2^32, always).
// A dropped element is multiplied by 0 rather than replaced, as x * mask does on the CPU.
struct DropoutOp {
  uint64_t seed;
  uint64_t threshold;
  float scale;
  __device__ float operator()(float x, float, int64_t i, int64_t) const {
    const bool drop = (splitmix64(seed, static_cast<uint64_t>(i)) >> 32) < threshold;
    return x * (drop ? 0.f : scale);
  }
};

template <bool kVec>
__global__ void zero_padded_kernel(float* __restrict__ x, int64_t rows, int64_t f, int64_t batch,
                                   const int32_t* __restrict__ len) {
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    if (!is_padded(r, batch, len)) continue;
    float* row = x + r * f;
    if constexpr (kVec) {
      for (int64_t j = threadIdx.x; j < f / 4; j += blockDim.x)
        reinterpret_cast<float4*>(row)[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int64_t j = threadIdx.x; j < f; j += blockDim.x) row[j] = 0.f;
    }
  }
}

template <bool kVec>
__global__ void embedding_gather_kernel(const int32_t* __restrict__ ids, const float* __restrict__ table,
                                        float* __restrict__ out, int64_t n, int64_t dim) {
  for (int64_t r = first_row(); r < n; r += row_stride()) {
    const int32_t id = ids[r];
    const float* src = id >= 0 ? table + static_cast<int64_t>(id) * dim : nullptr;
    float* dst = out + r * dim;
    if constexpr (kVec) {
      for (int64_t j = threadIdx.x; j < dim / 4; j += blockDim.x)
        reinterpret_cast<float4*>(dst)[j] =
            src ? reinterpret_cast<const float4*>(src)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src ? src[j] : 0.f;
    }
  }
}

__global__ void embedding_scatter_add_kernel(const int32_t* __restrict__ ids, const float* __restrict__ dy,
                                             float* __restrict__ dtable, int64_t n, int64_t dim,
                                             int64_t padding_idx) {
  for (int64_t r = first_row(); r < n; r += row_stride()) {
    const int32_t id = ids[r];
    if (id < 0 || id == padding_idx) continue;
    float* dst = dtable + static_cast<int64_t>(id) * dim;
    const float* src = dy + r * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(dst + j, src[j]);
  }
}

__device__ __forceinline__ int64_t last_step_of(int64_t b, int64_t steps, const int32_t* __restrict__ len) {
  return len ? static_cast<int64_t>(len[b]) - 1 : steps - 1;
}

__global__ void last_step_gather_kernel(const float* __restrict__ x, const int32_t* __restrict__ len,
                                        float* __restrict__ y, int64_t steps, int64_t batch, int64_t f) {
  for (int64_t b = first_row(); b < batch; b += row_stride()) {
    const float* src = x + (last_step_of(b, steps, len) * batch + b) * f;
    float* dst = y + b * f;
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x) dst[j] = src[j];
  }
}

__global__ void last_step_scatter_kernel(const float* __restrict__ dy, const int32_t* __restrict__ len,
                                         float* __restrict__ dx, int64_t steps, int64_t batch, int64_t f) {
  const int64_t rows = steps * batch;
  for (int64_t r = first_row(); r < rows; r += row_stride()) {
    const int64_t t = r / batch, b = r - t * batch;
    const float* src = t == last_step_of(b, steps, len) ? dy + b * f : nullptr;
    float* dst = dx + r * f;
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x) dst[j] = src ? src[j] : 0.f;
  }
}

__global__ void add_inplace_kernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void fill_f32_kernel(float* __restrict__ x, float v, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = v;
}

}  // namespace

void zero_padded_rows(float* x, const Rows& s) {
  if (!s.lengths || s.rows <= 0 || s.features <= 0) return;
  if (s.features % 4 == 0 && aligned16(x))
    zero_padded_kernel<true><<<row_grid(s.rows), row_block(), 0, stream()>>>(x, s.rows, s.features, s.batch, s.lengths);
  else
    zero_padded_kernel<false><<<row_grid(s.rows), row_block(), 0, stream()>>>(x, s.rows, s.features, s.batch,
                                                                              s.lengths);
  LSTM_CUDA_CHECK_LAUNCH();
}

void copy_zero_padded(const float* src, float* dst, const Rows& s) { map_rows(src, nullptr, dst, s, CopyOp{}); }

void embedding_gather(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim) {
  if (n <= 0 || dim <= 0) return;
  if (dim % 4 == 0 && aligned16(table) && aligned16(out))
    embedding_gather_kernel<true><<<row_grid(n), row_block(), 0, stream()>>>(ids, table, out, n, dim);
  else
    embedding_gather_kernel<false><<<row_grid(n), row_block(), 0, stream()>>>(ids, table, out, n, dim);
  LSTM_CUDA_CHECK_LAUNCH();
}

void embedding_scatter_add(const int32_t* ids, const float* dy, float* dtable, int64_t n, int64_t dim,
                           int64_t padding_idx) {
  if (n <= 0 || dim <= 0) return;
  embedding_scatter_add_kernel<<<row_grid(n), row_block(), 0, stream()>>>(ids, dy, dtable, n, dim, padding_idx);
  LSTM_CUDA_CHECK_LAUNCH();
}

void dropout_apply(const float* src, float* dst, const Rows& s, double p, uint64_t seed, bool apply_mask) {
  if (!apply_mask) {
    map_rows(src, nullptr, dst, s, CopyOp{});
    return;
  }
  DropoutOp op;
  op.seed = seed;
  const double scaled = p * 4294967296.0;  // p * 2^32
  op.threshold = p >= 1.0 ? (uint64_t(1) << 32) : static_cast<uint64_t>(std::llround(scaled));
  op.scale = p >= 1.0 ? 0.f : 1.f / (1.f - static_cast<float>(p));
  map_rows(src, nullptr, dst, s, op);
}

void activation_forward(ActFn fn, const float* x, float* y, const Rows& s) {
  if (fn == ActFn::Relu)
    map_rows(x, nullptr, y, s, ReluFwdOp{});
  else if (fn == ActFn::Sigmoid)
    map_rows(x, nullptr, y, s, SigmoidFwdOp{});
  else
    map_rows(x, nullptr, y, s, TanhFwdOp{});
}

void activation_backward(ActFn fn, const float* y, const float* dy, float* dx, const Rows& s) {
  if (fn == ActFn::Relu)
    map_rows(y, dy, dx, s, ReluBwdOp{});
  else if (fn == ActFn::Sigmoid)
    map_rows(y, dy, dx, s, SigmoidBwdOp{});
  else
    map_rows(y, dy, dx, s, TanhBwdOp{});
}

void last_step_gather(const float* x, const int32_t* lengths, float* y, int64_t steps, int64_t batch, int64_t f) {
  if (batch <= 0 || f <= 0) return;
  last_step_gather_kernel<<<row_grid(batch), row_block(), 0, stream()>>>(x, lengths, y, steps, batch, f);
  LSTM_CUDA_CHECK_LAUNCH();
}

void last_step_scatter(const float* dy, const int32_t* lengths, float* dx, int64_t steps, int64_t batch, int64_t f) {
  if (steps * batch <= 0 || f <= 0) return;
  last_step_scatter_kernel<<<row_grid(steps * batch), row_block(), 0, stream()>>>(dy, lengths, dx, steps, batch, f);
  LSTM_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  add_inplace_kernel<<<grid_for(n), 256, 0, stream()>>>(dst, src, n);
  LSTM_CUDA_CHECK_LAUNCH();
}

void broadcast_rows(const float* b, float* y, int64_t rows, int64_t cols) {
  Rows s;
  s.rows = rows;
  s.features = cols;
  map_rows(nullptr, nullptr, y, s, BiasOp{b});
}

void fill_f32(float* x, float v, int64_t n) {
  if (n <= 0) return;
  fill_f32_kernel<<<grid_for(n), 256, 0, stream()>>>(x, v, n);
  LSTM_CUDA_CHECK_LAUNCH();
}

}  // namespace lstm::cuda
