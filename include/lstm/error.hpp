// Errors thrown by lstm-engine.
//
// Every failure surfaces as lstm::Error (a std::runtime_error). User-facing checks say what was
// expected and what was given; internal checks also carry file:line and the failing expression.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lstm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace detail

}  // namespace lstm

// LSTM_REQUIRE(cond, stream-expression): a user-input check. The message is built only on failure,
// e.g. LSTM_REQUIRE(x.dim() == 3, "input: expected [T, B, I], got " << x.shape_str());
#define LSTM_REQUIRE(cond, msg)                      \
  do {                                               \
    if (!(cond)) {                                   \
      std::ostringstream lstm_require_os_;           \
      lstm_require_os_ << msg;                       \
      throw ::lstm::Error(lstm_require_os_.str());   \
    }                                                \
  } while (0)

// LSTM_CHECK(cond, stream-expression): an internal invariant; the message names file:line and cond.
#define LSTM_CHECK(cond, msg)                                                         \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::ostringstream lstm_check_os_;                                              \
      lstm_check_os_ << msg;                                                          \
      ::lstm::detail::throw_error(__FILE__, __LINE__, #cond, lstm_check_os_.str());   \
    }                                                                                 \
  } while (0)

#define LSTM_THROW(msg)                        \
  do {                                         \
    std::ostringstream lstm_throw_os_;         \
    lstm_throw_os_ << msg;                     \
    throw ::lstm::Error(lstm_throw_os_.str()); \
  } while (0)
