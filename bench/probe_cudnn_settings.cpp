// probe_cudnn_settings: times cudnnRNNForward (inference) and forward + backward (training) for an
// LSTM case under each combination of the descriptor settings that do not change the result's
// meaning: the data layout (SEQ_MAJOR_PACKED with padded I/O off, or SEQ_MAJOR_UNPACKED with
// padded I/O on, which is what PyTorch passes for a plain tensor) and the math type (FMA, DEFAULT,
// TENSOR_OP, TENSOR_OP_ALLOW_CONVERSION), for cuDNN's standard and persist_static algorithms. It is
// how the settings of src/cudnn/lstm_cudnn.cpp were chosen
// (docs/perf/log_2026-11-29_to_2026-12-01.md).
//
// All variants of one case and dtype share one weight space and one rotating input pool (>= 4x the
// L2), and are timed in interleaved rounds (round r times every variant in turn), so a clock drift
// over the run reaches every variant alike. Each variant reports the median over rounds of the
// per-round median; the output of each is compared with the case's reference variant (FMA for F32
// data, tensor-op math otherwise) as max |a - b| / max |ref| (inf when an output is not finite).
// "engine:<algo>" rows run the same case through our cuDNN backend (make_lstm_backend), in the
// same rounds, so the difference to the raw rows is the engine's own overhead.
//
//   probe_cudnn_settings --case L,H,I,B,T [--case ...] [--dtype fp32,tf32,bf16,fp16]
//                        [--mode infer,train] [--rounds N] [--reps N] [--x-scale S] [--w-scale S]
//                        [--null-stream] [--out FILE.jsonl]
// --x-scale 1e6 --w-scale 1e-6 shows whether a math type keeps fp32's range (x beyond fp16's).
// --null-stream adds raw calls with PyTorch's settings on the legacy default stream (the stream
// nn.LSTM runs on unless told otherwise), and nn.LSTM's exact call (unpacked layout, padded I/O,
// zero h0/c0 tensors rather than null pointers) on either stream: to tell what makes PyTorch's
// runs of the same cuDNN faster on some shapes (docs/perf/log_2026-11-29_to_2026-12-01.md). The
// engine stream is the legacy default stream itself unless LSTM_CUDA_STREAM=own (src/core/cuda_rt.cpp); run with
// LSTM_CUDA_STREAM=own to compare a stream of our own with the legacy one.
//
// One JSON object per line (also printed as a table on stdout). Without a GPU it says so and exits 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"

#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

#if LSTM_HAVE_CUDA
#include <cuda_runtime.h>
#include <cudnn.h>

#include "core/cuda_rt.hpp"
#include "cudnn/cudnn_util.hpp"
#endif

namespace {

using json = nlohmann::ordered_json;

struct Case {
  int L = 1, H = 0, I = 0, B = 0, T = 0;
  std::string id() const {
    std::ostringstream os;
    os << 'L' << L << "-H" << H << "-I" << I << "-B" << B << "-T" << T;
    return os.str();
  }
};

struct Options {
  std::vector<Case> cases;
  std::vector<std::string> dtypes{"fp32", "tf32", "bf16", "fp16"};
  std::vector<std::string> modes{"infer"};
  int rounds = 5, reps = 20;
  bool null_stream = false;  // also raw calls on the legacy default stream (PyTorch's stream)
  double x_scale = 1.0, w_scale = 1.0;  // x ~ U(-x_scale, x_scale); weights ~ w_scale * U(-1/sqrt(H), 1/sqrt(H))
  std::string out;
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "probe_cudnn_settings: " << msg
            << "\nusage: probe_cudnn_settings --case L,H,I,B,T [--case ...] [--dtype fp32,tf32,bf16,fp16]"
               " [--mode infer,train] [--rounds N] [--reps N] [--x-scale S] [--w-scale S] [--null-stream] [--out FILE.jsonl]\n";
  std::exit(2);
}

int to_int(const std::string& s, const char* what) {
  return static_cast<int>(lstm::bench::parse_int(what, s, 1, usage));
}

double to_positive(const std::string& s, const char* what) {
  const double v = lstm::bench::parse_double(what, s, usage);
  if (!(v > 0)) usage(std::string(what) + " expects a number > 0, got '" + s + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  bool dtypes_given = false, modes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--case") {
      const auto f = lstm::bench::split_commas(value());
      if (f.size() != 5) usage("--case: expected L,H,I,B,T, got " + std::to_string(f.size()) + " fields");
      Case c;
      c.L = to_int(f[0], "--case L");
      c.H = to_int(f[1], "--case H");
      c.I = to_int(f[2], "--case I");
      c.B = to_int(f[3], "--case B");
      c.T = to_int(f[4], "--case T");
      o.cases.push_back(c);
    } else if (a == "--dtype") {
      if (!dtypes_given) o.dtypes.clear();
      dtypes_given = true;
      for (const auto& d : lstm::bench::split_commas(value())) {
        if (d != "fp32" && d != "tf32" && d != "bf16" && d != "fp16")
          usage("--dtype: expected fp32, tf32, bf16 or fp16, got '" + d + "'");
        o.dtypes.push_back(d);
      }
    } else if (a == "--mode") {
      if (!modes_given) o.modes.clear();
      modes_given = true;
      for (const auto& m : lstm::bench::split_commas(value())) {
        if (m != "infer" && m != "train") usage("--mode: expected infer or train, got '" + m + "'");
        o.modes.push_back(m);
      }
    } else if (a == "--rounds") {
      o.rounds = to_int(value(), "--rounds");
    } else if (a == "--reps") {
      o.reps = to_int(value(), "--reps");
    } else if (a == "--null-stream") {
      o.null_stream = true;
    } else if (a == "--x-scale") {
      o.x_scale = to_positive(value(), "--x-scale");
    } else if (a == "--w-scale") {
      o.w_scale = to_positive(value(), "--w-scale");
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (o.cases.empty()) usage("give at least one --case");
  return o;
}

#if LSTM_HAVE_CUDA

using lstm::DType;
using lstm::Device;
using lstm::Tensor;

struct Variant {
  cudnnRNNAlgo_t algo;
  bool packed;
  cudnnMathType_t math;
  bool engine = false;  // our cuDNN backend (the registry row cudnn:<algo>), not a raw call
  bool null_stream = false;  // a raw call on a handle bound to the legacy default stream (PyTorch's default)
  bool zero_state = false;   // hx/cx passed as zero tensors (as nn.LSTM does) instead of null pointers
  std::string name() const {
    std::string s = algo == CUDNN_RNN_ALGO_STANDARD ? "standard" : "persist_static";
    if (engine) return "engine:" + s;
    s += packed ? "/packed" : "/unpacked";
    switch (math) {
      case CUDNN_FMA_MATH: s += "/fma"; break;
      case CUDNN_DEFAULT_MATH: s += "/default"; break;
      case CUDNN_TENSOR_OP_MATH: s += "/tensor_op"; break;
      default: s += "/allow_conversion"; break;
    }
    if (null_stream) s += "/null_stream";
    if (zero_state) s += "/zero_state";
    return s;
  }
};

std::vector<cudnnMathType_t> maths_for(const std::string& dt) {
  if (dt == "fp32") return {CUDNN_FMA_MATH};
  if (dt == "tf32") return {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_TENSOR_OP_MATH};
  return {CUDNN_TENSOR_OP_MATH, CUDNN_DEFAULT_MATH};
}

template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
struct Desc {
  H h{};
  Desc() { LSTM_CUDA_CHECK(Create(&h)); }
  ~Desc() { Destroy(h); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
};
using RnnDesc = Desc<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using DataDesc = Desc<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using DropDesc = Desc<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;

Tensor random_device(lstm::Rng& rng, int64_t n, DType dt, double k) {
  Tensor t = Tensor::empty({n}, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((rng.uniform() * 2.0 - 1.0) * k);
  return t.to(dt).to_device(Device::CUDA);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// One configured variant of a case: descriptors, sizes, buffers.
struct Run {
  Variant v;
  RnnDesc rnn;
  DataDesc x, y;
  std::unique_ptr<lstm::LstmBackend> be;  // engine variants
  std::string error;  // non-empty: cuDNN refused the variant
  size_t ws = 0, rs = 0;
  Tensor out;         // output on slot 0, for the comparison
  Tensor last;        // the engine's latest output
  std::vector<double> round_ms;
};

void probe(const Case& c, const std::string& dts, const std::string& mode, const Options& o, std::ostream* out) {
  const DType dt = dts == "bf16" ? DType::BF16 : dts == "fp16" ? DType::F16 : DType::F32;
  const cudnnDataType_t cdt =
      dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : dt == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
  const bool train = mode == "train";
  cudnnHandle_t h = lstm::cuda::cudnn_handle();  // the engine's, bound to its stream
  cudaStream_t s = lstm::cuda::stream();
  DropDesc drop;
  LSTM_CUDA_CHECK(cudnnSetDropoutDescriptor(drop.h, h, 0.0f, nullptr, 0, 0));

  std::vector<Variant> vs;
  for (cudnnRNNAlgo_t a : {CUDNN_RNN_ALGO_STANDARD, CUDNN_RNN_ALGO_PERSIST_STATIC})
    for (bool packed : {false, true})
      for (cudnnMathType_t m : maths_for(dts)) vs.push_back({a, packed, m});
  for (cudnnRNNAlgo_t a : {CUDNN_RNN_ALGO_STANDARD, CUDNN_RNN_ALGO_PERSIST_STATIC})
    vs.push_back({a, true, CUDNN_DEFAULT_MATH, true});
  if (o.null_stream) {
    // PyTorch's math for the dtype, both layouts, on the legacy default stream.
    const cudnnMathType_t tm = dts == "fp32" ? CUDNN_FMA_MATH : dts == "fp16" ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
    for (bool packed : {false, true}) vs.push_back({CUDNN_RNN_ALGO_STANDARD, packed, tm, false, true});
    // nn.LSTM's call exactly (unpacked, padded I/O, zero h0/c0 tensors), on either stream.
    for (bool ns : {false, true}) vs.push_back({CUDNN_RNN_ALGO_STANDARD, false, tm, false, ns, true});
  }
  cudnnHandle_t h0 = nullptr;  // bound to the legacy default stream, for null_stream variants
  if (o.null_stream) {
    LSTM_CUDA_CHECK(cudnnCreate(&h0));
    LSTM_CUDA_CHECK(cudnnSetStream(h0, nullptr));
  }
  struct HandleGuard {
    cudnnHandle_t h;
    ~HandleGuard() {
      if (h) cudnnDestroy(h);
    }
  } h0_guard{h0};
  lstm::LstmSpec spec;
  spec.input_size = c.I;
  spec.hidden_size = c.H;
  spec.num_layers = c.L;

  std::vector<std::unique_ptr<Run>> runs;
  size_t wbytes = 0, ws_max = 1;
  const std::vector<int32_t> len(static_cast<size_t>(c.B), c.T);
  const int LD = c.L;
  for (const Variant& v : vs) {
    auto r = std::make_unique<Run>();
    r->v = v;
    if (v.engine) {
      try {
        lstm::LstmOptions lo;
        lo.allow_tf32 = dts == "tf32";
        r->be = lstm::make_lstm_backend(v.algo == CUDNN_RNN_ALGO_STANDARD ? "cudnn:standard" : "cudnn:persist_static",
                                        lo, spec, dt, Device::CUDA);
      } catch (const std::exception& e) {
        r->error = e.what();
      }
      runs.push_back(std::move(r));
      continue;
    }
    try {
      LSTM_CUDA_CHECK(cudnnSetRNNDescriptor_v8(r->rnn.h, v.algo, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
                                               CUDNN_LINEAR_INPUT, cdt, CUDNN_DATA_FLOAT, v.math, c.I, c.H, c.H, c.L,
                                               drop.h, v.packed ? CUDNN_RNN_PADDED_IO_DISABLED : CUDNN_RNN_PADDED_IO_ENABLED));
      size_t wb = 0;
      LSTM_CUDA_CHECK(cudnnGetRNNWeightSpaceSize(h, r->rnn.h, &wb));
      LSTM_CHECK(wbytes == 0 || wb == wbytes, "weight space size differs between variants");
      wbytes = wb;
      const cudnnRNNDataLayout_t lay = v.packed ? CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED;
      double zero = 0;
      LSTM_CUDA_CHECK(cudnnSetRNNDataDescriptor(r->x.h, cdt, lay, c.T, c.B, c.I, len.data(), v.packed ? nullptr : &zero));
      LSTM_CUDA_CHECK(cudnnSetRNNDataDescriptor(r->y.h, cdt, lay, c.T, c.B, c.H, len.data(), v.packed ? nullptr : &zero));
      LSTM_CUDA_CHECK(cudnnGetRNNTempSpaceSizes(h, r->rnn.h, train ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                                                r->x.h, &r->ws, &r->rs));
      ws_max = std::max(ws_max, r->ws);
    } catch (const std::exception& e) {
      r->error = e.what();
    }
    runs.push_back(std::move(r));
  }
  LSTM_CHECK(wbytes > 0, "no variant accepted the case");

  lstm::Rng rng(1234 + static_cast<uint64_t>(c.H) * 7 + static_cast<uint64_t>(c.B));
  const double k = 1.0 / std::sqrt(static_cast<double>(c.H));
  const int64_t esz = static_cast<int64_t>(lstm::dtype_size(dt));
  void* wraw = nullptr;
  Tensor w = random_device(rng, static_cast<int64_t>(wbytes) / esz, dt, k * o.w_scale);
  // The engine's weights: views into w at the offsets cuDNN gives (the engine then uses w itself
  // as cuDNN's weight space, as it does for a placed model).
  std::vector<Tensor> wv;
  for (auto& r : runs) {
    if (!r->be) continue;
    const lstm::LstmBackend::FlatLayout lay = r->be->flat_layout(dt);
    LSTM_CHECK(lay.bytes == wbytes, "the engine's weight space differs from the raw one");
    if (wv.empty()) {
      wv = lstm::make_flat_weights(spec, lay, dt, Device::CUDA);
      const char* base = static_cast<const char*>(wv[0].raw()) - lay.offsets[0];
      LSTM_CUDA_CHECK(cudaMemcpy(const_cast<char*>(base), w.raw(), wbytes, cudaMemcpyDeviceToDevice));
      w = Tensor();  // the raw variants use the engine's buffer from here on
      wraw = const_cast<char*>(base);
    }
  }
  if (wv.empty()) wraw = w.raw();
  const int64_t xn = static_cast<int64_t>(c.T) * c.B * c.I, yn = static_cast<int64_t>(c.T) * c.B * c.H;
  const size_t l2 = static_cast<size_t>(lstm::cuda::device_prop().l2CacheSize);
  const int64_t slots = std::max<int64_t>(2, static_cast<int64_t>((4 * l2) / static_cast<size_t>(xn * esz)) + 1);
  Tensor xs = random_device(rng, xn * std::min<int64_t>(slots, 64), dt, o.x_scale);
  const int64_t nslots = std::min<int64_t>(slots, 64);
  Tensor dy = train ? random_device(rng, yn, dt, 1.0) : Tensor();
  Tensor y = Tensor::empty({yn}, dt, Device::CUDA), dx = Tensor::empty({xn}, dt, Device::CUDA);
  Tensor zero_state = Tensor::zeros({int64_t{LD} * c.B * c.H}, dt, Device::CUDA);
  Tensor hy = Tensor::empty({int64_t{LD} * c.B * c.H}, dt, Device::CUDA), cy = Tensor::empty({int64_t{LD} * c.B * c.H}, dt, Device::CUDA);
  Tensor dw = Tensor::empty({static_cast<int64_t>(wbytes) / esz}, dt, Device::CUDA);
  std::vector<Tensor> dwv;
  for (auto& t : wv) dwv.push_back(Tensor::zeros(t.shape(), dt, Device::CUDA));
  TensorDesc hd;
  const int dims[3] = {LD, c.B, c.H}, str[3] = {c.B * c.H, c.H, 1};
  LSTM_CUDA_CHECK(cudnnSetTensorNdDescriptor(hd.h, cdt, 3, dims, str));
  lstm::cuda::DeviceBuffer ws(ws_max);
  size_t rs_max = 1;
  for (auto& r : runs) rs_max = std::max(rs_max, r->rs);
  lstm::cuda::DeviceBuffer reserve(train ? rs_max : 1);
  lstm::cuda::DeviceBuffer dev_len(sizeof(int32_t) * len.size());
  LSTM_CUDA_CHECK(cudaMemcpy(dev_len.get(), len.data(), sizeof(int32_t) * len.size(), cudaMemcpyHostToDevice));
  const int32_t* dl = static_cast<const int32_t*>(dev_len.get());

  int64_t slot = 0;
  const lstm::Shape xshape{c.T, c.B, c.I};
  const lstm::ExecContext ctx = lstm::ExecContext::current(Device::CUDA);
  auto call = [&](Run& r, int64_t sl) {
    const void* xp = static_cast<const char*>(xs.raw()) + sl * xn * esz;
    if (r.be) {
      lstm::LstmInput in;
      in.x = xs.reshape({nslots * c.T, c.B, c.I}).slice0(sl * c.T, (sl + 1) * c.T);
      if (!train) {
        r.last = r.be->forward(wv, in, false, nullptr, nullptr, ctx).output;
        return;
      }
      lstm::Rng drng(1);
      std::unique_ptr<lstm::LstmSaved> saved;
      lstm::LstmOutput out = r.be->forward(wv, in, true, &drng, &saved, ctx);
      lstm::LstmGradOutput g;
      g.d_output = dy.reshape({c.T, c.B, c.H});
      r.be->backward(wv, *saved, g, dwv, ctx);
      r.last = out.output;
      return;
    }
    cudnnHandle_t h = r.v.null_stream ? h0 : lstm::cuda::cudnn_handle();
    const void* h0p = r.v.zero_state ? zero_state.raw() : nullptr;
    LSTM_CUDA_CHECK(cudnnRNNForward(h, r.rnn.h, train ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, dl, r.x.h,
                                    xp, r.y.h, y.raw(), hd.h, h0p, hy.raw(), hd.h, h0p, cy.raw(), wbytes,
                                    wraw, r.ws, ws.get(), train ? r.rs : 0, train ? reserve.get() : nullptr));
    if (!train) return;
    LSTM_CUDA_CHECK(cudnnRNNBackwardData_v8(h, r.rnn.h, dl, r.y.h, y.raw(), dy.raw(), r.x.h, dx.raw(), hd.h, h0p,
                                            nullptr, nullptr, hd.h, h0p, nullptr, nullptr, wbytes, wraw, r.ws,
                                            ws.get(), r.rs, reserve.get()));
    LSTM_CUDA_CHECK(cudnnRNNBackwardWeights_v8(h, r.rnn.h, CUDNN_WGRAD_MODE_ADD, dl, r.x.h, xp, hd.h, h0p, r.y.h,
                                               y.raw(), wbytes, dw.raw(), r.ws, ws.get(), r.rs, reserve.get()));
  };

  // Warm-up, and each variant's output on slot 0 for the comparison.
  for (auto& r : runs) {
    if (!r->error.empty()) continue;
    try {
      LSTM_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0xff, y.nbytes(), s));  // NaN poison
      LSTM_CUDA_CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < 3; ++i) call(*r, 0);
      LSTM_CUDA_CHECK(cudaDeviceSynchronize());
      r->out = r->be ? r->last.cpu().reshape({yn}) : y.cpu();
    } catch (const std::exception& e) {
      r->error = e.what();
    }
  }
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(o.reps));
  for (auto& e : ev) LSTM_CUDA_CHECK(cudaEventCreate(&e));
  for (int round = 0; round < o.rounds; ++round) {
    for (auto& r : runs) {
      if (!r->error.empty()) continue;
      const cudaStream_t rs = r->v.null_stream ? cudaStreamLegacy : s;
      LSTM_CUDA_CHECK(cudaDeviceSynchronize());  // each variant starts on an idle GPU, whatever its stream
      for (int i = 0; i < o.reps; ++i) {
        LSTM_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(i)], rs));
        call(*r, slot);
        slot = (slot + 1) % nslots;
        LSTM_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(i) + 1], rs));
      }
      LSTM_CUDA_CHECK(cudaEventSynchronize(ev.back()));
      std::vector<double> ms;
      for (int i = 0; i < o.reps; ++i) {
        float t = 0;
        LSTM_CUDA_CHECK(cudaEventElapsedTime(&t, ev[2 * static_cast<size_t>(i)], ev[2 * static_cast<size_t>(i) + 1]));
        ms.push_back(t);
      }
      r->round_ms.push_back(median(ms));
    }
  }
  for (auto& e : ev) cudaEventDestroy(e);

  // Reference output: the first variant that ran (standard, unpacked, FMA for F32 data).
  const Run* ref = nullptr;
  for (auto& r : runs)
    if (!ref && r->error.empty()) ref = r.get();
  double ref_max = 0;
  if (ref)
    for (int64_t i = 0; i < yn; ++i) ref_max = std::max(ref_max, std::fabs(ref->out.get(i)));
  for (auto& r : runs) {
    json j;
    j["case"] = c.id();
    j["dtype"] = dts;
    j["mode"] = mode;
    j["variant"] = r->v.name();
    if (!r->error.empty()) {
      j["error"] = r->error;
    } else {
      double d = 0;
      bool finite = true;
      for (int64_t i = 0; i < yn; ++i) {
        const double a = r->out.get(i);
        finite = finite && std::isfinite(a);
        d = std::isfinite(a) ? std::max(d, std::fabs(a - ref->out.get(i))) : INFINITY;
      }
      j["ms"] = median(r->round_ms);
      j["round_ms"] = r->round_ms;
      j["finite"] = finite;
      j["rel_diff_vs_ref"] = ref_max > 0 ? d / ref_max : d;
      j["ref"] = ref->v.name();
    }
    std::cout << std::left << std::setw(26) << c.id() << std::setw(6) << dts << std::setw(6) << mode << std::setw(38)
              << r->v.name();
    if (r->error.empty())
      std::cout << std::fixed << std::setprecision(4) << j["ms"].get<double>() << " ms  diff "
                << std::scientific << std::setprecision(2) << j["rel_diff_vs_ref"].get<double>()
                << std::defaultfloat << '\n';
    else
      std::cout << "refused: " << r->error.substr(0, 120) << '\n';
    if (out) *out << j.dump() << '\n';
  }
}

#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
#if LSTM_HAVE_CUDA
  if (!lstm::cuda_available()) {
    std::cout << "probe_cudnn_settings: no GPU (" << lstm::cuda_unavailable_reason() << "); nothing to measure\n";
    return 0;
  }
  std::ofstream f;
  if (!o.out.empty()) {
    f.open(o.out);
    if (!f) {
      std::cerr << "probe_cudnn_settings: cannot write " << o.out << "\n";
      return 1;
    }
  }
  try {
    for (const Case& c : o.cases)
      for (const auto& d : o.dtypes)
        for (const auto& m : o.modes) probe(c, d, m, o, f.is_open() ? &f : nullptr);
  } catch (const std::exception& e) {
    std::cerr << "probe_cudnn_settings: " << e.what() << "\n";
    return 1;
  }
  return 0;
#else
  std::cout << "probe_cudnn_settings: built without CUDA; nothing to measure\n";
  return 0;
#endif
}
