// The per-vertex book (issue 12: its first entry inline) against a std::vector
// of the same entries, through inserts and erases at every position, the move
// to the heap and back, moves of the book itself and a snapshot's assign_empty.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "market/engine/engine_impl.h"

namespace laissez::market::engine_internal {
namespace {

BookEntry Entry(uint64_t seq) { return BookEntry{static_cast<Price>(seq * 7 % 13), seq, static_cast<uint32_t>(seq % 1000), 0, 3}; }

void ExpectSame(const Book& b, const std::vector<BookEntry>& want) {
  ASSERT_EQ(b.size(), want.size());
  EXPECT_EQ(b.empty(), want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(b.begin()[i].seq, want[i].seq) << "entry " << i;
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
    if (step % 97 == 0) {  // Moves keep the entries and leave the source empty.
      Book moved(std::move(b));
      ASSERT_NO_FATAL_FAILURE(ExpectSame(moved, want));
      b = std::move(moved);
      ASSERT_NO_FATAL_FAILURE(ExpectSame(b, want));
    }
  }
}

TEST(BookEntries, SummaryAndAssignEmpty) {
  Book b;
  b.set_summary(BookSummary{5, 2, 3});
  EXPECT_EQ(b.summary(), (BookSummary{5, 2, 3}));
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{9}, size_t{1}}) {
    b.assign_empty(n);
    ASSERT_EQ(b.size(), n);
    for (BookEntry& e : b) e = Entry(n);
    for (const BookEntry& e : b) EXPECT_EQ(e.seq, n);
  }
  EXPECT_EQ(b.summary(), (BookSummary{5, 2, 3}));  // The entries' storage does not touch the summary.
}

}  // namespace
}  // namespace laissez::market::engine_internal
