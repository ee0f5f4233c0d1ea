// Small device kernels around the cuDNN LSTM (internal; CUDA builds only). All run on the engine
// stream and return without waiting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lstm/tensor.hpp"

namespace lstm::cuda {

// dst[t, b, :] = t < len[b] ? src[t, b, :] : 0 for a [T, B, W] array ([B, T, W] when
// batch_first) of elem_size-byte elements (2, 4 or 8: zero is all-zero bits for every float
// dtype). dst may equal src. len: B int32 values on the device.
void mask_past_lengths(void* dst, const void* src, size_t elem_size, int64_t T, int64_t B, int64_t W,
                       bool batch_first, const int32_t* len);

// dst[i] += src[i] for i < n, each side in its own float dtype (F64, F32, BF16, F16); the sum is
// formed in double when either side is F64, else in float.
void add_into(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

// dst[i] = host[i] for i < n (int32, dst on the device). The values travel as kernel arguments,
// so `host` may change as soon as this returns and the engine stream is never waited for (a
// pageable cudaMemcpyAsync may wait, and a pinned buffer could be rewritten before its copy runs).
void upload_int32(int32_t* dst, const int32_t* host, int64_t n);

}  // namespace lstm::cuda
