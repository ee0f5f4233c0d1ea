// What the registry says about cuDNN's algorithms, and cudnn_algo "heuristic": PyTorch nn.LSTM's
// rule for which cuDNN algorithm runs a shape (a pure function; unit-tested without a GPU).
#include "cudnn/cudnn_rnn.hpp"
#include "cudnn/lstm_cudnn.hpp"

namespace lstm {
using namespace cudnn;

std::string cudnn_algo_summary(CudnnAlgo a) {
  switch (a) {
    case CudnnAlgo::Standard: return "GPU, F64/F32/TF32/BF16/F16: cuDNN's standard algorithm, CUDA graphs";
    case CudnnAlgo::PersistStatic:
      return "GPU, F32/TF32/F16 (cuDNN 9 has no BF16 persistence): cuDNN's persistent kernel; hidden and batch "
             "limits set by cuDNN per device; no variable lengths, projection or bias-free layers";
    case CudnnAlgo::PersistDynamic:
      return "GPU, F32/TF32/F16: cuDNN's run-time compiled persistent kernel (one compile per batch size); "
             "no variable lengths, projection or bias-free layers";
    case CudnnAlgo::PersistStaticSmallH:
      return "GPU, F32/TF32/F16: cuDNN's persistent kernel for small hidden sizes (up to 192 in inference, "
             "128 in training, per cuDNN); no variable lengths, projection or bias-free layers";
    default: return "GPU: cuDNN";
  }
}

bool cudnn_algo_varlen(CudnnAlgo a) { return a == CudnnAlgo::Standard || a == CudnnAlgo::Heuristic || a == CudnnAlgo::Auto; }

std::string cudnn_heuristic_algo(const LstmSpec& spec, DType dtype, int64_t T, int64_t B, bool variable_lengths,
                                 bool training, int cc_major, int cc_minor, int sms) {
  return kAlgoNames[heuristic_algo(spec, dtype, T, B, variable_lengths, training, cc_major, cc_minor, sms)];
}

namespace cudnn {
int heuristic_algo(const LstmSpec& spec, DType dtype, int64_t T, int64_t B, bool variable_lengths, bool training,
                   int cc_major, int cc_minor, int sms) {
  // Where cuDNN 9 refuses every persistent algorithm (measured on cuDNN 9.19, see the tests).
  if (variable_lengths || spec.proj_size > 0 || !spec.bias || dtype == DType::F64) return kStandard;
  // The backward pass takes persist_static_small_h only up to hidden 128; a training forward
  // must use the algorithm its backward will.
  if (cc_major >= 6 && spec.hidden_size <= (training ? 128 : 192)) return kPersistSmallH;
  if (dtype != DType::F16) return kStandard;
  const bool shape_ok = spec.num_layers == 1 && !spec.bidirectional && spec.hidden_size <= 1024 &&
                        spec.hidden_size % 128 == 0 && spec.input_size % 128 == 0;
  if (!shape_ok) return kStandard;
  bool device_ok = false;
  if (cc_major == 7 && cc_minor != 5) {
    // Volta: batches that are multiples of 16 (but not 80 or 112) or exactly 8, long enough.
    device_ok = ((B % 16 == 0 && B != 80 && B != 112) || B == 8) &&
                ((T >= 40 && B <= 128) || (T >= 20 && B <= 96) || (T >= 10 && B <= 32));
  } else if (cc_major >= 8 && sms >= 98 && cc_minor != 6) {
    // Large Ampere and newer (not sm_86, not the 56-SM A30 class).
    device_ok = B % 8 == 0 && B <= 128;
  }
  return device_ok ? kPersistStatic : kStandard;
}
}  // namespace cudnn

}  // namespace lstm
