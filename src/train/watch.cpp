// ETA, best-model tracking and metrics.jsonl for the trainer.
#include "train/watch.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "io/config_reader.hpp"
#include "lstm/error.hpp"
#include "lstm/safetensors.hpp"

namespace lstm {

void EtaEstimator::add_steps(int64_t steps, double seconds) {
  if (steps <= 0 || !(seconds >= 0)) return;
  if (!warm_) {
    warm_ = true;
    return;
  }
  spans_.emplace_back(steps, seconds);
  if (spans_.size() > window_) spans_.pop_front();
}

void EtaEstimator::add_pause(double seconds) {
  if (!(seconds >= 0)) return;
  pause_sum_ += seconds;
  ++pauses_;
}

double EtaEstimator::seconds_per_step() const {
  int64_t n = 0;
  double s = 0;
  for (auto [steps, secs] : spans_) n += steps, s += secs;
  return n > 0 ? s / static_cast<double>(n) : std::nan("");
}

double EtaEstimator::eta(int64_t steps_left, int64_t pauses_left) const {
  const double per_pause = pauses_ > 0 ? pause_sum_ / static_cast<double>(pauses_) : 0;
  return seconds_per_step() * static_cast<double>(std::max<int64_t>(0, steps_left)) +
         per_pause * static_cast<double>(std::max<int64_t>(0, pauses_left));
}

int64_t pause_points(int64_t from, int64_t to, int64_t eval_every, int64_t ckpt_every) {
  if (to <= from) return 0;
  auto multiples = [&](int64_t k) { return k > 0 ? to / k - from / k : 0; };
  int64_t n = multiples(eval_every) + multiples(ckpt_every);
  if (eval_every > 0 && ckpt_every > 0) {
    const int64_t g = std::gcd(eval_every, ckpt_every), a = eval_every / g;
    if (a <= to / ckpt_every) n -= multiples(a * ckpt_every);  // both at once: one pause
  }
  const bool last_is_point = (eval_every > 0 && to % eval_every == 0) || (ckpt_every > 0 && to % ckpt_every == 0);
  return n + (last_is_point ? 0 : 1);
}

bool BestTracker::update(int64_t step, double value) {
  if (!std::isfinite(value)) {
    ++bad_evals;
    return false;
  }
  const bool lower = metric == "valid_loss";
  const bool better = !has_best || (lower ? value < best - min_delta : value > best + min_delta);
  if (!better) {
    ++bad_evals;
    return false;
  }
  has_best = true;
  best = value;
  best_step = step;
  bad_evals = 0;
  return true;
}

nlohmann::json BestTracker::state() const {
  nlohmann::json j = {{"metric", metric}, {"bad_evals", bad_evals}};
  if (has_best) j["best"] = best, j["best_step"] = best_step;
  return j;
}

void BestTracker::load_state(const nlohmann::json& j, const std::string& file) {
  const std::string pre = file + ": best-model state";
  LSTM_REQUIRE(j.is_object(), pre << " must be an object, got " << json_excerpt(j));
  const std::string m = read_string(j.value("metric", nlohmann::json()), pre + " 'metric'");
  // The metric is part of the configuration, which the checkpoint also holds: they must agree.
  LSTM_REQUIRE(m == metric, pre << " tracks " << m << ", the configuration " << metric);
  bad_evals = read_int(j.value("bad_evals", nlohmann::json()), pre + " 'bad_evals'", 0, int64_t{1} << 53);
  has_best = j.contains("best");
  if (has_best) {
    best = read_number(j["best"], pre + " 'best'", -HUGE_VAL, HUGE_VAL);
    best_step = read_int(j.value("best_step", nlohmann::json()), pre + " 'best_step'", 0, int64_t{1} << 53);
  } else {
    best = 0;
    best_step = -1;
  }
}

// ---- metrics.jsonl ----

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::open_append() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  LSTM_REQUIRE(fd_ >= 0, "cannot open " << path_ << " for appending: " << errno_text());
}

void MetricsLog::start(const std::string& path) {
  path_ = path;
  write_file_atomic(path_, "");
  open_append();
}

int64_t MetricsLog::resume(const std::string& path, int64_t step) {
  path_ = path;
  std::string keep;
  int64_t dropped = 0;
  if (std::filesystem::exists(path)) {
    const std::string text = read_regular_file(path, path + ": ", memory_limited_bytes());
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) {  // half written by a killed run
        ++dropped;
        break;
      }
      const std::string_view line(text.data() + pos, nl - pos);
      const nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);
      const bool ok = !rec.is_discarded() && rec.is_object() && rec.contains("step") && rec["step"].is_number() &&
                      rec["step"].get<double>() <= static_cast<double>(step);
      if (ok)
        keep.append(line).push_back('\n');
      else
        ++dropped;
      pos = nl + 1;
    }
  }
  write_file_atomic(path_, keep);
  open_append();
  return dropped;
}

void MetricsLog::append(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    LSTM_REQUIRE(n > 0, "cannot append to " << path_ << ": " << errno_text());
    done += static_cast<size_t>(n);
  }
}

}  // namespace lstm
