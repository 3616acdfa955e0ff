// Scenario: a simulation input as written in YAML (format in
// docs/EXPERIMENTS.md), and its expansion into a World for one seed.
//
// A scenario names the cluster (types, size, composition, rows and racks,
// power caps), the workload classes (share of the offered work, gang sizes,
// duration and value distributions, per-type throughput, checkpoint and
// reconfiguration overheads, deadlines), the inference tenants (Azure LLM trace
// replay), the contention level, the market parameters and the horizon. The
// profiles in the shipped scenarios cite the rows of ../shared/data they use.
//
// Expansion is deterministic: the same scenario and seed give the same World.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/world.h"

namespace laissez::sim {

struct Range {
  double lo = 0, hi = 0;
};

struct WorkloadSpec {
  JobKind kind = JobKind::kTraining;
  double share = 0;                   // Share of the offered batch work (batch kinds).
  std::vector<uint32_t> nodes{1};     // Gang sizes to choose from uniformly.
  double hours_median = 1, hours_sigma = 0, hours_min = 0.1, hours_max = 1e9;
  std::map<std::string, double> speed;  // Relative throughput per type.
  Micros ckpt_interval = 0, ckpt_save = 0, restore = 0;
  double spread_factor = 1.0;
  double value_median = 0, value_sigma = 0;  // Units of money per node-hour.
  Range deadline_slack{0, 0};         // Genomics: deadline = arrival + slack x ideal duration.
  // Inference only.
  int tenants = 0;
  double peak_nodes = 0;
  std::string trace;                  // File name under the data directory's traces/.
};

struct Scenario {
  std::string name;
  std::string description;
  uint64_t seed = 1;
  Micros duration = 48 * kMicrosPerHour;
  Micros arrival_window = 24 * kMicrosPerHour;
  Micros tick = 60 * kMicrosPerSecond;
  // Drained protocol (World::drain_limit): run on past `duration` until every
  // batch job has finished, at most `drain_factor` x `duration` in all.
  bool drain = false;
  double drain_factor = 4.0;
  double contention = 1.0;
  market::MarketParams market;
  // Tenants.
  Utility utility = Utility::kRetention;
  Price retention_value = 1000 * kMicroUnits;  // Money per unit of retention (retention utility).
  double estimate_sigma = 0;  // Lognormal error of the tenants' duration estimates.
  double overhead_estimate = 1.0, urgency = 1.0, autoscale_headroom = 1.1;
  bool migration_aware = true;
  double budget_factor = 4.0;  // Budget = value x ideal node-hours x factor.
  double low_urgency_share = 0;   // Share of batch jobs whose value is scaled by `low_urgency`.
  double low_urgency = 0.5;
  // Cluster.
  std::string region = "us", zone = "us-1a";
  int rows = 4, racks_per_row = 4, node_count = 48;
  std::map<std::string, double> composition;  // Type -> share of nodes.
  std::vector<HwType> types;
  std::vector<RowCap> power_caps;
  std::vector<std::pair<Ppm, Price>> power_steps;
  // `cluster.power_adaptive`: the capped rows get this adaptive cap instead of
  // the staircase (row and cap_w come from `power_caps`).
  std::optional<market::AdaptivePowerCapSpec> power_adaptive;
  std::vector<WorkloadSpec> workloads;
};

// Parses a scenario document; errors name the key and the reason.
Result<Scenario> ParseScenario(std::string_view yaml_text);
Result<Scenario> LoadScenario(const std::string& path);

// The directory holding data/ (the Azure trace); from LAISSEZ_DATA_DIR, else the source tree.
std::string DataDir();

// Per-minute load shape of an Azure LLM trace file (total tokens per minute,
// normalized to a maximum of 1). Cached per path.
Result<std::vector<double>> LoadTraceShape(const std::string& path);

// Expands a scenario for one seed.
Result<World> BuildWorld(const Scenario& scenario, uint64_t seed);

}  // namespace laissez::sim
