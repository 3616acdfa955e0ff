// The baseline and reference mechanisms, one class with a policy switch
// because they share the queue, the node pool and the reclaim machinery.
//
// Type choice. A job takes the best type with room, "best" by its tenant's
// utility: with money values (World::utility kValue) the largest surplus
// value x speed - price (list or spot), even when that surplus is negative
// (an on-demand tenant buys at list whatever it is worth); with a retention
// utility the fastest type. FCFS and FCFS-P always take the fastest.
//
// Priority. Where a policy ranks jobs by what they would pay (bid-priority
// spot, FCFS-P), a job's launch bid is its value per node-hour (value
// utility) or its cost-of-delay bid at arrival, retention_value / (estimated
// hours x nodes) (retention utility): the same number its LaissezCloud tenant
// would bid at arrival.
//
// - kOnDemand ("ondemand"): in arrival order, any job that fits starts (no
//   head-of-line blocking); never preempted; pays the list price.
// - kOnDemandSmallest ("ondemand-sf"): the same, smallest estimated job
//   (nodes x estimated hours, the tenants' own estimates) first.
// - kOnDemandRetry ("ondemand-retry"): on-demand where a launch that finds no
//   capacity fails and the tenant retries every `kRetryEvery`; freed nodes
//   wait for the next retry (a sensitivity row: today's capacity errors).
// - kFcfs ("fcfs"): strict first-come-first-served: the head takes the
//   fastest type with room, everything behind it waits; never preempted.
// - kFcfsP ("fcfsp"): FCFS whose head may preempt running jobs of a lower
//   launch bid on its preferred type, without notice (work since the last
//   checkpoint is lost).
// - kSpot ("spot"): bid-priority spot: the highest launch bids are served
//   first and reclaim lower bids with a 2-minute notice (work since the last
//   checkpoint is lost unless a checkpoint fits); pays the spot price.
// - kSpotCapacity ("spot-capacity"): today's capacity-driven spot: price is
//   not bid-based; in arrival order, a job that does not fit reclaims
//   capacity from the most recently arrived running jobs with a 2-minute
//   notice; pays the spot price.
// - kSrpt ("srpt"): a centralised preemptive shortest-remaining-first
//   scheduler with the tenants' duration estimates, by remaining work
//   (estimated hours left x nodes): a waiting job preempts running jobs whose
//   remaining work exceeds its own plus one move's overhead, at their next
//   checkpoint; pays the list price.
//
// Serving fleets take free capacity only under every spot variant and SRPT,
// and are never chosen as victims by SRPT or capacity-driven spot.
// Reclaimed nodes are reserved for the job they were reclaimed for; they go
// back to the pool only if it no longer needs them.
#pragma once

#include <deque>
#include <set>

#include "sim/online_sim.h"

namespace laissez::sim {

enum class BaselinePolicy : uint8_t {
  kOnDemand,
  kOnDemandSmallest,
  kOnDemandRetry,
  kFcfs,
  kFcfsP,
  kSpot,
  kSpotCapacity,
  kSrpt,
};

class BaselineMechanism final : public Mechanism {
 public:
  explicit BaselineMechanism(BaselinePolicy policy) : policy_(policy) {}
  std::string name() const override;
  Result<RunResult> Run(const World& world, const RunOptions& options) override;

 private:
  BaselinePolicy policy_;
};

// Launch-time bid of a job (see the file comment), in money per node-hour.
double LaunchBid(const World& world, uint32_t job);

}  // namespace laissez::sim
