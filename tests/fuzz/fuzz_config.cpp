// libFuzzer target: a training configuration as `lstm train --config` reads it: JSON text, then
// resolve_train_config (defaults, validation, optimizer and schedule) and every layer's settings.
// The contract (include/lstm/train.hpp, include/lstm/error.hpp): a defective configuration throws
// lstm::Error naming the field; anything else escaping, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>
#include <string_view>

#include "io/config_reader.hpp"
#include "lstm/error.hpp"
#include "lstm/layers.hpp"
#include "lstm/train.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    // The program's reader (lstm train --config goes through it): bounded nesting, errors as
    // lstm::Error naming the text.
    const nlohmann::json user =
        lstm::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
    const nlohmann::json cfg = lstm::resolve_train_config(user);
    const nlohmann::json& layers = cfg["model"]["layers"];
    for (size_t i = 0; i < layers.size(); ++i) {
      nlohmann::json layer = layers[i];
      // As the trainer does: a last dense layer without out_features gets the data's class count.
      if (i + 1 == layers.size() && layer.is_object() && layer.contains("type") && layer["type"] == "dense" &&
          !layer.contains("out_features"))
        layer["out_features"] = 2;
      (void)lstm::layer_from_json(layer);
    }
  } catch (const lstm::Error&) {
  }
  return 0;
}
