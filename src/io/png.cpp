// PNG (ISO/IEC 15948) written by hand: signature, IHDR, PLTE, one IDAT holding a zlib stream of
// stored deflate blocks (RFC 1950/1951), IEND.
#include "io/png.hpp"

#include "lstm/error.hpp"

namespace lstm {

namespace {

void put_be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
}

void put_chunk(std::string& out, const char type[4], std::string_view data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body.append(data);
  out += body;
  put_be32(out, crc32(body));
}

// zlib stream of `raw` in stored blocks (at most 65535 bytes each).
std::string zlib_stored(std::string_view raw) {
  std::string z = {'\x78', '\x01'};  // deflate, 32 KiB window, no dictionary; (0x7801 % 31 == 0)
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool final = pos + n == raw.size();
    z.push_back(static_cast<char>(final ? 1 : 0));  // BFINAL, BTYPE = 00 (stored)
    z.push_back(static_cast<char>(n & 0xff));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xff));
    z.push_back(static_cast<char>((~n >> 8) & 0xff));
    z.append(raw.substr(pos, n));
    pos += n;
  } while (pos < raw.size());
  put_be32(z, adler32(raw));
  return z;
}

}  // namespace

uint32_t crc32(std::string_view bytes) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t adler32(std::string_view bytes) {
  uint32_t a = 1, b = 0;
  for (unsigned char c : bytes) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::string encode_png_indexed(int width, int height, const std::vector<Rgb>& palette,
                               const std::vector<uint8_t>& pixels) {
  LSTM_REQUIRE(width >= 1 && width <= 65535 && height >= 1 && height <= 65535,
               "PNG size must be in [1, 65535] x [1, 65535], got " << width << " x " << height);
  LSTM_REQUIRE(!palette.empty() && palette.size() <= 256, "PNG palette must have 1 to 256 colours, got " << palette.size());
  LSTM_REQUIRE(pixels.size() == static_cast<size_t>(width) * static_cast<size_t>(height),
               "PNG of " << width << " x " << height << " needs " << static_cast<size_t>(width) * height
                         << " pixels, got " << pixels.size());
  const int depth = palette.size() <= 2 ? 1 : palette.size() <= 4 ? 2 : palette.size() <= 16 ? 4 : 8;
  const size_t row_bytes = (static_cast<size_t>(width) * depth + 7) / 8;
  std::string raw;
  raw.reserve((row_bytes + 1) * height);
  for (int y = 0; y < height; ++y) {
    raw.push_back('\0');  // filter type None
    std::string row(row_bytes, '\0');
    for (int x = 0; x < width; ++x) {
      const uint8_t v = pixels[static_cast<size_t>(y) * width + x];
      LSTM_REQUIRE(v < palette.size(), "PNG pixel (" << x << ", " << y << ") is colour " << int(v) << ", past the "
                                                     << palette.size() << "-colour palette");
      const size_t bit = static_cast<size_t>(x) * depth;
      row[bit / 8] = static_cast<char>(static_cast<uint8_t>(row[bit / 8]) | (v << (8 - depth - bit % 8)));
    }
    raw += row;
  }
  std::string out = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(width));
  put_be32(ihdr, static_cast<uint32_t>(height));
  ihdr += {static_cast<char>(depth), 3, 0, 0, 0};  // colour type 3 (indexed), deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  std::string plte;
  for (const Rgb& c : palette) plte.append(reinterpret_cast<const char*>(c.data()), 3);
  put_chunk(out, "PLTE", plte);
  put_chunk(out, "IDAT", zlib_stored(raw));
  put_chunk(out, "IEND", "");
  return out;
}

}  // namespace lstm
