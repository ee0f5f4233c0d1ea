// Training, evaluation and generation driven by a JSON configuration (what `lstm train` runs).
//
// Configuration (every field optional but task and data.path; defaults shown in
// default_train_config()):
//   {"task": "charlm" | "classify" | "regress" | "forecast" | "tag",
//    "data": {"path": FILE_OR_FOLDER, "valid_fraction": 0.05, "max_bytes": -1,
//             "label_column": "label", "sequence_column": "sequence", "tags_column": "tags",
//             "target_columns": ["target"], "input_columns": [], "horizon": 1},
//    "model": {"embedding_dim": 32, "layers": [{"type": "lstm", "hidden_size": 256}, {"type": "dense"}]},
//    "train": {"steps": 1000, "batch_size": 32, "seq_len": 64, "seed": 1, "threads": 0,
//              "optimizer": {"type": "adam"}, "schedule": {"type": "cosine", "lr": 3e-3, ...},
//              "clip_grad_norm": 1.0, "log_every": 10, "eval_every": 250, "eval_batches": 0 (0: every
//              evaluation covers all held-out batches, the number `lstm eval` gives; N: periodic
//              evaluations are estimates over the first N, the final one still covers all),
//              "checkpoint_every": 250, "keep_checkpoints": 3, "sample_length": 300,
//              "sample_temperature": 0.8,
//              "early_stopping": {"metric": "valid_loss", "patience": 0, "min_delta": 0.0},
//              "final_model": "best", "loss": "auto", "huber_delta": 1.0}}
// Tasks (docs/guide/tasks.md has the data formats and an example of each):
//   charlm    text; a window of train.seq_len characters predicts the next character at each step.
//   classify  CSV: data.sequence_column and data.label_column; a class per row.
//   regress   CSV: data.sequence_column and data.target_columns (numbers); K numbers per row.
//   tag       CSV: data.sequence_column and data.tags_column (one label per step); a class per step.
//   forecast  CSV, one row per time step: windows of train.seq_len steps of data.input_columns
//             (empty: the target columns) predict the next data.horizon steps of
//             data.target_columns (output h * K + k: step h, column k). The last valid_fraction
//             of the rows is held out; training windows never reach into it.
// train.loss: "auto" is cross-entropy for charlm, classify and tag (the only loss they take) and
// "mse" for regress and forecast, which also take "huber" (torch.nn.HuberLoss with delta
// train.huber_delta > 0); both with mean reduction over every predicted value.
// regress and forecast normalise numeric inputs and the targets per column with the mean and
// (population) standard deviation of the training split (a constant column gets std 1); the
// statistics are stored in the model (metadata "lstm_engine.normalization": {"inputs": {"names",
// "mean", "std"} or null for token input, "targets": {...}}) and used when it is evaluated. Their
// loss is in normalised units; EvalResult and TrainResult report MSE, MAE and RMSE of the
// de-normalised predictions, in the targets' original units.
// For token inputs an Embedding(vocab, embedding_dim) is put first; a last dense layer without
// out_features gets the vocabulary size (charlm), the class count (classify, tag), the target
// count K (regress) or horizon * K (forecast). classify, regress and forecast models must end
// their recurrent part with a many-to-one head ({"type": "last_step"} or an lstm with
// "output": "h_n"); charlm and tag models keep the sequence (a dense layer applies per step).
//
// Every evaluation (each eval_every steps and at the last step) compares the validation metric
// early_stopping.metric ("valid_loss": lower is better, "valid_accuracy": higher is better) with
// the best so far; beating it by more than min_delta (the first evaluation always does) writes
// best/model.safetensors. With patience N > 0, N evaluations in a row without such an improvement
// stop the run (a checkpoint is written there; 0 = never stop early). final_model says what
// model.safetensors gets at the end: "best" (best/'s model; the last weights when no evaluation
// measured anything) or "last" (the weights of the last step).
//
// Run folder layout (out_dir): checkpoints/step-NNNNNNNN/{model.safetensors, trainer.safetensors,
// best.safetensors (best/'s model as of that step, a hard link)}, checkpoints/latest (the name of
// the newest complete checkpoint), best/model.safetensors (never rotated away), model.safetensors
// (final), metrics.jsonl (below). Model files hold exactly the PyTorch state_dict names, with
// metadata "lstm_engine.step" (the step of their weights) and, for model.safetensors,
// "lstm_engine.final_model" ("best" or "last"); best/'s also "lstm_engine.valid_loss" and
// "lstm_engine.valid_accuracy". trainer.safetensors holds optimizer state, RNG states and progress
// (metadata "progress": elapsed time, the partial log window, the best-model state).
//
// metrics.jsonl: one JSON object a line, appended (one write each) as the run goes:
//   {"kind": "train", "step", "loss" (mean over the steps since the last line), "lr",
//    "grad_norm" (mean, before clipping), "tokens_per_s" (charlm), "samples_per_s" (classify),
//    "tags_per_s" (tag) or "targets_per_s" (regress, forecast: values predicted),
//    "elapsed_s", "eta_s" (null until measured)}                           every log_every steps
//   {"kind": "eval", "step", "valid_loss", "valid_accuracy", "valid_targets", "best" (a new best),
//    "best_step", "elapsed_s"}                                             every evaluation
//    (regress, forecast: "valid_mse", "valid_mae", "valid_rmse" in original units instead of
//    "valid_accuracy"; early_stopping.metric must be "valid_loss")
//   {"kind": "early_stop", "step", "metric", "best", "best_step", "elapsed_s"}
//   {"kind": "non_finite", "step", "loss", "grad_norm", "elapsed_s"}
// A resume from step S first drops the lines past S (and a half-written last line), so the file
// reads as one run. NaN/Inf values are written as null.
#pragma once

#include <atomic>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lstm/data.hpp"
#include "lstm/metrics.hpp"
#include "lstm/model.hpp"

namespace lstm {

nlohmann::json default_train_config();
// Merges `user` over the defaults (objects recursively) and validates it; errors name the field.
nlohmann::json resolve_train_config(const nlohmann::json& user);

struct TrainOptions {
  nlohmann::json config;      // as given by the user (resolved inside)
  std::string out_dir = "runs/default";
  bool resume = false;        // continue from out_dir/checkpoints/latest
  // Without resume, an out_dir that holds another run (checkpoints or a final model) is refused
  // unless overwrite: then that run is removed first.
  bool overwrite = false;
  int64_t steps = -1;         // overrides train.steps when >= 0
  std::ostream* log = nullptr;  // progress and messages (nullptr: std::cerr)
  int threads = 0;            // overrides train.threads when > 0
  // Where the model trains (device, precision, LSTM algorithm). On the GPU a step issues its
  // work without waiting for it; the host reads the loss and gradient norm only when it logs,
  // evaluates or checkpoints. A non-finite gradient norm makes the optimizer skip that update
  // and every later one on the device, and training stops at the next log point naming the
  // step where it happened (the parameters are those from before that step).
  Placement placement;
  // Polled between steps (never written by the trainer): once non-zero, the trainer finishes the
  // step it is in, writes a checkpoint and returns with TrainResult::stopped_by set to the value.
  // Lets an embedder stop cleanly from a signal handler (a lock-free atomic store is
  // async-signal-safe); the library installs no handlers itself.
  const std::atomic<int>* stop = nullptr;
};

struct TrainResult {
  int64_t step = 0;            // optimizer steps done in total
  double train_loss = 0;       // mean loss of the last logged window
  double valid_loss = 0;       // last evaluation (at the end: over all held-out batches, = evaluate_model's)
  double valid_accuracy = 0;   // last evaluation (fraction of targets predicted right)
  // regress, forecast (regression true): the last evaluation's errors in the targets' original
  // units (valid_accuracy stays 0).
  bool regression = false;
  double valid_mse = 0, valid_mae = 0, valid_rmse = 0;
  std::string sample;          // charlm: generated text at the end
  std::string last_checkpoint;
  bool stopped_non_finite = false;  // a NaN/Inf loss or gradient stopped the run
  int stopped_by = 0;               // *TrainOptions::stop's value when it stopped the run early
  bool stopped_early = false;       // early stopping ended the run (train.early_stopping.patience)
  std::string best_metric;          // train.early_stopping.metric
  int64_t best_step = -1;           // step of best/model.safetensors (-1: no evaluation measured one)
  double best_value = 0;            // its best_metric value
  std::string final_model;          // what model.safetensors holds: "best" or "last" (empty: not written)
  int64_t final_model_step = -1;    // the step of its weights
};

// Runs training. A NaN/Inf loss or gradient stops before the update is applied; the run folder
// keeps its last good checkpoint and the result says so (stopped_non_finite).
TrainResult train(const TrainOptions& opts);

// One definition of the validation loss, used by training and `lstm eval` alike: the mean
// cross-entropy over every target of the data evaluated (for a character LM every character of
// the held-out text after the first that falls in a complete window of seq_len, windows taken
// consecutively; for classification every row). Training's periodic evaluations (eval_every) may
// stop after train.eval_batches batches as a cheap estimate and say so; the final one, whose
// numbers TrainResult and the model report, always covers all of them and equals evaluate_model's
// on the same run (same batch_size and seq_len: its defaults).
struct EvalResult {
  double loss = 0, accuracy = 0;  // loss: the training objective (regression: on normalised targets)
  int64_t count = 0;            // targets scored (regression: values predicted)
  std::string task;             // "charlm" | "classify" | "regress" | "forecast" | "tag"
  std::string data;             // what was scored, in words (a file, or the held-out split of one)
  int64_t unknown = 0;          // input characters/tokens read as the model's <unk> id
  // Classification only (empty otherwise): the model's classes and per-class results.
  std::vector<std::string> class_names;
  ConfusionMatrix confusion;    // [target][predicted]
  std::vector<ClassMetrics> per_class;
  double macro_f1 = 0;          // unweighted mean of the classes' F1
  // regress, forecast (regression true): errors of the de-normalised predictions, in the
  // targets' original units, over every value predicted; accuracy stays 0.
  bool regression = false;
  double mse = 0, mae = 0, rmse = 0;

  nlohmann::json to_json() const;
  // Loss, accuracy (regression: MSE, MAE, RMSE), and for classification a per-class table and
  // the confusion matrix.
  std::string report() const;
};

// Loads a model (a model.safetensors or a run folder) and evaluates it. Without `data_path`: on
// the held-out split of the training data recorded in the model (the split training used). With
// it: on EVERY row (CSV) or every window of the whole text (charlm) of that file, read with the
// model's own vocabulary and classes: input it has never seen takes its <unk> id (a model without
// one refuses it by name), a label that is not one of its classes is an error naming it, the file
// and the line. batch_size and seq_len are in [1, kMaxDim], or 0 for the training configuration's
// values; a model with NaN/Inf parameters is refused unless allow_nonfinite.
EvalResult evaluate_model(const std::string& model_path, const std::string& data_path = "",
                          int64_t batch_size = 0, int64_t seq_len = 0, const Placement& placement = {},
                          bool allow_nonfinite = false);

// Samples `length` (in [0, kMaxDim]) characters from a character language model after reading
// `prime`; a model with NaN/Inf parameters is refused unless allow_nonfinite.
std::string generate_text(const std::string& model_path, const std::string& prime, int64_t length,
                          double temperature, uint64_t seed, const Placement& placement = {},
                          bool allow_nonfinite = false);

// Reads a training configuration file (a regular file of at most 16 MiB, JSON nested at most
// kMaxJsonDepth deep) and checks it as resolve_train_config does; errors name the file. Returns
// the configuration as written (train() resolves it).
nlohmann::json read_train_config_file(const std::string& path);

// Resolves a model argument: a file as is; a run folder -> its model.safetensors when the run
// finished (the file is newer than checkpoints/latest), else its latest checkpoint's model file
// (a run in progress, stopped, or resumed since it finished).
std::string resolve_model_path(const std::string& path);

}  // namespace lstm
