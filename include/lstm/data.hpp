// Datasets: character-level language modelling on UTF-8 text, and sequence classification from
// CSV. Batches are built on the host, sequence-major, ready for Model::forward.
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
  Tensor targets;                // I64: [T, B] (a label per step; -100 = ignore) or [B] (per sequence)
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

// Sequence classification from CSV. The first row is a header. One column holds the label
// (integers are used as class ids; any other strings are mapped to ids in sorted order), one
// column holds the sequence: space-separated steps, each a number or numbers joined by '|'
// (numeric features, F per step) or, when any step is not a number, a token (tokens get a
// vocabulary of their own). Quoted fields ("...") may hold commas. Errors name the file, line
// and column.
class CsvDataset {
 public:
  static CsvDataset load(const std::string& path, const std::string& label_column = "label",
                         const std::string& sequence_column = "sequence");
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const { return static_cast<int64_t>(class_names_.size()); }
  bool is_tokens() const { return tokens_; }
  int64_t features() const { return features_; }           // numeric: F; tokens: vocabulary size
  int64_t max_length() const;  // steps of the longest sequence (a batch's padded length at most)
  const std::vector<std::string>& class_names() const { return class_names_; }
  const std::vector<std::string>& token_names() const { return token_names_; }
  // Rows [indices], padded to the longest (pad value 0), targets I64 [B].
  Batch batch(const std::vector<int64_t>& indices) const;
  // Splits rows into (train, valid) index lists, shuffled by rng, valid_fraction held out.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> split(double valid_fraction, Rng& rng) const;

 private:
  bool tokens_ = false;
  int64_t features_ = 0;
  std::vector<std::vector<float>> sequences_;  // numeric: T*F values; tokens: ids
  std::vector<int64_t> labels_;
  std::vector<std::string> class_names_, token_names_;
};

}  // namespace lstm
