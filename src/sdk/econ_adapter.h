// EconAdapter: the tenant-side SDK (paper §4, DESIGN.md §2). The tenant
// describes the nodes it wants as `Request`s and writes one pricing callback,
// `PricingStrategy::Price(NodeSpec, OrderBookView)`. The adapter calls it for
// every node the tenant wants (the answer is a bid) and every node it holds
// (the answer is the retention limit), and places, updates or withdraws orders
// and limits with the results.
//
// When Price() runs. Adds, removes, resizes, the tenant's own market events
// (allocation, notice, release, cancellation) and market updates (price
// changes routed to the adapter) only mark the adapter dirty; the driver calls
// `Reprice()` at most once per market tick for a dirty adapter (CLARIFICATIONS
// "Simulator load"), so a burst of engine operations costs one round of
// Price() calls, not one per operation.
//
// Re-pricing only what changed. A driver that ticks (the simulator) asks
// `NeedsReprice(now)` each tick and calls Reprice() only when it says yes:
// (a) a quote price the last round's Price() calls read (OrderBookView::quote,
// QuoteOf; the adapter reads the quotes of the options it bids on the same
// way) differs now, (b) the tenant's own events, adds, removes, resizes or
// MarkDirty() made the adapter dirty, or (c) the strategy's timer is due:
// `PricingStrategy::NextChange` says when an answer may next move with time
// alone; the default is the next tick, so a strategy that does not declare
// it is re-priced every tick as before. A round whose reads the adapter does
// not watch (counts, eviction quotes, the balance) or whose calls the market
// rejected is repeated every tick. Skipping is exact: with the same reads,
// state and time-independent answers, Reprice() would make no call.
//
// What Reprice() does, per request:
// - For each held node: limit = Price(spec with `held` = node). No answer
//   (nullopt) relinquishes the node; a new answer calls SetLimit. Unchanged
//   answers make no call.
// - For the missing nodes (count - held): each option is priced; the adapter
//   bids on the option with the largest surplus (bid - quote), preferring an
//   option it can obtain now, then the earlier option. While the request holds
//   nodes, only the held nodes' option is considered (one request, one
//   hardware type) unless the request has `mixed_types` (a serving fleet that
//   may run on several types at once), and the locality constraint is
//   anchored on a held node. A
//   gang request places the missing nodes as one all-or-nothing order. An
//   existing order on the same option is updated in place (price only);
//   switching options cancels and re-places. No answer for any option cancels.
//
// Ownership: the client, strategy and listener are not owned and must outlive
// the adapter. Thread-safety: none.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "market/types.h"
#include "sdk/market_client.h"

namespace laissez::sdk {

// The node a tenant wants or holds (the paper's NodeSpec{NodeType, Locality,
// RelTo, Meta}; `location`, `held` and `count` are ours).
struct NodeSpec {
  std::string node_type;                              // Hardware type, e.g. "h100x8".
  market::Locality locality = market::Locality::kAny; // Relative to `rel_to`.
  NodeId rel_to;                                      // A node the tenant holds; invalid: the adapter
                                                      // anchors on one of the request's held nodes.
  std::map<std::string, std::string> meta;            // Free-form tenant data for its strategy.
  std::string location;                               // Optional location path narrowing the scope ("eu/eu-1a").
  // Filled by the adapter when it calls Price():
  NodeId held;         // Valid: the tenant holds this node and Price() answers its retention limit.
  uint32_t count = 1;  // Nodes wanted at this spec in this call (gangs: the missing nodes).
};

// What the Price() calls of one re-pricing round read from the market, so the
// adapter knows when an answer can change (EconAdapter::NeedsReprice).
struct BookReads {
  std::vector<std::pair<VertexId, Price>> quotes;  // Distinct (vertex, quote price) pairs read.
  bool unwatched = false;  // Read counts, an eviction quote or the balance: re-price every tick.
  void Quoted(VertexId v, Price p);
};

// What a strategy may read while pricing one NodeSpec. Reads go to the
// client lazily and are cached for the duration of one Price() call, so a
// strategy pays only for what it reads. With `reads`, every read is noted there.
class OrderBookView {
 public:
  OrderBookView(MarketClient* client, VertexId scope, NodeId held, Price current_limit,
                uint32_t request_held, uint32_t request_count, BookReads* reads = nullptr);

  Micros now() const;
  VertexId scope() const { return scope_; }
  // Lowest obtain price of a node at the scope (kInfPrice if none can be obtained).
  Price quote() const;
  uint32_t free_count() const;
  const market::VertexQuote& vertex_quote() const;
  // The quote at another vertex by name ("a100x8", "h100x8/eu/eu-1a"); kInfPrice if unknown.
  Price QuoteOf(std::string_view vertex_name) const;

  // For a held node (`held().valid()`):
  NodeId held() const { return held_; }
  Price current_limit() const { return current_limit_; }
  // Null if no node is held or the read failed.
  const market::EvictionQuote* eviction() const;

  // Nodes the request holds and wants in total.
  uint32_t request_held() const { return request_held_; }
  uint32_t request_count() const { return request_count_; }
  // Money left if all holdings were settled now (0 on a failed read).
  Money balance() const;

 private:
  MarketClient* client_;
  VertexId scope_;
  NodeId held_;
  Price current_limit_;
  uint32_t request_held_, request_count_;
  BookReads* reads_;
  mutable std::optional<Price> price_;
  mutable std::optional<market::VertexQuote> quote_;
  mutable std::optional<market::EvictionQuote> eviction_;
  mutable bool eviction_read_ = false;
  mutable std::optional<Money> balance_;
};

// The tenant's pricing callback. Return the price per node per hour; nullopt
// means "do not want": withdraw the bid, or relinquish the held node.
class PricingStrategy {
 public:
  virtual ~PricingStrategy() = default;
  virtual std::optional<laissez::Price> Price(const NodeSpec& spec, const OrderBookView& book) = 0;
  // The earliest time at which the answer Price(spec, ...) gave at `now` may
  // differ with the passage of time alone: the same book reads (the adapter
  // watches those) and no event of the tenant's (those re-price anyway).
  // kNever: the answer does not depend on time. The default, now + 1, means
  // "at the next tick", which is always correct: override it only when the
  // answer provably holds longer. A tenant that changes its strategy's
  // parameters (e.g. ThroughputValue::set_value_per_hour) calls MarkDirty().
  virtual Micros NextChange(const NodeSpec& /*spec*/, Micros now) const { return now + 1; }
  // For prefetching a chain of strategies (hints only, EconAdapter::Prefetch;
  // the adapter reads them once, when it is made):
  // the inner strategy this one's Price() calls (a decorator's; nullptr when
  // there is none), and the heap buffer its Price() reads, all of it (a
  // table's; empty when there is none).
  virtual const PricingStrategy* inner() const { return nullptr; }
  virtual std::span<const std::byte> table() const { return {}; }
};

using RequestId = uint64_t;

// "I want `count` nodes of one of these kinds."
struct Request {
  std::vector<NodeSpec> options;  // Alternatives in order of preference; at least one.
  uint32_t count = 1;
  bool gang = true;  // Missing nodes are placed as one all-or-nothing order.
  // Held nodes may be of different options (types): every option is priced
  // for the missing nodes even while nodes are held. Not for gangs.
  bool mixed_types = false;
};

// What the adapter reports to the tenant's code. Every method has a no-op default.
class AdapterListener {
 public:
  virtual ~AdapterListener() = default;
  virtual void OnNodeGained(RequestId, NodeId, Price /*limit*/) {}
  // The node is gone (outbid at the deadline, floor, maintenance, exhaustion or relinquished).
  virtual void OnNodeLost(RequestId, NodeId, uint8_t /*reasons*/) {}
  // The tenant may lose the node at `deadline` unless it raises its limit above `price`.
  virtual void OnNotice(RequestId, NodeId, Micros /*deadline*/, Price /*price*/, uint8_t /*reasons*/) {}
  virtual void OnContestEnded(RequestId, NodeId) {}
  virtual void OnOrderCancelled(RequestId, market::CancelReason) {}
  virtual void OnCharged(NodeId, Money /*amount*/) {}
};

// Counters for tests, benchmarks and reports.
struct AdapterStats {
  uint64_t reprices = 0, price_calls = 0;
  uint64_t reprices_skipped = 0;  // NeedsReprice() answered no.
  uint64_t orders_placed = 0, orders_updated = 0, orders_cancelled = 0;
  uint64_t limits_set = 0, relinquished = 0, rejected = 0;
};

class EconAdapter {
 public:
  struct HeldNode {
    NodeId node;
    Price limit = 0;
    bool contested = false;
    Micros deadline = 0;
    int option = -1;  // The request option it was obtained through.
  };
  struct OpenOrder {
    OrderId id;
    uint32_t count = 1;   // Nodes the order asks for (> 1: a gang).
    uint32_t filled = 0;  // Nodes obtained so far.
    Price price = 0;
    int option = -1;  // The request option it was placed on.
  };
  // One option of a request as the re-pricing round uses it: its scope, its
  // declared anchoring and the spec handed to Price(), side by side so a
  // round reads one buffer per request, not three (issue 12). The option is
  // kept here only: Add moves it out of the request.
  struct PricedOption {
    VertexId scope;
    market::Locality locality = market::Locality::kAny;  // As declared.
    NodeId rel_to;                                       // As declared.
    NodeSpec spec;  // The option as declared, but its anchoring is re-set for each Price() call.
  };
  struct RequestState {
    Request request;                   // As added, but its options are in `priced` (request.options is empty).
    std::vector<PricedOption> priced;  // The options, in the request's order.
    std::vector<HeldNode> nodes;   // In acquisition order.
    int option = -1;               // Index of the option held or bid on; -1: none.
    std::vector<OpenOrder> orders; // Open orders for the missing nodes (one gang, or singles).
  };

  EconAdapter(MarketClient* client, PricingStrategy* strategy, AdapterListener* listener = nullptr);

  // Adds a request (INVALID_ARGUMENT if it has no option, a zero count or an
  // unknown node type). Marks the adapter dirty.
  Result<RequestId> Add(Request request);
  // Cancels the request's order and relinquishes its nodes.
  Status Remove(RequestId id);
  // Changes the wanted count; shrinking below the held count relinquishes the
  // most recently acquired nodes first.
  Status Resize(RequestId id, uint32_t count);
  // Relinquishes one held node now (e.g. after a checkpoint inside the grace
  // window); the request still wants it, so Reprice() bids for a replacement.
  Status Yield(RequestId id, NodeId node);

  // The tenant's events from the transport. Updates holdings and orders,
  // calls the listener, marks the adapter dirty. Events of other tenants are ignored.
  void OnEvents(std::span<const market::Event> events);
  void MarkDirty() { dirty_ = true; }
  bool dirty() const { return dirty_; }
  // Whether Reprice() at `now` could do anything the last round did not (see
  // the file comment). Reads the watched quote prices. Counts a "no" in stats().
  bool NeedsReprice(Micros now);
  // Runs Price() for every wanted and held node and applies the results
  // (see the file comment). Clears the dirty flag. Returns the first error of
  // a call the market rejected; the other requests are still processed.
  Status Reprice();

  // A hint for a driver that re-prices many adapters in turn (the simulator's
  // tick, issue 12): asks the CPU to fetch what the next NeedsReprice() and
  // Reprice() read first, one level of pointers deeper per `level`: 0 the
  // adapter itself, 1 (after 0) its first request, client, strategy and read
  // list, 2 (after 1) that request's option and held-node buffers and the
  // strategy's inner strategy, then L >= 3 the strategy chain's object at
  // depth L - 1 (PricingStrategy::inner, and a table at the end); levels 3
  // and 4 also ask the market for its records of the first request's held
  // nodes (MarketClient::PrefetchNode, stages 0 and 1). Each level reads only
  // what the previous ones fetched; nothing changes.
  void Prefetch(int level) const;

  const RequestState* request(RequestId id) const;
  std::optional<RequestId> RequestOf(NodeId node) const;
  uint32_t held_count() const;
  const AdapterStats& stats() const { return stats_; }
  MarketClient& client() { return *client_; }

 private:
  Status RepriceRequest(RequestId id, RequestState& rs);
  Result<VertexId> ScopeOf(const NodeSpec& spec);
  Status CancelAll(RequestState& rs);
  Status CancelOne(RequestState& rs, size_t index);
  Status Place(RequestId id, RequestState& rs, const NodeSpec& spec, VertexId scope, uint32_t count, Price price);
  void ApplyEvent(const market::Event& e);
  void LoseNode(NodeId node, uint8_t reasons);

  MarketClient* client_;
  PricingStrategy* strategy_;
  AdapterListener* listener_;
  bool dirty_ = true;
  // What the last round depends on besides the adapter's own state.
  BookReads reads_;
  Micros reprice_at_ = kNever;  // Earliest NextChange of the last round's answers.
  bool retry_ = false;          // The last round had an error.
  RequestId next_id_ = 1;
  std::map<RequestId, RequestState> requests_;  // Ordered: deterministic pricing order.
  // What Prefetch fetches at levels 2, 3, ...: the strategy chain's objects
  // below the first, then the base's table, read through inner() and table()
  // once, when the adapter is made (issue 12): a level then costs one load of
  // this line, not a walk of virtual inner() calls over the objects the
  // levels before fetched. Hints only: a stale entry fetches the wrong lines.
  struct ChainLine {
    const void* p = nullptr;
    size_t bytes = 0;
  };
  std::array<ChainLine, 4> chain_{};
  std::unordered_map<uint64_t, RequestId> order_owner_;  // OrderId.value -> request.
  std::unordered_map<uint32_t, RequestId> node_owner_;   // NodeId.value -> request.
  std::unordered_map<std::string, VertexId> scope_cache_;
  AdapterStats stats_;
  // Events that arrive while Reprice() is calling the market (an in-process
  // engine delivers them synchronously) wait here until it is done.
  bool in_reprice_ = false;
  std::vector<market::Event> deferred_;
};

}  // namespace laissez::sdk
