// Element-type conversion and fill on the GPU, for Tensor (internal; CUDA builds only).
#pragma once

#include <cstdint>

#include "lstm/tensor.hpp"

namespace lstm::cuda {

// dst[i] = (dst dtype) src[i] for i < n, on the engine stream. Every pair of
// F64/F32/BF16/F16/I64/I32/U8 is accepted; floats round to nearest even.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);
// dst[i] = value for i < n, on the engine stream.
void fill(void* dst, DType dtype, double value, int64_t n);

}  // namespace lstm::cuda
