// Ready pricing strategies for the EconAdapter. Each is a `PricingStrategy`;
// the decorators (budget cap, urgency, locality, migration) wrap another
// strategy and adjust its answer, so a tenant composes what it needs:
//
//   auto value = std::make_unique<ThroughputValue>(values_per_type);
//   auto urgent = std::make_unique<DeadlineUrgency>(std::move(value), params);
//   BudgetCapped strategy(std::move(urgent), max_per_node);
//
// All prices are per node per hour in micro-units. A strategy never returns
// a negative price; nullopt means "do not want" (withdraw or relinquish).
// Thread-safety: none.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sdk/econ_adapter.h"

namespace laissez::sdk {

// Any callable as a strategy.
class FunctionStrategy final : public PricingStrategy {
 public:
  using Fn = std::function<std::optional<laissez::Price>(const NodeSpec&, const OrderBookView&)>;
  explicit FunctionStrategy(Fn fn) : fn_(std::move(fn)) {}
  std::optional<laissez::Price> Price(const NodeSpec& s, const OrderBookView& b) override { return fn_(s, b); }
  // NextChange: the default (every tick); the adapter cannot see into `fn`.

 private:
  Fn fn_;
};

// The same price for every node, wanted or held.
class FixedValue final : public PricingStrategy {
 public:
  explicit FixedValue(laissez::Price price) : price_(price) {}
  std::optional<laissez::Price> Price(const NodeSpec&, const OrderBookView&) override { return price_; }
  Micros NextChange(const NodeSpec&, Micros) const override { return kNever; }

 private:
  laissez::Price price_;
};

// On-demand-like: a high flat price (e.g. the list price or above), so the
// tenant is rarely outbid and pays the second price meanwhile.
std::unique_ptr<PricingStrategy> OnDemandLike(laissez::Price high);
// Spot-like: a low flat price; cheap while the market is slack, outbid first
// when it is not.
std::unique_ptr<PricingStrategy> SpotLike(laissez::Price low);

// Value from throughput: price(type) = value of one hour of work on the
// preferred hardware x the type's relative throughput. Types absent from the
// table are not wanted.
class ThroughputValue final : public PricingStrategy {
 public:
  // `value_per_hour`: what an hour of work on the preferred hardware is worth
  // per node; `speed_ppm`: each type's throughput relative to it, in ppm.
  ThroughputValue(laissez::Price value_per_hour, std::unordered_map<std::string, Ppm> speed_ppm);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  Micros NextChange(const NodeSpec&, Micros) const override { return kNever; }
  // The value of a type (nullopt if unknown).
  std::optional<laissez::Price> ValueOf(const std::string& type) const;
  void set_value_per_hour(laissez::Price v) { value_per_hour_ = v; }

  std::span<const std::byte> table() const override { return std::as_bytes(std::span(speed_ppm_)); }

 private:
  laissez::Price value_per_hour_;
  // A few types, read on every Price() call: a flat list compares faster
  // than a hash of the name.
  std::vector<std::pair<std::string, Ppm>> speed_ppm_;
};

// Caps the inner answer at `max_per_node`, and at what the balance can sustain
// for `horizon` over the request's nodes (0: no horizon cap).
class BudgetCapped final : public PricingStrategy {
 public:
  BudgetCapped(std::unique_ptr<PricingStrategy> inner, laissez::Price max_per_node, Micros horizon = 0);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  // The inner strategy's; the balance read of a horizon cap is watched by the adapter.
  Micros NextChange(const NodeSpec& spec, Micros now) const override { return inner_->NextChange(spec, now); }

  const PricingStrategy* inner() const override { return inner_.get(); }

 private:
  std::unique_ptr<PricingStrategy> inner_;
  laissez::Price max_per_node_;
  Micros horizon_;
};

// Urgency that rises as a deadline nears. With `remaining()` the time the
// remaining work needs on the preferred hardware, slack = (deadline - now) /
// remaining. The inner price is scaled by `relaxed_ppm` while slack >=
// `relaxed_slack_ppm`, by `urgent_ppm` once slack <= `urgent_slack_ppm`, and
// linearly between. The ramp ends well before slack 1: a job at slack 1 has
// no time left for a single move, so it must already be at full urgency.
class DeadlineUrgency final : public PricingStrategy {
 public:
  struct Params {
    Micros deadline = kNever;
    std::function<Micros()> remaining;  // Work left, as time on the preferred hardware.
    Ppm relaxed_ppm = 500'000;          // x0.5 with plenty of slack.
    Ppm urgent_ppm = 3'000'000;         // x3 when the deadline can barely be met.
    Ppm relaxed_slack_ppm = 3'000'000;  // Slack of 3 counts as relaxed.
    Ppm urgent_slack_ppm = 1'500'000;   // Full urgency from slack 1.5 down.
  };
  DeadlineUrgency(std::unique_ptr<PricingStrategy> inner, Params params);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  // With a deadline the factor moves with time and with `remaining()`: every tick.
  Micros NextChange(const NodeSpec& spec, Micros now) const override;
  // The factor (ppm) at time `now`.
  Ppm FactorAt(Micros now) const;

  const PricingStrategy* inner() const override { return inner_.get(); }

 private:
  std::unique_ptr<PricingStrategy> inner_;
  Params p_;
};

// A node beside my other nodes is worth more: when the spec carries a
// locality constraint (the adapter anchors it on a held node), the inner
// price is raised by `bonus_ppm`.
class LocalityAware final : public PricingStrategy {
 public:
  LocalityAware(std::unique_ptr<PricingStrategy> inner, Ppm bonus_ppm);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  Micros NextChange(const NodeSpec& spec, Micros now) const override { return inner_->NextChange(spec, now); }

  const PricingStrategy* inner() const override { return inner_.get(); }

 private:
  std::unique_ptr<PricingStrategy> inner_;
  Ppm bonus_ppm_;
};

// A node of a gang is worth the whole gang to its holder: losing any one node
// stops all of them. Held nodes' limits are the inner answer x the request's
// node count; bids for missing nodes are unchanged (per node).
class GangAware final : public PricingStrategy {
 public:
  explicit GangAware(std::unique_ptr<PricingStrategy> inner) : inner_(std::move(inner)) {}
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  Micros NextChange(const NodeSpec& spec, Micros now) const override { return inner_->NextChange(spec, now); }

  const PricingStrategy* inner() const override { return inner_.get(); }

 private:
  std::unique_ptr<PricingStrategy> inner_;
};

// Checkpoint-aware migration. Moving costs the reconfiguration overhead (save,
// restore, load, warm-up) plus the work done since the last checkpoint; the
// holder defends a node by that cost spread over `amortization`:
//   limit = inner + inner x (overhead + uncommitted()) / amortization.
// So a rival takes the node only when its gain beats the cost of moving, and
// right after a checkpoint (uncommitted ~ 0) the holder is cheapest to move.
// Wanted nodes are priced by the inner strategy unchanged. The yield itself
// (relinquish at a checkpoint inside the grace window) is the tenant's: see
// EconAdapter::Yield and AdapterListener::OnNotice.
class MigrationAware final : public PricingStrategy {
 public:
  struct Params {
    Micros overhead = 0;                   // Reconfiguration overhead of one move.
    std::function<Micros()> uncommitted;   // Work since the last checkpoint (may be null: 0).
    Micros amortization = kMicrosPerHour;  // Horizon over which the move cost is charged.
  };
  MigrationAware(std::unique_ptr<PricingStrategy> inner, Params params);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  // A held node's premium grows with `uncommitted()` while the job runs: every
  // tick then; otherwise the inner strategy's.
  Micros NextChange(const NodeSpec& spec, Micros now) const override;
  // The limit premium over `value` at this instant.
  laissez::Price Premium(laissez::Price value) const;
  Params& params() { return p_; }

  const PricingStrategy* inner() const override { return inner_.get(); }

 private:
  std::unique_ptr<PricingStrategy> inner_;
  Params p_;
};

// CostOfDelay: the truthful bid of a tenant whose utility is the performance
// of its own job (docs/STRATEGIES.md). The tenant declares what it knows of
// its job; Price() answers what the job loses, in money, per node-hour
// without the node:
//
// Batch (retention R = D / T: ideal duration D over time in the system T).
//   T = time since arrival + remaining work / speed(type) (+ the restore
//   overhead for a node not yet held); one hour of delay costs dR/dT = D / T^2.
//   bid(type)   = value x D / T^2 x speed(type) / nodes
//   limit(type) = bid(type) + value x D / T^2 x (overhead + uncommitted) / amortization
//   The limit adds the migration premium: losing any held node makes the
//   whole job pay the move (restore and save) and lose its uncommitted work.
//   With a deadline, both are scaled by an urgency that ramps from 1 at slack
//   `relaxed_slack_ppm` up to `urgent_ppm` at slack `urgent_slack_ppm`.
// Serving (retention = served load / offered load).
//   bid(type)   = value_per_served_hour x speed(type)
//   limit(type) = bid(type) x (1 + restore / amortization)
//   where value_per_served_hour is the tenant's money per node-hour of served
//   load on the preferred type (for a retention utility: value / the offered
//   node-hours it expects over its life).
//
// `value` is the money one unit of the tenant's utility is worth to it; with
// equal values (equal budgets) the market maximises the sum of retentions.
// Types absent from `speed_ppm` are not wanted. Thread-safety: none.
class CostOfDelay final : public PricingStrategy {
 public:
  enum class Kind : uint8_t { kBatch, kServing };
  struct Params {
    Kind kind = Kind::kBatch;
    laissez::Price value = 0;             // Money per unit of utility (batch) or per served node-hour (serving).
    std::unordered_map<std::string, Ppm> speed_ppm;  // Throughput per type relative to the preferred one.
    // Batch.
    Micros arrival = 0;                   // When the job entered the system.
    Micros ideal = 0;                     // Estimated duration alone on the preferred type.
    uint32_t nodes = 1;                   // Gang size.
    std::function<Micros()> remaining;    // Estimated work left as preferred-type time (null: `ideal`).
    std::function<Micros()> uncommitted;  // Work since the last checkpoint (null: 0).
    Micros overhead = 0;                  // Restore + save of one move (serving: restore).
    Micros amortization = kMicrosPerHour; // Horizon over which a move's cost is charged.
    Micros deadline = kNever;
    Ppm urgent_ppm = 3'000'000;
    Ppm relaxed_slack_ppm = 3'000'000;
    Ppm urgent_slack_ppm = 1'500'000;
  };
  explicit CostOfDelay(Params params);
  std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) override;
  // Serving: never (the answer does not depend on time). Batch: every tick,
  // since D / T^2 moves with time.
  Micros NextChange(const NodeSpec& spec, Micros now) const override;
  // What one hour of delay costs the whole job now, in money (batch; for tests).
  double DelayCostPerHour(Micros now, Ppm speed_ppm, bool held) const;
  Params& params() { return p_; }

 private:
  Params p_;
};

}  // namespace laissez::sdk
