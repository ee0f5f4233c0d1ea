// The LSTM stack through oneDNN's fused RNN primitives on the CPU (dnnl::lstm_forward /
// lstm_backward), the library PyTorch's CPU nn.LSTM runs on. Optional at build time
// (LSTM_HAVE_ONEDNN); without it the registry row is there and says why it cannot run.
#pragma once

#include <memory>
#include <string>

#include "lstm/lstm.hpp"

namespace lstm::cpu {

// Whether this binary was built with oneDNN, and its version ("" when not).
bool onednn_built();
std::string onednn_version();
// "" when the onednn backend computes spec in dtype on device, else why not (e.g. "built without
// oneDNN (install libdnnl-dev and reconfigure)", or F64, which oneDNN's RNN primitives lack).
std::string onednn_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device);
std::unique_ptr<LstmBackend> make_onednn_lstm_backend(const LstmSpec& spec, DType dtype);

}  // namespace lstm::cpu
