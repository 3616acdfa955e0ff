// FakeMarketClient: a scripted MarketClient for unit tests of strategies and
// of the adapter's bookkeeping without an engine. It records every call and
// answers quotes from a table.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sdk/market_client.h"

namespace laissez::sdk {

class FakeMarketClient final : public MarketClient {
 public:
  struct Call {
    std::string op;  // "place", "update", "cancel", "limit", "relinquish".
    uint64_t id = 0;  // Order or node id.
    Price price = 0;
    uint32_t count = 0;
    VertexId scope;
  };

  TenantId tenant() const override { return tenant_; }
  Micros Now() const override { return now; }

  Result<OrderId> PlaceOrder(const market::OrderSpec& spec) override {
    if (reject_orders) return ResourceExhausted("budget: would exceed the balance");
    OrderId id(next_order_++);
    calls.push_back({"place", id.value, spec.price, spec.count, spec.scope});
    return id;
  }
  Status UpdateOrder(OrderId order, Price price) override {
    calls.push_back({"update", order.value, price, 0, {}});
    return Status::Ok();
  }
  Status CancelOrder(OrderId order) override {
    calls.push_back({"cancel", order.value, 0, 0, {}});
    return Status::Ok();
  }
  Status SetLimit(NodeId node, Price limit) override {
    calls.push_back({"limit", node.value, limit, 0, {}});
    return Status::Ok();
  }
  Status Relinquish(NodeId node) override {
    calls.push_back({"relinquish", node.value, 0, 0, {}});
    return Status::Ok();
  }
  Result<market::VertexQuote> Quote(VertexId vertex, bool) override {
    market::VertexQuote q;
    q.vertex = vertex;
    auto it = quotes.find(vertex.value);
    q.quote = it == quotes.end() ? kInfPrice : it->second;
    return q;
  }
  Result<market::EvictionQuote> GetEvictionQuote(NodeId node) override {
    market::EvictionQuote q;
    q.node = node;
    return q;
  }
  Result<market::OrderView> GetOrder(OrderId) override { return NotFound("order: none"); }
  Result<market::TenantView> Me() override { return market::TenantView{}; }
  Result<Money> Balance() override { return balance; }
  Result<VertexId> FindVertex(std::string_view name) override {
    auto it = vertices.find(std::string(name));
    if (it == vertices.end()) return NotFound("vertex: unknown");
    return VertexId(it->second);
  }
  Result<NodeDescription> DescribeNode(NodeId) override { return NotFound("node: none"); }

  Micros now = 0;
  Money balance = 0;
  bool reject_orders = false;
  std::map<std::string, uint32_t> vertices;  // Name -> vertex id.
  std::map<uint32_t, Price> quotes;          // Vertex id -> quote.
  std::vector<Call> calls;

 private:
  TenantId tenant_{7};
  uint64_t next_order_ = 100;
};

}  // namespace laissez::sdk
