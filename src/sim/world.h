// World: everything one simulation run needs, fully expanded from a scenario
// and a seed: the cluster's nodes, the jobs with their arrival times and
// profiles, the market settings and the horizon. Every mechanism runs the same
// World, so their results are comparable job by job.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"
#include "market/types.h"
#include "topology/topology.h"

namespace laissez::sim {

struct HwType {
  std::string name;       // e.g. "h100x8".
  int gpus = 8;
  int power_w = 0;
  Price list_price = 0;   // On-demand price per node-hour.
  Price spot_price = 0;   // Spot price per node-hour.
};

struct SimNode {
  int type = 0;  // Index into World::types.
  int row = 0;   // Index into World::rows.
  int rack = 0;  // Global rack index.
};

enum class JobKind : uint8_t { kTraining = 0, kInference = 1, kGenomics = 2, kHpc = 3 };
const char* JobKindName(JobKind k);

struct Job {
  uint32_t id = 0;
  JobKind kind = JobKind::kTraining;
  Micros arrival = 0;
  uint32_t nodes = 1;           // Gang size (batch); the largest fleet (inference).
  double ideal_hours = 0;       // Duration alone on the preferred hardware, no overheads (batch).
  std::vector<double> speed;    // Per type, relative to the preferred type (max 1; 0: cannot run).
  Micros ckpt_interval = 0;     // Work time between checkpoints (0: none; work since start is lost).
  Micros ckpt_save = 0;         // Blocking time of one checkpoint save.
  Micros restore = 0;           // Restore + load + warm-up after (re)starting on new nodes.
  double spread_factor = 1.0;   // Speed factor when the gang spans more than one rack.
  Micros deadline = kNever;     // Genomics.
  Price value = 0;              // Value per node-hour of work on the preferred type.
  // The tenant's own estimate of `ideal_hours` (ideal x lognormal error of
  // sigma `tenants.estimate_sigma`); what tenants and the size-aware references
  // see. Batch only.
  double estimated_hours = 0;
  Money budget = 0;             // Tenant budget (LaissezCloud balance).
  bool low_urgency = false;     // Its value was scaled down (fig7 groups by this).
  // Inference: load in nodes of the preferred type, one value per minute from arrival.
  std::vector<float> need;
};

// What the tenants of a world want (docs/STRATEGIES.md):
// - kRetention: every tenant's utility is its own performance retention, worth
//   the same `retention_value` to each (equal budgets); LaissezCloud tenants bid
//   the truthful cost of delay (sdk::CostOfDelay). Scored by unweighted mean
//   retention: the paper's claim.
// - kValue: tenants bid money values per node-hour (`Job::value`); scored by
//   value-weighted retention (welfare) and cost.
enum class Utility : uint8_t { kRetention = 0, kValue = 1 };
const char* UtilityName(Utility u);

struct RowCap {
  int row = 0;
  int64_t cap_w = 0;
};

struct World {
  std::string name;
  std::vector<HwType> types;
  std::vector<std::string> rows;   // Row location paths ("us/us-1a/r0").
  std::vector<SimNode> nodes;      // Index = engine NodeId value.
  std::vector<topology::NodeInfo> infos;
  std::vector<RowCap> power_caps;
  // Power-cap InfraMap steps (utilization ppm, floor) applied to every capped row.
  std::vector<std::pair<Ppm, Price>> power_steps;
  // When set, every capped row gets this adaptive power cap (its `row` and
  // `cap_w` are filled from `power_caps`) instead of the staircase.
  std::optional<market::AdaptivePowerCapSpec> power_adaptive;
  std::vector<Job> jobs;
  Micros horizon = 0;
  // Drained protocol: after `horizon` the inference fleets leave and the run
  // goes on until every batch job has finished, or until `drain_limit` (then
  // the unfinished ones are reported apart). 0: no drain, stop at `horizon`.
  Micros drain_limit = 0;
  Utility utility = Utility::kRetention;
  // Money one unit of retention is worth to every retention-utility tenant;
  // their balance is `budget_factor` x this.
  Price retention_value = 1000 * kMicroUnits;
  market::MarketParams market;
  Micros tick = 60 * kMicrosPerSecond;  // Market tick: tenants re-price at most once per tick.
  // The factor tenants apply to their own overhead estimates (fig15: < 1 under-, > 1 over-estimates).
  double overhead_estimate = 1.0;
  // Inference autoscaler: target = need x headroom (nodes of the preferred type).
  double autoscale_headroom = 1.1;
  // LaissezCloud tenant strategy knobs.
  bool migration_aware = true;
  // fig8: LaissezCloud tenants of `bid_cap_kind` never bid or keep above `bid_cap` per node-hour.
  Price bid_cap = kInfPrice;
  JobKind bid_cap_kind = JobKind::kTraining;
  uint64_t seed = 1;

  int TypeIndex(const std::string& name) const;
  uint32_t NodesOfType(int type) const;
};

// A serving fleet's offered load over its life (arrival to the horizon), in
// node-hours of its preferred type; 0 for batch jobs.
double OfferedNodeHours(const World& world, uint32_t job);

}  // namespace laissez::sim
