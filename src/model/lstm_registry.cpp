// The backend registry: every implementation of the LSTM op, one row each, and the factory that
// picks a row. Nothing outside this file names a backend's factory.
#include <algorithm>

#include "cpu/lstm_onednn.hpp"
#include "cpu/lstm_reference.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "model/lstm_auto.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/lstm_naive.hpp"
#include "cuda/lstm_fused.hpp"
#include "cudnn/lstm_cudnn.hpp"
#endif

namespace lstm {
namespace {

std::vector<LstmBackendEntry> build_registry() {
  std::vector<LstmBackendEntry> rows;
  rows.push_back({"reference", Algo::Reference,
                  "CPU, F64/F32: the float64-capable function every other backend is tested against "
                  "(OpenBLAS GEMMs, OpenMP)",
                  false, true, true,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions&) {
                    return cpu::reference_lstm_unsupported(s, dt, dev);
                  },
                  [](const LstmSpec& s, DType dt, Device, const LstmOptions&) {
                    return cpu::make_reference_lstm_backend(s, dt);
                  }});
  // Listed in every build; without oneDNN its why_not says so (and lstm info shows it).
  rows.push_back({"onednn", Algo::Onednn,
                  cpu::onednn_built()
                      ? "CPU, F32: oneDNN " + cpu::onednn_version() +
                            "'s fused LSTM primitives (PyTorch's CPU nn.LSTM's library): one primitive per layer, "
                            "both directions in it; variable lengths as time segments of a shrinking batch"
                      : std::string("CPU, F32: oneDNN's fused LSTM primitives; not in this binary: built without "
                                    "oneDNN (install libdnnl-dev and reconfigure)"),
                  false, true, true,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions&) {
                    return cpu::onednn_lstm_unsupported(s, dt, dev);
                  },
                  [](const LstmSpec& s, DType dt, Device, const LstmOptions&) {
                    return cpu::make_onednn_lstm_backend(s, dt);
                  }});
#if LSTM_HAVE_CUDA
  rows.push_back({"naive", Algo::Naive,
                  "GPU, F32/TF32/BF16/F16: the per-gate baseline of Appleyard et al. (8 GEMMs and 11 unfused "
                  "kernels per layer and step); unidirectional, with bias, no projection, sequence-major, no "
                  "dropout; every sequence T steps, h0 = c0 = 0",
                  true, false, false,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions&) {
                    return cuda::naive_lstm_unsupported(s, dt, dev);
                  },
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                    return cuda::make_naive_lstm_backend(s, dt, dev, o);
                  }});
  // "cudnn" runs options.cudnn_algo; the rows after it pin one cuDNN algorithm each, so that
  // Auto and the benchmark see every algorithm as a backend of its own.
  rows.push_back({"cudnn", Algo::Cudnn,
                  "GPU, F64/F32/TF32/BF16/F16: cuDNN's RNN API with the algorithm LstmOptions::cudnn_algo "
                  "names (default: PyTorch's rule), CUDA graphs",
                  false, true, true,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                    return cudnn_lstm_unsupported(s, dt, dev, o);
                  },
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                    return make_cudnn_lstm_backend(s, dt, dev, o);
                  }});
  for (CudnnAlgo a : {CudnnAlgo::Standard, CudnnAlgo::PersistStatic, CudnnAlgo::PersistDynamic,
                      CudnnAlgo::PersistStaticSmallH}) {
    auto pinned = [a](LstmOptions o) {
      o.cudnn_algo = a;
      return o;
    };
    rows.push_back({std::string("cudnn:") + cudnn_algo_name(a), Algo::Cudnn, cudnn_algo_summary(a), false,
                    cudnn_algo_varlen(a), true,
                    [pinned](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                      return cudnn_lstm_unsupported(s, dt, dev, pinned(o));
                    },
                    [pinned](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                      return make_cudnn_lstm_backend(s, dt, dev, pinned(o));
                    }});
  }
  rows.push_back({"fused", Algo::Fused,
                  "GPU, F32/TF32/BF16/F16: our kernels: one recurrent GEMM and one fused pointwise kernel per "
                  "step, one input GEMM per layer, directions on two streams, a wavefront across layers",
                  false, true, true,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions&) {
                    return cuda::fused_lstm_unsupported(s, dt, dev);
                  },
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                    return cuda::make_fused_lstm_backend(s, dt, dev, o);
                  }});
  rows.push_back({"persistent", Algo::Persistent,
                  "GPU, F32/TF32/BF16/F16: our persistent kernels, one launch for all steps, tensor-core "
                  "products: bf16/fp16 layers up to hidden 512 in thread-block clusters, one per 8 batch rows "
                  "(W_hh in registers, h through distributed shared memory; stacks of up to 4 at batch <= 8 as "
                  "a wavefront of clusters, each layer's input projection in a cluster beside it; the backward "
                  "of a direction swept whole in cluster launches), others over the whole GPU (slices of W_hh "
                  "in registers or shared memory, h through L2; unidirectional stacks as a wavefront; batch <= "
                  "32); no projection, hidden size up to what the SMs hold; otherwise the fused backward",
                  false, true, true,
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions&) {
                    return cuda::persistent_lstm_unsupported(s, dt, dev);
                  },
                  [](const LstmSpec& s, DType dt, Device dev, const LstmOptions& o) {
                    return cuda::make_persistent_lstm_backend(s, dt, dev, o);
                  }});
#endif
  return rows;
}

std::string row_names() {
  std::string s;
  for (const auto& r : lstm_backends()) s += (s.empty() ? "" : ", ") + r.name;
  return s;
}

std::unique_ptr<LstmBackend> make_from(const LstmBackendEntry& row, const LstmOptions& options, const LstmSpec& spec,
                                       DType dtype, Device device) {
  spec.validate();
  const std::string why = row.why_not(spec, dtype, device, options);
  LSTM_REQUIRE(why.empty(), "LSTM backend '" << row.name << "' cannot run this case: " << why);
  return row.make(spec, dtype, device, options);
}

}  // namespace

const std::vector<LstmBackendEntry>& lstm_backends() {
  static const std::vector<LstmBackendEntry> rows = build_registry();
  return rows;
}

const LstmBackendEntry& lstm_backend_entry(const std::string& name) {
  for (const auto& r : lstm_backends())
    if (r.name == name) return r;
  LSTM_THROW("unknown LSTM backend '" << name << "': this binary has " << row_names());
}

std::vector<Algo> available_algos() {
  std::vector<Algo> algos;
  for (const auto& r : lstm_backends())
    if (std::find(algos.begin(), algos.end(), r.algo) == algos.end()) algos.push_back(r.algo);
  return algos;
}

std::unique_ptr<LstmBackend> make_lstm_backend(const std::string& name, const LstmOptions& options,
                                               const LstmSpec& spec, DType dtype, Device device) {
  return make_from(lstm_backend_entry(name), options, spec, dtype, device);
}

std::unique_ptr<LstmBackend> make_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                               Device device) {
  spec.validate();
  if (options.algo == Algo::Auto) {
    return make_auto_lstm_backend(options, spec, dtype, device);
  }
  // The algorithm's own row: the one named after it ("cudnn" runs options.cudnn_algo).
  for (const auto& r : lstm_backends())
    if (r.name == algo_name(options.algo)) {
      if (device == Device::CUDA) require_cuda(std::string("LSTM algo '") + r.name + "'");
      return make_from(r, options, spec, dtype, device);
    }
  LSTM_THROW("LSTM algo '" << algo_name(options.algo) << "' is not built into this binary (backends: " << row_names()
                           << ")");
}

}  // namespace lstm
