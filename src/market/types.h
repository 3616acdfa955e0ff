// Value types of the market engine's public API: parameters, orders, floors,
// events and views. Plain data; no behaviour beyond validation helpers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "topology/topology.h"

namespace laissez::market {

using topology::Level;

// Operator settings (DESIGN.md §3). Changes apply from now on; deadlines and
// clip steps already set stand.
struct MarketParams {
  Micros grace = 120 * kMicrosPerSecond;  // Notice-to-transfer window.
  Ppm hysteresis_ppm = 0;                 // h: a challenger must beat r(n) x (1 + h).
  Price tick = 1;                         // Smallest price step, >= 1.
  Ppm clip_alpha_ppm = 0;                 // alpha; 0 turns clipping off.
  Micros clip_interval = 60 * kMicrosPerSecond;
  Price decay_beta = 0;                   // Floor decay, price per second; 0 turns decay off.
  Micros min_hold = 0;                    // Minimum hold before tenant orders may contest.

  bool operator==(const MarketParams&) const = default;
};
// Longest duration a parameter or policy may carry: 100 years. Far beyond any
// real setting, and small enough that engine time (microseconds since the Unix
// epoch) plus it never overflows int64.
inline constexpr Micros kMaxDuration = 100LL * 365 * 24 * 3600 * kMicrosPerSecond;
// INVALID_ARGUMENT naming the field if a parameter is out of range; durations
// (grace, clip_interval, min_hold) must be in [0, kMaxDuration].
Status ValidateParams(const MarketParams& p);

// A locality constraint relative to a node the tenant holds.
enum class Locality : uint8_t { kAny = 0, kSameRegion = 1, kSameZone = 2, kSameRow = 3, kSameRack = 4 };
std::string_view LocalityName(Locality l);
Result<Locality> ParseLocality(std::string_view text, std::string_view field);

struct OrderSpec {
  VertexId scope;                  // A leaf (that node) or an inner vertex (any one node below).
  Price price = 0;                 // Limit per node per hour.
  uint32_t count = 1;              // > 1 makes a gang order (all or nothing).
  Locality locality = Locality::kAny;
  NodeId rel_to;                   // Required when locality != kAny; must be held by the tenant.

  bool operator==(const OrderSpec&) const = default;
};

enum class OrderState : uint8_t { kResting = 0, kPending = 1, kFilled = 2, kCancelled = 3 };
std::string_view OrderStateName(OrderState s);

enum class NodeStatus : uint8_t { kFree = 0, kHeld = 1, kContested = 2, kReserved = 3, kRemoved = 4 };
std::string_view NodeStatusName(NodeStatus s);

// Why a notice was sent or a node left its holder (a bit set).
enum Reason : uint8_t {
  kReasonNone = 0,
  kReasonOutbid = 1,        // A challenger reached the obtain price.
  kReasonFloor = 2,         // The operator floor rose above the holder's limit.
  kReasonMaintenance = 4,   // A scheduled or forced infinite floor.
  kReasonExhaustion = 8,    // The holder's budget no longer covers its nodes.
  kReasonRelinquish = 16,   // The holder gave the node up.
};
std::string ReasonNames(uint8_t reasons);

enum class CancelReason : uint8_t {
  kNone = 0,
  kByTenant = 1,       // The tenant cancelled.
  kOutOfMoney = 2,     // Balance would not cover the order for one grace period.
  kExhausted = 3,      // The tenant ran out of money (rule 7).
  kRelToLost = 4,      // The locality anchor is no longer held.
  kScopeGone = 5,      // Every node of the scope was removed. The last (oplog.cc counts to it).
};
std::string_view CancelReasonName(CancelReason r);

// Where a floor applies: a location (all hardware types below it) or one node.
struct FloorTarget {
  LocationId location;
  NodeId node;
  bool operator==(const FloorTarget&) const = default;
};

// InfraMaps policies. Each maps private infrastructure state to floor prices.
struct StaticFloorSpec {  // A fixed floor.
  FloorTarget target;
  Price price = 0;
  bool operator==(const StaticFloorSpec&) const = default;
};
struct PowerCapSpec {  // A row's floor rises as its committed power nears its cap.
  LocationId row;
  int64_t cap_w = 0;
  // (utilization in ppm of cap, floor) steps, ascending; the floor is that of the
  // highest step whose threshold the utilization reaches. kInfPrice is a hard cap.
  std::vector<std::pair<Ppm, Price>> steps;
  bool operator==(const PowerCapSpec&) const = default;
};
struct CarbonSpec {  // Floor = intensity(t) x node power x carbon price.
  LocationId location;
  Price price_per_tonne = 0;                          // Micro-units per tonne CO2.
  std::vector<std::pair<Micros, int64_t>> series;     // (from time, gCO2/kWh), ascending.
  bool operator==(const CarbonSpec&) const = default;
};
struct MaintenanceSpec {  // Infinite floor on [start, end): notices at start - grace.
  FloorTarget target;
  Micros start = 0;
  Micros end = kNever;  // kNever: a drain.
  bool operator==(const MaintenanceSpec&) const = default;
};
// The controller of an adaptive policy (docs/MECHANISM.md, "Adaptive power
// caps" and "Adaptive carbon budgets"): every `interval` on the engine's clock
// it measures what stays (held nodes whose holder is not leaving under a floor
// notice) and moves its value V - a floor, or a carbon price per tonne - up
// while the measurement is above the target cap x (1 - margin), holds it in the
// band below the target or while a reclaim is pending, and otherwise lowers it
// by at most `fall_step`. Both adaptive specs carry these fields under their
// own names; `ControlOf` gathers them.
struct AdaptiveControl {
  int64_t cap = 0;           // The cap on the measurement (watts; grams CO2 per hour).
  Ppm margin_ppm = 0;        // Target = cap x (1 - margin); in [0, 1000000).
  Ppm band_ppm = 0;          // Hold band below the target; margin + band <= 1000000.
  Micros interval = 60 * kMicrosPerSecond;  // Control interval, >= 1 s.
  Ppm rise_ppm = 0;          // Multiplicative part of a rise (of the current value).
  Price rise_min = 1;        // Smallest rise, >= 1 (a value at 0 must be able to rise).
  Price rise_max = 0;        // Largest rise per interval, >= rise_min, finite.
  Price fall_step = 0;       // Largest fall per interval, finite (0: the value never falls).
  Price min_value = 0;       // The value starts here and never goes below; finite.
  Price max_value = kInfPrice;  // The value never goes above; >= min_value.
};
// The names a spec gives the control's fields, for error messages.
struct AdaptiveFieldNames {
  const char* cap;
  const char* min_value;
  const char* max_value;
};
// INVALID_ARGUMENT naming the field (under `names`) if a parameter is out of range.
Status ValidateAdaptiveControl(const AdaptiveControl& c, const AdaptiveFieldNames& names);
// The controller's thresholds in the measurement's unit, rounded down: the
// target T = cap x (1 - margin) and the bottom of the hold band
// L = cap x (1 - margin - band).
struct AdaptiveThresholds {
  int64_t target = 0;
  int64_t low = 0;
};
AdaptiveThresholds AdaptiveThresholdsOf(const AdaptiveControl& c);
// The controller's rule, shared by the engine and the tests: the value after
// one control step from `value`, given the staying measurement and whether a
// reclaim is pending.
Price AdaptiveStep(const AdaptiveControl& c, Price value, int64_t measured, bool reclaim_pending);

// An adaptive power cap (docs/MECHANISM.md, "Adaptive power caps"): the
// controller's value is the row's floor and its measurement the row's staying
// power in watts.
struct AdaptivePowerCapSpec {
  LocationId row;
  int64_t cap_w = 0;
  Ppm margin_ppm = 0;        // Target = cap x (1 - margin); in [0, 1000000).
  Ppm band_ppm = 0;          // Hold band below the target; margin + band <= 1000000.
  Micros interval = 60 * kMicrosPerSecond;  // Control interval, >= 1 s.
  Ppm rise_ppm = 0;          // Multiplicative part of a rise (of the current floor).
  Price rise_min = 1;        // Smallest rise, >= 1 (a floor at 0 must be able to rise).
  Price rise_max = 0;        // Largest rise per interval, >= rise_min, finite.
  Price fall_step = 0;       // Largest fall per interval, finite (0: the floor never falls).
  Price min_floor = 0;       // The floor starts here and never goes below; finite.
  Price max_floor = kInfPrice;  // The floor never goes above; >= min_floor.
  bool operator==(const AdaptivePowerCapSpec&) const = default;
};
AdaptiveControl ControlOf(const AdaptivePowerCapSpec& s);
// INVALID_ARGUMENT naming the field if a parameter is out of range (the row
// itself is checked by the engine, which knows the topology).
Status ValidateAdaptivePowerCap(const AdaptivePowerCapSpec& s);
inline AdaptiveThresholds AdaptiveThresholdsOf(const AdaptivePowerCapSpec& s) { return AdaptiveThresholdsOf(ControlOf(s)); }
inline Price AdaptiveStep(const AdaptivePowerCapSpec& s, Price floor, int64_t staying_w, bool reclaim_pending) {
  return AdaptiveStep(ControlOf(s), floor, staying_w, reclaim_pending);
}

// An adaptive carbon budget (docs/MECHANISM.md, "Adaptive carbon budgets"): a
// region's emissions held under a budget by a carbon price P per tonne that
// the controller sets; each node's floor is intensity(t) x power x P, as with
// `CarbonSpec`. The measurement is the region's staying emission rate: the sum
// over held nodes that are not leaving of power x intensity(t), in grams CO2
// per hour, rounded up.
struct AdaptiveCarbonBudgetSpec {
  LocationId region;
  int64_t budget_g_per_h = 0;  // Grams CO2 per hour (tonnes in micro-units per hour), > 0.
  std::vector<std::pair<Micros, int64_t>> series;  // (from time, gCO2/kWh), ascending.
  Ppm margin_ppm = 0;
  Ppm band_ppm = 0;
  Micros interval = 60 * kMicrosPerSecond;
  Ppm rise_ppm = 0;
  Price rise_min = 1;        // Of the price per tonne.
  Price rise_max = 0;
  Price fall_step = 0;
  Price min_price = 0;       // Per tonne: the price starts here and never goes below; finite.
  Price max_price = kInfPrice;
  bool operator==(const AdaptiveCarbonBudgetSpec&) const = default;
};
AdaptiveControl ControlOf(const AdaptiveCarbonBudgetSpec& s);
Status ValidateAdaptiveCarbonBudget(const AdaptiveCarbonBudgetSpec& s);

// A carbon floor: intensity (gCO2/kWh) x power (W) x price per tonne, in
// micro-units per hour rounded up; kInfPrice if it does not fit.
Price CarbonFloor(int64_t g_per_kwh, int64_t power_w, Price per_tonne);
// The carbon intensity of a series at time t (0 before its first point).
int64_t IntensityAt(const std::vector<std::pair<Micros, int64_t>>& series, Micros t);

// New kinds go at the end: the variant index is part of nothing persistent,
// but keeping the order stable keeps `PolicyKindName` simple.
using PolicySpec = std::variant<StaticFloorSpec, PowerCapSpec, CarbonSpec, MaintenanceSpec, AdaptivePowerCapSpec,
                                AdaptiveCarbonBudgetSpec>;

// The state of a policy now (for operators, the dashboard and tests).
struct PolicyView {
  PolicyId id;
  PolicySpec spec;
  bool alive = false;
  // The floor the policy puts on its nodes now: the controller's floor for an
  // adaptive cap, the step's floor for a power cap, otherwise 0 (static,
  // carbon and maintenance floors are per node or per time; see the spec).
  Price floor = 0;
  int64_t staying_w = 0;    // Adaptive power cap: the staying power measured at the last step.
  // Adaptive carbon budget: the controller's price per tonne (a node's floor
  // is intensity x power x it) and the staying emission rate (grams CO2 per
  // hour) measured at the last step.
  Price carbon_price = 0;
  int64_t staying_g_per_h = 0;
  Micros next_step = kNever;  // Adaptive: the next control step.
};

enum class EventType : uint8_t {
  kAllocated = 0,       // A free node went to `tenant` by `order`; `price` is its limit.
  kReserved = 1,        // A free node was reserved for gang `order`.
  kNotice = 2,          // `tenant` may lose `node` at `deadline`; `price` = max(q, f); `reasons`.
  kContestEnded = 3,    // The contest on `node` ended in its holder's favour.
  kTransferred = 4,     // `node` moved from `other` to `tenant` by `order`; `price` is the new limit.
  kReleased = 5,        // `tenant` no longer holds `node` (`reasons`); it is free (or reserved).
  kCharged = 6,         // `tenant` paid `amount` (`waived` not collectable) for `node` at rate `price`
                        // over [`deadline`, `time`) (`deadline` carries the interval's start).
  kOrderCancelled = 7,  // `order` of `tenant` was cancelled (`cancel_reason`).
  kOrderFilled = 8,     // `order` got all its nodes.
  kGangDropped = 9,     // Gang `order` dropped its claims; cooldown until `deadline`.
  kExhausted = 10,      // `tenant` ran out of money; its orders were cancelled.
  kPriceChanged = 11,   // The quote at `vertex` changed to `price` (kInfPrice: none).
  kNodeAdded = 12,      // `node` joined the market.
  kNodeRemoved = 13,    // `node` left the market.
};
std::string_view EventTypeName(EventType t);

// One market event. Flat so it is cheap to queue, copy and serialize; fields a
// type does not use are left at their defaults.
struct Event {
  Micros time = 0;
  EventType type = EventType::kAllocated;
  uint8_t reasons = 0;
  CancelReason cancel_reason = CancelReason::kNone;
  NodeId node;
  TenantId tenant;
  TenantId other;  // The previous holder of a transfer (operator view only).
  OrderId order;
  VertexId vertex;
  Price price = 0;
  Money amount = 0;
  Money waived = 0;
  Micros deadline = 0;

  bool operator==(const Event&) const = default;
};

// One settled charge in the append-only ledger. Every debit from a tenant is a
// credit to the operator.
struct LedgerEntry {
  Micros time = 0;   // Settlement time (end of the interval).
  Micros from = 0;   // Start of the interval.
  TenantId tenant;
  NodeId node;
  Price rate = 0;    // p(n) over the interval.
  Money amount = 0;  // Debited from the tenant, credited to the operator.
  Money waived = 0;  // Due but not collected (the balance would have gone negative).
  bool operator==(const LedgerEntry&) const = default;
};

struct LedgerTotals {
  Money deposited = 0;         // Initial balances plus deposits.
  Money tenant_balances = 0;   // Sum of tenant balances now.
  Money operator_revenue = 0;  // Sum of ledger amounts.
  Money waived = 0;            // Sum of ledger waived amounts.
  uint64_t entries = 0;
};

// What a tenant reads about a vertex (rule 12).
struct VertexQuote {
  VertexId vertex;
  Price quote = kInfPrice;  // Lowest obtain price below, for a tenant holding none of them.
  uint32_t total = 0, free = 0, held = 0, contested = 0, reserved = 0;
  std::vector<std::pair<Price, uint32_t>> depth;  // Resting single-node orders at or below, by price, highest first.
};

// How close the market is to taking a node from its holder (rule 4).
struct EvictionQuote {
  NodeId node;
  TenantId holder;
  Price limit = 0;      // r(n).
  Price competing = 0;  // c(n); 0 when there is none.
  Price floor = 0;      // f(n), decay included.
  Price obtain = 0;     // What a challenger must bid now.
  Price pays = 0;       // p(n), the current rate.
  bool contested = false;
  Micros deadline = 0;  // When contested.
  uint8_t reasons = 0;  // When contested.
};

struct NodeView {
  NodeId id;
  NodeStatus status = NodeStatus::kFree;
  TenantId holder;
  Price limit = 0;
  Micros held_since = 0;
  Price floor = 0;
  OrderId reserved_for;
};

struct OrderView {
  OrderId id;
  TenantId tenant;
  OrderSpec spec;
  VertexId effective_scope;  // The scope narrowed by the locality constraint.
  Price effective_price = 0; // After clipping.
  OrderState state = OrderState::kResting;
  uint64_t seq = 0;
  uint32_t filled = 0;       // Nodes obtained (gangs).
  Micros cooldown_until = 0; // Gangs after a dropped claim.
  std::vector<NodeId> claims;  // Nodes this order reserves or contests.
};

struct TenantView {
  TenantId id;
  std::string name;
  Money balance = 0;
  Price max_rate = kInfPrice;  // kInfPrice: no cap.
  Price committed_rate = 0;    // Sum of limits plus price x remaining nodes of open orders.
  Price spend_rate = 0;        // Sum of p(n) over held nodes.
  Money paid = 0, waived = 0;
  bool exhausted = false;
  std::vector<NodeId> nodes;
  std::vector<OrderId> orders;  // Resting or pending.
};

}  // namespace laissez::market
