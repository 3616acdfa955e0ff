// The engine's 64-bit fast paths for the budget test, the exhaustion bound and Div128
// (issue 12) against the 128-bit arithmetic they replace: the same answers
// at and around the points where the 64-bit operands or products stop fitting.
#include <gtest/gtest.h>

#include <vector>

#include "market/engine/engine_impl.h"

namespace laissez::market::engine_internal {
namespace {

std::vector<__int128> EdgeValues() {
  const __int128 max64 = INT64_MAX, min64 = INT64_MIN;
  const __int128 h = kH;
  std::vector<__int128> base = {0, 1, h, max64 / h, max64 / h + 1, max64, min64, max64 * h, min64 * h,
                                int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 50};
  std::vector<__int128> out;
  for (__int128 v : base) {
    for (__int128 d = -2; d <= 2; ++d) {
      out.push_back(v + d);
      out.push_back(-v + d);
    }
  }
  return out;
}

TEST(EngineArith, TimesHAboveMatches128BitProduct) {
  std::vector<__int128> values = EdgeValues();
  for (__int128 x : values) {
    for (__int128 a : values) {
      ASSERT_EQ(TimesHAbove(x, a), x * kH > a)
          << "x=" << static_cast<long double>(x) << " a=" << static_cast<long double>(a);
    }
  }
}

TEST(EngineArith, AccrualAtMatches128BitFormula) {
  std::vector<__int128> values = EdgeValues();
  const std::vector<Micros> times = {0, 1, kMicrosPerHour, int64_t{1} << 40, kNever - 1};
  for (__int128 rate_sum : values) {
    // Keep rate_sum x at inside 128 bits: rate sums beyond 2^64 are not tested.
    if (rate_sum > (static_cast<__int128>(1) << 64) || rate_sum < -(static_cast<__int128>(1) << 64)) continue;
    for (Micros at : times) {
      Tenant t;
      t.rate_sum = rate_sum;
      t.carry_sum = 12345;
      t.rate_time_sum = rate_sum * 7;
      ASSERT_EQ(AccrualAt(t, at), t.carry_sum + t.rate_sum * at - t.rate_time_sum)
          << "rate_sum=" << static_cast<long double>(rate_sum) << " at=" << at;
    }
  }
}

TEST(EngineArith, Div128MatchesThe128BitQuotient) {
  const std::vector<int64_t> divisors = {1, 2, 7, kMicrosPerSecond, kMicrosPerHour, INT64_MAX, -1, -7, INT64_MIN};
  for (__int128 a : EdgeValues()) {
    for (int64_t b : divisors) {
      ASSERT_EQ(Div128(a, b), a / b) << "a=" << static_cast<long double>(a) << " b=" << b;
    }
  }
}

}  // namespace
}  // namespace laissez::market::engine_internal
