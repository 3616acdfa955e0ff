// laissez._native: the C++ SDK bound for Python with pybind11. It binds the
// one EconAdapter (src/sdk/econ_adapter.h), the ready strategies
// (src/sdk/strategies.h, and the named strategies of `laissez agent`) and the
// SDK's gRPC transport (src/server/grpc_client.h); Python adds only the
// tenant's `price(spec, book)` callback. Nothing here re-implements the SDK.
//
// Ownership: a strategy object passed to a decorator or an adapter is kept
// alive by it (the Python object is referenced, so a Python subclass's
// `price` stays callable). Thread-safety: as the C++ SDK, none: use one
// adapter and its connection from one Python thread. The GIL is released only
// while waiting for events.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "market/types.h"
#include "sdk/econ_adapter.h"
#include "sdk/strategies.h"
#include "server/agent.h"
#include "server/grpc_client.h"

namespace py = pybind11;
using namespace laissez;

namespace {

// A failed SDK call: "CODE: message" (e.g. "INVALID_ARGUMENT: count: must be positive").
struct MarketError : std::runtime_error {
  MarketError(std::string code, const std::string& message)
      : std::runtime_error(code + ": " + message), code(std::move(code)) {}
  std::string code;
};

void Check(const Status& s) {
  if (s.ok()) return;
  if (s.code() == StatusCode::kInvalidArgument) throw py::value_error(s.message());
  throw MarketError(std::string(StatusCodeName(s.code())), s.message());
}
template <typename T>
T Take(Result<T> r) {
  Check(r.status());
  return std::move(r).value();
}

// Lets Python subclass PricingStrategy: `def price(self, spec, book)`.
class PyStrategy : public sdk::PricingStrategy {
 public:
  std::optional<laissez::Price> Price(const sdk::NodeSpec& spec, const sdk::OrderBookView& book) override {
    PYBIND11_OVERRIDE_PURE_NAME(std::optional<laissez::Price>, sdk::PricingStrategy, "price", Price, spec, book);
  }
};

// A strategy referenced from C++ (a decorator's inner, an adapter's): keeps the
// Python object alive and forwards to it.
class Ref final : public sdk::PricingStrategy {
 public:
  explicit Ref(py::object obj) : obj_(std::move(obj)), s_(obj_.cast<sdk::PricingStrategy*>()) {}
  std::optional<laissez::Price> Price(const sdk::NodeSpec& spec, const sdk::OrderBookView& book) override {
    return s_->Price(spec, book);
  }

 private:
  py::object obj_;
  sdk::PricingStrategy* s_;
};

std::unique_ptr<sdk::PricingStrategy> Inner(py::object obj) {
  if (!py::isinstance<sdk::PricingStrategy>(obj)) throw py::type_error("inner: expected a PricingStrategy");
  return std::make_unique<Ref>(std::move(obj));
}

// A strategy made by one of the factories (OnDemandLike, MakeStrategy, ...).
class Owned final : public sdk::PricingStrategy {
 public:
  explicit Owned(std::unique_ptr<sdk::PricingStrategy> s) : s_(std::move(s)) {}
  std::optional<laissez::Price> Price(const sdk::NodeSpec& spec, const sdk::OrderBookView& book) override {
    return s_->Price(spec, book);
  }

 private:
  std::unique_ptr<sdk::PricingStrategy> s_;
};

// Forwards the adapter's reports to a Python object's optional methods.
class PyListener final : public sdk::AdapterListener {
 public:
  explicit PyListener(py::object obj) : obj_(std::move(obj)) {}
  void OnNodeGained(sdk::RequestId r, NodeId n, laissez::Price limit) override { Call("on_node_gained", r, n.value, limit); }
  void OnNodeLost(sdk::RequestId r, NodeId n, uint8_t reasons) override {
    Call("on_node_lost", r, n.value, market::ReasonNames(reasons));
  }
  void OnNotice(sdk::RequestId r, NodeId n, Micros deadline, laissez::Price price, uint8_t reasons) override {
    Call("on_notice", r, n.value, deadline, price, market::ReasonNames(reasons));
  }
  void OnContestEnded(sdk::RequestId r, NodeId n) override { Call("on_contest_ended", r, n.value); }
  void OnOrderCancelled(sdk::RequestId r, market::CancelReason why) override {
    Call("on_order_cancelled", r, std::string(market::CancelReasonName(why)));
  }
  void OnCharged(NodeId n, Money amount) override { Call("on_charged", n.value, amount); }

 private:
  template <typename... A>
  void Call(const char* name, A&&... args) {
    if (obj_.is_none() || !py::hasattr(obj_, name)) return;
    obj_.attr(name)(std::forward<A>(args)...);
  }
  py::object obj_;
};

// A connection: the gRPC MarketClient and its watch stream.
struct Connection {
  std::unique_ptr<server::GrpcMarketClient> client;
  std::unique_ptr<server::GrpcMarketClient::EventStream> stream;
};

py::dict EventDict(server::GrpcMarketClient& c, const market::Event& e) {
  py::dict d;
  d["type"] = std::string(market::EventTypeName(e.type));
  d["time"] = e.time;
  d["node"] = e.node.valid() ? py::object(py::int_(e.node.value)) : py::object(py::none());
  if (e.node.valid()) {
    auto desc = c.DescribeNode(e.node);
    d["node_name"] = desc.ok() ? desc->name : std::string();
  }
  d["price"] = e.price;
  d["amount"] = e.amount;
  d["deadline"] = e.deadline;
  d["reasons"] = market::ReasonNames(e.reasons);
  return d;
}

// The adapter together with what it references, so Python cannot drop them early.
struct Adapter {
  Adapter(std::shared_ptr<Connection> c, py::object strategy, py::object listener)
      : conn(std::move(c)), strategy(Inner(std::move(strategy))), listener(std::move(listener)),
        adapter(conn->client.get(), this->strategy.get(), &this->listener) {}
  std::shared_ptr<Connection> conn;
  std::unique_ptr<sdk::PricingStrategy> strategy;
  PyListener listener;
  sdk::EconAdapter adapter;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "The LaissezCloud C++ SDK (EconAdapter, strategies, gRPC transport) bound for Python.";
  auto err = py::register_exception<MarketError>(m, "MarketError", PyExc_RuntimeError);
  (void)err;
  m.attr("MICRO_UNITS") = kMicroUnits;
  m.attr("MICROS_PER_SECOND") = kMicrosPerSecond;
  m.attr("MICROS_PER_HOUR") = kMicrosPerHour;
  m.attr("PPM") = kPpm;
  m.attr("INF_PRICE") = kInfPrice;
  m.attr("DEFAULT_STRATEGY") = std::string(server::kDefaultStrategy);

  py::class_<sdk::NodeSpec>(m, "NodeSpec", "The node a tenant wants or holds (the paper's NodeSpec).")
      .def(py::init([](std::string node_type, std::string location, std::string locality,
                       std::map<std::string, std::string> meta) {
             sdk::NodeSpec s;
             s.node_type = std::move(node_type);
             s.location = std::move(location);
             s.locality = Take(market::ParseLocality(locality, "locality"));
             s.meta = std::move(meta);
             return s;
           }),
           py::arg("node_type"), py::arg("location") = "", py::arg("locality") = "any",
           py::arg("meta") = std::map<std::string, std::string>{})
      .def_readwrite("node_type", &sdk::NodeSpec::node_type)
      .def_readwrite("location", &sdk::NodeSpec::location)
      .def_readwrite("meta", &sdk::NodeSpec::meta)
      .def_property_readonly("locality", [](const sdk::NodeSpec& s) { return std::string(market::LocalityName(s.locality)); })
      .def_property_readonly("held", [](const sdk::NodeSpec& s) -> std::optional<uint32_t> {
        return s.held.valid() ? std::optional<uint32_t>(s.held.value) : std::nullopt;
      }, "The held node's id when Price() is asked for a retention limit, else None.")
      .def_readonly("count", &sdk::NodeSpec::count, "Nodes wanted at this spec in this call.")
      .def("__repr__", [](const sdk::NodeSpec& s) {
        return "NodeSpec(node_type='" + s.node_type + "', location='" + s.location + "', held=" +
               (s.held.valid() ? std::to_string(s.held.value) : "None") + ", count=" + std::to_string(s.count) + ")";
      });

  py::class_<sdk::OrderBookView>(m, "OrderBookView",
                                 "What a strategy may read while pricing one NodeSpec (valid during the call only).")
      .def_property_readonly("now", &sdk::OrderBookView::now, "Market time, engine microseconds.")
      .def_property_readonly("quote", &sdk::OrderBookView::quote, "Lowest obtain price at the scope (INF_PRICE: none).")
      .def_property_readonly("free_count", &sdk::OrderBookView::free_count)
      .def("quote_of", &sdk::OrderBookView::QuoteOf, py::arg("vertex_name"))
      .def_property_readonly("held", [](const sdk::OrderBookView& b) -> std::optional<uint32_t> {
        return b.held().valid() ? std::optional<uint32_t>(b.held().value) : std::nullopt;
      })
      .def_property_readonly("current_limit", &sdk::OrderBookView::current_limit)
      .def_property_readonly("eviction", [](const sdk::OrderBookView& b) -> py::object {
        const market::EvictionQuote* q = b.eviction();
        if (!q) return py::none();
        py::dict d;
        d["limit"] = q->limit;
        d["competing"] = q->competing;
        d["floor"] = q->floor;
        d["obtain"] = q->obtain;
        d["pays"] = q->pays;
        d["contested"] = q->contested;
        d["deadline"] = q->deadline;
        d["reasons"] = market::ReasonNames(q->reasons);
        return d;
      }, "For a held node: how close the market is to taking it (dict), else None.")
      .def_property_readonly("request_held", &sdk::OrderBookView::request_held)
      .def_property_readonly("request_count", &sdk::OrderBookView::request_count)
      .def_property_readonly("balance", &sdk::OrderBookView::balance);

  py::class_<sdk::PricingStrategy, PyStrategy>(
      m, "PricingStrategy",
      "The tenant's pricing callback. Subclass and define price(spec, book) -> int | None: micro-units per node "
      "per hour; None withdraws the bid or relinquishes the held node.")
      .def(py::init<>())
      .def("price", &sdk::PricingStrategy::Price, py::arg("spec"), py::arg("book"));

  py::class_<Owned, sdk::PricingStrategy>(m, "_Owned");
  py::class_<sdk::FixedValue, sdk::PricingStrategy>(m, "FixedValue", "The same price for every node, wanted or held.")
      .def(py::init<laissez::Price>(), py::arg("price"));
  m.def("on_demand_like", [](laissez::Price high) { return std::make_unique<Owned>(sdk::OnDemandLike(high)); },
        py::arg("high"), "A high flat price: rarely outbid.");
  m.def("spot_like", [](laissez::Price low) { return std::make_unique<Owned>(sdk::SpotLike(low)); }, py::arg("low"),
        "A low flat price: outbid first when the market is tight.");
  py::class_<sdk::ThroughputValue, sdk::PricingStrategy>(m, "ThroughputValue",
                                                         "Value x the type's relative throughput (ppm).")
      .def(py::init<laissez::Price, std::unordered_map<std::string, Ppm>>(), py::arg("value_per_hour"),
           py::arg("speed_ppm"))
      .def("value_of", &sdk::ThroughputValue::ValueOf, py::arg("type"));
  py::class_<sdk::BudgetCapped, sdk::PricingStrategy>(m, "BudgetCapped",
                                                      "Caps the inner answer per node and by what the balance sustains.")
      .def(py::init([](py::object inner, laissez::Price max_per_node, Micros horizon) {
             return std::make_unique<sdk::BudgetCapped>(Inner(std::move(inner)), max_per_node, horizon);
           }),
           py::arg("inner"), py::arg("max_per_node"), py::arg("horizon") = 0);
  py::class_<sdk::DeadlineUrgency, sdk::PricingStrategy>(m, "DeadlineUrgency", "Urgency rising as a deadline nears.")
      .def(py::init([](py::object inner, Micros deadline, std::function<Micros()> remaining, Ppm relaxed_ppm,
                       Ppm urgent_ppm, Ppm relaxed_slack_ppm, Ppm urgent_slack_ppm) {
             sdk::DeadlineUrgency::Params p;
             p.deadline = deadline;
             p.remaining = std::move(remaining);
             p.relaxed_ppm = relaxed_ppm;
             p.urgent_ppm = urgent_ppm;
             p.relaxed_slack_ppm = relaxed_slack_ppm;
             p.urgent_slack_ppm = urgent_slack_ppm;
             return std::make_unique<sdk::DeadlineUrgency>(Inner(std::move(inner)), std::move(p));
           }),
           py::arg("inner"), py::arg("deadline"), py::arg("remaining"), py::arg("relaxed_ppm") = 500'000,
           py::arg("urgent_ppm") = 3'000'000, py::arg("relaxed_slack_ppm") = 3'000'000,
           py::arg("urgent_slack_ppm") = 1'500'000)
      .def("factor_at", &sdk::DeadlineUrgency::FactorAt, py::arg("now"));
  py::class_<sdk::LocalityAware, sdk::PricingStrategy>(m, "LocalityAware", "Nodes near held ones are worth more.")
      .def(py::init([](py::object inner, Ppm bonus_ppm) {
             return std::make_unique<sdk::LocalityAware>(Inner(std::move(inner)), bonus_ppm);
           }),
           py::arg("inner"), py::arg("bonus_ppm"));
  py::class_<sdk::GangAware, sdk::PricingStrategy>(m, "GangAware", "A held node of a gang is worth the whole gang.")
      .def(py::init([](py::object inner) { return std::make_unique<sdk::GangAware>(Inner(std::move(inner))); }),
           py::arg("inner"));
  py::class_<sdk::MigrationAware, sdk::PricingStrategy>(m, "MigrationAware",
                                                        "Defends a held node by the cost of moving.")
      .def(py::init([](py::object inner, Micros overhead, std::function<Micros()> uncommitted, Micros amortization) {
             sdk::MigrationAware::Params p;
             p.overhead = overhead;
             p.uncommitted = std::move(uncommitted);
             p.amortization = amortization;
             return std::make_unique<sdk::MigrationAware>(Inner(std::move(inner)), std::move(p));
           }),
           py::arg("inner"), py::arg("overhead") = 0, py::arg("uncommitted") = nullptr,
           py::arg("amortization") = kMicrosPerHour)
      .def("premium", &sdk::MigrationAware::Premium, py::arg("value"));
  py::class_<sdk::CostOfDelay, sdk::PricingStrategy>(
      m, "CostOfDelay", "The truthful bid under a retention utility: what the job loses per node-hour without the node "
                        "(batch or serving; docs/STRATEGIES.md).")
      .def(py::init([](const std::string& kind, laissez::Price value, std::unordered_map<std::string, Ppm> speed_ppm,
                       Micros arrival, Micros ideal, uint32_t nodes, std::function<Micros()> remaining,
                       std::function<Micros()> uncommitted, Micros overhead, Micros amortization, Micros deadline) {
             sdk::CostOfDelay::Params p;
             if (kind == "batch") p.kind = sdk::CostOfDelay::Kind::kBatch;
             else if (kind == "serving") p.kind = sdk::CostOfDelay::Kind::kServing;
             else throw py::value_error("kind: \"" + kind + "\" is not batch or serving");
             p.value = value;
             p.speed_ppm = std::move(speed_ppm);
             p.arrival = arrival;
             p.ideal = ideal;
             p.nodes = nodes;
             p.remaining = std::move(remaining);
             p.uncommitted = std::move(uncommitted);
             p.overhead = overhead;
             p.amortization = amortization;
             p.deadline = deadline;
             return std::make_unique<sdk::CostOfDelay>(std::move(p));
           }),
           py::arg("kind") = "batch", py::arg("value") = 0, py::arg("speed_ppm") = std::unordered_map<std::string, Ppm>{},
           py::arg("arrival") = 0, py::arg("ideal") = 0, py::arg("nodes") = 1, py::arg("remaining") = nullptr,
           py::arg("uncommitted") = nullptr, py::arg("overhead") = 0, py::arg("amortization") = kMicrosPerHour,
           py::arg("deadline") = kNever)
      .def("delay_cost_per_hour", &sdk::CostOfDelay::DelayCostPerHour, py::arg("now"), py::arg("speed_ppm"),
           py::arg("held"));
  m.def(
      "make_strategy",
      [](const std::string& name, laissez::Price value, laissez::Price cap, Ppm bonus_ppm, Micros overhead) {
        server::AgentOptions o;
        o.strategy = name;
        o.value = value;
        o.cap = cap;
        o.bonus_ppm = bonus_ppm;
        o.overhead = overhead;
        return std::make_unique<Owned>(Take(server::MakeStrategy(o)));
      },
      py::arg("name") = std::string(server::kDefaultStrategy), py::arg("value") = 10 * kMicroUnits,
      py::arg("cap") = 0, py::arg("bonus_ppm") = 200'000, py::arg("overhead") = 10 * 60 * kMicrosPerSecond,
      "A ready strategy by the name `laissez agent --strategy` and `laissez run --strategy` take.");

  py::class_<Connection, std::shared_ptr<Connection>>(
      m, "Connection", "The SDK's gRPC transport: a tenant's MarketClient and its watch stream.")
      .def(py::init([](const std::string& address, const std::string& token, const std::string& tls_ca,
                       std::vector<std::string> watch) {
             server::ConnectOptions o;
             o.address = address;
             o.token = token;
             o.tls_ca = tls_ca;
             auto c = std::make_shared<Connection>();
             {
               py::gil_scoped_release nogil;
               auto client = server::GrpcMarketClient::Connect(o);
               Check(client.status());
               c->client = std::move(client).value();
               auto stream = c->client->Watch(watch);
               Check(stream.status());
               c->stream = std::move(stream).value();
             }
             return c;
           }),
           py::arg("address"), py::arg("token"), py::arg("tls_ca") = "", py::arg("watch") = std::vector<std::string>{},
           "Connects (and opens a watch on the vertices in `watch`: their price changes and the tenant's events).")
      .def_property_readonly("tenant", [](Connection& c) { return c.client->tenant_name(); })
      .def_property_readonly("tenant_id", [](Connection& c) { return c.client->tenant().value; })
      .def_property_readonly("now", [](Connection& c) { return c.client->Now(); })
      .def("node_name", [](Connection& c, uint32_t node) { return Take(c.client->DescribeNode(NodeId(node))).name; },
           py::arg("node"))
      .def("balance", [](Connection& c) { return Take(c.client->Balance()); },
           "Money left if every holding were settled now (micro-units).");

  py::class_<Adapter>(m, "EconAdapter",
                      "The one C++ EconAdapter: calls strategy.price(spec, book) for every wanted and held node and "
                      "places, updates or withdraws orders and limits (src/sdk/econ_adapter.h).")
      .def(py::init([](std::shared_ptr<Connection> c, py::object strategy, py::object listener) {
             return std::make_unique<Adapter>(std::move(c), std::move(strategy), std::move(listener));
           }),
           py::arg("connection"), py::arg("strategy"), py::arg("listener") = py::none())
      .def(
          "add",
          [](Adapter& a, std::vector<sdk::NodeSpec> options, uint32_t count, bool gang, bool mixed_types) {
            sdk::Request r;
            r.options = std::move(options);
            r.count = count;
            r.gang = gang;
            r.mixed_types = mixed_types;
            return Take(a.adapter.Add(std::move(r)));
          },
          py::arg("options"), py::arg("count") = 1, py::arg("gang") = true, py::arg("mixed_types") = false,
          "Wants `count` nodes of one of `options` (in order of preference); returns the request id.")
      .def("remove", [](Adapter& a, sdk::RequestId id) { Check(a.adapter.Remove(id)); }, py::arg("request"),
           "Cancels the request's orders and relinquishes its nodes.")
      .def("resize", [](Adapter& a, sdk::RequestId id, uint32_t count) { Check(a.adapter.Resize(id, count)); },
           py::arg("request"), py::arg("count"))
      .def("yield_node", [](Adapter& a, sdk::RequestId id, uint32_t node) { Check(a.adapter.Yield(id, NodeId(node))); },
           py::arg("request"), py::arg("node"), "Relinquishes a held node now; the request bids for a replacement.")
      .def("reprice", [](Adapter& a) { Check(a.adapter.Reprice()); }, "Runs price() for every wanted and held node.")
      .def("mark_dirty", [](Adapter& a) { a.adapter.MarkDirty(); })
      .def_property_readonly("dirty", [](Adapter& a) { return a.adapter.dirty(); })
      .def_property_readonly("held_count", [](Adapter& a) { return a.adapter.held_count(); })
      .def(
          "held",
          [](Adapter& a, sdk::RequestId id) {
            py::list out;
            const auto* rs = a.adapter.request(id);
            if (!rs) throw py::key_error("request: unknown request id");
            for (const auto& h : rs->nodes) {
              py::dict d;
              d["node"] = h.node.value;
              d["name"] = Take(a.conn->client->DescribeNode(h.node)).name;
              d["limit"] = h.limit;
              d["contested"] = h.contested;
              d["deadline"] = h.deadline;
              out.append(d);
            }
            return out;
          },
          py::arg("request"), "The request's held nodes (dicts: node, name, limit, contested, deadline).")
      .def(
          "poll",
          [](Adapter& a, int wait_ms) {
            std::vector<market::Event> events;
            Status s;
            {
              py::gil_scoped_release nogil;
              s = a.conn->stream->Poll(&events, wait_ms);
            }
            Check(s);
            bool prices = false;
            for (const auto& e : events) prices |= e.type == market::EventType::kPriceChanged;
            if (!events.empty()) a.adapter.OnEvents(events);
            if (prices) a.adapter.MarkDirty();
            py::list out;
            for (const auto& e : events) out.append(EventDict(*a.conn->client, e));
            return out;
          },
          py::arg("wait_ms") = 100,
          "Waits up to wait_ms for events, hands them to the adapter (listener callbacks run here) and returns them.")
      .def_property_readonly("stats", [](Adapter& a) {
        const auto& s = a.adapter.stats();
        py::dict d;
        d["reprices"] = s.reprices;
        d["price_calls"] = s.price_calls;
        d["orders_placed"] = s.orders_placed;
        d["orders_updated"] = s.orders_updated;
        d["orders_cancelled"] = s.orders_cancelled;
        d["limits_set"] = s.limits_set;
        d["relinquished"] = s.relinquished;
        d["rejected"] = s.rejected;
        return d;
      });
}
