// Scenario test of the paper's Fig. 2 story on the engine.
#include <gtest/gtest.h>

#include "tools/story.h"

namespace laissez::cli {
namespace {

using market::Event;
using market::EventType;

const Event* Find(const StoryOutcome& o, EventType type, NodeId node) {
  for (const Event& e : o.events) {
    if (e.type == type && e.node == node) return &e;
  }
  return nullptr;
}

TEST(Story, AppAIsOutbidMigratesAfterItsCheckpointAndBGetsHw1) {
  StoryOutcome o = RunStory(nullptr);
  constexpr Micros kMin = 60 * kMicrosPerSecond;
  // A got HW1 first.
  const Event* first = Find(o, EventType::kAllocated, o.hw1);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->tenant, o.a);
  EXPECT_EQ(first->time, 0);
  // B arrived and took HW2.
  const Event* b_hw2 = Find(o, EventType::kAllocated, o.hw2);
  ASSERT_NE(b_hw2, nullptr);
  EXPECT_EQ(b_hw2->tenant, o.b);
  // A was outbid with a notice and a grace deadline, never told who the rival is.
  const Event* notice = Find(o, EventType::kNotice, o.hw1);
  ASSERT_NE(notice, nullptr);
  EXPECT_EQ(notice->tenant, o.a);
  EXPECT_EQ(notice->time, o.notice_time);
  EXPECT_EQ(notice->deadline, notice->time + 10 * kMin);
  EXPECT_TRUE(notice->reasons & market::kReasonOutbid);
  // A left at its checkpoint, inside the grace window; HW1 moved to B at once.
  const Event* moved = Find(o, EventType::kTransferred, o.hw1);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->tenant, o.b);
  EXPECT_EQ(moved->other, o.a);
  EXPECT_EQ(moved->time, 20 * kMin);
  EXPECT_LT(moved->time, notice->deadline);
  EXPECT_TRUE(moved->reasons & market::kReasonRelinquish);
  // A continued on the remaining free node.
  const Event* a_hw3 = Find(o, EventType::kAllocated, o.hw3);
  ASSERT_NE(a_hw3, nullptr);
  EXPECT_EQ(a_hw3->tenant, o.a);
  EXPECT_EQ(a_hw3->time, 20 * kMin);
  // Charges never exceeded a holder's limit; money is conserved.
  for (const Event& e : o.events) {
    if (e.type != EventType::kCharged) continue;
    Price limit = e.tenant == o.a ? (e.node == o.hw1 ? 12 : 5) : (e.node == o.hw1 ? 14 : 6);
    EXPECT_LE(e.price, limit * kMicroUnits);
  }
  EXPECT_GT(o.a_paid, 0);
  EXPECT_GT(o.b_paid, 0);
  EXPECT_TRUE(o.money_conserved);
}

}  // namespace
}  // namespace laissez::cli
