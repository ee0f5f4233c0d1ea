#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "io/csv_reader.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"

using namespace lstm;
namespace fs = std::filesystem;

namespace {

// The lstm::Error message a call throws; records a failure when it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an lstm::Error";
  return {};
}

::testing::AssertionResult contains(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << part << "\"";
}

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("lstm_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out << bytes;
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.data<int64_t>()[i];
  return v;
}

std::vector<float> floats(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace

// ---- Vocab / UTF-8 ----------------------------------------------------------------------------

TEST(Vocab, MultiByteRoundTrip) {
  // 1-, 2-, 3- and 4-byte characters, the last and first of each length included.
  const std::string text = "zé€😀a\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBFé";
  const Vocab v = Vocab::from_text(text);
  EXPECT_EQ(v.size(), 12);
  // Ids follow code point order.
  EXPECT_EQ(v.decode_one(0), "a");
  EXPECT_EQ(v.decode_one(1), "z");
  EXPECT_EQ(v.decode_one(2), "\x7F");
  EXPECT_EQ(v.decode_one(3), "\xC2\x80");
  EXPECT_EQ(v.decode_one(4), "é");
  EXPECT_EQ(v.decode_one(11), "\xF4\x8F\xBF\xBF");
  const auto ids = v.encode(text);
  EXPECT_EQ(ids.size(), 13u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 4);
  EXPECT_EQ(v.decode(ids), text);

  const nlohmann::json j = v.to_json();
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j.size(), 12u);
  EXPECT_EQ(j[4].get<std::string>(), "é");
  const Vocab back = Vocab::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.encode(text), ids);

  EXPECT_EQ(Vocab::from_text("").size(), 0);
}

TEST(Vocab, InvalidUtf8NamesTheOffset) {
  struct Case {
    std::string bytes, offset, why;
  };
  const std::vector<Case> cases = {
      {"ab\x80", "offset 2", "continuation byte"},
      {"a\xC0\xAF", "offset 1", "overlong"},
      {"a\xC1\xBF", "offset 1", "overlong"},
      {"ab\xE0\x80\xAF", "offset 2", "overlong"},
      {"\xF0\x80\x80\xAF", "offset 0", "overlong"},
      {"xyz\xED\xA0\x80", "offset 3", "surrogate"},
      {"x\xED\xBF\xBF", "offset 1", "surrogate"},
      {"\xF4\x90\x80\x80", "offset 0", "above U+10FFFF"},
      {"\xF5\x80\x80\x80", "offset 0", "never occurs"},
      {"\xFF", "offset 0", "never occurs"},
      {"ok\xE2\x82", "offset 2", "truncated"},
      {"ok\xF0\x9F\x98", "offset 2", "truncated"},
      {"\xE2\x41\x42", "offset 0", "not a continuation byte"},
      {"é\xC3", "offset 2", "truncated"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { Vocab::from_text(c.bytes); });
    EXPECT_TRUE(contains(msg, "byte " + c.offset)) << "case at " << c.offset;
    EXPECT_TRUE(contains(msg, c.why));
  }
  const Vocab v = Vocab::from_text("abc");
  EXPECT_TRUE(contains(error_of([&] { v.encode("ab\xC3"); }), "byte offset 2"));
}

TEST(Vocab, EncodeDecodeErrors) {
  const Vocab v = Vocab::from_text("hello");
  const std::string msg = error_of([&] { v.encode("hellö"); });
  EXPECT_TRUE(contains(msg, "U+00F6"));
  EXPECT_TRUE(contains(msg, "byte offset 4"));
  EXPECT_TRUE(contains(msg, "not in the vocabulary"));
  EXPECT_TRUE(contains(error_of([&] { v.decode({0, 4}); }), "id 4"));
  EXPECT_TRUE(contains(error_of([&] { v.decode({-1}); }), "out of range"));
  EXPECT_THROW(v.decode_one(v.size()), Error);
}

TEST(Vocab, FromJsonValidates) {
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json::object()); }), "expected an array"));
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json{"a", 3}); }), "entry 1"));
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json{"a", "bc"}); }), "exactly one character"));
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json{""}); }), "empty string"));
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json{"a", "é", "a"}); }), "duplicates entry 0"));
  // Invalid UTF-8 inside a JSON string is rejected by nlohmann's parser, so build the value directly.
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json::array({std::string("\xED\xA0\x80")})); }),
                       "surrogate"));
  // Ids are positions in the saved array, so a checkpoint's vocabulary keeps its ids.
  const Vocab v = Vocab::from_json(nlohmann::json{"b", "a"});
  EXPECT_EQ(v.encode("ab"), (std::vector<int64_t>{1, 0}));
}

// ---- CharCorpus -------------------------------------------------------------------------------

TEST(CharCorpus, TrainBatchesAreShiftedWindows) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "héllo wörld € " + std::to_string(i) + "\n";
  const CharCorpus c = CharCorpus::from_text(text, 0.25);
  const auto chars = static_cast<int64_t>(c.vocab().encode(text).size());
  EXPECT_EQ(c.train_size() + c.valid_size(), chars);
  EXPECT_EQ(c.valid_size(), std::llround(chars * 0.25));
  // A corpus's vocabulary reserves the unknown id after its characters.
  EXPECT_EQ(c.vocab().size(), Vocab::from_text(text).size() + 1);
  EXPECT_EQ(c.vocab().unk_id(), c.vocab().size() - 1);

  const int64_t B = 5, T = 7;
  Rng rng(42);
  const Batch b = c.train_batch(B, T, rng);
  EXPECT_EQ(b.inputs.shape(), (Shape{T, B}));
  EXPECT_EQ(b.targets.shape(), (Shape{T, B}));
  EXPECT_EQ(b.inputs.dtype(), DType::I64);
  EXPECT_EQ(b.targets.dtype(), DType::I64);
  EXPECT_EQ(b.lengths, std::vector<int64_t>(B, T));
  const auto x = ints(b.inputs), y = ints(b.targets);
  const auto all = c.vocab().encode(text);
  const std::vector<int64_t> train(all.begin(), all.begin() + c.train_size());
  for (int64_t j = 0; j < B; ++j) {
    std::vector<int64_t> window;
    for (int64_t t = 0; t < T; ++t) {
      if (t + 1 < T) {
        EXPECT_EQ(y[t * B + j], x[(t + 1) * B + j]);
      }
      window.push_back(x[t * B + j]);
    }
    window.push_back(y[(T - 1) * B + j]);
    // Each column is a real stretch of the training split.
    EXPECT_NE(std::search(train.begin(), train.end(), window.begin(), window.end()), train.end());
  }

  Rng a(7), a2(7), other(8);
  const Batch b1 = c.train_batch(B, T, a), b2 = c.train_batch(B, T, a2), b3 = c.train_batch(B, T, other);
  EXPECT_EQ(ints(b1.inputs), ints(b2.inputs));
  EXPECT_EQ(ints(b1.targets), ints(b2.targets));
  EXPECT_NE(ints(b1.inputs), ints(b3.inputs));
  // Consecutive draws move on.
  EXPECT_NE(ints(c.train_batch(B, T, a).inputs), ints(b1.inputs));

  const std::string msg = error_of([&] { c.train_batch(2, c.train_size(), rng); });
  EXPECT_TRUE(contains(msg, "training split has " + std::to_string(c.train_size())));
  EXPECT_TRUE(contains(msg, "at least " + std::to_string(c.train_size() + 1)));
  EXPECT_NO_THROW(c.train_batch(2, c.train_size() - 1, rng));
}

TEST(CharCorpus, ValidBatchesAreConsecutiveWindows) {
  std::string text;
  for (int i = 0; i < 10; ++i) text += "0123456789";
  // Digits sort in order, so the id of each digit is its value.
  const CharCorpus c = CharCorpus::from_text(text, 0.2);
  ASSERT_EQ(c.valid_size(), 20);
  ASSERT_EQ(c.train_size(), 80);

  // 19 predictable characters hold 4 windows of 4 steps.
  EXPECT_EQ(c.valid_batches(2, 4), 2);
  const Batch b0 = c.valid_batch(2, 4, 0);
  EXPECT_EQ(b0.inputs.shape(), (Shape{4, 2}));
  EXPECT_EQ(ints(b0.inputs), (std::vector<int64_t>{0, 4, 1, 5, 2, 6, 3, 7}));
  EXPECT_EQ(ints(b0.targets), (std::vector<int64_t>{1, 5, 2, 6, 3, 7, 4, 8}));
  const Batch b1 = c.valid_batch(2, 4, 1);
  EXPECT_EQ(ints(b1.inputs), (std::vector<int64_t>{8, 2, 9, 3, 0, 4, 1, 5}));
  EXPECT_EQ(ints(b1.targets), (std::vector<int64_t>{9, 3, 0, 4, 1, 5, 2, 6}));
  EXPECT_EQ(ints(c.valid_batch(2, 4, 2).inputs), ints(b0.inputs));  // wraps
  EXPECT_EQ(ints(c.valid_batch(2, 4, 0).targets), ints(b0.targets));  // deterministic

  // Windows that do not fill the last batch still get evaluated, in a smaller batch.
  EXPECT_EQ(c.valid_batches(3, 4), 2);
  EXPECT_EQ(c.valid_batch(3, 4, 0).inputs.shape(), (Shape{4, 3}));
  const Batch rest = c.valid_batch(3, 4, 1);
  EXPECT_EQ(ints(rest.inputs), (std::vector<int64_t>{2, 3, 4, 5}));

  // Fewer windows than the batch asks for: one smaller batch.
  EXPECT_EQ(c.valid_batches(8, 4), 1);
  const Batch small = c.valid_batch(8, 4, 0);
  EXPECT_EQ(small.inputs.shape(), (Shape{4, 4}));
  EXPECT_EQ(small.lengths, std::vector<int64_t>(4, 4));

  EXPECT_EQ(c.valid_batches(1, 19), 1);
  EXPECT_EQ(c.valid_batches(1, 20), 0);
  const std::string msg = error_of([&] { c.valid_batch(1, 20, 0); });
  EXPECT_TRUE(contains(msg, "validation split has 20"));
  EXPECT_TRUE(contains(msg, "at least 21"));
}

TEST(CharCorpus, TooSmallSplitsSaySizes) {
  const std::string msg = error_of([] { CharCorpus::from_text("abcdefghij", 0.1); });
  EXPECT_TRUE(contains(msg, "10 characters"));
  EXPECT_TRUE(contains(msg, "9 training and 1 validation"));
  EXPECT_NO_THROW(CharCorpus::from_text("abcdefghij", 0.2));
  EXPECT_THROW(CharCorpus::from_text("abc", 0.5), Error);
  EXPECT_THROW(CharCorpus::from_text("abcdefghij", 0.0), Error);
  EXPECT_THROW(CharCorpus::from_text("abcdefghij", 1.0), Error);
  EXPECT_TRUE(contains(error_of([] { CharCorpus::from_text("abcdef\xFFghij", 0.2); }), "byte offset 6"));
}

TEST(CharCorpus, LoadsFolderSkippingBinariesAndLinks) {
  TempDir dir;
  const std::string a = "Ünïcode text, line one.\nLine two: ∑ 😀\n";
  const std::string b = "second file\n";
  dir.write("a.txt", a);
  dir.write("b.txt", b);
  dir.write("a.dat", std::string("\x01\x00\x00\x00\xD1\x07", 6));  // fortune-style index: not UTF-8
  dir.write("c.bin", std::string("abc\0def", 7));                  // valid UTF-8, but a NUL byte
  fs::create_symlink("a.txt", dir.path() / "a.u8");               // same text under another name
  fs::create_symlink("b.txt", dir.path() / "0first.u8");          // sorts before its target
  fs::create_directories(dir.path() / "sub");
  dir.write("sub/ignored.txt", "not read: folders are not recursed\n");
  fs::create_directory_symlink("sub", dir.path() / "sublink");
  fs::create_symlink("missing", dir.path() / "broken");

  const CharCorpus c = CharCorpus::load({dir.path().string()}, 0.25);
  const Vocab expected = Vocab::from_text(a + b, true);
  EXPECT_EQ(c.vocab().to_json(), expected.to_json());
  EXPECT_EQ(c.train_size() + c.valid_size(), static_cast<int64_t>(expected.encode(a + b).size()));

  // A link to a file outside the list is read; so is a file given both directly and in a folder, once.
  TempDir other;
  const std::string extra = "outside\n";
  other.write("x.txt", extra);
  fs::create_symlink(other.path() / "x.txt", dir.path() / "z.lnk");
  const CharCorpus d = CharCorpus::load({dir.path().string(), (dir.path() / "a.txt").string()}, 0.25);
  EXPECT_EQ(d.train_size() + d.valid_size(), static_cast<int64_t>(expected.encode(a + b).size()) + 8);

  // Named files must be text: the error says which file and where.
  const std::string msg = error_of([&] { CharCorpus::load({(dir.path() / "a.dat").string()}); });
  EXPECT_TRUE(contains(msg, "a.dat"));
  EXPECT_TRUE(contains(msg, "byte offset 4"));
  EXPECT_TRUE(contains(error_of([&] { CharCorpus::load({(dir.path() / "nope").string()}); }), "no such file"));

  TempDir binary_only;
  binary_only.write("x.dat", std::string("\xFF\xFE", 2));
  const std::string none = error_of([&] { CharCorpus::load({binary_only.path().string()}); });
  EXPECT_TRUE(contains(none, "no text"));
  EXPECT_TRUE(contains(none, "x.dat (not UTF-8)"));
}

TEST(CharCorpus, MaxBytesCutsAtACharacterBoundary) {
  TempDir dir;
  dir.write("a.txt", "abcdefgh");
  dir.write("b.txt", "ijk€€€");  // '€' is 3 bytes: bytes 11..13, 14..16, 17..19
  const CharCorpus whole = CharCorpus::load({dir.path().string()}, 0.25);
  EXPECT_EQ(whole.train_size() + whole.valid_size(), 14);
  const CharCorpus cut = CharCorpus::load({dir.path().string()}, 0.25, 13);
  EXPECT_EQ(cut.train_size() + cut.valid_size(), 11);  // the '€' straddling byte 13 is dropped
  EXPECT_EQ(cut.vocab().size(), 11 + 1);  // and <unk>
  const CharCorpus exact = CharCorpus::load({dir.path().string()}, 0.25, 14);
  EXPECT_EQ(exact.train_size() + exact.valid_size(), 12);
  const CharCorpus first = CharCorpus::load({dir.path().string()}, 0.25, 8);
  EXPECT_EQ(first.train_size() + first.valid_size(), 8);
}

TEST(CharCorpus, LoadsFortunes) {
  const fs::path dir = "/usr/share/games/fortunes";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " is not installed (Debian package fortunes-min or fortunes)";
  uintmax_t plain_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") plain_bytes += e.file_size();
  const CharCorpus c = CharCorpus::load({dir.string()});
  const int64_t chars = c.train_size() + c.valid_size();
  EXPECT_GT(chars, 100000);
  // Links (*.u8) add no text and index files (*.dat) are skipped: at most one character per byte.
  EXPECT_LE(static_cast<uintmax_t>(chars), plain_bytes);
  EXPECT_LT(c.vocab().size(), 300);
  EXPECT_GT(c.vocab().size(), 60);
  EXPECT_EQ(c.vocab().decode(c.vocab().encode("%\n")), "%\n");  // fortune's separator is there
  Rng rng(1);
  const Batch b = c.train_batch(16, 64, rng);
  EXPECT_EQ(b.inputs.shape(), (Shape{64, 16}));
  EXPECT_GE(c.valid_batches(16, 64), 1);
}

// ---- CsvDataset -------------------------------------------------------------------------------

TEST(CsvDataset, NumericSingleFeature) {
  TempDir dir;
  const auto path = dir.write("num.csv", "label,sequence\n0,1 2 3\n2, 4   5 \n1,-1.5 2e3 +0.25\n");
  const CsvDataset d = CsvDataset::load(path);
  EXPECT_EQ(d.size(), 3);
  EXPECT_FALSE(d.is_tokens());
  EXPECT_EQ(d.features(), 1);
  EXPECT_EQ(d.num_classes(), 3);
  EXPECT_EQ(d.class_names(), (std::vector<std::string>{"0", "1", "2"}));
  const Batch b = d.batch({1, 0, 2});
  EXPECT_EQ(b.inputs.shape(), (Shape{3, 3, 1}));
  EXPECT_EQ(b.inputs.dtype(), DType::F32);
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(floats(b.inputs), (std::vector<float>{4, 1, -1.5f, 5, 2, 2000, 0, 3, 0.25f}));
  EXPECT_EQ(b.targets.shape(), (Shape{3}));
  EXPECT_EQ(ints(b.targets), (std::vector<int64_t>{2, 0, 1}));
  const Batch one = d.batch({1});
  EXPECT_EQ(one.inputs.shape(), (Shape{2, 1, 1}));
  EXPECT_TRUE(contains(error_of([&] { d.batch({3}); }), "row index 3"));
  EXPECT_THROW(d.batch({}), Error);
}

TEST(CsvDataset, MultiFeatureCrlfAndColumnOrder) {
  TempDir dir;
  const auto path = dir.write("multi.csv", "id,seq,class\r\n7,\"1|2 3|4\",1\r\n8,5|6,0\r\n9,7|8 9|10 11|12,3\r\n");
  const CsvDataset d = CsvDataset::load(path, "class", "seq");
  EXPECT_EQ(d.size(), 3);
  EXPECT_FALSE(d.is_tokens());
  EXPECT_EQ(d.features(), 2);
  EXPECT_EQ(d.num_classes(), 4);  // integer labels are ids: 0..3, gaps included
  EXPECT_EQ(d.class_names(), (std::vector<std::string>{"0", "1", "2", "3"}));
  const Batch b = d.batch({0, 1});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(floats(b.inputs), (std::vector<float>{1, 2, 5, 6, 3, 4, 0, 0}));
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(ints(b.targets), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(d.batch({2}).inputs.shape(), (Shape{3, 1, 2}));
}

TEST(CsvDataset, TokensAndStringLabels) {
  TempDir dir;
  const auto path = dir.write("tok.csv", "sequence,label\nthe cat sat,pos\n  dog   ran ,neg\n1 2 x,pos\n");
  const CsvDataset d = CsvDataset::load(path);
  EXPECT_TRUE(d.is_tokens());
  EXPECT_EQ(d.token_names(), (std::vector<std::string>{"1", "2", "cat", "dog", "ran", "sat", "the", "x", "<unk>"}));
  EXPECT_EQ(d.features(), 9);
  EXPECT_EQ(d.class_names(), (std::vector<std::string>{"neg", "pos"}));
  EXPECT_EQ(d.num_classes(), 2);
  const Batch b = d.batch({0, 1, 2});
  EXPECT_EQ(b.inputs.shape(), (Shape{3, 3}));
  EXPECT_EQ(b.inputs.dtype(), DType::I64);
  EXPECT_EQ(ints(b.inputs), (std::vector<int64_t>{6, 3, 0, 2, 4, 1, 5, 0, 7}));
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(ints(b.targets), (std::vector<int64_t>{1, 0, 1}));

  // A negative number is not a class id, so such labels are names.
  const CsvDataset neg = CsvDataset::load(dir.write("neg.csv", "label,sequence\n-1,a\n1,b\n10,c\n"));
  EXPECT_EQ(neg.class_names(), (std::vector<std::string>{"-1", "1", "10"}));
  EXPECT_EQ(ints(neg.batch({0, 1, 2}).targets), (std::vector<int64_t>{0, 1, 2}));
}

TEST(CsvDataset, QuotedFields) {
  TempDir dir;
  const auto path = dir.write("q.csv",
                              "\"label\",note,sequence\n"
                              "a,\"hello, \"\"world\"\"\",\"x y\"\n"
                              "b,\"two\nlines, with comma\",z\n"
                              "a,,\"\"\"q\"\"\"\n");
  const CsvDataset d = CsvDataset::load(path);
  EXPECT_EQ(d.size(), 3);
  EXPECT_TRUE(d.is_tokens());
  EXPECT_EQ(d.token_names(), (std::vector<std::string>{"\"q\"", "x", "y", "z", "<unk>"}));
  EXPECT_EQ(d.class_names(), (std::vector<std::string>{"a", "b"}));
  // Line numbers count the newline inside the quoted field.
  const auto bad = dir.write("q2.csv", "label,note,sequence\n0,\"a\nb\",1\n1,x,\n");
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(bad); }), bad + ":4: empty sequence"));
}

TEST(CsvDataset, MalformedInputsSayWhatAndWhere) {
  TempDir dir;
  auto msg = error_of([&] { CsvDataset::load(dir.write("m.csv", "label,seq\n0,1\n")); });
  EXPECT_TRUE(contains(msg, "m.csv:1"));
  EXPECT_TRUE(contains(msg, "no sequence column 'sequence'"));
  EXPECT_TRUE(contains(msg, "available columns: 'label', 'seq'"));

  msg = error_of([&] { CsvDataset::load(dir.write("r.csv", "label,sequence\n0,1|2 3|4\n1,5|6 7\n")); });
  EXPECT_TRUE(contains(msg, "r.csv:3"));
  EXPECT_TRUE(contains(msg, "step 2 ('7')"));
  EXPECT_TRUE(contains(msg, "has 1 features, expected 2"));

  msg = error_of([&] { CsvDataset::load(dir.write("e.csv", "label,sequence\n0,1 2\n1,   \n")); });
  EXPECT_TRUE(contains(msg, "e.csv:3: empty sequence in column 'sequence'"));

  msg = error_of([&] { CsvDataset::load(dir.write("u.csv", "label,sequence\n0,\"1 2\n1,3\n")); });
  EXPECT_TRUE(contains(msg, "u.csv:2: unterminated quoted field 2"));

  msg = error_of([&] { CsvDataset::load(dir.write("c.csv", "label,sequence\n0,1,2\n")); });
  EXPECT_TRUE(contains(msg, "c.csv:2: expected 2 fields as in the header, got 3"));

  msg = error_of([&] { CsvDataset::load(dir.write("a.csv", "label,sequence\n0,\"1 2\"x\n")); });
  EXPECT_TRUE(contains(msg, "a.csv:2: unexpected character 'x' after the closing quote"));

  msg = error_of([&] { CsvDataset::load(dir.write("l.csv", "label,sequence\n0,1\n ,2\n")); });
  EXPECT_TRUE(contains(msg, "l.csv:3: empty label"));

  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(dir.write("0.csv", "")); }), "empty"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(dir.write("h.csv", "label,sequence\n")); }), "no data rows"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load((dir.path() / "none.csv").string()); }), "cannot open"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(dir.write("big.csv", "label,sequence\n20240101,1\n")); }),
                       "too large for a class id"));
  // Ragged features matter only for numeric data: a token elsewhere makes every step a token.
  EXPECT_TRUE(CsvDataset::load(dir.write("t.csv", "label,sequence\n0,1|2 3\n1,x\n")).is_tokens());
}

TEST(CsvDataset, SplitSizesAndDeterminism) {
  TempDir dir;
  std::string csv = "label,sequence\n";
  for (int i = 0; i < 10; ++i) csv += std::to_string(i % 3) + "," + std::to_string(i) + "\n";
  const CsvDataset d = CsvDataset::load(dir.write("s.csv", csv));

  Rng r1(3), r2(3), r3(4);
  const auto [train, valid] = d.split(0.2, r1);
  EXPECT_EQ(train.size(), 8u);
  EXPECT_EQ(valid.size(), 2u);
  std::set<int64_t> all(train.begin(), train.end());
  all.insert(valid.begin(), valid.end());
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 9);
  const auto again = d.split(0.2, r2);
  EXPECT_EQ(again.first, train);
  EXPECT_EQ(again.second, valid);
  const auto other = d.split(0.2, r3);
  EXPECT_NE(other.first, train);

  Rng r(5);
  EXPECT_EQ(d.split(0.01, r).second.size(), 1u);  // asked for some: at least one row
  EXPECT_EQ(d.split(0.0, r).second.size(), 0u);
  EXPECT_EQ(d.split(0.99, r).first.size(), 1u);   // training keeps a row
  EXPECT_EQ(d.split(0.35, r).second.size(), 4u);  // round(3.5)
  EXPECT_THROW(d.split(1.0, r), Error);
  EXPECT_THROW(d.split(-0.1, r), Error);

  const CsvDataset single = CsvDataset::load(dir.write("1.csv", "label,sequence\n0,1\n"));
  const auto [t1, v1] = single.split(0.5, r);
  EXPECT_EQ(t1, (std::vector<int64_t>{0}));
  EXPECT_TRUE(v1.empty());
}

// A folder or a FIFO given as a data file is named as such (a folder used to read as "the file is
// empty"; a FIFO used to block forever).
TEST(DataFiles, FolderOrFifoIsRefusedByName) {
  const fs::path d = fs::temp_directory_path() / ("lstm_data_kinds_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "folder.csv");
  ASSERT_EQ(::mkfifo((d / "pipe.csv").c_str(), 0600), 0);
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string folder = error_of([&] { CsvDataset::load((d / "folder.csv").string(), "label", "sequence"); });
  EXPECT_NE(folder.find((d / "folder.csv").string() + ": not a regular file: expected a file, got a folder"),
            std::string::npos)
      << folder;
  const std::string fifo = error_of([&] { CsvDataset::load((d / "pipe.csv").string(), "label", "sequence"); });
  EXPECT_NE(fifo.find("got a FIFO"), std::string::npos) << fifo;
  fs::remove_all(d);
}

// ---- Streaming CSV, model schemas, <unk> ---------------------------------------------------------

namespace {

// Records of `text` through CsvReader, fed `chunk` bytes at a time; an error comes back as its text.
std::vector<CsvRecord> stream_records(const std::string& text, size_t chunk, std::string* error = nullptr) {
  size_t at = 0;
  CsvReader r(
      [&](char* p, size_t n) {
        n = std::min(n, text.size() - at);
        std::copy_n(text.data() + at, n, p);
        at += n;
        return n;
      },
      "s.csv", chunk);
  std::vector<CsvRecord> out;
  CsvRecord rec;
  try {
    while (r.next(rec)) out.push_back(rec);
  } catch (const Error& e) {
    if (error) *error = e.what();
  }
  return out;
}

}  // namespace

TEST(CsvReader, StreamingParsesAsTheWholeFileDoesAtEveryChunkSize) {
  const std::vector<std::string> texts = {
      "\xEF\xBB\xBFlabel,sequence\r\na,\"x, y\"\r\n\r\nb,\"two\nlines\"\"q\"\"\"\nc,z",
      "a,b\n\n\n\"\",\"\"\n,\n",
      "x\r\ny\r",
      "\"unterminated,a\nb",
      "a,\"q\"x\n",
      "",
      "\xEF\xBB",
  };
  for (const auto& t : texts) {
    std::vector<CsvRecord> whole;
    std::string whole_error;
    try {
      whole = parse_csv(t, "s.csv");
    } catch (const Error& e) {
      whole_error = e.what();
    }
    for (size_t chunk : {1, 2, 3, 5, 64}) {
      std::string err;
      const auto got = stream_records(t, chunk, &err);
      EXPECT_EQ(err, whole_error) << "chunk " << chunk << " text " << t;
      if (!whole_error.empty()) continue;
      ASSERT_EQ(got.size(), whole.size()) << "chunk " << chunk << " text " << t;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].fields, whole[i].fields) << "chunk " << chunk << " record " << i;
        EXPECT_EQ(got[i].line, whole[i].line) << "chunk " << chunk << " record " << i;
      }
    }
  }
}

TEST(CsvChunkReader, ReadsChunksInOrderWithIdsAndTheModelsVocabulary) {
  TempDir dir;
  std::string text = "id,sequence,label\n";
  for (int i = 0; i < 7; ++i) {
    text += 'r';
    text += std::to_string(i);
    text += i % 2 ? ",cat dog,pos\n" : ",dog new,pos\n";
  }
  const auto path = dir.write("c.csv", text);
  CsvSchema schema{{"neg", "pos"}, true, {"cat", "dog", "<unk>"}, 0};
  CsvChunkReader r(path, schema, "sequence");
  EXPECT_TRUE(r.has_id_column());
  CsvDataset rows;
  std::vector<std::string> ids, all_ids;
  std::vector<int64_t> sizes;
  while (int64_t n = r.next(3, rows, ids)) {
    sizes.push_back(n);
    all_ids.insert(all_ids.end(), ids.begin(), ids.end());
    const Batch b = rows.batch(std::vector<int64_t>(1, 0));
    EXPECT_EQ(ints(b.targets), std::vector<int64_t>{-100});  // no label column read
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(all_ids, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4", "r5", "r6"}));
  EXPECT_EQ(r.unknown_tokens(), 4);  // "new" in rows 0, 2, 4, 6

  // The whole file with labels: unknown tokens take <unk> (id 2).
  const CsvDataset d = CsvDataset::load(path, schema, "label", "sequence");
  EXPECT_EQ(d.size(), 7);
  EXPECT_EQ(d.unknown_tokens(), 4);
  EXPECT_EQ(ints(d.batch({0}).inputs), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ints(d.batch({0}).targets), std::vector<int64_t>{1});

  // Without ids, rows are numbered from 1.
  CsvChunkReader plain(dir.write("p.csv", "sequence\ncat\ndog\n"), schema, "sequence");
  EXPECT_FALSE(plain.has_id_column());
  plain.next(10, rows, ids);
  EXPECT_EQ(ids, (std::vector<std::string>{"1", "2"}));
}

TEST(CsvChunkReader, UnknownClassAndOldVocabularyAreErrorsNamingThem) {
  TempDir dir;
  const auto path = dir.write("u.csv", "label,sequence\npos,cat\nmaybe,dog\n");
  CsvSchema schema{{"neg", "pos"}, true, {"cat", "dog", "<unk>"}, 0};
  const std::string cls = error_of([&] { CsvDataset::load(path, schema, "label", "sequence"); });
  EXPECT_TRUE(contains(cls, path + ":3: unknown class 'maybe'")) << cls;
  EXPECT_TRUE(contains(cls, "'neg', 'pos'")) << cls;
  // A vocabulary without <unk> (a model from before it) names the token it cannot read.
  const CsvSchema old{{"neg", "pos"}, true, {"cat", "dog"}, 0};
  const auto p2 = dir.write("o.csv", "label,sequence\npos,cat bird\n");
  const std::string tok = error_of([&] { CsvDataset::load(p2, old, "label", "sequence"); });
  EXPECT_TRUE(contains(tok, p2 + ":2: step 2")) << tok;
  EXPECT_TRUE(contains(tok, "'bird'")) << tok;
  // Numeric models check the feature count.
  const CsvSchema num{{"0", "1"}, false, {}, 2};
  const auto p3 = dir.write("n.csv", "label,sequence\n1,1|2 3\n");
  const std::string feat = error_of([&] { CsvDataset::load(p3, num, "label", "sequence"); });
  EXPECT_TRUE(contains(feat, p3 + ":2: step 2 ('3')")) << feat;
  EXPECT_TRUE(contains(feat, "has 1 features, the model reads 2")) << feat;
}

TEST(Vocab, UnknownIdIsLastAndRoundTrips) {
  const Vocab v = Vocab::from_text("ba", true);
  EXPECT_EQ(v.size(), 3);
  EXPECT_EQ(v.unk_id(), 2);
  int64_t unknown = 0;
  EXPECT_EQ(v.encode("abz€", &unknown), (std::vector<int64_t>{0, 1, 2, 2}));
  EXPECT_EQ(unknown, 2);
  EXPECT_EQ(v.decode_one(2), "<unk>");
  EXPECT_EQ(v.to_json(), (nlohmann::json{"a", "b", "<unk>"}));
  const Vocab back = Vocab::from_json(v.to_json());
  EXPECT_EQ(back.unk_id(), 2);
  EXPECT_TRUE(contains(error_of([] { Vocab::from_json(nlohmann::json{"<unk>", "a"}); }), "only be the last entry"));
  // Without one (models from before it), an unknown character is an error naming it.
  EXPECT_TRUE(contains(error_of([] { Vocab::from_text("ab").encode("az"); }), "U+007A 'z'"));
}

TEST(CharCorpus, LoadForEvalEncodesAllTextWithTheModelsVocabulary) {
  TempDir dir;
  const auto path = dir.write("t.txt", "abcab");
  const CharCorpus c = CharCorpus::load_for_eval({path}, Vocab::from_text("ab", true));
  EXPECT_EQ(c.train_size(), 0);
  EXPECT_EQ(c.valid_size(), 5);
  EXPECT_EQ(c.unknown_chars(), 1);
  EXPECT_EQ(c.valid_batches(10, 2), 1);  // (5 - 1) / 2 = 2 windows
  const std::string msg = error_of([&] { CharCorpus::load_for_eval({path}, Vocab::from_text("ab")); });
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "'c'")) << msg;
}

// ---- Regression targets, per-step tags, time series, normalisation ----------------------------

TEST(CsvDataset, RegressionTargetsInTheNamedOrder) {
  TempDir d;
  const auto p = d.write("r.csv", "y,sequence,z\n1.5,1|2 3|4,-2\n-0.25,5|6,1e3\n");
  CsvDataset ds = CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Values, {"z", "y"}});
  EXPECT_EQ(ds.target(), CsvTarget::Values);
  EXPECT_EQ(ds.num_values(), 2);
  EXPECT_EQ(ds.value_names(), (std::vector<std::string>{"z", "y"}));
  EXPECT_EQ(ds.features(), 2);
  Batch b = ds.batch({1, 0});
  ASSERT_EQ(b.targets.dtype(), DType::F32);
  ASSERT_EQ(b.targets.shape(), (Shape{2, 2}));
  EXPECT_EQ(b.targets.get(0), 1000.0);
  EXPECT_EQ(b.targets.get(1), -0.25);
  EXPECT_EQ(b.targets.get(2), -2.0);
  EXPECT_EQ(b.targets.get(3), 1.5);
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(b.lengths, (std::vector<int64_t>{1, 2}));
}

TEST(CsvDataset, RegressionErrorsNameFileLineAndColumn) {
  TempDir d;
  const auto p = d.write("r.csv", "sequence,y\n1 2,0.5\n3 4,abc\n");
  const std::string m = error_of([&] { CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Values, {"y"}}); });
  EXPECT_TRUE(contains(m, p + ":3"));
  EXPECT_TRUE(contains(m, "column 'y'"));
  EXPECT_TRUE(contains(m, "expected a number, got 'abc'"));
  const auto inf = d.write("i.csv", "sequence,y\n1 2,1e300\n");
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(inf, CsvSpec{"sequence", CsvTarget::Values, {"y"}}); }),
                       "not a finite float"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Values, {"w"}}); }),
                       "no target column 'w'"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Values, {"y", "y"}}); }),
                       "named twice"));
}

TEST(CsvDataset, TagsOnePerStepPaddedWithIgnore) {
  TempDir d;
  const auto p = d.write("t.csv", "sequence,tags\na b c,X Y X\nb,Y\n");
  CsvDataset ds = CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Tags, {"tags"}});
  EXPECT_EQ(ds.target(), CsvTarget::Tags);
  EXPECT_EQ(ds.class_names(), (std::vector<std::string>{"X", "Y"}));
  EXPECT_TRUE(ds.is_tokens());
  Batch b = ds.batch({1, 0});
  ASSERT_EQ(b.targets.dtype(), DType::I64);
  ASSERT_EQ(b.targets.shape(), (Shape{3, 2}));
  // [t, b]: row 1 ("Y") then row 0 ("X Y X"); steps past a length are -100.
  const std::vector<int64_t> want = {1, 0, -100, 1, -100, 0};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.targets.data<int64_t>()[i], want[static_cast<size_t>(i)]) << i;
  // Integer tags are class ids.
  const auto q = d.write("n.csv", "sequence,tags\n1 2,0 2\n");
  EXPECT_EQ(CsvDataset::load(q, CsvSpec{"sequence", CsvTarget::Tags, {"tags"}}).num_classes(), 3);
}

TEST(CsvDataset, TagCountMismatchNamesFileLineAndColumns) {
  TempDir d;
  const auto p = d.write("t.csv", "sequence,tags\na b,X Y\na b c,X Y\n");
  const std::string m = error_of([&] { CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Tags, {"tags"}}); });
  EXPECT_TRUE(contains(m, p + ":3"));
  EXPECT_TRUE(contains(m, "column 'tags' has 2 tags but column 'sequence' has 3 steps"));
  EXPECT_TRUE(contains(error_of([&] { CsvDataset::load(p, CsvSpec{"sequence", CsvTarget::Tags, {"a", "b"}}); }),
                       "expected one tags column"));
}

TEST(TimeSeries, WindowsAndColumns) {
  TempDir d;
  // Row t: a = t, b = 10 t, date ignored.
  std::string text = "date,a,b\n";
  for (int t = 0; t < 10; ++t) text += "day" + std::to_string(t) + "," + std::to_string(t) + "," + std::to_string(10 * t) + "\n";
  const auto p = d.write("s.csv", text);
  TimeSeries ts = TimeSeries::load(p, {"b", "a"}, {"a"});
  EXPECT_EQ(ts.steps(), 10);
  EXPECT_EQ(ts.num_inputs(), 2);
  EXPECT_EQ(ts.num_targets(), 1);
  Batch b = ts.windows({0, 5}, 3, 2);
  ASSERT_EQ(b.inputs.shape(), (Shape{3, 2, 2}));
  ASSERT_EQ(b.targets.shape(), (Shape{2, 2}));
  // Input step t of window b: [10 (s + t), s + t].
  EXPECT_EQ(b.inputs.get(((2 * 2) + 1) * 2 + 0), 70.0);  // t=2, window at 5: b
  EXPECT_EQ(b.inputs.get(((2 * 2) + 1) * 2 + 1), 7.0);   //                   a
  // Targets: steps s+3, s+4 of a.
  EXPECT_EQ(b.targets.get(0), 3.0);
  EXPECT_EQ(b.targets.get(1), 4.0);
  EXPECT_EQ(b.targets.get(2), 8.0);
  EXPECT_EQ(b.targets.get(3), 9.0);
  EXPECT_THROW(ts.windows({6}, 3, 2), Error);  // 6 + 3 + 2 > 10
  // No inputs named: the targets are the inputs.
  EXPECT_EQ(TimeSeries::load(p, {}, {"b"}).input_names(), (std::vector<std::string>{"b"}));
}

TEST(TimeSeries, ErrorsNameFileLineAndColumn) {
  TempDir d;
  const auto p = d.write("s.csv", "a,b\n1,2\n3,x\n");
  const std::string m = error_of([&] { TimeSeries::load(p, {"a"}, {"b"}); });
  EXPECT_TRUE(contains(m, p + ":3"));
  EXPECT_TRUE(contains(m, "column 'b': expected a number, got 'x'"));
  EXPECT_TRUE(contains(error_of([&] { TimeSeries::load(p, {"c"}, {"b"}); }), "no input column 'c'"));
  EXPECT_TRUE(contains(error_of([&] { TimeSeries::load(p, {}, {}); }), "no target column"));
  const auto e = d.write("e.csv", "a,b\n");
  EXPECT_TRUE(contains(error_of([&] { TimeSeries::load(e, {}, {"a"}); }), "no data rows"));
}

TEST(Normalization, FitApplyAndJsonRoundTrip) {
  // Two columns: {1, 2, 3, 4} (mean 2.5, population std sqrt(1.25)) and a constant 7 (std 1).
  Normalization n = Normalization::fit({"x", "c"}, {1, 7, 2, 7, 3, 7, 4, 7});
  EXPECT_DOUBLE_EQ(n.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(n.std[0], std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(n.mean[1], 7.0);
  EXPECT_EQ(n.std[1], 1.0);
  std::vector<float> row = {4, 7};
  n.apply(row.data(), 1);
  EXPECT_FLOAT_EQ(row[0], static_cast<float>(1.5 / std::sqrt(1.25)));
  EXPECT_EQ(row[1], 0.0f);
  Normalization back = Normalization::from_json(n.to_json(), "test");
  EXPECT_EQ(back.names, n.names);
  EXPECT_EQ(back.mean, n.mean);
  EXPECT_EQ(back.std, n.std);
  nlohmann::json bad = n.to_json();
  bad["std"][0] = 0.0;
  EXPECT_TRUE(contains(error_of([&] { Normalization::from_json(bad, "model.safetensors"); }), "model.safetensors: std[0]"));
  bad = n.to_json();
  bad["mean"].erase(1);
  EXPECT_TRUE(contains(error_of([&] { Normalization::from_json(bad, "m"); }), "\"mean\" must be a list of 2 numbers"));
}
