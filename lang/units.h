// Byte sizes written and read the same way everywhere: `human_bytes` prints them, `parse_size` reads them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace piper {

// 1.50 GiB, 512.00 KiB, 37 B.
std::string human_bytes(double bytes);

// Bytes in one unit: B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024); 0 when unknown.
int64_t size_unit(std::string_view unit);

// "80GiB", "1.5e9", "512MB", "25MiB" -> bytes; nothing for text that is not a non-negative size.
std::optional<double> parse_size(std::string_view text);

}  // namespace piper
