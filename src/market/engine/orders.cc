// Orders: placing, updating and cancelling them, their slots and tenants, filling a single
// order, setting an effective price, and the validation helpers these calls share.
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- orders

void MarketEngine::Impl::RemoveOrderFromTenant(Order& o) {
  Tenant& t = tenants_[o.tenant.value];
  uint32_t slot = SlotOf(o);
  if (!t.orders.empty() && t.orders.back() == slot) {
    t.orders.pop_back();  // The latest order (a fill on Place): no search.
  } else {
    auto it = std::lower_bound(t.orders.begin(), t.orders.end(), o.id.value,
                               [&](uint32_t s, uint64_t id) { return orders_[s].id.value < id; });
    if (it != t.orders.end() && *it == slot) t.orders.erase(it);
  }
  const Price requested = Requested(o);
  Price rate = static_cast<Price>(std::min<__int128>(kInfPrice, static_cast<__int128>(requested) * Remaining(o)));
  t.committed -= rate;
  t.committed_need -= static_cast<Money>(Remaining(o)) * GraceCost(requested, params_.grace);
}

void MarketEngine::Impl::ReleaseOrderSlot(uint32_t slot) {
  Order& o = orders_[slot];
  const OrderCold& c = Cold(o);
  if (c.next_clip != kNever) ScheduleErase(c.next_clip, kSchedClip, o.id.value);
  if (c.cooldown_until > now_) ScheduleErase(c.cooldown_until, kSchedCooldown, o.id.value);
  if (o.locality != Locality::kAny) {
    auto range = rel_to_orders_.equal_range(c.rel_to.value);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == slot) {
        rel_to_orders_.erase(it);
        break;
      }
    }
  }
  order_slot_.Erase(o.id.value, orders_);
  o.alive = false;
  if (o.has_cold) {
    OrderCold& mc = MutableCold(o);
    mc.claims.clear();
    mc.claims.shrink_to_fit();
  }
  free_slots_.push_back(slot);
}

// Cancels an open order: withdraws its claims, emits the event.
void MarketEngine::Impl::CancelOrderInternal(uint32_t slot, CancelReason why, bool detached) {
  Order& o = orders_[slot];
  if (!o.alive) return;
  BookErase(o);
  if (o.state == OrderState::kPending && !detached) {
    ReleaseClaims(slot);
  }
  o.state = OrderState::kCancelled;
  RemoveOrderFromTenant(o);
  Event e;
  e.type = EventType::kOrderCancelled;
  e.order = o.id;
  e.tenant = o.tenant;
  e.cancel_reason = why;
  Emit(e);
  ReleaseOrderSlot(slot);
}

// A single order obtains node n (free): it becomes the holder.
void MarketEngine::Impl::FillSingle(uint32_t slot, NodeId n, bool emit_alloc) {
  Order& o = orders_[slot];
  BookErase(o);
  TenantId tid = o.tenant;
  Price limit = Requested(o);
  if (emit_alloc) {
    Event e;
    e.type = EventType::kAllocated;
    e.node = n;
    e.tenant = tid;
    e.order = o.id;
    e.price = limit;
    Emit(e);
  }
  RemoveOrderFromTenant(o);
  o.state = OrderState::kFilled;
  Event f;
  f.type = EventType::kOrderFilled;
  f.order = o.id;
  f.tenant = tid;
  Emit(f);
  ReleaseOrderSlot(slot);
  StartHolding(n, tid, limit);
  RefreshNode(n);
}

// The obtain price of a node o claims, for o itself: an order never
// competes with itself, so a node it contests is priced without its own
// pending price and a node it reserves at its floor.
Price MarketEngine::Impl::OwnClaimObtain(const Order& o, NodeId n) const {
  const NodeState& s = nodes_[n.value];
  if (s.order_slot == SlotOf(o)) return Floor(n);
  if (params_.min_hold > 0 && now_ < node_cold_[n.value].held_since + params_.min_hold) return kInfPrice;
  return HolderBar(n);
}

// Changes an open order's effective price (and seq), keeping books and contests right.
void MarketEngine::Impl::SetEffective(uint32_t slot, Price eff, uint64_t seq) {
  Order& o = orders_[slot];
  if (o.state == OrderState::kPending) {
    if (o.in_book) {
      BookReprice(o, eff, seq);
    } else {
      o.effective = eff;
      SetSeq(o, seq);
    }
    for (NodeId n : std::vector<NodeId>(Claims(o))) {
      NodeState& s = nodes_[n.value];
      if (s.challenger == slot) {
        RefreshNode(n);
        UpdateRate(n);
        MarkDirty(n);
        // New price, same deadline; none if the price it states is unchanged
        // (a raise that clipping holds at the same effective price).
        if (s.contested && ChallengerPrice(s) >= HolderBar(n) && NoticePrice(n) != node_cold_[n.value].notice_price) SendNotice(n);
      } else if (s.order_slot == slot && EffFloor(n) > eff) {
        // A floor on a reserved node above the gang's price drops it (handled in review).
      }
    }
    if (o.is_gang()) {
      for (NodeId n : Claims(o)) {
        const NodeState& s = nodes_[n.value];
        if (s.challenger == slot && eff < HolderBar(n)) {
          DropGang(slot, /*cooldown=*/true);
          return;
        }
      }
    }
    return;
  }
  BookReprice(o, eff, seq);
}

// ---------------------------------------------------------------- placing and updating orders

Result<OrderId> MarketEngine::Impl::Place(TenantId tid, const OrderSpec& spec) {
  LZ_RETURN_IF_ERROR(CheckTenant(tid));
  LZ_RETURN_IF_ERROR(CheckPrice(spec.price, "price"));
  if (!spec.scope.valid() || spec.scope.value >= topo_.vertex_count()) {
    return NotFound("scope: no vertex with id " + Num(spec.scope.value));
  }
  if (spec.count < 1) return InvalidArgument("count: must be at least 1");
  const topology::Vertex sv = V(spec.scope);  // A copy: EnsureIndex below may compact the topology.
  if (sv.level == Level::kNode && !topo_.IsLiveNode(sv.node)) return NotFound("scope: node " + Num(sv.node.value) + " was removed");
  EnsureIndex();
  auto [lo, hi] = topo_.Range(spec.scope);
  if (spec.count > hi - lo) {
    return InvalidArgument("count: gang of " + Num(spec.count) + " is larger than its vertex (" + Num(hi - lo) + " nodes)");
  }
  if (sv.level == Level::kNode && nodes_[sv.node.value].holder == tid) {
    return FailedPrecondition("scope: the tenant already holds node " + topo_.node(sv.node).name);
  }
  LocationId locality_loc;
  if (spec.locality != Locality::kAny) {
    LZ_RETURN_IF_ERROR(CheckNode(spec.rel_to));
    if (nodes_[spec.rel_to.value].holder != tid) {
      return FailedPrecondition("rel_to: the tenant does not hold node " + topo_.node(spec.rel_to).name);
    }
    Level lvl = static_cast<Level>(static_cast<uint8_t>(spec.locality));  // kSameRegion=1 .. kSameRack=4.
    locality_loc = topo_.AncestorAt(topo_.node(spec.rel_to).rack, lvl);
  } else if (spec.rel_to.valid()) {
    return InvalidArgument("rel_to: only allowed with a locality constraint");
  }
  Tenant& t = tenants_[tid.value];
  // An exhausted tenant's orders are cancelled (rule 7), so a new one may
  // not rest either: even at price 0, which the budget test lets through
  // because it commits nothing.
  if (t.exhausted) {
    return ResourceExhausted("tenant: " + t.name +
                             " is exhausted: its balance does not cover its nodes for one grace period; deposit "
                             "or relinquish first");
  }
  __int128 add_rate = static_cast<__int128>(spec.price) * spec.count;
  __int128 add_need = static_cast<__int128>(spec.count) * GraceCost(spec.price, params_.grace);
  LZ_RETURN_IF_ERROR(CheckBudget(t, add_rate, add_need));
  MakeRoomForNextSeq();

  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (orders_.size() >= kMaxOrderSlots) return ResourceExhausted("order: too many open orders (" + Num(orders_.size()) + ")");
    slot = static_cast<uint32_t>(orders_.size());
    // Grow by an eighth, not the vector's doubling: the slots are most of an
    // order's memory, and doubling left up to half of them unused (issue 12;
    // a quarter left up to a fifth, 17% at the 100k-node benchmark's 14,250
    // orders). Each slot is copied about eight times over the growth, once.
    if (orders_.size() == orders_.capacity()) orders_.reserve(orders_.size() + orders_.size() / 8 + 16);
    orders_.emplace_back();
  }
  Order& o = orders_[slot];
  if (o.has_cold) order_cold_.erase(slot);  // The previous order's, kept until now.
  placed_.Erase(slot);                        // Likewise.
  if (o.apart) requested_apart_.Erase(slot);  // Likewise.
  if (o.seq_rel == Order::kSeqApart) seq_apart_.Erase(slot);      // Likewise.
  if (o.count_rel == Order::kCountApart) count_apart_.Erase(slot);  // Likewise.
  if (slot < clip_step_.size()) clip_step_[slot] = 0;
  o = Order();
  o.id = OrderId(next_order_id_++);
  o.tenant = tid;
  o.scope = spec.scope;
  SetCount(o, spec.count);
  o.locality = spec.locality;
  if (spec.rel_to.valid() || locality_loc.valid()) {
    OrderCold& c = MutableCold(o);
    c.rel_to = spec.rel_to;
    c.locality_loc = locality_loc;
    if (locality_loc.valid()) {
      c.eff_scope = Narrow(spec.scope, locality_loc);
      o.narrowed = true;
    }
  }
  o.effective = spec.price;  // The requested price, until ApplyClip.
  SetSeq(o, next_seq_++);
  o.state = OrderState::kResting;
  order_slot_.Insert(slot, orders_);
  // Ids only grow (a restored image's live ids are below next_order_id_), so
  // appending keeps the list in id order.
  t.orders.push_back(slot);
  t.committed = static_cast<Price>(std::min<__int128>(kInfPrice, t.committed + add_rate));
  t.committed_need = static_cast<Money>(std::min<__int128>(kInfPrice, t.committed_need + add_need));
  if (spec.locality != Locality::kAny) rel_to_orders_.emplace(spec.rel_to.value, slot);
  ApplyClip(o, spec.price, 0);
  if (o.effective != spec.price) StoreRequested(o, spec.price);  // Apart: a clip holds the effective price below it.
  OrderId id = o.id;
  // The book was not crossed before this call, so only the new order can
  // cross now: match it directly rather than resting it first (resting and
  // leaving a book would refresh the rates of every holder below its scope).
  bool acted = o.is_gang() ? TryGang(slot) : TrySingle(slot);
  if (!acted) BookInsert(orders_[slot], orders_[slot].is_gang() ? kFlagGang : 0);
  return id;
}

// The vertex of the nodes an order may take: its scope narrowed to the
// locality location (DESIGN.md 3b: locality resolves to a location when the
// order is placed). Invalid while no node of the scope's type lies there.
VertexId MarketEngine::Impl::Narrow(VertexId scope, LocationId loc) const {
  if (!loc.valid()) return scope;
  const topology::Vertex& sv = V(scope);
  if (sv.level == Level::kNode) return topo_.LocationContains(loc, sv.location) ? scope : VertexId();
  if (topo_.LocationContains(sv.location, loc)) return topo_.VertexAt(sv.type, loc);
  if (topo_.LocationContains(loc, sv.location)) return scope;
  return VertexId();
}

// After nodes are added, orders waiting for their locality vertex may now have one.
void MarketEngine::Impl::ResolveWaitingOrders() {
  if (unmatchable_.empty()) return;
  std::vector<uint32_t> waiting;
  waiting.swap(unmatchable_);
  for (uint32_t slot : waiting) {
    Order& o = orders_[slot];
    if (!o.alive) continue;
    o.in_book = false;
    if (o.narrowed) {  // Else its effective scope is its scope, as before.
      OrderCold& c = MutableCold(o);
      c.eff_scope = Narrow(o.scope, c.locality_loc);
    }
    BookInsert(o, o.book_flags);
  }
}

Result<uint32_t> MarketEngine::Impl::FindOwnOrder(TenantId tid, OrderId id) const {
  LZ_RETURN_IF_ERROR(CheckTenant(tid));
  uint32_t slot = FindSlot(id.value);
  if (slot == OrderIndex::kNone) return NotFound("order: no open order with id " + Num(id.value));
  if (orders_[slot].tenant != tid) return PermissionDenied("order: order " + Num(id.value) + " belongs to another tenant");
  return slot;
}

Status MarketEngine::Impl::Update(TenantId tid, OrderId id, Price price) {
  LZ_ASSIGN_OR_RETURN(uint32_t slot, FindOwnOrder(tid, id));
  LZ_RETURN_IF_ERROR(CheckPrice(price, "price"));
  Order& o = orders_[slot];
  Tenant& t = tenants_[tid.value];
  __int128 rem = Remaining(o);
  const Price requested = Requested(o);
  __int128 add_rate = (static_cast<__int128>(price) - requested) * rem;
  __int128 add_need = rem * (GraceCost(price, params_.grace) - GraceCost(requested, params_.grace));
  LZ_RETURN_IF_ERROR(CheckBudget(t, add_rate, add_need));
  // The first move away from the placed price keeps it for the snapshot.
  // Before the tenant's sums change: the table may allocate (and throw).
  if (price != requested && placed_.Find(slot) < 0) placed_.Insert(slot, requested);
  // Likewise the room for the requested price's entry, which EndRequested may
  // add once the update has begun, where it must not throw.
  if (price != requested && !o.apart) requested_apart_.Reserve(1);
  if (price > requested) MakeRoomForNextSeq();  // A raise takes a new seq.
  t.committed = static_cast<Price>(t.committed + add_rate);
  t.committed_need = static_cast<Money>(t.committed_need + add_need);
  if (price == requested) return Status::Ok();
  BeginRequested(o, slot, price);  // The new requested price, until EndRequested.
  // EndRequested however the update ends: a throw from the book (an
  // allocation in SetEffective) must not leave in_flight_ naming this order,
  // whose requested price would then read as none once another update began.
  struct EndOnExit {
    Impl* m;
    uint32_t slot;
    ~EndOnExit() { m->EndRequested(m->orders_[slot]); }
  } end_on_exit{this, slot};
  if (price > requested) {
    Price before = o.effective;
    uint64_t seq = next_seq_++;
    // Clip from the current effective price; the order gets a new sequence number.
    Price eff_before = o.effective;
    ApplyClip(o, price, eff_before);
    Price eff = o.effective;
    o.effective = before;
    SetEffective(slot, eff, seq);
  } else if (o.effective > price) {  // Lowered below the effective price.
    if (Cold(o).next_clip != kNever) {
      OrderCold& c = MutableCold(o);
      ScheduleErase(c.next_clip, kSchedClip, o.id.value);
      c.next_clip = kNever;
    }
    SetEffective(slot, price, Seq(o));
  }
  return Status::Ok();  // end_on_exit: EndRequested.
}

// SetSeq's rare cases (issue 12): a seq that does not fit the window (a new
// one past it: the base moves up; an older one, or a restored one anywhere:
// it is kept apart), or a record whose seq is apart now.
void MarketEngine::Impl::StoreSeq(Order& o, uint64_t seq) {
  if (seq >= seq_base_ && seq - seq_base_ >= Order::kSeqApart) RebaseSeqs(seq);  // May put o's old seq apart.
  const uint32_t slot = SlotOf(o);
  if (o.seq_rel == Order::kSeqApart) seq_apart_.Erase(slot);
  const uint64_t rel = seq - seq_base_;
  if (seq >= seq_base_ && rel < Order::kSeqApart) {
    o.seq_rel = static_cast<uint32_t>(rel);
  } else {
    seq_apart_.Insert(slot, static_cast<Price>(seq));
    o.seq_rel = Order::kSeqApart;
  }
}

// Moves the seqs' base to kSeqWindow below `seq`, a seq above the window:
// every slot's offset is rewritten, and a seq below the new base goes apart.
// Once in 2^31 seqs at most; two passes over the slots. The room for the
// seqs that go apart is made first, so that nothing changes unless all does.
void MarketEngine::Impl::RebaseSeqs(uint64_t seq) {
  const uint64_t base = seq - kSeqWindow;
  size_t going_apart = 0;
  for (const Order& o : orders_) going_apart += o.seq_rel != Order::kSeqApart && seq_base_ + o.seq_rel < base;
  seq_apart_.Reserve(going_apart);
  for (uint32_t slot = 0; slot < orders_.size(); ++slot) {
    Order& o = orders_[slot];
    if (o.seq_rel == Order::kSeqApart) continue;  // Apart already: stays so.
    const uint64_t full = seq_base_ + o.seq_rel;
    if (full >= base) {
      o.seq_rel = static_cast<uint32_t>(full - base);
    } else {
      seq_apart_.Insert(slot, static_cast<Price>(full));
      o.seq_rel = Order::kSeqApart;
    }
  }
  seq_base_ = base;
}

}  // namespace laissez::market
