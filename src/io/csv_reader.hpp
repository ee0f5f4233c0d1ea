// CSV records, parsed from a whole text or streamed from a file in chunks. Internal: the one CSV
// parser behind CsvDataset::load (whole file) and CsvChunkReader (constant memory in the rows).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lstm {

struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;  // where the record starts (quoted fields may span lines)
};

// Every record of `s` (a leading UTF-8 BOM and blank lines skipped). Errors name `path` and the
// line.
std::vector<CsvRecord> parse_csv(std::string_view s, const std::string& path);

// Reads records one at a time from a source of bytes, keeping only the record being parsed (and
// at most one read ahead) in memory. Parses exactly as parse_csv does: the same records, the same
// line numbers, the same errors.
class CsvReader {
 public:
  // Fills up to n bytes at p; returns how many (0: the end). Throws lstm::Error on a read error.
  using Source = std::function<size_t(char* p, size_t n)>;
  // `chunk` (>= 1): bytes asked of the source at a time (a record longer than that is read in
  // growing pieces, so parsing stays linear in its length).
  CsvReader(Source source, std::string path, size_t chunk = size_t{1} << 16);
  // A regular file (a FIFO or folder is refused, as read_regular_file does).
  static CsvReader open(const std::string& path);
  // The next non-blank record; false at the end of the input.
  bool next(CsvRecord& record);

 private:
  Source source_;
  std::string path_;
  size_t chunk_;
  std::string buf_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  bool eof_ = false, started_ = false;
  bool fill();  // reads more into buf_ (dropping what was parsed); false once the source is done
};

}  // namespace lstm
