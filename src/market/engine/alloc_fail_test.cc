// Allocation failures (issue 12, review): a std::bad_alloc inside the engine's
// tables or inside an update leaves what it touched usable. This binary
// replaces the global operator new (only here) with one that fails the n-th
// allocation once armed, and the tests arm it at every allocation in turn.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "market/engine/engine_impl.h"
#include "market/market_engine.h"

namespace {
long g_fail_in = -1;  // Allocations to let through before one fails; -1: none fails.
}  // namespace

void* operator new(std::size_t n) {
  if (g_fail_in == 0) {
    g_fail_in = -1;
    throw std::bad_alloc();
  }
  if (g_fail_in > 0) --g_fail_in;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// The nothrow form (std::stable_sort's buffer, which falls back to sorting in place) neither
// counts nor fails: its caller swallows the failure, which would disarm the count unseen.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n == 0 ? 1 : n); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace laissez::market {

struct EngineTestPeer {
  using Impl = MarketEngine::Impl;
  static Impl& Of(MarketEngine& e) { return *e.impl_; }
};

namespace {

using engine_internal::SlotTable;

// A growth whose allocation fails leaves every entry findable (it emptied the
// table when the old buckets were let go before the new ones were allocated).
TEST(AllocationFailure, AGrowthThatFailsLeavesTheSlotTableAsItWas) {
  SlotTable<Price, 1, 2> table;
  auto key_of = [](uint32_t s) { return uint64_t{s}; };
  int failed = 0;
  for (uint32_t s = 0; s < 1000; ++s) {
    g_fail_in = 0;  // The insert's first allocation, if it makes one, fails.
    try {
      table.Insert(s, key_of, Price{s} * 10);
    } catch (const std::bad_alloc&) {
      ++failed;
      g_fail_in = -1;
      ASSERT_EQ(table.size(), s);
      for (uint32_t q = 0; q < s; ++q) {
        size_t b = table.Bucket(q, key_of);
        ASSERT_NE(b, (SlotTable<Price, 1, 2>::kNone)) << "slot " << q << " lost by a failed growth at " << s;
        ASSERT_EQ(table.value_at(b), Price{q} * 10);
      }
      table.Insert(s, key_of, Price{s} * 10);
    }
    g_fail_in = -1;
  }
  EXPECT_GT(failed, 5);  // Every growth was made to fail once.
}

constexpr Micros kSec = kMicrosPerSecond;
constexpr Price kUnit = kMicroUnits;

// One h100 node n0 and two funded tenants, a and b.
struct OneNodeMarket {
  MarketEngine engine{MarketParams{}};
  TenantId a, b;
  VertexId h100;
  OneNodeMarket() {
    EXPECT_TRUE(engine.AddNode(0, topology::NodeInfo{"n0", "h100", "eu", "eu-1a", "r1", "k1", {8, 640, 1000}}).ok());
    a = *engine.CreateTenant(0, "a", 1'000'000 * kUnit);
    b = *engine.CreateTenant(0, "b", 1'000'000 * kUnit);
    h100 = *engine.topology().FindVertex("h100");
  }
};

// An update that throws part-way (an allocation anywhere inside it) leaves
// its order a requested price, the old or the new, and a later update of
// another order does not turn it into none (-1): the update's in-flight
// price is ended however the update ends (Impl::Update).
TEST(AllocationFailure, AnUpdateThatThrowsLeavesItsOrderARequestedPrice) {
  int threw = 0;
  for (long k = 0;; ++k) {
    OneNodeMarket mk;
    MarketEngine& e = mk.engine;
    const TenantId a = mk.a, b = mk.b;
    const VertexId h100 = mk.h100;
    ASSERT_TRUE(e.PlaceOrder(0, a, OrderSpec{h100, 20 * kUnit}).ok());  // a holds n0.
    MarketParams p;
    p.clip_alpha_ppm = 100'000;
    p.clip_interval = 60 * kSec;
    ASSERT_TRUE(e.SetParams(kSec, p).ok());
    auto o1 = e.PlaceOrder(2 * kSec, b, OrderSpec{h100, 5 * kUnit});
    auto o2 = e.PlaceOrder(2 * kSec, b, OrderSpec{h100, 6 * kUnit});
    ASSERT_TRUE(o1.ok() && o2.ok());
    bool failed = false;
    g_fail_in = k;
    try {
      (void)e.UpdateOrder(3 * kSec, b, *o1, 12 * kUnit);  // A raise, clipped: its price stays apart.
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    g_fail_in = -1;
    if (!failed) break;  // Past the update's last allocation.
    ++threw;
    (void)e.UpdateOrder(4 * kSec, b, *o2, 7 * kUnit);
    auto v = e.GetOrder(*o1);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->spec.price == 5 * kUnit || v->spec.price == 12 * kUnit)
        << "allocation " << k << ": requested price " << v->spec.price;
  }
  EXPECT_GT(threw, 0);
}

// A call whose new seq moves the seqs' base (Impl::RebaseSeqs), with an
// allocation of the rebase failing: every order keeps its seq. The slots
// alternate between older orders, whose seqs go apart, and newer ones, whose
// offsets are rewritten, so a rebase that failed part-way would leave some
// offsets measured from a base that never moved. The rebase makes its room
// before it rewrites anything, and runs before the call changes anything.
// `raise`: the call is a raise of the first newer order (which takes the new
// seq once it succeeds); else a placement.
void ExpectARebaseThatFailsLeavesEverySeq(bool raise) {
  int threw = 0;
  for (long k = 0;; ++k) {
    OneNodeMarket mk;
    MarketEngine& e = mk.engine;
    EngineTestPeer::Impl& m = EngineTestPeer::Of(e);
    const TenantId a = mk.a, b = mk.b;
    const VertexId h100 = mk.h100;
    ASSERT_TRUE(e.PlaceOrder(0, a, OrderSpec{h100, 9 * kUnit}).ok());  // a holds n0; the rest rest.
    m.next_seq_ = uint64_t{1} << 31;  // Older orders' seqs: 2^31 on.
    std::vector<OrderId> older;
    for (int i = 0; i < 40; ++i) older.push_back(*e.PlaceOrder(0, a, OrderSpec{h100, kUnit}));
    for (int i = 1; i < 40; i += 2) ASSERT_TRUE(e.CancelOrder(0, a, older[i]).ok());  // Every other slot free.
    m.next_seq_ = (uint64_t{1} << 31) + (uint64_t{1} << 30);  // Newer orders' seqs, in the freed slots.
    std::vector<OrderId> newer;
    for (int i = 0; i < 20; ++i) newer.push_back(*e.PlaceOrder(0, a, OrderSpec{h100, kUnit}));
    std::vector<std::pair<OrderId, uint64_t>> resting;
    for (OrderId id : older) {
      if (auto v = e.GetOrder(id); v.ok()) resting.emplace_back(id, v->seq);
    }
    for (OrderId id : newer) resting.emplace_back(id, e.GetOrder(id)->seq);
    ASSERT_EQ(resting.size(), 40u);
    // The next seq's base falls between the two: the older go apart, the newer stay.
    m.next_seq_ = (uint64_t{1} << 32) + (uint64_t{1} << 30);
    bool failed = false;
    g_fail_in = k;
    try {
      if (raise) {
        (void)e.UpdateOrder(kSec, a, newer[0], 2 * kUnit);
      } else {
        (void)e.PlaceOrder(kSec, b, OrderSpec{h100, kUnit});
      }
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    g_fail_in = -1;
    const uint64_t next = (uint64_t{1} << 32) + (uint64_t{1} << 30);
    for (const auto& [id, seq] : resting) {
      auto v = e.GetOrder(id);
      ASSERT_TRUE(v.ok());
      if (raise && id == newer[0]) {
        // The raised order: its new seq once the raise went through (an
        // allocation failing after that, as in the update test above, leaves
        // the raise done), its old one otherwise, with its old price.
        if (!failed || v->seq == next) {
          ASSERT_EQ(v->seq, next) << "allocation " << k;
          ASSERT_EQ(v->spec.price, 2 * kUnit) << "allocation " << k;
        } else {
          ASSERT_EQ(v->seq, seq) << "allocation " << k;
          ASSERT_EQ(v->spec.price, kUnit) << "allocation " << k;
        }
        continue;
      }
      ASSERT_EQ(v->seq, seq) << "allocation " << k << ", order " << id.value;
    }
    if (!failed) {
      EXPECT_EQ(m.seq_apart_.size(), 20u);  // The older ones (the call reused no apart slot).
      break;  // Past the call's last allocation.
    }
    ++threw;
  }
  EXPECT_GT(threw, 2);  // The rebase's room grows the table more than once.
}

// The index's inner levels agree with its leaves: every range's best leaf, from both trees of
// every type, equals that of trees built afresh from the leaves' keys and free flags.
void ExpectIndexWhole(EngineTestPeer::Impl& m, long k) {
  ASSERT_EQ(m.index_generation_, m.topo_.generation());
  for (const auto& ix : m.index_) {
    const auto n = static_cast<uint32_t>(ix.key.size());
    engine_internal::MinTree<2> all;
    all.Build(ix.all_leaves(), n);
    engine_internal::MinTree<3> free;
    free.Build(ix.free_leaves(), n);
    for (uint32_t lo = 0; lo < n; ++lo) {
      for (uint32_t hi = lo + 1; hi <= n; ++hi) {
        ASSERT_EQ(ix.tree.RangeBest(ix.all_leaves(), lo, hi), all.RangeBest(ix.all_leaves(), lo, hi))
            << "allocation " << k << ", leaves [" << lo << ", " << hi << ")";
        ASSERT_EQ(ix.free_tree.RangeBest(ix.free_leaves(), lo, hi), free.RangeBest(ix.free_leaves(), lo, hi))
            << "allocation " << k << ", free leaves [" << lo << ", " << hi << ")";
      }
    }
  }
}

// A power-cap step re-floors its row with the leaves' keys set first and the levels above
// them re-derived once at the end (RefloorPowerStep). An allocation that fails inside that
// loop leaves the index whole: the leaves already re-keyed are re-derived as the exception
// leaves, and a leaf whose listing failed was not re-keyed.
TEST(AllocationFailure, APowerStepThatThrowsLeavesTheIndexWhole) {
  int threw = 0;
  for (long k = 0;; ++k) {
    MarketEngine e{MarketParams{}};
    EngineTestPeer::Impl& m = EngineTestPeer::Of(e);
    const char* racks[] = {"k1", "k1", "k2", "k2", "k1", "k2"};
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(
          e.AddNode(0, topology::NodeInfo{"n" + std::to_string(i), "h100", "eu", "eu-1a", "r1", racks[i], {8, 640, 1000}})
              .ok());
    }
    const TenantId a = *e.CreateTenant(0, "a", 1'000'000 * kUnit);
    const VertexId h100 = *e.topology().FindVertex("h100");
    const LocationId row = *e.topology().FindLocation("eu/eu-1a/r1");
    // Half the row's power committed (three nodes of six) steps the floor to 3 units.
    ASSERT_TRUE(e.AddPolicy(0, PowerCapSpec{row, 6000, {{500'000, 3 * kUnit}}}).ok());
    ASSERT_TRUE(e.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit}).ok());
    ASSERT_TRUE(e.PlaceOrder(kSec, a, OrderSpec{h100, 5 * kUnit}).ok());
    bool failed = false;
    g_fail_in = k;
    try {
      (void)e.PlaceOrder(2 * kSec, a, OrderSpec{h100, 5 * kUnit});  // The third: the step.
      (void)e.Advance(3 * kSec);
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    g_fail_in = -1;
    ExpectIndexWhole(m, k);
    if (!failed) {
      // The step happened: a free node's floor is the step's.
      int stepped = 0;
      for (int i = 0; i < 6; ++i) stepped += e.GetNode(NodeId(static_cast<uint32_t>(i)))->floor == 3 * kUnit;
      EXPECT_EQ(stepped, 6);
      break;  // Past the calls' last allocation.
    }
    ++threw;
  }
  EXPECT_GT(threw, 3);
}

TEST(AllocationFailure, ARebaseThatFailsLeavesEverySeq) { ExpectARebaseThatFailsLeavesEverySeq(/*raise=*/false); }

TEST(AllocationFailure, ARebaseByARaiseThatFailsLeavesEverySeq) {
  ExpectARebaseThatFailsLeavesEverySeq(/*raise=*/true);
}

}  // namespace
}  // namespace laissez::market
