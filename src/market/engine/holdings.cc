// Holdings and contests: reasons and notices, deadlines (grace), challengers and gang
// claims, transfer or release at a deadline, and the holder's SetLimit and Relinquish.
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- contests

void MarketEngine::Impl::MarkDirty(NodeId n) {
  if (node_dirty_flag_.size() < nodes_.size()) node_dirty_flag_.resize(nodes_.size(), 0);
  if (!node_dirty_flag_[n.value]) {
    node_dirty_flag_[n.value] = 1;
    dirty_nodes_.push_back(n.value);
  }
}

// The reasons that currently apply to n's holder, and whether a challenger is valid.
// - floor: a floor other than a maintenance window's is above the limit (so
//   `floor` is listed beside `maintenance` when such a floor applies too);
// - exhaustion: the holder is exhausted, or was when this contest's notice
//   said so: notices already sent stay (DESIGN.md 3b), so a deposit or a
//   relinquish that covers the nodes again does not end the contest.
uint8_t MarketEngine::Impl::CurrentReasons(NodeId n) const {
  const NodeState& s = nodes_[n.value];
  uint8_t r = 0;
  if (s.challenger != UINT32_MAX && ChallengerPrice(s) >= HolderBar(n)) r |= kReasonOutbid;
  Micros maint = MaintAt(n);
  if (maint != kNever) r |= kReasonMaintenance;
  // Before its window starts a maintenance adds nothing to the floor.
  Price f = maint <= now_ ? FloorBesideMaintenance(n) : Floor(n);
  if (f > s.limit) r |= kReasonFloor;
  if (tenants_[s.holder.value].exhausted || (s.contested && (s.reasons & kReasonExhaustion))) {
    r |= kReasonExhaustion;
  }
  return r;
}

void MarketEngine::Impl::SendNotice(NodeId n) {
  NodeState& s = nodes_[n.value];
  node_cold_[n.value].notice_price = NoticePrice(n);
  Event e;
  e.type = EventType::kNotice;
  e.node = n;
  e.tenant = s.holder;
  e.reasons = s.reasons;
  e.price = node_cold_[n.value].notice_price;
  e.deadline = node_cold_[n.value].deadline;
  if (s.challenger != UINT32_MAX) e.order = orders_[s.challenger].id;
  Emit(e);
}

void MarketEngine::Impl::SetDeadline(NodeId n, Micros d) {
  NodeState& s = nodes_[n.value];
  if (s.contested) ScheduleErase(node_cold_[n.value].deadline, kSchedDeadline, n.value);
  node_cold_[n.value].deadline = d;
  ScheduleAdd(d, kSchedDeadline, n.value);
}

// Removes the contest state of n (no events); the challenger is left to the caller.
void MarketEngine::Impl::ClearContest(NodeId n) {
  NodeState& s = nodes_[n.value];
  if (s.contested) ScheduleErase(node_cold_[n.value].deadline, kSchedDeadline, n.value);
  s.contested = false;
  s.reasons = 0;
  node_cold_[n.value].deadline = 0;
  if (s.challenger != UINT32_MAX) {
    uint32_t c = s.challenger;
    s.challenger = UINT32_MAX;
    DetachChallenger(c, n, /*holder_won=*/true);
  }
}

// Contest validity and notices for one node. Returns true if anything changed.
bool MarketEngine::Impl::ReviewNode(NodeId n) {
  NodeState& s = nodes_[n.value];
  if (!s.holder.valid()) return false;
  // A challenger that no longer beats the holder's bar loses.
  if (s.challenger != UINT32_MAX && ChallengerPrice(s) < HolderBar(n)) {
    uint32_t c = s.challenger;
    s.challenger = UINT32_MAX;
    DetachChallenger(c, n, /*holder_won=*/true);
    RefreshNode(n);
    UpdateRate(n);
  }
  uint8_t want = CurrentReasons(n);
  if (!s.contested) {
    if (want == 0) return false;
    s.contested = true;
    s.reasons = want;
    Micros d = SatAdd(now_, params_.grace);
    if (MaintAt(n) != kNever) d = std::min(d, MaintAt(n));
    d = std::max(d, now_);
    node_cold_[n.value].deadline = d;
    ScheduleAdd(d, kSchedDeadline, n.value);
    SendNotice(n);
    return true;
  }
  if (want == 0) {
    ScheduleErase(node_cold_[n.value].deadline, kSchedDeadline, n.value);
    s.contested = false;
    s.reasons = 0;
    Event e;
    e.type = EventType::kContestEnded;
    e.node = n;
    e.tenant = s.holder;
    Emit(e);
    return true;
  }
  bool changed = false;
  if (Micros maint = MaintAt(n); maint != kNever && node_cold_[n.value].deadline > maint) {
    SetDeadline(n, std::max(maint, now_));
    changed = true;
  }
  // The holder's latest notice always states the reasons and the price in
  // force: a reason that comes or goes (a challenger leaving a contest that
  // a floor still justifies) or a new price gives a new notice, same deadline.
  if (want != s.reasons || NoticePrice(n) != node_cold_[n.value].notice_price) changed = true;
  s.reasons = want;
  if (changed) SendNotice(n);
  return changed;
}

// The challenger `slot` no longer contests node n.
void MarketEngine::Impl::DetachChallenger(uint32_t slot, NodeId n, bool holder_won) {
  Order& o = orders_[slot];
  EraseClaim(o, n);
  if (o.is_gang()) {
    if (holder_won) DropGang(slot, /*cooldown=*/true);
    return;
  }
  // A single challenger rests again, keeping its sequence number.
  o.state = OrderState::kResting;
  if (o.in_book) BookErase(o);
  BookInsert(o, 0);
}

// Withdraws an order's claims: nodes it reserved become free (no decay),
// contests it was the challenger of lose their challenger.
void MarketEngine::Impl::ReleaseClaims(uint32_t slot) {
  std::vector<NodeId> claims;
  if (orders_[slot].has_cold) claims.swap(MutableCold(orders_[slot]).claims);
  for (NodeId n : claims) {
    NodeState& s = nodes_[n.value];
    if (s.order_slot == slot) {
      s.order_slot = UINT32_MAX;
      MarkPowerDirty();
      RefreshNode(n);
    } else if (s.challenger == slot) {
      s.challenger = UINT32_MAX;
      RefreshNode(n);
      UpdateRate(n);
      MarkDirty(n);
    }
  }
}

// Gang drops all claims: reserved nodes free (no decay), contests lose it.
void MarketEngine::Impl::DropGang(uint32_t slot, bool cooldown) {
  Order& o = orders_[slot];
  ReleaseClaims(slot);
  o.state = OrderState::kResting;
  Event e;
  e.type = EventType::kGangDropped;
  e.order = o.id;
  e.tenant = o.tenant;
  if (cooldown) {
    OrderCold& c = MutableCold(o);
    ScheduleErase(c.cooldown_until, kSchedCooldown, o.id.value);
    c.cooldown_until = SatAdd(now_, params_.grace);
    if (c.cooldown_until > now_) ScheduleAdd(c.cooldown_until, kSchedCooldown, o.id.value);
  }
  e.deadline = Cold(o).cooldown_until;
  Emit(e);
  if (o.in_book) BookErase(o);
  BookInsert(o, kFlagGang);
}

// The deadline of n has come.
void MarketEngine::Impl::ResolveDeadline(NodeId n) {
  NodeState& s = nodes_[n.value];
  LZ_CHECK(s.contested);
  ScheduleErase(node_cold_[n.value].deadline, kSchedDeadline, n.value);
  s.contested = false;
  uint8_t reasons = s.reasons;
  s.reasons = 0;
  uint32_t c = s.challenger;
  s.challenger = UINT32_MAX;
  TenantId old = s.holder;
  if (c != UINT32_MAX && !orders_[c].is_gang() && OutOfMoney(orders_[c], 1)) {
    CancelOrderInternal(c, CancelReason::kOutOfMoney, /*detached=*/true);
    c = UINT32_MAX;
    reasons &= ~kReasonOutbid;
    if (reasons == 0) {  // Nothing else applies: the holder keeps n.
      Event e;
      e.type = EventType::kContestEnded;
      e.node = n;
      e.tenant = old;
      Emit(e);
      RefreshNode(n);
      UpdateRate(n);
      MarkDirty(n);
      return;
    }
  }
  EndHolding(n);
  if (c != UINT32_MAX) {
    Order& o = orders_[c];
    EraseClaim(o, n);
    if (o.is_gang()) {
      Event r;
      r.type = EventType::kReleased;
      r.node = n;
      r.tenant = old;
      r.reasons = reasons;
      Emit(r);
      s.order_slot = c;
      StopDecay(n);
      MutableCold(o).claims.push_back(n);
      MarkPowerDirty();
      gangs_to_check_.push_back(c);
      RefreshNode(n);
    } else {
      Event e;
      e.type = EventType::kTransferred;
      e.node = n;
      e.tenant = o.tenant;
      e.other = old;
      e.order = o.id;
      e.price = Requested(o);
      e.reasons = reasons;
      Emit(e);
      FillSingle(c, n, /*emit_alloc=*/false);
    }
  } else {
    Event r;
    r.type = EventType::kReleased;
    r.node = n;
    r.tenant = old;
    r.reasons = reasons;
    Emit(r);
    RefreshNode(n);
  }
}

// ---------------------------------------------------------------- the holder's calls: retention limit, relinquish

Status MarketEngine::Impl::SetLimitImpl(TenantId tid, NodeId n, Price limit) {
  // The checks below in one test first: a Status per check costs more than
  // the rest of an uncontested limit change's validation.
  bool valid = TenantExists(tid) && NodeExists(n) && limit >= 0 && limit != kInfPrice;
  if (!valid) {
    LZ_RETURN_IF_ERROR(CheckTenant(tid));
    LZ_RETURN_IF_ERROR(CheckNode(n));
    LZ_RETURN_IF_ERROR(CheckPrice(limit, "limit"));
  }
  NodeState& s = nodes_[n.value];
  if (s.holder != tid) return PermissionDenied("node: the tenant does not hold node " + topo_.node(n).name);
  // With nothing pending, this call's own work is the instant's first (see below).
  bool quiet = InstantQuiet();
  Tenant& t = tenants_[tid.value];
  Money old_cost = GraceCost(s.limit, params_.grace), new_cost = GraceCost(limit, params_.grace);
  if (limit > s.limit) {  // CheckBudget passes a call that does not raise the committed rate.
    LZ_RETURN_IF_ERROR(CheckBudget(t, static_cast<__int128>(limit) - s.limit, new_cost - old_cost));
  }
  if (limit == s.limit) return Status::Ok();
  t.committed += limit - s.limit;
  t.committed_need += new_cost - old_cost;
  t.need += new_cost - old_cost;
  Price old_limit = s.limit;
  s.limit = limit;
  // A raised limit raises n's obtain price (or leaves it): an order that
  // reaches it reached the old one, so it crossed then or is not eligible.
  RefreshNode(n, /*wake=*/limit < old_limit);
  // p(n) = min(r, max(c, f)), and neither c nor f depends on r. A current
  // rate (not waiting in rate_dirty_) below the old limit is max(c, f)
  // itself, so the new rate is min(limit, rate): unchanged unless the limit
  // goes below it. Then ApplyRate need not re-derive it (c(n) walks the books
  // of every ancestor). The node keeps its place in the order of the
  // instant's settlements (rate_dirty_, or rate_phantom_ when it would be first).
  // A node is flagged exactly while it waits in rate_dirty_: with the list
  // empty, as it usually is, the flag is not read (a cache line at 1M nodes).
  bool rate_current = rate_dirty_.empty() || n.value >= rate_dirty_flag_.size() || !rate_dirty_flag_[n.value];
  if (rate_current && s.rate < old_limit && s.rate <= limit) {
    if (rate_dirty_.empty() && rate_phantom_ == UINT32_MAX) {
      rate_phantom_ = n.value;  // Would be queued first: see rate_phantom_.
    } else {
      UpdateRate(n);
      rate_unchanged_node_ = n.value;
    }
  } else {
    UpdateRate(n);
  }
  bool review = s.contested || Floor(n) > limit || t.exhausted;
  if (review) MarkDirty(n);
  // Lowering may let a resting order cross; RefreshNode already queued candidates.
  // The tenant's exhaustion (issue 12): one that is not exhausted stays so
  // when its need falls (exhaustion is monotone in the need), and its armed
  // check, a lower bound, only gets earlier than needed, so a lowered limit
  // leaves nothing to do; a raise passed the budget test above, so it needs
  // its bound re-scheduled, not a review. A rate that changes marks the
  // tenant when it is applied.
  // When the instant was quiet and this call queued no node review, the
  // re-scheduling would be the first thing the instant loop does (no deadline
  // is due, no gang waits): done here, the loop has nothing left (issue 12).
  if (t.exhausted) {
    MarkExhaustDirty(tid);
  } else if (limit > old_limit) {
    if (quiet && !review) RescheduleExhaustion(tid.value);
    else MarkExhaustReschedule(tid);
  }
  return Status::Ok();
}

Status MarketEngine::Impl::RelinquishImpl(TenantId tid, NodeId n) {
  LZ_RETURN_IF_ERROR(CheckTenant(tid));
  LZ_RETURN_IF_ERROR(CheckNode(n));
  NodeState& s = nodes_[n.value];
  if (s.holder != tid) return PermissionDenied("node: the tenant does not hold node " + topo_.node(n).name);
  uint32_t c = s.challenger;
  uint8_t reasons = s.reasons | kReasonRelinquish;
  if (c != UINT32_MAX) {
    // The node moves at once to the pending challenger (or stays reserved for its gang).
    s.challenger = UINT32_MAX;
    if (s.contested) ScheduleErase(node_cold_[n.value].deadline, kSchedDeadline, n.value);
    s.contested = false;
    s.reasons = 0;
    EndHolding(n);
    Order& o = orders_[c];
    EraseClaim(o, n);
    if (o.is_gang()) {
      Event r;
      r.type = EventType::kReleased;
      r.node = n;
      r.tenant = tid;
      r.reasons = reasons;
      Emit(r);
      s.order_slot = c;
      StopDecay(n);
      MutableCold(o).claims.push_back(n);
      gangs_to_check_.push_back(c);
      RefreshNode(n);
    } else {
      Event e;
      e.type = EventType::kTransferred;
      e.node = n;
      e.tenant = o.tenant;
      e.other = tid;
      e.order = o.id;
      e.price = Requested(o);
      e.reasons = reasons;
      Emit(e);
      FillSingle(c, n, false);
    }
    return Status::Ok();
  }
  EndHolding(n);
  Event r;
  r.type = EventType::kReleased;
  r.node = n;
  r.tenant = tid;
  r.reasons = reasons;
  Emit(r);
  RefreshNode(n);
  return Status::Ok();
}

}  // namespace laissez::market
