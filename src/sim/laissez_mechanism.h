// LaissezCloud in the simulator: the real MarketEngine, driven in virtual
// time, with one tenant per job whose EconAdapter and strategy do the bidding
// (no second market implementation). Each job's strategy is its value from
// throughput on each type (x urgency for deadline jobs), defended by the
// checkpoint-aware migration premium; a noticed job yields at a checkpoint
// inside the grace window. Tenants re-price once per market tick.
#pragma once

#include "sim/mechanism.h"

namespace laissez::sim {

class LaissezMechanism final : public Mechanism {
 public:
  std::string name() const override { return "laissez"; }
  Result<RunResult> Run(const World& world, const RunOptions& options) override;
};

}  // namespace laissez::sim
