// The instant and timers: the instant loop (RunInstant), scheduled events (RunDue),
// advancing time (AdvanceTo), flushing events, and price-change events.
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- event flushing

void MarketEngine::Impl::Flush() {
  if (options_.price_events) EmitPriceChanges();
  if (!events_.empty()) {
    if (sink_) sink_->OnEvents(events_);
    events_.clear();
  }
}

// ---------------------------------------------------------------- price events

void MarketEngine::Impl::TouchVertex(VertexId v) {
  SizeTouched();
  MarkTouched(v.value);
}

void MarketEngine::Impl::TouchAncestors(VertexId v) {
  SizeTouched();  // Once per path, not per vertex.
  for (; v.valid(); v = V(v).parent) MarkTouched(v.value);
}

// The ancestors of a re-keyed leaf whose quote may have moved (issue 12: most
// re-keys of decaying nodes move no quote above them). An untouched vertex
// keeps the winner of its last quote while no key in its range changes, since
// every key change outside a rebuild (which touches every vertex) comes
// through here. So if that winner w is another leaf that beats this one, the
// vertex's quote stands and it is not touched; nor is any vertex above it: an
// untouched ancestor's winner beats w (its range holds w's) and is not this
// leaf (which would then have won below too). A vertex with no known winner
// (never quoted, or restored from a snapshot, which does not keep them) is
// touched and the walk goes on: the stop needs only the stopping vertex's own
// winner.
void MarketEngine::Impl::TouchRekeyed(const TypeIndex& ix, uint32_t leaf, VertexId v) {
  SizeTouched();
  for (; v.valid(); v = V(v).parent) {
    if (vertex_touched_[v.value]) continue;
    uint32_t w = v.value < quote_leaf_.size() ? quote_leaf_[v.value] : UINT32_MAX;
    if (w != UINT32_MAX && w != leaf && LeafLess(ix, w, leaf)) return;
    MarkTouched(v.value);
  }
}

void MarketEngine::Impl::EmitPriceChanges() {
  EnsureIndex();  // A rebuild marks vertices itself: do it before reading the list.
  if (last_quote_.size() < topo_.vertex_count()) last_quote_.resize(topo_.vertex_count(), kInfPrice);
  if (quote_leaf_.size() < topo_.vertex_count()) quote_leaf_.resize(topo_.vertex_count(), UINT32_MAX);
  // In ascending vertex order. When a good share of the vertices is touched
  // (a time step re-keys decaying nodes all over the tree), a scan of the
  // flags lists them in order for less than sorting the list (issue 12).
  if (touched_vertices_.size() * 8 >= vertex_touched_.size()) {
    touched_vertices_.clear();
    for (uint32_t v = 0; v < vertex_touched_.size(); ++v) {
      if (vertex_touched_[v]) touched_vertices_.push_back(v);
    }
  } else {
    std::sort(touched_vertices_.begin(), touched_vertices_.end());
  }
  for (uint32_t v : touched_vertices_) {
    vertex_touched_[v] = 0;
    // IndexedQuote, with a leaf vertex's (one leaf: four in five quotes) taken
    // here without a call (issue 12). The index is current (above).
    const TypeIndex& ix = index_[V(VertexId(v)).type.value];
    const auto [lo, hi] = topo_.Range(VertexId(v));
    const uint32_t leaf = hi == lo + 1 ? lo : RangeBest(ix, lo, hi);
    quote_leaf_[v] = leaf;
    const Price q = leaf == UINT32_MAX ? kInfPrice : ix.obtain(leaf);
    if (q != last_quote_[v]) {
      last_quote_[v] = q;
      Event e;
      e.type = EventType::kPriceChanged;
      e.vertex = VertexId(v);
      e.price = q;
      Emit(e);
    }
  }
  touched_vertices_.clear();
}

Price MarketEngine::Impl::QuoteOf(VertexId v) {
  EnsureIndex();
  return IndexedQuote(v);
}

Price MarketEngine::Impl::IndexedQuote(VertexId v, uint32_t* winner) const {
  const TypeIndex& ix = index_[V(v).type.value];
  auto [lo, hi] = topo_.Range(v);
  uint32_t leaf = RangeBest(ix, lo, hi);
  if (winner != nullptr) *winner = leaf;
  return leaf == UINT32_MAX ? kInfPrice : ix.obtain(leaf);
}

// ---------------------------------------------------------------- the instant

// RunInstant (engine_impl.h) when something is pending.
void MarketEngine::Impl::RunInstantLoop(bool settle_rates) {
  for (int round = 0;; ++round) {
    bool changed = false;
    // Contest validity and notices.
    while (!dirty_nodes_.empty()) {
      uint32_t n = dirty_nodes_.back();
      dirty_nodes_.pop_back();
      node_dirty_flag_[n] = 0;
      changed |= ReviewNode(NodeId(n));
    }
    // One due deadline.
    if (!sched_.empty() && sched_.begin()->time <= now_) {
      auto it = std::find_if(sched_.begin(), sched_.end(),
                             [&](const SchedKey& k) { return k.time > now_ || k.kind == kSchedDeadline; });
      if (it != sched_.end() && it->time <= now_ && it->kind == kSchedDeadline) {
        ResolveDeadline(NodeId(static_cast<uint32_t>(it->id)));
        continue;
      }
    }
    if (CompleteGangs()) continue;
    // Exhaustion.
    if (!exhaust_dirty_.empty()) {
      std::vector<uint32_t>& list = exhaust_scratch_;
      list.clear();
      list.swap(exhaust_dirty_);
      for (uint32_t& t : list) {
        if (exhaust_flag_[t] == 2) t |= kRescheduleOnly;
        exhaust_flag_[t & ~kRescheduleOnly] = 0;
      }
      for (uint32_t e : list) {
        uint32_t t = e & ~kRescheduleOnly;
        if (!(e & kRescheduleOnly)) changed |= ReviewExhaustion(t);
        RescheduleExhaustion(t);
      }
      if (changed) continue;
    }
    if (MatchOne()) continue;
    if (changed) continue;
    // Consistent: settle the rates that changed. A change re-arms its
    // tenant's exhaustion (with the new rates), so run the loop once more.
    if (settle_rates && ApplyRates()) continue;
    break;
  }
}

// Applies timed work due exactly at now_ (other than deadlines, handled in RunInstant).
void MarketEngine::Impl::RunDue() {
  // Clip steps first.
  std::vector<SchedKey> due;
  for (auto it = sched_.begin(); it != sched_.end() && it->time <= now_;) {
    if (it->kind != kSchedDeadline) {
      due.push_back(*it);
      it = sched_.erase(it);
    } else {
      ++it;
    }
  }
  if (!exhaust_sched_.empty() && exhaust_sched_.top_time() <= now_) {
    // Into the set's order (time, kind, id), as if the entries were in it:
    // both runs are sorted (the set's, and the heap's pops).
    const auto mid = static_cast<std::ptrdiff_t>(due.size());
    for (; !exhaust_sched_.empty() && exhaust_sched_.top_time() <= now_; exhaust_sched_.Pop()) {
      due.push_back(SchedKey{exhaust_sched_.top().time, kSchedExhaust, exhaust_sched_.top().tenant});
    }
    std::inplace_merge(due.begin(), due.begin() + mid, due.end());
  }
  std::stable_sort(due.begin(), due.end(), [](const SchedKey& a, const SchedKey& b) {
    return (a.kind == kSchedClip) > (b.kind == kSchedClip);
  });
  for (const SchedKey& k : due) {
    switch (k.kind) {
      case kSchedClip: {
        uint32_t slot = FindSlot(k.id);
        if (slot != OrderIndex::kNone && Cold(orders_[slot]).next_clip == k.time) ClipStep(slot);
        break;
      }
      case kSchedHoldExpiry: {
        NodeState& s = nodes_[k.id];
        if (s.hold_scheduled && s.holder.valid() && node_cold_[k.id].held_since + params_.min_hold <= now_) {
          s.hold_scheduled = false;
          RefreshNode(NodeId(static_cast<uint32_t>(k.id)));
        } else if (s.hold_scheduled && s.holder.valid()) {
          // min_hold changed: re-arm at the new expiry.
          ScheduleAdd(node_cold_[k.id].held_since + params_.min_hold, kSchedHoldExpiry, k.id);
        }
        break;
      }
      case kSchedPolicy: {
        Policy& p = policies_[k.id];
        p.sched = kNever;
        if (p.alive && IsAdaptive(p.spec)) {
          AdaptiveEvent(static_cast<uint32_t>(k.id));
          SchedulePolicy(static_cast<uint32_t>(k.id));
        } else if (p.alive) {
          RecomputeFloorsUnder(p);
          SchedulePolicy(static_cast<uint32_t>(k.id));
        }
        break;
      }
      case kSchedExhaust: {
        Tenant& t = tenants_[k.id];
        t.exhaust_sched = kNever;
        if (!t.exhausted && ExhaustedAt(t, now_)) {
          MarkExhaustDirty(TenantId(static_cast<uint32_t>(k.id)));
        } else if (!t.exhausted && !t.nodes.empty()) {
          // The lower bound was early: arm the exact crossing.
          t.exhaust_sched = ExactExhaustion(t);
          ScheduleAdd(t.exhaust_sched, kSchedExhaust, k.id);
        }
        break;
      }
      case kSchedCooldown: {
        uint32_t slot = FindSlot(k.id);
        if (slot != OrderIndex::kNone) {
          Order& o = orders_[slot];
          candidates_.emplace(-o.effective, Seq(o), slot);
        }
        break;
      }
      case kSchedDecay:
        break;
      case kSchedPower:
        power_sched_ = kNever;
        EvaluatePower();
        break;
    }
  }
  RefreshDecay();
}

Status MarketEngine::Impl::AdvanceTo(Micros t) {
  if (t < now_) {
    return OutOfRange("time: " + std::to_string(t) + " is before the engine's time " + std::to_string(now_));
  }
  while (true) {
    Micros next = NextTime();
    if (next > t) break;
    if (next > now_) now_ = next;
    RunDue();
    RunInstant(/*settle_rates=*/now_ < t);
    // Work re-armed at now_ (an exhaustion bound that needs its exact check)
    // runs in the next pass; each such entry re-arms strictly later.
    if (NextTime() <= now_) {
      LZ_CHECK(++same_time_passes_ < 1'000'000);
    } else {
      same_time_passes_ = 0;
    }
  }
  if (t > now_) {
    now_ = t;
    RefreshDecay();
    RunInstant(/*settle_rates=*/false);
  }
  return Status::Ok();
}

}  // namespace laissez::market
