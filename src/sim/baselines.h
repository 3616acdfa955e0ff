// The baseline mechanisms, one class with a policy switch because they share
// the queue and the node pool:
// - kOnDemand: each job takes, at arrival or when nodes free up, the type with
//   the largest surplus (value x speed - list price) that has room; jobs that
//   fit anywhere start (no head-of-line blocking); never preempted; pays the
//   list price.
// - kFcfs: strict first-come-first-served: the head of the queue takes the
//   fastest type with room, everything behind it waits; never preempted.
// - kFcfsP: FCFS, but the head may preempt running jobs of lower value on its
//   preferred type, without notice (work since the last checkpoint is lost).
// - kSpot: a launch-time maximum price (value x speed on the type it launches
//   on); the provider serves the highest prices first and reclaims lower-priced
//   jobs with a 2-minute notice (work since the last checkpoint is lost unless
//   a checkpoint fits in the notice); pays the type's spot price.
#pragma once

#include <deque>
#include <set>

#include "sim/online_sim.h"

namespace laissez::sim {

enum class BaselinePolicy : uint8_t { kOnDemand, kFcfs, kFcfsP, kSpot };

class BaselineMechanism final : public Mechanism {
 public:
  explicit BaselineMechanism(BaselinePolicy policy) : policy_(policy) {}
  std::string name() const override;
  Result<RunResult> Run(const World& world, const RunOptions& options) override;

 private:
  BaselinePolicy policy_;
};

}  // namespace laissez::sim
