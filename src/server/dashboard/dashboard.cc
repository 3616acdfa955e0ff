#include "server/dashboard/dashboard.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "laissez/v1/market.grpc.pb.h"
#include "server/dashboard/assets.h"
#include "server/server.h"

namespace laissez::server::dashboard {
namespace {

using json = nlohmann::json;
namespace pb = ::laissez::v1;

// kInfPrice has no JSON number a browser can hold exactly; null means "none".
json PriceJson(Price p) { return p >= kInfPrice ? json(nullptr) : json(p); }

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

std::string JoinPrefix(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < parts.size(); ++i) {
    if (i) s += '/';
    s += parts[i];
  }
  return s;
}

int HttpStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition: return 409;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

void Reply(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(), "application/json");
}

void ReplyError(httplib::Response& res, const Status& s) {
  Reply(res, json{{"error", s.message()}, {"code", static_cast<int>(s.code())}}, HttpStatus(s));
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t c = s.find(',', start);
    if (c == std::string::npos) c = s.size();
    if (c > start) out.push_back(s.substr(start, c - start));
    start = c + 1;
  }
  return out;
}

// One price sample at a vertex: (engine time in us, price; kInfPrice: no quote).
struct Sample {
  Micros time;
  Price price;
};

class Dashboard {
 public:
  explicit Dashboard(Server* s) : s_(s) {}
  ~Dashboard() {
    stop_ = true;
    if (recorder_.joinable()) recorder_.join();
    if (sub_) s_->core().Unsubscribe(sub_);
  }

  void Start() {
    sub_ = s_->core().Subscribe(true, TenantId(), {});
    recorder_ = std::thread([this] { Record(); });
  }

  Result<Principal> Auth(const httplib::Request& req) const {
    std::string h = req.get_header_value("Authorization");
    if (h.empty()) return Unauthenticated("authorization: missing bearer token");
    return s_->tokens().Authenticate(h);
  }

  json Me(const Principal& p) const { return json{{"role", RoleName(p.role)}, {"name", p.name}}; }

  Result<json> OperatorOverview();
  Result<json> TenantOverview(const Principal& p, const std::vector<std::string>& watch);
  Result<json> History(const std::string& vertex);
  Status Control(const Principal& p, const std::string& header, const std::string& kind, const json& body,
                 json* out);
  void Events(const httplib::Request& req, httplib::Response& res, const Principal& p);

 private:
  void Record();

  Server* s_;
  std::shared_ptr<Subscription> sub_;
  std::thread recorder_;
  std::atomic<bool> stop_{false};

  std::mutex hist_mu_;
  std::unordered_map<uint32_t, std::deque<Sample>> history_;  // By vertex id.
  static constexpr size_t kHistory = 2048;

  // Open event streams, per token id and in all (server.h bounds them).
  std::mutex streams_mu_;
  std::unordered_map<uint64_t, int> streams_;
  int streams_total_ = 0;
};

// Keeps the price history: every price change the market reports, per vertex.
void Dashboard::Record() {
  while (!stop_) {
    std::vector<WireEvent> events;
    bool open = sub_->Next(&events, std::chrono::milliseconds(200));
    if (!events.empty()) {
      std::lock_guard lock(hist_mu_);
      for (const auto& w : events) {
        if (w.event.type != market::EventType::kPriceChanged) continue;
        auto& q = history_[w.event.vertex.value];
        q.push_back({w.event.time, w.event.price});
        if (q.size() > kHistory) q.pop_front();
      }
    }
    if (!open) break;
  }
}

// The power caps in force on each row, read from the engine (policy ids run
// from 0): the smallest cap of a row's staircases and adaptive caps, and each
// adaptive cap's controller (floor F, target T, hold band bottom L, the staying
// power S it measured at its last step, its next step).
struct RowCaps {
  int64_t cap_w = 0;  // 0: no cap.
  json adaptive = json::array();
};
std::map<uint32_t, RowCaps> PowerCaps(const market::MarketEngine& e) {
  std::map<uint32_t, RowCaps> out;
  for (uint32_t id = 0; id < e.policy_count(); ++id) {
    auto pv = e.GetPolicy(PolicyId(id));
    if (!pv.ok() || !pv->alive) continue;
    LocationId row;
    int64_t cap = 0;
    if (const auto* pc = std::get_if<market::PowerCapSpec>(&pv->spec)) {
      row = pc->row;
      cap = pc->cap_w;
    } else if (const auto* ac = std::get_if<market::AdaptivePowerCapSpec>(&pv->spec)) {
      row = ac->row;
      cap = ac->cap_w;
      auto th = market::AdaptiveThresholdsOf(*ac);
      out[row.value].adaptive.push_back(json{{"policy", id},
                                             {"cap_w", ac->cap_w},
                                             {"target_w", th.target},
                                             {"low_w", th.low},
                                             {"floor", PriceJson(pv->floor)},
                                             {"staying_w", pv->staying_w},
                                             {"next_step", pv->next_step}});
    } else {
      continue;
    }
    RowCaps& rc = out[row.value];
    rc.cap_w = rc.cap_w == 0 ? cap : std::min(rc.cap_w, cap);
  }
  return out;
}

Result<json> Dashboard::OperatorOverview() {
  return s_->core().Execute<json>("dashboard", [&](WriterContext& w) -> Result<json> {
    const auto& e = w.engine();
    const auto& t = e.topology();
    json types = json::array();
    struct RowAgg {
      int64_t total_w = 0, committed_w = 0;
      Price floor_min = kInfPrice, floor_max = 0;
      uint32_t nodes = 0;
    };
    std::map<std::string, RowAgg> rows;
    std::map<uint32_t, std::string> row_path_by_id;
    uint32_t n_free = 0, n_held = 0, n_contested = 0, n_reserved = 0;
    Price revenue = 0;
    for (uint32_t ti = 0; ti < t.type_count(); ++ti) {
      TypeId type(ti);
      auto leaves = t.LeafOrder(type);
      if (leaves.empty()) continue;
      // zone -> row -> rack -> nodes, in leaf (location) order.
      json zones = json::array();
      std::string cur_zone, cur_row, cur_rack;
      for (NodeId n : leaves) {
        const auto& node = t.node(n);
        const std::string& rack_path = t.location(node.rack).path;
        auto parts = SplitPath(rack_path);
        std::string zone = JoinPrefix(parts, parts.size() >= 3 ? parts.size() - 2 : 1);
        std::string row = JoinPrefix(parts, parts.size() >= 2 ? parts.size() - 1 : 1);
        if (zones.empty() || zone != cur_zone) {
          zones.push_back(json{{"path", zone}, {"rows", json::array()}});
          cur_zone = zone;
          cur_row.clear();
        }
        auto& zrows = zones.back()["rows"];
        if (zrows.empty() || row != cur_row) {
          zrows.push_back(json{{"path", row}, {"racks", json::array()}});
          cur_row = row;
          cur_rack.clear();
        }
        auto& racks = zrows.back()["racks"];
        if (racks.empty() || rack_path != cur_rack) {
          racks.push_back(json{{"path", rack_path}, {"nodes", json::array()}});
          cur_rack = rack_path;
        }
        auto v = e.GetNode(n);
        if (!v.ok()) continue;
        json j{{"name", node.name}, {"status", market::NodeStatusName(v->status)}, {"floor", v->floor},
               {"vertex", t.VertexName(node.leaf)}};
        Price price = kInfPrice;
        if (v->holder.valid()) {
          j["holder"] = w.TenantName(v->holder);
          j["limit"] = v->limit;
          auto q = e.GetEvictionQuote(v->holder, n);
          if (q.ok()) {
            price = q->pays;
            revenue += q->pays;
            j["competing"] = q->competing;
            j["obtain"] = PriceJson(q->obtain);
            if (q->contested) j["deadline"] = q->deadline;
          }
        } else {
          auto q = e.Quote(node.leaf, false);
          if (q.ok()) price = q->quote;
        }
        j["price"] = PriceJson(price);
        switch (v->status) {
          case market::NodeStatus::kFree: ++n_free; break;
          case market::NodeStatus::kHeld: ++n_held; break;
          case market::NodeStatus::kContested: ++n_contested; break;
          case market::NodeStatus::kReserved: ++n_reserved; break;
          default: break;
        }
        racks.back()["nodes"].push_back(std::move(j));
        // Row power: committed = nodes not free.
        LocationId row_id = t.location(node.rack).parent;
        auto& agg = rows[row];
        row_path_by_id[row_id.value] = row;
        agg.nodes++;
        agg.total_w += node.meta.power_w;
        if (v->status != market::NodeStatus::kFree) agg.committed_w += node.meta.power_w;
        agg.floor_min = std::min(agg.floor_min, v->floor);
        agg.floor_max = std::max(agg.floor_max, v->floor);
      }
      json tj{{"type", t.type_name(type)}, {"zones", std::move(zones)}};
      auto q = e.Quote(t.TypeRoot(type), false);
      if (q.ok()) {
        tj["quote"] = PriceJson(q->quote);
        tj["total"] = q->total;
        tj["free"] = q->free;
        tj["held"] = q->held;
        tj["contested"] = q->contested;
      }
      types.push_back(std::move(tj));
    }
    std::map<std::string, RowCaps> caps_by_path;
    for (auto& [loc, caps] : PowerCaps(e)) {
      auto it = row_path_by_id.find(loc);
      if (it != row_path_by_id.end()) caps_by_path[it->second] = std::move(caps);
    }
    json jrows = json::array();
    for (const auto& [path, a] : rows) {
      json r{{"path", path}, {"nodes", a.nodes}, {"power_w", a.total_w}, {"committed_w", a.committed_w},
             {"floor_min", a.floor_min >= kInfPrice ? json(nullptr) : json(a.floor_min)},
             {"floor_max", PriceJson(a.floor_max)}};
      auto it = caps_by_path.find(path);
      bool capped = it != caps_by_path.end();
      r["cap_w"] = capped ? json(it->second.cap_w) : json(nullptr);
      r["adaptive"] = capped ? it->second.adaptive : json::array();
      jrows.push_back(std::move(r));
    }
    uint32_t live = n_free + n_held + n_contested + n_reserved;
    auto totals = e.ledger_totals();
    json tot{{"nodes", live},
             {"free", n_free},
             {"held", n_held},
             {"contested", n_contested},
             {"reserved", n_reserved},
             {"utilization_ppm", live ? static_cast<int64_t>(n_held + n_contested) * 1'000'000 / live : 0},
             {"revenue_per_hour", revenue},
             {"nodes_in_grace", n_contested},
             {"operator_revenue", totals.operator_revenue},
             {"tenants", e.tenant_count()},
             {"resting_orders", e.resting_order_count()}};
    return json{{"now", w.now()}, {"types", std::move(types)}, {"rows", std::move(jrows)}, {"totals", std::move(tot)}};
  });
}

Result<json> Dashboard::TenantOverview(const Principal& p, const std::vector<std::string>& watch) {
  return s_->core().Execute<json>("dashboard", [&](WriterContext& w) -> Result<json> {
    const auto& e = w.engine();
    const auto& t = e.topology();
    LZ_ASSIGN_OR_RETURN(auto tv, e.GetTenant(p.tenant));
    json nodes = json::array();
    for (NodeId n : tv.nodes) {
      if (!t.IsLiveNode(n)) continue;
      auto q = e.GetEvictionQuote(p.tenant, n);
      if (!q.ok()) continue;
      const auto& node = t.node(n);
      json j{{"name", node.name},
             {"type", t.type_name(node.type)},
             {"location", t.location(node.rack).path},
             {"limit", q->limit},
             {"pays", q->pays},
             {"competing", q->competing},
             {"floor", q->floor},
             {"obtain", PriceJson(q->obtain)},
             {"contested", q->contested}};
      if (q->contested) j["deadline"] = q->deadline;
      nodes.push_back(std::move(j));
    }
    json orders = json::array();
    for (OrderId id : tv.orders) {
      auto o = e.GetOrder(id);
      if (!o.ok() || o->tenant != p.tenant) continue;
      orders.push_back(json{{"id", o->id.value},
                            {"scope", t.VertexName(o->spec.scope)},
                            {"price", o->spec.price},
                            {"effective_price", o->effective_price},
                            {"count", o->spec.count},
                            {"filled", o->filled},
                            {"state", market::OrderStateName(o->state)}});
    }
    json ledger = json::array();
    auto all = e.ledger();
    for (size_t i = all.size(); i-- > 0 && ledger.size() < 50;) {
      const auto& l = all[i];
      if (l.tenant != p.tenant) continue;
      json j{{"time", l.time}, {"from", l.from}, {"rate", l.rate}, {"amount", l.amount}, {"waived", l.waived}};
      if (l.node.valid() && l.node.value < t.node_count()) j["node"] = t.node(l.node).name;
      ledger.push_back(std::move(j));
    }
    json quotes = json::array();
    for (const auto& name : watch) {
      auto v = t.FindVertex(name);
      if (!v.ok()) {
        quotes.push_back(json{{"vertex", name}, {"error", "no vertex named \"" + name.substr(0, 64) + "\""}});
        continue;
      }
      auto q = e.Quote(*v, false);
      if (!q.ok()) continue;
      quotes.push_back(json{{"vertex", t.VertexName(*v)}, {"quote", PriceJson(q->quote)}, {"total", q->total},
                            {"free", q->free}, {"held", q->held}, {"contested", q->contested}});
    }
    auto avail = e.AvailableBalance(p.tenant);
    json types = json::array();
    for (uint32_t ti = 0; ti < t.type_count(); ++ti) {
      if (!t.LeafOrder(TypeId(ti)).empty()) types.push_back(t.type_name(TypeId(ti)));
    }
    return json{{"now", w.now()},
                {"tenant", tv.name},
                {"balance", tv.balance},
                {"available", avail.ok() ? json(*avail) : json(nullptr)},
                {"spend_rate", tv.spend_rate},
                {"committed_rate", tv.committed_rate},
                {"max_rate", PriceJson(tv.max_rate)},
                {"paid", tv.paid},
                {"exhausted", tv.exhausted},
                {"nodes", std::move(nodes)},
                {"orders", std::move(orders)},
                {"ledger", std::move(ledger)},
                {"quotes", std::move(quotes)},
                {"types", std::move(types)}};
  });
}

Result<json> Dashboard::History(const std::string& vertex) {
  LZ_ASSIGN_OR_RETURN(auto cur, s_->core().Execute<json>("dashboard", [&](WriterContext& w) -> Result<json> {
    auto v = w.engine().topology().FindVertex(vertex);
    if (!v.ok()) return NotFound("vertex: no vertex named \"" + vertex.substr(0, 64) + "\"");
    auto q = w.engine().Quote(*v, false);
    LZ_RETURN_IF_ERROR(q.status());
    return json{{"id", v->value}, {"name", w.engine().topology().VertexName(*v)}, {"now", w.now()},
                {"quote", PriceJson(q->quote)}};
  }));
  json points = json::array();
  {
    std::lock_guard lock(hist_mu_);
    auto it = history_.find(cur["id"].get<uint32_t>());
    if (it != history_.end()) {
      for (const auto& s : it->second) points.push_back(json::array({s.time, PriceJson(s.price)}));
    }
  }
  return json{{"vertex", cur["name"]}, {"now", cur["now"]}, {"quote", cur["quote"]}, {"points", std::move(points)}};
}

// Controls go to the server's own gRPC OperatorService (an in-process
// channel) with the caller's own token: the same handler, checks, rate limit and audit record as the CLI.
Status Dashboard::Control(const Principal& p, const std::string& header, const std::string& kind, const json& body,
                          json* out) {
  if (p.role == Role::kTenant) return PermissionDenied("authorization: this call needs an operator or admin token");
  if (!body.is_object()) return InvalidArgument("body: must be a JSON object");
  auto str = [&](const char* k) -> Result<std::string> {
    if (!body.contains(k)) return std::string();
    if (!body[k].is_string()) return InvalidArgument(std::string(k) + ": must be a string");
    return body[k].get<std::string>();
  };
  LZ_ASSIGN_OR_RETURN(std::string node, str("node"));
  LZ_ASSIGN_OR_RETURN(std::string location, str("location"));
  // In-process: no network, so it works the same with and without TLS.
  auto channel = s_->InProcessChannel();
  auto stub = pb::OperatorService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", header);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::PolicyResponse r;
  grpc::Status st;
  if (kind == "floor") {
    if (!body.contains("price") || !body["price"].is_number_integer()) {
      return InvalidArgument("price: must be a whole number of micro-units per hour");
    }
    pb::SetFloorRequest q;
    q.set_node(node);
    q.set_location(location);
    q.set_price(body["price"].get<int64_t>());
    st = stub->SetFloor(&ctx, q, &r);
  } else {
    pb::DrainRequest q;
    q.set_node(node);
    q.set_location(location);
    st = stub->DrainNodes(&ctx, q, &r);
  }
  if (!st.ok()) return Status(static_cast<StatusCode>(st.error_code()), st.error_message());
  *out = json{{"policy", r.policy()}};
  return Status::Ok();
}

json EventJson(const WireEvent& w) {
  const market::Event& e = w.event;
  json j{{"time", e.time}, {"type", w.type}};
  if (!w.node.empty()) j["node"] = w.node;
  if (!w.vertex.empty()) j["vertex"] = w.vertex;
  if (e.order.valid()) j["order"] = e.order.value;
  if (e.price != 0 || e.type == market::EventType::kPriceChanged) j["price"] = PriceJson(e.price);
  if (e.amount) j["amount"] = e.amount;
  if (e.deadline) j["deadline"] = e.deadline;
  if (!w.reasons.empty()) j["reasons"] = w.reasons;
  if (!w.cancel_reason.empty()) j["cancel_reason"] = w.cancel_reason;
  if (!w.tenant.empty()) j["tenant"] = w.tenant;
  if (!w.other.empty()) j["other"] = w.other;
  return j;
}

void Dashboard::Events(const httplib::Request& req, httplib::Response& res, const Principal& p) {
  std::unordered_set<uint32_t> watch;
  if (p.role == Role::kTenant && req.has_param("watch")) {
    std::vector<std::string> list = SplitComma(req.get_param_value("watch"));
    if (list.size() > 256) {
      ReplyError(res, InvalidArgument("watch: at most 256 vertices"));
      return;
    }
    auto ids = s_->core().Execute<std::unordered_set<uint32_t>>(
        "dashboard", [&](WriterContext& w) -> Result<std::unordered_set<uint32_t>> {
          std::unordered_set<uint32_t> out;
          for (const auto& n : list) {
            auto v = w.engine().topology().FindVertex(n);
            if (!v.ok()) return NotFound("watch: no vertex named \"" + n.substr(0, 64) + "\"");
            out.insert(v->value);
          }
          return out;
        });
    if (!ids.ok()) {
      ReplyError(res, ids.status());
      return;
    }
    watch = std::move(*ids);
  }
  {
    std::lock_guard lock(streams_mu_);
    const auto& o = s_->options();
    if (streams_[p.token_id] >= o.http_streams_per_token) {
      ReplyError(res, ResourceExhausted("events: at most " + std::to_string(o.http_streams_per_token) +
                                        " open event streams per token; close one first"));
      return;
    }
    if (streams_total_ >= o.http_streams_total) {
      ReplyError(res, ResourceExhausted("events: the server has " + std::to_string(o.http_streams_total) +
                                        " open event streams; try again later"));
      return;
    }
    ++streams_[p.token_id];
    ++streams_total_;
  }
  auto sub = s_->core().Subscribe(p.role != Role::kTenant, p.tenant, std::move(watch));
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Accel-Buffering", "no");
  auto sent_hello = std::make_shared<bool>(false);
  auto last_write = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, p, sub, sent_hello, last_write](size_t, httplib::DataSink& sink) -> bool {
        if (!*sent_hello) {
          *sent_hello = true;
          // The client reconnects after 2 s by itself; `hello` marks a fresh stream.
          std::string hello = "retry: 2000\nevent: hello\ndata: {}\n\n";
          return sink.write(hello.data(), hello.size());
        }
        if (stop_) return false;
        // A revoked token's stream ends within one wait (1 s).
        if (!s_->tokens().Recheck(p).ok()) return false;
        std::vector<WireEvent> events;
        bool open = sub->Next(&events, std::chrono::milliseconds(1000));
        std::string out;
        for (const auto& e : events) out += "data: " + EventJson(e).dump() + "\n\n";
        auto now = std::chrono::steady_clock::now();
        // A heartbeat every few seconds lets the page tell "quiet" from "stale".
        if (out.empty() && now - *last_write >= std::chrono::seconds(3)) out = "event: ping\ndata: {}\n\n";
        if (!out.empty()) {
          *last_write = now;
          if (!sink.is_writable() || !sink.write(out.data(), out.size())) return false;
        }
        if (!open) {
          sink.done();
          return true;
        }
        return true;
      },
      [this, sub, id = p.token_id](bool) {
        s_->core().Unsubscribe(sub);
        std::lock_guard lock(streams_mu_);
        if (--streams_[id] <= 0) streams_.erase(id);
        --streams_total_;
      });
}

}  // namespace

void Install(Server& server) {
  HttpServer* http = server.http();
  if (!http) return;
  auto d = std::make_shared<Dashboard>(&server);
  d->Start();
  auto& r = http->router();

  for (const Asset& a : Assets()) {
    std::string path = "/dash/" + std::string(a.name);
    r.Get(path, [a](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(std::string(reinterpret_cast<const char*>(a.data), a.size), std::string(a.mime));
    });
  }
  auto index = [](const httplib::Request&, httplib::Response& res) {
    for (const Asset& a : Assets()) {
      if (std::string_view(a.name) == "index.html") {
        res.set_header("Cache-Control", "no-cache");
        res.set_content(std::string(reinterpret_cast<const char*>(a.data), a.size), "text/html; charset=utf-8");
        return;
      }
    }
    res.status = 404;
  };
  r.Get("/dash/", index);
  r.Get("/dash", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/dash/"); });
  r.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/dash/"); });

  r.Get("/api/v1/me", [d](const httplib::Request& req, httplib::Response& res) {
    auto p = d->Auth(req);
    if (!p.ok()) return ReplyError(res, p.status());
    Reply(res, d->Me(*p));
  });
  r.Get("/api/v1/operator/overview", [d](const httplib::Request& req, httplib::Response& res) {
    auto p = d->Auth(req);
    if (!p.ok()) return ReplyError(res, p.status());
    if (p->role == Role::kTenant) {
      return ReplyError(res, PermissionDenied("authorization: this view needs an operator or admin token"));
    }
    auto j = d->OperatorOverview();
    if (!j.ok()) return ReplyError(res, j.status());
    Reply(res, *j);
  });
  r.Get("/api/v1/tenant/overview", [d](const httplib::Request& req, httplib::Response& res) {
    auto p = d->Auth(req);
    if (!p.ok()) return ReplyError(res, p.status());
    if (p->role != Role::kTenant) return ReplyError(res, PermissionDenied("authorization: this view needs a tenant token"));
    auto watch = SplitComma(req.get_param_value("watch"));
    if (watch.size() > 256) return ReplyError(res, InvalidArgument("watch: at most 256 vertices"));
    auto j = d->TenantOverview(*p, watch);
    if (!j.ok()) return ReplyError(res, j.status());
    Reply(res, *j);
  });
  r.Get("/api/v1/history", [d](const httplib::Request& req, httplib::Response& res) {
    auto p = d->Auth(req);
    if (!p.ok()) return ReplyError(res, p.status());
    std::string v = req.get_param_value("vertex");
    if (v.empty()) return ReplyError(res, InvalidArgument("vertex: must not be empty"));
    auto j = d->History(v);
    if (!j.ok()) return ReplyError(res, j.status());
    Reply(res, *j);
  });
  r.Get("/api/v1/events", [d](const httplib::Request& req, httplib::Response& res) {
    auto p = d->Auth(req);
    if (!p.ok()) return ReplyError(res, p.status());
    d->Events(req, res, *p);
  });
  for (std::string kind : {"floor", "drain"}) {
    r.Post("/api/v1/operator/" + kind, [d, kind](const httplib::Request& req, httplib::Response& res) {
      auto p = d->Auth(req);
      if (!p.ok()) return ReplyError(res, p.status());
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded()) return ReplyError(res, InvalidArgument("body: not valid JSON"));
      json out;
      Status st = d->Control(*p, req.get_header_value("Authorization"), kind, body, &out);
      if (!st.ok()) return ReplyError(res, st);
      Reply(res, out);
    });
  }
}

}  // namespace laissez::server::dashboard
