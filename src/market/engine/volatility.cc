// Volatility controls (DESIGN.md section 3, rule 9): clipping an order's effective price and
// floor decay after a release. (The minimum hold is part of Obtain, in engine_impl.h.)
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- clipping

// Clip reference (DESIGN.md 3b): the k-th lowest obtain price over the
// eligible nodes, for the order's own tenant. The index prices the nodes o
// claims with o's own price in them, so those are priced apart and merged
// with the k cheapest others.
Price MarketEngine::Impl::ClipReference(const Order& o) {
  if (!EffScope(o).valid()) return kInfPrice;
  std::vector<NodeId> skip(Claims(o));
  std::vector<Price> prices;
  for (NodeId n : Claims(o)) prices.push_back(OwnClaimObtain(o, n));
  const uint32_t count = Count(o);
  for (uint32_t i = 0; i < count; ++i) {
    NodeId n = BestNodeFor(o, false, &skip);
    if (!n.valid()) break;
    skip.push_back(n);
    prices.push_back(Obtain(n));
  }
  if (prices.size() < count) return kInfPrice;
  std::nth_element(prices.begin(), prices.begin() + (count - 1), prices.end());
  return prices[count - 1];
}

// Sets effective price and clip schedule after placement or a raise to
// `requested`, which the caller stores beside the new effective price
// afterwards (StoreRequested, or EndRequested in an update).
void MarketEngine::Impl::ApplyClip(Order& o, Price requested, Price before_effective) {
  if (Cold(o).next_clip != kNever) {
    OrderCold& c = MutableCold(o);
    ScheduleErase(c.next_clip, kSchedClip, o.id.value);
    c.next_clip = kNever;
  }
  if (params_.clip_alpha_ppm == 0) {
    o.effective = requested;
    return;
  }
  Price p = ClipReference(o);
  if (p == kInfPrice) {
    o.effective = requested;
    return;
  }
  Price s = std::max(MulPpmCeil(p, params_.clip_alpha_ppm), params_.tick);
  // The step goes to its own table; the order's rare fields only when a
  // clip is scheduled (issue 12: not on every Place with clipping on).
  SetClipStep(SlotOf(o), s);
  o.effective = std::min(requested, std::max(SatAdd(p, s), before_effective));
  if (o.effective < requested) {
    if (params_.clip_interval == 0) {
      o.effective = requested;
    } else {
      OrderCold& c = MutableCold(o);
      c.next_clip = SatAdd(now_, params_.clip_interval);
      ScheduleAdd(c.next_clip, kSchedClip, o.id.value);
    }
  }
}

void MarketEngine::Impl::ClipStep(uint32_t slot) {
  Order& o = orders_[slot];
  OrderCold& c = MutableCold(o);  // A clip step: the order has a clip schedule.
  c.next_clip = kNever;
  const Price requested = Requested(o);
  Price eff = std::min(requested, SatAdd(o.effective, ClipStepOf(slot)));  // Set with the schedule.
  if (params_.clip_interval == 0) eff = requested;
  if (eff < requested) {
    c.next_clip = SatAdd(now_, params_.clip_interval);
    ScheduleAdd(c.next_clip, kSchedClip, o.id.value);
  }
  // Apart, the requested price stays as the effective one moves (an order
  // not apart has both equal, and eff is that price then).
  SetEffective(slot, eff, Seq(o));
  StoreRequested(orders_[slot], requested);  // Drops the entry once the clip reaches it.
}

// ---------------------------------------------------------------- decay

Micros MarketEngine::Impl::DecayCrossing(uint32_t i) const {
  const NodeState& s = nodes_[i];
  if (!s.decaying || s.holder.valid() || s.order_slot != UINT32_MAX || params_.decay_beta == 0) return kNever;
  auto [paid, released_at] = decay_state_.at(i);
  // EffFloor(i), from the decay record already read (its conditions hold here).
  Price eff = DecayedFloor(s.base_floor, paid, DecayedBy(released_at));
  if (eff <= s.base_floor) return kNever;
  // The next crossing is with the highest resting price still below the
  // decaying floor; prices at or above it already had their chance (a gang
  // short of nodes, say) and must not hide the lower ones.
  Price x = -1;
  for (VertexId v = topo_.node(NodeId(i)).leaf; v.valid(); v = V(v).parent) {
    if (books_.top(v.value) < 0) continue;
    if (books_.top(v.value) < eff) {
      x = std::max(x, books_.top(v.value));
      continue;
    }
    const auto& b = books_[v.value];
    auto it = std::lower_bound(b.begin(), b.end(), eff, [](const BookEntry& e, Price p) { return e.price >= p; });
    if (it != b.end()) x = std::max(x, it->price);
  }
  if (x < 0 || x < s.base_floor || x >= eff) return kNever;
  // First t with paid - floor(beta * (t - released_at) / 1s) <= x.
  __int128 need = static_cast<__int128>(paid - x) * kMicrosPerSecond;
  __int128 d = Div128(need + params_.decay_beta - 1, params_.decay_beta);
  __int128 t = released_at + d;
  // A crossing at or before now was applied when the keys were refreshed.
  return t >= kNever || t <= now_ ? kNever : static_cast<Micros>(t);
}

// Refresh keys of decaying free nodes for the current time; drop finished ones.
// With the index current, a node whose decayed floor is still the one in its
// key is not re-keyed (issue 12: most time steps move no decayed floor by a
// whole micro-unit, or the floor already rests on the policy floor): its key,
// its place in both trees and the quotes above it are unchanged, and its
// obtain price did not fall, so no order can newly cross at it (RefreshNode's
// `wake` contract). Only the nodes whose floor moved pay for a re-key. And a
// node is not even visited before the time its decayed floor can next move
// (decay_wake_; issue 12: of 4.82M visits in the stress replay, 3.17M found
// nothing to do, each with a decay-record lookup and a 128-bit decay).
void MarketEngine::Impl::RefreshDecay() {
  const bool index_current = index_generation_ == topo_.generation();
  // Visits are skipped, and their entries set, only with the index current (decay_wake_).
  if (index_current) {
    if (decay_wake_generation_ != index_generation_) {
      // A rebuilt index: entries of the old one are not relied on.
      std::fill(decay_wake_.begin(), decay_wake_.end(), DecayWake{});
      decay_quiet_until_ = kDecayQuietNone;
      decay_wake_generation_ = index_generation_;
    }
    if (decay_wake_.size() < nodes_.size()) decay_wake_.resize(nodes_.size());
    // No node's wake has come and none was cleared since the last pass: every visit would be
    // skipped, every entry kept (decay_quiet_until_).
    if (now_ < decay_quiet_until_) return;
  }
  // Stays so through the pass unless a visit clears a wake (StopDecay); then the next pass
  // visits as usual.
  decay_quiet_until_ = kNever;
  Micros least = kNever;  // The least wake of the nodes kept.
  size_t w = 0;
  for (size_t r = 0; r < decaying_.size(); ++r) {
    uint32_t i = decaying_[r];
    NodeState& s = nodes_[i];
    bool active = s.alive && s.decaying && !s.holder.valid() && s.order_slot == UINT32_MAX;
    if (active && index_current && now_ < decay_wake_[i].until && s.base_floor == decay_wake_[i].base) {
      least = std::min(least, decay_wake_[i].until);
      decaying_[w++] = i;  // Still running, its key current: nothing to do (decay_wake_).
      continue;
    }
    // Keep the decay while it can still matter: until P - decay reaches 0
    // (the floor below may fall later, DESIGN.md 9b).
    bool running = false;
    if (active) {
      auto [paid, released_at] = decay_state_.at(i);
      __int128 dec = DecayedBy(released_at);
      running = dec < paid;
      Price f = params_.decay_beta > 0 ? DecayedFloor(s.base_floor, paid, dec) : s.base_floor;
      if (index_current) {
        RekeyDecayed(NodeId(i), f);
        if (running) {
          // The next decay the floor can show: one micro-unit more while it is above the base
          // floor, else the whole price paid (the decay's end). dec(t) >= d from
          // t = released_at + ceil(d x 1s / beta) on; before it the visit finds f again. With
          // beta 0 nothing decays (f is the base floor) until beta changes, which clears the
          // entries (DecayInputsChanged).
          Micros until = kNever;
          if (params_.decay_beta > 0) {
            const __int128 d = f > s.base_floor ? dec + 1 : static_cast<__int128>(paid);
            // In 64 bits when every step fits (issue 12: once a visit), else in 128: the same time.
            int64_t scaled, t64;
            if (d == static_cast<int64_t>(d) &&
                !__builtin_mul_overflow(static_cast<int64_t>(d), kMicrosPerSecond, &scaled) &&
                !__builtin_add_overflow(scaled, params_.decay_beta - 1, &scaled) &&
                !__builtin_add_overflow(released_at, scaled / params_.decay_beta, &t64)) {
              until = t64;  // At most kNever: the 128-bit path's clamp changes nothing.
            } else {
              const __int128 t =
                  released_at + Div128(d * kMicrosPerSecond + params_.decay_beta - 1, params_.decay_beta);
              until = t >= kNever ? kNever : static_cast<Micros>(t);
            }
          }
          decay_wake_[i] = DecayWake{until, s.base_floor};
          least = std::min(least, until);
        }
      } else {
        refreshing_decay_ = true;
        RefreshNode(NodeId(i));
        refreshing_decay_ = false;
      }
    }
    if (running) {
      decaying_[w++] = i;
    } else if (!s.holder.valid()) {
      StopDecay(NodeId(i));
    }
  }
  decaying_.resize(w);
  // A node kept by the pass without its wake set (the index not current) must be visited again.
  if (decay_quiet_until_ == kNever) decay_quiet_until_ = index_current ? least : kDecayQuietNone;
}

// RefreshNode of live free decaying node n, whose floor (and so its obtain
// price) is f, with the index current (issue 12: a time step re-keys many).
// It leaves the index, the candidates and the marks for quotes as RefreshNode
// would, for less: the key is f's (no second decay-record lookup), a node
// already in the free tree with that key is left alone (nothing RefreshNode
// would change, and its obtain price did not fall: no wake), and a node
// already in the free tree moves there as in the tree of every node
// (MinTree::Moved: one read per level) instead of re-deriving each level.
void MarketEngine::Impl::RekeyDecayed(NodeId n, Price f) {
  const uint32_t leaf = nodes_[n.value].leaf;
  if (leaf == UINT32_MAX) return;
  TypeIndex& ix = index_[nodes_[n.value].type.value];
  const unsigned __int128 k = static_cast<unsigned __int128>(static_cast<uint64_t>(f)) << 64 | static_cast<uint64_t>(f);
  const unsigned __int128 old_key = ix.key[leaf];
  const bool in_free_tree = ix.free_leaf[leaf] != 0;
  if (k == old_key && in_free_tree) return;
  ix.Rekey(leaf, k, old_key, in_free_tree, /*free_now=*/true);
  if (MayWake(f)) WalkCandidates(WalkStart(n), f);
  if (k != old_key && options_.price_events) TouchRekeyed(ix, leaf, topo_.node(n).leaf);
}

}  // namespace laissez::market
