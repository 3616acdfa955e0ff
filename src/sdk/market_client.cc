#include "sdk/market_client.h"

#include <utility>

namespace laissez::sdk {

Result<Price> MarketClient::QuotePrice(VertexId vertex) {
  auto q = Quote(vertex, /*with_depth=*/false);
  if (!q.ok()) return q.status();
  return q->quote;
}

Result<Price> QuoteCache::Get(const market::MarketEngine& engine, VertexId v) {
  if (v.valid() && v.value < entries_.size() && entries_[v.value].epoch == epoch_) {
    ++hits_;
    return entries_[v.value].price;
  }
  ++misses_;
  auto p = engine.QuotePrice(v);
  if (!p.ok()) return p;
  if (entries_.size() <= v.value) entries_.resize(v.value + 1);
  entries_[v.value] = Entry{epoch_, *p};
  return p;
}

InProcessMarketClient::InProcessMarketClient(market::MarketEngine* engine, TenantId tenant, Clock clock,
                                             QuoteCache* cache)
    : engine_(engine), tenant_(tenant), clock_(std::move(clock)), cache_(cache) {}

Result<OrderId> InProcessMarketClient::PlaceOrder(const market::OrderSpec& spec) {
  Changed();
  return engine_->PlaceOrder(clock_(), tenant_, spec);
}
Status InProcessMarketClient::UpdateOrder(OrderId order, Price price) {
  Changed();
  return engine_->UpdateOrder(clock_(), tenant_, order, price);
}
Status InProcessMarketClient::CancelOrder(OrderId order) {
  Changed();
  return engine_->CancelOrder(clock_(), tenant_, order);
}
Status InProcessMarketClient::SetLimit(NodeId node, Price limit) {
  Changed();
  return engine_->SetLimit(clock_(), tenant_, node, limit);
}
Status InProcessMarketClient::Relinquish(NodeId node) {
  Changed();
  return engine_->Relinquish(clock_(), tenant_, node);
}

Result<market::VertexQuote> InProcessMarketClient::Quote(VertexId vertex, bool with_depth) {
  return engine_->Quote(vertex, with_depth);
}
Result<Price> InProcessMarketClient::QuotePrice(VertexId vertex) {
  return cache_ ? cache_->Get(*engine_, vertex) : engine_->QuotePrice(vertex);
}
Result<market::EvictionQuote> InProcessMarketClient::GetEvictionQuote(NodeId node) {
  return engine_->GetEvictionQuote(tenant_, node);
}
Result<market::OrderView> InProcessMarketClient::GetOrder(OrderId order) {
  auto view = engine_->GetOrder(order);
  // Only the tenant's own orders are visible (rule 12).
  if (view.ok() && view->tenant != tenant_) return NotFound("order: no such order of this tenant");
  return view;
}
Result<market::TenantView> InProcessMarketClient::Me() { return engine_->GetTenant(tenant_); }
Result<Money> InProcessMarketClient::Balance() { return engine_->AvailableBalance(tenant_); }

Result<VertexId> InProcessMarketClient::FindVertex(std::string_view name) {
  return engine_->topology().FindVertex(name);
}
Result<NodeDescription> InProcessMarketClient::DescribeNode(NodeId node) {
  return DescribeTopologyNode(engine_->topology(), node);
}

Result<NodeDescription> DescribeTopologyNode(const topology::Topology& topo, NodeId node) {
  if (node.value >= topo.node_count()) return NotFound("node: unknown node id");
  const topology::Node& n = topo.node(node);
  NodeDescription d;
  d.id = node;
  d.name = n.name;
  d.type = topo.type_name(n.type);
  d.meta = n.meta;
  d.leaf = n.leaf;
  d.type_root = topo.TypeRoot(n.type);
  // Walk the rack's ancestors for the names of each level.
  for (LocationId l = n.rack; l.valid() && l != topology::Topology::kRootLocation;
       l = topo.location(l).parent) {
    const topology::Location& loc = topo.location(l);
    switch (loc.level) {
      case topology::Level::kRegion: d.region = loc.name; break;
      case topology::Level::kZone: d.zone = loc.name; break;
      case topology::Level::kRow: d.row = loc.name; break;
      case topology::Level::kRack: d.rack = loc.name; break;
      default: break;
    }
  }
  return d;
}

}  // namespace laissez::sdk
