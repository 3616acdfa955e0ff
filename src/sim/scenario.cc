#include "sim/scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "common/money.h"
#include "sim/rng.h"

#ifndef LAISSEZ_SOURCE_DIR
#define LAISSEZ_SOURCE_DIR "."
#endif

namespace laissez::sim {

const char* JobKindName(JobKind k) {
  switch (k) {
    case JobKind::kTraining: return "training";
    case JobKind::kInference: return "inference";
    case JobKind::kGenomics: return "genomics";
    case JobKind::kHpc: return "hpc";
  }
  return "?";
}

const char* UtilityName(Utility u) { return u == Utility::kValue ? "value" : "retention"; }

double OfferedNodeHours(const World& world, uint32_t job) {
  const Job& j = world.jobs[job];
  const size_t minute = static_cast<size_t>(60 * kMicrosPerSecond);
  const size_t end = std::min(j.need.size(), static_cast<size_t>(world.horizon) / minute);
  double sum = 0;
  for (size_t m = static_cast<size_t>(j.arrival) / minute; m < end; ++m) sum += j.need[m];
  return sum / 60.0;
}

int World::TypeIndex(const std::string& name) const {
  for (size_t i = 0; i < types.size(); ++i)
    if (types[i].name == name) return static_cast<int>(i);
  return -1;
}

uint32_t World::NodesOfType(int type) const {
  uint32_t n = 0;
  for (const SimNode& s : nodes) n += s.type == type;
  return n;
}

namespace {

Status Bad(const std::string& field, const std::string& why) { return InvalidArgument(field + ": " + why); }

Result<double> Num(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) return Bad(field, "must be a number");
  try {
    double v = n.as<double>();
    if (!std::isfinite(v)) return Bad(field, "must be finite");
    return v;
  } catch (const YAML::Exception&) {
    return Bad(field, "must be a number, got '" + n.Scalar() + "'");
  }
}
Result<double> NonNeg(const YAML::Node& n, const std::string& field) {
  LZ_ASSIGN_OR_RETURN(double v, Num(n, field));
  if (v < 0) return Bad(field, "must not be negative");
  return v;
}
Result<Micros> Dur(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) return Bad(field, "must be a duration such as 90s, 30m or 2h");
  return ParseDuration(n.Scalar(), field);
}
Result<Price> MoneyOf(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) return Bad(field, "must be an amount of money");
  if (n.Scalar() == "inf") return kInfPrice;
  return ParseMoney(n.Scalar(), field);
}

Result<JobKind> KindOf(const std::string& s, const std::string& field) {
  if (s == "training") return JobKind::kTraining;
  if (s == "inference") return JobKind::kInference;
  if (s == "genomics") return JobKind::kGenomics;
  if (s == "hpc") return JobKind::kHpc;
  return Bad(field, "unknown kind '" + s + "' (training, inference, genomics, hpc)");
}

Status ParseWorkload(const YAML::Node& w, const std::string& f, WorkloadSpec* out) {
  static const char* kKeys[] = {"kind", "share", "nodes", "hours", "speed", "checkpoint_interval",
                                "checkpoint_save", "restore", "spread_factor", "value", "deadline_slack",
                                "tenants", "peak_nodes", "trace", "source"};
  for (auto it = w.begin(); it != w.end(); ++it) {
    std::string k = it->first.as<std::string>();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* x) { return k == x; }) == std::end(kKeys))
      return Bad(f + "." + k, "unknown key");
  }
  if (!w["kind"]) return Bad(f + ".kind", "is required");
  LZ_ASSIGN_OR_RETURN(out->kind, KindOf(w["kind"].as<std::string>(), f + ".kind"));
  if (w["share"]) { LZ_ASSIGN_OR_RETURN(out->share, NonNeg(w["share"], f + ".share")); }
  if (w["nodes"]) {
    out->nodes.clear();
    const YAML::Node& n = w["nodes"];
    if (n.IsScalar()) {
      LZ_ASSIGN_OR_RETURN(double v, NonNeg(n, f + ".nodes"));
      out->nodes.push_back(static_cast<uint32_t>(v));
    } else {
      for (size_t i = 0; i < n.size(); ++i) {
        LZ_ASSIGN_OR_RETURN(double v, NonNeg(n[i], f + ".nodes[" + std::to_string(i) + "]"));
        out->nodes.push_back(static_cast<uint32_t>(v));
      }
    }
    for (uint32_t v : out->nodes)
      if (v == 0) return Bad(f + ".nodes", "gang sizes must be positive");
    if (out->nodes.empty()) return Bad(f + ".nodes", "must list at least one gang size");
  }
  if (const YAML::Node& h = w["hours"]) {
    if (h["median"]) { LZ_ASSIGN_OR_RETURN(out->hours_median, NonNeg(h["median"], f + ".hours.median")); }
    if (h["sigma"]) { LZ_ASSIGN_OR_RETURN(out->hours_sigma, NonNeg(h["sigma"], f + ".hours.sigma")); }
    if (h["min"]) { LZ_ASSIGN_OR_RETURN(out->hours_min, NonNeg(h["min"], f + ".hours.min")); }
    if (h["max"]) { LZ_ASSIGN_OR_RETURN(out->hours_max, NonNeg(h["max"], f + ".hours.max")); }
    if (out->hours_median <= 0) return Bad(f + ".hours.median", "must be positive");
  }
  if (const YAML::Node& s = w["speed"]) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      std::string t = it->first.as<std::string>();
      LZ_ASSIGN_OR_RETURN(double v, NonNeg(it->second, f + ".speed." + t));
      if (v > 1.0) return Bad(f + ".speed." + t, "must be at most 1 (relative to the preferred type)");
      out->speed[t] = v;
    }
  }
  if (w["checkpoint_interval"]) { LZ_ASSIGN_OR_RETURN(out->ckpt_interval, Dur(w["checkpoint_interval"], f + ".checkpoint_interval")); }
  if (w["checkpoint_save"]) { LZ_ASSIGN_OR_RETURN(out->ckpt_save, Dur(w["checkpoint_save"], f + ".checkpoint_save")); }
  if (w["restore"]) { LZ_ASSIGN_OR_RETURN(out->restore, Dur(w["restore"], f + ".restore")); }
  if (w["spread_factor"]) {
    LZ_ASSIGN_OR_RETURN(out->spread_factor, NonNeg(w["spread_factor"], f + ".spread_factor"));
    if (out->spread_factor > 1) return Bad(f + ".spread_factor", "must be at most 1");
  }
  if (const YAML::Node& v = w["value"]) {
    if (v["median"]) { LZ_ASSIGN_OR_RETURN(out->value_median, NonNeg(v["median"], f + ".value.median")); }
    if (v["sigma"]) { LZ_ASSIGN_OR_RETURN(out->value_sigma, NonNeg(v["sigma"], f + ".value.sigma")); }
  }
  if (const YAML::Node& d = w["deadline_slack"]) {
    if (!d.IsSequence() || d.size() != 2) return Bad(f + ".deadline_slack", "must be [lo, hi]");
    LZ_ASSIGN_OR_RETURN(out->deadline_slack.lo, NonNeg(d[0], f + ".deadline_slack[0]"));
    LZ_ASSIGN_OR_RETURN(out->deadline_slack.hi, NonNeg(d[1], f + ".deadline_slack[1]"));
    if (out->deadline_slack.lo < 1 || out->deadline_slack.hi < out->deadline_slack.lo)
      return Bad(f + ".deadline_slack", "needs 1 <= lo <= hi");
  }
  if (w["tenants"]) {
    LZ_ASSIGN_OR_RETURN(double t, NonNeg(w["tenants"], f + ".tenants"));
    out->tenants = static_cast<int>(t);
  }
  if (w["peak_nodes"]) { LZ_ASSIGN_OR_RETURN(out->peak_nodes, NonNeg(w["peak_nodes"], f + ".peak_nodes")); }
  if (w["trace"]) out->trace = w["trace"].as<std::string>();
  if (out->speed.empty()) return Bad(f + ".speed", "must give the throughput of at least one type");
  if (out->kind == JobKind::kInference && out->trace.empty()) return Bad(f + ".trace", "is required for inference");
  return Status::Ok();
}

}  // namespace

Result<Scenario> ParseScenario(std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("scenario: not valid YAML: ") + e.what());
  }
  if (!root.IsMap()) return InvalidArgument("scenario: must be a YAML mapping");
  Scenario s;
  try {
    static const char* kKeys[] = {"name", "description", "data_rows", "seed", "duration", "arrival_window", "tick",
                                  "contention", "drain", "market", "tenants", "cluster", "types", "workloads"};
    for (auto it = root.begin(); it != root.end(); ++it) {
      std::string k = it->first.as<std::string>();
      if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* x) { return k == x; }) == std::end(kKeys))
        return Bad(k, "unknown key");
    }
    if (root["name"]) s.name = root["name"].as<std::string>();
    if (root["description"]) s.description = root["description"].as<std::string>();
    if (root["seed"]) {
      LZ_ASSIGN_OR_RETURN(double v, NonNeg(root["seed"], "seed"));
      s.seed = static_cast<uint64_t>(v);
    }
    if (root["duration"]) { LZ_ASSIGN_OR_RETURN(s.duration, Dur(root["duration"], "duration")); }
    if (root["arrival_window"]) { LZ_ASSIGN_OR_RETURN(s.arrival_window, Dur(root["arrival_window"], "arrival_window")); }
    if (root["tick"]) { LZ_ASSIGN_OR_RETURN(s.tick, Dur(root["tick"], "tick")); }
    if (s.duration <= 0) return Bad("duration", "must be positive");
    if (s.arrival_window <= 0 || s.arrival_window > s.duration)
      return Bad("arrival_window", "must be positive and at most the duration");
    if (s.tick <= 0) return Bad("tick", "must be positive");
    if (const YAML::Node& d = root["drain"]) {
      if (d.IsScalar()) {
        s.drain = d.as<bool>();
      } else {
        if (d["enabled"]) s.drain = d["enabled"].as<bool>();
        if (d["factor"]) { LZ_ASSIGN_OR_RETURN(s.drain_factor, NonNeg(d["factor"], "drain.factor")); }
        if (s.drain_factor < 1) return Bad("drain.factor", "must be at least 1 (a multiple of the duration)");
      }
    }
    if (root["contention"]) { LZ_ASSIGN_OR_RETURN(s.contention, NonNeg(root["contention"], "contention")); }
    if (const YAML::Node& m = root["market"]) {
      if (m["grace"]) { LZ_ASSIGN_OR_RETURN(s.market.grace, Dur(m["grace"], "market.grace")); }
      if (m["hysteresis_ppm"]) { LZ_ASSIGN_OR_RETURN(double v, NonNeg(m["hysteresis_ppm"], "market.hysteresis_ppm")); s.market.hysteresis_ppm = static_cast<Ppm>(v); }
      if (m["clip_alpha_ppm"]) { LZ_ASSIGN_OR_RETURN(double v, NonNeg(m["clip_alpha_ppm"], "market.clip_alpha_ppm")); s.market.clip_alpha_ppm = static_cast<Ppm>(v); }
      if (m["clip_interval"]) { LZ_ASSIGN_OR_RETURN(s.market.clip_interval, Dur(m["clip_interval"], "market.clip_interval")); }
      if (m["decay_beta"]) { LZ_ASSIGN_OR_RETURN(s.market.decay_beta, MoneyOf(m["decay_beta"], "market.decay_beta")); }
      if (m["min_hold"]) { LZ_ASSIGN_OR_RETURN(s.market.min_hold, Dur(m["min_hold"], "market.min_hold")); }
      LZ_RETURN_IF_ERROR(market::ValidateParams(s.market));
    }
    if (const YAML::Node& t = root["tenants"]) {
      if (t["overhead_estimate"]) { LZ_ASSIGN_OR_RETURN(s.overhead_estimate, NonNeg(t["overhead_estimate"], "tenants.overhead_estimate")); }
      if (t["urgency"]) { LZ_ASSIGN_OR_RETURN(s.urgency, NonNeg(t["urgency"], "tenants.urgency")); }
      if (t["autoscale_headroom"]) { LZ_ASSIGN_OR_RETURN(s.autoscale_headroom, NonNeg(t["autoscale_headroom"], "tenants.autoscale_headroom")); }
      if (t["budget_factor"]) { LZ_ASSIGN_OR_RETURN(s.budget_factor, NonNeg(t["budget_factor"], "tenants.budget_factor")); }
      if (t["migration_aware"]) s.migration_aware = t["migration_aware"].as<bool>();
      if (t["utility"]) {
        std::string u = t["utility"].as<std::string>();
        if (u == "retention") s.utility = Utility::kRetention;
        else if (u == "value") s.utility = Utility::kValue;
        else return Bad("tenants.utility", "must be 'retention' or 'value', not '" + u + "'");
      }
      if (t["retention_value"]) {
        LZ_ASSIGN_OR_RETURN(s.retention_value, MoneyOf(t["retention_value"], "tenants.retention_value"));
        if (s.retention_value <= 0) return Bad("tenants.retention_value", "must be positive");
      }
      if (t["estimate_sigma"]) { LZ_ASSIGN_OR_RETURN(s.estimate_sigma, NonNeg(t["estimate_sigma"], "tenants.estimate_sigma")); }
      if (t["low_urgency_share"]) { LZ_ASSIGN_OR_RETURN(s.low_urgency_share, NonNeg(t["low_urgency_share"], "tenants.low_urgency_share")); }
      if (t["low_urgency"]) { LZ_ASSIGN_OR_RETURN(s.low_urgency, NonNeg(t["low_urgency"], "tenants.low_urgency")); }
    }
    if (const YAML::Node& t = root["types"]) {
      for (size_t i = 0; i < t.size(); ++i) {
        std::string f = "types[" + std::to_string(i) + "]";
        HwType h;
        if (!t[i]["name"]) return Bad(f + ".name", "is required");
        h.name = t[i]["name"].as<std::string>();
        if (t[i]["gpus"]) h.gpus = t[i]["gpus"].as<int>();
        if (t[i]["power_w"]) { LZ_ASSIGN_OR_RETURN(double p, NonNeg(t[i]["power_w"], f + ".power_w")); h.power_w = static_cast<int>(p); }
        if (!t[i]["list_price"]) return Bad(f + ".list_price", "is required");
        LZ_ASSIGN_OR_RETURN(h.list_price, MoneyOf(t[i]["list_price"], f + ".list_price"));
        if (t[i]["spot_price"]) { LZ_ASSIGN_OR_RETURN(h.spot_price, MoneyOf(t[i]["spot_price"], f + ".spot_price")); }
        for (const HwType& o : s.types)
          if (o.name == h.name) return Bad(f + ".name", "duplicate type '" + h.name + "'");
        s.types.push_back(h);
      }
    }
    if (s.types.empty()) return Bad("types", "must list at least one hardware type");
    if (const YAML::Node& c = root["cluster"]) {
      if (c["region"]) s.region = c["region"].as<std::string>();
      if (c["zone"]) s.zone = c["zone"].as<std::string>();
      if (c["rows"]) s.rows = c["rows"].as<int>();
      if (c["racks_per_row"]) s.racks_per_row = c["racks_per_row"].as<int>();
      if (c["nodes"]) s.node_count = c["nodes"].as<int>();
      if (s.rows <= 0) return Bad("cluster.rows", "must be positive");
      if (s.racks_per_row <= 0) return Bad("cluster.racks_per_row", "must be positive");
      if (s.node_count <= 0) return Bad("cluster.nodes", "must be positive");
      if (const YAML::Node& comp = c["composition"]) {
        for (auto it = comp.begin(); it != comp.end(); ++it) {
          std::string t = it->first.as<std::string>();
          LZ_ASSIGN_OR_RETURN(double v, NonNeg(it->second, "cluster.composition." + t));
          if (std::none_of(s.types.begin(), s.types.end(), [&](const HwType& h) { return h.name == t; }))
            return Bad("cluster.composition." + t, "unknown type");
          s.composition[t] = v;
        }
      }
      if (const YAML::Node& pc = c["power_caps"]) {
        for (size_t i = 0; i < pc.size(); ++i) {
          std::string f = "cluster.power_caps[" + std::to_string(i) + "]";
          RowCap rc;
          rc.row = pc[i]["row"].as<int>();
          LZ_ASSIGN_OR_RETURN(double cap, NonNeg(pc[i]["cap_w"], f + ".cap_w"));
          rc.cap_w = static_cast<int64_t>(cap);
          if (rc.row < 0 || rc.row >= s.rows) return Bad(f + ".row", "no such row");
          if (rc.cap_w <= 0) return Bad(f + ".cap_w", "must be positive");
          s.power_caps.push_back(rc);
        }
      }
      if (const YAML::Node& pa = c["power_adaptive"]) {
        // Fractions as decimals, money per node-hour, interval as a duration;
        // no max_floor means none. Checked by the engine's own validation.
        const std::string f = "cluster.power_adaptive.";
        if (!pa.IsMap()) return Bad("cluster.power_adaptive", "must be a map");
        for (auto it = pa.begin(); it != pa.end(); ++it) {
          static const std::set<std::string> kKeys = {"margin", "band", "interval", "rise", "rise_min",
                                                      "rise_max", "fall", "min_floor", "max_floor"};
          if (!kKeys.count(it->first.as<std::string>())) return Bad(f + it->first.as<std::string>(), "unknown field");
        }
        auto need = [&](const char* k) -> Result<YAML::Node> {
          if (!pa[k]) return Bad(f + k, "is required");
          return pa[k];
        };
        auto ppm = [&](const char* k) -> Result<Ppm> {
          LZ_ASSIGN_OR_RETURN(YAML::Node n, need(k));
          LZ_ASSIGN_OR_RETURN(double v, NonNeg(n, f + k));
          if (v > 100) return Bad(f + k, "must be at most 100");
          return static_cast<Ppm>(std::llround(v * kPpm));
        };
        auto money = [&](const char* k) -> Result<Price> {
          LZ_ASSIGN_OR_RETURN(YAML::Node n, need(k));
          return MoneyOf(n, f + k);
        };
        market::AdaptivePowerCapSpec a;
        a.cap_w = 1;  // Per row, from power_caps.
        LZ_ASSIGN_OR_RETURN(a.margin_ppm, ppm("margin"));
        LZ_ASSIGN_OR_RETURN(a.band_ppm, ppm("band"));
        LZ_ASSIGN_OR_RETURN(a.rise_ppm, ppm("rise"));
        LZ_ASSIGN_OR_RETURN(a.rise_min, money("rise_min"));
        LZ_ASSIGN_OR_RETURN(a.rise_max, money("rise_max"));
        LZ_ASSIGN_OR_RETURN(a.fall_step, money("fall"));
        if (pa["interval"]) {
          LZ_ASSIGN_OR_RETURN(a.interval, Dur(pa["interval"], f + "interval"));
        }
        if (pa["min_floor"]) {
          LZ_ASSIGN_OR_RETURN(a.min_floor, MoneyOf(pa["min_floor"], f + "min_floor"));
        }
        if (pa["max_floor"]) {
          LZ_ASSIGN_OR_RETURN(a.max_floor, MoneyOf(pa["max_floor"], f + "max_floor"));
        }
        if (Status st = market::ValidateAdaptivePowerCap(a); !st.ok()) return Bad("cluster.power_adaptive", st.message());
        s.power_adaptive = a;
      }
      if (const YAML::Node& ps = c["power_steps"]) {
        for (size_t i = 0; i < ps.size(); ++i) {
          std::string f = "cluster.power_steps[" + std::to_string(i) + "]";
          LZ_ASSIGN_OR_RETURN(double u, NonNeg(ps[i][0], f + "[0]"));
          LZ_ASSIGN_OR_RETURN(Price p, MoneyOf(ps[i][1], f + "[1]"));
          s.power_steps.emplace_back(static_cast<Ppm>(u), p);
        }
      }
    }
    if (s.composition.empty()) s.composition[s.types[0].name] = 1.0;
    if (const YAML::Node& w = root["workloads"]) {
      for (size_t i = 0; i < w.size(); ++i) {
        WorkloadSpec ws;
        LZ_RETURN_IF_ERROR(ParseWorkload(w[i], "workloads[" + std::to_string(i) + "]", &ws));
        for (const auto& [t, v] : ws.speed) {
          (void)v;
          if (std::none_of(s.types.begin(), s.types.end(), [&](const HwType& h) { return h.name == t; }))
            return Bad("workloads[" + std::to_string(i) + "].speed." + t, "unknown type");
        }
        s.workloads.push_back(std::move(ws));
      }
    }
    if (s.workloads.empty()) return Bad("workloads", "must list at least one workload");
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("scenario: ") + e.what());
  }
  return s;
}

Result<Scenario> LoadScenario(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("scenario: cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto s = ParseScenario(ss.str());
  if (!s.ok()) return InvalidArgument(path + ": " + s.status().message());
  return s;
}

std::string DataDir() {
  if (const char* d = std::getenv("LAISSEZ_DATA_DIR")) return d;
  return std::string(LAISSEZ_SOURCE_DIR) + "/data";
}

Result<std::vector<double>> LoadTraceShape(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::vector<double>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  std::ifstream in(path);
  if (!in) return NotFound("trace: cannot open '" + path + "'");
  std::string line;
  std::getline(in, line);  // Header: TIMESTAMP,ContextTokens,GeneratedTokens.
  std::vector<double> per_minute;
  int first_minute = -1;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // "2023-11-16 18:17:03.9799600,4808,10"
    size_t c1 = line.find(','), c2 = line.find(',', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos || c1 < 16)
      return InvalidArgument("trace: malformed line '" + line + "'");
    int hh = std::atoi(line.substr(11, 2).c_str()), mm = std::atoi(line.substr(14, 2).c_str());
    int minute = hh * 60 + mm;
    if (first_minute < 0) first_minute = minute;
    int idx = minute - first_minute;
    if (idx < 0) idx += 24 * 60;
    double tokens = std::atof(line.substr(c1 + 1, c2 - c1 - 1).c_str()) + std::atof(line.substr(c2 + 1).c_str());
    if (static_cast<size_t>(idx) >= per_minute.size()) per_minute.resize(static_cast<size_t>(idx) + 1, 0.0);
    per_minute[static_cast<size_t>(idx)] += tokens;
  }
  // The first and last minutes are partial; drop them.
  if (per_minute.size() > 3) {
    per_minute.erase(per_minute.begin());
    per_minute.pop_back();
  }
  double mx = 0;
  for (double v : per_minute) mx = std::max(mx, v);
  if (mx <= 0) return InvalidArgument("trace: no load in '" + path + "'");
  for (double& v : per_minute) v /= mx;
  cache[path] = per_minute;
  return per_minute;
}

Result<World> BuildWorld(const Scenario& s, uint64_t seed) {
  World w;
  w.name = s.name;
  w.seed = seed;
  w.types = s.types;
  w.horizon = s.duration;
  w.drain_limit = s.drain ? static_cast<Micros>(static_cast<double>(s.duration) * s.drain_factor) : 0;
  w.utility = s.utility;
  w.retention_value = s.retention_value;
  w.market = s.market;
  w.tick = s.tick;
  w.overhead_estimate = s.overhead_estimate;
  w.autoscale_headroom = s.autoscale_headroom;
  w.migration_aware = s.migration_aware;
  w.power_caps = s.power_caps;
  w.power_steps = s.power_steps;
  w.power_adaptive = s.power_adaptive;
  Rng rng(seed * 0x9E3779B97F4A7C15ULL + 12345);

  // Cluster: node counts per type by largest remainder, then spread round-robin
  // over racks so every row holds a mix of types.
  double total_share = 0;
  for (const auto& [t, v] : s.composition) total_share += v;
  if (total_share <= 0) return InvalidArgument("cluster.composition: shares must not all be zero");
  std::vector<std::pair<int, int>> counts;  // (type index, count) in type order.
  int assigned = 0;
  std::vector<std::pair<double, int>> remainders;
  for (size_t i = 0; i < s.types.size(); ++i) {
    auto it = s.composition.find(s.types[i].name);
    double exact = it == s.composition.end() ? 0 : s.node_count * it->second / total_share;
    int c = static_cast<int>(std::floor(exact));
    counts.emplace_back(static_cast<int>(i), c);
    assigned += c;
    remainders.emplace_back(exact - c, static_cast<int>(i));
  }
  std::stable_sort(remainders.begin(), remainders.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = 0; assigned < s.node_count && i < remainders.size(); ++i, ++assigned)
    counts[static_cast<size_t>(remainders[i].second)].second++;
  const int racks = s.rows * s.racks_per_row;
  for (int r = 0; r < s.rows; ++r) w.rows.push_back(s.region + "/" + s.zone + "/r" + std::to_string(r));
  int slot = 0;
  for (auto [type, count] : counts) {
    for (int k = 0; k < count; ++k, ++slot) {
      // Fill racks in order so a type's nodes sit together (gangs fit in a rack).
      int rack = static_cast<int>((static_cast<int64_t>(slot) * racks) / s.node_count);
      SimNode n{type, rack / s.racks_per_row, rack};
      topology::NodeInfo info;
      info.type = s.types[static_cast<size_t>(type)].name;
      info.name = info.type + "-" + std::to_string(k);
      info.region = s.region;
      info.zone = s.zone;
      info.row = "r" + std::to_string(n.row);
      info.rack = "k" + std::to_string(rack);
      info.meta.gpus = s.types[static_cast<size_t>(type)].gpus;
      info.meta.power_w = s.types[static_cast<size_t>(type)].power_w;
      w.nodes.push_back(n);
      w.infos.push_back(std::move(info));
    }
  }

  // Batch jobs: draw jobs until the offered work reaches contention x capacity
  // (in preferred-type node-hours over the arrival window).
  std::vector<const WorkloadSpec*> batch;
  double share_sum = 0;
  for (const WorkloadSpec& ws : s.workloads) {
    if (ws.kind == JobKind::kInference || ws.share <= 0) continue;
    batch.push_back(&ws);
    share_sum += ws.share;
  }
  auto speeds_of = [&](const WorkloadSpec& ws) {
    std::vector<double> v(s.types.size(), 0.0);
    for (size_t i = 0; i < s.types.size(); ++i) {
      auto it = ws.speed.find(s.types[i].name);
      if (it != ws.speed.end()) v[i] = it->second;
    }
    return v;
  };
  const double window_h = static_cast<double>(s.arrival_window) / kMicrosPerHour;
  const double target = s.contention * s.node_count * window_h;
  std::vector<Job> jobs;
  double offered = 0;
  while (!batch.empty() && offered < target) {
    double pick = rng.Uniform() * share_sum;
    const WorkloadSpec* ws = batch.back();
    for (const WorkloadSpec* b : batch) {
      if (pick < b->share) {
        ws = b;
        break;
      }
      pick -= b->share;
    }
    Job j;
    j.kind = ws->kind;
    j.nodes = ws->nodes[static_cast<size_t>(rng.Int(0, static_cast<int64_t>(ws->nodes.size()) - 1))];
    double h = ws->hours_sigma > 0 ? rng.LogNormal(ws->hours_median, ws->hours_sigma) : ws->hours_median;
    j.ideal_hours = std::clamp(h, ws->hours_min, ws->hours_max);
    j.speed = speeds_of(*ws);
    j.ckpt_interval = ws->ckpt_interval;
    j.ckpt_save = ws->ckpt_save;
    j.restore = ws->restore;
    j.spread_factor = ws->spread_factor;
    double v = ws->value_sigma > 0 ? rng.LogNormal(ws->value_median, ws->value_sigma) : ws->value_median;
    if (rng.Uniform() < s.low_urgency_share) {
      j.low_urgency = true;
      v *= s.low_urgency;
    }
    v *= s.urgency;
    j.value = static_cast<Price>(std::llround(v * kMicroUnits));
    j.arrival = static_cast<Micros>(rng.Uniform() * static_cast<double>(s.arrival_window));
    if (ws->kind == JobKind::kGenomics && ws->deadline_slack.hi >= 1) {
      double slack = rng.Uniform(ws->deadline_slack.lo, ws->deadline_slack.hi);
      j.deadline = j.arrival + static_cast<Micros>(slack * j.ideal_hours * kMicrosPerHour);
    }
    j.budget = static_cast<Money>(static_cast<double>(j.value) * j.nodes * j.ideal_hours * s.budget_factor);
    offered += j.nodes * j.ideal_hours;
    jobs.push_back(std::move(j));
  }
  // Inference tenants: present from the start, load from the trace.
  for (const WorkloadSpec& ws : s.workloads) {
    if (ws.kind != JobKind::kInference) continue;
    LZ_ASSIGN_OR_RETURN(std::vector<double> shape, LoadTraceShape(DataDir() + "/traces/" + ws.trace));
    for (int t = 0; t < ws.tenants; ++t) {
      Job j;
      j.kind = JobKind::kInference;
      j.speed = speeds_of(ws);
      j.restore = ws.restore;
      double v = ws.value_sigma > 0 ? rng.LogNormal(ws.value_median, ws.value_sigma) : ws.value_median;
      j.value = static_cast<Price>(std::llround(v * kMicroUnits));
      j.nodes = static_cast<uint32_t>(std::ceil(ws.peak_nodes));
      size_t offset = static_cast<size_t>(rng.Int(0, static_cast<int64_t>(shape.size()) - 1));
      const size_t minutes = static_cast<size_t>(s.duration / (60 * kMicrosPerSecond)) + 1;
      j.need.resize(minutes);
      double total = 0;
      for (size_t m = 0; m < minutes; ++m) {
        // EXTRAPOLATION: the trace covers one hour; we loop it and modulate it
        // with a daily cycle (0.6..1.0) so a multi-day run sees peaks and troughs.
        double diurnal = 0.8 + 0.2 * std::sin(6.283185307179586 * (static_cast<double>(m) / 1440.0 + 0.1 * t));
        j.need[m] = static_cast<float>(ws.peak_nodes * shape[(m + offset) % shape.size()] * diurnal);
        total += j.need[m];
      }
      j.ideal_hours = static_cast<double>(s.duration) / kMicrosPerHour;
      j.budget = static_cast<Money>(static_cast<double>(j.value) * total / 60.0 * s.budget_factor);
      jobs.push_back(std::move(j));
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.arrival < b.arrival; });
  // Duration estimates come from a stream of their own, so that changing
  // `estimate_sigma` changes the estimates and nothing else (paired runs).
  Rng est_rng(seed * 0xD1B54A32D192ED03ULL + 777);
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    j.id = static_cast<uint32_t>(i);
    double z = est_rng.LogNormal(1.0, 1.0);  // exp(N(0, 1)).
    j.estimated_hours = j.ideal_hours * std::pow(z, s.estimate_sigma);
    if (s.utility == Utility::kRetention) j.budget = static_cast<Money>(s.budget_factor * static_cast<double>(s.retention_value));
  }
  w.jobs = std::move(jobs);
  return w;
}

}  // namespace laissez::sim
