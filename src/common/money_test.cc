#include "common/money.h"

#include <gtest/gtest.h>

namespace laissez {
namespace {

TEST(Money, ParsesDecimalsIntoMicroUnits) {
  EXPECT_EQ(*ParseMoney("12", "price"), 12'000'000);
  EXPECT_EQ(*ParseMoney("2.5", "price"), 2'500'000);
  EXPECT_EQ(*ParseMoney("0.000001", "price"), 1);
}

TEST(Money, RejectsBadPricesNamingTheField) {
  for (const char* bad : {"nan", "NaN", "inf", "-1", "1.0000001", "1e3", "", ".", "1.2.3", "99999999999999999999"}) {
    auto r = ParseMoney(bad, "price");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().rfind("price:", 0), 0u) << r.status().message();
  }
}

TEST(Money, FormatsRoundTrip) {
  for (int64_t v : {0L, 1L, 2'500'000L, 12'000'000L, 123'456'789L}) EXPECT_EQ(*ParseMoney(FormatMoney(v), "x"), v);
  EXPECT_EQ(FormatMoney(kInfPrice), "inf");
}

TEST(Duration, ParsesUnits) {
  EXPECT_EQ(*ParseDuration("90s", "grace"), 90 * kMicrosPerSecond);
  EXPECT_EQ(*ParseDuration("2m", "grace"), 120 * kMicrosPerSecond);
  EXPECT_EQ(*ParseDuration("1h", "grace"), kMicrosPerHour);
  EXPECT_EQ(*ParseDuration("1500ms", "grace"), 1'500'000);
  EXPECT_FALSE(ParseDuration("5 parsecs", "grace").ok());
}

}  // namespace
}  // namespace laissez
