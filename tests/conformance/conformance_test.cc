// Conformance cases: small operation logs on which an independent
// implementation of DESIGN.md §3/§3b and this engine once disagreed (issue 10).
// Each log replays (without price events, as `laissez replay --no-price-events`)
// to exactly the event stream in its `.events.jsonl` file, which was checked
// by hand against the rule the case is about; each test then also asserts
// that rule on its own, so that a regenerated expectation cannot quietly
// accept a regression. README.md in this folder says what each case shows.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "oplog/oplog.h"
#include "oplog/replay.h"

namespace laissez::oplog {
namespace {

using market::Event;
using market::EventType;

std::string CasePath(const std::string& name, const char* suffix) {
  return std::string(LAISSEZ_CONFORMANCE_DIR) + "/" + name + suffix;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class Collect : public market::EventSink {
 public:
  void OnEvents(std::span<const Event> events) override { all.insert(all.end(), events.begin(), events.end()); }
  std::vector<Event> all;
};

struct CaseRun {
  std::unique_ptr<Collect> sink;  // Outlives the replayer that feeds it.
  std::unique_ptr<Replayer> replayer;
  std::vector<Event> events;
};

// Replays the case and checks its whole event stream against the expected file.
CaseRun ReplayCase(const std::string& name) {
  CaseRun run;
  ReplayOptions options;
  options.price_events = false;
  options.record_rejections = true;
  run.sink = std::make_unique<Collect>();
  run.replayer = std::make_unique<Replayer>(options, run.sink.get());
  Status st = run.replayer->ReplayText(ReadText(CasePath(name, ".oplog.jsonl")));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(run.replayer->Finish().ok());
  run.events = run.sink->all;

  std::string got;
  for (const Event& e : run.events) {
    AppendEvent(e, &got);
    got.push_back('\n');
  }
  EXPECT_EQ(got, ReadText(CasePath(name, ".events.jsonl"))) << "case " << name;
  return run;
}

std::vector<Event> OfType(const std::vector<Event>& events, EventType type, NodeId node = NodeId()) {
  std::vector<Event> out;
  for (const Event& e : events) {
    if (e.type == type && (!node.valid() || e.node == node)) out.push_back(e);
  }
  return out;
}

// 3b "Exhaustion": it cancels orders; notices already sent stay. A relinquish
// that lets the balance cover the remaining node again does not end n0's
// contest: n0 is released at the exhaustion notice's deadline.
TEST(Conformance, ExhaustionNoticeStaysAfterTheBalanceCoversAgain) {
  CaseRun run = ReplayCase("exhaustion_notice_lapses");
  EXPECT_TRUE(OfType(run.events, EventType::kContestEnded).empty());
  auto notices = OfType(run.events, EventType::kNotice, NodeId(0));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].reasons, market::kReasonExhaustion);
  auto released = OfType(run.events, EventType::kReleased, NodeId(0));
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].time, notices[0].deadline);
  EXPECT_EQ(released[0].reasons, market::kReasonExhaustion);
  // The tenant itself is no longer exhausted: it may bid again.
  auto a = run.replayer->engine().GetTenant(TenantId(0));
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->exhausted);
}

// Rule 7: an exhausted tenant's orders are cancelled, so a new order from a
// tenant that is still exhausted is rejected, even at price 0 (which commits
// nothing and so passes the budget test); it never rests or wins a node.
TEST(Conformance, ExhaustedTenantCannotPlaceAnOrder) {
  CaseRun run = ReplayCase("exhausted_tenant_new_order");
  EXPECT_EQ(run.replayer->stats().rejected, 1u);
  ASSERT_EQ(run.replayer->diagnostics().size(), 1u);
  EXPECT_NE(run.replayer->diagnostics()[0].find("line 10: rejected place_order: RESOURCE_EXHAUSTED: tenant: A is exhausted"),
            std::string::npos)
      << run.replayer->diagnostics()[0];
  auto a = run.replayer->engine().GetTenant(TenantId(0));
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->orders.empty());
}

// 3b "Decay": P is the rate paid at release. A paid 0/h; the maintenance
// window's infinite floor raised p(n) to A's limit only at the instant the
// deadline released the node, and nothing was charged at it. So no decay, and
// B's bid of 100 gets n0 once the window is over.
TEST(Conformance, DecayStartsFromTheRatePaidBeforeAMaintenanceRelease) {
  CaseRun run = ReplayCase("decay_P_after_maintenance");
  EXPECT_TRUE(OfType(run.events, EventType::kCharged).empty());
  auto allocated = OfType(run.events, EventType::kAllocated, NodeId(0));
  ASSERT_EQ(allocated.size(), 2u);
  EXPECT_EQ(allocated[1].tenant, TenantId(1));
  EXPECT_EQ(allocated[1].time, 120'000'000);
}

// 3b "Clipping reference": p is the obtain price for the order's own tenant;
// an order never competes with itself, so a pending challenger's raise does
// not put its own pending price into the reference. B's raise keeps its
// effective price at 440,002 (p = 400,001, s = 40,001) and sends no notice.
TEST(Conformance, ClipReferenceExcludesTheOrdersOwnPendingPrice) {
  CaseRun run = ReplayCase("clip_reference_own_pending_price");
  auto notices = OfType(run.events, EventType::kNotice, NodeId(0));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].price, 440'002);
  auto b = run.replayer->engine().GetOrder(OrderId(1));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->effective_price, 440'002);
  EXPECT_EQ(b->spec.price, 1'000'000);
}

// 3b: a notice carries the price max(q, f) and every reason that applies.
// When the challenger leaves and the floor still outbids the holder, the
// holder gets a new notice (same deadline) saying it would keep the node at
// the floor's 100,000.
TEST(Conformance, HolderIsToldWhenTheChallengerLeavesAndAFloorRemains) {
  CaseRun run = ReplayCase("notice_after_challenger_leaves");
  auto notices = OfType(run.events, EventType::kNotice, NodeId(8));
  ASSERT_EQ(notices.size(), 3u);
  const Event& last = notices.back();
  EXPECT_EQ(last.time, 2'348'863'704);
  EXPECT_EQ(last.price, 100'000);
  EXPECT_EQ(last.reasons, market::kReasonFloor);
  EXPECT_EQ(last.deadline, notices[0].deadline);
  EXPECT_FALSE(last.order.valid());
}

// Rule 8: a maintenance at t sends notices at t - grace, so the node is free at t;
// 3b: parameter changes apply from now on. A grace raised from 10 s to 60 s at 50 s
// puts the window's notice time (40 s) in the past: A is noticed at once, with the
// window's start (100 s) as the deadline, not at the start with no grace left.
TEST(Conformance, GraceRaisedPastAMaintenanceNoticeTimeNoticesAtOnce) {
  CaseRun run = ReplayCase("grace_raised_past_notice");
  auto notices = OfType(run.events, EventType::kNotice, NodeId(0));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].time, 50'000'000);
  EXPECT_EQ(notices[0].deadline, 100'000'000);
  EXPECT_EQ(notices[0].reasons, market::kReasonMaintenance);
  auto released = OfType(run.events, EventType::kReleased, NodeId(0));
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].time, 100'000'000);
}

// 3b: parameter changes apply from now on; deadlines already set stand. A's notice for
// the window at 100 s went at 40 s under a grace of 60 s; the grace falls to 10 s at 50 s
// (the notice time moves to 90 s) and a floor is added at 55 s, which re-floors n0. The
// notice stands: no contest_ended, no second notice, the release at the start.
TEST(Conformance, LoweredGraceTakesBackNoMaintenanceNotice) {
  CaseRun run = ReplayCase("grace_lowered_keeps_notice");
  EXPECT_TRUE(OfType(run.events, EventType::kContestEnded).empty());
  auto notices = OfType(run.events, EventType::kNotice, NodeId(0));
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].time, 40'000'000);
  EXPECT_EQ(notices[0].deadline, 100'000'000);
  auto released = OfType(run.events, EventType::kReleased, NodeId(0));
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].time, 100'000'000);
}

}  // namespace
}  // namespace laissez::oplog
