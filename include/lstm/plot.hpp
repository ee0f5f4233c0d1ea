// Curves of a training run, drawn from its metrics.jsonl (what `lstm plot` runs).
//
// metrics.jsonl (written by train(), one JSON object a line, see train.hpp) holds records of kind
// "train" (step, loss, lr, grad_norm, ...) and "eval" (step, valid_loss, valid_accuracy, ...).
// The picture has four panels against the step: training and validation loss, validation
// accuracy (both with a dashed line at the best model's step), learning rate and gradient norm.
// It is an indexed-colour PNG written without any library (uncompressed deflate blocks), so it is
// a few hundred KB. Colours (RGB): training loss (31, 119, 180), validation loss and accuracy
// (255, 127, 14) and (44, 160, 44), learning rate (148, 103, 189), gradient norm (214, 39, 40).
#pragma once

#include <cstdint>
#include <string>

namespace lstm {

struct PlotResult {
  int64_t train_records = 0;  // "train" lines drawn
  int64_t eval_records = 0;   // "eval" lines drawn
  int64_t skipped_lines = 0;  // lines that were not complete JSON objects (a run killed mid-write)
  int width = 0, height = 0;  // of the picture, in pixels
};

// Reads `run_dir`/metrics.jsonl and writes the curves to `png_path` (atomically). Throws
// lstm::Error when the file is missing or has no "train" record, naming the file.
PlotResult plot_run(const std::string& run_dir, const std::string& png_path, int width = 800, int height = 560);

}  // namespace lstm
