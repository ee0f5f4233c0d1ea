// The LSTM stack through cuDNN's RNN API (internal; CUDA builds only).
#pragma once

#include <memory>

#include "lstm/lstm.hpp"

namespace lstm {

// A cuDNN backend instance; options.cudnn_algo picks cuDNN's algorithm ("standard",
// "persist_static", "persist_dynamic", "persist_static_small_h", "auto") and allow_tf32 the math
// mode for F32 data. Throws naming the accepted names for an unknown cudnn_algo.
std::unique_ptr<LstmBackend> make_cudnn_lstm_backend(const LstmOptions& options);

}  // namespace lstm
