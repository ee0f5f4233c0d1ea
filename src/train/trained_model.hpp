// A trained model with what its file records about its task (internal: shared by evaluation and
// prediction, src/train/trainer.cpp and src/train/predict.cpp).
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "lstm/data.hpp"
#include "lstm/model.hpp"

namespace lstm {

struct TrainedModel {
  std::string path;                          // the model file
  Model model;                               // placed
  std::map<std::string, std::string> meta;   // the file's metadata
  nlohmann::json config;                     // the training configuration, resolved
  std::string task;                          // "charlm" | "classify"
};

// A batch as the model's input: feature inputs go to the model's device; token ids stay on the
// host (the embedding copies them after checking their range).
inline Act to_act(const Batch& b, Device device = Device::CPU) {
  if (device != Device::CPU && is_floating(b.inputs.dtype())) return {b.inputs.to_device(device), b.lengths};
  return {b.inputs, b.lengths};
}

// Loads a model file or a run folder's model (resolve_model_path), places it, and reads its
// training configuration; errors name the file.
TrainedModel load_trained_model(const std::string& model_path, const Placement& placement, bool allow_nonfinite);
// The character vocabulary of a character LM (errors name the file).
Vocab stored_vocab(const TrainedModel& m);
// What a classifier reads from CSV: its classes, its tokens or its feature count.
CsvSchema stored_csv_schema(const TrainedModel& m);

}  // namespace lstm
