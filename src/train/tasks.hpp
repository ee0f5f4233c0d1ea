// What a training task is, behind one face: its data and split, how batches are built, the loss,
// the evaluation metric, and what a model file stores about it. Internal to the trainer; train(),
// evaluate_model() (and a predictor) use it instead of branching on the task's name.
//
// Tasks ("task" in the configuration):
//   charlm    character language model on text: tokens in, a class per step out
//   classify  a class per CSV row (many-to-one)
//   regress   K numbers per CSV row (many-to-one), MSE or Huber loss
//   forecast  windows of a numeric time series -> the next horizon steps of K columns
//   tag       a class per step of a CSV row (many-to-many)
// regress and forecast normalise inputs and targets with statistics of the training split
// (metadata "lstm_engine.normalization"); their loss is in normalised units, their metrics
// (MSE, MAE, RMSE) in the targets' original units.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "lstm/data.hpp"
#include "lstm/metrics.hpp"
#include "lstm/layers.hpp"
#include "lstm/loss.hpp"
#include "lstm/train.hpp"

namespace lstm {

// Sums over evaluation batches.
struct EvalSums {
  double loss_sum = 0;  // each batch's mean loss times its count
  int64_t count = 0, correct = 0;
  double sq_err = 0, abs_err = 0;  // regression: in the targets' original units, over `count` values
  ConfusionMatrix confusion;       // classify, tag: [target][predicted]
};

struct TrainedModel;

class Task {
 public:
  virtual ~Task() = default;
  const std::string& name() const { return name_; }
  // The model's input (token vocabulary or numeric features) and the width of its last layer.
  const Signal& input() const { return input_; }
  int64_t outputs() const { return outputs_; }
  // regress and forecast: numbers out (metrics MSE/MAE/RMSE, not accuracy).
  virtual bool regression() const { return false; }
  // Metadata a model trained on this task carries ("lstm_engine.*"), the data path included.
  const std::map<std::string, std::string>& metadata() const { return meta_; }

  virtual Batch train_batch(int64_t B, int64_t T, Rng& rng) const = 0;
  // The held-out split in deterministic batches (the last may be smaller); T is the window of a
  // language model and is ignored where the data fixes the length.
  virtual int64_t valid_batches(int64_t B, int64_t T) const = 0;
  virtual Batch valid_batch(int64_t B, int64_t T, int64_t i) const = 0;
  // The loss of a batch from the model's output; the gradient comes back in the output's shape.
  // Throws when the output's shape does not fit the task (naming both).
  virtual LossResult loss(const Act& out, const Batch& b) const = 0;
  // Empty sums for an evaluation; add_eval adds a batch to them (`lr` is loss(out, b),
  // resolved); eval_result makes the EvalResult (task, what was scored, metrics).
  EvalSums start_eval() const;
  virtual void add_eval(const Act& out, const Batch& b, const LossResult& lr, EvalSums& sums) const;
  EvalResult eval_result(const EvalSums& sums) const;
  // What valid_batch() covers, in words ("the held-out 10% of the rows of data.csv").
  const std::string& description() const { return description_; }

  // The padded length of a batch at most (for the memory estimate), given the window T of a
  // language model, and where that length comes from (for the error).
  virtual int64_t batch_steps(int64_t T) const { return T; }
  virtual std::string steps_from() const { return "train.seq_len"; }
  // One line for the log: the data's size and shape.
  virtual std::string describe() const = 0;
  // The progress line's rate, of LossResult::count per second: "tok/s" (charlm), "seq/s"
  // (classify), "tags/s" (tag), "targets/s" (regress, forecast: values predicted).
  virtual const char* rate_unit() const { return "seq/s"; }
  // The same rate's key in metrics.jsonl: "tokens_per_s", "samples_per_s", "tags_per_s",
  // "targets_per_s".
  virtual const char* rate_key() const { return "samples_per_s"; }
  // A model evaluated on this data: its vocabulary, classes and tokens must equal the data's, and
  // its stored normalisation replaces the one fitted on this data. Errors name `file`.
  virtual void adopt_model_metadata(const std::map<std::string, std::string>& meta, const std::string& file);
  // The character corpus of charlm (for sampling), else null.
  virtual const CharCorpus* corpus() const { return nullptr; }

 protected:
  friend std::unique_ptr<Task> make_task(const nlohmann::json& cfg, const std::string& path_override);
  friend std::unique_ptr<Task> make_eval_task(const TrainedModel& m, const std::string& path);
  std::string name_;
  Signal input_;
  int64_t outputs_ = 0;
  std::map<std::string, std::string> meta_;
  std::string description_;
  int64_t unknown_ = 0;                  // inputs read as the model's <unk> (evaluation on other data)
  std::vector<std::string> class_names_;  // classify, tag: the confusion matrix's classes
};

// Loads the data of cfg's task (cfg resolved by resolve_train_config); `path_override` replaces
// data.path. Errors name the file or the configuration field.
std::unique_ptr<Task> make_task(const nlohmann::json& cfg, const std::string& path_override = "");

// The data `lstm eval --data FILE` scores with a trained model: all of the file (every row, every
// window of the text or of the series), read with the model's vocabulary, classes and
// normalisation. Errors name the file.
std::unique_ptr<Task> make_eval_task(const TrainedModel& m, const std::string& path);

// The model of cfg for the task: an Embedding first for token input, the last dense layer
// without out_features sized to the task's outputs.
nlohmann::json task_model_json(const nlohmann::json& cfg, const Task& task);

}  // namespace lstm
