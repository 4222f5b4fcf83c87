#include "lang/units.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace piper {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

int64_t size_unit(std::string_view unit) {
  static const std::pair<std::string_view, int64_t> kUnits[] = {
      {"B", 1},         {"KB", 1000},           {"MB", 1000'000},       {"GB", 1000'000'000},   {"TB", 1000'000'000'000},
      {"KiB", 1 << 10}, {"MiB", int64_t{1} << 20}, {"GiB", int64_t{1} << 30}, {"TiB", int64_t{1} << 40}};
  for (auto [u, f] : kUnits)
    if (unit == u) return f;
  return 0;
}

std::optional<double> parse_size(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return std::nullopt;
  std::string_view unit(end);
  if (unit.empty()) return v;
  const int64_t scale = size_unit(unit);
  if (scale == 0) return std::nullopt;
  return v * static_cast<double>(scale);
}

}  // namespace piper
