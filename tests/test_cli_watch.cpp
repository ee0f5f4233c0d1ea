// End-to-end tests of watching a run through the `lstm` program: metrics.jsonl, its continuity
// after a kill and resume, `lstm plot`, the ETA and early stopping on the command line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "png_decode.hpp"
#include "test_util.hpp"

extern char** environ;

using ::testing::HasSubstr;
using lstm::testing::CliRun;
using lstm::testing::run_cli;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return lstm::testing::temp_dir("lstm_cli_watch", name); }

using lstm::testing::read_file;

// Every line of metrics.jsonl, parsed (a line that does not parse fails the test unless
// `while_running`: a reader may catch a line being written).
std::vector<nlohmann::json> records(const fs::path& run, bool while_running = false) {
  std::vector<nlohmann::json> r;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(while_running || !j.is_discarded()) << "not JSON: " << line;
    if (!j.is_discarded()) r.push_back(j);
  }
  return r;
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& recs, const std::string& kind) {
  std::vector<int64_t> s;
  for (const auto& r : recs)
    if (r["kind"] == kind) s.push_back(r["step"].get<int64_t>());
  return s;
}

fs::path write_text_file(const fs::path& d) {
  std::ofstream f(d / "text.txt");
  for (int i = 0; i < 200; ++i) f << "to be or not to be, that is the question " << i << "\n";
  return d / "text.txt";
}

}  // namespace

TEST(CliWatch, MetricsFileEtaEarlyStoppingAndPlot) {
  fs::path d = temp_dir("metrics");
  std::ofstream(d / "cfg.json") << R"({"task": "charlm", "data": {"path": ")" << write_text_file(d).string() << R"("},
    "model": {"embedding_dim": 4, "layers": [{"type": "lstm", "hidden_size": 16}, {"type": "dense"}]},
    "train": {"steps": 40, "batch_size": 4, "seq_len": 16, "log_every": 5, "eval_every": 10, "checkpoint_every": 10,
              "eval_batches": 4, "sample_length": 0,
              "early_stopping": {"patience": 1, "min_delta": 100}}})";
  const fs::path run = d / "run";
  CliRun r = run_cli("train --threads 1 --config " + (d / "cfg.json").string() + " --out " + run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  // No ETA before a step was measured past the warm-up; one from then on.
  EXPECT_THAT(r.out, HasSubstr("step 5/40 [==="));
  EXPECT_THAT(r.out, HasSubstr("| ETA ?\n"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("step 10/40 .* ETA [0-9]+s\n"));
  // Nothing after the first evaluation beats it by 100: patience 1 stops at the second.
  EXPECT_THAT(r.out, HasSubstr("early stopping at step 20: valid_loss has not improved by more than 100 for 1 evaluation(s)"));
  EXPECT_THAT(r.out, HasSubstr("trained 20 steps (stopped early)"));
  EXPECT_THAT(r.out, HasSubstr("model: " + run.string() + "/model.safetensors = the best by valid_loss ("));
  EXPECT_THAT(r.out, HasSubstr(" at step 10); checkpoint: " + run.string() + "/checkpoints/step-00000020"));

  const auto recs = records(run);
  EXPECT_EQ(steps_of(recs, "train"), (std::vector<int64_t>{5, 10, 15, 20}));
  EXPECT_EQ(steps_of(recs, "eval"), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(steps_of(recs, "early_stop"), (std::vector<int64_t>{20}));
  double elapsed = 0;
  for (const auto& rec : recs) {
    ASSERT_TRUE(rec["elapsed_s"].is_number()) << rec;
    EXPECT_GE(rec["elapsed_s"].get<double>(), elapsed);
    elapsed = rec["elapsed_s"];
    if (rec["kind"] == "train") {
      for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_s"}) EXPECT_TRUE(rec[k].is_number()) << k << ": " << rec;
      EXPECT_GT(rec["loss"].get<double>(), 0);
      EXPECT_GT(rec["tokens_per_s"].get<double>(), 0);
    }
    if (rec["kind"] == "eval") {
      EXPECT_GT(rec["valid_loss"].get<double>(), 0);
      EXPECT_GE(rec["valid_accuracy"].get<double>(), 0);
      EXPECT_LE(rec["valid_accuracy"].get<double>(), 1);
      EXPECT_EQ(rec["best_step"], 10);
    }
  }
  // In the order things happened.
  std::vector<std::string> order;
  for (const auto& rec : recs) order.push_back(rec["kind"].get<std::string>() + " " + rec["step"].dump());
  EXPECT_EQ(order, (std::vector<std::string>{"train 5", "train 10", "eval 10", "train 15", "train 20", "eval 20",
                                             "early_stop 20"}));

  // lstm plot: a valid PNG of the stated size with every curve's colour.
  CliRun p = run_cli("plot --run " + run.string());
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_THAT(p.out, HasSubstr("wrote " + run.string() + "/curves.png (800x560): 4 training lines, 2 evaluations"));
  const std::string bytes = read_file(run / "curves.png");
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  const auto png = lstm::testing::decode_png(bytes);
  ASSERT_EQ(png.error, "");
  EXPECT_EQ(png.width, 800u);
  EXPECT_EQ(png.height, 560u);
  for (std::array<uint8_t, 3> c : {std::array<uint8_t, 3>{31, 119, 180}, {255, 127, 14}, {44, 160, 44},
                                   {148, 103, 189}, {214, 39, 40}})
    EXPECT_TRUE(png.has_colour(c)) << int(c[0]) << "," << int(c[1]) << "," << int(c[2]);
  CliRun o = run_cli("plot --run " + run.string() + " --output " + (d / "other.png").string());
  EXPECT_EQ(o.code, 0) << o.out;
  EXPECT_EQ(lstm::testing::decode_png(read_file(d / "other.png")).error, "");
  CliRun none = run_cli("plot --run " + d.string());
  EXPECT_EQ(none.code, 1);
  EXPECT_THAT(none.out, HasSubstr("lstm: error: " + d.string() + "/metrics.jsonl does not exist"));
  CliRun missing = run_cli("plot");
  EXPECT_NE(missing.code, 0);
  EXPECT_THAT(missing.out, HasSubstr("--run"));
  fs::remove_all(d);
}

TEST(CliWatch, ClassifierRecordsSamplesPerSecond) {
  fs::path d = temp_dir("classify");
  lstm::testing::write_majority_csv(d / "data.csv", 200, 3);
  std::ofstream(d / "cfg.json") << R"({"task": "classify", "data": {"path": ")" << (d / "data.csv").string() << R"("},
    "model": {"embedding_dim": 4, "layers": [{"type": "lstm", "hidden_size": 8}, {"type": "last_step"}, {"type": "dense"}]},
    "train": {"steps": 6, "batch_size": 8, "log_every": 3, "eval_every": 3, "checkpoint_every": 0,
              "early_stopping": {"metric": "valid_accuracy"}, "final_model": "last"}})";
  CliRun r = run_cli("train --threads 1 --config " + (d / "cfg.json").string() + " --out " + (d / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("model: " + (d / "run").string() + "/model.safetensors = the last step's weights (step 6)"));
  const auto recs = records(d / "run");
  EXPECT_EQ(steps_of(recs, "train"), (std::vector<int64_t>{3, 6}));
  for (const auto& rec : recs)
    if (rec["kind"] == "train") {
      EXPECT_TRUE(rec["samples_per_s"].is_number()) << rec;
      EXPECT_FALSE(rec.contains("tokens_per_s")) << rec;
    }
  fs::remove_all(d);
}

TEST(CliWatch, KilledRunResumesToAContinuousMetricsFile) {
  fs::path d = temp_dir("kill");
  // Far more steps than the test lets it run; evaluations and checkpoints at other periods.
  std::ofstream(d / "cfg.json") << R"({"task": "charlm", "data": {"path": ")" << write_text_file(d).string() << R"("},
    "model": {"embedding_dim": 3, "layers": [{"type": "lstm", "hidden_size": 4}, {"type": "dense"}]},
    "train": {"steps": 10000000, "batch_size": 2, "seq_len": 8, "log_every": 1, "eval_every": 5, "eval_batches": 1,
              "checkpoint_every": 7, "sample_length": 0}})";
  const fs::path run = d / "run";
  const std::string cli = LSTM_CLI_PATH;
  std::vector<std::string> args = {cli, "train", "--threads", "1", "--config", (d / "cfg.json").string(), "--out",
                                   run.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, cli.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  // Kill it hard once metrics.jsonl has lines past the second checkpoint.
  auto t0 = std::chrono::steady_clock::now();
  int64_t ck = -1;
  for (;;) {
    std::string latest;
    std::ifstream(run / "checkpoints" / "latest") >> latest;
    ck = latest.rfind("step-", 0) == 0 ? std::stoll(latest.substr(5)) : -1;
    const auto recs = records(run, true);
    if (ck >= 14 && !recs.empty() && recs.back()["step"].get<int64_t>() > ck + 3) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st));
  // As if the kill had come in the middle of a write.
  std::ofstream(run / "metrics.jsonl", std::ios::app) << R"({"kind": "train", "step": 99)";
  std::string latest;
  std::ifstream(run / "checkpoints" / "latest") >> latest;
  const int64_t at = std::stoll(latest.substr(5)), end = at + 12;
  CliRun res = run_cli("train --threads 1 --resume --out " + run.string() + " --steps " + std::to_string(end));
  ASSERT_EQ(res.code, 0) << res.out;
  EXPECT_THAT(res.out, HasSubstr("metrics.jsonl: dropped "));
  // One record per logged step, one per evaluation, in order, no step twice.
  const auto recs = records(run);
  std::vector<int64_t> want_train, want_eval;
  for (int64_t s = 1; s <= end; ++s) want_train.push_back(s);
  for (int64_t s = 5; s <= end; s += 5) want_eval.push_back(s);
  if (end % 5) want_eval.push_back(end);
  EXPECT_EQ(steps_of(recs, "train"), want_train);
  EXPECT_EQ(steps_of(recs, "eval"), want_eval);
  int64_t prev = 0;
  for (const auto& rec : recs) {
    EXPECT_GE(rec["step"].get<int64_t>(), prev) << rec;
    prev = rec["step"];
  }
  const std::string text = read_file(run / "metrics.jsonl");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  fs::remove_all(d);
}
