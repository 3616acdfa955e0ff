// A seeded generator of plausible operation sequences, for replay tests and
// the replay benchmark. It drives a live engine (choices depend on the state:
// it updates orders that exist, sets limits on nodes that are held, ...) and
// returns every call it made, accepted or rejected, with the id each created.
//
// Deterministic: the same seed and options give the same calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "market/market_engine.h"
#include "oplog/oplog.h"

namespace laissez::oplog {

struct RandomLogOptions {
  uint64_t seed = 1;
  size_t operations = 1000;  // Calls after the setup (nodes and tenants).
  int nodes = 24;
  int tenants = 6;
  // Include operator calls: parameters, floors, power caps, carbon,
  // maintenance, node additions and removals.
  bool operator_ops = true;
  // Add nodes after matching has started (operator calls only).
  bool late_add_node = true;
  // Include calls that the engine must reject (unknown ids, other tenants' orders).
  bool bad_calls = true;
  // Shares of operator calls and of bad calls, per mille of all calls. Tests
  // use many operator calls to cover them; a realistic market (the replay
  // benchmark) has few: floors and maintenance change rarely, bids often.
  int operator_permille = 120;
  // Power caps are adaptive caps (docs/MECHANISM.md) every other time instead
  // of staircases, carbon policies adaptive carbon budgets every other time,
  // and live caps are changed in place (set_adaptive_cap). Off by default, so
  // existing seeds give the logs they gave.
  bool adaptive_caps = false;
  int bad_permille = 20;
};

// Calls `engine` (which should be fresh) and returns the calls as log records.
std::vector<LogRecord> DriveRandom(market::MarketEngine& engine, const RandomLogOptions& options);

// The same calls against a fresh engine of its own, as the text of an
// operation log (one line per call); `operations` gets the number of lines.
std::string RandomLogText(const RandomLogOptions& options, size_t* operations = nullptr);

}  // namespace laissez::oplog
