#include "sdk/econ_adapter.h"

#include <gtest/gtest.h>

#include "sdk/fake_market_client.h"
#include "sdk/strategies.h"

namespace laissez::sdk {
namespace {

constexpr Price kUnit = kMicroUnits;

market::Event Alloc(TenantId t, OrderId o, NodeId n, Price p) {
  market::Event e;
  e.type = market::EventType::kAllocated;
  e.tenant = t;
  e.order = o;
  e.node = n;
  e.price = p;
  return e;
}

class RecordingListener : public AdapterListener {
 public:
  void OnNodeGained(RequestId, NodeId n, Price) override { gained.push_back(n.value); }
  void OnNodeLost(RequestId, NodeId n, uint8_t) override { lost.push_back(n.value); }
  void OnNotice(RequestId, NodeId n, Micros, Price, uint8_t) override { notices.push_back(n.value); }
  std::vector<uint32_t> gained, lost, notices;
};

class EconAdapterTest : public ::testing::Test {
 protected:
  EconAdapterTest() {
    client_.vertices["h100"] = 1;
    client_.vertices["a100"] = 2;
    client_.quotes[1] = 12 * kUnit;
    client_.quotes[2] = 3 * kUnit;
  }
  Request TwoOptions(uint32_t count, bool gang = true) {
    Request r;
    NodeSpec h, a;
    h.node_type = "h100";
    a.node_type = "a100";
    r.options = {h, a};
    r.count = count;
    r.gang = gang;
    return r;
  }
  FakeMarketClient client_;
  ThroughputValue value_{10 * kUnit, {{"h100", kPpm}, {"a100", 500'000}}};
  RecordingListener listener_;
};

TEST_F(EconAdapterTest, RejectsEmptyOrUnknownRequests) {
  EconAdapter a(&client_, &value_);
  EXPECT_EQ(a.Add(Request{}).status().code(), StatusCode::kInvalidArgument);
  Request zero = TwoOptions(0);
  EXPECT_EQ(a.Add(zero).status().code(), StatusCode::kInvalidArgument);
  Request unknown = TwoOptions(1);
  unknown.options[0].node_type = "tpu";
  EXPECT_EQ(a.Add(unknown).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EconAdapterTest, KeepsEachOptionOnceInThePricedBuffer) {
  EconAdapter a(&client_, &value_, &listener_);
  Request r = TwoOptions(2);
  r.options[0].locality = market::Locality::kSameRow;
  r.options[1].meta["tier"] = "spot";
  auto id = a.Add(std::move(r));
  ASSERT_TRUE(id.ok());
  const auto* rs = a.request(*id);
  ASSERT_NE(rs, nullptr);
  // The options moved into the round's buffer; the request keeps its count and flags only.
  EXPECT_TRUE(rs->request.options.empty());
  EXPECT_EQ(rs->request.count, 2u);
  ASSERT_EQ(rs->priced.size(), 2u);
  EXPECT_EQ(rs->priced[0].spec.node_type, "h100");
  EXPECT_EQ(rs->priced[0].scope, VertexId(1));
  EXPECT_EQ(rs->priced[0].locality, market::Locality::kSameRow);
  EXPECT_EQ(rs->priced[1].spec.node_type, "a100");
  EXPECT_EQ(rs->priced[1].spec.meta.at("tier"), "spot");
  EXPECT_EQ(rs->priced[1].scope, VertexId(2));
}

TEST_F(EconAdapterTest, BidsOnTheObtainableOptionWithTheLargestSurplusAsOneGang) {
  EconAdapter a(&client_, &value_);
  auto id = a.Add(TwoOptions(4));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(a.Reprice().ok());
  // h100 is worth 10 but costs 12 (not obtainable); a100 is worth 5 at 3.
  ASSERT_EQ(client_.calls.size(), 1u);
  EXPECT_EQ(client_.calls[0].op, "place");
  EXPECT_EQ(client_.calls[0].scope, VertexId(2));
  EXPECT_EQ(client_.calls[0].count, 4u);
  EXPECT_EQ(client_.calls[0].price, 5 * kUnit);
  EXPECT_FALSE(a.dirty());
  // Repricing with nothing changed makes no call.
  a.MarkDirty();
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_EQ(client_.calls.size(), 1u);
}

TEST_F(EconAdapterTest, SwitchesOptionWhenPricesMove) {
  EconAdapter a(&client_, &value_);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  client_.quotes[1] = 4 * kUnit;  // h100 now leaves 6 of surplus, a100 2.
  a.MarkDirty();
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_EQ(client_.calls.size(), 3u);
  EXPECT_EQ(client_.calls[1].op, "cancel");
  EXPECT_EQ(client_.calls[2].op, "place");
  EXPECT_EQ(client_.calls[2].scope, VertexId(1));
}

TEST_F(EconAdapterTest, TracksHoldingsFromEventsAndSetsRetentionLimits) {
  MigrationAware::Params p;
  p.overhead = 6 * 60 * kMicrosPerSecond;
  MigrationAware strategy(std::make_unique<ThroughputValue>(value_), p);
  EconAdapter a(&client_, &strategy, &listener_);
  auto id = a.Add(TwoOptions(2));
  ASSERT_TRUE(a.Reprice().ok());
  OrderId order(client_.calls[0].id);
  market::Event events[] = {Alloc(client_.tenant(), order, NodeId(5), 5 * kUnit),
                            Alloc(client_.tenant(), order, NodeId(6), 5 * kUnit),
                            Alloc(TenantId(99), OrderId(1), NodeId(7), kUnit)};
  a.OnEvents(events);
  EXPECT_EQ(listener_.gained, (std::vector<uint32_t>{5, 6}));
  EXPECT_EQ(a.held_count(), 2u);
  EXPECT_EQ(a.RequestOf(NodeId(6)), *id);
  EXPECT_TRUE(a.request(*id)->orders.empty());
  EXPECT_TRUE(a.dirty());
  client_.calls.clear();
  ASSERT_TRUE(a.Reprice().ok());
  // Held nodes get value + 10% (0.1 h of overhead per hour): 5.5 each.
  ASSERT_EQ(client_.calls.size(), 2u);
  EXPECT_EQ(client_.calls[0].op, "limit");
  EXPECT_EQ(client_.calls[0].price, 5'500'000);

  // Losing one node makes the adapter bid for one replacement of the same type.
  market::Event rel;
  rel.type = market::EventType::kReleased;
  rel.tenant = client_.tenant();
  rel.node = NodeId(6);
  rel.reasons = market::kReasonOutbid;
  a.OnEvents({&rel, 1});
  EXPECT_EQ(listener_.lost, (std::vector<uint32_t>{6}));
  client_.calls.clear();
  client_.quotes[1] = 1;  // h100 is now far better, but the request is on a100.
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_EQ(client_.calls.size(), 1u);
  EXPECT_EQ(client_.calls[0].op, "place");
  EXPECT_EQ(client_.calls[0].scope, VertexId(2));
  EXPECT_EQ(client_.calls[0].count, 1u);
}

TEST_F(EconAdapterTest, NonGangRequestsPlaceOneOrderPerMissingNodeAndShrinkOnResize) {
  EconAdapter a(&client_, &value_, &listener_);
  auto id = a.Add(TwoOptions(3, /*gang=*/false));
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_EQ(client_.calls.size(), 3u);
  for (const auto& c : client_.calls) EXPECT_EQ(c.count, 1u);
  market::Event e = Alloc(client_.tenant(), OrderId(client_.calls[0].id), NodeId(1), 5 * kUnit);
  a.OnEvents({&e, 1});
  EXPECT_EQ(a.request(*id)->orders.size(), 2u);
  // Shrinking to one: the two open orders are cancelled on the next reprice.
  ASSERT_TRUE(a.Resize(*id, 1).ok());
  client_.calls.clear();
  ASSERT_TRUE(a.Reprice().ok());
  int cancels = 0;
  for (const auto& c : client_.calls) cancels += c.op == "cancel";
  EXPECT_EQ(cancels, 2);
  // Shrinking below the held count relinquishes.
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  EXPECT_EQ(a.Resize(*id, 0).code(), StatusCode::kInvalidArgument);
}

// Regression: a fleet holding a100 nodes could only ever bid for a100 (one
// request, one type), so it sat short of capacity while h100 was for sale.
TEST_F(EconAdapterTest, MixedTypeRequestsBidOnEveryOptionWhileHolding) {
  EconAdapter a(&client_, &value_, &listener_);
  Request r = TwoOptions(2, /*gang=*/false);
  r.mixed_types = true;
  auto id = a.Add(r);
  ASSERT_TRUE(id.ok());
  client_.quotes[1] = kInfPrice;  // Only a100 can be had at first.
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_EQ(client_.calls.size(), 2u);
  EXPECT_EQ(client_.calls[0].scope, VertexId(2));
  market::Event e = Alloc(client_.tenant(), OrderId(client_.calls[0].id), NodeId(5), 5 * kUnit);
  a.OnEvents({&e, 1});
  // h100 becomes obtainable with a larger surplus: the missing node's bid moves there.
  client_.quotes[1] = 4 * kUnit;
  client_.calls.clear();
  ASSERT_TRUE(a.Reprice().ok());
  bool placed_h100 = false;
  for (const auto& c : client_.calls) placed_h100 |= c.op == "place" && c.scope == VertexId(1);
  EXPECT_TRUE(placed_h100);
  market::Event e2 = Alloc(client_.tenant(), OrderId(client_.calls.back().id), NodeId(9), 10 * kUnit);
  a.OnEvents({&e2, 1});
  ASSERT_EQ(a.request(*id)->nodes.size(), 2u);
  // Each held node keeps its own type's limit: a100 at 5, h100 at 10.
  client_.calls.clear();
  ASSERT_TRUE(a.Reprice().ok());
  for (const auto& c : client_.calls) EXPECT_NE(c.op, "limit") << "limits already match each node's type";
  EXPECT_EQ(a.request(*id)->nodes[0].option, 1);
  EXPECT_EQ(a.request(*id)->nodes[1].option, 0);
  // Without mixed_types the same situation keeps bidding on the held type only.
  EconAdapter single(&client_, &value_, &listener_);
  auto sid = single.Add(TwoOptions(2, /*gang=*/false));
  client_.quotes[1] = kInfPrice;
  ASSERT_TRUE(single.Reprice().ok());
  uint64_t order = client_.calls.back().id;
  market::Event e3 = Alloc(client_.tenant(), OrderId(order), NodeId(11), 5 * kUnit);
  single.OnEvents({&e3, 1});
  client_.quotes[1] = 4 * kUnit;
  client_.calls.clear();
  ASSERT_TRUE(single.Reprice().ok());
  for (const auto& c : client_.calls) EXPECT_FALSE(c.op == "place" && c.scope == VertexId(1));
  // Gangs cannot mix types.
  Request g = TwoOptions(2);
  g.mixed_types = true;
  EXPECT_EQ(a.Add(g).status().code(), StatusCode::kInvalidArgument);
  (void)sid;
}

TEST_F(EconAdapterTest, WithdrawsWhenTheStrategyWantsNothing) {
  FunctionStrategy none([](const NodeSpec&, const OrderBookView&) { return std::optional<Price>(); });
  EconAdapter a(&client_, &none);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_TRUE(client_.calls.empty());
}

TEST_F(EconAdapterTest, ReportsRejectedOrdersAndKeepsGoing) {
  client_.reject_orders = true;
  EconAdapter a(&client_, &value_);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  Status s = a.Reprice();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.stats().rejected, 1u);
  EXPECT_FALSE(a.dirty());
}

TEST_F(EconAdapterTest, NoticesReachTheListener) {
  EconAdapter a(&client_, &value_, &listener_);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  market::Event e = Alloc(client_.tenant(), OrderId(client_.calls[0].id), NodeId(3), 5 * kUnit);
  a.OnEvents({&e, 1});
  market::Event n;
  n.type = market::EventType::kNotice;
  n.tenant = client_.tenant();
  n.node = NodeId(3);
  n.deadline = 120 * kMicrosPerSecond;
  a.OnEvents({&n, 1});
  EXPECT_EQ(listener_.notices, (std::vector<uint32_t>{3}));
}

// ---- Re-pricing only what changed (NeedsReprice) ----

constexpr Micros kMinute = 60 * kMicrosPerSecond;

TEST_F(EconAdapterTest, NothingChangedAndNoTimerMeansNoReprice) {
  EconAdapter a(&client_, &value_);
  ASSERT_TRUE(a.Add(TwoOptions(2)).ok());
  EXPECT_TRUE(a.NeedsReprice(0));  // A new request is dirty.
  ASSERT_TRUE(a.Reprice().ok());
  // ThroughputValue does not depend on time and the quotes it bid against hold.
  for (Micros t = kMinute; t <= 10 * kMinute; t += kMinute) {
    client_.now = t;
    EXPECT_FALSE(a.NeedsReprice(t)) << "at " << t;
  }
  EXPECT_EQ(a.stats().reprices_skipped, 10u);
}

TEST_F(EconAdapterTest, AWatchedQuoteThatMovesTriggersAReprice) {
  EconAdapter a(&client_, &value_);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  client_.now = kMinute;
  ASSERT_FALSE(a.NeedsReprice(client_.now));
  client_.quotes[1] = 4 * kUnit;  // The h100 quote the bid was chosen against moves.
  EXPECT_TRUE(a.NeedsReprice(client_.now));
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_EQ(client_.calls.back().scope, VertexId(1));  // And the re-price acts on it.
  EXPECT_FALSE(a.NeedsReprice(client_.now));
  // A vertex the tenant never read does not wake it.
  client_.quotes[9] = kUnit;
  EXPECT_FALSE(a.NeedsReprice(client_.now));
}

TEST(BookReadsTest, KeepsEveryDistinctPriceAVertexHadWithinARound) {
  // A tenant's later request may read a quote its earlier request's order
  // moved: the round used both prices, so both are watched.
  BookReads reads;
  reads.Quoted(VertexId(2), 3 * kUnit);
  reads.Quoted(VertexId(2), 3 * kUnit);
  reads.Quoted(VertexId(2), 4 * kUnit);
  reads.Quoted(VertexId(1), 3 * kUnit);
  EXPECT_EQ(reads.quotes, (std::vector<std::pair<VertexId, Price>>{
                              {VertexId(2), 3 * kUnit}, {VertexId(2), 4 * kUnit}, {VertexId(1), 3 * kUnit}}));
}

TEST_F(EconAdapterTest, OwnEventsTriggerAReprice) {
  EconAdapter a(&client_, &value_, &listener_);
  auto id = a.Add(TwoOptions(1));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_FALSE(a.NeedsReprice(kMinute));
  market::Event e = Alloc(client_.tenant(), OrderId(client_.calls[0].id), NodeId(3), 5 * kUnit);
  a.OnEvents({&e, 1});
  EXPECT_TRUE(a.NeedsReprice(kMinute));
  // Another tenant's event does not.
  ASSERT_TRUE(a.Reprice().ok());
  market::Event other = Alloc(TenantId(99), OrderId(1), NodeId(4), kUnit);
  a.OnEvents({&other, 1});
  EXPECT_FALSE(a.NeedsReprice(2 * kMinute));
  // A resize (what the simulator's fleet autoscaler does) is the tenant's own change too.
  ASSERT_TRUE(a.Resize(*id, 2).ok());
  EXPECT_TRUE(a.NeedsReprice(2 * kMinute));
}

TEST_F(EconAdapterTest, AStrategyWithoutTheHookIsRepricedEveryTick) {
  FunctionStrategy fn([](const NodeSpec&, const OrderBookView&) { return std::optional<Price>(5 * kUnit); });
  EconAdapter a(&client_, &fn);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  for (Micros t = kMinute; t <= 3 * kMinute; t += kMinute) {
    client_.now = t;
    EXPECT_TRUE(a.NeedsReprice(t));
    ASSERT_TRUE(a.Reprice().ok());
  }
  EXPECT_EQ(a.stats().reprices_skipped, 0u);
}

TEST_F(EconAdapterTest, TheStrategysTimerTriggersARepriceWhenDue) {
  // Worth 5 until 10 minutes, then 6: the strategy says when it changes.
  class Step final : public PricingStrategy {
   public:
    std::optional<laissez::Price> Price(const NodeSpec&, const OrderBookView& b) override {
      return b.now() < 10 * kMinute ? 5 * kUnit : 6 * kUnit;
    }
    Micros NextChange(const NodeSpec&, Micros now) const override { return now < 10 * kMinute ? 10 * kMinute : kNever; }
  } step;
  EconAdapter a(&client_, &step);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  client_.now = 9 * kMinute;
  EXPECT_FALSE(a.NeedsReprice(client_.now));
  client_.now = 10 * kMinute;
  ASSERT_TRUE(a.NeedsReprice(client_.now));
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_EQ(client_.calls.back().op, "update");
  EXPECT_EQ(client_.calls.back().price, 6 * kUnit);
  client_.now = 100 * kMinute;
  EXPECT_FALSE(a.NeedsReprice(client_.now));
}

TEST_F(EconAdapterTest, ReadsTheAdapterCannotWatchAndRejectionsRepriceEveryTick) {
  BudgetCapped capped(std::make_unique<ThroughputValue>(value_), 100 * kUnit, kMicrosPerHour);  // Reads the balance.
  client_.balance = 1000 * kUnit;
  EconAdapter a(&client_, &capped);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_TRUE(a.NeedsReprice(kMinute));

  client_.reject_orders = true;
  EconAdapter b(&client_, &value_);
  ASSERT_TRUE(b.Add(TwoOptions(1)).ok());
  EXPECT_FALSE(b.Reprice().ok());
  EXPECT_TRUE(b.NeedsReprice(kMinute));  // The order is still missing: try again.
}

TEST_F(EconAdapterTest, HeldNodesOfAMigrationAwareTenantRepriceWhileWorkIsUncommitted) {
  Micros uncommitted = 0;
  MigrationAware::Params p;
  p.overhead = 6 * kMinute;
  p.uncommitted = [&] { return uncommitted; };
  MigrationAware strategy(std::make_unique<ThroughputValue>(value_), p);
  EconAdapter a(&client_, &strategy);
  ASSERT_TRUE(a.Add(TwoOptions(1)).ok());
  ASSERT_TRUE(a.Reprice().ok());
  EXPECT_FALSE(a.NeedsReprice(kMinute));  // Bidding: the premium is only on held nodes.
  market::Event e = Alloc(client_.tenant(), OrderId(client_.calls[0].id), NodeId(3), 5 * kUnit);
  a.OnEvents({&e, 1});
  ASSERT_TRUE(a.Reprice().ok());
  client_.calls.clear();
  uncommitted = 6 * kMinute;
  client_.now = kMinute;
  ASSERT_TRUE(a.NeedsReprice(client_.now));
  ASSERT_TRUE(a.Reprice().ok());
  ASSERT_EQ(client_.calls.size(), 1u);
  EXPECT_EQ(client_.calls[0].op, "limit");
  EXPECT_EQ(client_.calls[0].price, 6 * kUnit);  // 5 + 5 x 12 min / 1 h.
}

}  // namespace
}  // namespace laissez::sdk
