// The training loop behind `lstm train`, plus evaluation and text generation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "io/config_reader.hpp"
#include "lstm/checked.hpp"
#include "lstm/loss.hpp"
#include "lstm/optim.hpp"
#include "lstm/parallel.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/train.hpp"
#include "train/tasks.hpp"
#include "train/trained_model.hpp"
#include "train/watch.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/misc.hpp"
#endif

namespace fs = std::filesystem;

namespace lstm {

nlohmann::json default_train_config() {
  return nlohmann::json::parse(R"({
    "task": "charlm",
    "data": {"path": "", "valid_fraction": 0.05, "max_bytes": -1,
             "label_column": "label", "sequence_column": "sequence", "tags_column": "tags",
             "target_columns": ["target"], "input_columns": [], "horizon": 1},
    "model": {"embedding_dim": 32,
              "layers": [{"type": "lstm", "hidden_size": 256}, {"type": "dense"}]},
    "train": {"steps": 1000, "batch_size": 32, "seq_len": 64, "seed": 1, "threads": 0,
              "optimizer": {"type": "adam"},
              "schedule": {"type": "cosine", "lr": 0.003, "warmup_steps": 50, "total_steps": 0, "min_lr": 0.0003},
              "clip_grad_norm": 1.0, "log_every": 10, "eval_every": 250, "eval_batches": 0,
              "checkpoint_every": 250, "keep_checkpoints": 3, "sample_length": 300,
              "sample_temperature": 0.8,
              "early_stopping": {"metric": "valid_loss", "patience": 0, "min_delta": 0.0},
              "final_model": "best", "loss": "auto", "huber_delta": 1.0}
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

// The validation loss (train.hpp's EvalResult says what it covers). max_batches > 0 stops early:
// training's periodic estimate.
EvalResult run_eval(Model& model, const Task& d, int64_t B, int64_t T, int64_t max_batches) {
  EvalSums sums = d.start_eval();
  int64_t n = d.valid_batches(B, T);
  if (max_batches > 0) n = std::min(n, max_batches);
  Rng unused(0);
  for (int64_t i = 0; i < n; ++i) {
    Batch b = d.valid_batch(B, T, i);
    if (b.targets.numel() == 0) continue;
    Act out = model.forward(to_act(b, model.placement().device), false, unused);
    LossResult lr = d.loss(out, b);
    lr.resolve();
    d.add_eval(out, b, lr, sums);
  }
  return d.eval_result(sums);
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
    // The unknown id stands for no character: it is never sampled.
    double total = 1;
    if (const int64_t unk = vocab.unk_id(); unk >= 0 && unk < C) {
      total -= p[static_cast<size_t>(unk)];
      p[static_cast<size_t>(unk)] = 0;
    }
    double u = rng.uniform() * total, acc = 0;
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

// The best model by the validation metric; outside checkpoints/, so rotation never removes it.
const fs::path kBestModel = fs::path("best") / "model.safetensors";

// Writes checkpoints/step-N/ as a whole: both files go into a temporary folder that is renamed
// into place, then `latest` is replaced atomically. A crash at any point leaves the previous
// checkpoint and `latest` intact.
std::string save_checkpoint(const fs::path& out_dir, int64_t step, const Model& model,
                            const std::map<std::string, std::string>& model_meta, const Optimizer& opt,
                            const Rng& data_rng, const Rng& model_rng, const nlohmann::json& cfg, int64_t keep,
                            const nlohmann::json& progress) {
  fs::path ck = out_dir / "checkpoints";
  fs::path final_dir = ck / step_dir_name(step);
  fs::path tmp = ck / (".tmp-" + step_dir_name(step) + "-" + std::to_string(::getpid()));
  try {
    fs::create_directories(ck);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    save_model((tmp / "model.safetensors").string(), model, model_meta);
    std::map<std::string, Tensor> ts = opt.state();
    std::map<std::string, Tensor> prefixed;
    for (auto& [k, v] : ts) prefixed["optimizer." + k] = v;
    prefixed["rng.data"] = rng_tensor(data_rng);
    prefixed["rng.model"] = rng_tensor(model_rng);
    write_safetensors((tmp / "trainer.safetensors").string(), prefixed,
                      {{"step", std::to_string(step)}, {"config", cfg.dump()}, {"optimizer", opt.to_json().dump()},
                       {"progress", progress.dump()}});
    // The best model as of this step, so that a resume here gets it back even after the run went
    // on to write a later best. A hard link costs no space: best/model.safetensors is replaced by
    // rename, never rewritten in place, so the link keeps this version.
    const fs::path best = out_dir / kBestModel;
    if (fs::exists(best)) {
      std::error_code ec;
      fs::create_hard_link(best, tmp / "best.safetensors", ec);
      if (ec) fs::copy_file(best, tmp / "best.safetensors");
    }
    fsync_dir(tmp);
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    fsync_dir(ck);
    write_file_atomic((ck / "latest").string(), step_dir_name(step) + "\n");
  } catch (const std::exception& e) {
    // The previous checkpoint and `latest` are intact; leave no half-written folder behind.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    const bool full = std::string(e.what()).find(std::strerror(ENOSPC)) != std::string::npos;
    LSTM_THROW("checkpoint " << final_dir.string() << " could not be written: " << e.what()
                             << (full ? "; the older checkpoints are kept until the new one is complete, so keeping "
                                        "train.keep_checkpoints = " + std::to_string(keep) + " needs room for " +
                                        std::to_string(keep + 1) + ": free space or lower keep_checkpoints"
                                      : std::string()));
  }
  // Keep the newest `keep` checkpoints; drop temporaries a killed run left behind: step folders
  // (.tmp-step-*) and the pointer's own (latest.tmp.<pid>.<n>, from write_file_atomic).
  std::vector<fs::path> dirs, stale;
  for (auto& e : fs::directory_iterator(ck)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) dirs.push_back(e.path());
    if (name.rfind(".tmp-", 0) == 0 || name.rfind("latest.tmp.", 0) == 0) stale.push_back(e.path());
  }
  for (auto& p : stale) fs::remove_all(p);
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < dirs.size(); ++i)
    if (dirs[i] != final_dir) fs::remove_all(dirs[i]);
  return final_dir.string();
}

// What of an earlier run `out_dir` holds (empty: none), named for the refusal to train over it.
std::string previous_run(const fs::path& out_dir) {
  const fs::path ck = out_dir / "checkpoints";
  std::error_code ec;
  if (fs::exists(ck / "latest", ec)) return "checkpoints (" + (ck / "latest").string() + ")";
  if (fs::is_directory(ck, ec))
    for (auto& e : fs::directory_iterator(ck, ec))
      if (e.path().filename().string().rfind("step-", 0) == 0) return "checkpoints (" + e.path().string() + ")";
  if (fs::exists(out_dir / "model.safetensors", ec)) return "a trained model (" + (out_dir / "model.safetensors").string() + ")";
  if (fs::exists(out_dir / kBestModel, ec)) return "a best model (" + (out_dir / kBestModel).string() + ")";
  return "";
}

// Removes an earlier run from `out_dir`. Its checkpoints leave by one rename, so a crash leaves
// either the whole resumable run or none of its checkpoints; what was moved aside (and what an
// earlier crash left there) is deleted afterwards.
void remove_previous_run(const fs::path& out_dir) {
  const fs::path trash = out_dir / (".overwritten-" + std::to_string(::getpid()));
  try {
    fs::remove_all(trash);
    fs::create_directories(trash);
    if (fs::exists(out_dir / "checkpoints")) fs::rename(out_dir / "checkpoints", trash / "checkpoints");
    if (fs::exists(out_dir / "model.safetensors")) fs::rename(out_dir / "model.safetensors", trash / "model.safetensors");
    if (fs::exists(out_dir / "best")) fs::rename(out_dir / "best", trash / "best");
    fsync_dir(out_dir);
    for (auto& e : fs::directory_iterator(out_dir))
      if (e.path().filename().string().rfind(".overwritten-", 0) == 0) fs::remove_all(e.path());
  } catch (const std::exception& e) {
    LSTM_THROW("could not remove the earlier run in " << out_dir.string() << " (--overwrite): " << e.what());
  }
}

// A resume must continue exactly as an uninterrupted run: after a step every param has its
// optimizer state (Adam's moments would otherwise silently restart), and there is no state for
// params this model does not have.
void check_optimizer_state(const std::map<std::string, Tensor>& state, const Optimizer& opt, Model& model,
                           int64_t step, const std::string& file) {
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const Param& p : model.parameters()) {
    for (const std::string& k : opt.state_keys(p.name)) {
      expected.insert(k);
      auto it = state.find(k);
      if (it == state.end()) {
        missing.push_back("optimizer." + k);
        continue;
      }
      // Step counters are scalars; buffers have their param's shape.
      LSTM_REQUIRE(it->second.dim() == 0 || it->second.shape() == p.value.shape(),
                   file << ": optimizer state 'optimizer." << k << "' has shape " << it->second.shape_str()
                        << ", expected " << p.value.shape_str() << " (the shape of parameter '" << p.name << "')");
    }
  }
  for (const auto& [k, t] : state)
    LSTM_REQUIRE(expected.count(k), file << ": unexpected optimizer state 'optimizer." << k << "' (" << opt.kind()
                                         << " keeps " << (expected.empty() ? std::string("no state") : "state for this model's parameters only")
                                         << ")");
  if (step == 0 || missing.empty()) return;
  std::string list;
  for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
  if (missing.size() > 5) list += ", ... (" + std::to_string(missing.size()) + " in all)";
  LSTM_THROW(file << ": the " << opt.kind() << " optimizer state is incomplete at step " << step << ": missing "
                  << list << "; resuming would restart it and differ from an uninterrupted run, so the resume is refused");
}

// The step of a checkpoint folder name "step-N" (digits only), or -1 for any other name.
int64_t step_of_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.substr(0, kPrefix.size()) != kPrefix || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18)
    return -1;
  int64_t step = -1;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(first, last, step);
  return ec == std::errc() && ptr == last && std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })
             ? step
             : -1;
}

// `latest` may name only a step-N folder of this run's checkpoints folder: anything else (a
// path into another run, a link) would resume a different run's architecture and state.
fs::path latest_checkpoint(const fs::path& out_dir) {
  const fs::path latest = out_dir / "checkpoints" / "latest";
  LSTM_REQUIRE(fs::exists(latest), "no checkpoint to resume from: " << latest.string() << " does not exist");
  const std::string pre = "checkpoint pointer " + latest.string() + ": ";
  std::string name = read_regular_file(latest.string(), pre, 4096);
  if (!name.empty() && name.back() == '\n') name.pop_back();
  LSTM_REQUIRE(step_of_dir_name(name) >= 0,
               pre << "expected the name of a checkpoint folder of this run (step-N, N digits), got \""
                   << printable(name) << "\"");
  const fs::path dir = out_dir / "checkpoints" / name;
  LSTM_REQUIRE(fs::is_directory(fs::symlink_status(dir)),
               pre << "names '" << name << "', but " << dir.string() << " is not a folder (a link or missing)");
  return dir;
}

// An integer stored as text in a file's metadata.
int64_t metadata_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& file) {
  auto it = meta.find(key);
  LSTM_REQUIRE(it != meta.end(), file << ": metadata \"" << key << "\" is missing (expected an integer)");
  int64_t v = 0;
  const std::string& text = it->second;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  LSTM_REQUIRE(ec == std::errc() && ptr == text.data() + text.size() && v >= 0,
               file << ": metadata \"" << key << "\" must be a non-negative integer, got \"" << printable(text) << "\"");
  return v;
}

// A training configuration stored in a file's metadata (checkpoint or model), checked as a
// user's config is, errors naming the file.
nlohmann::json stored_config(const std::map<std::string, std::string>& meta, const std::string& key,
                             const std::string& file) {
  auto it = meta.find(key);
  LSTM_REQUIRE(it != meta.end(), file << ": no training configuration in its metadata (\"" << key << "\")");
  nlohmann::json cfg = parse_json(it->second, file + ": metadata \"" + key + "\"");
  try {
    return resolve_train_config(cfg);
  } catch (const Error& e) {
    LSTM_THROW(file << ": metadata \"" << key << "\": " << e.what());
  }
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

// Refuses, before a step allocates anything large, a job whose step cannot fit in the memory of
// the device it runs on (Model::memory_bytes' estimate; the OOM killer gives no message).
// `steps_from` names where the number of steps comes from, for the error.
void require_step_fits(const Model& model, int64_t batch, int64_t steps, bool training, const Placement& p,
                       const std::string& steps_from, const std::string& what) {
  const int64_t act_bytes =
      p.device == Device::CUDA ? static_cast<int64_t>(dtype_size(precision_dtype(p.precision))) : dtype_size(model.dtype());
  const double need = model.memory_bytes(batch, steps, training, act_bytes);
  double have = static_cast<double>(physical_memory_bytes());
  std::string where = "this machine";
  if (p.device == Device::CUDA) {
    const auto gpus = cuda_devices();
    have = gpus.empty() ? 0 : static_cast<double>(gpus.front().memory_bytes);
    where = gpus.empty() ? "the GPU" : "the GPU (" + gpus.front().name + ")";
  }
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  LSTM_REQUIRE(have == 0 || need <= have,
               what << " needs about " << std::setprecision(3) << need / kGiB << " GiB for one "
                    << (training ? "training step" : "batch") << " (batch " << batch << " x " << steps << " steps from "
                    << steps_from << ", " << model.num_parameters() << " parameters), more than the " << have / kGiB
                    << " GiB of memory of " << where << ": lower the batch size or the sequence length");
}

}  // namespace

nlohmann::json resolve_train_config(const nlohmann::json& user) {
  LSTM_REQUIRE(user.is_object(), "config must be a JSON object, got " << json_excerpt(user));
  for (const char* section : {"data", "model", "train"})
    LSTM_REQUIRE(!user.contains(section) || user[section].is_object(),
                 "config: '" << section << "' must be an object, got " << json_excerpt(user[section]));
  nlohmann::json cfg = default_train_config();
  merge(cfg, user, "");
  auto name = [](const std::string& field) { return "config: '" + field + "'"; };
  const std::string task = read_string(cfg["task"], name("task"));
  LSTM_REQUIRE(task == "charlm" || task == "classify" || task == "regress" || task == "forecast" || task == "tag",
               name("task") << " must be \"charlm\", \"classify\", \"regress\", \"forecast\" or \"tag\", got "
                            << json_excerpt(cfg["task"]));
  const bool regression = task == "regress" || task == "forecast";
  for (const char* k : {"path", "label_column", "sequence_column", "tags_column"})
    read_string(cfg["data"][k], name(std::string("data.") + k));
  // Column lists: strings, none empty or named twice; targets at least one.
  for (const char* k : {"target_columns", "input_columns"}) {
    const std::string field = name(std::string("data.") + k);
    const auto& list = cfg["data"][k];
    const bool targets = std::string(k) == "target_columns";
    LSTM_REQUIRE(list.is_array() && (!targets || !list.empty()) && list.size() <= 65536,
                 field << " must be a list of " << (targets ? "1" : "0") << " to 65536 column names, got "
                       << json_excerpt(list));
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string item = name(std::string("data.") + k + "[" + std::to_string(i) + "]");
      const std::string col = read_string(list[i], item);
      LSTM_REQUIRE(!col.empty(), item << " is an empty column name");
      for (size_t j = 0; j < i; ++j)
        LSTM_REQUIRE(list[j] != list[i], field << " names the column '" << col << "' twice");
    }
  }
  cfg["data"]["horizon"] = read_int(cfg["data"]["horizon"], name("data.horizon"), 1, kMaxDim);
  {
    const std::string loss = read_string(cfg["train"]["loss"], name("train.loss"));
    LSTM_REQUIRE(loss == "auto" || loss == "cross_entropy" || loss == "mse" || loss == "huber",
                 name("train.loss") << " must be \"auto\", \"cross_entropy\", \"mse\" or \"huber\", got "
                                    << json_excerpt(cfg["train"]["loss"]));
    if (regression)
      LSTM_REQUIRE(loss != "cross_entropy", name("train.loss") << " of task \"" << task
                                                               << "\" must be \"mse\" or \"huber\" (or \"auto\": mse), got \"cross_entropy\"");
    else
      LSTM_REQUIRE(loss == "auto" || loss == "cross_entropy",
                   name("train.loss") << " of task \"" << task << "\" must be \"cross_entropy\" (or \"auto\"), got \""
                                      << loss << "\" (mse and huber are for the tasks regress and forecast)");
    cfg["train"]["loss"] = loss == "auto" ? (regression ? "mse" : "cross_entropy") : loss;
    cfg["train"]["huber_delta"] = read_number(cfg["train"]["huber_delta"], name("train.huber_delta") + " (> 0)",
                                              std::numeric_limits<double>::min(), std::numeric_limits<double>::max());
  }
  read_number(cfg["data"]["valid_fraction"], name("data.valid_fraction"), 0.0, 1.0);
  cfg["data"]["max_bytes"] =
      read_int(cfg["data"]["max_bytes"], name("data.max_bytes"), -1, std::numeric_limits<int64_t>::max());
  cfg["model"]["embedding_dim"] = read_int(cfg["model"]["embedding_dim"], name("model.embedding_dim"), 1, kMaxDim);
  const auto& layers = cfg["model"]["layers"];
  LSTM_REQUIRE(layers.is_array() && !layers.empty(),
               name("model.layers") << " must be a non-empty list of layers, got " << json_excerpt(layers));
  // Each layer is checked here, sizes and all, so a bad one fails before any data is read.
  for (size_t i = 0; i < layers.size(); ++i) {
    nlohmann::json l = layers[i];
    if (i + 1 == layers.size() && field_is(l, "type", "dense") && !l.contains("out_features"))
      l["out_features"] = 1;  // filled in from the data later
    if (l.is_object()) l.erase("name");
    try {
      (void)layer_from_json(l);
    } catch (const Error& e) {
      LSTM_THROW(name("model.layers[" + std::to_string(i) + "]") << ": " << e.what());
    }
  }
  // JSON text gives unsigned numbers; a config built in C++ ({"seed", 3}) gives signed ones.
  {
    auto& seed = cfg["train"]["seed"];
    if (seed.is_number_integer() && !seed.is_number_unsigned() && seed.get<int64_t>() >= 0)
      seed = static_cast<uint64_t>(seed.get<int64_t>());
    LSTM_REQUIRE(seed.is_number_unsigned(), name("train.seed") << " must be an integer in [0, 2^64), got "
                                                               << json_excerpt(seed));
  }
  auto& t = cfg["train"];
  // Counts of steps: 2^53 bounds the doubles (progress, Adam's step) that still count every step.
  constexpr int64_t kMaxSteps = int64_t{1} << 53;
  for (const char* k : {"steps", "log_every", "eval_every", "eval_batches", "checkpoint_every", "sample_length"})
    t[k] = read_int(t[k], name(std::string("train.") + k), 0, kMaxSteps);
  t["batch_size"] = read_int(t["batch_size"], name("train.batch_size"), 1, kMaxDim);
  t["seq_len"] = read_int(t["seq_len"], name("train.seq_len"), 1, kMaxDim);
  t["keep_checkpoints"] = read_int(t["keep_checkpoints"], name("train.keep_checkpoints"), 0, 1'000'000);
  t["threads"] = read_int(t["threads"], name("train.threads"), 0, 65536);
  read_number(t["clip_grad_norm"], name("train.clip_grad_norm") + " (0 = off)", 0.0, HUGE_VAL);
  LSTM_REQUIRE(t["sample_temperature"].is_number() && t["sample_temperature"].get<double>() > 0,
               name("train.sample_temperature") << " must be a number > 0, got "
                                                << json_excerpt(t["sample_temperature"]));
  {
    auto& es = t["early_stopping"];
    LSTM_REQUIRE(es.is_object(), name("train.early_stopping") << " must be an object {\"metric\", \"patience\", "
                                                                 "\"min_delta\"}, got " << json_excerpt(es));
    const std::string metric = read_string(es["metric"], name("train.early_stopping.metric"));
    LSTM_REQUIRE(metric == "valid_loss" || metric == "valid_accuracy",
                 name("train.early_stopping.metric") << " must be \"valid_loss\" or \"valid_accuracy\", got "
                                                     << json_excerpt(es["metric"]));
    LSTM_REQUIRE(!regression || metric == "valid_loss",
                 name("train.early_stopping.metric") << " of task \"" << task
                                                     << "\" must be \"valid_loss\" (it has no accuracy), got \""
                                                     << metric << "\"");
    es["patience"] = read_int(es["patience"], name("train.early_stopping.patience") + " (evaluations, 0 = off)", 0,
                              kMaxSteps);
    es["min_delta"] = read_number(es["min_delta"], name("train.early_stopping.min_delta"), 0.0, HUGE_VAL);
    const std::string fm = read_string(t["final_model"], name("train.final_model"));
    LSTM_REQUIRE(fm == "best" || fm == "last",
                 name("train.final_model") << " must be \"best\" or \"last\", got " << json_excerpt(t["final_model"]));
  }
  auto& sch = t["schedule"];
  const bool user_schedule = user.contains("train") && user["train"].is_object() && user["train"].contains("schedule");
  if (field_is(sch, "type", "cosine")) {
    // total_steps 0 (or absent) means "the run's steps"; a total_steps of another type is left
    // for schedule_from_json to report.
    if (!sch.contains("total_steps") || sch["total_steps"] == 0) sch["total_steps"] = t["steps"];
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
    const std::string tf = (resume_dir / "trainer.safetensors").string();
    trainer_file = read_safetensors(tf);
    cfg = stored_config(trainer_file.metadata, "config", tf);
    const auto& sch = cfg["train"]["schedule"];
    if (opts.steps >= 0 && field_is(sch, "type", "cosine") &&
        opts.steps > sch.value("total_steps", opts.steps)) {
      // Past its end a cosine schedule stays at min_lr: the extra steps would barely train (or not
      // at all with min_lr 0), and nothing would say so.
      const int64_t end = sch.value("total_steps", int64_t{0});
      LSTM_THROW("cannot resume " << out_dir.string() << " to step " << opts.steps << ": its cosine learning-rate "
                                  << "schedule ends at step " << end << " with lr " << sch.value("min_lr", 0.0)
                                  << ", so the steps after it would train at that final rate. Resume to at most step "
                                  << end << ", or train a new run with train.steps (and schedule.total_steps) "
                                  << opts.steps << " (--overwrite or another --out)");
    }
    if (opts.steps >= 0) {
      cfg["train"]["steps"] = opts.steps;
      cfg = resolve_train_config(cfg);
    }
  } else {
    if (const std::string prev = previous_run(out_dir); !prev.empty() && !opts.overwrite)
      LSTM_THROW(out_dir.string() << " holds another run's " << prev << ": use --resume to continue it or --overwrite "
                                  << "to start over (removes its checkpoints and model), or give another --out");
    nlohmann::json user = opts.config;
    if (opts.steps >= 0 && user.is_object()) user["train"]["steps"] = opts.steps;
    cfg = resolve_train_config(user);
  }
  if (opts.threads > 0) cfg["train"]["threads"] = checked_size(opts.threads, 1, 65536, "threads");
  const auto& tc = cfg["train"];
  if (tc["threads"].get<int>() > 0) set_num_threads(tc["threads"].get<int>());
  const int64_t steps = tc["steps"], B = tc["batch_size"], T = tc["seq_len"];
  const int64_t log_every = std::max<int64_t>(1, tc["log_every"].get<int64_t>());
  const int64_t eval_every = tc["eval_every"], ckpt_every = tc["checkpoint_every"], eval_batches = tc["eval_batches"];
  const double clip = tc["clip_grad_norm"];

  const std::unique_ptr<Task> task = make_task(cfg);
  const Task& data = *task;
  Model model = Model::from_json(task_model_json(cfg, data));
  require_step_fits(model, B, data.batch_steps(T), /*training=*/true, opts.placement, data.steps_from(),
                    "this training job");
  auto opt = optimizer_from_json(tc["optimizer"]);
  auto sched = schedule_from_json(tc["schedule"]);
  const uint64_t seed = tc["seed"];
  Rng data_rng(seed), model_rng(seed ^ 0x9e3779b97f4a7c15ull);
  int64_t step = 0;
  std::map<std::string, std::string> meta = data.metadata();
  meta["lstm_engine.config"] = cfg.dump();

  if (opts.resume) {
    std::map<std::string, std::string> mmeta;
    Model loaded = load_model((resume_dir / "model.safetensors").string(), &mmeta);
    model.load_state_dict(loaded.state_dict(), true);
    const std::string tf = (resume_dir / "trainer.safetensors").string();
    step = metadata_int(trainer_file.metadata, "step", tf);
    // Training cannot go back: --steps below the checkpoint would silently finish at a later step
    // than asked and call it done.
    LSTM_REQUIRE(opts.steps < 0 || opts.steps >= step,
                 "cannot resume " << out_dir.string() << " to step " << opts.steps << ": its latest checkpoint "
                                  << resume_dir.filename().string() << " is already at step " << step
                                  << " (give --steps " << step << " or more; an earlier model is in the checkpoints "
                                  << "that keep_checkpoints kept)");
    LSTM_REQUIRE(step == step_of_dir_name(resume_dir.filename().string()),
                 tf << ": metadata \"step\" is " << step << ", but the checkpoint folder is " << resume_dir.filename().string());
    std::map<std::string, Tensor> ostate;
    for (auto& [k, v] : trainer_file.tensors)
      if (k.rfind("optimizer.", 0) == 0) ostate[k.substr(10)] = v;
    check_optimizer_state(ostate, *opt, model, step, tf);
    try {
      opt->load_state(ostate);
    } catch (const Error& e) {
      LSTM_THROW(tf << ": " << e.what());
    }
    restore_rng(data_rng, trainer_file.tensors, "rng.data", resume_dir.string());
    restore_rng(model_rng, trainer_file.tensors, "rng.model", resume_dir.string());
    log << "resuming from " << resume_dir.string() << " at step " << step << "\n";
  } else {
    model.init(model_rng);
    fs::create_directories(out_dir);
    // Only now, with the configuration and data known good, is the earlier run given up.
    if (opts.overwrite) remove_previous_run(out_dir);
  }
  log << model.summary() << "\n";
  log << data.describe() << "\n";

  model.place(opts.placement);
  const bool gpu = opts.placement.device == Device::CUDA;
  if (gpu) log << "device: " << device_name(opts.placement.device) << ", precision " << precision_name(opts.placement.precision) << "\n";

  TrainResult res;
  res.step = step;
  res.regression = data.regression();
  auto params = model.parameters();
  const bool tty = ::isatty(::fileno(stderr)) && opts.log == nullptr;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto t_start = Clock::now();
  // Progress a checkpoint carries besides the optimizer and RNGs: the time trained so far (so
  // elapsed_s continues), the partial log window (so the resumed log line averages the same
  // steps) and the best-model state (so early stopping and best/ continue as uninterrupted).
  double elapsed_before = 0;
  double win_loss = 0, win_norm = 0;
  int64_t win_n = 0, win_targets = 0;
  double win_seconds = 0;
  BestTracker best;
  {
    const auto& es = tc["early_stopping"];
    best.metric = es["metric"].get<std::string>();
    best.patience = es["patience"].get<int64_t>();
    best.min_delta = es["min_delta"].get<double>();
  }
  const bool final_best = tc["final_model"].get<std::string>() == "best";
  const fs::path best_path = out_dir / kBestModel;
  MetricsLog metrics;
  if (opts.resume) {
    const std::string tf = (resume_dir / "trainer.safetensors").string();
    if (auto it = trainer_file.metadata.find("progress"); it != trainer_file.metadata.end()) {
      const nlohmann::json pr = parse_json(it->second, tf + ": metadata \"progress\"");
      LSTM_REQUIRE(pr.is_object(), tf << ": metadata \"progress\" must be an object, got " << json_excerpt(pr));
      const std::string pre = tf + ": metadata \"progress\" ";
      elapsed_before = read_number(pr.value("elapsed_s", nlohmann::json(0)), pre + "'elapsed_s'", 0, HUGE_VAL);
      const nlohmann::json w = pr.value("window", nlohmann::json::object());
      LSTM_REQUIRE(w.is_object(), pre << "'window' must be an object, got " << json_excerpt(w));
      win_loss = read_number(w.value("loss", nlohmann::json(0)), pre + "'window.loss'", -HUGE_VAL, HUGE_VAL);
      win_norm = read_number(w.value("grad_norm", nlohmann::json(0)), pre + "'window.grad_norm'", 0, HUGE_VAL);
      win_n = read_int(w.value("steps", nlohmann::json(0)), pre + "'window.steps'", 0, step);
      if (pr.contains("best")) best.load_state(pr["best"], tf);
    }
    // best/ as of the checkpoint: a later best the interrupted run wrote is not this run's (yet).
    const fs::path ck_best = resume_dir / "best.safetensors";
    if (fs::exists(ck_best)) {
      fs::create_directories(best_path.parent_path());
      write_file_atomic(best_path.string(), read_regular_file(ck_best.string(), ck_best.string() + ": ",
                                                              memory_limited_bytes()));
    } else if (!best.has_best) {
      fs::remove(best_path);
    }
    LSTM_REQUIRE(!best.has_best || fs::exists(best_path),
                 tf << ": the best model (step " << best.best_step << ") is missing: neither " << ck_best.string()
                    << " nor " << best_path.string() << " exists");
    const int64_t dropped = metrics.resume((out_dir / "metrics.jsonl").string(), step);
    if (dropped > 0)
      log << "metrics.jsonl: dropped " << dropped << " line(s) written after step " << step << " (or cut short)\n";
  } else {
    metrics.start((out_dir / "metrics.jsonl").string());
  }
  EtaEstimator eta;
  auto span_start = Clock::now();
  int64_t span_first = step;
  std::string last_good;
  if (opts.resume) last_good = resume_dir.string();
  auto model_meta = [&](int64_t at) {
    std::map<std::string, std::string> m = meta;
    m["lstm_engine.step"] = std::to_string(at);
    return m;
  };
  auto progress = [&] {
    return nlohmann::json{{"elapsed_s", elapsed_before + seconds_since(t_start)},
                          {"window", {{"loss", win_loss}, {"grad_norm", win_norm}, {"steps", win_n}}},
                          {"best", best.state()}};
  };
  // model.safetensors: the best model by the validation metric (train.final_model "best", when
  // an evaluation has found one) or the weights of the last step. Returns which it wrote.
  auto save_final = [&](int64_t at) {
    if (final_best && best.has_best) {
      SafetensorsFile b = read_safetensors(best_path.string());
      b.metadata["lstm_engine.final_model"] = "best";
      write_safetensors((out_dir / "model.safetensors").string(), b.tensors, b.metadata);
      res.final_model = "best";
      res.final_model_step = best.best_step;
    } else {
      auto m = model_meta(at);
      m["lstm_engine.final_model"] = "last";
      save_model((out_dir / "model.safetensors").string(), model, m);
      res.final_model = "last";
      res.final_model_step = at;
    }
  };
  auto fill_best = [&] {
    res.best_metric = best.metric;
    res.best_step = best.has_best ? best.best_step : -1;
    res.best_value = best.best;
  };

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
        metrics.append({{"kind", "non_finite"}, {"step", p.step}, {"loss", p.loss.loss}, {"grad_norm", gnorm},
                        {"elapsed_s", elapsed_before + seconds_since(t_start)}});
        res.last_checkpoint = last_good;
        res.step = p.step - 1;
        fill_best();
        pending.clear();
        return false;
      }
      win_loss += p.loss.loss;
      win_norm += gnorm;
      ++win_n;
      win_targets += p.loss.count;
    }
    pending.clear();
    return true;
  };

  bool stopped_early = false;
  while (step < steps) {
    Batch b = data.train_batch(B, T, data_rng);
    model.zero_grad();
    Act out = model.forward(to_act(b, opts.placement.device), true, model_rng);
    LossResult lr = data.loss(out, b);
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
    const int stop_req = opts.stop ? opts.stop->load(std::memory_order_relaxed) : 0;
    const bool last = step == steps;
    const bool log_now = step % log_every == 0 || last;
    const bool eval_now = !stop_req && ((eval_every > 0 && step % eval_every == 0) || last);
    bool ckpt_now = (ckpt_every > 0 && step % ckpt_every == 0) || last || stop_req;
    if (!(log_now || eval_now || ckpt_now)) continue;
    if (!flush()) return res;
    {
      // The steps since the last measurement, without evaluations or checkpoints (GPU: the flush
      // waited for them, so this is their real time).
      const double span = seconds_since(span_start);
      eta.add_steps(step - span_first, span);
      win_seconds += span;
    }
    if (log_now && win_n > 0) {
      const double rate = win_seconds > 0 ? static_cast<double>(win_targets) / win_seconds : 0;
      const double left = eta.eta(steps - step, pause_points(step, steps, eval_every, ckpt_every));
      res.train_loss = win_loss / static_cast<double>(win_n);
      const double lr_now = sched->lr(step - 1);
      const int width = 24;
      int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(step) / static_cast<double>(steps));
      std::ostringstream line;
      line << "step " << step << "/" << steps << " [" << std::string(static_cast<size_t>(filled), '=')
           << std::string(static_cast<size_t>(width - filled), ' ') << "] loss " << std::fixed << std::setprecision(4)
           << res.train_loss << " | lr " << std::setprecision(2) << std::scientific << lr_now
           << std::defaultfloat << " | " << fmt_rate(rate) << " " << data.rate_unit() << " | ETA "
           << fmt_duration(left);
      if (tty)
        log << "\r" << line.str() << "   " << std::flush;
      else
        log << line.str() << "\n";
      metrics.append({{"kind", "train"},
                      {"step", step},
                      {"loss", res.train_loss},
                      {"lr", lr_now},
                      {"grad_norm", win_norm / static_cast<double>(win_n)},
                      {data.rate_key(), rate},
                      {"elapsed_s", elapsed_before + seconds_since(t_start)},
                      {"eta_s", std::isfinite(left) ? nlohmann::json(left) : nlohmann::json()}});
      win_loss = win_norm = win_seconds = 0;
      win_n = win_targets = 0;
    }
    const auto pause_start = Clock::now();
    if (eval_now) {
      // The final evaluation covers every held-out batch (the number the run reports, equal to
      // `lstm eval`'s); the periodic ones may stop at eval_batches as an estimate.
      const int64_t max_batches = last ? 0 : eval_batches;
      const bool partial = max_batches > 0 && data.valid_batches(B, T) > max_batches;
      EvalResult er = run_eval(model, data, B, T, max_batches);
      res.valid_loss = er.loss;
      res.valid_accuracy = er.accuracy;
      res.valid_mse = er.mse;
      res.valid_mae = er.mae;
      res.valid_rmse = er.rmse;
      if (er.count == 0) {
        if (data.corpus())
          log << (tty ? "\n" : "") << "eval at step " << step
              << ": skipped, the held-out split has no complete window of " << T << " steps\n";
        else
          log << (tty ? "\n" : "") << "eval at step " << step << ": skipped, nothing is held out (data.valid_fraction)\n";
      } else {
        // The best model is chosen among numbers of one definition: with train.eval_batches set,
        // the periodic evaluations are estimates over the first eval_batches batches, so the final
        // one (over all of them, the number reported) is compared by the same estimate.
        const EvalResult tracked = last && eval_batches > 0 && data.valid_batches(B, T) > eval_batches
                                       ? run_eval(model, data, B, T, eval_batches)
                                       : er;
        const bool improved = best.update(step, best.metric == "valid_loss" ? tracked.loss : tracked.accuracy);
        if (improved) {
          auto m = model_meta(step);
          m["lstm_engine.valid_loss"] = nlohmann::json(er.loss).dump();
          m["lstm_engine.valid_accuracy"] = nlohmann::json(er.accuracy).dump();
          if (er.regression) {
            m["lstm_engine.valid_mse"] = nlohmann::json(er.mse).dump();
            m["lstm_engine.valid_mae"] = nlohmann::json(er.mae).dump();
          }
          try {
            fs::create_directories(best_path.parent_path());
            save_model(best_path.string(), model, m);
          } catch (const std::exception& e) {
            LSTM_THROW("best model " << best_path.string() << " could not be written (the previous one is intact): "
                                     << e.what());
          }
        }
        log << (tty ? "\n" : "") << "eval at step " << step << ": loss ";
        if (er.regression)
          // The loss is what training minimises (normalised targets); the errors are in the data's units.
          log << std::setprecision(4) << er.loss << " (" << tc["loss"].get<std::string>() << ", normalised); MSE "
              << er.mse << ", MAE " << er.mae << ", RMSE " << er.rmse << " (original units) over " << er.count
              << " targets";
        else
          log << std::fixed << std::setprecision(4) << er.loss << ", accuracy " << std::setprecision(2)
              << 100 * er.accuracy << "% over " << er.count << " targets";
        log << std::defaultfloat
            << (partial ? " (estimate: the first " + std::to_string(max_batches) + " held-out batches)"
                        : std::string(" (all held-out)"))
            << (improved ? " (best so far)" : "") << "\n";
        nlohmann::json rec = {{"kind", "eval"},
                              {"step", step},
                              {"valid_loss", er.loss},
                              {"valid_accuracy", er.accuracy},
                              {"valid_targets", er.count},
                              {"best", improved},
                              {"best_step", best.best_step},
                              {"elapsed_s", elapsed_before + seconds_since(t_start)}};
        if (er.regression) {
          rec.erase("valid_accuracy");
          rec["valid_mse"] = er.mse;
          rec["valid_mae"] = er.mae;
          rec["valid_rmse"] = er.rmse;
        }
        metrics.append(rec);
        if (best.should_stop() && !last) {
          stopped_early = true;
          ckpt_now = true;
          std::ostringstream msg;
          msg << "early stopping at step " << step << ": " << best.metric << " has not improved by more than "
              << best.min_delta << " for " << best.bad_evals << " evaluation(s); best " << std::fixed
              << std::setprecision(4) << best.best << std::defaultfloat << " at step " << best.best_step;
          log << msg.str() << "\n";
          metrics.append({{"kind", "early_stop"},
                          {"step", step},
                          {"metric", best.metric},
                          {"best", best.best},
                          {"best_step", best.best_step},
                          {"elapsed_s", elapsed_before + seconds_since(t_start)}});
        }
      }
    }
    if (ckpt_now) {
      last_good = save_checkpoint(out_dir, step, model, model_meta(step), *opt, data_rng, model_rng, cfg,
                                  tc["keep_checkpoints"], progress());
      res.last_checkpoint = last_good;
    }
    if (eval_now || ckpt_now) eta.add_pause(seconds_since(pause_start));
    span_start = Clock::now();
    span_first = step;
    if (stop_req) {
      if (last) save_final(step);
      log << (tty ? "\n" : "") << "stopped on request after step " << step << "; checkpoint " << last_good << "\n";
      res.step = step;
      res.stopped_by = stop_req;
      fill_best();
      return res;
    }
    if (stopped_early) break;
  }
  res.step = step;
  res.stopped_early = stopped_early;
  fill_best();
  save_final(step);
  if (data.corpus() && tc["sample_length"].get<int64_t>() > 0) {
    // From the weights model.safetensors holds.
    if (res.final_model == "best") model.load_state_dict(read_safetensors(best_path.string()).tensors, true);
    Rng srng(seed + 17);
    res.sample = sample_text(model, data.corpus()->vocab(), "", tc["sample_length"], tc["sample_temperature"], srng);
  }
  return res;
}

nlohmann::json read_train_config_file(const std::string& path) {
  const std::string pre = "--config " + path;
  nlohmann::json user = parse_json(read_regular_file(path, pre + ": ", 16 << 20), pre);
  // Checked now, so that errors name the file; returned as given, so that overrides (--steps)
  // still resolve into the derived defaults (the schedule's total_steps).
  try {
    (void)resolve_train_config(user);
  } catch (const Error& e) {
    LSTM_THROW(pre << ": " << e.what());
  }
  return user;
}

std::string resolve_model_path(const std::string& path) {
  if (fs::is_directory(path)) {
    // A finished run: its model.safetensors (written after its last checkpoint). A run in progress,
    // stopped, or resumed since it finished: its latest checkpoint's model.
    const fs::path latest = fs::path(path) / "checkpoints" / "latest", final_model = fs::path(path) / "model.safetensors";
    std::error_code e1, e2;
    const bool has_latest = fs::exists(latest), has_final = fs::exists(final_model);
    if (has_final && (!has_latest || fs::last_write_time(final_model, e1) >= fs::last_write_time(latest, e2)))
      return final_model.string();
    if (has_latest) return (latest_checkpoint(path) / "model.safetensors").string();
    if (fs::exists(fs::path(path) / "latest")) return (latest_checkpoint(fs::path(path).parent_path()) / "model.safetensors").string();
    LSTM_THROW(path << " is a folder without a model: expected checkpoints/latest or model.safetensors in it");
  }
  LSTM_REQUIRE(fs::exists(path), "model file " << path << " does not exist");
  return path;
}

TrainedModel load_trained_model(const std::string& model_path, const Placement& placement, bool allow_nonfinite) {
  TrainedModel t;
  t.path = resolve_model_path(model_path);
  t.model = load_model(t.path, &t.meta, DType::F32, allow_nonfinite);
  t.model.place(placement);
  t.config = stored_config(t.meta, "lstm_engine.config", t.path);
  t.task = t.config["task"].get<std::string>();
  return t;
}

Vocab stored_vocab(const TrainedModel& m) {
  auto it = m.meta.find("lstm_engine.vocab");
  LSTM_REQUIRE(it != m.meta.end(), m.path << ": not a character language model (no vocabulary in the file)");
  const nlohmann::json vj = parse_json(it->second, m.path + ": metadata \"lstm_engine.vocab\"");
  Vocab vocab;
  try {
    vocab = Vocab::from_json(vj);
  } catch (const Error& e) {
    LSTM_THROW(m.path << ": metadata \"lstm_engine.vocab\": " << e.what());
  }
  LSTM_REQUIRE(vocab.size() == m.model.output_signal().features,
               m.path << ": the vocabulary has " << vocab.size() << " entries but the model outputs "
                      << m.model.output_signal().features);
  return vocab;
}

CsvSchema stored_csv_schema(const TrainedModel& m) {
  auto names = [&](const char* key) {
    auto it = m.meta.find(key);
    LSTM_REQUIRE(it != m.meta.end(), m.path << ": no metadata \"" << key << "\" (not a classifier trained by lstm)");
    const nlohmann::json j = parse_json(it->second, m.path + ": metadata \"" + key + "\"");
    LSTM_REQUIRE(j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& e) { return e.is_string(); }),
                 m.path << ": metadata \"" << key << "\" must be a list of strings, got " << json_excerpt(j));
    return j.get<std::vector<std::string>>();
  };
  CsvSchema s;
  if (m.task != "regress") {  // regress predicts numbers, not classes
    s.class_names = names("lstm_engine.classes");
    LSTM_REQUIRE(static_cast<int64_t>(s.class_names.size()) == m.model.output_signal().features,
                 m.path << ": " << s.class_names.size() << " class names but the model outputs "
                        << m.model.output_signal().features);
  }
  const Signal& in = m.model.input_signal();
  s.tokens = in.kind == SignalKind::Tokens;
  if (s.tokens) {
    s.token_names = names("lstm_engine.tokens");
    LSTM_REQUIRE(static_cast<int64_t>(s.token_names.size()) == in.features,
                 m.path << ": " << s.token_names.size() << " token names but the model reads " << in.features);
  } else {
    s.features = in.features;
  }
  return s;
}

EvalResult evaluate_model(const std::string& model_path, const std::string& data_path, int64_t batch_size,
                          int64_t seq_len, const Placement& placement, bool allow_nonfinite) {
  checked_size(batch_size, 0, kMaxDim, "evaluation batch size");
  checked_size(seq_len, 0, kMaxDim, "evaluation sequence length");
  TrainedModel m = load_trained_model(model_path, placement, allow_nonfinite);
  if (batch_size == 0) batch_size = m.config["train"]["batch_size"].get<int64_t>();
  if (seq_len == 0) seq_len = m.config["train"]["seq_len"].get<int64_t>();
  std::unique_ptr<Task> d;
  if (data_path.empty()) {
    d = make_task(m.config);
    // The split is the one training held out only when the data is still the same.
    d->adopt_model_metadata(m.meta, m.path);
  } else {
    d = make_eval_task(m, data_path);
  }
  EvalResult r = run_eval(m.model, *d, batch_size, seq_len, 0);
  LSTM_REQUIRE(r.count > 0, "nothing to evaluate: " << d->description() << " has no complete window of " << seq_len
                                                   << " steps (try a smaller --seq-len)");
  return r;
}

std::string generate_text(const std::string& model_path, const std::string& prime, int64_t length, double temperature,
                          uint64_t seed, const Placement& placement, bool allow_nonfinite) {
  checked_size(length, 0, kMaxDim, "generated length");
  std::string mp = resolve_model_path(model_path);
  TrainedModel m;
  m.path = mp;
  m.model = load_model(mp, &m.meta, DType::F32, allow_nonfinite);
  m.model.place(placement);
  const Vocab vocab = stored_vocab(m);
  Rng rng(seed);
  return sample_text(m.model, vocab, prime, length, temperature, rng);
}

}  // namespace lstm
