// Engine snapshots (docs/SNAPSHOT.md): MarketEngine::Snapshot writes an image
// of every piece of state that determines the engine's future behaviour, and
// MarketEngine::Restore rebuilds an engine from one, so that a restored engine
// fed the same later calls gives exactly the events, state and re-snapshot of
// the original.
//
// Each logical record (a node, an order, a tenant, a policy, ...) lists its
// fields once, in a `Fields` function that both the writer and the reader
// visit: a change to a struct's layout touches only that list. Topology is written as
// the nodes' NodeInfo in id order and rebuilt by re-adding them, which gives
// the same node, location and vertex ids. Derived tables (name maps, the
// policies-by-location lists, order_slot_) are rebuilt on load; tables whose
// exact contents or iteration order steer behaviour (books, the schedule,
// rel_to_orders_, the index's cached keys, work lists) are written as they are.
// Of the ledger history only the last `ledger_tail` entries are written (the
// totals always): nothing in the engine reads it back, and it grows with the
// market's age.
// Member functions of MarketEngine (state: engine_impl.h).
#include "market/engine/engine_impl.h"

#include "common/fnv.h"

namespace laissez::market {
namespace {

constexpr char kMagic[8] = {'L', 'Z', 'E', 'N', 'G', 'S', 'N', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = sizeof(kMagic) + 4 + 8;  // Magic, version, payload length.
constexpr size_t kTrailer = 8;                      // FNV-1a 64 of the payload.

// A book entry as the image holds it: with its order's seq, which the
// in-memory entry reads from the order (BookEntry; issue 12), so the image
// is the same as when the entry carried it.
struct BookEntryImage {
  Price price = 0;
  uint64_t seq = 0;
  uint32_t slot = 0;
  uint32_t tenant = 0;
  uint8_t flags = 0;
};

void PutFixed(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetFixed(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// The records that list their fields in a `Fields` function below.
template <typename T>
concept HasFields = std::is_same_v<T, MarketParams> || std::is_same_v<T, OrderSpec> ||
                    std::is_same_v<T, FloorTarget> ||
                    std::is_same_v<T, Policy> || std::is_same_v<T, BookEntryImage> || std::is_same_v<T, LedgerEntry> ||
                    std::is_same_v<T, SchedKey>;

// Varints (LEB128); signed values zigzag-encoded; ids as value + 1 (0: invalid).
// F(field) writes a field by its type (Reader::F reads it back).
class Writer {
 public:
  std::string out;
  void U(uint64_t v) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
  }
  void S(int64_t v) { U((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void B(bool v) { U(v ? 1 : 0); }
  void I128(__int128 v) {
    S(static_cast<int64_t>(v >> 64));
    U(static_cast<uint64_t>(v));
  }
  void Str(std::string_view s) {
    U(s.size());
    out.append(s);
  }
  template <typename Tag, typename Rep>
  void Id(StrongId<Tag, Rep> id) {
    U(id.valid() ? static_cast<uint64_t>(id.value) + 1 : 0);
  }
  void F(int64_t v) { S(v); }
  void F(int32_t v) { S(v); }
  void F(uint64_t v) { U(v); }
  void F(uint32_t v) { U(v); }
  void F(uint16_t v) { U(v); }
  void F(uint8_t v) { U(v); }
  void F(bool v) { B(v); }
  void F(__int128 v) { I128(v); }
  void F(const std::string& v) { Str(v); }
  template <typename Tag, typename Rep>
  void F(StrongId<Tag, Rep> id) {
    Id(id);
  }
  template <typename E>
    requires std::is_enum_v<E>
  void F(E e) {
    static_assert(sizeof(E) == 1);
    U(static_cast<uint64_t>(e));
  }
  template <typename A, typename B>
  void F(const std::pair<A, B>& p) {
    F(p.first);
    F(p.second);
  }
  template <typename T>
  void F(const std::vector<T>& v) {
    U(v.size());
    for (const auto& x : v) F(x);
  }
  template <typename T>
  void F(const T& record)
    requires HasFields<T>;
  void F(const PolicySpec& spec);
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  // The section being read, for error messages.
  const char* section = "header";
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  bool at_end() const { return pos_ == in_.size(); }
  void Fail(const std::string& why) {
    if (error_.empty()) error_ = std::string(section) + ": " + why;
    pos_ = in_.size();
  }
  uint64_t U() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) {
        Fail("truncated");
        return 0;
      }
      uint8_t c = static_cast<uint8_t>(in_[pos_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    Fail("varint too long");
    return 0;
  }
  int64_t S() {
    uint64_t u = U();
    return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
  }
  bool B() { return U() != 0; }
  uint32_t U32() {
    uint64_t v = U();
    if (v > UINT32_MAX) Fail("value out of range");
    return static_cast<uint32_t>(v);
  }
  uint8_t U8() {
    uint64_t v = U();
    if (v > UINT8_MAX) Fail("value out of range");
    return static_cast<uint8_t>(v);
  }
  __int128 I128() {
    __int128 hi = S();
    return (hi << 64) | static_cast<__int128>(U());
  }
  std::string Str() {
    uint64_t n = U();
    if (n > in_.size() - pos_) {
      Fail("truncated string");
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  template <typename I>
  I Id() {
    uint64_t v = U();
    I id;
    if (v == 0) return id;
    if (v - 1 >= I::kInvalidValue) Fail("id out of range");
    id.value = static_cast<typename I::rep>(v - 1);
    return id;
  }
  // A count of items of at least one byte each: never more than the bytes left.
  size_t Count() {
    uint64_t n = U();
    if (n > in_.size() - pos_) Fail("count exceeds the image");
    return ok() ? static_cast<size_t>(n) : 0;
  }
  // An index into a table of `size` entries.
  uint32_t Index(size_t size, const char* what) {
    uint64_t v = U();
    if (v >= size) Fail(std::string(what) + " " + std::to_string(v) + " out of range (" + std::to_string(size) + ")");
    return ok() ? static_cast<uint32_t>(v) : 0;
  }
  void F(int64_t& v) { v = S(); }
  void F(int32_t& v) {
    int64_t x = S();
    if (x < INT32_MIN || x > INT32_MAX) Fail("value out of range");
    v = static_cast<int32_t>(x);
  }
  void F(uint64_t& v) { v = U(); }
  void F(uint32_t& v) { v = U32(); }
  void F(uint16_t& v) {
    uint64_t x = U();
    if (x > UINT16_MAX) Fail("value out of range");
    v = static_cast<uint16_t>(x);
  }
  void F(uint8_t& v) { v = U8(); }
  void F(bool& v) { v = B(); }
  void F(__int128& v) { v = I128(); }
  void F(std::string& v) { v = Str(); }
  template <typename Tag, typename Rep>
  void F(StrongId<Tag, Rep>& id) {
    id = Id<StrongId<Tag, Rep>>();
  }
  template <typename E>
    requires std::is_enum_v<E>
  void F(E& e) {
    e = static_cast<E>(U8());
  }
  template <typename A, typename B>
  void F(std::pair<A, B>& p) {
    F(p.first);
    F(p.second);
  }
  template <typename T>
  void F(std::vector<T>& v) {
    v.resize(Count());
    for (auto& x : v) F(x);
  }
  template <typename T>
  void F(T& record)
    requires HasFields<T>;
  void F(PolicySpec& spec);

 private:
  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- Logical records. ----
// Each record's fields are listed once, in `Fields(record, visitor)`: the
// Writer visits them to write, the Reader to read (the F overloads above and
// below pick the encoding by the field's type). A layout change touches only
// the record's list.

template <typename V, typename P>
void Fields(V& v, P& p) requires std::is_same_v<std::remove_const_t<P>, MarketParams> {
  v.F(p.grace);
  v.F(p.hysteresis_ppm);
  v.F(p.tick);
  v.F(p.clip_alpha_ppm);
  v.F(p.clip_interval);
  v.F(p.decay_beta);
  v.F(p.min_hold);
}

// A node's state and its cold part (NodeCold), in the order they had when
// they were one struct.
template <typename V, typename S, typename C>
void NodeFields(V& v, S& s, C& c) {
  v.F(s.holder);
  v.F(s.order_slot);
  v.F(s.limit);
  v.F(c.held_since);
  v.F(c.deadline);
  v.F(c.notice_price);
  v.F(s.challenger);
  v.F(c.tenant_pos);  // In NodeCold since issue 12; written in its old place.
  v.F(s.base_floor);
  v.F(s.rate);
  v.F(s.paid_rate);
  v.F(s.acc_since);
  v.F(s.carry);
  v.F(s.reasons);
  // Bit-fields (NodeState): through copies.
  bool flags[5] = {s.contested, s.alive, s.hold_scheduled, s.decaying, s.in_maint};
  for (bool& f : flags) v.F(f);
  if constexpr (!std::is_const_v<S>) {
    s.contested = flags[0];
    s.alive = flags[1];
    s.hold_scheduled = flags[2];
    s.decaying = flags[3];
    s.in_maint = flags[4];
  }
}

template <typename V, typename S>
void Fields(V& v, S& s) requires std::is_same_v<std::remove_const_t<S>, OrderSpec> {
  v.F(s.scope);
  v.F(s.price);
  v.F(s.count);
  v.F(s.locality);
  v.F(s.rel_to);
}

// An order's record, its prices by slot (Impl::placed_, clip_step_, and the
// requested price: Impl::Requested) and its rare fields (OrderCold, default
// when it has none), in the order they had when they were all in one struct.
struct OrderSlotPrices {
  Price placed = -1;   // Written: Impl::PlacedPrice. Read: -1 when it is the requested price.
  Price clip_step = 0;
  Price requested = 0;  // Impl::Requested: the record's effective price or the one kept apart.
  // The fields the record may keep apart, or derives (issue 12): Impl::Count,
  // Impl::OrderType (read: checked against the scope's by the caller), Impl::Seq.
  uint32_t count = 1;
  TypeId type;
  uint64_t seq = 0;
};
template <typename V, typename O, typename C>
void OrderFields(V& v, O& o, C& c, OrderSlotPrices& sp) {
  constexpr bool kRead = !std::is_const_v<O>;
  Price& placed = sp.placed;
  // The small fields are bit-fields (Order): through copies, checked before
  // they are stored.
  Locality locality = o.locality;
  OrderState state = o.state;
  bool in_book = o.in_book, alive = o.alive;
  uint8_t book_flags = o.book_flags;
  // The effective scope: the scope, or OrderCold's with a locality location.
  VertexId eff_scope = o.narrowed ? c.eff_scope : o.scope;
  v.F(o.id);
  v.F(o.tenant);
  v.F(o.scope);  // The OrderSpec: scope, price, count, locality, rel_to.
  v.F(placed);  // Read: checked below, once `requested` is known.
  v.F(sp.count);
  v.F(locality);
  if constexpr (kRead) {
    if (locality > Locality::kSameRack) v.Fail("locality " + Num(static_cast<uint8_t>(locality)) + " unknown");
    else o.locality = locality;
  }
  v.F(c.rel_to);
  v.F(sp.type);
  v.F(eff_scope);
  v.F(c.locality_loc);
  if constexpr (kRead) {
    if (c.locality_loc.valid()) {
      c.eff_scope = eff_scope;
      o.narrowed = true;
    } else if (eff_scope != o.scope) {
      v.Fail("order " + Num(o.id.value) + ": effective scope " + Num(eff_scope.value) + " differs from its scope " +
             Num(o.scope.value) + " without a locality location");
    }
  }
  v.F(sp.requested);
  v.F(o.effective);
  v.F(sp.clip_step);
  v.F(c.next_clip);
  v.F(sp.seq);
  v.F(state);
  if constexpr (kRead) {
    if (state > OrderState::kCancelled) v.Fail("order state " + Num(static_cast<uint8_t>(state)) + " unknown");
    else o.state = state;
  }
  // Not stored: derived from the state (all or nothing).
  const uint32_t filled_now = o.state == OrderState::kFilled ? sp.count : 0;
  uint32_t filled = filled_now;
  v.F(filled);
  if constexpr (kRead) {
    if (filled != filled_now) v.Fail("order " + Num(o.id.value) + ": filled count " + Num(filled) + " does not match its state");
  }
  v.F(c.cooldown_until);
  v.F(in_book);
  v.F(book_flags);
  v.F(c.claims);
  v.F(alive);
  if constexpr (kRead) {
    o.in_book = in_book;
    o.alive = alive;
    if (book_flags > (kFlagGang | kFlagPending)) v.Fail("order " + Num(o.id.value) + ": book flags " + Num(book_flags) + " out of range");
    else o.book_flags = book_flags;
    // Place's check (CheckPrice): an infinite placed price is refused too.
    if (const char* why = PriceProblem(placed)) v.Fail("order " + Num(o.id.value) + ": placed price " + std::to_string(placed) + ": " + why);
    if (placed == sp.requested) placed = -1;
    // ApplyClip's step is never negative (the table's -1 means none).
    if (sp.clip_step < 0) v.Fail("order " + Num(o.id.value) + ": clip step " + std::to_string(sp.clip_step) + ": negative");
  }
}

// A tenant's record; its open orders as ascending ids (Tenant::orders keeps
// their slots): written from the slots, read into `order_ids`.
template <typename V, typename T>
void TenantFields(V& v, T& t, std::vector<uint64_t>& order_ids) {
  v.F(t.name);
  v.F(t.balance);
  v.F(t.max_rate);
  v.F(t.deposited);
  v.F(t.paid);
  v.F(t.waived);
  v.F(t.nodes);
  v.F(order_ids);
  v.F(t.committed);
  v.F(t.committed_need);
  v.F(t.need);
  v.F(t.carry_sum);
  v.F(t.rate_sum);
  v.F(t.rate_time_sum);
  v.F(t.exhausted);
  v.F(t.exhaust_sched);
}

template <typename V, typename T>
void Fields(V& v, T& t) requires std::is_same_v<std::remove_const_t<T>, FloorTarget> {
  v.F(t.location);
  v.F(t.node);
}

// The policy specs, by kind (the variant's index is written before them).
template <typename V, typename S>
void SpecFields(V& v, S& s) {
  using T = std::remove_const_t<S>;
  if constexpr (std::is_same_v<T, StaticFloorSpec>) {
    Fields(v, s.target);
    v.F(s.price);
  } else if constexpr (std::is_same_v<T, PowerCapSpec>) {
    v.F(s.row);
    v.F(s.cap_w);
    v.F(s.steps);
  } else if constexpr (std::is_same_v<T, CarbonSpec>) {
    v.F(s.location);
    v.F(s.price_per_tonne);
    v.F(s.series);
  } else if constexpr (std::is_same_v<T, MaintenanceSpec>) {
    Fields(v, s.target);
    v.F(s.start);
    v.F(s.end);
  } else if constexpr (std::is_same_v<T, AdaptivePowerCapSpec> || std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
    if constexpr (std::is_same_v<T, AdaptivePowerCapSpec>) {
      v.F(s.row);
      v.F(s.cap_w);
    } else {
      v.F(s.region);
      v.F(s.budget_g_per_h);
      v.F(s.series);
    }
    v.F(s.margin_ppm);
    v.F(s.band_ppm);
    v.F(s.interval);
    v.F(s.rise_ppm);
    v.F(s.rise_min);
    v.F(s.rise_max);
    v.F(s.fall_step);
    if constexpr (std::is_same_v<T, AdaptivePowerCapSpec>) {
      v.F(s.min_floor);
      v.F(s.max_floor);
    } else {
      v.F(s.min_price);
      v.F(s.max_price);
    }
  } else {
    static_assert(sizeof(T) == 0, "a new policy kind needs its fields here");
  }
}

template <typename V, typename P>
void Fields(V& v, P& p) requires std::is_same_v<std::remove_const_t<P>, Policy> {
  v.F(p.spec);
  v.F(p.alive);
  v.F(p.maint_start);
  v.F(p.power_floor);
  v.F(p.staying_w);
  v.F(p.next_step);
  v.F(p.sched);
}

template <typename V, typename E>
void Fields(V& v, E& e) requires std::is_same_v<std::remove_const_t<E>, BookEntryImage> {
  v.F(e.price);
  v.F(e.seq);
  v.F(e.slot);
  v.F(e.tenant);
  v.F(e.flags);
  if constexpr (!std::is_const_v<E>) {
    if (e.slot >= kMaxOrderSlots || e.flags > (kFlagGang | kFlagPending)) v.Fail("book entry slot or flags out of range");
  }
}

template <typename V, typename E>
void Fields(V& v, E& e) requires std::is_same_v<std::remove_const_t<E>, LedgerEntry> {
  v.F(e.time);
  v.F(e.from);
  v.F(e.tenant);
  v.F(e.node);
  v.F(e.rate);
  v.F(e.amount);
  v.F(e.waived);
}

template <typename V, typename K>
void Fields(V& v, K& k) requires std::is_same_v<std::remove_const_t<K>, SchedKey> {
  v.F(k.time);
  v.F(k.kind);
  v.F(k.id);
}

// Records, and the policy variant, through their field lists.
template <typename T>
void Writer::F(const T& record)
  requires HasFields<T>
{
  Fields(*this, record);
}
template <typename T>
void Reader::F(T& record)
  requires HasFields<T>
{
  Fields(*this, record);
}
void Writer::F(const PolicySpec& spec) {
  U(spec.index());
  std::visit([&](const auto& s) { SpecFields(*this, s); }, spec);
}
template <size_t I = 0>
void ReadSpec(Reader& r, size_t kind, PolicySpec& spec) {
  if constexpr (I < std::variant_size_v<PolicySpec>) {
    if (kind == I) {
      SpecFields(r, spec.emplace<I>());
    } else {
      ReadSpec<I + 1>(r, kind, spec);
    }
  } else {
    r.Fail("policy kind " + std::to_string(kind) + " unknown");
  }
}
void Reader::F(PolicySpec& spec) { ReadSpec(*this, U(), spec); }

// A record read on its own, with the enums checked.
template <typename T>
T Read(Reader& r) {
  T record{};
  r.F(record);
  return record;
}

// The sorted (key, value) pairs of an unordered map, for a deterministic image.
template <typename M>
auto Sorted(const M& m) {
  std::vector<std::pair<typename M::key_type, typename M::mapped_type>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

std::string MarketEngine::Snapshot(size_t ledger_tail) const {
  const Impl& m = *impl_;
  const Topology& topo = m.topo_;
  Writer w;
  w.out.reserve(64 + m.nodes_.size() * 48 + m.order_slot_.size() * 48);

  // Options, parameters, clock and counters.
  w.B(m.options_.price_events);
  w.B(m.options_.retain_ledger);
  w.F(m.params_);
  w.S(m.now_);
  w.U(m.next_seq_);
  w.U(m.next_order_id_);

  // Topology: types, locations (in id order: parent before child) and nodes.
  w.U(topo.type_count());
  for (size_t t = 0; t < topo.type_count(); ++t) w.Str(topo.type_name(TypeId(static_cast<uint16_t>(t))));
  w.U(topo.location_count());
  for (size_t l = 1; l < topo.location_count(); ++l) {
    const topology::Location& loc = topo.location(LocationId(static_cast<uint32_t>(l)));
    w.Str(loc.name);
    w.U(loc.parent.value);
  }
  w.U(topo.node_count());
  for (size_t i = 0; i < topo.node_count(); ++i) {
    const topology::Node& n = topo.node(NodeId(static_cast<uint32_t>(i)));
    w.Str(n.name);
    w.U(n.type.value);
    w.U(n.rack.value);
    w.S(n.meta.gpus);
    w.S(n.meta.memory_gb);
    w.S(n.meta.power_w);
    w.B(n.alive);
  }

  // Per-node state.
  for (size_t i = 0; i < m.nodes_.size(); ++i) NodeFields(w, m.nodes_[i], m.node_cold_[i]);

  // Orders: every slot (free ones too, whose stale fields nothing reads but
  // which keep the slot numbering), the free list, the live-order map.
  w.U(m.orders_.size());
  for (uint32_t slot = 0; slot < m.orders_.size(); ++slot) {
    const Order& o = m.orders_[slot];
    OrderSlotPrices sp{m.PlacedPrice(slot), m.ClipStepOf(slot), m.Requested(o), m.Count(o), m.OrderType(o), m.Seq(o)};
    OrderFields(w, o, m.Cold(o), sp);
  }
  w.F(m.free_slots_);
  w.U(m.order_slot_.size());
  std::vector<std::pair<uint64_t, uint32_t>> live;
  m.order_slot_.ForEach([&](uint32_t slot) { live.emplace_back(m.orders_[slot].id.value, slot); });
  std::sort(live.begin(), live.end());
  for (auto [id, slot] : live) {
    w.U(id);
    w.U(slot);
  }
  w.F(m.unmatchable_);
  // Books, as they are (their order is the priority order).
  size_t books = 0;
  for (uint32_t v = 0; v < m.books_.size(); ++v) books += !m.books_[v].empty();
  w.U(books);
  for (uint32_t v = 0; v < m.books_.size(); ++v) {
    const auto& b = m.books_[v];
    if (b.empty()) continue;
    w.U(v);
    w.U(b.size());
    for (const BookEntry& e : b) w.F(BookEntryImage{e.price, m.Seq(m.orders_[e.slot]), e.slot, e.tenant, static_cast<uint8_t>(e.flags)});
  }
  // Orders by anchor node: keys ascending, each key's slots in iteration
  // order (which decides the order of cancellations when an anchor is lost).
  std::vector<uint32_t> anchors;
  for (const auto& [node, slot] : m.rel_to_orders_) anchors.push_back(node);
  std::sort(anchors.begin(), anchors.end());
  anchors.erase(std::unique(anchors.begin(), anchors.end()), anchors.end());
  w.U(anchors.size());
  for (uint32_t node : anchors) {
    auto [lo, hi] = m.rel_to_orders_.equal_range(node);
    w.U(node);
    w.U(static_cast<uint64_t>(std::distance(lo, hi)));
    for (auto it = lo; it != hi; ++it) w.U(it->second);
  }

  // Tenants and policies.
  w.U(m.tenants_.size());
  std::vector<uint64_t> order_ids;
  for (const Tenant& t : m.tenants_) {
    order_ids.clear();
    for (uint32_t slot : t.orders) order_ids.push_back(m.orders_[slot].id.value);
    TenantFields(w, t, order_ids);
  }
  w.U(m.policies_.size());
  for (const Policy& p : m.policies_) w.F(p);
  w.B(m.has_power_policy_);
  w.B(m.power_dirty_);
  w.S(m.power_sched_);

  // Timed work, decay and maintenance.
  // The schedule as one list in the set's order: the exhaustion checks
  // merged in (ExhaustSchedule).
  std::vector<SchedKey> exhaust;
  for (const ExhaustSchedule::Entry& e : m.exhaust_sched_.entries()) exhaust.push_back(SchedKey{e.time, kSchedExhaust, e.tenant});
  std::sort(exhaust.begin(), exhaust.end());
  w.U(m.sched_.size() + exhaust.size());
  auto ex = exhaust.begin();
  for (const SchedKey& k : m.sched_) {
    for (; ex != exhaust.end() && *ex < k; ++ex) w.F(*ex);
    w.F(k);
  }
  for (; ex != exhaust.end(); ++ex) w.F(*ex);
  w.F(m.decaying_);
  w.U(m.decay_state_.size());
  for (auto [node, state] : Sorted(m.decay_state_)) {
    w.U(node);
    w.S(state.first);
    w.S(state.second);
  }
  w.U(m.maint_state_.size());
  for (auto [node, at] : Sorted(m.maint_state_)) {
    w.U(node);
    w.S(at);
  }

  // Ledger totals and the last `ledger_tail` entries of its history (docs/SNAPSHOT.md).
  w.S(m.totals_.deposited);
  w.S(m.totals_.operator_revenue);
  w.S(m.totals_.waived);
  w.U(m.totals_.entries);
  size_t tail = std::min(ledger_tail, m.ledger_.size());
  w.U(tail);
  for (size_t i = m.ledger_.size() - tail; i < m.ledger_.size(); ++i) w.F(m.ledger_[i]);
  // Last quotes, for price events.
  w.U(m.last_quote_.size());
  for (Price p : m.last_quote_) w.S(p);

  // The index's cached keys, if the index is current: a cached key can lag a
  // time-varying floor until the node is re-keyed, and a rebuilt index would
  // not, so the image keeps them. The trees are re-derived from them.
  bool index_current = m.index_generation_ == topo.generation() && m.index_.size() == topo.type_count();
  w.B(index_current);
  if (index_current) {
    for (const Impl::TypeIndex& ix : m.index_) {
      w.U(ix.key.size());
      for (size_t i = 0; i < ix.key.size(); ++i) {
        w.U(static_cast<uint64_t>(ix.key[i] >> 64));
        w.U(static_cast<uint64_t>(ix.key[i]));
        w.B(ix.free_leaf[i] != 0);
      }
    }
  }

  // Work lists of an instant: empty between calls, written for completeness.
  w.U(m.candidates_.size());
  for (const auto& [neg_price, seq, slot] : m.candidates_) {
    w.S(neg_price);
    w.U(seq);
    w.U(slot);
  }
  w.F(m.dirty_nodes_);
  w.F(m.gangs_to_check_);
  w.F(m.rate_dirty_);
  w.F(m.exhaust_dirty_);
  w.F(m.touched_vertices_);
  w.U(m.rate_unchanged_node_);
  w.S(m.same_time_passes_);

  std::string image(kMagic, sizeof(kMagic));
  PutFixed(&image, kVersion, 4);
  PutFixed(&image, w.out.size(), 8);
  image += w.out;
  PutFixed(&image, Fnv1a64(w.out), 8);
  return image;
}

Status MarketEngine::Restore(std::string_view image) {
  if (image.size() < kHeader + kTrailer) return DataLoss("snapshot: image too short (" + Num(image.size()) + " bytes)");
  if (image.substr(0, sizeof(kMagic)) != std::string_view(kMagic, sizeof(kMagic))) {
    return DataLoss("snapshot: not an engine snapshot (bad magic)");
  }
  uint64_t version = GetFixed(image, sizeof(kMagic), 4);
  if (version != kVersion) {
    return FailedPrecondition("snapshot: version " + Num(version) + " is not supported (this build reads version " +
                              Num(kVersion) + ")");
  }
  uint64_t length = GetFixed(image, sizeof(kMagic) + 4, 8);
  if (length != image.size() - kHeader - kTrailer) {
    return DataLoss("snapshot: payload length " + Num(length) + " does not match the image (" +
                    Num(image.size() - kHeader - kTrailer) + " bytes): truncated or padded");
  }
  std::string_view payload = image.substr(kHeader, length);
  if (GetFixed(image, kHeader + length, 8) != Fnv1a64(payload)) return DataLoss("snapshot: checksum mismatch (corrupt image)");

  Reader r(payload);
  r.section = "options";
  EngineOptions options;
  options.price_events = r.B();
  options.retain_ledger = r.B();
  r.section = "params";
  MarketParams params = Read<MarketParams>(r);
  auto fresh = std::make_unique<Impl>(params, options);
  Impl& m = *fresh;
  r.section = "clock";
  m.now_ = r.S();
  m.next_seq_ = r.U();
  m.next_order_id_ = r.U();
  // The seqs' base as a rebase at the next seq would set it (RestoreSeq).
  m.seq_base_ = m.next_seq_ > Impl::kSeqWindow ? m.next_seq_ - Impl::kSeqWindow : 0;

  r.section = "topology";
  std::vector<std::string> types(r.Count());
  for (auto& t : types) t = r.Str();
  size_t locations = r.Count();
  if (r.ok() && locations == 0) r.Fail("no root location");
  std::vector<std::pair<std::string, uint32_t>> locs(locations);
  for (size_t l = 1; l < locations && r.ok(); ++l) {
    locs[l].first = r.Str();
    locs[l].second = r.Index(l, "location parent");
  }
  size_t node_count = r.Count();
  std::vector<bool> node_alive(node_count);
  for (size_t i = 0; i < node_count && r.ok(); ++i) {
    topology::NodeInfo info;
    info.name = r.Str();
    info.type = types.empty() ? "" : types[r.Index(types.size(), "node type")];
    uint32_t rack = r.Index(locations, "node rack");
    info.meta.gpus = static_cast<int32_t>(r.S());
    info.meta.memory_gb = static_cast<int32_t>(r.S());
    info.meta.power_w = static_cast<int32_t>(r.S());
    node_alive[i] = r.B();
    if (!r.ok()) break;
    // The rack's path, rack first.
    std::string* parts[4] = {&info.rack, &info.row, &info.zone, &info.region};
    uint32_t l = rack;
    for (std::string* part : parts) {
      if (l == 0) break;
      *part = locs[l].first;
      l = locs[l].second;
    }
    auto added = m.topo_.AddNode(info);
    if (!added.ok()) r.Fail("node " + Num(i) + ": " + added.status().message());
    else if (added->value != i || m.topo_.node(*added).rack.value != rack) r.Fail("node " + Num(i) + ": ids do not match");
  }
  for (size_t i = 0; i < node_count && r.ok(); ++i) {
    if (!node_alive[i]) (void)m.topo_.RemoveNode(NodeId(static_cast<uint32_t>(i)));
  }
  if (r.ok() && (m.topo_.location_count() != locations || m.topo_.type_count() != types.size())) {
    r.Fail("locations or types do not match their nodes");
  }
  m.books_.Resize(m.topo_.vertex_count());
  const size_t vertices = m.topo_.vertex_count();

  r.section = "nodes";
  m.nodes_.resize(node_count);
  m.node_cold_.resize(node_count);
  for (size_t i = 0; i < node_count; ++i) {
    NodeFields(r, m.nodes_[i], m.node_cold_[i]);
    // Not in the image: the topology's (NodeState::type).
    if (i < m.topo_.node_count()) m.nodes_[i].type = m.topo_.node(NodeId(static_cast<uint32_t>(i))).type;
  }

  r.section = "orders";
  const size_t order_slots = r.Count();
  if (order_slots > kMaxOrderSlots) r.Fail(Num(order_slots) + " order slots, more than " + Num(kMaxOrderSlots));
  m.orders_.resize(r.ok() ? order_slots : 0);
  for (uint32_t slot = 0; slot < m.orders_.size() && r.ok(); ++slot) {
    Order& o = m.orders_[slot];
    OrderCold c;
    OrderSlotPrices sp;
    OrderFields(r, o, c, sp);
    // The type is the scope's vertex's (Impl::OrderType): an image that says
    // otherwise is refused, as the record cannot keep another.
    if (r.ok() && o.scope.value >= vertices) {
      r.Fail("order " + Num(o.id.value) + ": scope " + Num(o.scope.value) + " out of range (" + Num(vertices) + " vertices)");
    } else if (r.ok() && sp.type != m.OrderType(o)) {
      r.Fail("order " + Num(o.id.value) + ": type " + Num(sp.type.value) + " is not its scope's (" + Num(m.OrderType(o).value) + ")");
    }
    // Seqs are taken from next_seq_ upwards: a live order at or past it
    // would share its seq with the next order placed.
    if (r.ok() && o.alive && sp.seq >= m.next_seq_) {
      r.Fail("order " + Num(o.id.value) + ": seq " + Num(sp.seq) + " is live, but the next seq is " + Num(m.next_seq_));
    }
    if (r.ok()) m.SetCount(o, sp.count);
    if (r.ok()) m.RestoreSeq(o, sp.seq);
    if (r.ok() && sp.placed >= 0) m.placed_.Insert(slot, sp.placed);
    if (r.ok() && sp.clip_step != 0) m.SetClipStep(slot, sp.clip_step);
    if (r.ok()) m.StoreRequested(o, sp.requested);  // Apart if it differs from the effective price.
    if (c != OrderCold{}) {
      o.has_cold = true;
      m.order_cold_.emplace(slot, std::move(c));
    }
  }
  r.F(m.free_slots_);
  size_t live = r.Count();
  for (size_t i = 0; i < live && r.ok(); ++i) {
    uint64_t id = r.U();
    uint32_t slot = r.Index(m.orders_.size(), "order slot");
    if (!r.ok()) break;
    // The index keys a slot by its record's id (OrderIndex).
    if (m.orders_[slot].id.value != id) r.Fail("order slot " + Num(slot) + " holds order " + Num(m.orders_[slot].id.value) + ", not " + Num(id));
    else if (m.FindSlot(id) != OrderIndex::kNone) r.Fail("order " + Num(id) + " is listed twice");
    else if (id >= m.next_order_id_) r.Fail("order " + Num(id) + " is live, but the next order id is " + Num(m.next_order_id_));
    else m.order_slot_.Insert(slot, m.orders_);
  }
  // The free slots are where the next orders go (Place takes the last):
  // each must be a slot of the table, hold no live order and be listed once,
  // or a placement would write past the table or over a live order.
  std::vector<bool> freed(m.orders_.size());
  for (uint32_t slot : m.free_slots_) {
    if (!r.ok()) break;
    if (slot >= m.orders_.size()) r.Fail("free order slot " + Num(slot) + " out of range (" + Num(m.orders_.size()) + ")");
    else if (m.orders_[slot].alive) r.Fail("free order slot " + Num(slot) + " holds live order " + Num(m.orders_[slot].id.value));
    else if (freed[slot]) r.Fail("free order slot " + Num(slot) + " is listed twice");
    else freed[slot] = true;
  }
  r.F(m.unmatchable_);
  r.section = "books";
  // The books must be the orders' (FindEntry trusts them): one book per
  // vertex, its entries in priority order, each the entry of an order that
  // is in the book at that vertex with the same price, seq, flags and
  // tenant, and every such order with an entry (a second one would break
  // the strict priority order or sit at another vertex).
  size_t books = r.Count();
  std::vector<bool> entered(m.orders_.size());  // Order slots with an entry read.
  for (size_t i = 0; i < books && r.ok(); ++i) {
    uint32_t v = r.Index(vertices, "book vertex");
    size_t entries = r.Count();
    if (!r.ok()) break;
    auto where = [&] { return "book at vertex " + Num(v) + ": "; };  // Built only for an error.
    if (entries > kMaxOrderSlots) {
      r.Fail(where() + Num(entries) + " entries, more than the order slots");
      break;
    }
    if (entries == 0) r.Fail(where() + "empty (only non-empty books are written)");
    else if (!m.books_[v].empty()) r.Fail(where() + "listed twice");
    if (!r.ok()) break;
    Book& b = m.books_.Mutable(v);
    b.assign_empty(entries);
    BookEntryImage prev;
    for (size_t k = 0; k < entries && r.ok(); ++k) {
      BookEntryImage e = Read<BookEntryImage>(r);
      if (!r.ok()) break;
      if (e.slot >= m.orders_.size()) {
        r.Fail(where() + "entry slot " + Num(e.slot) + " out of range (" + Num(m.orders_.size()) + " order slots)");
        break;
      }
      const Order& o = m.orders_[e.slot];
      const char* why = nullptr;
      if (k > 0 && !(prev.price != e.price ? prev.price > e.price : prev.seq < e.seq)) {
        why = "out of priority order (price descending, then seq ascending)";
      } else if (!o.in_book || !m.EffScope(o).valid() || m.EffScope(o).value != v) {
        why = "the order is not in the book at this vertex";
      } else if (e.price != o.effective || e.seq != m.Seq(o) || e.flags != o.book_flags || e.tenant != o.tenant.value) {
        why = "price, seq, flags or tenant differ from the order's";
      }
      if (why) r.Fail(where() + "entry " + Num(k) + " (order slot " + Num(e.slot) + ", order " + Num(o.id.value) + "): " + why);
      b.begin()[k] = BookEntry{e.price, e.slot, e.flags, e.tenant};
      entered[e.slot] = true;
      prev = e;
    }
    if (r.ok()) m.books_.Retop(v);
    if (r.ok() && m.V(VertexId(v)).node.valid()) ++m.leaf_books_;
  }
  for (uint32_t slot = 0; slot < m.orders_.size() && r.ok(); ++slot) {
    const Order& o = m.orders_[slot];
    if (o.in_book && m.EffScope(o).valid() && !entered[slot]) {
      r.Fail("order " + Num(o.id.value) + " (slot " + Num(slot) + ") is in the book at vertex " + Num(m.EffScope(o).value) + " but has no entry there");
    }
  }
  r.section = "anchors";
  size_t anchors = r.Count();
  for (size_t i = 0; i < anchors && r.ok(); ++i) {
    uint32_t node = r.Index(node_count, "anchor node");
    std::vector<uint32_t> slots(r.Count());
    for (uint32_t& s : slots) s = r.Index(m.orders_.size(), "anchor slot");
    // An equal key is inserted before the ones already there (libstdc++), so
    // inserting in reverse gives back the written order; the re-snapshot test checks it.
    for (auto it = slots.rbegin(); it != slots.rend(); ++it) m.rel_to_orders_.emplace(node, *it);
  }

  r.section = "tenants";
  m.tenants_.resize(r.Count());
  size_t listed_orders = 0;  // In the tenants' lists: each live order once (checked below).
  for (uint32_t i = 0; i < m.tenants_.size() && r.ok(); ++i) {
    Tenant& t = m.tenants_[i];
    std::vector<uint64_t> order_ids;
    TenantFields(r, t, order_ids);
    if (!r.ok()) break;
    if (!m.tenant_by_name_.emplace(t.name, TenantId(i)).second) r.Fail("duplicate tenant name");
    // Its open orders: live, its own, ascending (Place appends to the list).
    t.orders.reserve(order_ids.size());
    for (size_t k = 0; k < order_ids.size() && r.ok(); ++k) {
      uint64_t id = order_ids[k];
      uint32_t slot = m.FindSlot(id);
      if (slot == OrderIndex::kNone) r.Fail("tenant " + Num(i) + ": open order " + Num(id) + " is not a live order");
      else if (m.orders_[slot].tenant.value != i) r.Fail("tenant " + Num(i) + ": open order " + Num(id) + " is tenant " + Num(m.orders_[slot].tenant.value) + "'s");
      else if (k > 0 && order_ids[k - 1] >= id) r.Fail("tenant " + Num(i) + ": open orders not in ascending id order");
      else t.orders.push_back(slot);
    }
    listed_orders += t.orders.size();
    for (NodeId n : m.tenants_[i].nodes) {
      if (n.value >= node_count) r.Fail("tenant node out of range");
    }
  }
  if (r.ok() && listed_orders != m.order_slot_.size()) {
    r.Fail(Num(m.order_slot_.size()) + " live orders, but the tenants list " + Num(listed_orders) + " open orders");
  }
  r.section = "policies";
  m.policies_.resize(r.Count());
  for (Policy& p : m.policies_) p = Read<Policy>(r);
  m.has_power_policy_ = r.B();
  m.power_dirty_ = r.B();
  m.power_sched_ = r.S();

  r.section = "schedule";
  size_t sched = r.Count();
  for (size_t i = 0; i < sched && r.ok(); ++i) {
    SchedKey k = Read<SchedKey>(r);
    if (k.kind != kSchedExhaust) {
      m.sched_.insert(m.sched_.end(), k);
    } else if (k.id >= m.tenants_.size() || k.time == kNever) {
      r.Fail("exhaustion check of tenant " + Num(k.id) + " at " + std::to_string(k.time) + ": no such tenant or no time");
    } else if (m.exhaust_sched_.Has(static_cast<uint32_t>(k.id)) || m.tenants_[k.id].exhaust_sched != k.time) {
      r.Fail("exhaustion check of tenant " + Num(k.id) + " at " + std::to_string(k.time) + ": not the tenant's scheduled check");
    } else {
      m.exhaust_sched_.Insert(k.time, static_cast<uint32_t>(k.id));
    }
  }
  // And the other way: every tenant with a scheduled check has its entry
  // (with the checks above, equal counts make the match one to one).
  size_t armed = 0;
  for (const Tenant& t : m.tenants_) armed += t.exhaust_sched != kNever;
  if (r.ok() && armed != m.exhaust_sched_.size()) {
    r.Fail("exhaustion checks: the tenants have " + Num(armed) + " scheduled, the schedule holds " +
           Num(m.exhaust_sched_.size()));
  }
  r.F(m.decaying_);
  size_t decays = r.Count();
  for (size_t i = 0; i < decays && r.ok(); ++i) {
    uint32_t node = r.Index(node_count, "decay node");
    Price paid = r.S();
    m.decay_state_[node] = {paid, r.S()};
  }
  size_t maints = r.Count();
  for (size_t i = 0; i < maints && r.ok(); ++i) {
    uint32_t node = r.Index(node_count, "maintenance node");
    m.maint_state_[node] = r.S();
  }

  r.section = "ledger";
  m.totals_.deposited = r.S();
  m.totals_.operator_revenue = r.S();
  m.totals_.waived = r.S();
  m.totals_.entries = r.U();
  m.ledger_.resize(r.Count());
  for (LedgerEntry& e : m.ledger_) e = Read<LedgerEntry>(r);
  r.section = "quotes";
  m.last_quote_.resize(r.Count());
  for (Price& p : m.last_quote_) p = r.S();

  r.section = "index";
  if (r.B()) {
    m.EnsureIndex();  // Leaf order and tree shapes; the keys come from the image.
    m.touched_vertices_.clear();
    m.vertex_touched_.clear();
    for (Impl::TypeIndex& ix : m.index_) {
      if (r.Count() != ix.key.size()) r.Fail("leaf count does not match the topology");
      if (!r.ok()) break;
      for (size_t i = 0; i < ix.key.size(); ++i) {
        unsigned __int128 hi = r.U();
        ix.key[i] = hi << 64 | r.U();
        bool free = r.B();
        // RefreshNode trusts the key's held bit to skip the free-tree entry:
        // a held leaf marked free would stay in the free tree for good.
        if (free && ((ix.key[i] >> 63) & 1)) r.Fail("held leaf marked free");
        ix.free_leaf[i] = free;
      }
      ix.Build();
    }
  }

  r.section = "work lists";
  size_t candidates = r.Count();
  for (size_t i = 0; i < candidates && r.ok(); ++i) {
    Price p = r.S();
    uint64_t seq = r.U();
    m.candidates_.emplace(p, seq, r.U32());
  }
  auto flagged = [&](std::vector<uint32_t>& list, std::vector<uint8_t>& flags, size_t size) {
    r.F(list);
    for (uint32_t i : list) {
      if (i >= size) return r.Fail("work list entry out of range");
      if (flags.size() < size) flags.resize(size, 0);
      flags[i] = 1;
    }
  };
  flagged(m.dirty_nodes_, m.node_dirty_flag_, node_count);
  r.F(m.gangs_to_check_);
  flagged(m.rate_dirty_, m.rate_dirty_flag_, node_count);
  flagged(m.exhaust_dirty_, m.exhaust_flag_, m.tenants_.size());
  flagged(m.touched_vertices_, m.vertex_touched_, vertices);
  m.rate_unchanged_node_ = r.U32();
  m.same_time_passes_ = static_cast<int>(r.S());
  if (r.ok() && !r.at_end()) r.Fail("trailing bytes");

  // Cross-references the rebuilt tables need.
  r.section = "policies";
  for (uint32_t id = 0; id < m.policies_.size() && r.ok(); ++id) {
    if (!m.policies_[id].alive) continue;
    // Policy targets index tables sized by the topology.
    bool in_range = std::visit(
        [&](const auto& s) {
          using T = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<T, StaticFloorSpec> || std::is_same_v<T, MaintenanceSpec>) {
            return s.target.node.valid() ? s.target.node.value < node_count : s.target.location.value < locations;
          } else if constexpr (std::is_same_v<T, PowerCapSpec> || std::is_same_v<T, AdaptivePowerCapSpec>) {
            return s.row.value < locations;
          } else if constexpr (std::is_same_v<T, AdaptiveCarbonBudgetSpec>) {
            return s.region.value < locations;
          } else {
            return s.location.value < locations;
          }
        },
        m.policies_[id].spec);
    if (!in_range) r.Fail("policy " + Num(id) + " targets an unknown node or location");
    else m.IndexPolicy(id);
  }
  if (!r.ok()) return DataLoss("snapshot: " + r.error());

  m.sink_ = impl_->sink_;
  m.observer_ = std::move(impl_->observer_);
  impl_ = std::move(fresh);
  return Status::Ok();
}

}  // namespace laissez::market
