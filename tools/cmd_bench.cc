// `laissez bench engine`: throughput and latency of the engine's hot paths on
// a synthetic cluster, and measured memory per node and per resting order.
// Other families add `bench server`, `bench replay`... to the same parent.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "market/market_engine.h"
#include "tools/commands.h"

namespace laissez::cli {
namespace {

using market::MarketEngine;
using market::OrderSpec;
using Clock = std::chrono::steady_clock;
constexpr Price kUnit = kMicroUnits;

size_t HeapBytes() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

struct Cluster {
  std::unique_ptr<MarketEngine> engine;
  std::vector<TenantId> tenants;
  std::vector<VertexId> racks, rows, zones;
  size_t bytes_nodes = 0;
};

// N h100x8 nodes: 4 zones, rows of 16 racks, 16 nodes per rack.
Cluster Build(uint32_t nodes, uint32_t tenants) {
  Cluster c;
  market::EngineOptions opt;
  opt.retain_ledger = false;
  size_t before = HeapBytes();
  c.engine = std::make_unique<MarketEngine>(market::MarketParams{}, opt);
  for (uint32_t i = 0; i < nodes; ++i) {
    uint32_t rack = i / 16, row = rack / 16, zone = row % 4;
    topology::NodeInfo info{"n" + std::to_string(i), "h100x8", "us", "z" + std::to_string(zone),
                            "r" + std::to_string(row), "k" + std::to_string(rack), {8, 640, 10200}};
    (void)c.engine->AddNode(0, info);
  }
  c.engine->Compact();  // Builds the index and releases the load's spare capacity.
  c.bytes_nodes = HeapBytes() - before;
  // The market's deposits must fit in int64 micro-units (CreateTenant refuses
  // more): from about 8,000 tenants (400k nodes) on, each gets its share.
  Money balance = std::min<Money>(Money{1} << 50, (kInfPrice - 1) / std::max<uint32_t>(1, tenants));
  for (uint32_t i = 0; i < tenants; ++i) {
    c.tenants.push_back(*c.engine->CreateTenant(0, "t" + std::to_string(i), balance));
  }
  const auto& topo = c.engine->topology();
  for (uint32_t v = 0; v < topo.vertex_count(); ++v) {
    auto level = topo.vertex(VertexId(v)).level;
    if (level == topology::Level::kRack) c.racks.push_back(VertexId(v));
    if (level == topology::Level::kRow) c.rows.push_back(VertexId(v));
    if (level == topology::Level::kZone) c.zones.push_back(VertexId(v));
  }
  return c;
}

struct Stats {
  std::string name;
  double ops_per_sec = 0;
  double p50 = 0, p99 = 0, p999 = 0;
};

Stats Summarize(std::string name, std::vector<uint32_t>& lat_ns, double total_s, uint64_t ops) {
  Stats s;
  s.name = std::move(name);
  s.ops_per_sec = ops / total_s;
  std::sort(lat_ns.begin(), lat_ns.end());
  auto pct = [&](double p) { return lat_ns.empty() ? 0.0 : double(lat_ns[std::min(lat_ns.size() - 1, size_t(p * lat_ns.size()))]); };
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  s.p999 = pct(0.999);
  return s;
}

// Times `op(i)` for ops iterations: throughput from one timed loop, latency
// percentiles from per-op timestamps in a second loop.
template <typename Op>
Stats Measure(const std::string& name, uint64_t ops, Op&& op) {
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < ops; ++i) op(i);
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<uint32_t> lat;
  uint64_t sample = std::min<uint64_t>(ops, 1'000'000);
  lat.reserve(sample);
  for (uint64_t i = 0; i < sample; ++i) {
    auto a = Clock::now();
    op(ops + i);
    lat.push_back(static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count()));
  }
  return Summarize(name, lat, total, ops);
}

int RunEngineBench(uint32_t nodes, uint64_t ops, uint32_t seed, bool json, const std::string& only) {
  auto want = [&](const char* name) { return only.empty() || only == name; };
  std::vector<Stats> results;
  std::mt19937_64 rng(seed);
  uint32_t tenants = std::max<uint32_t>(16, nodes / 50);

  // retention: every node held; holders move their limits (with the outbid check
  // against resting demand at every ancestor).
  size_t bytes_per_node = 0, bytes_per_order = 0, resting_orders = 0;
  if (want("retention")) {
    Cluster c = Build(nodes, tenants);
    bytes_per_node = c.bytes_nodes / nodes;
    MarketEngine& e = *c.engine;
    VertexId root = e.topology().TypeRoot(TypeId(0));
    for (uint32_t i = 0; i < nodes; ++i) {
      (void)e.PlaceOrder(0, c.tenants[i % tenants], OrderSpec{e.topology().node(NodeId(i)).leaf, 100 * kUnit + (i % 97)});
    }
    // Resting demand below every holder: one order per tenant per zone (measured memory).
    size_t before = HeapBytes();
    for (VertexId z : c.zones) {
      // Arrival order is random in a real market; descending prices keep the
      // set-up from re-pricing every holder in the zone once per order.
      for (uint32_t k = tenants; k-- > 0;) (void)e.PlaceOrder(0, c.tenants[k], OrderSpec{z, 10 * kUnit + k});
    }
    for (VertexId r : c.racks) (void)e.PlaceOrder(0, c.tenants[r.value % tenants], OrderSpec{r, 20 * kUnit});
    resting_orders = e.resting_order_count();
    bytes_per_order = (HeapBytes() - before) / std::max<size_t>(1, resting_orders);
    (void)root;
    std::vector<uint32_t> pick(1 << 20);
    for (auto& p : pick) p = static_cast<uint32_t>(rng() % nodes);
    results.push_back(Measure("retention", ops, [&](uint64_t i) {
      NodeId n(pick[i & (pick.size() - 1)]);
      Price limit = 60 * kUnit + static_cast<Price>((i * 7919) % (80 * kUnit));
      (void)e.SetLimit(0, c.tenants[n.value % tenants], n, limit);
    }));
  }

  // inner_bid: a bid on a rack, row or zone takes the cheapest obtainable node below;
  // the node is handed back (untimed) so the market stays half free.
  if (want("inner_bid")) {
    Cluster c = Build(nodes, tenants);
    MarketEngine& e = *c.engine;
    for (uint32_t i = 0; i < nodes; i += 2) {
      (void)e.PlaceOrder(0, c.tenants[i % tenants], OrderSpec{e.topology().node(NodeId(i)).leaf, 50 * kUnit});
    }
    std::vector<VertexId> scopes;
    for (size_t i = 0; i < 4096; ++i) {
      uint64_t r = rng();
      scopes.push_back(r % 3 == 0 ? c.racks[r % c.racks.size()] : r % 3 == 1 ? c.rows[r % c.rows.size()] : c.zones[r % c.zones.size()]);
    }
    std::vector<uint32_t> lat;
    uint64_t sample = std::min<uint64_t>(ops, 1'000'000);
    lat.reserve(sample);
    double timed = 0;
    for (uint64_t i = 0; i < ops; ++i) {
      TenantId t = c.tenants[i % tenants];
      auto a = Clock::now();
      auto o = e.PlaceOrder(0, t, OrderSpec{scopes[i & 4095], 30 * kUnit});
      auto b = Clock::now();
      double dt = std::chrono::duration<double>(b - a).count();
      timed += dt;
      if (lat.size() < sample) lat.push_back(static_cast<uint32_t>(dt * 1e9));
      // Hand the node back so the next bid finds free nodes again.
      auto tv = e.GetTenant(t);
      if (o.ok() && !e.GetOrder(*o).ok() && !tv->nodes.empty()) {
        for (NodeId n : tv->nodes) {
          if (e.GetNode(n)->limit == 30 * kUnit) {
            (void)e.Relinquish(0, t, n);
            break;
          }
        }
      } else if (o.ok()) {
        (void)e.CancelOrder(0, t, *o);
      }
    }
    results.push_back(Summarize("inner_bid", lat, timed, ops));
  }

  // mixed: place / update / cancel / set limit / relinquish / advance time.
  if (want("mixed")) {
    Cluster c = Build(nodes, tenants);
    MarketEngine& e = *c.engine;
    for (uint32_t i = 0; i < nodes; i += 4) {
      (void)e.PlaceOrder(0, c.tenants[i % tenants], OrderSpec{e.topology().node(NodeId(i)).leaf, 40 * kUnit});
    }
    std::vector<std::pair<TenantId, OrderId>> open;
    Micros now = 0;
    results.push_back(Measure("mixed", ops, [&](uint64_t i) {
      uint64_t r = rng();
      TenantId t = c.tenants[r % tenants];
      int kind = static_cast<int>((r >> 20) % 100);
      if (kind < 30) {
        auto tv = e.GetTenant(t);
        if (!tv->nodes.empty()) (void)e.SetLimit(now, t, tv->nodes[(r >> 8) % tv->nodes.size()], 30 * kUnit + (r % (40 * kUnit)));
      } else if (kind < 55) {
        VertexId s = (r >> 30) % 2 ? c.racks[(r >> 9) % c.racks.size()] : c.zones[(r >> 9) % c.zones.size()];
        auto o = e.PlaceOrder(now, t, OrderSpec{s, 5 * kUnit + static_cast<Price>(r % (50 * kUnit))});
        if (o.ok() && e.GetOrder(*o).ok()) open.emplace_back(t, *o);
      } else if (kind < 70 && !open.empty()) {
        auto& [ot, oid] = open[(r >> 7) % open.size()];
        if (!e.UpdateOrder(now, ot, oid, 5 * kUnit + static_cast<Price>((r >> 3) % (50 * kUnit))).ok()) {}
      } else if (kind < 85 && !open.empty()) {
        size_t k = (r >> 7) % open.size();
        (void)e.CancelOrder(now, open[k].first, open[k].second);
        open[k] = open.back();
        open.pop_back();
      } else if (kind < 92) {
        auto tv = e.GetTenant(t);
        if (!tv->nodes.empty()) (void)e.Relinquish(now, t, tv->nodes[(r >> 8) % tv->nodes.size()]);
      } else {
        now += 1 + static_cast<Micros>(r % 2'000'000);
        (void)e.Advance(now);
      }
      (void)i;
    }));
  }

  if (json) {
    nlohmann::json j;
    j["nodes"] = nodes;
    j["ops"] = ops;
    j["bytes_per_node"] = bytes_per_node;
    j["bytes_per_resting_order"] = bytes_per_order;
    j["resting_orders_measured"] = resting_orders;
    j["workloads"] = nlohmann::json::array();
    for (const Stats& s : results) {
      j["workloads"].push_back({{"name", s.name}, {"ops_per_sec", s.ops_per_sec}, {"p50_ns", s.p50},
                                {"p99_ns", s.p99}, {"p999_ns", s.p999}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("nodes %u, ops %llu per workload\n", nodes, static_cast<unsigned long long>(ops));
    std::printf("memory: %zu B per node, %zu B per resting order (%zu resting orders)\n", bytes_per_node,
                bytes_per_order, resting_orders);
    std::printf("%-10s %14s %10s %10s %10s\n", "workload", "ops/s", "p50 ns", "p99 ns", "p99.9 ns");
    for (const Stats& s : results) {
      std::printf("%-10s %14.0f %10.0f %10.0f %10.0f\n", s.name.c_str(), s.ops_per_sec, s.p50, s.p99, s.p999);
    }
  }
  return 0;
}

// Snapshot size and time (docs/SNAPSHOT.md): a free market, then every node
// held, then resting demand on top, as in `retention`; Snapshot and Restore
// timed on the last.
int RunSnapshotBench(uint32_t nodes, int repeats, bool json) {
  uint32_t tenants = std::max<uint32_t>(16, nodes / 50);
  Cluster c = Build(nodes, tenants);
  MarketEngine& e = *c.engine;
  size_t free_bytes = e.Snapshot().size();
  for (uint32_t i = 0; i < nodes; ++i) {
    (void)e.PlaceOrder(0, c.tenants[i % tenants], OrderSpec{e.topology().node(NodeId(i)).leaf, 100 * kUnit + (i % 97)});
  }
  size_t held_bytes = e.Snapshot().size();
  size_t held_orders = e.resting_order_count();
  for (VertexId z : c.zones) {
    for (uint32_t k = tenants; k-- > 0;) (void)e.PlaceOrder(0, c.tenants[k], OrderSpec{z, 10 * kUnit + k});
  }
  for (VertexId r : c.racks) (void)e.PlaceOrder(0, c.tenants[r.value % tenants], OrderSpec{r, 20 * kUnit});
  size_t resting = e.resting_order_count() - held_orders;
  std::string image;
  std::vector<double> save_ms, load_ms;
  for (int i = 0; i < repeats; ++i) {
    auto a = Clock::now();
    image = e.Snapshot();
    save_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    MarketEngine restored;
    a = Clock::now();
    Status st = restored.Restore(image);
    load_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    if (!st.ok()) {
      std::fprintf(stderr, "bench snapshot: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::sort(save_ms.begin(), save_ms.end());
  std::sort(load_ms.begin(), load_ms.end());
  double per_free = double(free_bytes) / nodes, per_held = double(held_bytes) / nodes;
  double per_order = resting ? double(image.size() - held_bytes) / resting : 0;
  if (json) {
    nlohmann::json j = {{"nodes", nodes},
                        {"tenants", tenants},
                        {"bytes_free_market", free_bytes},
                        {"bytes_per_free_node", per_free},
                        {"bytes_all_held", held_bytes},
                        {"bytes_per_held_node", per_held},
                        {"resting_orders", resting},
                        {"bytes_per_resting_order", per_order},
                        {"bytes", image.size()},
                        {"snapshot_ms_median", save_ms[save_ms.size() / 2]},
                        {"restore_ms_median", load_ms[load_ms.size() / 2]}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("nodes %u, tenants %u\n", nodes, tenants);
    std::printf("free market: %zu B (%.1f B per node)\n", free_bytes, per_free);
    std::printf("every node held (one filled order each): %zu B (%.1f B per held node)\n", held_bytes, per_held);
    std::printf("plus %zu resting orders: %zu B (%.1f B per resting order)\n", resting, image.size(), per_order);
    std::printf("snapshot %.1f ms, restore %.1f ms (median of %d)\n", save_ms[save_ms.size() / 2],
                load_ms[load_ms.size() / 2], repeats);
  }
  return 0;
}

}  // namespace

void RegisterBenchCommands(CLI::App& app, int* exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks (not tests): engine, and more from other commands");
  bench->require_subcommand(1);
  auto* engine = bench->add_subcommand("engine", "Engine hot paths: retention, inner_bid, mixed; memory per node and order");
  static uint32_t nodes = 100'000, seed = 1;
  static uint64_t ops = 1'000'000;
  static bool json = false;
  static std::string only;
  engine->add_option("--workload", only, "Run only this workload (retention, inner_bid, mixed)")
      ->check(CLI::IsMember({"retention", "inner_bid", "mixed"}));
  engine->add_option("--nodes", nodes, "Cluster size")->check(CLI::Range(16u, 10'000'000u));
  engine->add_option("--ops", ops, "Operations per workload")->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}));
  engine->add_option("--seed", seed, "Random seed");
  engine->add_flag("--json", json, "Print one JSON document");
  engine->callback([exit_code] { *exit_code = RunEngineBench(nodes, ops, seed, json, only); });

  auto* snap = bench->add_subcommand("snapshot", "Engine snapshot size (per node, per order) and save/restore time");
  static uint32_t snap_nodes = 100'000;
  static int repeats = 5;
  static bool snap_json = false;
  snap->add_option("--nodes", snap_nodes, "Cluster size")->capture_default_str()->check(CLI::Range(16u, 10'000'000u));
  snap->add_option("--repeats", repeats, "Timed snapshot + restore pairs")->capture_default_str()->check(CLI::Range(1, 100));
  snap->add_flag("--json", snap_json, "Print one JSON document");
  snap->callback([exit_code] { *exit_code = RunSnapshotBench(snap_nodes, repeats, snap_json); });
}

}  // namespace laissez::cli
