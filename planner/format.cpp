#include "planner/format.h"

#include <cmath>
#include <cstdio>

namespace ftplan {

std::string format_fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string format_gib(double bytes) { return format_fixed(bytes / double(1LL << 30), 2) + " GiB"; }

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return format_fixed(bytes, u == 0 ? 0 : 2) + " " + units[u];
}

std::string format_duration(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s < 60) return format_fixed(s, s < 10 ? 2 : 1) + " s";
  long long total = std::llround(s);
  long long d = total / 86400, h = total % 86400 / 3600, m = total % 3600 / 60, sec = total % 60;
  if (d > 0) return std::to_string(d) + " d " + std::to_string(h) + " h " + std::to_string(m) + " min";
  if (h > 0) return std::to_string(h) + " h " + std::to_string(m) + " min";
  return std::to_string(m) + " min " + std::to_string(sec) + " s";
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

}  // namespace ftplan
