// Datasets: character-level language modelling on UTF-8 text; sequence classification,
// regression and per-step tagging from CSV; numeric time series for forecasting. Batches are
// built on the host, sequence-major, ready for Model::forward.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

namespace lstm {

struct Batch {
  Tensor inputs;                 // tokens: I64 [T, B]; numeric features: F32 [T, B, F]
  std::vector<int64_t> lengths;  // B values in [1, T]
  // Classes: I64 [T, B] (a label per step; -100 = ignore) or [B] (per sequence).
  // Values (regression, forecasting): F32 [B, K] (K values per sequence).
  Tensor targets;
};

// Characters (Unicode code points, from UTF-8) <-> ids 0..size()-1, in order of first sorting.
class Vocab {
 public:
  Vocab() = default;
  // Every distinct code point of `text`, sorted. Throws on invalid UTF-8 naming the byte offset.
  static Vocab from_text(const std::string& text);
  static Vocab from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;  // array of the characters as UTF-8 strings
  int64_t size() const { return static_cast<int64_t>(chars_.size()); }
  // Throws naming the first character not in the vocabulary (and its byte offset).
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // throws on an id out of range
  std::string decode_one(int64_t id) const;

 private:
  std::vector<char32_t> chars_;
  std::map<char32_t, int64_t> index_;
};

// Character-level language modelling: the text is encoded once; a batch is B windows of T+1
// characters at random offsets (inputs = first T, targets = last T).
class CharCorpus {
 public:
  // Reads every file named (a folder: every regular file in it, sorted by name, skipping
  // files that are not valid UTF-8 text). valid_fraction of the text (its end) is held out.
  static CharCorpus load(const std::vector<std::string>& paths, double valid_fraction = 0.05,
                         int64_t max_bytes = -1);
  static CharCorpus from_text(const std::string& text, double valid_fraction = 0.05);
  const Vocab& vocab() const { return vocab_; }
  int64_t train_size() const { return static_cast<int64_t>(train_.size()); }
  int64_t valid_size() const { return static_cast<int64_t>(valid_.size()); }
  // Random windows from the training split; throws if the split is shorter than steps + 1.
  Batch train_batch(int64_t batch, int64_t steps, Rng& rng) const;
  // Deterministic consecutive windows of the validation split (index-th batch, wrapping); the
  // last batch holds the windows left over and may be smaller. valid_batches() batches cover
  // every window once (0 when not even one window of steps + 1 characters fits).
  Batch valid_batch(int64_t batch, int64_t steps, int64_t index) const;
  int64_t valid_batches(int64_t batch, int64_t steps) const;

 private:
  Vocab vocab_;
  std::vector<int64_t> train_, valid_;
};

// What a CSV row's target is: a class label per sequence (classify), numbers per sequence
// (regress), or a class label per step (tag).
enum class CsvTarget { Label, Values, Tags };

struct CsvSpec {
  std::string sequence_column = "sequence";
  CsvTarget target = CsvTarget::Label;
  // Label and Tags: exactly one column (the label, or the tags); Values: one or more columns.
  std::vector<std::string> target_columns = {"label"};
};

// Sequences from CSV. The first row is a header. One column holds the sequence: space-separated
// steps, each a number or numbers joined by '|' (numeric features, F per step) or, when any step
// is not a number, a token (tokens get a vocabulary of their own). The target is
//   Label:  one column; integers are used as class ids, any other strings are mapped to ids in
//           sorted order;
//   Values: one or more columns, each a finite number (as float) per row;
//   Tags:   one column of space-separated labels, exactly one per step of the row's sequence,
//           mapped to class ids as labels are (integers as ids, else sorted names).
// Quoted fields ("...") may hold commas. Errors name the file, line and column.
class CsvDataset {
 public:
  static CsvDataset load(const std::string& path, const std::string& label_column = "label",
                         const std::string& sequence_column = "sequence");
  static CsvDataset load(const std::string& path, const CsvSpec& spec);
  int64_t size() const { return static_cast<int64_t>(sequences_.size()); }
  CsvTarget target() const { return target_; }
  // Label and Tags: the classes (ids 0..num_classes()-1 in this order).
  int64_t num_classes() const { return static_cast<int64_t>(class_names_.size()); }
  const std::vector<std::string>& class_names() const { return class_names_; }
  // Values: K target columns per row, in the order the spec named them.
  int64_t num_values() const { return static_cast<int64_t>(value_names_.size()); }
  const std::vector<std::string>& value_names() const { return value_names_; }
  bool is_tokens() const { return tokens_; }
  int64_t features() const { return features_; }           // numeric: F; tokens: vocabulary size
  int64_t max_length() const;  // steps of the longest sequence (a batch's padded length at most)
  const std::vector<std::string>& token_names() const { return token_names_; }
  // Row i: its sequence (numeric: steps*F values, step-major; tokens: ids as floats) and, for
  // Values, its K targets.
  const std::vector<float>& sequence(int64_t i) const { return sequences_.at(static_cast<size_t>(i)); }
  const float* values(int64_t i) const { return values_.data() + i * num_values(); }
  // Rows [indices], padded to the longest (pad value 0). Targets: Label I64 [B]; Values F32
  // [B, K]; Tags I64 [T, B] with -100 past each row's length.
  Batch batch(const std::vector<int64_t>& indices) const;
  // Splits rows into (train, valid) index lists, shuffled by rng, valid_fraction held out.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> split(double valid_fraction, Rng& rng) const;

 private:
  CsvTarget target_ = CsvTarget::Label;
  bool tokens_ = false;
  int64_t features_ = 0;
  std::vector<std::vector<float>> sequences_;  // numeric: T*F values; tokens: ids
  std::vector<int64_t> labels_;                // Label
  std::vector<std::vector<int64_t>> tags_;     // Tags: one class id per step
  std::vector<float> values_;                  // Values: size() * K
  std::vector<std::string> class_names_, value_names_, token_names_;
};

// A numeric time series from CSV: a header row, then one row per time step, in time order.
// The named input and target columns must hold a finite number (as float) in every row; other
// columns (a date, say) are not read. Errors name the file, line and column.
class TimeSeries {
 public:
  // `inputs` empty: the targets are the inputs (an autoregressive forecast). Columns may appear
  // in both lists.
  static TimeSeries load(const std::string& path, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& targets);
  int64_t steps() const { return steps_; }
  int64_t num_inputs() const { return static_cast<int64_t>(input_names_.size()); }
  int64_t num_targets() const { return static_cast<int64_t>(target_names_.size()); }
  const std::vector<std::string>& input_names() const { return input_names_; }
  const std::vector<std::string>& target_names() const { return target_names_; }
  // Row t's inputs (num_inputs() values) and targets (num_targets() values).
  const float* input_row(int64_t t) const { return inputs_.data() + t * num_inputs(); }
  const float* target_row(int64_t t) const { return targets_.data() + t * num_targets(); }
  // Windows starting at `starts`: inputs F32 [seq_len, B, num_inputs] from rows s..s+seq_len-1,
  // targets F32 [B, horizon * num_targets] from rows s+seq_len..s+seq_len+horizon-1 (step-major:
  // value k of step h at h * num_targets + k). Throws on a window past the end.
  Batch windows(const std::vector<int64_t>& starts, int64_t seq_len, int64_t horizon) const;

 private:
  int64_t steps_ = 0;
  std::vector<float> inputs_, targets_;  // steps * num_inputs, steps * num_targets
  std::vector<std::string> input_names_, target_names_;
};

// Per-column mean and standard deviation, fitted on a training split and applied as
// (x - mean) / std. A constant column (std 0, or not finite) gets std 1, so it maps to 0.
struct Normalization {
  std::vector<std::string> names;
  std::vector<double> mean, std;
  int64_t size() const { return static_cast<int64_t>(mean.size()); }
  // `rows` values per column, row-major (rows * names.size() values). No rows: mean 0, std 1.
  static Normalization fit(const std::vector<std::string>& names, const std::vector<float>& values);
  // In place on `n` rows of size() values each.
  void apply(float* x, int64_t n) const;
  nlohmann::json to_json() const;  // {"names": [...], "mean": [...], "std": [...]}
  // Throws naming `what` on a malformed object (sizes differ, a std not positive and finite).
  static Normalization from_json(const nlohmann::json& j, const std::string& what);
};

}  // namespace lstm
