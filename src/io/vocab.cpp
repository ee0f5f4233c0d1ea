#include <algorithm>
#include <cstdio>

#include "io/utf8.hpp"
#include "lstm/data.hpp"
#include "lstm/error.hpp"

namespace lstm {

namespace utf8 {

namespace {
std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}
}  // namespace

size_t decode_one(std::string_view s, size_t pos, char32_t& cp, std::string* why) {
  auto fail = [&](const std::string& msg) -> size_t {
    if (why) *why = msg;
    return 0;
  };
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  size_t len = 0;
  // The allowed range of the second byte is what rules out overlong forms (E0, F0), surrogates
  // (ED) and values above U+10FFFF (F4) without decoding first.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0xC0) return fail("unexpected continuation byte " + hex_byte(b0) + " (not after a lead byte)");
  if (b0 < 0xC2) return fail("overlong 2-byte encoding (lead byte " + hex_byte(b0) + ")");
  if (b0 < 0xE0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 < 0xF0) {
    len = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 < 0xF5) {
    len = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return fail("byte " + hex_byte(b0) + " never occurs in UTF-8");
  }
  for (size_t k = 1; k < len; ++k) {
    if (pos + k >= s.size())
      return fail("truncated sequence: lead byte " + hex_byte(b0) + " needs " + std::to_string(len) +
                  " bytes, only " + std::to_string(k) + " remain before the end of the text");
    const auto b = static_cast<unsigned char>(s[pos + k]);
    if (b < 0x80 || b > 0xBF)
      return fail("truncated sequence: lead byte " + hex_byte(b0) + " needs " + std::to_string(len) +
                  " bytes, byte " + std::to_string(k + 1) + " is " + hex_byte(b) + ", not a continuation byte");
    if (k == 1 && (b < lo || b > hi)) {
      if (b0 == 0xED) return fail("encoded UTF-16 surrogate (" + hex_byte(b0) + " " + hex_byte(b) + ")");
      if (b0 == 0xF4) return fail("code point above U+10FFFF (" + hex_byte(b0) + " " + hex_byte(b) + ")");
      return fail("overlong " + std::to_string(len) + "-byte encoding (" + hex_byte(b0) + " " + hex_byte(b) + ")");
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return len;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string encode(char32_t cp) {
  std::string s;
  append(s, cp);
  return s;
}

size_t first_invalid(std::string_view s, std::string* why) {
  size_t pos = 0;
  char32_t cp = 0;
  while (pos < s.size()) {
    // ASCII runs dominate real text; skip them without the general decoder.
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = decode_one(s, pos, cp, why);
    if (n == 0) return pos;
    pos += n;
  }
  return std::string_view::npos;
}

std::string describe(char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(cp));
  std::string out = buf;
  if (cp >= 0x20 && cp != 0x7F && !(cp >= 0x80 && cp < 0xA0)) out += " '" + encode(cp) + "'";
  return out;
}

}  // namespace utf8

Vocab Vocab::from_text(const std::string& text, bool reserve_unk) {
  // A bitmap over all code points is cheaper than a set for multi-megabyte corpora.
  std::vector<bool> seen(0x110000, false);
  std::string why;
  char32_t cp = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = utf8::decode_one(text, pos, cp, &why);
    LSTM_REQUIRE(n != 0, "Vocab::from_text: invalid UTF-8 at byte offset " << pos << ": " << why);
    seen[cp] = true;
    pos += n;
  }
  Vocab v;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (!seen[c]) continue;
    v.index_.emplace(c, static_cast<int64_t>(v.chars_.size()));
    v.chars_.push_back(c);
  }
  if (reserve_unk) v.unk_ = static_cast<int64_t>(v.chars_.size());
  return v;
}

Vocab Vocab::from_json(const nlohmann::json& j) {
  LSTM_REQUIRE(j.is_array(), "Vocab::from_json: expected an array of one-character strings, got a JSON "
                                 << j.type_name());
  Vocab v;
  std::string why;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    LSTM_REQUIRE(e.is_string(), "Vocab::from_json: entry " << i << ": expected a one-character string, got a JSON "
                                                              << e.type_name() << " (" << e.dump() << ")");
    const auto& s = e.get_ref<const std::string&>();
    if (s == kUnknownToken) {
      LSTM_REQUIRE(i + 1 == j.size(), "Vocab::from_json: entry " << i << " is \"" << kUnknownToken
                                                                 << "\", which may only be the last entry");
      v.unk_ = static_cast<int64_t>(i);
      break;
    }
    LSTM_REQUIRE(!s.empty(), "Vocab::from_json: entry " << i << ": expected one character, got an empty string");
    char32_t cp = 0;
    const size_t n = utf8::decode_one(s, 0, cp, &why);
    LSTM_REQUIRE(n != 0, "Vocab::from_json: entry " << i << ": invalid UTF-8 at byte offset 0: " << why);
    LSTM_REQUIRE(n == s.size(), "Vocab::from_json: entry " << i << ": expected exactly one character, got "
                                                           << e.dump() << " (" << s.size() << " bytes)");
    const auto [it, fresh] = v.index_.emplace(cp, static_cast<int64_t>(i));
    LSTM_REQUIRE(fresh, "Vocab::from_json: entry " << i << " (" << utf8::describe(cp)
                                                   << ") duplicates entry " << it->second);
    v.chars_.push_back(cp);
  }
  return v;
}

nlohmann::json Vocab::to_json() const {
  auto j = nlohmann::json::array();
  for (char32_t c : chars_) j.push_back(utf8::encode(c));
  if (unk_ >= 0) j.push_back(kUnknownToken);
  return j;
}

std::vector<int64_t> Vocab::encode(const std::string& text, int64_t* unknown) const {
  // Direct table for the first plane: the lookups are the hot loop when a corpus is encoded.
  constexpr char32_t kDirect = 0x10000;
  std::vector<int64_t> direct(std::min<size_t>(kDirect, chars_.empty() ? 0 : chars_.back() + 1), -1);
  for (size_t i = 0; i < chars_.size(); ++i)
    if (chars_[i] < direct.size()) direct[chars_[i]] = static_cast<int64_t>(i);

  std::vector<int64_t> ids;
  ids.reserve(text.size());
  std::string why;
  char32_t cp = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = utf8::decode_one(text, pos, cp, &why);
    LSTM_REQUIRE(n != 0, "Vocab::encode: invalid UTF-8 at byte offset " << pos << ": " << why);
    int64_t id = -1;
    if (cp < direct.size()) {
      id = direct[cp];
    } else if (auto it = index_.find(cp); it != index_.end()) {
      id = it->second;
    }
    if (id < 0 && unk_ >= 0) {
      id = unk_;
      if (unknown) ++*unknown;
    }
    LSTM_REQUIRE(id >= 0, "Vocab::encode: character " << utf8::describe(cp) << " at byte offset " << pos
                                                      << " is not in the vocabulary (" << size() << " characters"
                                                      << ", no " << kUnknownToken << " id: models trained before it "
                                                      << "was reserved read only their own characters)");
    ids.push_back(id);
    pos += n;
  }
  return ids;
}

std::string Vocab::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    LSTM_REQUIRE(ids[i] >= 0 && ids[i] < size(), "Vocab::decode: id " << ids[i] << " at position " << i
                                                                     << " is out of range [0, " << size() << ")");
    if (ids[i] == unk_)
      out += kUnknownToken;
    else
      utf8::append(out, chars_[static_cast<size_t>(ids[i])]);
  }
  return out;
}

std::string Vocab::decode_one(int64_t id) const {
  LSTM_REQUIRE(id >= 0 && id < size(), "Vocab::decode_one: id " << id << " is out of range [0, " << size() << ")");
  if (id == unk_) return kUnknownToken;
  return utf8::encode(chars_[static_cast<size_t>(id)]);
}

}  // namespace lstm
