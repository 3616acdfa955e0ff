// Topology: locations shared by all hardware types, and one tree of vertices per
// hardware type whose leaves are nodes.
//
// Locations form one tree: root / region / zone / row / rack. A vertex is a
// (hardware type, location) pair that has at least one node of that type below
// it, or a leaf (one node). Every vertex of a type covers a contiguous range of
// that type's leaf order (nodes sorted by location path, then id), so subtree
// queries are range queries. The leaf order is rebuilt lazily after nodes are
// added or removed; `generation()` changes whenever ranges may have moved.
//
// Thread-safety: none; owned by one engine or one loader.
// References returned by node(), vertex() and location() are invalidated by any
// mutating call on the owner (adding nodes grows the tables; the engine
// compacts them after a bulk load): copy what you keep.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "common/types.h"

namespace laissez::topology {

enum class Level : uint8_t { kRoot = 0, kRegion = 1, kZone = 2, kRow = 3, kRack = 4, kNode = 5 };
std::string_view LevelName(Level level);
// Parses "root", "region", "zone", "row", "rack" or "node".
Result<Level> ParseLevel(std::string_view text, std::string_view field);

struct NodeMeta {
  int32_t gpus = 0;
  int32_t memory_gb = 0;
  int32_t power_w = 0;
};

// What an operator supplies to add a node.
struct NodeInfo {
  std::string name;  // Unique across the cluster.
  std::string type;  // Hardware type, e.g. "h100x8".
  std::string region, zone, row, rack;
  NodeMeta meta;
};

struct Location {
  std::string name;  // Short name, e.g. "r3".
  std::string path;  // Full path, e.g. "eu/eu-1a/r3"; "" for the root.
  Level level = Level::kRoot;
  LocationId parent;
  std::vector<LocationId> children;
};

struct Vertex {
  TypeId type;
  Level level = Level::kRoot;
  LocationId location;  // The location, or the node's rack for a leaf.
  NodeId node;          // Valid only for a leaf.
  VertexId parent;      // Invalid for a type's root.
};

// Fields ordered so that the record packs into 56 bytes (issue 12).
struct Node {
  std::string name;
  TypeId type;
  bool alive = true;
  LocationId rack;
  NodeMeta meta;
  VertexId leaf;
};

class Topology {
 public:
  Topology();
  Topology(const Topology&) = delete;  // An engine owns one; nothing copies it.
  Topology& operator=(const Topology&) = delete;

  // Adds a node, creating its locations and vertices as needed. Fails with
  // INVALID_ARGUMENT on empty names or negative metadata, ALREADY_EXISTS on a
  // duplicate name; state is unchanged on failure.
  Result<NodeId> AddNode(const NodeInfo& info);
  // Releases spare capacity after a bulk load.
  void ShrinkToFit();
  // Marks a node removed; its id is never reused. NOT_FOUND if unknown or gone.
  Status RemoveNode(NodeId node);

  // Lookups.
  size_t node_count() const { return nodes_.size(); }  // Ids ever assigned.
  size_t live_node_count() const { return live_nodes_; }
  bool IsLiveNode(NodeId n) const { return n.value < nodes_.size() && nodes_[n.value].alive; }
  const Node& node(NodeId n) const { return nodes_[n.value]; }
  Result<NodeId> FindNode(std::string_view name) const;

  size_t type_count() const { return type_names_.size(); }
  const std::string& type_name(TypeId t) const { return type_names_[t.value]; }
  Result<TypeId> FindType(std::string_view name) const;

  size_t location_count() const { return locations_.size(); }
  const Location& location(LocationId l) const { return locations_[l.value]; }
  static constexpr LocationId kRootLocation{0};
  // Finds a location by path ("eu/eu-1a/r3"; "" is the root).
  Result<LocationId> FindLocation(std::string_view path) const;
  // The ancestor of `loc` (or `loc` itself) at `level`; invalid if `level` is deeper.
  LocationId AncestorAt(LocationId loc, Level level) const;
  bool LocationContains(LocationId outer, LocationId inner) const;

  size_t vertex_count() const { return vertices_.size(); }
  const Vertex& vertex(VertexId v) const { return vertices_[v.value]; }
  // The vertex of `type` at `loc`; invalid if no node of that type lies below `loc`.
  VertexId VertexAt(TypeId type, LocationId loc) const;
  VertexId TypeRoot(TypeId type) const { return VertexAt(type, kRootLocation); }
  // Finds a vertex by name: "TYPE" (its root), "TYPE/region/zone/...", or a node name.
  Result<VertexId> FindVertex(std::string_view name) const;
  std::string VertexName(VertexId v) const;
  // Ancestors of a vertex including itself, deepest first.
  void AncestorsOf(VertexId v, std::vector<VertexId>* out) const;
  bool VertexContains(VertexId outer, VertexId inner) const;

  // Leaf order (rebuilt lazily). `LeafOrder(type)` lists the live nodes of a type
  // in location order; `Range(v)` is v's half-open range in it; `LeafIndex(n)`
  // is n's position.
  std::span<const NodeId> LeafOrder(TypeId type) const;
  // Inline: the engine's hot paths call these once per operation.
  std::pair<uint32_t, uint32_t> Range(VertexId v) const {
    if (dirty_) RebuildIfDirty();
    return vertex_range_[v.value];
  }
  uint32_t LeafIndex(NodeId n) const {
    if (dirty_) RebuildIfDirty();
    return leaf_index_[n.value];
  }
  // Changes whenever nodes are added or removed (leaf order and ranges may move).
  uint64_t generation() const { return generation_; }

 private:
  LocationId GetOrAddLocation(LocationId parent, Level level, std::string_view name);
  VertexId GetOrAddVertex(TypeId type, LocationId loc, Level level, VertexId parent);
  void RebuildIfDirty() const;

  std::vector<Node> nodes_;
  size_t live_nodes_ = 0;
  // Node ids hashed by their names (the names live in nodes_ only): an
  // open-addressing table with linear probing, 4 bytes a bucket where a
  // std::unordered_set spent a 32-byte node and a bucket pointer on each node
  // (issue 12). At most half full while nodes are added, three quarters after
  // ShrinkToFit. Names are never removed.
  static constexpr uint32_t kNoNode = UINT32_MAX;
  std::vector<uint32_t> node_by_name_;
  // The bucket holding `name`, or the empty bucket where it would go.
  size_t NameBucket(std::string_view name) const;
  void IndexName(NodeId n);
  void RehashNames(size_t buckets);
  std::vector<std::string> type_names_;
  std::unordered_map<std::string, TypeId> type_by_name_;
  std::vector<Location> locations_;
  std::unordered_map<std::string, LocationId> location_by_path_;
  std::vector<Vertex> vertices_;
  std::unordered_map<uint64_t, VertexId> vertex_by_type_loc_;

  // Lazily rebuilt leaf order.
  mutable bool dirty_ = true;
  mutable uint64_t generation_ = 0;
  mutable std::vector<std::vector<NodeId>> leaf_order_;              // Per type.
  mutable std::vector<std::pair<uint32_t, uint32_t>> vertex_range_;  // Per vertex.
  mutable std::vector<uint32_t> leaf_index_;                         // Per node.
};

}  // namespace laissez::topology
