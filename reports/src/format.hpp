#pragma once
// Number formatting shared by the text writers: fixed, locale-free, NaN spelled out.

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace gradnorm::reports::detail {

inline std::string sci(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  return fmt::format("{:.2e}", value);
}

inline std::string sci(const std::optional<double>& value) { return value ? sci(*value) : "-"; }

inline std::string ulps(std::int64_t value) {
  if (value == std::numeric_limits<std::int64_t>::max()) return "max";
  return fmt::format("{}", value);
}

}  // namespace gradnorm::reports::detail
