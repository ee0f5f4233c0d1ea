// Seeded training runs through the trainer: small tasks learned to a stated accuracy in a fixed
// number of steps, identical results for an identical seed, NaN handling.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lstm/parallel.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/train.hpp"
#include "test_util.hpp"

using namespace lstm;
using ::testing::AllOf;
using ::testing::Not;
using lstm::testing::write_majority_csv;
namespace fs = std::filesystem;

namespace {

lstm::TrainOptions opts(const nlohmann::json& cfg, const std::string& out, bool resume, int64_t steps, std::ostream* log) {
  lstm::TrainOptions o;
  o.config = cfg;
  o.out_dir = out;
  o.resume = resume;
  o.steps = steps;
  o.log = log;
  return o;
}


fs::path temp_dir(const std::string& name) { return lstm::testing::temp_dir("lstm_train", name); }

std::string config_error(const nlohmann::json& j) {
  try {
    resolve_train_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Training, ClassifierLearnsMajorityTask) {
  set_num_threads(1);
  fs::path d = temp_dir("majority");
  write_majority_csv(d / "data.csv", 2000, 42);
  nlohmann::json cfg = {
      {"task", "classify"},
      {"data", {{"path", (d / "data.csv").string()}, {"valid_fraction", 0.1}}},
      {"model",
       {{"embedding_dim", 8},
        {"layers", {{{"type", "lstm"}, {"hidden_size", 24}}, {{"type", "last_step"}}, {{"type", "dense"}}}}}},
      {"train",
       {{"steps", 400},
        {"batch_size", 32},
        {"eval_every", 0},
        {"checkpoint_every", 0},
        {"optimizer", {{"type", "adam"}}},
        {"schedule", {{"type", "constant"}, {"lr", 0.01}}}}}};
  std::ostringstream log;
  TrainResult r = train(opts(cfg, (d / "run").string(), false, -1, &log));
  EXPECT_FALSE(r.stopped_non_finite);
  EXPECT_EQ(r.step, 400);
  // Stated goal: >= 90% held-out accuracy after 400 steps (chance is 50%).
  EXPECT_GE(r.valid_accuracy, 0.90) << log.str();
  EXPECT_TRUE(fs::exists(d / "run" / "model.safetensors"));
  EvalResult e = evaluate_model((d / "run").string());
  EXPECT_NEAR(e.accuracy, r.valid_accuracy, 1e-12);
  fs::remove_all(d);
}

TEST(Training, CharModelLearnsAPeriodicTextAndGenerates) {
  set_num_threads(1);
  fs::path d = temp_dir("periodic");
  {
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 300; ++i) f << "hello world. ";
  }
  nlohmann::json cfg = {{"task", "charlm"},
                        {"data", {{"path", (d / "text.txt").string()}}},
                        {"model", {{"embedding_dim", 8}, {"layers", {{{"type", "lstm"}, {"hidden_size", 32}}, {{"type", "dense"}}}}}},
                        {"train",
                         {{"steps", 300},
                          {"batch_size", 16},
                          {"seq_len", 24},
                          {"eval_every", 0},
                          {"checkpoint_every", 100},
                          {"sample_length", 26},
                          {"schedule", {{"type", "constant"}, {"lr", 0.01}}}}}};
  std::ostringstream log;
  TrainResult r = train(opts(cfg, (d / "run").string(), false, -1, &log));
  // Stated goal: the period-13 text is predicted with >= 95% accuracy after 300 steps.
  EXPECT_GE(r.valid_accuracy, 0.95) << log.str();
  EXPECT_LT(r.valid_loss, 0.3);
  EXPECT_THAT(generate_text((d / "run").string(), "hello", 13, 0.05, 3), ::testing::HasSubstr("world"));
  fs::remove_all(d);
}

TEST(Training, SameSeedSameResultAndResumeEqualsUninterrupted) {
  set_num_threads(1);
  fs::path d = temp_dir("resume");
  {
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  nlohmann::json cfg = {{"task", "charlm"},
                        {"data", {{"path", (d / "text.txt").string()}}},
                        {"model",
                         {{"embedding_dim", 6},
                          {"layers", {{{"type", "lstm"}, {"hidden_size", 12}, {"num_layers", 2}, {"dropout", 0.2}},
                                      {{"type", "dropout"}, {"p", 0.1}},
                                      {{"type", "dense"}}}}}},
                        {"train",
                         {{"steps", 40},
                          {"batch_size", 4},
                          {"seq_len", 10},
                          {"eval_every", 15},
                          {"checkpoint_every", 10},
                          {"keep_checkpoints", 2},
                          {"sample_length", 0},
                          {"optimizer", {{"type", "adamw"}}},
                          // The interrupted run stops early; its schedule must still be the 40-step one.
                          {"schedule", {{"type", "cosine"}, {"lr", 0.003}, {"warmup_steps", 5}, {"total_steps", 40}}}}}};
  std::ostringstream log;
  TrainResult full = train(opts(cfg, (d / "full").string(), false, -1, &log));
  // Interrupted: stop after 20 steps (a checkpoint is written there), then resume to 40.
  TrainResult part = train(opts(cfg, (d / "part").string(), false, 20, &log));
  EXPECT_EQ(part.step, 20);
  TrainResult rest = train(opts({}, (d / "part").string(), true, 40, &log));
  EXPECT_EQ(rest.step, 40);
  auto a = read_safetensors((d / "full" / "model.safetensors").string());
  auto b = read_safetensors((d / "part" / "model.safetensors").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (auto& [k, v] : a.tensors) EXPECT_EQ(max_abs_diff(v, b.tensors.at(k)), 0.0) << k;
  EXPECT_EQ(full.valid_loss, rest.valid_loss);
  // Only the newest keep_checkpoints folders remain.
  int n = 0;
  for (auto& e : fs::directory_iterator(d / "full" / "checkpoints")) n += e.is_directory();
  EXPECT_EQ(n, 2);
  fs::remove_all(d);
}

TEST(Training, NonFiniteLossStopsAndKeepsLastGoodCheckpoint) {
  set_num_threads(1);
  fs::path d = temp_dir("nan");
  nlohmann::json cfg = lstm::testing::exploding_lr_config(d);
  std::ostringstream log;
  TrainResult r = train(opts(cfg, (d / "run").string(), false, -1, &log));
  ASSERT_TRUE(r.stopped_non_finite) << log.str();
  EXPECT_THAT(log.str(), ::testing::HasSubstr("stopped before applying the update"));
  EXPECT_THAT(log.str(), ::testing::HasSubstr("last good checkpoint"));
  ASSERT_FALSE(r.last_checkpoint.empty());
  // The last good checkpoint loads and holds finite weights.
  auto m = read_safetensors(r.last_checkpoint + "/model.safetensors");
  for (auto& [k, v] : m.tensors) EXPECT_FALSE(has_non_finite(v)) << k;
  EXPECT_FALSE(fs::exists(d / "run" / "model.safetensors"));
  fs::remove_all(d);
}

TEST(Training, ConfigErrorsNameTheField) {
  auto err = config_error;
  EXPECT_THAT(err({{"train", {{"stepz", 3}}}}), ::testing::HasSubstr("train.stepz"));
  EXPECT_THAT(err({{"train", {{"batch_size", -1}}}}), ::testing::HasSubstr("train.batch_size"));
  EXPECT_THAT(err({{"train", {{"optimizer", {{"type", "rmsprop"}}}}}}), ::testing::HasSubstr("rmsprop"));
}

// ---- Hardening: what a resume accepts, limits on sizes, leftovers of killed runs ----

namespace {

nlohmann::json tiny_config(const fs::path& d) {
  {
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 50; ++i) f << "the quick brown fox " << i << "\n";
  }
  return {{"task", "charlm"},
          {"data", {{"path", (d / "text.txt").string()}}},
          {"model", {{"embedding_dim", 3}, {"layers", {{{"type", "lstm"}, {"hidden_size", 4}}, {{"type", "dense"}}}}}},
          {"train",
           {{"steps", 4}, {"batch_size", 2}, {"seq_len", 8}, {"checkpoint_every", 2}, {"eval_every", 0},
            {"sample_length", 0},
            // Runs stopped at step 2 resume to 4: the schedule must reach that far.
            {"schedule", {{"type", "cosine"}, {"lr", 0.003}, {"warmup_steps", 0}, {"total_steps", 4}}}}}};
}

std::string train_error(const lstm::TrainOptions& o) {
  try {
    train(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Training, ResumeRefusesIncompleteStateAndForeignCheckpoints) {
  set_num_threads(1);
  fs::path d = temp_dir("strict_resume");
  std::ostringstream log;
  const fs::path run = d / "run", ck = run / "checkpoints";
  train(opts(tiny_config(d), run.string(), false, 2, &log));
  const std::string tf = (ck / "step-00000002" / "trainer.safetensors").string();
  const SafetensorsFile good = read_safetensors(tf);
  auto resume_error = [&] { return train_error(opts({}, run.string(), true, 4, &log)); };

  // Optimizer state missing for one parameter: Adam's moments would silently restart.
  SafetensorsFile partial = good;
  std::string dropped;
  for (auto& [k, v] : partial.tensors)
    if (k.rfind("optimizer.exp_avg_sq.", 0) == 0) dropped = k;
  ASSERT_FALSE(dropped.empty());
  partial.tensors.erase(dropped);
  write_safetensors(tf, partial.tensors, partial.metadata);
  EXPECT_THAT(resume_error(), AllOf(::testing::HasSubstr(tf), ::testing::HasSubstr("optimizer state is incomplete"),
                                    ::testing::HasSubstr("missing '" + dropped + "'")));
  // No optimizer state at all.
  SafetensorsFile none = good;
  std::erase_if(none.tensors, [](const auto& kv) { return kv.first.rfind("optimizer.", 0) == 0; });
  write_safetensors(tf, none.tensors, none.metadata);
  EXPECT_THAT(resume_error(), ::testing::HasSubstr("optimizer state is incomplete"));
  // A step that is not a number.
  SafetensorsFile bad_step = good;
  bad_step.metadata["step"] = "two";
  write_safetensors(tf, bad_step.tensors, bad_step.metadata);
  EXPECT_THAT(resume_error(), ::testing::HasSubstr(tf + ": metadata \"step\" must be a non-negative integer, got \"two\""));
  write_safetensors(tf, good.tensors, good.metadata);

  // `latest` naming another run's checkpoint, or binary junk.
  fs::path other = d / "other";
  train(opts(tiny_config(d), other.string(), false, 2, &log));
  std::ofstream(ck / "latest") << "../../other/checkpoints/step-00000002\n";
  EXPECT_THAT(resume_error(), ::testing::HasSubstr("expected the name of a checkpoint folder of this run (step-N, N "
                                                   "digits), got \"../../other/checkpoints/step-00000002\""));
  std::ofstream(ck / "latest") << std::string("\x01\xff\0zz", 5);
  EXPECT_THAT(resume_error(), ::testing::HasSubstr("got \"\\x01\\xff\\x00zz\""));
  std::ofstream(ck / "latest") << "step-00000002\n";

  // Leftovers of a killed run go with the next checkpoint, the pointer's temporaries included.
  std::ofstream(ck / "latest.tmp.999999.0") << "step-0000";
  fs::create_directories(ck / ".tmp-step-00000004-999999");
  TrainResult r = train(opts({}, run.string(), true, 4, &log));
  EXPECT_EQ(r.step, 4);
  for (auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find("tmp"), std::string::npos) << e.path();
  fs::remove_all(d);
}

TEST(Training, FailedCheckpointLeavesNoTemporaryFolder) {
  set_num_threads(1);
  fs::path d = temp_dir("ckpt_fail");
  std::ostringstream log;
  const fs::path run = d / "run", ck = run / "checkpoints";
  train(opts(tiny_config(d), run.string(), false, 2, &log));
  // Writes of a file as large as the optimizer state fail (as a full disk would, with another
  // errno): the checkpoint at step 4. The best model (written before it, smaller) still fits.
  const auto trainer_bytes = fs::file_size(ck / "step-00000002" / "trainer.safetensors");
  ASSERT_LT(fs::file_size(run / "best" / "model.safetensors") + 256, trainer_bytes);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = trainer_bytes - 1;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string err = train_error(opts({}, run.string(), true, 4, &log));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, prev);
  EXPECT_THAT(err, ::testing::HasSubstr("checkpoint " + (ck / "step-00000004").string() + " could not be written"));
  for (auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  std::ifstream latest(ck / "latest");
  std::string pointer;
  std::getline(latest, pointer);
  EXPECT_EQ(pointer, "step-00000002");
  fs::remove_all(d);
}

TEST(Training, SizesAndTypesAreBoundedAndNamed) {
  auto err = config_error;
  auto layers = [](const nlohmann::json& lstm_layer) {
    return nlohmann::json{{"model", {{"layers", {lstm_layer, {{"type", "dense"}}}}}}};
  };
  EXPECT_THAT(err(layers({{"type", "lstm"}, {"hidden_size", int64_t{1} << 62}})),
              ::testing::HasSubstr("field \"hidden_size\" must be an integer in [1, 2147483647], got 4611686018427387904"));
  EXPECT_THAT(err(layers({{"type", "lstm"}, {"hidden_size", 4}, {"num_layers", 1000000}})),
              ::testing::HasSubstr("field \"num_layers\" must be an integer in [1, 1024], got 1000000"));
  EXPECT_THAT(err({{"train", {{"seq_len", INT64_MAX}}}}),
              ::testing::HasSubstr("'train.seq_len' must be an integer in [1, 2147483647], got 9223372036854775807"));
  EXPECT_THAT(err({{"train", {{"steps", "10"}}}}), ::testing::HasSubstr("'train.steps' must be an integer"));
  EXPECT_THAT(err({{"data", {{"path", "bad\xff"}}}}), ::testing::HasSubstr("'data.path' must be valid UTF-8"));
  EXPECT_THAT(err({{"train", {{"optimizer", {{"type", "adam"}, {"beta1", "x"}}}}}}),
              ::testing::HasSubstr("field \"beta1\" must be a number"));
  for (const std::string& e : {err({{"train", {{"threads", "4"}}}}), err({{"task", 3}})})
    EXPECT_THAT(e, Not(::testing::HasSubstr("json.exception")));
  // Fields that are looked at before their own check (a schedule's type, its total_steps, the last
  // layer's type) must not throw nlohmann's type_error either (a fuzzer found the schedule's).
  EXPECT_THAT(err({{"train", {{"schedule", {{"type", 1.5}}}}}}), ::testing::HasSubstr("must be a string"));
  EXPECT_THAT(err({{"train", {{"schedule", {{"type", "cosine"}, {"total_steps", "9"}}}}}}),
              ::testing::HasSubstr("total_steps"));
  EXPECT_THAT(err(nlohmann::json{{"model", {{"layers", {{{"type", 7}}}}}}}), ::testing::HasSubstr("model.layers[0]"));
}
