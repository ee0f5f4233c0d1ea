// Device helpers of bench_gpu_lstm (CUDA builds only): random fills and finiteness checks on the
// engine stream.
#pragma once

#include <cstdint>

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
// does): timed with events, it gives the SM clock (bench_gpu_lstm's sm_clock_mhz).
void spin_cycles(long long cycles);

}  // namespace lstm::bench
