// `lstm predict`: a trained model on new data, streamed a chunk of rows at a time. One Predictor
// per task turns a chunk of input into records; the writer (CSV or JSON Lines) knows no task.
#include "lstm/predict.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config_reader.hpp"
#include "lstm/checked.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"
#include "lstm/loss.hpp"
#include "lstm/train.hpp"
#include "train/trained_model.hpp"

namespace fs = std::filesystem;

namespace lstm {

namespace {

using ordered_json = nlohmann::ordered_json;

// One output row: its id, its CSV cells (one per Predictor::columns()) and its JSON fields.
struct Record {
  std::string id;
  bool id_is_number = false;
  std::vector<std::string> cells;
  ordered_json json = ordered_json::object();
};

// One task's prediction over a stream of input rows.
class Predictor {
 public:
  virtual ~Predictor() = default;
  // The first column's name (CSV header, JSON key): "id", or "step" for a forecast.
  virtual const char* id_column() const { return "id"; }
  // The CSV header after the id column.
  virtual std::vector<std::string> columns() const = 0;
  // Reads up to max_rows more input rows, runs the model on them and appends a record per row to
  // `out` (cleared first); returns how many (0: the input is done).
  virtual int64_t next(int64_t max_rows, std::vector<Record>& out) = 0;
  virtual int64_t unknown() const { return 0; }  // inputs read as <unk> so far
};

std::string format_prob(double p) {
  std::ostringstream os;
  os.precision(6);
  os << p;
  return os.str();
}

// ---- classify: a class per row, with every class's probability ----

class ClassifyPredictor final : public Predictor {
 public:
  ClassifyPredictor(TrainedModel& m, const std::string& data_path)
      : model_(m), schema_(stored_csv_schema(m)),
        reader_(data_path, schema_, m.config["data"]["sequence_column"].get<std::string>(), "", "id") {}

  std::vector<std::string> columns() const override {
    std::vector<std::string> c = {"predicted"};
    for (const auto& n : schema_.class_names) c.push_back("p_" + n);
    return c;
  }

  int64_t next(int64_t max_rows, std::vector<Record>& out) override {
    out.clear();
    const int64_t n = reader_.next(max_rows, rows_, ids_);
    if (n == 0) return 0;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t{0});
    const Batch b = rows_.batch(idx);
    Rng unused(0);
    const Act y = model_.model.forward(to_act(b, model_.model.placement().device), false, unused);
    const int64_t C = static_cast<int64_t>(schema_.class_names.size());
    LSTM_REQUIRE(y.data.dim() == 2 && y.data.size(0) == n && y.data.size(1) == C,
                 model_.path << ": the model outputs " << y.data.shape_str() << " for " << n << " rows, expected ["
                             << n << ", " << C << "] (one score per class)");
    const Tensor logits = y.data.cpu();
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<double> p = softmax_row(logits, r);
      const auto best = static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
      Record rec;
      rec.id = ids_[static_cast<size_t>(r)];
      rec.id_is_number = !reader_.has_id_column();
      rec.cells.push_back(schema_.class_names[best]);
      rec.json["predicted"] = schema_.class_names[best];
      ordered_json probs = ordered_json::object();
      for (int64_t c = 0; c < C; ++c) {
        rec.cells.push_back(format_prob(p[static_cast<size_t>(c)]));
        probs[schema_.class_names[static_cast<size_t>(c)]] = p[static_cast<size_t>(c)];
      }
      rec.json["probabilities"] = std::move(probs);
      out.push_back(std::move(rec));
    }
    return n;
  }

  int64_t unknown() const override { return reader_.unknown_tokens(); }

 private:
  TrainedModel& model_;
  CsvSchema schema_;
  CsvChunkReader reader_;
  CsvDataset rows_;
  std::vector<std::string> ids_;
};

// ---- charlm: the top-k next characters after each line ----

// Lines of a regular file, read in chunks (a line is held whole; nothing else is).
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    uint64_t size = 0;
    fd_ = std::make_unique<Fd>(open_regular_file(path, "text file " + path + ": ", size));
  }
  bool next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n', pos_);
      if (nl != std::string::npos) {
        line.assign(buf_, pos_, nl - pos_);
        pos_ = nl + 1;
        break;
      }
      if (eof_) {
        if (pos_ >= buf_.size()) return false;
        line.assign(buf_, pos_, std::string::npos);  // the last line, without a line break
        pos_ = buf_.size();
        break;
      }
      buf_.erase(0, pos_);
      pos_ = 0;
      const size_t old = buf_.size(), want = std::max<size_t>(size_t{1} << 16, old);
      buf_.resize(old + want);
      ssize_t r;
      do r = ::read(fd_->get(), buf_.data() + old, want);
      while (r < 0 && errno == EINTR);
      LSTM_REQUIRE(r >= 0, "text file " << path_ << ": read failed: " << std::strerror(errno));
      buf_.resize(old + static_cast<size_t>(r));
      eof_ = r == 0;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  }

 private:
  std::string path_;
  std::unique_ptr<Fd> fd_;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

class CharLmPredictor final : public Predictor {
 public:
  CharLmPredictor(TrainedModel& m, const std::string& data_path, int64_t top_k)
      : model_(m), vocab_(stored_vocab(m)), path_(data_path), lines_(data_path), k_(std::min(top_k, vocab_.size())) {
    // The context of an empty line: a line break, if the model knows one.
    int64_t unk = 0;
    std::vector<int64_t> nl;
    try {
      nl = vocab_.encode("\n", &unk);
    } catch (const Error&) {
    }
    if (nl.size() == 1 && unk == 0) newline_ = nl[0];
  }

  std::vector<std::string> columns() const override {
    std::vector<std::string> c;
    for (int64_t i = 1; i <= k_; ++i) {
      c.push_back("next_" + std::to_string(i));
      c.push_back("p_" + std::to_string(i));
    }
    return c;
  }

  int64_t next(int64_t max_rows, std::vector<Record>& out) override {
    out.clear();
    std::vector<std::vector<int64_t>> ctx;
    std::string line;
    while (static_cast<int64_t>(ctx.size()) < max_rows && lines_.next(line)) {
      ++line_no_;
      std::vector<int64_t> ids;
      try {
        ids = vocab_.encode(line, &unknown_);
      } catch (const Error& e) {
        LSTM_THROW(path_ << ":" << line_no_ << ": " << e.what());
      }
      if (ids.empty()) {
        LSTM_REQUIRE(newline_ >= 0, path_ << ":" << line_no_ << ": the line is empty, and the model's vocabulary "
                                          << "has no line break to read in its place (nothing to predict from)");
        ids.push_back(newline_);
      }
      ctx.push_back(std::move(ids));
    }
    const auto B = static_cast<int64_t>(ctx.size());
    if (B == 0) return 0;
    int64_t T = 0;
    Batch b;
    b.lengths.resize(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) T = std::max(T, b.lengths[static_cast<size_t>(i)] = static_cast<int64_t>(ctx[static_cast<size_t>(i)].size()));
    b.inputs = Tensor::zeros({T, B}, DType::I64);
    int64_t* x = b.inputs.data<int64_t>();
    for (int64_t i = 0; i < B; ++i)
      for (int64_t t = 0; t < b.lengths[static_cast<size_t>(i)]; ++t)
        x[t * B + i] = ctx[static_cast<size_t>(i)][static_cast<size_t>(t)];
    Rng unused(0);
    const Act y = model_.model.forward(to_act(b), false, unused);
    const int64_t C = vocab_.size();
    LSTM_REQUIRE(y.data.dim() == 3 && y.data.size(0) == T && y.data.size(1) == B && y.data.size(2) == C,
                 model_.path << ": the model outputs " << y.data.shape_str() << ", expected [" << T << ", " << B << ", "
                             << C << "] (a score per character per step)");
    // Each context's last step only.
    Tensor last = Tensor::empty({B, C}, DType::F32);
    const Tensor all = y.data.cpu().to(DType::F32);
    const float* src = all.data<float>();
    for (int64_t i = 0; i < B; ++i)
      std::copy_n(src + ((b.lengths[static_cast<size_t>(i)] - 1) * B + i) * C, C, last.data<float>() + i * C);
    std::vector<size_t> order(static_cast<size_t>(C));
    for (int64_t i = 0; i < B; ++i) {
      const std::vector<double> p = softmax_row(last, i);
      std::iota(order.begin(), order.end(), size_t{0});
      std::partial_sort(order.begin(), order.begin() + k_, order.end(),
                        [&](size_t a, size_t c) { return p[a] > p[c] || (p[a] == p[c] && a < c); });
      Record rec;
      rec.id = std::to_string(first_line_ + i);
      rec.id_is_number = true;
      ordered_json top = ordered_json::array();
      for (int64_t j = 0; j < k_; ++j) {
        const size_t c = order[static_cast<size_t>(j)];
        const std::string ch = vocab_.decode_one(static_cast<int64_t>(c));
        rec.cells.push_back(ch);
        rec.cells.push_back(format_prob(p[c]));
        top.push_back({{"next", ch}, {"p", p[c]}});
      }
      rec.json["top"] = std::move(top);
      out.push_back(std::move(rec));
    }
    first_line_ += B;
    return B;
  }

  int64_t unknown() const override { return unknown_; }

 private:
  TrainedModel& model_;
  Vocab vocab_;
  std::string path_;
  LineReader lines_;
  int64_t k_;
  int64_t newline_ = -1;
  int64_t line_no_ = 0, first_line_ = 1, unknown_ = 0;
};

// ---- regress, tag, forecast: shared pieces ----

// A number in original units, written with the fewest digits that read back as the same float.
std::string format_value(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
  return ec == std::errc() ? std::string(buf, end) : format_prob(v);
}

// The normalisation statistics a regress or forecast model stores ("lstm_engine.normalization"):
// inputs (numeric models only) and targets, exactly as training and evaluation apply them.
struct StoredNormalization {
  std::optional<Normalization> inputs;
  Normalization targets;

  // Appends one prediction (the targets.size() normalised values at v[first...]) to `rec` in the
  // targets' original units: a CSV cell per target and {"values": {name: value}} for JSON Lines,
  // both with the CSV's digits.
  void add_values(Record& rec, const Tensor& v, int64_t first) const {
    ordered_json values = ordered_json::object();
    for (size_t k = 0; k < targets.names.size(); ++k) {
      const double x = v.get(first + static_cast<int64_t>(k)) * targets.std[k] + targets.mean[k];
      rec.cells.push_back(format_value(x));
      values[targets.names[k]] = std::stod(rec.cells.back());
    }
    rec.json["values"] = std::move(values);
  }
};

StoredNormalization stored_normalization(const TrainedModel& m) {
  constexpr const char* key = "lstm_engine.normalization";
  auto it = m.meta.find(key);
  LSTM_REQUIRE(it != m.meta.end(), m.path << ": no normalisation statistics in its metadata (\"" << key
                                          << "\"), which a regression or forecasting model needs");
  const std::string what = m.path + ": metadata \"" + key + "\"";
  const nlohmann::json j = parse_json(it->second, what);
  LSTM_REQUIRE(j.is_object() && j.contains("inputs") && j.contains("targets"),
               what << ": expected {\"inputs\", \"targets\"}, got " << json_excerpt(j));
  StoredNormalization n;
  n.targets = Normalization::from_json(j["targets"], what + ".targets");
  if (!j["inputs"].is_null()) n.inputs = Normalization::from_json(j["inputs"], what + ".inputs");
  const Signal& in = m.model.input_signal();
  LSTM_REQUIRE((in.kind == SignalKind::Tokens) == !n.inputs.has_value(),
               what << ": the model reads " << (in.kind == SignalKind::Tokens ? "tokens" : "numbers") << " but "
                    << (n.inputs ? "has" : "has no") << " input statistics");
  LSTM_REQUIRE(!n.inputs || n.inputs->size() == in.features,
               what << ": " << n.inputs->size() << " input statistics, the model reads " << in.features << " features");
  return n;
}

// Normalises the numeric steps of a batch in place (steps past a length stay zero).
void normalize_inputs(const Normalization& norm, Batch& b) {
  const int64_t T = b.inputs.size(0), B = b.inputs.size(1), F = b.inputs.size(2);
  float* x = b.inputs.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < B; ++k)
      if (t < b.lengths[static_cast<size_t>(k)]) norm.apply(x + (t * B + k) * F, 1);
}

// Rows of a CSV file with a model's sequence column, a chunk at a time; ids as classify has them.
struct CsvRows {
  CsvRows(const TrainedModel& m, const std::string& path)
      : schema(stored_csv_schema(m)),
        reader(path, schema, CsvSpec{m.config["data"]["sequence_column"].get<std::string>(), CsvTarget::Label, {}}, "id") {}
  // The next chunk as a batch (inputs only); 0 rows at the end.
  int64_t next(int64_t max_rows, Batch& b) {
    const int64_t n = reader.next(max_rows, rows, ids);
    if (n == 0) return 0;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t{0});
    b = rows.batch(idx);
    return n;
  }
  Record record(int64_t r) const {
    Record rec;
    rec.id = ids[static_cast<size_t>(r)];
    rec.id_is_number = !reader.has_id_column();
    return rec;
  }
  CsvSchema schema;
  CsvChunkReader reader;
  CsvDataset rows;
  std::vector<std::string> ids;
};

// ---- regress: the target columns' values per row, in original units ----

class RegressPredictor final : public Predictor {
 public:
  RegressPredictor(TrainedModel& m, const std::string& data_path)
      : model_(m), norm_(stored_normalization(m)), rows_(m, data_path) {}

  std::vector<std::string> columns() const override { return norm_.targets.names; }

  int64_t next(int64_t max_rows, std::vector<Record>& out) override {
    out.clear();
    Batch b;
    const int64_t n = rows_.next(max_rows, b);
    if (n == 0) return 0;
    if (norm_.inputs) normalize_inputs(*norm_.inputs, b);
    Rng unused(0);
    const Act y = model_.model.forward(to_act(b, model_.model.placement().device), false, unused);
    const int64_t K = norm_.targets.size();
    LSTM_REQUIRE(y.data.dim() == 2 && y.data.size(0) == n && y.data.size(1) == K,
                 model_.path << ": the model outputs " << y.data.shape_str() << " for " << n << " rows, expected ["
                             << n << ", " << K << "] (one value per target column)");
    const Tensor v = y.data.cpu();
    for (int64_t r = 0; r < n; ++r) {
      Record rec = rows_.record(r);
      norm_.add_values(rec, v, r * K);
      out.push_back(std::move(rec));
    }
    return n;
  }

  int64_t unknown() const override { return rows_.reader.unknown_tokens(); }

 private:
  TrainedModel& model_;
  StoredNormalization norm_;
  CsvRows rows_;
};

// ---- tag: a label per step of each row ----

class TagPredictor final : public Predictor {
 public:
  TagPredictor(TrainedModel& m, const std::string& data_path) : model_(m), rows_(m, data_path) {}

  std::vector<std::string> columns() const override { return {"tags"}; }

  int64_t next(int64_t max_rows, std::vector<Record>& out) override {
    out.clear();
    Batch b;
    const int64_t n = rows_.next(max_rows, b);
    if (n == 0) return 0;
    Rng unused(0);
    const Act y = model_.model.forward(to_act(b, model_.model.placement().device), false, unused);
    const std::vector<std::string>& names = rows_.schema.class_names;
    const auto C = static_cast<int64_t>(names.size());
    const int64_t T = b.inputs.size(0);
    LSTM_REQUIRE(y.data.dim() == 3 && y.data.size(0) == T && y.data.size(1) == n && y.data.size(2) == C,
                 model_.path << ": the model outputs " << y.data.shape_str() << " for " << n << " rows of " << T
                             << " steps, expected [" << T << ", " << n << ", " << C << "] (a score per tag per step)");
    const Tensor logits = y.data.cpu().reshape({T * n, C});
    for (int64_t r = 0; r < n; ++r) {
      Record rec = rows_.record(r);
      std::string cell;
      ordered_json tags = ordered_json::array(), probs = ordered_json::array();
      for (int64_t t = 0; t < b.lengths[static_cast<size_t>(r)]; ++t) {
        const std::vector<double> p = softmax_row(logits, t * n + r);
        const auto best = static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
        cell += (t ? " " : "") + names[best];
        tags.push_back(names[best]);
        ordered_json step = ordered_json::object();
        for (size_t c = 0; c < names.size(); ++c) step[names[c]] = p[c];
        probs.push_back(std::move(step));
      }
      rec.cells.push_back(std::move(cell));
      rec.json["tags"] = std::move(tags);
      rec.json["probabilities"] = std::move(probs);
      out.push_back(std::move(rec));
    }
    return n;
  }

  int64_t unknown() const override { return rows_.reader.unknown_tokens(); }

 private:
  TrainedModel& model_;
  CsvRows rows_;
};

// ---- forecast: the next horizon steps after the end of a series ----

class ForecastPredictor final : public Predictor {
 public:
  ForecastPredictor(TrainedModel& m, const std::string& data_path) : model_(m), norm_(stored_normalization(m)) {
    const auto& data = m.config["data"];
    std::vector<std::string> inputs;
    for (const auto& c : data["input_columns"].empty() ? data["target_columns"] : data["input_columns"])
      inputs.push_back(c.get<std::string>());
    T_ = m.config["train"]["seq_len"].get<int64_t>();
    H_ = data["horizon"].get<int64_t>();
    LSTM_REQUIRE(norm_.inputs && norm_.inputs->size() == static_cast<int64_t>(inputs.size()),
                 m.path << ": the model's input statistics do not match its " << inputs.size() << " input columns");
    // Only the input columns are read: the targets are what is predicted.
    series_ = TimeSeries::load(data_path, inputs, inputs);
    LSTM_REQUIRE(series_.steps() >= T_, data_path << ": the series has " << series_.steps()
                                                  << " rows, but the model forecasts from the last train.seq_len = "
                                                  << T_ << " rows (its context): give at least " << T_ << " rows");
  }

  const char* id_column() const override { return "step"; }
  std::vector<std::string> columns() const override { return norm_.targets.names; }

  int64_t next(int64_t, std::vector<Record>& out) override {
    out.clear();
    if (done_) return 0;
    done_ = true;
    // The context: the last T rows, [T, 1, F].
    const int64_t F = series_.num_inputs(), first = series_.steps() - T_;
    Batch b;
    b.lengths = {T_};
    b.inputs = Tensor::empty({T_, 1, F}, DType::F32);
    std::copy_n(series_.input_row(first), T_ * F, b.inputs.data<float>());
    normalize_inputs(*norm_.inputs, b);
    Rng unused(0);
    const Act y = model_.model.forward(to_act(b, model_.model.placement().device), false, unused);
    const int64_t K = norm_.targets.size();
    LSTM_REQUIRE(y.data.dim() == 2 && y.data.size(0) == 1 && y.data.size(1) == H_ * K,
                 model_.path << ": the model outputs " << y.data.shape_str() << " for one window, expected [1, " << H_ * K
                             << "] (data.horizon " << H_ << " x " << K << " target columns)");
    const Tensor v = y.data.cpu();
    for (int64_t h = 0; h < H_; ++h) {
      Record rec;
      rec.id = std::to_string(h + 1);
      rec.id_is_number = true;
      norm_.add_values(rec, v, h * K);
      out.push_back(std::move(rec));
    }
    return H_;
  }

 private:
  TrainedModel& model_;
  StoredNormalization norm_;
  TimeSeries series_;
  int64_t T_ = 0, H_ = 0;
  bool done_ = false;
};

// The tasks that can predict. A new task: a Predictor above and a row here.
struct PredictorEntry {
  const char* task;
  std::function<std::unique_ptr<Predictor>(TrainedModel&, const PredictOptions&)> make;
};

const std::vector<PredictorEntry>& predictors() {
  static const std::vector<PredictorEntry> table = {
      {"classify", [](TrainedModel& m, const PredictOptions& o) { return std::make_unique<ClassifyPredictor>(m, o.data_path); }},
      {"charlm",
       [](TrainedModel& m, const PredictOptions& o) { return std::make_unique<CharLmPredictor>(m, o.data_path, o.top_k); }},
      {"regress", [](TrainedModel& m, const PredictOptions& o) { return std::make_unique<RegressPredictor>(m, o.data_path); }},
      {"tag", [](TrainedModel& m, const PredictOptions& o) { return std::make_unique<TagPredictor>(m, o.data_path); }},
      {"forecast",
       [](TrainedModel& m, const PredictOptions& o) { return std::make_unique<ForecastPredictor>(m, o.data_path); }},
  };
  return table;
}

// ---- output ----

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos && (s.empty() || (s.front() != ' ' && s.back() != ' '))) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_records(std::ostream& os, bool jsonl, const char* id_key, const std::vector<Record>& recs) {
  for (const Record& r : recs) {
    if (jsonl) {
      ordered_json j = ordered_json::object();
      if (r.id_is_number)
        j[id_key] = std::stoll(r.id);
      else
        j[id_key] = r.id;
      for (auto it = r.json.begin(); it != r.json.end(); ++it) j[it.key()] = it.value();
      os << j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
    } else {
      os << csv_cell(r.id);
      for (const auto& c : r.cells) os << ',' << csv_cell(c);
      os << "\n";
    }
  }
}

}  // namespace

PredictResult predict(const PredictOptions& opts, std::ostream& out) {
  checked_size(opts.top_k, 1, kMaxDim, "top-k");
  checked_size(opts.batch_size, 1, kMaxDim, "prediction batch size");
  LSTM_REQUIRE(!opts.data_path.empty(), "predict: no input data given (--data FILE)");
  PredictResult res;
  const bool to_stream = opts.output_path.empty() || opts.output_path == "-";
  res.format = opts.format;
  if (res.format.empty()) {
    const std::string ext = fs::path(opts.output_path).extension().string();
    res.format = !to_stream && (ext == ".jsonl" || ext == ".ndjson") ? "jsonl" : "csv";
  }
  LSTM_REQUIRE(res.format == "csv" || res.format == "jsonl",
               "--format must be csv or jsonl, got '" << printable(res.format) << "'");
  if (!to_stream) {
    std::error_code ec;
    LSTM_REQUIRE(!fs::equivalent(opts.output_path, opts.data_path, ec),
                 "--output " << opts.output_path << " is the input file itself; give another file");
  }

  TrainedModel m = load_trained_model(opts.model_path, opts.placement, opts.allow_nonfinite);
  res.task = m.task;
  const auto& table = predictors();
  auto it = std::find_if(table.begin(), table.end(), [&](const PredictorEntry& e) { return m.task == e.task; });
  LSTM_REQUIRE(it != table.end(), m.path << ": predictions for task '" << m.task << "' are not supported yet");
  std::unique_ptr<Predictor> p = it->make(m, opts);

  // A file is written under a temporary name and renamed when complete: an error leaves none.
  const std::string tmp = to_stream ? std::string() : opts.output_path + ".tmp." + std::to_string(::getpid());
  std::ofstream file;
  if (!to_stream) {
    file.open(tmp, std::ios::binary | std::ios::trunc);
    LSTM_REQUIRE(file, "--output " << opts.output_path << ": cannot write " << tmp << ": " << std::strerror(errno));
  }
  std::ostream& os = to_stream ? out : file;
  const bool jsonl = res.format == "jsonl";
  try {
    // The header goes out with the first chunk, so that input refused at once writes nothing.
    bool header = jsonl;
    auto write_header = [&] {
      if (header) return;
      header = true;
      os << p->id_column();
      for (const auto& c : p->columns()) os << ',' << csv_cell(c);
      os << "\n";
    };
    std::vector<Record> recs;
    while (p->next(opts.batch_size, recs) > 0) {
      write_header();
      write_records(os, jsonl, p->id_column(), recs);
      res.rows += static_cast<int64_t>(recs.size());
      os.flush();
      LSTM_REQUIRE(os, "predict: writing " << (to_stream ? std::string("the output") : tmp) << " failed");
    }
    write_header();
    if (!to_stream) {
      file.close();
      LSTM_REQUIRE(file, "--output " << opts.output_path << ": writing " << tmp << " failed");
      fs::rename(tmp, opts.output_path);
    }
  } catch (...) {
    if (!to_stream) {
      std::error_code ec;
      fs::remove(tmp, ec);
    }
    throw;
  }
  res.unknown = p->unknown();
  return res;
}

}  // namespace lstm
