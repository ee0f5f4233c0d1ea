// What the GPU benchmark needs beyond the library (CUDA builds only): random fills and finiteness
// checks on the engine stream, and the timing-fairness rules every measured cell follows, kept in
// one place so that a rule holds for every backend alike (bench/README.md, docs/PERFORMANCE.md
// "Method"):
//   - event timing on the engine stream, each call between its own two events, with the host's
//     time to issue it (EventTimer);
//   - the SM clock read right after a timed loop (sm_clock_mhz): the H200 caps its clock by a
//     power average, so a number is quoted with the clock it ran at;
//   - a cool-down before each cell, as long as the previous cell kept the GPU busy (Cooldown);
//   - placement pads that move where later buffers land in device memory (held_mib);
//   - inputs rotated through a pool of several times the L2, so no call finds its inputs in L2
//     from an earlier call (InputRotation);
//   - an optional L2 persisting window (L2Window), an experiment on the placement dependence.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "lstm/tensor.hpp"

namespace lstm::bench {

// p[i] = uniform in [lo, hi) for i < n, in `dtype` (F32, BF16 or F16), from a counter-based hash
// of (seed, i): the same seed gives the same values; never zeros or a constant.
// Issued on the engine stream.
void fill_uniform(void* p, DType dtype, int64_t n, float lo, float hi, uint64_t seed);
// Number of NaN/Inf values among p[0..n) (F32, BF16 or F16) counted on the device; waits for the
// engine stream (a timing loop is over when this is called).
int64_t count_non_finite(const void* p, DType dtype, int64_t n);
// One thread on the engine stream spins for `cycles` clock64() cycles (what torch.cuda._sleep
// does): timed with events, it gives the SM clock (sm_clock_mhz).
void spin_cycles(long long cycles);

// The q-quantile (0..1, linear interpolation) of v; 0 for an empty v.
double percentile(std::vector<double> v, double q);

// Times calls with CUDA events on the engine stream.
class EventTimer {
 public:
  EventTimer() = default;
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Times `count` calls of run(first + k), each between two events; prepare(first + k) runs before
  // each, outside the timed region. Returns milliseconds per call. host_us, when given, receives
  // the host's time to issue each run (us): where it approaches the GPU's time, the call is bound
  // by the host, not the GPU.
  std::vector<double> time(int first, int count, const std::function<void(int)>& prepare,
                           const std::function<void(int)>& run, std::vector<double>* host_us = nullptr);

 private:
  cudaEvent_t event(size_t i);
  std::vector<cudaEvent_t> ev_;
};

// The SM clock now, in MHz: a fixed number of clock64() cycles on one thread, timed with events
// (bench_gpu_torch.py measures it alike with torch.cuda._sleep). Called right after a timed loop,
// it reads the clock that loop ran at (boost and power limits move it between runs).
double sm_clock_mhz(EventTimer& timer);

// The GPU idles for `ms` after finishing what is queued (nothing when ms <= 0).
void idle_gpu(double ms);

// --cooldown-ms: the H200 caps its clock by a power average over about a second (nvidia-smi's SW
// power cap), so after a GEMM-heavy cell the next one ran at 1450-1650 MHz instead of 1980, by an
// amount that hangs on how many calls came before, which differs between benches. Each cell
// therefore starts after an idle as long as the previous cell kept the GPU busy, at most limit_ms
// (bench_gpu_torch.py applies the same rule).
class Cooldown {
 public:
  explicit Cooldown(double limit_ms) : limit_ms_(limit_ms) {}
  // Idles before a cell; returns the ms idled and starts counting the new cell's busy time.
  double before_cell();
  // A cell whose warm-up ran longer than the other bench's (settling CUDA graphs) idles again for
  // as long as that warm-up kept the GPU busy, so its timed calls start from the same history:
  // an idle GPU and --warmup calls. Returns the ms idled (0 when the limit is 0).
  double after_settling(double warmup_busy_ms);
  void busy(double ms) { busy_ms_ += ms; }
  double limit_ms() const { return limit_ms_; }

 private:
  double limit_ms_;
  double busy_ms_ = 0;  // GPU time of the calls since the last before_cell
};

// --pad-mib and the per-cell pads: `mib` MiB of device memory, held while the tensor lives, so
// that later buffers land elsewhere (undefined for mib <= 0): to tell whether a time hangs on
// where a cell's buffers are.
Tensor held_mib(int64_t mib);

// Inputs that never come from L2: one random pool per storage dtype (U(-1, 1), at least 4x the
// device's L2 and 2 of the largest slot), from which every call of every cell takes the next
// slot, a cursor running through the whole pool across cells.
class InputRotation {
 public:
  // largest_slot_elems: the largest x + d_output slot (elements) any cell will ask for.
  explicit InputRotation(int64_t largest_slot_elems);
  // Elements of one slot: x, and d_output when training, each aligned to 128 elements.
  static int64_t slot_elems(const Shape& x_shape, const Shape& dout_shape);
  struct Views {
    std::vector<Tensor> xs, douts;  // one per call, cycled; douts empty when dout_shape is
    Tensor x0, dout0;               // at the start of the pool: the same values in every cell
    size_t x_bytes = 0, dout_bytes = 0;
  };
  // Up to `count` slots (fewer when the pool holds fewer) of x_shape and, unless dout_shape is
  // empty, dout_shape, in dtype.
  Views take(DType dtype, const Shape& x_shape, const Shape& dout_shape, int64_t count);
  size_t l2_bytes() const { return l2_bytes_; }

 private:
  Tensor& pool(DType dtype);
  size_t l2_bytes_;
  int64_t largest_slot_elems_;
  std::map<DType, Tensor> pools_;
  std::map<DType, int64_t> cursor_;  // next free element of each pool
};

// --l2-whh: an L2 persisting access window on the engine stream for the life of the object (as
// much of the L2 as the device lets persist; hit ratio = that / the window). Needs a stream of
// our own (LSTM_CUDA_STREAM=own).
class L2Window {
 public:
  struct Set {
    size_t persisting_bytes = 0, window_bytes = 0;
    float hit_ratio = 0;
  };
  L2Window() = default;
  ~L2Window();
  L2Window(const L2Window&) = delete;
  L2Window& operator=(const L2Window&) = delete;
  Set set(const void* p, size_t bytes);

 private:
  bool set_ = false;
};

}  // namespace lstm::bench
