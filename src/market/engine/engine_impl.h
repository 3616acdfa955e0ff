// MarketEngine::Impl: the engine's state and the declarations of its member functions.
// Internal to src/market: only the engine's own .cc files include it. The definitions
// live by concern in the .cc files beside this header (docs/ARCHITECTURE.md, "Engine
// source map"); small hot helpers stay inline here.
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
// so that every vertex is a contiguous range, and a min tree over that order
// (4-ary, min_tree.h) finds the node with the lowest obtain price below any vertex in O(log n); a
// second tree over the same order holds only the free nodes, so the lowest free
// one is found in O(log n) too, however many held nodes rank before it.
// Orders rest in per-vertex books sorted by (effective price desc, seq asc); an
// order constrained by locality rests at the deeper of its scope and the
// anchor's location, which is exactly the set of nodes it is eligible for.
// Matching is incremental: only "candidate" orders (new, raised, re-rested, or
// under a node whose obtain price fell) can cross, and they are examined in
// priority order. Timed work (deadlines, hold expiries, clip steps, floor
// schedules, exhaustion, gang cooldowns) sits in one ordered schedule.
#pragma once

#include "market/market_engine.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/check.h"
#include "market/engine/min_tree.h"
#include "market/operation.h"

namespace laissez::market {
namespace engine_internal {

using topology::Topology;

inline constexpr __int128 kH = kMicrosPerHour;  // Charges: price (per hour) x micros / kH.

inline Price AddTick(Price p, Price tick) { return SatAdd(p, tick); }

// ceil(price * grace / 1h): what one node at `price` costs for one grace period.
inline Money GraceCost(Price price, Micros grace) {
  if (price <= 0 || grace <= 0) return 0;
  if (price < (int64_t{1} << 31) && grace < (int64_t{1} << 31)) {
    return (price * grace + kMicrosPerHour - 1) / kMicrosPerHour;  // Fits in 64 bits.
  }
  __int128 v = (static_cast<__int128>(price) * grace + kH - 1) / kH;
  return v >= kInfPrice ? kInfPrice : static_cast<Money>(v);
}

// a / b (truncated, as `/` does): in 64 bits when a fits and b > 0, since a
// 128-bit division is a library call about ten times slower. Same result.
inline __int128 Div128(__int128 a, int64_t b) {
  if (b > 0 && a == static_cast<int64_t>(a)) return static_cast<int64_t>(a) / b;
  return a / b;
}

inline std::string Num(uint64_t v) { return std::to_string(v); }

// Why p is no valid price, nullptr if it is: Place and Update check their
// prices with it (CheckPrice), and a snapshot's restore its placed prices.
inline const char* PriceProblem(Price p) {
  if (p < 0) return "must not be negative";
  if (p == kInfPrice) return "must be finite";
  return nullptr;
}

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

// The tenants' scheduled exhaustion checks (kSchedExhaust, at most one per
// tenant: Tenant::exhaust_sched), apart from the rest of the schedule (issue
// 12): a binary min-heap of (time, tenant) with each tenant's position in it,
// 20 bytes a tenant where the schedule's std::set spent a 64-byte tree node.
// Ordered by time, then tenant, as the set orders these entries; the
// schedule's users merge the two (Impl::RunDue, the snapshot).
class ExhaustSchedule {
 public:
  struct Entry {
    Micros time;
    uint32_t tenant;
    bool operator<(const Entry& o) const { return time != o.time ? time < o.time : tenant < o.tenant; }
  };
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  // The earliest entry's time, kNever if none.
  Micros top_time() const { return heap_.empty() ? kNever : heap_[0].time; }
  const Entry& top() const { return heap_[0]; }
  // Whether `tenant` has an entry at `time`.
  bool Contains(Micros time, uint32_t tenant) const {
    return Has(tenant) && heap_[pos_[tenant]].time == time;
  }
  // Whether `tenant` has an entry.
  bool Has(uint32_t tenant) const { return tenant < pos_.size() && pos_[tenant] != kNone; }
  // Adds `tenant`'s entry at `time` (may allocate). One entry per tenant: an
  // entry it has moves (the engine never schedules two: Tenant::exhaust_sched).
  void Insert(Micros time, uint32_t tenant) {
    if (Has(tenant)) return Move(heap_[pos_[tenant]].time, time, tenant);
    if (tenant >= pos_.size()) pos_.resize(tenant + 1, kNone);
    heap_.push_back(Entry{time, tenant});
    pos_[tenant] = static_cast<uint32_t>(heap_.size() - 1);
    Up(heap_.size() - 1);
  }
  // Moves `tenant`'s entry at `from` to `to` (adds it if it has none at `from`).
  void Move(Micros from, Micros to, uint32_t tenant) {
    if (!Contains(from, tenant)) return Insert(to, tenant);
    size_t i = pos_[tenant];
    heap_[i].time = to;
    if (to < from) Up(i);
    else Down(i);
  }
  // Removes `tenant`'s entry if it is at `time`.
  void Erase(Micros time, uint32_t tenant) {
    if (!Contains(time, tenant)) return;
    size_t i = pos_[tenant];
    pos_[tenant] = kNone;
    Entry last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    heap_[i] = last;
    pos_[last.tenant] = static_cast<uint32_t>(i);
    Up(i);
    Down(pos_[last.tenant]);
  }
  void Pop() { Erase(heap_[0].time, heap_[0].tenant); }
  // The entries, in no set order.
  const std::vector<Entry>& entries() const { return heap_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  void Place(size_t i, Entry e) {
    heap_[i] = e;
    pos_[e.tenant] = static_cast<uint32_t>(i);
  }
  void Up(size_t i) {
    Entry e = heap_[i];
    while (i > 0 && e < heap_[(i - 1) / 2]) {
      Place(i, heap_[(i - 1) / 2]);
      i = (i - 1) / 2;
    }
    Place(i, e);
  }
  void Down(size_t i) {
    Entry e = heap_[i];
    for (size_t c; (c = 2 * i + 1) < heap_.size(); i = c) {
      if (c + 1 < heap_.size() && heap_[c + 1] < heap_[c]) ++c;
      if (!(heap_[c] < e)) break;
      Place(i, heap_[c]);
    }
    Place(i, e);
  }
  std::vector<Entry> heap_;
  std::vector<uint32_t> pos_;  // By tenant: its entry's index in heap_, kNone if none.
};

enum BookFlag : uint8_t { kFlagGang = 1, kFlagPending = 2 };

// 16 bytes (issue 12): the flags share the slot's word, and the order's seq,
// which only breaks ties between equal prices, is read from its record
// (Impl::Seq, the same value: an order's seq changes only by a re-entry,
// BookReprice) where the entry carried a copy (24 bytes). The price and the
// tenant stay: the walks over a book (candidates, its top, its summary) read
// them for every entry they pass, and the records would cost a cache line each.
struct BookEntry {
  Price price;  // Effective price.
  uint32_t slot : 30;  // Order slots stay below kMaxOrderSlots (Place).
  uint32_t flags : 2;  // BookFlag bits.
  uint32_t tenant;
};
// Two slot values below 2^30 are left out: a Book's inline entry uses them as
// tags (empty, on the heap).
inline constexpr uint32_t kMaxOrderSlots = (uint32_t{1} << 30) - 2;
static_assert(sizeof(BookEntry) == 16);
// Sorted: price desc, seq asc; `seq_of(slot)` gives an entry's seq.
template <typename SeqOf>
inline bool BookLess(const BookEntry& a, const BookEntry& b, SeqOf&& seq_of) {
  return a.price != b.price ? a.price > b.price : seq_of(a.slot) < seq_of(b.slot);
}

// The competing-demand summary of a book: what its resting single-node
// orders (no pending or gang entries) offer a holder. A holder t pays at
// least p1 if t != t1, else p2 (rule 3's c(n)); two summaries that are equal
// offer every holder the same.
struct BookSummary {
  Price p1 = 0;
  uint32_t t1 = UINT32_MAX;
  Price p2 = 0;  // Best price of a tenant other than t1.
  bool operator==(const BookSummary&) const = default;
  // The best price this book offers against a holding of tenant `holder`; 0 if none.
  Price For(uint32_t holder) const { return t1 != holder ? p1 : p2; }
};

// One vertex's book (issue 12): its entries, sorted, and its summary as of
// the last Retop. The first entry lives inline, so a book with one order (a
// rack's, typically) costs no allocation of its own, and its summary is
// derived from that entry; a second entry moves the entries to the heap,
// behind a header with the stored summary, until the book empties. 16
// bytes, the inline entry's own: which of the three states a book is in
// (empty, one inline entry, entries on the heap) is told by the inline
// entry's slot, which no order slot reaches (kEmptyTag, kHeapTag: see
// kMaxOrderSlots); on the heap, the entry's price holds the block's address
// and its tenant the entry count (24 bytes while a separate count word
// followed the entry, 32 while an entry carried its seq; a std::vector
// header and the summary took 48 and a one-entry vector's allocation 32 more).
class Book {
 public:
  constexpr Book() {}  // Empty (constexpr: BookTable::kEmpty is constant-initialized).
  Book(const Book&) = delete;
  Book& operator=(const Book&) = delete;
  Book(Book&& o) noexcept { Take(o); }
  Book& operator=(Book&& o) noexcept {
    if (this != &o) {
      Free();
      Take(o);
    }
    return *this;
  }
  ~Book() { Free(); }

  const BookEntry* begin() const { return data(); }
  const BookEntry* end() const { return data() + size(); }
  BookEntry* begin() { return data(); }
  BookEntry* end() { return data() + size(); }
  size_t size() const {
    const uint32_t t = Tag();
    return t == kHeapTag ? rep_.size : t != kEmptyTag;
  }
  bool empty() const { return Tag() == kEmptyTag; }  // A book on the heap has an entry: erase frees it with its last.
  const BookEntry& front() const { return *data(); }

  // Inserts e before `pos` (a pointer into this book). e is taken by value:
  // it may be an entry of this book, which Reserve and the shift overwrite.
  void insert(BookEntry* pos, BookEntry e) {
    size_t i = static_cast<size_t>(pos - begin()), n = size();
    if (n == capacity()) Reserve(Grown(n));
    BookEntry* d = data();
    std::memmove(d + i + 1, d + i, (n - i) * sizeof(BookEntry));
    d[i] = e;  // Inline (n == 0): the entry's slot ends the empty tag.
    if (on_heap()) rep_.size = static_cast<uint32_t>(n + 1);
  }
  void erase(BookEntry* pos) {
    size_t i = static_cast<size_t>(pos - begin()), n = size();
    if (n == 1) {  // Empty: back to the inline entry, tagged empty.
      Free();
      return;
    }
    BookEntry* d = rep_.heap->entries();  // More than one entry: on the heap.
    std::memmove(d + i, d + i + 1, (n - i - 1) * sizeof(BookEntry));
    rep_.size = static_cast<uint32_t>(n - 1);
  }
  // n value-initialized entries (a snapshot's restore fills them in).
  void assign_empty(size_t n) {
    Free();
    if (n > 1) Reserve(n);
    else if (n == 1) one_ = BookEntry{};  // Slot 0: one inline entry.
    if (on_heap()) rep_.size = static_cast<uint32_t>(n);
    for (size_t i = 0; i < n; ++i) data()[i] = BookEntry{};
  }

  // What BookTable::Summarize gave at the last set_summary: stored for a
  // book on the heap; for an inline one, what Summarize gives for its entry.
  BookSummary summary() const {
    const uint32_t t = Tag();
    if (t == kHeapTag) return rep_.heap->summary;
    if (t == kEmptyTag || one_.flags) return BookSummary{};
    return BookSummary{one_.price, one_.tenant, 0};
  }
  void set_summary(const BookSummary& s) {
    if (on_heap()) rep_.heap->summary = s;
  }

 private:
  // The inline entry's slot values no order has (kMaxOrderSlots).
  static constexpr uint32_t kEmptyTag = (uint32_t{1} << 30) - 1;
  static constexpr uint32_t kHeapTag = (uint32_t{1} << 30) - 2;
  // The heap block: this header, then `capacity` entries.
  struct Heap {
    BookSummary summary;
    size_t capacity;
    // The entries start right after this header, in the same malloc block:
    // byte arithmetic and std::launder, not a pointer past this object.
    BookEntry* entries() { return std::launder(reinterpret_cast<BookEntry*>(reinterpret_cast<char*>(this) + sizeof(Heap))); }
  };
  static_assert(sizeof(Heap) % alignof(BookEntry) == 0);
  // The union's other member: a heap book's block, tag and count, laid over
  // the entry's price, slot word and tenant.
  struct Rep {
    Heap* heap;
    uint32_t tag_word;  // kHeapTag, in the bits of BookEntry::slot (flags 0).
    uint32_t size;
  };
  static_assert(sizeof(Rep) == sizeof(BookEntry) && offsetof(Rep, tag_word) == sizeof(Price) &&
                offsetof(BookEntry, tenant) == offsetof(Rep, size));
  // The slot bits of the word after the price, whichever member is active
  // (read as bytes: BookEntry::slot is the low 30 bits of that word).
  uint32_t Tag() const {
    uint32_t w;
    std::memcpy(&w, reinterpret_cast<const char*>(this) + sizeof(Price), sizeof w);
    return w & kMaxSlotBits;
  }
  static constexpr uint32_t kMaxSlotBits = (uint32_t{1} << 30) - 1;
  // Full at n entries (inline: one): doubling up to 16, then by an eighth
  // (issue 12). Every insert already shifts half the entries on average, so
  // the rarer copies cost little; doubling left a 20,000-entry zone book
  // (1M nodes) in a 32,768-entry block.
  static size_t Grown(size_t n) { return n < 16 ? 2 * n : n + n / 8; }
  bool on_heap() const { return Tag() == kHeapTag; }
  size_t capacity() const { return on_heap() ? rep_.heap->capacity : 1; }
  BookEntry* data() { return on_heap() ? rep_.heap->entries() : &one_; }
  const BookEntry* data() const { return on_heap() ? rep_.heap->entries() : &one_; }
  void Reserve(size_t cap) {
    LZ_CHECK(cap > 1);
    auto* h = static_cast<Heap*>(std::malloc(sizeof(Heap) + cap * sizeof(BookEntry)));
    LZ_CHECK(h != nullptr);
    const size_t n = size();
    h->summary = summary();
    h->capacity = cap;
    if (n) std::memcpy(static_cast<void*>(h->entries()), data(), n * sizeof(BookEntry));
    if (on_heap()) std::free(rep_.heap);
    std::construct_at(&rep_, Rep{h, kHeapTag, static_cast<uint32_t>(n)});
  }
  // Drops every entry and the allocation, if any.
  void Free() {
    if (on_heap()) std::free(rep_.heap);
    std::construct_at(&one_, Empty());  // The inline entry is the union's member again.
  }
  static constexpr BookEntry Empty() {
    BookEntry e{};
    e.slot = kEmptyTag;
    return e;
  }
  void Take(Book& o) {
    std::memcpy(static_cast<void*>(this), &o, sizeof(Book));  // Either member.
    std::construct_at(&o.one_, Empty());
  }
  union {
    BookEntry one_ = Empty();
    Rep rep_;
  };
};
static_assert(sizeof(Book) == 16);

// Per-vertex books, allocated only for vertices that ever had an order: most
// vertices are leaves that never do.
class BookTable {
 public:
  void Resize(size_t vertices) {
    index_.resize(vertices, kNone);
    top_.resize(vertices, -1);
  }
  size_t size() const { return index_.size(); }
  const Book& operator[](uint32_t v) const {
    uint32_t i = index_[v];
    return i == kNone ? kEmpty : pool_[i];
  }
  // The highest price of any entry at v, -1 if none: lets walks over a node's
  // ancestors skip books without touching them.
  Price top(uint32_t v) const { return top_[v]; }  // Sized with the vertices (Resize).
  // The book's summary as of the last Retop(v) (issue 12): c(n) reads it for
  // each ancestor instead of walking the pending entries above the best
  // resting one, per held node re-rated.
  BookSummary summary(uint32_t v) const {
    uint32_t i = index_[v];
    return i == kNone ? BookSummary{} : pool_[i].summary();
  }
  // A reference valid until the next Mutable call; call Retop(v) after changing it.
  Book& Mutable(uint32_t v) {
    ++generation_;
    recent_[generation_ % kRecent] = v;
    if (index_[v] == kNone) {
      // Grow by an eighth, not doubling: most books are a rack's one entry,
      // so the pool is most of what they cost (issue 12); it grows only as
      // vertices get their first order.
      if (pool_.size() == pool_.capacity()) pool_.reserve(pool_.size() + pool_.size() / 8 + 16);
      pool_.emplace_back();
      index_[v] = static_cast<uint32_t>(pool_.size() - 1);  // Once grown: a bad_alloc leaves no index past the pool.
    }
    return pool_[index_[v]];
  }
  void Retop(uint32_t v) {
    Book& b = pool_[index_[v]];
    const Price old = top_[v], now = b.empty() ? -1 : b.front().price;
    top_[v] = now;
    if (now > bound_) {
      bound_ = now;
      at_bound_ = 1;
      stale_checks_ = 0;
    } else if (old != now) {
      if (now == bound_) ++at_bound_;
      if (old == bound_) --at_bound_;
    }
    b.set_summary(Summarize(b));
  }
  // Whether some book may hold an entry at `price` or above (issue 12: a
  // lowered limit's candidate walk reads a top and a vertex record per
  // ancestor, two lines at the rack, and finds nothing whenever all resting
  // demand sits below the new limit, as in `bench engine`'s retention set-up;
  // one order above it anywhere makes every check true, and the walk runs as
  // before). False is exact: no top reaches `price`. The
  // bound is the highest top any Retop gave, and stays above the tops when
  // its last book falls below it; such a stale bound is brought back to the
  // highest top by a scan of the tops once the checks it let through number a
  // sixteenth of the vertices, so the scan costs a walk at most 16 tops.
  bool MayReach(Price price) {
    if (price > bound_) return false;
    if (at_bound_ == 0 && bound_ >= 0 && ++stale_checks_ > top_.size() / 16) {
      Tighten();
      return price <= bound_;
    }
    return true;
  }
  Price top_bound() const { return bound_; }
  static BookSummary Summarize(const Book& b) {
    BookSummary s;
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
  // Counts Mutable calls: a value read earlier still holds if it is unchanged.
  uint64_t generation() const { return generation_; }
  // The vertex of Mutable call number g, for the last kRecent calls
  // (generation() - kRecent < g <= generation()): what changed since a
  // generation read a few calls ago.
  static constexpr uint64_t kRecent = 8;
  uint32_t changed_at(uint64_t g) const { return recent_[g % kRecent]; }
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
  // The bound back to the highest top (-1: no entries) and its count.
  void Tighten() {
    bound_ = -1;
    at_bound_ = 0;
    stale_checks_ = 0;
    for (Price p : top_) {
      if (p > bound_) {
        bound_ = p;
        at_bound_ = 1;
      } else if (p == bound_ && p >= 0) {
        ++at_bound_;
      }
    }
  }
  static constexpr uint32_t kNone = UINT32_MAX;
  static constinit inline const Book kEmpty{};
  std::vector<uint32_t> index_;
  std::vector<Price> top_;
  // MayReach's bound: at least every top; while at_bound_ > 0, equal to the
  // highest (at_bound_ books have it). -1 before any entry.
  Price bound_ = -1;
  uint32_t at_bound_ = 0;
  size_t stale_checks_ = 0;  // MayReach calls let through since the bound went stale.
  std::vector<Book> pool_;
  uint64_t generation_ = 0;
  uint32_t recent_[kRecent] = {};
};

// A node's state in one cache line (issue 12): what a limit change, a re-key
// and a settlement read, aligned so that a node's record never straddles two
// lines (88 bytes at an 8-byte stride did, nearly always). The contest's and
// the minimum hold's fields are in NodeCold, by node (Impl::node_cold_).
// Fields are ordered so that the 4-byte and 1-byte ones pack without padding.
struct alignas(64) NodeState {
  TenantId holder;
  uint32_t order_slot = UINT32_MAX;  // Gang reservation (slot of the gang order).
  uint32_t challenger = UINT32_MAX;  // Order slot of the pending challenger.
  // The node's position in its type's leaf order (TypeIndex), UINT32_MAX if
  // it has none (a removed node); built with the index and read only while
  // it is current (Impl::EnsureIndex). In this line, a re-key finds its leaf
  // without a line of its own (issue 12: it was an 8-byte per-node entry
  // beside the walk's start, now NodeCold::above; tenant_pos went to NodeCold).
  uint32_t leaf = UINT32_MAX;
  uint32_t carry = 0;  // Remainder below one micro-unit, in micro-unit / kH (< kH < 2^32).
  uint8_t reasons = 0;
  // One byte of flags.
  bool contested : 1 = false;
  bool alive : 1 = true;
  bool hold_scheduled : 1 = false;
  bool decaying : 1 = false;  // Has an entry in decay_state_ (rare: kept out of the hot struct).
  bool in_maint : 1 = false;  // Has an entry in maint_state_.
  // The topology's type of the node (it never changes), in what was padding:
  // a re-key finds its type's index without the topology's node record.
  TypeId type;
  Price limit = 0;
  // Floors.
  Price base_floor = 0;  // Max of policy floors.
  // Charging.
  Price rate = 0;
  // The rate of the holding's latest interval of positive length: what it
  // paid, as opposed to a rate that took effect this instant (decay's P).
  Price paid_rate = 0;
  Micros acc_since = 0;
};
static_assert(sizeof(NodeState) == 64, "a node's hot state is meant to fill one cache line (issue 12)");

// The parts of a node's state that only contests, the minimum hold, a
// holding's start and end and the candidate walks (a re-key's wake,
// RekeyDecayed) read. Aligned to its size, so that an entry never straddles
// two cache lines: the vector's default 16-byte alignment would put every
// other entry across a line boundary.
struct alignas(32) NodeCold {
  Micros held_since = 0;
  // Contest.
  Micros deadline = 0;
  Price notice_price = 0;  // The price the holder's latest notice stated.
  // Index in the holder's node list: read when a holding starts or ends,
  // which write held_since on this line anyway (issue 12: it was in NodeState).
  uint32_t tenant_pos = 0;
  // With the index current: the parent of the node's leaf vertex, where a
  // candidate walk starts while no leaf vertex has an order (issue 12: one
  // 4-byte read instead of the topology's leaf index, node record, leaf
  // vertex and that book's top). Read only when a walk happens
  // (Impl::MayWake), not on every re-key.
  VertexId above;
};
static_assert(sizeof(NodeCold) == 32, "two a line: 96 bytes a node with NodeState, as with the per-node leaf entry before (issue 12)");

// The rare parts of an order (issue 12): a locality anchor, a clip schedule,
// a gang's cooldown and the nodes a pending order claims (the placed price
// and the clip step have tables of their own: SlotPrices). They live in a side
// table keyed by slot (Impl::order_cold_), created when one is first set, so
// an order that uses none of them has only the compact record below. Absent
// means every field at its default.
struct OrderCold {
  NodeId rel_to;            // OrderSpec::rel_to.
  LocationId locality_loc;  // The anchor's location at the locality level (invalid: none).
  // With a locality location (Order::narrowed): the order's effective scope,
  // its scope narrowed to that location (Impl::Narrow); invalid while no node
  // of the scope's type lies there. Without one it is the scope itself.
  VertexId eff_scope;
  Micros next_clip = kNever;
  Micros cooldown_until = 0;
  std::vector<NodeId> claims;  // Pending: contested or reserved nodes.
  bool operator==(const OrderCold&) const = default;
};

// An order's hot record: the OrderSpec's fields but rel_to and the placed
// price inline, the rest in OrderCold. Fields are ordered so that they pack
// without padding, and the small ones share two bytes as bit-fields (issue
// 12: 48 bytes, where a byte each and the effective scope took 56; the
// effective scope differs from the scope only for an order with a locality
// location, and lives in OrderCold then: Impl::EffScope). 40 bytes (issue
// 12): the requested price is the effective one but while clipping holds
// the effective price below it (or an update moves one before the other),
// and lives apart then (`apart`, Impl::Requested); it took 8 bytes of every
// record. 32 bytes (issue 12): with 8-byte alignment a record above 32 bytes
// takes 40, so three fields shrank together: the seq is 32 bits relative to
// a market-wide base (Impl::Seq), the type is the scope's vertex's (every
// vertex has one type and keeps it: Impl::OrderType), and the count shares
// its word with the bits (Impl::Count); a seq or count that does not fit
// lives apart, in a table by slot.
struct Order {
  OrderId id;
  Price effective = 0;
  TenantId tenant;
  VertexId scope;  // OrderSpec::scope.
  // The seq (time priority) less Impl::seq_base_, or kSeqApart: the seq is in
  // Impl::seq_apart_. Read through Impl::Seq, written through Impl::SetSeq.
  uint32_t seq_rel = 0;
  // OrderSpec::count, or kCountApart: the count is in Impl::count_apart_.
  // Read through Impl::Count; a value above 1 is a gang either way.
  uint32_t count_rel : 20 = 1;
  // The bits after the count, none across a byte boundary (their types are
  // a byte wide), so that they share the count's word.
  OrderState state : 2 = OrderState::kResting;  // Four states.
  uint8_t book_flags : 2 = 0;                   // BookFlag bits.
  Locality locality : 3 = Locality::kAny;       // OrderSpec::locality (five values).
  bool in_book : 1 = false;   // Has a BookEntry at its effective scope.
  bool alive : 1 = true;
  bool has_cold : 1 = false;  // Has an entry in Impl::order_cold_.
  bool narrowed : 1 = false;  // Has a locality location: its effective scope is OrderCold::eff_scope.
  // Its requested price (OrderSpec::price as placed, then as updated) differs
  // from `effective` and is in Impl::requested_apart_ (or Impl::in_flight_).
  bool apart : 1 = false;
  static constexpr uint32_t kSeqApart = UINT32_MAX;
  static constexpr uint32_t kCountApart = (uint32_t{1} << 20) - 1;
  bool is_gang() const { return count_rel > 1; }  // kCountApart too: the counts apart are large.
};
static_assert(sizeof(Order) == 32, "the order record is meant to stay compact: 32 bytes, not 40 (issue 12)");

// An open-addressing table of order slots with linear probing (issue 12),
// keyed by a 64-bit key that a caller's function derives from each slot
// (KeyOf: slot -> key), with a Value beside each slot unless Value is void.
// A bucket is 4 bytes (plus the value's), where a std::unordered_map spent a
// node and a bucket pointer on each entry. Kept at most kLoadNum / kLoadDen
// full; deletion shifts entries back, so there are no tombstones. Keys that
// are consecutive (ids, slots) spread evenly under the multiplicative hash,
// so the probes stay short. The capacity need not be a power of two: a hash
// maps to a bucket by the high half of its product with the capacity, and
// the table grows by a quarter, so once it has grown it stays between 4/5
// of the most full and the most full: 60-75% for OrderIndex (issue 12: 4
// bytes a bucket at 43% full cost 9.2 B an order at 100k nodes).
template <typename Value, size_t kLoadNum, size_t kLoadDen>
class SlotTable {
  static constexpr bool kHasValue = !std::is_void_v<Value>;
  struct NoValues {};

 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  size_t size() const { return size_; }
  // The bucket of the slot whose key is `key`, or kNone.
  template <typename KeyOf>
  size_t Bucket(uint64_t key, KeyOf&& key_of) const {
    if (size_ == 0) return kNone;
    for (size_t i = Home(key);; i = Next(i)) {
      uint32_t s = slots_[i];
      if (s == kNone) return kNone;
      if (key_of(s) == key) return i;
    }
  }
  // The slot whose key is `key`, or kNone.
  template <typename KeyOf>
  uint32_t Find(uint64_t key, KeyOf&& key_of) const {
    if (size_ == 0) return kNone;
    for (size_t i = Home(key);; i = Next(i)) {
      uint32_t s = slots_[i];
      if (s == kNone || key_of(s) == key) return s;
    }
  }
  auto value_at(size_t bucket) const requires kHasValue { return values_[bucket]; }
  // Room for n more entries: the next n Inserts do not allocate.
  template <typename KeyOf>
  void Reserve(size_t n, KeyOf& key_of) {
    while (kLoadDen * (size_ + n) > kLoadNum * slots_.size()) Grow(key_of);
  }
  template <typename V>
  void set_value_at(size_t bucket, V v) requires kHasValue { values_[bucket] = v; }
  // Adds `slot` (with `value`), whose key must not be in the table.
  template <typename KeyOf, typename... V>
  [[gnu::always_inline]] void Insert(uint32_t slot, KeyOf&& key_of, V... value) {
    if (kLoadDen * (size_ + 1) > kLoadNum * slots_.size()) Grow(key_of);
    size_t i = Home(key_of(slot));
    while (slots_[i] != kNone) i = Next(i);
    slots_[i] = slot;
    if constexpr (kHasValue) values_[i] = (value, ...);
    ++size_;
  }
  // Removes the slot whose key is `key`, if present.
  template <typename KeyOf>
  void Erase(uint64_t key, KeyOf&& key_of) {
    if (size_ == 0) return;
    size_t i = Home(key);
    while (slots_[i] != kNone && key_of(slots_[i]) != key) i = Next(i);
    if (slots_[i] == kNone) return;
    --size_;
    for (size_t j = Next(i); slots_[j] != kNone; j = Next(j)) {
      size_t home = Home(key_of(slots_[j]));
      // Move j's entry into the hole at i unless its home lies cyclically in (i, j].
      if (Distance(home, j) >= Distance(i, j)) {
        slots_[i] = slots_[j];
        if constexpr (kHasValue) values_[i] = values_[j];
        i = j;
      }
    }
    slots_[i] = kNone;
  }
  // Calls f(slot) for every slot in the table, in no set order.
  template <typename F>
  void ForEach(F&& f) const {
    for (uint32_t s : slots_) {
      if (s != kNone) f(s);
    }
  }

 private:
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((static_cast<unsigned __int128>(key * 0x9E3779B97F4A7C15ull) * slots_.size()) >> 64);
  }
  size_t Next(size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }
  // How far bucket `to` lies after `from`, cyclically.
  size_t Distance(size_t from, size_t to) const { return to >= from ? to - from : to + slots_.size() - from; }
  // The new buckets are allocated before the old ones are let go: an
  // allocation that throws leaves the table as it was (it emptied the table
  // when the old buckets were swapped out first). The re-inserts allocate
  // nothing.
  template <typename KeyOf>
  void Grow(KeyOf& key_of) {
    const size_t cap = std::max<size_t>(16, slots_.size() + slots_.size() / 4);
    std::vector<uint32_t> grown(cap, kNone);
    decltype(values_) grown_values;
    if constexpr (kHasValue) grown_values.assign(cap, Value{});
    // From here on nothing throws (the moves do not).
    std::vector<uint32_t> old_slots = std::exchange(slots_, std::move(grown));
    size_ = 0;
    if constexpr (kHasValue) {
      auto old_values = std::exchange(values_, std::move(grown_values));
      for (size_t k = 0; k < old_slots.size(); ++k) {
        if (old_slots[k] != kNone) Insert(old_slots[k], key_of, old_values[k]);
      }
    } else {
      for (uint32_t s : old_slots) {
        if (s != kNone) Insert(s, key_of);
      }
    }
  }
  std::vector<uint32_t> slots_;
  [[no_unique_address]] std::conditional_t<kHasValue, std::vector<std::conditional_t<kHasValue, Value, char>>, NoValues> values_;
  size_t size_ = 0;
};

// Live orders by id (issue 12): their slots in a SlotTable keyed by the
// record's id, at most three quarters full.
class OrderIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  size_t size() const { return table_.size(); }
  // The slot of the live order `id`, kNone if none.
  uint32_t Find(uint64_t id, const std::vector<Order>& orders) const {
    return table_.Find(id, IdOf{orders});
  }
  // Adds `slot`, keyed by orders[slot].id, which must not be in the table.
  // Inline: Place's one call (GCC stopped inlining it there when Place grew).
  [[gnu::always_inline]] void Insert(uint32_t slot, const std::vector<Order>& orders) { table_.Insert(slot, IdOf{orders}); }
  // Removes the order `id` if present.
  void Erase(uint64_t id, const std::vector<Order>& orders) { table_.Erase(id, IdOf{orders}); }
  // Calls f(slot) for every live order, in no set order.
  template <typename F>
  void ForEach(F&& f) const {
    table_.ForEach(f);
  }

 private:
  struct IdOf {
    const std::vector<Order>& orders;
    uint64_t operator()(uint32_t slot) const { return orders[slot].id.value; }
  };
  SlotTable<void, 3, 4> table_;
};

// A price by order slot (issue 12), for one of an order's rare fields: the
// placed price of an order whose requested price an update has moved. A
// SlotTable keyed by the slot itself, 12 bytes an entry and at most half
// full, where an OrderCold entry (a hash node of about 100 bytes) was made on
// an order's first price update. An entry outlives its order until the slot
// is reused, as the record's other fields do.
class SlotPrices {
 public:
  size_t size() const { return table_.size(); }
  // The price kept for `slot`, -1 if none.
  Price Find(uint32_t slot) const {
    size_t b = table_.Bucket(slot, Self{});
    return b == SlotTable<Price, 1, 2>::kNone ? -1 : table_.value_at(b);
  }
  // Keeps `price` for `slot`, which must have none (may allocate).
  void Insert(uint32_t slot, Price price) { table_.Insert(slot, Self{}, price); }
  // Room for n more prices: the next n Inserts do not allocate (nor throw).
  void Reserve(size_t n) {
    Self self;
    table_.Reserve(n, self);
  }
  // Keeps `price` for `slot`, in place of the one it has, if any (may allocate
  // if it has none).
  void Set(uint32_t slot, Price price) {
    size_t b = table_.Bucket(slot, Self{});
    if (b == SlotTable<Price, 1, 2>::kNone) table_.Insert(slot, Self{}, price);
    else table_.set_value_at(b, price);
  }
  // Drops `slot`'s price if it has one. The empty table's test inline, the
  // rest out of line: Place calls this on every reused slot, and the inlined
  // body pushed OrderIndex::Insert out of line there (+1% instructions).
  void Erase(uint32_t slot) {
    if (table_.size() != 0) EraseFrom(slot);
  }

 private:
  [[gnu::noinline]] void EraseFrom(uint32_t slot) { table_.Erase(slot, Self{}); }
  struct Self {
    uint64_t operator()(uint32_t slot) const { return slot; }
  };
  SlotTable<Price, 1, 2> table_;
};

// A tenant's open orders as their slots, by ascending id (issue 12): the
// first kInline in the tenant's record, in what was the padding of its last
// cache line (Tenant stays 256 bytes), more in a block of their own, which
// doubles as a std::vector's did. Most tenants have a few open orders: their
// std::vector's block, and the smaller ones it replaced as it grew, were
// 7.3 B an order at the retention benchmark. The data pointer points into
// the record while the slots are inline, so that an append, a pop and a
// read cost what a std::vector's do (a test of where the slots are cost
// Place 5.5 instructions); a move sets it anew.
class SlotList {
 public:
  static constexpr uint32_t kInline = 14;
  SlotList() {}
  SlotList(const SlotList& o) { CopyFrom(o); }
  SlotList& operator=(const SlotList& o) {
    if (this != &o) {
      Free();
      CopyFrom(o);
    }
    return *this;
  }
  SlotList(SlotList&& o) noexcept { Take(o); }
  SlotList& operator=(SlotList&& o) noexcept {
    if (this != &o) {
      Free();
      Take(o);
    }
    return *this;
  }
  ~SlotList() { Free(); }

  uint32_t* begin() { return data_; }
  uint32_t* end() { return data_ + size_; }
  const uint32_t* begin() const { return data_; }
  const uint32_t* end() const { return data_ + size_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint32_t back() const { return data_[size_ - 1]; }
  void push_back(uint32_t slot) {
    if (size_ == cap_) Grow(2 * static_cast<size_t>(cap_));
    data_[size_++] = slot;
  }
  void pop_back() { --size_; }
  void erase(uint32_t* pos) {
    std::memmove(pos, pos + 1, static_cast<size_t>(end() - pos - 1) * sizeof(uint32_t));
    --size_;
  }
  void reserve(size_t n) {
    if (n > cap_) Grow(n);
  }

 private:
  bool on_heap() const { return data_ != inline_; }
  void Grow(size_t cap) {
    LZ_CHECK(cap <= UINT32_MAX);
    auto* p = static_cast<uint32_t*>(std::malloc(cap * sizeof(uint32_t)));
    if (p == nullptr) throw std::bad_alloc();
    if (size_) std::memcpy(p, data_, size_ * sizeof(uint32_t));
    if (on_heap()) std::free(data_);
    data_ = p;
    cap_ = static_cast<uint32_t>(cap);
  }
  void Free() {
    if (on_heap()) std::free(data_);
    data_ = inline_;
    size_ = 0;
    cap_ = kInline;
  }
  void CopyFrom(const SlotList& o) {
    reserve(o.size_);
    if (o.size_) std::memcpy(data_, o.data_, o.size_ * sizeof(uint32_t));
    size_ = o.size_;
  }
  void Take(SlotList& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.on_heap()) data_ = o.data_;
    else if (size_) std::memcpy(inline_, o.inline_, size_ * sizeof(uint32_t));
    o.data_ = o.inline_;
    o.size_ = 0;
    o.cap_ = kInline;
  }
  uint32_t* data_ = inline_;
  uint32_t size_ = 0;
  uint32_t cap_ = kInline;
  uint32_t inline_[kInline];
};
static_assert(sizeof(SlotList) == 72);

// A tenant's hot fields in two cache lines (issue 12): the first holds what a
// lowered limit changes (the committed aggregates) and the exhaustion state,
// the second what the budget test and the exhaustion bound add (the balance
// and the accrual aggregates). The rest follows.
struct alignas(64) Tenant {
  // Committed rate and its grace cost.
  Price committed = 0;      // Sum limits + price x remaining (requested prices).
  Money committed_need = 0; // Per-item grace costs of the same.
  Money need = 0;           // Sum over held nodes of GraceCost(r).
  Micros exhaust_sched = kNever;
  std::vector<NodeId> nodes;
  bool exhausted = false;
  // Second line.
  Money balance = 0;
  Price max_rate = kInfPrice;
  // Accrual aggregates: A(t) = carry_sum + rate_sum * t - rate_time_sum.
  __int128 carry_sum = 0;
  __int128 rate_sum = 0;
  __int128 rate_time_sum = 0;
  // Cold.
  std::string name;
  Money deposited = 0;
  Money paid = 0, waived = 0;
  // The slots of the open orders, by ascending id: 4 bytes an order, where
  // the ids (8 bytes) were, and a std::set's 40-byte tree node before them;
  // up to 14 in the record itself (SlotList). Place appends (ids only grow);
  // the snapshot writes the ids.
  SlotList orders;
};
static_assert(sizeof(Tenant) == 256, "the open orders' inline slots fill what was the last line's padding (issue 12)");
static_assert(sizeof(std::vector<NodeId>) == 24, "the first line of Tenant holds four 8-byte fields, the node list and a flag");

// A(t) x kH at `at`, the accrued money's aggregate (carry_sum + rate_sum x at
// - rate_time_sum): one 64 x 64-bit multiply when the rate sum fits in 64
// bits, as it does but for absurd rates (issue 12); the same value.
inline __int128 AccrualAt(const Tenant& t, Micros at) {
  int64_t r = static_cast<int64_t>(t.rate_sum);
  __int128 m = r == t.rate_sum ? static_cast<__int128>(r) * at : t.rate_sum * at;
  return t.carry_sum + m - t.rate_time_sum;
}

// x x kH > a, exactly: the comparison of the budget test and the exhaustion
// bound. In 64-bit arithmetic when x and a fit (issue 12): a product beyond
// 64 bits exceeds every 64-bit a in magnitude, so its sign settles the test.
inline bool TimesHAbove(__int128 x, __int128 a) {
  int64_t x64 = static_cast<int64_t>(x), a64 = static_cast<int64_t>(a), p;
  if (x64 == x && a64 == a) {
    if (__builtin_mul_overflow(x64, kMicrosPerHour, &p)) return x64 > 0;
    return p > a64;
  }
  return x * kH > a;
}

struct Policy {
  PolicySpec spec;
  bool alive = true;
  Micros maint_start = 0;  // Effective maintenance start.
  // Current floor of a power-cap policy or an adaptive cap's controller; an
  // adaptive carbon budget's price per tonne.
  Price power_floor = 0;
  // Adaptive: what the last control step measured (W, or g CO2 per hour).
  int64_t staying_w = 0;
  Micros next_step = kNever;  // Adaptive cap: the next control step.
  Micros sched = kNever;
};

}  // namespace engine_internal

// The engine's internal types are used unqualified, as they were when they sat in one file.
using namespace engine_internal;

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
  R Observed(Micros t, std::optional<OpBody>& body, R&& result) {
    if (observer_ && body) {
      uint64_t id = UINT64_MAX;
      if constexpr (!std::is_same_v<R, Status>) {
        if (result.ok()) id = static_cast<uint64_t>(result->value);
      }
      observer_(Operation{t, std::move(*body)}, id);
    }
    return std::move(result);
  }
  Topology topo_;
  Micros now_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t next_order_id_ = 0;

  std::vector<NodeState> nodes_;
  std::vector<NodeCold> node_cold_;  // By node, beside nodes_.
  std::vector<Order> orders_;           // Slots.
  std::vector<uint32_t> free_slots_;
  OrderIndex order_slot_;  // Live orders: their slots by id.
  uint32_t FindSlot(uint64_t id) const { return order_slot_.Find(id, orders_); }
  // Rare order fields by slot (OrderCold); an entry outlives its order until
  // the slot is reused, as the record's other fields do.
  std::unordered_map<uint32_t, OrderCold> order_cold_;
  static inline const OrderCold kNoCold{};
  const OrderCold& Cold(const Order& o) const { return o.has_cold ? order_cold_.find(SlotOf(o))->second : kNoCold; }
  OrderCold& MutableCold(Order& o) {
    o.has_cold = true;
    return order_cold_[SlotOf(o)];
  }
  const std::vector<NodeId>& Claims(const Order& o) const { return Cold(o).claims; }
  // The vertex of the nodes an order may take (its scope narrowed to its
  // locality location); invalid: no node satisfies the order (yet).
  VertexId EffScope(const Order& o) const { return o.narrowed ? Cold(o).eff_scope : o.scope; }
  SlotPrices placed_;     // By slot: the placed price of orders an update moved.
  // By slot: the clip step ApplyClip last set (0: none). Dense, since with
  // clipping on every Place sets one; empty while clipping never was on.
  std::vector<Price> clip_step_;
  Price ClipStepOf(uint32_t slot) const { return slot < clip_step_.size() ? clip_step_[slot] : 0; }
  void SetClipStep(uint32_t slot, Price step) {
    if (slot >= clip_step_.size()) clip_step_.resize(std::max<size_t>(slot + 1, orders_.size()), 0);
    clip_step_[slot] = step;
  }
  // OrderSpec::price as placed, of the order in `slot`.
  Price PlacedPrice(uint32_t slot) const {
    Price p = placed_.Find(slot);
    return p >= 0 ? p : Requested(orders_[slot]);
  }
  // Order seqs in 32 bits (issue 12): a record holds its seq less seq_base_
  // (Order::seq_rel) while that fits, and kSeqApart with the seq in
  // seq_apart_ otherwise. A new seq is the largest yet; when one no longer
  // fits, RebaseSeqs moves the base to kSeqWindow below it, rewriting every
  // slot's offset and putting the seqs now below the base apart: orders
  // that sat 2^31 seqs (placements and raises) without a raise, and dead
  // slots as old, whose seq only the snapshot reads. A difference from the
  // id would not do: it grows by every raise in the market, and after 2^32
  // of them no new order's would fit. The seqs, their order and the
  // snapshot's bytes are the 64-bit seqs' as before.
  static constexpr uint64_t kSeqWindow = uint64_t{1} << 31;
  uint64_t seq_base_ = 0;
  SlotPrices seq_apart_;  // Seqs as Price, bit for bit.
  uint64_t Seq(const Order& o) const {
    return __builtin_expect(o.seq_rel != Order::kSeqApart, 1) ? seq_base_ + o.seq_rel : ApartSeq(o);
  }
  [[gnu::noinline]] uint64_t ApartSeq(const Order& o) const {
    return static_cast<uint64_t>(seq_apart_.Find(SlotOf(o)));
  }
  void SetSeq(Order& o, uint64_t seq) {
    const uint64_t rel = seq - seq_base_;  // Wraps (large) for a seq below the base.
    if (__builtin_expect(rel < Order::kSeqApart && o.seq_rel != Order::kSeqApart, 1)) {
      o.seq_rel = static_cast<uint32_t>(rel);
    } else {
      StoreSeq(o, seq);
    }
  }
  void StoreSeq(Order& o, uint64_t seq);  // SetSeq's rare cases (orders.cc).
  // Place and a raise take the next seq: where it would not fit the window,
  // the base moves first, before the call changes anything (a rebase that
  // throws, allocating, then leaves the engine as it was).
  void MakeRoomForNextSeq() {
    if (__builtin_expect(next_seq_ - seq_base_ >= Order::kSeqApart, 0)) RebaseSeqs(next_seq_);
  }
  // A restored record's seq (a fresh record's): any value, apart if it does
  // not fit; the base does not move.
  void RestoreSeq(Order& o, uint64_t seq) {
    const uint64_t rel = seq - seq_base_;
    if (seq >= seq_base_ && rel < Order::kSeqApart) {
      o.seq_rel = static_cast<uint32_t>(rel);
    } else {
      seq_apart_.Insert(SlotOf(o), static_cast<Price>(seq));
      o.seq_rel = Order::kSeqApart;
    }
  }
  void RebaseSeqs(uint64_t seq);
  // Counts in 20 bits (issue 12): a gang of 2^20 - 1 nodes or more keeps its
  // count in count_apart_ (the record holds kCountApart).
  SlotPrices count_apart_;
  uint32_t Count(const Order& o) const {
    return __builtin_expect(o.count_rel != Order::kCountApart, 1) ? o.count_rel : ApartCount(o);
  }
  [[gnu::noinline]] uint32_t ApartCount(const Order& o) const {
    return static_cast<uint32_t>(count_apart_.Find(SlotOf(o)));
  }
  // For a record whose count_rel is not kCountApart (a fresh one).
  void SetCount(Order& o, uint32_t count) {
    if (__builtin_expect(count < Order::kCountApart, 1)) {
      o.count_rel = count;
    } else {
      count_apart_.Insert(SlotOf(o), count);
      o.count_rel = Order::kCountApart;
    }
  }
  // All or nothing: the count once filled, 0 before.
  uint32_t Filled(const Order& o) const { return o.state == OrderState::kFilled ? Count(o) : 0; }
  uint32_t Remaining(const Order& o) const { return o.state == OrderState::kFilled ? 0 : Count(o); }
  // The order's node type: its scope's vertex's (and its effective scope's,
  // which Narrow picks of the same type).
  TypeId OrderType(const Order& o) const { return V(o.scope).type; }
  // The requested prices that differ from their orders' effective ones
  // (Order::apart; issue 12): the orders whose effective price a clip holds
  // below their requested one (an update's new price waits in in_flight_, not
  // here). With clipping never on the table stays empty; after SetParams
  // turns it off, an order clipped then stays here until its next clip step
  // or update brings the two together.
  // An entry outlives its order until the slot is reused, as the record's
  // other fields do (the snapshot writes every slot's).
  SlotPrices requested_apart_;
  // The requested price an update is setting (Update: BeginRequested to
  // EndRequested), its slot (kNoSlot: none), and whether requested_apart_
  // has an entry for that slot meanwhile. The update's effective price moves
  // through the book in between (SetEffective), and a requested price that
  // differs from it then costs no table entry inserted and erased again.
  struct InFlight {
    static constexpr uint32_t kNoSlot = UINT32_MAX;
    uint32_t slot = kNoSlot;
    bool had_entry = false;
    Price requested = 0;
  };
  InFlight in_flight_;
  // OrderSpec::price as placed, then as updated, of order o. The rare case
  // out of line: the common one is a bit test and the effective price, and
  // inlined whole it kept OutOfMoney and StoreRequested from being inlined
  // on Place's path.
  Price Requested(const Order& o) const { return __builtin_expect(o.apart, 0) ? ApartRequested(o) : o.effective; }
  [[gnu::noinline]] Price ApartRequested(const Order& o) const {
    const uint32_t slot = SlotOf(o);
    return slot == in_flight_.slot ? in_flight_.requested : requested_apart_.Find(slot);
  }
  // Makes r o's requested price, as it stands beside o.effective now: kept
  // apart if they differ, its entry dropped if they no longer do. o.apart
  // must tell whether requested_apart_ has o's slot (outside an update).
  [[gnu::noinline]] void StoreRequested(Order& o, Price r) {
    const uint32_t slot = SlotOf(o);
    if (r == o.effective) {
      if (o.apart) requested_apart_.Erase(slot);
      o.apart = false;
    } else if (o.apart) {
      requested_apart_.Set(slot, r);
    } else {
      requested_apart_.Insert(slot, r);
      o.apart = true;
    }
  }
  // Between these an update's new requested price r is o's, whatever its
  // effective price (o.apart set; ApartRequested reads in_flight_).
  void BeginRequested(Order& o, uint32_t slot, Price r) {
    in_flight_ = InFlight{slot, o.apart, r};
    o.apart = true;
  }
  void EndRequested(Order& o) {
    const Price r = in_flight_.requested;
    const bool had_entry = in_flight_.had_entry;
    in_flight_.slot = InFlight::kNoSlot;
    o.apart = had_entry;
    if (had_entry || r != o.effective) StoreRequested(o, r);  // Else equal, as before: nothing kept.
  }
  // Removes node n from o's claims, if it is there.
  void EraseClaim(Order& o, NodeId n) {
    if (!o.has_cold) return;
    std::vector<NodeId>& claims = MutableCold(o).claims;
    auto it = std::find(claims.begin(), claims.end(), n);
    if (it != claims.end()) claims.erase(it);
  }
  BookTable books_;  // Per vertex.
  std::vector<Tenant> tenants_;
  std::unordered_map<std::string, TenantId> tenant_by_name_;
  std::vector<Policy> policies_;
  std::unordered_multimap<uint32_t, uint32_t> rel_to_orders_;  // node -> order slot.
  std::vector<uint32_t> unmatchable_;  // Slots of orders with no eligible node ever (not in a book).

  std::set<SchedKey> sched_;  // Timed work but the tenants' exhaustion checks:
  ExhaustSchedule exhaust_sched_;  // those (issue 12).
  std::vector<LedgerEntry> ledger_;
  LedgerTotals totals_;
  std::vector<Event> events_;

  // Per-type index.
  struct TypeIndex {
    // Per leaf: obtain << 64 | held << 63 | floor, so one compare orders by
    // (obtain, free first, floor); node id breaks the remaining ties.
    LineVector<unsigned __int128> key;
    std::vector<NodeId> leaf_node;  // Per leaf.
    // Per leaf: 1 if free (neither held nor reserved) at its last re-key.
    std::vector<uint8_t> free_leaf;
    MinTree<2> tree;  // Over every leaf, 4-ary.
    // The same over free leaves only: a search for a free node skips whole
    // subtrees without one instead of visiting every held node below them
    // (issue 12). 8-ary: a limit change never re-keys it, and it takes 3.8
    // bytes a node less than a 4-ary one.
    MinTree<3> free_tree;
    Price obtain(uint32_t leaf) const { return static_cast<Price>(key[leaf] >> 64); }
    // The leaves of `tree` and of `free_tree` (MinTree's views).
    struct AllLeaves {
      const TypeIndex& ix;
      unsigned __int128 key(uint32_t i) const { return ix.key[i]; }
      uint32_t tie(uint32_t i) const { return ix.leaf_node[i].value; }
      bool present(uint32_t) const { return true; }
    };
    struct FreeLeaves : AllLeaves {
      bool present(uint32_t i) const { return ix.free_leaf[i] != 0; }
    };
    AllLeaves all_leaves() const { return AllLeaves{*this}; }
    FreeLeaves free_leaves() const { return FreeLeaves{{*this}}; }
    // Both trees from key and free_leaf.
    void Build() {
      tree.Build(all_leaves(), static_cast<uint32_t>(key.size()));
      free_tree.Build(free_leaves(), static_cast<uint32_t>(key.size()));
    }
    void SetFree(uint32_t leaf, bool free) {
      free_leaf[leaf] = free;
      free_tree.Update(free_leaves(), leaf);
    }
    // A leaf's new key `k` (its stored key was `old_key`) and whether it is
    // free now, in both trees: a key that changed moves in the tree of every
    // node; a node free before and after moves in the free tree (MinTree::Moved:
    // one read per level instead of re-deriving each, issue 12), one that
    // became free or held enters or leaves it. `was_free`: in the free tree
    // before (RefreshNode and RekeyDecayed share this).
    void Rekey(uint32_t leaf, unsigned __int128 k, unsigned __int128 old_key, bool was_free, bool free_now) {
      const bool fell = k < old_key;
      if (k != old_key) {
        key[leaf] = k;
        tree.Moved(all_leaves(), leaf, fell);
      }
      if (free_now && was_free) {
        free_tree.Moved(free_leaves(), leaf, fell);
      } else if (free_now || was_free) {
        SetFree(leaf, free_now);
      }
    }
    // Rekey (and SetFree: `k` == `old_key`) with the trees' levels left for
    // RederivePending (issue 12: a floor change over a row re-keys a run of
    // leaves that share their ancestors). The leaf's key and membership are
    // set now, as Rekey sets them; only the levels above wait, so nothing may
    // search the trees in between (Impl::RefreshNodeT).
    void RekeyPending(uint32_t leaf, unsigned __int128 k, unsigned __int128 old_key, bool was_free, bool free_now) {
      // Listed in both before it changes (the free tree reads the key too): a push that fails
      // to allocate leaves the leaf as it was.
      const bool rekey = k != old_key;
      const bool in_free = free_now || was_free;
      if (rekey) pending_all.push_back(leaf);
      if (in_free) pending_free.push_back(leaf);
      if (rekey) key[leaf] = k;
      if (in_free) free_leaf[leaf] = free_now;
    }
    // The levels above the leaves re-keyed by RekeyPending, each ancestor once. Allocates
    // nothing (it runs while an exception unwinds, RefloorPowerStep).
    void RederivePending() noexcept {
      for (auto [tr, list] : {std::pair{0, &pending_all}, std::pair{1, &pending_free}}) {
        if (list->empty()) continue;
        std::sort(list->begin(), list->end());
        list->erase(std::unique(list->begin(), list->end()), list->end());
        if (tr == 0) tree.UpdateMany(all_leaves(), list);
        else free_tree.UpdateMany(free_leaves(), list);
        list->clear();
      }
    }
    // Leaves whose key (pending_all) or free-tree membership or key
    // (pending_free) changed since the levels above them were derived.
    std::vector<uint32_t> pending_all, pending_free;
  };
  unsigned __int128 KeyOf(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    Price obtain, floor;
    if (s.alive && IsFree(s)) {
      // A live free node's obtain price is its floor: one EffFloor (a hash
      // lookup when it decays) instead of two.
      obtain = floor = Floor(n);
    } else {
      obtain = Obtain(n);
      floor = Floor(n);
    }
    unsigned __int128 k = static_cast<unsigned __int128>(static_cast<uint64_t>(obtain)) << 64;
    if (s.holder.valid()) k |= static_cast<unsigned __int128>(1) << 63;
    return k | static_cast<uint64_t>(floor);
  }
  std::vector<TypeIndex> index_;
  uint64_t index_generation_ = UINT64_MAX;
  // Per node, built with the index and valid while it is current: the
  // node's leaf position (NodeState::leaf) and its leaf vertex's parent
  // (NodeCold::above). They were an 8-byte entry per node on a line of its
  // own, read by every re-key (issue 12).
  uint32_t leaf_books_ = 0;  // Leaf vertices (one node each) whose book is not empty.

  // Work lists of the current instant.
  std::set<std::tuple<Price, uint64_t, uint32_t>> candidates_;  // (-price, seq, slot).
  // By order slot (issue 12): how many nodes a resting gang still lacked at
  // its last failed TryGang, less the wakes since (0: none known). Each wake
  // (WalkCandidates) is for one node whose obtain price fell or whose
  // holder changed, so it adds at most one node the gang can take; a gang
  // two or more nodes short cannot cross after one wake, and is not queued
  // (its search, one BestNodeFor per node it needs, finds the same shortfall).
  // Everything else that can let it cross queues it directly: its entry
  // entering a book (EntryInsert, which clears this), the end of its
  // cooldown; an index rebuild clears them all. Not in snapshots: a restored
  // engine starts at 0, which queues every wake as before.
  std::vector<uint16_t> gang_short_;
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
  // Per vertex, the leaf whose obtain price was its last quote (UINT32_MAX: none
  // or not known); valid while the vertex is not touched. Not in snapshots: a
  // restored engine starts with none known.
  std::vector<uint32_t> quote_leaf_;
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
    if (s.decaying) DecayInputsChanged(n);
    if (s.decaying) decay_state_.erase(n.value);
    s.decaying = false;
  }
  void StartDecay(NodeId n, Price paid) {
    decay_state_[n.value] = {paid, now_};
    DecayInputsChanged(n);
    nodes_[n.value].decaying = true;
  }

  // floor(beta x seconds since `released_at`): how far a decay has come at now_.
  __int128 DecayedBy(Micros released_at) const {
    // In 64 bits when the product fits (issue 12: each RefreshDecay visit asks): the same value.
    int64_t product;
    if (!__builtin_mul_overflow(params_.decay_beta, now_ - released_at, &product)) return product / kMicrosPerSecond;
    return Div128(static_cast<__int128>(params_.decay_beta) * (now_ - released_at), kMicrosPerSecond);
  }
  // max(base, paid - decayed): the floor of a free, unreserved decaying node (beta > 0).
  static Price DecayedFloor(Price base, Price paid, __int128 decayed) {
    __int128 d = static_cast<__int128>(paid) - decayed;
    return d > base ? static_cast<Price>(d) : base;
  }

  Price EffFloor(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    if (s.decaying && !s.holder.valid() && s.order_slot == UINT32_MAX && params_.decay_beta > 0) {
      auto [paid, released_at] = decay_state_.at(n.value);
      return DecayedFloor(s.base_floor, paid, DecayedBy(released_at));
    }
    return s.base_floor;
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
    if (params_.min_hold > 0 && now_ < node_cold_[n.value].held_since + params_.min_hold) return kInfPrice;
    Price bar = HolderBar(n);
    if (s.challenger != UINT32_MAX) bar = std::max(bar, AddTick(ChallengerPrice(s), params_.tick));
    return bar;
  }

  bool IsEligibleNode(const Order& o, NodeId n) const {
    VertexId scope = EffScope(o);
    if (!scope.valid()) return false;
    const NodeState& s = nodes_[n.value];
    if (!s.alive || s.holder == o.tenant) return false;
    return topo_.VertexContains(scope, topo_.node(n).leaf);
  }

  void Emit(Event e) {
    e.time = now_;
    events_.push_back(e);
  }

  // In instant.cc:
  void Flush();

  // ---------------------------------------------------------------- index (books.cc)
  void EnsureIndex();

  // Tie-break (docs/MECHANISM.md): lower obtain, then free before held, then
  // lower floor (the key), then lower id: the order the index's trees keep
  // (TouchRekeyed predicts their winners with it).
  bool LeafLess(const TypeIndex& ix, uint32_t a, uint32_t b) const {
    return decltype(ix.tree)::Less(ix.all_leaves(), ix.key[a], a, ix.key[b], b);
  }
  // Free: neither held nor reserved for a gang (what a free-only search takes).
  bool IsFree(const NodeState& s) const { return !s.holder.valid() && s.order_slot == UINT32_MAX; }
  // Re-keys n and queues the orders above it that reach its obtain price.
  // `wake` false: the caller knows that no order can newly cross at n (its
  // holder is unchanged and its obtain price did not fall), so the walk over
  // its ancestors' books is skipped.
  void RefreshNode(NodeId n, bool wake = true);
  // RefreshNode, with `kPending` the index's trees left for RederiveIndex
  // (TypeIndex::RekeyPending).
  template <bool kPending>
  void RefreshNodeT(NodeId n, bool wake);
  // The levels of every type's trees above the leaves re-keyed pending.
  void RederiveIndex() noexcept {
    for (TypeIndex& ix : index_) ix.RederivePending();
  }
  void AddCandidatesAbove(NodeId n, Price price) { AddCandidatesFrom(topo_.node(n).leaf, price); }
  // The same from vertex v up (v and its ancestors).
  void AddCandidatesFrom(VertexId v, Price price) {
    if (MayWake(price)) WalkCandidates(v, price);
  }
  // Whether some order may reach `price` (false is exact: a walk would queue
  // nothing). Split from the walk so that a caller reads the walk's start
  // only when it walks (issue 12: RefreshNode's NodeCold::above). Call it
  // once per walk: MayReach counts its calls.
  bool MayWake(Price price) { return price != kInfPrice && books_.MayReach(price); }
  // The walk itself, from vertex v up.
  void WalkCandidates(VertexId v, Price price);
  // Where n's candidate walk starts, with the index current: its leaf vertex
  // only if a leaf vertex's book has an order.
  VertexId WalkStart(NodeId n) const { return leaf_books_ > 0 ? topo_.node(n).leaf : node_cold_[n.value].above; }

  // Best leaf in [lo, hi) by the tie-break order: the same leaf as a search
  // with nothing to skip, from the nodes that cover the range, bottom up.
  uint32_t RangeBest(const TypeIndex& ix, uint32_t lo, uint32_t hi) const {
    return ix.tree.RangeBest(ix.all_leaves(), lo, hi);
  }

  NodeId BestNodeFor(const Order& o, bool free_only, const std::vector<NodeId>* exclude = nullptr);

  // ---------------------------------------------------------------- books (books.cc)
  BookEntry* FindEntry(Book& b, const Order& o);
  // A book entry's seq: its order's (BookEntry).
  auto EntrySeq() const {
    return [this](uint32_t slot) { return Seq(orders_[slot]); };
  }
  // The books' order (BookLess) with the seqs read through the slots.
  auto EntryLess() const {
    return [seq_of = EntrySeq()](const BookEntry& x, const BookEntry& y) { return BookLess(x, y, seq_of); };
  }
  uint32_t SlotOf(const Order& o) const { return static_cast<uint32_t>(&o - orders_.data()); }

  // The competing-demand summary of a book for change detection.
  using Summary = BookSummary;
  void BookInsert(Order& o, uint8_t flags);
  void EntryInsert(const Order& o);
  void EntryErase(const Order& o) {
    VertexId v = EffScope(o);
    auto& b = books_.Mutable(v.value);
    b.erase(FindEntry(b, o));
    if (b.empty() && V(v).node.valid()) --leaf_books_;
    books_.Retop(v.value);
  }

  void BookErase(Order& o);
  void BookReprice(Order& o, Price effective, uint64_t seq);
  void AfterBookChange(VertexId v, const Summary& before);
  Price Competing(NodeId n) const;

  // ---------------------------------------------------------------- money (ledger.cc)
  void ScheduleErase(Micros time, uint8_t kind, uint64_t id) {
    if (time == kNever) return;
    if (kind == kSchedExhaust) exhaust_sched_.Erase(time, static_cast<uint32_t>(id));
    else sched_.erase(SchedKey{time, kind, id});
  }
  void ScheduleAdd(Micros time, uint8_t kind, uint64_t id) {
    if (time == kNever) return;
    if (kind != kSchedExhaust) sched_.insert(SchedKey{time, kind, id});
    else exhaust_sched_.Insert(time, static_cast<uint32_t>(id));  // An entry already at `time` stays.
  }
  // ScheduleErase(from, ...) then ScheduleAdd(to, ...), the same schedule
  // after: the entry's tree node is re-keyed and re-linked, not freed and
  // allocated again (issue 12: a raise that brings a tenant's exhaustion
  // bound earlier moves its entry).
  void ScheduleMove(Micros from, Micros to, uint8_t kind, uint64_t id) {
    if (kind == kSchedExhaust) {
      if (to == kNever) exhaust_sched_.Erase(from, static_cast<uint32_t>(id));
      else exhaust_sched_.Move(from, to, static_cast<uint32_t>(id));
      return;
    }
    auto entry = from != kNever ? sched_.extract(SchedKey{from, kind, id}) : decltype(sched_)::node_type();
    if (to == kNever) return;
    if (entry.empty()) {
      sched_.insert(SchedKey{to, kind, id});
    } else {
      entry.value() = SchedKey{to, kind, id};
      sched_.insert(std::move(entry));
    }
  }

  void Settle(NodeId n);

  // The inputs of p(n) changed. p(n) is re-derived once the instant is
  // consistent (ApplyRates, at the end of RunInstant): a rate that moves and
  // comes back within the instant has not changed, and settling it would
  // split the ledger at an unchanged rate (3b: settled whenever p(n) changes).
  // Until then s.rate is the rate accruing since acc_since, which is what
  // settling a holding that ends at this instant must charge.
  std::vector<uint32_t> rate_dirty_;
  std::vector<uint8_t> rate_dirty_flag_;
  // A node whose queued rate SetLimit showed to be unchanged; any other
  // change to the inputs of its rate (UpdateRate) drops the mark.
  uint32_t rate_unchanged_node_ = UINT32_MAX;
  // A node SetLimit would have queued first, into an empty rate_dirty_, with
  // its rate shown unchanged: it would be settled last and do nothing, so it
  // is not queued (issue 12). If its rate's inputs change later in the
  // instant, UpdateRate puts it back at the bottom, where it would have been.
  uint32_t rate_phantom_ = UINT32_MAX;
  void UpdateRate(NodeId n);
  bool ApplyRate(NodeId n);
  bool ApplyRates();
  void StartHolding(NodeId n, TenantId tid, Price limit);
  void EndHolding(NodeId n);

  // ---------------------------------------------------------------- exhaustion (ledger.cc)
  std::vector<uint32_t> exhaust_dirty_;
  std::vector<uint8_t> exhaust_flag_;  // 0: not queued, 1: review, 2: re-schedule only.
  static constexpr uint32_t kRescheduleOnly = 1u << 31;  // Marks such a tenant in RunInstant's list.
  void MarkExhaustDirty(TenantId t);
  // The tenant's need rose in a call that passed the budget test, which
  // leaves it more than its committed need (at least the need): it cannot be
  // exhausted now, but its exhaustion bound may come earlier (issue 12).
  void MarkExhaustReschedule(TenantId t);
  Money Accrued(const Tenant& t, Micros at) const;
  Money Available(const Tenant& t, Micros at) const { return t.balance - Accrued(t, at); }

  // True if the available balance at `at` is <= `need`. O(1) and inline
  // unless the bound is too close to call, then exact over the tenant's
  // holdings (out of line).
  bool AvailableAtMost(const Tenant& t, Micros at, __int128 need) const {
    // balance - floor(A / kH) > need  <=  (balance - need) x kH > A: no division.
    if (TimesHAbove(static_cast<__int128>(t.balance) - need, AccrualAt(t, at))) return false;
    return static_cast<__int128>(Available(t, at)) <= need;
  }

  bool ExhaustedAt(const Tenant& t, Micros at) const {
    return !t.nodes.empty() && AvailableAtMost(t, at, t.need);
  }

  Micros ExhaustLowerBound(const Tenant& t) const;
  Micros ExactExhaustion(const Tenant& t) const;
  void RescheduleExhaustion(uint32_t tid);
  bool ReviewExhaustion(uint32_t tid);

  // ---------------------------------------------------------------- contests (holdings.cc)
  void MarkDirty(NodeId n);
  uint8_t CurrentReasons(NodeId n) const;

  Price NoticePrice(NodeId n) const {
    const NodeState& s = nodes_[n.value];
    if (MaintAt(n) != kNever) return kInfPrice;
    return std::max(ChallengerPrice(s), Floor(n));
  }

  void SendNotice(NodeId n);
  void SetDeadline(NodeId n, Micros d);
  void ClearContest(NodeId n);
  bool ReviewNode(NodeId n);
  void DetachChallenger(uint32_t slot, NodeId n, bool holder_won);
  void ReleaseClaims(uint32_t slot);
  void DropGang(uint32_t slot, bool cooldown);
  void ResolveDeadline(NodeId n);

  // ---------------------------------------------------------------- orders (orders.cc)
  bool OutOfMoney(const Order& o, uint32_t nodes) const {
    const Tenant& t = tenants_[o.tenant.value];
    __int128 need = static_cast<__int128>(t.need) + static_cast<__int128>(nodes) * GraceCost(Requested(o), params_.grace);
    return AvailableAtMost(t, now_, need);
  }

  void RemoveOrderFromTenant(Order& o);
  void ReleaseOrderSlot(uint32_t slot);
  void CancelOrderInternal(uint32_t slot, CancelReason why, bool detached = false);
  void FillSingle(uint32_t slot, NodeId n, bool emit_alloc);
  Price OwnClaimObtain(const Order& o, NodeId n) const;
  // In volatility.cc:
  Price ClipReference(const Order& o);
  // In volatility.cc:
  void ApplyClip(Order& o, Price requested, Price before_effective);
  // In volatility.cc:
  void ClipStep(uint32_t slot);
  void SetEffective(uint32_t slot, Price eff, uint64_t seq);

  // ---------------------------------------------------------------- matching (matching.cc)
  bool MatchOne();
  bool TrySingle(uint32_t slot);
  void BecomeChallenger(uint32_t slot, NodeId n);
  bool TryPendingToFree(uint32_t slot);
  bool TryGang(uint32_t slot);
  bool CompleteGangs();

  // ---------------------------------------------------------------- floors (floors.cc)
  // Live policies by the place they cover (issue 12): a policy on a location
  // (a static floor or maintenance window on a location, a carbon price, a
  // power cap's row) under that location, one on a single node under the
  // node. A node's floors visit the lists of its rack and the rack's
  // ancestors, and a policy change visits the nodes below its location,
  // instead of every node times every policy.
  std::vector<std::vector<uint32_t>> policies_at_location_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> policies_at_node_;
  std::vector<uint32_t>* PolicyList(const Policy& p);
  // Live staircase power caps by ascending id, the order EvaluatePower visits
  // them in: it ran at every committed-power change over every policy ever
  // added, most of them removed (issue 12).
  std::vector<uint32_t> power_caps_;
  void IndexPolicy(uint32_t id) {
    PolicyList(policies_[id])->push_back(id);
    // Ids come ascending: a new policy takes the next id, a restore indexes in id order.
    if (std::holds_alternative<PowerCapSpec>(policies_[id].spec)) power_caps_.push_back(id);
  }
  void UnindexPolicy(uint32_t id) {
    std::vector<uint32_t>* list = PolicyList(policies_[id]);
    list->erase(std::find(list->begin(), list->end(), id));
    if (auto it = std::find(power_caps_.begin(), power_caps_.end(), id); it != power_caps_.end()) power_caps_.erase(it);
  }
  // Calls f(policy) for every indexed policy that covers node n.
  template <typename F>
  void ForEachPolicyOn(NodeId n, F&& f) const {
    if (!policies_at_node_.empty()) {
      if (auto it = policies_at_node_.find(n.value); it != policies_at_node_.end()) {
        for (uint32_t id : it->second) f(policies_[id]);
      }
    }
    for (LocationId l = topo_.node(n).rack; l.valid(); l = topo_.location(l).parent) {
      if (l.value >= policies_at_location_.size()) continue;
      for (uint32_t id : policies_at_location_[l.value]) f(policies_[id]);
    }
  }
  // Calls f(node) for every live node below location loc, in no set order.
  template <typename F>
  void ForEachNodeUnder(LocationId loc, F&& f) const {
    for (size_t t = 0; t < topo_.type_count(); ++t) {
      VertexId v = topo_.VertexAt(TypeId(static_cast<uint16_t>(t)), loc);
      if (!v.valid()) continue;
      auto [lo, hi] = topo_.Range(v);
      auto order = topo_.LeafOrder(TypeId(static_cast<uint16_t>(t)));
      for (uint32_t i = lo; i < hi; ++i) f(order[i]);
    }
  }
  Price PolicyFloor(const Policy& p, NodeId n) const;
  Micros NoticedMaintStart(const Policy& p) const;
  Price FloorBesideMaintenance(NodeId n) const;

  // `pending`: the index's trees left for RederiveIndex (RefreshNodeT).
  void RecomputeFloor(NodeId n, bool pending = false);
  void ApplyFloor(NodeId n, Price f, Micros maint, bool pending = false);
  void RefloorPowerStep(const Policy& p, LocationId row, Price before);

  void RecomputeFloorsUnder(const Policy& p);

  Micros PolicyNextChange(const Policy& p) const;
  void SchedulePolicy(uint32_t id);
  static Status CheckSeries(const std::vector<std::pair<Micros, int64_t>>& series);
  static bool IsAdaptive(const PolicySpec& spec);
  static AdaptiveControl ControlOfPolicy(const PolicySpec& spec);
  int64_t Staying(const Policy& p, bool* leaving_any) const;
  void AdaptiveEvent(uint32_t id);
  bool EvaluatePower();

  // ---------------------------------------------------------------- decay (volatility.cc)
  Micros DecayCrossing(uint32_t i) const;

  // The earliest decay crossing, cached (issue 12: every call's NextTime
  // asked every decaying node). A node's next crossing does not move while
  // time passes before it: the highest resting price below its floor stays
  // the highest one until the floor reaches it. So each node's crossing holds
  // until then, or until one of its inputs changes: a book above it (the
  // books' recent changes; more than BookTable::kRecent since the last look
  // recompute every node), its own state (RefreshNode of a decaying node outside RefreshDecay,
  // whose re-keying only follows time; decay starting or stopping), the
  // topology (its generation), or the parameters (SetParams). Each node's
  // crossing is cached in decay_cross_, and the minimum over them in
  // decay_next_.
  static constexpr Micros kCrossUnknown = std::numeric_limits<Micros>::min();
  Micros NextDecay() const {
    if (decaying_.empty()) return kNever;
    const uint64_t books = books_.generation();
    if (decay_next_valid_ && !decay_node_changed_ && decay_next_ > now_ && decay_next_books_ == books &&
        decay_next_topo_ == topo_.generation()) {
      return decay_next_;
    }
    const bool all = !decay_next_valid_ || decay_next_topo_ != topo_.generation() ||
                     books - decay_next_books_ > BookTable::kRecent;
    if (decay_cross_.size() < nodes_.size()) decay_cross_.resize(nodes_.size(), kCrossUnknown);
    // The books changed since the last look, each vertex's type and leaf range read once for
    // all the nodes (issue 12: each node read every change's vertex, about 2M times in the
    // stress replay). Without `all`, the topology is as then: its ranges are current.
    ChangedRange changed[BookTable::kRecent];
    size_t changes = 0;
    if (!all) {
      for (uint64_t g = decay_next_books_ + 1; g <= books; ++g) {
        const VertexId v(books_.changed_at(g));
        const auto [lo, hi] = topo_.Range(v);
        const ChangedRange x{V(v).type.value, lo, hi};
        bool seen = false;
        for (size_t k = 0; k < changes; ++k) {
          seen = seen || (changed[k].type == x.type && changed[k].lo == x.lo && changed[k].hi == x.hi);
        }
        if (seen) continue;
        // A range of few leaves has its nodes' crossings forgotten through the leaf order
        // (issue 12: every decaying node was tested against every changed range, about 4.6M
        // tests in the stress replay, mostly for a rack's few leaves). The nodes under it are
        // exactly those of the leaf order in [lo, hi) (a removed node is in no range, as
        // ChangedAbove finds too); one not in decaying_ is marked unknown harmlessly, as a
        // node entering the list is marked on its start anyway (StartDecay). A wide range
        // is tested node by node below, as before.
        if (x.hi - x.lo <= 4 * decaying_.size()) {
          const std::span<const NodeId> order = topo_.LeafOrder(TypeId(static_cast<uint16_t>(x.type)));
          for (uint32_t leaf = x.lo; leaf < x.hi; ++leaf) decay_cross_[order[leaf].value] = kCrossUnknown;
        } else {
          changed[changes++] = x;
        }
      }
    }
    Micros best = kNever;
    if (all) {
      for (uint32_t i : decaying_) {
        Micros& c = decay_cross_[i];
        c = DecayCrossing(i);
        best = std::min(best, c);
      }
    } else {
      for (uint32_t i : decaying_) {
        Micros& c = decay_cross_[i];
        // kCrossUnknown is below every time: `c <= now_` finds it too.
        if (c <= now_ || ChangedAbove(i, changed, changes)) c = DecayCrossing(i);
        best = std::min(best, c);
      }
    }
    decay_next_ = best;
    decay_next_valid_ = true;
    decay_node_changed_ = false;
    decay_next_books_ = books;
    decay_next_topo_ = topo_.generation();
    return decay_next_;
  }
  // A changed book's vertex: its type and its range of leaves.
  struct ChangedRange {
    uint32_t type, lo, hi;
  };
  // True if one of the `count` changed books is at a vertex above node i.
  bool ChangedAbove(uint32_t i, const ChangedRange* changed, size_t count) const {
    if (count == 0) return false;
    const uint32_t type = nodes_[i].type.value;
    const uint32_t leaf = topo_.LeafIndex(NodeId(i));
    for (size_t k = 0; k < count; ++k) {
      if (changed[k].type == type && changed[k].lo <= leaf && leaf < changed[k].hi) return true;
    }
    return false;
  }
  mutable Micros decay_next_ = kNever;
  mutable bool decay_next_valid_ = false;
  mutable bool decay_node_changed_ = false;
  mutable uint64_t decay_next_books_ = 0, decay_next_topo_ = 0;
  mutable std::vector<Micros> decay_cross_;  // By node: its next crossing, kCrossUnknown if not known.
  bool refreshing_decay_ = false;  // RefreshDecay is re-keying decaying nodes for the time.
  // By node: until when RefreshDecay's visit of it changes nothing (issue 12: most visits of a
  // time step found the decayed floor where the node's key already had it). Set by a visit with
  // the index current, for the decay record, beta and base floor it read: before `until` the
  // decay has not come one micro-unit further (the floor is above its base floor) or has not
  // reached the price paid (the floor rests on its base floor, where it stays until the decay
  // ends; with beta 0, until beta changes). A visit before `until` with the node still free and
  // unreserved, the same base floor and the same index generation skips the node; any other
  // change of its inputs (its decay starting or stopping, a RefreshNode of it, beta) clears its
  // entry below. Not in snapshots: a restored engine starts with none, and its first visits set
  // them; a skipped visit is one that would have changed nothing, so both answer alike.
  struct DecayWake {
    Micros until = std::numeric_limits<Micros>::min();
    Price base = 0;
  };
  std::vector<DecayWake> decay_wake_;
  uint64_t decay_wake_generation_ = 0;  // The index generation the entries were set at.
  // The least `until` over the nodes of decaying_ after RefreshDecay's last pass, if that pass
  // left every node of the list running with its wake set and nothing cleared a wake since;
  // else kDecayQuietNone. Before it, with the index current as then, a pass would skip every
  // visit and keep every entry, so RefreshDecay returns at once (issue 12: about two in three
  // time steps of the stress replay). Not in snapshots: a restored engine starts with none.
  static constexpr Micros kDecayQuietNone = std::numeric_limits<Micros>::min();
  Micros decay_quiet_until_ = kDecayQuietNone;
  void DecayInputsChanged() {
    decay_next_valid_ = false;
    std::fill(decay_wake_.begin(), decay_wake_.end(), DecayWake{});
    decay_quiet_until_ = kDecayQuietNone;
  }
  // Node n's own inputs changed: only its crossing is recomputed.
  void DecayInputsChanged(NodeId n) {
    if (n.value < decay_cross_.size()) decay_cross_[n.value] = kCrossUnknown;
    if (n.value < decay_wake_.size()) decay_wake_[n.value] = DecayWake{};
    decay_quiet_until_ = kDecayQuietNone;
    decay_node_changed_ = true;
  }

  void RefreshDecay();
  void RekeyDecayed(NodeId n, Price f);

  // ---------------------------------------------------------------- price events (instant.cc)
  // Out of line: inlined, they made RefreshNode's every call dearer.
  void TouchVertex(VertexId v);
  void TouchAncestors(VertexId v);
  void TouchRekeyed(const TypeIndex& ix, uint32_t leaf, VertexId v);
  void SizeTouched() {
    if (vertex_touched_.size() < topo_.vertex_count()) vertex_touched_.resize(topo_.vertex_count(), 0);
  }
  void MarkTouched(uint32_t v) {
    if (!vertex_touched_[v]) {
      vertex_touched_[v] = 1;
      touched_vertices_.push_back(v);
    }
  }
  void EmitPriceChanges();
  Price QuoteOf(VertexId v);
  // QuoteOf with the index known to be current; `winner` (if given) gets the
  // leaf whose obtain price it is (UINT32_MAX for none).
  Price IndexedQuote(VertexId v, uint32_t* winner = nullptr) const;

  // ---------------------------------------------------------------- the instant (instant.cc)
  // Runs everything due at now_ until nothing changes (DESIGN.md 3b "One instant").
  // Then settles the rates that changed, unless `settle_rates` is false: the
  // instant of a call's own time is settled once, after the call's operation.
  // Inline for the common case of an uncontested limit change: with nothing
  // pending the loop's first round would find every list empty and end
  // (ApplyRates only drops rate_phantom_), so it is not entered (issue 12).
  void RunInstant(bool settle_rates = true) {
    if (!InstantQuiet()) {
      RunInstantLoop(settle_rates);
    } else if (settle_rates) {
      rate_phantom_ = UINT32_MAX;
    }
  }
  void RunInstantLoop(bool settle_rates);
  // Nothing for the instant loop to do (issue 12): no node to review, no
  // scheduled work due, no gang to complete, no tenant's exhaustion queued,
  // no candidate order, no rate to settle (rate_phantom_ is settled with
  // nothing to do). RunInstant's first round would then change nothing.
  bool InstantQuiet() const {
    return dirty_nodes_.empty() && (sched_.empty() || sched_.begin()->time > now_) &&
           (exhaust_sched_.empty() || exhaust_sched_.top_time() > now_) &&
           gangs_to_check_.empty() &&
           exhaust_dirty_.empty() && candidates_.empty() && rate_dirty_.empty();
  }
  void RunDue();

  Micros NextTime() const {
    Micros t = sched_.empty() ? kNever : sched_.begin()->time;
    return std::min({t, exhaust_sched_.top_time(), NextDecay()});
  }

  Status AdvanceTo(Micros t);

  // Every public mutating call: advance to t, then run `op`, then settle the instant.
  // Results are built in place in the caller (CallAt has one named result):
  // a Status moved through each layer costs a string move per layer.
  template <typename F>
  auto Call(Micros t, F&& op) -> decltype(op()) {
    if (t < now_) {  // AdvanceTo refuses it and changes nothing.
      Flush();
      return AdvanceTo(t);
    }
    return CallAt(t, op);
  }
  template <typename F>
  auto CallAt(Micros t, F& op) -> decltype(op()) {
    // At the engine's own time with nothing due, AdvanceTo has nothing to do.
    if (t != now_ || NextTime() <= now_) (void)AdvanceTo(t);
    decltype(op()) r = op();
    RunInstant();
    Flush();
    return r;
  }

  // ---------------------------------------------------------------- validation (orders.cc)
  Status CheckPrice(Price p, const char* field) const {
    if (const char* why = PriceProblem(p)) return InvalidArgument(std::string(field) + ": " + why);
    return Status::Ok();
  }
  bool TenantExists(TenantId t) const { return t.valid() && t.value < tenants_.size(); }
  bool NodeExists(NodeId n) const { return n.valid() && n.value < nodes_.size() && nodes_[n.value].alive; }
  Status CheckTenant(TenantId t) const {
    if (!TenantExists(t)) return NotFound("tenant: no tenant with id " + Num(t.value));
    return Status::Ok();
  }
  Status CheckNode(NodeId n) const {
    if (!NodeExists(n)) return NotFound("node: no live node with id " + Num(n.value));
    return Status::Ok();
  }

  // In ledger.cc:
  // Budget test (rule 7), applied when the committed rate increases: the
  // verdict inline, the refusal's message out of line (issue 12).
  bool BudgetPasses(const Tenant& t, __int128 add_rate, __int128 add_need) const {
    if (add_rate <= 0) return true;
    if (t.max_rate != kInfPrice && static_cast<__int128>(t.committed) + add_rate > t.max_rate) return false;
    return !AvailableAtMost(t, now_, static_cast<__int128>(t.committed_need) + add_need);
  }
  Status CheckBudget(const Tenant& t, __int128 add_rate, __int128 add_need) const {
    if (BudgetPasses(t, add_rate, add_need)) return Status::Ok();
    return BudgetRefusal(t, add_rate, add_need);
  }
  // In ledger.cc: the error of a call that fails the budget test.
  Status BudgetRefusal(const Tenant& t, __int128 add_rate, __int128 add_need) const;
  Result<OrderId> Place(TenantId tid, const OrderSpec& spec);
  VertexId Narrow(VertexId scope, LocationId loc) const;
  void ResolveWaitingOrders();
  Result<uint32_t> FindOwnOrder(TenantId tid, OrderId id) const;
  Status Update(TenantId tid, OrderId id, Price price);
  // In holdings.cc:
  Status SetLimitImpl(TenantId tid, NodeId n, Price limit);
  // In holdings.cc:
  Status RelinquishImpl(TenantId tid, NodeId n);
};

}  // namespace laissez::market
