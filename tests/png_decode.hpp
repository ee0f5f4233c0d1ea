// A PNG reader for the tests, written apart from src/io/png.cpp (its own bitwise CRC-32 and
// Adler-32) so that the writer is checked against the format, not against itself. It reads what
// the writer makes: indexed colour, no interlace, filter type 0 rows, zlib with stored blocks.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace lstm::testing {

struct DecodedPng {
  std::string error;  // empty when the file is valid
  uint32_t width = 0, height = 0;
  int depth = 0, colour_type = 0;
  int idat_blocks = 0;  // stored deflate blocks
  std::vector<std::array<uint8_t, 3>> palette;
  std::vector<uint8_t> pixels;  // palette indices, row-major

  bool has_colour(std::array<uint8_t, 3> rgb) const {
    for (uint8_t p : pixels)
      if (p < palette.size() && palette[p] == rgb) return true;
    return false;
  }
};

inline uint32_t crc32_bitwise(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

inline uint32_t adler32_plain(const std::string& s) {
  uint64_t a = 1, b = 0;
  for (unsigned char c : s) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  return static_cast<uint32_t>((b << 16) | a);
}

inline uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

inline DecodedPng decode_png(const std::string& f) {
  DecodedPng r;
  auto fail = [&](const std::string& e) {
    r.error = e;
    return r;
  };
  if (f.size() < 8 || f.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0) return fail("bad signature");
  size_t pos = 8;
  std::string idat;
  bool ihdr = false, iend = false;
  while (pos + 12 <= f.size() && !iend) {
    const uint32_t len = be32(f, pos);
    if (pos + 12 + len > f.size()) return fail("chunk past the end");
    const std::string type = f.substr(pos + 4, 4), data = f.substr(pos + 8, len);
    if (crc32_bitwise(f.substr(pos + 4, 4 + len)) != be32(f, pos + 8 + len)) return fail("bad CRC in " + type);
    if (!ihdr && type != "IHDR") return fail("first chunk is " + type);
    if (type == "IHDR") {
      if (len != 13) return fail("IHDR length");
      r.width = be32(data, 0), r.height = be32(data, 4);
      r.depth = static_cast<unsigned char>(data[8]), r.colour_type = static_cast<unsigned char>(data[9]);
      if (data[10] || data[11] || data[12]) return fail("compression/filter/interlace not 0");
      ihdr = true;
    } else if (type == "PLTE") {
      if (len % 3 || len == 0) return fail("PLTE length");
      for (size_t i = 0; i < len; i += 3)
        r.palette.push_back({static_cast<uint8_t>(data[i]), static_cast<uint8_t>(data[i + 1]), static_cast<uint8_t>(data[i + 2])});
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      iend = true;
    }
    pos += 12 + len;
  }
  if (!iend || pos != f.size()) return fail("no IEND at the end");
  if (r.colour_type != 3 || r.palette.empty()) return fail("not indexed colour with a palette");
  // zlib: CMF/FLG, stored blocks, Adler-32 of the inflated bytes.
  if (idat.size() < 6 || (static_cast<unsigned char>(idat[0]) & 0x0f) != 8 ||
      ((static_cast<unsigned char>(idat[0]) << 8) | static_cast<unsigned char>(idat[1])) % 31 != 0)
    return fail("bad zlib header");
  std::string raw;
  size_t z = 2;
  for (bool final = false; !final;) {
    if (z + 5 > idat.size()) return fail("zlib stream cut short");
    const unsigned char h = static_cast<unsigned char>(idat[z]);
    final = h & 1;
    if (((h >> 1) & 3) != 0) return fail("not a stored block");
    const unsigned n = static_cast<unsigned char>(idat[z + 1]) | (static_cast<unsigned char>(idat[z + 2]) << 8);
    const unsigned nn = static_cast<unsigned char>(idat[z + 3]) | (static_cast<unsigned char>(idat[z + 4]) << 8);
    if ((n ^ 0xffffu) != nn) return fail("LEN/NLEN mismatch");
    if (z + 5 + n > idat.size()) return fail("stored block past the end");
    raw += idat.substr(z + 5, n);
    z += 5 + n;
    ++r.idat_blocks;
  }
  if (z + 4 != idat.size()) return fail("bytes after the zlib stream");
  if (be32(idat, z) != adler32_plain(raw)) return fail("bad Adler-32");
  const size_t row = (static_cast<size_t>(r.width) * r.depth + 7) / 8;
  if (raw.size() != (row + 1) * r.height) return fail("inflated size is not height x (1 + row bytes)");
  for (uint32_t y = 0; y < r.height; ++y) {
    if (raw[y * (row + 1)] != 0) return fail("row filter is not 0");
    for (uint32_t x = 0; x < r.width; ++x) {
      const size_t bit = static_cast<size_t>(x) * r.depth;
      const unsigned char byte = static_cast<unsigned char>(raw[y * (row + 1) + 1 + bit / 8]);
      r.pixels.push_back(static_cast<uint8_t>((byte >> (8 - r.depth - bit % 8)) & ((1 << r.depth) - 1)));
    }
  }
  for (uint8_t p : r.pixels)
    if (p >= r.palette.size()) return fail("pixel index past the palette");
  return r;
}

}  // namespace lstm::testing
