// What watching a training run needs, apart from the loop: the ETA from measured step times, the
// best-model / early-stopping tracker, and the append-only metrics.jsonl. Internal (the trainer
// and the tests use it).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include <nlohmann/json.hpp>

namespace lstm {

// Remaining time from measured durations. Spans of steps are timed without the evaluations and
// checkpoints in between (those are timed as pauses); the first span after a (re)start is
// warm-up (allocation, thread start-up, a GPU's algorithm measurement and graph capture) and is
// left out, and the per-step time is the mean of the last `window` spans.
class EtaEstimator {
 public:
  explicit EtaEstimator(size_t window = 8) : window_(window) {}
  // `steps` steps took `seconds` (no evaluation or checkpoint among them).
  void add_steps(int64_t steps, double seconds);
  // One evaluation and/or checkpoint point took `seconds`.
  void add_pause(double seconds);
  // Seconds a step takes (NaN until a span past the warm-up was measured).
  double seconds_per_step() const;
  // Seconds for `steps_left` more steps and `pauses_left` more evaluation/checkpoint points
  // (NaN while seconds_per_step() is unknown).
  double eta(int64_t steps_left, int64_t pauses_left) const;

 private:
  size_t window_;
  bool warm_ = false;
  std::deque<std::pair<int64_t, double>> spans_;
  double pause_sum_ = 0;
  int64_t pauses_ = 0;
};

// How many of the steps in (from, to] are evaluation or checkpoint points (multiples of either
// period; 0 = never) plus the last step `to` when it is neither.
int64_t pause_points(int64_t from, int64_t to, int64_t eval_every, int64_t ckpt_every);

// The best validation value so far and the early-stopping count. metric "valid_loss" improves
// downwards, "valid_accuracy" upwards; an improvement must beat the best by more than min_delta
// (the first finite value always does). patience 0: never stops.
struct BestTracker {
  std::string metric = "valid_loss";
  int64_t patience = 0;
  double min_delta = 0;

  bool has_best = false;
  double best = 0;
  int64_t best_step = -1;
  int64_t bad_evals = 0;  // evaluations since the best without improvement

  // Records one evaluation; returns true when it is the new best.
  bool update(int64_t step, double value);
  bool should_stop() const { return patience > 0 && bad_evals >= patience; }
  // The state a checkpoint keeps (doubles round-trip exactly through nlohmann's JSON).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j, const std::string& file);
};

// metrics.jsonl: one JSON object a line, appended with one write() each, so a killed run loses at
// most its last line (and may leave it half written).
class MetricsLog {
 public:
  MetricsLog() = default;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();
  // Starts the file empty.
  void start(const std::string& path);
  // Continues a run resumed at `step`: keeps the complete lines whose step is at most `step` (what
  // the checkpoint covers) and drops the rest, a half-written last line included. Returns the
  // number of lines dropped. The shortened file replaces the old one atomically.
  int64_t resume(const std::string& path, int64_t step);
  // Appends `record` as one line (NaN/Inf become null).
  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  void open_append();
  std::string path_;
  int fd_ = -1;
};

}  // namespace lstm
