#include "oplog/random_log.h"

#include <algorithm>
#include <random>
#include <string>

namespace laissez::oplog {

using namespace laissez::market;

namespace {

class Driver {
 public:
  Driver(MarketEngine& engine, const RandomLogOptions& options)
      : e_(engine), o_(options), rng_(options.seed * 0x9E3779B97F4A7C15ULL + 7) {}

  std::vector<LogRecord> Run() {
    Setup();
    for (size_t i = 0; i < o_.operations; ++i) Step();
    return std::move(log_);
  }

 private:
  uint64_t U(uint64_t n) { return n == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  bool P(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  // A price in micro-units per hour: 0.1 .. 20 units, on a 1000-micro grid.
  Price RandPrice() { return static_cast<Price>(100 + U(20'000)) * 1000; }

  void Do(OpBody body) {
    Operation op{t_, std::move(body)};
    ApplyResult r = Apply(e_, op);
    log_.push_back(LogRecord{std::move(op), r.status.ok() ? r.created_id : kNoId});
  }

  void AddNode(int i) {
    static const char* kTypes[] = {"h100x8", "a100x8"};
    topology::NodeInfo info;
    info.name = "n-" + std::to_string(i);
    info.type = kTypes[U(2)];
    int region = static_cast<int>(U(2));
    info.region = region == 0 ? "eu" : "us";
    info.zone = info.region + "-" + std::to_string(1 + U(2));
    info.row = "r" + std::to_string(1 + U(2));
    info.rack = "k" + std::to_string(1 + U(2));
    info.meta = {8, 640, static_cast<int32_t>(3000 + U(5) * 1000)};
    Do(OpAddNode{info});
  }

  MarketParams RandParams() {
    MarketParams p;
    p.grace = static_cast<Micros>(30 + U(270)) * kMicrosPerSecond;
    p.hysteresis_ppm = P(0.5) ? 0 : 50'000;
    p.tick = P(0.5) ? 1 : 1000;
    p.clip_alpha_ppm = P(0.6) ? 0 : 200'000;
    p.clip_interval = static_cast<Micros>(10 + U(50)) * kMicrosPerSecond;
    p.decay_beta = P(0.6) ? 0 : static_cast<Price>(U(2000));
    p.min_hold = P(0.6) ? 0 : static_cast<Micros>(U(120)) * kMicrosPerSecond;
    return p;
  }

  void Setup() {
    // Nodes first: the engine (as of commit 767e993) crashes on set_params
    // before any node exists (see the disabled test in replay_test.cc).
    for (int i = 0; i < o_.nodes; ++i) AddNode(next_node_name_++);
    if (o_.operator_ops) Do(OpSetParams{RandParams()});
    for (int i = 0; i < o_.tenants; ++i) {
      Money balance = static_cast<Money>(20 + U(500)) * kMicroUnits;
      Price max_rate = P(0.7) ? kInfPrice : static_cast<Price>(20 + U(60)) * kMicroUnits;
      Do(OpCreateTenant{"tenant-" + std::to_string(i), balance, max_rate});
    }
  }

  TenantId RandTenant() { return TenantId(static_cast<uint32_t>(U(e_.tenant_count()))); }

  // A live node, or an invalid id if none.
  NodeId RandLiveNode() {
    const auto& topo = e_.topology();
    if (topo.live_node_count() == 0) return NodeId();
    for (int tries = 0; tries < 16; ++tries) {
      NodeId n(static_cast<uint32_t>(U(topo.node_count())));
      if (topo.IsLiveNode(n)) return n;
    }
    for (uint32_t i = 0; i < topo.node_count(); ++i) {
      if (topo.IsLiveNode(NodeId(i))) return NodeId(i);
    }
    return NodeId();
  }

  // A vertex with live nodes below: a live node's leaf or one of its ancestors.
  // `inner` asks for a type root, region or zone (gangs need room).
  VertexId RandScope(bool inner) {
    const auto& topo = e_.topology();
    NodeId n = RandLiveNode();
    if (!n.valid()) return VertexId(static_cast<uint32_t>(U(topo.vertex_count() + 1)));
    std::vector<VertexId> up;
    topo.AncestorsOf(topo.node(n).leaf, &up);  // Deepest first: leaf, rack, row, zone, region, root.
    if (inner && up.size() >= 3) return up[up.size() - 1 - U(3)];
    return up[U(up.size())];
  }

  // A held node and its holder, if any.
  bool RandHolding(NodeId* node, TenantId* holder) {
    for (int tries = 0; tries < 8; ++tries) {
      TenantId t = RandTenant();
      auto v = e_.GetTenant(t);
      if (v.ok() && !v->nodes.empty()) {
        *node = v->nodes[U(v->nodes.size())];
        *holder = t;
        return true;
      }
    }
    return false;
  }

  bool RandOpenOrder(OrderView* out) {
    std::vector<OrderId> open = e_.OpenOrders();
    if (open.empty()) return false;
    auto v = e_.GetOrder(open[U(open.size())]);
    if (!v.ok()) return false;
    *out = *v;
    return true;
  }

  LocationId RandLocation() {
    NodeId n = RandLiveNode();
    if (!n.valid()) return topology::Topology::kRootLocation;
    const auto& topo = e_.topology();
    auto level = static_cast<topology::Level>(U(5));  // Root .. rack.
    return topo.AncestorAt(topo.node(n).rack, level);
  }

  void PlaceOrder() {
    TenantId t = RandTenant();
    // Tenants keep a handful of orders open, as real ones do; one with many
    // re-prices or withdraws instead (else budgets reject most calls).
    auto tv = e_.GetTenant(t);
    if (tv.ok() && tv->orders.size() >= 6) {
      auto o = e_.GetOrder(tv->orders[U(tv->orders.size())]);
      if (o.ok()) {
        if (P(0.5)) return Do(OpCancelOrder{t, o->id});
        return Do(OpUpdateOrder{t, o->id, RandPrice()});
      }
    }
    OrderSpec spec;
    spec.price = RandPrice();
    bool gang = P(0.12);
    spec.scope = RandScope(gang);
    if (gang) spec.count = static_cast<uint32_t>(2 + U(2));
    if (P(0.15)) {
      auto v = e_.GetTenant(t);
      if (v.ok() && !v->nodes.empty()) {
        spec.rel_to = v->nodes[U(v->nodes.size())];
        spec.locality = static_cast<Locality>(1 + U(4));
        const auto& topo = e_.topology();
        spec.scope = topo.TypeRoot(topo.node(spec.rel_to).type);
      }
    }
    Do(OpPlaceOrder{t, spec});
  }

  void Step() {
    // Time moves forward by 0 to ~20 s, sometimes straight to the next due event.
    uint64_t dt_kind = U(10);
    if (dt_kind < 3) {
      // Same instant.
    } else if (dt_kind < 9) {
      t_ += static_cast<Micros>(U(20'000'000));
    } else {
      Micros next = e_.NextEventTime();
      t_ = (next != kNever && next > t_) ? next : t_ + static_cast<Micros>(U(200'000'000));
    }
    if (o_.operator_ops && U(1000) < static_cast<uint64_t>(o_.operator_permille)) return OperatorStep(860 + U(120));
    if (o_.bad_calls && U(1000) < static_cast<uint64_t>(o_.bad_permille)) return BadCall();
    uint64_t r = U(860);
    if (r < 100) {
      Do(OpAdvance{});
    } else if (r < 360) {
      PlaceOrder();
    } else if (r < 560) {
      OrderView o;
      if (!RandOpenOrder(&o)) return PlaceOrder();
      Price p = P(0.6) ? o.spec.price + static_cast<Price>(U(3'000'000)) : RandPrice();
      Do(OpUpdateOrder{o.tenant, o.id, p});
    } else if (r < 640) {
      OrderView o;
      if (!RandOpenOrder(&o)) return Do(OpAdvance{});
      Do(OpCancelOrder{o.tenant, o.id});
    } else if (r < 760) {
      NodeId n;
      TenantId h;
      if (!RandHolding(&n, &h)) return PlaceOrder();
      auto v = e_.GetNode(n);
      Price limit = v.ok() ? v->limit : 0;
      Price nl = P(0.5) ? limit + static_cast<Price>(U(4'000'000)) : RandPrice();
      Do(OpSetLimit{h, n, nl});
    } else if (r < 800) {
      NodeId n;
      TenantId h;
      if (!RandHolding(&n, &h)) return Do(OpAdvance{});
      Do(OpRelinquish{h, n});
    } else if (r < 840) {
      Do(OpDeposit{RandTenant(), static_cast<Money>(1 + U(200)) * kMicroUnits});
    } else {
      Do(OpSetMaxRate{RandTenant(), P(0.5) ? kInfPrice : static_cast<Price>(10 + U(80)) * kMicroUnits});
    }
  }

  void OperatorStep(uint64_t r) {
    const auto& topo = e_.topology();
    // An operator keeps a bounded set of policies: past a dozen, retire one.
    if (r < 915 && live_policies_.size() >= 12) r = 930;
    if (r < 880) {
      FloorTarget target;
      if (P(0.3)) target.node = RandLiveNode();
      else target.location = RandLocation();
      Do(OpAddPolicy{StaticFloorSpec{target, P(0.05) ? kInfPrice : static_cast<Price>(U(6'000)) * 1000}});
    } else if (r < 895) {
      FloorTarget target;
      if (P(0.7)) target.node = RandLiveNode();
      else target.location = RandLocation();
      Micros start = t_ + static_cast<Micros>(U(400'000'000));
      Micros end = P(0.1) ? kNever : start + static_cast<Micros>(60 + U(600)) * kMicrosPerSecond;
      Do(OpAddPolicy{MaintenanceSpec{target, start, end}});
    } else if (r < 905) {
      NodeId n = RandLiveNode();
      if (!n.valid()) return Do(OpAdvance{});
      LocationId row = topo.AncestorAt(topo.node(n).rack, topology::Level::kRow);
      std::vector<PolicyId> adaptive;
      for (PolicyId id : live_policies_) {
        auto pv = e_.GetPolicy(id);
        if (pv.ok() && pv->alive && (std::holds_alternative<AdaptivePowerCapSpec>(pv->spec) ||
                                     std::holds_alternative<AdaptiveCarbonBudgetSpec>(pv->spec))) {
          adaptive.push_back(id);
        }
      }
      if (o_.adaptive_caps && !live_policies_.empty() && P(0.5)) {
        // A cooling failure or its end: a live adaptive policy's cap changes
        // in place (watts or grams per hour); now and then another policy's,
        // which is refused.
        PolicyId id = !adaptive.empty() && P(0.9) ? adaptive[U(adaptive.size())] : live_policies_[U(live_policies_.size())];
        return Do(OpSetAdaptiveCap{id, static_cast<int64_t>(2'000 + U(30'000))});
      }
      if (o_.adaptive_caps && P(0.5)) {
        AdaptivePowerCapSpec a;
        a.row = row;
        a.cap_w = static_cast<int64_t>(5'000 + U(30'000));
        a.margin_ppm = static_cast<Ppm>(U(200'000));
        a.band_ppm = static_cast<Ppm>(U(200'000));
        a.interval = static_cast<Micros>(1 + U(90)) * kMicrosPerSecond;
        a.rise_ppm = static_cast<Ppm>(U(500'000));
        a.rise_min = static_cast<Price>(1 + U(1'000'000));
        a.rise_max = a.rise_min * static_cast<Price>(1 + U(10));
        a.fall_step = static_cast<Price>(U(500'000));
        a.min_floor = static_cast<Price>(U(2)) * kMicroUnits / 2;
        a.max_floor = P(0.5) ? kInfPrice : a.min_floor + 6 * kMicroUnits;
        Do(OpAddPolicy{a});
        return TrackPolicy();  // So it can be removed, or its cap changed in place.
      }
      PowerCapSpec s;
      s.row = row;
      s.cap_w = static_cast<int64_t>(5'000 + U(30'000));
      s.steps = {{0, 0}, {500'000, static_cast<Price>(1 + U(3)) * kMicroUnits}, {900'000, kInfPrice}};
      Do(OpAddPolicy{s});
    } else if (r < 915) {
      NodeId n = RandLiveNode();
      if (o_.adaptive_caps && n.valid() && P(0.5)) {
        // An adaptive carbon budget on the node's region: a few kg per hour
        // against nodes of 3-7 kW at up to 500 g/kWh, so it often binds.
        AdaptiveCarbonBudgetSpec a;
        a.region = topo.AncestorAt(topo.node(n).rack, topology::Level::kRegion);
        a.budget_g_per_h = static_cast<int64_t>(1'000 + U(20'000));
        a.series = {{t_, static_cast<int64_t>(U(500))}, {t_ + 900 * kMicrosPerSecond, static_cast<int64_t>(U(500))}};
        a.margin_ppm = static_cast<Ppm>(U(200'000));
        a.band_ppm = static_cast<Ppm>(U(200'000));
        a.interval = static_cast<Micros>(1 + U(90)) * kMicrosPerSecond;
        a.rise_ppm = static_cast<Ppm>(U(500'000));
        a.rise_min = static_cast<Price>(1 + U(1'000)) * kMicroUnits;
        a.rise_max = a.rise_min * static_cast<Price>(1 + U(10));
        a.fall_step = static_cast<Price>(U(500)) * kMicroUnits;
        a.min_price = static_cast<Price>(U(2)) * 50 * kMicroUnits;
        a.max_price = P(0.5) ? kInfPrice : a.min_price + 20'000 * kMicroUnits;
        Do(OpAddPolicy{a});
        return TrackPolicy();
      }
      CarbonSpec s;
      s.location = n.valid() ? topo.AncestorAt(topo.node(n).rack, topology::Level::kRegion)
                             : topology::Topology::kRootLocation;
      s.price_per_tonne = static_cast<Price>(20 + U(100)) * kMicroUnits;
      s.series = {{t_, static_cast<int64_t>(U(500))},
                  {t_ + 600 * kMicrosPerSecond, static_cast<int64_t>(U(500))},
                  {t_ + 1800 * kMicrosPerSecond, static_cast<int64_t>(U(500))}};
      Do(OpAddPolicy{s});
    } else if (r < 940) {
      if (live_policies_.empty() || P(0.1)) {
        Do(OpRemovePolicy{PolicyId(static_cast<uint32_t>(U(policies_guess_ + 2)))});  // Maybe unknown.
      } else {
        size_t i = U(live_policies_.size());
        Do(OpRemovePolicy{live_policies_[i]});
        live_policies_.erase(live_policies_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else if (r < 950) {
      Do(OpSetParams{RandParams()});
    } else if (r < 965) {
      if (!o_.late_add_node) return Do(OpAdvance{});
      AddNode(next_node_name_++);
    } else {
      // Keep at least half the cluster so long runs stay interesting.
      NodeId n = RandLiveNode();
      if (!n.valid() || 2 * topo.live_node_count() <= static_cast<size_t>(o_.nodes)) return Do(OpAdvance{});
      Do(OpRemoveNode{n});
    }
    TrackPolicy();
  }

  // Records the policy the last call created, if it created one.
  void TrackPolicy() {
    if (!log_.empty() && std::holds_alternative<OpAddPolicy>(log_.back().op.body) && log_.back().created_id != kNoId) {
      policies_guess_ = std::max<uint64_t>(policies_guess_, log_.back().created_id + 1);
      live_policies_.push_back(PolicyId(static_cast<uint32_t>(log_.back().created_id)));
    }
  }

  void BadCall() {
    switch (U(6)) {
      case 0: Do(OpUpdateOrder{RandTenant(), OrderId(1'000'000 + U(10)), RandPrice()}); break;
      case 1: Do(OpCancelOrder{TenantId(9999), OrderId(0)}); break;
      case 2: {
        OrderView o;
        if (RandOpenOrder(&o)) Do(OpCancelOrder{TenantId(o.tenant.value + 1), o.id});
        else Do(OpRelinquish{RandTenant(), NodeId(123456)});
        break;
      }
      case 3: Do(OpSetLimit{RandTenant(), RandLiveNode(), RandPrice()}); break;
      case 4: Do(OpPlaceOrder{RandTenant(), OrderSpec{VertexId(999'999), RandPrice(), 1, Locality::kAny, NodeId()}});
        break;
      default: {
        // A call in the past: rejected with OUT_OF_RANGE, no time change.
        Operation op{t_ > 0 ? t_ - 1 : 0, OpAdvance{}};
        ApplyResult res = Apply(e_, op);
        log_.push_back(LogRecord{std::move(op), res.status.ok() ? res.created_id : kNoId});
      }
    }
  }

  MarketEngine& e_;
  RandomLogOptions o_;
  std::mt19937_64 rng_;
  Micros t_ = 0;
  int next_node_name_ = 0;
  uint64_t policies_guess_ = 0;
  std::vector<PolicyId> live_policies_;
  std::vector<LogRecord> log_;
};

}  // namespace

std::vector<LogRecord> DriveRandom(MarketEngine& engine, const RandomLogOptions& options) {
  return Driver(engine, options).Run();
}

std::string RandomLogText(const RandomLogOptions& options, size_t* operations) {
  market::MarketEngine engine;
  std::string text;
  size_t n = 0;
  for (const LogRecord& r : DriveRandom(engine, options)) {
    AppendOperation(r.op, r.created_id, &text);
    text.push_back('\n');
    ++n;
  }
  if (operations != nullptr) *operations = n;
  return text;
}

}  // namespace laissez::oplog
