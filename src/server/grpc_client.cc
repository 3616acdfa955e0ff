#include "server/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "laissez/v1/market.grpc.pb.h"

namespace laissez::server {
namespace pb = ::laissez::v1;

namespace {

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

int64_t SteadyMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint8_t ParseReasons(const std::string& text) {
  uint8_t r = 0;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    for (uint8_t bit = 1; bit != 0 && bit <= market::kReasonRelinquish;
         bit = static_cast<uint8_t>(bit << 1)) {
      if (market::ReasonNames(bit) == part) r |= bit;
    }
  }
  return r;
}

market::Event ToEvent(const pb::Event& e) {
  market::Event out;
  out.time = e.time();
  for (int t = 0; t <= static_cast<int>(market::EventType::kNodeRemoved); ++t) {
    if (market::EventTypeName(static_cast<market::EventType>(t)) == e.type())
      out.type = static_cast<market::EventType>(t);
  }
  out.reasons = ParseReasons(e.reasons());
  for (int c = 0; c <= static_cast<int>(market::CancelReason::kScopeGone); ++c) {
    if (market::CancelReasonName(static_cast<market::CancelReason>(c)) == e.cancel_reason()) {
      out.cancel_reason = static_cast<market::CancelReason>(c);
    }
  }
  out.node = NodeId(e.node_id());
  out.tenant = TenantId(e.tenant_id());
  out.other = TenantId(e.other_id());
  // Order ids start at 0, so "no order" travels as `has_order` false, not as
  // 0 (an allocation by the market's first order names order 0).
  out.order = e.has_order() ? OrderId(e.order()) : OrderId();
  out.vertex = VertexId(e.vertex_id());
  out.price = e.price();
  out.amount = e.amount();
  out.waived = e.waived();
  out.deadline = e.deadline();
  return out;
}

market::OrderState ParseOrderState(const std::string& s) {
  for (int i = 0; i <= 3; ++i) {
    if (market::OrderStateName(static_cast<market::OrderState>(i)) == s)
      return static_cast<market::OrderState>(i);
  }
  return market::OrderState::kResting;
}

}  // namespace

Endpoints::Endpoints(const std::string& list) {
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (!part.empty()) list_.push_back(part);
  }
  if (list_.empty()) list_.push_back(list);
}

void Endpoints::Next(const std::string& error) {
  size_t at = error.find("leader=");
  if (at != std::string::npos) {
    std::string leader = error.substr(at + 7);
    size_t end = leader.find_first_of(") ,;");
    if (end != std::string::npos) leader.resize(end);
    for (size_t i = 0; i < list_.size(); ++i) {
      if (list_[i] == leader) {
        cur_ = i;
        return;
      }
    }
    if (!leader.empty()) {
      list_.push_back(leader);  // A replica the caller did not list: try it too.
      cur_ = list_.size() - 1;
      return;
    }
  }
  cur_ = (cur_ + 1) % list_.size();
}

bool Retryable(int code, const std::string& m, bool idempotent) {
  if (code != static_cast<int>(grpc::StatusCode::UNAVAILABLE)) return false;
  if (idempotent) return true;
  for (const char* not_applied :
       {"not the leader", "failed to connect", "Connection refused", "server: not running",
        "the store failed; restart the server", "connections to all backends failing"}) {
    if (m.find(not_applied) != std::string::npos) return true;
  }
  return false;
}

pb::WatchRequest MakeWatchRequest(const std::vector<std::string>& vertices,
                                  const std::optional<WatchPosition>& after) {
  pb::WatchRequest q;
  for (const auto& v : vertices) q.add_vertices(v);
  if (after) {
    q.set_resume(true);
    q.set_after_seq(after->seq);
    q.set_after_index(after->index);
  }
  return q;
}

std::optional<WatchPosition> StreamStart(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find("laissez-position");
  if (it == md.end()) return std::nullopt;
  auto p = ParseWatchPosition(std::string_view(it->second.data(), it->second.size()), "laissez-position");
  if (!p.ok()) return std::nullopt;
  return *p;
}

std::string NewIdempotencyKey() {
  static thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  char buf[40];
  std::snprintf(buf, sizeof buf, "k-%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

Result<std::string> ReadTokenFile(const std::string& path, std::string_view field) {
  if (path.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  std::ifstream in(path);
  if (!in) return InvalidArgument(std::string(field) + ": cannot read " + path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t'))
    token.pop_back();
  if (token.empty()) return InvalidArgument(std::string(field) + ": " + path + " is empty");
  return token;
}

std::shared_ptr<grpc::Channel> MakeChannel(const ConnectOptions& o) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!o.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    std::ifstream in(o.tls_ca);
    std::stringstream s;
    s << in.rdbuf();
    ssl.pem_root_certs = s.str();
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A replica that is down should fail over quickly, not wait out reconnection backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(Endpoints(o.address).current(), creds, args);
}

struct GrpcMarketClient::Impl {
  ConnectOptions options;
  Endpoints endpoints{""};
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::TenantService::Stub> stub;

  void Dial() {
    ConnectOptions o = options;
    o.address = endpoints.current();
    channel = MakeChannel(o);
    stub = pb::TenantService::NewStub(channel);
  }
  // Runs `call` with a fresh context; on a retryable UNAVAILABLE moves to
  // another endpoint (the leader) and tries again, for up to kFailoverBudgetMs.
  template <typename F>
  Status Call(F call, bool idempotent) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFailoverBudgetMs);
    int backoff_ms = 50;
    for (;;) {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      grpc::Status g = call(&ctx);
      if (g.ok() || !Retryable(g.error_code(), g.error_message(), idempotent) ||
          std::chrono::steady_clock::now() >= until) {
        return FromGrpc(g);
      }
      endpoints.Next(g.error_message());
      Dial();
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min(backoff_ms * 2, 500);
    }
  }
  pb::TopologyResponse topo;
  std::unordered_map<std::string, uint32_t> vertex_by_name;
  Micros server_now = 0;
  int64_t server_now_at = 0;

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->AddMetadata("authorization", "Bearer " + options.token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options.timeout_ms));
  }
};

struct GrpcMarketClient::EventStream::Impl {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<pb::Event>> reader;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<market::Event> queue;
  WatchPosition position;
  bool done = false;
  Status end;
};

WatchPosition GrpcMarketClient::EventStream::position() const {
  std::lock_guard lock(impl_->mu);
  return impl_->position;
}

Result<WatchPosition> ParseWatchPosition(std::string_view text, std::string_view field) {
  auto bad = [&] {
    return InvalidArgument(std::string(field) + ": must be SEQ.INDEX, two whole numbers (got \"" + std::string(text) +
                           "\")");
  };
  size_t dot = text.find('.');
  if (dot == std::string_view::npos) return bad();
  WatchPosition p;
  auto seq = text.substr(0, dot), index = text.substr(dot + 1);
  auto r1 = std::from_chars(seq.data(), seq.data() + seq.size(), p.seq);
  auto r2 = std::from_chars(index.data(), index.data() + index.size(), p.index);
  if (seq.empty() || index.empty() || r1.ec != std::errc() || r1.ptr != seq.data() + seq.size() ||
      r2.ec != std::errc() || r2.ptr != index.data() + index.size()) {
    return bad();
  }
  return p;
}

GrpcMarketClient::EventStream::~EventStream() {
  if (impl_) {
    impl_->ctx.TryCancel();
    if (impl_->thread.joinable()) impl_->thread.join();
  }
}

Status GrpcMarketClient::EventStream::Poll(std::vector<market::Event>* out, int wait_ms) {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait_for(lock, std::chrono::milliseconds(wait_ms),
                     [&] { return impl_->done || !impl_->queue.empty(); });
  for (auto& e : impl_->queue) out->push_back(e);
  impl_->queue.clear();
  return impl_->done ? (impl_->end.ok() ? Unavailable("watch: stream ended") : impl_->end) : Status::Ok();
}

GrpcMarketClient::GrpcMarketClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcMarketClient::~GrpcMarketClient() = default;

Result<std::unique_ptr<GrpcMarketClient>> GrpcMarketClient::Connect(const ConnectOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->endpoints = Endpoints(options.address);
  impl->Dial();
  std::unique_ptr<GrpcMarketClient> c(new GrpcMarketClient(std::move(impl)));
  pb::BalanceResponse b;
  Impl& i = *c->impl_;
  LZ_RETURN_IF_ERROR(i.Call(
      [&](grpc::ClientContext* ctx) { return i.stub->GetBalance(ctx, pb::GetBalanceRequest(), &b); }, true));
  c->tenant_ = TenantId(b.tenant_id());
  c->tenant_name_ = b.tenant();
  LZ_RETURN_IF_ERROR(c->RefreshTopology());
  return c;
}

Micros GrpcMarketClient::Now() const { return impl_->server_now + (SteadyMicros() - impl_->server_now_at); }

Status GrpcMarketClient::RefreshTopology() {
  pb::TopologyResponse r;
  LZ_RETURN_IF_ERROR(impl_->Call(
      [&](grpc::ClientContext* ctx) { return impl_->stub->GetTopology(ctx, pb::GetTopologyRequest(), &r); },
      true));
  impl_->topo = std::move(r);
  impl_->vertex_by_name.clear();
  for (const auto& v : impl_->topo.vertices()) impl_->vertex_by_name[v.name()] = v.id();
  impl_->server_now = impl_->topo.now();
  impl_->server_now_at = SteadyMicros();
  return Status::Ok();
}

std::string GrpcMarketClient::VertexName(VertexId v) const {
  if (v.value < static_cast<uint32_t>(impl_->topo.vertices_size()))
    return impl_->topo.vertices(static_cast<int>(v.value)).name();
  return std::string();
}

Result<std::string> GrpcMarketClient::NodeName(NodeId node) {
  if (node.value >= static_cast<uint32_t>(impl_->topo.nodes_size())) LZ_RETURN_IF_ERROR(RefreshTopology());
  if (node.value >= static_cast<uint32_t>(impl_->topo.nodes_size())) {
    return NotFound("node: no node " + std::to_string(node.value));
  }
  return impl_->topo.nodes(static_cast<int>(node.value)).name();
}

Result<VertexId> GrpcMarketClient::FindVertex(std::string_view name) {
  auto it = impl_->vertex_by_name.find(std::string(name));
  if (it == impl_->vertex_by_name.end()) {
    LZ_RETURN_IF_ERROR(RefreshTopology());
    it = impl_->vertex_by_name.find(std::string(name));
    if (it == impl_->vertex_by_name.end())
      return NotFound("vertex: no vertex named \"" + std::string(name) + "\"");
  }
  return VertexId(it->second);
}

Result<sdk::NodeDescription> GrpcMarketClient::DescribeNode(NodeId node) {
  LZ_RETURN_IF_ERROR(NodeName(node).status());
  const auto& n = impl_->topo.nodes(static_cast<int>(node.value));
  sdk::NodeDescription d;
  d.id = node;
  d.name = n.name();
  d.type = n.type();
  d.region = n.region();
  d.zone = n.zone();
  d.row = n.row();
  d.rack = n.rack();
  d.meta = topology::NodeMeta{n.gpus(), n.memory_gb(), n.power_w()};
  d.leaf = VertexId(n.leaf());
  d.type_root = VertexId(n.type_root());
  return d;
}

Result<OrderId> GrpcMarketClient::PlaceOrder(const market::OrderSpec& spec) {
  pb::PlaceOrderRequest q;
  std::string scope = VertexName(spec.scope);
  if (scope.empty()) {
    LZ_RETURN_IF_ERROR(RefreshTopology());
    scope = VertexName(spec.scope);
    if (scope.empty()) return NotFound("scope: no vertex " + std::to_string(spec.scope.value));
  }
  q.set_scope(scope);
  q.set_price(spec.price);
  q.set_count(spec.count);
  q.set_locality(static_cast<pb::Locality>(static_cast<int>(spec.locality)));
  if (spec.locality != market::Locality::kAny) {
    LZ_ASSIGN_OR_RETURN(std::string rel, NodeName(spec.rel_to));
    q.set_rel_to(rel);
  }
  // One key for this call and all its retries: an order whose leader died
  // while committing it is placed once, whatever the failover.
  q.set_idempotency_key(NewIdempotencyKey());
  pb::PlaceOrderResponse r;
  LZ_RETURN_IF_ERROR(
      impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->PlaceOrder(ctx, q, &r); }, true));
  return OrderId(r.order());
}

Status GrpcMarketClient::UpdateOrder(OrderId order, Price price) {
  pb::UpdateOrderRequest q;
  q.set_order(order.value);
  q.set_price(price);
  pb::UpdateOrderResponse r;
  return impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->UpdateOrder(ctx, q, &r); }, true);
}

Status GrpcMarketClient::CancelOrder(OrderId order) {
  pb::CancelOrderRequest q;
  q.set_order(order.value);
  q.set_idempotency_key(NewIdempotencyKey());  // Retried with it: cancelled once, a repeat answers OK.
  pb::CancelOrderResponse r;
  return impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->CancelOrder(ctx, q, &r); }, true);
}

Status GrpcMarketClient::SetLimit(NodeId node, Price limit) {
  LZ_ASSIGN_OR_RETURN(std::string name, NodeName(node));
  pb::SetLimitRequest q;
  q.set_node(name);
  q.set_limit(limit);
  pb::SetLimitResponse r;
  return impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->SetLimit(ctx, q, &r); }, true);
}

Status GrpcMarketClient::Relinquish(NodeId node) {
  LZ_ASSIGN_OR_RETURN(std::string name, NodeName(node));
  pb::RelinquishRequest q;
  q.set_node(name);
  q.set_idempotency_key(NewIdempotencyKey());  // Retried with it: released once, a repeat answers OK.
  pb::RelinquishResponse r;
  return impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->Relinquish(ctx, q, &r); }, true);
}

Result<market::VertexQuote> GrpcMarketClient::Quote(VertexId vertex, bool with_depth) {
  std::string name = VertexName(vertex);
  if (name.empty()) return NotFound("vertex: no vertex " + std::to_string(vertex.value));
  pb::QuoteRequest q;
  q.set_vertex(name);
  q.set_depth(with_depth);
  pb::QuoteResponse r;
  LZ_RETURN_IF_ERROR(
      impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->Quote(ctx, q, &r); }, true));
  market::VertexQuote out;
  out.vertex = vertex;
  out.quote = r.quote().quote();
  out.total = r.quote().total();
  out.free = r.quote().free();
  out.held = r.quote().held();
  out.contested = r.quote().contested();
  out.reserved = r.quote().reserved();
  for (const auto& l : r.quote().depth()) out.depth.emplace_back(l.price(), l.count());
  return out;
}

Result<market::EvictionQuote> GrpcMarketClient::GetEvictionQuote(NodeId node) {
  LZ_ASSIGN_OR_RETURN(std::string name, NodeName(node));
  pb::EvictionQuoteRequest q;
  q.set_node(name);
  pb::EvictionQuoteResponse r;
  LZ_RETURN_IF_ERROR(
      impl_->Call([&](grpc::ClientContext* ctx) { return impl_->stub->EvictionQuote(ctx, q, &r); }, true));
  market::EvictionQuote e;
  e.node = node;
  e.holder = tenant_;
  e.limit = r.limit();
  e.competing = r.competing();
  e.floor = r.floor();
  e.obtain = r.obtain();
  e.pays = r.pays();
  e.contested = r.contested();
  e.deadline = r.deadline();
  e.reasons = ParseReasons(r.reasons());
  return e;
}

Result<market::OrderView> GrpcMarketClient::GetOrder(OrderId order) {
  pb::ListOrdersResponse r;
  LZ_RETURN_IF_ERROR(impl_->Call(
      [&](grpc::ClientContext* ctx) { return impl_->stub->ListOrders(ctx, pb::ListOrdersRequest(), &r); },
      true));
  for (const auto& o : r.orders()) {
    if (o.id() != order.value) continue;
    market::OrderView v;
    v.id = order;
    v.tenant = tenant_;
    v.spec.scope = VertexId(o.scope_id());
    v.spec.price = o.price();
    v.spec.count = o.count();
    v.spec.locality = static_cast<market::Locality>(static_cast<int>(o.locality()));
    if (!o.rel_to().empty()) {
      for (const auto& n : impl_->topo.nodes()) {
        if (n.name() == o.rel_to()) v.spec.rel_to = NodeId(n.id());
      }
    }
    v.effective_scope = v.spec.scope;
    v.effective_price = o.effective_price();
    v.state = ParseOrderState(o.state());
    v.filled = o.filled();
    return v;
  }
  return NotFound("order: no open order " + std::to_string(order.value));
}

Result<market::TenantView> GrpcMarketClient::Me() {
  market::TenantView v;
  {
    pb::BalanceResponse b;
    LZ_RETURN_IF_ERROR(impl_->Call(
        [&](grpc::ClientContext* ctx) { return impl_->stub->GetBalance(ctx, pb::GetBalanceRequest(), &b); },
        true));
    v.id = TenantId(b.tenant_id());
    v.name = b.tenant();
    v.balance = b.balance();
    v.max_rate = b.max_rate();
    v.committed_rate = b.committed_rate();
    v.spend_rate = b.spend_rate();
    v.paid = b.paid();
    v.waived = b.waived();
    v.exhausted = b.exhausted();
  }
  {
    pb::ListNodesResponse r;
    LZ_RETURN_IF_ERROR(impl_->Call(
        [&](grpc::ClientContext* ctx) { return impl_->stub->ListNodes(ctx, pb::ListNodesRequest(), &r); },
        true));
    for (const auto& n : r.nodes()) v.nodes.push_back(NodeId(n.node_id()));
  }
  {
    pb::ListOrdersResponse r;
    LZ_RETURN_IF_ERROR(impl_->Call(
        [&](grpc::ClientContext* ctx) { return impl_->stub->ListOrders(ctx, pb::ListOrdersRequest(), &r); },
        true));
    for (const auto& o : r.orders()) v.orders.push_back(OrderId(o.id()));
  }
  return v;
}

Result<Money> GrpcMarketClient::Balance() {
  pb::BalanceResponse b;
  LZ_RETURN_IF_ERROR(impl_->Call(
      [&](grpc::ClientContext* ctx) { return impl_->stub->GetBalance(ctx, pb::GetBalanceRequest(), &b); },
      true));
  return b.available();
}

void GrpcMarketClient::Failover(const std::string& error) {
  impl_->endpoints.Next(error);
  impl_->Dial();
}

Result<std::unique_ptr<GrpcMarketClient::EventStream>> GrpcMarketClient::Watch(
    const std::vector<std::string>& vertices, std::optional<WatchPosition> after) {
  auto s = std::unique_ptr<EventStream>(new EventStream());
  s->impl_ = std::make_unique<EventStream::Impl>();
  auto* impl = s->impl_.get();
  impl->ctx.AddMetadata("authorization", "Bearer " + impl_->options.token);
  if (after) impl->position = *after;
  impl->reader = impl_->stub->Watch(&impl->ctx, MakeWatchRequest(vertices, after));
  // The server sends its initial metadata once the subscription is live; an
  // error status ends the stream first.
  impl->reader->WaitForInitialMetadata();
  if (auto start = StreamStart(impl->ctx); start && !after) impl->position = *start;
  EventStream* raw = s.get();
  impl->thread = std::thread([impl, raw] {
    pb::Event e;
    while (impl->reader->Read(&e)) {
      std::lock_guard lock(impl->mu);
      impl->position = WatchPosition{e.seq(), e.index()};
      impl->queue.push_back(ToEvent(e));
      impl->cv.notify_all();
    }
    Status end = FromGrpc(impl->reader->Finish());
    std::lock_guard lock(impl->mu);
    impl->done = true;
    impl->end = end;
    raw->open_.store(false);
    impl->cv.notify_all();
  });
  return s;
}

}  // namespace laissez::server
