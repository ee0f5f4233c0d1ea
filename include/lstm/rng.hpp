// Seeded random numbers (xoshiro256**). Deterministic for a seed on every platform; the state
// is four 64-bit words that checkpoints save so that a resumed run draws the same numbers.
#pragma once

#include <array>
#include <cstdint>

namespace lstm {

class Tensor;

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x5eed);
  uint64_t next_u64();
  // Uniform in [0, 1).
  double uniform();
  // Standard normal (Box-Muller; no cached second value, so the state is the whole story).
  double normal();
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n);

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

  // Fills a floating tensor in place.
  void fill_uniform(Tensor& t, double lo, double hi);
  void fill_normal(Tensor& t, double mean, double stddev);

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace lstm
