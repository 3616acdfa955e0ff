// Matching: the candidate loop (MatchOne), single orders, challengers, pending orders that
// move to a free node, and gangs.
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- matching

// One matching step: the highest-priority candidate that crosses acts.
bool MarketEngine::Impl::MatchOne() {
  while (!candidates_.empty()) {
    auto [neg_price, seq, slot] = *candidates_.begin();
    candidates_.erase(candidates_.begin());
    if (slot >= orders_.size()) continue;
    Order& o = orders_[slot];
    if (!o.alive || o.effective != -neg_price || Seq(o) != seq) continue;
    if (o.state == OrderState::kPending) {
      if (o.is_gang()) continue;
      if (TryPendingToFree(slot)) return true;
      continue;
    }
    if (o.state != OrderState::kResting) continue;
    if (o.is_gang()) {
      if (TryGang(slot)) return true;
      continue;
    }
    if (TrySingle(slot)) return true;
  }
  return false;
}

bool MarketEngine::Impl::TrySingle(uint32_t slot) {
  Order& o = orders_[slot];
  NodeId n = BestNodeFor(o, false);
  if (!n.valid() || o.effective < Obtain(n)) return false;
  if (OutOfMoney(o, 1)) {
    CancelOrderInternal(slot, CancelReason::kOutOfMoney);
    return true;
  }
  NodeState& s = nodes_[n.value];
  if (!s.holder.valid()) {
    FillSingle(slot, n, /*emit_alloc=*/true);
    return true;
  }
  // Contest a held node. The order stays in its book flagged pending: it no
  // longer counts as demand, but a free node appearing below wakes it. Its
  // price moves from n's resting demand to n's pending price in one step,
  // so c(n) does not dip in between (a dip would settle n at an unchanged
  // rate); other holdings below are refreshed once the contest is set.
  VertexId v = EffScope(o);
  Summary before = books_.summary(v.value);
  if (o.in_book) EntryErase(o);  // Not in its book yet when just placed.
  o.state = OrderState::kPending;
  MutableCold(o).claims.push_back(n);
  o.book_flags = kFlagPending;
  EntryInsert(o);
  o.in_book = true;
  candidates_.emplace(-o.effective, Seq(o), slot);
  BecomeChallenger(slot, n);
  AfterBookChange(v, before);
  return true;
}

void MarketEngine::Impl::BecomeChallenger(uint32_t slot, NodeId n) {
  NodeState& s = nodes_[n.value];
  uint32_t prev = s.challenger;
  s.challenger = slot;
  if (prev != UINT32_MAX) {
    Order& p = orders_[prev];
    EraseClaim(p, n);
    if (p.is_gang()) {
      DropGang(prev, /*cooldown=*/false);  // Displaced by a higher challenger: no cooldown.
    } else {
      p.state = OrderState::kResting;
      if (p.in_book) BookErase(p);
      BookInsert(p, 0);
    }
  }
  RefreshNode(n);
  UpdateRate(n);
  if (!s.contested) {
    MarkDirty(n);
    ReviewNode(n);  // Opens the contest and sends the notice now.
  } else {
    s.reasons |= kReasonOutbid;
    if (Micros maint = MaintAt(n); maint != kNever && node_cold_[n.value].deadline > maint) SetDeadline(n, std::max(maint, now_));
    SendNotice(n);
  }
}

bool MarketEngine::Impl::TryPendingToFree(uint32_t slot) {
  Order& o = orders_[slot];
  NodeId n = BestNodeFor(o, /*free_only=*/true);
  if (!n.valid() || o.effective < Obtain(n)) return false;
  // Withdraw from the contest, then take the free node.
  LZ_CHECK(Claims(o).size() == 1);
  NodeId contested = Claims(o)[0];
  MutableCold(o).claims.clear();
  NodeState& cs = nodes_[contested.value];
  if (cs.challenger == slot) {
    cs.challenger = UINT32_MAX;
    RefreshNode(contested);
    UpdateRate(contested);
    MarkDirty(contested);
  }
  o.state = OrderState::kResting;
  if (OutOfMoney(o, 1)) {
    CancelOrderInternal(slot, CancelReason::kOutOfMoney);
    return true;
  }
  FillSingle(slot, n, /*emit_alloc=*/true);
  return true;
}

bool MarketEngine::Impl::TryGang(uint32_t slot) {
  Order& o = orders_[slot];
  bool cooling = Cold(o).cooldown_until > now_;
  std::vector<NodeId> chosen;
  for (uint32_t i = 0, count = Count(o); i < count; ++i) {
    NodeId n = BestNodeFor(o, cooling, &chosen);
    if (!n.valid() || o.effective < Obtain(n)) {
      // Short of count - i nodes: the wakes it may skip (gang_short_).
      if (gang_short_.size() <= slot) gang_short_.resize(orders_.size(), 0);
      gang_short_[slot] = static_cast<uint16_t>(std::min<uint32_t>(count - i, UINT16_MAX));
      return false;
    }
    chosen.push_back(n);
  }
  if (OutOfMoney(o, Count(o))) {
    CancelOrderInternal(slot, CancelReason::kOutOfMoney);
    return true;
  }
  BookErase(o);
  o.state = OrderState::kPending;
  for (NodeId n : chosen) {
    NodeState& s = nodes_[n.value];
    MutableCold(o).claims.push_back(n);
    if (!s.holder.valid()) {
      s.order_slot = slot;
      StopDecay(n);
      MarkPowerDirty();
      Event e;
      e.type = EventType::kReserved;
      e.node = n;
      e.tenant = o.tenant;
      e.order = o.id;
      Emit(e);
      RefreshNode(n);
    } else {
      BecomeChallenger(slot, n);
      if (!orders_[slot].alive || orders_[slot].state != OrderState::kPending) return true;
    }
  }
  gangs_to_check_.push_back(slot);
  return true;
}

// A pending gang whose claims are all reserved gets its nodes.
bool MarketEngine::Impl::CompleteGangs() {
  if (gangs_to_check_.empty()) return false;
  bool any = false;
  std::vector<uint32_t> list;
  list.swap(gangs_to_check_);
  for (uint32_t slot : list) {
    Order& o = orders_[slot];
    if (!o.alive || o.state != OrderState::kPending || !o.is_gang()) continue;
    // A floor above the gang's price on a reserved node drops the gang.
    bool floor_ok = true;
    for (NodeId n : Claims(o)) {
      if (nodes_[n.value].order_slot == slot) floor_ok = floor_ok && EffFloor(n) <= o.effective;
    }
    if (!floor_ok) {
      DropGang(slot, true);
      any = true;
      continue;
    }
    bool all = Claims(o).size() == Count(o);
    for (NodeId n : Claims(o)) all = all && nodes_[n.value].order_slot == slot;
    if (!all) continue;
    std::vector<NodeId> claims = Claims(o);
    TenantId tid = o.tenant;
    Price limit = Requested(o);
    for (NodeId n : claims) {
      Event e;
      e.type = EventType::kAllocated;
      e.node = n;
      e.tenant = tid;
      e.order = o.id;
      e.price = limit;
      Emit(e);
    }
    MutableCold(o).claims.clear();
    RemoveOrderFromTenant(o);
    o.state = OrderState::kFilled;
    Event f;
    f.type = EventType::kOrderFilled;
    f.order = o.id;
    f.tenant = tid;
    Emit(f);
    ReleaseOrderSlot(slot);
    for (NodeId n : claims) {
      nodes_[n.value].order_slot = UINT32_MAX;
      StartHolding(n, tid, limit);
      RefreshNode(n);
    }
    any = true;
  }
  return any;
}

}  // namespace laissez::market
