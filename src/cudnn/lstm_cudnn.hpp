// The LSTM stack through cuDNN's RNN API (internal; CUDA builds only).
#pragma once

#include <memory>

#include "lstm/lstm.hpp"

namespace lstm {

// "" when cuDNN can run spec in dtype on device with options.cudnn_algo (host-side descriptor
// checks only: a persistent algorithm that rejects the hidden size names the limit), else why not.
std::string cudnn_lstm_unsupported(const LstmSpec& spec, DType dtype, Device device, const LstmOptions& options);
// A cuDNN backend instance; options.cudnn_algo picks cuDNN's algorithm, allow_tf32 the math mode
// for F32 data, cuda_graphs whether its calls are replayed as CUDA graphs.
std::unique_ptr<LstmBackend> make_cudnn_lstm_backend(const LstmSpec& spec, DType dtype, Device device,
                                                     const LstmOptions& options);
// The registry's line about one pinned cuDNN algorithm, and whether it takes variable lengths
// within a batch (cuDNN 9's persistent algorithms refuse them at call time).
std::string cudnn_algo_summary(CudnnAlgo a);
bool cudnn_algo_varlen(CudnnAlgo a);

// The algorithm cudnn_algo "heuristic" runs for a call: the rule PyTorch's nn.LSTM applies
// (persist_static_small_h for hidden sizes up to 192 in inference and 128 in training,
// persist_static for single-layer unidirectional fp16 with sizes that are multiples of 128 and
// batches the device rule accepts, standard otherwise), so that the same shapes run the same
// cuDNN algorithm as there. Persistent algorithms are never chosen where cuDNN 9 refuses them:
// variable lengths within the batch, proj_size, no bias, F64. T = steps, B = batch;
// (cc_major, cc_minor, sms) describe the GPU.
std::string cudnn_heuristic_algo(const LstmSpec& spec, DType dtype, int64_t T, int64_t B, bool variable_lengths,
                                 bool training, int cc_major, int cc_minor, int sms);

}  // namespace lstm
