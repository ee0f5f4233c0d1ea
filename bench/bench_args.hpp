// Command-line parsing shared by the benchmarks: comma lists and checked numbers. A bad value
// calls the benchmark's usage_error (which prints its usage and exits; it must not return).
#pragma once

#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace lstm::bench {

using UsageError = void (*)(const std::string& msg);

inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

inline int64_t parse_int(const std::string& flag, const std::string& s, int64_t min_value, UsageError usage_error) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < min_value)
    usage_error(flag + " expects an integer >= " + std::to_string(min_value) + ", got '" + s + "'");
  return v;
}

inline double parse_double(const std::string& flag, const std::string& s, UsageError usage_error) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !(v >= 0)) usage_error(flag + " expects a number >= 0, got '" + s + "'");
  return v;
}

}  // namespace lstm::bench
