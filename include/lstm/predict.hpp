// Running a trained model on new data: what `lstm predict` does.
//
// The input is read and the output written a chunk of --batch-size rows at a time, so memory
// stays constant in the number of rows. Every row keeps an id: the input's `id` column where a
// CSV has one, otherwise the row's number (1: the first row after the header; for text, the
// first line).
//
// Per task (one Predictor each in src/train/predict.cpp; adding a task is a class and a row of
// its table there):
//   classify: the CSV's sequence column (as in training; a label column, if any, is not read).
//     CSV columns: id, predicted (the class name), p_<class> for every class in the model's order.
//     JSON Lines: {"id": ..., "predicted": "...", "probabilities": {"<class>": p, ...}}.
//   charlm: every line of a UTF-8 text file (without its line break, a trailing '\r' dropped) is
//     a context; the output is the distribution of the character that follows it, its top_k
//     entries (k at most the vocabulary's size) by falling probability. An empty line's context is
//     a line break (what starts a line). Characters the model lacks are read as its <unk> id (a
//     model without one refuses them naming the line).
//     CSV columns: id, next_1, p_1, ..., next_k, p_k. JSON Lines: {"id": ..., "top": [{"next":
//     "e", "p": 0.31}, ...]}. A line break is written as it is (CSV quotes it), <unk> as "<unk>".
//   regress: the CSV's sequence column (target columns, if any, are not read); numeric inputs are
//     normalised with the model's stored statistics and the outputs de-normalised with them.
//     CSV columns: id, then each target column by its name, in original units.
//     JSON Lines: {"id": ..., "values": {"<target>": v, ...}}.
//   tag: the CSV's sequence column (a tags column is not read); the most probable tag per step.
//     CSV columns: id, tags (space-separated, one per step). JSON Lines: {"id": ..., "tags": [...],
//     "probabilities": [{"<tag>": p, ...} per step]}.
//   forecast: a time series CSV with the model's input columns; the last train.seq_len rows are the
//     context (fewer is an error) and the output is the data.horizon steps after the end, one
//     record each (not streamed: the series is read whole). CSV columns: step (1: the step after
//     the last row), then each target column, in original units. JSON Lines: {"step": h,
//     "values": {"<target>": v, ...}}.
// Token input: tokens the model lacks are read as its <unk> (classify, regress, tag alike).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "lstm/model.hpp"

namespace lstm {

struct PredictOptions {
  std::string model_path;   // a model.safetensors or a run folder (resolve_model_path)
  std::string data_path;    // the input: a CSV file (classify, regress, tag, forecast) or a text file (charlm)
  // Where the predictions go: a file (written under a temporary name, renamed into place when
  // complete), or "" / "-" for `out`.
  std::string output_path;
  // "csv", "jsonl", or "" for: jsonl when output_path ends in .jsonl or .ndjson, else csv.
  std::string format;
  int64_t top_k = 5;        // charlm: characters per context, in [1, kMaxDim]
  int64_t batch_size = 64;  // rows per chunk, in [1, kMaxDim] (forecast: not used)
  Placement placement;      // as for evaluation (CPU or GPU; the same code either way)
  bool allow_nonfinite = false;
};

struct PredictResult {
  std::string task;    // the model's task
  std::string format;  // "csv" | "jsonl"
  int64_t rows = 0;    // records written
  int64_t unknown = 0; // input tokens/characters read as <unk>
};

// Writes one record per input row, in input order. Errors (lstm::Error) name the file and line;
// on an error no output file is left behind (what went to `out` stays written).
PredictResult predict(const PredictOptions& opts, std::ostream& out);

}  // namespace lstm
