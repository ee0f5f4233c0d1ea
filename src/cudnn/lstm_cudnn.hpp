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

// cuda_graphs "auto"'s first look at a shape, from its measured eager calls (the fastest host
// time to issue one and the fastest GPU time, in us): whether a trial of replays is worth making.
// Yes when the host is what the call waits for (it took at least half the GPU's time to issue),
// or when the copies into the graph's input buffers that a replay adds (staged_bytes, each read
// and written once at copy_gbs GB/s of bytes read + written; 1000 when copy_gbs <= 0) take at most
// 5% of the call: a graph also closes the gaps between cuDNN's dependent per-step kernels, which
// the H200 measured at 5-10% on GPU-bound shapes. The trial's replays, copies included, decide.
struct GraphFirstLook {
  double copy_us = 0;
  bool host_bound = false;
  bool cheap_copy = false;
  bool try_graphs() const { return host_bound || cheap_copy; }
};
GraphFirstLook cuda_graphs_first_look(double host_us, double gpu_us, size_t staged_bytes, double copy_gbs);

}  // namespace lstm
