// MarketEngine implementation.
//
// Invariants (checked by tests/property after every operation):
// - A node has at most one holder; a reserved node has none.
// - After every public call the book is not crossed: no resting single-node
//   order reaches the obtain price of a node it is eligible for, and no resting
//   gang outside its cooldown can obtain its k nodes.
// - After every public call a holding's rate p(n) = min(r(n), max(c(n), f(n)))
//   is current, and its charge since `acc_since` is settled exactly whenever
//   p(n) changes (re-derived once per instant, see ApplyRates).
// - Sum of balances + operator revenue == deposits; balances never go negative.
//
// Structure. Per hardware type, nodes are laid out in the topology's leaf order
// so that every vertex is a contiguous range, and a segment tree over that order
// finds the node with the lowest obtain price below any vertex in O(log n).
// Orders rest in per-vertex books sorted by (effective price desc, seq asc); an
// order constrained by locality rests at the deeper of its scope and the
// anchor's location, which is exactly the set of nodes it is eligible for.
// Matching is incremental: only "candidate" orders (new, raised, re-rested, or
// under a node whose obtain price fell) can cross, and they are examined in
// priority order. Timed work (deadlines, hold expiries, clip steps, floor
// schedules, exhaustion, gang cooldowns) sits in one ordered schedule.
#include "market/market_engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "common/check.h"
#include "market/operation.h"

namespace laissez::market {
namespace {

using topology::Topology;

constexpr __int128 kH = kMicrosPerHour;  // Charges: price (per hour) x micros / kH.

Price AddTick(Price p, Price tick) { return SatAdd(p, tick); }

// ceil(price * grace / 1h): what one node at `price` costs for one grace period.
Money GraceCost(Price price, Micros grace) {
  if (price <= 0 || grace <= 0) return 0;
  if (price < (int64_t{1} << 31) && grace < (int64_t{1} << 31)) {
    return (price * grace + kMicrosPerHour - 1) / kMicrosPerHour;  // Fits in 64 bits.
  }
  __int128 v = (static_cast<__int128>(price) * grace + kH - 1) / kH;
  return v >= kInfPrice ? kInfPrice : static_cast<Money>(v);
}

std::string Num(uint64_t v) { return std::to_string(v); }

enum SchedKind : uint8_t {
  kSchedDeadline = 0,    // id: node
  kSchedHoldExpiry = 1,  // id: node
  kSchedClip = 2,        // id: order
  kSchedPolicy = 3,      // id: policy
  kSchedExhaust = 4,     // id: tenant
  kSchedCooldown = 5,    // id: order
  kSchedDecay = 6,       // id: node
  kSchedPower = 7,       // id: 0; power-cap floors follow committed power one microsecond later.
};

struct SchedKey {
  Micros time;
  uint8_t kind;
  uint64_t id;
  bool operator<(const SchedKey& o) const { return std::tie(time, kind, id) < std::tie(o.time, o.kind, o.id); }
};

enum BookFlag : uint8_t { kFlagGang = 1, kFlagPending = 2 };

struct BookEntry {
  Price price;  // Effective price.
  uint64_t seq;
  uint32_t slot;
  uint32_t tenant;
  uint8_t flags;
};
// Sorted: price desc, seq asc.
inline bool BookLess(const BookEntry& a, const BookEntry& b) {
  return a.price != b.price ? a.price > b.price : a.seq < b.seq;
}

// Per-vertex books, allocated only for vertices that ever had an order: most
// vertices are leaves that never do, and an empty std::vector is 24 bytes.
class BookTable {
 public:
  void Resize(size_t vertices) { index_.resize(vertices, kNone); }
  size_t size() const { return index_.size(); }
  const std::vector<BookEntry>& operator[](uint32_t v) const {
    uint32_t i = index_[v];
    return i == kNone ? kEmpty : pool_[i];
  }
  // The highest price of any entry at v, -1 if none: lets walks over a node's
  // ancestors skip books without touching them.
  Price top(uint32_t v) const { return v < top_.size() ? top_[v] : -1; }
  // A reference valid until the next Mutable call; call Retop(v) after changing it.
  std::vector<BookEntry>& Mutable(uint32_t v) {
    if (index_[v] == kNone) {
      index_[v] = static_cast<uint32_t>(pool_.size());
      pool_.emplace_back();
    }
    return pool_[index_[v]];
  }
  void Retop(uint32_t v) {
    if (top_.size() < index_.size()) top_.resize(index_.size(), -1);
    const auto& b = (*this)[v];
    top_[v] = b.empty() ? -1 : b.front().price;
  }
  size_t total_entries() const {
    size_t n = 0;
    for (const auto& b : pool_) n += b.size();
    return n;
  }
  void ShrinkToFit() {
    index_.shrink_to_fit();
    top_.resize(index_.size(), -1);
    top_.shrink_to_fit();
  }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static inline const std::vector<BookEntry> kEmpty{};
  std::vector<uint32_t> index_;
  std::vector<Price> top_;
  std::vector<std::vector<BookEntry>> pool_;
};

// Fields are ordered so that the 4-byte and 1-byte ones pack without padding.
struct NodeState {
  TenantId holder;
  uint32_t order_slot = UINT32_MAX;  // Gang reservation (slot of the gang order).
  Price limit = 0;
  Micros held_since = 0;
  // Contest.
  Micros deadline = 0;
  Price notice_price = 0;            // The price the holder's latest notice stated.
  uint32_t challenger = UINT32_MAX;  // Order slot of the pending challenger.
  uint32_t tenant_pos = 0;           // Index in the holder's node list.
  // Floors.
  Price base_floor = 0;    // Max of policy floors.
  // Charging.
  Price rate = 0;
  // The rate of the holding's latest interval of positive length: what it
  // paid, as opposed to a rate that took effect this instant (decay's P).
  Price paid_rate = 0;
  Micros acc_since = 0;
  uint32_t carry = 0;  // Remainder below one micro-unit, in micro-unit / kH (< kH < 2^32).
  bool contested = false;
  uint8_t reasons = 0;
  bool alive = true;
  bool hold_scheduled = false;
  bool decaying = false;  // Has an entry in decay_state_ (rare: kept out of the hot struct).
  bool in_maint = false;  // Has an entry in maint_state_.
};

struct Order {
  OrderId id;
  TenantId tenant;
  OrderSpec spec;
  TypeId type;
  VertexId eff_scope;      // Invalid: no node satisfies the order (yet).
  LocationId locality_loc; // The anchor's location at the locality level (invalid: none).
  Price requested = 0;
  Price effective = 0;
  Price clip_step = 0;
  Micros next_clip = kNever;
  uint64_t seq = 0;
  OrderState state = OrderState::kResting;
  uint32_t filled = 0;
  Micros cooldown_until = 0;
  bool in_book = false;     // Has a BookEntry at eff_scope.
  uint8_t book_flags = 0;
  std::vector<NodeId> claims;  // Pending: contested or reserved nodes.
  bool alive = true;
  bool is_gang() const { return spec.count > 1; }
  uint32_t remaining() const { return spec.count - filled; }
};

struct Tenant {
  std::string name;
  Money balance = 0;
  Price max_rate = kInfPrice;
  Money deposited = 0;
  Money paid = 0, waived = 0;
  std::vector<NodeId> nodes;
  std::set<uint64_t> orders;  // Open order ids.
  // Committed rate and its grace cost.
  Price committed = 0;      // Sum limits + price x remaining (requested prices).
  Money committed_need = 0; // Per-item grace costs of the same.
  Money need = 0;           // Sum over held nodes of GraceCost(r).
  // Accrual aggregates: A(t) = carry_sum + rate_sum * t - rate_time_sum.
  __int128 carry_sum = 0;
  __int128 rate_sum = 0;
  __int128 rate_time_sum = 0;
  bool exhausted = false;
  Micros exhaust_sched = kNever;
};

struct Policy {
  PolicySpec spec;
  bool alive = true;
  Micros maint_start = 0;  // Effective maintenance start.
  Price power_floor = 0;   // Current floor of a power-cap policy or an adaptive cap's controller.
  int64_t staying_w = 0;   // Adaptive cap: staying power measured at the last control step.
  Micros next_step = kNever;  // Adaptive cap: the next control step.
  Micros sched = kNever;
};

}  // namespace

class MarketEngine::Impl {
 public:
  Impl(MarketParams p, EngineOptions o) : params_(p), options_(o) {}

  // ---------------------------------------------------------------- state
  MarketParams params_;
  EngineOptions options_;
  EventSink* sink_ = nullptr;
  OperationObserver observer_;
  // Reports a call to the observer (if any) and passes its result through.
  template <typename R>
  R Observed(Micros t, std::optional<OpBody>& body, R result) {
    if (observer_ && body) {
      uint64_t id = UINT64_MAX;
      if constexpr (!std::is_same_v<R, Status>) {
        if (result.ok()) id = static_cast<uint64_t>(result->value);
      }
      observer_(Operation{t, std::move(*body)}, id);
    }
    return result;
  }
  Topology topo_;
  Micros now_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t next_order_id_ = 0;

  std::vector<NodeState> nodes_;
  std::vector<Order> orders_;           // Slots.
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, uint32_t> order_slot_;  // Live orders.
  BookTable books_;  // Per vertex.
  std::vector<Tenant> tenants_;
  std::unordered_map<std::string, TenantId> tenant_by_name_;
  std::vector<Policy> policies_;
  std::unordered_multimap<uint32_t, uint32_t> rel_to_orders_;  // node -> order slot.
  std::vector<uint32_t> unmatchable_;  // Slots of orders with no eligible node ever (not in a book).

  std::set<SchedKey> sched_;
  std::vector<LedgerEntry> ledger_;
  LedgerTotals totals_;
  std::vector<Event> events_;

  // Per-type index.
  struct TypeIndex {
    uint32_t size = 1;
    std::vector<uint32_t> tree;     // Leaf index of the subtree minimum; UINT32_MAX if empty.
    // Per leaf: obtain << 64 | held << 63 | floor, so one compare orders by
    // (obtain, free first, floor); node id breaks the remaining ties.
    std::vector<unsigned __int128> key;
    std::vector<NodeId> leaf_node;  // Per leaf.
    Price obtain(uint32_t leaf) const { return static_cast<Price>(key[leaf] >> 64); }
  };
  unsigned __int128 KeyOf(NodeId n) const {
    unsigned __int128 k = static_cast<unsigned __int128>(static_cast<uint64_t>(Obtain(n))) << 64;
    if (nodes_[n.value].holder.valid()) k |= static_cast<unsigned __int128>(1) << 63;
    return k | static_cast<uint64_t>(Floor(n));
  }
  std::vector<TypeIndex> index_;
  uint64_t index_generation_ = UINT64_MAX;

  // Work lists of the current instant.
  std::set<std::tuple<Price, uint64_t, uint32_t>> candidates_;  // (-price, seq, slot).
  std::vector<uint32_t> dirty_nodes_;
  std::vector<uint8_t> node_dirty_flag_;
  std::vector<uint32_t> gangs_to_check_;
  bool power_dirty_ = false;
  Micros power_sched_ = kNever;
  // Committed power changed: power-cap floors are re-evaluated one microsecond
  // later (a scheduled event), never inside the instant whose allocations
  // changed it, so a floor that reacts to what it prices cannot loop.
  void MarkPowerDirty() {
    power_dirty_ = true;
    if (power_sched_ != kNever || !has_power_policy_) return;
    power_sched_ = SatAdd(now_, 1);
    ScheduleAdd(power_sched_, kSchedPower, 0);
  }
  bool has_power_policy_ = false;
  std::vector<Price> last_quote_;  // For price events.
  std::vector<uint8_t> vertex_touched_;
  std::vector<uint32_t> touched_vertices_;
  std::vector<VertexId> anc_scratch_;
  std::vector<uint32_t> decaying_;  // Nodes with a decay_state_ entry.
  // Rare per-node state, kept out of NodeState to keep it small.
  std::unordered_map<uint32_t, std::pair<Price, Micros>> decay_state_;  // (P paid at release, release time).
  std::unordered_map<uint32_t, Micros> maint_state_;  // Start of a maintenance whose notice phase began.
  int same_time_passes_ = 0;
  std::vector<uint32_t> exhaust_scratch_, gang_scratch_;  // Reused buffers (no allocation per call).

  // ---------------------------------------------------------------- helpers
  const topology::Vertex& V(VertexId v) const { return topo_.vertex(v); }

  Micros MaintAt(NodeId n) const {
    return nodes_[n.value].in_maint ? maint_state_.at(n.value) : kNever;
  }
  void SetMaintAt(NodeId n, Micros at) {
    NodeState& s = nodes_[n.value];
    s.in_maint = at != kNever;
    if (s.in_maint) maint_state_[n.value] = at;
    else maint_state_.erase(n.value);
  }
  void StopDecay(NodeId n) {
    NodeState& s = nodes_[n.value];
    if (s.decaying) decay_state_.erase(n.value);
    s.decaying = false;
  }
  void StartDecay(NodeId n, Price paid) {
    decay_state_[n.value] = {paid, now_};
    nodes_[n.value].decaying = true;
  }

  Price EffFloor(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    Price f = s.base_floor;
    if (s.decaying && !s.holder.valid() && s.order_slot == UINT32_MAX && params_.decay_beta > 0) {
      auto [paid, released_at] = decay_state_.at(n.value);
      __int128 dec = static_cast<__int128>(params_.decay_beta) * (now_ - released_at) / kMicrosPerSecond;
      __int128 d = static_cast<__int128>(paid) - dec;
      if (d > f) f = static_cast<Price>(d);
    }
    return f;
  }

  // The holder-side floor (decay applies only to free nodes).
  Price Floor(NodeId n) const { return EffFloor(n); }

  Price ChallengerPrice(const NodeState& s) const {
    return s.challenger == UINT32_MAX ? 0 : orders_[s.challenger].effective;
  }

  // max(f, r(1+h)) + tick: what a challenger must reach, ignoring a pending one.
  Price HolderBar(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    Price r = s.limit;
    Price rh = SatAdd(r, MulPpmCeil(r, params_.hysteresis_ppm));
    return AddTick(std::max(Floor(n), rh), params_.tick);
  }

  // Obtain price for a tenant order (rule "Obtain price"); kInfPrice if not obtainable.
  Price Obtain(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    if (!s.alive || s.order_slot != UINT32_MAX) return kInfPrice;
    if (!s.holder.valid()) return EffFloor(n);
    if (params_.min_hold > 0 && now_ < s.held_since + params_.min_hold) return kInfPrice;
    Price bar = HolderBar(n);
    if (s.challenger != UINT32_MAX) bar = std::max(bar, AddTick(ChallengerPrice(s), params_.tick));
    return bar;
  }

  bool IsEligibleNode(const Order& o, NodeId n) const {
    if (!o.eff_scope.valid()) return false;
    const NodeState& s = nodes_[n.value];
    if (!s.alive || s.holder == o.tenant) return false;
    return topo_.VertexContains(o.eff_scope, topo_.node(n).leaf);
  }

  void Emit(Event e) {
    e.time = now_;
    events_.push_back(e);
  }

  void Flush() {
    if (options_.price_events) EmitPriceChanges();
    if (!events_.empty()) {
      if (sink_) sink_->OnEvents(events_);
      events_.clear();
    }
  }

  // ---------------------------------------------------------------- index
  void EnsureIndex() {
    if (index_generation_ == topo_.generation() && index_.size() == topo_.type_count()) return;
    index_generation_ = topo_.generation();
    if (options_.price_events) {
      for (uint32_t v = 0; v < topo_.vertex_count(); ++v) TouchVertex(VertexId(v));
    }
    // No compaction here: callers up the stack hold references into nodes_
    // and the topology while a rebuild can happen (a dangling NodeState& was
    // found by the split-advance property test).
    index_.assign(topo_.type_count(), {});
    for (size_t t = 0; t < topo_.type_count(); ++t) {
      auto order = topo_.LeafOrder(TypeId(static_cast<uint16_t>(t)));
      TypeIndex& ix = index_[t];
      ix.size = 1;
      while (ix.size < order.size()) ix.size <<= 1;
      ix.tree.assign(2 * ix.size, UINT32_MAX);
      ix.key.assign(order.size(), 0);
      ix.leaf_node.assign(order.begin(), order.end());
      for (uint32_t i = 0; i < order.size(); ++i) {
        ix.key[i] = KeyOf(order[i]);
        ix.tree[ix.size + i] = i;
      }
      for (uint32_t i = ix.size - 1; i >= 1; --i) ix.tree[i] = Better(ix, ix.tree[2 * i], ix.tree[2 * i + 1]);
    }
  }

  // Tie-break (docs/MECHANISM.md): lower obtain, then free before held, then lower floor, then lower id.
  bool LeafLess(const TypeIndex& ix, uint32_t a, uint32_t b) const {
    if (ix.key[a] != ix.key[b]) return ix.key[a] < ix.key[b];
    return ix.leaf_node[a].value < ix.leaf_node[b].value;
  }
  uint32_t Better(const TypeIndex& ix, uint32_t a, uint32_t b) const {
    if (a == UINT32_MAX) return b;
    if (b == UINT32_MAX) return a;
    return LeafLess(ix, a, b) ? a : b;
  }

  // Re-keys node n in its type's tree; marks candidates if its obtain price fell.
  void RefreshNode(NodeId n) {
    if (index_generation_ != topo_.generation()) {
      // The index is rebuilt lazily with fresh keys; the change must still wake
      // orders and mark vertices, whether or not a query rebuilt it meanwhile.
      AddCandidatesAbove(n, Obtain(n));
      if (options_.price_events) TouchAncestors(topo_.node(n).leaf);
      return;
    }
    TypeIndex& ix = index_[topo_.node(n).type.value];
    uint32_t leaf = topo_.LeafIndex(n);
    if (leaf == UINT32_MAX) return;
    unsigned __int128 k = KeyOf(n);
    Price now_obtain = static_cast<Price>(k >> 64);
    if (k == ix.key[leaf]) {
      AddCandidatesAbove(n, now_obtain);
      return;
    }
    ix.key[leaf] = k;
    for (uint32_t i = (ix.size + leaf) >> 1; i >= 1; i >>= 1) {
      uint32_t was = ix.tree[i];
      uint32_t now_best = Better(ix, ix.tree[2 * i], ix.tree[2 * i + 1]);
      ix.tree[i] = now_best;
      // Above here nothing changes: the same other leaf still wins with the same key.
      if (now_best == was && now_best != leaf) break;
    }
    // Any order now reaching n may cross: its price fell, or its holder changed
    // (the old holder's orders become eligible for it).
    AddCandidatesAbove(n, now_obtain);
    if (options_.price_events) TouchAncestors(topo_.node(n).leaf);
  }

  // Orders at the ancestors of n whose price reaches `price` may now cross.
  void AddCandidatesAbove(NodeId n, Price price) {
    if (price == kInfPrice) return;
    for (VertexId v = topo_.node(n).leaf; v.valid(); v = V(v).parent) {
      if (books_.top(v.value) < price) continue;
      for (const BookEntry& e : books_[v.value]) {
        if (e.price < price) break;
        candidates_.emplace(-e.price, e.seq, e.slot);
      }
    }
  }

  // Best leaf in [lo, hi) of type t by LeafLess, skipping leaves that `skip` rejects.
  template <typename Skip>
  uint32_t FindBest(const TypeIndex& ix, uint32_t lo, uint32_t hi, Skip&& skip) const {
    uint32_t best = UINT32_MAX;
    FindRec(ix, 1, 0, ix.size, lo, hi, skip, &best);
    return best;
  }
  template <typename Skip>
  void FindRec(const TypeIndex& ix, uint32_t node, uint32_t nlo, uint32_t nhi, uint32_t lo, uint32_t hi, Skip& skip,
               uint32_t* best) const {
    if (nhi <= lo || hi <= nlo) return;
    uint32_t m = ix.tree[node];
    if (m == UINT32_MAX) return;
    if (*best != UINT32_MAX && !LeafLess(ix, m, *best)) return;  // Nothing better below.
    if (lo <= nlo && nhi <= hi && !skip(m)) {
      *best = m;
      return;
    }
    if (nhi - nlo == 1) return;
    uint32_t mid = (nlo + nhi) / 2;
    FindRec(ix, 2 * node, nlo, mid, lo, hi, skip, best);
    FindRec(ix, 2 * node + 1, mid, nhi, lo, hi, skip, best);
  }

  // The best eligible node for order o (free only if `free_only`), excluding `exclude`.
  NodeId BestNodeFor(const Order& o, bool free_only, const std::vector<NodeId>* exclude = nullptr) {
    if (!o.eff_scope.valid()) return NodeId();
    EnsureIndex();
    const TypeIndex& ix = index_[o.type.value];
    auto [lo, hi] = topo_.Range(o.eff_scope);
    auto skip = [&](uint32_t leaf) {
      NodeId n = ix.leaf_node[leaf];
      const NodeState& s = nodes_[n.value];
      if (s.holder == o.tenant) return true;
      if (free_only && (s.holder.valid() || s.order_slot != UINT32_MAX)) return true;
      if (exclude && std::find(exclude->begin(), exclude->end(), n) != exclude->end()) return true;
      return false;
    };
    uint32_t leaf = FindBest(ix, lo, hi, skip);
    if (leaf == UINT32_MAX || ix.obtain(leaf) == kInfPrice) return NodeId();
    return ix.leaf_node[leaf];
  }

  // ---------------------------------------------------------------- books
  std::vector<BookEntry>::iterator FindEntry(std::vector<BookEntry>& b, const Order& o) {
    BookEntry key{o.effective, o.seq, 0, 0, 0};
    auto it = std::lower_bound(b.begin(), b.end(), key, BookLess);
    while (it != b.end() && it->price == o.effective && it->seq == o.seq) {
      if (it->slot == SlotOf(o)) return it;
      ++it;
    }
    LZ_CHECK(false && "book entry missing");
    return b.end();
  }
  uint32_t SlotOf(const Order& o) const { return static_cast<uint32_t>(&o - orders_.data()); }

  // The competing-demand summary of a book for change detection.
  struct Summary {
    Price p1 = 0;
    uint32_t t1 = UINT32_MAX;
    Price p2 = 0;  // Best price of a tenant other than t1.
    bool operator==(const Summary&) const = default;
  };
  Summary Summarize(const std::vector<BookEntry>& b) const {
    Summary s;
    for (const BookEntry& e : b) {
      if (e.flags) continue;
      if (s.t1 == UINT32_MAX) {
        s.p1 = e.price;
        s.t1 = e.tenant;
      } else if (e.tenant != s.t1) {
        s.p2 = e.price;
        break;
      }
    }
    return s;
  }

  void BookInsert(Order& o, uint8_t flags) {
    LZ_CHECK(!o.in_book);
    o.book_flags = flags;
    if (!o.eff_scope.valid()) {
      unmatchable_.push_back(SlotOf(o));
      o.in_book = true;
      return;
    }
    Summary before = Summarize(books_[o.eff_scope.value]);
    EntryInsert(o);
    o.in_book = true;
    AfterBookChange(o.eff_scope, before);
    candidates_.emplace(-o.effective, o.seq, SlotOf(o));
  }

  // Raw edits of the entry of an order whose effective scope is valid; the
  // callers refresh the rates the book's summary feeds (AfterBookChange).
  void EntryInsert(const Order& o) {
    auto& b = books_.Mutable(o.eff_scope.value);
    BookEntry e{o.effective, o.seq, SlotOf(o), o.tenant.value, o.book_flags};
    b.insert(std::upper_bound(b.begin(), b.end(), e, BookLess), e);
    books_.Retop(o.eff_scope.value);
  }
  void EntryErase(const Order& o) {
    auto& b = books_.Mutable(o.eff_scope.value);
    b.erase(FindEntry(b, o));
    books_.Retop(o.eff_scope.value);
  }

  void BookErase(Order& o) {
    if (!o.in_book) return;
    o.in_book = false;
    if (!o.eff_scope.valid()) {
      auto it = std::find(unmatchable_.begin(), unmatchable_.end(), SlotOf(o));
      if (it != unmatchable_.end()) unmatchable_.erase(it);
      return;
    }
    Summary before = Summarize(books_[o.eff_scope.value]);
    EntryErase(o);
    AfterBookChange(o.eff_scope, before);
  }

  // Changes an order's effective price and/or seq while it sits in the book.
  // One rate refresh for the move: refreshing after the erase and again after
  // the insert would settle every holding below whose c(n) the order sets and
  // open a new ledger interval at the same rate (p(n) changed and changed back).
  void BookReprice(Order& o, Price effective, uint64_t seq) {
    if (!o.in_book) {
      o.effective = effective;
      o.seq = seq;
      return;
    }
    if (!o.eff_scope.valid()) {  // Waiting for a node in its locality: re-queued at the back.
      uint8_t flags = o.book_flags;
      BookErase(o);
      o.effective = effective;
      o.seq = seq;
      BookInsert(o, flags);
      return;
    }
    Summary before = Summarize(books_[o.eff_scope.value]);
    EntryErase(o);
    o.effective = effective;
    o.seq = seq;
    EntryInsert(o);
    AfterBookChange(o.eff_scope, before);
    candidates_.emplace(-o.effective, o.seq, SlotOf(o));
  }

  void AfterBookChange(VertexId v, const Summary& before) {
    if (options_.price_events) TouchVertex(v);
    if (Summarize(books_[v.value]) == before) return;
    // c(n) may have changed for held nodes below v: refresh their rates.
    EnsureIndex();
    const TypeIndex& ix = index_[V(v).type.value];
    auto [lo, hi] = topo_.Range(v);
    for (uint32_t i = lo; i < hi; ++i) {
      NodeId n = ix.leaf_node[i];
      if (nodes_[n.value].holder.valid()) UpdateRate(n);
    }
  }

  // c(n): max of q(n) and resting single-node orders eligible for n (not the holder's).
  Price Competing(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    Price c = ChallengerPrice(s);
    for (VertexId v = topo_.node(n).leaf; v.valid(); v = V(v).parent) {
      if (books_.top(v.value) <= c) continue;
      for (const BookEntry& e : books_[v.value]) {
        if (e.price <= c) break;
        if (e.flags || e.tenant == s.holder.value) continue;
        c = e.price;
        break;
      }
    }
    return c;
  }

  // ---------------------------------------------------------------- money
  void ScheduleErase(Micros time, uint8_t kind, uint64_t id) {
    if (time != kNever) sched_.erase(SchedKey{time, kind, id});
  }
  void ScheduleAdd(Micros time, uint8_t kind, uint64_t id) {
    if (time != kNever) sched_.insert(SchedKey{time, kind, id});
  }

  // Settles node n's holding up to now at its current rate.
  void Settle(NodeId n) {
    NodeState& s = nodes_[n.value];
    if (!s.holder.valid() || now_ == s.acc_since) return;
    Tenant& t = tenants_[s.holder.value];
    __int128 due = static_cast<__int128>(s.carry) + static_cast<__int128>(s.rate) * (now_ - s.acc_since);
    Money whole = static_cast<Money>(due / kH);
    int64_t carry = static_cast<int64_t>(due % kH);
    // Aggregates: remove the old accrual term, add the new one.
    t.carry_sum += carry - s.carry;
    t.rate_time_sum += static_cast<__int128>(s.rate) * (now_ - s.acc_since);
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

  // The inputs of p(n) changed. p(n) is re-derived once the instant is
  // consistent (ApplyRates, at the end of RunInstant): a rate that moves and
  // comes back within the instant has not changed, and settling it would
  // split the ledger at an unchanged rate (3b: settled whenever p(n) changes).
  // Until then s.rate is the rate accruing since acc_since, which is what
  // settling a holding that ends at this instant must charge.
  std::vector<uint32_t> rate_dirty_;
  std::vector<uint8_t> rate_dirty_flag_;
  void UpdateRate(NodeId n) {
    if (!nodes_[n.value].holder.valid()) return;
    if (rate_dirty_flag_.size() < nodes_.size()) rate_dirty_flag_.resize(nodes_.size(), 0);
    if (!rate_dirty_flag_[n.value]) {
      rate_dirty_flag_[n.value] = 1;
      rate_dirty_.push_back(n.value);
    }
  }

  // Re-derives p(n); settles first if it changed. True if it did.
  bool ApplyRate(NodeId n) {
    NodeState& s = nodes_[n.value];
    if (!s.holder.valid()) return false;
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

  // Applies the rate changes of the instant. True if any rate changed.
  bool ApplyRates() {
    bool any = false;
    while (!rate_dirty_.empty()) {
      uint32_t n = rate_dirty_.back();
      rate_dirty_.pop_back();
      rate_dirty_flag_[n] = 0;
      any |= ApplyRate(NodeId(n));
    }
    return any;
  }

  void StartHolding(NodeId n, TenantId tid, Price limit) {
    NodeState& s = nodes_[n.value];
    Tenant& t = tenants_[tid.value];
    s.holder = tid;
    s.limit = limit;
    s.held_since = now_;
    s.order_slot = UINT32_MAX;
    StopDecay(n);
    s.rate = 0;
    s.paid_rate = 0;
    s.carry = 0;
    s.acc_since = now_;
    s.tenant_pos = static_cast<uint32_t>(t.nodes.size());
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
  void EndHolding(NodeId n) {
    NodeState& s = nodes_[n.value];
    TenantId tid = s.holder;
    Settle(n);
    Tenant& t = tenants_[tid.value];
    t.carry_sum -= s.carry;
    t.rate_sum -= s.rate;
    t.rate_time_sum -= static_cast<__int128>(s.rate) * now_;
    // Swap-remove from the tenant's list.
    uint32_t pos = s.tenant_pos;
    NodeId last = t.nodes.back();
    t.nodes[pos] = last;
    nodes_[last.value].tenant_pos = pos;
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
      ScheduleErase(s.held_since + params_.min_hold, kSchedHoldExpiry, n.value);
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
  std::vector<uint32_t> exhaust_dirty_;
  std::vector<uint8_t> exhaust_flag_;
  void MarkExhaustDirty(TenantId t) {
    if (exhaust_flag_.size() < tenants_.size()) exhaust_flag_.resize(tenants_.size(), 0);
    if (!exhaust_flag_[t.value]) {
      exhaust_flag_[t.value] = 1;
      exhaust_dirty_.push_back(t.value);
    }
  }

  // Sum of floor(acc_i(t) / kH) over t's holdings: accrued unsettled money at time `at`.
  Money Accrued(const Tenant& t, Micros at) const {
    __int128 sum = 0;
    for (NodeId n : t.nodes) {
      const NodeState& s = nodes_[n.value];
      sum += (static_cast<__int128>(s.carry) + static_cast<__int128>(s.rate) * (at - s.acc_since)) / kH;
    }
    return sum > kInfPrice ? kInfPrice : static_cast<Money>(sum);
  }
  Money Available(const Tenant& t, Micros at) const { return t.balance - Accrued(t, at); }

  // Upper bound of the accrued money at `at` from the aggregates, O(1):
  // sum floor(a_i / kH) <= floor(sum a_i / kH).
  __int128 AccruedUpperBound(const Tenant& t, Micros at) const {
    return (t.carry_sum + t.rate_sum * at - t.rate_time_sum) / kH;
  }

  // True if the available balance at `at` is <= `need`. O(1) unless the
  // bound is too close to call, then exact over the tenant's holdings.
  bool AvailableAtMost(const Tenant& t, Micros at, __int128 need) const {
    // balance - floor(A / kH) > need  <=  (balance - need) x kH > A: no division.
    __int128 a = t.carry_sum + t.rate_sum * at - t.rate_time_sum;
    if ((static_cast<__int128>(t.balance) - need) * kH > a) return false;
    return static_cast<__int128>(Available(t, at)) <= need;
  }

  bool ExhaustedAt(const Tenant& t, Micros at) const {
    return !t.nodes.empty() && AvailableAtMost(t, at, t.need);
  }

  // Earliest time >= now at which the tenant can become exhausted (a lower bound).
  Micros ExhaustLowerBound(const Tenant& t) const {
    if (t.nodes.empty()) return kNever;
    __int128 target = (static_cast<__int128>(t.balance) - t.need) * kH;  // A(t) must reach this.
    __int128 a_now = t.carry_sum + t.rate_sum * now_ - t.rate_time_sum;
    if (a_now >= target) return now_;
    if (t.rate_sum <= 0) return kNever;
    __int128 dt = (target - a_now + t.rate_sum - 1) / t.rate_sum;
    if (dt >= kNever - now_) return kNever;
    return now_ + static_cast<Micros>(dt);
  }

  // Keeps a lower bound of the tenant's exhaustion time in the schedule. A
  // later bound leaves the earlier entry in place: when it fires, the exact
  // check runs and re-arms at the exact crossing. This keeps limit changes
  // (which move the bound a little every time) off the schedule's tree.
  // The exact first time after now at which the tenant is exhausted, by
  // exponential then binary search over the exact test; kNever if none.
  Micros ExactExhaustion(const Tenant& t) const {
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

  void RescheduleExhaustion(uint32_t tid) {
    Tenant& t = tenants_[tid];
    if (!t.exhausted && t.exhaust_sched != kNever && t.exhaust_sched > now_ && !t.nodes.empty()) {
      // The armed check still comes no later than the new bound if the bound's
      // condition does not hold yet at the armed time: keep it (no division).
      __int128 target = (static_cast<__int128>(t.balance) - t.need) * kH;
      __int128 a = t.carry_sum + t.rate_sum * t.exhaust_sched - t.rate_time_sum;
      if (a < target) return;
    }
    Micros when = t.exhausted ? kNever : ExhaustLowerBound(t);
    // Not exhausted now (ReviewExhaustion ran first), so a bound at or before
    // now says nothing: find the exact instant rather than leave work due now.
    if (when <= now_) when = ExactExhaustion(t);
    if (when == t.exhaust_sched) return;
    if (when > t.exhaust_sched && t.exhaust_sched != kNever && when != kNever) return;
    ScheduleErase(t.exhaust_sched, kSchedExhaust, tid);
    t.exhaust_sched = when;
    ScheduleAdd(when, kSchedExhaust, tid);
  }

  // Exhaustion due at now? Returns true if it fired or recovered (state changed).
  bool ReviewExhaustion(uint32_t tid) {
    Tenant& t = tenants_[tid];
    bool ex = ExhaustedAt(t, now_);
    if (ex == t.exhausted) return false;
    t.exhausted = ex;
    if (ex) {
      Event e;
      e.type = EventType::kExhausted;
      e.tenant = TenantId(tid);
      Emit(e);
      std::vector<uint64_t> ids(t.orders.begin(), t.orders.end());
      for (uint64_t id : ids) CancelOrderInternal(order_slot_.at(id), CancelReason::kExhausted);
    }
    for (NodeId n : t.nodes) MarkDirty(n);
    return true;
  }

  // ---------------------------------------------------------------- contests
  void MarkDirty(NodeId n) {
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
  uint8_t CurrentReasons(NodeId n) const {
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

  Price NoticePrice(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    if (MaintAt(n) != kNever) return kInfPrice;
    return std::max(ChallengerPrice(s), Floor(n));
  }

  void SendNotice(NodeId n) {
    NodeState& s = nodes_[n.value];
    s.notice_price = NoticePrice(n);
    Event e;
    e.type = EventType::kNotice;
    e.node = n;
    e.tenant = s.holder;
    e.reasons = s.reasons;
    e.price = s.notice_price;
    e.deadline = s.deadline;
    if (s.challenger != UINT32_MAX) e.order = orders_[s.challenger].id;
    Emit(e);
  }

  void SetDeadline(NodeId n, Micros d) {
    NodeState& s = nodes_[n.value];
    if (s.contested) ScheduleErase(s.deadline, kSchedDeadline, n.value);
    s.deadline = d;
    ScheduleAdd(d, kSchedDeadline, n.value);
  }

  // Removes the contest state of n (no events); the challenger is left to the caller.
  void ClearContest(NodeId n) {
    NodeState& s = nodes_[n.value];
    if (s.contested) ScheduleErase(s.deadline, kSchedDeadline, n.value);
    s.contested = false;
    s.reasons = 0;
    s.deadline = 0;
    if (s.challenger != UINT32_MAX) {
      uint32_t c = s.challenger;
      s.challenger = UINT32_MAX;
      DetachChallenger(c, n, /*holder_won=*/true);
    }
  }

  // Contest validity and notices for one node. Returns true if anything changed.
  bool ReviewNode(NodeId n) {
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
      s.deadline = d;
      ScheduleAdd(d, kSchedDeadline, n.value);
      SendNotice(n);
      return true;
    }
    if (want == 0) {
      ScheduleErase(s.deadline, kSchedDeadline, n.value);
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
    if (Micros maint = MaintAt(n); maint != kNever && s.deadline > maint) {
      SetDeadline(n, std::max(maint, now_));
      changed = true;
    }
    // The holder's latest notice always states the reasons and the price in
    // force: a reason that comes or goes (a challenger leaving a contest that
    // a floor still justifies) or a new price gives a new notice, same deadline.
    if (want != s.reasons || NoticePrice(n) != s.notice_price) changed = true;
    s.reasons = want;
    if (changed) SendNotice(n);
    return changed;
  }

  // The challenger `slot` no longer contests node n.
  void DetachChallenger(uint32_t slot, NodeId n, bool holder_won) {
    Order& o = orders_[slot];
    auto it = std::find(o.claims.begin(), o.claims.end(), n);
    if (it != o.claims.end()) o.claims.erase(it);
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
  void ReleaseClaims(uint32_t slot) {
    std::vector<NodeId> claims;
    claims.swap(orders_[slot].claims);
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
  void DropGang(uint32_t slot, bool cooldown) {
    Order& o = orders_[slot];
    ReleaseClaims(slot);
    o.state = OrderState::kResting;
    Event e;
    e.type = EventType::kGangDropped;
    e.order = o.id;
    e.tenant = o.tenant;
    if (cooldown) {
      ScheduleErase(o.cooldown_until, kSchedCooldown, o.id.value);
      o.cooldown_until = SatAdd(now_, params_.grace);
      if (o.cooldown_until > now_) ScheduleAdd(o.cooldown_until, kSchedCooldown, o.id.value);
    }
    e.deadline = o.cooldown_until;
    Emit(e);
    if (o.in_book) BookErase(o);
    BookInsert(o, kFlagGang);
  }

  // The deadline of n has come.
  void ResolveDeadline(NodeId n) {
    NodeState& s = nodes_[n.value];
    LZ_CHECK(s.contested);
    ScheduleErase(s.deadline, kSchedDeadline, n.value);
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
      auto it = std::find(o.claims.begin(), o.claims.end(), n);
      if (it != o.claims.end()) o.claims.erase(it);
      if (o.is_gang()) {
        Event r;
        r.type = EventType::kReleased;
        r.node = n;
        r.tenant = old;
        r.reasons = reasons;
        Emit(r);
        s.order_slot = c;
        StopDecay(n);
        o.claims.push_back(n);
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
        e.price = o.requested;
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

  // ---------------------------------------------------------------- orders
  bool OutOfMoney(const Order& o, uint32_t nodes) const {
    const Tenant& t = tenants_[o.tenant.value];
    __int128 need = static_cast<__int128>(t.need) + static_cast<__int128>(nodes) * GraceCost(o.requested, params_.grace);
    return AvailableAtMost(t, now_, need);
  }

  void RemoveOrderFromTenant(Order& o) {
    Tenant& t = tenants_[o.tenant.value];
    t.orders.erase(o.id.value);
    Price rate = static_cast<Price>(std::min<__int128>(kInfPrice, static_cast<__int128>(o.requested) * o.remaining()));
    t.committed -= rate;
    t.committed_need -= static_cast<Money>(o.remaining()) * GraceCost(o.requested, params_.grace);
  }

  void ReleaseOrderSlot(uint32_t slot) {
    Order& o = orders_[slot];
    if (o.next_clip != kNever) ScheduleErase(o.next_clip, kSchedClip, o.id.value);
    if (o.cooldown_until > now_) ScheduleErase(o.cooldown_until, kSchedCooldown, o.id.value);
    if (o.spec.locality != Locality::kAny) {
      auto range = rel_to_orders_.equal_range(o.spec.rel_to.value);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == slot) {
          rel_to_orders_.erase(it);
          break;
        }
      }
    }
    order_slot_.erase(o.id.value);
    o.alive = false;
    o.claims.clear();
    o.claims.shrink_to_fit();
    free_slots_.push_back(slot);
  }

  // Cancels an open order: withdraws its claims, emits the event.
  void CancelOrderInternal(uint32_t slot, CancelReason why, bool detached = false) {
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
  void FillSingle(uint32_t slot, NodeId n, bool emit_alloc) {
    Order& o = orders_[slot];
    BookErase(o);
    TenantId tid = o.tenant;
    Price limit = o.requested;
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
    o.filled = 1;
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
  Price OwnClaimObtain(const Order& o, NodeId n) const {
    const NodeState& s = nodes_[n.value];
    if (s.order_slot == SlotOf(o)) return Floor(n);
    if (params_.min_hold > 0 && now_ < s.held_since + params_.min_hold) return kInfPrice;
    return HolderBar(n);
  }

  // Clip reference (DESIGN.md 3b): the k-th lowest obtain price over the
  // eligible nodes, for the order's own tenant. The index prices the nodes o
  // claims with o's own price in them, so those are priced apart and merged
  // with the k cheapest others.
  Price ClipReference(const Order& o) {
    if (!o.eff_scope.valid()) return kInfPrice;
    std::vector<NodeId> skip(o.claims);
    std::vector<Price> prices;
    for (NodeId n : o.claims) prices.push_back(OwnClaimObtain(o, n));
    for (uint32_t i = 0; i < o.spec.count; ++i) {
      NodeId n = BestNodeFor(o, false, &skip);
      if (!n.valid()) break;
      skip.push_back(n);
      prices.push_back(Obtain(n));
    }
    if (prices.size() < o.spec.count) return kInfPrice;
    std::nth_element(prices.begin(), prices.begin() + (o.spec.count - 1), prices.end());
    return prices[o.spec.count - 1];
  }

  // Sets effective price and clip schedule after placement or a raise.
  void ApplyClip(Order& o, Price before_effective) {
    if (o.next_clip != kNever) {
      ScheduleErase(o.next_clip, kSchedClip, o.id.value);
      o.next_clip = kNever;
    }
    if (params_.clip_alpha_ppm == 0) {
      o.effective = o.requested;
      return;
    }
    Price p = ClipReference(o);
    if (p == kInfPrice) {
      o.effective = o.requested;
      return;
    }
    Price s = std::max(MulPpmCeil(p, params_.clip_alpha_ppm), params_.tick);
    o.clip_step = s;
    o.effective = std::min(o.requested, std::max(SatAdd(p, s), before_effective));
    if (o.effective < o.requested) {
      if (params_.clip_interval == 0) {
        o.effective = o.requested;
      } else {
        o.next_clip = SatAdd(now_, params_.clip_interval);
        ScheduleAdd(o.next_clip, kSchedClip, o.id.value);
      }
    }
  }

  void ClipStep(uint32_t slot) {
    Order& o = orders_[slot];
    o.next_clip = kNever;
    Price eff = std::min(o.requested, SatAdd(o.effective, o.clip_step));
    if (params_.clip_interval == 0) eff = o.requested;
    if (eff < o.requested) {
      o.next_clip = SatAdd(now_, params_.clip_interval);
      ScheduleAdd(o.next_clip, kSchedClip, o.id.value);
    }
    SetEffective(slot, eff, o.seq);
  }

  // Changes an open order's effective price (and seq), keeping books and contests right.
  void SetEffective(uint32_t slot, Price eff, uint64_t seq) {
    Order& o = orders_[slot];
    if (o.state == OrderState::kPending) {
      if (o.in_book) {
        BookReprice(o, eff, seq);
      } else {
        o.effective = eff;
        o.seq = seq;
      }
      for (NodeId n : std::vector<NodeId>(o.claims)) {
        NodeState& s = nodes_[n.value];
        if (s.challenger == slot) {
          RefreshNode(n);
          UpdateRate(n);
          MarkDirty(n);
          // New price, same deadline; none if the price it states is unchanged
          // (a raise that clipping holds at the same effective price).
          if (s.contested && ChallengerPrice(s) >= HolderBar(n) && NoticePrice(n) != s.notice_price) SendNotice(n);
        } else if (s.order_slot == slot && EffFloor(n) > eff) {
          // A floor on a reserved node above the gang's price drops it (handled in review).
        }
      }
      if (o.is_gang()) {
        for (NodeId n : o.claims) {
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

  // ---------------------------------------------------------------- matching
  // One matching step: the highest-priority candidate that crosses acts.
  bool MatchOne() {
    while (!candidates_.empty()) {
      auto [neg_price, seq, slot] = *candidates_.begin();
      candidates_.erase(candidates_.begin());
      if (slot >= orders_.size()) continue;
      Order& o = orders_[slot];
      if (!o.alive || o.effective != -neg_price || o.seq != seq) continue;
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

  bool TrySingle(uint32_t slot) {
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
    VertexId v = o.eff_scope;
    Summary before = Summarize(books_[v.value]);
    if (o.in_book) EntryErase(o);  // Not in its book yet when just placed.
    o.state = OrderState::kPending;
    o.claims.push_back(n);
    o.book_flags = kFlagPending;
    EntryInsert(o);
    o.in_book = true;
    candidates_.emplace(-o.effective, o.seq, slot);
    BecomeChallenger(slot, n);
    AfterBookChange(v, before);
    return true;
  }

  void BecomeChallenger(uint32_t slot, NodeId n) {
    NodeState& s = nodes_[n.value];
    uint32_t prev = s.challenger;
    s.challenger = slot;
    if (prev != UINT32_MAX) {
      Order& p = orders_[prev];
      auto it = std::find(p.claims.begin(), p.claims.end(), n);
      if (it != p.claims.end()) p.claims.erase(it);
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
      if (Micros maint = MaintAt(n); maint != kNever && s.deadline > maint) SetDeadline(n, std::max(maint, now_));
      SendNotice(n);
    }
  }

  bool TryPendingToFree(uint32_t slot) {
    Order& o = orders_[slot];
    NodeId n = BestNodeFor(o, /*free_only=*/true);
    if (!n.valid() || o.effective < Obtain(n)) return false;
    // Withdraw from the contest, then take the free node.
    LZ_CHECK(o.claims.size() == 1);
    NodeId contested = o.claims[0];
    o.claims.clear();
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

  bool TryGang(uint32_t slot) {
    Order& o = orders_[slot];
    bool cooling = o.cooldown_until > now_;
    std::vector<NodeId> chosen;
    for (uint32_t i = 0; i < o.spec.count; ++i) {
      NodeId n = BestNodeFor(o, cooling, &chosen);
      if (!n.valid() || o.effective < Obtain(n)) return false;
      chosen.push_back(n);
    }
    if (OutOfMoney(o, o.spec.count)) {
      CancelOrderInternal(slot, CancelReason::kOutOfMoney);
      return true;
    }
    BookErase(o);
    o.state = OrderState::kPending;
    for (NodeId n : chosen) {
      NodeState& s = nodes_[n.value];
      o.claims.push_back(n);
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
  bool CompleteGangs() {
    if (gangs_to_check_.empty()) return false;
    bool any = false;
    std::vector<uint32_t> list;
    list.swap(gangs_to_check_);
    for (uint32_t slot : list) {
      Order& o = orders_[slot];
      if (!o.alive || o.state != OrderState::kPending || !o.is_gang()) continue;
      // A floor above the gang's price on a reserved node drops the gang.
      bool floor_ok = true;
      for (NodeId n : o.claims) {
        if (nodes_[n.value].order_slot == slot) floor_ok = floor_ok && EffFloor(n) <= o.effective;
      }
      if (!floor_ok) {
        DropGang(slot, true);
        any = true;
        continue;
      }
      bool all = o.claims.size() == o.spec.count;
      for (NodeId n : o.claims) all = all && nodes_[n.value].order_slot == slot;
      if (!all) continue;
      std::vector<NodeId> claims = o.claims;
      TenantId tid = o.tenant;
      Price limit = o.requested;
      for (NodeId n : claims) {
        Event e;
        e.type = EventType::kAllocated;
        e.node = n;
        e.tenant = tid;
        e.order = o.id;
        e.price = limit;
        Emit(e);
      }
      o.claims.clear();
      RemoveOrderFromTenant(o);
      o.state = OrderState::kFilled;
      o.filled = o.spec.count;
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

  // ---------------------------------------------------------------- floors
  bool PolicyCovers(const Policy& p, NodeId n) const {
    auto covers = [&](const FloorTarget& t) {
      if (t.node.valid()) return t.node == n;
      return topo_.LocationContains(t.location, topo_.node(n).rack);
    };
    return std::visit(
        [&](const auto& s) -> bool {
          using T = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<T, StaticFloorSpec> || std::is_same_v<T, MaintenanceSpec>) {
            return covers(s.target);
          } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
            return topo_.LocationContains(s.row, topo_.node(n).rack);
          } else {
            return topo_.LocationContains(s.location, topo_.node(n).rack);
          }
        },
        p.spec);
  }

  Price PolicyFloor(const Policy& p, NodeId n) const {
    return std::visit(
        [&](const auto& s) -> Price {
          using T = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<T, StaticFloorSpec>) {
            return s.price;
          } else if constexpr (std::is_same_v<T, MaintenanceSpec>) {
            return (now_ >= p.maint_start && now_ < s.end) ? kInfPrice : 0;
          } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
            return p.power_floor;
          } else {
            int64_t intensity = 0;
            for (auto [from, v] : s.series) {
              if (from <= now_) intensity = v;
              else break;
            }
            __int128 f = static_cast<__int128>(intensity) * topo_.node(n).meta.power_w * s.price_per_tonne;
            f = (f + 999'999'999) / 1'000'000'000;  // g/kWh x W x per-tonne: ceil to micro-units per hour.
            return f >= kInfPrice ? kInfPrice : static_cast<Price>(f);
          }
        },
        p.spec);
  }

  // Maintenance start whose notice phase has begun for n, or kNever.
  Micros MaintFor(NodeId n) const {
    Micros best = kNever;
    for (const Policy& p : policies_) {
      if (!p.alive) continue;
      const auto* m = std::get_if<MaintenanceSpec>(&p.spec);
      if (!m || now_ >= m->end || now_ < SatAdd(p.maint_start, -params_.grace)) continue;
      if (!PolicyCovers(p, n)) continue;
      best = std::min(best, p.maint_start);
    }
    return best;
  }

  // The maximum of the policy floors on n, without maintenance windows if
  // `with_maintenance` is false (for the `floor` reason inside a window).
  Price PolicyFloors(NodeId n, bool with_maintenance) const {
    Price f = 0;
    for (const Policy& p : policies_) {
      if (!p.alive || (!with_maintenance && std::holds_alternative<MaintenanceSpec>(p.spec))) continue;
      if (PolicyCovers(p, n)) f = std::max(f, PolicyFloor(p, n));
    }
    return f;
  }
  Price FloorBesideMaintenance(NodeId n) const { return PolicyFloors(n, /*with_maintenance=*/false); }

  void RecomputeFloor(NodeId n) {
    NodeState& s = nodes_[n.value];
    if (!s.alive) return;
    Price f = PolicyFloors(n, /*with_maintenance=*/true);
    Micros maint = MaintFor(n);
    if (f == s.base_floor && maint == MaintAt(n)) return;
    s.base_floor = f;
    SetMaintAt(n, maint);
    RefreshNode(n);
    if (s.holder.valid()) {
      UpdateRate(n);
      MarkDirty(n);
    } else if (s.order_slot != UINT32_MAX) {
      gangs_to_check_.push_back(s.order_slot);
    }
  }

  void RecomputeFloorsUnder(const Policy& p) {
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].alive && PolicyCovers(p, NodeId(i))) RecomputeFloor(NodeId(i));
    }
  }

  // Next time a policy's floors change by themselves.
  Micros PolicyNextChange(const Policy& p) const {
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
          } else {
            return kNever;
          }
        },
        p.spec);
  }

  void SchedulePolicy(uint32_t id) {
    Policy& p = policies_[id];
    ScheduleErase(p.sched, kSchedPolicy, id);
    p.sched = p.alive ? PolicyNextChange(p) : kNever;
    ScheduleAdd(p.sched, kSchedPolicy, id);
  }

  // The power of the row's held nodes that stay, and whether any is leaving:
  // a node is leaving when its holder's limit is below its floor (rule 2) and
  // no single pending challenger reaches that floor (the node would move to
  // it and keep drawing power). Reserved nodes sit idle and do not count.
  int64_t StayingPower(LocationId row, bool* leaving_any) const {
    int64_t sum = 0;
    *leaving_any = false;
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
      const NodeState& s = nodes_[i];
      if (!s.alive || !s.holder.valid() || !topo_.LocationContains(row, topo_.node(NodeId(i)).rack)) continue;
      bool leaving = s.limit < s.base_floor;
      if (leaving && s.challenger != UINT32_MAX) {
        const Order& o = orders_[s.challenger];
        if (!o.is_gang() && o.effective >= s.base_floor) leaving = false;
      }
      if (leaving) *leaving_any = true;
      else sum = SatAdd(sum, topo_.node(NodeId(i)).meta.power_w);
    }
    return sum;
  }

  // One control step of an adaptive power cap (docs/MECHANISM.md): a
  // scheduled event every `interval` from the policy's creation, so splitting
  // an Advance never moves it, and evaluated before the instant's matching.
  void AdaptiveControl(uint32_t id) {
    Policy& p = policies_[id];
    const auto& spec = std::get<AdaptivePowerCapSpec>(p.spec);
    bool pending = false;
    p.staying_w = StayingPower(spec.row, &pending);
    Price floor = AdaptiveStep(spec, p.power_floor, p.staying_w, pending);
    p.next_step = SatAdd(p.next_step, spec.interval);
    if (floor != p.power_floor) {
      p.power_floor = floor;
      RecomputeFloorsUnder(p);
    }
  }

  // Re-evaluates power-cap floors from committed power. True if any floor changed.
  bool EvaluatePower() {
    if (!power_dirty_) return false;
    power_dirty_ = false;
    bool changed = false;
    for (uint32_t id = 0; id < policies_.size(); ++id) {
      Policy& p = policies_[id];
      const auto* pc = std::get_if<PowerCapSpec>(&p.spec);
      if (!p.alive || !pc) continue;
      int64_t committed = 0;
      for (uint32_t i = 0; i < nodes_.size(); ++i) {
        const NodeState& s = nodes_[i];
        if (!s.alive || !s.holder.valid()) continue;  // Reserved nodes sit idle until their gang starts.
        if (topo_.LocationContains(pc->row, topo_.node(NodeId(i)).rack)) committed += topo_.node(NodeId(i)).meta.power_w;
      }
      Ppm util = pc->cap_w > 0 ? static_cast<Ppm>(static_cast<__int128>(committed) * kPpm / pc->cap_w) : kPpm;
      Price floor = 0;
      for (auto [threshold, price] : pc->steps) {
        if (util >= threshold) floor = price;
      }
      if (floor != p.power_floor) {
        p.power_floor = floor;
        RecomputeFloorsUnder(p);
        changed = true;
      }
    }
    return changed;
  }

  // ---------------------------------------------------------------- decay
  Micros DecayCrossing(uint32_t i) const {
    const NodeState& s = nodes_[i];
    if (!s.decaying || s.holder.valid() || s.order_slot != UINT32_MAX || params_.decay_beta == 0) return kNever;
    auto [paid, released_at] = decay_state_.at(i);
    Price eff = EffFloor(NodeId(i));
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
    __int128 d = (need + params_.decay_beta - 1) / params_.decay_beta;
    __int128 t = released_at + d;
    // A crossing at or before now was applied when the keys were refreshed.
    return t >= kNever || t <= now_ ? kNever : static_cast<Micros>(t);
  }

  Micros NextDecay() const {
    Micros best = kNever;
    for (uint32_t i : decaying_) best = std::min(best, DecayCrossing(i));
    return best;
  }

  // Refresh keys of decaying free nodes for the current time; drop finished ones.
  void RefreshDecay() {
    size_t w = 0;
    for (size_t r = 0; r < decaying_.size(); ++r) {
      uint32_t i = decaying_[r];
      NodeState& s = nodes_[i];
      bool active = s.alive && s.decaying && !s.holder.valid() && s.order_slot == UINT32_MAX;
      if (active) RefreshNode(NodeId(i));
      // Keep the decay while it can still matter: until P - decay reaches 0
      // (the floor below may fall later, DESIGN.md 9b).
      bool running = false;
      if (active) {
        auto [paid, released_at] = decay_state_.at(i);
        __int128 dec = static_cast<__int128>(params_.decay_beta) * (now_ - released_at) / kMicrosPerSecond;
        running = dec < paid;
      }
      if (running) {
        decaying_[w++] = i;
      } else if (!s.holder.valid()) {
        StopDecay(NodeId(i));
      }
    }
    decaying_.resize(w);
  }

  // ---------------------------------------------------------------- price events
  void TouchVertex(VertexId v) {
    if (vertex_touched_.size() < topo_.vertex_count()) vertex_touched_.resize(topo_.vertex_count(), 0);
    if (!vertex_touched_[v.value]) {
      vertex_touched_[v.value] = 1;
      touched_vertices_.push_back(v.value);
    }
  }
  void TouchAncestors(VertexId v) {
    for (; v.valid(); v = V(v).parent) TouchVertex(v);
  }
  void EmitPriceChanges() {
    EnsureIndex();  // A rebuild marks vertices itself: do it before reading the list.
    if (last_quote_.size() < topo_.vertex_count()) last_quote_.resize(topo_.vertex_count(), kInfPrice);
    std::sort(touched_vertices_.begin(), touched_vertices_.end());
    for (uint32_t v : touched_vertices_) {
      vertex_touched_[v] = 0;
      Price q = QuoteOf(VertexId(v));
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

  Price QuoteOf(VertexId v) {
    EnsureIndex();
    const TypeIndex& ix = index_[V(v).type.value];
    auto [lo, hi] = topo_.Range(v);
    auto none = [](uint32_t) { return false; };
    uint32_t leaf = FindBest(ix, lo, hi, none);
    return leaf == UINT32_MAX ? kInfPrice : ix.obtain(leaf);
  }

  // ---------------------------------------------------------------- the instant
  // Runs everything due at now_ until nothing changes (DESIGN.md 3b "One instant").
  // Then settles the rates that changed, unless `settle_rates` is false: the
  // instant of a call's own time is settled once, after the call's operation.
  void RunInstant(bool settle_rates = true) {
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
        for (uint32_t t : list) exhaust_flag_[t] = 0;
        for (uint32_t t : list) {
          changed |= ReviewExhaustion(t);
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
  void RunDue() {
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
    std::stable_sort(due.begin(), due.end(), [](const SchedKey& a, const SchedKey& b) {
      return (a.kind == kSchedClip) > (b.kind == kSchedClip);
    });
    for (const SchedKey& k : due) {
      switch (k.kind) {
        case kSchedClip: {
          auto it = order_slot_.find(k.id);
          if (it != order_slot_.end() && orders_[it->second].next_clip == k.time) ClipStep(it->second);
          break;
        }
        case kSchedHoldExpiry: {
          NodeState& s = nodes_[k.id];
          if (s.hold_scheduled && s.holder.valid() && s.held_since + params_.min_hold <= now_) {
            s.hold_scheduled = false;
            RefreshNode(NodeId(static_cast<uint32_t>(k.id)));
          } else if (s.hold_scheduled && s.holder.valid()) {
            // min_hold changed: re-arm at the new expiry.
            ScheduleAdd(s.held_since + params_.min_hold, kSchedHoldExpiry, k.id);
          }
          break;
        }
        case kSchedPolicy: {
          Policy& p = policies_[k.id];
          p.sched = kNever;
          if (p.alive && std::holds_alternative<AdaptivePowerCapSpec>(p.spec)) {
            AdaptiveControl(static_cast<uint32_t>(k.id));
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
          auto it = order_slot_.find(k.id);
          if (it != order_slot_.end()) {
            Order& o = orders_[it->second];
            candidates_.emplace(-o.effective, o.seq, it->second);
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

  Micros NextTime() const {
    Micros t = sched_.empty() ? kNever : sched_.begin()->time;
    return std::min(t, NextDecay());
  }

  Status AdvanceTo(Micros t) {
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

  // Every public mutating call: advance to t, then run `op`, then settle the instant.
  template <typename F>
  auto Call(Micros t, F&& op) -> decltype(op()) {
    Status s = AdvanceTo(t);
    if (!s.ok()) {
      Flush();
      return s;
    }
    auto r = op();
    RunInstant();
    Flush();
    return r;
  }

  // ---------------------------------------------------------------- validation
  Status CheckPrice(Price p, const char* field) const {
    if (p < 0) return InvalidArgument(std::string(field) + ": must not be negative");
    if (p == kInfPrice) return InvalidArgument(std::string(field) + ": must be finite");
    return Status::Ok();
  }
  Status CheckTenant(TenantId t) const {
    if (!t.valid() || t.value >= tenants_.size()) return NotFound("tenant: no tenant with id " + Num(t.value));
    return Status::Ok();
  }
  Status CheckNode(NodeId n) const {
    if (!n.valid() || n.value >= nodes_.size() || !nodes_[n.value].alive) return NotFound("node: no live node with id " + Num(n.value));
    return Status::Ok();
  }

  // Budget test (rule 7), applied when the committed rate increases.
  Status CheckBudget(const Tenant& t, __int128 add_rate, __int128 add_need) const {
    if (add_rate <= 0) return Status::Ok();
    __int128 committed = static_cast<__int128>(t.committed) + add_rate;
    if (t.max_rate != kInfPrice && committed > t.max_rate) {
      return ResourceExhausted("price: committed rate " + std::to_string(static_cast<int64_t>(std::min<__int128>(committed, kInfPrice))) +
                               " would exceed the tenant's max_rate " + std::to_string(t.max_rate));
    }
    __int128 need = static_cast<__int128>(t.committed_need) + add_need;
    if (AvailableAtMost(t, now_, need)) {
      return ResourceExhausted("price: balance " + std::to_string(Available(t, now_)) +
                               " does not cover the committed rate for one grace period (" +
                               std::to_string(static_cast<int64_t>(std::min<__int128>(need, kInfPrice))) + ")");
    }
    return Status::Ok();
  }

  Result<OrderId> Place(TenantId tid, const OrderSpec& spec) {
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

    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(orders_.size());
      orders_.emplace_back();
    }
    Order& o = orders_[slot];
    o = Order();
    o.id = OrderId(next_order_id_++);
    o.tenant = tid;
    o.spec = spec;
    o.type = sv.type;
    o.locality_loc = locality_loc;
    o.eff_scope = Narrow(spec.scope, locality_loc);
    o.requested = spec.price;
    o.seq = next_seq_++;
    o.state = OrderState::kResting;
    order_slot_.emplace(o.id.value, slot);
    t.orders.insert(o.id.value);
    t.committed = static_cast<Price>(std::min<__int128>(kInfPrice, t.committed + add_rate));
    t.committed_need = static_cast<Money>(std::min<__int128>(kInfPrice, t.committed_need + add_need));
    if (spec.locality != Locality::kAny) rel_to_orders_.emplace(spec.rel_to.value, slot);
    ApplyClip(o, 0);
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
  VertexId Narrow(VertexId scope, LocationId loc) const {
    if (!loc.valid()) return scope;
    const topology::Vertex& sv = V(scope);
    if (sv.level == Level::kNode) return topo_.LocationContains(loc, sv.location) ? scope : VertexId();
    if (topo_.LocationContains(sv.location, loc)) return topo_.VertexAt(sv.type, loc);
    if (topo_.LocationContains(loc, sv.location)) return scope;
    return VertexId();
  }

  // After nodes are added, orders waiting for their locality vertex may now have one.
  void ResolveWaitingOrders() {
    if (unmatchable_.empty()) return;
    std::vector<uint32_t> waiting;
    waiting.swap(unmatchable_);
    for (uint32_t slot : waiting) {
      Order& o = orders_[slot];
      if (!o.alive) continue;
      o.in_book = false;
      o.eff_scope = Narrow(o.spec.scope, o.locality_loc);
      BookInsert(o, o.book_flags);
    }
  }

  Result<uint32_t> FindOwnOrder(TenantId tid, OrderId id) const {
    LZ_RETURN_IF_ERROR(CheckTenant(tid));
    auto it = order_slot_.find(id.value);
    if (it == order_slot_.end()) return NotFound("order: no open order with id " + Num(id.value));
    if (orders_[it->second].tenant != tid) return PermissionDenied("order: order " + Num(id.value) + " belongs to another tenant");
    return it->second;
  }

  Status Update(TenantId tid, OrderId id, Price price) {
    LZ_ASSIGN_OR_RETURN(uint32_t slot, FindOwnOrder(tid, id));
    LZ_RETURN_IF_ERROR(CheckPrice(price, "price"));
    Order& o = orders_[slot];
    Tenant& t = tenants_[tid.value];
    __int128 rem = o.remaining();
    __int128 add_rate = (static_cast<__int128>(price) - o.requested) * rem;
    __int128 add_need = rem * (GraceCost(price, params_.grace) - GraceCost(o.requested, params_.grace));
    LZ_RETURN_IF_ERROR(CheckBudget(t, add_rate, add_need));
    t.committed = static_cast<Price>(t.committed + add_rate);
    t.committed_need = static_cast<Money>(t.committed_need + add_need);
    if (price > o.requested) {
      o.requested = price;
      Price before = o.effective;
      uint64_t seq = next_seq_++;
      // Clip from the current effective price; the order gets a new sequence number.
      Price eff_before = o.effective;
      ApplyClip(o, eff_before);
      Price eff = o.effective;
      o.effective = before;
      SetEffective(slot, eff, seq);
    } else if (price < o.requested) {
      o.requested = price;
      if (o.effective > price) {
        if (o.next_clip != kNever) {
          ScheduleErase(o.next_clip, kSchedClip, o.id.value);
          o.next_clip = kNever;
        }
        SetEffective(slot, price, o.seq);
      }
    }
    return Status::Ok();
  }

  Status SetLimitImpl(TenantId tid, NodeId n, Price limit) {
    LZ_RETURN_IF_ERROR(CheckTenant(tid));
    LZ_RETURN_IF_ERROR(CheckNode(n));
    LZ_RETURN_IF_ERROR(CheckPrice(limit, "limit"));
    NodeState& s = nodes_[n.value];
    if (s.holder != tid) return PermissionDenied("node: the tenant does not hold node " + topo_.node(n).name);
    Tenant& t = tenants_[tid.value];
    Money old_cost = GraceCost(s.limit, params_.grace), new_cost = GraceCost(limit, params_.grace);
    LZ_RETURN_IF_ERROR(CheckBudget(t, static_cast<__int128>(limit) - s.limit, new_cost - old_cost));
    if (limit == s.limit) return Status::Ok();
    t.committed += limit - s.limit;
    t.committed_need += new_cost - old_cost;
    t.need += new_cost - old_cost;
    s.limit = limit;
    RefreshNode(n);
    UpdateRate(n);
    if (s.contested || Floor(n) > limit || t.exhausted) MarkDirty(n);
    if (limit < s.limit || true) {
      // Lowering may let a resting order cross; RefreshNode already queued candidates.
    }
    MarkExhaustDirty(tid);
    return Status::Ok();
  }

  Status RelinquishImpl(TenantId tid, NodeId n) {
    LZ_RETURN_IF_ERROR(CheckTenant(tid));
    LZ_RETURN_IF_ERROR(CheckNode(n));
    NodeState& s = nodes_[n.value];
    if (s.holder != tid) return PermissionDenied("node: the tenant does not hold node " + topo_.node(n).name);
    uint32_t c = s.challenger;
    uint8_t reasons = s.reasons | kReasonRelinquish;
    if (c != UINT32_MAX) {
      // The node moves at once to the pending challenger (or stays reserved for its gang).
      s.challenger = UINT32_MAX;
      if (s.contested) ScheduleErase(s.deadline, kSchedDeadline, n.value);
      s.contested = false;
      s.reasons = 0;
      EndHolding(n);
      Order& o = orders_[c];
      auto it = std::find(o.claims.begin(), o.claims.end(), n);
      if (it != o.claims.end()) o.claims.erase(it);
      if (o.is_gang()) {
        Event r;
        r.type = EventType::kReleased;
        r.node = n;
        r.tenant = tid;
        r.reasons = reasons;
        Emit(r);
        s.order_slot = c;
        StopDecay(n);
        o.claims.push_back(n);
        gangs_to_check_.push_back(c);
        RefreshNode(n);
      } else {
        Event e;
        e.type = EventType::kTransferred;
        e.node = n;
        e.tenant = o.tenant;
        e.other = tid;
        e.order = o.id;
        e.price = o.requested;
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
};

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
    m.books_.Resize(m.topo_.vertex_count());
    NodeState& s = m.nodes_[n.value];
    s.alive = true;
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
    for (const BookEntry& e : m.books_[leaf.value]) gone.push_back(e.slot);
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
    if (old.grace != params.grace) {
      // Grace costs of every limit and open order change.
      for (uint32_t i = 0; i < m.tenants_.size(); ++i) {
        Tenant& t = m.tenants_[i];
        t.need = 0;
        t.committed_need = 0;
        for (NodeId n : t.nodes) t.need += GraceCost(m.nodes_[n.value].limit, params.grace);
        t.committed_need = t.need;
        for (uint64_t id : t.orders) {
          const Order& o = m.orders_[m.order_slot_.at(id)];
          t.committed_need += static_cast<Money>(o.remaining()) * GraceCost(o.requested, params.grace);
        }
        m.MarkExhaustDirty(TenantId(i));
      }
      for (uint32_t id = 0; id < m.policies_.size(); ++id) m.SchedulePolicy(id);
    }
    if (old.min_hold != params.min_hold) {
      for (uint32_t i = 0; i < m.nodes_.size(); ++i) {
        NodeState& s = m.nodes_[i];
        if (!s.holder.valid()) continue;
        if (s.hold_scheduled) m.ScheduleErase(s.held_since + old.min_hold, kSchedHoldExpiry, i);
        s.hold_scheduled = params.min_hold > 0 && s.held_since + params.min_hold > m.now_;
        if (s.hold_scheduled) m.ScheduleAdd(s.held_since + params.min_hold, kSchedHoldExpiry, i);
      }
    }
    if (old.clip_interval != params.clip_interval && params.clip_interval == 0) {
      // Steps already set stand; at that step the order is lifted to its requested price.
    }
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
    } else if (const auto* s = std::get_if<CarbonSpec>(&spec)) {
      if (!s->location.valid() || s->location.value >= m.topo_.location_count()) {
        return NotFound("location: no location with id " + Num(s->location.value));
      }
      if (s->price_per_tonne < 0) return InvalidArgument("price_per_tonne: must not be negative");
      Micros last = std::numeric_limits<Micros>::min();
      for (auto [from, v] : s->series) {
        if (from <= last) return InvalidArgument("series: times must be strictly ascending");
        if (v < 0) return InvalidArgument("series: intensity must not be negative");
        last = from;
      }
    }
    uint32_t id = static_cast<uint32_t>(m.policies_.size());
    m.policies_.push_back(std::move(p));
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
    m.SchedulePolicy(id.value);
    m.RecomputeFloorsUnder(p);
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

Result<OrderId> MarketEngine::PlaceOrder(Micros t, TenantId tenant, const OrderSpec& spec) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpPlaceOrder{tenant, spec});
  auto result = m.Call(t, [&]() -> Result<OrderId> { return m.Place(tenant, spec); });
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
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpSetLimit{tenant, node, limit});
  auto result = m.Call(t, [&]() -> Status { return m.SetLimitImpl(tenant, node, limit); });
  return m.Observed(t, body, std::move(result));
}

Status MarketEngine::Relinquish(Micros t, TenantId tenant, NodeId node) {
  Impl& m = *impl_;
  std::optional<OpBody> body;
  if (m.observer_) body.emplace(OpRelinquish{tenant, node});
  auto result = m.Call(t, [&]() -> Status { return m.RelinquishImpl(tenant, node); });
  return m.Observed(t, body, std::move(result));
}

void MarketEngine::Compact() {
  Impl& m = *impl_;
  m.EnsureIndex();
  m.nodes_.shrink_to_fit();
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
  q.deadline = s.contested ? s.deadline : 0;
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
  v.held_since = s.holder.valid() ? s.held_since : 0;
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
  auto it = m.order_slot_.find(order.value);
  if (it == m.order_slot_.end()) return NotFound("order: no open order with id " + Num(order.value));
  const Order& o = m.orders_[it->second];
  OrderView v;
  v.id = o.id;
  v.tenant = o.tenant;
  v.spec = o.spec;
  v.spec.price = o.requested;
  v.effective_scope = o.eff_scope;
  v.effective_price = o.effective;
  v.state = o.state;
  v.seq = o.seq;
  v.filled = o.filled;
  v.cooldown_until = o.cooldown_until;
  v.claims = o.claims;
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
  for (uint64_t id : t.orders) v.orders.push_back(OrderId(id));
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
  }
  v.staying_w = p.staying_w;
  v.next_step = p.alive ? p.next_step : kNever;
  return v;
}

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
  for (const auto& [id, slot] : impl_->order_slot_) ids.push_back(OrderId(id));
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace laissez::market
