// The CPU reference LSTM backend (f32 and f64), the function every other backend is tested against.
#pragma once

#include "lstm/lstm.hpp"

namespace lstm::cpu {

LstmBackend& reference_lstm_backend();

}  // namespace lstm::cpu
