// One typed suite runs every sim::Mechanism through the same invariants.
#include <gtest/gtest.h>

#include <map>

#include "oplog/oplog.h"
#include "sim/baselines.h"
#include "sim/laissez_mechanism.h"
#include "sim/mechanism.h"
#include "sim/metrics.h"
#include "sim/oracle.h"
#include "sim/scenario.h"

namespace laissez::sim {
namespace {

const std::string kBase = std::string(LAISSEZ_SOURCE_DIR) + "/scenarios/base.yaml";

World SmallWorld(double contention, uint64_t seed, int nodes = 12, Utility utility = Utility::kRetention) {
  auto s = LoadScenario(kBase);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  s->utility = utility;
  s->node_count = nodes;
  s->rows = 2;
  s->racks_per_row = 2;
  s->duration = 12 * kMicrosPerHour;
  s->arrival_window = 6 * kMicrosPerHour;
  s->contention = contention;
  for (WorkloadSpec& w : s->workloads) {
    w.hours_median = std::min(w.hours_median, 2.0);
    w.hours_max = 4;
    if (w.kind == JobKind::kInference) {
      w.tenants = 1;
      w.peak_nodes = 2;
    }
  }
  auto w = BuildWorld(*s, seed);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(w).value();
}

struct LaissezT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<LaissezMechanism>(); } };
struct OnDemandT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemand); } };
struct SpotT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kSpot); } };
struct FcfsT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kFcfs); } };
struct FcfsPT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kFcfsP); } };
struct OnDemandSfT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemandSmallest); } };
struct OnDemandRetryT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kOnDemandRetry); } };
struct SpotCapacityT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kSpotCapacity); } };
struct SrptT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<BaselineMechanism>(BaselinePolicy::kSrpt); } };
struct OracleT { static std::unique_ptr<Mechanism> Make() { return std::make_unique<OracleBound>(); } };

template <typename T>
class MechanismTest : public ::testing::Test {};
using AllMechanisms = ::testing::Types<LaissezT, OnDemandT, OnDemandSfT, OnDemandRetryT, SpotT, SpotCapacityT, SrptT,
                                       FcfsT, FcfsPT, OracleT>;
TYPED_TEST_SUITE(MechanismTest, AllMechanisms);

TYPED_TEST(MechanismTest, OutcomesAreWellFormed) {
  World w = SmallWorld(1.2, 3);
  auto m = TypeParam::Make();
  RunOptions o;
  auto r = m->Run(w, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->jobs.size(), w.jobs.size());
  for (size_t i = 0; i < r->jobs.size(); ++i) {
    const JobOutcome& j = r->jobs[i];
    EXPECT_EQ(j.job, i);
    EXPECT_GE(j.retention, 0.0);
    EXPECT_LE(j.retention, 1.0);
    EXPECT_GE(j.cost, 0);
    EXPECT_GE(j.lost_work_hours, 0.0);
    if (j.finish >= 0) {
      // Nothing finishes faster than alone on its preferred hardware.
      EXPECT_GE(j.finish - w.jobs[i].arrival, static_cast<Micros>(w.jobs[i].ideal_hours * kMicrosPerHour) - 1);
    }
  }
  EXPECT_GE(r->metrics.utilization, 0.0);
  EXPECT_LE(r->metrics.utilization, 1.0 + 1e-9);
}

TYPED_TEST(MechanismTest, SameWorldGivesByteIdenticalResults) {
  World w = SmallWorld(1.5, 5);
  auto a = TypeParam::Make()->Run(w, RunOptions{});
  auto b = TypeParam::Make()->Run(w, RunOptions{});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(JobsCsv(w, *a), JobsCsv(w, *b));
  EXPECT_EQ(SummaryCsvRow(Summarize(*a)), SummaryCsvRow(Summarize(*b)));
}

TYPED_TEST(MechanismTest, NoNodeEverHasTwoHoldersAndGangsStayWithinSize) {
  World w = SmallWorld(2.0, 11);
  RunOptions o;
  o.record_allocations = true;
  auto r = TypeParam::Make()->Run(w, o);
  ASSERT_TRUE(r.ok());
  if (r->bound) {
    EXPECT_TRUE(r->log.empty());
    return;
  }
  EXPECT_FALSE(r->log.empty());
  std::vector<int32_t> holder(w.nodes.size(), -1);
  std::map<int32_t, int> held;
  Micros last = 0;
  for (const AllocationRecord& a : r->log) {
    EXPECT_GE(a.time, last);
    last = a.time;
    if (a.job >= 0) {
      ASSERT_EQ(holder[a.node], -1) << "node " << a.node << " granted to " << a.job << " while held by "
                                    << holder[a.node] << " at " << a.time;
      holder[a.node] = a.job;
      const Job& j = w.jobs[static_cast<size_t>(a.job)];
      EXPECT_GT(j.speed[static_cast<size_t>(w.nodes[a.node].type)], 0.0) << "a job got a type it cannot use";
      ++held[a.job];
      if (j.kind != JobKind::kInference) {
        EXPECT_LE(held[a.job], static_cast<int>(j.nodes));
      }
    } else {
      ASSERT_EQ(holder[a.node], a.from);
      holder[a.node] = -1;
      --held[a.from];
    }
  }
}

TYPED_TEST(MechanismTest, NeverBeatsTheOracleBound) {
  for (uint64_t seed : {1, 2}) {
    World w = SmallWorld(1.5, seed);
    auto bound = OracleBound().Run(w, RunOptions{});
    auto r = TypeParam::Make()->Run(w, RunOptions{});
    ASSERT_TRUE(bound.ok() && r.ok());
    EXPECT_LE(Summarize(*r).mean_retention, Summarize(*bound).mean_retention + 1e-6) << "seed " << seed;
  }
}

TYPED_TEST(MechanismTest, AloneAJobRunsNearlyAtItsIdealRate) {
  World w = SmallWorld(1.0, 1);
  // Keep one batch job, alone on a big enough cluster.
  std::vector<Job> one;
  for (const Job& j : w.jobs)
    if (j.kind == JobKind::kTraining && one.empty()) one.push_back(j);
  ASSERT_EQ(one.size(), 1u);
  one[0].id = 0;
  one[0].arrival = 0;
  w.jobs = one;
  auto r = TypeParam::Make()->Run(w, RunOptions{});
  ASSERT_TRUE(r.ok());
  // Only the restore and checkpoint saves slow it down.
  EXPECT_GT(r->jobs[0].retention, 0.8);
  EXPECT_EQ(r->jobs[0].evictions, 0u);
}

// Re-pricing only the tenants whose inputs changed (issue 12) must not change
// what the engine sees: the same operations, in the same order, at the same
// times, as re-pricing every tenant every tick, for both tenant populations.
TEST(LaissezRepricingTest, SkippingUnchangedTenantsSendsTheEngineTheSameOperations) {
  for (Utility utility : {Utility::kValue, Utility::kRetention}) {
    for (uint64_t seed : {1, 2, 3}) {
      World w = SmallWorld(1.3, seed, 24, utility);
      auto run = [&](bool every_tick, std::string* ops) {
        RunOptions o;
        o.reprice_every_tick = every_tick;
        o.operation_observer = [ops](const market::Operation& op, uint64_t id) {
          *ops += oplog::EncodeOperation(op, id) + "\n";
        };
        auto r = LaissezMechanism().Run(w, o);
        EXPECT_TRUE(r.ok()) << r.status().ToString();
        return std::move(r).value();
      };
      std::string every, skipping;
      RunResult a = run(true, &every);
      RunResult b = run(false, &skipping);
      SCOPED_TRACE(std::string(utility == Utility::kValue ? "value" : "retention") + " seed " + std::to_string(seed));
      EXPECT_GT(every.size(), 0u);
      EXPECT_TRUE(every == skipping) << "the engine saw different operations";
      EXPECT_EQ(a.metrics.engine_events, b.metrics.engine_events);
      EXPECT_LE(b.metrics.price_calls, a.metrics.price_calls);
      // Value tenants waiting for nodes have nothing to re-price while their quotes hold.
      if (utility == Utility::kValue) {
        EXPECT_LT(b.metrics.price_calls, a.metrics.price_calls);
      }
    }
  }
}

}  // namespace
}  // namespace laissez::sim
