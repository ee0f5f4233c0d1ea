// Shared by the fuzz targets (tests/fuzz, docs/FUZZING.md).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace lstm_fuzz {

// The parsers take paths, as the program does, so each input reaches them through a file: one
// per process, rewritten for every input (a crash leaves it behind in $TMPDIR, which
// scripts/fuzz.sh points at a folder of its own).
class InputFile {
 public:
  explicit InputFile(const std::string& suffix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/lstm-fuzz-XXXXXX" + suffix;
    const int fd = mkstemps(tmpl.data(), static_cast<int>(suffix.size()));
    if (fd < 0) throw std::runtime_error("fuzz: cannot create a file like " + tmpl);
    close(fd);
    path_ = tmpl;
  }
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& write(const uint8_t* data, size_t size) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) throw std::runtime_error("fuzz: cannot write " + path_);
    const size_t n = size ? std::fwrite(data, 1, size, f) : 0;
    std::fclose(f);
    if (n != size) throw std::runtime_error("fuzz: short write to " + path_);
    return path_;
  }

 private:
  std::string path_;
};

// Where touch() leaves its result, so that the reads cannot be optimized away.
inline volatile unsigned char touch_sink = 0;

// Reads every byte, so that ASan sees a buffer shorter than the parser claims it is.
inline void touch(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  unsigned char acc = 0;
  for (size_t i = 0; i < n; ++i) acc = static_cast<unsigned char>(acc ^ b[i]);
  touch_sink = acc;
}

}  // namespace lstm_fuzz
