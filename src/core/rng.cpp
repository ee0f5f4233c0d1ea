#include "lstm/rng.hpp"

#include <cmath>

#include "lstm/tensor.hpp"

namespace lstm {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) w = splitmix64(x);
}

uint64_t Rng::next_u64() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  double u1 = uniform();
  double u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Rng::below(uint64_t n) {
  LSTM_REQUIRE(n > 0, "Rng::below: n must be positive");
  // Lemire's rejection-free-enough method: multiply-high with rejection of the biased zone.
  uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t r = next_u64();
    if (r >= threshold) return r % n;
  }
}

void Rng::fill_uniform(Tensor& t, double lo, double hi) {
  LSTM_REQUIRE(is_floating(t.dtype()), "fill_uniform: needs a floating tensor, got " << dtype_name(t.dtype()));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, lo + (hi - lo) * uniform());
}

void Rng::fill_normal(Tensor& t, double mean, double stddev) {
  LSTM_REQUIRE(is_floating(t.dtype()), "fill_normal: needs a floating tensor, got " << dtype_name(t.dtype()));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, mean + stddev * normal());
}

}  // namespace lstm
