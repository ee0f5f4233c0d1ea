// Placeholder until the cuDNN backend lands (being written in this same change set).
#include "cudnn/lstm_cudnn.hpp"

namespace lstm {
std::unique_ptr<LstmBackend> make_cudnn_lstm_backend(const LstmOptions&) {
  LSTM_THROW("the cuDNN LSTM backend is not built yet");
}
}  // namespace lstm
