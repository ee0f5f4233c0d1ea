// libFuzzer target: read_safetensors and read_safetensors_shapes on arbitrary bytes.
// The contract (include/lstm/safetensors.hpp): a defective file throws lstm::Error; anything
// else escaping, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "lstm/error.hpp"
#include "lstm/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lstm_fuzz::InputFile file(".safetensors");
  const std::string& path = file.write(data, size);
  try {
    (void)lstm::read_safetensors_shapes(path);
  } catch (const lstm::Error&) {
  }
  try {
    const lstm::SafetensorsFile f = lstm::read_safetensors(path);
    for (const auto& [name, t] : f.tensors) lstm_fuzz::touch(t.raw(), t.nbytes());
  } catch (const lstm::Error&) {
  }
  return 0;
}
