// Floors and InfraMaps policies: the index of live policies by location (which policies
// cover a node, which nodes a policy covers), static floors, maintenance, power caps, carbon,
// the adaptive controllers (power caps and carbon budgets), and recomputing a node's floor.
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- floors

Price MarketEngine::Impl::PolicyFloor(const Policy& p, NodeId n) const {
  return std::visit(
      [&](const auto& s) -> Price {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, StaticFloorSpec>) {
          return s.price;
        } else if constexpr (std::is_same_v<T, MaintenanceSpec>) {
          return (now_ >= p.maint_start && now_ < s.end) ? kInfPrice : 0;
        } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
          return p.power_floor;
        } else if constexpr (std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
          // The controller's price per tonne is kept in power_floor.
          return CarbonFloor(IntensityAt(s.series, now_), topo_.node(n).meta.power_w, p.power_floor);
        } else {
          return CarbonFloor(IntensityAt(s.series, now_), topo_.node(n).meta.power_w, s.price_per_tonne);
        }
      },
      p.spec);
}

// The list of the index (policies_at_location_, policies_at_node_) that holds policy p.
std::vector<uint32_t>* MarketEngine::Impl::PolicyList(const Policy& p) {
  auto location_list = [&](LocationId l) {
    if (policies_at_location_.size() <= l.value) policies_at_location_.resize(l.value + 1);
    return &policies_at_location_[l.value];
  };
  return std::visit(
      [&](const auto& s) -> std::vector<uint32_t>* {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, StaticFloorSpec> || std::is_same_v<T, MaintenanceSpec>) {
          if (s.target.node.valid()) return &policies_at_node_[s.target.node.value];
          return location_list(s.target.location);
        } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
          return location_list(s.row);
        } else if constexpr (std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
          return location_list(s.region);
        } else {
          return location_list(s.location);
        }
      },
      p.spec);
}

// The start of p's maintenance if p is a maintenance window whose notice
// phase has begun and that has not ended, else kNever.
Micros MarketEngine::Impl::NoticedMaintStart(const Policy& p) const {
  const auto* m = std::get_if<MaintenanceSpec>(&p.spec);
  if (!m || now_ >= m->end || now_ < SatAdd(p.maint_start, -params_.grace)) return kNever;
  return p.maint_start;
}

// The maximum of the policy floors on n other than maintenance windows (for
// the `floor` reason inside a window).
Price MarketEngine::Impl::FloorBesideMaintenance(NodeId n) const {
  Price f = 0;
  ForEachPolicyOn(n, [&](const Policy& p) {
    if (!p.alive || std::holds_alternative<MaintenanceSpec>(p.spec)) return;
    f = std::max(f, PolicyFloor(p, n));
  });
  return f;
}

// Recomputes the floors of the nodes p covers, in node id order (the order
// of the notices and rate changes that follow).
void MarketEngine::Impl::RecomputeFloorsUnder(const Policy& p) {
  std::vector<uint32_t> under;
  auto add = [&](NodeId n) { under.push_back(n.value); };
  std::visit(
      [&](const auto& s) {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, StaticFloorSpec> || std::is_same_v<T, MaintenanceSpec>) {
          if (s.target.node.valid()) {
            if (s.target.node.value < nodes_.size()) add(s.target.node);
          } else {
            ForEachNodeUnder(s.target.location, add);
          }
        } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
          ForEachNodeUnder(s.row, add);
        } else if constexpr (std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
          ForEachNodeUnder(s.region, add);
        } else {
          ForEachNodeUnder(s.location, add);
        }
      },
      p.spec);
  std::sort(under.begin(), under.end());
  for (uint32_t i : under) {
    if (nodes_[i].alive) RecomputeFloor(NodeId(i));
  }
}

void MarketEngine::Impl::RecomputeFloor(NodeId n, bool pending) {
  NodeState& s = nodes_[n.value];
  if (!s.alive) return;
  // The maximum of the policy floors and the earliest noticed maintenance start on n, in one
  // walk over the policies on n (issue 12).
  Price f = 0;
  Micros maint = kNever;
  const Micros noticed = MaintAt(n);
  ForEachPolicyOn(n, [&](const Policy& p) {
    if (!p.alive) return;
    f = std::max(f, PolicyFloor(p, n));
    Micros start = NoticedMaintStart(p);
    // A window's notice phase that began on n stays begun until the window ends: a grace
    // lowered since (which moves the notice time after now) takes back no notice already
    // sent (DESIGN.md 3b: parameter changes apply from now on, deadlines already set stand).
    if (start == kNever && noticed != kNever && noticed == p.maint_start) {
      if (const auto* m = std::get_if<MaintenanceSpec>(&p.spec); m && now_ < m->end) start = p.maint_start;
    }
    maint = std::min(maint, start);
  });
  ApplyFloor(n, f, maint, pending);
}

// Sets live node n's floor and noticed maintenance start, with what follows a change.
void MarketEngine::Impl::ApplyFloor(NodeId n, Price f, Micros maint, bool pending) {
  NodeState& s = nodes_[n.value];
  if (f == s.base_floor && maint == MaintAt(n)) return;
  s.base_floor = f;
  SetMaintAt(n, maint);
  if (pending) RefreshNodeT<true>(n, true);
  else RefreshNode(n);
  if (s.holder.valid()) {
    UpdateRate(n);
    MarkDirty(n);
  } else if (s.order_slot != UINT32_MAX) {
    gangs_to_check_.push_back(s.order_slot);
  }
}

// Re-floors the nodes of `row` after staircase power cap p's floor stepped from `before` to
// p.power_floor: RecomputeFloorsUnder(p), without the walk over each node's policies where
// the step alone decides the floor (issue 12: a step re-floored every node of the row, most
// of them by a walk whose other terms had not moved). A node's floor is the maximum of its
// policies' floors, and here every other term is the one its last re-flooring read: the
// floors that follow time are re-floored at their own scheduled changes, which run before a
// power step at the same time (kSchedPolicy sorts before kSchedPower), and the rest at the
// calls that change them. So base_floor = max(others, before), and with base_floor > before,
// or base_floor == before and the step going up, the new floor is max(base_floor, after).
// The noticed maintenance start is the one term the shortcut cannot carry: a node with one
// is walked as before, since only RecomputeFloor knows to keep it (a notice phase that began
// under a grace since lowered). A node without one has none to gain here: every window's
// notice phase re-floors its nodes when it begins (its scheduled change, which runs before
// a power step at the same time; a raised grace that starts it, in SetParams; a node added
// inside it, at the addition). A node the step takes down from a floor it set (the others
// decide it), or that sits outside this shape, is walked too. The row's re-keys leave the
// index's trees to one re-derivation at the end (RefreshNodeT, RederiveIndex): a row is a
// run of leaves sharing their ancestors, and nothing here searches the trees (a re-floor
// reads policies and keys; the candidate walks read books; TouchRekeyed reads leaf keys).
void MarketEngine::Impl::RefloorPowerStep(const Policy& p, LocationId row, Price before) {
  const Price after = p.power_floor;
  std::vector<uint32_t> under;
  ForEachNodeUnder(row, [&](NodeId n) { under.push_back(n.value); });
  std::sort(under.begin(), under.end());
  // However the loop ends (an allocation in it that fails), the levels above the leaves it
  // re-keyed are re-derived, so the index stays whole.
  struct Rederive {
    Impl* impl;
    ~Rederive() { impl->RederiveIndex(); }
  } rederive{this};
  for (uint32_t i : under) {
    const NodeState& s = nodes_[i];
    if (!s.alive) continue;
    const NodeId n(i);
    const LocationId rack = topo_.node(n).rack;
    const bool walk = s.in_maint || s.base_floor < before || (s.base_floor == before && after < before) ||
                      !rack.valid() || topo_.location(rack).parent != row;
    if (walk) {
      RecomputeFloor(n, /*pending=*/true);
    } else {
      ApplyFloor(n, std::max(s.base_floor, after), kNever, /*pending=*/true);
    }
  }
}

// Next time a policy's floors change by themselves.
Micros MarketEngine::Impl::PolicyNextChange(const Policy& p) const {
  return std::visit(
      [&](const auto& s) -> Micros {
        using T = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<T, MaintenanceSpec>) {
          Micros notice = SatAdd(p.maint_start, -params_.grace);
          for (Micros c : {notice, p.maint_start, s.end}) {
            if (c > now_) return c;
          }
          return kNever;
        } else if constexpr (std::is_same_v<T, CarbonSpec>) {
          for (auto [from, v] : s.series) {
            if (from > now_) return from;
          }
          return kNever;
        } else if constexpr (std::is_same_v<T, AdaptivePowerCapSpec>) {
          return p.next_step;
        } else if constexpr (std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
          for (auto [from, v] : s.series) {
            if (from > now_) return std::min(from, p.next_step);
          }
          return p.next_step;
        } else {
          return kNever;
        }
      },
      p.spec);
}

void MarketEngine::Impl::SchedulePolicy(uint32_t id) {
  Policy& p = policies_[id];
  ScheduleErase(p.sched, kSchedPolicy, id);
  p.sched = p.alive ? PolicyNextChange(p) : kNever;
  ScheduleAdd(p.sched, kSchedPolicy, id);
}

Status MarketEngine::Impl::CheckSeries(const std::vector<std::pair<Micros, int64_t>>& series) {
  Micros last = std::numeric_limits<Micros>::min();
  for (auto [from, v] : series) {
    if (from <= last) return InvalidArgument("series: times must be strictly ascending");
    if (v < 0) return InvalidArgument("series: intensity must not be negative");
    last = from;
  }
  return Status::Ok();
}

bool MarketEngine::Impl::IsAdaptive(const PolicySpec& spec) {
  return std::holds_alternative<AdaptivePowerCapSpec>(spec) || std::holds_alternative<AdaptiveCarbonBudgetSpec>(spec);
}

AdaptiveControl MarketEngine::Impl::ControlOfPolicy(const PolicySpec& spec) {
  if (const auto* c = std::get_if<AdaptiveCarbonBudgetSpec>(&spec)) return ControlOf(*c);
  return ControlOf(std::get<AdaptivePowerCapSpec>(spec));
}

// What an adaptive policy measures over its held nodes that stay, and whether
// any is leaving: a node is leaving when its holder's limit is below its floor
// (rule 2) and no single pending challenger reaches that floor (the node would
// move to it and keep drawing power). Reserved nodes sit idle and do not
// count. A power cap sums power_w (watts) over its row; a carbon budget sums
// power_w x intensity(now) (mg/h) over its region, returned in grams per hour
// rounded up.
int64_t MarketEngine::Impl::Staying(const Policy& p, bool* leaving_any) const {
  const auto* carbon = std::get_if<AdaptiveCarbonBudgetSpec>(&p.spec);
  const int64_t intensity = carbon ? IntensityAt(carbon->series, now_) : 1;
  const LocationId where = carbon ? carbon->region : std::get<AdaptivePowerCapSpec>(p.spec).row;
  __int128 sum = 0;  // Non-negative terms: the order does not matter.
  *leaving_any = false;
  ForEachNodeUnder(where, [&](NodeId n) {
    const NodeState& s = nodes_[n.value];
    if (!s.alive || !s.holder.valid()) return;
    bool leaving = s.limit < s.base_floor;
    if (leaving && s.challenger != UINT32_MAX) {
      const Order& o = orders_[s.challenger];
      if (!o.is_gang() && o.effective >= s.base_floor) leaving = false;
    }
    if (leaving) *leaving_any = true;
    else sum += static_cast<__int128>(topo_.node(n).meta.power_w) * intensity;
  });
  if (carbon) sum = (sum + 999) / 1000;
  return sum >= INT64_MAX ? INT64_MAX : static_cast<int64_t>(sum);
}

// An adaptive policy's scheduled event (docs/MECHANISM.md): a control step -
// every `interval` from the policy's creation, so splitting an Advance never
// moves it, evaluated before the instant's matching - or a carbon budget's
// intensity change point, whose floors move with the intensity whatever the
// price does.
void MarketEngine::Impl::AdaptiveEvent(uint32_t id) {
  Policy& p = policies_[id];
  const Price before = p.power_floor;
  if (p.next_step <= now_) {
    const AdaptiveControl c = ControlOfPolicy(p.spec);
    bool pending = false;
    p.staying_w = Staying(p, &pending);
    p.power_floor = AdaptiveStep(c, p.power_floor, p.staying_w, pending);
    p.next_step = SatAdd(p.next_step, c.interval);
  }
  if (p.power_floor != before || std::holds_alternative<AdaptiveCarbonBudgetSpec>(p.spec)) RecomputeFloorsUnder(p);
}

// Re-evaluates power-cap floors from committed power. True if any floor changed.
bool MarketEngine::Impl::EvaluatePower() {
  if (!power_dirty_) return false;
  power_dirty_ = false;
  bool changed = false;
  for (uint32_t id : power_caps_) {
    Policy& p = policies_[id];
    const auto* pc = std::get_if<PowerCapSpec>(&p.spec);
    if (!p.alive || !pc) continue;
    int64_t committed = 0;
    ForEachNodeUnder(pc->row, [&](NodeId n) {
      const NodeState& s = nodes_[n.value];
      if (!s.alive || !s.holder.valid()) return;  // Reserved nodes sit idle until their gang starts.
      committed += topo_.node(n).meta.power_w;
    });
    Ppm util = pc->cap_w > 0 ? static_cast<Ppm>(static_cast<__int128>(committed) * kPpm / pc->cap_w) : kPpm;
    Price floor = 0;
    for (auto [threshold, price] : pc->steps) {
      if (util >= threshold) floor = price;
    }
    if (floor != p.power_floor) {
      const Price before = p.power_floor;
      p.power_floor = floor;
      RefloorPowerStep(p, pc->row, before);
      changed = true;
    }
  }
  return changed;
}

}  // namespace laissez::market
