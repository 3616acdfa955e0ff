// A small fixture for hand-written engine scenarios: builds nodes and tenants,
// places orders, records events, and checks every invariant of
// tests/support/market_invariants.h on demand.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "market/market_engine.h"
#include "tests/support/market_invariants.h"

namespace laissez::market {

inline constexpr Price U = 1'000'000;           // One unit of money (per hour, for prices).
inline constexpr Micros S = kMicrosPerSecond;   // One second of engine time.

class ScenarioTest : public ::testing::Test {
 protected:
  void Make(MarketParams params = {}, EngineOptions options = {}) {
    engine_ = std::make_unique<MarketEngine>(params, options);
    engine_->set_sink(&sink_);
  }
  MarketEngine& e() {
    if (!engine_) Make();
    return *engine_;
  }

  NodeId Node(const std::string& name, const std::string& rack = "k0", const std::string& type = "h100x8",
              const std::string& row = "w0", const std::string& zone = "z0", Micros t = -1) {
    topology::NodeInfo info{name, type, "eu", zone, row, rack, {8, 640, 10200}};
    auto r = e().AddNode(t < 0 ? e().now() : t, info);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : NodeId();
  }
  TenantId Tenant(const std::string& name, Money balance = 1'000'000 * U, Price max_rate = kInfPrice) {
    auto r = e().CreateTenant(e().now(), name, balance, max_rate);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) deposited_ += balance;
    return r.ok() ? *r : TenantId();
  }
  VertexId Leaf(NodeId n) { return e().topology().node(n).leaf; }
  VertexId Vertex(const std::string& name) {
    auto v = e().topology().FindVertex(name);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : VertexId();
  }
  LocationId Location(const std::string& path) {
    auto l = e().topology().FindLocation(path);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? *l : LocationId();
  }

  OrderId Bid(Micros t, TenantId tenant, VertexId scope, Price price, uint32_t count = 1) {
    auto r = e().PlaceOrder(t, tenant, OrderSpec{scope, price, count, Locality::kAny, NodeId()});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) requested_[r->value] = price;
    return r.ok() ? *r : OrderId();
  }
  void Update(Micros t, TenantId tenant, OrderId order, Price price) {
    Status s = e().UpdateOrder(t, tenant, order, price);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (s.ok()) requested_[order.value] = price;
  }
  void Limit(Micros t, TenantId tenant, NodeId node, Price limit) {
    Status s = e().SetLimit(t, tenant, node, limit);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  void AdvanceTo(Micros t) {
    Status s = e().Advance(t);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  PolicyId Policy(Micros t, const PolicySpec& spec) {
    auto r = e().AddPolicy(t, spec);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : PolicyId();
  }

  NodeView N(NodeId n) {
    auto v = e().GetNode(n);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : NodeView{};
  }
  OrderView O(OrderId o) {
    auto v = e().GetOrder(o);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : OrderView{};
  }
  bool IsOpen(OrderId o) { return e().GetOrder(o).ok(); }
  TenantView T(TenantId t) {
    auto v = e().GetTenant(t);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : TenantView{};
  }
  EvictionQuote EQ(TenantId holder, NodeId n) {
    auto q = e().GetEvictionQuote(holder, n);
    EXPECT_TRUE(q.ok()) << q.status().ToString();
    return q.ok() ? *q : EvictionQuote{};
  }
  Price QuoteAt(VertexId v) {
    auto q = e().Quote(v, false);
    EXPECT_TRUE(q.ok()) << q.status().ToString();
    return q.ok() ? q->quote : -1;
  }

  // Events of a type (optionally about a node) delivered so far.
  std::vector<Event> Events(EventType type, NodeId node = NodeId()) const {
    std::vector<Event> out;
    for (const auto& ev : sink_.events) {
      if (ev.type == type && (!node.valid() || ev.node == node)) out.push_back(ev);
    }
    return out;
  }
  Money PaidBy(TenantId t) const {
    Money sum = 0;
    for (const auto& le : engine_->ledger()) {
      if (le.tenant == t) sum += le.amount;
    }
    return sum;
  }

  // Every invariant holds now.
  void Check() {
    testsupport::InvariantContext ctx;
    ctx.expected_deposited = deposited_;
    ctx.requested = &requested_;
    ctx.charged_event_total = sink_.charged_total;
    ctx.last_notice = &sink_.last_notice;
    std::string bad = testsupport::CheckInvariants(e(), ctx);
    EXPECT_EQ(bad, "") << "events so far:\n" << testsupport::EventsToString(sink_.events);
  }
  std::string State() { return testsupport::Snapshot(e(), 1000); }

  std::unique_ptr<MarketEngine> engine_;
  testsupport::RecordingSink sink_;
  Money deposited_ = 0;
  std::map<uint64_t, Price> requested_;
};

}  // namespace laissez::market
