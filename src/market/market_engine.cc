// MarketEngine: the public facade (market/market_engine.h). Each call checks its arguments,
// reports itself to the operation observer and runs in MarketEngine::Impl (engine/engine_impl.h),
// whose member functions live by concern in src/market/engine/.
#include "market/market_engine.h"

#include "market/engine/engine_impl.h"

namespace laissez::market {

// ==================================================================== facade

MarketEngine::MarketEngine(MarketParams params, EngineOptions options)
    : impl_(std::make_unique<Impl>(params, options)) {}
MarketEngine::~MarketEngine() = default;

void MarketEngine::set_sink(EventSink* sink) { impl_->sink_ = sink; }

void MarketEngine::set_operation_observer(OperationObserver observer) {
  impl_->observer_ = std::move(observer);
  if (impl_->observer_) impl_->observer_(Operation{impl_->now_, OpSetParams{impl_->params_}}, UINT64_MAX);
}

Status MarketEngine::Advance(Micros t) {
  std::optional<OpBody> body;
  if (impl_->observer_) body.emplace(OpAdvance{});
  return impl_->Observed(t, body, impl_->Call(t, [] { return Status::Ok(); }));
}
Micros MarketEngine::now() const { return impl_->now_; }
Micros MarketEngine::NextEventTime() const { return impl_->NextTime(); }

Result<NodeId> MarketEngine::AddNode(Micros t, const topology::NodeInfo& info) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpAddNode{info});
  auto result = m.Call(t, [&]() -> Result<NodeId> {
    LZ_ASSIGN_OR_RETURN(NodeId n, m.topo_.AddNode(info));
    m.nodes_.emplace_back();
    m.node_cold_.emplace_back();
    m.books_.Resize(m.topo_.vertex_count());
    NodeState& s = m.nodes_[n.value];
    s.alive = true;
    s.type = m.topo_.node(n).type;
    Event e;
    e.type = EventType::kNodeAdded;
    e.node = n;
    m.Emit(e);
    m.RecomputeFloor(n);
    m.ResolveWaitingOrders();
    // The index is rebuilt lazily; the new node may let resting orders cross.
    m.AddCandidatesAbove(n, m.Obtain(n));
    if (m.options_.price_events) m.TouchAncestors(m.topo_.node(n).leaf);
    return n;
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::RemoveNode(Micros t, NodeId node) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpRemoveNode{node});
  auto result = m.Call(t, [&]() -> Status {
    LZ_RETURN_IF_ERROR(m.CheckNode(node));
    const NodeState& s = m.nodes_[node.value];
    if (s.holder.valid() || s.order_slot != UINT32_MAX) {
      return FailedPrecondition("node: " + m.topo_.node(node).name + " is held or reserved; drain it first");
    }
    LZ_RETURN_IF_ERROR(m.topo_.RemoveNode(node));
    m.nodes_[node.value].alive = false;
    // Orders scoped to this node alone can never be filled.
    VertexId leaf = m.topo_.node(node).leaf;
    std::vector<uint32_t> gone;
    for (const BookEntry& e : m.books_[leaf.value]) gone.push_back(static_cast<uint32_t>(e.slot));
    for (uint32_t slot : gone) m.CancelOrderInternal(slot, CancelReason::kScopeGone);
    Event e;
    e.type = EventType::kNodeRemoved;
    e.node = node;
    m.Emit(e);
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::SetParams(Micros t, const MarketParams& params) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpSetParams{params});
  auto result = m.Call(t, [&]() -> Status {
    LZ_RETURN_IF_ERROR(ValidateParams(params));
    MarketParams old = m.params_;
    if (old.decay_beta != params.decay_beta) {
      // A beta change continues each decay from its current value (DESIGN.md 3b).
      for (auto& [node, state] : m.decay_state_) {
        auto& [paid, released_at] = state;
        __int128 dec = old.decay_beta == 0 ? 0
                                           : static_cast<__int128>(old.decay_beta) * (m.now_ - released_at) / kMicrosPerSecond;
        paid = static_cast<Price>(std::max<__int128>(0, paid - dec));
        released_at = m.now_;
      }
    }
    m.params_ = params;
    m.DecayInputsChanged();
    if (old.grace != params.grace) {
      // Grace costs of every limit and open order change.
      for (uint32_t i = 0; i < m.tenants_.size(); ++i) {
        Tenant& t = m.tenants_[i];
        t.need = 0;
        t.committed_need = 0;
        for (NodeId n : t.nodes) t.need += GraceCost(m.nodes_[n.value].limit, params.grace);
        t.committed_need = t.need;
        for (uint32_t slot : t.orders) {
          const Order& o = m.orders_[slot];
          t.committed_need += static_cast<Money>(m.Remaining(o)) * GraceCost(m.Requested(o), params.grace);
        }
        m.MarkExhaustDirty(TenantId(i));
      }
      for (uint32_t id = 0; id < m.policies_.size(); ++id) m.SchedulePolicy(id);
    }
    if (old.min_hold != params.min_hold) {
      for (uint32_t i = 0; i < m.nodes_.size(); ++i) {
        NodeState& s = m.nodes_[i];
        if (!s.holder.valid()) continue;
        if (s.hold_scheduled) m.ScheduleErase(m.node_cold_[i].held_since + old.min_hold, kSchedHoldExpiry, i);
        s.hold_scheduled = params.min_hold > 0 && m.node_cold_[i].held_since + params.min_hold > m.now_;
        if (s.hold_scheduled) m.ScheduleAdd(m.node_cold_[i].held_since + params.min_hold, kSchedHoldExpiry, i);
      }
    }
    // Turning clipping off (clip_interval 0) leaves the steps already set: at its step each
    // clipped order is lifted to its requested price.
    // Obtain prices, bars and rates depend on h, tick, decay and min hold: refresh every node.
    m.index_generation_ = UINT64_MAX;
    m.EnsureIndex();
    for (uint32_t i = 0; i < m.nodes_.size(); ++i) {
      if (!m.nodes_[i].alive) continue;
      m.AddCandidatesAbove(NodeId(i), m.Obtain(NodeId(i)));
      if (m.nodes_[i].holder.valid()) {
        m.UpdateRate(NodeId(i));
        m.MarkDirty(NodeId(i));
      }
    }
    if (params.grace > old.grace) {
      // A raised grace can put a maintenance window's notice time (its start
      // less the grace) at or before now: the window's holders get their
      // notice now (DESIGN.md 3 rule 8), not at the start with no grace left.
      // SchedulePolicy above moved the window's next change to its start, so
      // without this nothing would re-floor its nodes before then. A lowered
      // grace re-floors nothing here: notices already sent stand (RecomputeFloor
      // keeps a notice phase that began), and the others come at the new notice
      // time.
      for (uint32_t id = 0; id < m.policies_.size(); ++id) {
        const Policy& p = m.policies_[id];
        if (p.alive && m.NoticedMaintStart(p) != kNever) m.RecomputeFloorsUnder(p);
      }
    }
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Result<PolicyId> MarketEngine::AddPolicy(Micros t, const PolicySpec& spec) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpAddPolicy{spec});
  auto result = m.Call(t, [&]() -> Result<PolicyId> {
    auto check_target = [&](const FloorTarget& tg) -> Status {
      if (tg.node.valid() == tg.location.valid()) return InvalidArgument("target: exactly one of node or location");
      if (tg.node.valid()) return m.CheckNode(tg.node);
      if (tg.location.value >= m.topo_.location_count()) return NotFound("target: no location with id " + Num(tg.location.value));
      return Status::Ok();
    };
    Policy p;
    p.spec = spec;
    if (const auto* s = std::get_if<StaticFloorSpec>(&spec)) {
      LZ_RETURN_IF_ERROR(check_target(s->target));
      if (s->price < 0) return InvalidArgument("price: must not be negative");
    } else if (const auto* s = std::get_if<MaintenanceSpec>(&spec)) {
      LZ_RETURN_IF_ERROR(check_target(s->target));
      if (s->end <= s->start) return InvalidArgument("end: must be after start");
      if (s->end <= m.now_) return InvalidArgument("end: maintenance window is already over");
      // A window that starts sooner than one grace period from now starts then:
      // every holder gets the full grace (rule 10).
      p.maint_start = std::max(s->start, SatAdd(m.now_, m.params_.grace));
      if (p.maint_start >= s->end) return InvalidArgument("end: window ends before one grace period from now");
    } else if (const auto* s = std::get_if<PowerCapSpec>(&spec)) {
      if (!s->row.valid() || s->row.value >= m.topo_.location_count() ||
          m.topo_.location(s->row).level != Level::kRow) {
        return InvalidArgument("row: not a row location");
      }
      if (s->cap_w <= 0) return InvalidArgument("cap_w: must be positive");
      Ppm last = -1;
      for (auto [th, price] : s->steps) {
        if (th <= last) return InvalidArgument("steps: thresholds must be strictly ascending");
        if (th < 0) return InvalidArgument("steps: thresholds must not be negative");
        if (price < 0) return InvalidArgument("steps: prices must not be negative");
        last = th;
      }
      m.has_power_policy_ = true;
    } else if (const auto* s = std::get_if<AdaptivePowerCapSpec>(&spec)) {
      if (!s->row.valid() || s->row.value >= m.topo_.location_count() ||
          m.topo_.location(s->row).level != Level::kRow) {
        return InvalidArgument("row: not a row location");
      }
      LZ_RETURN_IF_ERROR(ValidateAdaptivePowerCap(*s));
      // The floor starts at min_floor at once (an operator change); the
      // controller's first step is one interval later.
      p.power_floor = s->min_floor;
      p.next_step = SatAdd(m.now_, s->interval);
    } else if (const auto* s = std::get_if<AdaptiveCarbonBudgetSpec>(&spec)) {
      if (!s->region.valid() || s->region.value >= m.topo_.location_count() ||
          m.topo_.location(s->region).level != Level::kRegion) {
        return InvalidArgument("region: not a region location");
      }
      LZ_RETURN_IF_ERROR(ValidateAdaptiveCarbonBudget(*s));
      LZ_RETURN_IF_ERROR(m.CheckSeries(s->series));
      // The price starts at min_price at once; the first step is one interval later.
      p.power_floor = s->min_price;
      p.next_step = SatAdd(m.now_, s->interval);
    } else if (const auto* s = std::get_if<CarbonSpec>(&spec)) {
      if (!s->location.valid() || s->location.value >= m.topo_.location_count()) {
        return NotFound("location: no location with id " + Num(s->location.value));
      }
      if (s->price_per_tonne < 0) return InvalidArgument("price_per_tonne: must not be negative");
      LZ_RETURN_IF_ERROR(m.CheckSeries(s->series));
    }
    uint32_t id = static_cast<uint32_t>(m.policies_.size());
    m.policies_.push_back(std::move(p));
    m.IndexPolicy(id);
    m.RecomputeFloorsUnder(m.policies_[id]);
    m.SchedulePolicy(id);
    if (std::holds_alternative<PowerCapSpec>(spec)) {
      m.power_dirty_ = true;
      m.EvaluatePower();  // An operator change applies at once.
    }
    return PolicyId(id);
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::RemovePolicy(Micros t, PolicyId id) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpRemovePolicy{id});
  auto result = m.Call(t, [&]() -> Status {
    if (!id.valid() || id.value >= m.policies_.size() || !m.policies_[id.value].alive) {
      return NotFound("policy: no policy with id " + Num(id.value));
    }
    Policy& p = m.policies_[id.value];
    p.alive = false;
    m.UnindexPolicy(id.value);
    m.SchedulePolicy(id.value);
    m.RecomputeFloorsUnder(p);
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::SetAdaptiveCap(Micros t, PolicyId id, int64_t cap) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpSetAdaptiveCap{id, cap});
  auto result = m.Call(t, [&]() -> Status {
    if (!id.valid() || id.value >= m.policies_.size() || !m.policies_[id.value].alive) {
      return NotFound("policy: no policy with id " + Num(id.value));
    }
    Policy& p = m.policies_[id.value];
    auto* power = std::get_if<AdaptivePowerCapSpec>(&p.spec);
    auto* carbon = std::get_if<AdaptiveCarbonBudgetSpec>(&p.spec);
    if (!power && !carbon) return FailedPrecondition("policy: policy " + Num(id.value) + " is not an adaptive cap");
    if (cap <= 0 || cap == kInfPrice) return InvalidArgument("cap: must be positive and finite");
    // Only the cap changes: the value (floor or price) and the step grid
    // stay, so it is continuous and the next step measures against the new target.
    (power ? power->cap_w : carbon->budget_g_per_h) = cap;
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Result<TenantId> MarketEngine::CreateTenant(Micros t, std::string name, Money balance, Price max_rate) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpCreateTenant{name, balance, max_rate});
  auto result = m.Call(t, [&]() -> Result<TenantId> {
    if (name.empty()) return InvalidArgument("name: must not be empty");
    if (m.tenant_by_name_.count(name)) return AlreadyExists("name: tenant '" + name + "' already exists");
    if (balance < 0) return InvalidArgument("balance: must not be negative");
    if (max_rate < 0) return InvalidArgument("max_rate: must not be negative");
    if (m.totals_.deposited > kInfPrice - 1 - balance) {
      return InvalidArgument("balance: the market's total deposits would overflow int64 micro-units");
    }
    TenantId id(static_cast<uint32_t>(m.tenants_.size()));
    m.tenants_.emplace_back();
    Tenant& tn = m.tenants_.back();
    tn.name = name;
    tn.balance = balance;
    tn.deposited = balance;
    tn.max_rate = max_rate;
    m.totals_.deposited += balance;
    m.tenant_by_name_.emplace(std::move(name), id);
    return id;
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::Deposit(Micros t, TenantId tenant, Money amount) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpDeposit{tenant, amount});
  auto result = m.Call(t, [&]() -> Status {
    LZ_RETURN_IF_ERROR(m.CheckTenant(tenant));
    if (amount <= 0) return InvalidArgument("amount: must be positive");
    Tenant& tn = m.tenants_[tenant.value];
    if (tn.balance > kInfPrice - amount) return InvalidArgument("amount: balance would overflow");
    // Every money total of the ledger is bounded by what was deposited, so
    // keeping the market's deposits below int64's limit keeps them all exact.
    if (m.totals_.deposited > kInfPrice - 1 - amount) {
      return InvalidArgument("amount: the market's total deposits would overflow int64 micro-units");
    }
    tn.balance += amount;
    tn.deposited += amount;
    m.totals_.deposited += amount;
    m.MarkExhaustDirty(tenant);
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::SetMaxRate(Micros t, TenantId tenant, Price max_rate) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpSetMaxRate{tenant, max_rate});
  auto result = m.Call(t, [&]() -> Status {
    LZ_RETURN_IF_ERROR(m.CheckTenant(tenant));
    if (max_rate < 0) return InvalidArgument("max_rate: must not be negative");
    m.tenants_[tenant.value].max_rate = max_rate;
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

// The hot calls (a bid, a holder's limit) skip the operation record when no
// observer wants it, and return the call's result without moving it.
Result<OrderId> MarketEngine::PlaceOrder(Micros t, TenantId tenant, const OrderSpec& spec) {
  Impl& m = *impl_;
  auto op = [&]() -> Result<OrderId> { return m.Place(tenant, spec); };
  if (!m.observer_) return m.Call(t, op);
  std::optional<OpBody> body;
  body.emplace(OpPlaceOrder{tenant, spec});
  auto result = m.Call(t, op);
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::UpdateOrder(Micros t, TenantId tenant, OrderId order, Price price) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpUpdateOrder{tenant, order, price});
  auto result = m.Call(t, [&]() -> Status { return m.Update(tenant, order, price); });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::CancelOrder(Micros t, TenantId tenant, OrderId order) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpCancelOrder{tenant, order});
  auto result = m.Call(t, [&]() -> Status {
    LZ_ASSIGN_OR_RETURN(uint32_t slot, m.FindOwnOrder(tenant, order));
    m.CancelOrderInternal(slot, CancelReason::kByTenant);
    return Status::Ok();
  });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::SetLimit(Micros t, TenantId tenant, NodeId node, Price limit) {
  Impl& m = *impl_;
  auto op = [&]() -> Status { return m.SetLimitImpl(tenant, node, limit); };
  if (!m.observer_) return m.Call(t, op);
  std::optional<OpBody> body;
  body.emplace(OpSetLimit{tenant, node, limit});
  auto result = m.Call(t, op);
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::Relinquish(Micros t, TenantId tenant, NodeId node) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpRelinquish{tenant, node});
  auto result = m.Call(t, [&]() -> Status { return m.RelinquishImpl(tenant, node); });
  return m.Observed(t, body, std::move(result));
}

void MarketEngine::PrefetchNode(NodeId node, int stage) const {
  const Impl& m = *impl_;
  if (node.value >= m.nodes_.size()) return;
  if (stage == 0) {
    __builtin_prefetch(&m.nodes_[node.value]);
    return;
  }
  // Reads the line stage 0 fetched (the leaf is in it, issue 12); a stale
  // index is only a wrong hint.
  const uint32_t leaf = m.nodes_[node.value].leaf;
  const uint16_t type = m.nodes_[node.value].type.value;
  if (type >= m.index_.size() || leaf >= m.index_[type].key.size()) return;
  __builtin_prefetch(&m.index_[type].key[leaf]);
}

void MarketEngine::Compact() {
  Impl& m = *impl_;
  m.EnsureIndex();
  m.nodes_.shrink_to_fit();
  m.node_cold_.shrink_to_fit();
  m.books_.ShrinkToFit();
  m.topo_.ShrinkToFit();
}

const topology::Topology& MarketEngine::topology() const { return impl_->topo_; }
const MarketParams& MarketEngine::params() const { return impl_->params_; }

Result<VertexQuote> MarketEngine::Quote(VertexId v, bool with_depth) const {
  Impl& m = *impl_;
  if (!v.valid() || v.value >= m.topo_.vertex_count()) return NotFound("vertex: no vertex with id " + Num(v.value));
  VertexQuote q;
  q.vertex = v;
  m.EnsureIndex();
  const auto& ix = m.index_[m.V(v).type.value];
  auto [lo, hi] = m.topo_.Range(v);
  q.quote = m.QuoteOf(v);
  for (uint32_t i = lo; i < hi; ++i) {
    const NodeState& s = m.nodes_[ix.leaf_node[i].value];
    ++q.total;
    if (s.order_slot != UINT32_MAX) ++q.reserved;
    else if (!s.holder.valid()) ++q.free;
    else if (s.contested) ++q.contested;
    else ++q.held;
  }
  if (with_depth) {
    std::map<Price, uint32_t, std::greater<>> levels;
    for (uint32_t vi = 0; vi < m.books_.size(); ++vi) {
      if (m.books_[vi].empty() || !m.topo_.VertexContains(v, VertexId(vi))) continue;
      for (const BookEntry& e : m.books_[vi]) {
        if (!e.flags) ++levels[e.price];
      }
    }
    q.depth.assign(levels.begin(), levels.end());
  }
  return q;
}

Result<Price> MarketEngine::QuotePrice(VertexId v) const {
  Impl& m = *impl_;
  if (!v.valid() || v.value >= m.topo_.vertex_count()) return NotFound("vertex: no vertex with id " + Num(v.value));
  return m.QuoteOf(v);
}

Result<EvictionQuote> MarketEngine::GetEvictionQuote(TenantId tenant, NodeId node) const {
  const Impl& m = *impl_;
  LZ_RETURN_IF_ERROR(m.CheckTenant(tenant));
  LZ_RETURN_IF_ERROR(m.CheckNode(node));
  const NodeState& s = m.nodes_[node.value];
  if (s.holder != tenant) return PermissionDenied("node: the tenant does not hold node " + m.topo_.node(node).name);
  EvictionQuote q;
  q.node = node;
  q.holder = tenant;
  q.limit = s.limit;
  q.competing = m.Competing(node);
  q.floor = m.Floor(node);
  q.obtain = m.Obtain(node);
  q.pays = s.rate;
  q.contested = s.contested;
  q.deadline = s.contested ? m.node_cold_[node.value].deadline : 0;
  q.reasons = s.contested ? s.reasons : 0;
  return q;
}

Result<NodeView> MarketEngine::GetNode(NodeId node) const {
  const Impl& m = *impl_;
  if (!node.valid() || node.value >= m.nodes_.size()) return NotFound("node: no node with id " + Num(node.value));
  const NodeState& s = m.nodes_[node.value];
  NodeView v;
  v.id = node;
  v.holder = s.holder;
  v.limit = s.limit;
  v.held_since = s.holder.valid() ? m.node_cold_[node.value].held_since : 0;
  v.floor = s.alive ? m.Floor(node) : 0;
  if (!s.alive) v.status = NodeStatus::kRemoved;
  else if (s.order_slot != UINT32_MAX) {
    v.status = NodeStatus::kReserved;
    v.reserved_for = m.orders_[s.order_slot].id;
  } else if (!s.holder.valid()) v.status = NodeStatus::kFree;
  else v.status = s.contested ? NodeStatus::kContested : NodeStatus::kHeld;
  return v;
}

Result<OrderView> MarketEngine::GetOrder(OrderId order) const {
  const Impl& m = *impl_;
  uint32_t slot = m.FindSlot(order.value);
  if (slot == OrderIndex::kNone) return NotFound("order: no open order with id " + Num(order.value));
  const Order& o = m.orders_[slot];
  OrderView v;
  v.id = o.id;
  v.tenant = o.tenant;
  const OrderCold& c = m.Cold(o);
  v.spec = OrderSpec{o.scope, m.Requested(o), m.Count(o), o.locality, c.rel_to};
  v.effective_scope = m.EffScope(o);
  v.effective_price = o.effective;
  v.state = o.state;
  v.seq = m.Seq(o);
  v.filled = m.Filled(o);
  v.cooldown_until = c.cooldown_until;
  v.claims = c.claims;
  return v;
}

Result<TenantView> MarketEngine::GetTenant(TenantId tenant) const {
  const Impl& m = *impl_;
  LZ_RETURN_IF_ERROR(m.CheckTenant(tenant));
  const Tenant& t = m.tenants_[tenant.value];
  TenantView v;
  v.id = tenant;
  v.name = t.name;
  v.balance = t.balance;
  v.max_rate = t.max_rate;
  v.committed_rate = t.committed;
  for (NodeId n : t.nodes) v.spend_rate = SatAdd(v.spend_rate, m.nodes_[n.value].rate);
  v.paid = t.paid;
  v.waived = t.waived;
  v.exhausted = t.exhausted;
  v.nodes = t.nodes;
  std::sort(v.nodes.begin(), v.nodes.end());
  for (uint32_t slot : t.orders) v.orders.push_back(m.orders_[slot].id);
  return v;
}

Result<PolicyView> MarketEngine::GetPolicy(PolicyId id) const {
  const Impl& m = *impl_;
  if (!id.valid() || id.value >= m.policies_.size()) return NotFound("policy: no policy with id " + Num(id.value));
  const Policy& p = m.policies_[id.value];
  PolicyView v;
  v.id = id;
  v.spec = p.spec;
  v.alive = p.alive;
  if (std::holds_alternative<PowerCapSpec>(p.spec) || std::holds_alternative<AdaptivePowerCapSpec>(p.spec)) {
    v.floor = p.alive ? p.power_floor : 0;
    v.staying_w = p.staying_w;
  } else if (std::holds_alternative<AdaptiveCarbonBudgetSpec>(p.spec)) {
    v.carbon_price = p.alive ? p.power_floor : 0;
    v.staying_g_per_h = p.staying_w;
  }
  v.next_step = p.alive ? p.next_step : kNever;
  return v;
}

size_t MarketEngine::policy_count() const { return impl_->policies_.size(); }

size_t MarketEngine::tenant_count() const { return impl_->tenants_.size(); }

Result<TenantId> MarketEngine::FindTenant(std::string_view name) const {
  auto it = impl_->tenant_by_name_.find(std::string(name));
  if (it == impl_->tenant_by_name_.end()) return NotFound("tenant: no tenant named '" + std::string(name) + "'");
  return it->second;
}

Result<Money> MarketEngine::AvailableBalance(TenantId tenant) const {
  LZ_RETURN_IF_ERROR(impl_->CheckTenant(tenant));
  // Charges beyond the balance are waived when settled, never owed.
  return std::max<Money>(0, impl_->Available(impl_->tenants_[tenant.value], impl_->now_));
}

std::span<const LedgerEntry> MarketEngine::ledger() const { return impl_->ledger_; }

LedgerTotals MarketEngine::ledger_totals() const {
  LedgerTotals t = impl_->totals_;
  t.tenant_balances = 0;
  for (const Tenant& tn : impl_->tenants_) t.tenant_balances += tn.balance;
  return t;
}

Money MarketEngine::UnsettledCharges() const {
  Money sum = 0;
  for (const Tenant& t : impl_->tenants_) sum += impl_->Accrued(t, impl_->now_);
  return sum;
}

size_t MarketEngine::resting_order_count() const {
  size_t n = 0;
  n += impl_->books_.total_entries();
  return n + impl_->unmatchable_.size();
}

std::vector<OrderId> MarketEngine::OpenOrders() const {
  std::vector<OrderId> ids;
  impl_->order_slot_.ForEach([&](uint32_t slot) { ids.push_back(impl_->orders_[slot].id); });
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace laissez::market
