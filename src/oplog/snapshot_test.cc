// Engine snapshots (docs/SNAPSHOT.md): for random operation logs cut at random
// points, an engine restored from a snapshot and the original, given the rest
// of the log, must give the same call results, the same event streams, the
// same final state and the same re-snapshot bytes. Plus: the empty market,
// determinism, and corrupt, truncated or foreign images refused with the
// engine left as it was.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/fnv.h"
#include "market/operation.h"
#include "oplog/random_log.h"
#include "oplog/replay.h"

namespace laissez::oplog {
namespace {

using namespace laissez::market;

class Collect : public EventSink {
 public:
  void OnEvents(std::span<const Event> events) override { events_.insert(events_.end(), events.begin(), events.end()); }
  std::vector<Event> events_;
};

std::string State(const MarketEngine& e) { return StateJson(e, ReplayStats{}); }

struct CutStats {
  size_t cuts = 0, events_after = 0, pending_orders = 0, decaying = 0, policies = 0;
};

// Runs `log` to `cut` on one engine, restores a second from its snapshot and
// runs the rest on both, comparing everything.
void ExpectCutMatches(const std::vector<LogRecord>& log, size_t cut, const EngineOptions& eo, uint64_t seed,
                      CutStats* stats) {
  MarketEngine original(MarketParams{}, eo);
  for (size_t i = 0; i < cut; ++i) (void)Apply(original, log[i].op);
  std::string image = original.Snapshot();
  ASSERT_EQ(image, original.Snapshot()) << "a snapshot taken twice differs";

  MarketEngine restored(MarketParams{}, EngineOptions{});  // Options come from the image.
  Status st = restored.Restore(image);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(restored.Snapshot(), image) << "seed " << seed << " cut " << cut << ": re-snapshot differs";
  ASSERT_EQ(State(restored), State(original)) << "seed " << seed << " cut " << cut;
  size_t ledger_at_cut = original.ledger().size();
  EXPECT_TRUE(restored.ledger().empty());  // The history is not in the image, only its totals.

  Collect a, b;
  original.set_sink(&a);
  restored.set_sink(&b);
  for (size_t i = cut; i < log.size(); ++i) {
    ApplyResult ra = Apply(original, log[i].op);
    ApplyResult rb = Apply(restored, log[i].op);
    ASSERT_EQ(ra.status.ToString(), rb.status.ToString()) << "seed " << seed << " cut " << cut << " op " << i;
    ASSERT_EQ(ra.created_id, rb.created_id) << "seed " << seed << " cut " << cut << " op " << i;
    ASSERT_EQ(a.events_.size(), b.events_.size()) << "seed " << seed << " cut " << cut << " op " << i;
  }
  for (size_t i = 0; i < a.events_.size(); ++i) {
    ASSERT_EQ(a.events_[i], b.events_[i]) << "seed " << seed << " cut " << cut << " event " << i << ": original "
                                          << EncodeEvent(a.events_[i]) << " restored " << EncodeEvent(b.events_[i]);
  }
  EXPECT_EQ(State(restored), State(original)) << "seed " << seed << " cut " << cut;
  EXPECT_EQ(restored.Snapshot(), original.Snapshot()) << "seed " << seed << " cut " << cut;
  EXPECT_EQ(restored.NextEventTime(), original.NextEventTime());
  EXPECT_EQ(restored.UnsettledCharges(), original.UnsettledCharges());
  // The ledger entries after the cut are the same entries.
  ASSERT_EQ(restored.ledger().size(), original.ledger().size() - ledger_at_cut);
  for (size_t i = 0; i < restored.ledger().size(); ++i) {
    ASSERT_EQ(restored.ledger()[i], original.ledger()[ledger_at_cut + i]);
  }
  for (uint32_t p = 0; p < original.policy_count(); ++p) {
    auto pa = original.GetPolicy(PolicyId(p));
    auto pb = restored.GetPolicy(PolicyId(p));
    ASSERT_TRUE(pa.ok() && pb.ok());
    EXPECT_EQ(pa->floor, pb->floor);
    EXPECT_EQ(pa->carbon_price, pb->carbon_price);
    EXPECT_EQ(pa->next_step, pb->next_step);
  }
  for (uint32_t v = 0; v < original.topology().vertex_count(); v += 3) {
    auto qa = original.Quote(VertexId(v));
    auto qb = restored.Quote(VertexId(v));
    ASSERT_TRUE(qa.ok() && qb.ok());
    EXPECT_EQ(qa->quote, qb->quote);
    EXPECT_EQ(qa->depth, qb->depth);
  }
  ++stats->cuts;
  stats->events_after += a.events_.size();
  stats->policies += original.policy_count();
}

void RunSeeds(uint64_t first, uint64_t last, bool adaptive, bool operator_ops, CutStats* stats) {
  for (uint64_t seed = first; seed < last; ++seed) {
    RandomLogOptions opts;
    opts.seed = seed;
    opts.operations = 400;
    opts.nodes = 6 + static_cast<int>(seed % 20);
    opts.tenants = 2 + static_cast<int>(seed % 6);
    opts.operator_ops = operator_ops;
    opts.adaptive_caps = adaptive;
    opts.operator_permille = adaptive ? 250 : 120;
    EngineOptions eo;
    eo.price_events = seed % 2 == 0;
    eo.retain_ledger = seed % 3 != 0;
    MarketEngine live(MarketParams{}, eo);
    std::vector<LogRecord> log = DriveRandom(live, opts);
    std::mt19937_64 rng(seed);
    for (int k = 0; k < 4; ++k) {
      size_t cut = k == 0 ? 0 : rng() % (log.size() + 1);
      ExpectCutMatches(log, cut, eo, seed, stats);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(Snapshot, RestoredEnginesContinueExactlyAsTheOriginal) {
  CutStats stats;
  RunSeeds(1, 31, /*adaptive=*/false, /*operator_ops=*/true, &stats);
  EXPECT_EQ(stats.cuts, 120u);
  EXPECT_GT(stats.events_after, 1000u);  // The comparisons saw real traffic.
}

TEST(Snapshot, WithAdaptivePoliciesGangsDecayAndMaintenance) {
  CutStats stats;
  RunSeeds(300, 320, /*adaptive=*/true, /*operator_ops=*/true, &stats);
  EXPECT_EQ(stats.cuts, 80u);
  EXPECT_GT(stats.policies, 20u);
}

TEST(Snapshot, WithoutOperatorCalls) {
  CutStats stats;
  RunSeeds(100, 110, /*adaptive=*/false, /*operator_ops=*/false, &stats);
  EXPECT_EQ(stats.cuts, 40u);
}

// Cuts at every point of a few logs: states inside contests, gang
// reservations and clip steps all get a turn.
TEST(Snapshot, EveryCutPointOfShortLogs) {
  CutStats stats;
  for (uint64_t seed = 500; seed < 503; ++seed) {
    RandomLogOptions opts;
    opts.seed = seed;
    opts.operations = 120;
    opts.nodes = 8;
    opts.tenants = 4;
    opts.adaptive_caps = seed % 2 == 1;
    EngineOptions eo;
    eo.price_events = true;
    MarketEngine live(MarketParams{}, eo);
    std::vector<LogRecord> log = DriveRandom(live, opts);
    for (size_t cut = 0; cut <= log.size(); ++cut) {
      ExpectCutMatches(log, cut, eo, seed, &stats);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Snapshot, EmptyMarket) {
  MarketParams params;
  params.tick = 7;
  params.grace = 5 * kMicrosPerSecond;
  EngineOptions eo;
  eo.price_events = true;
  MarketEngine empty(params, eo);
  std::string image = empty.Snapshot();
  EXPECT_LT(image.size(), 100u);
  MarketEngine restored;
  ASSERT_TRUE(restored.Restore(image).ok());
  EXPECT_EQ(restored.params(), params);
  EXPECT_EQ(restored.now(), 0);
  EXPECT_EQ(restored.topology().node_count(), 0u);
  EXPECT_EQ(restored.Snapshot(), image);
  // It works as a market.
  topology::NodeInfo info{"n0", "gpu", "eu", "eu-1", "r1", "k1", {}};
  auto n = restored.AddNode(10, info);
  ASSERT_TRUE(n.ok());
  auto t = restored.CreateTenant(10, "a", 1'000'000'000);
  ASSERT_TRUE(t.ok());
  OrderSpec spec;
  spec.scope = restored.topology().node(*n).leaf;
  spec.price = 100;
  ASSERT_TRUE(restored.PlaceOrder(20, *t, spec).ok());
  EXPECT_EQ(restored.GetNode(*n)->holder, *t);
}

// A market with some of everything, for the corruption tests.
std::string BusyImage(MarketEngine& engine) {
  RandomLogOptions opts;
  opts.seed = 7;
  opts.operations = 300;
  opts.adaptive_caps = true;
  (void)DriveRandom(engine, opts);
  return engine.Snapshot();
}

TEST(Snapshot, CorruptTruncatedOrForeignImagesAreRefusedAndChangeNothing) {
  MarketEngine source;
  std::string image = BusyImage(source);
  MarketEngine target;
  topology::NodeInfo info{"keep", "gpu", "eu", "eu-1", "r1", "k1", {}};
  ASSERT_TRUE(target.AddNode(5, info).ok());
  std::string before = target.Snapshot();

  auto refused = [&](std::string_view bad, StatusCode code, const std::string& words) {
    Status st = target.Restore(bad);
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.ToString();
    EXPECT_EQ(target.Snapshot(), before) << "a refused image changed the engine";
  };
  // A flipped byte anywhere in the payload.
  for (size_t at : {size_t{25}, image.size() / 2, image.size() - 9}) {
    std::string bad = image;
    bad[at] ^= 0x40;
    refused(bad, StatusCode::kDataLoss, "checksum");
  }
  refused(image.substr(0, image.size() - 1), StatusCode::kDataLoss, "truncated");
  refused(image.substr(0, image.size() / 2), StatusCode::kDataLoss, "truncated");
  refused(image.substr(0, 10), StatusCode::kDataLoss, "too short");
  refused("{\"v\":1,\"t\":0,\"op\":\"advance\"}........", StatusCode::kDataLoss, "bad magic");
  std::string other = image;
  other[8] = 2;  // Version 2.
  refused(other, StatusCode::kFailedPrecondition, "version 2");
  // A well-formed checksum over a payload that does not parse.
  std::string junk = image.substr(0, 20) + std::string(image.size() - 28, '\xff');
  uint64_t h = Fnv1a64(std::string_view(junk).substr(20));
  for (int i = 0; i < 8; ++i) junk.push_back(static_cast<char>(h >> (8 * i)));
  refused(junk, StatusCode::kDataLoss, "snapshot: ");

  // The ledger's tail rides along when asked for, and only then.
  ASSERT_GT(source.ledger().size(), 3u);
  MarketEngine with_tail;
  ASSERT_TRUE(with_tail.Restore(source.Snapshot(3)).ok());
  ASSERT_EQ(with_tail.ledger().size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(with_tail.ledger()[i], source.ledger()[source.ledger().size() - 3 + i]);
  EXPECT_EQ(with_tail.ledger_totals().entries, source.ledger_totals().entries);

  // And the good image still loads into the same engine afterwards.
  ASSERT_TRUE(target.Restore(image).ok());
  EXPECT_EQ(State(target), State(source));
}

// An image whose payload was edited, with its header's payload length
// (bytes 12-19) and its checksum trailer made right again: so a restore gets
// past them to the edited field.
std::string Resealed(std::string image) {
  image.resize(image.size() - 8);
  uint64_t length = image.size() - 20;
  for (int i = 0; i < 8; ++i) image[12 + i] = static_cast<char>(length >> (8 * i));
  uint64_t h = Fnv1a64(std::string_view(image).substr(20));
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<char>(h >> (8 * i)));
  return image;
}

// Restoring `bad` (payload length and checksum re-done) into `target` is
// refused as data loss, naming `words`, and leaves `target` as it was.
void ExpectRefused(MarketEngine& target, const std::string& bad, const std::string& words) {
  const std::string before = target.Snapshot();
  Status st = target.Restore(Resealed(bad));
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find(words), std::string::npos) << "want '" << words << "', got " << st.ToString();
  EXPECT_EQ(target.Snapshot(), before) << "a refused image changed the engine";
}

// A zigzag varint, as the image stores a signed value.
std::string Varint(int64_t v) {
  uint64_t u = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
  std::string out;
  for (; u >= 0x80; u >>= 7) out.push_back(static_cast<char>(u | 0x80));
  out.push_back(static_cast<char>(u));
  return out;
}

// The placed price of an updated order lives in a table by slot (issue 12,
// SlotPrices); the image keeps it, and one that Place would refuse (negative
// or infinite) is refused by name.
TEST(Snapshot, UpdatedOrderKeepsItsPlacedPriceAndAnInvalidOneIsRefused) {
  MarketEngine source;
  topology::NodeInfo info{"n0", "gpu", "eu", "eu-1", "r1", "k1", {}};
  auto n = source.AddNode(0, info);
  ASSERT_TRUE(n.ok());
  // A second tenant holds the node above the order's price, so the order rests.
  auto holder = source.CreateTenant(0, "h", int64_t{1} << 50);
  auto bidder = source.CreateTenant(0, "b", int64_t{1} << 50);
  ASSERT_TRUE(holder.ok() && bidder.ok());
  VertexId leaf = source.topology().node(*n).leaf;
  ASSERT_TRUE(source.PlaceOrder(1, *holder, OrderSpec{leaf, 5'000'000'000}).ok());
  const Price placed = 987'654'321;
  auto order = source.PlaceOrder(2, *bidder, OrderSpec{leaf, placed});
  ASSERT_TRUE(order.ok());
  ASSERT_TRUE(source.UpdateOrder(3, *bidder, *order, placed + 1000).ok());
  std::string image = source.Snapshot();
  MarketEngine restored;
  ASSERT_TRUE(restored.Restore(image).ok());
  EXPECT_EQ(restored.Snapshot(), image);

  // The placed price is in the image (zigzag varint), as are the prices that
  // equal it (the holding's rate, say): make each occurrence negative, then
  // infinite, in turn, payload length and checksum re-done; one of them is
  // the placed price.
  const std::string want = Varint(placed);
  const std::pair<Price, std::string> cases[] = {
      {-placed, "placed price -987654321: must not be negative"},
      {kInfPrice, "placed price 9223372036854775807: must be finite"},
  };
  for (const auto& [bad_price, message] : cases) {
    int refused_by_name = 0;
    for (size_t at = image.find(want, 20); at != std::string::npos; at = image.find(want, at + 1)) {
      std::string bad = image;
      bad.replace(at, want.size(), Varint(bad_price));
      bad = Resealed(std::move(bad));
      MarketEngine target;
      std::string before = target.Snapshot();
      Status st = target.Restore(bad);
      if (st.message().find(message) == std::string::npos) continue;
      ++refused_by_name;
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
      EXPECT_EQ(target.Snapshot(), before) << "a refused image changed the engine";
    }
    EXPECT_EQ(refused_by_name, 1) << message;
  }
}

// The books section must be the orders' (FindEntry trusts it and aborts on
// a missing entry): a book listed twice, entries out of priority order, an
// entry that differs from its order and an order without its entry are
// refused by name at restore, the engine left as it was.
// Two nodes of one rack and three rich tenants (a holder, then a and b),
// added to `e`; invalid ids if a call failed.
struct TwoNodesThreeTenants {
  VertexId leaf0, leaf1;
  TenantId holder, a, b;
};
TwoNodesThreeTenants AddTwoNodesThreeTenants(MarketEngine& e, const std::array<std::string, 3>& names) {
  VertexId leaf[2];
  for (int i = 0; i < 2; ++i) {
    topology::NodeInfo info{"n" + std::to_string(i), "gpu", "eu", "eu-1", "r1", "k1", {}};
    auto added = e.AddNode(0, info);
    if (added.ok()) leaf[i] = e.topology().node(*added).leaf;
  }
  TenantId t[3];
  for (int i = 0; i < 3; ++i) {
    auto created = e.CreateTenant(0, names[i], int64_t{1} << 50);
    if (created.ok()) t[i] = *created;
  }
  return {leaf[0], leaf[1], t[0], t[1], t[2]};
}

TEST(Snapshot, BooksThatDoNotMatchTheOrdersAreRefused) {
  MarketEngine source;
  const auto [leaf0, leaf1, holder, a, b] = AddTwoNodesThreeTenants(source, {"h", "a", "b"});
  ASSERT_TRUE(leaf0.valid() && leaf1.valid() && holder.valid() && a.valid() && b.valid());
  ASSERT_LT(leaf1.value, 128u);  // One-byte vertex ids below.
  // The holder takes both nodes above the bids, so the bids rest: two
  // entries at leaf 0 (a's first, its price higher), one at leaf 1.
  ASSERT_TRUE(source.PlaceOrder(1, holder, OrderSpec{leaf0, 5'000'000'000}).ok());
  ASSERT_TRUE(source.PlaceOrder(1, holder, OrderSpec{leaf1, 5'000'000'000}).ok());
  const Price pa = 987'654'321, pb = 987'654'000, pc = 987'650'000;
  ASSERT_TRUE(source.PlaceOrder(2, a, OrderSpec{leaf0, pa}).ok());
  auto ob = source.PlaceOrder(2, b, OrderSpec{leaf0, pb});
  ASSERT_TRUE(ob.ok());
  ASSERT_TRUE(source.PlaceOrder(2, a, OrderSpec{leaf1, pc}).ok());
  const std::string image = source.Snapshot();
  MarketEngine restored;
  ASSERT_TRUE(restored.Restore(image).ok());

  // An entry: price (5 bytes here), seq, slot, tenant and flags (1 byte each).
  constexpr size_t kEntry = 9;
  const std::string ea = Varint(pa), eb = Varint(pb), ec = Varint(pc);
  ASSERT_EQ(ea.size() + 4, kEntry);
  size_t at = std::string::npos;  // Leaf 0's book: its vertex, 2, a's entry, b's entry.
  for (size_t p = image.find(ea, 20); p != std::string::npos; p = image.find(ea, p + 1)) {
    if (image.compare(p + kEntry, eb.size(), eb) == 0 && image[p - 1] == 2 && image[p - 2] == char(leaf0.value)) at = p;
  }
  ASSERT_NE(at, std::string::npos) << "leaf 0's book not found in the image";
  size_t at1 = std::string::npos;  // Leaf 1's book: its vertex, 1, the entry.
  for (size_t p = image.find(ec, 20); p != std::string::npos; p = image.find(ec, p + 1)) {
    if (image[p - 1] == 1 && image[p - 2] == char(leaf1.value)) at1 = p;
  }
  ASSERT_NE(at1, std::string::npos) << "leaf 1's book not found in the image";

  MarketEngine target;
  auto refused = [&](const std::string& bad, const std::string& words) { ExpectRefused(target, bad, words); };
  const std::string book0 = "books: book at vertex " + std::to_string(leaf0.value) + ": ";
  {  // Leaf 1's book claims leaf 0's vertex.
    std::string bad = image;
    bad[at1 - 2] = char(leaf0.value);
    refused(bad, book0 + "listed twice");
  }
  {  // a's and b's entries swapped.
    std::string bad = image;
    bad.replace(at, kEntry, image, at + kEntry, kEntry);
    bad.replace(at + kEntry, kEntry, image, at, kEntry);
    refused(bad, book0 + "entry 1 (order slot ");
    refused(bad, "out of priority order");
  }
  {  // a's entry names another tenant.
    std::string bad = image;
    bad[at + 7] = static_cast<char>(bad[at + 7] ^ 0x3);
    refused(bad, book0 + "entry 0 (order slot ");
    refused(bad, "price, seq, flags or tenant differ from the order's");
  }
  {  // The two books' vertices swapped: a's entry at leaf 1 is not its order's book.
    std::string bad = image;
    bad[at - 2] = char(leaf1.value);
    bad[at1 - 2] = char(leaf0.value);
    refused(bad, "books: book at vertex " + std::to_string(leaf1.value) + ": entry 0 (order slot ");
    refused(bad, "the order is not in the book at this vertex");
  }
  {  // b's entry dropped: the order is in its book without an entry.
    std::string bad = image;
    bad[at - 1] = 1;
    bad.erase(at + kEntry, kEntry);
    refused(bad, "order " + std::to_string(ob->value) + " (slot ");
    refused(bad, "is in the book at vertex " + std::to_string(leaf0.value) + " but has no entry there");
  }
  // The good image still loads into the same engine afterwards.
  ASSERT_TRUE(target.Restore(image).ok());
  EXPECT_EQ(target.Snapshot(), image);
}

// The free order slots are where the next orders go: one past the table, one
// that holds a live order or one listed twice would make a placement write
// past the table or over a live order, so restore refuses each by name and
// leaves the engine as it was.
TEST(Snapshot, FreeOrderSlotsThatAreNotFreeAreRefused) {
  MarketEngine source;
  const auto [leaf0, leaf1, holder, a, b] = AddTwoNodesThreeTenants(source, {"h", "a", "b"});
  ASSERT_TRUE(leaf0.valid() && leaf1.valid() && holder.valid() && a.valid() && b.valid());
  // The holder's orders fill (their slot is free again at once); the three
  // bids rest in slots 0, 1 and 2; b's is cancelled, so slot 1 is free.
  ASSERT_TRUE(source.PlaceOrder(1, holder, OrderSpec{leaf0, 5'000'000'000}).ok());
  ASSERT_TRUE(source.PlaceOrder(1, holder, OrderSpec{leaf1, 5'000'000'000}).ok());
  auto o0 = source.PlaceOrder(2, a, OrderSpec{leaf0, 987'654'321});
  auto o1 = source.PlaceOrder(2, b, OrderSpec{leaf0, 987'654'000});
  auto o2 = source.PlaceOrder(2, a, OrderSpec{leaf1, 987'650'000});
  ASSERT_TRUE(o0.ok() && o1.ok() && o2.ok());
  ASSERT_LT(o2->value, 128u);  // One-byte ids below.
  ASSERT_TRUE(source.CancelOrder(3, b, *o1).ok());
  const std::string image = source.Snapshot();
  // The free list (one slot: 1), then the live orders by id: (o0, slot 0)
  // and (o2, slot 2).
  const std::string lists{1, 1, 2, char(o0->value), 0, char(o2->value), 2};
  const size_t at = image.find(lists, 20);
  ASSERT_NE(at, std::string::npos) << "the free list and the live orders not found in the image";
  ASSERT_EQ(image.find(lists, at + 1), std::string::npos);

  MarketEngine target;
  {
    std::string bad = image;
    bad[at + 1] = 3;
    ExpectRefused(target, bad, "orders: free order slot 3 out of range (3)");
  }
  {
    std::string bad = image;
    bad[at + 1] = 2;
    ExpectRefused(target, bad, "orders: free order slot 2 holds live order " + std::to_string(o2->value));
  }
  {
    std::string bad = image;
    bad.replace(at, 2, std::string{2, 1, 1});
    ExpectRefused(target, bad, "orders: free order slot 1 is listed twice");
  }
  // The good image still loads, and its next order takes the free slot.
  ASSERT_TRUE(target.Restore(image).ok());
  EXPECT_EQ(target.Snapshot(), image);
  ASSERT_TRUE(target.PlaceOrder(4, b, OrderSpec{leaf0, 987'000'000}).ok());
}

// The record keeps an order's effective scope only when the order has a
// locality location (issue 12: OrderCold::eff_scope); any other order's is
// its scope, so an image that says otherwise is refused by name, the engine
// left as it was.
TEST(Snapshot, AnEffectiveScopeOtherThanTheScopeWithoutALocalityIsRefused) {
  MarketEngine source;
  const auto [leaf0, leaf1, holder, a, b] = AddTwoNodesThreeTenants(source, {"h", "a", "b"});
  ASSERT_TRUE(leaf0.valid() && leaf1.valid() && holder.valid() && a.valid() && b.valid());
  ASSERT_LT(leaf1.value + 1, 128u);  // One-byte ids below (an id is written as value + 1).
  ASSERT_TRUE(source.PlaceOrder(1, holder, OrderSpec{leaf0, 5'000'000'000}).ok());
  ASSERT_TRUE(source.PlaceOrder(2, a, OrderSpec{leaf0, 987'654'321}).ok());  // Rests at leaf 0.
  const std::string image = source.Snapshot();
  MarketEngine restored;
  ASSERT_TRUE(restored.Restore(image).ok());
  // Every byte that could be leaf 0's id made leaf 1's, in turn: the edits
  // of an order's effective scope are refused by name.
  const std::string words = "effective scope " + std::to_string(leaf1.value) + " differs from its scope " +
                            std::to_string(leaf0.value) + " without a locality location";
  int refused_by_name = 0;
  for (size_t at = 20; at + 8 < image.size(); ++at) {
    if (image[at] != static_cast<char>(leaf0.value + 1)) continue;
    std::string bad = image;
    bad[at] = static_cast<char>(leaf1.value + 1);
    MarketEngine target;
    const std::string before = target.Snapshot();
    Status st = target.Restore(Resealed(bad));
    if (st.message().find(words) == std::string::npos) continue;
    ++refused_by_name;
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_EQ(target.Snapshot(), before) << "a refused image changed the engine";
  }
  EXPECT_GE(refused_by_name, 1);
}

// The tenants' exhaustion checks (a heap of their own, merged into the
// schedule in the image) must be their tenants' (Tenant::exhaust_sched): an
// entry at another time, a tenant listed twice, and a tenant whose check the
// schedule does not hold are refused by name at restore, the engine left as
// it was. (A check that never fires would leave the tenant never exhausted.)
TEST(Snapshot, ExhaustionChecksThatAreNotTheirTenantsAreRefused) {
  MarketEngine source;
  topology::NodeInfo info{"n0", "gpu", "eu", "eu-1", "r1", "k1", {}};
  auto n = source.AddNode(0, info);
  ASSERT_TRUE(n.ok());
  auto t = source.CreateTenant(0, "a", 100 * kMicroUnits);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->value, 0u);  // Tenant 0: its id is one zero byte below.
  FloorTarget target_node;
  target_node.node = *n;
  ASSERT_TRUE(source.AddPolicy(0, StaticFloorSpec{target_node, 10 * kMicroUnits}).ok());
  // Holds the node at 10/h from a balance of 100: its exhaustion check is the
  // schedule's only entry, and the market's next event.
  ASSERT_TRUE(source.PlaceOrder(0, *t, OrderSpec{source.topology().node(*n).leaf, 10 * kMicroUnits}).ok());
  const Micros check = source.NextEventTime();
  ASSERT_GT(check, 0);
  ASSERT_LT(check, kNever);
  const std::string image = source.Snapshot();

  // The schedule: its count (1), then the entry: time, kind (4: an
  // exhaustion check), tenant.
  const std::string entry = Varint(check) + std::string(1, char(4)) + std::string(1, char(0));
  size_t at = std::string::npos;
  for (size_t p = image.find(entry, 20); p != std::string::npos; p = image.find(entry, p + 1)) {
    if (image[p - 1] == 1) at = p;
  }
  ASSERT_NE(at, std::string::npos) << "the schedule's entry was not found in the image";

  MarketEngine target;
  auto refused = [&](const std::string& bad, const std::string& words) { ExpectRefused(target, bad, words); };
  {  // The entry a microsecond late.
    std::string later = Varint(check + 1);
    ASSERT_EQ(later.size(), Varint(check).size());
    std::string bad = image;
    bad.replace(at, later.size(), later);
    refused(bad, "exhaustion check of tenant 0 at " + std::to_string(check + 1) + ": not the tenant's scheduled check");
  }
  {  // The entry twice.
    std::string bad = image;
    bad[at - 1] = 2;
    bad.insert(at, entry);
    refused(bad, "exhaustion check of tenant 0 at " + std::to_string(check) + ": not the tenant's scheduled check");
  }
  {  // No entry: the tenant's check would never fire.
    std::string bad = image;
    bad[at - 1] = 0;
    bad.erase(at, entry.size());
    refused(bad, "exhaustion checks: the tenants have 1 scheduled, the schedule holds 0");
  }
  // The good image still loads into the same engine afterwards.
  ASSERT_TRUE(target.Restore(image).ok());
  EXPECT_EQ(target.Snapshot(), image);
}

// A tenant's open orders are kept as order slots (issue 12) and written as
// ascending ids; at restore each id must be a live order of that tenant, in
// ascending order, every live order listed, and every live id below the next
// order id (Place appends to the list). Each broken list is refused by name,
// the engine left as it was.
TEST(Snapshot, TenantsOpenOrdersThatAreNotTheLiveOrdersAreRefused) {
  MarketEngine source;
  const auto [leaf0, leaf1, holder, a, b] = AddTwoNodesThreeTenants(source, {"holder", "tenant-alpha", "tenant-beta"});
  ASSERT_TRUE(leaf0.valid() && leaf1.valid() && holder.valid() && a.valid() && b.valid());
  // The holder takes both nodes (orders 0 and 1, filled); a's two bids and
  // b's one rest: a lists orders 2 and 3, b order 4; the next id is 5.
  const Micros at = 1'000'000;
  ASSERT_TRUE(source.PlaceOrder(at, holder, OrderSpec{leaf0, 5'000'000'000}).ok());
  ASSERT_TRUE(source.PlaceOrder(at, holder, OrderSpec{leaf1, 5'000'000'000}).ok());
  auto a0 = source.PlaceOrder(at, a, OrderSpec{leaf0, 1'000'000});
  auto a1 = source.PlaceOrder(at, a, OrderSpec{leaf1, 1'000'000});
  auto b0 = source.PlaceOrder(at, b, OrderSpec{leaf0, 1'000'000});
  ASSERT_TRUE(a0.ok() && a1.ok() && b0.ok());
  ASSERT_EQ(a0->value, 2u);
  ASSERT_EQ(a1->value, 3u);
  ASSERT_EQ(b0->value, 4u);
  ASSERT_EQ(source.GetTenant(a)->orders, (std::vector<OrderId>{*a0, *a1}));
  const std::string image = source.Snapshot();
  MarketEngine restored;
  ASSERT_TRUE(restored.Restore(image).ok());
  EXPECT_EQ(restored.GetTenant(a)->orders, (std::vector<OrderId>{*a0, *a1}));
  EXPECT_EQ(restored.GetTenant(b)->orders, std::vector<OrderId>{*b0});

  // A tenant's record: its name, five signed varints (balance, max_rate,
  // deposited, paid, waived), its nodes (count 0 here), then its orders.
  auto orders_at = [&](const std::string& name) {
    size_t p = image.find(std::string(1, char(name.size())) + name);
    EXPECT_NE(p, std::string::npos) << name << "'s record was not found";
    if (p == std::string::npos) return p;
    p += 1 + name.size();
    for (int k = 0; k < 5; ++k) {
      while (static_cast<unsigned char>(image[p]) & 0x80) ++p;
      ++p;
    }
    EXPECT_EQ(image[p], 0) << name << " holds no node";
    return p + 1;
  };
  const size_t pa = orders_at("tenant-alpha"), pb = orders_at("tenant-beta");
  ASSERT_NE(pa, std::string::npos);
  ASSERT_NE(pb, std::string::npos);
  ASSERT_EQ(image.substr(pa, 3), std::string("\x02\x02\x03", 3));
  ASSERT_EQ(image.substr(pb, 2), std::string("\x01\x04", 2));

  MarketEngine target;
  auto refused = [&](const std::string& bad, const std::string& words) { ExpectRefused(target, bad, words); };
  {  // a lists b's order.
    std::string bad = image;
    bad[pa + 2] = 4;
    refused(bad, "tenants: tenant 1: open order 4 is tenant 2's");
  }
  {  // a lists an order that is not live (the holder's, filled).
    std::string bad = image;
    bad[pa + 1] = 0;
    refused(bad, "tenants: tenant 1: open order 0 is not a live order");
  }
  {  // a's orders out of order.
    std::string bad = image;
    bad[pa + 1] = 3;
    bad[pa + 2] = 2;
    refused(bad, "tenants: tenant 1: open orders not in ascending id order");
  }
  {  // b lists none: order 4 is in no tenant's list.
    std::string bad = image;
    bad[pb] = 0;
    bad.erase(pb + 1, 1);
    refused(bad, "3 live orders, but the tenants list 2 open orders");
  }
  {  // The next order id (after the clock and the next seq) lowered to 4: order 4 is live.
    const std::string clock = Varint(at);
    size_t p = std::string::npos;
    for (size_t q = image.find(clock); q != std::string::npos; q = image.find(clock, q + 1)) {
      if (image[q + clock.size() + 1] == 5) p = q + clock.size() + 1;  // A one-byte seq, then 5.
    }
    ASSERT_NE(p, std::string::npos) << "the clock was not found in the image";
    std::string bad = image;
    bad[p] = 4;
    refused(bad, "order 4 is live, but the next order id is 4");
  }
  // The good image still loads into the same engine afterwards.
  ASSERT_TRUE(target.Restore(image).ok());
  EXPECT_EQ(target.Snapshot(), image);
}

}  // namespace
}  // namespace laissez::oplog
