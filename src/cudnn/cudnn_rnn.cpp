// cuDNN's algorithms, descriptors, refusals, math modes and weight layout for the LSTM backend.
#include "cudnn/cudnn_rnn.hpp"

#include <sstream>

namespace lstm::cudnn {

// Padding value cuDNN writes into the outputs past each length: all-zero bits, which reads as 0 in
// every float dtype (cuDNN reads it as the data descriptor's type).
double g_zero_fill = 0.0;

std::string CaseText::text() const {
  const LstmSpec& s = *spec;
  std::ostringstream os;
  os << "input_size " << s.input_size << ", hidden_size " << s.hidden_size << ", proj_size " << s.proj_size << ", "
     << s.num_layers << " layer(s), " << (s.bidirectional ? "bidirectional" : "unidirectional")
     << (s.bias ? "" : ", no bias") << ", " << dtype_name(dt);
  if (B > 0) os << ", batch " << B << ", " << T << " steps, " << (varlen ? "variable lengths" : "equal lengths");
  return os.str();
}

cudnnRNNAlgo_t to_cudnn_algo(int a) {
  switch (a) {
    case kPersistStatic: return CUDNN_RNN_ALGO_PERSIST_STATIC;
    case kPersistDynamic: return CUDNN_RNN_ALGO_PERSIST_DYNAMIC;
    case kPersistSmallH: return CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H;
    default: return CUDNN_RNN_ALGO_STANDARD;
  }
}

int algo_id(CudnnAlgo a) {
  switch (a) {
    case CudnnAlgo::Standard: return kStandard;
    case CudnnAlgo::PersistStatic: return kPersistStatic;
    case CudnnAlgo::PersistDynamic: return kPersistDynamic;
    case CudnnAlgo::PersistStaticSmallH: return kPersistSmallH;
    case CudnnAlgo::Auto: return kAutoAlgo;
    case CudnnAlgo::Heuristic: return kHeuristicAlgo;
  }
  return kStandard;
}

// The limit a refusal most likely hit, from what cuDNN 9 was seen to refuse on an H200 (the
// DISABLED_ProbeAlgorithmLimits test prints it) and PyTorch's notes, so that the message names it
// and not only cuDNN's status.
static std::string limit_hint(int a, const CaseText& c) {
  if (a == kStandard) return "";
  const std::string name = kAlgoNames[a];
  const std::string h = std::to_string(c.spec->hidden_size);
  if (c.varlen)
    return "cuDNN's persistent algorithms run only batches whose sequences all have the same length; this batch has "
           "variable lengths";
  if (c.spec->proj_size > 0) return name + " has no projection (proj_size) support; only standard has";
  if (!c.spec->bias) return name + " needs the biases (bias=true); only standard runs bias=false";
  switch (a) {
    case kPersistSmallH:
      return name + " is for small hidden sizes: up to 192 for inference and 128 for training (cuDNN 9.19 on an "
                    "H200); hidden_size " + h + " is past that";
    case kPersistStatic:
      return name + " keeps the recurrent weights on chip: hidden sizes up to 1024 ran, 2048 was refused (cuDNN "
                    "9.19 on an H200); hidden_size " + h + " is past what it takes here";
    default:
      return name + " compiles a persistent kernel for the shape (hidden sizes up to 2048 ran with cuDNN 9.19 on an "
                    "H200); hidden_size " + h + " with this batch is past what it takes here";
  }
}

static bool is_rejection(cudnnStatus_t st, int algo) {
  if (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED) return true;
  // A persistent algorithm answers some shapes it cannot run with BAD_PARAM; for the standard
  // algorithm BAD_PARAM would be our bug and is reported as such.
  return algo != kStandard && CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_BAD_PARAM;
}

void check_accepts(cudnnStatus_t st, int algo, const CaseText& what_case, const char* call, const char* file,
                   int line, const char* expr) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  if (is_rejection(st, algo)) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    std::ostringstream os;
    os << "cuDNN " << kAlgoNames[algo] << " does not support this LSTM (" << what_case.text() << "): " << call
       << " returned " << cudnnGetErrorString(st);
    if (detail[0]) os << " (" << detail << ")";
    const std::string lim = limit_hint(algo, what_case);
    if (!lim.empty()) os << ". " << lim;
    os << ". cudnn_algo \"standard\" runs every case; \"auto\" picks the fastest algorithm that accepts it";
    throw Rejected(os.str());
  }
  cuda::check(st, file, line, expr);
}

std::string under_capture(cudnnStatus_t st) {
  if (st == CUDNN_STATUS_SUCCESS) return "";
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  return std::string("cuDNN under stream capture returned ") + cudnnGetErrorString(st) +
         (detail[0] ? std::string(" (") + detail + ")" : std::string());
}

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: break;
  }
  LSTM_THROW("the cuDNN LSTM computes in F32, BF16, F16 or F64, not " << dtype_name(dt));
}

// The math cuDNN may use, as PyTorch's nn.LSTM asks for it (aten/src/ATen/cudnn/Descriptors.h):
// compute precision fp32 for every float dtype; F16 data on tensor cores (TENSOR_OP); BF16 data
// and TF32-allowed F32 data with DEFAULT_MATH, which on Ampere and newer runs F32 GEMMs as TF32;
// F32 without TF32 in plain FMA. Never TENSOR_OP_MATH_ALLOW_CONVERSION: it lets cuDNN convert F32
// data to half precision (faster, but inputs beyond fp16's range +-65504 become inf; measured with
// bench/probe_cudnn_settings, docs/PERFORMANCE.md).
void math_for(DType dt, bool allow_tf32, cudnnDataType_t* prec, cudnnMathType_t* math) {
  switch (dt) {
    case DType::F64:
      *prec = CUDNN_DATA_DOUBLE;
      *math = CUDNN_DEFAULT_MATH;
      return;
    case DType::F32:
      *prec = CUDNN_DATA_FLOAT;
      *math = allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
      return;
    case DType::BF16:
      *prec = CUDNN_DATA_FLOAT;
      *math = CUDNN_DEFAULT_MATH;
      return;
    default:
      *prec = CUDNN_DATA_FLOAT;
      *math = CUDNN_TENSOR_OP_MATH;
      return;
  }
}

// ---- Weight layout ----

static int64_t desc_numel(cudnnTensorDescriptor_t d) {
  cudnnDataType_t t;
  int nb = 0;
  int dims[8], strides[8];
  LSTM_CUDA_CHECK(cudnnGetTensorNdDescriptor(d, 8, &t, &nb, dims, strides));
  int64_t n = 1;
  for (int i = 0; i < nb; ++i) n *= dims[i];
  return n;
}

LstmBackend::FlatLayout compute_layout(cudnnHandle_t h, cudnnRNNDescriptor_t rnn, const LstmSpec& s, DType dt) {
  LstmBackend::FlatLayout out;
  LSTM_CUDA_CHECK(cudnnGetRNNWeightSpaceSize(h, rnn, &out.bytes));
  // cudnnGetRNNWeightParams returns addresses inside the buffer it is given; a real (arena)
  // buffer keeps that within what the API documents.
  cuda::DeviceBuffer probe(out.bytes);
  const char* base = static_cast<const char*>(probe.get());
  TensorDesc mdesc, bdesc;
  const size_t es = dtype_size(dt);
  const int64_t H = s.hidden_size, P = s.proj_size, Hout = s.out_size(), D = s.directions();
  out.offsets.assign(s.param_names().size(), 0);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const int32_t pseudo = static_cast<int32_t>(l * D + d);
      const int64_t In = s.layer_input_size(l);
      auto where = [&](int32_t lin, bool bias, int64_t numel) -> size_t {
        void* addr = nullptr;
        if (bias)
          LSTM_CUDA_CHECK(cudnnGetRNNWeightParams(h, rnn, pseudo, out.bytes, base, lin, nullptr, nullptr, bdesc.get(),
                                                  &addr));
        else
          LSTM_CUDA_CHECK(cudnnGetRNNWeightParams(h, rnn, pseudo, out.bytes, base, lin, mdesc.get(), &addr, nullptr,
                                                  nullptr));
        LSTM_CHECK(addr, "cuDNN returned no address for linLayerID " << lin << " of pseudo-layer " << pseudo);
        LSTM_CHECK(desc_numel(bias ? bdesc.get() : mdesc.get()) == numel,
                   "cuDNN's linLayerID " << lin << " of pseudo-layer " << pseudo << " has "
                                         << desc_numel(bias ? bdesc.get() : mdesc.get()) << " elements, expected "
                                         << numel);
        const size_t off = static_cast<size_t>(static_cast<const char*>(addr) - base);
        LSTM_CHECK(off % es == 0 && off + static_cast<size_t>(numel) * es <= out.bytes,
                   "cuDNN weight offset " << off << " is outside the weight space");
        return off;
      };
      // One nn.LSTM tensor = cuDNN's four gates (linLayerIDs first..first+3, gate order i, f, g, o)
      // back to back.
      auto gates = [&](int32_t first, bool bias, int64_t per_gate) -> size_t {
        const size_t off = where(first, bias, per_gate);
        for (int32_t g = 1; g < 4; ++g)
          LSTM_CHECK(where(first + g, bias, per_gate) == off + static_cast<size_t>(g * per_gate) * es,
                     "cuDNN's gate " << g << " of linLayerID " << first << " (pseudo-layer " << pseudo
                                     << ") does not follow gate " << g - 1 << "; nn.LSTM's layout cannot map onto it");
        return off;
      };
      const auto sl = s.slots(l, d);
      out.offsets[sl.w_ih] = gates(0, false, H * In);
      out.offsets[sl.w_hh] = gates(4, false, H * Hout);
      if (s.bias) {
        out.offsets[sl.b_ih] = gates(0, true, H);
        out.offsets[sl.b_hh] = gates(4, true, H);
      }
      if (P > 0) out.offsets[sl.w_hr] = where(8, false, P * H);
    }
  }
  return out;
}

void set_rnn_desc(cudnnRNNDescriptor_t d, int algo, const LstmSpec& s, DType dt, bool allow_tf32,
                  cudnnDropoutDescriptor_t drop, const CaseText& what, bool padded_io) {
  cudnnDataType_t prec;
  cudnnMathType_t math;
  math_for(dt, allow_tf32, &prec, &math);
  // projSize == hiddenSize turns the projection off; padded I/O admits the unpacked layouts.
  LSTM_CUDNN_ACCEPTS(
      cudnnSetRNNDescriptor_v8(d, to_cudnn_algo(algo), CUDNN_LSTM, s.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
                               s.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT,
                               data_type(dt), prec, math, static_cast<int32_t>(s.input_size),
                               static_cast<int32_t>(s.hidden_size), static_cast<int32_t>(s.out_size()),
                               static_cast<int32_t>(s.num_layers), drop,
                               padded_io ? CUDNN_RNN_PADDED_IO_ENABLED : CUDNN_RNN_PADDED_IO_DISABLED),
      algo, what, "cudnnSetRNNDescriptor_v8");
}

bool in_place(const std::vector<Tensor>& ts, const LstmBackend::FlatLayout& layout, void** base) {
  if (ts.empty() || layout.offsets.size() != ts.size()) return false;
  char* b = static_cast<char*>(const_cast<void*>(ts[0].raw())) - layout.offsets[0];
  for (size_t i = 0; i < ts.size(); ++i)
    if (!ts[i].same_storage(ts[0]) || static_cast<const char*>(ts[i].raw()) != b + layout.offsets[i]) return false;
  *base = b;
  return true;
}

}  // namespace lstm::cudnn
