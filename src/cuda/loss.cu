// Fused softmax cross-entropy on the GPU (cuda/layers.hpp says what it computes).
//
// One group of threads per row of logits: a warp when the row is short, a block of 256 when
// it is long (a 50k vocabulary). Pass 1 reads the row once with an online softmax (running
// max and the sum of exponentials rescaled when the max grows) and the first argmax; pass 2
// reads it again and writes the gradient. Per-row losses go to scratch and one block sums them
// in a fixed order, so the mean loss is the same bit for bit from run to run (no float atomics).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "core/cuda_rt.hpp"
#include "cuda/layers.hpp"

namespace lstm::cuda {

namespace {

constexpr int kBlock = 256;
// Rows up to this many classes get a warp each; longer rows a whole block.
constexpr int64_t kWarpRowMaxClasses = 2048;
constexpr int kFinishThreads = 1024;

// Softmax state of part of a row: max m, sum of exp(x - m), and the index of the first max.
struct RowStat {
  float m;
  float s;
  int arg;
};

__device__ __forceinline__ void absorb(RowStat& st, float x, int j) {
  if (x > st.m) {
    st.s = st.s * expf(st.m - x) + 1.f;  // expf(-inf) = 0 for the first element
    st.m = x;
    st.arg = j;
  } else {
    st.s += expf(x - st.m);
  }
}

// Combines two partial states; on equal maxima the smaller index wins (torch.argmax's first).
__device__ __forceinline__ RowStat combine(RowStat a, RowStat b) {
  if (b.s == 0.f) return a;  // b saw no element
  if (a.s == 0.f) return b;
  if (b.m > a.m || (b.m == a.m && b.arg < a.arg)) {
    b.s += a.s * expf(a.m - b.m);
    return b;
  }
  a.s += b.s * expf(b.m - a.m);
  return a;
}

__device__ __forceinline__ RowStat shfl_down(RowStat st, int delta) {
  RowStat o;
  o.m = __shfl_down_sync(0xffffffffu, st.m, delta);
  o.s = __shfl_down_sync(0xffffffffu, st.s, delta);
  o.arg = __shfl_down_sync(0xffffffffu, st.arg, delta);
  return o;
}

// Reduces within the row's threads; every thread of the row gets lane 0's result, so all of
// them use the same (bit-identical) max and sum.
template <int TPR>
__device__ __forceinline__ RowStat reduce_row(RowStat st) {
  for (int d = 16; d > 0; d /= 2) st = combine(st, shfl_down(st, d));
  if constexpr (TPR == 32) {
    st.m = __shfl_sync(0xffffffffu, st.m, 0);
    st.s = __shfl_sync(0xffffffffu, st.s, 0);
    st.arg = __shfl_sync(0xffffffffu, st.arg, 0);
    return st;
  } else {
    constexpr int kWarps = TPR / 32;
    __shared__ RowStat part[kWarps];
    __shared__ RowStat total;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
      RowStat t = part[0];
      for (int w = 1; w < kWarps; ++w) t = combine(t, part[w]);
      total = t;
    }
    __syncthreads();
    return total;
  }
}

// targets: class index, -1 (not counted) or -2 (counted but outside [0, c): NaN row).
template <int TPR, bool kVec>
__global__ void __launch_bounds__(kBlock) cross_entropy_rows_kernel(
    const float* __restrict__ logits, const int32_t* __restrict__ targets, float* __restrict__ grad, int64_t n,
    int64_t c, const unsigned long long* __restrict__ dev_count, double host_inv_count,
    double* __restrict__ row_loss, int32_t* __restrict__ row_correct) {
  constexpr int kRowsPerBlock = kBlock / TPR;
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  if (r >= n) return;  // uniform over the row's threads (a whole block when TPR == kBlock)
  const float* x = logits + r * c;
  float* g = grad + r * c;
  const int32_t t = targets[r];
  if (t == -1) {
    if constexpr (kVec) {
      for (int64_t j = lane; j < c / 4; j += TPR)
        reinterpret_cast<float4*>(g)[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int64_t j = lane; j < c; j += TPR) g[j] = 0.f;
    }
    if (lane == 0) {
      row_loss[r] = 0.0;
      row_correct[r] = 0;
    }
    return;
  }

  RowStat st{-INFINITY, 0.f, INT_MAX};
  if constexpr (kVec) {
    for (int64_t j = lane; j < c / 4; j += TPR) {
      const float4 v = reinterpret_cast<const float4*>(x)[j];
      const int k = static_cast<int>(4 * j);
      absorb(st, v.x, k);
      absorb(st, v.y, k + 1);
      absorb(st, v.z, k + 2);
      absorb(st, v.w, k + 3);
    }
  } else {
    for (int64_t j = lane; j < c; j += TPR) absorb(st, x[j], static_cast<int>(j));
  }
  st = reduce_row<TPR>(st);

  double inv_count = host_inv_count;
  if (dev_count) {
    const unsigned long long k = *dev_count;
    inv_count = k ? 1.0 / static_cast<double>(k) : 0.0;
  }
  const bool invalid = t < 0;
  const float nan = __int_as_float(0x7fc00000);
  const float scale = static_cast<float>(inv_count / static_cast<double>(st.s));
  const float inv = static_cast<float>(inv_count);
  auto grad_of = [&](float v, int64_t j) { return invalid ? nan : expf(v - st.m) * scale - (j == t ? inv : 0.f); };
  if constexpr (kVec) {
    for (int64_t j = lane; j < c / 4; j += TPR) {
      const float4 v = reinterpret_cast<const float4*>(x)[j];
      const int64_t k = 4 * j;
      reinterpret_cast<float4*>(g)[j] =
          make_float4(grad_of(v.x, k), grad_of(v.y, k + 1), grad_of(v.z, k + 2), grad_of(v.w, k + 3));
    }
  } else {
    for (int64_t j = lane; j < c; j += TPR) g[j] = grad_of(x[j], j);
  }
  if (lane == 0) {
    row_loss[r] = invalid ? static_cast<double>(nan)
                          : static_cast<double>(st.m) + log(static_cast<double>(st.s)) - static_cast<double>(x[t]);
    row_correct[r] = !invalid && st.arg == t;
  }
}

// Resolves raw device targets: -1 where not counted (masked or ignore_index), -2 where counted
// but outside [0, c); counts the counted rows (integer atomics: the count is exact).
__global__ void prepare_targets_kernel(const int64_t* __restrict__ targets, const uint8_t* __restrict__ mask,
                                       int64_t ignore_index, int64_t c, int32_t* __restrict__ out,
                                       unsigned long long* __restrict__ count, int64_t n) {
  unsigned local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = targets[i];
    const bool counted = (!mask || mask[i]) && t != ignore_index;
    out[i] = !counted ? -1 : (t >= 0 && t < c ? static_cast<int32_t>(t) : -2);
    local += counted;
  }
  local = __reduce_add_sync(0xffffffffu, local);
  if (threadIdx.x % 32 == 0 && local) atomicAdd(count, static_cast<unsigned long long>(local));
}

// One block: fixed-order sums of the per-row losses and hits, then the stats.
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(const double* __restrict__ row_loss,
                                                                const int32_t* __restrict__ row_correct, int64_t n,
                                                                const unsigned long long* __restrict__ dev_count,
                                                                int64_t host_count, double* __restrict__ stats) {
  __shared__ double loss[kFinishThreads];
  __shared__ long long hits[kFinishThreads];
  double s = 0;
  long long h = 0;
  for (int64_t i = threadIdx.x; i < n; i += kFinishThreads) {
    s += row_loss[i];
    h += row_correct[i];
  }
  loss[threadIdx.x] = s;
  hits[threadIdx.x] = h;
  __syncthreads();
  for (int w = kFinishThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) {
      loss[threadIdx.x] += loss[threadIdx.x + w];
      hits[threadIdx.x] += hits[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double count = dev_count ? static_cast<double>(*dev_count) : static_cast<double>(host_count);
    stats[0] = count > 0 ? loss[0] * (1.0 / count) : 0.0;
    stats[1] = count;
    stats[2] = static_cast<double>(hits[0]);
  }
}

size_t align_up(size_t v) { return (v + 255) / 256 * 256; }

}  // namespace

void softmax_cross_entropy(const float* logits, float* grad, double* stats, int64_t n, int64_t c,
                           const int32_t* host_targets, int64_t host_count, const int64_t* dev_targets,
                           const uint8_t* host_mask, int64_t ignore_index) {
  LSTM_REQUIRE(n < (int64_t(1) << 31) && c < (int64_t(1) << 31),
               "softmax_cross_entropy (GPU): logits [" << n << ", " << c << "] are too large for the kernel");
  LSTM_REQUIRE((host_targets != nullptr) != (dev_targets != nullptr),
               "softmax_cross_entropy (GPU): give either resolved host targets or raw device targets");
  const size_t nn = static_cast<size_t>(n);
  // Scratch, in one arena block: row losses, row hits, resolved targets, the count, the mask.
  const size_t off_loss = 0;
  const size_t off_hits = align_up(off_loss + nn * sizeof(double));
  const size_t off_tgt = align_up(off_hits + nn * sizeof(int32_t));
  const size_t off_count = align_up(off_tgt + (dev_targets ? nn * sizeof(int32_t) : 0));
  const size_t off_mask = align_up(off_count + sizeof(unsigned long long));
  const size_t bytes = off_mask + (dev_targets && host_mask ? nn : 0);
  DeviceBuffer scratch(bytes);
  auto* base = scratch.as<unsigned char>();
  auto* row_loss = reinterpret_cast<double*>(base + off_loss);
  auto* row_hits = reinterpret_cast<int32_t*>(base + off_hits);

  const int32_t* targets = host_targets;
  const unsigned long long* dev_count = nullptr;
  if (dev_targets) {
    auto* resolved = reinterpret_cast<int32_t*>(base + off_tgt);
    auto* count = reinterpret_cast<unsigned long long*>(base + off_count);
    const uint8_t* mask = nullptr;
    if (host_mask && n > 0) {
      auto* m = base + off_mask;
      upload_async(m, host_mask, nn);
      mask = m;
    }
    LSTM_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned long long), stream()));
    if (n > 0) {
      prepare_targets_kernel<<<grid_for(n), kBlock, 0, stream()>>>(dev_targets, mask, ignore_index, c, resolved,
                                                                   count, n);
      LSTM_CUDA_CHECK_LAUNCH();
    }
    targets = resolved;
    dev_count = count;
  }

  if (n > 0) {
    const double host_inv = host_count > 0 ? 1.0 / static_cast<double>(host_count) : 0.0;
    const bool vec = c % 4 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15u) == 0 &&
                     (reinterpret_cast<uintptr_t>(grad) & 15u) == 0;
    if (c <= kWarpRowMaxClasses) {
      const unsigned blocks = static_cast<unsigned>((n + kBlock / 32 - 1) / (kBlock / 32));
      if (vec)
        cross_entropy_rows_kernel<32, true><<<blocks, kBlock, 0, stream()>>>(logits, targets, grad, n, c, dev_count,
                                                                             host_inv, row_loss, row_hits);
      else
        cross_entropy_rows_kernel<32, false><<<blocks, kBlock, 0, stream()>>>(logits, targets, grad, n, c, dev_count,
                                                                              host_inv, row_loss, row_hits);
    } else {
      const unsigned blocks = static_cast<unsigned>(n);
      if (vec)
        cross_entropy_rows_kernel<kBlock, true><<<blocks, kBlock, 0, stream()>>>(logits, targets, grad, n, c,
                                                                                 dev_count, host_inv, row_loss,
                                                                                 row_hits);
      else
        cross_entropy_rows_kernel<kBlock, false><<<blocks, kBlock, 0, stream()>>>(logits, targets, grad, n, c,
                                                                                  dev_count, host_inv, row_loss,
                                                                                  row_hits);
    }
    LSTM_CUDA_CHECK_LAUNCH();
  }
  finish_kernel<<<1, kFinishThreads, 0, stream()>>>(row_loss, row_hits, n, dev_count, host_count, stats);
  LSTM_CUDA_CHECK_LAUNCH();
}

}  // namespace lstm::cuda
