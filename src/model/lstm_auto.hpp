// Algo::Auto on a GPU (internal): picks a registered backend per shape by measurement.
#pragma once

#include <memory>

#include "lstm/lstm.hpp"

namespace lstm {

// See make_lstm_backend in lstm/lstm.hpp. device is Device::CUDA.
std::unique_ptr<LstmBackend> make_auto_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                                    Device device);

// The file Algo::Auto keeps its choices in for `setting` (LstmOptions::auto_cache): "" when none.
std::string auto_cache_path(const std::string& setting);

}  // namespace lstm
