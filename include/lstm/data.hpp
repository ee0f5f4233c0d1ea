// Datasets: character-level language modelling on UTF-8 text; sequence classification,
// regression and per-step tagging from CSV; numeric time series for forecasting. Batches are
// built on the host, sequence-major, ready for Model::forward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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

// The name of the id a vocabulary reserves for what it has never seen (characters of a character
// vocabulary, tokens of a CSV token vocabulary). Models trained by this version have one; older
// ones do not, and refuse unknown input by name.
inline constexpr const char* kUnknownToken = "<unk>";

// Characters (Unicode code points, from UTF-8) <-> ids 0..size()-1, in order of first sorting;
// with an unknown id (reserve_unk) that one comes last. Its JSON form is an array of the
// characters as UTF-8 strings, the unknown id written as "<unk>".
class Vocab {
 public:
  Vocab() = default;
  // Every distinct code point of `text`, sorted; reserve_unk adds the unknown id after them.
  // Throws on invalid UTF-8 naming the byte offset.
  static Vocab from_text(const std::string& text, bool reserve_unk = false);
  static Vocab from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  int64_t size() const { return static_cast<int64_t>(chars_.size()) + (unk_ >= 0 ? 1 : 0); }
  int64_t unk_id() const { return unk_; }  // -1: none
  // A character not in the vocabulary becomes unk_id(); without one, throws naming the first such
  // character (and its byte offset). `unknown` (if given) is incremented per unknown character.
  std::vector<int64_t> encode(const std::string& text, int64_t* unknown = nullptr) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // throws on an id out of range
  std::string decode_one(int64_t id) const;  // unk_id() decodes as "<unk>"

 private:
  std::vector<char32_t> chars_;
  std::map<char32_t, int64_t> index_;
  int64_t unk_ = -1;
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
  // For evaluating a trained model on other text: every file named is read as load() reads it and
  // ALL of the text becomes the held-out split, encoded with the model's `vocab` (characters it
  // lacks become its unknown id; without one, an error names the character). Throws when the text
  // has fewer than 2 characters.
  static CharCorpus load_for_eval(const std::vector<std::string>& paths, const Vocab& vocab, int64_t max_bytes = -1);
  int64_t unknown_chars() const { return unknown_; }  // characters read as the unknown id
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
  int64_t unknown_ = 0;
};

// What a trained classifier reads from CSV: its class names (a label's id is its position) and
// its input: tokens with the model's vocabulary (id = position; tokens not in it take the id of
// kUnknownToken, or are an error when the vocabulary has none), or `features` numbers per step.
struct CsvSchema {
  std::vector<std::string> class_names;
  bool tokens = false;
  std::vector<std::string> token_names;
  int64_t features = 0;  // numeric input: numbers per step (tokens: 0)
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
// is not a number, a token (tokens get a vocabulary of their own, sorted, then kUnknownToken
// unless the data holds it). The target is
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
  // Every row of `path` read with a trained model's schema (no decisions from the data): a label
  // that is not one of schema.class_names is an error naming it, the file and the line.
  static CsvDataset load(const std::string& path, const CsvSchema& schema, const std::string& label_column,
                         const std::string& sequence_column);
  // Every row of `path` read with a trained model's schema, its targets as `spec` says (Label,
  // Tags: names of schema.class_names, another is an error naming it, the file and the line;
  // Values: numbers). Tokens not in schema.token_names are read as its kUnknownToken.
  static CsvDataset load(const std::string& path, const CsvSchema& schema, const CsvSpec& spec);
  CsvSchema schema() const;
  int64_t unknown_tokens() const { return unknown_tokens_; }  // tokens read as kUnknownToken
  int64_t size() const { return static_cast<int64_t>(sequences_.size()); }
  // Any target (Label, Values, Tags) read as `spec` says.
  static CsvDataset load(const std::string& path, const CsvSpec& spec);
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
  int64_t unknown_tokens_ = 0;
  friend class CsvChunkReader;
};

// Reads a CSV file with a trained model's schema a chunk of rows at a time: memory stays constant
// in the number of rows (what `lstm predict` streams through). Parses as CsvDataset::load does.
class CsvChunkReader {
 public:
  // Opens `path` and reads its header, which must name sequence_column and, when label_column is
  // not empty, label_column (labels are then checked against the schema's classes). An id_column
  // the header names is passed through as the rows' ids.
  CsvChunkReader(const std::string& path, CsvSchema schema, const std::string& sequence_column,
                 const std::string& label_column = "", const std::string& id_column = "id");
  // The same, reading the targets `spec` names as CsvDataset::load(path, schema, spec) does (an
  // empty spec.target_columns: none, as with an empty label_column).
  CsvChunkReader(const std::string& path, CsvSchema schema, const CsvSpec& spec, const std::string& id_column = "id");
  CsvChunkReader(CsvChunkReader&&) noexcept;
  ~CsvChunkReader();
  // Replaces `rows` with the next up to max_rows (>= 1) rows of the file and returns how many (0 at
  // the end). rows.batch() works on them; they carry no class or token names (the schema has
  // them); without a label column their targets are -100. `ids`: per row, the id column's value,
  // or else the row's number (1: the first row after the header).
  int64_t next(int64_t max_rows, CsvDataset& rows, std::vector<std::string>& ids);
  bool has_id_column() const;
  int64_t unknown_tokens() const;  // so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
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
