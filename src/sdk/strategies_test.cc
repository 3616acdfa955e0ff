#include "sdk/strategies.h"

#include <gtest/gtest.h>

#include "sdk/fake_market_client.h"

namespace laissez::sdk {
namespace {

constexpr Price kUnit = kMicroUnits;

class StrategiesTest : public ::testing::Test {
 protected:
  StrategiesTest() { client_.vertices["h100"] = 1; client_.quotes[1] = 5 * kUnit; }
  OrderBookView View(NodeId held = NodeId(), uint32_t count = 1) {
    return OrderBookView(&client_, VertexId(1), held, 0, 0, count);
  }
  NodeSpec Spec(std::string type = "h100") {
    NodeSpec s;
    s.node_type = std::move(type);
    return s;
  }
  FakeMarketClient client_;
};

TEST_F(StrategiesTest, FixedValueAnswersTheSamePriceForWantedAndHeld) {
  FixedValue f(3 * kUnit);
  EXPECT_EQ(f.Price(Spec(), View()), 3 * kUnit);
  NodeSpec held = Spec();
  held.held = NodeId(4);
  EXPECT_EQ(f.Price(held, View(NodeId(4))), 3 * kUnit);
}

TEST_F(StrategiesTest, ThroughputValueScalesByRelativeSpeedAndSkipsUnknownTypes) {
  ThroughputValue t(10 * kUnit, {{"h100", kPpm}, {"a100", 437'000}});
  EXPECT_EQ(t.Price(Spec("h100"), View()), 10 * kUnit);
  EXPECT_EQ(t.Price(Spec("a100"), View()), 4'370'000);
  EXPECT_EQ(t.Price(Spec("l4"), View()), std::nullopt);
}

TEST_F(StrategiesTest, BudgetCapLimitsToMaxAndToWhatTheBalanceSustains) {
  BudgetCapped capped(std::make_unique<FixedValue>(10 * kUnit), 8 * kUnit);
  EXPECT_EQ(capped.Price(Spec(), View()), 8 * kUnit);
  // 12 units of balance over 2 hours for 2 nodes sustain 3 per node-hour.
  client_.balance = 12 * kUnit;
  BudgetCapped horizon(std::make_unique<FixedValue>(10 * kUnit), kInfPrice, 2 * kMicrosPerHour);
  EXPECT_EQ(horizon.Price(Spec(), View(NodeId(), 2)), 3 * kUnit);
}

TEST_F(StrategiesTest, UrgencyRisesAsTheDeadlineNears) {
  Micros remaining = 2 * kMicrosPerHour;
  DeadlineUrgency::Params p;
  p.deadline = 10 * kMicrosPerHour;
  p.remaining = [&] { return remaining; };
  DeadlineUrgency u(std::make_unique<FixedValue>(10 * kUnit), p);
  client_.now = 0;  // slack 5: relaxed.
  EXPECT_EQ(u.Price(Spec(), View()), 5 * kUnit);
  client_.now = 8 * kMicrosPerHour;  // slack 1: urgent.
  EXPECT_EQ(u.Price(Spec(), View()), 30 * kUnit);
  client_.now = 6 * kMicrosPerHour;  // slack 2: halfway between x3 and x0.5.
  EXPECT_EQ(u.Price(Spec(), View()), 17'500'000);
  // Monotone: the factor never falls as time passes with the same work left.
  Ppm last = 0;
  for (Micros t = 0; t <= p.deadline; t += kMicrosPerHour / 4) {
    Ppm f = u.FactorAt(t);
    EXPECT_GE(f, last);
    last = f;
  }
}

TEST_F(StrategiesTest, LocalityBonusAppliesOnlyToAnchoredWantedNodes) {
  LocalityAware l(std::make_unique<FixedValue>(10 * kUnit), 200'000);
  NodeSpec s = Spec();
  EXPECT_EQ(l.Price(s, View()), 10 * kUnit);
  s.locality = market::Locality::kSameRack;
  s.rel_to = NodeId(3);
  EXPECT_EQ(l.Price(s, View()), 12 * kUnit);
  s.held = NodeId(9);
  EXPECT_EQ(l.Price(s, View(NodeId(9))), 10 * kUnit);
}

TEST_F(StrategiesTest, MigrationAwareDefendsHeldNodesByTheCostOfMoving) {
  Micros uncommitted = 0;
  MigrationAware::Params p;
  p.overhead = 6 * 60 * kMicrosPerSecond;  // 6 minutes = 0.1 h.
  p.uncommitted = [&] { return uncommitted; };
  MigrationAware m(std::make_unique<FixedValue>(10 * kUnit), p);
  NodeSpec held = Spec();
  held.held = NodeId(2);
  EXPECT_EQ(m.Price(held, View(NodeId(2))), 11 * kUnit);
  uncommitted = 24 * 60 * kMicrosPerSecond;  // +0.4 h.
  EXPECT_EQ(m.Price(held, View(NodeId(2))), 15 * kUnit);
  // A wanted node is priced at its plain value.
  EXPECT_EQ(m.Price(Spec(), View()), 10 * kUnit);
}

TEST_F(StrategiesTest, GangAwareValuesAHeldGangNodeAtTheWholeGang) {
  GangAware g(std::make_unique<FixedValue>(3 * kUnit));
  NodeSpec held = Spec();
  held.held = NodeId(1);
  EXPECT_EQ(g.Price(held, OrderBookView(&client_, VertexId(1), NodeId(1), 0, 4, 4)), 12 * kUnit);
  // Wanted nodes and single-node requests keep the per-node price.
  EXPECT_EQ(g.Price(Spec(), OrderBookView(&client_, VertexId(1), NodeId(), 0, 0, 4)), 3 * kUnit);
  EXPECT_EQ(g.Price(held, OrderBookView(&client_, VertexId(1), NodeId(1), 0, 1, 1)), 3 * kUnit);
}

TEST_F(StrategiesTest, OnDemandAndSpotLikeAreFlat) {
  auto od = OnDemandLike(40 * kUnit);
  auto spot = SpotLike(2 * kUnit);
  client_.quotes[1] = 100 * kUnit;
  EXPECT_EQ(od->Price(Spec(), View()), 40 * kUnit);
  EXPECT_EQ(spot->Price(Spec(), View()), 2 * kUnit);
}

}  // namespace
}  // namespace laissez::sdk
