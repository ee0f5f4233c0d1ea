// Device kernels of the fused LSTM backend (included by lstm_fused.cu only). docs/KERNELS.md
// describes how they map work to threads and how the backend schedules them.
//
// Conventions: E is the storage type (float, __nv_bfloat16, __half); gate pre-activations,
// activated gates, the cell state and every gradient carried between steps are fp32. A [B, 4H]
// gate block holds, per batch row, the i, f, g, o sections of H units each (PyTorch's row order of
// weight_ih / weight_hh). "Active" means t < len[b]: rows past a sequence's length are never read
// for values, only written (zeros, or the unchanged state).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/lstm_cell_math.cuh"

namespace lstm::cuda::fused {

#define FUSED_GRID_LOOP(i, n)                                                        \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- Layout --------------------------------------------------------------------------------

// dst = src moved between sequence-major [T, B, W] and batch-major [B, T, W] (either side
// either way), converted to D, with every row past its sequence's length zero. Rows of src past
// a length are not read (x there may be NaN).
template <class S, class D>
__global__ void relayout_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t Tn, int64_t B, int64_t W,
                                bool src_bf, bool dst_bf, const int32_t* __restrict__ len) {
  FUSED_GRID_LOOP(i, Tn * B * W) {
    const int64_t row = i / W, k = i - row * W;
    const int64_t t = dst_bf ? row % Tn : row / B;
    const int64_t b = dst_bf ? row / Tn : row % B;
    if (t < len[b]) {
      const int64_t srow = src_bf ? b * Tn + t : t * B + b;
      dst[i] = convert<D>(src[srow * W + k]);
    } else {
      dst[i] = from_f<D>(0.f);
    }
  }
}

// Inverted dropout of elements [begin, end): dst = src * (dropped ? 0 : scale). A dropped
// element is replaced by 0 rather than multiplied, so that no value can survive it.
template <class V>
__global__ void dropout_kernel(const V* __restrict__ src, V* __restrict__ dst, int64_t begin, int64_t end,
                               uint64_t seed, uint64_t threshold, float scale) {
  FUSED_GRID_LOOP(k, end - begin) {
    const int64_t i = begin + k;
    const bool drop = (mix64(seed, static_cast<uint64_t>(i)) >> 32) < threshold;
    dst[i] = from_f<V>(drop ? 0.f : to_f(src[i]) * scale);
  }
}

// ---- Forward -------------------------------------------------------------------------------

// The state a direction starts from: h = h0 (or 0) in E, c = c0 (or 0) in fp32.
template <class E>
__global__ void init_state_kernel(const E* __restrict__ h0, const E* __restrict__ c0, E* __restrict__ h,
                                  float* __restrict__ c, int nh, int nc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nh) h[i] = h0 ? h0[i] : from_f<E>(0.f);
  if (i < nc) c[i] = c0 ? to_f(c0[i]) : 0.f;
}

// h_n / c_n of a direction from its final state.
template <class E>
__global__ void finish_state_kernel(const E* __restrict__ h, const float* __restrict__ c, E* __restrict__ h_n,
                                    E* __restrict__ c_n, int nh, int nc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nh) h_n[i] = h[i];
  if (i < nc) c_n[i] = from_f<E>(c[i]);
}

// One step of the cell, one thread per (batch row b, unit j): i = b * H + j.
template <class E>
struct CellForwardArgs {
  float* gates;                      // [B, 4H]: x-projection + recurrent product (pre-activation)
  const E* b_ih;                     // [4H] or null (no bias)
  const E* b_hh;                     // [4H] or null
  const float* c_in;                 // [B, H] state before the step
  float* c_out;                      // [B, H] after (may equal c_in)
  const E* h_in;                     // [B, H] (no projection; only read to keep inactive rows)
  E* h_out;                          // [B, H] (no projection; may equal h_in)
  E* m;                              // projection: [B, H] o * tanh(c); null without projection
  E* y;                              // output row b at y + b * ldy (no projection)
  int64_t ldy;
  const int32_t* len;
  int t, B, H;
  bool save_gates;     // write the activated i, f, g, o back into `gates` (training)
  bool copy_inactive;  // the state lives in a new slot each step: carry inactive rows over
};

template <class E>
__global__ void cell_forward_kernel(const CellForwardArgs<E> a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.B * a.H) return;
  const int b = i / a.H, j = i - b * a.H, H = a.H;
  if (a.t >= a.len[b]) {
    if (a.copy_inactive) {
      a.c_out[i] = a.c_in[i];
      if (!a.m) a.h_out[i] = a.h_in[i];
    }
    // m of an inactive row feeds the projection GEMM (and dW_hr in backward, times a zero
    // gradient): it must be finite.
    if (a.m)
      a.m[i] = from_f<E>(0.f);
    else
      a.y[b * a.ldy + j] = from_f<E>(0.f);
    return;
  }
  float* g = a.gates + static_cast<int64_t>(b) * 4 * H + j;
  float pi = g[0], pf = g[H], pg = g[2 * H], po = g[3 * H];
  if (a.b_ih) {
    pi += to_f(a.b_ih[j]) + to_f(a.b_hh[j]);
    pf += to_f(a.b_ih[H + j]) + to_f(a.b_hh[H + j]);
    pg += to_f(a.b_ih[2 * H + j]) + to_f(a.b_hh[2 * H + j]);
    po += to_f(a.b_ih[3 * H + j]) + to_f(a.b_hh[3 * H + j]);
  }
  const float ig = sigmoid(pi), fg = sigmoid(pf), gg = tanhf(pg), og = sigmoid(po);
  const float c = fg * a.c_in[i] + ig * gg;
  a.c_out[i] = c;
  if (a.save_gates) {
    g[0] = ig;
    g[H] = fg;
    g[2 * H] = gg;
    g[3 * H] = og;
  }
  const E h = from_f<E>(og * tanhf(c));
  if (a.m) {
    a.m[i] = h;
  } else {
    a.h_out[i] = h;
    a.y[b * a.ldy + j] = h;
  }
}

// Projection: after hp = m W_hr^T (a GEMM over every row), the new state and the output of
// active rows; inactive rows keep their state and output zero. One thread per (b, q < P).
template <class E>
struct ProjCommitArgs {
  const E* hp;     // [B, P]
  const E* h_in;   // [B, P]
  E* h_out;        // [B, P] (may equal h_in)
  E* y;
  int64_t ldy;
  const int32_t* len;
  int t, B, P;
  bool copy_inactive;
};

template <class E>
__global__ void proj_commit_kernel(const ProjCommitArgs<E> a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.B * a.P) return;
  const int b = i / a.P, q = i - b * a.P;
  if (a.t < a.len[b]) {
    const E v = a.hp[i];
    a.h_out[i] = v;
    a.y[b * a.ldy + q] = v;
  } else {
    if (a.copy_inactive) a.h_out[i] = a.h_in[i];
    a.y[b * a.ldy + q] = from_f<E>(0.f);
  }
}

// ---- Backward ------------------------------------------------------------------------------
//
// The gradient w.r.t. the carried h lives in `dh` (fp32 [B, Hout], d_h_n at first). A step's
// recurrent GEMM writes dhp = dG W_hh for every row, but only rows that were active at that step
// carry a gradient to their previous state: the next step's kernel commits dhp into dh for those
// rows only (has_prev && tp < len[b], tp = the time of the previous processed step). So
// d_h_n enters at each sequence's own last step, and dh ends as d_h0 without a per-step copy.

template <class E>
__global__ void grad_init_kernel(const E* __restrict__ dhn, const E* __restrict__ dcn, float* __restrict__ dh,
                                 float* __restrict__ dc, int nh, int nc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nh) dh[i] = dhn ? to_f(dhn[i]) : 0.f;
  if (i < nc) dc[i] = dcn ? to_f(dcn[i]) : 0.f;
}

// Projection only: dht = the gradient w.r.t. the projected h at t (zero for inactive rows),
// kept for dW_hr and multiplied by W_hr next (dm = dht W_hr). One thread per (b, q < P).
template <class E>
struct DhTotalArgs {
  const float* dy;  // row b at dy + b * ldy
  int64_t ldy;
  const float* dhp;
  float* dh;
  E* dht;  // [B, P]
  const int32_t* len;
  int t, tp, B, P;
  bool has_prev;
};

template <class E>
__global__ void dh_total_kernel(const DhTotalArgs<E> a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.B * a.P) return;
  const int b = i / a.P, q = i - b * a.P;
  const int lb = a.len[b];
  float d = a.dh[i];
  if (a.has_prev && a.tp < lb) {
    d = a.dhp[i];
    a.dh[i] = d;
  }
  a.dht[i] = from_f<E>(a.t < lb ? d + a.dy[b * a.ldy + q] : 0.f);
}

// The cell's backward at t, one thread per (b, j < H): the pre-activation gate gradients dG
// (zero for inactive rows), and dc carried to the previous step in place.
template <class E>
struct CellBackwardArgs {
  const float* gates;   // [B, 4H] activated i, f, g, o at t
  const float* c_t;     // [B, H]
  const float* c_prev;  // [B, H]
  const float* dm;      // projection: [B, H] gradient w.r.t. o * tanh(c); null without
  const float* dy;      // no projection: row b at dy + b * ldy
  int64_t ldy;
  const float* dhp;     // no projection: [B, H]
  float* dh;            // no projection: [B, H]
  float* dc;            // [B, H]
  E* dg;                // [B, 4H]
  const int32_t* len;
  int t, tp, B, H;
  bool has_prev;
};

template <class E>
__global__ void cell_backward_kernel(const CellBackwardArgs<E> a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.B * a.H) return;
  const int b = i / a.H, j = i - b * a.H, H = a.H;
  const int lb = a.len[b];
  float dm = 0.f;
  if (!a.dm) {
    float d = a.dh[i];
    if (a.has_prev && a.tp < lb) {
      d = a.dhp[i];
      a.dh[i] = d;
    }
    if (a.t < lb) dm = d + a.dy[b * a.ldy + j];
  }
  E* dg = a.dg + static_cast<int64_t>(b) * 4 * H + j;
  if (a.t >= lb) {
    const E z = from_f<E>(0.f);
    dg[0] = z;
    dg[H] = z;
    dg[2 * H] = z;
    dg[3 * H] = z;
    return;
  }
  if (a.dm) dm = a.dm[i];
  const float* g = a.gates + static_cast<int64_t>(b) * 4 * H + j;
  const float ig = g[0], fg = g[H], gg = g[2 * H], og = g[3 * H];
  const float tc = tanhf(a.c_t[i]);
  const float dct = a.dc[i] + dm * og * (1.f - tc * tc);
  dg[0] = from_f<E>(dct * gg * ig * (1.f - ig));
  dg[H] = from_f<E>(dct * a.c_prev[i] * fg * (1.f - fg));
  dg[2 * H] = from_f<E>(dct * ig * (1.f - gg * gg));
  dg[3 * H] = from_f<E>(dm * tc * og * (1.f - og));
  a.dc[i] = dct * fg;
}

// d_h0 / d_c0 of a direction after its sweep; tl is the time of the sweep's last step.
template <class E>
struct GradFinishArgs {
  const float* dhp;
  const float* dh;
  const float* dc;
  E* dh0;  // [B, Hout] or null
  E* dc0;  // [B, H] or null
  const int32_t* len;
  int tl, B, Hout, H;
};

template <class E>
__global__ void grad_finish_kernel(const GradFinishArgs<E> a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (a.dh0 && i < a.B * a.Hout) {
    const int b = i / a.Hout;
    a.dh0[i] = from_f<E>(a.tl < a.len[b] ? a.dhp[i] : a.dh[i]);
  }
  if (a.dc0 && i < a.B * a.H) a.dc0[i] = from_f<E>(a.dc[i]);
}

// Column sums of x [rows, cols] in fp32, in a fixed order (deterministic): blocks of 32 columns x
// 8 row lanes, grid.y splits the rows into `splits` ranges of rows_per_split; partial [splits, cols].
template <class E>
__global__ void colsum_partial_kernel(const E* __restrict__ x, int64_t rows, int cols, int64_t rows_per_split,
                                      float* __restrict__ partial) {
  __shared__ float acc[8][33];
  const int j = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
  float s = 0.f;
  if (j < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += to_f(x[r * cols + j]);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float sum = 0.f;
    for (int k = 0; k < 8; ++k) sum += acc[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * cols + j] = sum;
  }
}

__global__ void colsum_final_kernel(const float* __restrict__ partial, int splits, int cols, float* __restrict__ out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.f;
  for (int k = 0; k < splits; ++k) s += partial[static_cast<int64_t>(k) * cols + j];
  out[j] = s;
}

#undef FUSED_GRID_LOOP

}  // namespace lstm::cuda::fused
