// FNV-1a, 64 bits: the checksum of snapshot images (docs/SNAPSHOT.md, docs/HA.md).
// Catches damage and truncation, not tampering.
#pragma once

#include <cstdint>
#include <string_view>

namespace laissez {

inline uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace laissez
