#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "io/config_reader.hpp"
#include "io/csv_reader.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"

namespace lstm {

namespace {

constexpr std::string_view kSpace = " \t\r\n\v\f";

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while ((pos = s.find_first_not_of(kSpace, pos)) != std::string_view::npos) {
    const size_t end = std::min(s.find_first_of(kSpace, pos), s.size());
    out.push_back(s.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

enum class Parsed { Record, NeedMore, End };

// Parses the record of `s` at `pos` into `r` (blank lines skipped). When the record may go on
// past the end of `s` and more input may follow (!eof), returns NeedMore with pos and line left
// as they were, so that the caller can append input and parse the record again.
Parsed parse_record(std::string_view s, size_t& pos_io, int64_t& line_io, bool eof, const std::string& path,
                    CsvRecord& r) {
  size_t pos = pos_io;
  int64_t line = line_io;
  for (;;) {
    if (pos >= s.size()) return eof ? Parsed::End : Parsed::NeedMore;
    r.fields.clear();
    r.line = line;
    bool end_of_record = false;
    while (!end_of_record) {
      std::string field;
      const size_t field_no = r.fields.size() + 1;
      if (pos < s.size() && s[pos] == '"') {
        const int64_t open_line = line;
        ++pos;
        for (;;) {
          if (pos >= s.size() && !eof) return Parsed::NeedMore;
          LSTM_REQUIRE(pos < s.size(), path << ":" << open_line << ": unterminated quoted field " << field_no
                                            << ": it opens with \" but the file ends before the closing quote");
          const char c = s[pos];
          if (c == '"') {
            if (pos + 1 >= s.size() && !eof) return Parsed::NeedMore;
            if (pos + 1 < s.size() && s[pos + 1] == '"') {
              field += '"';
              pos += 2;
              continue;
            }
            ++pos;
            break;
          }
          if (c == '\n') ++line;
          field += c;
          ++pos;
        }
        if (pos >= s.size()) {
          if (!eof) return Parsed::NeedMore;
          end_of_record = true;
        } else if (s[pos] == ',') {
          ++pos;
        } else if (s[pos] == '\n') {
          ++pos, ++line, end_of_record = true;
        } else if (s[pos] == '\r' && pos + 1 >= s.size() && !eof) {
          return Parsed::NeedMore;
        } else if (s[pos] == '\r' && pos + 1 < s.size() && s[pos + 1] == '\n') {
          pos += 2, ++line, end_of_record = true;
        } else {
          LSTM_THROW(path << ":" << line << ": unexpected character '" << s[pos] << "' after the closing quote of field "
                          << field_no << ", expected ',' or the end of the line (write a quote inside a quoted "
                          << "field as \"\")");
        }
      } else {
        const size_t start = pos;
        while (pos < s.size() && s[pos] != ',' && s[pos] != '\n') ++pos;
        size_t end = pos;
        if (pos >= s.size()) {
          if (!eof) return Parsed::NeedMore;
          end_of_record = true;
        } else if (s[pos] == ',') {
          ++pos;
        } else {
          ++pos, ++line, end_of_record = true;
        }
        if (end_of_record && end > start && s[end - 1] == '\r') --end;  // CRLF
        field.assign(s.substr(start, end - start));
      }
      r.fields.push_back(std::move(field));
    }
    pos_io = pos;
    line_io = line;
    if (r.fields.size() == 1 && r.fields[0].empty()) continue;  // blank line
    return Parsed::Record;
  }
}

constexpr std::string_view kBom = "\xEF\xBB\xBF";  // spreadsheets like to write one

// The whole of `s` must be the number (std::from_chars is locale-independent, unlike strtod).
bool parse_double(std::string_view s, double& v) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_step(std::string_view step, std::vector<double>& out) {
  out.clear();
  size_t pos = 0;
  for (;;) {
    const size_t bar = step.find('|', pos);
    double v = 0;
    if (!parse_double(step.substr(pos, bar == std::string_view::npos ? std::string_view::npos : bar - pos), v))
      return false;
    out.push_back(v);
    if (bar == std::string_view::npos) return true;
    pos = bar + 1;
  }
}

bool parse_class_id(std::string_view s, int64_t& v) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= 0;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

std::vector<CsvRecord> parse_csv(std::string_view s, const std::string& path) {
  std::vector<CsvRecord> rows;
  size_t pos = s.starts_with(kBom) ? kBom.size() : 0;
  int64_t line = 1;
  CsvRecord r;
  while (parse_record(s, pos, line, true, path, r) == Parsed::Record) rows.push_back(std::move(r));
  return rows;
}

CsvReader::CsvReader(Source source, std::string path, size_t chunk)
    : source_(std::move(source)), path_(std::move(path)), chunk_(std::max<size_t>(chunk, 1)) {}

CsvReader CsvReader::open(const std::string& path) {
  uint64_t size = 0;
  auto fd = std::make_shared<Fd>(open_regular_file(path, "CSV file " + path + ": ", size));
  return CsvReader(
      [fd, path](char* p, size_t n) -> size_t {
        for (;;) {
          const ssize_t r = ::read(fd->get(), p, n);
          if (r < 0 && errno == EINTR) continue;
          LSTM_REQUIRE(r >= 0, "CSV file " << path << ": read failed: " << std::strerror(errno));
          return static_cast<size_t>(r);
        }
      },
      path);
}

bool CsvReader::fill() {
  if (eof_) return false;
  buf_.erase(0, pos_);
  pos_ = 0;
  // Ask for at least as much as is buffered: a long record is then re-parsed O(log n) times.
  const size_t want = std::max(chunk_, buf_.size());
  const size_t old = buf_.size();
  buf_.resize(old + want);
  const size_t got = source_(buf_.data() + old, want);
  buf_.resize(old + std::min(got, want));
  if (got == 0) eof_ = true;
  return true;
}

bool CsvReader::next(CsvRecord& record) {
  if (!started_) {
    while (buf_.size() < kBom.size() && fill()) {
    }
    if (std::string_view(buf_).starts_with(kBom)) pos_ = kBom.size();
    started_ = true;
  }
  for (;;) {
    switch (parse_record(buf_, pos_, line_, eof_, path_, record)) {
      case Parsed::Record:
        return true;
      case Parsed::End:
        return false;
      case Parsed::NeedMore:
        fill();
        break;
    }
  }
}

CsvDataset CsvDataset::load(const std::string& path, const std::string& label_column,
                            const std::string& sequence_column) {
  return load(path, CsvSpec{sequence_column, CsvTarget::Label, {label_column}});
}

namespace {

// Class ids for labels: integer ids if every label is one (names "0".."max"), otherwise the
// distinct names in sorted order. `lines[i]` is where labels[i] is, for errors.
std::vector<int64_t> class_ids(const std::vector<std::string_view>& labels, const std::vector<int64_t>& lines,
                               const std::string& path, const std::string& column, std::vector<std::string>& names) {
  const size_t n = labels.size();
  std::vector<int64_t> ids(n);
  bool integer_labels = true;
  int64_t max_id = 0;
  for (size_t i = 0; i < n && integer_labels; ++i) {
    integer_labels = parse_class_id(labels[i], ids[i]);
    if (integer_labels) max_id = std::max(max_id, ids[i]);
  }
  names.clear();
  if (integer_labels) {
    // Guards against a non-label column (an id, a date) being taken for class ids.
    constexpr int64_t kMaxClassId = (int64_t{1} << 20) - 1;
    for (size_t i = 0; i < n; ++i)
      LSTM_REQUIRE(ids[i] <= kMaxClassId, path << ":" << lines[i] << ": label " << ids[i] << " in column '" << column
                                               << "' is too large for a class id (at most " << kMaxClassId
                                               << "); integer labels are used as class ids 0..max");
    for (int64_t c = 0; c <= max_id; ++c) names.push_back(std::to_string(c));
    return ids;
  }
  const std::set<std::string_view> distinct(labels.begin(), labels.end());
  std::unordered_map<std::string_view, int64_t> id;
  for (const auto& name : distinct) {
    id.emplace(name, static_cast<int64_t>(names.size()));
    names.emplace_back(name);
  }
  for (size_t i = 0; i < n; ++i) ids[i] = id.at(labels[i]);
  return ids;
}

// A number of a numeric column, finite as a float; errors name the place and the text.
float column_number(std::string_view field, const std::string& path, int64_t line, const std::string& column) {
  const std::string_view text = trim(field);
  double v = 0;
  LSTM_REQUIRE(parse_double(text, v), path << ":" << line << ": column '" << column << "': expected a number, got '"
                                            << printable(text, 40) << "'");
  const auto f = static_cast<float>(v);
  LSTM_REQUIRE(std::isfinite(f), path << ":" << line << ": column '" << column << "': " << printable(text, 40)
                                      << " is not a finite float");
  return f;
}

}  // namespace

CsvDataset CsvDataset::load(const std::string& path, const CsvSpec& spec) {
  const std::string& sequence_column = spec.sequence_column;
  const char* role = spec.target == CsvTarget::Label ? "label" : spec.target == CsvTarget::Tags ? "tags" : "target";
  LSTM_REQUIRE(!spec.target_columns.empty(), "CsvDataset::load: no " << role << " column named");
  LSTM_REQUIRE(spec.target == CsvTarget::Values || spec.target_columns.size() == 1,
               "CsvDataset::load: expected one " << role << " column, got " << spec.target_columns.size());
  for (size_t i = 0; i < spec.target_columns.size(); ++i) {
    LSTM_REQUIRE(spec.target_columns[i] != sequence_column,
                 "CsvDataset::load: the " << role << " and sequence columns must differ, both are '"
                                          << sequence_column << "'");
    for (size_t j = 0; j < i; ++j)
      LSTM_REQUIRE(spec.target_columns[i] != spec.target_columns[j],
                   "CsvDataset::load: the " << role << " column '" << spec.target_columns[i] << "' is named twice");
  }
  // A folder or FIFO is refused by name (a folder used to read as "the file is empty").
  const std::string text = read_regular_file(path, "CSV file " + path + ": ", memory_limited_bytes());

  const std::vector<CsvRecord> rows = parse_csv(text, path);
  LSTM_REQUIRE(!rows.empty(), path << ": the file is empty, expected a header row naming the columns '"
                                   << spec.target_columns[0] << "' and '" << sequence_column << "'");
  std::vector<std::string> header;
  for (const auto& f : rows[0].fields) header.emplace_back(trim(f));
  auto find_column = [&](const std::string& name, const char* what) {
    const auto it = std::find(header.begin(), header.end(), name);
    LSTM_REQUIRE(it != header.end(), path << ":" << rows[0].line << ": no " << what << " column '" << name
                                          << "' in the header; available columns: " << join(header));
    return static_cast<size_t>(it - header.begin());
  };
  std::vector<size_t> target_cols;
  for (const auto& c : spec.target_columns) target_cols.push_back(find_column(c, role));
  const size_t seq_col = find_column(sequence_column, "sequence");
  LSTM_REQUIRE(rows.size() > 1, path << ": no data rows after the header");

  CsvDataset d;
  d.target_ = spec.target;
  std::vector<std::string_view> labels;
  std::vector<std::vector<std::string_view>> steps;
  std::vector<int64_t> lines;
  for (size_t r = 1; r < rows.size(); ++r) {
    const CsvRecord& rec = rows[r];
    LSTM_REQUIRE(rec.fields.size() == header.size(),
                 path << ":" << rec.line << ": expected " << header.size() << " fields as in the header, got "
                      << rec.fields.size() << " (a field holding commas must be quoted)");
    auto seq = split_ws(rec.fields[seq_col]);
    LSTM_REQUIRE(!seq.empty(), path << ":" << rec.line << ": empty sequence in column '" << sequence_column
                                    << "', expected at least one step");
    if (spec.target == CsvTarget::Label) {
      const std::string_view label = trim(rec.fields[target_cols[0]]);
      LSTM_REQUIRE(!label.empty(), path << ":" << rec.line << ": empty label in column '" << spec.target_columns[0] << "'");
      labels.push_back(label);
    } else if (spec.target == CsvTarget::Tags) {
      auto tags = split_ws(rec.fields[target_cols[0]]);
      LSTM_REQUIRE(tags.size() == seq.size(),
                   path << ":" << rec.line << ": column '" << spec.target_columns[0] << "' has " << tags.size()
                        << " tags but column '" << sequence_column << "' has " << seq.size()
                        << " steps; expected one tag per step");
      labels.insert(labels.end(), tags.begin(), tags.end());
    } else {
      for (size_t k = 0; k < target_cols.size(); ++k)
        d.values_.push_back(column_number(rec.fields[target_cols[k]], path, rec.line, spec.target_columns[k]));
    }
    steps.push_back(std::move(seq));
    lines.push_back(rec.line);
  }
  const size_t n = steps.size();

  if (spec.target == CsvTarget::Label) {
    d.labels_ = class_ids(labels, lines, path, spec.target_columns[0], d.class_names_);
  } else if (spec.target == CsvTarget::Tags) {
    std::vector<int64_t> tag_lines;
    for (size_t i = 0; i < n; ++i) tag_lines.insert(tag_lines.end(), steps[i].size(), lines[i]);
    const std::vector<int64_t> ids = class_ids(labels, tag_lines, path, spec.target_columns[0], d.class_names_);
    d.tags_.resize(n);
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
      d.tags_[i].assign(ids.begin() + static_cast<std::ptrdiff_t>(k),
                        ids.begin() + static_cast<std::ptrdiff_t>(k + steps[i].size()));
      k += steps[i].size();
    }
  } else {
    d.value_names_ = spec.target_columns;
  }

  // Sequences: numeric if every step of every row is a number (or numbers joined by '|'). That is
  // decided over the whole file first, so a token dataset never reports numeric-only errors.
  std::vector<double> values;
  bool numeric = true;
  for (size_t i = 0; i < n && numeric; ++i)
    for (const auto& step : steps[i])
      if (!parse_step(step, values)) {
        numeric = false;
        break;
      }
  d.sequences_.resize(n);
  if (numeric) {
    for (size_t i = 0; i < n; ++i) {
      auto& seq = d.sequences_[i];
      for (size_t t = 0; t < steps[i].size(); ++t) {
        parse_step(steps[i][t], values);
        if (d.features_ == 0) d.features_ = static_cast<int64_t>(values.size());
        LSTM_REQUIRE(static_cast<int64_t>(values.size()) == d.features_,
                     path << ":" << lines[i] << ": step " << t + 1 << " ('" << steps[i][t] << "') of column '"
                          << sequence_column << "' has " << values.size() << " features, expected " << d.features_
                          << " like the first step at line " << lines[0]);
        for (double v : values) {
          const auto f = static_cast<float>(v);
          LSTM_REQUIRE(std::isfinite(f), path << ":" << lines[i] << ": step " << t + 1 << " ('" << steps[i][t]
                                              << "') of column '" << sequence_column
                                              << "' holds a value that is not a finite float");
          seq.push_back(f);
        }
      }
    }
    return d;
  }

  d.tokens_ = true;
  std::set<std::string_view> vocab;
  for (const auto& seq : steps) vocab.insert(seq.begin(), seq.end());
  // Ids are stored as floats, exact only up to 2^24.
  LSTM_REQUIRE(vocab.size() <= (size_t{1} << 24),
               path << ": " << vocab.size() << " distinct tokens in column '" << sequence_column
                    << "', at most " << (size_t{1} << 24) << " are supported");
  std::unordered_map<std::string_view, int64_t> id;
  for (const auto& tok : vocab) {
    id.emplace(tok, static_cast<int64_t>(d.token_names_.size()));
    d.token_names_.emplace_back(tok);
  }
  // The model's id for tokens it never saw (evaluation and prediction on new data); a dataset
  // that itself holds the token "<unk>" already has it.
  if (!vocab.count(kUnknownToken)) d.token_names_.emplace_back(kUnknownToken);
  d.features_ = static_cast<int64_t>(d.token_names_.size());
  for (size_t i = 0; i < n; ++i) {
    auto& seq = d.sequences_[i];
    for (const auto& tok : steps[i]) seq.push_back(static_cast<float>(id.at(tok)));
  }
  return d;
}

CsvSchema CsvDataset::schema() const { return {class_names_, tokens_, token_names_, tokens_ ? 0 : features_}; }

struct CsvChunkReader::Impl {
  Impl(CsvReader r, std::string p, CsvSchema s, CsvSpec sp)
      : reader(std::move(r)), path(std::move(p)), schema(std::move(s)), spec(std::move(sp)) {}
  CsvReader reader;
  std::string path;
  CsvSchema schema;
  CsvSpec spec;  // target_columns empty: no target read (labels -100)
  const std::string& sequence_column = spec.sequence_column;
  size_t columns = 0, seq_col = 0, id_col = std::string::npos;
  std::vector<size_t> target_cols;
  std::unordered_map<std::string, int64_t> class_id, token_id;
  int64_t unk = -1;
  int64_t rows = 0, unknown_tokens = 0;
  std::vector<double> values;
};

CsvChunkReader::CsvChunkReader(const std::string& path, CsvSchema schema, const std::string& sequence_column,
                               const std::string& label_column, const std::string& id_column)
    : CsvChunkReader(path, std::move(schema),
                     CsvSpec{sequence_column, CsvTarget::Label,
                             label_column.empty() ? std::vector<std::string>{} : std::vector<std::string>{label_column}},
                     id_column) {}

CsvChunkReader::CsvChunkReader(const std::string& path, CsvSchema schema, const CsvSpec& spec,
                               const std::string& id_column)
    : impl_(std::make_unique<Impl>(CsvReader::open(path), path, std::move(schema), spec)) {
  Impl& m = *impl_;
  LSTM_REQUIRE(m.schema.tokens || m.schema.features >= 1,
               "CsvChunkReader: a numeric schema needs features >= 1, got " << m.schema.features);
  LSTM_REQUIRE(spec.target == CsvTarget::Values || spec.target_columns.size() <= 1,
               "CsvChunkReader: expected at most one label or tags column, got " << spec.target_columns.size());
  const char* role = spec.target == CsvTarget::Label ? "label" : spec.target == CsvTarget::Tags ? "tags" : "target";
  CsvRecord head;
  std::string wanted = "'" + spec.sequence_column + "'";
  for (const auto& c : spec.target_columns) wanted += " and '" + c + "'";
  LSTM_REQUIRE(m.reader.next(head), path << ": the file is empty, expected a header row naming the column " << wanted);
  std::vector<std::string> header;
  for (const auto& f : head.fields) header.emplace_back(trim(f));
  m.columns = header.size();
  auto find = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? std::string::npos : static_cast<size_t>(it - header.begin());
  };
  m.seq_col = find(spec.sequence_column);
  LSTM_REQUIRE(m.seq_col != std::string::npos, path << ":" << head.line << ": no sequence column '" << spec.sequence_column
                                                     << "' in the header; available columns: " << join(header));
  for (const auto& c : spec.target_columns) {
    m.target_cols.push_back(find(c));
    LSTM_REQUIRE(m.target_cols.back() != std::string::npos, path << ":" << head.line << ": no " << role << " column '"
                                                                  << c << "' in the header; available columns: "
                                                                  << join(header));
  }
  if (!id_column.empty()) m.id_col = find(id_column);
  for (size_t c = 0; c < m.schema.class_names.size(); ++c)
    m.class_id.emplace(m.schema.class_names[c], static_cast<int64_t>(c));
  for (size_t t = 0; t < m.schema.token_names.size(); ++t)
    m.token_id.emplace(m.schema.token_names[t], static_cast<int64_t>(t));
  if (auto it = m.token_id.find(kUnknownToken); it != m.token_id.end()) m.unk = it->second;
}

CsvChunkReader::~CsvChunkReader() = default;
CsvChunkReader::CsvChunkReader(CsvChunkReader&&) noexcept = default;

bool CsvChunkReader::has_id_column() const { return impl_->id_col != std::string::npos; }
int64_t CsvChunkReader::unknown_tokens() const { return impl_->unknown_tokens; }

int64_t CsvChunkReader::next(int64_t max_rows, CsvDataset& out, std::vector<std::string>& ids) {
  LSTM_REQUIRE(max_rows >= 1, "CsvChunkReader::next: max_rows must be >= 1, got " << max_rows);
  Impl& m = *impl_;
  out = CsvDataset();
  out.tokens_ = m.schema.tokens;
  out.features_ = m.schema.tokens ? static_cast<int64_t>(m.schema.token_names.size()) : m.schema.features;
  if (!m.target_cols.empty()) out.target_ = m.spec.target;
  if (out.target_ == CsvTarget::Values) out.value_names_ = m.spec.target_columns;
  ids.clear();
  CsvRecord rec;
  while (out.size() < max_rows && m.reader.next(rec)) {
    ++m.rows;
    LSTM_REQUIRE(rec.fields.size() == m.columns,
                 m.path << ":" << rec.line << ": expected " << m.columns << " fields as in the header, got "
                        << rec.fields.size() << " (a field holding commas must be quoted)");
    int64_t label = -100;
    if (m.spec.target == CsvTarget::Label && !m.target_cols.empty()) {
      const std::string& column = m.spec.target_columns[0];
      const std::string label_text(trim(rec.fields[m.target_cols[0]]));
      LSTM_REQUIRE(!label_text.empty(), m.path << ":" << rec.line << ": empty label in column '" << column << "'");
      auto it = m.class_id.find(label_text);
      LSTM_REQUIRE(it != m.class_id.end(), m.path << ":" << rec.line << ": unknown class '" << printable(label_text)
                                                  << "' in column '" << column << "': the model knows "
                                                  << m.class_id.size() << " classes (" << join(m.schema.class_names)
                                                  << ")");
      label = it->second;
    }
    const auto steps = split_ws(rec.fields[m.seq_col]);
    LSTM_REQUIRE(!steps.empty(), m.path << ":" << rec.line << ": empty sequence in column '" << m.sequence_column
                                        << "', expected at least one step");
    std::vector<float> seq;
    if (m.schema.tokens) {
      seq.reserve(steps.size());
      for (size_t t = 0; t < steps.size(); ++t) {
        auto it = m.token_id.find(std::string(steps[t]));
        if (it == m.token_id.end()) {
          LSTM_REQUIRE(m.unk >= 0, m.path << ":" << rec.line << ": step " << t + 1 << " of column '"
                                          << m.sequence_column << "' is the token '" << printable(steps[t])
                                          << "', which is not in the model's vocabulary; this model reserves no "
                                          << kUnknownToken << " id for unknown tokens (models trained since it "
                                          << "does), so it can only read the " << m.token_id.size() << " tokens it was trained on");
          ++m.unknown_tokens;
          seq.push_back(static_cast<float>(m.unk));
        } else {
          seq.push_back(static_cast<float>(it->second));
        }
      }
    } else {
      seq.reserve(steps.size() * static_cast<size_t>(m.schema.features));
      for (size_t t = 0; t < steps.size(); ++t) {
        LSTM_REQUIRE(parse_step(steps[t], m.values),
                     m.path << ":" << rec.line << ": step " << t + 1 << " ('" << printable(steps[t]) << "') of column '"
                            << m.sequence_column << "' is not a number (or numbers joined by '|'); the model reads "
                            << m.schema.features << " number(s) per step");
        LSTM_REQUIRE(static_cast<int64_t>(m.values.size()) == m.schema.features,
                     m.path << ":" << rec.line << ": step " << t + 1 << " ('" << printable(steps[t]) << "') of column '"
                            << m.sequence_column << "' has " << m.values.size() << " features, the model reads "
                            << m.schema.features);
        for (double v : m.values) {
          const auto f = static_cast<float>(v);
          LSTM_REQUIRE(std::isfinite(f), m.path << ":" << rec.line << ": step " << t + 1 << " ('" << printable(steps[t])
                                                << "') of column '" << m.sequence_column
                                                << "' holds a value that is not a finite float");
          seq.push_back(f);
        }
      }
    }
    if (m.spec.target == CsvTarget::Tags && !m.target_cols.empty()) {
      const std::string& column = m.spec.target_columns[0];
      const auto tags = split_ws(rec.fields[m.target_cols[0]]);
      LSTM_REQUIRE(tags.size() == steps.size(), m.path << ":" << rec.line << ": column '" << column << "' has "
                                                       << tags.size() << " tags but column '" << m.sequence_column
                                                       << "' has " << steps.size() << " steps; expected one tag per step");
      std::vector<int64_t> row;
      for (size_t t = 0; t < tags.size(); ++t) {
        auto it = m.class_id.find(std::string(tags[t]));
        LSTM_REQUIRE(it != m.class_id.end(), m.path << ":" << rec.line << ": unknown tag '" << printable(tags[t])
                                                    << "' at step " << t + 1 << " of column '" << column
                                                    << "': the model knows " << m.class_id.size() << " tags ("
                                                    << join(m.schema.class_names) << ")");
        row.push_back(it->second);
      }
      out.tags_.push_back(std::move(row));
    }
    if (m.spec.target == CsvTarget::Values)
      for (size_t k = 0; k < m.target_cols.size(); ++k)
        out.values_.push_back(column_number(rec.fields[m.target_cols[k]], m.path, rec.line, m.spec.target_columns[k]));
    out.sequences_.push_back(std::move(seq));
    out.labels_.push_back(label);
    ids.push_back(m.id_col != std::string::npos ? std::string(trim(rec.fields[m.id_col])) : std::to_string(m.rows));
  }
  return out.size();
}

CsvDataset CsvDataset::load(const std::string& path, const CsvSchema& schema, const std::string& label_column,
                            const std::string& sequence_column) {
  LSTM_REQUIRE(!label_column.empty() && label_column != sequence_column,
               "CsvDataset::load: the label and sequence columns must differ and be named, got '" << label_column
                                                                                                 << "' and '" << sequence_column << "'");
  CsvChunkReader reader(path, schema, sequence_column, label_column, "");
  CsvDataset d;
  std::vector<std::string> ids;
  reader.next(std::numeric_limits<int64_t>::max(), d, ids);
  LSTM_REQUIRE(d.size() > 0, path << ": no data rows after the header");
  d.class_names_ = schema.class_names;
  d.token_names_ = schema.token_names;
  d.unknown_tokens_ = reader.unknown_tokens();
  return d;
}

CsvDataset CsvDataset::load(const std::string& path, const CsvSchema& schema, const CsvSpec& spec) {
  LSTM_REQUIRE(!spec.target_columns.empty(), "CsvDataset::load: no target column named");
  for (const auto& c : spec.target_columns)
    LSTM_REQUIRE(c != spec.sequence_column, "CsvDataset::load: the target and sequence columns must differ, both are '"
                                                << c << "'");
  CsvChunkReader reader(path, schema, spec, "");
  CsvDataset d;
  std::vector<std::string> ids;
  reader.next(std::numeric_limits<int64_t>::max(), d, ids);
  LSTM_REQUIRE(d.size() > 0, path << ": no data rows after the header");
  if (spec.target != CsvTarget::Values) d.class_names_ = schema.class_names;
  d.token_names_ = schema.token_names;
  d.unknown_tokens_ = reader.unknown_tokens();
  return d;
}

Batch CsvDataset::batch(const std::vector<int64_t>& indices) const {
  LSTM_REQUIRE(!indices.empty(), "CsvDataset::batch: no rows selected");
  const int64_t width = tokens_ ? 1 : features_;
  const auto B = static_cast<int64_t>(indices.size());
  Batch out;
  out.lengths.resize(indices.size());
  int64_t T = 0;
  for (size_t b = 0; b < indices.size(); ++b) {
    const int64_t i = indices[b];
    LSTM_REQUIRE(i >= 0 && i < size(),
                 "CsvDataset::batch: row index " << i << " at position " << b << " is out of range [0, " << size() << ")");
    out.lengths[b] = static_cast<int64_t>(sequences_[static_cast<size_t>(i)].size()) / width;
    T = std::max(T, out.lengths[b]);
  }
  if (tokens_) {
    out.inputs = Tensor::zeros({T, B}, DType::I64);
    int64_t* x = out.inputs.data<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      const auto& seq = sequences_[static_cast<size_t>(indices[static_cast<size_t>(b)])];
      for (int64_t t = 0; t < out.lengths[static_cast<size_t>(b)]; ++t)
        x[t * B + b] = static_cast<int64_t>(seq[static_cast<size_t>(t)]);
    }
  } else {
    const int64_t F = features_;
    out.inputs = Tensor::zeros({T, B, F}, DType::F32);
    float* x = out.inputs.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      const auto& seq = sequences_[static_cast<size_t>(indices[static_cast<size_t>(b)])];
      for (int64_t t = 0; t < out.lengths[static_cast<size_t>(b)]; ++t)
        std::copy_n(seq.begin() + t * F, F, x + (t * B + b) * F);
    }
  }
  const auto row = [&](int64_t b) { return static_cast<size_t>(indices[static_cast<size_t>(b)]); };
  if (target_ == CsvTarget::Label) {
    out.targets = Tensor::empty({B}, DType::I64);
    int64_t* y = out.targets.data<int64_t>();
    for (int64_t b = 0; b < B; ++b) y[b] = labels_[row(b)];
  } else if (target_ == CsvTarget::Tags) {
    out.targets = Tensor::full({T, B}, -100.0, DType::I64);
    int64_t* y = out.targets.data<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < out.lengths[static_cast<size_t>(b)]; ++t) y[t * B + b] = tags_[row(b)][static_cast<size_t>(t)];
  } else {
    const int64_t K = num_values();
    out.targets = Tensor::empty({B, K}, DType::F32);
    float* y = out.targets.data<float>();
    for (int64_t b = 0; b < B; ++b) std::copy_n(values_.begin() + static_cast<std::ptrdiff_t>(row(b)) * K, K, y + b * K);
  }
  return out;
}

int64_t CsvDataset::max_length() const {
  const size_t width = tokens_ ? 1 : static_cast<size_t>(features_);
  size_t longest = 0;
  for (const auto& seq : sequences_) longest = std::max(longest, seq.size() / width);
  return static_cast<int64_t>(longest);
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> CsvDataset::split(double valid_fraction, Rng& rng) const {
  LSTM_REQUIRE(valid_fraction >= 0.0 && valid_fraction < 1.0,
               "CsvDataset::split: valid_fraction must be in [0, 1), got " << valid_fraction);
  const int64_t n = size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[rng.below(static_cast<uint64_t>(i + 1))]);
  int64_t n_valid = std::llround(static_cast<double>(n) * valid_fraction);
  // A requested validation set is never empty, and training always keeps a row.
  if (n >= 2 && valid_fraction > 0.0) n_valid = std::clamp<int64_t>(n_valid, 1, n - 1);
  if (n < 2) n_valid = 0;
  const auto cut = order.begin() + (n - n_valid);
  return {std::vector<int64_t>(order.begin(), cut), std::vector<int64_t>(cut, order.end())};
}

TimeSeries TimeSeries::load(const std::string& path, const std::vector<std::string>& inputs,
                            const std::vector<std::string>& targets) {
  LSTM_REQUIRE(!targets.empty(), "TimeSeries::load: no target column named");
  const std::vector<std::string>& in_names = inputs.empty() ? targets : inputs;
  for (const auto* list : {&in_names, &targets})
    for (size_t i = 0; i < list->size(); ++i)
      for (size_t j = 0; j < i; ++j)
        LSTM_REQUIRE((*list)[i] != (*list)[j], "TimeSeries::load: the " << (list == &targets ? "target" : "input")
                                                                        << " column '" << (*list)[i]
                                                                        << "' is named twice");
  const std::string text = read_regular_file(path, "CSV file " + path + ": ", memory_limited_bytes());
  const std::vector<CsvRecord> rows = parse_csv(text, path);
  LSTM_REQUIRE(!rows.empty(), path << ": the file is empty, expected a header row naming the columns");
  std::vector<std::string> header;
  for (const auto& f : rows[0].fields) header.emplace_back(trim(f));
  auto find_column = [&](const std::string& name, const char* role) {
    const auto it = std::find(header.begin(), header.end(), name);
    LSTM_REQUIRE(it != header.end(), path << ":" << rows[0].line << ": no " << role << " column '" << name
                                          << "' in the header; available columns: " << join(header));
    return static_cast<size_t>(it - header.begin());
  };
  std::vector<size_t> in_cols, tg_cols;
  for (const auto& c : in_names) in_cols.push_back(find_column(c, "input"));
  for (const auto& c : targets) tg_cols.push_back(find_column(c, "target"));
  LSTM_REQUIRE(rows.size() > 1, path << ": no data rows after the header");

  TimeSeries ts;
  ts.input_names_ = in_names;
  ts.target_names_ = targets;
  for (size_t r = 1; r < rows.size(); ++r) {
    const CsvRecord& rec = rows[r];
    LSTM_REQUIRE(rec.fields.size() == header.size(),
                 path << ":" << rec.line << ": expected " << header.size() << " fields as in the header, got "
                      << rec.fields.size() << " (a field holding commas must be quoted)");
    for (size_t k = 0; k < in_cols.size(); ++k)
      ts.inputs_.push_back(column_number(rec.fields[in_cols[k]], path, rec.line, in_names[k]));
    for (size_t k = 0; k < tg_cols.size(); ++k)
      ts.targets_.push_back(column_number(rec.fields[tg_cols[k]], path, rec.line, targets[k]));
  }
  ts.steps_ = static_cast<int64_t>(rows.size() - 1);
  return ts;
}

Batch TimeSeries::windows(const std::vector<int64_t>& starts, int64_t seq_len, int64_t horizon) const {
  LSTM_REQUIRE(!starts.empty(), "TimeSeries::windows: no windows selected");
  LSTM_REQUIRE(seq_len >= 1 && horizon >= 1,
               "TimeSeries::windows: seq_len and horizon must be >= 1, got " << seq_len << " and " << horizon);
  const auto B = static_cast<int64_t>(starts.size());
  const int64_t F = num_inputs(), K = num_targets();
  Batch out;
  out.lengths.assign(starts.size(), seq_len);
  out.inputs = Tensor::empty({seq_len, B, F}, DType::F32);
  out.targets = Tensor::empty({B, horizon * K}, DType::F32);
  float* x = out.inputs.data<float>();
  float* y = out.targets.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = starts[static_cast<size_t>(b)];
    LSTM_REQUIRE(s >= 0 && s <= steps_ - seq_len - horizon,
                 "TimeSeries::windows: a window of " << seq_len << " + " << horizon << " steps at " << s
                                                     << " does not fit the series of " << steps_ << " steps");
    for (int64_t t = 0; t < seq_len; ++t) std::copy_n(input_row(s + t), F, x + (t * B + b) * F);
    for (int64_t h = 0; h < horizon; ++h) std::copy_n(target_row(s + seq_len + h), K, y + b * horizon * K + h * K);
  }
  return out;
}

Normalization Normalization::fit(const std::vector<std::string>& names, const std::vector<float>& values) {
  const size_t k = names.size();
  LSTM_REQUIRE(k > 0 && values.size() % k == 0,
               "Normalization::fit: " << values.size() << " values do not make rows of " << k << " columns");
  Normalization n;
  n.names = names;
  n.mean.assign(k, 0.0);
  n.std.assign(k, 1.0);
  const size_t rows = values.size() / k;
  if (rows == 0) return n;
  // Two passes in double: the variance does not cancel for columns far from zero.
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < k; ++c) n.mean[c] += values[r * k + c];
  for (double& m : n.mean) m /= static_cast<double>(rows);
  std::vector<double> var(k, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < k; ++c) {
      const double d = values[r * k + c] - n.mean[c];
      var[c] += d * d;
    }
  for (size_t c = 0; c < k; ++c) {
    const double sd = std::sqrt(var[c] / static_cast<double>(rows));
    // A constant column (up to float rounding) would otherwise be blown up to noise.
    n.std[c] = std::isfinite(sd) && sd > 1e-6 * std::max(1.0, std::abs(n.mean[c])) ? sd : 1.0;
  }
  return n;
}

void Normalization::apply(float* x, int64_t n) const {
  const int64_t k = size();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      x[r * k + c] = static_cast<float>((x[r * k + c] - mean[static_cast<size_t>(c)]) / std[static_cast<size_t>(c)]);
}

nlohmann::json Normalization::to_json() const { return {{"names", names}, {"mean", mean}, {"std", std}}; }

Normalization Normalization::from_json(const nlohmann::json& j, const std::string& what) {
  LSTM_REQUIRE(j.is_object() && j.size() == 3 && j.contains("names") && j.contains("mean") && j.contains("std"),
               what << ": expected an object {\"names\", \"mean\", \"std\"}, got " << json_excerpt(j));
  Normalization n;
  const auto& names = j["names"];
  LSTM_REQUIRE(names.is_array() && !names.empty(), what << ": \"names\" must be a non-empty list, got " << json_excerpt(names));
  for (size_t i = 0; i < names.size(); ++i) n.names.push_back(read_string(names[i], what + ": names[" + std::to_string(i) + "]"));
  for (const char* key : {"mean", "std"}) {
    const auto& a = j[key];
    LSTM_REQUIRE(a.is_array() && a.size() == names.size(),
                 what << ": \"" << key << "\" must be a list of " << names.size() << " numbers, got " << json_excerpt(a));
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string field = what + ": " + key + "[" + std::to_string(i) + "]";
      if (std::string(key) == "mean")
        n.mean.push_back(read_number(a[i], field, std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max()));
      else
        n.std.push_back(read_number(a[i], field, std::numeric_limits<double>::min(), std::numeric_limits<double>::max()));
    }
  }
  return n;
}

}  // namespace lstm
