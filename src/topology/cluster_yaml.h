// Cluster description files: hardware types, then regions / zones / rows /
// racks / nodes, with optional per-row power caps (format: docs/CLUSTER_FORMAT.md).
//
// The loader turns a YAML document into a flat list of `NodeInfo`s (in file
// order, so node ids assigned by `Topology::AddNode` or `MarketEngine::AddNode`
// are deterministic) and the rows' power caps. It checks everything a topology
// would reject and more (unknown keys, duplicate names, wrong scalar types), and
// every error names the YAML path and line: "regions[0].zones[1].rows[0]
// (line 12, column 9): power_cap_w: must be positive".
//
// Thread-safety: the functions are pure; call them from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "topology/topology.h"

namespace laissez::topology {

// A row's power cap in watts; `row_path` is the row's location path ("eu/eu-1a/r1").
struct RowPowerCap {
  std::string row_path;
  int64_t cap_w = 0;
  bool operator==(const RowPowerCap&) const = default;
};

struct ClusterSpec {
  std::vector<NodeInfo> nodes;  // In file order.
  std::vector<RowPowerCap> power_caps;  // In file order.
};

// Parses a cluster document. INVALID_ARGUMENT naming the YAML path, line and
// reason on any error; no partial result.
Result<ClusterSpec> ParseClusterYaml(std::string_view yaml_text);

// Reads and parses a file. NOT_FOUND if it cannot be opened; parse errors are
// prefixed with the file name.
Result<ClusterSpec> LoadClusterYaml(const std::string& path);

}  // namespace laissez::topology
