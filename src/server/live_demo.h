// `laissez demo live`: a real server on an embedded (SQLite) database, a small
// cluster, and several tenants' EconAdapter agents with different strategies
// talking to it over gRPC. A late high bidder and an operator drain halfway
// through make the market move; the demo narrates what happens and ends with
// a summary (allocations, notices, transfers, prices, money paid) and a check
// that money is conserved.
#pragma once

#include <string>

namespace laissez::server {

struct LiveDemoOptions {
  double seconds = 120;
  std::string cluster = "scenarios/clusters/small.yaml";
  std::string db;  // "" : a temporary file, removed at the end.
  bool json = false;
  bool quiet = false;  // No narration, summary only.
};

// Returns the process exit code.
int RunLiveDemo(const LiveDemoOptions& options);

}  // namespace laissez::server
