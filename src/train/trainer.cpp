// The training loop behind `lstm train`, plus evaluation and text generation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "lstm/loss.hpp"
#include "lstm/optim.hpp"
#include "lstm/parallel.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/train.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/misc.hpp"
#endif

namespace fs = std::filesystem;

namespace lstm {

nlohmann::json default_train_config() {
  return nlohmann::json::parse(R"({
    "task": "charlm",
    "data": {"path": "", "valid_fraction": 0.05, "max_bytes": -1,
             "label_column": "label", "sequence_column": "sequence"},
    "model": {"embedding_dim": 32,
              "layers": [{"type": "lstm", "hidden_size": 256}, {"type": "dense"}]},
    "train": {"steps": 1000, "batch_size": 32, "seq_len": 64, "seed": 1, "threads": 0,
              "optimizer": {"type": "adam"},
              "schedule": {"type": "cosine", "lr": 0.003, "warmup_steps": 50, "total_steps": 0, "min_lr": 0.0003},
              "clip_grad_norm": 1.0, "log_every": 10, "eval_every": 250, "eval_batches": 20,
              "checkpoint_every": 250, "keep_checkpoints": 3, "sample_length": 300,
              "sample_temperature": 0.8}
  })");
}

namespace {

void merge(nlohmann::json& base, const nlohmann::json& over, const std::string& path) {
  for (auto it = over.begin(); it != over.end(); ++it) {
    const std::string key = path.empty() ? it.key() : path + "." + it.key();
    if (!base.contains(it.key()))
      LSTM_THROW("config: unknown field '" << key << "'");
    // Layer lists, optimizer and schedule objects replace the default wholesale.
    bool replace = it.key() == "layers" || it.key() == "optimizer" || it.key() == "schedule";
    if (base[it.key()].is_object() && it.value().is_object() && !replace) {
      merge(base[it.key()], it.value(), key);
    } else {
      base[it.key()] = it.value();
    }
  }
}

template <class T>
T field(const nlohmann::json& j, const char* section, const char* name) {
  try {
    return j.at(section).at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    LSTM_THROW("config: '" << section << "." << name << "' has the wrong type: " << j.at(section).at(name).dump());
  }
}

// The data of either task, behind one face.
struct TaskData {
  std::string task;
  std::optional<CharCorpus> corpus;
  std::optional<CsvDataset> csv;
  std::vector<int64_t> train_idx, valid_idx;
  Signal input;
  int64_t outputs = 0;
  std::map<std::string, std::string> meta;

  Batch train_batch(int64_t B, int64_t T, Rng& rng) const {
    if (corpus) return corpus->train_batch(B, T, rng);
    std::vector<int64_t> idx(static_cast<size_t>(B));
    for (auto& i : idx) i = train_idx[rng.below(train_idx.size())];
    return csv->batch(idx);
  }
  int64_t valid_batches(int64_t B, int64_t T) const {
    if (corpus) return corpus->valid_batches(B, T);
    return (static_cast<int64_t>(valid_idx.size()) + B - 1) / B;
  }
  Batch valid_batch(int64_t B, int64_t T, int64_t i) const {
    if (corpus) return corpus->valid_batch(B, T, i);
    std::vector<int64_t> idx;
    for (int64_t k = i * B; k < std::min<int64_t>((i + 1) * B, valid_idx.size()); ++k) idx.push_back(valid_idx[k]);
    return csv->batch(idx);
  }
};

nlohmann::json string_list(const std::vector<std::string>& v) { return nlohmann::json(v); }

TaskData load_task_data(const nlohmann::json& cfg, const std::string& path_override = "") {
  TaskData d;
  d.task = cfg["task"].get<std::string>();
  std::string path = path_override.empty() ? cfg["data"]["path"].get<std::string>() : path_override;
  LSTM_REQUIRE(!path.empty(), "config: 'data.path' is empty: give a text file or folder (charlm) or a CSV file (classify)");
  double vf = field<double>(cfg, "data", "valid_fraction");
  if (d.task == "charlm") {
    d.corpus = CharCorpus::load({path}, vf, field<int64_t>(cfg, "data", "max_bytes"));
    d.input = {SignalKind::Tokens, d.corpus->vocab().size()};
    d.outputs = d.corpus->vocab().size();
    d.meta["lstm_engine.vocab"] = d.corpus->vocab().to_json().dump();
  } else if (d.task == "classify") {
    d.csv = CsvDataset::load(path, cfg["data"]["label_column"].get<std::string>(),
                             cfg["data"]["sequence_column"].get<std::string>());
    Rng split_rng(field<uint64_t>(cfg, "train", "seed") ^ 0x5151ull);
    std::tie(d.train_idx, d.valid_idx) = d.csv->split(vf, split_rng);
    LSTM_REQUIRE(!d.train_idx.empty(), path << ": no rows left for training after holding out " << vf << " for validation");
    d.input = {d.csv->is_tokens() ? SignalKind::Tokens : SignalKind::Sequence, d.csv->features()};
    d.outputs = d.csv->num_classes();
    d.meta["lstm_engine.classes"] = string_list(d.csv->class_names()).dump();
    if (d.csv->is_tokens()) d.meta["lstm_engine.tokens"] = string_list(d.csv->token_names()).dump();
  } else {
    LSTM_THROW("config: 'task' must be \"charlm\" or \"classify\", got \"" << d.task << "\"");
  }
  d.meta["lstm_engine.task"] = d.task;
  d.meta["lstm_engine.data"] = path;
  return d;
}

nlohmann::json model_json(const nlohmann::json& cfg, const TaskData& d) {
  nlohmann::json layers = nlohmann::json::array();
  if (d.input.kind == SignalKind::Tokens) {
    int64_t dim = cfg["model"].value("embedding_dim", int64_t{32});
    layers.push_back({{"type", "embedding"}, {"num_embeddings", d.input.features}, {"embedding_dim", dim}});
  }
  const auto& user = cfg["model"]["layers"];
  LSTM_REQUIRE(user.is_array() && !user.empty(), "config: 'model.layers' must be a non-empty list of layers");
  for (size_t i = 0; i < user.size(); ++i) {
    nlohmann::json l = user[i];
    if (i + 1 == user.size() && l.value("type", "") == "dense" && !l.contains("out_features"))
      l["out_features"] = d.outputs;
    layers.push_back(l);
  }
  nlohmann::json input = {{"kind", signal_kind_name(d.input.kind)}, {"features", d.input.features}};
  return {{"input", input}, {"layers", layers}, {"dtype", "F32"}};
}

// Feature inputs go to the model's device; token ids stay on the host (the embedding copies
// them after checking their range).
Act to_act(const Batch& b, Device device = Device::CPU) {
  if (device != Device::CPU && is_floating(b.inputs.dtype())) return {b.inputs.to_device(device), b.lengths};
  return {b.inputs, b.lengths};
}

// Loss of a batch from the model's output; the gradient comes back in the output's shape.
LossResult batch_loss(const Act& out, const Batch& b, int64_t classes) {
  if (out.data.dim() == 3) {
    const int64_t T = out.data.size(0), B = out.data.size(1), C = out.data.size(2);
    LSTM_REQUIRE(b.targets.shape() == (Shape{T, B}), "the model outputs a sequence " << out.data.shape_str()
                                                                                      << " but the targets are "
                                                                                      << b.targets.shape_str()
                                                                                      << " (a many-to-one task needs a head such as last_step)");
    LSTM_REQUIRE(C == classes, "the model outputs " << C << " classes, the data has " << classes);
    std::vector<uint8_t> mask(static_cast<size_t>(T * B), 1);
    if (!b.lengths.empty())
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < B; ++k) mask[t * B + k] = t < b.lengths[k];
    LossResult r = softmax_cross_entropy(out.data.reshape({T * B, C}), b.targets.reshape({T * B}), -100, mask);
    r.grad = r.grad.reshape({T, B, C});
    return r;
  }
  LSTM_REQUIRE(out.data.dim() == 2 && b.targets.dim() == 1 && out.data.size(0) == b.targets.size(0),
               "the model outputs " << out.data.shape_str() << " but the targets are " << b.targets.shape_str());
  LSTM_REQUIRE(out.data.size(1) == classes, "the model outputs " << out.data.size(1) << " classes, the data has " << classes);
  return softmax_cross_entropy(out.data, b.targets);
}

EvalResult run_eval(Model& model, const TaskData& d, int64_t B, int64_t T, int64_t max_batches) {
  EvalResult r;
  int64_t n = d.valid_batches(B, T);
  if (max_batches > 0) n = std::min(n, max_batches);
  double loss_sum = 0;
  int64_t correct = 0;
  Rng unused(0);
  for (int64_t i = 0; i < n; ++i) {
    Batch b = d.valid_batch(B, T, i);
    if (b.targets.numel() == 0) continue;
    LossResult lr = batch_loss(model.forward(to_act(b, model.placement().device), false, unused), b, d.outputs);
    lr.resolve();
    loss_sum += lr.loss * static_cast<double>(lr.count);
    r.count += lr.count;
    correct += lr.correct;
  }
  if (r.count) {
    r.loss = loss_sum / static_cast<double>(r.count);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(r.count);
  }
  return r;
}

std::string sample_text(Model& model, const Vocab& vocab, const std::string& prime, int64_t length, double temperature,
                        Rng& rng) {
  LSTM_REQUIRE(temperature > 0, "temperature must be positive, got " << temperature);
  std::vector<int64_t> ids = vocab.encode(prime.empty() ? vocab.decode_one(0) : prime);
  model.set_stateful(true);
  std::string out;
  Rng unused(0);
  Tensor x = Tensor::from_vector<int64_t>({static_cast<int64_t>(ids.size()), 1}, ids);
  Act y = model.forward({x, {}}, false, unused);
  for (int64_t i = 0; i < length; ++i) {
    const int64_t T = y.data.size(0), C = y.data.size(2);
    // Only the last step's logits come to the host.
    std::vector<double> p = softmax_row(y.data.reshape({T, C}).slice0(T - 1, T).cpu(), 0, temperature);
    double u = rng.uniform(), acc = 0;
    int64_t next = C - 1;
    for (int64_t c = 0; c < C; ++c) {
      acc += p[c];
      if (u < acc) {
        next = c;
        break;
      }
    }
    out += vocab.decode_one(next);
    y = model.forward({Tensor::from_vector<int64_t>({1, 1}, {next}), {}}, false, unused);
  }
  model.set_stateful(false);
  return out;
}

// ---- checkpoints ----

std::string step_dir_name(int64_t step) {
  std::ostringstream os;
  os << "step-" << std::setw(8) << std::setfill('0') << step;
  return os.str();
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

Tensor rng_tensor(const Rng& r) {
  auto s = r.state();
  Tensor t = Tensor::empty({4}, DType::I64);
  for (int i = 0; i < 4; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(s[i]);
  return t;
}

void restore_rng(Rng& r, const std::map<std::string, Tensor>& m, const std::string& name, const std::string& file) {
  auto it = m.find(name);
  LSTM_REQUIRE(it != m.end() && it->second.dtype() == DType::I64 && it->second.numel() == 4,
               file << ": missing or malformed RNG state '" << name << "'");
  std::array<uint64_t, 4> s;
  for (int i = 0; i < 4; ++i) s[i] = static_cast<uint64_t>(it->second.data<int64_t>()[i]);
  r.set_state(s);
}

// Writes checkpoints/step-N/ as a whole: both files go into a temporary folder that is renamed
// into place, then `latest` is replaced atomically. A crash at any point leaves the previous
// checkpoint and `latest` intact.
std::string save_checkpoint(const fs::path& out_dir, int64_t step, const Model& model,
                            const std::map<std::string, std::string>& model_meta, const Optimizer& opt,
                            const Rng& data_rng, const Rng& model_rng, const nlohmann::json& cfg, int64_t keep) {
  fs::path ck = out_dir / "checkpoints";
  fs::create_directories(ck);
  fs::path final_dir = ck / step_dir_name(step);
  fs::path tmp = ck / (".tmp-" + step_dir_name(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_model((tmp / "model.safetensors").string(), model, model_meta);
  std::map<std::string, Tensor> ts = opt.state();
  std::map<std::string, Tensor> prefixed;
  for (auto& [k, v] : ts) prefixed["optimizer." + k] = v;
  prefixed["rng.data"] = rng_tensor(data_rng);
  prefixed["rng.model"] = rng_tensor(model_rng);
  write_safetensors((tmp / "trainer.safetensors").string(), prefixed,
                    {{"step", std::to_string(step)}, {"config", cfg.dump()}, {"optimizer", opt.to_json().dump()}});
  fsync_dir(tmp);
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_dir(ck);
  write_file_atomic((ck / "latest").string(), step_dir_name(step) + "\n");
  // Keep the newest `keep` checkpoints; drop temporary folders a killed run left behind.
  std::vector<fs::path> dirs, stale;
  for (auto& e : fs::directory_iterator(ck)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) dirs.push_back(e.path());
    if (name.rfind(".tmp-", 0) == 0) stale.push_back(e.path());
  }
  for (auto& p : stale) fs::remove_all(p);
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < dirs.size(); ++i)
    if (dirs[i] != final_dir) fs::remove_all(dirs[i]);
  return final_dir.string();
}

fs::path latest_checkpoint(const fs::path& out_dir) {
  fs::path latest = out_dir / "checkpoints" / "latest";
  std::ifstream f(latest);
  LSTM_REQUIRE(f, "no checkpoint to resume from: " << latest << " does not exist");
  std::string name;
  std::getline(f, name);
  fs::path dir = out_dir / "checkpoints" / name;
  LSTM_REQUIRE(!name.empty() && fs::is_directory(dir), latest << " names '" << name << "', which is not a checkpoint folder");
  return dir;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h";
  if (t >= 60) os << (t / 60) % 60 << "m";
  os << t % 60 << "s";
  return os.str();
}

std::string fmt_rate(double r) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (r >= 1e6) os << r / 1e6 << "M";
  else if (r >= 1e3) os << r / 1e3 << "k";
  else os << r;
  return os.str();
}

}  // namespace

nlohmann::json resolve_train_config(const nlohmann::json& user) {
  LSTM_REQUIRE(user.is_object(), "config must be a JSON object, got " << user.dump().substr(0, 100));
  for (const char* section : {"data", "model", "train"})
    LSTM_REQUIRE(!user.contains(section) || user[section].is_object(),
                 "config: '" << section << "' must be an object, got " << user[section].dump().substr(0, 100));
  nlohmann::json cfg = default_train_config();
  merge(cfg, user, "");
  auto expect = [&](const nlohmann::json& v, bool ok, const char* name, const char* what) {
    LSTM_REQUIRE(ok, "config: '" << name << "' must be " << what << ", got " << v.dump().substr(0, 100));
  };
  expect(cfg["task"], cfg["task"].is_string(), "task", "\"charlm\" or \"classify\"");
  for (const char* k : {"path", "label_column", "sequence_column"}) {
    std::string name = std::string("data.") + k;
    expect(cfg["data"][k], cfg["data"][k].is_string(), name.c_str(), "a string");
  }
  expect(cfg["data"]["valid_fraction"], cfg["data"]["valid_fraction"].is_number(), "data.valid_fraction", "a number");
  expect(cfg["data"]["max_bytes"], cfg["data"]["max_bytes"].is_number_integer(), "data.max_bytes", "an integer");
  expect(cfg["model"]["embedding_dim"],
         cfg["model"]["embedding_dim"].is_number_integer() && cfg["model"]["embedding_dim"].get<int64_t>() > 0,
         "model.embedding_dim", "a positive integer");
  expect(cfg["model"]["layers"], cfg["model"]["layers"].is_array() && !cfg["model"]["layers"].empty(), "model.layers",
         "a non-empty list of layers");
  // JSON text gives unsigned numbers; a config built in C++ ({"seed", 3}) gives signed ones.
  {
    auto& seed = cfg["train"]["seed"];
    if (seed.is_number_integer() && !seed.is_number_unsigned() && seed.get<int64_t>() >= 0)
      seed = static_cast<uint64_t>(seed.get<int64_t>());
  }
  expect(cfg["train"]["seed"], cfg["train"]["seed"].is_number_unsigned(), "train.seed", "a non-negative integer");
  auto& t = cfg["train"];
  for (const char* k : {"steps", "batch_size", "seq_len", "log_every", "eval_every", "eval_batches", "checkpoint_every",
                        "keep_checkpoints", "sample_length", "threads"})
    LSTM_REQUIRE(t[k].is_number_integer() && t[k].get<int64_t>() >= 0,
                 "config: 'train." << k << "' must be a non-negative integer, got " << t[k].dump());
  LSTM_REQUIRE(t["batch_size"].get<int64_t>() > 0, "config: 'train.batch_size' must be positive");
  LSTM_REQUIRE(t["seq_len"].get<int64_t>() > 0, "config: 'train.seq_len' must be positive");
  LSTM_REQUIRE(t["clip_grad_norm"].is_number() && t["clip_grad_norm"].get<double>() >= 0,
               "config: 'train.clip_grad_norm' must be a number >= 0 (0 = off), got " << t["clip_grad_norm"].dump());
  LSTM_REQUIRE(t["sample_temperature"].is_number() && t["sample_temperature"].get<double>() > 0,
               "config: 'train.sample_temperature' must be positive");
  auto& sch = t["schedule"];
  const bool user_schedule = user.contains("train") && user["train"].is_object() && user["train"].contains("schedule");
  if (sch.is_object() && sch.value("type", "") == "cosine") {
    if (sch.value("total_steps", int64_t{0}) == 0) sch["total_steps"] = t["steps"];
    // The default warm-up must fit short runs.
    if (!user_schedule) sch["warmup_steps"] = std::min<int64_t>(50, t["steps"].get<int64_t>() / 10);
  }
  // Construct once to validate (errors name the field).
  (void)optimizer_from_json(t["optimizer"]);
  (void)schedule_from_json(t["schedule"]);
  return cfg;
}

TrainResult train(const TrainOptions& opts) {
  std::ostream& log = opts.log ? *opts.log : std::cerr;
  const fs::path out_dir = opts.out_dir;
  nlohmann::json cfg;
  fs::path resume_dir;
  SafetensorsFile trainer_file;
  if (opts.resume) {
    resume_dir = latest_checkpoint(out_dir);
    trainer_file = read_safetensors((resume_dir / "trainer.safetensors").string());
    try {
      cfg = nlohmann::json::parse(trainer_file.metadata.at("config"));
    } catch (const std::exception&) {
      LSTM_THROW(resume_dir / "trainer.safetensors" << ": no valid training configuration in its metadata");
    }
    if (opts.steps >= 0) cfg["train"]["steps"] = opts.steps;
  } else {
    nlohmann::json user = opts.config;
    if (opts.steps >= 0) user["train"]["steps"] = opts.steps;
    cfg = resolve_train_config(user);
  }
  if (opts.threads > 0) cfg["train"]["threads"] = opts.threads;
  const auto& tc = cfg["train"];
  if (tc["threads"].get<int>() > 0) set_num_threads(tc["threads"].get<int>());
  const int64_t steps = tc["steps"], B = tc["batch_size"], T = tc["seq_len"];
  const int64_t log_every = std::max<int64_t>(1, tc["log_every"].get<int64_t>());
  const int64_t eval_every = tc["eval_every"], ckpt_every = tc["checkpoint_every"];
  const double clip = tc["clip_grad_norm"];

  TaskData data = load_task_data(cfg);
  Model model = Model::from_json(model_json(cfg, data));
  auto opt = optimizer_from_json(tc["optimizer"]);
  auto sched = schedule_from_json(tc["schedule"]);
  const uint64_t seed = tc["seed"];
  Rng data_rng(seed), model_rng(seed ^ 0x9e3779b97f4a7c15ull);
  int64_t step = 0;
  std::map<std::string, std::string> meta = data.meta;
  meta["lstm_engine.config"] = cfg.dump();

  if (opts.resume) {
    std::map<std::string, std::string> mmeta;
    Model loaded = load_model((resume_dir / "model.safetensors").string(), &mmeta);
    model.load_state_dict(loaded.state_dict(), true);
    step = std::stoll(trainer_file.metadata.at("step"));
    std::map<std::string, Tensor> ostate;
    for (auto& [k, v] : trainer_file.tensors)
      if (k.rfind("optimizer.", 0) == 0) ostate[k.substr(10)] = v;
    opt->load_state(ostate);
    restore_rng(data_rng, trainer_file.tensors, "rng.data", resume_dir.string());
    restore_rng(model_rng, trainer_file.tensors, "rng.model", resume_dir.string());
    log << "resuming from " << resume_dir.string() << " at step " << step << "\n";
  } else {
    model.init(model_rng);
    fs::create_directories(out_dir);
  }
  log << model.summary() << "\n";
  if (data.corpus)
    log << "data: " << data.corpus->train_size() << " training characters, " << data.corpus->valid_size()
        << " held out, vocabulary " << data.corpus->vocab().size() << "\n";
  else
    log << "data: " << data.train_idx.size() << " training sequences, " << data.valid_idx.size() << " held out, "
        << data.outputs << " classes\n";

  model.place(opts.placement);
  const bool gpu = opts.placement.device == Device::CUDA;
  if (gpu) log << "device: " << device_name(opts.placement.device) << ", precision " << precision_name(opts.placement.precision) << "\n";

  TrainResult res;
  res.step = step;
  auto params = model.parameters();
  const bool tty = ::isatty(::fileno(stderr)) && opts.log == nullptr;
  auto t_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  double win_loss = 0;
  int64_t win_n = 0, tokens = 0;
  std::string last_good;
  if (opts.resume) last_good = resume_dir.string();

  // Steps whose loss and gradient norm the host has not looked at yet (GPU: read lazily).
  struct Pending {
    int64_t step;
    LossResult loss;
    Tensor norm;
  };
  std::vector<Pending> pending;
  // GPU: running sum of gradient norms; the guarded optimizer skips every update from the first
  // non-finite norm on, so the parameters stay those from before that step.
  Tensor guard;
  if (gpu) guard = Tensor::zeros({1}, DType::F32, Device::CUDA);

  // Reads the pending steps; on a non-finite loss or norm, reports it and returns false.
  auto flush = [&]() -> bool {
    for (auto& p : pending) {
      p.loss.resolve();
      const double gnorm = p.norm.defined() ? p.norm.cpu().get(0) : 0.0;
      const bool loss_ok = std::isfinite(p.loss.loss);
      if (!loss_ok || !std::isfinite(gnorm)) {
        res.stopped_non_finite = true;
        log << (tty ? "\n" : "") << "error: " << (loss_ok ? "the gradient norm" : "the loss") << " is "
            << (loss_ok ? gnorm : p.loss.loss) << " at step " << p.step
            << (gpu ? "; its update and any later one were skipped on the device and training stopped. "
                    : "; stopped before applying the update. ");
        if (last_good.empty())
          log << "No checkpoint was written yet.\n";
        else
          log << "The last good checkpoint is " << last_good << ".\n";
        res.last_checkpoint = last_good;
        res.step = p.step - 1;
        pending.clear();
        return false;
      }
      win_loss += p.loss.loss;
      ++win_n;
      tokens += p.loss.count;
    }
    pending.clear();
    return true;
  };

  while (step < steps) {
    Batch b = data.train_batch(B, T, data_rng);
    model.zero_grad();
    Act out = model.forward(to_act(b, opts.placement.device), true, model_rng);
    LossResult lr = batch_loss(out, b, data.outputs);
    if (gpu) {
      // No host synchronisation: loss and norm stay on the device until the next flush.
      model.backward({lr.grad, b.lengths});
      Tensor norm = grad_norm_tensor(params);
      if (clip > 0) clip_grad_norm_with(params, clip, norm);
#if LSTM_HAVE_CUDA
      cuda::accumulate_scalar(guard, norm);
#endif
      opt->step_guarded(params, sched->lr(step), guard);
      ++step;
      lr.grad = Tensor();  // pending steps keep only their statistics, not logits-sized gradients
      pending.push_back({step, std::move(lr), norm});
    } else {
      Tensor norm;
      if (std::isfinite(lr.loss)) {
        model.backward({lr.grad, b.lengths});
        norm = Tensor::full({1}, clip > 0 ? clip_grad_norm(params, clip) : grad_norm(params));
      }
      pending.push_back({step + 1, std::move(lr), norm});
      if (!flush()) return res;
      opt->step(params, sched->lr(step));
      ++step;
    }
    const bool last = step == steps;
    const bool log_now = step % log_every == 0 || last;
    const bool eval_now = (eval_every > 0 && step % eval_every == 0) || last;
    const bool ckpt_now = (ckpt_every > 0 && step % ckpt_every == 0) || last;
    if ((log_now || eval_now || ckpt_now) && !flush()) return res;
    if (log_now && win_n > 0) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      double rate = el > 0 ? static_cast<double>(tokens) / el : 0;
      double eta = step > first_step ? el / static_cast<double>(step - first_step) * static_cast<double>(steps - step) : 0;
      res.train_loss = win_loss / static_cast<double>(win_n);
      const int width = 24;
      int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(step) / static_cast<double>(steps));
      std::ostringstream line;
      line << "step " << step << "/" << steps << " [" << std::string(static_cast<size_t>(filled), '=')
           << std::string(static_cast<size_t>(width - filled), ' ') << "] loss " << std::fixed << std::setprecision(4)
           << res.train_loss << " | lr " << std::setprecision(2) << std::scientific << sched->lr(step - 1)
           << std::defaultfloat << " | " << fmt_rate(rate) << (data.corpus ? " tok/s" : " seq/s") << " | ETA "
           << fmt_duration(eta);
      if (tty)
        log << "\r" << line.str() << "   " << std::flush;
      else
        log << line.str() << "\n";
      win_loss = 0;
      win_n = 0;
    }
    if (eval_now) {
      EvalResult er = run_eval(model, data, B, T, tc["eval_batches"]);
      res.valid_loss = er.loss;
      res.valid_accuracy = er.accuracy;
      if (er.count == 0)
        log << (tty ? "\n" : "") << "eval at step " << step << ": skipped, the held-out split has no complete window of "
            << T << " steps\n";
      else
        log << (tty ? "\n" : "") << "eval at step " << step << ": loss " << std::fixed << std::setprecision(4) << er.loss
            << ", accuracy " << std::setprecision(2) << 100 * er.accuracy << "% over " << er.count << " targets"
            << std::defaultfloat << "\n";
    }
    if (ckpt_now) {
      last_good = save_checkpoint(out_dir, step, model, meta, *opt, data_rng, model_rng, cfg, tc["keep_checkpoints"]);
      res.last_checkpoint = last_good;
    }
  }
  res.step = step;
  save_model((out_dir / "model.safetensors").string(), model, meta);
  if (data.corpus && tc["sample_length"].get<int64_t>() > 0) {
    Rng srng(seed + 17);
    res.sample = sample_text(model, data.corpus->vocab(), "", tc["sample_length"], tc["sample_temperature"], srng);
  }
  return res;
}

std::string resolve_model_path(const std::string& path) {
  if (fs::is_directory(path)) {
    fs::path p = fs::path(path) / "checkpoints";
    if (fs::exists(p / "latest")) return (latest_checkpoint(path) / "model.safetensors").string();
    if (fs::exists(fs::path(path) / "model.safetensors")) return (fs::path(path) / "model.safetensors").string();
    if (fs::exists(fs::path(path) / "latest")) return (latest_checkpoint(fs::path(path).parent_path()) / "model.safetensors").string();
    LSTM_THROW(path << " is a folder without a model: expected checkpoints/latest or model.safetensors in it");
  }
  LSTM_REQUIRE(fs::exists(path), "model file " << path << " does not exist");
  return path;
}

EvalResult evaluate_model(const std::string& model_path, const std::string& data_path, int64_t batch_size,
                          int64_t seq_len, const Placement& placement) {
  std::string mp = resolve_model_path(model_path);
  std::map<std::string, std::string> meta;
  Model model = load_model(mp, &meta);
  model.place(placement);
  auto it = meta.find("lstm_engine.config");
  LSTM_REQUIRE(it != meta.end(), mp << ": no training configuration in the model file; cannot tell its task");
  nlohmann::json cfg = nlohmann::json::parse(it->second);
  TaskData d = load_task_data(cfg, data_path);
  for (const char* key : {"lstm_engine.vocab", "lstm_engine.classes", "lstm_engine.tokens"}) {
    auto a = meta.find(key);
    auto b = d.meta.find(key);
    if (a != meta.end() && b != d.meta.end())
      LSTM_REQUIRE(a->second == b->second, "the data's " << std::string(key).substr(12)
                                                         << " differ from the model's: evaluate on data with the same "
                                                         << std::string(key).substr(12));
  }
  LSTM_REQUIRE(batch_size >= 1 && seq_len >= 1,
               "evaluation needs batch size and sequence length >= 1, got " << batch_size << " and " << seq_len);
  EvalResult r = run_eval(model, d, batch_size, seq_len, 0);
  LSTM_REQUIRE(r.count > 0, "nothing to evaluate: the held-out split of " << d.meta.at("lstm_engine.data")
                                                                         << " has no complete window of " << seq_len
                                                                         << " steps (try a smaller --seq-len)");
  return r;
}

std::string generate_text(const std::string& model_path, const std::string& prime, int64_t length, double temperature,
                          uint64_t seed, const Placement& placement) {
  std::string mp = resolve_model_path(model_path);
  std::map<std::string, std::string> meta;
  Model model = load_model(mp, &meta);
  model.place(placement);
  auto it = meta.find("lstm_engine.vocab");
  LSTM_REQUIRE(it != meta.end(), mp << ": not a character language model (no vocabulary in the file)");
  Vocab vocab = Vocab::from_json(nlohmann::json::parse(it->second));
  Rng rng(seed);
  return sample_text(model, vocab, prime, length, temperature, rng);
}

}  // namespace lstm
