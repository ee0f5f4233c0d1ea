#include "lstm/error.hpp"

namespace lstm::detail {

void throw_error(const char* file, int line, const char* expr, const std::string& msg) {
  std::ostringstream os;
  os << msg << " [" << file << ":" << line << ": check failed: " << expr << "]";
  throw Error(os.str());
}

}  // namespace lstm::detail
