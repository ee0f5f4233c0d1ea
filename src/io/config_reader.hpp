// Reading what users hand us: regular files (never blocking on a FIFO), JSON text with bounded
// nesting, and typed, bounded fields of configurations. Internal; every reader of a file, a
// configuration or a JSON side file goes through here, so each defect has one error message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace lstm {

// Deeper JSON is refused while parsing: copying, comparing and printing a json value recurse,
// and a few hundred KB of '[' would overflow the stack there. Nothing we read nests beyond 4.
inline constexpr int kMaxJsonDepth = 64;

// Closes a POSIX descriptor on every exit path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  // Returns close()'s result so writers can see deferred write errors (e.g. on NFS).
  int release_and_close();
  // Gives up ownership: the caller closes the returned descriptor.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Opens `path` for reading and returns the descriptor; `size` receives the file size. A FIFO, a
// folder or a device is refused (opened without blocking, then checked) rather than waited on.
// Errors start with `pre` (which names the file).
int open_regular_file(const std::string& path, const std::string& pre, uint64_t& size);
// The whole file, refused when larger than max_bytes.
// (memory_limited_bytes(): the machine's physical memory, for data files with no smaller bound.)
std::string read_regular_file(const std::string& path, const std::string& pre, uint64_t max_bytes);
uint64_t memory_limited_bytes();

// Parses JSON text. `pre` names the text ("--config job.json"); errors continue it with " is not
// valid JSON: ...", " nests deeper ..." or " has the key ... twice" and say where (line and column for syntax errors);
// nesting deeper than kMaxJsonDepth is refused, and with reject_duplicate_keys so is a key given
// twice in one object (instead of nlohmann's "last one wins").
nlohmann::json parse_json(std::string_view text, const std::string& pre, bool reject_duplicate_keys = false);

// A value for a message: compact JSON, cut at max_chars, invalid UTF-8 replaced (never throws).
std::string json_excerpt(const nlohmann::json& j, size_t max_chars = 100);
// Bytes for a message: printable ASCII as is, everything else as \xNN, cut at max_chars.
std::string printable(std::string_view bytes, size_t max_chars = 100);

// Typed fields. `name` says which field in errors (e.g. "config: 'train.batch_size'"); each error
// says what was expected and what was given. Integers accept 3.0 (a tool that writes only
// floats) but not 3.5; strings must be valid UTF-8 (they end up in JSON metadata).
int64_t read_int(const nlohmann::json& v, const std::string& name, int64_t lo, int64_t hi);
double read_number(const nlohmann::json& v, const std::string& name, double lo, double hi);
bool read_bool(const nlohmann::json& v, const std::string& name);
std::string read_string(const nlohmann::json& v, const std::string& name);
// True when `obj` is an object whose field `key` is the string `value`. Never throws (unlike
// nlohmann's value(key, default), which throws on a field of another type): a field of the wrong
// type is left for its own typed read to report.
bool field_is(const nlohmann::json& obj, std::string_view key, std::string_view value);

}  // namespace lstm
