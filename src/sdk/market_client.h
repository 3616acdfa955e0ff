// MarketClient: what a tenant can do and see in the market, independent of
// the transport. The EconAdapter and the strategies talk only to this
// interface; `InProcessMarketClient` drives a `market::MarketEngine` directly
// (the simulator, tests), a gRPC transport (target `sdk_grpc`) talks to the
// server.
//
// Contract shared by every implementation:
// - Every call acts for one tenant, `tenant()`. Calls never expose another
//   tenant's identity or orders (DESIGN.md §3 rule 12).
// - Mutating calls take effect at the market's current time (`Now()`); the
//   in-process client reads it from a time source the driver owns, a remote
//   client leaves it to the server's clock.
// - Errors are the engine's Status codes and messages unchanged
//   (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...);
//   a transport failure is UNAVAILABLE. A rejected call changes nothing.
// - Events concerning the tenant (allocations, notices, releases, charges,
//   cancellations) are not pulled through this interface: the transport
//   pushes them to `EconAdapter::OnEvents` (in-process: the driver routes the
//   engine's event stream by tenant; gRPC: the server's event stream).
//
// Thread-safety: none; one thread uses a client at a time.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/types.h"
#include "market/market_engine.h"
#include "market/types.h"
#include "topology/topology.h"

namespace laissez::sdk {

// A node as a tenant sees it: where it is and what it is.
struct NodeDescription {
  NodeId id;
  std::string name;
  std::string type;  // Hardware type name, e.g. "h100x8".
  std::string region, zone, row, rack;
  topology::NodeMeta meta;
  VertexId leaf;       // The node's own vertex (an order scoped here targets exactly this node).
  VertexId type_root;  // The root vertex of its hardware type.
};

class MarketClient {
 public:
  virtual ~MarketClient() = default;

  // The tenant this client acts for.
  virtual TenantId tenant() const = 0;
  // The market time the next call will act at (engine microseconds).
  virtual Micros Now() const = 0;

  // ---- Orders ----
  // Places a bid (`spec.count > 1` makes a gang). Returns the engine's order id.
  virtual Result<OrderId> PlaceOrder(const market::OrderSpec& spec) = 0;
  // Changes an open order's price (raising it re-queues it, rule 1).
  virtual Status UpdateOrder(OrderId order, Price price) = 0;
  // Withdraws an open order. NOT_FOUND if it is already filled or cancelled.
  virtual Status CancelOrder(OrderId order) = 0;

  // ---- Holdings ----
  // Sets the retention limit on a node the tenant holds (rule 2).
  virtual Status SetLimit(NodeId node, Price limit) = 0;
  // Gives a held node up at once (rule 5: a contested node moves to its challenger).
  virtual Status Relinquish(NodeId node) = 0;
  // A hint before SetLimit or Relinquish on `node` (MarketEngine::PrefetchNode;
  // issue 12): nothing for a remote market.
  virtual void PrefetchNode(NodeId /*node*/, int /*stage*/) const {}

  // ---- Reads (no side effects) ----
  // The aggregate quote at a vertex; `with_depth` adds the price levels.
  virtual Result<market::VertexQuote> Quote(VertexId vertex, bool with_depth = false) = 0;
  // Quote(vertex).quote alone; transports may answer it more cheaply.
  virtual Result<Price> QuotePrice(VertexId vertex);
  // How close the market is to taking a node this tenant holds (rule 4).
  virtual Result<market::EvictionQuote> GetEvictionQuote(NodeId node) = 0;
  // One of this tenant's orders.
  virtual Result<market::OrderView> GetOrder(OrderId order) = 0;
  // This tenant: balance, rates, held nodes, open orders.
  virtual Result<market::TenantView> Me() = 0;
  // Money left if every holding were settled now.
  virtual Result<Money> Balance() = 0;

  // ---- Topology lookups ----
  // Resolves "TYPE", "TYPE/region/zone/row/rack" or a node name to a vertex.
  virtual Result<VertexId> FindVertex(std::string_view name) = 0;
  // Describes any node of the market (public information).
  virtual Result<NodeDescription> DescribeNode(NodeId node) = 0;
};

// Quote prices shared by the InProcessMarketClients of one engine (a
// simulator's tenants, CLARIFICATIONS "Simulator load"): a vertex's price is
// read from the engine once and reused by every tenant until the engine
// changes. Every mutating call of a client that shares the cache clears it;
// whoever changes the engine another way (advancing its clock, creating
// tenants or nodes) must call Clear(). Thread-safety: none.
class QuoteCache {
 public:
  void Clear() { ++epoch_; }
  Result<Price> Get(const market::MarketEngine& engine, VertexId v);
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    uint64_t epoch = 0;  // 0: never read (epochs start at 1).
    Price price = 0;
  };
  uint64_t epoch_ = 1;
  uint64_t hits_ = 0, misses_ = 0;
  std::vector<Entry> entries_;  // By vertex id.
};

// A MarketClient over an engine in the same process. The engine and the clock
// are not owned and must outlive the client. Every mutating call first
// advances the engine to `clock()` (the engine does this itself; see
// MarketEngine).
class InProcessMarketClient final : public MarketClient {
 public:
  using Clock = std::function<Micros()>;
  // `cache` (optional, not owned) is shared with the engine's other clients.
  InProcessMarketClient(market::MarketEngine* engine, TenantId tenant, Clock clock, QuoteCache* cache = nullptr);

  TenantId tenant() const override { return tenant_; }
  Micros Now() const override { return clock_(); }

  Result<OrderId> PlaceOrder(const market::OrderSpec& spec) override;
  Status UpdateOrder(OrderId order, Price price) override;
  Status CancelOrder(OrderId order) override;
  Status SetLimit(NodeId node, Price limit) override;
  Status Relinquish(NodeId node) override;
  void PrefetchNode(NodeId node, int stage) const override { engine_->PrefetchNode(node, stage); }

  Result<market::VertexQuote> Quote(VertexId vertex, bool with_depth = false) override;
  Result<Price> QuotePrice(VertexId vertex) override;
  Result<market::EvictionQuote> GetEvictionQuote(NodeId node) override;
  Result<market::OrderView> GetOrder(OrderId order) override;
  Result<market::TenantView> Me() override;
  Result<Money> Balance() override;

  Result<VertexId> FindVertex(std::string_view name) override;
  Result<NodeDescription> DescribeNode(NodeId node) override;

 private:
  // The engine changes: cached quote prices are stale.
  void Changed() {
    if (cache_) cache_->Clear();
  }

  market::MarketEngine* engine_;
  TenantId tenant_;
  Clock clock_;
  QuoteCache* cache_;
};

// Describes `node` of `topo` (shared by transports that hold a topology copy).
Result<NodeDescription> DescribeTopologyNode(const topology::Topology& topo, NodeId node);

}  // namespace laissez::sdk
