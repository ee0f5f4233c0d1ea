// Fused multi-tensor optimizer steps, gradient norm and clipping (see optim.hpp).
//
// The update formulas are the CPU optimizer's (src/train/optim.cpp), operation for operation:
// every F32 operation is written with an explicit rounding intrinsic (__fmul_rn, __fadd_rn, ...)
// so that nvcc cannot contract a*b+c into an FMA. The CPU code is compiled without contraction,
// so both round identically and GPU and CPU params agree bit for bit (up to the bias
// corrections, whose double pow may differ by an ulp before rounding to F32).
#include "cuda/optim.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace lstm::cuda {
namespace {

constexpr int kThreads = 256;  // the reductions below assume exactly this many threads

unsigned chunk_grid(int64_t chunks) {
  // Each block loops over chunks, so the grid only needs to fill the GPU; the cap keeps it well
  // inside gridDim.x for any table.
  return static_cast<unsigned>(std::min<int64_t>(chunks, int64_t{1} << 20));
}

__device__ __forceinline__ double read_scalar(DeviceScalar s) {
  return s.f64 ? *static_cast<const double*>(s.ptr) : static_cast<double>(*static_cast<const float*>(s.ptr));
}

__device__ __forceinline__ bool guard_finite(DeviceScalar g) { return g.ptr == nullptr || isfinite(read_scalar(g)); }

// Advances a param's step counter once per launch and returns the count this launch uses.
//
// All chunks of a tensor need the new count, but they run in different blocks in any order, and
// exactly one of them (the tensor's first chunk, `writer`) stores it. The word carries the id of
// the launch that last stored it, so a block that reads the word after the writer's store sees
// this launch's id and takes the count as it is, while one that reads it before computes the same
// value the writer does. Every read and the store are 64-bit atomics, so a block sees either the
// old or the new word, never a mix. On a skipped (non-finite) launch the count stays.
__device__ __forceinline__ uint32_t advance_step(unsigned long long* word, bool writer, bool finite, uint32_t launch) {
  const unsigned long long old = atomicAdd(word, 0ull);
  const uint32_t tag = static_cast<uint32_t>(old >> 32);
  const uint32_t count = static_cast<uint32_t>(old & 0xffffffffull);
  if (tag == launch) return count;
  const uint32_t now = count + (finite && count != 0xffffffffu ? 1u : 0u);
  if (writer) atomicExch(word, (static_cast<unsigned long long>(launch) << 32) | now);
  return now;
}

// torch.optim.SGD, as sgd_update in src/train/optim.cpp.
struct SgdOp {
  SgdArgs a;
  struct Scalars {
    int skip;
    int first;  // the param's first step: the momentum buffer starts as the update (torch.clone)
  };
  __device__ Scalars prepare(const MtTensor& t, bool writer, bool finite, uint32_t launch) const {
    Scalars s{finite ? 0 : 1, 0};
    if (a.use_momentum) s.first = advance_step(t.step, writer, finite, launch) == 1u ? 1 : 0;
    return s;
  }
  __device__ __forceinline__ void apply(const Scalars& s, float& p, float g, float& buf, float&) const {
    float d = g;
    if (a.decay) d = __fadd_rn(d, __fmul_rn(a.weight_decay, p));
    if (a.use_momentum) {
      const float b = s.first ? d : __fadd_rn(__fmul_rn(a.momentum, buf), d);
      buf = b;
      d = a.nesterov ? __fadd_rn(d, __fmul_rn(a.momentum, b)) : b;
    }
    p = __fsub_rn(p, __fmul_rn(a.lr, d));
  }
};

// torch.optim.Adam / AdamW, as adam_update in src/train/optim.cpp.
struct AdamOp {
  AdamArgs a;
  struct Scalars {
    int skip;
    float step_size, bias_c2_sqrt;
  };
  __device__ Scalars prepare(const MtTensor& t, bool writer, bool finite, uint32_t launch) const {
    const uint32_t now = advance_step(t.step, writer, finite, launch);
    if (!finite) return Scalars{1, 0.f, 0.f};
    // As the CPU: bias corrections in double, rounded to F32 once. torch's `** 0.5` is a pow whose
    // exact value is the square root; sqrt is correctly rounded, CUDA's pow is not.
    const double t_d = static_cast<double>(now);
    const double bias_c1 = 1.0 - pow(a.beta1, t_d);
    const double bias_c2 = 1.0 - pow(a.beta2, t_d);
    return Scalars{0, __double2float_rn(__ddiv_rn(a.lr, bias_c1)), __double2float_rn(__dsqrt_rn(bias_c2))};
  }
  __device__ __forceinline__ void apply(const Scalars& s, float& p, float g, float& m, float& v) const {
    float pi = p;
    if (a.shrink) pi = __fmul_rn(pi, a.keep);
    float gi = g;
    if (a.l2) gi = __fadd_rn(gi, __fmul_rn(a.weight_decay, pi));
    const float mi = __fadd_rn(__fmul_rn(a.b1, m), __fmul_rn(a.one_minus_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(__fmul_rn(a.one_minus_b2, gi), gi));
    m = mi;
    v = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias_c2_sqrt), a.eps);
    p = __fsub_rn(pi, __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
  }
};

__device__ __forceinline__ int64_t chunk_end(const MtTensor& t, int64_t begin) {
  const int64_t e = begin + kMtChunk;
  return e < t.numel ? e : t.numel;
}

// kStates: how many of s1, s2 the op reads and writes (0, 1 or 2).
template <int kStates, class Op>
__global__ void __launch_bounds__(kThreads)
    update_kernel(const MtTensor* __restrict__ tensors, const MtChunk* __restrict__ chunks, int64_t num_chunks,
                  Op op, DeviceScalar guard, uint32_t launch) {
  __shared__ typename Op::Scalars shared;
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const MtChunk ch = chunks[c];
    const MtTensor t = tensors[ch.tensor];
    const int64_t begin = static_cast<int64_t>(ch.index) * kMtChunk;
    const int64_t end = chunk_end(t, begin);
    // Once per chunk: the guard, the step counter and what depends on it.
    if (threadIdx.x == 0) shared = op.prepare(t, ch.index == 0, guard_finite(guard), launch);
    __syncthreads();
    const typename Op::Scalars s = shared;
    __syncthreads();  // thread 0 rewrites `shared` for the next chunk only after every thread read it
    if (s.skip) continue;

    float* __restrict__ p = t.value;
    const float* __restrict__ g = t.grad;
    float* __restrict__ m = t.s1;
    float* __restrict__ v = t.s2;
    int64_t scalar_from = begin;
    if (t.vec4) {
      const int64_t n4 = (end - begin) / 4;
      for (int64_t k = threadIdx.x; k < n4; k += blockDim.x) {
        const int64_t i = begin + 4 * k;
        float4 pv = *reinterpret_cast<const float4*>(p + i);
        const float4 gv = *reinterpret_cast<const float4*>(g + i);
        float4 mv = make_float4(0.f, 0.f, 0.f, 0.f), vv = make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (kStates >= 1) mv = *reinterpret_cast<const float4*>(m + i);
        if constexpr (kStates >= 2) vv = *reinterpret_cast<const float4*>(v + i);
        op.apply(s, pv.x, gv.x, mv.x, vv.x);
        op.apply(s, pv.y, gv.y, mv.y, vv.y);
        op.apply(s, pv.z, gv.z, mv.z, vv.z);
        op.apply(s, pv.w, gv.w, mv.w, vv.w);
        *reinterpret_cast<float4*>(p + i) = pv;
        if constexpr (kStates >= 1) *reinterpret_cast<float4*>(m + i) = mv;
        if constexpr (kStates >= 2) *reinterpret_cast<float4*>(v + i) = vv;
      }
      scalar_from = begin + 4 * n4;
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
      float pi = p[i];
      float mi = 0.f, vi = 0.f;
      if constexpr (kStates >= 1) mi = m[i];
      if constexpr (kStates >= 2) vi = v[i];
      op.apply(s, pi, g[i], mi, vi);
      p[i] = pi;
      if constexpr (kStates >= 1) m[i] = mi;
      if constexpr (kStates >= 2) v[i] = vi;
    }
  }
}

// Sum of `red[0..kThreads)` into red[0], in a fixed order (the result does not depend on timing).
__device__ __forceinline__ void block_sum(double* red) {
  for (int off = kThreads / 2; off > 0; off >>= 1) {
    if (static_cast<int>(threadIdx.x) < off) red[threadIdx.x] += red[threadIdx.x + off];
    __syncthreads();
  }
}

// partials[c] = sum of grad^2 over chunk c, in double. Each element goes to a fixed thread and
// the block sums in a fixed tree, so the partials are the same on every run.
__global__ void __launch_bounds__(kThreads)
    sum_squares_kernel(const MtTensor* __restrict__ tensors, const MtChunk* __restrict__ chunks, int64_t num_chunks,
                       double* __restrict__ partials) {
  __shared__ double red[kThreads];
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const MtChunk ch = chunks[c];
    const MtTensor t = tensors[ch.tensor];
    const int64_t begin = static_cast<int64_t>(ch.index) * kMtChunk;
    const int64_t end = chunk_end(t, begin);
    const float* __restrict__ g = t.grad;
    double s = 0;
    int64_t scalar_from = begin;
    if (t.vec4) {
      const int64_t n4 = (end - begin) / 4;
      for (int64_t k = threadIdx.x; k < n4; k += blockDim.x) {
        const float4 x = *reinterpret_cast<const float4*>(g + begin + 4 * k);
        const double a = x.x, b = x.y, cc = x.z, d = x.w;
        s += a * a;
        s += b * b;
        s += cc * cc;
        s += d * d;
      }
      scalar_from = begin + 4 * n4;
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
      const double x = g[i];
      s += x * x;
    }
    red[threadIdx.x] = s;
    __syncthreads();
    block_sum(red);
    if (threadIdx.x == 0) partials[c] = red[0];
    __syncthreads();  // red is reused for the next chunk
  }
}

__global__ void __launch_bounds__(kThreads)
    norm_finish_kernel(const double* __restrict__ partials, int64_t n, float* __restrict__ out_f32,
                       double* __restrict__ out_f64) {
  __shared__ double red[kThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += partials[i];
  red[threadIdx.x] = s;
  __syncthreads();
  block_sum(red);
  if (threadIdx.x == 0) {
    const double r = __dsqrt_rn(red[0]);
    out_f32[0] = __double2float_rn(r);
    if (out_f64) out_f64[0] = r;
  }
}

__global__ void __launch_bounds__(kThreads)
    clip_kernel(const MtTensor* __restrict__ tensors, const MtChunk* __restrict__ chunks, int64_t num_chunks,
                double max_norm, DeviceScalar norm) {
  // As the CPU's clip_grad_norm_with: the coefficient in double, applied in F32; >= 1 is a no-op
  // (NaN is not >= 1, so a NaN norm scales by NaN like torch).
  const double coef = __ddiv_rn(max_norm, __dadd_rn(read_scalar(norm), 1e-6));
  if (coef >= 1.0) return;
  const float cf = __double2float_rn(coef);
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const MtChunk ch = chunks[c];
    const MtTensor t = tensors[ch.tensor];
    const int64_t begin = static_cast<int64_t>(ch.index) * kMtChunk;
    const int64_t end = chunk_end(t, begin);
    float* __restrict__ g = t.grad;
    int64_t scalar_from = begin;
    if (t.vec4) {
      const int64_t n4 = (end - begin) / 4;
      for (int64_t k = threadIdx.x; k < n4; k += blockDim.x) {
        float4* q = reinterpret_cast<float4*>(g + begin + 4 * k);
        float4 x = *q;
        x.x = __fmul_rn(x.x, cf);
        x.y = __fmul_rn(x.y, cf);
        x.z = __fmul_rn(x.z, cf);
        x.w = __fmul_rn(x.w, cf);
        *q = x;
      }
      scalar_from = begin + 4 * n4;
    }
    for (int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) g[i] = __fmul_rn(g[i], cf);
  }
}

}  // namespace

int32_t mt_aligned(const MtTensor& t) {
  auto ok = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return ok(t.value) && ok(t.grad) && ok(t.s1) && ok(t.s2) ? 1 : 0;
}

void MtTable::set(const std::vector<MtTensor>& tensors) {
  cudaStream_t s = stream();
  if (valid_ && s == stream_ && tensors == host_) return;
  LSTM_REQUIRE(tensors.size() <= std::numeric_limits<uint32_t>::max(), "multi-tensor table: too many tensors");
  std::vector<MtChunk> chunks;
  for (size_t i = 0; i < tensors.size(); ++i) {
    LSTM_REQUIRE(tensors[i].numel >= 0, "multi-tensor table: negative numel");
    // An empty tensor still gets one (empty) chunk: its step counter must advance like the others.
    const int64_t n = std::max<int64_t>(1, (tensors[i].numel + kMtChunk - 1) / kMtChunk);
    LSTM_REQUIRE(n <= std::numeric_limits<uint32_t>::max(), "multi-tensor table: tensor too large");
    for (int64_t c = 0; c < n; ++c) chunks.push_back(MtChunk{static_cast<uint32_t>(i), static_cast<uint32_t>(c)});
  }
  chunk_offset_ = tensors.size() * sizeof(MtTensor);
  static_assert(sizeof(MtTensor) % alignof(MtChunk) == 0, "chunks follow the tensors in one buffer");
  const size_t bytes = chunk_offset_ + chunks.size() * sizeof(MtChunk);
  std::vector<unsigned char> staging(bytes);
  if (!tensors.empty()) std::memcpy(staging.data(), tensors.data(), chunk_offset_);
  if (!chunks.empty()) std::memcpy(staging.data() + chunk_offset_, chunks.data(), chunks.size() * sizeof(MtChunk));
  valid_ = false;
  if (s != stream_) {
    // Arena blocks are cached per stream; take new ones from the stream that will use them.
    dev_.reset();
    partials_.reset();
  }
  if (bytes) {
    dev_.ensure(bytes);
    // Pageable source: the driver stages it before returning, so `staging` may go away. The copy
    // is ordered after earlier kernels of the stream that still read the old table.
    LSTM_CUDA_CHECK(cudaMemcpyAsync(dev_.get(), staging.data(), bytes, cudaMemcpyHostToDevice, s));
  }
  host_ = tensors;
  stream_ = s;
  num_chunks_ = static_cast<int64_t>(chunks.size());
  valid_ = true;
}

double* MtTable::partials() {
  partials_.ensure(static_cast<size_t>(std::max<int64_t>(num_chunks_, 1)) * sizeof(double));
  return partials_.as<double>();
}

void sgd_step(const MtTable& table, const SgdArgs& args, DeviceScalar guard, uint32_t launch) {
  const int64_t n = table.num_chunks();
  if (n == 0) return;
  const SgdOp op{args};
  if (args.use_momentum) {
    update_kernel<1, SgdOp><<<chunk_grid(n), kThreads, 0, stream()>>>(table.tensors(), table.chunks(), n, op, guard,
                                                                      launch);
  } else {
    update_kernel<0, SgdOp><<<chunk_grid(n), kThreads, 0, stream()>>>(table.tensors(), table.chunks(), n, op, guard,
                                                                      launch);
  }
  LSTM_CUDA_CHECK_LAUNCH();
}

void adam_step(const MtTable& table, const AdamArgs& args, DeviceScalar guard, uint32_t launch) {
  const int64_t n = table.num_chunks();
  if (n == 0) return;
  const AdamOp op{args};
  update_kernel<2, AdamOp><<<chunk_grid(n), kThreads, 0, stream()>>>(table.tensors(), table.chunks(), n, op, guard,
                                                                     launch);
  LSTM_CUDA_CHECK_LAUNCH();
}

void grad_norm(MtTable& table, float* out_f32, double* out_f64) {
  const int64_t n = table.num_chunks();
  double* partials = table.partials();
  if (n > 0) {
    sum_squares_kernel<<<chunk_grid(n), kThreads, 0, stream()>>>(table.tensors(), table.chunks(), n, partials);
    LSTM_CUDA_CHECK_LAUNCH();
  }
  norm_finish_kernel<<<1, kThreads, 0, stream()>>>(partials, n, out_f32, out_f64);
  LSTM_CUDA_CHECK_LAUNCH();
}

void clip_grads(const MtTable& table, double max_norm, DeviceScalar norm) {
  const int64_t n = table.num_chunks();
  if (n == 0) return;
  LSTM_REQUIRE(norm.ptr != nullptr, "clip_grads: no norm given");
  clip_kernel<<<chunk_grid(n), kThreads, 0, stream()>>>(table.tensors(), table.chunks(), n, max_norm, norm);
  LSTM_CUDA_CHECK_LAUNCH();
}

MtTable& grad_table() {
  thread_local MtTable table;
  return table;
}

}  // namespace lstm::cuda
