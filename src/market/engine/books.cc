// Order books and the per-type index (its trees: min_tree.h): the index that finds the node with the lowest
// obtain price below a vertex, re-keying nodes, candidate orders, and the per-vertex books
// (insert, erase, reprice, competing-demand summaries).
// Member functions of MarketEngine::Impl (state and declarations: engine_impl.h).
#include "market/engine/engine_impl.h"

namespace laissez::market {

// ---------------------------------------------------------------- index

// A rebuild marks for re-quoting only the vertices whose quote can have moved
// (issue 12: the stress log's node additions and removals re-quoted every
// vertex, about a tenth of its quotes). A vertex's quote is the least obtain
// price over the keys of the nodes in its range, and its winner the least
// (key, node id) there (MinTree's tie): neither depends on where the range
// sits in the leaf order. Nodes never move between locations and the leaf
// order keeps the relative order of the nodes it kept, so a vertex's range
// holds other nodes only if a node below it was added or removed, and other
// keys only if a node's key in the old index differs from its key now (a
// key changed while the index was stale, or one lagging a time-varying floor:
// the snapshot's "index" section). The ancestors of exactly those nodes are
// marked; every other vertex keeps its quote (untouched, it equals
// last_quote_: no event) and its winner, whose leaf position is remapped
// (quote_leaf_, for TouchRekeyed). A first build, or one forced by SetParams
// (index_generation_ reset), marks every vertex as before.
void MarketEngine::Impl::EnsureIndex() {
  if (index_generation_ == topo_.generation() && index_.size() == topo_.type_count()) return;
  const bool diff = options_.price_events && index_generation_ != UINT64_MAX;
  index_generation_ = topo_.generation();
  if (options_.price_events && !diff) {
    for (uint32_t v = 0; v < topo_.vertex_count(); ++v) TouchVertex(VertexId(v));
  }
  // No compaction here: callers up the stack hold references into nodes_
  // and the topology while a rebuild can happen (a dangling NodeState& was
  // found by the split-advance property test).
  gang_short_.clear();  // Keys may have fallen without a wake.
  if (!diff) {
    index_.assign(topo_.type_count(), {});
    // A removed node has no leaf (its position is read only with the index
    // current, so every node's is rewritten here).
    for (NodeState& s : nodes_) s.leaf = UINT32_MAX;
  } else {
    // The old index is read while the new one is built over it: each winner
    // becomes its node for now (every vertex's, marked or not: a marked one's
    // is rewritten when it is quoted), and a node that had a leaf and has
    // none now was removed, so its ancestors lost it.
    for (uint32_t v = 0; v < quote_leaf_.size(); ++v) {
      uint32_t& w = quote_leaf_[v];
      if (w == UINT32_MAX) continue;
      const uint16_t t = V(VertexId(v)).type.value;
      w = t < index_.size() && w < index_[t].leaf_node.size() ? index_[t].leaf_node[w].value : UINT32_MAX;
    }
    for (uint32_t n = 0; n < nodes_.size(); ++n) {
      NodeState& s = nodes_[n];
      if (s.leaf == UINT32_MAX || topo_.IsLiveNode(NodeId(n))) continue;
      s.leaf = UINT32_MAX;
      TouchAncestors(topo_.node(NodeId(n)).leaf);
    }
    index_.resize(topo_.type_count());
  }
  for (size_t t = 0; t < topo_.type_count(); ++t) {
    auto order = topo_.LeafOrder(TypeId(static_cast<uint16_t>(t)));
    TypeIndex& ix = index_[t];
    // With `diff`, the new keys go to a fresh array: the old one is read for
    // the comparison. One KeyOf call site (a second one made the compiler
    // stop inlining it into RefreshNode).
    decltype(ix.key) fresh;
    auto& key = diff ? fresh : ix.key;
    key.assign(order.size(), 0);
    for (uint32_t i = 0; i < order.size(); ++i) {
      key[i] = KeyOf(order[i]);
      if (!diff) continue;
      // New to the index (added, or its old leaf is not its own), or re-keyed.
      const uint32_t l = nodes_[order[i].value].leaf;
      if (l >= ix.leaf_node.size() || ix.leaf_node[l] != order[i] || ix.key[l] != key[i]) {
        TouchAncestors(topo_.node(order[i]).leaf);
      }
    }
    if (diff) ix.key.swap(fresh);
    ix.leaf_node.assign(order.begin(), order.end());
    ix.free_leaf.assign(order.size(), 0);
    for (uint32_t i = 0; i < order.size(); ++i) {
      NodeState& s = nodes_[order[i].value];
      ix.free_leaf[i] = IsFree(s);
      s.leaf = i;
      node_cold_[order[i].value].above = V(topo_.node(order[i]).leaf).parent;
    }
    ix.Build();
  }
  if (!diff) return;
  // The winners to their nodes' new leaf positions.
  for (uint32_t& w : quote_leaf_) {
    if (w != UINT32_MAX) w = nodes_[w].leaf;
  }
}

// Re-keys node n in its type's tree; marks candidates if its obtain price fell.
void MarketEngine::Impl::RefreshNode(NodeId n, bool wake) { RefreshNodeT<false>(n, wake); }

template <bool kPending>
void MarketEngine::Impl::RefreshNodeT(NodeId n, bool wake) {
  // Only a decaying node has a crossing (StartDecay and StopDecay mark the
  // node themselves), so a limit change on a held node leaves the cache alone.
  if (!refreshing_decay_ && nodes_[n.value].decaying) DecayInputsChanged(n);
  if (index_generation_ != topo_.generation()) {
    // The index is rebuilt lazily with fresh keys; the change must still wake
    // orders and mark vertices, whether or not a query rebuilt it meanwhile.
    AddCandidatesAbove(n, Obtain(n));
    if (options_.price_events) TouchAncestors(topo_.node(n).leaf);
    return;
  }
  TypeIndex& ix = index_[nodes_[n.value].type.value];
  uint32_t leaf = nodes_[n.value].leaf;
  if (leaf == UINT32_MAX) return;
  unsigned __int128 k = KeyOf(n);
  Price now_obtain = static_cast<Price>(k >> 64);
  bool free_now = IsFree(nodes_[n.value]);
  // A node held at its last re-key (the held bit of its stored key) was not
  // in the free tree then: its entry there need not be read (issue 12: a
  // cache line at 1M nodes).
  unsigned __int128 old_key = ix.key[leaf];
  bool was_held = (old_key >> 63) & 1;
  if (k == old_key) {
    if (!was_held && ix.free_leaf[leaf] != free_now) {
      if constexpr (kPending) ix.RekeyPending(leaf, k, old_key, /*was_free=*/!free_now, free_now);
      else ix.SetFree(leaf, free_now);
    }
    if (wake && MayWake(now_obtain)) WalkCandidates(WalkStart(n), now_obtain);
    return;
  }
  // One held or reserved throughout is not in the free tree.
  if constexpr (kPending) ix.RekeyPending(leaf, k, old_key, /*was_free=*/!was_held && ix.free_leaf[leaf], free_now);
  else ix.Rekey(leaf, k, old_key, /*was_free=*/!was_held && ix.free_leaf[leaf], free_now);
  // Any order now reaching n may cross: its price fell, or its holder changed
  // (the old holder's orders become eligible for it).
  // The walk's start (NodeCold's line) is read only when a walk happens.
  if (wake && MayWake(now_obtain)) WalkCandidates(WalkStart(n), now_obtain);
  if (options_.price_events) TouchRekeyed(ix, leaf, topo_.node(n).leaf);
}

template void MarketEngine::Impl::RefreshNodeT<true>(NodeId n, bool wake);

// Orders at v and its ancestors whose price reaches `price` may now cross.
void MarketEngine::Impl::WalkCandidates(VertexId from, Price price) {
  for (VertexId v = from; v.valid(); v = V(v).parent) {
    if (books_.top(v.value) < price) continue;
    for (const BookEntry& e : books_[v.value]) {
      if (e.price < price) break;
      if (e.flags == kFlagGang && e.slot < gang_short_.size() && gang_short_[e.slot] > 1) {
        --gang_short_[e.slot];  // Still a node short after this one: see gang_short_.
        continue;
      }
      candidates_.emplace(-e.price, Seq(orders_[e.slot]), static_cast<uint32_t>(e.slot));
    }
  }
}

// The best eligible node for order o (free only if `free_only`), excluding `exclude`.
NodeId MarketEngine::Impl::BestNodeFor(const Order& o, bool free_only, const std::vector<NodeId>* exclude) {
  VertexId scope = EffScope(o);
  if (!scope.valid()) return NodeId();
  EnsureIndex();
  const TypeIndex& ix = index_[V(scope).type.value];  // The order's type (OrderType).
  auto [lo, hi] = topo_.Range(scope);
  auto skip = [&](uint32_t leaf) {
    NodeId n = ix.leaf_node[leaf];
    const NodeState& s = nodes_[n.value];
    if (s.holder == o.tenant) return true;
    if (free_only && !IsFree(s)) return true;
    if (exclude && std::find(exclude->begin(), exclude->end(), n) != exclude->end()) return true;
    return false;
  };
  // A free-only search walks the free leaves' tree: same order, same answer,
  // without visiting held nodes.
  uint32_t leaf = free_only ? ix.free_tree.FindBest(ix.free_leaves(), lo, hi, skip)
                            : ix.tree.FindBest(ix.all_leaves(), lo, hi, skip);
  if (leaf == UINT32_MAX || ix.obtain(leaf) == kInfPrice) return NodeId();
  return ix.leaf_node[leaf];
}

// ---------------------------------------------------------------- books

BookEntry* MarketEngine::Impl::FindEntry(Book& b, const Order& o) {
  // The order's own entry sorts where the search key does: its seq is read
  // through the order's slot.
  const BookEntry key{o.effective, SlotOf(o), 0, 0};
  auto seq_of = EntrySeq();
  auto it = std::lower_bound(b.begin(), b.end(), key, EntryLess());
  const uint64_t seq = Seq(o);
  while (it != b.end() && it->price == o.effective && seq_of(it->slot) == seq) {
    if (it->slot == SlotOf(o)) return it;
    ++it;
  }
  LZ_CHECK(false && "book entry missing");
  return b.end();
}

void MarketEngine::Impl::BookInsert(Order& o, uint8_t flags) {
  LZ_CHECK(!o.in_book);
  o.book_flags = flags;
  VertexId v = EffScope(o);
  if (!v.valid()) {
    unmatchable_.push_back(SlotOf(o));
    o.in_book = true;
    return;
  }
  Summary before = books_.summary(v.value);
  EntryInsert(o);
  o.in_book = true;
  AfterBookChange(v, before);
  candidates_.emplace(-o.effective, Seq(o), SlotOf(o));
}

// Raw edits of the entry of an order whose effective scope is valid; the
// callers refresh the rates the book's summary feeds (AfterBookChange).
void MarketEngine::Impl::EntryInsert(const Order& o) {
  VertexId v = EffScope(o);
  auto& b = books_.Mutable(v.value);
  const bool was_empty = b.empty();
  BookEntry e{o.effective, SlotOf(o), o.book_flags, o.tenant.value};
  if (SlotOf(o) < gang_short_.size()) gang_short_[SlotOf(o)] = 0;  // Queued in full again.
  b.insert(std::upper_bound(b.begin(), b.end(), e, EntryLess()), e);
  // Counted once the entry is in: an insert that fails leaves the count as it was.
  if (was_empty && V(v).node.valid()) ++leaf_books_;
  books_.Retop(v.value);
}

void MarketEngine::Impl::BookErase(Order& o) {
  if (!o.in_book) return;
  o.in_book = false;
  VertexId v = EffScope(o);
  if (!v.valid()) {
    auto it = std::find(unmatchable_.begin(), unmatchable_.end(), SlotOf(o));
    if (it != unmatchable_.end()) unmatchable_.erase(it);
    return;
  }
  Summary before = books_.summary(v.value);
  EntryErase(o);
  AfterBookChange(v, before);
}

// Changes an order's effective price and/or seq while it sits in the book.
// One rate refresh for the move: refreshing after the erase and again after
// the insert would settle every holding below whose c(n) the order sets and
// open a new ledger interval at the same rate (p(n) changed and changed back).
void MarketEngine::Impl::BookReprice(Order& o, Price effective, uint64_t seq) {
  if (!o.in_book) {
    o.effective = effective;
    SetSeq(o, seq);
    return;
  }
  VertexId v = EffScope(o);
  if (!v.valid()) {  // Waiting for a node in its locality: re-queued at the back.
    uint8_t flags = o.book_flags;
    BookErase(o);
    o.effective = effective;
    SetSeq(o, seq);
    BookInsert(o, flags);
    return;
  }
  Summary before = books_.summary(v.value);
  EntryErase(o);
  o.effective = effective;
  SetSeq(o, seq);
  EntryInsert(o);
  AfterBookChange(v, before);
  candidates_.emplace(-o.effective, Seq(o), SlotOf(o));
}

void MarketEngine::Impl::AfterBookChange(VertexId v, const Summary& before) {
  if (options_.price_events) TouchVertex(v);
  if (books_.summary(v.value) == before) return;
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
// Each ancestor's book offers the holder its summary's price (BookSummary::For):
// the first resting entry of another tenant, without walking past the pending
// and gang entries above it.
Price MarketEngine::Impl::Competing(NodeId n) const {
  const NodeState& s = nodes_[n.value];
  Price c = ChallengerPrice(s);
  for (VertexId v = topo_.node(n).leaf; v.valid(); v = V(v).parent) {
    if (books_.top(v.value) <= c) continue;
    c = std::max(c, books_.summary(v.value).For(s.holder.value));
  }
  return c;
}

}  // namespace laissez::market
