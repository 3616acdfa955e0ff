// The 32-byte order record's rare paths (issue 12): a seq that no longer fits
// the 32-bit window beside the market's base (Impl::Seq, seq_apart_) and a
// gang count of 2^20 - 1 or more (Impl::Count, count_apart_). Reaching them
// honestly takes 2^31 raises or a million nodes; the seq test moves the
// market's next seq forward through EngineTestPeer instead, as a long-lived
// market's would be, and the count test builds the nodes.
#include <gtest/gtest.h>

#include <string>

#include "market/engine/engine_impl.h"
#include "market/market_engine.h"

namespace laissez::market {

struct EngineTestPeer {
  using Impl = MarketEngine::Impl;
  static Impl& Of(MarketEngine& e) { return *e.impl_; }
};

namespace {

constexpr Micros kSec = kMicrosPerSecond;
constexpr Price kUnit = kMicroUnits;

topology::NodeInfo NodeNamed(std::string name, std::string rack = "k1") {
  return topology::NodeInfo{std::move(name), "h100", "eu", "eu-1a", "r1", std::move(rack), {8, 640, 1000}};
}

TenantId NewTenant(MarketEngine& e, std::string name) {
  auto r = e.CreateTenant(e.now(), std::move(name), 1'000'000'000 * kUnit);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

// One h100 node held by `holder` (at 10 an hour), and two tenants to bid
// below it.
struct HeldNode {
  MarketEngine engine{MarketParams{}};
  EngineTestPeer::Impl& m = EngineTestPeer::Of(engine);
  NodeId n = *engine.AddNode(0, NodeNamed("n1"));
  VertexId h100 = *engine.topology().FindVertex("h100");
  TenantId holder = NewTenant(engine, "holder"), a = NewTenant(engine, "a"), b = NewTenant(engine, "b");
  HeldNode() { EXPECT_TRUE(engine.PlaceOrder(0, holder, OrderSpec{h100, 10 * kUnit}).ok()); }
};

// An order whose seq falls below the base when a later seq moves it keeps its
// seq (apart), its time priority over a newer order at the same price, and
// both through a snapshot's round trip; its slot, reused, drops the entry.
TEST(EngineRecordTest, ASeqApartKeepsItsPriorityAndItsSnapshot) {
  HeldNode x;
  auto& [engine, m, n, h100, holder, a, b] = x;
  ASSERT_EQ(engine.GetNode(n)->holder, holder);
  auto older = engine.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit});
  ASSERT_TRUE(older.ok());
  const uint64_t older_seq = engine.GetOrder(*older)->seq;
  // A market 2^33 seqs later: the next seq is past the window, so it moves
  // the base up and the older order's seq no longer fits.
  m.next_seq_ = older_seq + (uint64_t{1} << 33);
  auto newer = engine.PlaceOrder(2 * kSec, b, OrderSpec{h100, 5 * kUnit});
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ(m.orders_[m.FindSlot(older->value)].seq_rel, Order::kSeqApart);
  EXPECT_NE(m.orders_[m.FindSlot(newer->value)].seq_rel, Order::kSeqApart);
  EXPECT_EQ(engine.GetOrder(*older)->seq, older_seq);
  EXPECT_EQ(engine.GetOrder(*newer)->seq, older_seq + (uint64_t{1} << 33));

  const std::string image = engine.Snapshot();
  MarketEngine restored{MarketParams{}};
  ASSERT_TRUE(restored.Restore(image).ok());
  EXPECT_EQ(restored.Snapshot(), image);
  EXPECT_EQ(restored.GetOrder(*older)->seq, older_seq);
  const EngineTestPeer::Impl& rm = EngineTestPeer::Of(restored);
  EXPECT_EQ(rm.orders_[rm.FindSlot(older->value)].seq_rel, Order::kSeqApart);

  // Freed, the node goes to the older order, in both engines.
  for (MarketEngine* e : {&engine, &restored}) {
    ASSERT_TRUE(e->Relinquish(3 * kSec, holder, n).ok());
    EXPECT_EQ(e->GetNode(n)->holder, a);
    EXPECT_FALSE(e->GetOrder(*older).ok());  // Filled.
    EXPECT_TRUE(e->GetOrder(*newer).ok());
  }
  // A raise gives the newer order a new seq in the window; the slots reused
  // by new orders drop their entries.
  ASSERT_TRUE(engine.UpdateOrder(4 * kSec, b, *newer, 6 * kUnit).ok());
  EXPECT_EQ(engine.GetOrder(*newer)->seq, older_seq + (uint64_t{1} << 33) + 1);
  ASSERT_TRUE(engine.PlaceOrder(5 * kSec, holder, OrderSpec{h100, 1 * kUnit}).ok());
  ASSERT_TRUE(engine.PlaceOrder(5 * kSec, holder, OrderSpec{h100, 1 * kUnit}).ok());
  EXPECT_EQ(m.seq_apart_.size(), 0u);
}

// An image whose live order holds a seq at or past the image's next seq
// (here: next_seq_ moved back below it before the snapshot) is refused, as
// the next order placed would share that seq; the engine restored into is
// left as it was.
TEST(EngineRecordTest, AnImagesSeqPastItsNextSeqIsRefused) {
  MarketEngine engine{MarketParams{}};
  EngineTestPeer::Impl& m = EngineTestPeer::Of(engine);
  ASSERT_TRUE(engine.AddNode(0, NodeNamed("n1")).ok());
  VertexId h100 = *engine.topology().FindVertex("h100");
  TenantId holder = NewTenant(engine, "holder"), a = NewTenant(engine, "a");
  ASSERT_TRUE(engine.PlaceOrder(0, holder, OrderSpec{h100, 10 * kUnit}).ok());
  m.next_seq_ = uint64_t{1} << 40;
  auto far = engine.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit});
  ASSERT_TRUE(far.ok());
  const std::string honest = engine.Snapshot();
  m.next_seq_ = 7;
  const std::string image = engine.Snapshot();

  MarketEngine target{MarketParams{}};
  ASSERT_TRUE(target.Restore(honest).ok());
  Status refused = target.Restore(image);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("order " + std::to_string(far->value) + ": seq " +
                                   std::to_string(uint64_t{1} << 40) + " is live, but the next seq is 7"),
            std::string::npos)
      << refused.ToString();
  EXPECT_EQ(target.Snapshot(), honest);
}

// A raise that finds the next seq past the window moves the base: an older
// order falls apart and keeps its time priority, the raised order takes the
// next seq in the window. (That the base moves before the raise changes
// anything is alloc_fail_test.cc's ARebaseByARaiseThatFailsLeavesEverySeq.)
TEST(EngineRecordTest, ARaiseMovesTheBase) {
  HeldNode x;
  auto& [engine, m, n, h100, holder, a, b] = x;
  ASSERT_EQ(engine.GetNode(n)->holder, holder);
  auto older = engine.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit});
  auto raised = engine.PlaceOrder(kSec, b, OrderSpec{h100, 4 * kUnit});
  ASSERT_TRUE(older.ok() && raised.ok());
  const uint64_t older_seq = engine.GetOrder(*older)->seq;
  const uint64_t base_before = m.seq_base_;
  m.next_seq_ = older_seq + (uint64_t{1} << 33);
  ASSERT_TRUE(engine.UpdateOrder(2 * kSec, b, *raised, 5 * kUnit).ok());
  EXPECT_GT(m.seq_base_, base_before);
  EXPECT_EQ(m.orders_[m.FindSlot(older->value)].seq_rel, Order::kSeqApart);
  EXPECT_NE(m.orders_[m.FindSlot(raised->value)].seq_rel, Order::kSeqApart);
  EXPECT_EQ(engine.GetOrder(*older)->seq, older_seq);
  EXPECT_EQ(engine.GetOrder(*raised)->seq, older_seq + (uint64_t{1} << 33));
  // Both at 5: the node, freed, goes to the older order.
  ASSERT_TRUE(engine.Relinquish(3 * kSec, holder, n).ok());
  EXPECT_EQ(engine.GetNode(n)->holder, a);
}

// A restored engine's base is not the original's (it sits where a rebase at
// the image's next seq would put it), yet the same calls after the restore
// give the same seqs, the same fills and the same image.
TEST(EngineRecordTest, ARestoredEngineGivesTheSameSeqsThoughItsBaseDiffers) {
  HeldNode x;
  auto& [engine, m, n, h100, holder, a, b] = x;
  ASSERT_EQ(engine.GetNode(n)->holder, holder);
  auto older = engine.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit});
  ASSERT_TRUE(older.ok());
  const uint64_t older_seq = engine.GetOrder(*older)->seq;
  // Two seqs before the end of the original's window (its base is 0): its
  // third placement below moves its base. The restored engine's base sits
  // where a rebase at this next seq would put it, so it moves none.
  ASSERT_EQ(m.seq_base_, 0u);
  m.next_seq_ = Order::kSeqApart - 2;
  MarketEngine restored{MarketParams{}};
  ASSERT_TRUE(restored.Restore(engine.Snapshot()).ok());
  const uint64_t restored_base = EngineTestPeer::Of(restored).seq_base_;
  EXPECT_GT(restored_base, 0u);
  for (MarketEngine* e : {&engine, &restored}) {
    for (int i = 0; i < 4; ++i) {
      auto placed = e->PlaceOrder(2 * kSec, b, OrderSpec{h100, 5 * kUnit});
      ASSERT_TRUE(placed.ok()) << placed.status().ToString();
      EXPECT_EQ(e->GetOrder(*placed)->seq, uint64_t{Order::kSeqApart} - 2 + i);
    }
    EXPECT_EQ(e->GetOrder(*older)->seq, older_seq);
  }
  EXPECT_GT(m.seq_base_, 0u);
  EXPECT_EQ(EngineTestPeer::Of(restored).seq_base_, restored_base);
  EXPECT_EQ(restored.Snapshot(), engine.Snapshot());
  for (MarketEngine* e : {&engine, &restored}) {
    ASSERT_TRUE(e->Relinquish(3 * kSec, holder, n).ok());
    EXPECT_EQ(e->GetNode(n)->holder, a);
  }
  EXPECT_EQ(restored.Snapshot(), engine.Snapshot());
}

// A gang of more nodes than the record's 20 bits count keeps its count
// apart: its view, its commitment (given back in full by a cancel) and a
// snapshot's round trip. A floor above its price keeps it resting.
TEST(EngineRecordTest, AGangCountApartKeepsItsCount) {
  MarketEngine engine{MarketParams{}};
  EngineTestPeer::Impl& m = EngineTestPeer::Of(engine);
  constexpr uint32_t kCount = (uint32_t{1} << 20) + 5;
  for (uint32_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(engine.AddNode(0, NodeNamed("n" + std::to_string(i), "k" + std::to_string(i / 64))).ok());
  }
  StaticFloorSpec floor;
  floor.target.location = *engine.topology().FindLocation("eu");
  floor.price = 2 * kUnit;
  ASSERT_TRUE(engine.AddPolicy(0, floor).ok());
  VertexId h100 = *engine.topology().FindVertex("h100");
  TenantId a = NewTenant(engine, "a");
  const Price committed_before = engine.GetTenant(a)->committed_rate;
  auto gang = engine.PlaceOrder(kSec, a, OrderSpec{h100, 1 * kUnit, kCount});
  ASSERT_TRUE(gang.ok()) << gang.status().ToString();
  EXPECT_EQ(engine.GetOrder(*gang)->spec.count, kCount);
  EXPECT_EQ(engine.GetOrder(*gang)->filled, 0u);
  EXPECT_EQ(m.count_apart_.size(), 1u);
  EXPECT_EQ(engine.GetTenant(a)->committed_rate, committed_before + Price{kCount} * kUnit);

  const std::string image = engine.Snapshot();
  MarketEngine restored{MarketParams{}};
  ASSERT_TRUE(restored.Restore(image).ok());
  EXPECT_EQ(restored.Snapshot(), image);
  EXPECT_EQ(restored.GetOrder(*gang)->spec.count, kCount);
  for (MarketEngine* e : {&engine, &restored}) {
    ASSERT_TRUE(e->CancelOrder(2 * kSec, a, *gang).ok());
    EXPECT_EQ(e->GetTenant(a)->committed_rate, committed_before);
    // The slot, reused by a single order, drops the entry.
    auto one = e->PlaceOrder(3 * kSec, a, OrderSpec{h100, 1 * kUnit});
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(e->GetOrder(*one)->spec.count, 1u);
    EXPECT_EQ(EngineTestPeer::Of(*e).count_apart_.size(), 0u);
  }
}

}  // namespace
}  // namespace laissez::market
