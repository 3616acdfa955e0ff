// An EconAdapter agent against a live server: one tenant, one ready strategy,
// reacting to the watch stream (`laissez agent`, and the agents of
// `laissez demo live`). Part of `sdk_grpc`.
//
// The loop: open a watch on the wanted hardware type, hand the tenant's events
// to the adapter, mark it dirty on price changes there, and call Reprice() at
// most once per `reprice_interval` when it is dirty (and at least every
// `refresh_interval`, so time-dependent strategies move).
//
// Thread-safety: RunAgent blocks its thread; `stop` may be set from another.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "sdk/strategies.h"
#include "server/grpc_client.h"

namespace laissez::server {

// The strategy `laissez agent` and `laissez run` use when none is named: the
// one place to change the tenant tools' default.
inline constexpr std::string_view kDefaultStrategy = "cost-of-delay";

struct AgentOptions {
  ConnectOptions connect;
  // cost-of-delay (the truthful bid for a job of `hours` worth `value`,
  // docs/STRATEGIES.md), fixed, on-demand, spot, budget (fixed value capped at
  // `cap`), locality (fixed value, +`bonus_ppm` for nodes near held ones),
  // migration (fixed value, premium for the move overhead).
  std::string strategy = std::string(kDefaultStrategy);
  // What a node-hour is worth to this tenant; for cost-of-delay, what the
  // whole job finishing in its ideal time is worth.
  Price value = 10 * kMicroUnits;
  double hours = 1.0;              // cost-of-delay: the job's estimated duration alone on `node_type`.
  Price cap = 0;                   // budget: the most per node per hour.
  Ppm bonus_ppm = 200'000;         // locality.
  Micros overhead = 10 * 60 * kMicrosPerSecond;  // migration: one move's lost work.
  std::string node_type = "h100x8";
  std::string location;  // Optional narrowing ("eu/eu-1a").
  uint32_t count = 1;
  bool gang = false;
  double seconds = 0;  // 0: until `stop`.
  int reprice_interval_ms = 200;
  int refresh_interval_ms = 5000;
};

struct AgentReport {
  std::string tenant;
  uint64_t gained = 0, lost = 0, notices = 0, contests_won = 0, cancelled = 0;
  Money charged = 0;
  uint64_t reprices = 0, orders_placed = 0, orders_updated = 0, limits_set = 0, rejected = 0;
  uint32_t held_at_end = 0;
};

// Builds one of the ready strategies by name; INVALID_ARGUMENT naming
// "strategy" for an unknown one. cost-of-delay starts its clock at `arrival`
// and reads the work left from `remaining` (null: all of `hours`).
Result<std::unique_ptr<sdk::PricingStrategy>> MakeStrategy(const AgentOptions& o, Micros arrival = 0,
                                                          std::function<Micros()> remaining = nullptr);

// Runs until `seconds` pass or `*stop` turns true. `log` (may be null) gets
// one line per notable event. Returns the first connection error, if any.
Result<AgentReport> RunAgent(const AgentOptions& o, const std::atomic<bool>* stop,
                             const std::function<void(const std::string&)>& log);

}  // namespace laissez::server
