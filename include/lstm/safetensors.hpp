// safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {str: str}}, then the raw little-endian data. Compatible with safetensors.torch.save_file /
// load_file.
#pragma once

#include <map>
#include <string>

#include "lstm/tensor.hpp"

namespace lstm {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads a whole file. Throws lstm::Error naming the file and the defect: missing file, header
// length past the end or absurd, malformed JSON, unknown dtype, shape/offset mismatch,
// offsets out of range or overlapping, trailing bytes not covered.
SafetensorsFile read_safetensors(const std::string& path);
// Only the header: names -> shapes (and dtypes), without reading the data.
std::map<std::string, Shape> read_safetensors_shapes(const std::string& path);

// Writes atomically: to a temporary file in the same folder, fsync, rename over `path`, fsync
// the folder. A failure leaves any previous file at `path` untouched.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Atomic write of any bytes (same procedure). Used for checkpoints and JSON side files.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace lstm
