// The ledger and budgets: settling a holding's charge, rates, starting and ending holdings,
// the budget check, and exhaustion (accrual aggregates, when a tenant runs out, its review).
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- money

// Settles node n's holding up to now at its current rate.
void MarketEngine::Impl::Settle(NodeId n) {
  NodeState& s = nodes_[n.value];
  if (!s.holder.valid() || now_ == s.acc_since) return;
  Tenant& t = tenants_[s.holder.value];
  Micros dt = now_ - s.acc_since;
  Money whole;
  int64_t carry;
  // due = carry + rate x dt (>= 0), split into whole micro-units and the
  // remainder: in 64 bits when it fits (issue 12: every settled re-rating
  // paid two 128-bit library divisions), the same quotient and remainder.
  int64_t due64;
  if (!__builtin_mul_overflow(s.rate, dt, &due64) && !__builtin_add_overflow(due64, int64_t{s.carry}, &due64)) {
    whole = due64 / kMicrosPerHour;
    carry = due64 % kMicrosPerHour;
  } else {
    __int128 due = static_cast<__int128>(s.carry) + static_cast<__int128>(s.rate) * dt;
    whole = static_cast<Money>(due / kH);
    carry = static_cast<int64_t>(due % kH);
  }
  // Aggregates: remove the old accrual term, add the new one.
  t.carry_sum += carry - s.carry;
  t.rate_time_sum += static_cast<__int128>(s.rate) * dt;
  s.carry = carry;
  Micros from = s.acc_since;
  s.acc_since = now_;
  s.paid_rate = s.rate;
  // Every interval that accrued something is recorded, even below one
  // micro-unit, so the carried remainders can be audited from the ledger.
  if (s.rate == 0) return;
  Money paid = std::min(whole, t.balance);
  Money waived = whole - paid;
  t.balance -= paid;
  t.paid += paid;
  t.waived += waived;
  totals_.operator_revenue += paid;
  totals_.waived += waived;
  ++totals_.entries;
  if (options_.retain_ledger) ledger_.push_back(LedgerEntry{now_, from, s.holder, n, s.rate, paid, waived});
  Event e;
  e.type = EventType::kCharged;
  e.node = n;
  e.tenant = s.holder;
  e.price = s.rate;
  e.amount = paid;
  e.waived = waived;
  e.deadline = from;
  Emit(e);
  MarkExhaustDirty(s.holder);
}

void MarketEngine::Impl::UpdateRate(NodeId n) {
  if (n.value == rate_unchanged_node_) rate_unchanged_node_ = UINT32_MAX;
  if (rate_dirty_flag_.size() < nodes_.size()) rate_dirty_flag_.resize(nodes_.size(), 0);
  if (n.value == rate_phantom_) {
    rate_phantom_ = UINT32_MAX;
    rate_dirty_flag_[n.value] = 1;
    rate_dirty_.insert(rate_dirty_.begin(), n.value);
    return;
  }
  if (!nodes_[n.value].holder.valid()) return;
  if (!rate_dirty_flag_[n.value]) {
    rate_dirty_flag_[n.value] = 1;
    rate_dirty_.push_back(n.value);
  }
}

// Re-derives p(n); settles first if it changed. True if it did.
bool MarketEngine::Impl::ApplyRate(NodeId n) {
  NodeState& s = nodes_[n.value];
  bool unchanged = n.value == rate_unchanged_node_;
  if (unchanged) rate_unchanged_node_ = UINT32_MAX;
  if (!s.holder.valid() || unchanged) return false;
  Price f = Floor(n);
  Price p = std::min(s.limit, std::max(Competing(n), f));
  if (p == s.rate) return false;
  Settle(n);
  Tenant& t = tenants_[s.holder.value];
  t.rate_sum += p - s.rate;
  t.rate_time_sum += static_cast<__int128>(p - s.rate) * now_;
  s.rate = p;
  MarkExhaustDirty(s.holder);
  return true;
}

// Room kept in rate_dirty_ between instants (ApplyRates): 16 KB.
constexpr size_t kRateListKeep = 4096;

// Applies the rate changes of the instant. True if any rate changed.
bool MarketEngine::Impl::ApplyRates() {
  bool any = false;
  while (!rate_dirty_.empty()) {
    uint32_t n = rate_dirty_.back();
    rate_dirty_.pop_back();
    rate_dirty_flag_[n] = 0;
    any |= ApplyRate(NodeId(n));
  }
  rate_phantom_ = UINT32_MAX;  // Its turn, last: its rate is unchanged.
  // The list is the instant's scratch, empty between instants. An instant
  // that re-rates many holders (a book's summary changing under a zone
  // re-rates every held node below it) grows it that long, and a vector
  // keeps its room: at most kRateListKeep entries' room is kept (issue 12:
  // the first order in each of four zones of 25,000 held nodes left 128 KB
  // idle, 9 B per resting order in `bench engine`'s 100k-node memory figure).
  // The next such instant grows it again: a few allocations beside its
  // thousands of rate updates.
  if (rate_dirty_.capacity() > kRateListKeep) std::vector<uint32_t>().swap(rate_dirty_);
  return any;
}

void MarketEngine::Impl::StartHolding(NodeId n, TenantId tid, Price limit) {
  NodeState& s = nodes_[n.value];
  Tenant& t = tenants_[tid.value];
  s.holder = tid;
  s.limit = limit;
  NodeCold& cold = node_cold_[n.value];
  cold.held_since = now_;
  s.order_slot = UINT32_MAX;
  StopDecay(n);
  s.rate = 0;
  s.paid_rate = 0;
  s.carry = 0;
  s.acc_since = now_;
  cold.tenant_pos = static_cast<uint32_t>(t.nodes.size());
  t.nodes.push_back(n);
  t.committed = SatAdd(t.committed, limit);
  t.committed_need = SatAdd(t.committed_need, GraceCost(limit, params_.grace));
  t.need = SatAdd(t.need, GraceCost(limit, params_.grace));
  if (params_.min_hold > 0) {
    s.hold_scheduled = true;
    ScheduleAdd(now_ + params_.min_hold, kSchedHoldExpiry, n.value);
  }
  UpdateRate(n);
  MarkPowerDirty();
  MarkExhaustDirty(tid);
  MarkDirty(n);
}

// Ends n's holding: settles, drops the remainder, frees bookkeeping. Leaves n free.
void MarketEngine::Impl::EndHolding(NodeId n) {
  NodeState& s = nodes_[n.value];
  TenantId tid = s.holder;
  Settle(n);
  Tenant& t = tenants_[tid.value];
  t.carry_sum -= s.carry;
  t.rate_sum -= s.rate;
  t.rate_time_sum -= static_cast<__int128>(s.rate) * now_;
  // Swap-remove from the tenant's list.
  uint32_t pos = node_cold_[n.value].tenant_pos;
  NodeId last = t.nodes.back();
  t.nodes[pos] = last;
  node_cold_[last.value].tenant_pos = pos;
  t.nodes.pop_back();
  t.committed -= s.limit;
  t.committed_need -= GraceCost(s.limit, params_.grace);
  t.need -= GraceCost(s.limit, params_.grace);
  // Decay starts from the rate the holder paid (DESIGN.md 3b), not from a
  // rate that took effect at this instant and was never charged (a
  // maintenance window's infinite floor raises p(n) to r(n) at its start,
  // the instant its deadline releases the node).
  Price paid_rate = s.paid_rate;
  s.holder = TenantId();
  s.limit = 0;
  s.rate = 0;
  s.carry = 0;
  if (s.hold_scheduled) {
    ScheduleErase(node_cold_[n.value].held_since + params_.min_hold, kSchedHoldExpiry, n.value);
    s.hold_scheduled = false;
  }
  ClearContest(n);
  if (params_.decay_beta > 0 && paid_rate > 0) {
    StartDecay(n, paid_rate);
    decaying_.push_back(n.value);
  }
  MarkPowerDirty();
  MarkExhaustDirty(tid);
  // Orders anchored on n lose their anchor.
  auto range = rel_to_orders_.equal_range(n.value);
  std::vector<uint32_t> anchored;
  for (auto it = range.first; it != range.second; ++it) anchored.push_back(it->second);
  for (uint32_t slot : anchored) {
    if (orders_[slot].alive && orders_[slot].tenant == tid) CancelOrderInternal(slot, CancelReason::kRelToLost);
  }
}

// ---------------------------------------------------------------- exhaustion

void MarketEngine::Impl::MarkExhaustDirty(TenantId t) {
  if (exhaust_flag_.size() < tenants_.size()) exhaust_flag_.resize(tenants_.size(), 0);
  uint8_t& f = exhaust_flag_[t.value];
  if (f == 2) f = 1;  // Queued already: now it is reviewed as well.
  if (!f) {
    f = 1;
    exhaust_dirty_.push_back(t.value);
  }
}

void MarketEngine::Impl::MarkExhaustReschedule(TenantId t) {
  if (exhaust_flag_.size() < tenants_.size()) exhaust_flag_.resize(tenants_.size(), 0);
  if (!exhaust_flag_[t.value]) {
    exhaust_flag_[t.value] = 2;
    exhaust_dirty_.push_back(t.value);
  }
}

// Sum of floor(acc_i(t) / kH) over t's holdings: accrued unsettled money at time `at`.
Money MarketEngine::Impl::Accrued(const Tenant& t, Micros at) const {
  __int128 sum = 0;
  for (NodeId n : t.nodes) {
    const NodeState& s = nodes_[n.value];
    sum += (static_cast<__int128>(s.carry) + static_cast<__int128>(s.rate) * (at - s.acc_since)) / kH;
  }
  return sum > kInfPrice ? kInfPrice : static_cast<Money>(sum);
}

// Earliest time >= now at which the tenant can become exhausted (a lower bound).
Micros MarketEngine::Impl::ExhaustLowerBound(const Tenant& t) const {
  if (t.nodes.empty()) return kNever;
  __int128 a_now = AccrualAt(t, now_);
  if (!TimesHAbove(static_cast<__int128>(t.balance) - t.need, a_now)) return now_;
  if (t.rate_sum <= 0) return kNever;
  __int128 target = (static_cast<__int128>(t.balance) - t.need) * kH;  // A(t) must reach this.
  __int128 num = target - a_now + t.rate_sum - 1;
  int64_t r = static_cast<int64_t>(t.rate_sum);
  __int128 dt = r == t.rate_sum ? Div128(num, r) : num / t.rate_sum;
  if (dt >= kNever - now_) return kNever;
  return now_ + static_cast<Micros>(dt);
}

// Keeps a lower bound of the tenant's exhaustion time in the schedule. A
// later bound leaves the earlier entry in place: when it fires, the exact
// check runs and re-arms at the exact crossing. This keeps limit changes
// (which move the bound a little every time) off the schedule's tree.
// The exact first time after now at which the tenant is exhausted, by
// exponential then binary search over the exact test; kNever if none.
Micros MarketEngine::Impl::ExactExhaustion(const Tenant& t) const {
  if (t.nodes.empty()) return kNever;
  // Doubling steps from now, saturating: engine times past kNever / 2 are
  // valid too (a tiny rate against a large balance exhausts that late).
  Micros lo = now_, hi = now_;
  for (Micros step = 1;; step = step > kNever / 2 ? kNever : 2 * step) {
    hi = SatAdd(now_, step);
    if (hi == kNever) return kNever;
    if (ExhaustedAt(t, hi)) break;
    lo = hi;
  }
  while (hi - lo > 1) {
    Micros mid = lo + (hi - lo) / 2;
    (ExhaustedAt(t, mid) ? hi : lo) = mid;
  }
  return hi;
}

void MarketEngine::Impl::RescheduleExhaustion(uint32_t tid) {
  Tenant& t = tenants_[tid];
  if (!t.exhausted && t.exhaust_sched != kNever && t.exhaust_sched > now_ && !t.nodes.empty()) {
    // The armed check still comes no later than the new bound if the bound's
    // condition does not hold yet at the armed time: keep it (no division).
    if (TimesHAbove(static_cast<__int128>(t.balance) - t.need, AccrualAt(t, t.exhaust_sched))) return;
  }
  Micros when = t.exhausted ? kNever : ExhaustLowerBound(t);
  // Not exhausted now (ReviewExhaustion ran first), so a bound at or before
  // now says nothing: find the exact instant rather than leave work due now.
  if (when <= now_) when = ExactExhaustion(t);
  if (when == t.exhaust_sched) return;
  if (when > t.exhaust_sched && t.exhaust_sched != kNever && when != kNever) return;
  ScheduleMove(t.exhaust_sched, when, kSchedExhaust, tid);
  t.exhaust_sched = when;
}

// Exhaustion due at now? Returns true if it fired or recovered (state changed).
bool MarketEngine::Impl::ReviewExhaustion(uint32_t tid) {
  Tenant& t = tenants_[tid];
  bool ex = ExhaustedAt(t, now_);
  if (ex == t.exhausted) return false;
  t.exhausted = ex;
  if (ex) {
    Event e;
    e.type = EventType::kExhausted;
    e.tenant = TenantId(tid);
    Emit(e);
    // A copy of the slots, in the list's (id) order: the cancellations edit
    // the list. A slot stays the order's until its own cancellation releases
    // it (no order is placed meanwhile), so no lookup by id is needed.
    std::vector<uint32_t> slots(t.orders.begin(), t.orders.end());
    for (uint32_t s : slots) CancelOrderInternal(s, CancelReason::kExhausted);
  }
  for (NodeId n : t.nodes) MarkDirty(n);
  return true;
}

// ---------------------------------------------------------------- budget check

Status MarketEngine::Impl::BudgetRefusal(const Tenant& t, __int128 add_rate, __int128 add_need) const {
  __int128 committed = static_cast<__int128>(t.committed) + add_rate;
  if (t.max_rate != kInfPrice && committed > t.max_rate) {
    return ResourceExhausted("price: committed rate " + std::to_string(static_cast<int64_t>(std::min<__int128>(committed, kInfPrice))) +
                             " would exceed the tenant's max_rate " + std::to_string(t.max_rate));
  }
  __int128 need = static_cast<__int128>(t.committed_need) + add_need;
  return ResourceExhausted("price: balance " + std::to_string(Available(t, now_)) +
                           " does not cover the committed rate for one grace period (" +
                           std::to_string(static_cast<int64_t>(std::min<__int128>(need, kInfPrice))) + ")");
}

}  // namespace laissez::market
