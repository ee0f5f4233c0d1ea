#include "io/config_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "io/utf8.hpp"
#include "lstm/checked.hpp"
#include "lstm/error.hpp"

namespace lstm {

using json = nlohmann::json;

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release_and_close() {
  int r = ::close(fd_);
  fd_ = -1;
  return r;
}

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "neither a file nor a folder";
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& pre, uint64_t& size) {
  // O_NONBLOCK: open() of a FIFO would otherwise wait for a writer before we could look at it.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  LSTM_REQUIRE(fd.get() >= 0, pre << "cannot open: " << std::strerror(errno));
  struct stat st {};
  LSTM_REQUIRE(::fstat(fd.get(), &st) == 0, pre << "cannot stat: " << std::strerror(errno));
  LSTM_REQUIRE(S_ISREG(st.st_mode), pre << "not a regular file: expected a file, got " << kind_of(st.st_mode));
  // Reads of a regular file never block, but later code may not expect EAGAIN semantics.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  size = static_cast<uint64_t>(st.st_size);
  return fd.release();
}

uint64_t memory_limited_bytes() {
  const uint64_t m = physical_memory_bytes();
  return m > 0 ? m : std::numeric_limits<uint64_t>::max();
}

std::string read_regular_file(const std::string& path, const std::string& pre, uint64_t max_bytes) {
  uint64_t size = 0;
  Fd fd(open_regular_file(path, pre, size));
  LSTM_REQUIRE(size <= max_bytes, pre << "the file is " << size << " bytes, more than the limit of " << max_bytes);
  std::string out(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(fd.get(), out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    LSTM_REQUIRE(r >= 0, pre << "read failed: " << std::strerror(errno));
    if (r == 0) break;  // the file shrank while we read it
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

json parse_json(std::string_view text, const std::string& pre, bool reject_duplicate_keys) {
  // nlohmann stops at a NUL byte as if the text ended there; JSON allows none anywhere.
  if (const size_t z = text.find('\0'); z != std::string_view::npos)
    LSTM_THROW(pre << " is not valid JSON: a NUL byte at offset " << z
                   << " (after the value only whitespace may follow)");
  std::vector<std::set<std::string>> keys;  // one per open object
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      LSTM_REQUIRE(depth < kMaxJsonDepth, pre << " nests deeper than " << kMaxJsonDepth << " levels");
    }
    if (!reject_duplicate_keys) return true;
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      LSTM_REQUIRE(keys.back().insert(k).second,
                   pre << " has the key \"" << printable(k) << "\" twice in one object (expected unique keys)");
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..." without the tag.
    std::string what = e.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception.", 0) == 0 && p != std::string::npos)
      what = what.substr(p + 2);
    LSTM_THROW(pre << " is not valid JSON: " << what);
  }
}

std::string json_excerpt(const json& j, size_t max_chars) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

std::string printable(std::string_view bytes, size_t max_chars) {
  std::string out;
  for (unsigned char c : bytes.substr(0, max_chars)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (bytes.size() > max_chars) out += "...";
  return out;
}

int64_t read_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  bool ok = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    x = ok ? static_cast<int64_t>(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    ok = true;
  } else if (v.is_number_float()) {
    // 3.0 is an integer written by a tool that knows only floats; 3.5 is not. 2^53 bounds the
    // doubles that still count every integer.
    const double d = v.get<double>();
    ok = std::isfinite(d) && std::floor(d) == d && std::abs(d) <= 9007199254740992.0;
    x = ok ? static_cast<int64_t>(d) : 0;
  }
  LSTM_REQUIRE(ok && x >= lo && x <= hi,
               name << " must be an integer in [" << lo << ", " << hi << "], got " << json_excerpt(v));
  return x;
}

double read_number(const json& v, const std::string& name, double lo, double hi) {
  LSTM_REQUIRE(v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi,
               name << " must be a number in [" << lo << ", " << hi << "], got " << json_excerpt(v));
  return v.get<double>();
}

bool read_bool(const json& v, const std::string& name) {
  LSTM_REQUIRE(v.is_boolean(), name << " must be true or false, got " << json_excerpt(v));
  return v.get<bool>();
}

std::string read_string(const json& v, const std::string& name) {
  LSTM_REQUIRE(v.is_string(), name << " must be a string, got " << json_excerpt(v));
  const std::string& s = v.get_ref<const std::string&>();
  std::string why;
  const size_t bad = utf8::first_invalid(s, &why);
  LSTM_REQUIRE(bad == std::string::npos, name << " must be valid UTF-8 text, got \"" << printable(s) << "\" ("
                                              << why << " at byte " << bad << ")");
  return s;
}

bool field_is(const json& obj, std::string_view key, std::string_view value) {
  if (!obj.is_object()) return false;
  const auto it = obj.find(std::string(key));
  return it != obj.end() && it->is_string() && it->get_ref<const std::string&>() == value;
}

}  // namespace lstm
