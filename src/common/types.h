// Strong ids, engine time and fixed-point money.
//
// Units (DESIGN.md §3): time is int64 microseconds of engine time; prices are
// int64 micro-units of money per hour; money is int64 micro-units; fractions are
// int64 parts per million. `kInfPrice` is a saturating sentinel: arithmetic on
// it stays infinite and nothing is ever billed at it.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>

namespace laissez {

// A typed integer id; ids of different kinds do not mix.
template <typename Tag, typename Rep>
struct StrongId {
  using rep = Rep;
  static constexpr Rep kInvalidValue = std::numeric_limits<Rep>::max();
  Rep value = kInvalidValue;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : value(v) {}
  constexpr bool valid() const { return value != kInvalidValue; }
  constexpr auto operator<=>(const StrongId&) const = default;
};

using NodeId = StrongId<struct NodeIdTag, uint32_t>;
using TenantId = StrongId<struct TenantIdTag, uint32_t>;
using OrderId = StrongId<struct OrderIdTag, uint64_t>;
using LocationId = StrongId<struct LocationIdTag, uint32_t>;
using TypeId = StrongId<struct TypeIdTag, uint16_t>;
using VertexId = StrongId<struct VertexIdTag, uint32_t>;
using PolicyId = StrongId<struct PolicyIdTag, uint32_t>;

using Micros = int64_t;  // Engine time or a duration, in microseconds.
using Price = int64_t;   // Micro-units of money per hour.
using Money = int64_t;   // Micro-units of money.
using Ppm = int64_t;     // Parts per million.

inline constexpr Price kInfPrice = std::numeric_limits<int64_t>::max();
inline constexpr Micros kNever = std::numeric_limits<int64_t>::max();
inline constexpr Micros kMicrosPerSecond = 1'000'000;
inline constexpr Micros kMicrosPerHour = 3'600'000'000;
inline constexpr int64_t kMicroUnits = 1'000'000;  // Micro-units per unit of money.
inline constexpr Ppm kPpm = 1'000'000;

// Saturating arithmetic: results at or beyond the sentinel are the sentinel.
constexpr int64_t SatAdd(int64_t a, int64_t b) {
  if (a == kInfPrice || b == kInfPrice) return kInfPrice;
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? kInfPrice : std::numeric_limits<int64_t>::min();
  return r;
}

// ceil(a * ppm / 1e6) for a >= 0, saturating; infinity stays infinite.
constexpr int64_t MulPpmCeil(int64_t a, Ppm ppm) {
  if (a == kInfPrice) return kInfPrice;
  if (ppm == 0 || a == 0) return 0;
  if (a < (int64_t{1} << 31) && ppm < (int64_t{1} << 31)) return (a * ppm + kPpm - 1) / kPpm;  // 64-bit fast path.
  __int128 p = static_cast<__int128>(a) * ppm;
  __int128 r = (p + kPpm - 1) / kPpm;
  if (r >= kInfPrice) return kInfPrice;
  return static_cast<int64_t>(r);
}

}  // namespace laissez

template <typename Tag, typename Rep>
struct std::hash<laissez::StrongId<Tag, Rep>> {
  size_t operator()(const laissez::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>()(id.value);
  }
};
