// libFuzzer target: a text corpus as `lstm train` reads one for a character language model
// (CharCorpus::load: UTF-8 checks, vocabulary, train/validation split), then batches from it.
// The contract (include/lstm/data.hpp): a defective file throws lstm::Error naming the byte
// offset; anything else escaping, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"
#include "lstm/rng.hpp"

namespace {
void touch_batch(const lstm::Batch& b) {
  lstm_fuzz::touch(b.inputs.raw(), b.inputs.nbytes());
  lstm_fuzz::touch(b.targets.raw(), b.targets.nbytes());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lstm_fuzz::InputFile file(".txt");
  const std::string& path = file.write(data, size);
  try {
    const lstm::CharCorpus c = lstm::CharCorpus::load({path}, 0.25);
    const lstm::Vocab v = lstm::Vocab::from_json(c.vocab().to_json());
    if (v.size() != c.vocab().size()) __builtin_trap();  // the vocabulary must survive its JSON form
    constexpr int64_t kBatch = 2, kSteps = 3;
    if (c.train_size() > kSteps) {
      lstm::Rng rng(1);
      touch_batch(c.train_batch(kBatch, kSteps, rng));
    }
    if (c.valid_batches(kBatch, kSteps) > 0) touch_batch(c.valid_batch(kBatch, kSteps, 0));
  } catch (const lstm::Error&) {
  }
  return 0;
}
