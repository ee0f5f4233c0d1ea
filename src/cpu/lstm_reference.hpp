// The CPU reference LSTM backend (f32 and f64), the function every other backend is tested against.
#pragma once

#include "lstm/lstm.hpp"

namespace lstm::cpu {

// "" when the reference computes spec in dtype on device (F32 or F64 on the CPU), else why not.
std::string reference_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device);
std::unique_ptr<LstmBackend> make_reference_lstm_backend(const LstmSpec& spec, DType dtype);

}  // namespace lstm::cpu
