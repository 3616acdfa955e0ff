// Mechanism: one way of allocating the cluster to the jobs of a World
// (LaissezCloud, on-demand, spot, FCFS, FCFS-P, the offline bound). The
// simulator, the experiments and the typed test suite see mechanisms only
// through this interface.
//
// Contract of Run():
// - Runs the world from time 0 to `world.horizon` and reports one outcome per
//   job, in job order. The same world and options give the same result
//   (byte-identical CSVs): no wall clock, no unseeded randomness, no
//   iteration over unordered containers where order matters.
// - Retention is in [0, 1]; costs, migrations, evictions and lost work are
//   non-negative. An allocation log, when requested, lists every grant and
//   release in time order, and a node is never granted while held.
// - `bound` results (the oracle) are upper bounds on mean retention, not
//   schedules: they carry no allocation log and their per-job figures come
//   from a relaxed solution.
// Thread-safety: a Mechanism object runs one world at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "market/market_engine.h"
#include "sim/world.h"

namespace laissez::sim {

struct JobOutcome {
  uint32_t job = 0;
  JobKind kind = JobKind::kTraining;
  double retention = 0;       // Achieved over ideal performance (see docs/EXPERIMENTS.md).
  Money cost = 0;             // What the tenant paid.
  uint32_t migrations = 0;    // Restarts on a different node set after having run.
  uint32_t evictions = 0;     // Nodes taken from the job against its will.
  double lost_work_hours = 0; // Node-hours of preferred-type work lost (since the last checkpoint).
  Micros finish = -1;         // Completion time (batch); -1 if not finished.
  int last_type = -1;         // Type index it last ran on.
  // The job's money value of full performance (value per node-hour x
  // node-hours of ideal work; serving: x offered node-hours): the weight of
  // value-weighted retention (welfare).
  double value_weight = 0;
};

struct AllocationRecord {
  Micros time = 0;
  uint32_t node = 0;
  int32_t job = -1;   // The job granted the node; -1 on release.
  int32_t from = -1;  // On release: the job that held it.
};

struct RunMetrics {
  double utilization = 0;       // Held node-time over node-time.
  Money revenue = 0;            // Operator revenue.
  uint64_t power_violation_minutes = 0;  // Row-minutes with held power above the row's cap.
  double energy_mwh = 0;        // Energy of held nodes.
  double churn_per_node_day = 0;  // Grants per node per day.
  Micros end = 0;               // When the run stopped (the horizon, or later when drained).
  uint64_t engine_events = 0;   // LaissezCloud: market events processed.
  uint64_t price_calls = 0;     // LaissezCloud: Price() calls.
  // Per tick: held power per row in watts (only when RunOptions::sample_power).
  std::vector<Micros> sample_times;
  std::vector<std::vector<int64_t>> row_power;
  // Per tick: mean price paid per node-hour per type (LaissezCloud; spot/on-demand: list).
  std::vector<std::vector<Price>> type_price;
  // Per tick: the power-cap floor of each row (LaissezCloud; 0 without a policy).
  std::vector<std::vector<Price>> row_floor;
  // Per tick: nodes held per type by "low urgency" jobs (fig7), when sampled.
  std::vector<std::vector<uint32_t>> type_held;
};

struct RunResult {
  std::string mechanism;
  bool bound = false;
  std::vector<JobOutcome> jobs;
  RunMetrics metrics;
  std::vector<AllocationRecord> log;
};

struct RunOptions {
  bool record_allocations = false;
  bool sample_power = false;
  // Called now and then with the fraction of simulated time done (stderr progress).
  std::function<void(double)> progress;
  // LaissezCloud only: sees every engine operation (simulate --oplog).
  market::OperationObserver operation_observer;
  // LaissezCloud only: re-price every active tenant every tick, as before
  // tenants were re-priced only when their inputs changed. For checking that
  // the skipping changes nothing (the engine sees the same operations).
  bool reprice_every_tick = false;
};

class Mechanism {
 public:
  virtual ~Mechanism() = default;
  virtual std::string name() const = 0;
  virtual Result<RunResult> Run(const World& world, const RunOptions& options) = 0;
};

// "laissez", "ondemand", "spot", "fcfs", "fcfsp", "oracle".
std::vector<std::string> MechanismNames();
Result<std::unique_ptr<Mechanism>> MakeMechanism(std::string_view name);

}  // namespace laissez::sim
