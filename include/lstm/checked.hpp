// Checked size arithmetic for every size that comes from a file, a configuration or a flag.
//
// Sizes from outside are bounded before anything multiplies them, products are computed with
// overflow checks, and a job's memory is compared with the machine's before it is allocated, so
// a hostile or mistyped number ends in an lstm::Error naming it instead of a wrapped-around
// size, a crash or a bare std::bad_alloc.
#pragma once

#include <cstdint>
#include <string_view>

namespace lstm {

// The largest size of one dimension (a hidden size, a batch, a sequence length, ...): BLAS,
// cuBLAS and cuDNN index with 32-bit integers, so nothing larger can run anyway.
inline constexpr int64_t kMaxDim = 2147483647;
// The most layers of one LSTM stack: the host walks the stack layer by layer (names, shapes,
// launches), so a mistyped 1e6 would spin for hours long before memory ran out; stacks that
// train are a few layers deep.
inline constexpr int64_t kMaxLayers = 1024;

// a * b and a + b for non-negative operands; on overflow throws lstm::Error
// "<what>: <a> * <b> overflows 64-bit integers".
int64_t checked_mul(int64_t a, int64_t b, std::string_view what);
int64_t checked_add(int64_t a, int64_t b, std::string_view what);

// Returns v when lo <= v <= hi, else throws "<what>: expected an integer in [lo, hi], got v".
int64_t checked_size(int64_t v, int64_t lo, int64_t hi, std::string_view what);

// Physical memory of this machine in bytes (0 when the system does not say).
uint64_t physical_memory_bytes();
// Throws "<what> needs <bytes> (<GiB>), more than this machine's <GiB> of memory" when `bytes`
// exceeds the physical memory; nothing is allocated.
void require_memory(uint64_t bytes, std::string_view what);

}  // namespace lstm
