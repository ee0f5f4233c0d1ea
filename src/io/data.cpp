#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <system_error>

#include "io/config_reader.hpp"
#include "io/utf8.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"

namespace lstm {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  return read_regular_file(p.string(), "CharCorpus::load: " + p.string() + ": ", memory_limited_bytes());
}

struct Candidate {
  fs::path path;
  bool from_folder = false;
  bool is_symlink = false;
  fs::path target;  // canonical path of the file whose bytes we would read
};

fs::path resolve(const fs::path& p) {
  std::error_code ec;
  auto c = fs::canonical(p, ec);
  return ec ? fs::absolute(p) : c;
}

// Expands folders (one level, sorted by name) and resolves every file to its canonical target,
// so that links such as fortune's *.u8 -> * can be recognised as the same text.
std::vector<Candidate> expand(const std::vector<std::string>& paths) {
  std::vector<Candidate> out;
  for (const auto& p : paths) {
    std::error_code ec;
    const auto st = fs::status(p, ec);
    LSTM_REQUIRE(!ec && fs::exists(st), "CharCorpus::load: no such file or folder: " << p);
    if (fs::is_directory(st)) {
      std::vector<fs::directory_entry> entries;
      fs::directory_iterator it(p, ec);
      LSTM_REQUIRE(!ec, "CharCorpus::load: cannot list folder " << p << ": " << ec.message());
      while (it != fs::directory_iterator()) {
        entries.push_back(*it);
        it.increment(ec);
        LSTM_REQUIRE(!ec, "CharCorpus::load: cannot list folder " << p << ": " << ec.message());
      }
      std::sort(entries.begin(), entries.end(),
                [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
      for (const auto& e : entries) {
        std::error_code ec2;
        // is_regular_file follows links, which both admits links to files and rejects links to
        // folders (and broken links).
        if (!e.is_regular_file(ec2) || ec2) continue;
        const bool link = e.is_symlink(ec2);
        out.push_back({e.path(), true, link, resolve(e.path())});
      }
    } else {
      LSTM_REQUIRE(fs::is_regular_file(st), "CharCorpus::load: " << p << " is neither a regular file nor a folder");
      out.push_back({fs::path(p), false, fs::is_symlink(fs::symlink_status(p)), resolve(p)});
    }
  }
  return out;
}

}  // namespace

namespace {

// The text of every file named (load()'s rules for folders, links and max_bytes).
std::string read_texts(const std::vector<std::string>& paths, int64_t max_bytes) {
  LSTM_REQUIRE(!paths.empty(), "CharCorpus::load: no paths given");
  const auto candidates = expand(paths);

  std::set<fs::path> plain_targets;
  for (const auto& c : candidates)
    if (!c.is_symlink) plain_targets.insert(c.target);

  std::string text;
  std::set<fs::path> read;
  std::vector<std::string> skipped;
  const auto limit = max_bytes > 0 ? static_cast<size_t>(max_bytes) : std::string::npos;
  for (const auto& c : candidates) {
    if (text.size() >= limit) break;
    if (c.is_symlink && plain_targets.count(c.target)) continue;
    if (!read.insert(c.target).second) continue;
    std::string body = read_file(c.path);
    std::string why;
    const size_t bad = utf8::first_invalid(body, &why);
    const size_t nul = body.find('\0');
    if (c.from_folder) {
      // Folders of text often carry binary companions (indexes, caches); they are not text.
      if (bad != std::string::npos) {
        skipped.push_back(c.path.filename().string() + " (not UTF-8)");
        continue;
      }
      if (nul != std::string::npos) {
        skipped.push_back(c.path.filename().string() + " (NUL byte)");
        continue;
      }
    } else {
      LSTM_REQUIRE(bad == std::string::npos, "CharCorpus::load: " << c.path.string()
                                                 << ": invalid UTF-8 at byte offset " << bad << ": " << why);
      LSTM_REQUIRE(nul == std::string::npos, "CharCorpus::load: " << c.path.string()
                                                 << ": NUL byte at offset " << nul << ", expected text");
    }
    text += body;
  }
  if (text.size() > limit) {
    size_t n = limit;
    // Never cut inside a character: back up to the start of the one that straddles the limit.
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
    text.resize(n);
  }

  if (text.empty()) {
    std::ostringstream os;
    os << "CharCorpus::load: no text found in";
    for (const auto& p : paths) os << " " << p;
    if (!skipped.empty()) {
      os << "; skipped:";
      for (const auto& s : skipped) os << " " << s;
    }
    LSTM_THROW(os.str());
  }
  return text;
}

}  // namespace

CharCorpus CharCorpus::load(const std::vector<std::string>& paths, double valid_fraction, int64_t max_bytes) {
  return from_text(read_texts(paths, max_bytes), valid_fraction);
}

CharCorpus CharCorpus::load_for_eval(const std::vector<std::string>& paths, const Vocab& vocab, int64_t max_bytes) {
  const std::string text = read_texts(paths, max_bytes);
  CharCorpus c;
  c.vocab_ = vocab;
  try {
    c.valid_ = vocab.encode(text, &c.unknown_);
  } catch (const Error& e) {
    std::string names;
    for (const auto& p : paths) names += (names.empty() ? "" : ", ") + p;
    LSTM_THROW(names << ": " << e.what());
  }
  LSTM_REQUIRE(c.valid_size() >= 2, "CharCorpus::load_for_eval: the text has " << c.valid_size()
                                                                               << " characters, at least 2 are needed");
  return c;
}

CharCorpus CharCorpus::from_text(const std::string& text, double valid_fraction) {
  LSTM_REQUIRE(valid_fraction > 0.0 && valid_fraction < 1.0,
               "CharCorpus: valid_fraction must be in (0, 1), got " << valid_fraction);
  CharCorpus c;
  c.vocab_ = Vocab::from_text(text, /*reserve_unk=*/true);
  std::vector<int64_t> ids = c.vocab_.encode(text);
  const auto n = static_cast<int64_t>(ids.size());
  const auto n_valid = static_cast<int64_t>(std::llround(static_cast<double>(n) * valid_fraction));
  const int64_t n_train = n - n_valid;
  LSTM_REQUIRE(n_train >= 2 && n_valid >= 2,
               "CharCorpus: the text has " << n << " characters; valid_fraction " << valid_fraction
                                           << " splits it into " << n_train << " training and " << n_valid
                                           << " validation characters, each split needs at least 2");
  c.valid_.assign(ids.begin() + n_train, ids.end());
  ids.resize(static_cast<size_t>(n_train));
  c.train_ = std::move(ids);
  return c;
}

Batch CharCorpus::train_batch(int64_t batch, int64_t steps, Rng& rng) const {
  LSTM_REQUIRE(batch >= 1 && steps >= 1,
               "CharCorpus::train_batch: batch and steps must be >= 1, got batch " << batch << ", steps " << steps);
  LSTM_REQUIRE(train_size() >= steps + 1, "CharCorpus::train_batch: the training split has "
                                              << train_size() << " characters, a window of steps " << steps
                                              << " needs at least " << steps + 1);
  Batch out;
  out.inputs = Tensor::empty({steps, batch}, DType::I64);
  out.targets = Tensor::empty({steps, batch}, DType::I64);
  out.lengths.assign(static_cast<size_t>(batch), steps);
  int64_t* x = out.inputs.data<int64_t>();
  int64_t* y = out.targets.data<int64_t>();
  const auto starts = static_cast<uint64_t>(train_size() - steps);
  for (int64_t b = 0; b < batch; ++b) {
    const auto off = static_cast<int64_t>(rng.below(starts));
    for (int64_t t = 0; t < steps; ++t) {
      x[t * batch + b] = train_[static_cast<size_t>(off + t)];
      y[t * batch + b] = train_[static_cast<size_t>(off + t + 1)];
    }
  }
  return out;
}

int64_t CharCorpus::valid_batches(int64_t batch, int64_t steps) const {
  LSTM_REQUIRE(batch >= 1 && steps >= 1,
               "CharCorpus::valid_batches: batch and steps must be >= 1, got batch " << batch << ", steps " << steps);
  // Windows share their boundary character (the last target of one is the first input of the
  // next), so every validation character after the first is predicted exactly once.
  const int64_t windows = (valid_size() - 1) / steps;
  return (windows + batch - 1) / batch;  // the last batch may be smaller
}

Batch CharCorpus::valid_batch(int64_t batch, int64_t steps, int64_t index) const {
  const int64_t count = valid_batches(batch, steps);
  LSTM_REQUIRE(count > 0, "CharCorpus::valid_batch: the validation split has "
                              << valid_size() << " characters, a window of steps " << steps << " needs at least "
                              << steps + 1);
  const int64_t windows = (valid_size() - 1) / steps;
  const int64_t k = ((index % count) + count) % count;
  const int64_t first = k * batch;
  const int64_t b_eff = std::min(batch, windows - first);
  Batch out;
  out.inputs = Tensor::empty({steps, b_eff}, DType::I64);
  out.targets = Tensor::empty({steps, b_eff}, DType::I64);
  out.lengths.assign(static_cast<size_t>(b_eff), steps);
  int64_t* x = out.inputs.data<int64_t>();
  int64_t* y = out.targets.data<int64_t>();
  for (int64_t b = 0; b < b_eff; ++b) {
    const int64_t off = (first + b) * steps;
    for (int64_t t = 0; t < steps; ++t) {
      x[t * b_eff + b] = valid_[static_cast<size_t>(off + t)];
      y[t * b_eff + b] = valid_[static_cast<size_t>(off + t + 1)];
    }
  }
  return out;
}

}  // namespace lstm
