// UTF-8 decoding shared by the text datasets (internal; not part of the public API).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lstm::utf8 {

// Decodes the code point starting at s[pos] into `cp` and returns its length in bytes (1..4).
// Returns 0 on malformed input (stray continuation byte, overlong form, surrogate, value above
// U+10FFFF, truncated sequence) and, when `why` is given, says what is wrong there.
size_t decode_one(std::string_view s, size_t pos, char32_t& cp, std::string* why = nullptr);

// Appends the UTF-8 form of a valid code point (not a surrogate, at most U+10FFFF).
void append(std::string& out, char32_t cp);
std::string encode(char32_t cp);

// Byte offset of the first malformed sequence, or npos when `s` is entirely valid UTF-8.
size_t first_invalid(std::string_view s, std::string* why = nullptr);

// "U+00E9 'é'" for messages; control characters are shown by code only.
std::string describe(char32_t cp);

}  // namespace lstm::utf8
