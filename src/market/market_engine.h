// MarketEngine: the LaissezCloud market. Topology, order books and their
// aggregates, matching, contests with grace and transfer, second-price charging
// into an append-only ledger, budgets, InfraMaps floors and volatility controls
// (DESIGN.md §3; the exact rules and our deviations are in docs/MECHANISM.md).
//
// Every mutating call takes the engine time `t` of the operation. A call first
// advances the market to `t` (rule 11; even if the call is then rejected), then
// applies the operation, then runs matching until the book is not crossed.
// Rejected calls return a Status naming the field and the reason and change
// nothing else. Events are queued while the state changes and delivered to the
// sink only after the state is consistent again (no listener re-enters a
// half-updated book).
//
// Thread-safety: none. One thread owns an engine; the server funnels requests
// into one writer thread, the simulator drives it from its event loop.
// The engine never reads a clock and owns no threads, so the same calls give
// the same events, state and ledger.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "market/types.h"
#include "topology/topology.h"

namespace laissez::market {

// Receives each operation's events once the engine is consistent.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Called at the end of every public call that produced events, in order.
  // Must not call mutating engine methods.
  virtual void OnEvents(std::span<const Event> events) = 0;
};

struct Operation;  // market/operation.h
// Sees every mutating call as data, with the id it created (UINT64_MAX if none),
// after the call ran; rejected calls too, since they still move time.
using OperationObserver = std::function<void(const Operation& op, uint64_t created_id)>;

struct EngineOptions {
  // Emit kPriceChanged for every vertex whose quote changed during a call.
  bool price_events = false;
  // Keep every ledger entry (totals are always kept).
  bool retain_ledger = true;
};

class MarketEngine {
 public:
  explicit MarketEngine(MarketParams params = {}, EngineOptions options = {});
  ~MarketEngine();
  MarketEngine(const MarketEngine&) = delete;
  MarketEngine& operator=(const MarketEngine&) = delete;

  // The sink is not owned; nullptr drops events.
  void set_sink(EventSink* sink);
  // Records every later mutating call (an operation log, docs/OPLOG.md). It is
  // first called with the current parameters as a set_params at now(), so a
  // fresh engine fed the recorded operations reaches the same state.
  void set_operation_observer(OperationObserver observer);

  // ---- Time ----
  // Applies everything due up to `t` in time order (rule 11). OUT_OF_RANGE if t < now().
  Status Advance(Micros t);
  Micros now() const;
  // When the next thing falls due (deadline, hold expiry, clip step, floor change,
  // exhaustion); kNever if nothing is scheduled.
  Micros NextEventTime() const;

  // ---- Operator ----
  Result<NodeId> AddNode(Micros t, const topology::NodeInfo& info);
  // Removes a free, unreserved node (drain it first). FAILED_PRECONDITION otherwise.
  Status RemoveNode(Micros t, NodeId node);
  Status SetParams(Micros t, const MarketParams& params);
  // Adds an InfraMaps policy (static floor, power cap, carbon, maintenance,
  // adaptive power cap, adaptive carbon budget).
  Result<PolicyId> AddPolicy(Micros t, const PolicySpec& spec);
  Status RemovePolicy(Micros t, PolicyId id);
  // Changes a live adaptive policy's cap in place - an adaptive power cap's
  // cap_w (a cooling failure), an adaptive carbon budget's budget_g_per_h:
  // the controller keeps its value (floor or carbon price) and step times;
  // its next step measures against the new target. NOT_FOUND if no live
  // policy has the id, FAILED_PRECONDITION if it is not adaptive.
  Status SetAdaptiveCap(Micros t, PolicyId id, int64_t cap);

  // ---- Tenants and budgets ----
  Result<TenantId> CreateTenant(Micros t, std::string name, Money balance, Price max_rate = kInfPrice);
  Status Deposit(Micros t, TenantId tenant, Money amount);
  Status SetMaxRate(Micros t, TenantId tenant, Price max_rate);

  // ---- Orders ----
  Result<OrderId> PlaceOrder(Micros t, TenantId tenant, const OrderSpec& spec);
  // A new price; raising it gives the order a new sequence number.
  Status UpdateOrder(Micros t, TenantId tenant, OrderId order, Price price);
  Status CancelOrder(Micros t, TenantId tenant, OrderId order);

  // ---- Holdings ----
  Status SetLimit(Micros t, TenantId tenant, NodeId node, Price limit);
  Status Relinquish(Micros t, TenantId tenant, NodeId node);
  // A hint (issue 12; no effect on the market, any node id accepted): asks the
  // CPU to fetch what a SetLimit on `node` reads first. `stage` 0: the node's
  // record (its place in its type's index is in it); 1 (after 0): its key there.
  void PrefetchNode(NodeId node, int stage) const;

  // Releases spare capacity after a bulk load (no effect on the market). A
  // separate call because internal references must not move mid-operation.
  void Compact();

  // ---- Snapshots (docs/SNAPSHOT.md) ----
  // A self-checking binary image of everything that determines the engine's
  // future behaviour (options, params, clock, counters, topology, nodes,
  // orders, books, tenants, policies and controllers, the schedule, decay and
  // maintenance state, ledger totals, last quotes). Of the ledger history it
  // keeps only the last `ledger_tail` entries (the totals are always exact):
  // the engine never reads the history back, and it grows with the market's
  // age. Taking one twice gives the same bytes.
  std::string Snapshot(size_t ledger_tail = 0) const;
  // Replaces this engine's whole state (options included) by an image's; the
  // sink and the operation observer stay. A restored engine given the same
  // later calls gives the same events, state and snapshots as the original.
  // DATA_LOSS naming the section and the reason for a truncated or corrupt
  // image, FAILED_PRECONDITION for another version; the engine is unchanged
  // on any error.
  Status Restore(std::string_view image);

  // ---- Queries (no side effects; they read the state as of now()) ----
  const topology::Topology& topology() const;
  const MarketParams& params() const;
  Result<VertexQuote> Quote(VertexId v, bool with_depth = true) const;
  // Quote(v).quote alone, without counting the nodes below v: O(log n).
  Result<Price> QuotePrice(VertexId v) const;
  // Only the holder may read its node's eviction quote (PERMISSION_DENIED otherwise).
  Result<EvictionQuote> GetEvictionQuote(TenantId tenant, NodeId node) const;
  Result<NodeView> GetNode(NodeId node) const;
  Result<OrderView> GetOrder(OrderId order) const;
  Result<TenantView> GetTenant(TenantId tenant) const;
  // A policy's state now, removed ones included (alive = false). NOT_FOUND if
  // no policy ever had that id.
  Result<PolicyView> GetPolicy(PolicyId id) const;
  // Policies ever added: their ids are 0 .. policy_count() - 1.
  size_t policy_count() const;
  size_t tenant_count() const;
  Result<TenantId> FindTenant(std::string_view name) const;
  // Money the tenant would have if every holding were settled now.
  Result<Money> AvailableBalance(TenantId tenant) const;
  std::span<const LedgerEntry> ledger() const;
  LedgerTotals ledger_totals() const;
  // Holdings' accrued but unsettled charges (whole micro-units) - for conservation checks.
  Money UnsettledCharges() const;
  size_t resting_order_count() const;
  // Every live order id (resting or pending), ascending.
  std::vector<OrderId> OpenOrders() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  // Tests' access to the state (issue 12: to reach the rare paths of the
  // compact order record without 2^31 updates or 2^20 nodes). Defined by tests only.
  friend struct EngineTestPeer;
};

}  // namespace laissez::market
