// CPU reference LSTM: nn.LSTM semantics with packed-sequence behaviour for variable lengths.
//
// Per layer and direction: one GEMM computes every step's input projection (x W_ih^T + biases),
// then each step adds h_{t-1} W_hh^T and applies the fused pointwise cell. A sequence is
// "active" at step t while t < length; inactive rows keep their state and output zero, which
// gives the reverse direction its start at each sequence's own last step for free.
// Backward runs the steps in reverse, then forms the weight gradients and dX with three GEMMs
// over all steps at once.
#include "cpu/lstm_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "cpu/blas.hpp"

namespace lstm::cpu {
namespace {

// ---- The pointwise cell, one batch row at a time ----
// f64 uses libm (it is the reference the fixtures are checked against to 1e-10). f32 uses a
// branch-free exp (Cody-Waite reduction + degree-6 polynomial, ~1 ulp) that the compiler
// vectorises; libm's scalar tanhf/expf made the cell cost more than the GEMMs. The f32 row
// functions are compiled for AVX-512, AVX2 and baseline x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LSTM_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LSTM_CPU_CLONES
#endif

#pragma omp declare simd
inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (vectorises without SSE4.1's roundps).
  const float shifter = 12582912.0f;
  float n = (x * 1.44269504088896341f + shifter) - shifter;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
#pragma omp declare simd
inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
#pragma omp declare simd
inline float tanh_f32(float x) { return 2.0f / (1.0f + exp_f32(-2.0f * x)) - 1.0f; }

// One row's block of n units. g points at the row's gates (i at g, f at g + H, ...; pre-activation
// in, activated out); r holds the recurrent part for the block (i at r, f at r + n, ...), added
// first. c (n values) is updated; m = o * tanh(c).
template <class T, class Sig, class Tanh>
inline void cell_forward_units_impl(T* __restrict g, const T* __restrict r, T* __restrict c, T* __restrict m, int64_t n,
                                    int64_t H, Sig sig, Tanh tanh_fn) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    T ig = sig(g[j] + r[j]), fg = sig(g[H + j] + r[n + j]);
    T gg = tanh_fn(g[2 * H + j] + r[2 * n + j]), og = sig(g[3 * H + j] + r[3 * n + j]);
    g[j] = ig;
    g[H + j] = fg;
    g[2 * H + j] = gg;
    g[3 * H + j] = og;
    T cn = fg * c[j] + ig * gg;
    c[j] = cn;
    m[j] = og * tanh_fn(cn);
  }
}
// Written out rather than through the template: GCC does not vectorise the template's loop
// when the f32 functions come in as arguments.
LSTM_CPU_CLONES void cell_forward_units(float* __restrict g, const float* __restrict r, float* __restrict c,
                                        float* __restrict m, int64_t n, int64_t H) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    float ig = sigmoid_f32(g[j] + r[j]), fg = sigmoid_f32(g[H + j] + r[n + j]);
    float gg = tanh_f32(g[2 * H + j] + r[2 * n + j]), og = sigmoid_f32(g[3 * H + j] + r[3 * n + j]);
    g[j] = ig;
    g[H + j] = fg;
    g[2 * H + j] = gg;
    g[3 * H + j] = og;
    float cn = fg * c[j] + ig * gg;
    c[j] = cn;
    m[j] = og * tanh_f32(cn);
  }
}
void cell_forward_units(double* g, const double* r, double* c, double* m, int64_t n, int64_t H) {
  cell_forward_units_impl(g, r, c, m, n, H, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
                          [](double x) { return std::tanh(x); });
}

// Backward of one row's block of n units (gate sections H apart in gates and d): cs = c_t,
// cp = c_{t-1}, dm = dL/dm_t; dc holds dL/dc_t from later steps and becomes dL/dc_{t-1}; d gets
// the pre-activation gate gradients.
template <class T, class Tanh>
inline void cell_backward_units_impl(const T* __restrict gates, const T* __restrict cs, const T* __restrict cp,
                                     const T* __restrict dm, T* __restrict dc, T* __restrict d, int64_t n, int64_t H,
                                     Tanh tanh_fn) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    T ig = gates[j], fg = gates[H + j], gg = gates[2 * H + j], og = gates[3 * H + j];
    T tc = tanh_fn(cs[j]);
    T dmv = dm[j];
    T dct = dc[j] + dmv * og * (T(1) - tc * tc);
    d[j] = dct * gg * ig * (T(1) - ig);
    d[H + j] = dct * cp[j] * fg * (T(1) - fg);
    d[2 * H + j] = dct * ig * (T(1) - gg * gg);
    d[3 * H + j] = dmv * tc * og * (T(1) - og);
    dc[j] = dct * fg;
  }
}
LSTM_CPU_CLONES void cell_backward_units(const float* gates, const float* cs, const float* cp, const float* dm,
                                         float* dc, float* d, int64_t n, int64_t H) {
  cell_backward_units_impl(gates, cs, cp, dm, dc, d, n, H, [](float x) { return tanh_f32(x); });
}
void cell_backward_units(const double* gates, const double* cs, const double* cp, const double* dm, double* dc,
                         double* d, int64_t n, int64_t H) {
  cell_backward_units_impl(gates, cs, cp, dm, dc, d, n, H, [](double x) { return std::tanh(x); });
}

// Threads of the step loop and each one's share [begin, end) of n items (units or outputs).
// Each thread owns a block of hidden units for the whole sequence, so its slice of W_hh stays in
// its core's cache and one barrier per phase replaces a threaded GEMM per step.
int64_t step_threads(int64_t H, int64_t Hout, int64_t B) {
  // Inside a caller's parallel region, or where the runtime may hand out fewer threads than
  // asked, the blocks would not all be computed: run on one thread there.
  if (omp_in_parallel() || omp_get_dynamic()) return 1;
  int64_t nt = std::min<int64_t>(omp_get_max_threads(), omp_get_thread_limit());
  if (4 * H * Hout * B < (int64_t{1} << 18)) nt = 1;  // too little work per step to pay for the barriers
  return std::max<int64_t>(1, std::min<int64_t>(nt, H / 16));
}
std::pair<int64_t, int64_t> share(int64_t n, int64_t parts, int64_t k) {
  return {n * k / parts, n * (k + 1) / parts};
}
// Runs body(k) on nt threads. One thread runs it directly: a team of one would still make
// OpenBLAS start nested threads for every product.
inline void team_barrier(bool team) {
  if (team) {
#pragma omp barrier
  }
}

// body(k, team) synchronises with team_barrier(team), a barrier only when team is true: called on one
// thread inside a caller's parallel region, a barrier would bind to the caller's team.
template <class F>
void run_step_team(int64_t nt, F& body) {
  if (nt == 1) {
    body(0, false);
    return;
  }
  bool short_team = false;
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    // Every block must have its thread; a smaller team would leave blocks unwritten.
    if (omp_get_num_threads() == nt)
      body(omp_get_thread_num(), true);
    else if (omp_get_thread_num() == 0)
      short_team = true;
  }
  LSTM_CHECK(!short_team, "the OpenMP runtime started fewer than the " << nt << " threads asked for");
}

// [A, B, C] -> [B, A, C]
Tensor swap01(const Tensor& t) {
  int64_t A = t.size(0), B = t.size(1), C = t.size(2);
  Tensor r = Tensor::empty({B, A, C}, t.dtype());
  size_t es = dtype_size(t.dtype());
  const auto* s = static_cast<const uint8_t*>(t.raw());
  auto* d = static_cast<uint8_t*>(r.raw());
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(d + ((b * A + a) * C) * es, s + ((a * B + b) * C) * es, static_cast<size_t>(C) * es);
  return r;
}

struct DirSaved {
  Tensor gates;  // [T, B, 4H] activated i, f, g, o
  Tensor c;      // [T, B, H] cell state after the step
  Tensor c_prev; // [T, B, H] cell state before the step
  Tensor h_prev; // [T, B, Hout] hidden state before the step
  Tensor m;      // [T, B, H] o * tanh(c) (projection only)
};

struct LayerSaved {
  Tensor x;     // [T, B, In] layer input (zero past lengths, after dropout)
  Tensor mask;  // [T, B, In] dropout scale (0 or 1/(1-p)) applied to the previous output; layers > 0
  std::vector<DirSaved> dirs;
};

struct Saved : LstmSaved {
  int64_t T = 0, B = 0;
  DType dtype = DType::F32;
  std::vector<int64_t> lengths;  // always B entries
  bool has_h0 = false, has_c0 = false;
  std::vector<LayerSaved> layers;
};

template <class T>
struct Ctx {
  const LstmSpec& spec;
  const std::vector<Tensor>& w;
  int64_t Tn, B, H, P, Hout;
  const std::vector<int64_t>& len;
};

// One layer, one direction. x: [T, B, In]; writes its Hout columns of y [T, B, D*Hout];
// h, c: [B, Hout] / [B, H] initial states, updated in place to the final states.
template <class T>
void dir_forward(const Ctx<T>& cx, int64_t layer, int64_t dir, const T* x, int64_t In, T* y, T* h, T* c,
                 DirSaved* sv) {
  const LstmSpec& s = cx.spec;
  const int64_t Tn = cx.Tn, B = cx.B, H = cx.H, P = cx.P, Hout = cx.Hout, G4 = 4 * H, D = s.directions();
  auto sl = s.slots(layer, dir);
  const T* wih = cx.w[sl.w_ih].template data<T>();
  const T* whh = cx.w[sl.w_hh].template data<T>();
  const T* whr = P > 0 ? cx.w[sl.w_hr].template data<T>() : nullptr;

  Tensor gates_t = Tensor::empty({Tn, B, G4}, dtype_of<T>());
  T* gates = gates_t.data<T>();
  gemm(false, true, Tn * B, G4, In, T(1), x, In, wih, In, T(0), gates, G4);
  if (s.bias) {
    const T* bi = cx.w[sl.b_ih].template data<T>();
    const T* bh = cx.w[sl.b_hh].template data<T>();
    std::vector<T> bsum(static_cast<size_t>(G4));
    for (int64_t j = 0; j < G4; ++j) bsum[j] = bi[j] + bh[j];
#pragma omp parallel for if (Tn * B * G4 > 65536)
    for (int64_t r = 0; r < Tn * B; ++r)
      for (int64_t j = 0; j < G4; ++j) gates[r * G4 + j] += bsum[j];
  }
  T *cs = nullptr, *cps = nullptr, *hps = nullptr, *ms = nullptr;
  if (sv) {
    sv->c = Tensor::empty({Tn, B, H}, dtype_of<T>());
    sv->c_prev = Tensor::empty({Tn, B, H}, dtype_of<T>());
    sv->h_prev = Tensor::empty({Tn, B, Hout}, dtype_of<T>());
    cs = sv->c.data<T>();
    cps = sv->c_prev.data<T>();
    hps = sv->h_prev.data<T>();
    if (P > 0) {
      sv->m = Tensor::zeros({Tn, B, H}, dtype_of<T>());
      ms = sv->m.data<T>();
    }
  }
  const int64_t nt = step_threads(H, Hout, B);
  // W_hh regrouped by unit block: block k holds the i, f, g, o rows of its units, so that one
  // GEMM gives the block all four gates.
  std::vector<T> wr(static_cast<size_t>(G4 * Hout));
  for (int64_t k = 0; k < nt; ++k) {
    auto [u0, u1] = share(H, nt, k);
    T* dst = wr.data() + 4 * u0 * Hout;
    for (int64_t gate = 0; gate < 4; ++gate)
      for (int64_t j = u0; j < u1; ++j, dst += Hout)
        std::memcpy(dst, whh + (gate * H + j) * Hout, sizeof(T) * static_cast<size_t>(Hout));
  }
  std::vector<T> hbuf(static_cast<size_t>(2 * B * Hout)), m(static_cast<size_t>(B * H), T(0)),
      hp(static_cast<size_t>(P > 0 ? B * P : 0)), rec(static_cast<size_t>(B * G4));
  std::memcpy(hbuf.data(), h, sizeof(T) * static_cast<size_t>(B * Hout));
  const int64_t* len = cx.len.data();
  auto body = [&](int64_t k, bool team) {
    auto [u0, u1] = share(H, nt, k);
    auto [o0, o1] = share(Hout, nt, k);
    const int64_t nu = u1 - u0, no = o1 - o0;
    T* r = rec.data() + 4 * u0 * B;  // [B, 4*nu] recurrent part of this block's gates
    int cur = 0;
    for (int64_t step = 0; step < Tn; ++step) {
      const int64_t t = dir == 0 ? step : Tn - 1 - step;
      const T* hc = hbuf.data() + cur * B * Hout;
      T* hn = hbuf.data() + (1 - cur) * B * Hout;
      T* g = gates + t * B * G4;
      for (int64_t b = 0; b < B; ++b) {
        if (hps) std::memcpy(hps + (t * B + b) * Hout + o0, hc + b * Hout + o0, sizeof(T) * static_cast<size_t>(no));
        if (cps) std::memcpy(cps + (t * B + b) * H + u0, c + b * H + u0, sizeof(T) * static_cast<size_t>(nu));
      }
      if (nu > 0) gemm(false, true, B, 4 * nu, Hout, T(1), hc, Hout, wr.data() + 4 * u0 * Hout, Hout, T(0), r, 4 * nu);
      for (int64_t b = 0; b < B; ++b)
        if (t < len[b]) cell_forward_units(g + b * G4 + u0, r + b * 4 * nu, c + b * H + u0, m.data() + b * H + u0, nu, H);
      const T* hnew = m.data();
      if (P > 0) {
        if (ms)
          for (int64_t b = 0; b < B; ++b)
            if (t < len[b]) std::memcpy(ms + (t * B + b) * H + u0, m.data() + b * H + u0, sizeof(T) * static_cast<size_t>(nu));
        team_barrier(team);
        if (no > 0) gemm(false, true, B, no, H, T(1), m.data(), H, whr + o0 * H, H, T(0), hp.data() + o0, P);
        hnew = hp.data();
      }
      for (int64_t b = 0; b < B; ++b) {
        T* yrow = y + (t * B + b) * D * Hout + dir * Hout + o0;
        const size_t bytes = sizeof(T) * static_cast<size_t>(no);
        if (t < len[b]) {
          std::memcpy(hn + b * Hout + o0, hnew + b * Hout + o0, bytes);
          std::memcpy(yrow, hnew + b * Hout + o0, bytes);
        } else {
          std::memcpy(hn + b * Hout + o0, hc + b * Hout + o0, bytes);
          std::memset(yrow, 0, bytes);
        }
        if (cs) std::memcpy(cs + (t * B + b) * H + u0, c + b * H + u0, sizeof(T) * static_cast<size_t>(nu));
      }
      cur = 1 - cur;
      team_barrier(team);
    }
  };
  run_step_team(nt, body);
  std::memcpy(h, hbuf.data() + (Tn % 2) * B * Hout, sizeof(T) * static_cast<size_t>(B * Hout));
  if (sv) sv->gates = gates_t;
}

// Backward of one layer/direction. dy: [T, B, D*Hout] (this direction's columns are read);
// dh, dc: [B, Hout] / [B, H] gradients w.r.t. the final states, replaced by those w.r.t. the
// initial states. Adds into dx [T, B, In] (beta: 0 overwrites) and into the weight gradients.
template <class T>
void dir_backward(const Ctx<T>& cx, int64_t layer, int64_t dir, const DirSaved& sv, const T* x, int64_t In,
                  const T* dy, T* dh, T* dc, T* dx, T dx_beta, std::vector<Tensor>& dw) {
  const LstmSpec& s = cx.spec;
  const int64_t Tn = cx.Tn, B = cx.B, H = cx.H, P = cx.P, Hout = cx.Hout, G4 = 4 * H, D = s.directions();
  auto sl = s.slots(layer, dir);
  const T* wih = cx.w[sl.w_ih].template data<T>();
  const T* whh = cx.w[sl.w_hh].template data<T>();
  const T* whr = P > 0 ? cx.w[sl.w_hr].template data<T>() : nullptr;
  const T* gates = sv.gates.data<T>();
  const T* cs = sv.c.data<T>();
  const T* cps = sv.c_prev.data<T>();

  Tensor dg_t = Tensor::empty({Tn, B, G4}, dtype_of<T>());
  T* dg = dg_t.data<T>();
  Tensor dht_t;  // [T, B, P] gradient w.r.t. the projected output, for dW_hr
  T* dht = nullptr;
  if (P > 0) {
    dht_t = Tensor::zeros({Tn, B, P}, dtype_of<T>());
    dht = dht_t.data<T>();
  }
  std::vector<T> htot(static_cast<size_t>(B * Hout)), dmb(static_cast<size_t>(P > 0 ? B * H : 0)),
      dhp(static_cast<size_t>(B * Hout));
  const int64_t nt = step_threads(H, Hout, B);
  const int64_t* len = cx.len.data();
  auto body = [&](int64_t k, bool team) {
    auto [u0, u1] = share(H, nt, k);
    auto [o0, o1] = share(Hout, nt, k);
    const int64_t nu = u1 - u0, no = o1 - o0;
    for (int64_t step = Tn - 1; step >= 0; --step) {
      const int64_t t = dir == 0 ? step : Tn - 1 - step;
      // Gradient reaching h_t: from the next step (dh) and from the output at t.
      for (int64_t b = 0; b < B; ++b) {
        const T* dyr = dy + (t * B + b) * D * Hout + dir * Hout;
        for (int64_t q = o0; q < o1; ++q) htot[b * Hout + q] = t < len[b] ? dh[b * Hout + q] + dyr[q] : T(0);
        if (P > 0) std::memcpy(dht + (t * B + b) * P + o0, htot.data() + b * Hout + o0, sizeof(T) * static_cast<size_t>(no));
      }
      const T* dm = htot.data();  // without projection, units and outputs share one partition
      if (P > 0) {
        team_barrier(team);
        if (nu > 0) gemm(false, false, B, nu, P, T(1), htot.data(), P, whr + u0, H, T(0), dmb.data() + u0, H);
        dm = dmb.data();
      }
      T* dgt = dg + t * B * G4;
      for (int64_t b = 0; b < B; ++b) {
        T* d = dgt + b * G4 + u0;
        if (t >= len[b]) {
          for (int64_t gate = 0; gate < 4; ++gate) std::memset(d + gate * H, 0, sizeof(T) * static_cast<size_t>(nu));
          continue;
        }
        const int64_t row = t * B + b;
        cell_backward_units(gates + row * G4 + u0, cs + row * H + u0, cps + row * H + u0, dm + b * H + u0,
                            dc + b * H + u0, d, nu, H);
      }
      team_barrier(team);
      if (no > 0) gemm(false, false, B, no, G4, T(1), dgt, G4, whh + o0, Hout, T(0), dhp.data() + o0, Hout);
      for (int64_t b = 0; b < B; ++b)
        if (t < len[b]) std::memcpy(dh + b * Hout + o0, dhp.data() + b * Hout + o0, sizeof(T) * static_cast<size_t>(no));
      team_barrier(team);
    }
  };
  run_step_team(nt, body);
  const int64_t N = Tn * B;
  gemm(true, false, G4, In, N, T(1), dg, G4, x, In, T(1), dw[sl.w_ih].data<T>(), In);
  gemm(true, false, G4, Hout, N, T(1), dg, G4, sv.h_prev.data<T>(), Hout, T(1), dw[sl.w_hh].data<T>(), Hout);
  if (s.bias) {
    T* dbi = dw[sl.b_ih].data<T>();
    T* dbh = dw[sl.b_hh].data<T>();
    std::vector<T> acc(static_cast<size_t>(G4), T(0));
    for (int64_t r = 0; r < N; ++r) {
      const T* row = dg + r * G4;
#pragma omp simd
      for (int64_t j = 0; j < G4; ++j) acc[j] += row[j];
    }
    for (int64_t j = 0; j < G4; ++j) {
      dbi[j] += acc[j];
      dbh[j] += acc[j];
    }
  }
  if (P > 0) gemm(true, false, P, H, N, T(1), dht, P, sv.m.data<T>(), H, T(1), dw[sl.w_hr].data<T>(), H);
  gemm(false, false, N, In, G4, T(1), dg, G4, wih, In, dx_beta, dx, In);
}

template <class T>
LstmOutput forward_impl(const LstmSpec& s, const std::vector<Tensor>& w, const LstmInput& in, bool training,
                        Rng* rng, Saved* sv) {
  auto [Tn, B] = check_lstm_input(s, in, w);
  const int64_t H = s.hidden_size, P = s.proj_size, Hout = s.out_size(), D = s.directions(), L = s.num_layers;
  std::vector<int64_t> len = in.lengths.empty() ? std::vector<int64_t>(static_cast<size_t>(B), Tn) : in.lengths;
  Ctx<T> cx{s, w, Tn, B, H, P, Hout, len};

  // Layer-0 input, sequence-major, with rows past each length zeroed so that NaN there never
  // reaches a GEMM.
  Tensor x = s.batch_first ? swap01(in.x) : in.x.clone();
  {
    T* xd = x.data<T>();
    const int64_t I = s.input_size;
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t b = 0; b < B; ++b)
        if (t >= len[b]) std::memset(xd + (t * B + b) * I, 0, sizeof(T) * static_cast<size_t>(I));
  }
  if (sv) {
    sv->T = Tn;
    sv->B = B;
    sv->dtype = dtype_of<T>();
    sv->lengths = len;
    sv->has_h0 = in.h0.defined();
    sv->has_c0 = in.c0.defined();
    sv->layers.assign(static_cast<size_t>(L), {});
  }
  LstmOutput out;
  out.h_n = Tensor::empty({L * D, B, Hout}, dtype_of<T>());
  out.c_n = Tensor::empty({L * D, B, H}, dtype_of<T>());
  Tensor layer_in = x;
  Tensor y;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t In = s.layer_input_size(l);
    if (l > 0 && training && s.dropout > 0) {
      LSTM_REQUIRE(rng, "LSTM: dropout in training needs an Rng");
      Tensor mask = Tensor::empty(layer_in.shape(), dtype_of<T>());
      T* md = mask.data<T>();
      T* xd = layer_in.data<T>();
      const T keep = T(1) / T(1 - s.dropout);
      for (int64_t i = 0; i < mask.numel(); ++i) {
        md[i] = rng->uniform() < s.dropout ? T(0) : keep;
        xd[i] *= md[i];
      }
      if (sv) sv->layers[l].mask = mask;
    }
    y = Tensor::empty({Tn, B, D * Hout}, dtype_of<T>());
    if (sv) {
      sv->layers[l].x = layer_in;
      sv->layers[l].dirs.assign(static_cast<size_t>(D), {});
    }
    for (int64_t d = 0; d < D; ++d) {
      const int64_t idx = l * D + d;
      T* h = out.h_n.data<T>() + idx * B * Hout;
      T* c = out.c_n.data<T>() + idx * B * H;
      if (in.h0.defined())
        std::memcpy(h, in.h0.data<T>() + idx * B * Hout, sizeof(T) * static_cast<size_t>(B * Hout));
      else
        std::memset(h, 0, sizeof(T) * static_cast<size_t>(B * Hout));
      if (in.c0.defined())
        std::memcpy(c, in.c0.data<T>() + idx * B * H, sizeof(T) * static_cast<size_t>(B * H));
      else
        std::memset(c, 0, sizeof(T) * static_cast<size_t>(B * H));
      dir_forward<T>(cx, l, d, layer_in.data<T>(), In, y.data<T>(), h, c, sv ? &sv->layers[l].dirs[d] : nullptr);
    }
    layer_in = y;
  }
  out.output = s.batch_first ? swap01(y) : y;
  return out;
}

template <class T>
LstmGrads backward_impl(const LstmSpec& s, const std::vector<Tensor>& w, const Saved& sv, const LstmGradOutput& g,
                        std::vector<Tensor>& dw) {
  const int64_t Tn = sv.T, B = sv.B, H = s.hidden_size, P = s.proj_size, Hout = s.out_size(), D = s.directions(),
                L = s.num_layers;
  LSTM_REQUIRE(sv.dtype == dtype_of<T>(), "LSTM backward: saved state has dtype " << dtype_name(sv.dtype));
  auto names = s.param_names();
  LSTM_REQUIRE(dw.size() == names.size(), "LSTM backward: expected " << names.size() << " gradient tensors, got "
                                                                      << dw.size());
  for (size_t i = 0; i < names.size(); ++i)
    LSTM_REQUIRE(dw[i].defined() && dw[i].shape() == w[i].shape() && dw[i].dtype() == w[i].dtype(),
                 "LSTM backward: gradient for '" << names[i] << "' must be " << w[i].shape_str());
  Ctx<T> cx{s, w, Tn, B, H, P, Hout, sv.lengths};
  const int64_t LD = L * D;
  Shape yshape = s.batch_first ? Shape{B, Tn, D * Hout} : Shape{Tn, B, D * Hout};
  Tensor dy;
  if (g.d_output.defined()) {
    LSTM_REQUIRE(g.d_output.shape() == yshape, "LSTM backward: d_output must be " << shape_str(yshape) << ", got "
                                                                                  << g.d_output.shape_str());
    // Only read below, so a d_output of the right dtype is used as it is.
    Tensor src = g.d_output.dtype() == dtype_of<T>() ? g.d_output : g.d_output.to(dtype_of<T>());
    dy = s.batch_first ? swap01(src) : src;
  } else {
    dy = Tensor::zeros({Tn, B, D * Hout}, dtype_of<T>());
  }
  Tensor dh = g.d_h_n.defined() ? g.d_h_n.to(dtype_of<T>()) : Tensor::zeros({LD, B, Hout}, dtype_of<T>());
  Tensor dc = g.d_c_n.defined() ? g.d_c_n.to(dtype_of<T>()) : Tensor::zeros({LD, B, H}, dtype_of<T>());
  LSTM_REQUIRE(dh.shape() == (Shape{LD, B, Hout}), "LSTM backward: d_h_n must be " << shape_str({LD, B, Hout}));
  LSTM_REQUIRE(dc.shape() == (Shape{LD, B, H}), "LSTM backward: d_c_n must be " << shape_str({LD, B, H}));
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerSaved& ls = sv.layers[l];
    const int64_t In = s.layer_input_size(l);
    Tensor dx = Tensor::empty({Tn, B, In}, dtype_of<T>());
    for (int64_t d = 0; d < D; ++d) {
      const int64_t idx = l * D + d;
      dir_backward<T>(cx, l, d, ls.dirs[d], ls.x.data<T>(), In, dy.data<T>(), dh.data<T>() + idx * B * Hout,
                      dc.data<T>() + idx * B * H, dx.data<T>(), d == 0 ? T(0) : T(1), dw);
    }
    if (ls.mask.defined()) {
      T* dxd = dx.data<T>();
      const T* md = ls.mask.data<T>();
      for (int64_t i = 0; i < dx.numel(); ++i) dxd[i] *= md[i];
    }
    dy = dx;
  }
  LstmGrads r;
  r.d_x = s.batch_first ? swap01(dy) : dy;
  if (sv.has_h0) r.d_h0 = dh;
  if (sv.has_c0) r.d_c0 = dc;
  return r;
}

class ReferenceBackend final : public LstmBackend {
 public:
  using LstmBackend::LstmBackend;
  Algo algo() const override { return Algo::Reference; }
  std::string name() const override { return "reference"; }
  std::string last_run() const override { return ran_ ? "reference" : ""; }
  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override {
    check_call(in, weights, ctx);
    std::unique_ptr<Saved> sv = saved ? std::make_unique<Saved>() : nullptr;
    LstmOutput out = dtype() == DType::F64 ? forward_impl<double>(spec(), weights, in, training, rng, sv.get())
                                           : forward_impl<float>(spec(), weights, in, training, rng, sv.get());
    if (saved) *saved = std::move(sv);
    ran_ = true;
    return out;
  }
  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override {
    LSTM_REQUIRE(ctx.device == Device::CPU, "reference LSTM backward: runs on the CPU, got a "
                                                << device_name(ctx.device) << " execution context");
    const auto* sv = dynamic_cast<const Saved*>(&saved);
    LSTM_REQUIRE(sv, "LSTM backward: saved state does not come from the reference backend's forward");
    return sv->dtype == DType::F64 ? backward_impl<double>(spec(), weights, *sv, grad, d_weights)
                                   : backward_impl<float>(spec(), weights, *sv, grad, d_weights);
  }

 private:
  bool ran_ = false;
};

}  // namespace

std::string reference_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device) {
  if (device != Device::CPU) return "the reference backend runs on the CPU only";
  if (dtype != DType::F32 && dtype != DType::F64)
    return std::string("the reference backend computes in F32 or F64, not ") + dtype_name(dtype);
  return "";
}

std::unique_ptr<LstmBackend> make_reference_lstm_backend(const LstmSpec& spec, DType dtype) {
  return std::make_unique<ReferenceBackend>(spec, dtype, Device::CPU);
}

}  // namespace lstm::cpu
