// lstm-engine's C API (include/lstm/c_api.h): a thin layer over the public C++ API. Every entry
// point catches what the engine throws and turns it into LSTM_ERROR and lstm_last_error().
#include "lstm/c_api.h"

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/model.hpp"
#include "lstm/predict.hpp"
#include "lstm/train.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cuda/exec.hpp"
#endif

#ifndef LSTM_VERSION_STRING
#define LSTM_VERSION_STRING "unknown"
#endif

using namespace lstm;

struct lstm_backend {
  std::unique_ptr<LstmBackend> be;
  std::string requested;  // the algo name asked for
  int device_index = 0;   // the CUDA ordinal it was made on
  std::string info;       // lstm_backend_info's answer
};
struct lstm_saved {
  std::unique_ptr<LstmSaved> saved;
  Shape x_shape;
  int64_t B = 0;
  bool had_h0 = false, had_c0 = false;
};
struct lstm_model {
  Model model;
  std::map<std::string, std::string> meta;
  std::string path, task, info;
  Placement placement;
};
struct lstm_tensor {
  Tensor t;
};

namespace {

thread_local std::string t_error;
thread_local std::string t_string[8];  // one per string-returning function (see c_api.h)

template <class F>
int guarded(F&& f) {
  try {
    f();
    return LSTM_OK;
  } catch (const std::exception& e) {
    t_error = e.what();
  } catch (...) {
    t_error = "an unknown C++ exception";
  }
  return LSTM_ERROR;
}

const char* keep(int slot, std::string s) {
  t_string[slot] = std::move(s);
  return t_string[slot].c_str();
}

DType to_dtype(int d) {
  LSTM_REQUIRE(d >= LSTM_F64 && d <= LSTM_U8, "dtype: expected an lstm_dtype value (0..6), got " << d);
  return static_cast<DType>(d);
}
Device to_device(int d) {
  LSTM_REQUIRE(d == LSTM_DEVICE_CPU || d == LSTM_DEVICE_CUDA, "device: expected 0 (cpu) or 1 (cuda), got " << d);
  return static_cast<Device>(d);
}

LstmSpec to_spec(const lstm_spec* s) {
  LSTM_REQUIRE(s, "spec: NULL");
  LstmSpec spec;
  spec.input_size = s->input_size;
  spec.hidden_size = s->hidden_size;
  spec.num_layers = s->num_layers;
  spec.proj_size = s->proj_size;
  spec.bidirectional = s->bidirectional != 0;
  spec.bias = s->bias != 0;
  spec.batch_first = s->batch_first != 0;
  spec.dropout = s->dropout;
  spec.validate();
  return spec;
}

Placement to_placement(int device, const char* precision, const char* algo) {
  Placement p;
  p.device = to_device(device);
  p.precision = precision_from_name(precision && *precision ? precision : "f32");
  const std::string a = algo && *algo ? algo : "auto";
  p.lstm.algo = algo_from_name(a);
  return p;
}

// Where a call runs, made current for the call (device, the caller's stream, its allocator).
struct CallScope {
#if LSTM_HAVE_CUDA
  std::unique_ptr<cuda::ExecScope> exec;
  cuda::ExternalAllocator ext;
  std::unique_ptr<cuda::ExternalAllocScope> alloc;
#endif
  ExecContext ctx;
  CallScope(const LstmBackend& be, int device_index, void* stream, const lstm_allocator* a) {
    ctx.device = be.device();
    ctx.device_index = device_index;
    ctx.stream = stream;
    if (ctx.device != Device::CUDA) return;
#if LSTM_HAVE_CUDA
    exec = std::make_unique<cuda::ExecScope>(ctx);
    if (a && a->alloc && a->free) {
      ext.alloc = reinterpret_cast<void* (*)(void*, size_t, cudaStream_t)>(a->alloc);
      ext.free = a->free;
      ext.ctx = a->ctx;
      alloc = std::make_unique<cuda::ExternalAllocScope>(&ext);
    }
#else
    (void)a;
    require_cuda("a CUDA call");
#endif
  }
};

// The caller's tensors, wrapped in place.
std::vector<Tensor> wrap_weights(const LstmBackend& be, const void* const* ptrs, int64_t n) {
  const LstmSpec& spec = be.spec();
  const auto names = spec.param_names();
  LSTM_REQUIRE(n == static_cast<int64_t>(names.size()),
               "weights: expected " << names.size() << " tensors (" << names.front() << ", ...), got " << n);
  LSTM_REQUIRE(ptrs, "weights: NULL");
  // Weights laid out at the backend's flat layout in one buffer are handed over as views of one
  // storage, so that a backend with a weight space (cuDNN) uses them in place.
  const LstmBackend::FlatLayout layout = be.flat_layout(be.dtype());
  if (!layout.offsets.empty() && layout.offsets.size() == names.size() && ptrs[0]) {
    const char* base = static_cast<const char*>(ptrs[0]) - layout.offsets[0];
    bool flat = true;
    for (size_t i = 0; i < names.size() && flat; ++i) flat = static_cast<const char*>(ptrs[i]) == base + layout.offsets[i];
    if (flat) {
      const size_t es = dtype_size(be.dtype());
      Tensor all = Tensor::wrap(const_cast<char*>(base), {static_cast<int64_t>(layout.bytes / es)}, be.dtype(),
                                be.device());
      std::vector<Tensor> w;
      for (size_t i = 0; i < names.size(); ++i) {
        const Shape shape = spec.param_shape(names[i]);
        const int64_t begin = static_cast<int64_t>(layout.offsets[i] / es);
        w.push_back(all.slice0(begin, begin + shape_numel(shape)).reshape(shape));
      }
      return w;
    }
  }
  std::vector<Tensor> w;
  for (size_t i = 0; i < names.size(); ++i) {
    LSTM_REQUIRE(ptrs[i], "weights: " << names[i] << " is NULL");
    w.push_back(Tensor::wrap(const_cast<void*>(ptrs[i]), spec.param_shape(names[i]), be.dtype(), be.device()));
  }
  return w;
}

Shape x_shape(const LstmSpec& s, int64_t T, int64_t B, int64_t F) {
  return s.batch_first ? Shape{B, T, F} : Shape{T, B, F};
}

// Copies src into the caller's buffer dst (same shape, dtype and device), on the engine stream.
void copy_out(const Tensor& src, void* dst, const char* what) {
  if (!dst) return;
  LSTM_REQUIRE(src.defined(), what << ": the backend returned no tensor");
  Tensor::wrap(dst, src.shape(), src.dtype(), src.device()).copy_(src);
}

}  // namespace

extern "C" {

int lstm_c_api_version(void) { return LSTM_C_API_VERSION; }
const char* lstm_version(void) { return LSTM_VERSION_STRING; }
const char* lstm_last_error(void) { return t_error.c_str(); }
int lstm_cuda_available(void) { return cuda_available() ? 1 : 0; }
const char* lstm_cuda_unavailable_reason(void) { return keep(0, cuda_unavailable_reason()); }

const char* lstm_backends_json(void) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : lstm_backends())
    rows.push_back({{"name", r.name},
                    {"algo", algo_name(r.algo)},
                    {"summary", r.summary},
                    {"baseline", r.baseline},
                    {"variable_lengths", r.variable_lengths},
                    {"initial_state", r.initial_state}});
  return keep(1, rows.dump());
}

int lstm_spec_param_names(const lstm_spec* spec, const char** names, int64_t* count) {
  return guarded([&] {
    const auto n = to_spec(spec).param_names();
    std::string s;
    for (const auto& x : n) s += (s.empty() ? "" : "\n") + x;
    if (count) *count = static_cast<int64_t>(n.size());
    if (names) *names = keep(2, s);
  });
}

int lstm_backend_create(const lstm_spec* spec, int dtype, int device, int device_index,
                        const lstm_backend_options* options, lstm_backend** out) {
  return guarded([&] {
    LSTM_REQUIRE(out, "lstm_backend_create: out is NULL");
    *out = nullptr;
    const LstmSpec s = to_spec(spec);
    const DType dt = to_dtype(dtype);
    const Device dev = to_device(device);
    LstmOptions o;
    std::string algo = "auto";
    if (options) {
      if (options->algo && *options->algo) algo = options->algo;
      if (options->cudnn_algo && *options->cudnn_algo) o.cudnn_algo = cudnn_algo_from_name(options->cudnn_algo);
      if (options->cuda_graphs && *options->cuda_graphs)
        o.cuda_graphs = graph_mode_from_name(options->cuda_graphs);
      if (options->auto_cache) o.auto_cache = options->auto_cache;
      o.allow_tf32 = options->allow_tf32 != 0;
    }
    auto h = std::make_unique<lstm_backend>();
    h->requested = algo;
    h->device_index = device_index;
    if (dev == Device::CUDA) require_cuda("LSTM algo '" + algo + "'");
#if LSTM_HAVE_CUDA
    // A backend makes its descriptors and handles on the current device.
    std::unique_ptr<cuda::ExecScope> scope;
    if (dev == Device::CUDA) {
      ExecContext ctx;
      ctx.device = Device::CUDA;
      ctx.device_index = device_index;
      scope = std::make_unique<cuda::ExecScope>(ctx);
    }
#else
    (void)device_index;
#endif
    if (algo == "auto") {
      o.algo = Algo::Auto;
      h->be = make_lstm_backend(o, s, dt, dev);
    } else {
      h->be = make_lstm_backend(algo, o, s, dt, dev);
    }
    *out = h.release();
  });
}

void lstm_backend_destroy(lstm_backend* b) {
  try {
    delete b;
  } catch (...) {
  }
}

const char* lstm_backend_info(lstm_backend* b, const char* key) {
  if (!b || !key) return nullptr;
  const std::string k = key;
  if (k == "name") return keep(3, b->be->name());
  if (k == "last_run") return keep(3, b->be->last_run());
  if (k == "log") return keep(3, b->be->log());
  if (k == "settled") return keep(3, b->be->settled() ? "1" : "0");
  return nullptr;
}

int lstm_backend_flat_layout(lstm_backend* b, size_t* bytes, size_t* offsets, int64_t count) {
  return guarded([&] {
    LSTM_REQUIRE(b && bytes, "lstm_backend_flat_layout: NULL argument");
    const auto l = b->be->flat_layout(b->be->dtype());
    *bytes = l.offsets.empty() ? 0 : l.bytes;
    if (offsets && !l.offsets.empty()) {
      LSTM_REQUIRE(count == static_cast<int64_t>(l.offsets.size()),
                   "lstm_backend_flat_layout: " << l.offsets.size() << " offsets, room for " << count);
      for (size_t i = 0; i < l.offsets.size(); ++i) offsets[i] = l.offsets[i];
    }
  });
}

int lstm_backend_forward(lstm_backend* b, const lstm_forward_args* a, lstm_saved** saved) {
  return guarded([&] {
    LSTM_REQUIRE(b && a, "lstm_backend_forward: NULL argument");
    LstmBackend& be = *b->be;
    const LstmSpec& s = be.spec();
    const int64_t T = a->steps, B = a->batch;
    LSTM_REQUIRE(T >= 1 && B >= 1, "forward: expected steps >= 1 and batch >= 1, got " << T << " and " << B);
    LSTM_REQUIRE(a->x && a->output, "forward: x and output must not be NULL");
    CallScope scope(be, b->device_index, a->stream, a->allocator);
    const int64_t LD = s.num_layers * s.directions();
    LstmInput in;
    in.x = Tensor::wrap(const_cast<void*>(a->x), x_shape(s, T, B, s.input_size), be.dtype(), be.device());
    if (a->lengths) in.lengths.assign(a->lengths, a->lengths + B);
    if (a->h0) in.h0 = Tensor::wrap(const_cast<void*>(a->h0), {LD, B, s.out_size()}, be.dtype(), be.device());
    if (a->c0) in.c0 = Tensor::wrap(const_cast<void*>(a->c0), {LD, B, s.hidden_size}, be.dtype(), be.device());
    const std::vector<Tensor> w = wrap_weights(be, a->weights, a->num_weights);
    Rng rng(a->seed);
    std::unique_ptr<LstmSaved> sv;
    LstmOutput out = be.forward(w, in, a->training != 0, &rng, saved ? &sv : nullptr, scope.ctx);
    copy_out(out.output, a->output, "output");
    copy_out(out.h_n, a->h_n, "h_n");
    copy_out(out.c_n, a->c_n, "c_n");
    if (saved) {
      auto h = std::make_unique<lstm_saved>();
      h->saved = std::move(sv);
      h->x_shape = in.x.shape();
      h->B = B;
      h->had_h0 = a->h0 != nullptr;
      h->had_c0 = a->c0 != nullptr;
      *saved = h.release();
    }
  });
}

int lstm_backend_backward(lstm_backend* b, lstm_saved* saved, const lstm_backward_args* a) {
  return guarded([&] {
    LSTM_REQUIRE(b && saved && a, "lstm_backend_backward: NULL argument");
    LSTM_REQUIRE(saved->saved, "backward: this saved state was used by a backward already");
    LstmBackend& be = *b->be;
    const LstmSpec& s = be.spec();
    CallScope scope(be, b->device_index, a->stream, a->allocator);
    const int64_t LD = s.num_layers * s.directions(), B = saved->B;
    Shape out_shape = saved->x_shape;
    out_shape.back() = s.directions() * s.out_size();
    LstmGradOutput g;
    if (a->d_output) g.d_output = Tensor::wrap(const_cast<void*>(a->d_output), out_shape, be.dtype(), be.device());
    if (a->d_h_n) g.d_h_n = Tensor::wrap(const_cast<void*>(a->d_h_n), {LD, B, s.out_size()}, be.dtype(), be.device());
    if (a->d_c_n) g.d_c_n = Tensor::wrap(const_cast<void*>(a->d_c_n), {LD, B, s.hidden_size}, be.dtype(), be.device());
    const std::vector<Tensor> w = wrap_weights(be, a->weights, a->num_weights);
    std::vector<Tensor> dw = wrap_weights(be, reinterpret_cast<const void* const*>(a->d_weights), a->num_weights);
    LstmGrads r = be.backward(w, *saved->saved, g, dw, scope.ctx);
    saved->saved.reset();  // what it held (reserve space, activations) goes back now
    copy_out(r.d_x, a->d_x, "d_x");
    if (a->d_h0) {
      LSTM_REQUIRE(saved->had_h0, "backward: d_h0 asked for, but the forward had no h0");
      copy_out(r.d_h0, a->d_h0, "d_h0");
    }
    if (a->d_c0) {
      LSTM_REQUIRE(saved->had_c0, "backward: d_c0 asked for, but the forward had no c0");
      copy_out(r.d_c0, a->d_c0, "d_c0");
    }
  });
}

void lstm_saved_destroy(lstm_saved* s) {
  try {
    delete s;
  } catch (...) {
  }
}

// ---- Models ----

int lstm_model_load(const char* path, int device, const char* precision, const char* algo, lstm_model** out) {
  return guarded([&] {
    LSTM_REQUIRE(path && out, "lstm_model_load: NULL argument");
    *out = nullptr;
    auto m = std::make_unique<lstm_model>();
    m->placement = to_placement(device, precision, algo);
    m->path = resolve_model_path(path);
    const DType dt = m->placement.precision == Precision::F64 ? DType::F64 : DType::F32;
    m->model = load_model(m->path, &m->meta, dt);
    m->model.place(m->placement);
    auto it = m->meta.find("lstm_engine.config");
    if (it != m->meta.end()) {
      const auto cfg = nlohmann::json::parse(it->second, nullptr, false);
      if (cfg.is_object() && cfg.contains("task") && cfg["task"].is_string()) m->task = cfg["task"].get<std::string>();
    }
    *out = m.release();
  });
}

void lstm_model_destroy(lstm_model* m) {
  try {
    delete m;
  } catch (...) {
  }
}

const char* lstm_model_info(lstm_model* m) {
  if (!m) return nullptr;
  try {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [k, v] : m->meta) meta[k] = v;
    const Signal& in = m->model.input_signal();
    const Signal& o = m->model.output_signal();
    nlohmann::json j = {{"path", m->path},
                        {"task", m->task},
                        {"model", m->model.to_json()},
                        {"metadata", meta},
                        {"input", {{"kind", signal_kind_name(in.kind)}, {"features", in.features}}},
                        {"output", {{"kind", signal_kind_name(o.kind)}, {"features", o.features}}},
                        {"num_parameters", m->model.num_parameters()},
                        {"device", device_name(m->placement.device)},
                        {"precision", precision_name(m->placement.precision)}};
    return keep(4, j.dump());
  } catch (const std::exception& e) {
    t_error = e.what();
    return nullptr;
  }
}

int lstm_model_forward(lstm_model* m, const void* x, int dtype, const int64_t* shape, int64_t ndim,
                       const int64_t* lengths, lstm_tensor** out) {
  return guarded([&] {
    LSTM_REQUIRE(m && x && shape && out, "lstm_model_forward: NULL argument");
    *out = nullptr;
    const DType dt = to_dtype(dtype);
    LSTM_REQUIRE(ndim == 2 || ndim == 3, "model forward: expected tokens [T, B] or features [T, B, F], got "
                                             << ndim << " dimensions");
    Shape sh(shape, shape + ndim);
    Tensor in = Tensor::wrap(const_cast<void*>(x), sh, dt, Device::CPU);
    const Signal& sig = m->model.input_signal();
    if (sig.kind == SignalKind::Tokens) {
      LSTM_REQUIRE(ndim == 2 && dt == DType::I64,
                   "model forward: this model reads tokens: expected int64 ids [T, B], got " << dtype_name(dt) << " "
                                                                                               << shape_str(sh));
    } else {
      LSTM_REQUIRE(ndim == 3 && is_floating(dt), "model forward: this model reads "
                                                     << sig.str() << ": expected floats [T, B, " << sig.features
                                                     << "], got " << dtype_name(dt) << " " << shape_str(sh));
      in = in.to(m->model.dtype());  // a copy: the model never holds the caller's memory
      if (m->placement.device != Device::CPU) in = in.to_device(m->placement.device);
    }
    Act a{in, {}};
    if (lengths) a.lengths.assign(lengths, lengths + sh[1]);
    Rng rng(1);
    Act r = m->model.forward(a, false, rng);
    auto t = std::make_unique<lstm_tensor>();
    t->t = r.data.to_device(Device::CPU);
    if (t->t.dtype() != DType::F32) t->t = t->t.to(DType::F32);
    if (t->t.same_storage(in)) t->t = t->t.clone();
    *out = t.release();
  });
}

int64_t lstm_tensor_ndim(const lstm_tensor* t) { return t ? t->t.dim() : 0; }
int64_t lstm_tensor_dim(const lstm_tensor* t, int64_t i) {
  return t && i >= 0 && i < t->t.dim() ? t->t.shape()[static_cast<size_t>(i)] : 0;
}
int lstm_tensor_dtype(const lstm_tensor* t) { return t ? static_cast<int>(t->t.dtype()) : -1; }
const void* lstm_tensor_data(const lstm_tensor* t) { return t ? t->t.raw() : nullptr; }
void lstm_tensor_destroy(lstm_tensor* t) { delete t; }

int lstm_evaluate(const char* model_path, const char* data_path, int64_t batch_size, int64_t seq_len, int device,
                  const char* precision, const char* algo, const char** result_json) {
  return guarded([&] {
    LSTM_REQUIRE(model_path && result_json, "lstm_evaluate: NULL argument");
    const EvalResult r = evaluate_model(model_path, data_path ? data_path : "", batch_size, seq_len,
                                        to_placement(device, precision, algo));
    *result_json = keep(5, r.to_json().dump());
  });
}

int lstm_predict(const char* model_path, const char* data_path, const char* output_path, const char* format,
                 int64_t top_k, int64_t batch_size, int device, const char* precision, const char* algo,
                 const char** result_json, const char** text) {
  return guarded([&] {
    LSTM_REQUIRE(model_path && data_path && result_json, "lstm_predict: NULL argument");
    PredictOptions o;
    o.model_path = model_path;
    o.data_path = data_path;
    o.output_path = output_path ? output_path : "";
    o.format = format ? format : "";
    if (top_k > 0) o.top_k = top_k;
    if (batch_size > 0) o.batch_size = batch_size;
    o.placement = to_placement(device, precision, algo);
    std::ostringstream os;
    const PredictResult r = predict(o, os);
    nlohmann::json j = {{"task", r.task}, {"format", r.format}, {"rows", r.rows}, {"unknown", r.unknown}};
    *result_json = keep(6, j.dump());
    if (text) *text = keep(7, os.str());
  });
}

}  // extern "C"
