// libFuzzer target: CsvDataset::load on arbitrary bytes, then batches and a split of what it read.
// The contract (include/lstm/data.hpp): a defective file throws lstm::Error naming the line and
// column; anything else escaping, a crash or a sanitizer report is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_util.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"
#include "lstm/rng.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static lstm_fuzz::InputFile file(".csv");
  const std::string& path = file.write(data, size);
  try {
    const lstm::CsvDataset d = lstm::CsvDataset::load(path);
    std::vector<int64_t> rows(static_cast<size_t>(std::min<int64_t>(d.size(), 8)));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    if (!rows.empty()) {
      const lstm::Batch b = d.batch(rows);
      lstm_fuzz::touch(b.inputs.raw(), b.inputs.nbytes());
      lstm_fuzz::touch(b.targets.raw(), b.targets.nbytes());
    }
    lstm::Rng rng(1);
    (void)d.split(0.5, rng);
  } catch (const lstm::Error&) {
  }
  return 0;
}
