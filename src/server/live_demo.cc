#include "server/live_demo.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/money.h"
#include "laissez/v1/market.grpc.pb.h"
#include "server/agent.h"
#include "server/server.h"
#include "topology/cluster_yaml.h"

namespace laissez::server {
namespace {
namespace pb = ::laissez::v1;

struct Actor {
  std::string name, strategy, type;
  Price value, cap;
  uint32_t count;
  double start_fraction;  // When it joins, as a fraction of the run.
};

}  // namespace

int RunLiveDemo(const LiveDemoOptions& o) {
  auto t_start = std::chrono::steady_clock::now();
  std::mutex out_mu;
  auto say = [&](const std::string& who, const std::string& what) {
    if (o.quiet) return;
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    std::lock_guard lock(out_mu);
    std::fprintf(o.json ? stderr : stdout, "[%6.1fs] %-10s %s\n", t, who.c_str(), what.c_str());
    std::fflush(o.json ? stderr : stdout);
  };

  auto spec = topology::LoadClusterYaml(o.cluster);
  if (!spec.ok()) {
    std::fprintf(stderr, "laissez demo live: --cluster: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  std::string db = o.db;
  bool temp_db = db.empty();
  if (temp_db) {
    db = (std::filesystem::temp_directory_path() / ("laissez-demo-live-" + std::to_string(::getpid()) + ".db")).string();
  }
  ServerOptions so;
  so.db = db;
  so.listen = "127.0.0.1:0";
  so.rate_limit = 0;
  so.core.idle_tick = std::chrono::milliseconds(200);
  Server server(so);
  Status st = server.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "laissez demo live: %s\n", st.ToString().c_str());
    return 1;
  }
  const std::string admin = server.admin_token();
  const std::string addr = "127.0.0.1:" + std::to_string(server.grpc_port());
  say("server", "listening on " + addr + ", journal in " + db);

  // The cluster, and a short grace so contests resolve within the demo.
  auto setup = server.core().Execute<size_t>("operator:demo", [&](WriterContext& w) -> Result<size_t> {
    for (const auto& n : spec->nodes) LZ_RETURN_IF_ERROR(w.Apply(market::OpAddNode{n}).status);
    market::MarketParams p = w.engine().params();
    p.grace = 8 * kMicrosPerSecond;
    p.hysteresis_ppm = 50'000;
    LZ_RETURN_IF_ERROR(w.Apply(market::OpSetParams{p}).status);
    return spec->nodes.size();
  });
  if (!setup.ok()) {
    std::fprintf(stderr, "laissez demo live: %s\n", setup.status().ToString().c_str());
    return 1;
  }
  say("operator", std::to_string(*setup) + " nodes from " + o.cluster + "; grace 8 s, hysteresis 5%");

  // Everything that happens, operator view.
  auto sub = server.core().Subscribe(true, TenantId(), {});
  std::map<std::string, uint64_t> counts;
  std::map<std::string, Price> last_price;  // Type root quotes.
  std::atomic<bool> watch_stop{false};
  std::thread watcher([&] {
    while (!watch_stop) {
      std::vector<WireEvent> events;
      bool open = sub->Next(&events, std::chrono::milliseconds(100));
      for (const auto& e : events) {
        ++counts[e.type];
        using market::EventType;
        switch (e.event.type) {
          case EventType::kTransferred:
            say("market", e.node + " moved from " + e.other + " to " + e.tenant + " at " +
                              FormatMoney(e.event.price) + "/h");
            break;
          case EventType::kPriceChanged:
            if (e.vertex.find('/') == std::string::npos) {
              if (!last_price.count(e.vertex) || last_price[e.vertex] != e.event.price) {
                say("market", "quote for any " + e.vertex + " is now " + FormatMoney(e.event.price) + "/h");
              }
              last_price[e.vertex] = e.event.price;
            }
            break;
          default: break;
        }
      }
      if (!open) break;
    }
  });

  const std::vector<Actor> actors = {
      {"serving", "on-demand", "h100x8", 40 * kMicroUnits, 0, 2, 0.0},
      {"training", "migration", "h100x8", 25 * kMicroUnits, 0, 2, 0.0},
      {"batch", "spot", "h100x8", 8 * kMicroUnits, 0, 2, 0.0},
      {"analytics", "budget", "a100x8", 30 * kMicroUnits, 18 * kMicroUnits, 2, 0.0},
      {"genomics", "locality", "a100x8", 12 * kMicroUnits, 0, 2, 0.1},
      {"latecomer", "fixed", "h100x8", 60 * kMicroUnits, 0, 1, 0.35},
  };
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto admin_stub = pb::AdminService::NewStub(channel);
  auto op_stub = pb::OperatorService::NewStub(channel);
  auto ctx = [&] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->AddMetadata("authorization", "Bearer " + admin);
    return c;
  };
  std::vector<std::string> tokens;
  for (const auto& a : actors) {
    pb::CreateTenantRequest q;
    q.set_name(a.name);
    q.set_balance(5000 * kMicroUnits);
    pb::CreateTenantResponse r;
    grpc::Status g = admin_stub->CreateTenant(ctx().get(), q, &r);
    if (!g.ok()) {
      std::fprintf(stderr, "laissez demo live: create tenant: %s\n", g.error_message().c_str());
      return 1;
    }
    tokens.push_back(r.token());
  }

  std::atomic<bool> stop{false};
  std::vector<AgentReport> reports(actors.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < actors.size(); ++i) {
    threads.emplace_back([&, i] {
      const Actor& a = actors[i];
      auto wait_until = t_start + std::chrono::milliseconds(static_cast<int64_t>(a.start_fraction * o.seconds * 1000));
      while (!stop && std::chrono::steady_clock::now() < wait_until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (stop) return;
      AgentOptions ao;
      ao.connect.address = addr;
      ao.connect.token = tokens[i];
      ao.strategy = a.strategy;
      ao.value = a.value;
      ao.cap = a.cap;
      ao.node_type = a.type;
      ao.count = a.count;
      ao.overhead = 2 * 60 * kMicrosPerSecond;
      say(a.name, "joins: wants " + std::to_string(a.count) + " x " + a.type + ", strategy " + a.strategy +
                      ", values a node-hour at " + FormatMoney(a.value));
      auto r = RunAgent(ao, &stop, [&](const std::string& line) { say(a.name, line); });
      if (r.ok()) {
        reports[i] = *r;
      } else {
        say(a.name, "stopped: " + r.status().ToString());
      }
    });
  }

  // Halfway through, the operator drains a rack for maintenance.
  auto drain_at = t_start + std::chrono::milliseconds(static_cast<int64_t>(0.6 * o.seconds * 1000));
  auto end_at = t_start + std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1000));
  bool drained = false;
  while (std::chrono::steady_clock::now() < end_at) {
    if (!drained && std::chrono::steady_clock::now() >= drain_at) {
      pb::DrainRequest q;
      q.set_location("eu/eu-1a/r1/k2");
      pb::PolicyResponse r;
      grpc::Status g = op_stub->DrainNodes(ctx().get(), q, &r);
      say("operator", g.ok() ? "drains rack eu/eu-1a/r1/k2 for maintenance (holders get notices)"
                             : "drain failed: " + g.error_message());
      drained = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  for (auto& t : threads) t.join();

  pb::OperatorLedgerRequest lq;
  lq.set_limit(10000);
  pb::OperatorLedgerResponse led;
  grpc::Status lg = op_stub->GetLedger(ctx().get(), lq, &led);
  std::map<std::string, Money> paid;
  for (const auto& e : led.entries()) paid[e.tenant()] += e.amount();
  watch_stop = true;
  watcher.join();
  server.core().Unsubscribe(sub);

  bool conserved = lg.ok() && led.deposited() == led.tenant_balances() + led.operator_revenue();
  nlohmann::json j;
  j["seconds"] = o.seconds;
  j["events"] = counts;
  j["quotes"] = last_price;
  j["operator_revenue"] = led.operator_revenue();
  j["money_conserved"] = conserved;
  for (size_t i = 0; i < actors.size(); ++i) {
    const auto& r = reports[i];
    j["tenants"].push_back({{"tenant", actors[i].name},
                            {"strategy", actors[i].strategy},
                            {"held_at_end", r.held_at_end},
                            {"gained", r.gained},
                            {"lost", r.lost},
                            {"notices", r.notices},
                            {"paid", paid[actors[i].name]},
                            {"reprices", r.reprices}});
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\nWhat happened in %.0f s:\n", o.seconds);
    std::printf("  %llu allocations, %llu notices, %llu transfers, %llu releases, %llu price changes\n",
                static_cast<unsigned long long>(counts["allocated"]), static_cast<unsigned long long>(counts["notice"]),
                static_cast<unsigned long long>(counts["transferred"]), static_cast<unsigned long long>(counts["released"]),
                static_cast<unsigned long long>(counts["price_changed"]));
    std::printf("  %-10s %-10s %5s %6s %5s %7s %12s\n", "tenant", "strategy", "held", "gained", "lost", "notices",
                "paid");
    for (size_t i = 0; i < actors.size(); ++i) {
      const auto& r = reports[i];
      std::printf("  %-10s %-10s %5u %6llu %5llu %7llu %12s\n", actors[i].name.c_str(), actors[i].strategy.c_str(),
                  r.held_at_end, static_cast<unsigned long long>(r.gained), static_cast<unsigned long long>(r.lost),
                  static_cast<unsigned long long>(r.notices), FormatMoney(paid[actors[i].name]).c_str());
    }
    std::printf("  operator revenue %s; money conserved: %s\n", FormatMoney(led.operator_revenue()).c_str(),
                conserved ? "yes" : "NO");
  }
  server.Shutdown();
  if (temp_db) {
    for (const char* s : {"", "-wal", "-shm", ".admin-token", ".identity"}) std::filesystem::remove(db + s);
  }
  return conserved ? 0 : 1;
}

}  // namespace laissez::server
