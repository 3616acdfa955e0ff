#include "topology/topology.h"

#include <algorithm>

#include "common/check.h"

namespace laissez::topology {

std::string_view LevelName(Level level) {
  switch (level) {
    case Level::kRoot: return "root";
    case Level::kRegion: return "region";
    case Level::kZone: return "zone";
    case Level::kRow: return "row";
    case Level::kRack: return "rack";
    case Level::kNode: return "node";
  }
  return "?";
}

Result<Level> ParseLevel(std::string_view text, std::string_view field) {
  for (int i = 0; i <= 5; ++i) {
    if (LevelName(static_cast<Level>(i)) == text) return static_cast<Level>(i);
  }
  return InvalidArgument(std::string(field) + ": '" + std::string(text) +
                         "' is not a level (root, region, zone, row, rack, node)");
}

Topology::Topology() {
  locations_.push_back(Location{"", "", Level::kRoot, LocationId(), {}});
  location_by_path_[""] = kRootLocation;
}

static uint64_t TypeLocKey(TypeId t, LocationId l) { return (static_cast<uint64_t>(t.value) << 32) | l.value; }

LocationId Topology::GetOrAddLocation(LocationId parent, Level level, std::string_view name) {
  const std::string& ppath = locations_[parent.value].path;
  std::string path = ppath.empty() ? std::string(name) : ppath + "/" + std::string(name);
  auto it = location_by_path_.find(path);
  if (it != location_by_path_.end()) return it->second;
  LocationId id(static_cast<uint32_t>(locations_.size()));
  locations_.push_back(Location{std::string(name), path, level, parent, {}});
  locations_[parent.value].children.push_back(id);
  location_by_path_.emplace(std::move(path), id);
  return id;
}

VertexId Topology::GetOrAddVertex(TypeId type, LocationId loc, Level level, VertexId parent) {
  auto [it, inserted] = vertex_by_type_loc_.try_emplace(TypeLocKey(type, loc), VertexId());
  if (!inserted) return it->second;
  VertexId id(static_cast<uint32_t>(vertices_.size()));
  vertices_.push_back(Vertex{type, level, loc, NodeId(), parent});
  it->second = id;
  return id;
}

Result<NodeId> Topology::AddNode(const NodeInfo& info) {
  auto need = [](const std::string& v, const char* field) -> Status {
    if (v.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
    if (v.find('/') != std::string::npos) return InvalidArgument(std::string(field) + ": '" + v + "' must not contain '/'");
    return Status::Ok();
  };
  LZ_RETURN_IF_ERROR(need(info.name, "name"));
  LZ_RETURN_IF_ERROR(need(info.type, "type"));
  LZ_RETURN_IF_ERROR(need(info.region, "region"));
  LZ_RETURN_IF_ERROR(need(info.zone, "zone"));
  LZ_RETURN_IF_ERROR(need(info.row, "row"));
  LZ_RETURN_IF_ERROR(need(info.rack, "rack"));
  if (info.meta.gpus < 0) return InvalidArgument("gpus: must not be negative");
  if (info.meta.memory_gb < 0) return InvalidArgument("memory_gb: must not be negative");
  if (info.meta.power_w < 0) return InvalidArgument("power_w: must not be negative");
  if (!node_by_name_.empty() && node_by_name_[NameBucket(info.name)] != kNoNode) return AlreadyExists("name: node '" + info.name + "' already exists");
  if (type_by_name_.size() >= TypeId::kInvalidValue - 1 && !type_by_name_.count(info.type)) {
    return ResourceExhausted("type: too many hardware types");
  }

  TypeId type;
  if (auto it = type_by_name_.find(info.type); it != type_by_name_.end()) {
    type = it->second;
  } else {
    type = TypeId(static_cast<uint16_t>(type_names_.size()));
    type_names_.push_back(info.type);
    type_by_name_.emplace(info.type, type);
  }
  LocationId region = GetOrAddLocation(kRootLocation, Level::kRegion, info.region);
  LocationId zone = GetOrAddLocation(region, Level::kZone, info.zone);
  LocationId row = GetOrAddLocation(zone, Level::kRow, info.row);
  LocationId rack = GetOrAddLocation(row, Level::kRack, info.rack);

  VertexId v = GetOrAddVertex(type, kRootLocation, Level::kRoot, VertexId());
  v = GetOrAddVertex(type, region, Level::kRegion, v);
  v = GetOrAddVertex(type, zone, Level::kZone, v);
  v = GetOrAddVertex(type, row, Level::kRow, v);
  v = GetOrAddVertex(type, rack, Level::kRack, v);

  NodeId id(static_cast<uint32_t>(nodes_.size()));
  VertexId leaf(static_cast<uint32_t>(vertices_.size()));
  vertices_.push_back(Vertex{type, Level::kNode, rack, id, v});
  nodes_.push_back(Node{info.name, type, true, rack, info.meta, leaf});
  IndexName(id);
  ++live_nodes_;
  dirty_ = true;
  ++generation_;
  return id;
}

void Topology::ShrinkToFit() {
  // Three quarters full (and one bucket free at least), for as long as no node is added.
  if (!nodes_.empty()) RehashNames(nodes_.size() + nodes_.size() / 3 + 1);
  nodes_.shrink_to_fit();
  vertices_.shrink_to_fit();
  locations_.shrink_to_fit();
}

Status Topology::RemoveNode(NodeId n) {
  if (!IsLiveNode(n)) return NotFound("node: no live node with id " + std::to_string(n.value));
  nodes_[n.value].alive = false;
  --live_nodes_;
  dirty_ = true;
  ++generation_;
  return Status::Ok();
}

Result<NodeId> Topology::FindNode(std::string_view name) const {
  uint32_t n = node_by_name_.empty() ? kNoNode : node_by_name_[NameBucket(name)];
  if (n == kNoNode) return NotFound("node: no node named '" + std::string(name) + "'");
  return NodeId(n);
}

size_t Topology::NameBucket(std::string_view name) const {
  const size_t size = node_by_name_.size();
  // The hash scaled to [0, size) (any size, not only powers of two).
  uint64_t h = std::hash<std::string_view>()(name);
  size_t i = static_cast<size_t>((static_cast<unsigned __int128>(h) * size) >> 64);
  for (;; i = i + 1 == size ? 0 : i + 1) {
    uint32_t n = node_by_name_[i];
    if (n == kNoNode || nodes_[n].name == name) return i;
  }
}

void Topology::RehashNames(size_t buckets) {
  std::vector<uint32_t> old(buckets, kNoNode);
  old.swap(node_by_name_);
  for (uint32_t n : old) {
    if (n != kNoNode) node_by_name_[NameBucket(nodes_[n].name)] = n;
  }
}

void Topology::IndexName(NodeId id) {
  // nodes_ holds the new node already: keep the table at most half full.
  if (2 * nodes_.size() > node_by_name_.size()) RehashNames(std::max<size_t>(16, 4 * nodes_.size()));
  node_by_name_[NameBucket(nodes_[id.value].name)] = id.value;
}

Result<TypeId> Topology::FindType(std::string_view name) const {
  auto it = type_by_name_.find(std::string(name));
  if (it == type_by_name_.end()) return NotFound("type: no hardware type named '" + std::string(name) + "'");
  return it->second;
}

Result<LocationId> Topology::FindLocation(std::string_view path) const {
  auto it = location_by_path_.find(std::string(path));
  if (it == location_by_path_.end()) return NotFound("location: no location '" + std::string(path) + "'");
  return it->second;
}

LocationId Topology::AncestorAt(LocationId loc, Level level) const {
  while (loc.valid() && locations_[loc.value].level > level) loc = locations_[loc.value].parent;
  if (!loc.valid() || locations_[loc.value].level != level) return LocationId();
  return loc;
}

bool Topology::LocationContains(LocationId outer, LocationId inner) const {
  Level lo = locations_[outer.value].level;
  if (locations_[inner.value].level < lo) return false;
  return AncestorAt(inner, lo) == outer;
}

VertexId Topology::VertexAt(TypeId type, LocationId loc) const {
  auto it = vertex_by_type_loc_.find(TypeLocKey(type, loc));
  return it == vertex_by_type_loc_.end() ? VertexId() : it->second;
}

Result<VertexId> Topology::FindVertex(std::string_view name) const {
  auto slash = name.find('/');
  std::string_view tname = name.substr(0, slash);
  if (auto t = type_by_name_.find(std::string(tname)); t != type_by_name_.end()) {
    std::string_view lpath = slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
    auto loc = FindLocation(lpath);
    if (!loc.ok()) return NotFound("vertex: no location '" + std::string(lpath) + "' for '" + std::string(name) + "'");
    VertexId v = VertexAt(t->second, *loc);
    if (!v.valid()) return NotFound("vertex: no " + std::string(tname) + " node lies below '" + std::string(lpath) + "'");
    return v;
  }
  auto n = FindNode(name);
  if (n.ok() && IsLiveNode(*n)) return nodes_[n->value].leaf;
  return NotFound("vertex: '" + std::string(name) + "' is neither TYPE[/location path] nor a node name");
}

std::string Topology::VertexName(VertexId v) const {
  const Vertex& x = vertices_[v.value];
  if (x.level == Level::kNode) return nodes_[x.node.value].name;
  const std::string& p = locations_[x.location.value].path;
  return p.empty() ? type_names_[x.type.value] : type_names_[x.type.value] + "/" + p;
}

void Topology::AncestorsOf(VertexId v, std::vector<VertexId>* out) const {
  out->clear();
  for (; v.valid(); v = vertices_[v.value].parent) out->push_back(v);
}

bool Topology::VertexContains(VertexId outer, VertexId inner) const {
  const Vertex& o = vertices_[outer.value];
  const Vertex& i = vertices_[inner.value];
  if (o.type != i.type) return false;
  if (o.level == Level::kNode) return outer == inner;
  return LocationContains(o.location, i.location);
}

void Topology::RebuildIfDirty() const {
  if (!dirty_) return;
  dirty_ = false;
  leaf_order_.assign(type_names_.size(), {});
  vertex_range_.assign(vertices_.size(), {0, 0});
  leaf_index_.assign(nodes_.size(), UINT32_MAX);
  // Live nodes by rack, in id order: counted, then placed in one array (issue 12: a vector per
  // location and a std::function walk made each rebuild after a node's addition or removal
  // about 70k instructions at 256 nodes, mostly allocations). After the placement, rack r's
  // nodes are by_rack[end[r - 1] .. end[r]) (from 0 for the first location).
  std::vector<uint32_t> end(locations_.size(), 0);
  std::vector<size_t> per_type(type_names_.size(), 0);
  uint32_t live = 0;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].alive) {
      ++end[nodes_[i].rack.value];
      ++per_type[nodes_[i].type.value];
      ++live;
    }
  }
  for (uint32_t l = 0, sum = 0; l < end.size(); ++l) {
    const uint32_t count = end[l];
    end[l] = sum;  // For now, where the next of its nodes goes.
    sum += count;
  }
  std::vector<NodeId> by_rack(live);
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].alive) by_rack[end[nodes_[i].rack.value]++] = NodeId(i);
  }
  for (size_t t = 0; t < per_type.size(); ++t) leaf_order_[t].reserve(per_type[t]);  // Exact: no growth slack.
  // Depth-first walk of locations in insertion order; ranges of every vertex. The vertices of
  // the locations open on the walk's path, with where their ranges start, are a stack.
  std::vector<std::pair<VertexId, uint32_t>> starts;
  auto walk = [&](auto& self, LocationId loc) -> void {
    const size_t mark = starts.size();
    for (size_t t = 0; t < type_names_.size(); ++t) {
      VertexId v = VertexAt(TypeId(static_cast<uint16_t>(t)), loc);
      if (v.valid()) starts.emplace_back(v, static_cast<uint32_t>(leaf_order_[t].size()));
    }
    for (uint32_t k = loc.value == 0 ? 0 : end[loc.value - 1]; k < end[loc.value]; ++k) {
      const NodeId n = by_rack[k];
      const Node& node = nodes_[n.value];
      auto& order = leaf_order_[node.type.value];
      uint32_t idx = static_cast<uint32_t>(order.size());
      order.push_back(n);
      leaf_index_[n.value] = idx;
      vertex_range_[node.leaf.value] = {idx, idx + 1};
    }
    for (LocationId c : locations_[loc.value].children) self(self, c);
    for (size_t k = mark; k < starts.size(); ++k) {
      const auto [v, start] = starts[k];
      vertex_range_[v.value] = {start, static_cast<uint32_t>(leaf_order_[vertices_[v.value].type.value].size())};
    }
    starts.resize(mark);
  };
  walk(walk, kRootLocation);
}

std::span<const NodeId> Topology::LeafOrder(TypeId type) const {
  RebuildIfDirty();
  return leaf_order_[type.value];
}

}  // namespace laissez::topology
