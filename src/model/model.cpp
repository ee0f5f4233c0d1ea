#include "lstm/model.hpp"

#include <algorithm>
#include <sstream>

#include "io/config_reader.hpp"
#include "lstm/checked.hpp"
#include "lstm/safetensors.hpp"

namespace lstm {
namespace {

const char* kModelKey = "lstm_engine.model";

std::string default_name(const std::string& kind) {
  if (kind == "dense") return "fc";
  return kind;
}

nlohmann::json signal_json(const Signal& s) { return {{"kind", signal_kind_name(s.kind)}, {"features", s.features}}; }

Signal signal_from_json(const nlohmann::json& j) {
  LSTM_REQUIRE(j.is_object() && j.contains("kind") && j.contains("features") && j["kind"].is_string(),
               "model input must be {\"kind\": \"tokens\"|\"sequence\"|\"vector\", \"features\": N}, got "
                   << json_excerpt(j));
  std::string k = j["kind"];
  Signal s;
  if (k == "tokens") s.kind = SignalKind::Tokens;
  else if (k == "sequence") s.kind = SignalKind::Sequence;
  else if (k == "vector") s.kind = SignalKind::Vector;
  else LSTM_THROW("model input kind must be tokens, sequence or vector, got \"" << k << "\"");
  s.features = read_int(j["features"], "model input \"features\"", 1, kMaxDim);
  return s;
}

}  // namespace

Model& Model::add(std::unique_ptr<Layer> layer, std::string name) {
  LSTM_REQUIRE(layer, "Model::add: null layer");
  LSTM_REQUIRE(!built_, "Model::add: the model is already built");
  if (name.empty()) {
    std::string base = default_name(layer->kind());
    int n = 0;
    for (auto& l : layers_)
      if (l->kind() == layer->kind()) ++n;
    name = n == 0 ? base : base + std::to_string(n);
    while (std::find(names_.begin(), names_.end(), name) != names_.end()) name += "_";
  }
  LSTM_REQUIRE(name.find('.') == std::string::npos, "layer name '" << name << "' must not contain '.'");
  LSTM_REQUIRE(std::find(names_.begin(), names_.end(), name) == names_.end(), "layer name '" << name << "' is taken");
  layers_.push_back(std::move(layer));
  names_.push_back(std::move(name));
  return *this;
}

void Model::build(const Signal& input, DType dtype) {
  LSTM_REQUIRE(!built_, "Model::build: already built");
  LSTM_REQUIRE(!layers_.empty(), "Model::build: the model has no layers");
  LSTM_REQUIRE(dtype == DType::F32 || dtype == DType::F64, "Model::build: dtype must be F32 or F64, got " << dtype_name(dtype));
  Signal s = input;
  outputs_.clear();
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      s = layers_[i]->build(s, dtype);
    } catch (const Error& e) {
      LSTM_THROW("layer " << i << " '" << names_[i] << "' (" << layers_[i]->kind() << "): " << e.what());
    }
    outputs_.push_back(s);
  }
  input_ = input;
  output_ = s;
  dtype_ = dtype;
  built_ = true;
}

void Model::init(Rng& rng) {
  LSTM_REQUIRE(built_, "Model::init: build the model first");
  for (auto& l : layers_) l->init(rng);
}

void Model::place(const Placement& p) {
  LSTM_REQUIRE(built_, "Model::place: build the model first");
  if (p.device == Device::CUDA) {
    require_cuda("placing the model on the GPU");
    LSTM_REQUIRE(dtype_ == DType::F32, "Model::place: on the GPU parameters are F32 (master weights), the model has "
                                           << dtype_name(dtype_) << "; build it with DType::F32");
    LSTM_REQUIRE(p.precision != Precision::F64, "Model::place: f64 runs on the CPU only; on the GPU use f32, tf32, "
                                                "bf16 or f16");
  } else {
    const Precision want = dtype_ == DType::F64 ? Precision::F64 : Precision::F32;
    LSTM_REQUIRE(p.precision == want, "Model::place: on the CPU the precision is the parameter dtype ("
                                          << precision_name(want) << "), got " << precision_name(p.precision));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      layers_[i]->place(p);
    } catch (const Error& e) {
      LSTM_THROW("layer " << i << " '" << names_[i] << "' (" << layers_[i]->kind() << "): " << e.what());
    }
  }
  placement_ = p;
}

Act Model::forward(const Act& in, bool training, Rng& rng) {
  LSTM_REQUIRE(built_, "Model::forward: build the model first");
  Act a = in;
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      a = layers_[i]->forward(a, training, rng);
    } catch (const Error& e) {
      LSTM_THROW("layer " << i << " '" << names_[i] << "' (" << layers_[i]->kind() << "): " << e.what());
    }
  }
  return a;
}

Act Model::backward(const Act& grad_out) {
  LSTM_REQUIRE(built_, "Model::backward: build the model first");
  Act g = grad_out;
  for (size_t i = layers_.size(); i-- > 0;) {
    g = layers_[i]->backward(g);
    if (!g.data.defined()) break;  // token input: nothing flows further back
  }
  return g;
}

double Model::memory_bytes(int64_t batch, int64_t steps, bool training, int64_t act_bytes) const {
  LSTM_REQUIRE(built_, "Model::memory_bytes: build the model first");
  const double B = static_cast<double>(batch), T = static_cast<double>(steps);
  auto elements = [&](const Signal& s) { return (s.kind == SignalKind::Vector ? B : B * T) * static_cast<double>(s.features); };
  const double params = static_cast<double>(num_parameters()) * static_cast<double>(dtype_size(dtype_));
  double acts = 0;
  if (training) {
    // Every layer's output lives until backward, and its gradient is made on the way back.
    for (size_t i = 0; i < layers_.size(); ++i)
      acts += 2 * elements(outputs_[i]) + layers_[i]->extra_elements(batch, steps, true);
  } else {
    // Inference keeps one layer's input and output at a time.
    Signal in = input_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      acts = std::max(acts, elements(in) + elements(outputs_[i]) + layers_[i]->extra_elements(batch, steps, false));
      in = outputs_[i];
    }
  }
  return params * (training ? 4 : 1) + acts * static_cast<double>(act_bytes);
}

std::vector<Param> Model::parameters() {
  std::vector<Param> all;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (auto& p : layers_[i]->params()) all.push_back({names_[i] + "." + p.name, p.value, p.grad});
  return all;
}

void Model::zero_grad() {
  for (auto& p : parameters()) p.grad.zero_();
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (auto& p : const_cast<Model*>(this)->parameters()) n += p.value.numel();
  return n;
}

std::map<std::string, Tensor> Model::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (auto& p : const_cast<Model*>(this)->parameters()) sd[p.name] = p.value;
  return sd;
}

void Model::load_state_dict(const std::map<std::string, Tensor>& sd, bool strict) {
  LSTM_REQUIRE(built_, "load_state_dict: build the model first");
  auto params = parameters();
  for (auto& p : params) {
    auto it = sd.find(p.name);
    if (it == sd.end()) {
      LSTM_REQUIRE(!strict, "state_dict is missing '" << p.name << "' (shape " << p.value.shape_str() << ")");
      continue;
    }
    LSTM_REQUIRE(it->second.shape() == p.value.shape(), "state_dict tensor '" << p.name << "': the model expects shape "
                                                                              << p.value.shape_str() << ", the file has "
                                                                              << it->second.shape_str());
    LSTM_REQUIRE(is_floating(it->second.dtype()), "state_dict tensor '" << p.name << "' must be floating point, got "
                                                                        << dtype_name(it->second.dtype()));
  }
  if (strict) {
    for (auto& [name, t] : sd) {
      bool known = false;
      for (auto& p : params) known = known || p.name == name;
      LSTM_REQUIRE(known, "state_dict has tensor '" << name << "' " << t.shape_str()
                                                    << " that this model does not have (a different architecture?)");
    }
  }
  // Validate everything first so that a bad file changes nothing.
  for (auto& p : params) {
    auto it = sd.find(p.name);
    if (it != sd.end()) p.value.copy_(it->second);
  }
}

nlohmann::json Model::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < layers_.size(); ++i) {
    nlohmann::json j = layers_[i]->to_json();
    j["name"] = names_[i];
    layers.push_back(j);
  }
  return {{"input", signal_json(input_)}, {"dtype", dtype_name(dtype_)}, {"layers", layers}};
}

Model Model::from_json(const nlohmann::json& j) {
  LSTM_REQUIRE(j.is_object() && j.contains("layers") && j["layers"].is_array() && j.contains("input"),
               "model description must be an object with \"input\" and \"layers\", got " << json_excerpt(j, 200));
  Model m;
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    nlohmann::json copy = j["layers"][i];
    std::string name;
    try {
      if (copy.is_object() && copy.contains("name")) {
        name = read_string(copy["name"], "field \"name\"");
        copy.erase("name");
      }
      m.add(layer_from_json(copy), name);
    } catch (const Error& e) {
      LSTM_THROW("layers[" << i << "]: " << e.what());
    }
  }
  DType dt = DType::F32;
  if (j.contains("dtype")) dt = dtype_from_name(read_string(j["dtype"], "model \"dtype\""));
  m.build(signal_from_json(j["input"]), dt);
  return m;
}

std::string Model::summary() const {
  std::ostringstream os;
  os << "input: " << input_.str() << "\n";
  for (size_t i = 0; i < layers_.size(); ++i) {
    int64_t n = 0;
    for (auto& p : layers_[i]->params()) n += p.value.numel();
    os << "  " << i << " " << names_[i] << ": " << layers_[i]->describe() << "  (" << n << " parameters)\n";
  }
  os << "output: " << output_.str() << "\n";
  os << "parameters: " << num_parameters() << " (" << dtype_name(dtype_) << ")";
  return os.str();
}

void save_model(const std::string& path, const Model& model, const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> meta = extra;
  meta[kModelKey] = model.to_json().dump();
  meta["format"] = "pt";
  write_safetensors(path, model.state_dict(), meta);
}

Model load_model(const std::string& path, std::map<std::string, std::string>* metadata, DType dtype,
                 bool allow_nonfinite) {
  SafetensorsFile f = read_safetensors(path);
  auto it = f.metadata.find(kModelKey);
  LSTM_REQUIRE(it != f.metadata.end(), path << ": not an lstm-engine model file (no \"" << kModelKey
                                            << "\" metadata); for a bare nn.LSTM state_dict use `lstm forward`");
  nlohmann::json j = parse_json(it->second, path + ": model description (metadata \"" + kModelKey + "\")");
  LSTM_REQUIRE(j.is_object(), path << ": model description must be a JSON object, got " << json_excerpt(j));
  j["dtype"] = dtype_name(dtype);
  Model m;
  try {
    m = Model::from_json(j);
    m.load_state_dict(f.tensors, true);
  } catch (const Error& e) {
    LSTM_THROW(path << ": " << e.what());
  }
  // A model with NaN/Inf parameters only produces garbage; refuse it unless asked to look at it.
  if (!allow_nonfinite) {
    try {
      for (const auto& [name, t] : f.tensors) require_finite(t, path + ": parameter '" + name + "'");
    } catch (const Error& e) {
      LSTM_THROW(e.what() << "; to load it anyway for inspection, pass --allow-nonfinite (allow_nonfinite)");
    }
  }
  if (metadata) *metadata = f.metadata;
  return m;
}

}  // namespace lstm
