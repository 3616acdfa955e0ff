#include "topology/cluster_yaml.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace laissez::topology {
namespace {

// A generated count larger than this is almost certainly a typo, and would
// allocate without bound before anything else could fail.
constexpr int64_t kMaxCount = 1'000'000;

struct HwType {
  NodeMeta meta;
};

// yaml-cpp throws; this file converts every failure into a Status naming the
// YAML path and the line, and never lets an exception escape.
class Parser {
 public:
  Result<ClusterSpec> Run(std::string_view text) {
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::Exception& e) {
      return InvalidArgument(At("", e.mark) + e.msg);
    }
    try {
      Status s = ParseRoot(root);
      if (!s.ok()) return s;
    } catch (const YAML::Exception& e) {
      // Defensive: conversions below are checked, but yaml-cpp may still throw
      // on malformed node access.
      return InvalidArgument(At("", e.mark) + e.msg);
    }
    return std::move(spec_);
  }

 private:
  static std::string At(const std::string& path, const YAML::Mark& mark) {
    std::string s = path.empty() ? std::string("document") : path;
    if (!mark.is_null()) {
      s += " (line " + std::to_string(mark.line + 1) + ", column " + std::to_string(mark.column + 1) + ")";
    }
    return s + ": ";
  }
  static Status Error(const std::string& path, const YAML::Node& node, const std::string& reason) {
    return InvalidArgument(At(path, node.Mark()) + reason);
  }

  static const char* KindName(const YAML::Node& n) {
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    if (n.IsScalar()) return "a scalar";
    return "null";
  }

  // Checks that `node` is a mapping whose keys are all in `allowed` and unique.
  static Status CheckMap(const std::string& path, const YAML::Node& node, std::initializer_list<const char*> allowed) {
    if (!node.IsMap()) return Error(path, node, std::string("must be a mapping, not ") + KindName(node));
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) return Error(path, key, "keys must be scalars");
      const std::string& k = key.Scalar();
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        return Error(path, key, "unknown key '" + k + "' (expected one of: " + list + ")");
      }
      if (!seen.insert(k).second) return Error(path, key, "duplicate key '" + k + "'");
    }
    return Status::Ok();
  }

  static Status GetString(const std::string& path, const YAML::Node& map, const char* key, std::string* out) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) return Error(path, map, std::string(key) + ": missing");
    if (!v.IsScalar()) return Error(path + "." + key, v, std::string("must be a string, not ") + KindName(v));
    const std::string& s = v.Scalar();
    if (s.empty()) return Error(path + "." + key, v, "must not be empty");
    if (s.find('/') != std::string::npos) return Error(path + "." + key, v, "'" + s + "' must not contain '/'");
    *out = s;
    return Status::Ok();
  }

  // Reads a non-negative integer in [min, max]. Accepts only plain decimal
  // integers, so "1.5", "8GB" or "true" are rejected rather than truncated.
  static Status GetInt(const std::string& path, const YAML::Node& map, const char* key, int64_t min, int64_t max,
                       int64_t* out) {
    const YAML::Node v = map[key];
    std::string p = path + "." + key;
    if (!v.IsDefined() || v.IsNull()) return Error(path, map, std::string(key) + ": missing");
    if (!v.IsScalar()) return Error(p, v, std::string("must be an integer, not ") + KindName(v));
    const std::string& s = v.Scalar();
    int64_t x = 0;
    const char* b = s.data();
    const char* e = s.data() + s.size();
    auto [ptr, ec] = std::from_chars(b, e, x);
    if (ec == std::errc::result_out_of_range) return Error(p, v, "'" + s + "' is out of range");
    if (s.empty() || ec != std::errc() || ptr != e) return Error(p, v, "'" + s + "' is not an integer");
    if (x < 0 && min >= 0) return Error(p, v, "must not be negative (got " + s + ")");
    if (x < min) return Error(p, v, "must be at least " + std::to_string(min) + " (got " + s + ")");
    if (x > max) return Error(p, v, "must be at most " + std::to_string(max) + " (got " + s + ")");
    *out = x;
    return Status::Ok();
  }

  static Status GetList(const std::string& path, const YAML::Node& map, const char* key, YAML::Node* out) {
    const YAML::Node v = map[key];
    if (!v.IsDefined() || v.IsNull()) return Error(path, map, std::string(key) + ": missing");
    if (!v.IsSequence()) return Error(path + "." + key, v, std::string("must be a list, not ") + KindName(v));
    *out = v;
    return Status::Ok();
  }

  static std::string Index(const std::string& path, const char* key, size_t i) {
    std::string p = path.empty() ? std::string(key) : path + "." + key;
    return p + "[" + std::to_string(i) + "]";
  }

  Status ParseRoot(const YAML::Node& root) {
    if (!root.IsDefined() || root.IsNull()) return Error("", root, "empty document (expected 'types' and 'regions')");
    LZ_RETURN_IF_ERROR(CheckMap("", root, {"types", "regions"}));
    YAML::Node types;
    LZ_RETURN_IF_ERROR(GetList("document", root, "types", &types));
    for (size_t i = 0; i < types.size(); ++i) LZ_RETURN_IF_ERROR(ParseType(Index("", "types", i), types[i]));
    YAML::Node regions;
    LZ_RETURN_IF_ERROR(GetList("document", root, "regions", &regions));
    std::set<std::string> names;
    for (size_t i = 0; i < regions.size(); ++i) {
      std::string p = Index("", "regions", i);
      const YAML::Node r = regions[i];
      LZ_RETURN_IF_ERROR(CheckMap(p, r, {"name", "zones"}));
      std::string name;
      LZ_RETURN_IF_ERROR(GetString(p, r, "name", &name));
      if (!names.insert(name).second) return Error(p + ".name", r["name"], "duplicate region '" + name + "'");
      YAML::Node zones;
      LZ_RETURN_IF_ERROR(GetList(p, r, "zones", &zones));
      std::set<std::string> znames;
      for (size_t j = 0; j < zones.size(); ++j) {
        LZ_RETURN_IF_ERROR(ParseZone(Index(p, "zones", j), zones[j], name, &znames));
      }
    }
    return Status::Ok();
  }

  Status ParseType(const std::string& p, const YAML::Node& t) {
    LZ_RETURN_IF_ERROR(CheckMap(p, t, {"name", "gpus", "memory_gb", "power_w"}));
    std::string name;
    LZ_RETURN_IF_ERROR(GetString(p, t, "name", &name));
    constexpr int64_t kI32 = std::numeric_limits<int32_t>::max();
    int64_t gpus = 0, mem = 0, power = 0;
    LZ_RETURN_IF_ERROR(GetInt(p, t, "gpus", 0, kI32, &gpus));
    LZ_RETURN_IF_ERROR(GetInt(p, t, "memory_gb", 0, kI32, &mem));
    LZ_RETURN_IF_ERROR(GetInt(p, t, "power_w", 0, kI32, &power));
    if (types_.count(name)) return Error(p + ".name", t["name"], "duplicate type '" + name + "'");
    types_[name] = HwType{NodeMeta{static_cast<int32_t>(gpus), static_cast<int32_t>(mem), static_cast<int32_t>(power)}};
    return Status::Ok();
  }

  Status ParseZone(const std::string& p, const YAML::Node& z, const std::string& region, std::set<std::string>* names) {
    LZ_RETURN_IF_ERROR(CheckMap(p, z, {"name", "rows"}));
    std::string name;
    LZ_RETURN_IF_ERROR(GetString(p, z, "name", &name));
    if (!names->insert(name).second) return Error(p + ".name", z["name"], "duplicate zone '" + name + "'");
    YAML::Node rows;
    LZ_RETURN_IF_ERROR(GetList(p, z, "rows", &rows));
    std::set<std::string> rnames;
    for (size_t i = 0; i < rows.size(); ++i) {
      std::string rp = Index(p, "rows", i);
      const YAML::Node r = rows[i];
      LZ_RETURN_IF_ERROR(CheckMap(rp, r, {"name", "power_cap_w", "racks"}));
      std::string row;
      LZ_RETURN_IF_ERROR(GetString(rp, r, "name", &row));
      if (!rnames.insert(row).second) return Error(rp + ".name", r["name"], "duplicate row '" + row + "'");
      if (r["power_cap_w"].IsDefined()) {
        int64_t cap = 0;
        LZ_RETURN_IF_ERROR(GetInt(rp, r, "power_cap_w", 1, std::numeric_limits<int64_t>::max(), &cap));
        spec_.power_caps.push_back(RowPowerCap{region + "/" + name + "/" + row, cap});
      }
      YAML::Node racks;
      LZ_RETURN_IF_ERROR(GetList(rp, r, "racks", &racks));
      std::set<std::string> knames;
      for (size_t k = 0; k < racks.size(); ++k) {
        std::string kp = Index(rp, "racks", k);
        const YAML::Node rack = racks[k];
        LZ_RETURN_IF_ERROR(CheckMap(kp, rack, {"name", "nodes"}));
        std::string rack_name;
        LZ_RETURN_IF_ERROR(GetString(kp, rack, "name", &rack_name));
        if (!knames.insert(rack_name).second) {
          return Error(kp + ".name", rack["name"], "duplicate rack '" + rack_name + "'");
        }
        YAML::Node nodes;
        LZ_RETURN_IF_ERROR(GetList(kp, rack, "nodes", &nodes));
        NodeInfo base;
        base.region = region;
        base.zone = name;
        base.row = row;
        base.rack = rack_name;
        std::map<std::string, int64_t> next_index;  // Per type within this rack.
        for (size_t n = 0; n < nodes.size(); ++n) {
          LZ_RETURN_IF_ERROR(ParseNodes(Index(kp, "nodes", n), nodes[n], base, &next_index));
        }
      }
    }
    return Status::Ok();
  }

  Status ParseNodes(const std::string& p, const YAML::Node& e, const NodeInfo& base,
                    std::map<std::string, int64_t>* next_index) {
    LZ_RETURN_IF_ERROR(CheckMap(p, e, {"name", "type", "count"}));
    std::string type;
    LZ_RETURN_IF_ERROR(GetString(p, e, "type", &type));
    auto t = types_.find(type);
    if (t == types_.end()) {
      std::string known;
      for (const auto& [k, v] : types_) known += std::string(known.empty() ? "" : ", ") + k;
      return Error(p + ".type", e["type"], "unknown type '" + type + "' (declared types: " + known + ")");
    }
    bool has_name = e["name"].IsDefined();
    bool has_count = e["count"].IsDefined();
    if (has_name == has_count) return Error(p, e, "exactly one of 'name' or 'count' is required");
    NodeInfo info = base;
    info.type = type;
    info.meta = t->second.meta;
    if (has_name) {
      LZ_RETURN_IF_ERROR(GetString(p, e, "name", &info.name));
      return AddNode(p + ".name", e["name"], std::move(info));
    }
    int64_t count = 0;
    LZ_RETURN_IF_ERROR(GetInt(p, e, "count", 0, kMaxCount, &count));
    if (static_cast<int64_t>(spec_.nodes.size()) + count > kMaxCount * 10) {
      return Error(p + ".count", e["count"], "the cluster would exceed " + std::to_string(kMaxCount * 10) + " nodes");
    }
    int64_t& next = (*next_index)[type];
    for (int64_t i = 0; i < count; ++i) {
      info.name = base.zone + "-" + base.row + "-" + base.rack + "-" + type + "-" + std::to_string(next++);
      LZ_RETURN_IF_ERROR(AddNode(p + ".count", e["count"], info));
    }
    return Status::Ok();
  }

  Status AddNode(const std::string& p, const YAML::Node& at, NodeInfo info) {
    auto [it, inserted] = name_line_.try_emplace(info.name, at.Mark().line + 1);
    if (!inserted) {
      return Error(p, at, "duplicate node name '" + info.name + "' (first defined on line " +
                              std::to_string(it->second) + ")");
    }
    spec_.nodes.push_back(std::move(info));
    return Status::Ok();
  }

  std::map<std::string, HwType> types_;
  std::unordered_map<std::string, int> name_line_;
  ClusterSpec spec_;
};

}  // namespace

Result<ClusterSpec> ParseClusterYaml(std::string_view yaml_text) { return Parser().Run(yaml_text); }

Result<ClusterSpec> LoadClusterYaml(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cluster file: cannot open '" + path + "'");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return DataLoss("cluster file: error reading '" + path + "'");
  auto r = ParseClusterYaml(buf.str());
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

}  // namespace laissez::topology
