// MinTree: the per-type index's tree (issue 12: fewer cache misses per re-key).
// Internal to src/market: included by engine_impl.h.
//
// A 2^kBits-ary min tree over leaves 0..n-1 ordered by (key, tie): per node, the
// least key below it and the leaf that holds it. At kBits 2 (4-ary, the tree of
// every node, which each limit change re-keys) four siblings' keys (16 bytes
// each) fill one 64-byte line and their leaves 16 bytes of another, so
// re-deriving a node reads one line of keys, and a re-key climbs half the
// levels of a binary tree: at 1M leaves ten levels, of which the bottom few are
// not cached, against twenty (each reading the sibling's key from a leaf far
// away). At kBits 3 (the free nodes' tree, re-keyed only when a node is freed,
// taken or re-priced while free) a node's keys take two lines, for 2.9 bytes a
// leaf against 6.7. The leaves
// themselves (their keys, ties and membership) belong to the caller, passed as a
// `Leaves` view with key(i), tie(i) and present(i); the tree holds the levels
// above them. Which leaf a search returns does not depend on the tree's shape:
// (key, tie) is a total order, and every search returns the least leaf it admits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace laissez::market::engine_internal {

// std::vector storage aligned to a cache line, so that four 16-byte keys at an
// index that is a multiple of four share one line.
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator.
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <typename U>
  bool operator==(const LineAllocator<U>&) const { return true; }
};
template <typename T>
using LineVector = std::vector<T, LineAllocator<T>>;

template <uint32_t kBits>
class MinTree {
 public:
  static constexpr uint32_t kArity = 1u << kBits;
  using Key = unsigned __int128;
  static constexpr uint32_t kNone = UINT32_MAX;

  // Derives every level from the leaves (n of them).
  template <typename Leaves>
  void Build(const Leaves& lv, uint32_t n) {
    n_ = n;
    up_.clear();
    if (n == 0) return;
    uint32_t count = n;
    do {
      count = (count + kArity - 1) >> kBits;
      Level& l = up_.emplace_back();
      l.key.assign(RoundUp(count), 0);
      l.win.assign(RoundUp(count), kNone);
      uint32_t level = static_cast<uint32_t>(up_.size());
      for (uint32_t j = 0; j < count; ++j) Derive(lv, level, j, &up_.back().key[j], &up_.back().win[j]);
    } while (count > 1);
  }

  // The least leaf, or kNone if no leaf is present.
  uint32_t Root() const { return up_.empty() ? kNone : up_.back().win[0]; }

  // A leaf's key or membership changed: re-derives its ancestors up to the
  // first one whose least (key, leaf) is unchanged (nothing above it changes).
  template <typename Leaves>
  void Update(const Leaves& lv, uint32_t leaf) {
    uint32_t j = leaf;
    for (uint32_t level = 1; level <= up_.size(); ++level) {
      j >>= kBits;
      Key k;
      uint32_t w;
      Derive(lv, level, j, &k, &w);
      Level& l = up_[level - 1];
      if (l.win[j] == w && (w == kNone || l.key[j] == k)) return;
      l.key[j] = k;
      l.win[j] = w;
    }
  }

  // Update for several leaves at once, `leaves` ascending without repeats (it
  // is used as scratch): each ancestor of the set is re-derived once, level by
  // level, and one whose least (key, leaf) is unchanged stops its line as in
  // Update (issue 12: a power step re-floors a row, a run of leaves that share
  // their ancestors). Every node is then the least of its children, as after
  // one Update per leaf: the same levels.
  template <typename Leaves>
  void UpdateMany(const Leaves& lv, std::vector<uint32_t>* leaves) {
    std::vector<uint32_t>& js = *leaves;
    for (uint32_t level = 1; level <= up_.size() && !js.empty(); ++level) {
      Level& l = up_[level - 1];
      size_t out = 0;
      uint32_t last = kNone;
      for (size_t i = 0; i < js.size(); ++i) {
        const uint32_t j = js[i] >> kBits;
        if (j == last) continue;  // A sibling's parent, derived already.
        last = j;
        Key k;
        uint32_t w;
        Derive(lv, level, j, &k, &w);
        if (l.win[j] == w && (w == kNone || l.key[j] == k)) continue;
        l.key[j] = k;
        l.win[j] = w;
        js[out++] = j;
      }
      js.resize(out);
    }
  }

  // The same for a present leaf whose key changed (`fell` if it fell), reading
  // less: a fallen key still wins every node it won and wins above while it
  // beats the node's least; a risen one changes only the nodes it won.
  template <typename Leaves>
  void Moved(const Leaves& lv, uint32_t leaf, bool fell) {
    if (!fell) {
      uint32_t j = leaf;
      for (uint32_t level = 1; level <= up_.size(); ++level) {
        j >>= kBits;
        Level& l = up_[level - 1];
        if (l.win[j] != leaf) return;
        Derive(lv, level, j, &l.key[j], &l.win[j]);
      }
      return;
    }
    Key k = lv.key(leaf);
    uint32_t j = leaf;
    for (uint32_t level = 1; level <= up_.size(); ++level) {
      j >>= kBits;
      Level& l = up_[level - 1];
      if (l.win[j] != leaf && l.win[j] != kNone && !Less(lv, k, leaf, l.key[j], l.win[j])) return;
      l.key[j] = k;
      l.win[j] = leaf;
    }
  }

  // The least present leaf in [lo, hi), or kNone: bottom up over the nodes that
  // cover the range, without recursion. A range of one leaf (an index's leaf
  // vertex, four in five of the stress replay's quotes) or of every leaf (a
  // type's root) needs no walk (issue 12): the leaf itself, or the root's winner.
  template <typename Leaves>
  uint32_t RangeBest(const Leaves& lv, uint32_t lo, uint32_t hi) const {
    if (hi == lo + 1) return lv.present(lo) ? lo : kNone;
    if (lo == 0 && hi == n_) return Root();
    Best best;
    uint32_t level = 0;
    while (lo < hi) {
      bool last = (lo >> kBits) == ((hi - 1) >> kBits) || level == up_.size();
      uint32_t head = last ? hi : std::min(hi, RoundUp(lo));
      for (; lo < head; ++lo) Take(lv, level, lo, &best);
      if (last) break;
      for (; hi & (kArity - 1); --hi) Take(lv, level, hi - 1, &best);
      lo >>= kBits;
      hi >>= kBits;
      ++level;
    }
    return best.w;
  }

  // The least present leaf in [lo, hi) that `skip` does not reject, or kNone.
  template <typename Leaves, typename Skip>
  uint32_t FindBest(const Leaves& lv, uint32_t lo, uint32_t hi, Skip& skip) const {
    Best best;
    if (!up_.empty()) FindRec(lv, static_cast<uint32_t>(up_.size()), 0, lo, hi, skip, &best);
    return best.w;
  }

  // The tree's order: leaf wa (key ka) before leaf wb (key kb).
  template <typename Leaves>
  static bool Less(const Leaves& lv, Key ka, uint32_t wa, Key kb, uint32_t wb) {
    if (ka != kb) return ka < kb;
    return lv.tie(wa) < lv.tie(wb);
  }

 private:
  struct Level {
    LineVector<Key> key;        // Per node: the least key below it (any value if empty).
    LineVector<uint32_t> win;   // Per node: the leaf holding it; kNone if empty.
  };
  struct Best {
    Key k = 0;
    uint32_t w = kNone;
  };
  static uint32_t RoundUp(uint32_t x) { return (x + kArity - 1) & ~(kArity - 1); }

  template <typename Leaves>
  static void Offer(const Leaves& lv, Key k, uint32_t w, Best* best) {
    if (best->w == kNone || Less(lv, k, w, best->k, best->w)) *best = Best{k, w};
  }
  // Offers node j of `level` (0: leaf j) to best.
  template <typename Leaves>
  void Take(const Leaves& lv, uint32_t level, uint32_t j, Best* best) const {
    if (level == 0) {
      if (lv.present(j)) Offer(lv, lv.key(j), j, best);
      return;
    }
    const Level& l = up_[level - 1];
    if (l.win[j] != kNone) Offer(lv, l.key[j], l.win[j], best);
  }
  // The least of node j's (at `level` >= 1) children.
  template <typename Leaves>
  void Derive(const Leaves& lv, uint32_t level, uint32_t j, Key* k, uint32_t* w) const {
    Best best;
    if (level == 1) {
      for (uint32_t c = j << kBits, end = std::min((j + 1) << kBits, n_); c < end; ++c) Take(lv, 0, c, &best);
    } else {
      for (uint32_t c = j << kBits; c < (j + 1) << kBits; ++c) Take(lv, level - 1, c, &best);
    }
    *k = best.k;
    *w = best.w;
  }
  template <typename Leaves, typename Skip>
  void FindRec(const Leaves& lv, uint32_t level, uint32_t j, uint32_t lo, uint32_t hi, Skip& skip,
               Best* best) const {
    uint64_t nlo = uint64_t{j} << (kBits * level), nhi = uint64_t{j + 1} << (kBits * level);
    if (nhi <= lo || hi <= nlo) return;
    Key k;
    uint32_t w;
    if (level == 0) {
      if (!lv.present(j)) return;
      k = lv.key(j);
      w = j;
    } else {
      const Level& l = up_[level - 1];
      w = l.win[j];
      if (w == kNone) return;
      k = l.key[j];
    }
    if (best->w != kNone && !Less(lv, k, w, best->k, best->w)) return;  // Nothing better below.
    if (lo <= nlo && nhi <= hi && !skip(w)) {
      *best = Best{k, w};
      return;
    }
    if (level == 0) return;
    for (uint32_t c = j << kBits; c < (j + 1) << kBits; ++c) FindRec(lv, level - 1, c, lo, hi, skip, best);
  }

  uint32_t n_ = 0;
  std::vector<Level> up_;  // up_[0]: the nodes over kArity leaves each; up_.back(): the root's level.
};

}  // namespace laissez::market::engine_internal
