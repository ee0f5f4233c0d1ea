#include "lstm/checked.hpp"

#include <unistd.h>

#include <iomanip>
#include <limits>

#include "lstm/error.hpp"

namespace lstm {

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  LSTM_CHECK(a >= 0 && b >= 0, what << ": negative operand " << a << " * " << b);
  int64_t r = 0;
  LSTM_REQUIRE(!__builtin_mul_overflow(a, b, &r), what << ": " << a << " * " << b << " overflows 64-bit integers");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  LSTM_CHECK(a >= 0 && b >= 0, what << ": negative operand " << a << " + " << b);
  int64_t r = 0;
  LSTM_REQUIRE(!__builtin_add_overflow(a, b, &r), what << ": " << a << " + " << b << " overflows 64-bit integers");
  return r;
}

int64_t checked_size(int64_t v, int64_t lo, int64_t hi, std::string_view what) {
  LSTM_REQUIRE(v >= lo && v <= hi, what << ": expected an integer in [" << lo << ", " << hi << "], got " << v);
  return v;
}

uint64_t physical_memory_bytes() {
  // Read once: the answer does not change while we run, and tensors are allocated often.
  static const uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : uint64_t{0};
  }();
  return bytes;
}

void require_memory(uint64_t bytes, std::string_view what) {
  const uint64_t have = physical_memory_bytes();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  LSTM_REQUIRE(have == 0 || bytes <= have,
               what << " needs " << bytes << " bytes (" << std::setprecision(4) << static_cast<double>(bytes) / kGiB
                    << " GiB), more than this machine's " << static_cast<double>(have) / kGiB << " GiB of memory");
}

}  // namespace lstm
