// libFuzzer target: CsvDataset::load on arbitrary bytes, then batches and a split of what it read;
// the streaming reader (CsvReader, fed a few bytes at a time) must give the same records or the
// same error as the whole-file parse; CsvChunkReader reads the file with a model's schema.
// The contract (include/lstm/data.hpp): a defective file throws lstm::Error naming the line and
// column; anything else escaping, a crash or a sanitizer report is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_util.hpp"
#include "io/csv_reader.hpp"
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

  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<lstm::CsvRecord> whole;
  std::string whole_error, stream_error;
  try {
    whole = lstm::parse_csv(text, "f.csv");
  } catch (const lstm::Error& e) {
    whole_error = e.what();
  }
  size_t at = 0;
  const size_t chunk = size ? 1 + data[0] % 7 : 1;
  lstm::CsvReader reader(
      [&](char* p, size_t n) {
        n = std::min(n, size - at);
        std::copy_n(data + at, n, p);
        at += n;
        return n;
      },
      "f.csv", chunk);
  size_t i = 0;
  try {
    lstm::CsvRecord r;
    while (reader.next(r)) {
      if (whole_error.empty() && (i >= whole.size() || r.fields != whole[i].fields || r.line != whole[i].line))
        __builtin_trap();  // the streaming parse differs from the whole-file parse
      ++i;
    }
  } catch (const lstm::Error& e) {
    stream_error = e.what();
  }
  if (stream_error != whole_error || (whole_error.empty() && i != whole.size())) __builtin_trap();

  try {
    lstm::CsvChunkReader rows(path, lstm::CsvSchema{{"0", "1", "a"}, true, {"a", "b", "<unk>"}, 0}, "sequence", "label");
    lstm::CsvDataset chunk_rows;
    std::vector<std::string> ids;
    while (rows.next(3, chunk_rows, ids) > 0) {
      const lstm::Batch b = chunk_rows.batch({0});
      lstm_fuzz::touch(b.inputs.raw(), b.inputs.nbytes());
    }
  } catch (const lstm::Error&) {
  }
  return 0;
}
