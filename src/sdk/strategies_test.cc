#include "sdk/strategies.h"

#include <gtest/gtest.h>

#include "sdk/fake_market_client.h"

namespace laissez::sdk {
namespace {

constexpr Price kUnit = kMicroUnits;
constexpr Micros kMinute = 60 * kMicrosPerSecond;

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
  // Names match whole: not a prefix, not one differing in its last byte.
  EXPECT_EQ(t.Price(Spec("h10"), View()), std::nullopt);
  EXPECT_EQ(t.Price(Spec("h1000"), View()), std::nullopt);
  EXPECT_EQ(t.Price(Spec("h101"), View()), std::nullopt);
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
  // Regression: urgency used to switch on fully only at slack 1, when no move
  // fits any more. It is full from slack 1.5 (3 h left for 2 h of work).
  client_.now = 7 * kMicrosPerHour;
  EXPECT_EQ(u.Price(Spec(), View()), 30 * kUnit);
  client_.now = 6 * kMicrosPerHour + 30 * kMinute;  // slack 1.75: a sixth of the way to relaxed.
  EXPECT_EQ(u.Price(Spec(), View()), 25'833'340);
  // Monotone: the factor never falls as time passes with the same work left.
  Ppm last = 0;
  for (Micros t = 0; t <= p.deadline; t += kMicrosPerHour / 4) {
    Ppm f = u.FactorAt(t);
    EXPECT_GE(f, last);
    last = f;
  }
}

TEST_F(StrategiesTest, CostOfDelayBidsTheMarginalRetentionLossPerNode) {
  // A 2-node job of 4 h (estimate), 2 h in the system, 3 h of work left.
  CostOfDelay::Params p;
  p.value = 1000 * kUnit;
  p.speed_ppm = {{"h100", kPpm}, {"a100", 500'000}};
  p.arrival = 0;
  p.ideal = 4 * kMicrosPerHour;
  p.nodes = 2;
  Micros left = 3 * kMicrosPerHour;
  p.remaining = [&] { return left; };
  CostOfDelay c(p);
  client_.now = 2 * kMicrosPerHour;
  // On h100 it finishes at T = 2 + 3 = 5 h: an hour of delay costs 1000 x 4 / 25 = 160 for the job,
  // 80 per node.
  EXPECT_NEAR(c.DelayCostPerHour(client_.now, kPpm, /*held=*/true), 160.0 * kUnit, 1);
  EXPECT_EQ(c.Price(Spec("h100"), View()), 80 * kUnit);
  // On a100 (half speed) T = 2 + 6 = 8 h: 1000 x 4 / 64 x 0.5 / 2.
  EXPECT_EQ(c.Price(Spec("a100"), View()), 15'625'000);
  EXPECT_EQ(c.Price(Spec("l4"), View()), std::nullopt);
  // The bid falls as the job waits (T grows) and rises as it nears completion.
  client_.now = 4 * kMicrosPerHour;
  EXPECT_LT(*c.Price(Spec("h100"), View()), 80 * kUnit);
  client_.now = 2 * kMicrosPerHour;
  left = kMicrosPerHour;
  EXPECT_GT(*c.Price(Spec("h100"), View()), 80 * kUnit);
}

TEST_F(StrategiesTest, CostOfDelayDefendsAHeldNodeByTheMoveItWouldCost) {
  CostOfDelay::Params p;
  p.value = 1000 * kUnit;
  p.speed_ppm = {{"h100", kPpm}};
  p.ideal = 4 * kMicrosPerHour;
  p.nodes = 2;
  p.remaining = [] { return 2 * kMicrosPerHour; };
  Micros uncommitted = 0;
  p.uncommitted = [&] { return uncommitted; };
  p.overhead = 30 * kMinute;
  CostOfDelay c(p);
  client_.now = 2 * kMicrosPerHour;  // T = 4 h = D: a delay hour costs 1000 / 4 = 250.
  NodeSpec held = Spec();
  held.held = NodeId(3);
  // 250 / 2 per node, plus the whole job's move: 250 x 0.5 h over the 1 h amortization.
  EXPECT_EQ(c.Price(held, View(NodeId(3))), 250 * kUnit);
  uncommitted = 30 * kMinute;  // Work since the last checkpoint raises it.
  EXPECT_EQ(c.Price(held, View(NodeId(3))), 375 * kUnit);
  // A wanted node carries no premium, and pays for the restore in T.
  EXPECT_LT(*c.Price(Spec(), View()), 125 * kUnit);
}

TEST_F(StrategiesTest, CostOfDelayRampsDeadlineUrgencyBeforeSlackOne) {
  CostOfDelay::Params p;
  p.value = 1000 * kUnit;
  p.speed_ppm = {{"h100", kPpm}};
  p.ideal = 2 * kMicrosPerHour;
  p.remaining = [] { return 2 * kMicrosPerHour; };
  p.deadline = 3 * kMicrosPerHour;  // Slack 1.5 at time 0: full urgency (x3).
  CostOfDelay with(p);
  p.deadline = kNever;
  CostOfDelay without(p);
  EXPECT_EQ(*with.Price(Spec(), View()), 3 * *without.Price(Spec(), View()));
}

TEST_F(StrategiesTest, CostOfDelayPricesServedLoadBySpeed) {
  CostOfDelay::Params p;
  p.kind = CostOfDelay::Kind::kServing;
  p.value = 10 * kUnit;
  p.speed_ppm = {{"h100", kPpm}, {"a100", 250'000}};
  p.overhead = 6 * kMinute;
  CostOfDelay c(p);
  EXPECT_EQ(c.Price(Spec("a100"), View()), 2'500'000);
  NodeSpec held = Spec("h100");
  held.held = NodeId(1);
  EXPECT_EQ(c.Price(held, View(NodeId(1))), 11 * kUnit);  // 10 + 10 x 0.1 h.
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

TEST_F(StrategiesTest, LargeProductsAreExactBeyondSixtyFourBits) {
  // value x time and value x ppm overflow int64 here: the 128-bit path must
  // give the exact quotient, and saturate only at infinity.
  const Price big = 4'000'000 * kUnit;  // 4e12 micro-units per node-hour.
  MigrationAware::Params p;
  p.overhead = 10 * 60 * kMinute;  // 10 h: 4e12 x 3.6e10 us overflows.
  MigrationAware m(std::make_unique<FixedValue>(big), p);
  EXPECT_EQ(m.Premium(big), 10 * big);
  ThroughputValue t(kInfPrice / 2, {{"h100", 3 * kPpm}, {"a100", 1'500'001}});
  EXPECT_EQ(t.Price(Spec("h100"), View()), kInfPrice);
  EXPECT_EQ(t.Price(Spec("a100"), View()),
            static_cast<Price>(static_cast<__int128>(kInfPrice / 2) * 1'500'001 / kPpm));
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

// EconAdapter::Prefetch walks a tenant's strategy chain through inner() and
// ends at a table: every decorator names the strategy it wraps.
TEST_F(StrategiesTest, DecoratorsNameTheirInnerStrategyForPrefetching) {
  auto tv = std::make_unique<ThroughputValue>(10 * kUnit, std::unordered_map<std::string, Ppm>{{"h100", kPpm}});
  const PricingStrategy* base = tv.get();
  EXPECT_EQ(base->inner(), nullptr);
  // The whole table, not its first line: a type's entry may lie past it.
  EXPECT_EQ(base->table().size(), sizeof(std::pair<std::string, Ppm>));
  std::unique_ptr<PricingStrategy> s = std::move(tv);
  s = std::make_unique<DeadlineUrgency>(std::move(s), DeadlineUrgency::Params{});
  s = std::make_unique<LocalityAware>(std::move(s), 100'000);
  s = std::make_unique<GangAware>(std::move(s));
  s = std::make_unique<MigrationAware>(std::move(s), MigrationAware::Params{});
  s = std::make_unique<BudgetCapped>(std::move(s), 100 * kUnit);
  int depth = 0;
  const PricingStrategy* p = s.get();
  while (p->inner() != nullptr) {
    EXPECT_TRUE(p->table().empty());
    p = p->inner();
    ++depth;
  }
  EXPECT_EQ(p, base);
  EXPECT_EQ(depth, 5);
  EXPECT_EQ(FixedValue(kUnit).inner(), nullptr);
  EXPECT_TRUE(FixedValue(kUnit).table().empty());
}

TEST_F(StrategiesTest, OnDemandAndSpotLikeAreFlat) {
  auto od = OnDemandLike(40 * kUnit);
  auto spot = SpotLike(2 * kUnit);
  client_.quotes[1] = 100 * kUnit;
  EXPECT_EQ(od->Price(Spec(), View()), 40 * kUnit);
  EXPECT_EQ(spot->Price(Spec(), View()), 2 * kUnit);
}

TEST_F(StrategiesTest, NextChangeSaysWhenAnAnswerCanMoveWithTimeAlone) {
  const Micros now = 5 * kMicrosPerHour;
  NodeSpec wanted;
  wanted.node_type = "h100";
  NodeSpec held = wanted;
  held.held = NodeId(1);
  EXPECT_EQ(FixedValue(kUnit).NextChange(wanted, now), kNever);
  ThroughputValue tv(10 * kUnit, {{"h100", kPpm}});
  EXPECT_EQ(tv.NextChange(wanted, now), kNever);
  EXPECT_EQ(GangAware(std::make_unique<ThroughputValue>(tv)).NextChange(held, now), kNever);
  EXPECT_EQ(BudgetCapped(std::make_unique<ThroughputValue>(tv), kUnit).NextChange(wanted, now), kNever);
  // A user's callable may depend on anything: every tick.
  FunctionStrategy fn([](const NodeSpec&, const OrderBookView&) { return std::optional<Price>(kUnit); });
  EXPECT_EQ(fn.NextChange(wanted, now), now + 1);

  DeadlineUrgency::Params dp;
  dp.remaining = [] { return kMicrosPerHour; };
  EXPECT_EQ(DeadlineUrgency(std::make_unique<ThroughputValue>(tv), dp).NextChange(wanted, now), kNever);
  dp.deadline = 10 * kMicrosPerHour;
  EXPECT_EQ(DeadlineUrgency(std::make_unique<ThroughputValue>(tv), dp).NextChange(wanted, now), now + 1);

  MigrationAware::Params mp;
  mp.overhead = kMicrosPerHour / 10;
  EXPECT_EQ(MigrationAware(std::make_unique<ThroughputValue>(tv), mp).NextChange(held, now), kNever);
  mp.uncommitted = [] { return Micros{0}; };
  MigrationAware ma(std::make_unique<ThroughputValue>(tv), mp);
  EXPECT_EQ(ma.NextChange(held, now), now + 1);
  EXPECT_EQ(ma.NextChange(wanted, now), kNever);

  CostOfDelay::Params cp;
  cp.value = 1000 * kUnit;
  cp.speed_ppm = {{"h100", kPpm}};
  cp.ideal = kMicrosPerHour;
  EXPECT_EQ(CostOfDelay(cp).NextChange(wanted, now), now + 1);  // D / T^2 moves every minute.
  cp.kind = CostOfDelay::Kind::kServing;
  EXPECT_EQ(CostOfDelay(cp).NextChange(held, now), kNever);
}

}  // namespace
}  // namespace laissez::sdk
