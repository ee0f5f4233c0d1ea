// The persistent recurrence: see lstm_persistent.cuh and docs/KERNELS.md ("The persistent
// backend"). One CTA per SM at most; CTA k of a group (a layer direction) owns hidden units
// [k*U, k*U + U) and holds the 4U rows of W_hh that feed them (i, f, g, o of each unit), and in
// the wavefront also those rows of W_ih, in shared memory for the whole launch. Per step it
//   1. takes its x-projection values of step t, read one step ahead (they do not depend on the
//      recurrence),
//   2. reads h_{t-1} [B, Hout] (and in the wavefront the layer below's h_t) from the exchange in L2
//      into shared memory: tagged words polled until every word carries the step's tag (batch
//      <= 2), or values behind a flag per CTA (persistent_exchange_for),
//   3. forms its [4U, B] block of [x;h] [W_ih;W_hh]^T with tensor-core mma (bf16/fp16 m16n8k16;
//      F32 as TF32 m16n8k8, three products per term unless TF32 is allowed), with W either in
//      registers (bf16/fp16, 8+ units: warps split the m-tiles, then K) or read from shared memory
//      (K split over the 8 warps), partial sums reduced through shared memory,
//   4. runs the cell for its (unit pair, batch row) items (c stays in registers), publishes h_t,
//      then writes the output and, in training, h_t, c_t and the activated gates to their slots.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_rt.hpp"
#include "cuda/lstm_cell_math.cuh"
#include "cuda/lstm_persistent.cuh"
#include "lstm/error.hpp"

namespace lstm::cuda {
namespace {

using fused::from_f;
using fused::sigmoid;
using fused::to_f;

constexpr int kWarps = 8;
constexpr int kBlock = kWarps * 32;
// Values of E per exchange word (its low 32 bits): two 16-bit values, or one F32
// (persistent_exchange_words counts the words the same way).
template <class E> constexpr int kValuesPerWord = sizeof(E) == 2 ? 2 : 1;
// The partial products red[slice][col][row] have a column stride of ROWS + kRedPad floats: the
// product's stores (8 rows x 4 column pairs per instruction) and the cell's 64-bit loads (two
// units of up to 8 batch rows) then fall in distinct banks.
constexpr int kRedPad = 4;
// The most k-tiles of W a warp keeps in registers (4 registers each): W in registers takes the
// product's shared-memory reads of W off every step; slices with more run from shared memory.
constexpr int kRegTiles = 16;

// The mma's K per instruction and the row padding of the shared-memory tiles (16 bytes, which
// keeps ldmatrix and the F32 fragment loads free of bank conflicts).
template <class E> struct Mma {
  static constexpr int kK = 16, kPad = 8;
};
template <> struct Mma<float> {
  static constexpr int kK = 8, kPad = 4;
};

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x2(unsigned (&r)[2], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

template <class E>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (std::is_same_v<E, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo with hi and lo both TF32: three TF32 products (hi*hi + hi*lo + lo*hi) carry about
// the precision of one F32 product.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}

// The CTA's [4U, NP] block of h W_hh^T (rows r = gate * U + u), this warp's K range, into
// red[warp][col][row].
template <class E, int MT, int NT>
__device__ __forceinline__ void recurrent_product(const E* Ws, const E* Hs, int KS, int Kp, float* red, int split) {
  constexpr int ROWS = 16 * MT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int KK = Mma<E>::kK;
  const int KT = Kp / KK;
  const int kb = warp * KT / kWarps, ke = (warp + 1) * KT / kWarps;
  // Independent accumulators (by k-step parity, and for F32 one more for the small split terms) so
  // that consecutive mma instructions do not wait for each other's results.
  float acc2[2][MT][NT][4], lo[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc2[0][m][n][q] = acc2[1][m][n][q] = lo[m][n][q] = 0.f;
  const int g = lane >> 2, tq = lane & 3;
  auto kstep = [&](int kt, float (&acc)[MT][NT][4]) {
    const int k0 = kt * KK;
    if constexpr (std::is_same_v<E, float>) {
      unsigned bh[NT][2], bl[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float* hp = Hs + (n * 8 + g) * KS + k0 + tq;
        split_tf32(hp[0], bh[n][0], bl[n][0]);
        split_tf32(hp[4], bh[n][1], bl[n][1]);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float* wp = Ws + (m * 16 + g) * KS + k0 + tq;
        unsigned ah[4], al[4];
        split_tf32(wp[0], ah[0], al[0]);
        split_tf32(wp[8 * KS], ah[1], al[1]);
        split_tf32(wp[4], ah[2], al[2]);
        split_tf32(wp[8 * KS + 4], ah[3], al[3]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          if (split) {
            mma_1688_tf32(lo[m][n], al, bh[n]);
            mma_1688_tf32(lo[m][n], ah, bl[n]);
          }
          mma_1688_tf32(acc[m][n], ah, bh[n]);
        }
      }
    } else {
      unsigned bf[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) ldsm_x2(bf[n], Hs + (n * 8 + (lane & 7)) * KS + k0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        unsigned af[4];
        ldsm_x4(af, Ws + (m * 16 + (lane & 15)) * KS + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < NT; ++n) mma_16816<E>(acc[m][n], af, bf[n]);
      }
    }
  };
  int kt = kb;
  for (; kt + 1 < ke; kt += 2) {
    kstep(kt, acc2[0]);
    kstep(kt + 1, acc2[1]);
  }
  if (kt < ke) kstep(kt, acc2[0]);
  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[m][n][q] = acc2[0][m][n][q] + acc2[1][m][n][q] + lo[m][n][q];
  constexpr int NP = 8 * NT, RS = ROWS + kRedPad;
  float* rw = red + warp * NP * RS;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int row = m * 16 + g, col = n * 8 + 2 * tq;
      rw[col * RS + row] = acc[m][n][0];
      rw[(col + 1) * RS + row] = acc[m][n][1];
      rw[col * RS + row + 8] = acc[m][n][2];
      rw[(col + 1) * RS + row + 8] = acc[m][n][3];
    }
}

// bf16/fp16 with W in registers: warps split the CTA's MT m-tiles first (kWarps / MT warps per
// m-tile, each over its share of K), so there are only kWarps / MT partial sums per value. Warp w
// owns m-tile w / WM and k-tiles [kb, ke) of its share w % WM; its A fragments of those tiles
// are loaded once (load_w_fragments) and the product reads only h from shared memory.
template <int MT> struct RegSplit {
  static constexpr int WM = kWarps / MT;  // warps per m-tile = partial sums per value
  int m = 0, kw = 0, kb = 0, ke = 0;
  __device__ RegSplit(int KT) {
    const int warp = threadIdx.x >> 5;
    m = warp / WM;
    kw = warp % WM;
    kb = kw * KT / WM;
    ke = (kw + 1) * KT / WM;
  }
};

template <class E, int MT, int KR>
__device__ __forceinline__ void load_w_fragments(unsigned (&afr)[KR][4], const E* Ws, int KS, const RegSplit<MT>& rs) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    if (rs.kb + i < rs.ke) {
      ldsm_x4(afr[i], Ws + (rs.m * 16 + (lane & 15)) * KS + (rs.kb + i) * 16 + (lane >> 4) * 8);
    } else {
      afr[i][0] = afr[i][1] = afr[i][2] = afr[i][3] = 0u;
    }
  }
}

template <class E, int MT, int NT, int KR>
__device__ __forceinline__ void recurrent_product_regs(const unsigned (&afr)[KR][4], const E* Hs, int KS,
                                                       const RegSplit<MT>& rs, float* red) {
  constexpr int ROWS = 16 * MT, NP = 8 * NT, RS = ROWS + kRedPad;
  const int lane = threadIdx.x & 31;
  float acc[2][NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][n][q] = acc[1][n][q] = 0.f;
#pragma unroll
  for (int i = 0; i < KR; ++i) {
    if (rs.kb + i < rs.ke) {
      const int k0 = (rs.kb + i) * 16;
      unsigned bf[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) ldsm_x2(bf[n], Hs + (n * 8 + (lane & 7)) * KS + k0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_16816<E>(acc[i & 1][n], afr[i], bf[n]);
    }
  }
  const int g = lane >> 2, tq = lane & 3;
  float* rw = red + rs.kw * NP * RS;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int row = rs.m * 16 + g, col = n * 8 + 2 * tq;
    rw[col * RS + row] = acc[0][n][0] + acc[1][n][0];
    rw[(col + 1) * RS + row] = acc[0][n][1] + acc[1][n][1];
    rw[col * RS + row + 8] = acc[0][n][2] + acc[1][n][2];
    rw[(col + 1) * RS + row + 8] = acc[0][n][3] + acc[1][n][3];
  }
}

template <class E>
__device__ __forceinline__ void copy_h_to_shared(E* Hs, const E* __restrict__ h, int B, int Hout, int KS) {
  constexpr int V = 16 / sizeof(E);
  if (Hout % V == 0) {
    const int chunks = Hout / V;
    for (int i = threadIdx.x; i < B * chunks; i += kBlock) {
      const int b = i / chunks, q = i - b * chunks;
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(h + static_cast<size_t>(b) * Hout) + q);
      *reinterpret_cast<uint4*>(Hs + b * KS + q * V) = v;
    }
  } else {
    for (int i = threadIdx.x; i < B * Hout; i += kBlock) {
      const int b = i / Hout, k = i - b * Hout;
      E v;
      if constexpr (sizeof(E) == 4) {
        v = __ldcg(reinterpret_cast<const float*>(h) + i);
      } else {
        const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(h) + i);
        v = *reinterpret_cast<const E*>(&bits);
      }
      Hs[b * KS + k] = v;
    }
  }
}

// The gate activations: F32 keeps the accurate expf/tanhf (held to 1e-5 against the float64
// reference); bf16/fp16 use the hardware tanh (tanh.approx.f32: one MUFU instruction, a relative
// error of about 2^-11, at or below the rounding of their own results), and sigmoid(x) =
// (1 + tanh(x / 2)) / 2, which takes the cell's activations to one MUFU instruction each on the
// step's critical path.
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <class E> __device__ __forceinline__ float act_sigmoid(float x) {
  if constexpr (std::is_same_v<E, float>)
    return sigmoid(x);
  else
    return fmaf(0.5f, tanh_fast(0.5f * x), 0.5f);
}
template <class E> __device__ __forceinline__ float act_tanh(float x) {
  if constexpr (std::is_same_v<E, float>)
    return tanhf(x);
  else
    return tanh_fast(x);
}

// Relaxed 64-bit accesses of the exchange words (data and step tag in one single-copy-atomic
// word, so a reader that sees the tag sees the data: no fence, no separate flag).
__device__ __forceinline__ unsigned long long ld_word(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_word(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}

// The flag exchange's flags: a relaxed load (the reader's __syncthreads and the values' L2 reads
// follow), and the writer's store after its fence.
__device__ __forceinline__ unsigned ld_flag(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_flag(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// One source of exchange words for exchange_to_shared: [B, words] words that must carry `tag`,
// stored into Hs from column `col` on.
struct Segment {
  const unsigned long long* src = nullptr;
  int words = 0, col = 0;
  unsigned tag = 0;
};

// Up to two segments (the input from the group below, and h_{t-1}) into Hs: every word is read in
// batches of kBatch loads per thread in flight, and words whose tag is not yet the expected one are
// read again together, so that a batch costs one round trip per poll.
template <class E, int kThreads = kBlock, int kBatch = 8>
__device__ __forceinline__ void exchange_to_shared(E* Hs, int KS, int B, const Segment& s0, const Segment& s1,
                                                   int skip) {
  const bool skip_wait = skip & kSkipWait;
  const int n0 = s0.src ? B * s0.words : 0;
  const int n = n0 + (s1.src ? B * s1.words : 0);
  for (int base = threadIdx.x; base < n; base += kThreads * kBatch) {
    unsigned long long v[kBatch];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      const int i = base + r * kThreads;
      v[r] = i < n ? ld_word(i < n0 ? s0.src + i : s1.src + (i - n0)) : 0ull;
    }
    while (!skip_wait) {
      bool ready = true;
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int i = base + r * kThreads;
        ready &= i >= n || static_cast<unsigned>(v[r] >> 32) == (i < n0 ? s0.tag : s1.tag);
      }
      if (ready) break;
      if (!(skip & kSkipSleep)) __nanosleep(32);  // fewer polls in flight leave L2 to the stores being waited for
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int i = base + r * kThreads;
        if (i < n && static_cast<unsigned>(v[r] >> 32) != (i < n0 ? s0.tag : s1.tag))
          v[r] = ld_word(i < n0 ? s0.src + i : s1.src + (i - n0));
      }
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      const int i = base + r * kThreads;
      if (i >= n) continue;
      const Segment& sg = i < n0 ? s0 : s1;
      const int ii = i < n0 ? i : i - n0;
      const int b = ii / sg.words, w = ii - b * sg.words;
      *reinterpret_cast<unsigned*>(Hs + b * KS + sg.col + w * kValuesPerWord<E>) = static_cast<unsigned>(v[r]);
    }
  }
}

template <class E>
__device__ __forceinline__ unsigned pack_pair(E lo, E hi) {
  if constexpr (sizeof(E) == 4) {
    return __float_as_uint(lo);
  } else {
    unsigned short a, b;
    memcpy(&a, &lo, 2);
    memcpy(&b, &hi, 2);
    return static_cast<unsigned>(a) | (static_cast<unsigned>(b) << 16);
  }
}

// KR > 0 (bf16/fp16): W in registers, KR k-tiles per warp at most (recurrent_product_regs);
// KR = 0: W read from shared memory every step (recurrent_product).
template <class E, int MT, int NT, int KR>
__global__ void __launch_bounds__(kBlock, 1) persistent_lstm_kernel(const PersistentArgs<E> a, int ctas) {
  constexpr int KK = Mma<E>::kK;
  constexpr int ROWS = 16 * MT, U = ROWS / 4, NP = 8 * NT, RS = ROWS + kRedPad;
  // Partial sums per value: kWarps / MT with W in registers, kWarps (K split 8 ways) without.
  constexpr int kParts = KR > 0 ? kWarps / MT : kWarps;
  // A cell item is kPair adjacent units of one batch row: their h values share an exchange word.
  constexpr int kPair = kValuesPerWord<E>;
  constexpr int IPT = ((U / kPair) * NP + kBlock - 1) / kBlock;  // cell items per thread
  const int grp = blockIdx.x / ctas;
  const int k = blockIdx.x - grp * ctas;
  const PersistentGroup<E>& d = a.group[grp];
  const int H = a.H, Hout = a.Hout, B = a.B, T = a.T, In = d.w_ih ? d.in_size : 0;
  // Shared memory: Ws [ROWS, KS] (columns [0, Kx): W_ih, [Kx, Kx + Kh): W_hh), Hs [NP, KS] (the
  // input, then h_{t-1}), red [kParts, NP, RS] the warps' partial products.
  const int Kx = (In + KK - 1) / KK * KK, Kh = (Hout + KK - 1) / KK * KK;
  const int KS = Kx + Kh + Mma<E>::kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  E* Ws = reinterpret_cast<E*>(smem);
  E* Hs = Ws + ROWS * KS;
  float* red = reinterpret_cast<float*>(Hs + NP * KS);

  const int words = (Hout + kPair - 1) / kPair, in_words = (In + kPair - 1) / kPair;
  const int j0 = k * U;
  const int nU = min(U, H - j0);
  const int nI = (nU + kPair - 1) / kPair;  // items per batch row
  const int tid = threadIdx.x;

  // The weight slices, zero rows past H and zero columns past each matrix's width; Hs zero (rows
  // past B and the padding columns stay zero).
  for (int i = tid; i < ROWS * KS; i += kBlock) {
    const int r = i / KS, col = i - r * KS;
    const int gate = r / U, u = r - gate * U;
    E v = from_f<E>(0.f);
    if (u < nU) {
      const size_t row = static_cast<size_t>(gate * H + j0 + u);
      if (col < In)
        v = d.w_ih[row * In + col];
      else if (col >= Kx && col - Kx < Hout)
        v = d.w_hh[row * Hout + (col - Kx)];
    }
    Ws[i] = v;
  }
  for (int i = tid; i < NP * KS; i += kBlock) Hs[i] = from_f<E>(0.f);

  // Item i -> batch row i % B, units j0 + kPair * (i / B) + e for e < kPair (those below nU):
  // neighbouring threads take neighbouring rows of the same units (distinct banks of red).
  int ib[IPT], iu[IPT];
  bool iv[IPT];
  float bias[IPT][kPair][4], cst[IPT][kPair];
  E hcur[IPT][kPair];
  const size_t h_first = a.seq && d.reverse ? static_cast<size_t>(T) * B * Hout : 0;
  const size_t c_first = a.seq && d.reverse ? static_cast<size_t>(T) * B * H : 0;
#pragma unroll
  for (int q = 0; q < IPT; ++q) {
    const int i = tid + q * kBlock;
    iv[q] = i < nI * B;
    ib[q] = iv[q] ? i % B : 0;
    iu[q] = iv[q] ? (i / B) * kPair : 0;
#pragma unroll
    for (int e = 0; e < kPair; ++e) {
      const bool on = iv[q] && iu[q] + e < nU;
      const int j = j0 + iu[q] + e;
#pragma unroll
      for (int gate = 0; gate < 4; ++gate)
        bias[q][e][gate] = on && d.b_ih ? to_f(d.b_ih[gate * H + j]) + to_f(d.b_hh[gate * H + j]) : 0.f;
      cst[q][e] = on ? d.c[c_first + static_cast<size_t>(ib[q]) * H + j] : 0.f;
      hcur[q][e] = on ? d.h[h_first + static_cast<size_t>(ib[q]) * Hout + j] : from_f<E>(0.f);
    }
  }
  int ilen[IPT];
#pragma unroll
  for (int q = 0; q < IPT; ++q) ilen[q] = iv[q] ? a.len[ib[q]] : 0;
  // The x-projection values of step s are read one step ahead (they do not depend on the
  // recurrence), so their memory latency is off the step's critical path.
  float gx_next[IPT][kPair][4];
  auto load_gx = [&](int s_load) {
    const int t_load = d.reverse ? T - 1 - s_load : s_load;
#pragma unroll
    for (int q = 0; q < IPT; ++q)
#pragma unroll
      for (int e = 0; e < kPair; ++e) {
#pragma unroll
        for (int gate = 0; gate < 4; ++gate) gx_next[q][e][gate] = 0.f;
        if (d.w_ih || s_load >= T || !iv[q] || iu[q] + e >= nU || (a.skip & kSkipGates)) continue;
        const float* gp = d.gates + (static_cast<size_t>(t_load) * B + ib[q]) * 4 * H + j0 + iu[q] + e;
#pragma unroll
        for (int gate = 0; gate < 4; ++gate) gx_next[q][e][gate] = gp[gate * H];
      }
  };
  load_gx(0);
  __syncthreads();
  // W in registers: each warp's A fragments, once.
  const RegSplit<MT> rsplit((Kx + Kh) / KK);
  unsigned afr[KR > 0 ? KR : 1][4];
  if constexpr (KR > 0) load_w_fragments<E, MT, KR>(afr, Ws, KS, rsplit);

  for (int s = 0; s < T; ++s) {
    const int t = d.reverse ? T - 1 - s : s;
    float gx[IPT][kPair][4];
#pragma unroll
    for (int q = 0; q < IPT; ++q)
#pragma unroll
      for (int e = 0; e < kPair; ++e)
#pragma unroll
        for (int gate = 0; gate < 4; ++gate) gx[q][e][gate] = gx_next[q][e][gate];
    load_gx(s + 1);
    if (a.skip & kSkipRead) {
      if (s == 0) copy_h_to_shared(Hs + Kx, d.h + h_first, B, Hout, KS);
    } else if (d.flags) {
      // Flags: one warp waits until every CTA of this group has flagged step s - 1 (and of the
      // group below, step s), then the values are read from the plain slots.
      if (tid < 32 && !(a.skip & kSkipWait)) {
        for (;;) {
          bool done = true;
          if (s > 0)
            for (int f = tid; f < ctas; f += 32)
              done &= ld_flag(d.flags + f) >= static_cast<unsigned>(s);
          if (d.w_ih)
            for (int f = tid; f < ctas; f += 32)
              done &= ld_flag(d.in_flags + f) >= static_cast<unsigned>(s + 1);
          if (__all_sync(0xffffffffu, done)) break;
          if (!(a.skip & kSkipSleep)) __nanosleep(32);
        }
        __threadfence();  // acquire: the values behind the flags are read after this
      }
      __syncthreads();
      if (d.w_ih)
        copy_h_to_shared(Hs, reinterpret_cast<const E*>(d.in_xchg) + static_cast<size_t>(s) * B * In, B, In, KS);
      copy_h_to_shared(Hs + Kx,
                       s == 0 ? d.h + h_first : reinterpret_cast<const E*>(d.xchg) + static_cast<size_t>(s - 1) * B * Hout,
                       B, Hout, KS);
    } else {
      // The input of step s from the group below (tag s + 1), and h_{t-1}: h0 at the first step,
      // then the exchange words of step s - 1 (tag s).
      Segment sx, sh;
      if (d.w_ih) {
        sx.src = d.in_xchg + static_cast<size_t>(s) * B * in_words;
        sx.words = in_words;
        sx.col = 0;
        sx.tag = static_cast<unsigned>(s + 1);
      }
      if (s == 0) {
        copy_h_to_shared(Hs + Kx, d.h + h_first, B, Hout, KS);
      } else {
        sh.src = d.xchg + static_cast<size_t>(s - 1) * B * words;
        sh.words = words;
        sh.col = Kx;
        sh.tag = static_cast<unsigned>(s);
      }
      exchange_to_shared(Hs, KS, B, sx, sh, a.skip);
    }
    __syncthreads();
    if (!(a.skip & kSkipProduct)) {
      if constexpr (KR > 0)
        recurrent_product_regs<E, MT, NT, KR>(afr, Hs, KS, rsplit, red);
      else
        recurrent_product<E, MT, NT>(Ws, Hs, KS, Kx + Kh, red, a.fp32_split);
    }
    __syncthreads();
    unsigned long long* xout = d.xchg + static_cast<size_t>(s) * B * words;
#pragma unroll
    for (int q = 0; q < IPT; ++q) {
      if (!iv[q]) continue;
      const int b = ib[q];
      const bool active = t < ilen[q];
      // The partial products of this item's units (two adjacent rows of red in one 64-bit load for
      // 16-bit types).
      float sums[kPair][4] = {};
#pragma unroll
      for (int gate = 0; gate < 4; ++gate) {
        if (!active || (a.skip & kSkipCell)) break;
        const float* rp = red + b * RS + gate * U + iu[q];
        if constexpr (kPair == 2) {
          float2 v = make_float2(0.f, 0.f);
#pragma unroll
          for (int w = 0; w < kParts; ++w) {
            const float2 p = *reinterpret_cast<const float2*>(rp + w * NP * RS);
            v.x += p.x;
            v.y += p.y;
          }
          sums[0][gate] = v.x;
          sums[1][gate] = v.y;
        } else {
          float v = 0.f;
#pragma unroll
          for (int w = 0; w < kParts; ++w) v += rp[w * NP * RS];
          sums[0][gate] = v;
        }
      }
#pragma unroll
      for (int e = 0; e < kPair; ++e) {
        const int u = iu[q] + e, j = j0 + u;
        if (u >= nU) continue;
        E* y = d.y + (static_cast<size_t>(t) * B + b) * a.ldy + j;
        if (a.skip & kSkipCell) {
          // measurement only: h_t = h_{t-1}
        } else if (active) {
          float pre[4];
#pragma unroll
          for (int gate = 0; gate < 4; ++gate) pre[gate] = gx[q][e][gate] + bias[q][e][gate] + sums[e][gate];
          const float ig = act_sigmoid<E>(pre[0]), fg = act_sigmoid<E>(pre[1]), gg = act_tanh<E>(pre[2]),
                      og = act_sigmoid<E>(pre[3]);
          cst[q][e] = fg * cst[q][e] + ig * gg;
          hcur[q][e] = from_f<E>(og * act_tanh<E>(cst[q][e]));
          if (!(a.skip & kSkipWrites)) *y = hcur[q][e];
          if (a.seq && !(a.skip & kSkipWrites)) {
            float* gp = d.gates + (static_cast<size_t>(t) * B + b) * 4 * H + j;
            gp[0] = ig;
            gp[H] = fg;
            gp[2 * H] = gg;
            gp[3 * H] = og;
          }
        } else if (!(a.skip & kSkipWrites)) {
          *y = from_f<E>(0.f);
        }
      }
      // Publish first (the other CTAs, and the group above, wait for it), then the saved state.
      // A reverse group publishes its state (a row becomes active only after its inactive steps,
      // starting from h0); a forward group its output, zero past each length, which is what the
      // group above reads, while its own inactive rows never become active again.
      const bool held = d.reverse || active;
      if (d.flags) {
        E* hx = reinterpret_cast<E*>(d.xchg) + (static_cast<size_t>(s) * B + b) * Hout + j0 + iu[q];
#pragma unroll
        for (int e = 0; e < kPair; ++e)
          if (iu[q] + e < nU) hx[e] = held ? hcur[q][e] : from_f<E>(0.f);
      } else {
        const unsigned data =
            pack_pair<E>(held ? hcur[q][0] : from_f<E>(0.f), held ? hcur[q][kPair - 1] : from_f<E>(0.f));
        st_word(xout + static_cast<size_t>(b) * words + (j0 + iu[q]) / kPair,
                (static_cast<unsigned long long>(s + 1) << 32) | data);
      }
      if (a.seq && !(a.skip & kSkipWrites)) {
        E* h_out = d.h + static_cast<size_t>(d.reverse ? t : t + 1) * B * Hout + static_cast<size_t>(b) * Hout;
        float* c_out = d.c + static_cast<size_t>(d.reverse ? t : t + 1) * B * H + static_cast<size_t>(b) * H;
#pragma unroll
        for (int e = 0; e < kPair; ++e) {
          const int j = j0 + iu[q] + e;
          if (iu[q] + e >= nU) continue;
          h_out[j] = hcur[q][e];
          c_out[j] = cst[q][e];
        }
      }
    }
    if (d.flags) {
      // All of this CTA's values of step s are written: fence, then the flag.
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        st_flag(d.flags + k, static_cast<unsigned>(s + 1));
      }
    }
  }
#pragma unroll
  for (int q = 0; q < IPT; ++q) {
    if (!iv[q]) continue;
#pragma unroll
    for (int e = 0; e < kPair; ++e) {
      const int b = ib[q], j = j0 + iu[q] + e;
      if (iu[q] + e >= nU) continue;
      d.h_n[static_cast<size_t>(b) * Hout + j] = hcur[q][e];
      d.c_n[static_cast<size_t>(b) * H + j] = from_f<E>(cst[q][e]);
    }
  }
}

// Ws [4 units, KS] and Hs [8 n_tiles, KS] in E, red [kWarps, 8 n_tiles, 4 units + kRedPad] floats.
size_t smem_bytes(int units, int n_tiles, int64_t k_total, size_t esize, int pad) {
  const size_t KS = static_cast<size_t>(k_total + pad);
  return (4 * static_cast<size_t>(units) + 8 * static_cast<size_t>(n_tiles)) * KS * esize +
         static_cast<size_t>(kWarps) * (4 * units + kRedPad) * 8 * n_tiles * sizeof(float);
}

// Whether W goes in registers: bf16/fp16, at least two m-tiles per CTA (8 units; with one, the
// register kernel measured 7-12% slower than the shared-memory one on the H200, and with two 3-8%
// faster: docs/KERNELS.md), and every warp's share of the widest group's K (k_tiles of 16; a
// wavefront group projecting its input holds [W_ih | W_hh]) within kRegTiles k-tiles.
bool w_in_registers(DType dtype, int units, int64_t k_tiles) {
  if (dtype == DType::F32 || units < 8) return false;
  const int64_t wm = kWarps / (units / 4);  // warps per m-tile
  return (k_tiles + wm - 1) / wm <= kRegTiles;
}

// Lets `kernel` take `smem` bytes of dynamic shared memory (and, for the cluster kernels,
// clusters of more than 8 CTAs) on the current device. The attributes are set when a launch needs
// more than was set before, so a planned shape's launches set nothing.
void allow_kernel(const void* kernel, size_t smem, bool cluster) {
  int device = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;  // (kernel, device): bytes
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  const auto it = allowed.find(key);
  if (it != allowed.end() && it->second >= smem) return;
  LSTM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (cluster) LSTM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  allowed[key] = smem;
}

// A launch's configuration with one attribute (cooperative, or the cluster's size); it points at
// its own attribute, so it is filled where it stays.
struct LaunchConfig {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  LaunchConfig(unsigned ctas, unsigned threads, size_t smem, cudaStream_t stream) {
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

template <class E, int MT, int NT, int KR>
void launch_kernel(const PersistentArgs<E>& a, int groups, const PersistentShape& p, cudaStream_t stream) {
  auto kernel = persistent_lstm_kernel<E, MT, NT, KR>;
  allow_kernel(reinterpret_cast<const void*>(kernel), p.smem, false);
  LaunchConfig l(static_cast<unsigned>(p.ctas * groups), kBlock, p.smem, stream);
  l.attr[0].id = cudaLaunchAttributeCooperative;
  l.attr[0].val.cooperative = 1;
  LSTM_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, a, p.ctas));
}

template <class E, int MT, int NT>
void launch_one(const PersistentArgs<E>& a, int groups, const PersistentShape& p, cudaStream_t stream) {
  if constexpr (sizeof(E) == 2 && MT >= 2) {
    if (p.w_in_registers) return launch_kernel<E, MT, NT, kRegTiles>(a, groups, p, stream);
  }
  LSTM_REQUIRE(!p.w_in_registers, "persistent LSTM: bad plan (W in registers needs bf16/fp16 and 8+ units)");
  launch_kernel<E, MT, NT, 0>(a, groups, p, stream);
}

template <class E, int MT>
void launch_nt(const PersistentArgs<E>& a, int groups, const PersistentShape& p, cudaStream_t stream) {
  if constexpr (MT == 8) {
    LSTM_REQUIRE(p.n_tiles == 1, "persistent LSTM: bad plan (32 units per CTA need batch <= 8)");
    launch_one<E, MT, 1>(a, groups, p, stream);
  } else {
    switch (p.n_tiles) {
      case 1: return launch_one<E, MT, 1>(a, groups, p, stream);
      case 2: return launch_one<E, MT, 2>(a, groups, p, stream);
      default: return launch_one<E, MT, 4>(a, groups, p, stream);
    }
  }
}

// ---- The cluster variant ---------------------------------------------------------------------
// One thread-block cluster per group (a layer direction whose hidden size fits 16 CTAs): rank r
// owns hidden units [rU, rU + U) with their W_hh rows in its warps' registers; after the cell each
// CTA stores its h_t values straight into every CTA's shared memory (distributed shared memory)
// with st.async, each store counted in the receiving CTA's transaction barrier (an mbarrier that
// expects the bytes of a whole h_t), and a CTA starts step t + 1 when its own barrier says the
// whole h_t has arrived: no cluster-wide barrier and no fence, so the step's global writes (the
// output, the saved state) are never waited for. Hs is double-buffered by step parity, one
// transaction barrier per buffer: a CTA writes h_t into the buffer the others read at step t + 1,
// which they last read at step t - 1, before they sent h_{t-1}, which the writer needed for h_t.
// ($LSTM_PERSISTENT_CLUSTER_SYNC=barrier ends each step with barrier.cluster instead, for
// measurement.)
constexpr int kClusterWarps = 16;
constexpr int kClusterBlock = kClusterWarps * 32;
constexpr int kClusterMax = 16;      // CTAs per cluster (non-portable above 8)
constexpr int kClusterRows = 8;      // batch rows per cluster (larger batches: several clusters)
// The forward's warps by m-tiles per CTA (MT): each warp multiplies cluster_mpw m-tiles (two at
// 8 m-tiles, so that each h fragment read from shared memory serves two products: the product
// reads h from shared memory MT / cluster_mpw times per step, and that is its bottleneck), over
// one of cluster_wk shares of K, holding at most cluster_tiles k-tiles of W per m-tile in registers:
// the planner's smallest slice for each hidden size needs 1 (hidden <= 128), 4 (<= 256) or 8 (<=
// 512).
__host__ __device__ constexpr int cluster_mpw(int mt) { return mt >= 8 ? 2 : 1; }
__host__ __device__ constexpr int cluster_wk(int mt) { return kClusterWarps / (mt / cluster_mpw(mt)); }
__host__ __device__ constexpr int cluster_tiles(int mt) { return mt >= 8 ? 8 : mt >= 4 ? 4 : 1; }
// $LSTM_PERSISTENT_TRACE: per step, the clock at the top of the step, after the wavefront's input
// (taken and the next step's copies issued), after its W_ih product, after the wait, after the
// product, after the CTA barrier, after the cell, after the sends.
constexpr int kTraceStamps = 8;

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // cluster instructions: sm_90 and later
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// The shared-memory address `p` (of this CTA) in the CTA of rank r, as a 32-bit
// shared::cluster address.
__device__ __forceinline__ unsigned cluster_addr(const void* p, unsigned r) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(a), "r"(r));
  return out;
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
}
// Arrives once on this CTA's barrier and adds `bytes` to the transactions its phase waits for
// (relaxed: the arrival publishes nothing, and a release would wait for this thread's global
// writes).
__device__ __forceinline__ void mbar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
}
// Stores into (another CTA's) shared memory that complete their bytes of the transaction barrier
// `bar` there (both shared::cluster addresses)...
__device__ __forceinline__ void st_async2(unsigned addr, uint2 v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
               "r"(v.x), "r"(v.y), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void st_async4(unsigned addr, uint4 v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}
// ... and plain ones (the barrier.cluster variant).
__device__ __forceinline__ void st_cluster2(unsigned addr, uint2 v) {
  asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void st_cluster4(unsigned addr, uint4 v) {
  asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Waits until the phase of parity `parity` of this CTA's barrier has completed; the stores that
// completed its transactions are visible after (CTA scope is enough for them, as for TMA: a
// cluster-scope acquire would also invalidate this SM's L1).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
}
// Asynchronous 16-byte copies of tagged words into shared memory (through L2 only), waited for by
// the issuing thread with cp_async_wait_all. Each aligned 8-byte word is read whole (a word is
// written by one 8-byte store), so its tag still says whether its data is the step's; a word read
// too early is read again with ld_word.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))),
               "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Every thread of every CTA of the cluster: the writes before (to any CTA's shared memory) are
// visible to the reads after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
#endif

// The width of a cluster's shared h buffers: the hidden units rounded up to whole k-tiles and to
// whole slices (every CTA sends a whole slice), plus the bank-conflict padding.
__host__ __device__ constexpr int cluster_ks(int H, int U) {
  const int kh = (H + 15) / 16 * 16, kw = (H + U - 1) / U * U;
  return (kh > kw ? kh : kw) + 8;
}

// The cluster kernels' product: a warp's k-tiles [kb, ke) of W for its MPW m-tiles m0, m0 + 1, ...
// (registers, afr; at most NT each) with 8 rows (an n-tile) of the values at src ([rows, KS]), two
// k-tiles per ldmatrix (lanes 16-31 address the second; past the warp's last tile they re-read it,
// against a zero tile of W), four tiles loaded before their products, each used by the MPW
// m-tiles, NC accumulator chains per m-tile; the warp's partial sums into its slice kp of red
// ([kp][NP][RS] floats, the n-tile's columns first).
template <class E, int MPW, int NT, int NC, int NP, int RS>
__device__ __forceinline__ void cluster_product_tile(const unsigned (&afr)[MPW][NT][4], const E* src, int KS, int kb,
                                                     int ke, int m0, int kp, float* red, int lane) {
  constexpr int KK = 16;
  float acc[MPW][NC][4];
#pragma unroll
  for (int mi = 0; mi < MPW; ++mi)
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][c][q] = 0.f;
  const E* hrow = src + (lane & 7) * KS + ((lane >> 3) & 1) * 8;
  if constexpr (NT == 1) {
    unsigned bf[2];
    ldsm_x2(bf, hrow + kb * KK);
#pragma unroll
    for (int mi = 0; mi < MPW; ++mi) mma_16816<E>(acc[mi][0], afr[mi][0], bf);
  } else {
#pragma unroll
    for (int i0 = 0; i0 < NT; i0 += 4) {
      unsigned bf[4][2];
#pragma unroll
      for (int q = 0; q < 4; q += 2) {
        const int tile = min(kb + i0 + q + (lane >> 4), ke - 1);
        unsigned r4[4];
        ldsm_x4(r4, hrow + tile * KK);
        bf[q][0] = r4[0];
        bf[q][1] = r4[1];
        bf[q + 1][0] = r4[2];
        bf[q + 1][1] = r4[3];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int mi = 0; mi < MPW; ++mi) mma_16816<E>(acc[mi][(i0 + q) % NC], afr[mi][i0 + q], bf[q]);
    }
  }
  const int g = lane >> 2, tq = lane & 3;
  float* rw = red + kp * NP * RS;
#pragma unroll
  for (int mi = 0; mi < MPW; ++mi) {
#pragma unroll
    for (int c = 1; c < NC; ++c)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][0][q] += acc[mi][c][q];
    const int row = (m0 + mi) * 16 + g, col = 2 * tq;
    rw[col * RS + row] = acc[mi][0][0];
    rw[(col + 1) * RS + row] = acc[mi][0][1];
    rw[col * RS + row + 8] = acc[mi][0][2];
    rw[(col + 1) * RS + row + 8] = acc[mi][0][3];
  }
}

// The product for all NP rows (NP / 8 n-tiles, one after the other, so that the registers of one
// serve the next).
template <class E, int MPW, int NT, int NC, int NP, int RS>
__device__ __forceinline__ void cluster_product(const unsigned (&afr)[MPW][NT][4], const E* src, int KS, int kb,
                                                int ke, int m0, int kp, float* red, int lane) {
#pragma unroll
  for (int n = 0; n < NP / 8; ++n)
    cluster_product_tile<E, MPW, NT, NC, NP, RS>(afr, src + n * 8 * KS, KS, kb, ke, m0, kp, red + n * 8 * RS, lane);
}

// MT m-tiles (U = 4 MT units) per CTA; each warp takes cluster_mpw(MT) of them over one of
// cluster_wk(MT) shares of K, holding up to cluster_tiles(MT) k-tiles of W per m-tile in registers;
// the cluster's batch rows (at most 8 NB) in NB tiles of 8. Every thread of the first U B does the
// cell of one (unit, batch row); after it every CTA's h_t goes to every CTA, one 16-byte (8-byte
// for U = 4) st.async per thread and row tile at most.
template <class E, int MT, bool WAVE, int NB>
__global__ void __launch_bounds__(kClusterBlock, 1) persistent_cluster_kernel(const PersistentArgs<E> a, int cl) {
  static_assert(NB == 1 || (NB == 2 && !WAVE), "16-row tiles are for clusters outside the wavefront");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // Clusters are sm_90 and later (the planner offers them only there); the body's instructions
  // would not even compile for the older targets this file's PTX is embedded for.
  __trap();
#else
  constexpr int KK = 16, ROWS = 16 * MT, U = ROWS / 4, NP = 8 * NB, RS = ROWS + kRedPad;
  constexpr int MPW = cluster_mpw(MT);    // m-tiles per warp
  constexpr int MG = MT / MPW;            // warps per share of K
  constexpr int WK = cluster_wk(MT);      // shares of K = partial sums per value
  constexpr int NT = cluster_tiles(MT);   // k-tiles per warp and m-tile, at most
  constexpr int NC = MPW > 1 ? 1 : NT < 4 ? NT : 4;  // accumulator chains per m-tile
  constexpr int VW = U == 4 ? 2 : 4;      // 32-bit words per send (alignment: a slice is U * 2 bytes)
  constexpr int NCH = U / 2 / VW;         // sends per batch row and destination
  // Cluster ci runs group grp on batch rows [b0, b0 + B): `B` below is the cluster's rows, `BT`
  // the whole batch (the row stride of every [T, BT, ...] buffer), global row b0 + b.
  const int ci = blockIdx.x / cl, grp = ci % a.groups, b0 = ci / a.groups * a.rows;
  const unsigned rank = cluster_rank();
  const PersistentGroup<E>& d = a.group[grp];
  const int H = a.H, BT = a.B, B = min(a.rows, BT - b0), T = a.T;
  const int KS = cluster_ks(H, U), KT = (H + KK - 1) / KK;
  extern __shared__ __align__(16) unsigned char smem[];
  E* Ws = reinterpret_cast<E*>(smem);        // [ROWS, KS], read once into registers
  E* Hs = Ws + ROWS * KS;                      // [2][NP, KS]: h_{t-1} by step parity
  float* red = reinterpret_cast<float*>(Hs + 2 * NP * KS);  // [WK][NP][RS]
  float* bias_s = red + WK * NP * RS;                        // [4][U]: b_ih + b_hh of the CTA's units
  // [2]: the transaction barriers of the two Hs buffers (8-byte aligned: 4 U floats before).
  auto* bars = reinterpret_cast<unsigned long long*>(bias_s + 4 * U);
  E* stage = reinterpret_cast<E*>(bars + 2);  // [NP][U]: this CTA's h_t, what it sends
  // A projection group of the wavefront (d.gx_out set): Xs [NP, KS] the input of the step, the
  // layer below's h_t from its exchange words.
  E* Xs = stage + NP * U;
  // A layer above the first (d.gx_in): [NP * U][4] its cell threads' tagged x-projection words of
  // the next step, copied while the step before runs (16-byte aligned).
  auto* gxs = reinterpret_cast<unsigned long long*>(Xs + NP * KS);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int j0 = static_cast<int>(rank) * U, nU = min(U, H - j0);
  long long* const trace = a.trace && grp == a.trace_group && b0 == 0 && tid == 0 &&
                                   (rank == 0 || static_cast<int>(rank) == cl - 1)
                               ? a.trace + (rank == 0 ? 0 : 1) * static_cast<size_t>(T) * kTraceStamps
                               : nullptr;
  auto stamp = [&](int s, int k) {
    if (trace) trace[static_cast<size_t>(s) * kTraceStamps + k] = clock64();
  };

  // The rows this CTA multiplies: its units' rows of W_hh, or of W_ih in a projection group.
  const bool proj = WAVE && d.gx_out;
  const E* const w_src = proj ? d.w_ih : d.w_hh;
  const int w_cols = proj ? d.in_size : H;
  for (int i = tid; i < ROWS * KS; i += kClusterBlock) {
    const int r = i / KS, col = i - r * KS;
    const int gate = r / U, u = r - gate * U;
    E v = from_f<E>(0.f);
    if (u < nU && col < w_cols) v = w_src[static_cast<size_t>(gate * H + j0 + u) * w_cols + col];
    Ws[i] = v;
  }
  for (int i = tid; i < 2 * NP * KS; i += kClusterBlock) Hs[i] = from_f<E>(0.f);
  for (int i = tid; i < WK * NP * RS; i += kClusterBlock) red[i] = 0.f;  // warps without k-tiles never write theirs
  for (int i = tid; i < NP * U; i += kClusterBlock) stage[i] = from_f<E>(0.f);
  if (proj)
    for (int i = tid; i < NP * KS; i += kClusterBlock) Xs[i] = from_f<E>(0.f);
  for (int i = tid; i < 4 * U; i += kClusterBlock) {
    const int gate = i / U, u = i - gate * U, j = j0 + u;
    bias_s[i] = u < nU && d.b_ih ? to_f(d.b_ih[gate * H + j]) + to_f(d.b_hh[gate * H + j]) : 0.f;
  }
  const bool mbar = !a.cluster_barrier;
  // The bytes of one h_t: every CTA sends its whole slice of every batch row.
  const unsigned step_bytes = static_cast<unsigned>(cl * B * U) * sizeof(E);
  if (tid == 0 && mbar) {
    mbar_init(&bars[0], 1);
    mbar_init(&bars[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    mbar_expect(&bars[1], step_bytes);  // h_0, read at step 1
  }
  __syncthreads();
  // The initial state's slot (this cluster's first row of it).
  const size_t h_first = (a.seq && d.reverse ? static_cast<size_t>(T) * BT * H : 0) + static_cast<size_t>(b0) * H;
  const size_t c_first = h_first;
  if (!proj) copy_h_to_shared(Hs, d.h + h_first, B, H, KS);  // h0 into buffer 0 (every CTA its own copy)
  // Warp w: m-tiles m0 .. m0 + MPW - 1 (m0 = MPW (w % MG)), k-tiles [kb, ke) of its share w / MG
  // (ke - kb <= NT: the planner).
  const int m0 = warp % MG * MPW, kp = warp / MG;
  const int kb = kp * KT / WK, ke = (kp + 1) * KT / WK;
  unsigned afr[MPW][NT][4];
#pragma unroll
  for (int mi = 0; mi < MPW; ++mi)
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      if (kb + i < ke)
        ldsm_x4(afr[mi][i], Ws + ((m0 + mi) * 16 + (lane & 15)) * KS + (kb + i) * KK + (lane >> 4) * 8);
      else
        afr[mi][i][0] = afr[mi][i][1] = afr[mi][i][2] = afr[mi][i][3] = 0u;  // a zero tile: its product adds nothing
    }
  // This thread's send: chunk c (VW words) of batch row `row` to rank r, the same chunk of the
  // same buffer every step (the parity's buffer and barrier are an offset away). With 16-row tiles
  // a thread sends the chunk of rows `row` and `row + 8` (cl x 8 x NCH <= kClusterBlock).
  bool sender, sender2 = false;
  unsigned send_dst = 0, send_bar = 0;
  const E* send_src = stage;
  if constexpr (NB == 1) {
    sender = tid < cl * B * NCH;
    if (sender) {
      const int r = tid / (B * NCH), rest = tid - r * (B * NCH), row = rest / NCH, c = rest - row * NCH;
      send_dst = cluster_addr(Hs + row * KS + j0 + c * VW * 2, static_cast<unsigned>(r));
      send_bar = cluster_addr(bars, static_cast<unsigned>(r));
      send_src = stage + row * U + c * VW * 2;
    }
  } else {
    const int r = tid / (8 * NCH), rest = tid - r * (8 * NCH), row = rest / NCH, c = rest - row * NCH;
    sender = r < cl && row < B;
    sender2 = r < cl && row + 8 < B;
    if (sender) {
      send_dst = cluster_addr(Hs + row * KS + j0 + c * VW * 2, static_cast<unsigned>(r));
      send_bar = cluster_addr(bars, static_cast<unsigned>(r));
      send_src = stage + row * U + c * VW * 2;
    }
  }
  // This thread's cell item: batch row b of unit j0 + u.
  const bool iv = tid < nU * B;
  const int b = iv ? tid % B : 0, u = iv ? tid / B : 0, j = j0 + u, gb = b0 + b;
  float cst = iv && !proj ? d.c[c_first + static_cast<size_t>(b) * H + j] : 0.f;
  E hcur = iv && !proj ? d.h[h_first + static_cast<size_t>(b) * H + j] : from_f<E>(0.f);
  const int len = iv ? a.len[gb] : 0;
  // The x-projection values of the next step, loaded at the end of a step (their latency passes
  // during the wait and the product): plain floats of the GEMM before the launch, or, for a layer
  // of the wavefront above the first (d.gx_in), the tagged words its projection group writes (the
  // tag checked at the cell, where a word read before it was written is read again).
  float gx[4];
  auto load_gx = [&](int s_load) {
    const int t_load = d.reverse ? T - 1 - s_load : s_load;
    const bool on = iv && !proj && s_load < T && !(a.skip & kSkipGates);
    if constexpr (WAVE) {
      if (d.gx_in) {
        if (on) {
          const unsigned long long* src = d.gx_in + ((static_cast<size_t>(t_load) * BT + gb) * H + j) * 4;
          cp_async16(gxs + tid * 4, src);
          cp_async16(gxs + tid * 4 + 2, src + 2);
        }
        return;
      }
    }
    const float* g = d.gates + (static_cast<size_t>(t_load) * BT + gb) * 4 * H + j;
#pragma unroll
    for (int gate = 0; gate < 4; ++gate) gx[gate] = on ? g[gate * H] : 0.f;
  };
  auto gx_value = [&](int gate, int s_now) -> float {
    if constexpr (WAVE) {
      if (d.gx_in) {
        if (a.skip & kSkipGates) return 0.f;
        cp_async_wait_all();
        unsigned long long v = gxs[tid * 4 + gate];
        const unsigned long long* src = d.gx_in + ((static_cast<size_t>(s_now) * BT + gb) * H + j) * 4 + gate;
        while (!(a.skip & kSkipWait) && static_cast<unsigned>(v >> 32) != static_cast<unsigned>(s_now + 1)) {
          if (!(a.skip & kSkipSleep)) __nanosleep(32);
          v = ld_word(src);
        }
        return __uint_as_float(static_cast<unsigned>(v));
      }
    }
    return gx[gate];
  };
  load_gx(0);
  // A projection group's input, one step ahead: every thread loads the same words of each step's
  // slot of the layer below's exchange (XPT at most; relaxed loads, which read the coherent value)
  // while the step before runs, and at the step checks their tags (polling only those the
  // layer below had not written yet) and unpacks them into Xs. A group that had to wait falls a
  // little further behind the layer below, until its loads find the words there.
  constexpr int XPT = 4;  // B * (H + 1) / 2 <= 8 * 256 words: the planner's hidden <= 512
  const int xw = proj ? (d.in_size + 1) / 2 : 1, nx = proj ? B * xw : 0;
  unsigned long long xv[XPT];
  auto x_prefetch = [&](int s_next) {
    const unsigned long long* src = d.in_xchg + static_cast<size_t>(s_next) * nx;
#pragma unroll
    for (int k = 0; k < XPT; ++k) {
      const int i = tid + k * kClusterBlock;
      xv[k] = 0ull;
      if (s_next < T && i < nx) xv[k] = ld_word(src + i);
    }
  };
  auto x_take = [&](int s_now) {
    const unsigned long long* src = d.in_xchg + static_cast<size_t>(s_now) * nx;
    const unsigned tag = static_cast<unsigned>(s_now + 1);
#pragma unroll
    for (int k = 0; k < XPT; ++k) {
      const int i = tid + k * kClusterBlock;
      if (i >= nx) continue;
      unsigned long long v = xv[k];
      while (!(a.skip & kSkipWait) && static_cast<unsigned>(v >> 32) != tag) {
        if (!(a.skip & kSkipSleep)) __nanosleep(32);
        v = ld_word(src + i);
      }
      const int row = i / xw, w = i - row * xw;
      *reinterpret_cast<unsigned*>(Xs + row * KS + w * kValuesPerWord<E>) = static_cast<unsigned>(v);
    }
  };
  // The product of this CTA's rows of W (registers) with the [NP, KS] values at src (h_{t-1}, or a
  // projection group's input), each warp's partial sums into red.
  auto multiply = [&](const E* src) {
    cluster_product<E, MPW, NT, NC, NP, RS>(afr, src, KS, kb, ke, m0, kp, red, lane);
  };
  // Row b of unit u's gate `gate`: the sum of the warps' partial sums.
  auto reduced = [&](int gate) {
    const float* rp = red + b * RS + gate * U + u;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) v += rp[w * NP * RS];
    return v;
  };
  if (proj) x_prefetch(0);
  cluster_sync();  // every CTA started and its buffers zeroed before anyone writes into them

  if constexpr (WAVE) {
    if (proj) {
      // A projection group: per step the layer below's h_s (its exchange words) times this CTA's
      // rows of W_ih, handed to the layer's cluster as tagged fp32 words (gx_out), which it loads a
      // step ahead as layer 0 loads its GEMM's output. Nothing crosses this cluster's CTAs.
      for (int s = 0; s < T; ++s) {
        stamp(s, 0);
        x_take(s);
        __syncthreads();
        x_prefetch(s + 1);
        stamp(s, 1);
        if (ke > kb && !(a.skip & (kSkipProduct | kSkipInput))) multiply(Xs);
        stamp(s, 2);
        __syncthreads();
        if (iv) {
          unsigned long long* g = d.gx_out + ((static_cast<size_t>(s) * BT + gb) * H + j) * 4;
#pragma unroll
          for (int gate = 0; gate < 4; ++gate)
            st_word(g + gate, (static_cast<unsigned long long>(s + 1) << 32) | __float_as_uint(reduced(gate)));
        }
        for (int k = 3; k < kTraceStamps; ++k) stamp(s, k);
      }
      return;
    }
  }

  for (int s = 0; s < T; ++s) {
    const int t = d.reverse ? T - 1 - s : s;
    const E* Hcur = Hs + (s & 1) * NP * KS;
    stamp(s, 0);
    const bool prod = ke > kb && !(a.skip & kSkipProduct);
    stamp(s, 1);
    stamp(s, 2);
    if (mbar) {
      // h_{s-1} is in (buffer s & 1, filled for the ((s - 1) / 2)-th time; step 0 reads h0).
      if (s > 0) mbar_wait(&bars[s & 1], static_cast<unsigned>(((s - 1) >> 1) & 1));
      // That buffer's next phase: h_{s+1}, read at step s + 2 (it cannot arrive before every CTA
      // has h_s, so after this thread's wait above).
      if (tid == 0 && s + 2 < T) mbar_expect(&bars[s & 1], step_bytes);
    }
    stamp(s, 3);
    if (prod) multiply(Hcur);
    stamp(s, 4);
    __syncthreads();
    stamp(s, 5);
    if (iv) {
      const bool active = t < len;
      if (active && !(a.skip & kSkipCell)) {
        float pre[4];
#pragma unroll
        for (int gate = 0; gate < 4; ++gate) pre[gate] = gx_value(gate, s) + bias_s[gate * U + u] + reduced(gate);
        const float ig = act_sigmoid<E>(pre[0]), fg = act_sigmoid<E>(pre[1]), gg = act_tanh<E>(pre[2]),
                    og = act_sigmoid<E>(pre[3]);
        cst = fg * cst + ig * gg;
        hcur = from_f<E>(og * act_tanh<E>(cst));
        if (a.seq) {
          float* gp = d.gates + (static_cast<size_t>(t) * BT + gb) * 4 * H + j;
          gp[0] = ig;
          gp[H] = fg;
          gp[2 * H] = gg;
          gp[3 * H] = og;
        }
      }
      // h_t (or, for a reverse row not yet started, h0; a finished forward row publishes zero,
      // never read again) into the staging buffer the senders read.
      stage[b * U + u] = d.reverse || active ? hcur : from_f<E>(0.f);
    }
    stamp(s, 6);
    __syncthreads();
    if (sender && (s + 1 < T || !mbar)) {  // with the transaction barriers h_{T-1} goes nowhere (a CTA may have left)
      const unsigned parity = static_cast<unsigned>((s + 1) & 1);
      const unsigned dst = send_dst + parity * NP * KS * static_cast<unsigned>(sizeof(E));
      const unsigned bar = send_bar + parity * static_cast<unsigned>(sizeof(unsigned long long));
      auto send = [&](unsigned to, const E* from) {
        if constexpr (VW == 4) {
          const uint4 v = *reinterpret_cast<const uint4*>(from);
          if (mbar)
            st_async4(to, v, bar);
          else
            st_cluster4(to, v);
        } else {
          const uint2 v = *reinterpret_cast<const uint2*>(from);
          if (mbar)
            st_async2(to, v, bar);
          else
            st_cluster2(to, v);
        }
      };
      send(dst, send_src);
      if (NB > 1 && sender2) send(dst + 8 * KS * static_cast<unsigned>(sizeof(E)), send_src + 8 * U);
    }
    if (WAVE && d.xchg && tid < B * (U / 2)) {
      // The wavefront: h_t (the output) for the layer above, as tagged exchange words.
      const int row = tid / (U / 2), w = tid - row * (U / 2), words = (H + 1) / 2;
      if (j0 / 2 + w < words)
        st_word(d.xchg + (static_cast<size_t>(s) * BT + b0 + row) * words + j0 / 2 + w,
                (static_cast<unsigned long long>(s + 1) << 32) |
                    reinterpret_cast<const unsigned*>(stage)[row * (U / 2) + w]);
    }
    stamp(s, 7);
    // Then the output and the saved state (off the critical path: the next wait absorbs them).
    if (iv && !(a.skip & kSkipWrites)) {
      const bool active = t < len;
      d.y[(static_cast<size_t>(t) * BT + gb) * a.ldy + j] = active ? hcur : from_f<E>(0.f);
      if (a.seq) {
        const size_t slot = static_cast<size_t>(d.reverse ? t : t + 1) * BT * H + static_cast<size_t>(gb) * H + j;
        d.h[slot] = hcur;
        d.c[slot] = cst;
      }
    }
    load_gx(s + 1);
    // With the transaction barriers no CTA-wide barrier is needed here: the next step's product
    // (which rewrites the partial sums) and cell (which rewrites the staging buffer) start after
    // the barrier above, which every sender passed after reading the sums and before its send.
    if (!mbar) cluster_sync();
  }
  if (mbar) cluster_sync();  // no CTA leaves while another may still store into it
  if (iv) {
    d.h_n[static_cast<size_t>(gb) * H + j] = hcur;
    d.c_n[static_cast<size_t>(gb) * H + j] = from_f<E>(cst);
  }
#endif
}

// Shared memory of the forward's cluster kernel with batch tiles of `rows` (8 or 16) rows.
size_t cluster_smem_bytes(int units, int64_t H, bool wavefront, int rows) {
  const size_t KS = static_cast<size_t>(cluster_ks(static_cast<int>(H), units));
  const int MT = units / 4;
  // (The wavefront's Xs, rows x KS values, and gxs, rows x units x 4 words.)
  const size_t NP = static_cast<size_t>(rows);
  return (4 * static_cast<size_t>(units) + 2 * NP + (wavefront ? NP : 0)) * KS * 2 +
         (wavefront ? NP * static_cast<size_t>(units) * 4 * 8 : 0) +
         (static_cast<size_t>(cluster_wk(MT)) * NP * (4 * units + kRedPad) + 4 * units) * sizeof(float) +
         2 * sizeof(unsigned long long) + NP * static_cast<size_t>(units) * 2;
}

// ---- The cluster backward ------------------------------------------------------------------
// One cluster per direction, rank r owning hidden units [rU, rU + U) as in the forward, but now
// the outputs of the product are its units of dh_{t-1} = W_hh^T dG_t, so a CTA holds the columns
// of W_hh of its units (W_hh^T rows: MROWS x 4Hc, Hc = the cluster's padded hidden width) in
// registers and every CTA needs all of dG_t: each sends its units' slice of the four gates of
// every batch row to every CTA (4 x B x U values), a transaction barrier per buffer as in the
// forward. The cell's backward is one (unit, row) per thread with dh and dc in registers.
template <int U>
struct ClusterBack {
  static constexpr int MROWS = U < 16 ? 16 : U;        // m-tile rows (units past U are zero rows)
  static constexpr int MT = MROWS / 16;                // m-tiles per CTA: 1 or 2
  static constexpr int WK = kClusterWarps / MT;        // warps per m-tile, splitting K
  static constexpr int NT = MT == 2 ? 16 : 4;          // k-tiles per warp at most (hidden <= 512)
  static constexpr int NC = MT == 2 ? 2 : 4;           // accumulator chains
  static constexpr int VW = U == 4 ? 2 : 4;            // 32-bit words per send
  static constexpr int NCH = U / 2 / VW;               // sends per (row, gate, destination)
  static constexpr int RS = MROWS + kRedPad;
};

// Columns of the backward's shared dG buffers: the four gates of the padded hidden width, whole
// k-tiles, plus the bank-conflict padding.
__host__ __device__ constexpr int cluster_back_ks(int H, int U) { return 4 * ((H + U - 1) / U * U) + 8; }

template <class E, int U>
__global__ void __launch_bounds__(kClusterBlock, 1) persistent_cluster_backward_kernel(const PersistentBackArgs<E> a,
                                                                                      int cl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();
#else
  using C = ClusterBack<U>;
  constexpr int KK = 16, NP = kClusterRows, MROWS = C::MROWS, MT = C::MT, WK = C::WK, NT = C::NT, NC = C::NC, VW = C::VW,
                NCH = C::NCH, RS = C::RS;
  const unsigned rank = cluster_rank();
  // Cluster blockIdx.x / cl sweeps batch rows [b0, b0 + B) of the BT (the forward's batch groups).
  const int b0 = static_cast<int>(blockIdx.x) / cl * a.rows;
  const int H = a.H, BT = a.B, B = min(a.rows, BT - b0), T = a.T;
  const int Hc = cl * U, KS = cluster_back_ks(H, U), KT = 4 * Hc / KK;
  extern __shared__ __align__(16) unsigned char smem[];
  E* Ws = reinterpret_cast<E*>(smem);                       // [MROWS, KS]: W_hh^T rows, read once into registers
  E* Gs = Ws + MROWS * KS;                                  // [2][NP, KS]: dG of the previous processed step
  float* red = reinterpret_cast<float*>(Gs + 2 * NP * KS);  // [WK][NP][RS]
  auto* bars = reinterpret_cast<unsigned long long*>(red + WK * NP * RS);
  E* stage = reinterpret_cast<E*>(bars + 2);                // [NP][4U]: this CTA's dG_t, what it sends
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int j0 = static_cast<int>(rank) * U, nU = min(U, H - j0);

  // W_hh^T rows of this CTA's units: Ws[m][gate * Hc + k] = W_hh[gate * H + k][j0 + m]
  // (consecutive threads on consecutive m: coalesced reads of W_hh's rows).
  for (int i = tid; i < MROWS * 4 * Hc; i += kClusterBlock) {
    const int m = i % MROWS, col = i / MROWS, gate = col / Hc, k = col - gate * Hc;
    E v = from_f<E>(0.f);
    if (m < nU && k < H) v = a.w_hh[static_cast<size_t>(gate * H + k) * H + j0 + m];
    Ws[m * KS + col] = v;
  }
  for (int i = tid; i < 2 * NP * KS; i += kClusterBlock) Gs[i] = from_f<E>(0.f);
  for (int i = tid; i < WK * NP * RS; i += kClusterBlock) red[i] = 0.f;
  for (int i = tid; i < NP * 4 * U; i += kClusterBlock) stage[i] = from_f<E>(0.f);
  const unsigned step_bytes = static_cast<unsigned>(cl * B * 4 * U) * sizeof(E);
  if (tid == 0) {
    mbar_init(&bars[0], 1);
    mbar_init(&bars[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    mbar_expect(&bars[1], step_bytes);  // dG of processed step 0, read at step 1
  }
  __syncthreads();
  const int m = warp % MT, kp = warp / MT;
  const int kb = kp * KT / WK, ke = (kp + 1) * KT / WK;  // ke - kb <= NT (the planner)
  unsigned afr[1][NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    if (kb + i < ke)
      ldsm_x4(afr[0][i], Ws + (m * 16 + (lane & 15)) * KS + (kb + i) * KK + (lane >> 4) * 8);
    else
      afr[0][i][0] = afr[0][i][1] = afr[0][i][2] = afr[0][i][3] = 0u;
  }
  // This thread's cell item: batch row b of unit j0 + u.
  const bool iv = tid < nU * B;
  const int b = iv ? tid % B : 0, u = iv ? tid / B : 0, j = j0 + u, gb = b0 + b;
  const int len = iv ? a.len[gb] : 0;
  float dh = iv && a.dhn ? to_f(a.dhn[static_cast<size_t>(gb) * H + j]) : 0.f;
  float dc = iv && a.dcn ? to_f(a.dcn[static_cast<size_t>(gb) * H + j]) : 0.f;
  float dhp = 0.f;
  // The next processed step's saved values (loaded a step ahead: they do not depend on the sweep).
  float ig = 0.f, fg = 0.f, gg = 0.f, og = 0.f, ct = 0.f, cp = 0.f, dyv = 0.f;
  auto load = [&](int s_load) {
    const int t = a.reverse ? s_load : T - 1 - s_load;
    if (!iv || s_load >= T || t >= len) return;
    const size_t row = static_cast<size_t>(t) * BT + gb;  // (t, gb); c's slots are rows of [T + 1, BT]
    const float* g = a.gates + row * 4 * H + j;
    ig = g[0];
    fg = g[H];
    gg = g[2 * H];
    og = g[3 * H];
    ct = a.c[(a.reverse ? row : row + BT) * H + j];
    cp = a.c[(a.reverse ? row + BT : row) * H + j];
    dyv = a.dy[row * a.ldy + j];
  };
  // dh_{t-1} of this thread's (unit, row) from dG in buffer `buf`: the product (the forward's),
  // then the sum of the warps' partial sums. Every thread calls it (it has CTA barriers).
  auto product = [&](const E* Gcur) {
    if (ke > kb) cluster_product<E, 1, NT, NC, NP, RS>(afr, Gcur, KS, kb, ke, m, kp, red, lane);
    __syncthreads();
    if (iv) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < WK; ++w) v += red[w * NP * RS + b * RS + u];
      dhp = v;
    }
  };
  load(0);
  cluster_sync();  // every CTA started and its buffers zeroed before anyone writes into them

  for (int s = 0; s < T; ++s) {
    const int t = a.reverse ? s : T - 1 - s;
    const int tp = a.reverse ? t - 1 : t + 1;  // the time of the previous processed step
    if (s > 0) mbar_wait(&bars[s & 1], static_cast<unsigned>(((s - 1) >> 1) & 1));
    // The buffer's next phase: dG of processed step s + 1, read at step s + 2 (the last read is
    // the one after the loop, at step T).
    if (tid == 0 && s + 2 <= T) mbar_expect(&bars[s & 1], step_bytes);
    if (s > 0) product(Gs + (s & 1) * NP * KS);
    if (iv) {
      // dh carries d_h_n until the row's last step, then the recurrent gradient of the step after.
      if (s > 0 && tp < len) dh = dhp;
      float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
      if (t < len) {
        const float dm = dh + dyv;
        const float tc = act_tanh<E>(ct);
        const float dct = dc + dm * og * (1.f - tc * tc);
        d0 = dct * gg * ig * (1.f - ig);
        d1 = dct * cp * fg * (1.f - fg);
        d2 = dct * ig * (1.f - gg * gg);
        d3 = dm * tc * og * (1.f - og);
        dc = dct * fg;
      }
      const E e0 = from_f<E>(d0), e1 = from_f<E>(d1), e2 = from_f<E>(d2), e3 = from_f<E>(d3);
      E* st = stage + b * 4 * U + u;
      st[0] = e0;
      st[U] = e1;
      st[2 * U] = e2;
      st[3 * U] = e3;
      E* dg = a.dg + (static_cast<size_t>(t) * BT + gb) * 4 * H + j;
      dg[0] = e0;
      dg[H] = e1;
      dg[2 * H] = e2;
      dg[3 * H] = e3;
    }
    __syncthreads();
    // The sends: chunk (rank, row, gate, c) of dG_t, each thread a few.
    {
      const unsigned parity = static_cast<unsigned>((s + 1) & 1);
      for (int i = tid; i < cl * B * 4 * NCH; i += kClusterBlock) {
        const int c = i % NCH, q = i / NCH, gate = q & 3, rest = q >> 2, row = rest % B, r = rest / B;
        const E* src = stage + row * 4 * U + gate * U + c * VW * 2;
        const unsigned dst = cluster_addr(Gs + parity * NP * KS + row * KS + gate * Hc + j0 + c * VW * 2,
                                          static_cast<unsigned>(r));
        const unsigned bar = cluster_addr(&bars[parity], static_cast<unsigned>(r));
        if constexpr (VW == 4)
          st_async4(dst, *reinterpret_cast<const uint4*>(src), bar);
        else
          st_async2(dst, *reinterpret_cast<const uint2*>(src), bar);
      }
    }
    load(s + 1);
    // No CTA-wide barrier here: the next step's product (which rewrites the partial sums) and cell
    // (which rewrites the staging buffer) come after this CTA's barrier has seen every word its
    // own threads sent, each after reading what it sent.
  }
  // dh_{t-1} of the last processed step, for d_h0.
  mbar_wait(&bars[T & 1], static_cast<unsigned>(((T - 1) >> 1) & 1));
  product(Gs + (T & 1) * NP * KS);
  if (iv) {
    const int tl = a.reverse ? T - 1 : 0;
    if (a.dh0) a.dh0[static_cast<size_t>(gb) * H + j] = from_f<E>(tl < len ? dhp : dh);
    if (a.dc0) a.dc0[static_cast<size_t>(gb) * H + j] = from_f<E>(dc);
  }
  cluster_sync();  // no CTA leaves before every CTA has passed its last wait
#endif
}

size_t cluster_back_smem_bytes(int units, int64_t H) {
  const int mrows = units < 16 ? 16 : units, mt = mrows / 16;
  const size_t KS = static_cast<size_t>(cluster_back_ks(static_cast<int>(H), units));
  constexpr size_t NP = kClusterRows;
  return (static_cast<size_t>(mrows) + 2 * NP) * KS * 2 +
         static_cast<size_t>(kClusterWarps / mt) * NP * (mrows + kRedPad) * sizeof(float) +
         2 * sizeof(unsigned long long) + NP * 4 * static_cast<size_t>(units) * 2;
}

// $LSTM_PERSISTENT_TRACE: runs the launch with clock stamps, waits for it, and prints the
// median cycles of each stage of a step (steps 16 to T - 16) to stderr. Measurement only.
template <class E, class K>
void trace_cluster_launch(const cudaLaunchConfig_t& cfg, K kernel, PersistentArgs<E> a, int cl, int group) {
  const size_t n = 2 * static_cast<size_t>(a.T) * kTraceStamps;
  long long* buf = nullptr;
  LSTM_CUDA_CHECK(cudaMalloc(&buf, n * sizeof(long long)));
  a.trace = buf;
  a.trace_group = group;
  cudaEvent_t e0, e1;
  LSTM_CUDA_CHECK(cudaEventCreate(&e0));
  LSTM_CUDA_CHECK(cudaEventCreate(&e1));
  LSTM_CUDA_CHECK(cudaEventRecord(e0, cfg.stream));
  LSTM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, cl));
  LSTM_CUDA_CHECK(cudaEventRecord(e1, cfg.stream));
  std::vector<long long> h(n);
  LSTM_CUDA_CHECK(cudaMemcpyAsync(h.data(), buf, n * sizeof(long long), cudaMemcpyDeviceToHost, cfg.stream));
  LSTM_CUDA_CHECK(cudaStreamSynchronize(cfg.stream));
  float ms = 0.f;
  LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  LSTM_CUDA_CHECK(cudaFree(buf));
  LSTM_CUDA_CHECK(cudaEventDestroy(e0));
  LSTM_CUDA_CHECK(cudaEventDestroy(e1));
  const char* names[kTraceStamps] = {"input",       "input product", "wait",          "product",
                                     "CTA barrier", "cell",          "barrier+sends", "writes+x-proj load+loop"};
  for (int c = 0; c < 2; ++c) {
    std::fprintf(stderr,
                 "persistent trace: T=%d B=%d H=%d, group %d, CTA %d of %d, launch %.3f ms, median cycles per step:",
                 a.T, a.B, a.H, group, c == 0 ? 0 : cl - 1, cl, ms);
    const long long* t = h.data() + static_cast<size_t>(c) * a.T * kTraceStamps;
    long long total = 0;
    for (int k = 0; k < kTraceStamps; ++k) {
      std::vector<long long> d;
      for (int s = 16; s < a.T - 16; ++s) {
        const long long from = t[static_cast<size_t>(s) * kTraceStamps + k];
        const long long to = k + 1 < kTraceStamps ? t[static_cast<size_t>(s) * kTraceStamps + k + 1]
                                                  : t[static_cast<size_t>(s + 1) * kTraceStamps];
        d.push_back(to - from);
      }
      std::nth_element(d.begin(), d.begin() + static_cast<long>(d.size() / 2), d.end());
      total += d[d.size() / 2];
      std::fprintf(stderr, " %s %lld,", names[k], d[d.size() / 2]);
    }
    const long long span = t[static_cast<size_t>(a.T - 16) * kTraceStamps] - t[16 * kTraceStamps];
    std::fprintf(stderr, " sum of medians %lld, mean step %lld\n", total, span / (a.T - 32));
  }
}

// `clusters` clusters of the cluster kernels' block, p.ctas CTAs each.
struct ClusterConfig : LaunchConfig {
  ClusterConfig(int clusters, const PersistentShape& p, cudaStream_t stream)
      : LaunchConfig(static_cast<unsigned>(p.ctas * clusters), kClusterBlock, p.smem, stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(p.ctas);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
  }
};

// How many clusters of `kernel` under plan p the current device holds at once (and the kernel
// allowed p's shared memory and cluster size): planning time, not launch time.
int resident_clusters(const void* kernel, const PersistentShape& p) {
  allow_kernel(kernel, p.smem, true);
  ClusterConfig l(1, p, nullptr);
  int clusters = 0;
  LSTM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &l.cfg));
  return clusters;
}

// The cluster kernel of a slice of `units` units (wave: the instantiation of the stack's
// wavefront, whose groups above the first project their input themselves).
template <class E, bool WAVE, int NB>
auto cluster_kernel_nb(int units) {
  switch (units) {
    case 4: return persistent_cluster_kernel<E, 1, WAVE, NB>;
    case 8: return persistent_cluster_kernel<E, 2, WAVE, NB>;
    case 16: return persistent_cluster_kernel<E, 4, WAVE, NB>;
    case 32: return persistent_cluster_kernel<E, 8, WAVE, NB>;
    default: LSTM_THROW("persistent LSTM: bad plan (" << units << " units per CTA)");
  }
}
// The kernel of plan p: the wavefront's instantiation (wave) or a single layer's, with 8- or
// 16-row batch tiles.
template <class E>
auto cluster_kernel(const PersistentShape& p, bool wave) {
  if (wave) return cluster_kernel_nb<E, true, 1>(p.units);
  return p.tile_rows() > 8 ? cluster_kernel_nb<E, false, 2>(p.units) : cluster_kernel_nb<E, false, 1>(p.units);
}
template <class E>
auto cluster_backward_kernel(int units) {
  switch (units) {
    case 4: return persistent_cluster_backward_kernel<E, 4>;
    case 8: return persistent_cluster_backward_kernel<E, 8>;
    case 16: return persistent_cluster_backward_kernel<E, 16>;
    case 32: return persistent_cluster_backward_kernel<E, 32>;
    default: LSTM_THROW("persistent LSTM backward: bad plan (" << units << " units per CTA)");
  }
}

template <class E>
void launch_cluster(const PersistentArgs<E>& a, int groups, const PersistentShape& p, cudaStream_t stream) {
  if constexpr (sizeof(E) != 2) {
    LSTM_THROW("persistent LSTM: bad plan (the cluster kernels are bf16/fp16)");
  } else {
    // The wavefront (layers above the first reading their x-projection from projection groups)
    // has its own instantiation: the single layers' kernel keeps its registers. Its groups wait on
    // each other (layer l on its projection, which waits on layer l-1), so all of its clusters
    // must be resident at once; other launches' clusters are independent.
    const bool wave = groups > 1 && a.group[1].gx_in;
    const auto kernel = cluster_kernel<E>(p, wave);
    LSTM_REQUIRE(p.resident >= (wave ? groups : 1),
                 "persistent LSTM: the device places " << p.resident << " clusters of " << p.ctas << " CTAs with "
                                                       << p.smem << " bytes of shared memory each at once; "
                                                       << (wave ? groups : 1) << " are needed");
    LSTM_REQUIRE(p.rows > 0 && p.rows <= 2 * kClusterRows && p.batch_groups >= 1 &&
                     static_cast<int64_t>(p.rows) * p.batch_groups >= a.B && (p.batch_groups == 1 || !wave) &&
                     (p.rows <= kClusterRows || !wave),
                 "persistent LSTM: bad plan (" << p.batch_groups << " batch groups of " << p.rows << " rows for batch "
                                               << a.B << (wave ? ", wavefront" : "") << ")");
    PersistentArgs<E> args = a;
    args.groups = groups;
    args.rows = p.rows;
    allow_kernel(reinterpret_cast<const void*>(kernel), p.smem, true);
    ClusterConfig l(groups * p.batch_groups, p, stream);
    if (const int traced = persistent_knobs().trace; traced > 0 && a.T >= 64) {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      LSTM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
      if (capturing == cudaStreamCaptureStatusNone)
        return trace_cluster_launch(l.cfg, kernel, args, p.ctas, std::min(traced, groups) - 1);
    }
    LSTM_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, args, p.ctas));
  }
}

// How many clusters of plan p's kernel the current device holds at once.
template <class E>
int cluster_capacity(const PersistentShape& p, bool wave) {
  const auto kernel = cluster_kernel<E>(p, wave);
  return resident_clusters(reinterpret_cast<const void*>(kernel), p);
}

}  // namespace

const PersistentKnobs& persistent_knobs() {
  static const PersistentKnobs knobs = [] {
    auto env = [](const char* name) -> std::string {
      const char* v = std::getenv(name);
      return v ? v : "";
    };
    PersistentKnobs k;
    k.cluster_off = env("LSTM_PERSISTENT_CLUSTER") == "0";
    k.regs_off = env("LSTM_PERSISTENT_REGS") == "0";
    k.no_wavefront = env("LSTM_PERSISTENT_WAVEFRONT") == "0";
    k.cluster_barrier = env("LSTM_PERSISTENT_CLUSTER_SYNC") == "barrier";
    k.trace = std::getenv("LSTM_PERSISTENT_TRACE") ? std::max(1, std::atoi(env("LSTM_PERSISTENT_TRACE").c_str())) : 0;
    k.units = std::atoi(env("LSTM_PERSISTENT_UNITS").c_str());
    k.skip = std::atoi(env("LSTM_PERSISTENT_SKIP").c_str());
    k.exchange = env("LSTM_PERSISTENT_EXCHANGE");
    return k;
  }();
  return knobs;
}

std::string persistent_device(int device, PersistentDevice* out) {
  int sms = 0, smem_optin = 0, coop = 0, cluster = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "no usable CUDA device to plan the persistent kernels on (their limits come from its properties)";
  }
  out->sms = sms;
  out->smem_per_block = static_cast<size_t>(smem_optin);
  out->cooperative = coop != 0;
  out->cluster = cluster != 0;
  return "";
}

std::string plan_persistent_cluster(const PersistentDevice& dev, int64_t H, int64_t Hout, int64_t in_size,
                                    int64_t groups, int64_t B, DType dtype, PersistentShape* out, int resident) {
  if (dtype != DType::BF16 && dtype != DType::F16)
    return std::string("the cluster kernels compute in BF16 or F16, not ") + dtype_name(dtype);
  if (!dev.cluster) return "the device has no thread-block clusters";
  if (Hout != H) return "the cluster kernels have no projection";
  if (in_size && in_size != H)
    return "the cluster wavefront takes layers whose input is the layer below's h (input " + std::to_string(in_size) +
           ", hidden " + std::to_string(H) + ")";
  if (B < 1) return "the cluster kernels need at least one batch row; got " + std::to_string(B);
  if (in_size && B > kClusterRows)
    return "the cluster wavefront runs batches of up to " + std::to_string(kClusterRows) + " rows; got " +
           std::to_string(B);
  if (groups > kPersistentMaxGroups)
    return "one launch of the cluster kernels runs at most " + std::to_string(kPersistentMaxGroups) + " clusters; " +
           (in_size ? "a wavefront of L layers takes 2L - 1, " : "") + std::to_string(groups) + " needed";
  const int64_t k_tiles = (H + 15) / 16;
  for (int units : {4, 8, 16, 32}) {
    const int64_t cl = (H + units - 1) / units;
    if (cl > kClusterMax) continue;
    const int wk = cluster_wk(units / 4);
    if ((k_tiles + wk - 1) / wk > cluster_tiles(units / 4)) continue;
    if (cl * groups > dev.sms) continue;
    if (cluster_smem_bytes(units, H, in_size > 0, kClusterRows) > dev.smem_per_block) continue;
    *out = PersistentShape();
    out->units = units;
    out->ctas = static_cast<int>(cl);
    out->cluster = true;
    // Batch groups of equal size, at most 8 rows each; where the device holds fewer clusters than
    // that makes (resident, known), as many groups as it holds (at least one per 16 rows) in
    // 16-row tiles: one wave of clusters with 9 to 16 rows each runs faster than two of 8 (a step
    // is mostly the exchange's latency, not its bytes).
    int64_t bg = (B + kClusterRows - 1) / kClusterRows;
    if (resident > 0 && !in_size && groups * bg > resident) {
      const int64_t fit = std::max<int64_t>(resident / groups, (B + 2 * kClusterRows - 1) / (2 * kClusterRows));
      if (fit < bg && cluster_smem_bytes(units, H, false, 2 * kClusterRows) <= dev.smem_per_block) bg = fit;
    }
    out->batch_groups = static_cast<int>(bg);
    out->rows = static_cast<int>((B + bg - 1) / bg);
    out->smem = cluster_smem_bytes(units, H, in_size > 0, out->tile_rows());
    return "";
  }
  return "hidden size " + std::to_string(H) + " does not fit one cluster of " + std::to_string(kClusterMax) +
         " CTAs with W_hh in registers" + (in_size ? " (per cluster, " + std::to_string(groups) + " clusters)" : "");
}

std::string plan_persistent_cluster(int64_t H, int64_t Hout, int64_t in_size, int64_t groups, int64_t B, DType dtype,
                                    int device, PersistentShape* out) {
  if (persistent_knobs().cluster_off) return "turned off ($LSTM_PERSISTENT_CLUSTER=0)";
  PersistentDevice dev;
  std::string why = persistent_device(device, &dev);
  if (!why.empty()) return why;
  why = plan_persistent_cluster(dev, H, Hout, in_size, groups, B, dtype, out);
  if (!why.empty()) return why;
  // Only the wavefront's groups wait on each other (layer l on its projection group, which waits
  // on layer l-1; never the other way): every cluster of its launch must fit the device at once.
  const bool wave = in_size > 0;
  auto capacity = [&] {
    return dtype == DType::BF16 ? cluster_capacity<__nv_bfloat16>(*out, wave) : cluster_capacity<__half>(*out, wave);
  };
  out->resident = capacity();
  // More batch groups than the device holds at once: fewer, larger ones where that fits.
  if (!wave && groups * out->batch_groups > out->resident && out->resident > 0) {
    const int resident = out->resident;
    why = plan_persistent_cluster(dev, H, Hout, in_size, groups, B, dtype, out, resident);
    if (!why.empty()) return why;
    out->resident = out->rows <= kClusterRows ? resident : capacity();
  }
  const int64_t needed = wave ? groups : 1;
  if (out->resident < needed)
    return "the device places " + std::to_string(out->resident) + " clusters of " + std::to_string(out->ctas) +
           " CTAs at once; " + (wave ? "the wavefront needs " : "the launch needs ") + std::to_string(needed);
  return "";
}

std::string plan_persistent_cluster_backward(const PersistentDevice& dev, int64_t H, int64_t B, DType dtype,
                                             PersistentShape* out) {
  // The forward's slice (its limits: dtype, batch, one cluster), then the backward's shape of it.
  PersistentShape fwd;
  const std::string why = plan_persistent_cluster(dev, H, H, 0, 1, B, dtype, &fwd);
  if (!why.empty()) return why;
  const int units = fwd.units, mrows = units < 16 ? 16 : units;
  const int64_t cl = fwd.ctas, k_tiles = 4 * cl * units / 16;
  const int wk = kClusterWarps / (mrows / 16);
  if ((k_tiles + wk - 1) / wk > (mrows == 32 ? 16 : 4))
    return "hidden size " + std::to_string(H) + ": W_hh^T does not fit the backward's registers";
  const size_t smem = cluster_back_smem_bytes(units, H);
  if (smem > dev.smem_per_block)
    return "the cluster backward needs " + std::to_string(smem) + " bytes of shared memory per CTA; the device has " +
           std::to_string(dev.smem_per_block);
  *out = fwd;
  out->smem = smem;
  return "";
}

std::string plan_persistent_cluster_backward(int64_t H, int64_t B, DType dtype, int device, PersistentShape* out) {
  if (persistent_knobs().cluster_off) return "turned off ($LSTM_PERSISTENT_CLUSTER=0)";
  PersistentDevice dev;
  std::string why = persistent_device(device, &dev);
  if (!why.empty()) return why;
  why = plan_persistent_cluster_backward(dev, H, B, dtype, out);
  if (!why.empty()) return why;
  const auto resident = [&](auto kernel) { return resident_clusters(reinterpret_cast<const void*>(kernel), *out); };
  out->resident = dtype == DType::BF16 ? resident(cluster_backward_kernel<__nv_bfloat16>(out->units))
                                       : resident(cluster_backward_kernel<__half>(out->units));
  if (out->resident < 1)
    return "the device cannot place a cluster of " + std::to_string(out->ctas) + " CTAs with " +
           std::to_string(out->smem) + " bytes of shared memory each";
  return "";
}

std::string plan_persistent(const PersistentDevice& dev, int64_t H, int64_t Hout, int64_t in_size, int64_t groups,
                            int64_t B, DType dtype, PersistentShape* out, int pinned_units) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    return std::string("the persistent kernels compute in F32, BF16 or F16, not ") + dtype_name(dtype);
  if (B > 32) return "the persistent kernels run batches of up to 32 rows; got " + std::to_string(B);
  if (groups > kPersistentMaxGroups)
    return "one persistent launch runs at most " + std::to_string(kPersistentMaxGroups) + " layer directions";
  if (!dev.cooperative) return "the device has no cooperative launch (the persistent kernels need all CTAs resident)";
  const bool f32 = dtype == DType::F32;
  const size_t esize = f32 ? 4 : 2;
  const int64_t kk = f32 ? 8 : 16;
  const int pad = f32 ? 4 : 8;
  const int64_t k_total = (in_size + kk - 1) / kk * kk + (Hout + kk - 1) / kk * kk;
  const int nt = B <= 8 ? 1 : B <= 16 ? 2 : 4;
  std::string last;
  for (int units : {4, 8, 16, 32}) {
    if (pinned_units && units != pinned_units) continue;
    if (units == 32 && nt > 1) continue;  // 32 units: batches up to 8 (the accumulators' registers)
    const int64_t ctas = (H + units - 1) / units;
    if (ctas * groups > dev.sms || ctas > kPersistentMaxCtas) {
      last = std::to_string(groups) + " x " + std::to_string(ctas) + " CTAs of " + std::to_string(units) +
             " units exceed the device's " + std::to_string(dev.sms) + " SMs";
      continue;
    }
    const size_t smem = smem_bytes(units, nt, k_total, esize, pad);
    if (smem > dev.smem_per_block)
      return "the weights of hidden size " + std::to_string(H) + " (recurrent input " + std::to_string(Hout) +
             (in_size ? ", layer input " + std::to_string(in_size) : std::string()) + ", " + dtype_name(dtype) + ", " +
             std::to_string(groups) + " layer direction(s) at once, batch " + std::to_string(B) + ") need " +
             std::to_string(smem / 1024) + " KiB of shared memory per SM at " + std::to_string(units) +
             " units per CTA; the device has " + std::to_string(dev.smem_per_block / 1024) + " KiB per block and " +
             std::to_string(dev.sms) + " SMs";
    out->units = units;
    out->ctas = static_cast<int>(ctas);
    out->n_tiles = nt;
    out->smem = smem;
    out->w_in_registers = w_in_registers(dtype, units, k_total / kk);
    return "";
  }
  return "hidden size " + std::to_string(H) + " is too large for one CTA per SM: " + last;
}

std::string plan_persistent(int64_t H, int64_t Hout, int64_t in_size, int64_t groups, int64_t B, DType dtype,
                            int device, PersistentShape* out) {
  PersistentDevice dev;
  const std::string why = persistent_device(device, &dev);
  if (!why.empty()) return why;
  // $LSTM_PERSISTENT_UNITS (4, 8, 16 or 32) pins the slice per CTA, $LSTM_PERSISTENT_REGS=0
  // keeps W in shared memory, for measurement.
  const PersistentKnobs& k = persistent_knobs();
  const std::string plan = plan_persistent(dev, H, Hout, in_size, groups, B, dtype, out, k.units);
  if (plan.empty() && k.regs_off) out->w_in_registers = false;
  return plan;
}

PersistentExchange persistent_exchange_for(int64_t B) {
  const std::string& forced = persistent_knobs().exchange;
  if (!forced.empty()) {
    LSTM_REQUIRE(forced == "words" || forced == "flags",
                 "LSTM_PERSISTENT_EXCHANGE: expected words or flags, got '" << forced << "'");
    return forced == "words" ? PersistentExchange::Words : PersistentExchange::Flags;
  }
  // Tagged words cost one L2 round trip but 8 bytes per word, every one polled; flags cost a
  // fence and two round trips but move only the values. Measured on the H200 (docs/KERNELS.md):
  // at batch 1 words were faster (bf16 hidden 256 and 1024; F32 hidden 1024, 8 KiB of words per
  // CTA and step), at batch 8 flags (bf16 hidden 256 to 1024). Batches 3 to 7 were not measured.
  return B <= 2 ? PersistentExchange::Words : PersistentExchange::Flags;
}

template <class E>
void launch_persistent(const PersistentArgs<E>& a, int groups, const PersistentShape& p, cudaStream_t stream) {
  LSTM_REQUIRE(p.ctas > 0 && p.ctas <= kPersistentMaxCtas, "persistent LSTM: bad plan (" << p.ctas << " CTAs)");
  if (p.cluster) return launch_cluster<E>(a, groups, p, stream);
  switch (p.units) {
    case 4: return launch_nt<E, 1>(a, groups, p, stream);
    case 8: return launch_nt<E, 2>(a, groups, p, stream);
    case 16: return launch_nt<E, 4>(a, groups, p, stream);
    case 32: return launch_nt<E, 8>(a, groups, p, stream);
    default: LSTM_THROW("persistent LSTM: bad plan (" << p.units << " units per CTA)");
  }
}

template <class E>
void launch_persistent_backward(const PersistentBackArgs<E>& a, const PersistentShape& p, cudaStream_t stream) {
  if constexpr (sizeof(E) != 2) {
    LSTM_THROW("persistent LSTM backward: bad plan (the cluster kernels are bf16/fp16)");
  } else {
    LSTM_REQUIRE(p.cluster && p.ctas > 0 && p.ctas <= kClusterMax && p.resident >= 1,
                 "persistent LSTM backward: bad plan (" << p.ctas << " CTAs, " << p.resident << " resident clusters)");
    LSTM_REQUIRE(a.T > 0 && a.B > 0, "persistent LSTM backward: expected at least one step and one row, got T "
                                         << a.T << ", B " << a.B);
    LSTM_REQUIRE(p.rows > 0 && p.rows <= kClusterRows && static_cast<int64_t>(p.rows) * p.batch_groups >= a.B,
                 "persistent LSTM backward: bad plan (" << p.batch_groups << " batch groups of " << p.rows
                                                        << " rows for batch " << a.B << ")");
    PersistentBackArgs<E> args = a;
    args.rows = p.rows;
    const auto kernel = cluster_backward_kernel<E>(p.units);
    allow_kernel(reinterpret_cast<const void*>(kernel), p.smem, true);
    ClusterConfig l(p.batch_groups, p, stream);
    LSTM_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kernel, args, p.ctas));
  }
}

template void launch_persistent<float>(const PersistentArgs<float>&, int, const PersistentShape&, cudaStream_t);
template void launch_persistent<__nv_bfloat16>(const PersistentArgs<__nv_bfloat16>&, int, const PersistentShape&,
                                               cudaStream_t);
template void launch_persistent<__half>(const PersistentArgs<__half>&, int, const PersistentShape&, cudaStream_t);
template void launch_persistent_backward<float>(const PersistentBackArgs<float>&, const PersistentShape&, cudaStream_t);
template void launch_persistent_backward<__nv_bfloat16>(const PersistentBackArgs<__nv_bfloat16>&, const PersistentShape&,
                                                        cudaStream_t);
template void launch_persistent_backward<__half>(const PersistentBackArgs<__half>&, const PersistentShape&,
                                                 cudaStream_t);

}  // namespace lstm::cuda
