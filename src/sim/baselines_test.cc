// Regression tests of the simulator core and the baselines on tiny worlds
// built by hand, where the right answer can be worked out on paper.
#include <gtest/gtest.h>

#include <algorithm>

#include "sim/baselines.h"
#include "sim/metrics.h"
#include "sim/online_sim.h"

namespace laissez::sim {
namespace {

constexpr Micros kMinute = 60 * kMicrosPerSecond;
constexpr Micros kHour = kMicrosPerHour;

Job Batch(Micros arrival, uint32_t nodes, double hours, double value) {
  Job j;
  j.kind = JobKind::kTraining;
  j.arrival = arrival;
  j.nodes = nodes;
  j.ideal_hours = hours;
  j.estimated_hours = hours;
  j.speed = {1.0};
  j.ckpt_interval = kHour;
  j.ckpt_save = 100 * kMicrosPerSecond;
  j.restore = 300 * kMicrosPerSecond;
  j.value = static_cast<Price>(value * kMicroUnits);
  return j;
}

// One hardware type, `nodes` nodes in one rack, the given jobs (in arrival order).
World Tiny(uint32_t nodes, std::vector<Job> jobs, Utility utility = Utility::kValue) {
  World w;
  w.types = {HwType{"h100x8", 8, 10000, 98 * kMicroUnits, 27 * kMicroUnits}};
  w.rows = {"us/us-1a/r0"};
  for (uint32_t n = 0; n < nodes; ++n) w.nodes.push_back(SimNode{0, 0, 0});
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].id = static_cast<uint32_t>(i);
  w.jobs = std::move(jobs);
  w.horizon = 24 * kHour;
  w.utility = utility;
  return w;
}

// When `job` was first granted a node (-1: never).
Micros FirstGrant(const RunResult& r, int32_t job) {
  for (const AllocationRecord& a : r.log)
    if (a.job == job) return a.time;
  return -1;
}

// A scripted mechanism: every job gets node `job` at arrival; a notice and
// its cancellation can be scheduled.
class Scripted final : public OnlineSim {
 public:
  Scripted(const World& w, Micros notice_at, Micros notice_for, Micros cancel_at)
      : OnlineSim(w, RunOptions{}), notice_at_(notice_at), notice_for_(notice_for), cancel_at_(cancel_at) {}

 private:
  void OnArrival(uint32_t job) override {
    GrantNode(job, job);
    if (notice_at_ >= 0) SetTimer(notice_at_, job, 1);
    if (cancel_at_ >= 0) SetTimer(cancel_at_, job, 2);
  }
  void OnFinished(uint32_t job) override {
    std::vector<uint32_t> nodes = runs_[job].nodes;
    for (uint32_t n : nodes) RevokeNode(job, n, true, false);
  }
  void OnYield(uint32_t) override {}
  void OnAutoscale(uint32_t, double) override {}
  void OnTimer(uint32_t job, uint64_t tag) override {
    if (tag == 1) Notice(job, job, now() + notice_for_);
    if (tag == 2) CancelYield(job);
  }
  Micros notice_at_, notice_for_, cancel_at_;
};

// Regression: a contest that ended during an emergency save made the job run
// a full restore afterwards although it never left its node (39 needless
// restores at a 120 s grace, 1,742 at 300 s, in the base scenario).
TEST(OnlineSimTest, AStopCancelledDuringASaveCostsTheSaveButNoRestore) {
  World w = Tiny(1, {Batch(0, 1, 2.0, 100)});
  // No checkpoint fits in a 200 s notice at 10 min, so the job starts a 100 s
  // emergency save; the contest ends 50 s into it.
  auto noticed = Scripted(w, 10 * kMinute, 200 * kMicrosPerSecond, 10 * kMinute + 50 * kMicrosPerSecond)
                     .Execute("scripted");
  auto quiet = Scripted(w, -1, 0, -1).Execute("scripted");
  ASSERT_TRUE(noticed.ok() && quiet.ok());
  ASSERT_GE(noticed->jobs[0].finish, 0);
  ASSERT_GE(quiet->jobs[0].finish, 0);
  EXPECT_EQ(noticed->jobs[0].finish - quiet->jobs[0].finish, 100 * kMicrosPerSecond);
  EXPECT_EQ(noticed->jobs[0].migrations, 0u);
}

TEST(OnlineSimTest, ANoticeDuringACancelledSaveStillStopsTheJob) {
  World w = Tiny(1, {Batch(0, 1, 2.0, 100)});
  // Noticed at 10 min, cancelled at 10:50, noticed again at 11:00 (same timer
  // tags: the second notice comes from a third timer).
  class Twice final : public OnlineSim {
   public:
    explicit Twice(const World& w) : OnlineSim(w, RunOptions{}) {}
    int yields = 0;

   private:
    void OnArrival(uint32_t job) override {
      GrantNode(job, 0);
      SetTimer(10 * kMinute, job, 1);
      SetTimer(10 * kMinute + 50 * kMicrosPerSecond, job, 2);
      SetTimer(11 * kMinute, job, 1);
    }
    void OnFinished(uint32_t job) override { RevokeNode(job, 0, true, false); }
    void OnYield(uint32_t) override { ++yields; }
    void OnAutoscale(uint32_t, double) override {}
    void OnTimer(uint32_t job, uint64_t tag) override {
      if (tag == 1) Notice(job, 0, now() + 200 * kMicrosPerSecond);
      if (tag == 2) CancelYield(job);
    }
  } sim(w);
  auto r = sim.Execute("scripted");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(sim.yields, 1);
}

// Regression: when a bid-priority spot job reclaimed nodes, the first
// victim's timer reset the claimant's count of incoming nodes and the freed
// node went back to the shared pool, where a lower bid took it, was
// reclaimed, and so on (one job was evicted 448 times in one run).
TEST(SpotTest, ReclaimedNodesGoToTheJobTheyWereReclaimedFor) {
  World w = Tiny(2, {Batch(0, 1, 10, 10), Batch(0, 1, 10, 10), Batch(kHour, 2, 2, 100),
                     Batch(kHour + 30 * kMicrosPerSecond, 1, 2, 50)});
  RunOptions o;
  o.record_allocations = true;
  auto r = BaselineMechanism(BaselinePolicy::kSpot).Run(w, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // The gang (job 2) gets both nodes when the two-minute notices run out;
  // job 3 (a middle bid) never gets a node before it, so it is never reclaimed.
  const Micros gang_start = FirstGrant(*r, 2), mid_first = FirstGrant(*r, 3);
  // Both victims are mid-hour: each stops by a 100 s emergency save.
  EXPECT_EQ(gang_start, kHour + 100 * kMicrosPerSecond);
  EXPECT_GT(mid_first, gang_start);
  EXPECT_EQ(r->jobs[3].evictions, 0u);
  EXPECT_EQ(r->jobs[0].evictions + r->jobs[1].evictions, 2u);
}

TEST(SpotTest, ACleanYieldHandsTheNodesOverAtOnce) {
  // The victim is 55 min into its hour: its checkpoint (at 60 min + 100 s
  // save) does not fit in two minutes, but an emergency save (100 s) does.
  World w = Tiny(1, {Batch(0, 1, 10, 10), Batch(55 * kMinute + 300 * kMicrosPerSecond, 1, 1, 100)});
  RunOptions o;
  o.record_allocations = true;
  auto r = BaselineMechanism(BaselinePolicy::kSpot).Run(w, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FirstGrant(*r, 1), w.jobs[1].arrival + 100 * kMicrosPerSecond);
  EXPECT_EQ(r->jobs[0].lost_work_hours, 0.0);
}

TEST(SrptTest, PreemptsTheLongestJobAtItsCheckpointForAShortOne) {
  // A 10 h job holds the only node; a 1 h job arrives at 20 min. SRPT stops
  // the long one at its next commit (1 h of work + 100 s save after the 300 s
  // restore) and runs the short one.
  World w = Tiny(1, {Batch(0, 1, 10, 10), Batch(20 * kMinute, 1, 1, 10)}, Utility::kRetention);
  RunOptions o;
  o.record_allocations = true;
  auto r = BaselineMechanism(BaselinePolicy::kSrpt).Run(w, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FirstGrant(*r, 1), 300 * kMicrosPerSecond + kHour + 100 * kMicrosPerSecond);
  EXPECT_EQ(r->jobs[0].lost_work_hours, 0.0);
  EXPECT_GE(r->jobs[0].finish, 0);
  EXPECT_LT(r->jobs[1].finish, r->jobs[0].finish);
  // On-demand never preempts: the short job waits for the long one.
  auto od = BaselineMechanism(BaselinePolicy::kOnDemand).Run(w, RunOptions{});
  ASSERT_TRUE(od.ok());
  EXPECT_GT(od->jobs[1].finish, od->jobs[0].finish);
}

// Regression: when SRPT's victim was not running (still restoring) it left at
// once, but the claimant waited for the next event to start on its nodes.
TEST(SrptTest, AClaimantStartsAtOnceWhenItsVictimHadNothingToSave) {
  // The long job arrives at 0 and restores until 300 s; the short one
  // arrives at 100 s: the long one leaves at once and the short one starts.
  World w = Tiny(1, {Batch(0, 1, 10, 10), Batch(100 * kMicrosPerSecond, 1, 1, 10)}, Utility::kRetention);
  RunOptions o;
  o.record_allocations = true;
  auto r = BaselineMechanism(BaselinePolicy::kSrpt).Run(w, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(FirstGrant(*r, 1), 100 * kMicrosPerSecond);
  EXPECT_EQ(r->jobs[0].lost_work_hours, 0.0);
}

TEST(OnDemandTest, SmallestFirstServesTheShortestWaitingJobFirst) {
  World w = Tiny(1, {Batch(0, 1, 1, 10), Batch(10 * kMinute, 1, 8, 10), Batch(20 * kMinute, 1, 1, 10)});
  auto sf = BaselineMechanism(BaselinePolicy::kOnDemandSmallest).Run(w, RunOptions{});
  auto fifo = BaselineMechanism(BaselinePolicy::kOnDemand).Run(w, RunOptions{});
  ASSERT_TRUE(sf.ok() && fifo.ok());
  EXPECT_LT(sf->jobs[2].finish, sf->jobs[1].finish);
  EXPECT_GT(fifo->jobs[2].finish, fifo->jobs[1].finish);
}

TEST(OnDemandTest, RetryingTenantsStartOnlyAtTheirNextAttempt) {
  // Job 1 arrives at 11 min to a full cluster and retries every 5 minutes;
  // the node frees when job 0 finishes (65 min), and job 1 starts at its next
  // retry (66 min), not at once.
  World w = Tiny(1, {Batch(0, 1, 1, 10), Batch(11 * kMinute, 1, 1, 10)});
  RunOptions o;
  o.record_allocations = true;
  auto r = BaselineMechanism(BaselinePolicy::kOnDemandRetry).Run(w, o);
  ASSERT_TRUE(r.ok());
  const Micros free_at = r->jobs[0].finish;
  const Micros start = FirstGrant(*r, 1);
  ASSERT_GT(start, 0);
  EXPECT_GT(start, free_at);
  EXPECT_EQ((start - 11 * kMinute) % (5 * kMinute), 0);
  EXPECT_LT(start - free_at, 5 * kMinute);
}

TEST(DrainTest, ADrainedRunFinishesEveryJobAndReportsNoneUnfinished) {
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(Batch(i * kMinute, 1, 6, 10));
  World w = Tiny(2, jobs);
  w.horizon = 4 * kHour;
  auto cut = BaselineMechanism(BaselinePolicy::kOnDemand).Run(w, RunOptions{});
  w.drain_limit = 48 * kHour;
  auto drained = BaselineMechanism(BaselinePolicy::kOnDemand).Run(w, RunOptions{});
  ASSERT_TRUE(cut.ok() && drained.ok());
  EXPECT_EQ(Summarize(*cut).unfinished, 6u);
  EXPECT_EQ(Summarize(*drained).unfinished, 0u);
  EXPECT_GT(drained->metrics.end, w.horizon);
  EXPECT_LE(drained->metrics.end, w.drain_limit);
}

TEST(MetricsTest, ValueWeightedRetentionWeighsJobsByTheirValue) {
  RunResult r;
  JobOutcome a, b;
  a.retention = 1.0;
  a.value_weight = 300;
  b.retention = 0.0;
  b.value_weight = 100;
  r.jobs = {a, b};
  Summary s = Summarize(r);
  EXPECT_DOUBLE_EQ(s.mean_retention, 0.5);
  EXPECT_DOUBLE_EQ(s.value_weighted_retention, 0.75);
}

}  // namespace
}  // namespace laissez::sim
