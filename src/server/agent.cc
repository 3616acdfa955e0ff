#include "server/agent.h"

#include <algorithm>
#include <chrono>

#include "common/money.h"

namespace laissez::server {

Result<std::unique_ptr<sdk::PricingStrategy>> MakeStrategy(const AgentOptions& o, Micros arrival,
                                                          std::function<Micros()> remaining) {
  if (o.value < 0) return InvalidArgument("value: must not be negative");
  const std::string& s = o.strategy;
  if (s == "cost-of-delay") {
    if (!(o.hours > 0) || o.hours > 1e6) return InvalidArgument("hours: must be positive (and at most 1e6)");
    sdk::CostOfDelay::Params p;
    p.value = o.value;
    p.speed_ppm = {{o.node_type, kPpm}};
    p.arrival = arrival;
    p.ideal = static_cast<Micros>(o.hours * kMicrosPerHour);
    p.nodes = std::max<uint32_t>(1, o.count);
    p.remaining = std::move(remaining);
    return std::unique_ptr<sdk::PricingStrategy>(std::make_unique<sdk::CostOfDelay>(std::move(p)));
  }
  if (s == "fixed") return std::unique_ptr<sdk::PricingStrategy>(std::make_unique<sdk::FixedValue>(o.value));
  if (s == "on-demand") return sdk::OnDemandLike(o.value);
  if (s == "spot") return sdk::SpotLike(o.value);
  if (s == "budget") {
    if (o.cap <= 0) return InvalidArgument("cap: must be positive for strategy budget");
    return std::unique_ptr<sdk::PricingStrategy>(
        std::make_unique<sdk::BudgetCapped>(std::make_unique<sdk::FixedValue>(o.value), o.cap));
  }
  if (s == "locality") {
    return std::unique_ptr<sdk::PricingStrategy>(
        std::make_unique<sdk::LocalityAware>(std::make_unique<sdk::FixedValue>(o.value), o.bonus_ppm));
  }
  if (s == "migration") {
    sdk::MigrationAware::Params p;
    p.overhead = o.overhead;
    return std::unique_ptr<sdk::PricingStrategy>(
        std::make_unique<sdk::MigrationAware>(std::make_unique<sdk::FixedValue>(o.value), p));
  }
  return InvalidArgument("strategy: unknown \"" + s +
                         "\" (cost-of-delay, fixed, on-demand, spot, budget, locality, migration)");
}

namespace {

class Listener final : public sdk::AdapterListener {
 public:
  Listener(AgentReport* r, GrpcMarketClient* c, const std::function<void(const std::string&)>* log)
      : r_(r), c_(c), log_(log) {}
  void OnNodeGained(sdk::RequestId, NodeId n, Price limit) override {
    ++r_->gained;
    Log("gained " + Name(n) + " with limit " + FormatMoney(limit) + "/h");
  }
  void OnNodeLost(sdk::RequestId, NodeId n, uint8_t reasons) override {
    ++r_->lost;
    Log("lost " + Name(n) + " (" + market::ReasonNames(reasons) + ")");
  }
  void OnNotice(sdk::RequestId, NodeId n, Micros deadline, Price price, uint8_t reasons) override {
    ++r_->notices;
    Log("notice on " + Name(n) + ": " + market::ReasonNames(reasons) + " at " + FormatMoney(price) + "/h, " +
        std::to_string((deadline - c_->Now()) / kMicrosPerSecond) + " s to respond");
  }
  void OnContestEnded(sdk::RequestId, NodeId n) override {
    ++r_->contests_won;
    Log("kept " + Name(n));
  }
  void OnOrderCancelled(sdk::RequestId, market::CancelReason why) override {
    ++r_->cancelled;
    Log(std::string("order cancelled (") + std::string(market::CancelReasonName(why)) + ")");
  }
  void OnCharged(NodeId, Money amount) override { r_->charged += amount; }

 private:
  std::string Name(NodeId n) {
    auto d = c_->DescribeNode(n);
    return d.ok() ? d->name : "node " + std::to_string(n.value);
  }
  void Log(const std::string& s) {
    if (*log_) (*log_)(s);
  }
  AgentReport* r_;
  GrpcMarketClient* c_;
  const std::function<void(const std::string&)>* log_;
};

}  // namespace

Result<AgentReport> RunAgent(const AgentOptions& o, const std::atomic<bool>* stop,
                             const std::function<void(const std::string&)>& log) {
  LZ_RETURN_IF_ERROR(MakeStrategy(o).status());  // Bad options fail before connecting.
  LZ_ASSIGN_OR_RETURN(auto client, GrpcMarketClient::Connect(o.connect));
  // cost-of-delay: the job works while it holds all its nodes.
  const Micros arrival = client->Now();
  Micros worked = 0, running_since = -1;
  GrpcMarketClient* c = client.get();
  auto remaining = [&worked, &running_since, c, &o] {
    Micros w = worked + (running_since >= 0 ? c->Now() - running_since : 0);
    return std::max<Micros>(0, static_cast<Micros>(o.hours * kMicrosPerHour) - w);
  };
  LZ_ASSIGN_OR_RETURN(auto strategy, MakeStrategy(o, arrival, remaining));
  AgentReport report;
  report.tenant = client->tenant_name();
  LZ_ASSIGN_OR_RETURN(auto stream, client->Watch({o.node_type}));
  Listener listener(&report, client.get(), &log);
  sdk::EconAdapter adapter(client.get(), strategy.get(), &listener);
  sdk::Request req;
  sdk::NodeSpec spec;
  spec.node_type = o.node_type;
  spec.location = o.location;
  if (o.strategy == "locality") spec.locality = market::Locality::kSameRack;
  req.options.push_back(spec);
  req.count = o.count;
  req.gang = o.gang;
  LZ_ASSIGN_OR_RETURN(sdk::RequestId id, adapter.Add(req));
  (void)id;
  auto start = std::chrono::steady_clock::now();
  auto last_reprice = start - std::chrono::hours(1);
  auto last_refresh = start;
  auto failover_until = start + std::chrono::milliseconds(kFailoverBudgetMs);
  Status end;
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    if (stop && stop->load()) break;
    if (o.seconds > 0 && now - start >= std::chrono::duration<double>(o.seconds)) break;
    if (adapter.dirty() && now - last_reprice >= std::chrono::milliseconds(o.reprice_interval_ms)) {
      Status st = adapter.Reprice();
      if (!st.ok() && st.code() == StatusCode::kUnavailable) {
        end = st;
        break;
      }
      last_reprice = now;
    }
    if (now - last_refresh >= std::chrono::milliseconds(o.refresh_interval_ms)) {
      adapter.MarkDirty();
      last_refresh = now;
    }
    std::vector<market::Event> events;
    Status st = stream->Poll(&events, 100);
    // Events received before the stream ended count too.
    if (!events.empty()) adapter.OnEvents(events);
    if (!st.ok() && (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kOutOfRange) &&
        std::chrono::steady_clock::now() < failover_until) {
      if (st.code() == StatusCode::kUnavailable) {
        // A replica went away: watch on another one (the leader), resuming
        // after the last event seen, so no event is lost or repeated.
        client->Failover(st.message());
        auto again = client->Watch({o.node_type}, stream->position());
        if (again.ok()) stream = std::move(*again);
      } else {
        // That replica no longer has the events of the gap: watch from now
        // and re-read everything.
        auto again = client->Watch({o.node_type});
        if (again.ok()) stream = std::move(*again);
        adapter.MarkDirty();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (!st.ok()) {
      end = st;
      break;
    }
    failover_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFailoverBudgetMs);
    bool prices = false;
    for (const auto& e : events) prices |= e.type == market::EventType::kPriceChanged;
    if (prices) adapter.MarkDirty();
    const bool running = adapter.held_count() >= o.count;
    if (running && running_since < 0) running_since = client->Now();
    if (!running && running_since >= 0) {
      worked += client->Now() - running_since;
      running_since = -1;
    }
  }
  const auto& s = adapter.stats();
  report.reprices = s.reprices;
  report.orders_placed = s.orders_placed;
  report.orders_updated = s.orders_updated;
  report.limits_set = s.limits_set;
  report.rejected = s.rejected;
  report.held_at_end = adapter.held_count();
  if (!end.ok() && !(stop && stop->load())) return end;
  return report;
}

}  // namespace laissez::server
