// MinTree (the index's 4-ary and 8-ary trees, and a binary one) against a brute-force scan of the same
// leaves: the least leaf by (key, tie) over random ranges, with and without
// leaves skipped, through random key moves (up and down, many ties) and
// membership changes, at sizes around the powers of four.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "market/engine/min_tree.h"

namespace laissez::market::engine_internal {
namespace {

using Key = unsigned __int128;
constexpr uint32_t kNone = UINT32_MAX;

struct Leaves {
  std::vector<Key> keys;
  std::vector<uint32_t> ties;
  std::vector<uint8_t> in;
  Key key(uint32_t i) const { return keys[i]; }
  uint32_t tie(uint32_t i) const { return ties[i]; }
  bool present(uint32_t i) const { return in[i] != 0; }
};

// The least present leaf in [lo, hi) that skip does not reject, by a scan.
template <typename Skip>
uint32_t Scan(const Leaves& lv, uint32_t lo, uint32_t hi, Skip&& skip) {
  uint32_t best = kNone;
  for (uint32_t i = lo; i < hi; ++i) {
    if (!lv.present(i) || skip(i)) continue;
    if (best == kNone || lv.keys[i] < lv.keys[best] ||
        (lv.keys[i] == lv.keys[best] && lv.ties[i] < lv.ties[best])) {
      best = i;
    }
  }
  return best;
}

// A key like the index's: obtain in the high half, a held bit, a floor; few
// distinct values so that equal keys (decided by the tie) are common.
Key RandomKey(std::mt19937_64& rng) {
  return static_cast<Key>(rng() % 6) << 64 | static_cast<Key>(rng() % 2) << 63 | rng() % 3;
}

template <typename Tree>
void CheckQueries(const Tree& tree, const Leaves& lv, uint32_t n, std::mt19937_64& rng) {
  auto none = [](uint32_t) { return false; };
  ASSERT_EQ(tree.Root(), Scan(lv, 0, n, none));
  for (int q = 0; q < 20; ++q) {
    uint32_t lo = static_cast<uint32_t>(rng() % (n + 1)), hi = static_cast<uint32_t>(rng() % (n + 1));
    if (lo > hi) std::swap(lo, hi);
    ASSERT_EQ(tree.RangeBest(lv, lo, hi), Scan(lv, lo, hi, none)) << "range " << lo << ".." << hi;
    std::vector<uint8_t> skipped(n);
    for (auto& s : skipped) s = rng() % 3 == 0;
    auto skip = [&](uint32_t i) { return skipped[i] != 0; };
    ASSERT_EQ(tree.FindBest(lv, lo, hi, skip), Scan(lv, lo, hi, skip)) << "range " << lo << ".." << hi;
    ASSERT_EQ(tree.FindBest(lv, lo, hi, none), Scan(lv, lo, hi, none)) << "range " << lo << ".." << hi;
  }
}

template <uint32_t kBits>
void MatchesAScan() {
  std::mt19937_64 rng(7 + kBits);
  for (uint32_t n : {1u, 2u, 3u, 4u, 5u, 15u, 16u, 17u, 63u, 64u, 65u, 100u, 255u, 256u, 257u, 1000u}) {
    for (bool all : {true, false}) {
      Leaves lv;
      lv.keys.resize(n);
      lv.in.assign(n, 1);
      lv.ties.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        lv.keys[i] = RandomKey(rng);
        lv.ties[i] = static_cast<uint32_t>((i * 7919u + 13u) % 100003u);  // Not the leaf order.
        if (!all) lv.in[i] = rng() % 2;
      }
      MinTree<kBits> tree;
      tree.Build(lv, n);
      CheckQueries(tree, lv, n, rng);
      for (int step = 0; step < 300; ++step) {
        uint32_t leaf = static_cast<uint32_t>(rng() % n);
        if (!all && rng() % 3 == 0) {
          lv.in[leaf] = !lv.in[leaf];
          if (rng() % 2) lv.keys[leaf] = RandomKey(rng);
          tree.Update(lv, leaf);
        } else {
          Key old = lv.keys[leaf];
          lv.keys[leaf] = RandomKey(rng);
          if (lv.keys[leaf] == old) continue;
          // Moved is for a present leaf; Update for any.
          if (lv.present(leaf) && rng() % 4 != 0) {
            tree.Moved(lv, leaf, lv.keys[leaf] < old);
          } else {
            tree.Update(lv, leaf);
          }
        }
        CheckQueries(tree, lv, n, rng);
      }
    }
  }
}

TEST(MinTree, MatchesAScanThroughRandomMovesAndMembershipChanges) {
  MatchesAScan<1>();
  MatchesAScan<2>();  // The tree of every node.
  MatchesAScan<3>();  // The free nodes' tree.
}

// UpdateMany after several leaves changed at once (a run, as a power step's row,
// or scattered): every query as after one Update per leaf (issue 12).
template <uint32_t kBits>
void UpdateManyMatchesAScan() {
  std::mt19937_64 rng(23 + kBits);
  for (uint32_t n : {1u, 4u, 5u, 17u, 64u, 65u, 300u}) {
    Leaves lv;
    lv.keys.resize(n);
    lv.ties.resize(n);
    lv.in.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      lv.keys[i] = RandomKey(rng);
      lv.ties[i] = (i * 7919u + 13u) % 100003u;
      lv.in[i] = rng() % 4 != 0;
    }
    MinTree<kBits> tree;
    tree.Build(lv, n);
    for (int step = 0; step < 100; ++step) {
      std::vector<uint32_t> changed;
      const uint32_t lo = static_cast<uint32_t>(rng() % n), len = 1 + static_cast<uint32_t>(rng() % 40);
      for (uint32_t i = lo; i < n && i < lo + len; ++i) {
        if (step % 2 == 0 || rng() % 4 == 0) changed.push_back(i);  // A run, or scattered.
      }
      for (uint32_t i : changed) {
        lv.keys[i] = RandomKey(rng);
        if (rng() % 5 == 0) lv.in[i] = !lv.in[i];
      }
      tree.UpdateMany(lv, &changed);
      CheckQueries(tree, lv, n, rng);
    }
  }
}

TEST(MinTree, UpdateManyMatchesAScanAfterRunsAndScatteredChanges) {
  UpdateManyMatchesAScan<2>();
  UpdateManyMatchesAScan<3>();
}

// RangeBest answers a range of one leaf and the range of every leaf without a
// walk (issue 12): the one leaf only if present, the root's winner after moves.
TEST(MinTree, OneLeafAndWholeRangesFollowMovesAndMembership) {
  std::mt19937_64 rng(11);
  auto none = [](uint32_t) { return false; };
  for (uint32_t n : {1u, 2u, 5u, 16u, 17u, 100u}) {
    Leaves lv;
    lv.keys.resize(n);
    lv.ties.resize(n);
    lv.in.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      lv.keys[i] = RandomKey(rng);
      lv.ties[i] = n - i;
      lv.in[i] = rng() % 3 != 0;
    }
    MinTree<2> tree;
    tree.Build(lv, n);
    for (int step = 0; step < 200; ++step) {
      uint32_t leaf = static_cast<uint32_t>(rng() % n);
      if (rng() % 3 == 0) lv.in[leaf] = !lv.in[leaf];
      lv.keys[leaf] = RandomKey(rng);
      tree.Update(lv, leaf);
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(tree.RangeBest(lv, i, i + 1), Scan(lv, i, i + 1, none)) << i;
      }
      ASSERT_EQ(tree.RangeBest(lv, 0, n), Scan(lv, 0, n, none));
      if (n > 1) {
        ASSERT_EQ(tree.RangeBest(lv, 1, n), Scan(lv, 1, n, none));
      }
    }
  }
}

TEST(MinTree, EmptyTreeAndEmptyRangesFindNothing) {
  Leaves lv;
  MinTree<2> tree;
  tree.Build(lv, 0);
  auto none = [](uint32_t) { return false; };
  EXPECT_EQ(tree.Root(), kNone);
  EXPECT_EQ(tree.RangeBest(lv, 0, 0), kNone);
  EXPECT_EQ(tree.FindBest(lv, 0, 0, none), kNone);
  lv.keys = {5, 3};
  lv.ties = {0, 1};
  lv.in = {0, 0};
  tree.Build(lv, 2);
  EXPECT_EQ(tree.Root(), kNone);
  EXPECT_EQ(tree.RangeBest(lv, 0, 2), kNone);
  lv.in[1] = 1;
  tree.Update(lv, 1);
  EXPECT_EQ(tree.Root(), 1u);
  EXPECT_EQ(tree.RangeBest(lv, 0, 1), kNone);
}

}  // namespace
}  // namespace laissez::market::engine_internal
