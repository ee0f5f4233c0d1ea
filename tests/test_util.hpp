// Helpers shared by the end-to-end tests: scratch folders, running the `lstm` program, and the
// small training tasks several tests train on.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/train.hpp"

namespace lstm::testing {

// A fresh folder in the system's temporary directory, unique per process.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / (prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct CliRun {
  int code;
  std::string out;
};

// Runs the `lstm` program (LSTM_CLI_PATH) with a shell, capturing stdout and stderr together.
inline CliRun run_cli(const std::string& args) {
  std::string cmd = std::string(LSTM_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Label = which of two tokens ("a" or "b") occurs more often; sequences of 3..12 tokens drawn
// from {a, b, c} ("c" is noise). Needs counting over variable lengths.
inline void write_majority_csv(const std::filesystem::path& p, int rows, uint64_t seed) {
  Rng rng(seed);
  std::ofstream f(p);
  f << "id,sequence,label\n";
  for (int r = 0; r < rows; ++r) {
    int len = 3 + static_cast<int>(rng.below(10));
    int na = 0, nb = 0;
    std::string s;
    for (int t = 0; t < len; ++t) {
      uint64_t k = rng.below(3);
      if (k == 0) ++na;
      if (k == 1) ++nb;
      if (t) s += ' ';
      s += k == 0 ? 'a' : k == 1 ? 'b' : 'c';
    }
    if (na == nb) {
      s += " a";
      ++na;
    }
    f << r << "," << s << "," << (na > nb ? "more_a" : "more_b") << "\n";
  }
}

// A character LM on a small text in `dir` whose SGD learning rate explodes (x1e30 every 5 steps)
// so that the loss turns non-finite after a few checkpoints.
inline nlohmann::json exploding_lr_config(const std::filesystem::path& dir) {
  {
    std::ofstream f(dir / "text.txt");
    for (int i = 0; i < 100; ++i) f << "abcdefghij klmnop " << i << "\n";
  }
  return {{"task", "charlm"},
          {"data", {{"path", (dir / "text.txt").string()}}},
          {"model", {{"embedding_dim", 4}, {"layers", {{{"type", "lstm"}, {"hidden_size", 8}}, {{"type", "dense"}}}}}},
          {"train",
           {{"steps", 200},
            {"batch_size", 4},
            {"seq_len", 8},
            {"eval_every", 0},
            {"checkpoint_every", 5},
            {"clip_grad_norm", 0},
            {"optimizer", {{"type", "sgd"}}},
            {"schedule", {{"type", "step"}, {"lr", 1.0}, {"step_size", 5}, {"gamma", 1e30}}}}}};
}

// The PyTorch golden files tests/fixtures/lstm_*.safetensors (scripts/make_fixtures.py), sorted.
inline std::vector<std::filesystem::path> lstm_fixture_files() {
  namespace fs = std::filesystem;
  std::vector<fs::path> r;
  if (fs::is_directory(LSTM_FIXTURE_DIR))
    for (auto& e : fs::directory_iterator(LSTM_FIXTURE_DIR))
      if (e.path().filename().string().rfind("lstm_", 0) == 0 && e.path().extension() == ".safetensors")
        r.push_back(e.path());
  std::sort(r.begin(), r.end());
  return r;
}

// Splits a golden file into what `lstm forward` reads: dir/m.safetensors (the nn.LSTM
// state_dict) and dir/x.safetensors (input, lengths, h0, c0). Returns the LSTM's spec.
inline LstmSpec write_forward_inputs(const SafetensorsFile& g, const std::filesystem::path& dir) {
  std::map<std::string, Shape> shapes;
  for (auto& [k, v] : g.tensors) shapes[k] = v.shape();
  LstmSpec spec = LstmSpec::infer(shapes);
  std::map<std::string, Tensor> model, input;
  for (const auto& n : spec.param_names()) model[n] = g.tensors.at(n);
  for (const char* k : {"input", "lengths", "h0", "c0"})
    if (g.tensors.count(k)) input[k] = g.tensors.at(k);
  write_safetensors((dir / "m.safetensors").string(), model);
  write_safetensors((dir / "x.safetensors").string(), input);
  return spec;
}

// A whole file's bytes ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// resolve_train_config's error message for a configuration, "(no error)" when it is accepted.
inline std::string config_error(const nlohmann::json& j) {
  try {
    resolve_train_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace lstm::testing
