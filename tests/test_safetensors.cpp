#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "lstm/safetensors.hpp"

using namespace lstm;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards, so tests can run in parallel (ctest -j).
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("lstm_st_" + std::string(info->name()) + "_" +
                                        std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Files whose name says they are temporaries of write_file_atomic.
  std::vector<std::string> temp_files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().find(".tmp.") != std::string::npos)
        out.push_back(e.path().filename().string());
    return out;
  }

  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

// Little-endian bytes of values, spelled out byte by byte so the test does not depend on memcpy.
template <class T>
std::string le(std::initializer_list<T> values) {
  std::string s;
  for (T v : values) {
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T); ++i) s.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  return s;
}

// A file as the python library lays it out: length, header padded with spaces to 8, data.
std::string st_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected non-lstm exception: ") + e.what();
  }
  return "no exception thrown";
}

// Both readers must reject the file, naming the file and the defect.
void expect_read_error(const std::string& p, const std::string& defect) {
  SCOPED_TRACE("file " + p + ", expecting '" + defect + "'");
  EXPECT_THAT(error_of([&] { read_safetensors(p); }), AllOf(HasSubstr(p), HasSubstr(defect)));
  EXPECT_THAT(error_of([&] { read_safetensors_shapes(p); }),
              AllOf(HasSubstr(p), HasSubstr(defect)));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor filled(const Shape& shape, DType dt, double start) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, start + static_cast<double>(i));
  return t;
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripEveryDtypeShapeAndMetadata) {
  std::map<std::string, Tensor> ts;
  ts["f64"] = filled({2, 3}, DType::F64, -2.5);
  ts["f32"] = Tensor::from_vector<float>(
      {5}, {1.5f, -0.0f, std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()});
  ts["bf16"] = filled({2, 2}, DType::BF16, -1.0);
  ts["f16"] = filled({3}, DType::F16, 0.25);
  ts["i64"] = Tensor::from_vector<int64_t>({2}, {std::numeric_limits<int64_t>::min(), 42});
  ts["i32"] = Tensor::from_vector<int32_t>({1, 2, 1}, {-7, std::numeric_limits<int32_t>::max()});
  ts["u8"] = Tensor::from_vector<uint8_t>({4}, {0, 1, 128, 255});
  ts["scalar"] = Tensor::full({}, 3.0, DType::F64);
  ts["empty"] = Tensor::empty({0, 3}, DType::F32);
  ts["empty_u8"] = Tensor::empty({0}, DType::U8);
  ts["lstm.weight_ih_l0"] = filled({8, 2}, DType::F32, 0.0);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"q\""}};

  const std::string p = path("all.safetensors");
  write_safetensors(p, ts, meta);
  SafetensorsFile f = read_safetensors(p);
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (const auto& [name, t] : ts) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(f.tensors.at(name), t)) << name;
  }
  EXPECT_EQ(f.metadata, meta);

  auto shapes = read_safetensors_shapes(p);
  ASSERT_EQ(shapes.size(), ts.size());
  for (const auto& [name, t] : ts) EXPECT_EQ(shapes.at(name), t.shape()) << name;
  EXPECT_EQ(shapes.at("scalar"), Shape{});
  EXPECT_EQ(shapes.at("empty"), (Shape{0, 3}));
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, WritesPythonLayout) {
  std::map<std::string, Tensor> ts;
  ts["b"] = filled({3}, DType::F32, 1.0);
  ts["a"] = filled({2}, DType::U8, 7.0);
  ts["c"] = filled({1}, DType::F64, 9.0);
  const std::string p = path("layout.safetensors");
  write_safetensors(p, ts, {{"format", "pt"}});

  const std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "header is padded to 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 2 + 12 + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}')) << "padding is trailing spaces";

  auto j = nlohmann::ordered_json::parse(header);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.begin().key(), "__metadata__");
  EXPECT_EQ(j["__metadata__"], (nlohmann::ordered_json{{"format", "pt"}}));
  // Sorted by name, packed back to back.
  EXPECT_EQ(j["a"]["dtype"], "U8");
  EXPECT_EQ(j["a"]["shape"], nlohmann::ordered_json::array({2}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::ordered_json::array({0, 2}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::ordered_json::array({2, 14}));
  EXPECT_EQ(j["c"]["dtype"], "F64");
  EXPECT_EQ(j["c"]["data_offsets"], nlohmann::ordered_json::array({14, 22}));
  EXPECT_EQ(bytes.substr(8 + n), le<uint8_t>({7, 8}) + le<float>({1.f, 2.f, 3.f}) + le<double>({9.0}));

  // Without metadata there is no "__metadata__" key at all, as save_file(metadata=None) writes.
  write_safetensors(p, ts);
  const std::string b2 = read_bytes(p);
  EXPECT_EQ(b2.find("__metadata__"), std::string::npos);
  EXPECT_TRUE(read_safetensors(p).metadata.empty());
}

TEST_F(SafetensorsTest, ReadsHandBuiltFile) {
  // Offsets deliberately not in name order, extra whitespace, and a bf16 scalar: all legal.
  const std::string header =
      R"({"__metadata__": {"format": "pt"}, )"
      R"("weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}, )"
      R"("bias": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, )"
      R"("half": {"dtype": "F16", "shape": [1], "data_offsets": [32, 34]}, )"
      R"("scale": {"dtype": "BF16", "shape": [], "data_offsets": [34, 36]}, )"
      R"("none": {"dtype": "F64", "shape": [0, 4], "data_offsets": [36, 36]}, )"
      R"("mask": {"dtype": "U8", "shape": [3], "data_offsets": [36, 39]}})";
  const std::string data = le<int64_t>({-3, 1LL << 40}) + le<float>({1.f, -2.f, 0.5f, 8.f}) +
                           le<uint16_t>({0x3c00}) /* f16 1.0 */ +
                           le<uint16_t>({0xc040}) /* bf16 -3.0 */ + le<uint8_t>({1, 0, 255});
  const std::string p = path("hand.safetensors");
  write_bytes(p, st_file(header, data));

  SafetensorsFile f = read_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 6u);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  const Tensor& w = f.tensors.at("weight");
  EXPECT_EQ(w.dtype(), DType::F32);
  EXPECT_EQ(w.shape(), (Shape{2, 2}));
  EXPECT_EQ(w.get(0), 1.0);
  EXPECT_EQ(w.get(1), -2.0);
  EXPECT_EQ(w.get(2), 0.5);
  EXPECT_EQ(w.get(3), 8.0);
  const Tensor& b = f.tensors.at("bias");
  EXPECT_EQ(b.dtype(), DType::I64);
  EXPECT_EQ(b.data<int64_t>()[0], -3);
  EXPECT_EQ(b.data<int64_t>()[1], 1LL << 40);
  EXPECT_EQ(f.tensors.at("half").dtype(), DType::F16);
  EXPECT_EQ(f.tensors.at("half").get(0), 1.0);
  EXPECT_EQ(f.tensors.at("scale").dim(), 0);
  EXPECT_EQ(f.tensors.at("scale").dtype(), DType::BF16);
  EXPECT_EQ(f.tensors.at("scale").get(0), -3.0);
  EXPECT_EQ(f.tensors.at("none").shape(), (Shape{0, 4}));
  EXPECT_EQ(f.tensors.at("none").numel(), 0);
  EXPECT_EQ(f.tensors.at("mask").get(2), 255.0);

  // Unpadded headers are legal too, and so is an empty file's "{}".
  write_bytes(p, u64_le(2) + "{}");
  EXPECT_TRUE(read_safetensors(p).tensors.empty());
  write_bytes(p, st_file(R"({"__metadata__": null})", ""));
  EXPECT_TRUE(read_safetensors(p).metadata.empty());
}

TEST_F(SafetensorsTest, RejectsUnreadableOrShortFiles) {
  expect_read_error(path("missing.safetensors"), "No such file or directory");
  expect_read_error(dir_.string(), "not a regular file");

  const std::string p = path("bad.safetensors");
  write_bytes(p, "");
  expect_read_error(p, "shorter than the 8-byte header length");
  write_bytes(p, std::string("\x10\0\0\0\0", 5));
  expect_read_error(p, "shorter than the 8-byte header length");

  write_bytes(p, u64_le(64) + "{}");
  expect_read_error(p, "header length 64 is larger than the file");
  write_bytes(p, u64_le(200'000'000) + "{}");
  expect_read_error(p, "exceeds the 100 MB limit");
  write_bytes(p, u64_le(~0ULL) + "{}");
  expect_read_error(p, "exceeds the 100 MB limit");

  // A valid file cut short loses the end of its last tensor.
  std::map<std::string, Tensor> ts = {{"x", filled({4}, DType::F32, 0.0)}};
  write_safetensors(p, ts);
  std::string bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 3));
  expect_read_error(p, "past the end of the data buffer");
  write_bytes(p, bytes.substr(0, 12));
  expect_read_error(p, "is larger than the file");
}

TEST_F(SafetensorsTest, RejectsMalformedHeaders) {
  const std::string p = path("bad.safetensors");
  auto check = [&](const std::string& header, const std::string& data, const std::string& defect) {
    write_bytes(p, st_file(header, data));
    expect_read_error(p, defect);
  };
  const std::string f32x2 = le<float>({1.f, 2.f});

  check("", "", "header is not valid JSON");
  check(R"({"x": {"dtype": "F32", )", "", "header is not valid JSON");
  check("{\"\xff\": 1}", "", "header is not valid JSON");
  check("[1, 2]", "", "header is not a JSON object");
  check("\"x\"", "", "header is not a JSON object");
  check(R"({"x": 3})", "", "tensor 'x': header entry must be a JSON object");
  check(R"({"x": {"shape": [2], "data_offsets": [0, 8]}})", f32x2, "missing \"dtype\"");
  check(R"({"x": {"dtype": "F32", "data_offsets": [0, 8]}})", f32x2, "missing \"shape\"");
  check(R"({"x": {"dtype": "F32", "shape": [2]}})", f32x2, "missing \"data_offsets\"");
  check(R"({"x": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})", f32x2,
        "\"dtype\" must be a string");
  check(R"({"x": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", f32x2,
        "\"shape\" must be an array of integers");
  check(R"({"x": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", f32x2,
        "\"shape\" must be an array of integers");
  check(R"({"x": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}})", f32x2,
        "\"shape\" must be an array of integers");
  check(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": {"begin": 0}}})", f32x2,
        "\"data_offsets\" must be an array of two non-negative integers");
  check(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8]}})", f32x2,
        "\"data_offsets\" must be an array of two non-negative integers");
  check(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}})", f32x2,
        "\"data_offsets\" must be an array of two non-negative integers");
  check(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", f32x2,
        "\"data_offsets\" must be an array of two non-negative integers");
  check(R"({"x": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", "ab",
        "unsupported dtype 'BOOL'");
  check(R"({"x": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}})", f32x2,
        "unsupported dtype 'f32'");
  check(R"({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", f32x2,
        "negative dimension -2");
  check(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", f32x2,
        "begin > end");
  check(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", f32x2,
        "past the end of the data buffer");
  check(R"({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", f32x2,
        "hold 8 bytes, but dtype F32 with shape [3] needs 12 bytes");
  check(R"({"x": {"dtype": "F64", "shape": [2], "data_offsets": [0, 8]}})", f32x2,
        "needs 16 bytes");
  // Products that overflow 64 bits must not wrap around to a size that happens to match.
  check(R"({"x": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
        "", "too many elements");
  check(R"({"x": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
        "", "too many elements");
  check(R"({"x": {"dtype": "U8", "shape": [99999999999999999999], "data_offsets": [0, 0]}})",
        "", "\"shape\" must be an array of integers");
  check(R"({"__metadata__": ["a"]})", "", "\"__metadata__\" must be an object of strings");
  check(R"({"__metadata__": {"epoch": 3}})", "", "value for key 'epoch' is not a string");
  check(R"({"__metadata__": {"a": "b", "n": null}})", "", "value for key 'n' is not a string");
}

TEST_F(SafetensorsTest, RejectsBuffersNotTiledByTensors) {
  const std::string p = path("bad.safetensors");
  auto check = [&](const std::string& header, const std::string& data, const std::string& defect) {
    write_bytes(p, st_file(header, data));
    expect_read_error(p, defect);
  };
  const std::string b12(12, '\x01');
  check(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
        b12, "tensor 'b' bytes [4, 12) overlap tensor 'a' [0, 8)");
  check(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
        R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
        std::string(8, '\x01'), "overlap");
  check(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
        R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
        b12, "gap in data buffer: bytes [4, 8) before tensor 'b'");
  check(R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
        std::string(8, '\x01'), "gap in data buffer: bytes [0, 4)");
  check(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
        std::string(8, '\x01'), "trailing bytes: data buffer is 8 bytes but tensors cover only 4");
  check("{}", "x", "metadata incomplete buffer");
}

TEST_F(SafetensorsTest, WriteRefusesBadInput) {
  const std::string p = path("w.safetensors");
  const Tensor ok = filled({2}, DType::F32, 0.0);
  EXPECT_THAT(error_of([&] { write_safetensors(p, {{"x", Tensor()}}); }),
              AllOf(HasSubstr(p), HasSubstr("tensor 'x' is undefined")));
  EXPECT_THAT(error_of([&] { write_safetensors(p, {{"", ok}}); }),
              AllOf(HasSubstr(p), HasSubstr("name must not be empty")));
  EXPECT_THAT(error_of([&] { write_safetensors(p, {{"__metadata__", ok}}); }),
              AllOf(HasSubstr(p), HasSubstr("\"__metadata__\" is reserved")));
  EXPECT_THAT(error_of([&] { write_safetensors(p, {{"x", ok}}, {{"k", "\xff"}}); }),
              AllOf(HasSubstr(p), HasSubstr("valid UTF-8")));
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, FailedWriteLeavesOldFileUntouched) {
  const std::string p = path("model.safetensors");
  write_safetensors(p, {{"w", filled({3, 2}, DType::F32, 1.0)}}, {{"step", "1"}});
  const std::string before = read_bytes(p);

  // Validation fails after a good tensor has already been serialised.
  EXPECT_THROW(write_safetensors(p, {{"a", filled({4}, DType::F64, 0.0)}, {"b", Tensor()}}), Error);
  EXPECT_EQ(read_bytes(p), before);

  // The rename fails because the target is a non-empty folder; the temp file must go.
  const std::string d = path("folder");
  fs::create_directories(d);
  write_bytes(d + "/inside", "x");
  EXPECT_THAT(error_of([&] { write_file_atomic(d, "new contents"); }),
              AllOf(HasSubstr(d), HasSubstr("cannot rename")));
  EXPECT_TRUE(fs::is_directory(d));

  // The folder does not exist: the temp file cannot even be created.
  const std::string nowhere = path("no/such/dir/f.bin");
  EXPECT_THAT(error_of([&] { write_file_atomic(nowhere, "x"); }),
              AllOf(HasSubstr(nowhere), HasSubstr("cannot create temporary file"),
                    HasSubstr("No such file or directory")));

  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(read_safetensors(p).metadata.at("step"), "1");
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, WriteFailingMidwayLeavesOldFileUntouched) {
  const std::string p = path("model.safetensors");
  write_safetensors(p, {{"w", filled({8}, DType::F32, 1.0)}});
  const std::string before = read_bytes(p);

  // A file size limit makes write() itself fail with EFBIG partway through the data, the closest
  // a test can get to a full disk.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg = error_of([&] {
    write_safetensors(p, {{"w", filled({1 << 16}, DType::F32, 2.0)}});
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_THAT(msg, AllOf(HasSubstr(p), HasSubstr("write failed"), HasSubstr("File too large")));
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_TRUE(temp_files().empty());
}

TEST_F(SafetensorsTest, AtomicWriteReplacesAndConcurrentWritersDoNotCollide) {
  const std::string p = path("side.json");
  write_file_atomic(p, "first");
  write_file_atomic(p, "");
  EXPECT_EQ(read_bytes(p), "");
  write_file_atomic(p, std::string(100000, 'z'));
  EXPECT_EQ(read_bytes(p), std::string(100000, 'z'));

  // Whoever renames last wins, but every reader sees one writer's complete file.
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k) write_file_atomic(p, std::string(1000, static_cast<char>('a' + i)));
    });
  for (auto& t : threads) t.join();
  const std::string got = read_bytes(p);
  ASSERT_EQ(got.size(), 1000u);
  EXPECT_EQ(got, std::string(1000, got[0]));
  EXPECT_TRUE(temp_files().empty());

  // A bare file name writes into the current folder.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  write_file_atomic("bare.txt", "here");
  fs::current_path(cwd);
  EXPECT_EQ(read_bytes(path("bare.txt")), "here");
}

// Hardening: inputs that crashed, hung or were wrongly accepted.

TEST_F(SafetensorsTest, RejectsDeepNestingBeforeAnythingRecurses) {
  const std::string p = path("deep.safetensors");
  // A few hundred KB of '[' used to overflow the stack while the error message was formatted.
  for (const char* field : {"shape", "data_offsets"}) {
    std::string deep = std::string(300'000, '[') + std::string(300'000, ']');
    std::string h = std::string(R"({"x": {"dtype": "F32", ")") + field + "\": " + deep;
    h += std::string(field) == "shape" ? R"(, "data_offsets": [0, 0]}})" : R"(, "shape": [0]}})";
    write_bytes(p, st_file(h, ""));
    expect_read_error(p, "header nests deeper than 64 levels");
  }
  // 64 levels are fine as JSON (and then refused as a shape).
  std::string ok = std::string(62, '[') + std::string(62, ']');
  write_bytes(p, st_file(R"({"x": {"dtype": "F32", "shape": )" + ok + R"(, "data_offsets": [0, 0]}})", ""));
  expect_read_error(p, "\"shape\" must be an array of integers");
}

TEST_F(SafetensorsTest, RefusesFifoWithoutBlocking) {
  const std::string p = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  // Without a writer, open() of a FIFO blocks forever unless the reader refuses it first.
  std::atomic<bool> done{false};
  std::thread guard([&] {
    for (int i = 0; i < 200 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!done) {  // unblock the reader so that the test fails instead of hanging
      int fd = ::open(p.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  });
  expect_read_error(p, "not a regular file: expected a file, got a FIFO");
  done = true;
  guard.join();
}

TEST_F(SafetensorsTest, ZeroDimensionDoesNotHideAnOverflowingShape) {
  const std::string p = path("zero.safetensors");
  write_bytes(p, st_file(R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4, 0], "data_offsets": [0, 0]}})", ""));
  expect_read_error(p, "shape [4611686018427387904, 4, 0] has too many elements");
  // An ordinary empty tensor is still fine.
  write_bytes(p, st_file(R"({"x": {"dtype": "F32", "shape": [3, 0], "data_offsets": [0, 0]}})", ""));
  EXPECT_EQ(read_safetensors(p).tensors.at("x").shape(), (Shape{3, 0}));
  EXPECT_THAT(error_of([] { (void)shape_numel({int64_t{1} << 62, 4, 0}); }), HasSubstr("too many elements"));
}

TEST_F(SafetensorsTest, AcceptsOnlyWhatTheReferenceAccepts) {
  const std::string p = path("strict.safetensors");
  const std::string f32x2 = le<float>({1.f, 2.f});
  const std::string good = R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  auto with_header = [&](const std::string& h) { write_bytes(p, u64_le(h.size()) + h + f32x2); };
  // Valid JSON, then a NUL and junk: nlohmann stops at the NUL, the reference does not.
  with_header(good + std::string("\0junk", 5));
  expect_read_error(p, "header is not valid JSON: a NUL byte at offset");
  with_header(good + "junk");
  expect_read_error(p, "header is not valid JSON");
  // Trailing whitespace is accepted (serde_json skips it); leading whitespace is not.
  with_header(good + "  \n\t ");
  EXPECT_EQ(read_safetensors(p).tensors.at("x").numel(), 2);
  with_header(" " + good);
  expect_read_error(p, "header must start with '{'");
  with_header("\xEF\xBB\xBF" + good);
  expect_read_error(p, "header must start with '{'");
  // A name given twice is refused, not "last one wins".
  with_header(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
              R"("x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})");
  expect_read_error(p, "header has the key \"x\" twice");
}
