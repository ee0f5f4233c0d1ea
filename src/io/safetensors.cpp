#include "lstm/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/config_reader.hpp"

namespace lstm {

// Tensor bytes are copied verbatim between memory and the file, and the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

// The python library's limit; it stops a hostile length field from triggering a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

std::string errno_str(int err) { return std::strerror(err); }

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;     // file offset of the data buffer
};

// Reads exactly n bytes at `offset`; false if the file ends first. Throws on I/O errors.
bool pread_exact(int fd, void* buf, size_t n, uint64_t offset, const std::string& pre) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      LSTM_THROW(pre << "read failed: " << errno_str(errno));
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

// A JSON integer that fits in uint64_t, or nothing (floats, bools, negatives, strings...).
bool json_u64(const nlohmann::json& j, uint64_t& out) {
  if (!j.is_number_unsigned()) return false;
  out = j.get<uint64_t>();
  return true;
}

Entry parse_entry(const std::string& name, const nlohmann::json& j, const std::string& pre) {
  const std::string at = pre + "tensor '" + name + "': ";
  LSTM_REQUIRE(j.is_object(), at << "header entry must be a JSON object, got " << j.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    LSTM_REQUIRE(j.contains(key), at << "header entry is missing \"" << key << "\"");

  Entry e;
  e.name = name;
  const auto& jd = j.at("dtype");
  LSTM_REQUIRE(jd.is_string(), at << "\"dtype\" must be a string, got " << jd.type_name());
  try {
    e.dtype = dtype_from_name(jd.get<std::string>());
  } catch (const Error& err) {
    LSTM_THROW(at << err.what());
  }

  const auto& js = j.at("shape");
  LSTM_REQUIRE(js.is_array(), at << "\"shape\" must be an array of integers, got " << js.type_name());
  for (const auto& jdim : js) {
    LSTM_REQUIRE(jdim.is_number_integer(),
                 at << "\"shape\" must be an array of integers, found " << json_excerpt(jdim));
    LSTM_REQUIRE(jdim.is_number_unsigned(),
                 at << "negative dimension " << json_excerpt(jdim) << " in shape " << json_excerpt(js));
    uint64_t d = jdim.get<uint64_t>();
    LSTM_REQUIRE(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 at << "dimension " << d << " in shape " << json_excerpt(js) << " is too large");
    e.shape.push_back(static_cast<int64_t>(d));
  }
  const auto& jo = j.at("data_offsets");
  LSTM_REQUIRE(jo.is_array() && jo.size() == 2,
               at << "\"data_offsets\" must be an array of two non-negative integers [begin, end], got "
                  << json_excerpt(jo));
  LSTM_REQUIRE(json_u64(jo[0], e.begin) && json_u64(jo[1], e.end),
               at << "\"data_offsets\" must be an array of two non-negative integers [begin, end], got "
                  << json_excerpt(jo));
  LSTM_REQUIRE(e.begin <= e.end,
               at << "data_offsets [" << e.begin << ", " << e.end << "]: begin > end");

  // Counted in order, with no shortcut for a zero dimension, as the reference implementation
  // counts: [2^62, 4, 0] is refused there, so it is refused here. Tensor counts elements and
  // bytes in int64_t, so that is the bound for both.
  uint64_t numel = 1;
  for (int64_t d : e.shape)
    LSTM_REQUIRE(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) &&
                     numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dtype_size(e.dtype),
                 at << "shape " << shape_str(e.shape) << " has too many elements");
  const uint64_t elem = dtype_size(e.dtype);
  const uint64_t want = numel * elem;
  LSTM_REQUIRE(e.end - e.begin == want,
               at << "data_offsets [" << e.begin << ", " << e.end << "] hold " << (e.end - e.begin)
                  << " bytes, but dtype " << dtype_name(e.dtype) << " with shape "
                  << shape_str(e.shape) << " needs " << want << " bytes");
  return e;
}

// Reads and fully validates the header of an open file of `file_size` bytes.
Header read_header(int fd, uint64_t file_size, const std::string& path, const std::string& pre) {
  // A file of some other kind (text, an archive, random bytes) fails one of the first checks; it
  // is named as such rather than by the header length its first bytes happen to spell.
  const std::string other = "'" + path + "' is not a safetensors file: ";
  LSTM_REQUIRE(file_size >= 8, other << "it is " << file_size
                                     << " bytes, shorter than the 8-byte header length");
  uint8_t len_bytes[8];
  LSTM_REQUIRE(pread_exact(fd, len_bytes, 8, 0, pre), pre << "file shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  LSTM_REQUIRE(n <= kMaxHeaderBytes,
               other << "header length " << n << " exceeds the 100 MB limit (" << kMaxHeaderBytes
                     << " bytes; the length is the file's first 8 bytes)");
  LSTM_REQUIRE(n <= file_size - 8, other << "header length " << n << " is larger than the file ("
                                         << file_size << " bytes, " << (file_size - 8)
                                         << " after the length field; the length is the file's first 8 bytes)");

  std::string text(n, '\0');
  LSTM_REQUIRE(pread_exact(fd, text.data(), n, 8, pre), pre << "file truncated while reading header");
  // A byte that starts no JSON value at all; other malformed headers get the JSON checks' words.
  LSTM_REQUIRE(n == 0 || std::string_view("{[\"-0123456789tfn \t\r\n\xEF").find(text[0]) != std::string_view::npos,
               other << "its header (" << n << " bytes after the length field) is not JSON: it starts with \""
                     << printable(text.substr(0, 8)) << "\"");

  // Duplicate names are refused rather than "last one wins": two readers must not disagree on
  // which bytes a name means.
  nlohmann::json j = parse_json(text, pre + "header", /*reject_duplicate_keys=*/true);
  LSTM_REQUIRE(j.is_object(), pre << "header is not a JSON object (got " << j.type_name() << ")");
  // The reference implementation refuses a header that does not start with '{' (leading
  // whitespace, a byte order mark); trailing whitespace is allowed there and here.
  LSTM_REQUIRE(text[0] == '{', pre << "header must start with '{', got \"" << printable(text.substr(0, 8))
                                   << "\" (leading whitespace or a byte order mark)");
  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      // The python library models metadata as Option<map>, so null means "none".
      if (value.is_null()) continue;
      LSTM_REQUIRE(value.is_object(),
                   pre << "\"__metadata__\" must be an object of strings, got " << value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        LSTM_REQUIRE(mv.is_string(), pre << "\"__metadata__\" value for key '" << mk
                                         << "' is not a string (got " << mv.type_name() << ")");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(key, value, pre);
    LSTM_REQUIRE(e.end <= data_size,
                 pre << "tensor '" << e.name << "': data_offsets [" << e.begin << ", " << e.end
                     << "] reach past the end of the data buffer (" << data_size << " bytes)");
    h.entries.push_back(std::move(e));
  }

  // The python library refuses buffers that are not tiled exactly by the tensors; doing the same
  // means every file we accept loads there too, and no hidden bytes ride along in a checkpoint.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < pos)
      LSTM_THROW(pre << "tensor '" << e.name << "' bytes [" << e.begin << ", " << e.end
                     << ") overlap tensor '" << prev->name << "' [" << prev->begin << ", "
                     << prev->end << ")");
    LSTM_REQUIRE(e.begin == pos, pre << "gap in data buffer: bytes [" << pos << ", " << e.begin
                                     << ") before tensor '" << e.name
                                     << "' belong to no tensor (metadata incomplete buffer)");
    pos = e.end;
    prev = &e;
  }
  LSTM_REQUIRE(pos == data_size, pre << "trailing bytes: data buffer is " << data_size
                                     << " bytes but tensors cover only " << pos
                                     << " (metadata incomplete buffer)");
  return h;
}

std::string read_prefix(const std::string& path) { return "safetensors file '" + path + "': "; }

void write_all(int fd, const char* p, size_t n, const std::string& pre) {
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      LSTM_THROW(pre << "write failed: " << errno_str(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string pre = read_prefix(path);
  uint64_t size = 0;
  Fd fd(open_regular_file(path, pre, size));
  Header h = read_header(fd.get(), size, path, pre);

  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  // Entries are in offset order, so this is one forward pass straight into each tensor's storage.
  for (Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    LSTM_REQUIRE(pread_exact(fd.get(), t.raw(), t.nbytes(), h.data_start + e.begin, pre),
                 pre << "file truncated while reading tensor '" << e.name << "'");
    out.tensors.emplace(std::move(e.name), std::move(t));
  }
  return out;
}

std::map<std::string, Shape> read_safetensors_shapes(const std::string& path) {
  const std::string pre = read_prefix(path);
  uint64_t size = 0;
  Fd fd(open_regular_file(path, pre, size));
  Header h = read_header(fd.get(), size, path, pre);
  std::map<std::string, Shape> out;
  for (Entry& e : h.entries) out.emplace(std::move(e.name), std::move(e.shape));
  return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors_in,
                       const std::map<std::string, std::string>& metadata) {
  const std::string pre = "write_safetensors '" + path + "': ";
  // GPU tensors (parameters, optimizer state) are written from host copies.
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : tensors_in) tensors[name] = t.defined() ? t.cpu() : t;
  // ordered_json keeps "__metadata__" first and tensors in name order, as the bytes are laid out.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LSTM_REQUIRE(!name.empty(), pre << "tensor name must not be empty");
    LSTM_REQUIRE(name != kMetadataKey, pre << "tensor name \"__metadata__\" is reserved");
    LSTM_REQUIRE(t.defined(), pre << "tensor '" << name << "' is undefined");
    LSTM_REQUIRE(t.device() == Device::CPU,
                 pre << "tensor '" << name << "' is not on the CPU; copy it to the host first");
    const uint64_t nb = t.nbytes();
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + nb});
    header[name] = std::move(entry);
    offset += nb;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& err) {
    LSTM_THROW(pre << "tensor names and metadata must be valid UTF-8: " << err.what());
  }
  // Padding to 8 bytes, as the python library does, keeps the data buffer 8-byte aligned when the
  // file is memory-mapped.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string bytes;
  bytes.reserve(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += text;
  for (const auto& [name, t] : tensors)
    bytes.append(static_cast<const char*>(t.raw()), t.nbytes());
  write_file_atomic(path, bytes);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string pre = "write_file_atomic '" + path + "': ";
  LSTM_REQUIRE(!path.empty(), "write_file_atomic: empty path");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";

  // pid + counter keeps concurrent writers (threads or processes) off each other's temp files.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    // 0666 lets the umask decide, like any ordinarily created file.
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    // A leftover from a crashed process with a recycled pid: try the next name.
    if (raw_fd < 0 && errno != EEXIST) break;
  }
  LSTM_REQUIRE(raw_fd >= 0,
               pre << "cannot create temporary file '" << tmp << "': " << errno_str(errno));

  Fd fd(raw_fd);
  try {
    write_all(fd.get(), bytes.data(), bytes.size(), pre);
    LSTM_REQUIRE(::fsync(fd.get()) == 0, pre << "fsync failed: " << errno_str(errno));
    LSTM_REQUIRE(fd.release_and_close() == 0, pre << "close failed: " << errno_str(errno));
    LSTM_REQUIRE(::rename(tmp.c_str(), path.c_str()) == 0,
                 pre << "cannot rename temporary file over it: " << errno_str(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }

  // Without this the rename itself may be lost on power failure, leaving the old file in place.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LSTM_REQUIRE(dfd >= 0, pre << "file written, but cannot open folder '" << dir.string()
                             << "' to fsync it: " << errno_str(errno));
  Fd dir_fd(dfd);
  // Some filesystems cannot fsync a folder at all; that is not a failure of this write.
  if (::fsync(dir_fd.get()) != 0 && errno != EINVAL && errno != ENOTSUP)
    LSTM_THROW(pre << "file written, but fsync of folder '" << dir.string()
                   << "' failed: " << errno_str(errno));
}

}  // namespace lstm
