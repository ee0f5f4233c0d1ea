// Watching training: the PNG encoder (decoded by an independent reader), the plot, the ETA
// estimator, the best-model / early-stopping tracker, metrics.jsonl's cut on resume and the
// configuration fields.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/png.hpp"
#include "lstm/plot.hpp"
#include "lstm/train.hpp"
#include "png_decode.hpp"
#include "test_util.hpp"
#include "train/watch.hpp"

using namespace lstm;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return lstm::testing::temp_dir("lstm_watch", name); }

using lstm::testing::read_file;

using lstm::testing::config_error;

}  // namespace

TEST(Png, ChecksumsMatchTheirStandardCheckValues) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(adler32("Wikipedia"), 0x11E60398u);
  EXPECT_EQ(crc32(""), 0u);
  EXPECT_EQ(adler32(""), 1u);
}

TEST(Png, EncodedImagesDecodeToTheSamePixels) {
  Rng rng(5);
  // Palette sizes for each bit depth, widths that leave a partial last byte, and an image whose
  // raw data needs several stored blocks (> 65535 bytes).
  for (auto [w, h, colours] : std::vector<std::array<int, 3>>{{1, 1, 1}, {13, 7, 2}, {9, 5, 4}, {31, 17, 16},
                                                              {300, 250, 200}, {5, 3, 256}}) {
    SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h) + ", " + std::to_string(colours) + " colours");
    std::vector<Rgb> palette;
    for (int i = 0; i < colours; ++i)
      palette.push_back({static_cast<uint8_t>(i), static_cast<uint8_t>(255 - i), static_cast<uint8_t>(i * 7)});
    std::vector<uint8_t> px(static_cast<size_t>(w) * h);
    for (auto& p : px) p = static_cast<uint8_t>(rng.below(static_cast<uint64_t>(colours)));
    const lstm::testing::DecodedPng d = lstm::testing::decode_png(encode_png_indexed(w, h, palette, px));
    ASSERT_EQ(d.error, "");
    EXPECT_EQ(d.width, static_cast<uint32_t>(w));
    EXPECT_EQ(d.height, static_cast<uint32_t>(h));
    EXPECT_EQ(d.depth, colours <= 2 ? 1 : colours <= 4 ? 2 : colours <= 16 ? 4 : 8);
    EXPECT_EQ(d.pixels, px);
    EXPECT_EQ(d.palette.size(), palette.size());
    EXPECT_EQ(d.palette.back(), palette.back());
    if (w == 300) {
      EXPECT_EQ(d.idat_blocks, 2);
    }
  }
}

TEST(Png, CorruptionIsCaughtByTheReaderAndBadInputsByTheWriter) {
  std::string png = encode_png_indexed(4, 4, {{0, 0, 0}, {255, 255, 255}}, std::vector<uint8_t>(16, 1));
  ASSERT_EQ(lstm::testing::decode_png(png).error, "");
  std::string bad = png;
  bad[bad.size() - 20] ^= 1;  // inside the IDAT data: its CRC no longer matches
  EXPECT_THAT(lstm::testing::decode_png(bad).error, HasSubstr("bad CRC"));
  EXPECT_THROW(encode_png_indexed(2, 2, {{0, 0, 0}}, {0, 0, 0, 1}), Error);
  EXPECT_THROW(encode_png_indexed(2, 2, {{0, 0, 0}}, {0, 0, 0}), Error);
  EXPECT_THROW(encode_png_indexed(0, 2, {{0, 0, 0}}, {}), Error);
}

TEST(Eta, FromMeasuredStepsWithoutWarmUpAndWithPauses) {
  EtaEstimator e(4);
  EXPECT_TRUE(std::isnan(e.eta(100, 0)));
  e.add_steps(10, 30.0);  // warm-up: 3 s a step, left out
  EXPECT_TRUE(std::isnan(e.seconds_per_step()));
  e.add_steps(10, 1.0);
  EXPECT_DOUBLE_EQ(e.seconds_per_step(), 0.1);
  EXPECT_DOUBLE_EQ(e.eta(100, 0), 10.0);
  // Evaluation/checkpoint points cost their mean measured time each.
  e.add_pause(2.0);
  e.add_pause(4.0);
  EXPECT_DOUBLE_EQ(e.eta(100, 2), 10.0 + 6.0);
  // A moving window: after 4 spans at 0.2 s a step the 0.1 s one is forgotten.
  for (int i = 0; i < 4; ++i) e.add_steps(5, 1.0);
  EXPECT_DOUBLE_EQ(e.seconds_per_step(), 0.2);
  EXPECT_DOUBLE_EQ(e.eta(0, 0), 0.0);
}

TEST(Eta, PausePointsCountEvaluationsCheckpointsAndTheLastStep) {
  EXPECT_EQ(pause_points(0, 100, 25, 10), 12);  // 4 + 10 - 2 (50 and 100 are both)
  EXPECT_EQ(pause_points(0, 105, 25, 10), 13);  // and the last step, 105
  EXPECT_EQ(pause_points(40, 100, 25, 10), 7);  // 50, 60, 70, 75, 80, 90, 100
  EXPECT_EQ(pause_points(0, 10, 0, 0), 1);
  EXPECT_EQ(pause_points(10, 10, 5, 5), 0);
  // Periods whose common multiple overflows int64: 8191 + 8191 points and the last step.
  EXPECT_EQ(pause_points(0, int64_t{1} << 53, (int64_t{1} << 40) + 1, (int64_t{1} << 40) + 3), 16383);
}

TEST(EarlyStopping, StopsAtTheRightEvaluationOfACraftedSequence) {
  BestTracker t;
  t.metric = "valid_loss";
  t.patience = 3;
  const std::vector<double> losses = {3.0, 2.5, 2.6, 2.4, 2.45, 2.5, 2.7, 1.0};
  int64_t stopped_at = -1;
  for (size_t i = 0; i < losses.size(); ++i) {
    t.update(static_cast<int64_t>(i + 1) * 10, losses[i]);
    if (t.should_stop()) {
      stopped_at = static_cast<int64_t>(i + 1) * 10;
      break;
    }
  }
  EXPECT_EQ(stopped_at, 70);
  EXPECT_EQ(t.best, 2.4);
  EXPECT_EQ(t.best_step, 40);
  EXPECT_EQ(t.bad_evals, 3);

  // min_delta: an improvement must beat the best by more than it.
  BestTracker d;
  d.patience = 2;
  d.min_delta = 0.2;
  EXPECT_TRUE(d.update(1, 3.0));
  EXPECT_FALSE(d.update(2, 2.85));
  EXPECT_FALSE(d.should_stop());
  EXPECT_TRUE(d.update(3, 2.7));
  EXPECT_EQ(d.bad_evals, 0);
  EXPECT_FALSE(d.update(4, std::nan("")));  // a NaN never improves
  EXPECT_FALSE(d.update(5, 2.6));
  EXPECT_TRUE(d.should_stop());

  // Accuracy improves upwards; patience 0 never stops.
  BestTracker a;
  a.metric = "valid_accuracy";
  EXPECT_TRUE(a.update(1, 0.5));
  EXPECT_FALSE(a.update(2, 0.4));
  EXPECT_TRUE(a.update(3, 0.6));
  for (int i = 0; i < 100; ++i) a.update(4 + i, 0.1);
  EXPECT_FALSE(a.should_stop());
  EXPECT_EQ(a.best_step, 3);

  // The state a checkpoint keeps comes back exactly.
  BestTracker r;
  r.metric = "valid_loss";
  r.load_state(nlohmann::json::parse(t.state().dump()), "ck");
  EXPECT_EQ(r.best, t.best);
  EXPECT_EQ(r.best_step, t.best_step);
  EXPECT_EQ(r.bad_evals, t.bad_evals);
  r.metric = "valid_accuracy";
  EXPECT_THROW(r.load_state(t.state(), "ck"), Error);
}

TEST(MetricsLog, ResumeKeepsWhatTheCheckpointCoversAndDropsAHalfWrittenLine) {
  fs::path d = temp_dir("metrics");
  const std::string path = (d / "metrics.jsonl").string();
  {
    MetricsLog m;
    m.start(path);
    for (int s : {10, 20, 30}) m.append({{"kind", "train"}, {"step", s}, {"loss", 1.0 / s}});
    m.append({{"kind", "eval"}, {"step", 20}, {"valid_loss", std::nan("")}});
  }
  std::ofstream(path, std::ios::app) << R"({"kind": "train", "step": 4)";  // killed mid-write
  MetricsLog m;
  EXPECT_EQ(m.resume(path, 20), 2);  // the step-30 line and the cut one
  m.append({{"kind", "train"}, {"step", 30}, {"loss", 0.5}});
  std::istringstream in(read_file(path));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);  // every line parses
    steps.push_back(j["step"]);
    if (j["kind"] == "eval") {
      EXPECT_TRUE(j["valid_loss"].is_null());
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 20, 30}));
  // A fresh start empties it.
  MetricsLog fresh;
  fresh.start(path);
  EXPECT_EQ(read_file(path), "");
  fs::remove_all(d);
}

TEST(Plot, DrawsEveryCurveFromMetricsAndNamesWhatIsMissing) {
  fs::path d = temp_dir("plot");
  {
    std::ofstream f(d / "metrics.jsonl");
    for (int s = 10; s <= 200; s += 10)
      f << nlohmann::json{{"kind", "train"}, {"step", s}, {"loss", 4.0 / std::sqrt(s)}, {"lr", 3e-3 * (1 - s / 400.0)},
                          {"grad_norm", 0.3 + 0.001 * s}, {"tokens_per_s", 1000}, {"elapsed_s", s * 0.1}}
                  .dump()
        << "\n";
    for (int s = 50; s <= 200; s += 50)
      f << nlohmann::json{{"kind", "eval"}, {"step", s}, {"valid_loss", 5.0 / std::sqrt(s)}, {"valid_accuracy", s / 250.0}}
                  .dump()
        << "\n";
    f << R"({"kind": "train", "st)";
  }
  const PlotResult r = plot_run(d.string(), (d / "c.png").string(), 640, 400);
  EXPECT_EQ(r.train_records, 20);
  EXPECT_EQ(r.eval_records, 4);
  EXPECT_EQ(r.skipped_lines, 1);
  const auto png = lstm::testing::decode_png(read_file(d / "c.png"));
  ASSERT_EQ(png.error, "");
  EXPECT_EQ(png.width, 640u);
  EXPECT_EQ(png.height, 400u);
  // plot.hpp's curve colours, each drawn.
  for (std::array<uint8_t, 3> c : {std::array<uint8_t, 3>{31, 119, 180}, {255, 127, 14}, {44, 160, 44},
                                   {148, 103, 189}, {214, 39, 40}})
    EXPECT_TRUE(png.has_colour(c)) << int(c[0]) << "," << int(c[1]) << "," << int(c[2]);

  // Without evaluations the validation curves are absent, the others still drawn.
  fs::path e = temp_dir("plot_noeval");
  std::ofstream(e / "metrics.jsonl") << R"({"kind": "train", "step": 5, "loss": 2, "lr": 0.1, "grad_norm": 1})" << "\n";
  plot_run(e.string(), (e / "c.png").string());
  const auto one = lstm::testing::decode_png(read_file(e / "c.png"));
  ASSERT_EQ(one.error, "");
  EXPECT_TRUE(one.has_colour({31, 119, 180}));
  EXPECT_FALSE(one.has_colour({44, 160, 44}));

  std::ofstream(e / "metrics.jsonl") << R"({"kind": "eval", "step": 5, "valid_loss": 2})" << "\n";
  EXPECT_THROW(
      try { plot_run(e.string(), (e / "c.png").string()); } catch (const Error& err) {
        EXPECT_THAT(err.what(), HasSubstr("no \"train\" record"));
        throw;
      },
      Error);
  EXPECT_THROW(
      try { plot_run((d / "nothing").string(), (d / "x.png").string()); } catch (const Error& err) {
        EXPECT_THAT(err.what(), HasSubstr("metrics.jsonl does not exist"));
        throw;
      },
      Error);
  fs::remove_all(d);
  fs::remove_all(e);
}

TEST(WatchConfig, EarlyStoppingAndFinalModelFieldsAreCheckedAndNamed) {
  const nlohmann::json def = resolve_train_config(nlohmann::json::object());
  EXPECT_EQ(def["train"]["early_stopping"]["metric"], "valid_loss");
  EXPECT_EQ(def["train"]["early_stopping"]["patience"], 0);
  EXPECT_EQ(def["train"]["final_model"], "best");
  auto es = [](const nlohmann::json& j) { return nlohmann::json{{"train", {{"early_stopping", j}}}}; };
  EXPECT_THAT(config_error(es({{"metric", "valid_los"}})),
              HasSubstr("'train.early_stopping.metric' must be \"valid_loss\" or \"valid_accuracy\", got \"valid_los\""));
  EXPECT_THAT(config_error(es({{"patience", -1}})), HasSubstr("'train.early_stopping.patience'"));
  EXPECT_THAT(config_error(es({{"patience", 2.5}})), HasSubstr("'train.early_stopping.patience'"));
  EXPECT_THAT(config_error(es({{"min_delta", -0.1}})), HasSubstr("'train.early_stopping.min_delta'"));
  EXPECT_THAT(config_error(es({{"patience", 2}, {"metrc", "x"}})), HasSubstr("unknown field 'train.early_stopping.metrc'"));
  EXPECT_THAT(config_error(es(3)), HasSubstr("'train.early_stopping' must be an object"));
  EXPECT_THAT(config_error({{"train", {{"final_model", "worst"}}}}),
              HasSubstr("'train.final_model' must be \"best\" or \"last\", got \"worst\""));
  EXPECT_EQ(config_error(es({{"metric", "valid_accuracy"}, {"patience", 3}, {"min_delta", 0.01}})), "(no error)");
}
