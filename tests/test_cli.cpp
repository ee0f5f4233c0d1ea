// End-to-end tests of the `lstm` program: forward on golden fixtures, kill-and-resume training,
// and clear errors for bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "lstm/lstm.hpp"
#include "lstm/safetensors.hpp"
#include "test_util.hpp"

extern char** environ;

using namespace lstm;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

namespace {

using lstm::testing::CliRun;
using lstm::testing::run_cli;

fs::path temp_dir(const std::string& name) { return lstm::testing::temp_dir("lstm_cli", name); }

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::vector<fs::path> fixtures() { return lstm::testing::lstm_fixture_files(); }

std::map<std::string, Tensor> random_state_dict(const LstmSpec& s, Rng& rng) {
  std::map<std::string, Tensor> model;
  for (const auto& n : s.param_names()) {
    model[n] = Tensor::empty(s.param_shape(n), DType::F32);
    rng.fill_normal(model[n], 0, 0.3);
  }
  return model;
}

// Starts `lstm train --threads 1 --config CFG --out RUN` in the background with its stdout and
// stderr in `log`; returns its pid (-1 if it could not be started).
pid_t spawn_train(const fs::path& cfg, const fs::path& run, const fs::path& log) {
  std::string cli = LSTM_CLI_PATH;
  std::vector<std::string> args = {cli, "train", "--threads", "1", "--config", cfg.string(), "--out", run.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, cli.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

}  // namespace

TEST(Cli, ForwardMatchesPyTorchGoldenFiles) {
  auto files = fixtures();
  ASSERT_FALSE(files.empty()) << "no golden fixtures in " << LSTM_FIXTURE_DIR << " (make them with scripts/make_fixtures.py)";
  fs::path d = temp_dir("forward");
  int checked = 0;
  for (const auto& f : files) {
    SafetensorsFile g = read_safetensors(f.string());
    if (g.metadata.count("batch_first") && g.metadata.at("batch_first") == "1") continue;  // CLI input is [T, B, I]
    lstm::testing::write_forward_inputs(g, d);
    CliRun r = run_cli("forward --model " + (d / "m.safetensors").string() + " --input " + (d / "x.safetensors").string() +
                    " --output " + (d / "y.safetensors").string());
    ASSERT_EQ(r.code, 0) << f << "\n" << r.out;
    SafetensorsFile y = read_safetensors((d / "y.safetensors").string());
    const double tol = g.tensors.at("input").dtype() == DType::F64 ? 1e-10 : 1e-5;
    for (const char* k : {"output", "h_n", "c_n"}) {
      EXPECT_EQ(y.tensors.at(k).dtype(), g.tensors.at("input").dtype()) << f << " " << k;
      EXPECT_LT(rel_l2_error(y.tensors.at(k), g.tensors.at(k)), tol) << f << " " << k;
    }
    // Reduced precision: bf16 storage, f32 compute, within DESIGN.md's bf16 tolerance.
    CliRun rb = run_cli("forward --dtype bf16 --model " + (d / "m.safetensors").string() + " --input " +
                     (d / "x.safetensors").string() + " --output " + (d / "yb.safetensors").string());
    ASSERT_EQ(rb.code, 0) << rb.out;
    SafetensorsFile yb = read_safetensors((d / "yb.safetensors").string());
    EXPECT_EQ(yb.tensors.at("output").dtype(), DType::BF16);
    EXPECT_LT(rel_l2_error(yb.tensors.at("output"), g.tensors.at("output")), 2e-2) << f;
    ++checked;
  }
  EXPECT_GT(checked, 3);
  fs::remove_all(d);
}

// A model's state_dict (lstm.weight_ih_l0, fc.weight, ...) runs like a bare nn.LSTM's: its only
// LSTM is found, or --prefix picks one of several; the results equal the bare file's.
TEST(Cli, ForwardFindsTheLstmOfAModelStateDict) {
  fs::path d = temp_dir("prefix");
  LstmSpec s{.input_size = 3, .hidden_size = 4};
  Rng rng(7);
  const std::map<std::string, Tensor> bare = random_state_dict(s, rng);
  std::map<std::string, Tensor> model{{"fc.weight", Tensor::zeros({2, 4})}}, two;
  for (const auto& [k, v] : bare) model["lstm." + k] = two["enc." + k] = two["dec." + k] = v;
  write_safetensors((d / "bare.safetensors").string(), bare);
  write_safetensors((d / "model.safetensors").string(), model);
  write_safetensors((d / "two.safetensors").string(), two);
  Tensor x = Tensor::empty({5, 2, 3}, DType::F32);
  rng.fill_normal(x, 0, 1);
  write_safetensors((d / "x.safetensors").string(), {{"input", x}});
  auto fwd = [&](const std::string& m, const std::string& out, const std::string& extra = "") {
    return run_cli("forward --model " + (d / m).string() + " --input " + (d / "x.safetensors").string() + " --output " +
                   (d / out).string() + " " + extra);
  };
  ASSERT_EQ(fwd("bare.safetensors", "y0.safetensors").code, 0);
  const Tensor want = read_safetensors((d / "y0.safetensors").string()).tensors.at("output");
  for (const auto& [m, extra] : std::vector<std::pair<std::string, std::string>>{
           {"model.safetensors", ""}, {"model.safetensors", "--prefix lstm"}, {"two.safetensors", "--prefix dec."}}) {
    CliRun r = fwd(m, "y1.safetensors", extra);
    ASSERT_EQ(r.code, 0) << m << " " << extra << "\n" << r.out;
    EXPECT_EQ(rel_l2_error(read_safetensors((d / "y1.safetensors").string()).tensors.at("output"), want), 0) << m;
  }
  CliRun several = fwd("two.safetensors", "y2.safetensors");
  EXPECT_EQ(several.code, 1);
  EXPECT_THAT(several.out, HasSubstr("holds 2 LSTMs ('dec.weight_ih_l0', 'enc.weight_ih_l0'): choose one with --prefix"));
  CliRun wrong = fwd("model.safetensors", "y2.safetensors", "--prefix encoder");
  EXPECT_THAT(wrong.out, HasSubstr("--prefix encoder.: no tensor 'encoder.weight_ih_l0' (nn.LSTM weights found: "
                                   "'lstm.weight_ih_l0')"));
  fs::remove_all(d);
}

TEST(Cli, ForwardBadInputsGiveClearErrors) {
  fs::path d = temp_dir("badfwd");
  LstmSpec s{.input_size = 3, .hidden_size = 4};
  Rng rng(1);
  std::map<std::string, Tensor> model = random_state_dict(s, rng);
  write_safetensors((d / "m.safetensors").string(), model);
  Tensor x = Tensor::empty({5, 2, 3}, DType::F32);
  rng.fill_normal(x, 0, 1);
  auto fwd = [&](const std::map<std::string, Tensor>& in, const std::string& extra = "") {
    write_safetensors((d / "x.safetensors").string(), in);
    return run_cli("forward --model " + (d / "m.safetensors").string() + " --input " + (d / "x.safetensors").string() +
                   " --output " + (d / "y.safetensors").string() + " " + extra);
  };
  CliRun ok = fwd({{"input", x}});
  EXPECT_EQ(ok.code, 0) << ok.out;
  CliRun wrong = fwd({{"input", Tensor::zeros({5, 2, 4})}});
  EXPECT_NE(wrong.code, 0);
  EXPECT_THAT(wrong.out, HasSubstr("input_size=3"));
  CliRun len0 = fwd({{"input", x}, {"lengths", Tensor::from_vector<int64_t>({2}, {0, 5})}});
  EXPECT_THAT(len0.out, HasSubstr("lengths[0] must be in [1, 5], got 0"));
  CliRun len6 = fwd({{"input", x}, {"lengths", Tensor::from_vector<int64_t>({2}, {6, 5})}});
  EXPECT_THAT(len6.out, HasSubstr("got 6"));
  CliRun h0 = fwd({{"input", x}, {"h0", Tensor::zeros({1, 3, 4})}});
  EXPECT_THAT(h0.out, HasSubstr("h0 must be [1, 2, 4], got [1, 3, 4]"));
  CliRun dt = fwd({{"input", x}}, "--dtype f8");
  EXPECT_THAT(dt.out, HasSubstr("--dtype must be one of"));
  CliRun dev = fwd({{"input", x}}, "--device tpu");
  EXPECT_NE(dev.code, 0);
  // Truncated model file.
  std::ifstream mf(d / "m.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(mf)), {});
  write_text(d / "trunc.safetensors", bytes.substr(0, bytes.size() - 7));
  CliRun tr = run_cli("forward --model " + (d / "trunc.safetensors").string() + " --input " + (d / "x.safetensors").string() +
                   " --output " + (d / "y.safetensors").string());
  EXPECT_EQ(tr.code, 1);
  EXPECT_THAT(tr.out, HasSubstr("trunc.safetensors"));
  // A file that is not an LSTM state_dict.
  write_safetensors((d / "other.safetensors").string(), {{"fc.weight", Tensor::zeros({2, 2})}});
  CliRun ot = run_cli("forward --model " + (d / "other.safetensors").string() + " --input " + (d / "x.safetensors").string() +
                   " --output " + (d / "y.safetensors").string());
  EXPECT_THAT(ot.out, HasSubstr("weight_ih_l0"));
  fs::remove_all(d);
}

TEST(Cli, KilledTrainingResumesToTheSameParameters) {
  fs::path d = temp_dir("kill");
  {
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 400; ++i) f << "to be or not to be, that is the question " << i * 7 << "\n";
  }
  std::ofstream(d / "cfg.json") << R"({"task": "charlm", "data": {"path": ")" << (d / "text.txt").string() << R"("},
    "model": {"embedding_dim": 8, "layers": [{"type": "lstm", "hidden_size": 48, "num_layers": 2}, {"type": "dense"}]},
    "train": {"steps": 150, "batch_size": 16, "seq_len": 32, "eval_every": 50, "checkpoint_every": 10,
              "sample_length": 0, "log_every": 10}})";
  const std::string base = "train --threads 1 --config " + (d / "cfg.json").string() + " --out ";
  CliRun full = run_cli(base + (d / "full").string());
  ASSERT_EQ(full.code, 0) << full.out;
  EXPECT_THAT(full.out, HasSubstr("ETA"));
  EXPECT_THAT(full.out, HasSubstr("tok/s"));

  // Start the same run, kill it hard once a checkpoint exists, then resume.
  fs::path run = d / "killed";
  const pid_t pid = spawn_train(d / "cfg.json", run, "/dev/null");
  ASSERT_GT(pid, 0);
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(run / "checkpoints" / "latest") && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGKILL);
  int st;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the run finished before it could be killed";
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
  CliRun res = run_cli("train --threads 1 --resume --out " + run.string());
  ASSERT_EQ(res.code, 0) << res.out;
  EXPECT_THAT(res.out, HasSubstr("resuming from"));
  auto a = read_safetensors((d / "full" / "model.safetensors").string());
  auto b = read_safetensors((run / "model.safetensors").string());
  for (auto& [k, v] : a.tensors) EXPECT_EQ(max_abs_diff(v, b.tensors.at(k)), 0.0) << k;

  // eval, generate and info work on the run folder; a checkpoint from another architecture is refused.
  CliRun ev = run_cli("eval --model " + run.string());
  // --batch-size 0 means the training batch size; below that is refused.
  CliRun ev0 = run_cli("eval --batch-size -1 --model " + run.string());
  EXPECT_EQ(ev0.code, 1);
  EXPECT_THAT(ev0.out, HasSubstr("--batch-size: expected an integer in [0, 2147483647], got -1"));
  CliRun evl = run_cli("eval --seq-len 100000 --model " + run.string());
  EXPECT_EQ(evl.code, 1);
  EXPECT_THAT(evl.out, HasSubstr("nothing to evaluate"));
  EXPECT_EQ(ev.code, 0) << ev.out;
  EXPECT_THAT(ev.out, HasSubstr("accuracy"));
  CliRun gen = run_cli("generate --model " + run.string() + " --prime 'to be' --length 20");
  EXPECT_EQ(gen.code, 0) << gen.out;
  EXPECT_GE(gen.out.size(), 25u);
  CliRun info = run_cli("info --model " + run.string());
  EXPECT_THAT(info.out, HasSubstr("LSTM(8, 48, num_layers=2)"));
  EXPECT_THAT(info.out, HasSubstr("reference"));
  fs::remove_all(d);
}

// SIGINT/SIGTERM: the run finishes its step, checkpoints there, says how to resume and exits
// with 128 + the signal; the resume continues from that step.
TEST(Cli, SignalStopsAfterTheStepWithACheckpointAndResumes) {
  fs::path d = temp_dir("signal");
  std::ofstream(d / "text.txt") << std::string(300, 'a') + "the quick brown fox jumps over the lazy dog\n";
  // Far more steps than the test waits for, and no periodic checkpoint: any checkpoint is the stop's.
  write_text(d / "cfg.json", R"({"task": "charlm", "data": {"path": ")" + (d / "text.txt").string() +
                                 R"("}, "model": {"embedding_dim": 3, "layers": [{"type": "lstm", "hidden_size": 4},
                                 {"type": "dense"}]}, "train": {"steps": 10000000, "batch_size": 2, "seq_len": 8,
                                 "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "sample_length": 0}})");
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const fs::path run = d / ("run" + std::to_string(sig)), log = d / ("log" + std::to_string(sig));
    const std::string cli = LSTM_CLI_PATH;
    const pid_t pid = spawn_train(d / "cfg.json", run, log);
    ASSERT_GT(pid, 0);
    auto read_log = [&] {
      std::ifstream f(log);
      return std::string((std::istreambuf_iterator<char>(f)), {});
    };
    // Stepping has begun once the third step is logged.
    auto t0 = std::chrono::steady_clock::now();
    while (read_log().find("step 3/") == std::string::npos && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    const std::string out = read_log();
    ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0) << "\n" << out;
    EXPECT_EQ(WEXITSTATUS(st), 128 + sig) << out;
    std::string latest;
    std::ifstream(run / "checkpoints" / "latest") >> latest;
    ASSERT_EQ(latest.rfind("step-", 0), 0u) << out;
    const int64_t at = std::stoll(latest.substr(5));
    EXPECT_GE(at, 3);
    EXPECT_TRUE(fs::exists(run / "checkpoints" / latest / "trainer.safetensors"));
    EXPECT_THAT(out, HasSubstr("after step " + std::to_string(at)));
    EXPECT_THAT(out, HasSubstr("checkpoint " + (run / "checkpoints" / latest).string() + "\n"));
    EXPECT_THAT(out, HasSubstr(std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + "; resume with: " +
                               cli + " train --resume --out " + run.string() + " --threads 1\n"));
    CliRun res = run_cli("train --threads 1 --resume --out " + run.string() + " --steps " + std::to_string(at + 2));
    ASSERT_EQ(res.code, 0) << res.out;
    EXPECT_THAT(res.out, HasSubstr("resuming from " + (run / "checkpoints" / latest).string() + " at step " + std::to_string(at)));
    EXPECT_THAT(res.out, HasSubstr("trained " + std::to_string(at + 2) + " steps"));
  }
  fs::remove_all(d);
}

// A second signal during the step the first one lets finish ends the program at once: killed by
// that signal, no checkpoint written. The steps are slow (hidden 1024, 64 steps of 16 sequences
// on one thread), so the signals land inside the step the first one interrupts.
TEST(Cli, SecondSignalEndsTheProgramAtOnce) {
  fs::path d = temp_dir("signal2");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "the quick brown fox jumps over the lazy dog\n";
  std::ofstream(d / "text.txt") << text;
  write_text(d / "cfg.json", R"({"task": "charlm", "data": {"path": ")" + (d / "text.txt").string() +
                                 R"("}, "model": {"embedding_dim": 8, "layers": [{"type": "lstm", "hidden_size": 1024},
                                 {"type": "dense"}]}, "train": {"steps": 1000, "batch_size": 16, "seq_len": 64,
                                 "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "sample_length": 0}})");
  const fs::path run = d / "run", log = d / "log";
  const pid_t pid = spawn_train(d / "cfg.json", run, log);
  ASSERT_GT(pid, 0);
  auto t0 = std::chrono::steady_clock::now();
  while (lstm::testing::read_file(log).find("step 1/") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // The first signal, then more every 5 ms until the program ends: a signal sent while the first
  // is still pending would merge into it, so the first one handled is followed by another.
  int st = 0, sent = 0;
  for (pid_t w = 0; w == 0; w = ::waitpid(pid, &st, WNOHANG)) {
    if (sent < 400) ::kill(pid, SIGINT), ++sent;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string out = lstm::testing::read_file(log);
  ASSERT_TRUE(WIFSIGNALED(st)) << "exited with " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1) << "\n" << out;
  EXPECT_EQ(WTERMSIG(st), SIGINT) << out;
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "latest")) << out;
  EXPECT_THAT(out, Not(HasSubstr("resume with")));
  fs::remove_all(d);
}

TEST(Cli, ResumeWithoutCheckpointAndBadConfigAreClear) {
  fs::path d = temp_dir("badtrain");
  CliRun r = run_cli("train --resume --out " + (d / "nothing").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("no checkpoint to resume from"));
  write_text(d / "bad.json", "{\"task\": \"charlm\",");
  CliRun b = run_cli("train --config " + (d / "bad.json").string());
  EXPECT_THAT(b.out, HasSubstr("not valid JSON"));
  write_text(d / "tok.csv", "label,sequence\n0,a b\n1,b a\n");
  write_text(d / "cfg.json", "{\"task\": \"charlm\", \"data\": {\"path\": \"/nonexistent/file.txt\"}}");
  CliRun m = run_cli("train --config " + (d / "cfg.json").string() + " --out " + (d / "o").string());
  CliRun rc = run_cli("train --resume --config " + (d / "cfg.json").string() + " --out " + (d / "o").string());
  EXPECT_EQ(rc.code, 1);
  EXPECT_THAT(rc.out, HasSubstr("do not give --config or --data"));
  write_text(d / "typed.json", "{\"train\": 5}");
  CliRun ty = run_cli("train --config " + (d / "typed.json").string() + " --out " + (d / "o").string());
  EXPECT_THAT(ty.out, HasSubstr("'train' must be an object"));
  EXPECT_EQ(m.code, 1);
  EXPECT_THAT(m.out, HasSubstr("/nonexistent/file.txt"));
  CliRun g = run_cli("train --cuda-graphs always --out " + (d / "o").string());
  EXPECT_EQ(g.code, 1);
  EXPECT_THAT(g.out, HasSubstr("--cuda-graphs: expected auto, on or off, got 'always'"));
  fs::remove_all(d);
}

// ---- Hardening: small hostile files and flags end as errors naming what was wrong ----

namespace {

// A tiny character model trained for two steps: a model file for eval/generate/info.
fs::path tiny_run(const fs::path& d) {
  std::ofstream(d / "text.txt") << std::string(400, 'a') + "the quick brown fox\n";
  write_text(d / "tiny.json", R"({"task": "charlm", "data": {"path": ")" + (d / "text.txt").string() +
                                  R"("}, "model": {"embedding_dim": 3, "layers": [{"type": "lstm", "hidden_size": 4},
                                  {"type": "dense"}]}, "train": {"steps": 2, "batch_size": 2, "seq_len": 8,
                                  "sample_length": 0, "checkpoint_every": 1}})");
  CliRun r = run_cli("train --config " + (d / "tiny.json").string() + " --out " + (d / "run").string());
  EXPECT_EQ(r.code, 0) << r.out;
  return d / "run";
}

}  // namespace

TEST(Cli, DeeplyNestedFilesAreErrorsNotCrashes) {
  fs::path d = temp_dir("deep");
  const std::string deep = std::string(300'000, '[') + std::string(300'000, ']');
  std::string h = R"({"weight_ih_l0": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})";
  std::string n(8, '\0');
  for (int i = 0; i < 8; ++i) n[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  write_text(d / "deep.safetensors", n + h);
  for (const std::string& cmd :
       {"info --model " + (d / "deep.safetensors").string(),
        "forward --model " + (d / "deep.safetensors").string() + " --input " + (d / "deep.safetensors").string() +
            " --output " + (d / "y.safetensors").string()}) {
    CliRun r = run_cli(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("deep.safetensors': header nests deeper than 64 levels")) << cmd;
  }
  write_text(d / "deep.json", "{\"task\": " + deep + "}");
  CliRun c = run_cli("train --config " + (d / "deep.json").string() + " --out " + (d / "o").string());
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_THAT(c.out, HasSubstr("--config " + (d / "deep.json").string() + " nests deeper than 64 levels"));
  fs::remove_all(d);
}

TEST(Cli, FifoAsModelOrInputIsRefusedNotWaitedOn) {
  fs::path d = temp_dir("fifo");
  ASSERT_EQ(::mkfifo((d / "pipe").c_str(), 0600), 0);
  // The background kill turns a hang into a failure instead of a stuck test.
  for (const std::string& cmd :
       {"forward --model " + (d / "pipe").string() + " --input " + (d / "pipe").string() + " --output " +
            (d / "y.safetensors").string(),
        "info --model " + (d / "pipe").string(), "train --config " + (d / "pipe").string()}) {
    CliRun r = run_cli(cmd + " 2>&1 & P=$!; (sleep 20; kill $P) >/dev/null 2>&1 & wait $P");
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("not a regular file: expected a file, got a FIFO")) << cmd;
  }
  fs::remove_all(d);
}

TEST(Cli, OversizedSizesNameTheFieldTheValueAndTheLimit) {
  fs::path d = temp_dir("sizes");
  std::ofstream(d / "text.txt") << std::string(300, 'x') << "\n";
  auto train_with = [&](const std::string& model, const std::string& train) {
    write_text(d / "c.json", R"({"task": "charlm", "data": {"path": ")" + (d / "text.txt").string() +
                                 R"("}, "model": )" + model + R"(, "train": )" + train + "}");
    return run_cli("train --config " + (d / "c.json").string() + " --out " + (d / "o").string());
  };
  const std::string lstm_dense = R"({"layers": [{"type": "lstm", "hidden_size": 4}, {"type": "dense"}]})";
  struct Case {
    std::string model, train, expect;
  };
  const std::vector<Case> cases = {
      {R"({"layers": [{"type": "lstm", "hidden_size": 4611686018427387904}, {"type": "dense"}]})", "{}",
       "'model.layers[0]': layer JSON {\"hidden_size\":4611686018427387904,\"type\":\"lstm\"}: field \"hidden_size\" "
       "must be an integer in [1, 2147483647], got 4611686018427387904"},
      {R"({"layers": [{"type": "lstm", "hidden_size": 2305843009213693952}, {"type": "dense"}]})", "{}",
       "got 2305843009213693952"},
      {R"({"layers": [{"type": "lstm", "hidden_size": 4}, {"type": "dense", "out_features": 4611686018427387904}]})",
       "{}", "field \"out_features\" must be an integer in [1, 2147483647]"},
      {R"({"embedding_dim": 4611686018427387904, "layers": [{"type": "lstm", "hidden_size": 4}, {"type": "dense"}]})",
       "{}", "'model.embedding_dim' must be an integer in [1, 2147483647], got 4611686018427387904"},
      {lstm_dense, R"({"batch_size": 4611686018427387904})",
       "'train.batch_size' must be an integer in [1, 2147483647], got 4611686018427387904"},
      {lstm_dense, R"({"seq_len": 9223372036854775807})",
       "'train.seq_len' must be an integer in [1, 2147483647], got 9223372036854775807"},
      {R"({"layers": [{"type": "lstm", "hidden_size": 4, "num_layers": 1000000}, {"type": "dense"}]})", "{}",
       "field \"num_layers\" must be an integer in [1, 1024], got 1000000"},
      {R"({"layers": [{"type": "lstm", "hidden_size": 1000000000}, {"type": "dense"}]})", "{}",
       "the LSTM's parameters and gradients (hidden_size 1000000000, num_layers 1)"},
      {lstm_dense, R"({"batch_size": 2147483647, "steps": 1})", "this training job"},
      {lstm_dense, R"({"threads": "4"})", "'train.threads' must be an integer in [0, 65536], got \"4\""},
  };
  for (const Case& c : cases) {
    CliRun r = train_with(c.model, c.train);
    EXPECT_EQ(r.code, 1) << c.model << c.train << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(c.expect)) << c.model << c.train;
    EXPECT_THAT(r.out, Not(HasSubstr("json.exception")));
  }
  fs::path run = tiny_run(d);
  CliRun e = run_cli("eval --model " + run.string() + " --batch-size 9223372036854775807");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--batch-size: expected an integer in [0, 2147483647], got 9223372036854775807"));
  fs::remove_all(d);
}

TEST(Cli, ForwardRefusesIntegerAndNonFiniteWeightsAndReadsLengthsExactly) {
  fs::path d = temp_dir("fwdtypes");
  LstmSpec s{.input_size = 3, .hidden_size = 4};
  Rng rng(1);
  std::map<std::string, Tensor> model = random_state_dict(s, rng);
  Tensor x = Tensor::empty({5, 2, 3}, DType::F32);
  rng.fill_normal(x, 0, 1);
  const std::string m = (d / "m.safetensors").string(), xi = (d / "x.safetensors").string();
  auto fwd = [&](const std::map<std::string, Tensor>& mdl, const std::map<std::string, Tensor>& in,
                 const std::string& extra = "") {
    write_safetensors(m, mdl);
    write_safetensors(xi, in);
    return run_cli("forward --model " + m + " --input " + xi + " --output " + (d / "y.safetensors").string() + " " + extra);
  };
  auto int_model = model;
  int_model["weight_hh_l0"] = Tensor::zeros(s.param_shape("weight_hh_l0"), DType::I64);
  CliRun wi = fwd(int_model, {{"input", x}});
  EXPECT_EQ(wi.code, 1);
  EXPECT_THAT(wi.out, HasSubstr("m.safetensors: 'weight_hh_l0' must be floating point (F64, F32, BF16, F16), got I64"));
  CliRun hi = fwd(model, {{"input", x}, {"h0", Tensor::zeros({1, 2, 4}, DType::I32)}});
  EXPECT_EQ(hi.code, 1);
  EXPECT_THAT(hi.out, HasSubstr("x.safetensors: 'h0' must be floating point (F64, F32, BF16, F16), got I32"));
  auto nan_model = model;
  nan_model["bias_ih_l0"] = nan_model["bias_ih_l0"].clone();
  nan_model["bias_ih_l0"].set(5, std::nan(""));
  CliRun wn = fwd(nan_model, {{"input", x}});
  EXPECT_EQ(wn.code, 1);
  EXPECT_THAT(wn.out, HasSubstr("'bias_ih_l0' holds nan at flat index 5"));
  EXPECT_THAT(wn.out, HasSubstr("--allow-nonfinite"));
  EXPECT_EQ(fwd(nan_model, {{"input", x}}, "--allow-nonfinite").code, 0);
  CliRun big = fwd(model, {{"input", x}, {"lengths", Tensor::from_vector<int64_t>({2}, {9223372036854775807LL, 5})}});
  EXPECT_EQ(big.code, 1);
  EXPECT_THAT(big.out, HasSubstr("9223372036854775807"));
  EXPECT_THAT(big.out, Not(HasSubstr("-9223372036854775808")));
  fs::remove_all(d);
}

TEST(Cli, NonFiniteModelIsRefusedUnlessAllowed) {
  fs::path d = temp_dir("nanmodel");
  fs::path run = tiny_run(d);
  const std::string mp = (run / "model.safetensors").string();
  SafetensorsFile f = read_safetensors(mp);
  Tensor& w = f.tensors.at("fc.bias");
  w = w.clone();
  w.set(0, std::numeric_limits<double>::infinity());
  write_safetensors(mp, f.tensors, f.metadata);
  CliRun g = run_cli("generate --model " + mp + " --length 5");
  EXPECT_EQ(g.code, 1) << g.out;
  EXPECT_THAT(g.out, HasSubstr(mp + ": parameter 'fc.bias' holds inf at flat index 0"));
  CliRun i = run_cli("info --model " + mp + " --allow-nonfinite");
  EXPECT_EQ(i.code, 0) << i.out;
  fs::remove_all(d);
}

TEST(Cli, TrainingOverAnotherRunNeedsResumeOrOverwrite) {
  fs::path d = temp_dir("overwrite");
  const fs::path run = tiny_run(d);
  const std::string again = "train --config " + (d / "tiny.json").string() + " --out " + run.string();
  CliRun r = run_cli(again);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr(run.string() + " holds another run's checkpoints"));
  EXPECT_THAT(r.out, HasSubstr("use --resume to continue it or --overwrite to start over"));
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-00000002"));
  // A final model alone counts as a run too.
  fs::create_directories(d / "model_only");
  fs::copy_file(run / "model.safetensors", d / "model_only" / "model.safetensors");
  CliRun m = run_cli("train --config " + (d / "tiny.json").string() + " --out " + (d / "model_only").string());
  EXPECT_THAT(m.out, HasSubstr("holds another run's a trained model"));
  CliRun both = run_cli("train --resume --overwrite --out " + run.string());
  EXPECT_EQ(both.code, 1);
  EXPECT_THAT(both.out, HasSubstr("give one of them"));
  // --overwrite starts over: the old run's checkpoints are gone, not mixed with the new ones.
  fs::create_directories(run / "checkpoints" / "step-00000099");
  CliRun o = run_cli(again + " --overwrite");
  ASSERT_EQ(o.code, 0) << o.out;
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step-00000099"));
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-00000002"));
  for (auto& e : fs::directory_iterator(run)) EXPECT_EQ(e.path().filename().string().rfind(".overwritten-", 0), std::string::npos) << e.path();
  fs::remove_all(d);
}

TEST(Cli, ResumePastTheEndOfTheScheduleIsRefused) {
  fs::path d = temp_dir("schedule_end");
  const fs::path run = tiny_run(d);  // 2 steps: its cosine schedule ends at step 2
  CliRun r = run_cli("train --resume --steps 10 --out " + run.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("cannot resume " + run.string() + " to step 10: its cosine learning-rate schedule ends at step 2"));
  EXPECT_THAT(r.out, HasSubstr("train a new run with train.steps (and schedule.total_steps) 10"));
  CliRun ok = run_cli("train --resume --steps 2 --out " + run.string());
  EXPECT_EQ(ok.code, 0) << ok.out;
  fs::remove_all(d);
}

TEST(Cli, VersionAndUnknownSubcommand) {
  CliRun v = run_cli("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_THAT(v.out, HasSubstr("lstm-engine 0.1.0"));
  CliRun u = run_cli("trian");
  EXPECT_NE(u.code, 0);
  EXPECT_THAT(u.out, HasSubstr("unknown command 'trian'; expected one of train, eval, predict, generate, info, forward"));
}

TEST(Cli, AFileThatIsNotSafetensorsIsNamedAsSuch) {
  fs::path d = temp_dir("not_safetensors");
  const fs::path run = tiny_run(d);
  write_text(d / "notes.txt", "these are some notes, not tensors\n");
  std::string noise;
  Rng rng(7);
  for (int i = 0; i < 4096; ++i) noise += static_cast<char>(rng.below(256));
  write_text(d / "noise.bin", noise);
  LstmSpec s{.input_size = 3, .hidden_size = 4};
  write_safetensors((d / "m.safetensors").string(), random_state_dict(s, rng));
  write_safetensors((d / "x.safetensors").string(), {{"input", Tensor::zeros({2, 1, 3})}});
  for (const char* bad : {"notes.txt", "noise.bin"}) {
    const std::string f = (d / bad).string(), want = "'" + f + "' is not a safetensors file";
    CliRun fm = run_cli("forward --model " + f + " --input " + (d / "x.safetensors").string() + " --output " + (d / "y").string());
    EXPECT_EQ(fm.code, 1);
    EXPECT_THAT(fm.out, HasSubstr(want));
    CliRun fi = run_cli("forward --model " + (d / "m.safetensors").string() + " --input " + f + " --output " + (d / "y").string());
    EXPECT_THAT(fi.out, HasSubstr(want));
    CliRun ev = run_cli("eval --model " + f);
    EXPECT_THAT(ev.out, HasSubstr(want));
    CliRun gen = run_cli("generate --model " + f);
    EXPECT_THAT(gen.out, HasSubstr(want));
  }
  // Sizes are already bounded; these stay errors.
  CliRun len = run_cli("generate --length -5 --model " + run.string());
  EXPECT_EQ(len.code, 1);
  EXPECT_THAT(len.out, HasSubstr("--length"));
  CliRun thr = run_cli("train --threads -4 --out " + (d / "t").string());
  EXPECT_EQ(thr.code, 1);
  EXPECT_THAT(thr.out, HasSubstr("--threads"));
  fs::remove_all(d);
}

// A forecasting run prints its errors in original units (MSE, MAE, RMSE), not an accuracy, after
// training and from `lstm eval`; both agree.
TEST(Cli, ForecastReportsErrorsInOriginalUnits) {
  fs::path d = temp_dir("forecast");
  {
    std::ofstream f(d / "series.csv");
    f << "t,y\n";
    for (int t = 0; t < 80; ++t) f << t << "," << 100 + 10 * std::sin(t * 0.5) << "\n";
  }
  write_text(d / "cfg.json", R"({"task": "forecast", "data": {"path": ")" + (d / "series.csv").string() +
                                 R"(", "target_columns": ["y"], "horizon": 2, "valid_fraction": 0.25},
    "model": {"layers": [{"type": "lstm", "hidden_size": 4}, {"type": "last_step"}, {"type": "dense"}]},
    "train": {"steps": 3, "batch_size": 4, "seq_len": 6, "checkpoint_every": 0}})");
  CliRun tr = run_cli("train --threads 1 --config " + (d / "cfg.json").string() + " --out " + (d / "run").string());
  ASSERT_EQ(tr.code, 0) << tr.out;
  EXPECT_THAT(tr.out, HasSubstr("(original units)"));
  EXPECT_THAT(tr.out, Not(HasSubstr("accuracy")));
  const size_t at = tr.out.find("final validation loss ");
  ASSERT_NE(at, std::string::npos) << tr.out;
  CliRun ev = run_cli("eval --model " + (d / "run").string());
  ASSERT_EQ(ev.code, 0) << ev.out;
  EXPECT_THAT(ev.out, HasSubstr("MSE"));
  EXPECT_THAT(ev.out, HasSubstr("over 38 targets"));  // 20 held-out steps: 19 windows of 2
  // The same loss as the training run's final evaluation.
  const std::string loss = tr.out.substr(at + 22, tr.out.find(' ', at + 22) - at - 22);
  EXPECT_THAT(ev.out, HasSubstr("loss " + loss + " (normalised)"));
  fs::remove_all(d);
}
