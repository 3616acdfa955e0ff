#include "sim/laissez_mechanism.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "market/market_engine.h"
#include "sdk/econ_adapter.h"
#include "sdk/market_client.h"
#include "sdk/strategies.h"
#include "sim/online_sim.h"

namespace laissez::sim {
namespace {

constexpr Micros kPartialGangPatience = 10 * 60 * kMicrosPerSecond;

class LaissezSim;

class JobListener final : public sdk::AdapterListener {
 public:
  JobListener(LaissezSim* sim, uint32_t job) : sim_(sim), job_(job) {}
  void OnNodeGained(sdk::RequestId, NodeId node, Price) override;
  void OnNodeLost(sdk::RequestId, NodeId node, uint8_t reasons) override;
  void OnNotice(sdk::RequestId, NodeId node, Micros deadline, Price, uint8_t) override;
  void OnContestEnded(sdk::RequestId, NodeId node) override;

 private:
  LaissezSim* sim_;
  uint32_t job_;
};

class LaissezSim final : public OnlineSim, public market::EventSink {
 public:
  LaissezSim(const World& w, const RunOptions& o) : OnlineSim(w, o) {}

  struct Tenant {
    TenantId id;
    std::unique_ptr<sdk::InProcessMarketClient> client;
    std::unique_ptr<sdk::PricingStrategy> strategy;
    std::unique_ptr<JobListener> listener;
    std::unique_ptr<sdk::EconAdapter> adapter;
    sdk::RequestId request = 0;
    std::vector<uint32_t> noticed;   // Nodes under notice.
    std::vector<uint32_t> yielding;  // Nodes we are relinquishing after a notice.
    bool finishing = false;
    bool active = false;
    Micros partial_since = -1;
  };

  // ---- market::EventSink ----
  // Charges change nothing in the adapter (it only forwards them to the
  // listener) and JobListener ignores them: costs come from the balances at
  // the end. A full cluster settles many of them per engine call, so they are
  // counted here and not queued (issue 12); the other events keep their order.
  void OnEvents(std::span<const market::Event> events) override {
    for (const market::Event& e : events) {
      if (e.type == market::EventType::kCharged) {
        ++result_.metrics.engine_events;
      } else {
        pending_.push_back(e);
      }
    }
  }

  void Drain() {
    while (!pending_.empty()) {
      std::vector<market::Event> events;
      events.swap(pending_);
      for (const market::Event& e : events) {
        ++result_.metrics.engine_events;
        // A transfer: the previous holder loses the node before the new one gets it.
        if (e.type == market::EventType::kTransferred && e.other.valid() && e.other != e.tenant) Route(e, e.other);
        Route(e, e.tenant);
      }
    }
  }

  void Route(const market::Event& e, TenantId t) {
    if (!t.valid() || t.value >= job_of_tenant_.size()) return;
    int32_t job = job_of_tenant_[t.value];
    if (job < 0) return;
    Tenant& ten = tenants_[static_cast<size_t>(job)];
    if (ten.adapter) ten.adapter->OnEvents({&e, 1});
  }

  // ---- Listener callbacks ----
  void Gained(uint32_t job, uint32_t node) { GrantNode(job, node); }
  void Lost(uint32_t job, uint32_t node, uint8_t reasons) {
    Tenant& t = tenants_[job];
    auto y = std::find(t.yielding.begin(), t.yielding.end(), node);
    bool yielded = y != t.yielding.end();
    if (yielded) t.yielding.erase(y);
    t.noticed.erase(std::remove(t.noticed.begin(), t.noticed.end(), node), t.noticed.end());
    bool own = (reasons & market::kReasonRelinquish) != 0 && !yielded;
    if (t.finishing || own) {
      RevokeNode(job, node, /*clean=*/true, /*evicted=*/false);
    } else if (yielded) {
      RevokeNode(job, node, /*clean=*/true, /*evicted=*/true);
    } else {
      RevokeNode(job, node, /*clean=*/false, /*evicted=*/true);
    }
  }
  void Noticed(uint32_t job, uint32_t node, Micros deadline) {
    Tenant& t = tenants_[job];
    if (std::find(t.noticed.begin(), t.noticed.end(), node) == t.noticed.end()) t.noticed.push_back(node);
    Notice(job, node, deadline);
  }
  void ContestEnded(uint32_t job, uint32_t node) {
    Tenant& t = tenants_[job];
    t.noticed.erase(std::remove(t.noticed.begin(), t.noticed.end(), node), t.noticed.end());
    if (t.noticed.empty()) CancelYield(job);
  }

 private:
  Status Start() override {
    market::EngineOptions eo;
    eo.price_events = false;
    eo.retain_ledger = false;
    engine_ = std::make_unique<market::MarketEngine>(world_.market, eo);
    engine_->set_sink(this);
    if (options_.operation_observer) engine_->set_operation_observer(options_.operation_observer);
    for (size_t i = 0; i < world_.infos.size(); ++i) {
      auto id = engine_->AddNode(0, world_.infos[i]);
      if (!id.ok()) return id.status();
      if (id->value != i) return Internal("engine assigned node ids out of order");
    }
    for (const RowCap& rc : world_.power_caps) {
      auto loc = engine_->topology().FindLocation(world_.rows[static_cast<size_t>(rc.row)]);
      if (!loc.ok()) return loc.status();
      Result<PolicyId> p = PolicyId();
      if (world_.power_adaptive) {
        market::AdaptivePowerCapSpec spec = *world_.power_adaptive;
        spec.row = *loc;
        spec.cap_w = rc.cap_w;
        p = engine_->AddPolicy(0, spec);
      } else {
        market::PowerCapSpec spec;
        spec.row = *loc;
        spec.cap_w = rc.cap_w;
        spec.steps = world_.power_steps;
        p = engine_->AddPolicy(0, spec);
      }
      if (!p.ok()) return p.status();
      row_policies_.emplace_back(rc.row, *p);
    }
    for (size_t t = 0; t < world_.types.size(); ++t) {
      auto v = engine_->topology().FindVertex(world_.types[t].name);
      type_root_.push_back(v.ok() ? *v : VertexId());
    }
    tenants_.resize(world_.jobs.size());
    quotes_.Clear();
    Drain();
    return Status::Ok();
  }

  // Estimated work left, as time on the preferred type, from the tenant's own
  // duration estimate (never below a minute while the job is unfinished).
  Micros EstimatedRemaining(uint32_t job) const {
    const Job& j = world_.jobs[job];
    double left_h = std::max(j.estimated_hours - WorkDone(job), 1.0 / 60);
    return static_cast<Micros>(left_h * kMicrosPerHour);
  }

  // The truthful cost-of-delay strategy of a retention-utility tenant.
  std::unique_ptr<sdk::PricingStrategy> CostOfDelayFor(uint32_t job, std::unordered_map<std::string, Ppm> speed) {
    const Job& j = world_.jobs[job];
    sdk::CostOfDelay::Params p;
    p.speed_ppm = std::move(speed);
    if (j.kind == JobKind::kInference) {
      // A unit of retention is all of the offered load over the fleet's life:
      // one node-hour of served load is worth value / offered node-hours.
      const double offered = OfferedNodeHours(world_, job);
      p.kind = sdk::CostOfDelay::Kind::kServing;
      p.value = static_cast<Price>(static_cast<double>(world_.retention_value) / std::max(offered, 1e-6));
      p.overhead = static_cast<Micros>(static_cast<double>(j.restore) * world_.overhead_estimate);
      return std::make_unique<sdk::CostOfDelay>(std::move(p));
    }
    p.kind = sdk::CostOfDelay::Kind::kBatch;
    p.value = world_.retention_value;
    p.arrival = j.arrival;
    p.ideal = static_cast<Micros>(j.estimated_hours * kMicrosPerHour);
    p.nodes = j.nodes;
    p.remaining = [this, job] { return EstimatedRemaining(job); };
    if (world_.migration_aware) {
      p.uncommitted = [this, job] { return static_cast<Micros>(std::max(0.0, Uncommitted(job)) * kMicrosPerHour); };
      p.overhead = static_cast<Micros>(static_cast<double>(j.restore + j.ckpt_save) * world_.overhead_estimate);
    }
    p.deadline = j.deadline;
    return std::make_unique<sdk::CostOfDelay>(std::move(p));
  }

  std::unique_ptr<sdk::PricingStrategy> MakeStrategy(uint32_t job) {
    const Job& j = world_.jobs[job];
    std::unordered_map<std::string, Ppm> speed;
    for (size_t t = 0; t < world_.types.size(); ++t)
      if (j.speed[t] > 0) speed[world_.types[t].name] = static_cast<Ppm>(std::llround(j.speed[t] * kPpm));
    if (world_.utility == Utility::kRetention) {
      std::unique_ptr<sdk::PricingStrategy> s = CostOfDelayFor(job, std::move(speed));
      if (world_.bid_cap != kInfPrice && j.kind == world_.bid_cap_kind)
        s = std::make_unique<sdk::BudgetCapped>(std::move(s), world_.bid_cap);
      return s;
    }
    // Value utility: money values per node-hour.
    std::unique_ptr<sdk::PricingStrategy> s = std::make_unique<sdk::ThroughputValue>(j.value, std::move(speed));
    if (j.deadline != kNever) {
      sdk::DeadlineUrgency::Params p;
      p.deadline = j.deadline;
      p.remaining = [this, job] { return EstimatedRemaining(job); };
      s = std::make_unique<sdk::DeadlineUrgency>(std::move(s), std::move(p));
    }
    // A gang stops when it loses any node: each held node is worth the whole gang.
    if (j.kind != JobKind::kInference && j.nodes > 1) s = std::make_unique<sdk::GangAware>(std::move(s));
    if (world_.migration_aware) {
      sdk::MigrationAware::Params p;
      // The tenant's own estimate of one move's overhead (fig15 misestimates it).
      p.overhead = static_cast<Micros>(static_cast<double>(j.restore + j.ckpt_save) * world_.overhead_estimate);
      p.uncommitted = [this, job] {
        return static_cast<Micros>(std::max(0.0, Uncommitted(job)) * kMicrosPerHour);
      };
      s = std::make_unique<sdk::MigrationAware>(std::move(s), std::move(p));
    }
    if (world_.bid_cap != kInfPrice && j.kind == world_.bid_cap_kind)
      s = std::make_unique<sdk::BudgetCapped>(std::move(s), world_.bid_cap);
    return s;
  }

  sdk::Request MakeRequest(uint32_t job, uint32_t count) {
    const Job& j = world_.jobs[job];
    sdk::Request r;
    std::vector<std::pair<double, size_t>> order;
    for (size_t t = 0; t < world_.types.size(); ++t)
      if (j.speed[t] > 0) order.emplace_back(j.speed[t], t);
    std::stable_sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (auto& [s, t] : order) {
      sdk::NodeSpec spec;
      spec.node_type = world_.types[t].name;
      // Replacement nodes of a gang should sit in the same row as the rest.
      if (j.kind != JobKind::kInference) spec.locality = market::Locality::kSameRow;
      r.options.push_back(std::move(spec));
    }
    r.count = count;
    r.gang = j.kind != JobKind::kInference;
    // A serving fleet runs on whatever types it can get, side by side.
    r.mixed_types = j.kind == JobKind::kInference;
    return r;
  }

  void OnArrival(uint32_t job) override {
    const Job& j = world_.jobs[job];
    Tenant& t = tenants_[job];
    auto id = engine_->CreateTenant(now(), "job-" + std::to_string(job), std::max<Money>(j.budget, 1));
    quotes_.Clear();  // The call advanced the engine to now.
    Drain();
    if (!id.ok()) return;
    t.id = *id;
    if (job_of_tenant_.size() <= id->value) job_of_tenant_.resize(id->value + 1, -1);
    job_of_tenant_[id->value] = static_cast<int32_t>(job);
    t.client = std::make_unique<sdk::InProcessMarketClient>(engine_.get(), *id, [this] { return now(); }, &quotes_);
    t.strategy = MakeStrategy(job);
    t.listener = std::make_unique<JobListener>(this, job);
    t.adapter = std::make_unique<sdk::EconAdapter>(t.client.get(), t.strategy.get(), t.listener.get());
    uint32_t count = j.kind == JobKind::kInference ? 1 : j.nodes;
    auto req = t.adapter->Add(MakeRequest(job, count));
    if (!req.ok()) return;
    t.request = *req;
    t.active = true;
    active_.push_back(job);
    // The add marks the adapter dirty; it prices at the next market tick.
  }

  void OnFinished(uint32_t job) override {
    Tenant& t = tenants_[job];
    if (!t.active) return;
    t.finishing = true;
    (void)t.adapter->Remove(t.request);
    Drain();
    t.active = false;
    // A finished tenant's adapter has no request left: later events find no
    // owner in it, so it is dropped (with its client, strategy and listener)
    // after its count of Price() calls is kept. The week's finished tenants
    // otherwise stay on the heap beside the running ones (issue 12).
    finished_price_calls_ += t.adapter->stats().price_calls;
    t.adapter.reset();
    t.listener.reset();
    t.strategy.reset();
    t.client.reset();
    t.noticed = {};
    t.yielding = {};
  }

  void OnYield(uint32_t job) override {
    Tenant& t = tenants_[job];
    if (!t.active) return;
    std::vector<uint32_t> noticed = t.noticed;
    for (uint32_t n : noticed) {
      if (holder(n) != static_cast<int32_t>(job)) continue;
      t.yielding.push_back(n);
      (void)t.adapter->Yield(t.request, NodeId(n));
      Drain();
    }
  }

  void OnAutoscale(uint32_t job, double target) override {
    Tenant& t = tenants_[job];
    if (!t.active) return;
    const Job& j = world_.jobs[job];
    const auto* rs = t.adapter->request(t.request);
    if (!rs) return;
    // Capacity of the held nodes (a fleet may mix types), in acquisition order.
    std::vector<double> held;
    double cap = 0;
    for (const auto& h : rs->nodes) {
      held.push_back(j.speed[static_cast<size_t>(world_.nodes[h.node.value].type)]);
      cap += held.back();
    }
    uint32_t count = static_cast<uint32_t>(held.size());
    if (cap < target) {
      // Missing capacity in nodes of the best type; the next tick tops up if
      // the market hands out slower ones.
      double best = 0;
      for (double s : j.speed) best = std::max(best, s);
      count += static_cast<uint32_t>(std::ceil((target - cap) / std::max(best, 1e-9) - 1e-9));
    } else {
      // Resize gives back the most recently acquired nodes first.
      while (count > 1 && cap - held[count - 1] >= target) cap -= held[--count];
    }
    count = std::max<uint32_t>(1, count);
    if (rs->request.count == count) return;
    (void)t.adapter->Resize(t.request, count);
    Drain();
  }

  void OnTick() override {
    // Each active tenant re-prices at most once per tick, and only when its
    // inputs changed: a watched quote, its own events, or its strategy's timer
    // (EconAdapter::NeedsReprice). Skipping the others makes no engine call
    // that a re-price would have made.
    std::vector<uint32_t> still;
    const size_t n_active = active_.size();
    for (size_t i = 0; i < n_active; ++i) {
      PrefetchAhead(i);
      const uint32_t job = active_[i];
      Tenant& t = tenants_[job];
      if (!t.active) continue;
      still.push_back(job);
      // A gang stuck with part of its nodes gives them back and starts over.
      const Job& j = world_.jobs[job];
      if (j.kind != JobKind::kInference) {
        size_t held = runs_[job].nodes.size();
        if (held > 0 && held < j.nodes) {
          if (t.partial_since < 0) t.partial_since = now();
          if (now() - t.partial_since >= kPartialGangPatience) {
            t.partial_since = -1;
            t.finishing = true;
            (void)t.adapter->Remove(t.request);
            Drain();
            t.finishing = false;
            t.noticed.clear();
            auto req = t.adapter->Add(MakeRequest(job, j.nodes));
            if (req.ok()) t.request = *req;
          }
        } else {
          t.partial_since = -1;
        }
      }
      if (options_.reprice_every_tick) t.adapter->MarkDirty();
      if (!t.adapter->NeedsReprice(now())) continue;
      (void)t.adapter->Reprice();
      Drain();
    }
    active_.swap(still);
    if (options_.sample_power) {
      std::vector<Price> prices;
      for (VertexId v : type_root_) {
        auto q = engine_->Quote(v, false);
        prices.push_back(q.ok() ? q->quote : kInfPrice);
      }
      result_.metrics.type_price.push_back(std::move(prices));
      std::vector<Price> floors(world_.rows.size(), 0);
      for (auto [row, id] : row_policies_) {
        auto pv = engine_->GetPolicy(id);
        if (pv.ok()) floors[static_cast<size_t>(row)] = std::max(floors[static_cast<size_t>(row)], pv->floor);
      }
      result_.metrics.row_floor.push_back(std::move(floors));
      std::vector<uint32_t> held(world_.types.size() * 2, 0);
      for (uint32_t n = 0; n < world_.nodes.size(); ++n) {
        int32_t h = holder(n);
        if (h < 0) continue;
        size_t idx = static_cast<size_t>(world_.nodes[n].type) * 2 + (world_.jobs[static_cast<size_t>(h)].low_urgency ? 1 : 0);
        held[idx]++;
      }
      result_.metrics.type_held.push_back(std::move(held));
    }
  }

  // The tick walks thousands of tenants whose state is scattered over the
  // heap, and each one's first loads after the previous tenant's engine calls
  // missed the cache (issue 12). A few tenants ahead, the state the walk will
  // read is fetched, one level of pointers per step, so the misses overlap
  // with the work in between. Hints only: nothing is read that the walk
  // does not read anyway, and nothing changes.
  // EconAdapter::Prefetch's levels: the adapter, its request, client and
  // strategy, then the request's buffers and the strategy chain four hops
  // deep (levels 2-5: the objects at depth 1-4, or the table of a base met
  // sooner; the simulator's longest chain, four decorators over a
  // ThroughputValue, has its base fetched but not the base's table).
  static constexpr int kPrefetchLevels = 6;
  void PrefetchAhead(size_t i) const {
    const size_t n = active_.size();
    if (i + kPrefetchLevels + 1 < n) {
      const uint32_t job = active_[i + kPrefetchLevels + 1];
      __builtin_prefetch(&tenants_[job]);
      __builtin_prefetch(&world_.jobs[job]);
      __builtin_prefetch(&runs_[job]);
    }
    for (int level = 0; level < kPrefetchLevels; ++level) {
      const size_t ahead = i + kPrefetchLevels - static_cast<size_t>(level);
      if (ahead >= n) continue;
      const Tenant& t = tenants_[active_[ahead]];
      if (t.adapter) t.adapter->Prefetch(level);
    }
  }

  Micros NextExternalTime() override { return engine_ ? engine_->NextEventTime() : kNever; }
  void AdvanceExternal(Micros t) override {
    if (!engine_ || t < engine_->now()) return;
    (void)engine_->Advance(t);
    quotes_.Clear();
    Drain();
  }

  void Finish(RunResult* r) override {
    uint64_t calls = finished_price_calls_;
    for (size_t j = 0; j < tenants_.size(); ++j) {
      Tenant& t = tenants_[j];
      if (!t.id.valid()) continue;
      auto bal = engine_->AvailableBalance(t.id);
      Money start = std::max<Money>(world_.jobs[j].budget, 1);
      r->jobs[j].cost = bal.ok() ? start - *bal : 0;
      if (t.adapter) calls += t.adapter->stats().price_calls;
    }
    r->metrics.price_calls = calls;
  }

  std::unique_ptr<market::MarketEngine> engine_;
  sdk::QuoteCache quotes_;  // Shared by the tenants' clients; cleared by every engine change.
  std::vector<Tenant> tenants_;
  std::vector<int32_t> job_of_tenant_;
  std::vector<uint32_t> active_;
  std::vector<VertexId> type_root_;
  std::vector<std::pair<int, PolicyId>> row_policies_;  // (row index, its power-cap policy).
  std::vector<market::Event> pending_;
  uint64_t finished_price_calls_ = 0;  // Price() calls of the tenants dropped by OnFinished.
};

void JobListener::OnNodeGained(sdk::RequestId, NodeId node, Price) { sim_->Gained(job_, node.value); }
void JobListener::OnNodeLost(sdk::RequestId, NodeId node, uint8_t reasons) { sim_->Lost(job_, node.value, reasons); }
void JobListener::OnNotice(sdk::RequestId, NodeId node, Micros deadline, Price, uint8_t) {
  sim_->Noticed(job_, node.value, deadline);
}
void JobListener::OnContestEnded(sdk::RequestId, NodeId node) { sim_->ContestEnded(job_, node.value); }

}  // namespace

Result<RunResult> LaissezMechanism::Run(const World& world, const RunOptions& options) {
  LaissezSim sim(world, options);
  return sim.Execute(name());
}

}  // namespace laissez::sim
