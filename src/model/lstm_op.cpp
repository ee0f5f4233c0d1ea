// LstmSpec, input checking, initialisation, the names of the LSTM enums, ExecContext.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <regex>

#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/exec.hpp"
#endif

namespace lstm {

namespace {
constexpr Algo kAlgos[] = {Algo::Reference, Algo::Naive, Algo::Cudnn, Algo::Fused, Algo::Persistent, Algo::Onednn, Algo::Auto};
constexpr CudnnAlgo kCudnnAlgos[] = {CudnnAlgo::Heuristic,     CudnnAlgo::Standard,
                                     CudnnAlgo::PersistStatic, CudnnAlgo::PersistDynamic,
                                     CudnnAlgo::PersistStaticSmallH, CudnnAlgo::Auto};
constexpr GraphMode kGraphModes[] = {GraphMode::Auto, GraphMode::On, GraphMode::Off};

// The accepted names of an enum, "a, b or c", for errors.
template <class E, size_t N>
std::string accepted(const E (&all)[N], const char* (*name)(E)) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + name(all[i]);
  return s;
}
template <class E, size_t N>
E parse_enum(const E (&all)[N], const char* (*name)(E), const std::string& value, const std::string& what) {
  for (E e : all)
    if (value == name(e)) return e;
  LSTM_THROW(what << ": expected " << accepted(all, name) << ", got '" << value << "'");
}
}  // namespace

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::Reference: return "reference";
    case Algo::Naive: return "naive";
    case Algo::Cudnn: return "cudnn";
    case Algo::Fused: return "fused";
    case Algo::Persistent: return "persistent";
    case Algo::Onednn: return "onednn";
    case Algo::Auto: return "auto";
  }
  return "?";
}
Algo algo_from_name(const std::string& n) { return parse_enum(kAlgos, algo_name, n, "algo"); }

const char* cudnn_algo_name(CudnnAlgo a) {
  switch (a) {
    case CudnnAlgo::Heuristic: return "heuristic";
    case CudnnAlgo::Standard: return "standard";
    case CudnnAlgo::PersistStatic: return "persist_static";
    case CudnnAlgo::PersistDynamic: return "persist_dynamic";
    case CudnnAlgo::PersistStaticSmallH: return "persist_static_small_h";
    case CudnnAlgo::Auto: return "auto";
  }
  return "?";
}
CudnnAlgo cudnn_algo_from_name(const std::string& n, const std::string& what) {
  return parse_enum(kCudnnAlgos, cudnn_algo_name, n, what);
}

const char* graph_mode_name(GraphMode m) {
  switch (m) {
    case GraphMode::Auto: return "auto";
    case GraphMode::On: return "on";
    case GraphMode::Off: return "off";
  }
  return "?";
}
GraphMode graph_mode_from_name(const std::string& n, const std::string& what) {
  return parse_enum(kGraphModes, graph_mode_name, n, what);
}

ExecContext ExecContext::current(Device device) {
  if (device == Device::CPU) return cpu();
  require_cuda("a GPU execution context");
#if LSTM_HAVE_CUDA
  return cuda::current_context();
#else
  return cpu();  // unreachable: require_cuda threw
#endif
}

void LstmSpec::validate() const {
  LSTM_REQUIRE(input_size > 0, "LSTM: input_size must be positive, got " << input_size);
  LSTM_REQUIRE(hidden_size > 0, "LSTM: hidden_size must be positive, got " << hidden_size);
  LSTM_REQUIRE(num_layers > 0, "LSTM: num_layers must be positive, got " << num_layers);
  LSTM_REQUIRE(proj_size >= 0 && proj_size < hidden_size,
               "LSTM: proj_size must be in [0, hidden_size=" << hidden_size << "), got " << proj_size);
  LSTM_REQUIRE(dropout >= 0.0 && dropout < 1.0, "LSTM: dropout must be in [0, 1), got " << dropout);
}

std::vector<std::string> LstmSpec::param_names() const {
  std::vector<std::string> names;
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int64_t d = 0; d < directions(); ++d) {
      std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      names.push_back("weight_ih" + sfx);
      names.push_back("weight_hh" + sfx);
      if (bias) {
        names.push_back("bias_ih" + sfx);
        names.push_back("bias_hh" + sfx);
      }
      if (proj_size > 0) names.push_back("weight_hr" + sfx);
    }
  }
  return names;
}

LstmSpec::Slots LstmSpec::slots(int64_t layer, int64_t direction) const {
  int per = 2 + (bias ? 2 : 0) + (proj_size > 0 ? 1 : 0);
  int base = static_cast<int>((layer * directions() + direction) * per);
  Slots s{base, base + 1, -1, -1, -1};
  int next = base + 2;
  if (bias) {
    s.b_ih = next++;
    s.b_hh = next++;
  }
  if (proj_size > 0) s.w_hr = next;
  return s;
}

Shape LstmSpec::param_shape(const std::string& name) const {
  static const std::regex re("(weight_ih|weight_hh|bias_ih|bias_hh|weight_hr)_l([0-9]+)(_reverse)?");
  std::smatch m;
  LSTM_REQUIRE(std::regex_match(name, m, re), "not an nn.LSTM parameter name: '" << name << "'");
  int64_t layer = std::stoll(m[2].str());
  LSTM_REQUIRE(layer < num_layers && (!m[3].matched || bidirectional),
               "parameter '" << name << "' does not exist in an LSTM with " << num_layers << " layer(s)"
                             << (bidirectional ? ", bidirectional" : ", unidirectional"));
  const std::string kind = m[1].str();
  if (kind == "weight_ih") return {4 * hidden_size, layer_input_size(layer)};
  if (kind == "weight_hh") return {4 * hidden_size, out_size()};
  if (kind == "weight_hr") {
    LSTM_REQUIRE(proj_size > 0, "parameter '" << name << "' needs proj_size > 0");
    return {proj_size, hidden_size};
  }
  LSTM_REQUIRE(bias, "parameter '" << name << "' does not exist with bias=false");
  return {4 * hidden_size};
}

std::vector<std::string> LstmSpec::find_prefixes(const std::map<std::string, Shape>& shapes) {
  const std::string first = "weight_ih_l0";
  std::vector<std::string> prefixes;
  for (const auto& [name, shape] : shapes)
    if (name.size() >= first.size() && name.compare(name.size() - first.size(), first.size(), first) == 0)
      prefixes.push_back(name.substr(0, name.size() - first.size()));
  return prefixes;  // the map's order: sorted
}

LstmSpec LstmSpec::infer(const std::map<std::string, Shape>& shapes, const std::string& prefix) {
  auto find = [&](const std::string& n) -> const Shape* {
    auto it = shapes.find(prefix + n);
    return it == shapes.end() ? nullptr : &it->second;
  };
  const Shape* wih0 = find("weight_ih_l0");
  const Shape* whh0 = find("weight_hh_l0");
  LSTM_REQUIRE(wih0 && whh0, "no nn.LSTM weights found: expected tensors '" << prefix << "weight_ih_l0' and '"
                                                                            << prefix << "weight_hh_l0'");
  LSTM_REQUIRE(wih0->size() == 2 && whh0->size() == 2 && (*wih0)[0] % 4 == 0 && (*wih0)[0] > 0,
               "'" << prefix << "weight_ih_l0' must be [4*hidden, input], got " << shape_str(*wih0));
  LstmSpec s;
  s.hidden_size = (*wih0)[0] / 4;
  s.input_size = (*wih0)[1];
  s.bias = find("bias_ih_l0") != nullptr;
  s.bidirectional = find("weight_ih_l0_reverse") != nullptr;
  if (const Shape* whr = find("weight_hr_l0")) {
    LSTM_REQUIRE(whr->size() == 2, "'" << prefix << "weight_hr_l0' must be [proj, hidden], got " << shape_str(*whr));
    s.proj_size = (*whr)[0];
  }
  s.num_layers = 0;
  while (find("weight_ih_l" + std::to_string(s.num_layers))) ++s.num_layers;
  s.validate();
  // Every expected tensor must exist with the expected shape, and nothing else may look like one.
  std::map<std::string, bool> expected;
  for (const auto& n : s.param_names()) {
    const Shape* got = find(n);
    LSTM_REQUIRE(got, "missing nn.LSTM tensor '" << prefix << n << "' for an LSTM with " << s.num_layers
                                                << " layer(s), hidden " << s.hidden_size);
    Shape want = s.param_shape(n);
    LSTM_REQUIRE(*got == want, "tensor '" << prefix << n << "': expected shape " << shape_str(want) << ", got "
                                         << shape_str(*got));
    expected[prefix + n] = true;
  }
  static const std::regex re("(weight_ih|weight_hh|bias_ih|bias_hh|weight_hr)_l([0-9]+)(_reverse)?");
  for (const auto& [name, shape] : shapes) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string local = name.substr(prefix.size());
    if (std::regex_match(local, re))
      LSTM_REQUIRE(expected.count(name), "unexpected tensor '" << name << "' for an LSTM with " << s.num_layers
                                                               << " layer(s)" << (s.bidirectional ? ", bidirectional" : "")
                                                               << (s.proj_size ? ", with projection" : ""));
  }
  return s;
}

std::pair<int64_t, int64_t> check_lstm_input(const LstmSpec& spec, const LstmInput& in,
                                             const std::vector<Tensor>& weights) {
  spec.validate();
  LSTM_REQUIRE(in.x.defined(), "LSTM: input is undefined");
  LSTM_REQUIRE(in.x.dim() == 3, "LSTM: input must be " << (spec.batch_first ? "[B, T, I]" : "[T, B, I]")
                                                       << ", got " << in.x.shape_str());
  int64_t T = spec.batch_first ? in.x.size(1) : in.x.size(0);
  int64_t B = spec.batch_first ? in.x.size(0) : in.x.size(1);
  LSTM_REQUIRE(T > 0 && B > 0, "LSTM: input has no steps or no batch: " << in.x.shape_str());
  LSTM_REQUIRE(in.x.size(2) == spec.input_size,
               "LSTM: input feature size must be input_size=" << spec.input_size << ", got " << in.x.size(2));
  // Which float dtypes a backend computes in is its own unsupported_reason's business (BF16/F16
  // run on the GPU only).
  LSTM_REQUIRE(in.x.dtype() == DType::F32 || in.x.dtype() == DType::F64 || in.x.dtype() == DType::BF16 ||
                   in.x.dtype() == DType::F16,
               "LSTM: input dtype must be F32, F64, BF16 or F16, got " << dtype_name(in.x.dtype()));
  // Shapes from the slots, names only in a message: this runs on every call, where
  // param_names()/param_shape() would format and regex-match each name.
  const int64_t per_layer = 2 + (spec.bias ? 2 : 0) + (spec.proj_size > 0 ? 1 : 0);
  const size_t nparams = static_cast<size_t>(spec.num_layers * spec.directions() * per_layer);
  LSTM_REQUIRE(weights.size() == nparams, "LSTM: expected " << nparams << " weight tensors, got " << weights.size());
  auto check_weight = [&](int i, std::initializer_list<int64_t> want) {
    const Tensor& w = weights[static_cast<size_t>(i)];
    auto name = [&] { return spec.param_names()[static_cast<size_t>(i)]; };
    LSTM_REQUIRE(w.defined() && std::equal(w.shape().begin(), w.shape().end(), want.begin(), want.end()),
                 "LSTM: weight '" << name() << "' must be " << shape_str(Shape(want)) << ", got "
                                  << (w.defined() ? w.shape_str() : std::string("undefined")));
    LSTM_REQUIRE(w.dtype() == in.x.dtype(), "LSTM: weight '" << name() << "' has dtype " << dtype_name(w.dtype())
                                                             << ", input has " << dtype_name(in.x.dtype()));
    LSTM_REQUIRE(w.device() == in.x.device(), "LSTM: weight '" << name() << "' is on the " << device_name(w.device())
                                                               << ", the input on the " << device_name(in.x.device()));
  };
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    for (int64_t d = 0; d < spec.directions(); ++d) {
      const LstmSpec::Slots sl = spec.slots(l, d);
      const int64_t G = 4 * spec.hidden_size;
      check_weight(sl.w_ih, {G, spec.layer_input_size(l)});
      check_weight(sl.w_hh, {G, spec.out_size()});
      if (spec.bias) {
        check_weight(sl.b_ih, {G});
        check_weight(sl.b_hh, {G});
      }
      if (spec.proj_size > 0) check_weight(sl.w_hr, {spec.proj_size, spec.hidden_size});
    }
  }
  if (!in.lengths.empty()) {
    LSTM_REQUIRE(static_cast<int64_t>(in.lengths.size()) == B,
                 "LSTM: lengths must have one entry per sequence (" << B << "), got " << in.lengths.size());
    for (size_t b = 0; b < in.lengths.size(); ++b)
      LSTM_REQUIRE(in.lengths[b] >= 1 && in.lengths[b] <= T,
                   "LSTM: lengths[" << b << "] must be in [1, " << T << "], got " << in.lengths[b]);
  }
  int64_t LD = spec.num_layers * spec.directions();
  if (in.h0.defined()) {
    Shape want{LD, B, spec.out_size()};
    LSTM_REQUIRE(in.h0.shape() == want, "LSTM: h0 must be " << shape_str(want) << ", got " << in.h0.shape_str());
    LSTM_REQUIRE(in.h0.dtype() == in.x.dtype(), "LSTM: h0 dtype " << dtype_name(in.h0.dtype()) << " differs from input "
                                                                  << dtype_name(in.x.dtype()));
    LSTM_REQUIRE(in.h0.device() == in.x.device(), "LSTM: h0 is on the " << device_name(in.h0.device())
                                                                       << ", the input on the "
                                                                       << device_name(in.x.device()));
  }
  if (in.c0.defined()) {
    Shape want{LD, B, spec.hidden_size};
    LSTM_REQUIRE(in.c0.shape() == want, "LSTM: c0 must be " << shape_str(want) << ", got " << in.c0.shape_str());
    LSTM_REQUIRE(in.c0.dtype() == in.x.dtype(), "LSTM: c0 dtype " << dtype_name(in.c0.dtype()) << " differs from input "
                                                                  << dtype_name(in.x.dtype()));
    LSTM_REQUIRE(in.c0.device() == in.x.device(), "LSTM: c0 is on the " << device_name(in.c0.device())
                                                                       << ", the input on the "
                                                                       << device_name(in.x.device()));
  }
  return {T, B};
}

void lstm_init_weights(const LstmSpec& spec, std::vector<Tensor>& weights, Rng& rng) {
  double k = 1.0 / std::sqrt(static_cast<double>(spec.hidden_size));
  for (auto& w : weights) rng.fill_uniform(w, -k, k);
}

std::vector<Tensor> make_flat_weights(const LstmSpec& spec, const LstmBackend::FlatLayout& layout, DType dtype,
                                      Device device) {
  std::vector<Tensor> w;
  const auto names = spec.param_names();
  if (layout.offsets.empty()) {
    for (const auto& n : names) w.push_back(Tensor::empty(spec.param_shape(n), dtype, device));
    return w;
  }
  LSTM_CHECK(layout.offsets.size() == names.size(), "flat layout has " << layout.offsets.size() << " offsets for "
                                                                         << names.size() << " tensors");
  const size_t es = dtype_size(dtype);
  LSTM_CHECK(layout.bytes % es == 0, "flat layout size " << layout.bytes << " is not a multiple of " << es);
  Tensor flat = Tensor::empty({static_cast<int64_t>(layout.bytes / es)}, dtype, device);
  for (size_t i = 0; i < names.size(); ++i) {
    const Shape shape = spec.param_shape(names[i]);
    const int64_t n = shape_numel(shape), begin = static_cast<int64_t>(layout.offsets[i] / es);
    LSTM_CHECK(layout.offsets[i] % es == 0 && layout.offsets[i] + static_cast<size_t>(n) * es <= layout.bytes,
               "flat layout offset " << layout.offsets[i] << " of " << names[i] << " is out of range");
    w.push_back(flat.slice0(begin, begin + n).reshape(shape));
  }
  return w;
}

std::pair<int64_t, int64_t> LstmBackend::check_call(const LstmInput& in, const std::vector<Tensor>& weights,
                                                    const ExecContext& ctx) const {
  LSTM_REQUIRE(ctx.device == device_, "LSTM " << name() << ": the backend runs on the " << device_name(device_)
                                              << ", the call's execution context is on the "
                                              << device_name(ctx.device));
  LSTM_REQUIRE(in.x.defined(), "LSTM " << name() << ": input is undefined");
  LSTM_REQUIRE(in.x.dtype() == dtype_, "LSTM " << name() << ": the backend was made for " << dtype_name(dtype_)
                                               << " data, the input is " << dtype_name(in.x.dtype()));
  LSTM_REQUIRE(in.x.device() == device_, "LSTM " << name() << ": the input must be on the " << device_name(device_)
                                                 << ", got a " << device_name(in.x.device()) << " tensor");
  return check_lstm_input(spec_, in, weights);
}

}  // namespace lstm
