// The persistent recurrence (Algo::Persistent): one kernel launch runs every step of a layer's
// directions, each CTA holding its slice of W_hh on-chip (shared memory, or registers) for the
// whole sequence and handing h_t to the others once per step through L2 (tagged words or flags).
// docs/KERNELS.md ("The persistent backend") has the mapping, the exchange and the limits.
// Internal to the fused backend (src/cuda/lstm_fused.cu), which does everything around the
// recurrence: the input projection GEMMs, dropout, the layer loop, what training saves and the
// whole backward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "lstm/tensor.hpp"

namespace lstm::cuda {

// How a launch is spread over the GPU: `units` hidden units per CTA (4*units rows of W_hh, and of
// W_ih for groups that project their input themselves, in its shared memory), `ctas` CTAs per
// group, `smem` bytes of dynamic shared memory per CTA. The grid-wide kernels: `n_tiles` mma tiles
// of 8 batch rows; `w_in_registers`: the warps keep their W tiles in registers rather than reading
// them from shared memory every step (docs/KERNELS.md, "Mapping"). The cluster kernels
// (`cluster`): each group is one thread-block cluster of `ctas` CTAs, and `resident` says how many
// such clusters the device holds at once (planned on a device; 0 from the pure planner). A batch
// of more than 8 rows is split into `batch_groups` clusters per group of `rows` rows each (the
// last may have fewer; outside the wavefront, where nothing crosses clusters), so a launch runs
// groups x batch_groups clusters, in waves when the device holds fewer; groups of more than 8 rows
// (where 8-row groups would not fit the device at once) run the kernel's 16-row tiles.
struct PersistentShape {
  int units = 0, ctas = 0, n_tiles = 0;
  size_t smem = 0;
  bool w_in_registers = false;
  bool cluster = false;
  int resident = 0;
  int rows = 0, batch_groups = 1;
  // The cluster kernel's batch tile: 8 rows, or 16 for groups of 9 to 16 rows.
  int tile_rows() const { return rows > 8 ? 16 : 8; }
};

// The measurement knobs of the persistent kernels (docs/DEVELOPING.md), read from the environment
// once per process: $LSTM_PERSISTENT_CLUSTER=0 (cluster_off), _UNITS (units), _REGS=0 (regs_off),
// _EXCHANGE (exchange, "" when unset), _WAVEFRONT=0 (no_wavefront), _SKIP (skip, PersistentSkip
// bits), _CLUSTER_SYNC=barrier (cluster_barrier), _TRACE=N (trace: the N-th group of a launch, 1
// the first; 0 when unset).
struct PersistentKnobs {
  bool cluster_off = false, regs_off = false, no_wavefront = false, cluster_barrier = false;
  int units = 0, skip = 0, trace = 0;
  std::string exchange;
};
const PersistentKnobs& persistent_knobs();

// The most groups (layer directions) one launch runs, and CTAs per group (the flag exchange's
// flags per group).
constexpr int kPersistentMaxGroups = 8;
constexpr int kPersistentMaxCtas = 256;

// How the CTAs hand h_t to each other (docs/KERNELS.md, "The exchange"): tagged 64-bit words
// polled directly, or plain values behind a flag per CTA set after a fence.
enum class PersistentExchange { Words, Flags };
// The exchange for batch B: $LSTM_PERSISTENT_EXCHANGE ("words" or "flags") when set (for
// measurement), else the measured rule (lstm_persistent.cu).
PersistentExchange persistent_exchange_for(int64_t B);


// The device properties the planner needs.
struct PersistentDevice {
  int sms = 0;                // cudaDevAttrMultiProcessorCount
  size_t smem_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
  bool cooperative = false;   // cudaDevAttrCooperativeLaunch
  bool cluster = false;       // cudaDevAttrClusterLaunch
};
// Reads them for CUDA device `device`: "" or why not.
std::string persistent_device(int device, PersistentDevice* out);

// Plans a launch of `groups` groups of hidden size H and recurrent input Hout for batch B on `dev`
// (a pure function): the smallest slice per CTA whose grid fits one CTA per SM (or exactly
// `pinned_units` when not 0). `in_size` > 0 when some group projects its input (of that width)
// itself (the wavefront). "" and *out filled, or why it cannot run (named limits).
std::string plan_persistent(const PersistentDevice& dev, int64_t H, int64_t Hout, int64_t in_size, int64_t groups,
                            int64_t B, DType dtype, PersistentShape* out, int pinned_units = 0);
// The same on CUDA device `device` (its properties; $LSTM_PERSISTENT_UNITS pins the slice,
// $LSTM_PERSISTENT_REGS=0 keeps W in shared memory).
std::string plan_persistent(int64_t H, int64_t Hout, int64_t in_size, int64_t groups, int64_t B, DType dtype,
                            int device, PersistentShape* out);

// The cluster kernels (docs/KERNELS.md, "Clusters"): one thread-block cluster of up to 16 CTAs
// per group and batch group of up to 8 rows holds W_hh in registers and hands h_t over through
// distributed shared memory, for bf16/fp16, no projection: a layer's directions per launch (any
// batch, split into groups of at most 8 rows), or (in_size > 0, batch <= 8) a unidirectional
// stack's wavefront, `groups` = 2L - 1 clusters (the L layers and the projection groups of layers
// 1 to L-1). A pure function of the device's properties like plan_persistent; ""
// and *out filled (cluster set), or why not.
// `resident`: how many clusters the device holds at once, when known (0: batch groups of at most
// 8 rows each; otherwise, outside a wavefront, groups of up to 16 rows where 8-row groups would
// take more clusters than the device holds).
std::string plan_persistent_cluster(const PersistentDevice& dev, int64_t H, int64_t Hout, int64_t in_size,
                                    int64_t groups, int64_t B, DType dtype, PersistentShape* out, int resident = 0);
// The same on CUDA device `device` ($LSTM_PERSISTENT_CLUSTER=0 turns them off), with `resident`
// (a stack's wavefront, groups waiting on each other, needs all of its clusters at once).
std::string plan_persistent_cluster(int64_t H, int64_t Hout, int64_t in_size, int64_t groups, int64_t B, DType dtype,
                                    int device, PersistentShape* out);

// 64-bit exchange words of one group for T steps of batch B and width W (the group's h): one
// slot of [B, W] words per step (W/2 rounded up for 16-bit E, which packs two values per word).
inline size_t persistent_exchange_words(int64_t T, int64_t B, int64_t W, DType dtype) {
  const int64_t per_row = dtype == DType::F32 ? W : (W + 1) / 2;
  return static_cast<size_t>(T * B * per_row);
}

// One group of a launch: a layer direction. Slot conventions are the fused backend's (DirPtrs
// in lstm_fused.cu): training (seq) keeps h and c of every step, forward direction writing slot
// t+1, reverse slot t (the initial state in slot 0, or T for reverse); inference reads h0/c0 from
// slot 0 and keeps the state on-chip. h_t itself travels between CTAs through the exchange
// words: after step s each CTA stores its units' h_t into slot s of xchg as 64-bit words, the data
// in the low half (one F32 value, or two adjacent 16-bit values) and the tag s + 1 in the high
// half, so a reader that sees the tag sees the data (no fence, no separate flag).
template <class E>
struct PersistentGroup {
  const E* w_hh = nullptr;   // [4H, Hout]
  const E* b_ih = nullptr;   // [4H] or null (no bias)
  const E* b_hh = nullptr;   // [4H] or null
  // Either gates holds x W_ih^T of every step (a GEMM before the launch; w_ih null), or w_ih is
  // set and the group projects its input itself each step from the exchange words of the group
  // below (in_xchg, width in_size; the wavefront of a unidirectional stack).
  float* gates = nullptr;    // [T, B, 4H]; training: the activated i, f, g, o written back
  const E* w_ih = nullptr;   // [4H, in_size] or null
  const unsigned long long* in_xchg = nullptr;
  int in_size = 0;
  E* h = nullptr;            // seq [T+1, B, Hout]; inference [B, Hout] (h0)
  float* c = nullptr;        // seq [T+1, B, H]; inference [B, H] (c0)
  E* y = nullptr;            // the layer output's column block of this direction ([T, B, ldy])
  E* h_n = nullptr;          // [B, Hout]
  E* c_n = nullptr;          // [B, H]
  unsigned long long* xchg = nullptr;  // [T, B, words], zero before the launch
  // The flag exchange instead (flags set): xchg holds plain E values [T, B, Hout] and CTA k stores
  // flags[k] = s + 1 (after a fence) once its values of step s are written; in_flags are the
  // group below's. Both zero before the launch, at most kPersistentMaxCtas each.
  unsigned* flags = nullptr;
  const unsigned* in_flags = nullptr;
  int reverse = 0;
  // The cluster kernels' wavefront of a unidirectional stack (docs/KERNELS.md, "Clusters: the
  // wavefront"): the group of layer l > 0 reads its x-projection from gx_in instead of gates, [T,
  // B, H, 4] words (a unit's four gates side by side) each holding an fp32 value and the tag s + 1
  // (zero before the launch), which a
  // projection group of its own cluster writes (gx_out set, with w_ih, in_xchg and in_size: layer
  // l-1's exchange words times W_ih, step by step; no other field).
  const unsigned long long* gx_in = nullptr;
  unsigned long long* gx_out = nullptr;
};

// The stages $LSTM_PERSISTENT_SKIP can leave out (bits; measurement only).
enum PersistentSkip : int {
  kSkipProduct = 1,   // the recurrent product
  kSkipWait = 2,      // the wait for the other CTAs' h (the words or flags are still read once)
  kSkipRead = 4,      // reading the exchange at all
  kSkipCell = 8,      // the partial sums' reduction and the gate math (h_t published unchanged)
  kSkipWrites = 16,   // the output and saved-state writes
  kSkipGates = 32,    // reading the x-projection values
  kSkipSleep = 64,    // polling without __nanosleep
  kSkipInput = 128,   // the cluster wavefront's input product (W_ih x_t)
};

template <class E>
struct PersistentArgs {
  PersistentGroup<E> group[kPersistentMaxGroups];
  const int32_t* len = nullptr;  // [B]
  int T = 0, B = 0, H = 0, Hout = 0, ldy = 0;
  int seq = 0;        // training: every step's state in slots, activated gates saved
  int fp32_split = 0; // F32 without TF32: each product as three TF32 products (hi*hi + hi*lo + lo*hi)
  // Measurement only ($LSTM_PERSISTENT_SKIP, docs/KERNELS.md), results are wrong with it: each
  // bit leaves a stage of the step out (PersistentSkip).
  int skip = 0;
  // Measurement only ($LSTM_PERSISTENT_CLUSTER_SYNC=barrier): the cluster kernels end each step
  // with a cluster-wide barrier instead of waiting on their per-CTA transaction barriers.
  int cluster_barrier = 0;
  // Measurement only ($LSTM_PERSISTENT_TRACE=N, set by the launch): clock stamps of each step's
  // stages in the first and last CTA of group trace_group's cluster (kTraceStamps per step).
  long long* trace = nullptr;
  int trace_group = 0;
  // Set by the launch (the cluster kernels): cluster c runs group c % groups on batch rows
  // [(c / groups) * rows, + rows) (PersistentShape::rows, batch_groups).
  int groups = 1, rows = 0;
};

// The recurrent sweep of one direction's backward in one cluster launch (the cluster kernels'
// shape, docs/KERNELS.md "Clusters: the backward"): per processed step the gate gradients dG of
// every row (zero past each length) into dg, the carried dh and dc in registers, dh_{t-1} =
// W_hh^T dG_t through distributed shared memory; at the end d_h0 and d_c0. The same semantics as
// the fused backward's sweep without a projection (lstm_fused_kernels.cuh).
template <class E>
struct PersistentBackArgs {
  const E* w_hh = nullptr;       // [4H, H]
  const float* gates = nullptr;  // [T, B, 4H] the forward's activated i, f, g, o
  const float* c = nullptr;      // [T + 1, B, H] the forward's cell-state slots
  const float* dy = nullptr;     // row (t, b) at dy + (t * B + b) * ldy
  int64_t ldy = 0;
  const int32_t* len = nullptr;  // [B]
  const E* dhn = nullptr;        // [B, H] or null
  const E* dcn = nullptr;        // [B, H] or null
  E* dg = nullptr;               // [T, B, 4H]
  E* dh0 = nullptr;              // [B, H] or null
  E* dc0 = nullptr;              // [B, H] or null
  int T = 0, B = 0, H = 0;
  int reverse = 0;               // the direction: its forward ran t = T-1 .. 0
  int rows = 0;                  // set by the launch: cluster c sweeps rows [c * rows, + rows)
};

// "" and the launch's shape in *out, or why the cluster backward does not take this direction on
// CUDA device `device` (a pure function of the device's properties beside it, for tests).
std::string plan_persistent_cluster_backward(const PersistentDevice& dev, int64_t H, int64_t B, DType dtype,
                                             PersistentShape* out);
std::string plan_persistent_cluster_backward(int64_t H, int64_t B, DType dtype, int device, PersistentShape* out);

// Launches the backward sweep planned by plan_persistent_cluster_backward on `stream`.
template <class E>
void launch_persistent_backward(const PersistentBackArgs<E>& a, const PersistentShape& shape, cudaStream_t stream);

// Launches groups [0, groups) as one cooperative grid (all CTAs resident) on `stream`. Throws
// lstm::Error when the launch fails.
template <class E>
void launch_persistent(const PersistentArgs<E>& a, int groups, const PersistentShape& shape, cudaStream_t stream);

}  // namespace lstm::cuda
