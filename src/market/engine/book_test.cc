// The per-vertex book (issue 12: its first entry inline) against a std::vector
// of the same entries, through inserts and erases at every position, the move
// to the heap and back, moves of the book itself and a snapshot's assign_empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "market/engine/engine_impl.h"

namespace laissez::market::engine_internal {
namespace {

// Some entries flagged (pending or gang) and tenants repeating, so summaries
// vary. The slot is the seq: the entry's seq is its order's (BookEntry), and
// here an order is its slot.
BookEntry Entry(uint64_t seq) {
  return BookEntry{static_cast<Price>(seq * 7 % 13), static_cast<uint32_t>(seq),
                   static_cast<uint32_t>(seq % 5 == 0 ? kFlagPending : 0), static_cast<uint32_t>(seq % 3)};
}
bool Less(const BookEntry& a, const BookEntry& b) {
  return BookLess(a, b, [](uint32_t slot) { return uint64_t{slot}; });
}

void ExpectSame(const Book& b, const std::vector<BookEntry>& want) {
  ASSERT_EQ(b.size(), want.size());
  EXPECT_EQ(b.empty(), want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(b.begin()[i].price, want[i].price) << "entry " << i;
    EXPECT_EQ(static_cast<uint32_t>(b.begin()[i].slot), static_cast<uint32_t>(want[i].slot)) << "entry " << i;
  }
}

TEST(BookEntries, MatchesAVectorThroughRandomInsertsAndErases) {
  std::mt19937_64 rng(12);
  Book b;
  std::vector<BookEntry> want;
  uint64_t seq = 0;
  for (int step = 0; step < 20000; ++step) {
    // Drift between empty, one entry and a few dozen, so the book moves to the heap and back often.
    bool grow = want.size() < 2 ? rng() % 4 != 0 : rng() % 100 < (want.size() < 40 ? 50 : 30);
    if (grow) {
      size_t at = rng() % (want.size() + 1);
      BookEntry e = Entry(++seq);
      b.insert(b.begin() + at, e);
      want.insert(want.begin() + static_cast<ptrdiff_t>(at), e);
    } else if (!want.empty()) {
      size_t at = rng() % want.size();
      b.erase(b.begin() + at);
      want.erase(want.begin() + static_cast<ptrdiff_t>(at));
    }
    ASSERT_NO_FATAL_FAILURE(ExpectSame(b, want)) << "step " << step;
    // As BookTable::Retop does after every change: the summary read back is Summarize's.
    b.set_summary(BookTable::Summarize(b));
    ASSERT_EQ(b.summary(), BookTable::Summarize(b)) << "step " << step << ", " << want.size() << " entries";
    if (step % 97 == 0) {  // Moves keep the entries and leave the source empty.
      Book moved(std::move(b));
      ASSERT_NO_FATAL_FAILURE(ExpectSame(moved, want));
      b = std::move(moved);
      ASSERT_NO_FATAL_FAILURE(ExpectSame(b, want));
    }
  }
}

TEST(BookEntries, SummaryOfAnInlineEntryIsDerivedAndAHeapOneStored) {
  Book b;
  EXPECT_EQ(b.summary(), BookSummary{});
  BookEntry e{40, 7, 0, 2};
  b.insert(b.begin(), e);
  EXPECT_EQ(b.summary(), (BookSummary{40, 2, 0}));  // Derived: nothing to store.
  b.begin()->flags = kFlagPending;
  EXPECT_EQ(b.summary(), BookSummary{});  // A pending entry is no resting demand.
  b.begin()->flags = 0;
  b.insert(b.end(), BookEntry{30, 8, 0, 3});  // To the heap, the summary carried along.
  EXPECT_EQ(b.summary(), (BookSummary{40, 2, 0}));
  b.set_summary(BookSummary{40, 2, 30});
  b.erase(b.begin());  // Still on the heap with one entry: stored until the next set_summary.
  EXPECT_EQ(b.summary(), (BookSummary{40, 2, 30}));
  Book moved(std::move(b));
  EXPECT_EQ(moved.summary(), (BookSummary{40, 2, 30}));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.summary(), BookSummary{});
}

TEST(BookEntries, AssignEmpty) {
  Book b;
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{9}, size_t{1}, size_t{0}}) {
    b.assign_empty(n);
    ASSERT_EQ(b.size(), n);
    for (BookEntry& e : b) e = Entry(n);
    for (const BookEntry& e : b) EXPECT_EQ(e.slot, n);
  }
}

// The book's state lives in its inline entry's slot bits (16 bytes, issue
// 12): an entry with the highest order slot, both flags and any tenant is one
// entry, neither an empty book nor a heap one, inline and on the heap.
TEST(BookEntries, ExtremeSlotsFlagsAndTenantsAreEntries) {
  static_assert(sizeof(Book) == 16);
  const BookEntry top{-5, kMaxOrderSlots - 1, kFlagGang | kFlagPending, UINT32_MAX};
  Book b;
  b.insert(b.begin(), top);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_FALSE(b.empty());
  EXPECT_EQ(b.front().slot, kMaxOrderSlots - 1);
  EXPECT_EQ(b.front().tenant, UINT32_MAX);
  EXPECT_EQ(b.front().flags, kFlagGang | kFlagPending);
  b.insert(b.end(), BookEntry{-6, 0, 0, UINT32_MAX - 1});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b.begin()[0].slot, kMaxOrderSlots - 1);
  EXPECT_EQ(b.begin()[1].tenant, UINT32_MAX - 1);
  b.erase(b.begin());
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b.front().slot, 0u);
  b.erase(b.begin());
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.size(), 0u);
}

// insert's argument may be an entry of the same book: the move to the heap
// overwrites the inline entry, a regrowth frees the old block and the shift
// overwrites the entries after `pos` (review of issue 12). The inline and the
// spare-capacity cases read a wrong entry when insert copies `e` late; the
// full-heap case reads a freed block, which only a sanitizer build sees.
TEST(BookEntries, InsertsACopyOfAnEntryOfTheSameBook) {
  auto fill = [](Book& b, std::vector<BookEntry>& want, size_t n) {
    for (uint64_t s = 1; s <= n; ++s) {
      BookEntry e{static_cast<Price>(100 - s), static_cast<uint32_t>(s), 0, static_cast<uint32_t>(s)};
      b.insert(b.end(), e);
      want.push_back(e);
    }
  };
  // n entries before the insert: 1 (inline, full), 2 (heap, full), 3 (heap, one spare).
  for (size_t n : {size_t{1}, size_t{2}, size_t{3}}) {
    for (size_t from = 0; from < n; ++from) {
      for (size_t at = 0; at <= n; ++at) {
        Book b;
        std::vector<BookEntry> want;
        fill(b, want, n);
        BookEntry copy = want[from];
        b.insert(b.begin() + at, b.begin()[from]);
        want.insert(want.begin() + static_cast<ptrdiff_t>(at), copy);
        ASSERT_NO_FATAL_FAILURE(ExpectSame(b, want)) << n << " entries, from " << from << " at " << at;
      }
    }
  }
}

TEST(BookEntries, RegrowthOnTheHeapKeepsTheStoredSummary) {
  Book b;
  for (uint64_t s = 1; s <= 2; ++s) b.insert(b.end(), Entry(s));
  const BookSummary stored{77, 4, 66};  // Not Summarize's: only a copy carries it.
  b.set_summary(stored);
  for (uint64_t s = 3; s <= 40; ++s) {  // Regrows at 2, 4, 8 and 16 entries, then by an eighth (18, 20, 22, ...).
    b.insert(b.begin(), Entry(s));
    ASSERT_EQ(b.summary(), stored) << s << " entries";
  }
}

// The table itself: Mutable allocates a vertex's book on first use and the
// pool grows under books that are inline or on the heap; top and summary
// follow Retop.
TEST(BookTables, PoolGrowthRetopAndSummaries) {
  constexpr uint32_t kVertices = 60;
  BookTable t;
  t.Resize(kVertices);
  std::vector<std::vector<BookEntry>> want(kVertices);
  std::mt19937_64 rng(7);
  uint64_t seq = 0;
  auto check = [&](const char* when) {
    for (uint32_t v = 0; v < kVertices; ++v) {
      ASSERT_NO_FATAL_FAILURE(ExpectSame(t[v], want[v])) << when << ", vertex " << v;
      EXPECT_EQ(t.top(v), want[v].empty() ? -1 : want[v].front().price) << when << ", vertex " << v;
      EXPECT_EQ(t.summary(v), BookTable::Summarize(t[v])) << when << ", vertex " << v;
    }
  };
  // Vertices in a shuffled order, every third with a second entry (on the
  // heap), so the pool regrows (16, 34, 54, then 76 books) under both kinds.
  std::vector<uint32_t> order(kVertices);
  for (uint32_t v = 0; v < kVertices; ++v) order[v] = v;
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t v : order) {
    uint64_t before = t.generation();
    Book& b = t.Mutable(v);
    EXPECT_EQ(t.generation(), before + 1);
    for (int k = 0; k < (v % 3 == 0 ? 2 : 1); ++k) {
      BookEntry e = Entry(++seq);
      auto at = std::upper_bound(want[v].begin(), want[v].end(), e, Less);
      b.insert(b.begin() + (at - want[v].begin()), e);
      want[v].insert(at, e);
    }
    t.Retop(v);
  }
  ASSERT_NO_FATAL_FAILURE(check("after the inserts"));
  size_t total = 0;
  for (const auto& w : want) total += w.size();
  EXPECT_EQ(t.total_entries(), total);
  // Erase every entry of some books: Retop leaves no top and an empty summary.
  for (uint32_t v = 0; v < kVertices; v += 2) {
    Book& b = t.Mutable(v);
    while (!b.empty()) b.erase(b.end() - 1);
    want[v].clear();
    t.Retop(v);
    EXPECT_EQ(t.top(v), -1);
    EXPECT_EQ(t.summary(v), BookSummary{});
  }
  ASSERT_NO_FATAL_FAILURE(check("after the erases"));
}

// MayReach against the books' tops (issue 12: a lowered limit skips its
// candidate walk when it says no): never no while a top reaches the price, and
// a bound left above every top (its last book emptied or fell) comes back to
// the highest top within a sixteenth of the vertices' checks.
TEST(BookTables, MayReachBoundsTheTopsAndTightens) {
  constexpr uint32_t kVertices = 64;
  BookTable t;
  t.Resize(kVertices);
  EXPECT_FALSE(t.MayReach(0));
  std::mt19937_64 rng(5);
  uint64_t seq = 0;
  for (int step = 0; step < 5000; ++step) {
    uint32_t v = static_cast<uint32_t>(rng() % kVertices);
    Book& b = t.Mutable(v);
    if (!b.empty() && rng() % 2 == 0) {
      b.erase(b.begin());
    } else {
      BookEntry e = Entry(++seq);
      e.price = static_cast<Price>(rng() % 40);
      b.insert(std::upper_bound(b.begin(), b.end(), e, Less), e);
    }
    t.Retop(v);
    Price high = -1;
    for (uint32_t u = 0; u < kVertices; ++u) high = std::max(high, t.top(u));
    ASSERT_GE(t.top_bound(), high) << "step " << step;
    if (high >= 0) {
      ASSERT_TRUE(t.MayReach(high)) << "step " << step;
    }
    for (uint32_t i = 0; i <= kVertices / 16; ++i) t.MayReach(0);
    ASSERT_EQ(t.top_bound(), high) << "step " << step;
    ASSERT_FALSE(t.MayReach(high + 1)) << "step " << step;  // No walk above the highest top.
    if (high >= 0) {
      ASSERT_TRUE(t.MayReach(high)) << "step " << step;
    }
  }
}

// The open-addressing table of order slots (issue 12: OrderIndex, SlotPrices)
// against a std::map: random inserts, erases and finds, keys derived from
// slots as the engine's are (an id per slot, or the slot itself), through
// growths to capacities that are not powers of two, with runs that wrap past
// the last bucket (backward-shift deletion across the wrap).
TEST(SlotTables, MatchAMapThroughInsertsErasesAndGrowth) {
  std::mt19937_64 rng(12);
  std::vector<uint64_t> key(5000);  // By slot: distinct, clustered keys.
  for (size_t s = 0; s < key.size(); ++s) key[s] = s * 3 + (s % 7 == 0 ? 1 : 0);
  auto key_of = [&](uint32_t s) { return key[s]; };
  using Slots = SlotTable<void, 3, 4>;
  using Prices = SlotTable<Price, 1, 2>;
  Slots slots;
  Prices prices;
  std::map<uint32_t, Price> want;
  for (int step = 0; step < 40000; ++step) {
    uint32_t s = static_cast<uint32_t>(rng() % (step < 20000 ? key.size() : 300));
    bool present = want.count(s) != 0;
    if (rng() % 3 != 0 && !present) {
      Price p = static_cast<Price>(rng() % 1000);
      slots.Insert(s, key_of);
      prices.Insert(s, [](uint32_t x) { return uint64_t{x}; }, p);
      want[s] = p;
    } else if (present) {
      slots.Erase(key[s], key_of);
      prices.Erase(s, [](uint32_t x) { return uint64_t{x}; });
      want.erase(s);
    }
    ASSERT_EQ(slots.size(), want.size());
    ASSERT_EQ(prices.size(), want.size());
    if (step % 97 == 0) {
      for (uint32_t q = 0; q < key.size(); q += 1 + static_cast<uint32_t>(rng() % 5)) {
        auto it = want.find(q);
        ASSERT_EQ(slots.Find(key[q], key_of), it == want.end() ? Slots::kNone : q) << "step " << step;
        size_t b = prices.Bucket(q, [](uint32_t x) { return uint64_t{x}; });
        ASSERT_EQ(b == Prices::kNone ? Price{-1} : prices.value_at(b), it == want.end() ? -1 : it->second)
            << "step " << step;
      }
      std::vector<uint32_t> listed;
      slots.ForEach([&](uint32_t x) { listed.push_back(x); });
      std::sort(listed.begin(), listed.end());
      std::vector<uint32_t> expect;
      for (const auto& [x, p] : want) expect.push_back(x);
      ASSERT_EQ(listed, expect) << "step " << step;
    }
  }
}

// A tenant's open-order list (SlotList, issue 12): inline up to kInline
// slots, then on the heap, against a std::vector through appends, pops and
// erases; and its data pointer, which points into the list itself while the
// slots are inline, stays right when a vector of lists (Impl::tenants_)
// moves them as it grows, and through copies.
TEST(SlotListTest, MatchesAVectorInlineAndOnTheHeapAndThroughMoves) {
  std::mt19937 rng(5);
  std::vector<SlotList> lists;
  std::vector<std::vector<uint32_t>> want;
  for (uint32_t round = 0; round < 60; ++round) {
    // Each new list moves the others (the vector reallocates now and then).
    lists.emplace_back();
    want.emplace_back();
    for (size_t i = 0; i < lists.size(); ++i) {
      SlotList& l = lists[i];
      std::vector<uint32_t>& w = want[i];
      uint32_t op = rng() % 6;  // Two appends in three: the early lists pass kInline.
      if (op < 4 || w.empty()) {
        uint32_t s = rng();
        l.push_back(s);
        w.push_back(s);
      } else if (op == 4) {
        l.pop_back();
        w.pop_back();
      } else {
        size_t k = rng() % w.size();
        l.erase(l.begin() + k);
        w.erase(w.begin() + static_cast<std::ptrdiff_t>(k));
      }
      ASSERT_EQ(l.size(), w.size());
      ASSERT_TRUE(std::equal(l.begin(), l.end(), w.begin(), w.end())) << "list " << i << " round " << round;
      if (!w.empty()) {
        EXPECT_EQ(l.back(), w.back());
      }
    }
  }
  // Lists past kInline went to the heap; copies and moves of both kinds.
  size_t on_heap = 0;
  for (size_t i = 0; i < lists.size(); ++i) {
    on_heap += want[i].size() > SlotList::kInline;
    SlotList copy(lists[i]);
    SlotList moved(std::move(copy));
    moved.push_back(7);
    want[i].push_back(7);
    EXPECT_TRUE(std::equal(moved.begin(), moved.end(), want[i].begin(), want[i].end()));
    lists[i] = moved;
    EXPECT_TRUE(std::equal(lists[i].begin(), lists[i].end(), want[i].begin(), want[i].end()));
    EXPECT_TRUE(copy.empty());
  }
  EXPECT_GT(on_heap, 0u);
  EXPECT_LT(on_heap, lists.size());
}

}  // namespace
}  // namespace laissez::market::engine_internal
