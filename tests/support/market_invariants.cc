#include "tests/support/market_invariants.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace laissez::testsupport {

using market::EventType;
using market::MarketEngine;
using market::NodeStatus;
using market::NodeView;
using market::OrderState;
using market::OrderView;
using market::TenantView;
using topology::Level;

namespace {

std::string P(Price p) { return p == kInfPrice ? std::string("inf") : std::to_string(p); }

// Everything a check needs, read once through the public API.
struct World {
  const MarketEngine& e;
  const topology::Topology& topo;
  market::MarketParams params;
  Micros now;
  std::vector<NodeId> live;                // Live nodes.
  std::map<uint32_t, NodeView> nodes;      // By node id, live nodes only.
  std::map<uint64_t, OrderView> orders;    // Open orders.
  std::vector<TenantView> tenants;
  std::map<uint32_t, uint64_t> challenger;  // Node -> pending order contesting it.

  explicit World(const MarketEngine& engine)
      : e(engine), topo(engine.topology()), params(engine.params()), now(engine.now()) {}
};

// q(n): the effective price of the pending challenger of a contested node.
Price PendingPrice(const World& w, NodeId n, bool* has) {
  auto it = w.challenger.find(n.value);
  *has = it != w.challenger.end();
  if (!*has) return 0;
  return w.orders.at(it->second).effective_price;
}

// r(n) x (1 + h), rounded up (DESIGN.md §3 "Prices derived from fractions round up").
Price WithHysteresis(Price r, Ppm h) { return MulPpmCeil(r, kPpm + h); }

// The obtain price for a tenant order. `min_hold_counts` false gives the raw
// formula (what the eviction quote may show during the hold).
Price Obtain(const World& w, NodeId n, bool min_hold_counts = true) {
  const NodeView& v = w.nodes.at(n.value);
  if (v.status == NodeStatus::kReserved) return kInfPrice;
  if (v.floor == kInfPrice) return kInfPrice;  // Never obtainable.
  if (v.status == NodeStatus::kFree) return v.floor;
  if (min_hold_counts && w.now - v.held_since < w.params.min_hold) return kInfPrice;
  bool has_q = false;
  Price q = PendingPrice(w, n, &has_q);
  Price m = std::max(v.floor, WithHysteresis(v.limit, w.params.hysteresis_ppm));
  if (has_q) m = std::max(m, q);
  return SatAdd(m, w.params.tick);
}

bool EligibleIn(const topology::Topology& topo, const OrderView& o, NodeId n) {
  if (!topo.IsLiveNode(n)) return false;
  const topology::Node& node = topo.node(n);
  if (!o.spec.scope.valid() || o.spec.scope.value >= topo.vertex_count()) return false;
  const topology::Vertex& sv = topo.vertex(o.spec.scope);
  if (sv.type != node.type) return false;
  if (sv.level == Level::kNode) {
    if (sv.node != n) return false;
  } else if (!topo.LocationContains(sv.location, node.rack)) {
    return false;
  }
  if (o.spec.locality != market::Locality::kAny) {
    if (!o.spec.rel_to.valid() || o.spec.rel_to.value >= topo.node_count()) return false;
    Level level = static_cast<Level>(static_cast<uint8_t>(o.spec.locality));
    LocationId anchor = topo.AncestorAt(topo.node(o.spec.rel_to).rack, level);
    if (!anchor.valid() || !topo.LocationContains(anchor, node.rack)) return false;
  }
  return true;
}

bool IsHeld(const NodeView& v) { return v.status == NodeStatus::kHeld || v.status == NodeStatus::kContested; }

// Whether `n` lies under vertex `v` (a leaf: n itself).
bool Under(const topology::Topology& topo, VertexId v, NodeId n) {
  const topology::Vertex& x = topo.vertex(v);
  const topology::Node& node = topo.node(n);
  if (x.type != node.type) return false;
  if (x.level == Level::kNode) return x.node == n;
  return topo.LocationContains(x.location, node.rack);
}

class Checker {
 public:
  explicit Checker(const MarketEngine& e) : w_(e) {}

  std::string Run(InvariantContext& ctx) {
    if (!Load()) return out_.str();
    check_available_ = ctx.check_available_non_negative;
    last_notice_ = ctx.last_notice;
    if (ctx.requested != nullptr) {
      for (auto& [id, o] : w_.orders) {
        auto it = ctx.requested->find(id);
        if (it != ctx.requested->end()) o.spec.price = it->second;
      }
    }
    CheckHolders();
    CheckOrders();
    CheckNotCrossed();
    CheckHoldings();
    CheckTenants();
    CheckMoney(ctx);
    CheckQuotes();
    return out_.str();
  }

 private:
  std::ostream& Fail(const char* rule) { return out_ << "[" << rule << "] "; }

  bool Load() {
    const auto& topo = w_.topo;
    for (uint32_t i = 0; i < topo.node_count(); ++i) {
      NodeId n(i);
      auto v = w_.e.GetNode(n);
      if (!topo.IsLiveNode(n)) {
        if (v.ok() && v->status != NodeStatus::kRemoved) {
          Fail("removed") << "node " << i << " was removed but has status " << NodeStatusName(v->status) << "\n";
        }
        continue;
      }
      if (!v.ok()) {
        Fail("query") << "GetNode(" << i << "): " << v.status().ToString() << "\n";
        return false;
      }
      w_.live.push_back(n);
      w_.nodes.emplace(i, *v);
    }
    auto open = w_.e.OpenOrders();
    if (!std::is_sorted(open.begin(), open.end()) || std::adjacent_find(open.begin(), open.end()) != open.end()) {
      Fail("orders") << "OpenOrders() is not ascending and unique\n";
    }
    for (OrderId id : open) {
      auto o = w_.e.GetOrder(id);
      if (!o.ok()) {
        Fail("query") << "GetOrder(" << id.value << ") of an open order: " << o.status().ToString() << "\n";
        return false;
      }
      w_.orders.emplace(id.value, *o);
    }
    for (uint32_t i = 0; i < w_.e.tenant_count(); ++i) {
      auto t = w_.e.GetTenant(TenantId(i));
      if (!t.ok()) {
        Fail("query") << "GetTenant(" << i << "): " << t.status().ToString() << "\n";
        return false;
      }
      w_.tenants.push_back(*t);
    }
    // Pending challengers of contested nodes.
    for (const auto& [id, o] : w_.orders) {
      if (o.state != OrderState::kPending) continue;
      for (NodeId n : o.claims) {
        auto it = w_.nodes.find(n.value);
        if (it == w_.nodes.end()) {
          Fail("claims") << "order " << id << " claims node " << n.value << " which is not live\n";
          continue;
        }
        if (it->second.status == NodeStatus::kContested) {
          auto [c, ins] = w_.challenger.emplace(n.value, id);
          if (!ins) Fail("claims") << "node " << n.value << " has two pending challengers " << c->second << " and " << id << "\n";
        }
      }
    }
    return true;
  }

  // No node has two holders; the holder's list has each of its nodes once.
  void CheckHolders() {
    std::map<uint32_t, uint32_t> listed;  // Node -> tenant listing it.
    for (const TenantView& t : w_.tenants) {
      std::set<uint32_t> mine;
      for (NodeId n : t.nodes) {
        if (!mine.insert(n.value).second) Fail("holders") << "tenant " << t.id.value << " lists node " << n.value << " twice\n";
        auto [it, ins] = listed.emplace(n.value, t.id.value);
        if (!ins && it->second != t.id.value) {
          Fail("holders") << "node " << n.value << " is listed by tenants " << it->second << " and " << t.id.value << "\n";
        }
        auto nv = w_.nodes.find(n.value);
        if (nv == w_.nodes.end()) {
          Fail("holders") << "tenant " << t.id.value << " lists node " << n.value << " which is not live\n";
        } else if (!IsHeld(nv->second) || nv->second.holder != t.id) {
          Fail("holders") << "tenant " << t.id.value << " lists node " << n.value << " whose view says status "
                          << NodeStatusName(nv->second.status) << " holder " << nv->second.holder.value << "\n";
        }
      }
    }
    for (const auto& [i, v] : w_.nodes) {
      if (IsHeld(v)) {
        if (!v.holder.valid() || v.holder.value >= w_.tenants.size()) {
          Fail("holders") << "held node " << i << " has no valid holder\n";
        } else if (!listed.count(i) || listed[i] != v.holder.value) {
          Fail("holders") << "node " << i << " held by " << v.holder.value << " is not in its holder's list\n";
        }
        if (v.reserved_for.valid()) Fail("holders") << "held node " << i << " is also reserved for order " << v.reserved_for.value << "\n";
        if (v.limit < 0 || v.limit == kInfPrice) Fail("holders") << "node " << i << " has limit " << P(v.limit) << "\n";
      } else {
        if (v.holder.valid()) Fail("holders") << "node " << i << " is " << NodeStatusName(v.status) << " but has holder " << v.holder.value << "\n";
        if (listed.count(i)) Fail("holders") << "node " << i << " is " << NodeStatusName(v.status) << " but tenant " << listed[i] << " lists it\n";
      }
      if (v.status == NodeStatus::kReserved) {
        auto o = w_.orders.find(v.reserved_for.value);
        if (!v.reserved_for.valid() || o == w_.orders.end() || o->second.state != OrderState::kPending ||
            std::find(o->second.claims.begin(), o->second.claims.end(), NodeId(i)) == o->second.claims.end()) {
          Fail("reserved") << "node " << i << " is reserved for order " << v.reserved_for.value
                           << " which is not a pending order claiming it\n";
        }
      } else if (v.status == NodeStatus::kFree && v.reserved_for.valid()) {
        Fail("reserved") << "free node " << i << " says reserved_for " << v.reserved_for.value << "\n";
      }
      if (v.floor < 0) Fail("floor") << "node " << i << " has negative floor " << v.floor << "\n";
    }
  }

  void CheckOrders() {
    std::map<uint32_t, uint64_t> claimed;
    std::set<uint64_t> listed;
    for (const TenantView& t : w_.tenants) {
      for (OrderId id : t.orders) {
        listed.insert(id.value);
        auto o = w_.orders.find(id.value);
        if (o == w_.orders.end()) {
          Fail("orders") << "tenant " << t.id.value << " lists order " << id.value << " which is not open\n";
        } else if (o->second.tenant != t.id) {
          Fail("orders") << "tenant " << t.id.value << " lists order " << id.value << " of tenant " << o->second.tenant.value << "\n";
        }
      }
    }
    for (const auto& [id, o] : w_.orders) {
      if (!listed.count(id)) Fail("orders") << "open order " << id << " is not in its tenant's list\n";
      if (o.state != OrderState::kResting && o.state != OrderState::kPending) {
        Fail("orders") << "open order " << id << " has state " << OrderStateName(o.state) << "\n";
      }
      if (o.effective_price < 0 || o.effective_price > o.spec.price) {
        Fail("clip") << "order " << id << " effective price " << P(o.effective_price) << " outside [0, "
                     << P(o.spec.price) << "]\n";
      }
      if (o.spec.count < 1) Fail("orders") << "order " << id << " has count 0\n";
      // The effective scope is exactly the set of nodes eligible by scope, type and locality.
      for (NodeId n : w_.live) {
        bool under = o.effective_scope.valid() && o.effective_scope.value < w_.topo.vertex_count() &&
                     Under(w_.topo, o.effective_scope, n);
        if (under != EligibleIn(w_.topo, o, n)) {
          Fail("scope") << "order " << id << ": node " << n.value << (under ? " is" : " is not")
                        << " under the effective scope " << o.effective_scope.value << " but is"
                        << (under ? " not" : "") << " eligible by scope and locality\n";
        }
      }
      if (o.state == OrderState::kResting && !o.claims.empty()) Fail("orders") << "resting order " << id << " has claims\n";
      if (o.state == OrderState::kPending) {
        if (o.claims.empty() || o.claims.size() > o.spec.count) {
          Fail("orders") << "pending order " << id << " has " << o.claims.size() << " claims for count " << o.spec.count << "\n";
        }
        if (o.spec.count == 1 && o.claims.size() == 1) {
          auto nv = w_.nodes.find(o.claims[0].value);
          if (nv != w_.nodes.end() && nv->second.status != NodeStatus::kContested) {
            Fail("orders") << "pending single order " << id << " claims node " << o.claims[0].value << " which is "
                           << NodeStatusName(nv->second.status) << ", not contested\n";
          }
        }
      }
      for (NodeId n : o.claims) {
        auto [it, ins] = claimed.emplace(n.value, id);
        if (!ins) Fail("claims") << "node " << n.value << " is claimed by orders " << it->second << " and " << id << "\n";
        auto nv = w_.nodes.find(n.value);
        if (nv == w_.nodes.end()) continue;
        const NodeView& v = nv->second;
        bool reserved_by_me = v.status == NodeStatus::kReserved && v.reserved_for.value == id;
        bool contested_by_me = v.status == NodeStatus::kContested && v.holder != o.tenant;
        if (!reserved_by_me && !contested_by_me) {
          Fail("claims") << "order " << id << " claims node " << n.value << " which is " << NodeStatusName(v.status)
                         << " (holder " << v.holder.value << ", reserved_for " << v.reserved_for.value << ")\n";
        }
        if (!EligibleIn(w_.topo, o, n)) Fail("claims") << "order " << id << " claims node " << n.value << " it is not eligible for\n";
      }
    }
  }

  // DESIGN.md §3b "Never crossed": no resting single-node order reaches an
  // eligible obtain price, and no resting gang outside its cooldown can obtain
  // k nodes (during the cooldown: k free nodes). Plus rule 5: a pending
  // challenger never coexists with a free eligible node at or below its price.
  void CheckNotCrossed() {
    for (const auto& [id, o] : w_.orders) {
      uint32_t obtainable = 0, free_obtainable = 0;
      NodeId witness;
      for (NodeId n : w_.live) {
        const NodeView& v = w_.nodes.at(n.value);
        if (IsHeld(v) && v.holder == o.tenant) continue;  // Own nodes are never eligible.
        if (!EligibleIn(w_.topo, o, n)) continue;
        Price ob = Obtain(w_, n);
        if (ob != kInfPrice && o.effective_price >= ob) {
          ++obtainable;
          witness = n;
          if (v.status == NodeStatus::kFree) ++free_obtainable;
        }
        if (o.state == OrderState::kResting && o.spec.count == 1 && ob != kInfPrice && o.effective_price >= ob) {
          Fail("crossed") << "resting order " << id << " (tenant " << o.tenant.value << ", price "
                          << P(o.effective_price) << ", requested " << P(o.spec.price) << ") reaches obtain price "
                          << P(ob) << " of node " << n.value << " (" << NodeStatusName(v.status) << ", floor "
                          << P(v.floor) << ", limit " << P(v.limit) << ")\n";
        }
        if (o.state == OrderState::kPending && o.spec.count == 1 && v.status == NodeStatus::kFree &&
            v.floor != kInfPrice && o.effective_price >= v.floor) {
          Fail("pending-free") << "pending order " << id << " (price " << P(o.effective_price) << ") coexists with free eligible node "
                               << n.value << " at floor " << P(v.floor) << "\n";
        }
      }
      if (o.state == OrderState::kResting && o.spec.count > 1) {
        bool cooling = w_.now < o.cooldown_until;
        uint32_t can = cooling ? free_obtainable : obtainable;
        if (can >= o.spec.count) {
          Fail("crossed") << "resting gang " << id << " (k=" << o.spec.count << ", price " << P(o.effective_price)
                          << (cooling ? ", cooling down" : "") << ") can obtain " << can << " nodes, e.g. "
                          << witness.value << "\n";
        }
      }
    }
  }

  // Rule 2-4: eviction quotes, paying, keeping.
  void CheckHoldings() {
    for (const auto& [i, v] : w_.nodes) {
      NodeId n(i);
      if (!IsHeld(v)) continue;
      if (!v.holder.valid() || v.holder.value >= w_.tenants.size()) continue;
      auto eq = w_.e.GetEvictionQuote(v.holder, n);
      if (!eq.ok()) {
        Fail("eviction") << "GetEvictionQuote(holder " << v.holder.value << ", node " << i << "): " << eq.status().ToString() << "\n";
        continue;
      }
      if (w_.tenants.size() > 1) {
        TenantId other((v.holder.value + 1) % w_.tenants.size());
        auto bad = w_.e.GetEvictionQuote(other, n);
        if (bad.ok() || bad.status().code() != StatusCode::kPermissionDenied) {
          Fail("eviction") << "GetEvictionQuote by non-holder " << other.value << " of node " << i << " gave "
                           << (bad.ok() ? std::string("OK") : bad.status().ToString()) << ", want PERMISSION_DENIED\n";
        }
      }
      // c(n): q(n) and resting single-node orders of other tenants eligible for n.
      bool has_q = false;
      Price c = PendingPrice(w_, n, &has_q);
      for (const auto& [id, o] : w_.orders) {
        if (o.state != OrderState::kResting || o.spec.count != 1 || o.tenant == v.holder) continue;
        if (EligibleIn(w_.topo, o, n)) c = std::max(c, o.effective_price);
      }
      Price f = v.floor;
      Price want_pays = std::min(v.limit, std::max(c, f));
      std::ostringstream where;
      where << "node " << i << " (holder " << v.holder.value << ", " << NodeStatusName(v.status) << ")";
      if (eq->holder != v.holder) Fail("eviction") << where.str() << ": quote holder " << eq->holder.value << "\n";
      if (eq->limit != v.limit) Fail("eviction") << where.str() << ": quote limit " << P(eq->limit) << " != view limit " << P(v.limit) << "\n";
      if (eq->floor != f) Fail("eviction") << where.str() << ": quote floor " << P(eq->floor) << " != view floor " << P(f) << "\n";
      if (eq->competing != c) Fail("competing") << where.str() << ": c(n) " << P(eq->competing) << ", brute force " << P(c) << "\n";
      if (eq->pays > eq->limit) Fail("pays<=limit") << where.str() << ": pays " << P(eq->pays) << " > limit " << P(eq->limit) << "\n";
      if (eq->pays != want_pays) {
        Fail("pays") << where.str() << ": pays " << P(eq->pays) << ", want min(r=" << P(v.limit) << ", max(c=" << P(c)
                     << ", f=" << P(f) << ")) = " << P(want_pays) << "\n";
      }
      Price raw = Obtain(w_, n, /*min_hold_counts=*/false);
      Price held = Obtain(w_, n, /*min_hold_counts=*/true);
      if (eq->obtain != raw && eq->obtain != held) {
        Fail("eviction") << where.str() << ": obtain " << P(eq->obtain) << ", brute force " << P(raw) << "\n";
      }
      if (eq->contested != (v.status == NodeStatus::kContested)) {
        Fail("eviction") << where.str() << ": quote says contested=" << eq->contested << "\n";
      }
      if (v.status == NodeStatus::kContested && eq->deadline < w_.now) {
        Fail("grace") << where.str() << ": deadline " << eq->deadline << " already passed (now " << w_.now << ")\n";
      }
      // Rule 2: an uncontested holder keeps n only while r(n) >= f(n).
      if (v.status == NodeStatus::kHeld && v.limit < f) {
        Fail("keeping") << where.str() << ": limit " << P(v.limit) << " below floor " << P(f) << " without a notice\n";
      }
      // Rule 5: a pending single challenger still reaches the obtain price
      // computed without itself (else the contest ended in the holder's favour).
      auto ch = w_.challenger.find(i);
      if (ch != w_.challenger.end() && f != kInfPrice) {
        const OrderView& o = w_.orders.at(ch->second);
        Price need = SatAdd(std::max(f, WithHysteresis(v.limit, w_.params.hysteresis_ppm)), w_.params.tick);
        if (o.effective_price < need) {
          Fail("contest") << where.str() << ": pending challenger " << ch->second << " at " << P(o.effective_price)
                          << " is below the obtain price " << P(need) << " yet the contest stands\n";
        }
      }
      pays_[v.holder.value] += eq->pays;
      if (last_notice_ != nullptr) CheckNotice(n, v, *eq, where.str());
    }
  }

  // §3b: a contested node's reasons are the ones that apply, and the
  // holder's latest notice states them with the deadline and the price
  // max(q, f) (infinite for maintenance). Exhaustion may outlive the
  // tenant's exhaustion: notices already sent stay.
  void CheckNotice(NodeId n, const NodeView& v, const market::EvictionQuote& eq, const std::string& where) {
    const TenantView& holder = w_.tenants[v.holder.value];
    if (v.status != NodeStatus::kContested) {
      if (holder.exhausted) Fail("notice") << where << ": the holder is exhausted but the node has no notice\n";
      return;
    }
    bool has_q = false;
    Price q = PendingPrice(w_, n, &has_q);
    Price f = v.floor;
    uint8_t r = eq.reasons;
    bool maintenance = (r & market::kReasonMaintenance) != 0;
    if (r == 0) Fail("notice") << where << ": contested without a reason\n";
    if (((r & market::kReasonOutbid) != 0) != has_q) {
      Fail("notice") << where << ": reasons " << market::ReasonNames(r) << " but "
                     << (has_q ? "a" : "no") << " pending challenger\n";
    }
    // Inside a maintenance window f is infinite and says nothing about other floors.
    if ((!maintenance || f != kInfPrice) && ((r & market::kReasonFloor) != 0) != (f > v.limit)) {
      Fail("notice") << where << ": reasons " << market::ReasonNames(r) << " with floor " << P(f) << " and limit "
                     << P(v.limit) << "\n";
    }
    if (holder.exhausted && (r & market::kReasonExhaustion) == 0) {
      Fail("notice") << where << ": the holder is exhausted but the reasons are " << market::ReasonNames(r) << "\n";
    }
    auto it = last_notice_->find(n.value);
    if (it == last_notice_->end()) {
      Fail("notice") << where << ": contested, but no notice was ever sent for it\n";
      return;
    }
    const market::Event& ev = it->second;
    Price want = maintenance ? kInfPrice : std::max(q, f);
    OrderId want_order = has_q ? OrderId(w_.challenger.at(n.value)) : OrderId();
    if (ev.tenant != v.holder || ev.deadline != eq.deadline || ev.reasons != r || ev.price != want ||
        ev.order != want_order) {
      Fail("notice") << where << ": the latest notice (t " << ev.time << ", tenant " << ev.tenant.value << ", price "
                     << P(ev.price) << ", reasons " << market::ReasonNames(ev.reasons) << ", deadline " << ev.deadline
                     << ", order " << (ev.order.valid() ? std::to_string(ev.order.value) : "-")
                     << ") does not state what is in force (price " << P(want) << ", reasons "
                     << market::ReasonNames(r) << ", deadline " << eq.deadline << ", order "
                     << (has_q ? std::to_string(want_order.value) : "-") << ")\n";
    }
  }

  void CheckTenants() {
    for (const TenantView& t : w_.tenants) {
      __int128 committed = 0;
      __int128 need = 0;  // Nodes at full limit for one grace period (§3b exhaustion).
      bool all_noticed = true;
      size_t open_orders = t.orders.size();  // Even at price 0 (rule 7: its orders are cancelled).
      for (NodeId n : t.nodes) {
        auto it = w_.nodes.find(n.value);
        if (it == w_.nodes.end()) continue;
        committed += it->second.limit;
        __int128 x = static_cast<__int128>(it->second.limit) * w_.params.grace;
        need += (x + kMicrosPerHour - 1) / kMicrosPerHour;
        if (it->second.status != NodeStatus::kContested) all_noticed = false;
      }
      for (OrderId id : t.orders) {
        auto it = w_.orders.find(id.value);
        if (it == w_.orders.end()) continue;
        committed += static_cast<__int128>(it->second.spec.price) * (it->second.spec.count - it->second.filled);
      }
      if (committed != static_cast<__int128>(t.committed_rate)) {
        Fail("committed") << "tenant " << t.id.value << " committed_rate " << P(t.committed_rate) << ", brute force "
                          << static_cast<int64_t>(committed) << "\n";
      }
      if (t.spend_rate != pays_[t.id.value]) {
        Fail("spend") << "tenant " << t.id.value << " spend_rate " << P(t.spend_rate) << " != sum of pays "
                      << P(pays_[t.id.value]) << "\n";
      }
      if (t.balance < 0) Fail("balance>=0") << "tenant " << t.id.value << " balance " << t.balance << "\n";
      auto avail = w_.e.AvailableBalance(t.id);
      if (!avail.ok()) {
        Fail("query") << "AvailableBalance(" << t.id.value << "): " << avail.status().ToString() << "\n";
      } else {
        if (*avail < 0 && check_available_) Fail("balance>=0") << "tenant " << t.id.value << " available balance " << *avail << "\n";
        if (*avail > t.balance) Fail("balance") << "tenant " << t.id.value << " available " << *avail << " > balance " << t.balance << "\n";
        unsettled_by_tenants_ += t.balance - *avail;
        // Rule 7 / §3b: once the balance no longer covers the nodes at full
        // limit for one grace period, the tenant is exhausted: no open orders,
        // and every node it holds has a notice.
        if (!t.nodes.empty() && static_cast<__int128>(*avail) <= need && (open_orders > 0 || !all_noticed)) {
          Fail("exhaustion") << "tenant " << t.id.value << " available " << *avail << " <= "
                             << static_cast<int64_t>(need) << " (nodes at limit for one grace) but has "
                             << open_orders << " open orders and " << (all_noticed ? "all" : "not all")
                             << " nodes noticed\n";
        }
      }
    }
  }

  void CheckMoney(InvariantContext& ctx) {
    market::LedgerTotals tot = w_.e.ledger_totals();
    auto ledger = w_.e.ledger();
    if (tot.deposited != tot.tenant_balances + tot.operator_revenue) {
      Fail("conservation") << "deposited " << tot.deposited << " != balances " << tot.tenant_balances << " + revenue "
                           << tot.operator_revenue << "\n";
    }
    if (ctx.expected_deposited >= 0 && tot.deposited != ctx.expected_deposited) {
      Fail("conservation") << "deposited " << tot.deposited << ", the test deposited " << ctx.expected_deposited << "\n";
    }
    Money balances = 0;
    for (const TenantView& t : w_.tenants) balances += t.balance;
    if (balances != tot.tenant_balances) Fail("conservation") << "sum of balances " << balances << " != total " << tot.tenant_balances << "\n";
    if (ctx.charged_event_total >= 0 && ctx.charged_event_total != tot.operator_revenue) {
      Fail("conservation") << "charged events sum to " << ctx.charged_event_total << ", revenue " << tot.operator_revenue << "\n";
    }
    Money unsettled = w_.e.UnsettledCharges();
    if (unsettled < 0) Fail("conservation") << "UnsettledCharges " << unsettled << "\n";
    if (unsettled_by_tenants_ > unsettled) {
      Fail("conservation") << "balances minus available balances " << unsettled_by_tenants_ << " > UnsettledCharges " << unsettled << "\n";
    }
    if (ledger.empty() && tot.entries != 0 && ctx.ledger_prefix == nullptr) return;  // Ledger not retained.
    if (tot.entries != ledger.size()) Fail("ledger") << "totals.entries " << tot.entries << " != ledger size " << ledger.size() << "\n";
    Money amount = 0, waived = 0;
    std::map<uint32_t, Money> paid, tw;
    for (const auto& le : ledger) {
      amount += le.amount;
      waived += le.waived;
      paid[le.tenant.value] += le.amount;
      tw[le.tenant.value] += le.waived;
      if (le.amount < 0 || le.waived < 0 || le.from > le.time || le.time > w_.now || le.rate < 0 || le.rate == kInfPrice) {
        Fail("ledger") << "bad entry: tenant " << le.tenant.value << " node " << le.node.value << " [" << le.from << ", "
                       << le.time << "] rate " << P(le.rate) << " amount " << le.amount << " waived " << le.waived << "\n";
      }
      // A charge is price x elapsed time plus a carried remainder below one micro-unit.
      __int128 due = static_cast<__int128>(le.rate) * (le.time - le.from);
      __int128 lo = due / kMicrosPerHour, hi = (due + kMicrosPerHour - 1) / kMicrosPerHour + 1;
      if (le.amount + le.waived < lo || le.amount + le.waived > hi) {
        Fail("ledger") << "entry for node " << le.node.value << " charges " << le.amount << "+" << le.waived
                       << " for rate " << le.rate << " over " << (le.time - le.from) << "us\n";
      }
    }
    if (amount != tot.operator_revenue) Fail("ledger") << "ledger amounts sum to " << amount << ", revenue " << tot.operator_revenue << "\n";
    if (waived != tot.waived) Fail("ledger") << "ledger waived sum to " << waived << ", totals " << tot.waived << "\n";
    for (const TenantView& t : w_.tenants) {
      if (t.paid != paid[t.id.value]) Fail("ledger") << "tenant " << t.id.value << " paid " << t.paid << ", ledger " << paid[t.id.value] << "\n";
      if (t.waived != tw[t.id.value]) Fail("ledger") << "tenant " << t.id.value << " waived " << t.waived << ", ledger " << tw[t.id.value] << "\n";
    }
    if (ctx.ledger_prefix != nullptr) {
      auto& prev = *ctx.ledger_prefix;
      if (prev.size() > ledger.size() || !std::equal(prev.begin(), prev.end(), ledger.begin())) {
        Fail("ledger") << "the ledger is not append-only (" << prev.size() << " entries before, " << ledger.size() << " now)\n";
      }
      prev.assign(ledger.begin(), ledger.end());
    }
  }

  // Rule 12: every vertex aggregate equals a brute-force recomputation.
  void CheckQuotes() {
    const auto& topo = w_.topo;
    for (uint32_t vi = 0; vi < topo.vertex_count(); ++vi) {
      VertexId v(vi);
      const topology::Vertex& vx = topo.vertex(v);
      if (vx.level == Level::kNode && !topo.IsLiveNode(vx.node)) continue;
      market::VertexQuote want;
      want.vertex = v;
      for (NodeId n : w_.live) {
        if (!Under(topo, v, n)) continue;
        const NodeView& nv = w_.nodes.at(n.value);
        ++want.total;
        switch (nv.status) {
          case NodeStatus::kFree: ++want.free; break;
          case NodeStatus::kHeld: ++want.held; break;
          case NodeStatus::kContested: ++want.contested; break;
          case NodeStatus::kReserved: ++want.reserved; break;
          case NodeStatus::kRemoved: break;
        }
        want.quote = std::min(want.quote, Obtain(w_, n));
      }
      std::map<Price, uint32_t, std::greater<>> depth;
      for (const auto& [id, o] : w_.orders) {
        if (o.state != OrderState::kResting || o.spec.count != 1) continue;
        // The order's scope narrowed by its locality: where it can take a node.
        VertexId scope = o.effective_scope;
        if (!scope.valid() || scope.value >= topo.vertex_count()) continue;
        const topology::Vertex& sx = topo.vertex(scope);
        bool below = sx.type == vx.type &&
                     (vx.level == Level::kNode ? scope == v
                                               : (sx.level == Level::kNode ? topo.LocationContains(vx.location, topo.node(sx.node).rack)
                                                                           : topo.LocationContains(vx.location, sx.location)));
        if (below) ++depth[o.effective_price];
      }
      want.depth.assign(depth.begin(), depth.end());
      auto got = w_.e.Quote(v, /*with_depth=*/true);
      if (!got.ok()) {
        if (want.total > 0) Fail("quote") << "Quote(" << topo.VertexName(v) << "): " << got.status().ToString() << "\n";
        continue;
      }
      auto show = [](const market::VertexQuote& q) {
        std::ostringstream s;
        s << "quote " << P(q.quote) << " total " << q.total << " free " << q.free << " held " << q.held << " contested "
          << q.contested << " reserved " << q.reserved << " depth [";
        for (auto [p, c] : q.depth) s << P(p) << "x" << c << " ";
        s << "]";
        return s.str();
      };
      if (got->quote != want.quote || got->total != want.total || got->free != want.free || got->held != want.held ||
          got->contested != want.contested || got->reserved != want.reserved || got->depth != want.depth) {
        Fail("aggregate") << "vertex " << topo.VertexName(v) << ": engine " << show(*got) << "; brute force " << show(want) << "\n";
      }
    }
  }

  World w_;
  std::ostringstream out_;
  std::map<uint32_t, Price> pays_;
  Money unsettled_by_tenants_ = 0;
  bool check_available_ = true;
  const std::map<uint32_t, market::Event>* last_notice_ = nullptr;
};

}  // namespace

std::string CheckInvariants(const MarketEngine& e, InvariantContext& ctx) { return Checker(e).Run(ctx); }

namespace {
// Node views and pending challengers: what obtain prices are computed from.
World LoadForObtain(const MarketEngine& e) {
  World w(e);
  for (uint32_t i = 0; i < w.topo.node_count(); ++i) {
    if (!w.topo.IsLiveNode(NodeId(i))) continue;
    auto v = e.GetNode(NodeId(i));
    if (v.ok()) w.nodes.emplace(i, *v);
  }
  for (OrderId id : e.OpenOrders()) {
    auto o = e.GetOrder(id);
    if (o.ok()) w.orders.emplace(id.value, *o);
  }
  for (const auto& [id, o] : w.orders) {
    if (o.state != OrderState::kPending) continue;
    for (NodeId c : o.claims) {
      auto it = w.nodes.find(c.value);
      if (it != w.nodes.end() && it->second.status == NodeStatus::kContested) w.challenger.emplace(c.value, id);
    }
  }
  return w;
}
}  // namespace

Price BruteObtain(const MarketEngine& e, NodeId n) {
  World w = LoadForObtain(e);
  if (!w.nodes.count(n.value)) return kInfPrice;
  return Obtain(w, n);
}

Price BruteClipReference(const MarketEngine& e, const OrderView& o) {
  World w = LoadForObtain(e);
  std::vector<Price> prices;
  for (const auto& [i, v] : w.nodes) {
    NodeId n(i);
    if ((IsHeld(v) && v.holder == o.tenant) || !EligibleIn(w.topo, o, n)) continue;
    if (v.status == NodeStatus::kReserved && v.reserved_for == o.id) {
      prices.push_back(v.floor);  // Its own reservation: what it took the node at.
      continue;
    }
    auto it = w.challenger.find(i);
    if (it != w.challenger.end() && it->second == o.id.value) {
      w.challenger.erase(it);  // Priced without its own pending price.
      prices.push_back(Obtain(w, n));
      w.challenger.emplace(i, o.id.value);
      continue;
    }
    prices.push_back(Obtain(w, n));
  }
  if (prices.size() < o.spec.count) return kInfPrice;
  std::sort(prices.begin(), prices.end());
  return prices[o.spec.count - 1];
}

bool Eligible(const MarketEngine& e, const OrderView& o, NodeId n) { return EligibleIn(e.topology(), o, n); }

std::string EventToString(const market::Event& ev) {
  std::ostringstream s;
  s << "t=" << ev.time << " " << market::EventTypeName(ev.type);
  if (ev.node.valid()) s << " node=" << ev.node.value;
  if (ev.tenant.valid()) s << " tenant=" << ev.tenant.value;
  if (ev.other.valid()) s << " other=" << ev.other.value;
  if (ev.order.valid()) s << " order=" << ev.order.value;
  if (ev.vertex.valid()) s << " vertex=" << ev.vertex.value;
  s << " price=" << P(ev.price);
  if (ev.amount || ev.waived) s << " amount=" << ev.amount << " waived=" << ev.waived;
  if (ev.deadline) s << " deadline=" << ev.deadline;
  if (ev.reasons) s << " reasons=" << market::ReasonNames(ev.reasons);
  if (ev.cancel_reason != market::CancelReason::kNone) s << " cancel=" << market::CancelReasonName(ev.cancel_reason);
  return s.str();
}

std::string EventsToString(std::span<const market::Event> events) {
  std::string s;
  for (const auto& ev : events) s += EventToString(ev) + "\n";
  return s;
}

void RecordingSink::OnEvents(std::span<const market::Event> evs) {
  ++batches;
  for (const auto& ev : evs) {
    events.push_back(ev);
    if (ev.type == EventType::kCharged) charged_total += ev.amount;
    if (ev.type == EventType::kNotice) last_notice.insert_or_assign(ev.node.value, ev);
  }
}

std::string Snapshot(const MarketEngine& e, uint64_t order_id_bound) {
  std::ostringstream s;
  const auto& topo = e.topology();
  const auto& p = e.params();
  s << "now " << e.now() << " next " << e.NextEventTime() << "\n";
  s << "params grace " << p.grace << " h " << p.hysteresis_ppm << " tick " << p.tick << " alpha " << p.clip_alpha_ppm
    << " interval " << p.clip_interval << " beta " << p.decay_beta << " min_hold " << p.min_hold << "\n";
  for (uint32_t i = 0; i < topo.node_count(); ++i) {
    auto v = e.GetNode(NodeId(i));
    s << "node " << i << " " << topo.node(NodeId(i)).name << " live " << topo.IsLiveNode(NodeId(i));
    if (v.ok()) {
      s << " " << NodeStatusName(v->status) << " holder " << v->holder.value << " limit " << P(v->limit) << " since "
        << v->held_since << " floor " << P(v->floor) << " reserved_for " << v->reserved_for.value;
      if ((v->status == NodeStatus::kHeld || v->status == NodeStatus::kContested)) {
        auto eq = e.GetEvictionQuote(v->holder, NodeId(i));
        if (eq.ok()) {
          s << " | c " << P(eq->competing) << " f " << P(eq->floor) << " obtain " << P(eq->obtain) << " pays "
            << P(eq->pays) << " contested " << eq->contested << " deadline " << eq->deadline << " reasons "
            << int(eq->reasons);
        }
      }
    }
    s << "\n";
  }
  for (uint64_t id = 0; id < order_id_bound; ++id) {
    auto o = e.GetOrder(OrderId(id));
    if (!o.ok()) continue;
    s << "order " << id << " tenant " << o->tenant.value << " scope " << o->spec.scope.value << " price "
      << P(o->spec.price) << " count " << o->spec.count << " loc " << int(o->spec.locality) << " rel "
      << o->spec.rel_to.value << " eff_scope " << o->effective_scope.value << " eff " << P(o->effective_price) << " "
      << OrderStateName(o->state) << " seq " << o->seq << " filled " << o->filled << " cooldown " << o->cooldown_until
      << " claims";
    for (NodeId n : o->claims) s << " " << n.value;
    s << "\n";
  }
  for (uint32_t i = 0; i < e.tenant_count(); ++i) {
    auto t = e.GetTenant(TenantId(i));
    if (!t.ok()) continue;
    auto avail = e.AvailableBalance(TenantId(i));
    s << "tenant " << i << " " << t->name << " balance " << t->balance << " avail " << (avail.ok() ? *avail : -1)
      << " max " << P(t->max_rate) << " committed " << P(t->committed_rate) << " spend " << P(t->spend_rate)
      << " paid " << t->paid << " waived " << t->waived << " exhausted " << t->exhausted << " nodes";
    for (NodeId n : t->nodes) s << " " << n.value;
    s << " orders";
    for (OrderId o : t->orders) s << " " << o.value;
    s << "\n";
  }
  // Policies' own state (the adaptive controller's floor and measurement).
  for (uint32_t id = 0;; ++id) {
    auto pv = e.GetPolicy(PolicyId(id));
    if (!pv.ok()) break;
    s << "policy " << id << " alive " << pv->alive << " floor " << P(pv->floor) << " staying " << pv->staying_w
      << " carbon_price " << P(pv->carbon_price) << " staying_g " << pv->staying_g_per_h << " next " << pv->next_step
      << "\n";
  }
  auto tot = e.ledger_totals();
  s << "totals deposited " << tot.deposited << " balances " << tot.tenant_balances << " revenue "
    << tot.operator_revenue << " waived " << tot.waived << " entries " << tot.entries << " unsettled "
    << e.UnsettledCharges() << " resting " << e.resting_order_count() << "\n";
  for (const auto& le : e.ledger()) {
    s << "ledger " << le.time << " " << le.from << " tenant " << le.tenant.value << " node " << le.node.value << " rate "
      << le.rate << " amount " << le.amount << " waived " << le.waived << "\n";
  }
  for (uint32_t vi = 0; vi < topo.vertex_count(); ++vi) {
    auto q = e.Quote(VertexId(vi), true);
    if (!q.ok()) continue;
    s << "quote " << topo.VertexName(VertexId(vi)) << " " << P(q->quote) << " " << q->total << "/" << q->free << "/"
      << q->held << "/" << q->contested << "/" << q->reserved << " depth";
    for (auto [pr, c] : q->depth) s << " " << P(pr) << "x" << c;
    s << "\n";
  }
  return s.str();
}

}  // namespace laissez::testsupport
