// Algo::Auto (internal): picks a registered backend per shape by measurement, on a GPU or the CPU.
#pragma once

#include <memory>

#include "lstm/lstm.hpp"

namespace lstm {

// See make_lstm_backend in lstm/lstm.hpp. Throws on Device::CUDA where no GPU is usable.
std::unique_ptr<LstmBackend> make_auto_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                                    Device device);

// The part of a choice's key that names the spec.
std::string auto_spec_key(const LstmSpec& spec);

// The file Algo::Auto keeps its choices in for `setting` (LstmOptions::auto_cache): "" when none.
std::string auto_cache_path(const std::string& setting);

}  // namespace lstm
