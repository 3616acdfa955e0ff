// Hand-written scenarios, one per market rule of DESIGN.md §3/§3b. Each checks
// the rule's visible effects (holders, notices, deadlines, prices, ledger) and
// runs the brute-force invariant checker at every step.
#include "tests/scenario/scenario_fixture.h"

namespace laissez::market {
namespace {

// ---- Rule 5: outbid -> notice -> transfer at the deadline ----

TEST_F(ScenarioTest, OutbidNoticeThenTransferAtDeadline) {
  Make();  // grace 120 s, h = 0, tick 1.
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  EXPECT_EQ(N(n0).holder, a);
  EXPECT_EQ(N(n0).limit, 5 * U);
  ASSERT_EQ(Events(EventType::kAllocated, n0).size(), 1u);
  Check();

  OrderId ob = Bid(10 * S, b, Leaf(n0), 6 * U);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  EXPECT_EQ(N(n0).holder, a);
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].tenant, a);
  EXPECT_EQ(notices[0].price, 6 * U);  // max(q, f).
  EXPECT_EQ(notices[0].deadline, 130 * S);
  EXPECT_TRUE(notices[0].reasons & kReasonOutbid);
  EXPECT_EQ(O(ob).state, OrderState::kPending);
  EXPECT_EQ(O(ob).claims, std::vector<NodeId>{n0});
  // Holder pays the second price, capped by its limit: min(5, max(6, 0)) = 5.
  EXPECT_EQ(EQ(a, n0).pays, 5 * U);
  EXPECT_TRUE(EQ(a, n0).contested);
  EXPECT_EQ(EQ(a, n0).deadline, 130 * S);
  Check();
  EXPECT_LE(e().NextEventTime(), 130 * S);

  AdvanceTo(130 * S - 1);
  EXPECT_EQ(N(n0).holder, a);
  Check();
  AdvanceTo(130 * S);
  EXPECT_EQ(N(n0).holder, b);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  EXPECT_EQ(N(n0).limit, 6 * U);
  auto moved = Events(EventType::kTransferred, n0);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].tenant, b);
  EXPECT_EQ(moved[0].other, a);
  EXPECT_EQ(moved[0].time, 130 * S);
  EXPECT_FALSE(IsOpen(ob));
  EXPECT_TRUE(T(a).nodes.empty());
  // A paid nothing while uncontested (c = f = 0), then 5/h for 120 s; the
  // remainder below one micro-unit is dropped when the holding ends.
  EXPECT_EQ(PaidBy(a), 5 * U * 120 / 3600);
  Check();
}

TEST_F(ScenarioTest, HolderRebidInsideGraceWins) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  OrderId ob = Bid(10 * S, b, Leaf(n0), 6 * U);
  uint64_t seq = O(ob).seq;
  ASSERT_EQ(N(n0).status, NodeStatus::kContested);
  Limit(60 * S, a, n0, 7 * U);  // Retention raises are not clipped and end the contest.
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  EXPECT_EQ(Events(EventType::kContestEnded, n0).size(), 1u);
  EXPECT_EQ(O(ob).state, OrderState::kResting);
  EXPECT_EQ(O(ob).seq, seq);  // An order that rests again keeps its number.
  EXPECT_EQ(EQ(a, n0).competing, 6 * U);
  EXPECT_EQ(EQ(a, n0).pays, 6 * U);
  EXPECT_EQ(EQ(a, n0).obtain, 7 * U + 1);
  Check();
  AdvanceTo(300 * S);
  EXPECT_EQ(N(n0).holder, a);
  EXPECT_TRUE(Events(EventType::kTransferred).empty());
  Check();
}

TEST_F(ScenarioTest, EarlyRelinquishMovesTheNodeAtOnce) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  Bid(10 * S, b, Leaf(n0), 6 * U);
  ASSERT_TRUE(e().Relinquish(30 * S, a, n0).ok());
  EXPECT_EQ(N(n0).holder, b);
  EXPECT_EQ(N(n0).limit, 6 * U);
  auto moved = Events(EventType::kTransferred, n0);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].time, 30 * S);
  EXPECT_EQ(PaidBy(a), 5 * U * 20 / 3600);
  Check();
}

TEST_F(ScenarioTest, RelinquishWithoutChallengerFreesTheNode) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a");
  Bid(0, a, Leaf(n0), 5 * U);
  ASSERT_TRUE(e().Relinquish(S, a, n0).ok());
  EXPECT_EQ(N(n0).status, NodeStatus::kFree);
  auto rel = Events(EventType::kReleased, n0);
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_TRUE(rel[0].reasons & kReasonRelinquish);
  EXPECT_TRUE(T(a).nodes.empty());
  Check();
}

// Rule 5: a pending challenger takes a free eligible node at once, also when
// the node is freed later and cheaper held nodes sit beside it (the search for
// a free node walks a tree of free nodes that every release must update).
TEST_F(ScenarioTest, PendingChallengerTakesANodeFreedBesideCheaperHeldOnes) {
  Make();
  NodeId n0 = Node("n0"), n1 = Node("n1"), n2 = Node("n2"), n3 = Node("n3");
  TenantId a = Tenant("a"), b = Tenant("b"), c = Tenant("c");
  Bid(0, a, Leaf(n0), U);
  Bid(0, a, Leaf(n1), U);
  Bid(0, a, Leaf(n2), U);
  Bid(0, c, Leaf(n3), 9 * U);
  OrderId ob = Bid(10 * S, b, Vertex("h100x8"), 4 * U);
  ASSERT_EQ(O(ob).state, OrderState::kPending);  // Contests one of a's nodes: none is free.
  ASSERT_TRUE(e().Relinquish(20 * S, c, n3).ok());
  EXPECT_EQ(N(n3).holder, b);
  EXPECT_FALSE(IsOpen(ob));
  EXPECT_EQ(N(n0).holder, a);
  EXPECT_EQ(N(n1).holder, a);
  EXPECT_EQ(N(n2).holder, a);
  Check();
  // n3 is held again: a new order contests rather than taking it.
  OrderId oc = Bid(30 * S, c, Vertex("h100x8"), 4 * U);
  EXPECT_EQ(O(oc).state, OrderState::kPending);
  EXPECT_EQ(N(n3).holder, b);
  Check();
}

// ---- Rule 2 / h: hysteresis ----

TEST_F(ScenarioTest, HysteresisRaisesTheBarForChallengers) {
  MarketParams p;
  p.hysteresis_ppm = 100'000;  // 10 %.
  Make(p);
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 10 * U);
  EXPECT_EQ(QuoteAt(Leaf(n0)), 11 * U + 1);  // max(f, r x 1.1) + tick.
  OrderId ob = Bid(S, b, Leaf(n0), 11 * U);
  EXPECT_EQ(O(ob).state, OrderState::kResting);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  Check();
  Update(2 * S, b, ob, 11 * U + 1);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  EXPECT_EQ(O(ob).state, OrderState::kPending);
  Check();
}

// ---- Ties ----

TEST_F(ScenarioTest, AnEqualBidDoesNotDisplaceTheIncumbent) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  OrderId ob = Bid(S, b, Leaf(n0), 5 * U);
  EXPECT_EQ(O(ob).state, OrderState::kResting);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  EvictionQuote q = EQ(a, n0);
  EXPECT_EQ(q.competing, 5 * U);
  EXPECT_EQ(q.pays, 5 * U);
  EXPECT_EQ(q.obtain, 5 * U + 1);
  Check();
}

TEST_F(ScenarioTest, EqualOrdersAreServedInSequenceAndARaiseTakesANewNumber) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), c = Tenant("c"), d = Tenant("d");
  Bid(0, a, Leaf(n0), 10 * U);
  OrderId oc = Bid(S, c, Leaf(n0), 7 * U);
  OrderId od = Bid(2 * S, d, Leaf(n0), 7 * U);
  // c raises (new sequence number) and lowers back (keeps it): d is now first.
  Update(3 * S, c, oc, 8 * U);
  Update(4 * S, c, oc, 7 * U);
  EXPECT_GT(O(oc).seq, O(od).seq);
  ASSERT_TRUE(e().Relinquish(5 * S, a, n0).ok());
  EXPECT_EQ(N(n0).holder, d);
  EXPECT_EQ(O(oc).state, OrderState::kResting);  // 7 does not reach 7 + tick.
  Check();
}

// ---- Rule 6: gangs ----

class GangTest : public ScenarioTest {
 protected:
  void SetUp() override {
    Make();
    n0 = Node("n0");
    n1 = Node("n1");
    n2 = Node("n2");
    a = Tenant("a");
    b = Tenant("b");
    Bid(0, a, Leaf(n0), 5 * U);
  }
  NodeId n0, n1, n2;
  TenantId a, b;
};

TEST_F(GangTest, AllOrNothing) {
  OrderId g = Bid(S, b, Vertex("h100x8/eu/z0/w0/k0"), 4 * U, 3);
  // 4 cannot obtain n0 (5 + tick), so the gang takes nothing, not even the free nodes.
  EXPECT_EQ(O(g).state, OrderState::kResting);
  EXPECT_EQ(N(n1).status, NodeStatus::kFree);
  EXPECT_EQ(N(n2).status, NodeStatus::kFree);
  Check();

  Update(2 * S, b, g, 6 * U);
  EXPECT_EQ(O(g).state, OrderState::kPending);
  EXPECT_EQ(N(n1).status, NodeStatus::kReserved);
  EXPECT_EQ(N(n1).reserved_for, g);
  EXPECT_EQ(N(n2).status, NodeStatus::kReserved);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  EXPECT_TRUE(T(b).nodes.empty());  // Nothing moves before every contest is decided.
  EXPECT_EQ(QuoteAt(Leaf(n1)), kInfPrice);  // Reserved: not obtainable.
  Check();

  AdvanceTo(2 * S + 120 * S);
  EXPECT_EQ(T(b).nodes.size(), 3u);
  for (NodeId n : {n0, n1, n2}) {
    EXPECT_EQ(N(n).holder, b);
    EXPECT_EQ(N(n).limit, 6 * U);
  }
  EXPECT_FALSE(IsOpen(g));
  EXPECT_EQ(Events(EventType::kOrderFilled).size(), 2u);  // a's single order, then the gang.
  // Reserved nodes were not billed: b has paid nothing yet.
  EXPECT_EQ(PaidBy(b), 0);
  Check();
}

TEST_F(GangTest, DropsEveryClaimWhenAContestIsLostAndCoolsDown) {
  OrderId g = Bid(S, b, Vertex("h100x8/eu/z0/w0/k0"), 6 * U, 3);
  ASSERT_EQ(O(g).state, OrderState::kPending);
  Limit(10 * S, a, n0, 7 * U);
  auto dropped = Events(EventType::kGangDropped);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].order, g);
  EXPECT_EQ(dropped[0].deadline, 10 * S + 120 * S);
  EXPECT_EQ(N(n1).status, NodeStatus::kFree);
  EXPECT_EQ(N(n2).status, NodeStatus::kFree);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  EXPECT_EQ(O(g).state, OrderState::kResting);
  EXPECT_EQ(O(g).cooldown_until, 130 * S);
  Check();
  // During the cooldown a higher price does not let it contest.
  Update(20 * S, b, g, 8 * U);
  EXPECT_EQ(O(g).state, OrderState::kResting);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  Check();
  AdvanceTo(130 * S);
  EXPECT_EQ(O(g).state, OrderState::kPending);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  Check();
}

// ---- Rule 7: budgets ----

TEST_F(ScenarioTest, BudgetRejectsAnOrderTheBalanceCannotCoverForOneGrace) {
  Make();
  NodeId n0 = Node("n0");
  TenantId x = Tenant("x", 100'000);  // 0.1 units.
  TenantId y = Tenant("y", 1'000'000 * U, 5 * U);
  std::string before = State();
  // 5/h for 120 s needs 166,667 micro-units.
  auto r = e().PlaceOrder(0, x, OrderSpec{Leaf(n0), 5 * U, 1, Locality::kAny, NodeId()});
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  r = e().PlaceOrder(0, y, OrderSpec{Leaf(n0), 6 * U, 1, Locality::kAny, NodeId()});
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);  // Above its max rate.
  EXPECT_EQ(State(), before);
  Bid(0, x, Leaf(n0), 2 * U);  // Needs 66,667.
  EXPECT_EQ(N(n0).holder, x);
  Check();
}

TEST_F(ScenarioTest, ExhaustionCancelsOrdersAndGivesNoticeThenReleases) {
  Make();
  NodeId n0 = Node("n0"), n1 = Node("n1", "k1");
  TenantId x = Tenant("x", 100'000), c = Tenant("c");
  Bid(0, x, Leaf(n0), 2 * U);
  Bid(0, c, Leaf(n1), 10 * U);
  OrderId oc = Bid(0, c, Leaf(n0), U + U / 2);  // x pays 1.5/h from now.
  OrderId ox = Bid(0, x, Leaf(n1), U / 10);     // Rests below c's limit.
  EXPECT_EQ(EQ(x, n0).pays, U + U / 2);
  Check();
  // Exhausted once the available balance is at most ceil(2/h x 120 s) = 66,667,
  // i.e. after 33,333 micro-units at 1.5/h: 79.9992 s.
  AdvanceTo(79 * S);
  EXPECT_TRUE(Events(EventType::kExhausted).empty());
  EXPECT_LE(e().NextEventTime(), 80 * S);
  AdvanceTo(80 * S);
  auto ex = Events(EventType::kExhausted);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].tenant, x);
  EXPECT_EQ(ex[0].time, 79'999'200);
  EXPECT_FALSE(IsOpen(ox));
  auto cancelled = Events(EventType::kOrderCancelled);
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0].cancel_reason, CancelReason::kExhausted);
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(notices[0].reasons & kReasonExhaustion);
  EXPECT_EQ(notices[0].deadline, 79'999'200 + 120 * S);
  EXPECT_EQ(N(n0).holder, x);  // Still held through the grace period.
  Check();
  AdvanceTo(79'999'200 + 120 * S);
  EXPECT_NE(N(n0).holder, x);
  EXPECT_EQ(N(n0).holder, c);  // Released, then c's resting order took it.
  EXPECT_FALSE(IsOpen(oc));
  EXPECT_GE(T(x).balance, 0);
  EXPECT_EQ(T(x).balance + PaidBy(x), 100'000);
  Check();
}

// ---- Rule 2 / 10: floors ----

TEST_F(ScenarioTest, AFloorAboveTheLimitOutbidsTheHolder) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a");
  Bid(0, a, Leaf(n0), 5 * U);
  Policy(10 * S, StaticFloorSpec{FloorTarget{LocationId(), n0}, 6 * U});
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(notices[0].reasons & kReasonFloor);
  EXPECT_EQ(notices[0].price, 6 * U);
  EXPECT_EQ(notices[0].deadline, 130 * S);
  EXPECT_EQ(EQ(a, n0).pays, 5 * U);  // Never above the limit.
  Check();
  AdvanceTo(130 * S);
  EXPECT_EQ(N(n0).status, NodeStatus::kFree);
  EXPECT_EQ(N(n0).floor, 6 * U);
  auto rel = Events(EventType::kReleased, n0);
  ASSERT_EQ(rel.size(), 1u);
  EXPECT_TRUE(rel[0].reasons & kReasonFloor);
  Check();
}

TEST_F(ScenarioTest, MaintenanceNoticesOneGraceBeforeItStarts) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  Policy(10 * S, MaintenanceSpec{FloorTarget{LocationId(), n0}, 1000 * S, 2000 * S});
  AdvanceTo(880 * S - 1);
  EXPECT_TRUE(Events(EventType::kNotice, n0).empty());
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  Check();
  AdvanceTo(880 * S);
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_TRUE(notices[0].reasons & kReasonMaintenance);
  EXPECT_EQ(notices[0].price, kInfPrice);
  EXPECT_EQ(notices[0].deadline, 1000 * S);
  Check();
  AdvanceTo(1000 * S);
  EXPECT_EQ(N(n0).status, NodeStatus::kFree);
  EXPECT_EQ(N(n0).floor, kInfPrice);
  EXPECT_EQ(QuoteAt(Leaf(n0)), kInfPrice);
  OrderId ob = Bid(1100 * S, b, Leaf(n0), 100 * U);
  EXPECT_EQ(O(ob).state, OrderState::kResting);  // Never obtainable during the window.
  Check();
  AdvanceTo(2000 * S);
  EXPECT_EQ(N(n0).holder, b);
  Check();
}

// ---- Rule 9: volatility controls ----

TEST_F(ScenarioTest, ClippingStepsTheEffectivePricePerInterval) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  MarketParams p;
  p.clip_alpha_ppm = 100'000;  // 10 % per 60 s.
  p.clip_interval = 60 * S;
  ASSERT_TRUE(e().SetParams(S, p).ok());
  // Reference p = obtain = 5,000,001; s = ceil(p x 0.1) = 500,001.
  OrderId ob = Bid(10 * S, b, Leaf(n0), 10 * U);
  EXPECT_EQ(O(ob).effective_price, 5'500'002);
  EXPECT_EQ(O(ob).state, OrderState::kPending);
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].price, 5'500'002);  // The clipped price, not 10.
  Check();
  Limit(20 * S, a, n0, 6 * U);  // 6,000,001 > 5,500,002: the contest ends.
  EXPECT_EQ(O(ob).state, OrderState::kResting);
  Check();
  AdvanceTo(70 * S - 1);
  EXPECT_EQ(O(ob).effective_price, 5'500'002);
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  AdvanceTo(70 * S);
  EXPECT_EQ(O(ob).effective_price, 6'000'003);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  Check();
}

// The requested price lives apart from the order's record while a clip holds
// the effective price below it (issue 12): updates move it, a restore keeps
// it, and a slot reused after such an order starts without it.
TEST_F(ScenarioTest, ClippedOrdersKeepTheirRequestedPrice) {
  Make();
  NodeId n0 = Node("n0");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  MarketParams p;
  p.clip_alpha_ppm = 100'000;
  p.clip_interval = 60 * S;
  ASSERT_TRUE(e().SetParams(S, p).ok());
  OrderId ob = Bid(10 * S, b, Leaf(n0), 10 * U);
  EXPECT_EQ(O(ob).spec.price, 10 * U);
  EXPECT_EQ(O(ob).effective_price, 5'500'002);
  {
    MarketEngine restored;
    ASSERT_TRUE(restored.Restore(e().Snapshot()).ok());
    auto v = restored.GetOrder(ob);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->spec.price, 10 * U);
    EXPECT_EQ(v->effective_price, 5'500'002);
    EXPECT_EQ(restored.Snapshot(), e().Snapshot());
  }
  Update(11 * S, b, ob, 12 * U);  // A raise the clip holds.
  EXPECT_EQ(O(ob).spec.price, 12 * U);
  EXPECT_LT(O(ob).effective_price, 12 * U);
  Price clipped = O(ob).effective_price;
  Update(12 * S, b, ob, 8 * U);  // Lowered, still above the effective price.
  EXPECT_EQ(O(ob).spec.price, 8 * U);
  EXPECT_EQ(O(ob).effective_price, clipped);
  Check();
  Update(13 * S, b, ob, 5 * U);  // Lowered below it: the two meet.
  EXPECT_EQ(O(ob).spec.price, 5 * U);
  EXPECT_EQ(O(ob).effective_price, 5 * U);
  Update(14 * S, b, ob, 9 * U);  // Raised again: clipped again.
  EXPECT_EQ(O(ob).spec.price, 9 * U);
  EXPECT_LT(O(ob).effective_price, 9 * U);
  Check();
  ASSERT_TRUE(e().CancelOrder(15 * S, b, ob).ok());
  requested_.erase(ob.value);
  // The next order takes the cancelled one's slot; clipped, its own price.
  OrderId oc = Bid(16 * S, b, Leaf(n0), 20 * U);
  EXPECT_EQ(O(oc).spec.price, 20 * U);
  EXPECT_LT(O(oc).effective_price, 20 * U);
  Check();
  // The clip lifts it a step at a time; its requested price stays its own
  // (one clip interval on, it still rests: it outbids a only later).
  const Price first = O(oc).effective_price;
  AdvanceTo(16 * S + 60 * S);
  ASSERT_TRUE(IsOpen(oc));
  EXPECT_EQ(O(oc).spec.price, 20 * U);
  EXPECT_GT(O(oc).effective_price, first);
  EXPECT_LT(O(oc).effective_price, 20 * U);
  Check();
  // Later it outbids a, and b holds n0 after the grace.
  AdvanceTo(16 * S + 3600 * S);
  EXPECT_EQ(N(n0).holder, b);
  Check();
}

TEST_F(ScenarioTest, MinimumHoldDelaysChallengersButNotFloors) {
  MarketParams p;
  p.min_hold = 30 * S;
  Make(p);
  NodeId n0 = Node("n0"), n1 = Node("n1");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  Bid(0, a, Leaf(n1), 5 * U);
  OrderId ob = Bid(10 * S, b, Leaf(n0), 10 * U);
  EXPECT_EQ(O(ob).state, OrderState::kResting);
  EXPECT_EQ(QuoteAt(Leaf(n0)), kInfPrice);
  Check();
  // A floor outbids at once, hold or not.
  Policy(11 * S, StaticFloorSpec{FloorTarget{LocationId(), n1}, 6 * U});
  EXPECT_EQ(N(n1).status, NodeStatus::kContested);
  EXPECT_EQ(Events(EventType::kNotice, n1).size(), 1u);
  EXPECT_LE(e().NextEventTime(), 30 * S);
  AdvanceTo(30 * S);
  EXPECT_EQ(N(n0).status, NodeStatus::kContested);
  auto notices = Events(EventType::kNotice, n0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].time, 30 * S);
  Check();
}

// ---- Own nodes ----

TEST_F(ScenarioTest, ATenantsOrdersAreNeverEligibleForItsOwnNodes) {
  Make();
  NodeId n0 = Node("n0"), n1 = Node("n1");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), U);
  Bid(0, b, Leaf(n1), U);
  // An order on a node it holds is rejected.
  auto r = e().PlaceOrder(S, a, OrderSpec{Leaf(n0), 10 * U, 1, Locality::kAny, NodeId()});
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  // Through an inner scope it contests b's node, not its own cheaper one.
  OrderId oa = Bid(S, a, Vertex("h100x8/eu/z0/w0/k0"), 10 * U);
  EXPECT_EQ(O(oa).state, OrderState::kPending);
  EXPECT_EQ(O(oa).claims, std::vector<NodeId>{n1});
  EXPECT_EQ(N(n0).status, NodeStatus::kHeld);
  EXPECT_EQ(EQ(a, n0).competing, 0);  // Its own order does not count in c(n0).
  Check();
}

// ---- Bad input: a clear status, nothing changed ----

TEST_F(ScenarioTest, BadInputIsRejectedAndLeavesStateUnchanged) {
  Make();
  NodeId n0 = Node("n0"), n1 = Node("n1"), n2 = Node("n2");
  TenantId a = Tenant("a"), b = Tenant("b");
  Bid(0, a, Leaf(n0), 5 * U);
  Bid(0, b, Leaf(n1), 5 * U);
  OrderId oa = Bid(0, a, Leaf(n1), U);  // Rests below b's limit.
  // Keep n2 taken too, so that a valid order could not match anything.
  Bid(0, b, Leaf(n2), 5 * U);
  AdvanceTo(S);
  const Micros t = S;
  std::string before = State();
  size_t events = sink_.events.size();
  auto spec = [&](VertexId v, Price p, uint32_t count = 1) { return OrderSpec{v, p, count, Locality::kAny, NodeId()}; };
  struct Case {
    const char* what;
    Status status;
    StatusCode want;
  };
  std::vector<Case> cases = {
      {"negative price", e().PlaceOrder(t, a, spec(Leaf(n2), -1)).status(), StatusCode::kInvalidArgument},
      {"infinite price", e().PlaceOrder(t, a, spec(Leaf(n2), kInfPrice)).status(), StatusCode::kInvalidArgument},
      {"unknown tenant", e().PlaceOrder(t, TenantId(99), spec(Leaf(n2), U)).status(), StatusCode::kNotFound},
      {"unknown vertex", e().PlaceOrder(t, a, spec(VertexId(9999), U)).status(), StatusCode::kNotFound},
      {"count 0", e().PlaceOrder(t, a, spec(Leaf(n2), U, 0)).status(), StatusCode::kInvalidArgument},
      {"gang larger than its vertex", e().PlaceOrder(t, a, spec(Vertex("h100x8"), U, 4)).status(),
       StatusCode::kInvalidArgument},
      {"own node", e().PlaceOrder(t, a, spec(Leaf(n0), 6 * U)).status(), StatusCode::kFailedPrecondition},
      {"unknown order", e().UpdateOrder(t, a, OrderId(9999), U), StatusCode::kNotFound},
      {"negative update", e().UpdateOrder(t, a, oa, -5), StatusCode::kInvalidArgument},
      {"other tenant's order", e().CancelOrder(t, b, oa), StatusCode::kNotFound},
      {"other tenant's node (limit)", e().SetLimit(t, b, n0, 9 * U), StatusCode::kPermissionDenied},
      {"other tenant's node (relinquish)", e().Relinquish(t, b, n0), StatusCode::kPermissionDenied},
      {"negative limit", e().SetLimit(t, a, n0, -1), StatusCode::kInvalidArgument},
      {"unknown node", e().Relinquish(t, a, NodeId(9999)), StatusCode::kNotFound},
      {"negative deposit", e().Deposit(t, a, -1), StatusCode::kInvalidArgument},
      {"time backwards", e().Advance(t - 1), StatusCode::kOutOfRange},
      {"tick 0", e().SetParams(t, MarketParams{.tick = 0}), StatusCode::kInvalidArgument},
      {"remove a held node", e().RemoveNode(t, n0), StatusCode::kFailedPrecondition},
  };
  for (const auto& c : cases) {
    EXPECT_FALSE(c.status.ok()) << c.what;
    EXPECT_FALSE(c.status.message().empty()) << c.what;
    // Another tenant's order may be reported as missing (no leak of its existence) or denied.
    if (std::string(c.what) == "other tenant's order") {
      EXPECT_TRUE(c.status.code() == StatusCode::kPermissionDenied || c.status.code() == StatusCode::kNotFound)
          << c.status.ToString();
    } else {
      EXPECT_EQ(c.status.code(), c.want) << c.what << ": " << c.status.ToString();
    }
  }
  EXPECT_EQ(State(), before);
  EXPECT_EQ(sink_.events.size(), events);
  Check();
}

}  // namespace
}  // namespace laissez::market
