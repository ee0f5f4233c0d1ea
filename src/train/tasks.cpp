#include "train/tasks.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "io/config_reader.hpp"
#include "lstm/checked.hpp"
#include "lstm/error.hpp"
#include "train/trained_model.hpp"

namespace lstm {

namespace {

constexpr const char* kNormKey = "lstm_engine.normalization";

std::string percent(double fraction) {
  std::ostringstream os;
  os << 100 * fraction << "%";
  return os.str();
}

// Adds the argmax of each counted row of class outputs to the confusion matrix: a vector [B, C]
// against I64 [B], or a sequence [T, B, C] against I64 [T, B] (-100 not counted). The outputs of
// a batch of rows are small: the host reads them.
void add_confusion(const Act& out, const Batch& b, ConfusionMatrix& m) {
  const Tensor logits = out.data.cpu().to(DType::F32);
  const int64_t C = logits.size(logits.dim() - 1), rows = logits.numel() / C;
  const float* l = logits.data<float>();
  const int64_t* y = b.targets.data<int64_t>();
  for (int64_t k = 0; k < rows; ++k) {
    if (y[k] == -100) continue;  // past a length (tags)
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c)
      if (l[k * C + c] > l[k * C + best]) best = c;
    m.add(y[k], best);
  }
}

std::vector<std::string> strings_of(const nlohmann::json& j) {
  std::vector<std::string> out;
  for (const auto& v : j) out.push_back(v.get<std::string>());
  return out;
}

// Cross-entropy of class outputs: a vector [B, C] against I64 [B], or a sequence [T, B, C]
// against I64 [T, B] (-100 and steps past a length not counted).
LossResult class_loss(const Act& out, const Batch& b, int64_t classes) {
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
               "the model outputs " << out.data.shape_str() << " but the targets are " << b.targets.shape_str()
                                    << (b.targets.dim() == 2 ? " (a per-step task needs the sequence output: no last_step "
                                                               "head, an lstm with \"output\": \"sequence\")"
                                                             : ""));
  LSTM_REQUIRE(out.data.size(1) == classes, "the model outputs " << out.data.size(1) << " classes, the data has " << classes);
  return softmax_cross_entropy(out.data, b.targets);
}

// Data that splits into rows (classify, regress, tag): rows drawn at random for training, the
// held-out rows in order for evaluation.
class CsvTask : public Task {
 public:
  CsvTask(const nlohmann::json& cfg, const std::string& path, CsvTarget target) {
    CsvSpec spec;
    spec.sequence_column = cfg["data"]["sequence_column"].get<std::string>();
    spec.target = target;
    if (target == CsvTarget::Label) spec.target_columns = {cfg["data"]["label_column"].get<std::string>()};
    if (target == CsvTarget::Tags) spec.target_columns = {cfg["data"]["tags_column"].get<std::string>()};
    if (target == CsvTarget::Values) spec.target_columns = strings_of(cfg["data"]["target_columns"]);
    csv_ = CsvDataset::load(path, spec);
    path_ = path;
    const double vf = cfg["data"]["valid_fraction"].get<double>();
    Rng split_rng(cfg["train"]["seed"].get<uint64_t>() ^ 0x5151ull);
    std::tie(train_idx_, valid_idx_) = csv_.split(vf, split_rng);
    LSTM_REQUIRE(!train_idx_.empty(), path << ": no rows left for training after holding out " << vf << " for validation");
    input_ = {csv_.is_tokens() ? SignalKind::Tokens : SignalKind::Sequence, csv_.features()};
    if (csv_.is_tokens()) meta_["lstm_engine.tokens"] = nlohmann::json(csv_.token_names()).dump();
    if (target != CsvTarget::Values) {
      outputs_ = csv_.num_classes();
      meta_["lstm_engine.classes"] = nlohmann::json(csv_.class_names()).dump();
      class_names_ = csv_.class_names();
    }
    description_ = "the held-out " + percent(vf) + " of the rows of " + path;
  }
  // Rows read with a trained model's schema (classify): every row is evaluated.
  CsvTask(CsvDataset csv, const std::string& path) : csv_(std::move(csv)), path_(path) {
    input_ = {csv_.is_tokens() ? SignalKind::Tokens : SignalKind::Sequence, csv_.features()};
    outputs_ = csv_.num_classes();
    class_names_ = csv_.class_names();
    unknown_ = csv_.unknown_tokens();
    use_all_rows();
  }
  // Every row becomes the evaluated split (`lstm eval --data`).
  void use_all_rows() {
    valid_idx_.resize(static_cast<size_t>(csv_.size()));
    for (int64_t i = 0; i < csv_.size(); ++i) valid_idx_[static_cast<size_t>(i)] = i;
    description_ = "all of " + path_;
  }

  Batch train_batch(int64_t B, int64_t, Rng& rng) const override {
    std::vector<int64_t> idx(static_cast<size_t>(B));
    for (auto& i : idx) i = train_idx_[rng.below(train_idx_.size())];
    return prepare(csv_.batch(idx));
  }
  int64_t valid_batches(int64_t B, int64_t) const override {
    return (static_cast<int64_t>(valid_idx_.size()) + B - 1) / B;
  }
  Batch valid_batch(int64_t B, int64_t, int64_t i) const override {
    std::vector<int64_t> idx;
    for (int64_t k = i * B; k < std::min<int64_t>((i + 1) * B, static_cast<int64_t>(valid_idx_.size())); ++k)
      idx.push_back(valid_idx_[static_cast<size_t>(k)]);
    return prepare(csv_.batch(idx));
  }
  int64_t batch_steps(int64_t) const override { return csv_.max_length(); }
  std::string steps_from() const override { return "the longest sequence of " + path_; }
  const char* rate_unit() const override {
    return csv_.target() == CsvTarget::Label ? "seq/s" : csv_.target() == CsvTarget::Tags ? "tags/s" : "targets/s";
  }
  const char* rate_key() const override {
    return csv_.target() == CsvTarget::Label ? "samples_per_s"
           : csv_.target() == CsvTarget::Tags ? "tags_per_s"
                                              : "targets_per_s";
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "data: " << train_idx_.size() << " training sequences, " << valid_idx_.size() << " held out, ";
    if (csv_.target() == CsvTarget::Values)
      os << csv_.num_values() << " target" << (csv_.num_values() == 1 ? "" : "s");
    else
      os << outputs_ << (csv_.target() == CsvTarget::Tags ? " tags" : " classes");
    return os.str();
  }

 protected:
  // What a task does to a batch before the model sees it (normalisation).
  virtual Batch prepare(Batch b) const { return b; }
  CsvDataset csv_;
  std::string path_;
  std::vector<int64_t> train_idx_, valid_idx_;
};

class ClassifyTask final : public CsvTask {
 public:
  ClassifyTask(const nlohmann::json& cfg, const std::string& path) : CsvTask(cfg, path, CsvTarget::Label) {}
  ClassifyTask(CsvDataset csv, const std::string& path) : CsvTask(std::move(csv), path) {}
  LossResult loss(const Act& out, const Batch& b) const override { return class_loss(out, b, outputs_); }
  void add_eval(const Act& out, const Batch& b, const LossResult& lr, EvalSums& sums) const override {
    Task::add_eval(out, b, lr, sums);
    add_confusion(out, b, sums.confusion);
  }
};

class TagTask final : public CsvTask {
 public:
  TagTask(const nlohmann::json& cfg, const std::string& path) : CsvTask(cfg, path, CsvTarget::Tags) {}
  TagTask(CsvDataset csv, const std::string& path) : CsvTask(std::move(csv), path) {}
  LossResult loss(const Act& out, const Batch& b) const override {
    LSTM_REQUIRE(out.data.dim() == 3, "task \"tag\" needs a label per step, but the model outputs "
                                          << out.data.shape_str()
                                          << ": end the model without a many-to-one head (no last_step, an lstm "
                                             "with \"output\": \"sequence\") and with a dense layer");
    return class_loss(out, b, outputs_);
  }
  void add_eval(const Act& out, const Batch& b, const LossResult& lr, EvalSums& sums) const override {
    Task::add_eval(out, b, lr, sums);
    add_confusion(out, b, sums.confusion);
  }
};

// The parts regress and forecast share: normalisation, the regression loss, the metrics.
struct RegressionPart {
  RegressionLoss kind = RegressionLoss::MSE;
  double delta = 1.0;
  std::optional<Normalization> inputs;  // numeric inputs only
  Normalization targets;

  explicit RegressionPart(const nlohmann::json& cfg) {
    kind = cfg["train"]["loss"].get<std::string>() == "huber" ? RegressionLoss::Huber : RegressionLoss::MSE;
    delta = cfg["train"]["huber_delta"].get<double>();
  }

  std::string metadata() const {
    nlohmann::json j = {{"inputs", inputs ? inputs->to_json() : nlohmann::json()}, {"targets", targets.to_json()}};
    return j.dump();
  }

  LossResult loss(const Act& out, const Batch& b, const std::string& task) const {
    LSTM_REQUIRE(out.data.dim() == 2 && b.targets.dim() == 2 && out.data.size(0) == b.targets.size(0),
                 "task \"" << task << "\" predicts " << b.targets.size(1) << " values per sequence (targets "
                           << b.targets.shape_str() << "), but the model outputs " << out.data.shape_str()
                           << (out.data.dim() == 3 ? ": end the recurrent part with a many-to-one head (last_step, or an "
                                                     "lstm with \"output\": \"h_n\")"
                                                   : ""));
    LSTM_REQUIRE(out.data.size(1) == b.targets.size(1), "the model outputs " << out.data.size(1)
                                                                             << " values per sequence, the data has "
                                                                             << b.targets.size(1));
    return regression_loss(out.data, b.targets, kind, delta);
  }

  // Errors in original units: (prediction - target) * std of the target's column.
  void add_eval(const Act& out, const Batch& b, EvalSums& sums) const {
    const Tensor p = out.data.device() == Device::CPU ? out.data : out.data.cpu();
    const int64_t n = b.targets.numel(), k = targets.size();
    for (int64_t i = 0; i < n; ++i) {
      const double e = (p.get(i) - b.targets.get(i)) * targets.std[static_cast<size_t>(i % k)];
      sums.sq_err += e * e;
      sums.abs_err += std::abs(e);
    }
  }

  // The model's statistics replace the data's; their columns must be the same.
  void adopt(const std::map<std::string, std::string>& meta, const std::string& file) {
    auto it = meta.find(kNormKey);
    LSTM_REQUIRE(it != meta.end(), file << ": no normalisation statistics in its metadata (\"" << kNormKey
                                        << "\"), which a regression or forecasting model needs");
    const std::string what = file + ": metadata \"" + kNormKey + "\"";
    const nlohmann::json j = parse_json(it->second, what);
    LSTM_REQUIRE(j.is_object() && j.contains("inputs") && j.contains("targets"),
                 what << ": expected {\"inputs\", \"targets\"}, got " << json_excerpt(j));
    Normalization t = Normalization::from_json(j["targets"], what + ".targets");
    LSTM_REQUIRE(t.names == targets.names, what << ": the model predicts the columns "
                                                << nlohmann::json(t.names).dump() << ", the data has "
                                                << nlohmann::json(targets.names).dump());
    targets = std::move(t);
    LSTM_REQUIRE(j["inputs"].is_null() == !inputs.has_value(),
                 what << ": the model " << (inputs ? "has no" : "has") << " input statistics, the data "
                      << (inputs ? "is numeric" : "is tokens"));
    if (inputs) {
      Normalization in = Normalization::from_json(j["inputs"], what + ".inputs");
      LSTM_REQUIRE(in.size() == inputs->size(), what << ": the model has " << in.size()
                                                     << " input features, the data " << inputs->size());
      inputs = std::move(in);
    }
  }
};

class RegressTask final : public CsvTask {
 public:
  RegressTask(const nlohmann::json& cfg, const std::string& path)
      : CsvTask(cfg, path, CsvTarget::Values), reg_(cfg) {
    outputs_ = csv_.num_values();
    // Statistics of the training rows only: the held-out rows stay unseen.
    std::vector<float> values, features;
    for (int64_t i : train_idx_) {
      values.insert(values.end(), csv_.values(i), csv_.values(i) + csv_.num_values());
      if (!csv_.is_tokens()) features.insert(features.end(), csv_.sequence(i).begin(), csv_.sequence(i).end());
    }
    reg_.targets = Normalization::fit(csv_.value_names(), values);
    if (!csv_.is_tokens()) {
      std::vector<std::string> names;
      for (int64_t f = 0; f < csv_.features(); ++f) names.push_back("feature " + std::to_string(f));
      reg_.inputs = Normalization::fit(names, features);
    }
    meta_[kNormKey] = reg_.metadata();
  }
  // Rows read with a trained model's schema (`lstm eval --data`), normalised with its statistics.
  RegressTask(const nlohmann::json& cfg, CsvDataset csv, const std::string& path,
              const std::map<std::string, std::string>& meta, const std::string& file)
      : CsvTask(std::move(csv), path), reg_(cfg) {
    outputs_ = csv_.num_values();
    reg_.targets.names = csv_.value_names();
    if (!csv_.is_tokens()) reg_.inputs = Normalization::fit(std::vector<std::string>(static_cast<size_t>(csv_.features()), "x"), {});
    reg_.adopt(meta, file);
    meta_[kNormKey] = reg_.metadata();
  }
  bool regression() const override { return true; }
  LossResult loss(const Act& out, const Batch& b) const override { return reg_.loss(out, b, "regress"); }
  void add_eval(const Act& out, const Batch& b, const LossResult& lr, EvalSums& sums) const override {
    Task::add_eval(out, b, lr, sums);
    reg_.add_eval(out, b, sums);
  }
  void adopt_model_metadata(const std::map<std::string, std::string>& meta, const std::string& file) override {
    Task::adopt_model_metadata(meta, file);
    reg_.adopt(meta, file);
    meta_[kNormKey] = reg_.metadata();
  }

 private:
  Batch prepare(Batch b) const override {
    if (reg_.inputs) {
      // Steps past a length stay zero.
      const int64_t T = b.inputs.size(0), B = b.inputs.size(1), F = b.inputs.size(2);
      float* x = b.inputs.data<float>();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < B; ++k)
          if (t < b.lengths[static_cast<size_t>(k)]) reg_.inputs->apply(x + (t * B + k) * F, 1);
    }
    reg_.targets.apply(b.targets.data<float>(), b.targets.size(0));
    return b;
  }
  RegressionPart reg_;
};

class ForecastTask final : public Task {
 public:
  ForecastTask(const nlohmann::json& cfg, const std::string& path) : reg_(cfg) {
    series_ = TimeSeries::load(path, strings_of(cfg["data"]["input_columns"]), strings_of(cfg["data"]["target_columns"]));
    T_ = cfg["train"]["seq_len"].get<int64_t>();
    H_ = cfg["data"]["horizon"].get<int64_t>();
    const int64_t n = series_.steps();
    const double vf = cfg["data"]["valid_fraction"].get<double>();
    // The end of the series is held out; a training window never reaches into it.
    n_valid_ = std::llround(static_cast<double>(n) * vf);
    if (vf > 0 && n_valid_ < H_) n_valid_ = std::min<int64_t>(H_, n);
    const int64_t n_train = n - n_valid_;
    LSTM_REQUIRE(n_train >= T_ + H_,
                 path << ": the series has " << n << " steps, " << n_valid_ << " of them held out for validation "
                      << "(data.valid_fraction " << vf << "), leaving " << n_train
                      << " for training: fewer than one window of train.seq_len (" << T_ << ") + data.horizon (" << H_
                      << ") = " << T_ + H_ << " steps");
    train_starts_ = n_train - T_ - H_ + 1;
    // Validation windows predict held-out steps only; their inputs may reach back into training.
    valid_starts_ = n_valid_ >= H_ ? n_valid_ - H_ + 1 : 0;
    valid_first_ = n - n_valid_ - T_;  // the window predicting the first held-out step
    description_ = "the windows predicting the held-out last " + percent(vf) + " of the series " + path;
    path_ = path;
    std::vector<float> in(series_.input_row(0), series_.input_row(0) + n_train * series_.num_inputs());
    std::vector<float> tg(series_.target_row(0), series_.target_row(0) + n_train * series_.num_targets());
    reg_.inputs = Normalization::fit(series_.input_names(), in);
    reg_.targets = Normalization::fit(series_.target_names(), tg);
    input_ = {SignalKind::Sequence, series_.num_inputs()};
    outputs_ = checked_mul(H_, series_.num_targets(), "data.horizon * target columns");
    meta_[kNormKey] = reg_.metadata();
  }
  bool regression() const override { return true; }
  int64_t batch_steps(int64_t) const override { return T_; }
  const char* rate_unit() const override { return "targets/s"; }

  Batch train_batch(int64_t B, int64_t, Rng& rng) const override {
    std::vector<int64_t> starts(static_cast<size_t>(B));
    for (auto& s : starts) s = static_cast<int64_t>(rng.below(static_cast<uint64_t>(train_starts_)));
    return prepare(series_.windows(starts, T_, H_));
  }
  int64_t valid_batches(int64_t B, int64_t) const override { return (valid_starts_ + B - 1) / B; }
  Batch valid_batch(int64_t B, int64_t, int64_t i) const override {
    std::vector<int64_t> starts;
    for (int64_t k = i * B; k < std::min((i + 1) * B, valid_starts_); ++k) starts.push_back(valid_first_ + k);
    return prepare(series_.windows(starts, T_, H_));
  }
  LossResult loss(const Act& out, const Batch& b) const override { return reg_.loss(out, b, "forecast"); }
  const char* rate_key() const override { return "targets_per_s"; }
  // Every window of the series becomes the evaluated split (`lstm eval --data`).
  void use_all_windows() {
    valid_first_ = 0;
    valid_starts_ = series_.steps() - T_ - H_ + 1;
    description_ = "every window of the series " + path_;
  }
  void add_eval(const Act& out, const Batch& b, const LossResult& lr, EvalSums& sums) const override {
    Task::add_eval(out, b, lr, sums);
    reg_.add_eval(out, b, sums);
  }
  void adopt_model_metadata(const std::map<std::string, std::string>& meta, const std::string& file) override {
    Task::adopt_model_metadata(meta, file);
    reg_.adopt(meta, file);
    meta_[kNormKey] = reg_.metadata();
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "data: a series of " << series_.steps() << " steps, the last " << n_valid_ << " held out; "
       << train_starts_ << " training windows and " << valid_starts_ << " held-out ones of " << T_ << " steps, "
       << series_.num_inputs() << " input" << (series_.num_inputs() == 1 ? "" : "s") << ", predicting " << H_
       << " step" << (H_ == 1 ? "" : "s") << " of " << series_.num_targets() << " target"
       << (series_.num_targets() == 1 ? "" : "s");
    return os.str();
  }

 private:
  Batch prepare(Batch b) const {
    reg_.inputs->apply(b.inputs.data<float>(), b.inputs.size(0) * b.inputs.size(1));
    reg_.targets.apply(b.targets.data<float>(), b.targets.numel() / reg_.targets.size());
    return b;
  }
  TimeSeries series_;
  RegressionPart reg_;
  std::string path_;
  int64_t T_ = 0, H_ = 0, n_valid_ = 0, train_starts_ = 0, valid_starts_ = 0, valid_first_ = 0;
};

class CharLmTask final : public Task {
 public:
  CharLmTask(const nlohmann::json& cfg, const std::string& path) {
    corpus_ = CharCorpus::load({path}, cfg["data"]["valid_fraction"].get<double>(), cfg["data"]["max_bytes"].get<int64_t>());
    input_ = {SignalKind::Tokens, corpus_.vocab().size()};
    outputs_ = corpus_.vocab().size();
    meta_["lstm_engine.vocab"] = corpus_.vocab().to_json().dump();
    description_ = "the held-out last " + percent(cfg["data"]["valid_fraction"].get<double>()) + " of the text of " + path;
  }
  // All of a text read with a trained model's vocabulary (`lstm eval --data`).
  CharLmTask(CharCorpus corpus, const std::string& path) : corpus_(std::move(corpus)) {
    input_ = {SignalKind::Tokens, corpus_.vocab().size()};
    outputs_ = corpus_.vocab().size();
    unknown_ = corpus_.unknown_chars();
    description_ = "all of " + path;
  }
  Batch train_batch(int64_t B, int64_t T, Rng& rng) const override { return corpus_.train_batch(B, T, rng); }
  int64_t valid_batches(int64_t B, int64_t T) const override { return corpus_.valid_batches(B, T); }
  Batch valid_batch(int64_t B, int64_t T, int64_t i) const override { return corpus_.valid_batch(B, T, i); }
  LossResult loss(const Act& out, const Batch& b) const override { return class_loss(out, b, outputs_); }
  std::string describe() const override {
    std::ostringstream os;
    os << "data: " << corpus_.train_size() << " training characters, " << corpus_.valid_size()
       << " held out, vocabulary " << corpus_.vocab().size();
    return os.str();
  }
  const char* rate_unit() const override { return "tok/s"; }
  const char* rate_key() const override { return "tokens_per_s"; }
  const CharCorpus* corpus() const override { return &corpus_; }

 private:
  CharCorpus corpus_;
};

}  // namespace

void Task::add_eval(const Act&, const Batch&, const LossResult& lr, EvalSums& sums) const {
  sums.loss_sum += lr.loss * static_cast<double>(lr.count);
  sums.count += lr.count;
  sums.correct += lr.correct;
}

EvalSums Task::start_eval() const {
  EvalSums s;
  if (!class_names_.empty()) s.confusion = ConfusionMatrix(static_cast<int64_t>(class_names_.size()));
  return s;
}

EvalResult Task::eval_result(const EvalSums& s) const {
  EvalResult r;
  r.task = name_;
  r.data = description_;
  r.unknown = unknown_;
  r.count = s.count;
  r.regression = regression();
  if (!class_names_.empty()) {
    r.class_names = class_names_;
    r.confusion = s.confusion;
    r.per_class = class_metrics(r.confusion, r.class_names);
    for (const auto& c : r.per_class) r.macro_f1 += c.f1 / static_cast<double>(r.per_class.size());
  }
  if (s.count == 0) return r;
  const auto n = static_cast<double>(s.count);
  r.loss = s.loss_sum / n;
  if (regression()) {
    r.mse = s.sq_err / n;
    r.mae = s.abs_err / n;
    r.rmse = std::sqrt(r.mse);
  } else {
    r.accuracy = static_cast<double>(s.correct) / n;
  }
  return r;
}

void Task::adopt_model_metadata(const std::map<std::string, std::string>& meta, const std::string& file) {
  (void)file;
  for (const char* key : {"lstm_engine.vocab", "lstm_engine.classes", "lstm_engine.tokens"}) {
    auto a = meta.find(key);
    auto b = meta_.find(key);
    if (a != meta.end() && b != meta_.end())
      LSTM_REQUIRE(a->second == b->second, "the data " << meta_.at("lstm_engine.data") << " does not match the model "
                                                       << file << " (its " << std::string(key).substr(12)
                                                       << " differ from the model's; for the training data: it changed "
                                                          "since the model was trained, so its held-out split is not "
                                                          "the one training used)");
  }
}

std::unique_ptr<Task> make_task(const nlohmann::json& cfg, const std::string& path_override) {
  const std::string task = cfg["task"].get<std::string>();
  const std::string path = path_override.empty() ? cfg["data"]["path"].get<std::string>() : path_override;
  LSTM_REQUIRE(!path.empty(), "config: 'data.path' is empty: give a text file or folder (charlm) or a CSV file "
                              "(classify, regress, tag, forecast)");
  std::unique_ptr<Task> t;
  if (task == "charlm")
    t = std::make_unique<CharLmTask>(cfg, path);
  else if (task == "classify")
    t = std::make_unique<ClassifyTask>(cfg, path);
  else if (task == "regress")
    t = std::make_unique<RegressTask>(cfg, path);
  else if (task == "forecast")
    t = std::make_unique<ForecastTask>(cfg, path);
  else if (task == "tag")
    t = std::make_unique<TagTask>(cfg, path);
  else
    LSTM_THROW("config: 'task' must be \"charlm\", \"classify\", \"regress\", \"forecast\" or \"tag\", got \"" << task
                                                                                                           << "\"");
  t->name_ = task;
  t->meta_["lstm_engine.task"] = task;
  t->meta_["lstm_engine.data"] = path;
  return t;
}

std::unique_ptr<Task> make_eval_task(const TrainedModel& m, const std::string& path) {
  std::unique_ptr<Task> t;
  if (m.task == "charlm") {
    t = std::make_unique<CharLmTask>(CharCorpus::load_for_eval({path}, stored_vocab(m)), path);
  } else if (m.task == "classify") {
    t = std::make_unique<ClassifyTask>(CsvDataset::load(path, stored_csv_schema(m),
                                                        m.config["data"]["label_column"].get<std::string>(),
                                                        m.config["data"]["sequence_column"].get<std::string>()),
                                       path);
  } else if (m.task == "regress" || m.task == "tag") {
    // Read with the model's tokens (others as its <unk>), tags and target columns.
    CsvSpec spec;
    spec.sequence_column = m.config["data"]["sequence_column"].get<std::string>();
    if (m.task == "tag") {
      spec.target = CsvTarget::Tags;
      spec.target_columns = {m.config["data"]["tags_column"].get<std::string>()};
      t = std::make_unique<TagTask>(CsvDataset::load(path, stored_csv_schema(m), spec), path);
    } else {
      spec.target = CsvTarget::Values;
      spec.target_columns = strings_of(m.config["data"]["target_columns"]);
      t = std::make_unique<RegressTask>(m.config, CsvDataset::load(path, stored_csv_schema(m), spec), path, m.meta, m.path);
    }
  } else {
    // forecast: read as training reads, checked against and normalised with the
    // model's vocabulary, classes and statistics; then all of it is evaluated.
    t = make_task(m.config, path);
    t->adopt_model_metadata(m.meta, m.path);
    if (auto* f = dynamic_cast<ForecastTask*>(t.get())) f->use_all_windows();
    return t;
  }
  t->name_ = m.task;
  t->meta_["lstm_engine.task"] = m.task;
  t->meta_["lstm_engine.data"] = path;
  return t;
}

nlohmann::json task_model_json(const nlohmann::json& cfg, const Task& task) {
  nlohmann::json layers = nlohmann::json::array();
  if (task.input().kind == SignalKind::Tokens) {
    int64_t dim = cfg["model"].value("embedding_dim", int64_t{32});
    layers.push_back({{"type", "embedding"}, {"num_embeddings", task.input().features}, {"embedding_dim", dim}});
  }
  const auto& user = cfg["model"]["layers"];
  LSTM_REQUIRE(user.is_array() && !user.empty(), "config: 'model.layers' must be a non-empty list of layers");
  for (size_t i = 0; i < user.size(); ++i) {
    nlohmann::json l = user[i];
    if (i + 1 == user.size() && field_is(l, "type", "dense") && !l.contains("out_features"))
      l["out_features"] = task.outputs();
    layers.push_back(l);
  }
  nlohmann::json input = {{"kind", signal_kind_name(task.input().kind)}, {"features", task.input().features}};
  return {{"input", input}, {"layers", layers}, {"dtype", "F32"}};
}

}  // namespace lstm
