// PNG files without zlib: an indexed-colour image in "stored" (uncompressed) deflate blocks, with
// the CRC-32 and Adler-32 checksums PNG and zlib require. Enough for plots: a few colours, so a
// palette of at most 16 entries keeps the file at 4 bits a pixel. Internal.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lstm {

using Rgb = std::array<uint8_t, 3>;

// CRC-32 (ISO 3309, as PNG chunks use) and Adler-32 (zlib's stream checksum) of `bytes`.
uint32_t crc32(std::string_view bytes);
uint32_t adler32(std::string_view bytes);

// A PNG of width x height pixels, `pixels` row-major, each an index into `palette` (1 to 256
// colours; the bit depth is the smallest of 1, 2, 4, 8 that holds them). Throws lstm::Error on
// sizes out of [1, 65535], a pixel count other than width * height, or an index past the palette.
std::string encode_png_indexed(int width, int height, const std::vector<Rgb>& palette,
                               const std::vector<uint8_t>& pixels);

}  // namespace lstm
