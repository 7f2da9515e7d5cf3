// Number formatting for reports: units always spelled out (GiB = 2^30 bytes, GB = 10^9 bytes).
#pragma once

#include <cstdint>
#include <string>

namespace ftplan {

std::string format_gib(double bytes);        // "12.34 GiB"
std::string format_bytes(double bytes);      // picks B, KiB, MiB, GiB, TiB
std::string format_duration(double seconds); // "3 min 53 s", "1 d 20 h", "59.0 s"
std::string format_fixed(double value, int decimals);
std::string format_count(int64_t n);         // "8,030,261,248"

}  // namespace ftplan
