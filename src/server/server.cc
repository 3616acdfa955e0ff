// The gRPC services and the server's lifecycle. Every handler follows one
// pattern: authenticate and authorize (Call), validate the request's fields
// without touching the engine, then run one closure on the writer thread that
// resolves names, checks ownership and applies the operation, and reply once
// that closure's journal records are durable.
#include "server/server.h"

#include <absl/synchronization/mutex.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "laissez/v1/market.grpc.pb.h"
#include "oplog/oplog.h"
#include "server/grpc_client.h"
#include "topology/cluster_yaml.h"

namespace laissez::server {
namespace pb = ::laissez::v1;
using grpc::ServerContext;
using market::ApplyResult;

namespace {

// Largest price or amount accepted on the wire: a billion units of money (per
// hour). Far above any real price, far below where price x count x time overflows.
constexpr int64_t kMaxPrice = 1'000'000'000'000'000;
constexpr uint32_t kMaxGang = 4096;
constexpr size_t kMaxName = 256;
constexpr size_t kMaxListed = 10000;

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

Status CheckAmount(int64_t v, std::string_view field, std::string_view unit) {
  if (v < 0) return InvalidArgument(std::string(field) + ": must not be negative (got " + std::to_string(v) + ")");
  if (v > kMaxPrice) {
    return InvalidArgument(std::string(field) + ": must be at most " + std::to_string(kMaxPrice) + " " +
                           std::string(unit) + " (got " + std::to_string(v) + ")");
  }
  return Status::Ok();
}
Status CheckPrice(int64_t v, std::string_view field) { return CheckAmount(v, field, "micro-units per hour"); }

Status CheckName(const std::string& s, std::string_view field, bool required = true) {
  if (required && s.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  if (s.size() > kMaxName) {
    return InvalidArgument(std::string(field) + ": longer than " + std::to_string(kMaxName) + " bytes");
  }
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return InvalidArgument(std::string(field) + ": contains a control character");
  }
  return Status::Ok();
}

Status CheckTenantName(const std::string& s) {
  LZ_RETURN_IF_ERROR(CheckName(s, "name"));
  if (s.size() > 64) return InvalidArgument("name: longer than 64 bytes");
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return InvalidArgument("name: may contain only letters, digits, '-', '_' and '.'");
    }
  }
  return Status::Ok();
}

Result<VertexId> FindVertexOr(const market::MarketEngine& e, const std::string& name, std::string_view field) {
  auto v = e.topology().FindVertex(name);
  if (!v.ok()) return NotFound(std::string(field) + ": no vertex named \"" + name.substr(0, 64) + "\"");
  return *v;
}

Result<NodeId> FindNodeOr(const market::MarketEngine& e, const std::string& name, std::string_view field) {
  if (name.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  auto n = e.topology().FindNode(name);
  if (!n.ok() || !e.topology().IsLiveNode(*n)) {
    return NotFound(std::string(field) + ": no node named \"" + name.substr(0, 64) + "\"");
  }
  return *n;
}

Result<TenantId> FindTenantOr(const market::MarketEngine& e, const std::string& name, std::string_view field) {
  if (name.empty()) return InvalidArgument(std::string(field) + ": must not be empty");
  auto t = e.FindTenant(name);
  if (!t.ok()) return NotFound(std::string(field) + ": no tenant named \"" + name.substr(0, 64) + "\"");
  return *t;
}

// An order of `tenant`; another tenant's order is reported exactly like a
// missing one, so ids reveal nothing.
Result<market::OrderView> OwnOrder(const market::MarketEngine& e, TenantId tenant, uint64_t id) {
  auto o = e.GetOrder(OrderId(id));
  if (!o.ok() || o->tenant != tenant) return NotFound("order: no order " + std::to_string(id));
  return *o;
}

std::string LocationPath(const topology::Topology& t, NodeId n) {
  return t.location(t.node(n).rack).path;
}

pb::Locality ToPb(market::Locality l) { return static_cast<pb::Locality>(static_cast<int>(l)); }

void FillOrder(const market::MarketEngine& e, const market::OrderView& o, pb::Order* out) {
  const auto& topo = e.topology();
  out->set_id(o.id.value);
  out->set_scope(topo.VertexName(o.spec.scope));
  out->set_scope_id(o.spec.scope.value);
  out->set_price(o.spec.price);
  out->set_effective_price(o.effective_price);
  out->set_count(o.spec.count);
  out->set_locality(ToPb(o.spec.locality));
  if (o.spec.rel_to.valid() && o.spec.rel_to.value < topo.node_count()) out->set_rel_to(topo.node(o.spec.rel_to).name);
  out->set_state(std::string(market::OrderStateName(o.state)));
  out->set_filled(o.filled);
}

void FillQuote(const market::MarketEngine& e, const market::VertexQuote& q, pb::Quote* out) {
  out->set_vertex(e.topology().VertexName(q.vertex));
  out->set_quote(q.quote);
  out->set_total(q.total);
  out->set_free(q.free);
  out->set_held(q.held);
  out->set_contested(q.contested);
  out->set_reserved(q.reserved);
  for (const auto& [price, count] : q.depth) {
    auto* l = out->add_depth();
    l->set_price(price);
    l->set_count(count);
  }
}

// An optional idempotency key: empty, or valid (named `idempotency_key`).
Status CheckKey(const std::string& key) {
  return key.empty() ? Status::Ok() : oplog::CheckIdempotencyKey(key, "idempotency_key");
}

void FillEvent(const WireEvent& w, pb::Event* out) {
  const market::Event& e = w.event;
  out->set_time(e.time);
  out->set_type(w.type);
  out->set_node(w.node);
  out->set_node_id(e.node.value);
  if (e.order.valid()) {
    out->set_order(e.order.value);
    out->set_has_order(true);
  }
  out->set_vertex(w.vertex);
  out->set_vertex_id(e.vertex.value);
  out->set_price(e.price);
  out->set_amount(e.amount);
  out->set_waived(e.waived);
  out->set_deadline(e.deadline);
  out->set_reasons(w.reasons);
  out->set_cancel_reason(w.cancel_reason);
  out->set_tenant(w.tenant);
  out->set_other(w.other);
  out->set_tenant_id(e.tenant.value);
  out->set_other_id(e.other.value);
  out->set_seq(w.pos.seq);
  out->set_index(w.pos.index);
}

void FillLedger(const market::MarketEngine& e, const market::LedgerEntry& l, bool with_tenant, WriterContext& w,
                pb::LedgerEntry* out) {
  out->set_time(l.time);
  out->set_from(l.from);
  if (l.node.valid() && l.node.value < e.topology().node_count()) out->set_node(e.topology().node(l.node).name);
  out->set_rate(l.rate);
  out->set_amount(l.amount);
  out->set_waived(l.waived);
  if (with_tenant) out->set_tenant(w.TenantName(l.tenant));
}

enum class Need { kTenant, kAnyRole, kOperator, kAdmin };

}  // namespace

// ---------------------------------------------------------------------------

class Server::Services {
 public:
  Services(Server* s) : s_(s), tenant_(this), op_(this), admin_(this) {}

  // Authenticates, authorizes, rate-limits, runs `body`, records metrics.
  template <typename F>
  grpc::Status Call(const char* method, ServerContext* ctx, Need need, F&& body) {
    auto t0 = std::chrono::steady_clock::now();
    Status st = [&]() -> Status {
      LZ_ASSIGN_OR_RETURN(Principal p, Admit(ctx, need));
      return body(p);
    }();
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    Stats(method)->Observe(static_cast<int>(st.code()), us);
    return ToGrpc(st);
  }

  // Authenticates, authorizes and rate-limits a call.
  Result<Principal> Admit(grpc::ServerContextBase* ctx, Need need) {
    LZ_ASSIGN_OR_RETURN(Principal p, Authenticate(ctx));
    LZ_RETURN_IF_ERROR(Authorize(p, need));
    LZ_RETURN_IF_ERROR(Limit(p));
    return p;
  }

  Result<Principal> Authenticate(grpc::ServerContextBase* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end()) return Unauthenticated("authorization: missing bearer token");
    return s_->tokens_.Authenticate(std::string_view(it->second.data(), it->second.size()));
  }

  static Status Authorize(const Principal& p, Need need) {
    switch (need) {
      case Need::kAnyRole: return Status::Ok();
      case Need::kTenant:
        if (p.role != Role::kTenant) return PermissionDenied("authorization: this call needs a tenant token");
        return Status::Ok();
      case Need::kOperator:
        if (p.role == Role::kTenant) return PermissionDenied("authorization: this call needs an operator or admin token");
        return Status::Ok();
      case Need::kAdmin:
        if (p.role != Role::kAdmin) return PermissionDenied("authorization: this call needs an admin token");
        return Status::Ok();
    }
    return Internal("authorization: unknown need");
  }

  Status Limit(const Principal& p) { return s_->Limit(p); }

  // Counts a token's open gRPC streams; RESOURCE_EXHAUSTED beyond the bound.
  Status AcquireStream(const Principal& p) {
    std::lock_guard lock(streams_mu_);
    int& n = streams_[p.token_id];
    if (n >= s_->options_.grpc_streams_per_token) {
      return ResourceExhausted("streams: at most " + std::to_string(s_->options_.grpc_streams_per_token) +
                               " open streams per token; close one first");
    }
    ++n;
    return Status::Ok();
  }
  void ReleaseStream(const Principal& p) {
    std::lock_guard lock(streams_mu_);
    if (--streams_[p.token_id] <= 0) streams_.erase(p.token_id);
  }

  MethodStats* Stats(const char* method) {
    std::lock_guard lock(stats_mu_);
    auto& m = stats_[method];
    if (!m) m = s_->metrics_.Method(method);
    return m;
  }

  // Runs `work` on the writer thread and calls `done` with its result once
  // durable (MarketCore::ExecAsync), from the committing thread. The token is
  // checked again on the writer: a call authenticated before a revocation but
  // queued after it is refused. A stream shares one principal (and its actor
  // name) among its messages instead of copying it into each.
  template <typename T>
  void ExecAsync(std::shared_ptr<const Principal> p, std::string actor, std::function<Result<T>(WriterContext&)> work,
                 std::function<void(Result<T>)> done) {
    s_->core_->ExecAsync<T>(std::move(actor), Rechecked<Result<T>>(std::move(p), std::move(work)), std::move(done));
  }
  // The same for work that yields only a Status.
  void ExecAsync(std::shared_ptr<const Principal> p, std::string actor, std::function<Status(WriterContext&)> work,
                 std::function<void(Status)> done) {
    s_->core_->ExecAsync(std::move(actor), Rechecked<Status>(std::move(p), std::move(work)), std::move(done));
  }
  // ExecAsync, waiting for the result.
  template <typename T>
  Result<T> Exec(const Principal& p, std::function<Result<T>(WriterContext&)> work) {
    return s_->core_->Execute<T>(p.Actor(), Rechecked<Result<T>>(std::make_shared<const Principal>(p), std::move(work)));
  }
  Status ExecStatus(const Principal& p, std::function<Status(WriterContext&)> work) {
    return s_->core_->Execute(p.Actor(), Rechecked<Status>(std::make_shared<const Principal>(p), std::move(work)));
  }
  // `work` after the token's re-check; R is Status or Result<T>.
  template <typename R>
  std::function<R(WriterContext&)> Rechecked(std::shared_ptr<const Principal> p, std::function<R(WriterContext&)> work) {
    return [this, p = std::move(p), work = std::move(work)](WriterContext& w) -> R {
      LZ_RETURN_IF_ERROR(s_->tokens_.Recheck(*p));
      return work(w);
    };
  }

  // Streams events from a subscription until the client goes away or the server stops.
  grpc::Status Stream(const char* method, ServerContext* ctx, grpc::ServerWriter<pb::Event>* writer, Need need,
                      const pb::WatchRequest* req) {
    std::shared_ptr<Subscription> sub;
    Principal principal;
    EventPos live_from;
    grpc::Status setup = Call(method, ctx, need, [&](const Principal& p) -> Status {
      principal = p;
      if (req->vertices_size() > 4096) return InvalidArgument("vertices: at most 4096");
      LZ_ASSIGN_OR_RETURN(auto set, Exec<std::unordered_set<uint32_t>>(
                                        p, [&](WriterContext& w) -> Result<std::unordered_set<uint32_t>> {
                                          std::unordered_set<uint32_t> out;
                                          for (int i = 0; i < req->vertices_size(); ++i) {
                                            LZ_ASSIGN_OR_RETURN(VertexId v,
                                                                FindVertexOr(w.engine(), req->vertices(i),
                                                                             "vertices[" + std::to_string(i) + "]"));
                                            out.insert(v.value);
                                          }
                                          return out;
                                        }));
      std::optional<EventPos> after;
      if (req->resume()) after = EventPos{req->after_seq(), req->after_index()};
      LZ_RETURN_IF_ERROR(AcquireStream(p));
      auto subscribed = s_->core_->SubscribeAfter(p.role != Role::kTenant, p.tenant, std::move(set), after, &live_from);
      if (!subscribed.ok()) {
        ReleaseStream(p);
        return subscribed.status();
      }
      sub = *std::move(subscribed);
      return Status::Ok();
    });
    if (!setup.ok()) return setup;
    // Tell the client the subscription is live, and from where, before any event.
    ctx->AddInitialMetadata("laissez-position", std::to_string(live_from.seq) + "." + std::to_string(live_from.index));
    writer->SendInitialMetadata();
    Status end;
    for (;;) {
      std::vector<WireEvent> events;
      bool open = sub->Next(&events, std::chrono::milliseconds(200));
      bool broken = false;
      for (const auto& e : events) {
        pb::Event out;
        FillEvent(e, &out);
        if (!writer->Write(out)) {
          broken = true;
          break;
        }
      }
      if (broken || ctx->IsCancelled()) break;
      if (!open) {
        end = sub->close_status();
        break;
      }
      // Revocation ends the stream within one poll interval (200 ms).
      if (Status still = s_->tokens_.Recheck(principal); !still.ok()) {
        end = still;
        break;
      }
    }
    s_->core_->Unsubscribe(sub);
    ReleaseStream(principal);
    return ToGrpc(end);
  }

  // ---- Tenant service ----
  class Tenant final
      : public pb::TenantService::WithCallbackMethod_UpdateOrder<
            pb::TenantService::WithCallbackMethod_StreamUpdates<pb::TenantService::Service>> {
   public:
    explicit Tenant(Services* s) : s_(s), sweeper_([this] { SweepRevoked(); }) {}
    ~Tenant() {
      {
        std::lock_guard lock(live_mu_);
        sweep_stop_ = true;
      }
      live_cv_.notify_all();
      sweeper_.join();
    }

    grpc::Status PlaceOrder(ServerContext* c, const pb::PlaceOrderRequest* q, pb::PlaceOrderResponse* r) override {
      return s_->Call("PlaceOrder", c, Need::kTenant, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->scope(), "scope"));
        LZ_RETURN_IF_ERROR(CheckPrice(q->price(), "price"));
        uint32_t count = q->count() == 0 ? 1 : q->count();
        if (count > kMaxGang) return InvalidArgument("count: must be at most " + std::to_string(kMaxGang));
        if (!pb::Locality_IsValid(q->locality())) return InvalidArgument("locality: unknown value");
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        auto locality = static_cast<market::Locality>(q->locality());
        if (locality == market::Locality::kAny && !q->rel_to().empty()) {
          return InvalidArgument("rel_to: needs a locality");
        }
        if (locality != market::Locality::kAny && q->rel_to().empty()) {
          return InvalidArgument("rel_to: required with a locality");
        }
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          market::OrderSpec spec;
          LZ_ASSIGN_OR_RETURN(spec.scope, FindVertexOr(w.engine(), q->scope(), "scope"));
          spec.price = q->price();
          spec.count = count;
          spec.locality = locality;
          if (locality != market::Locality::kAny) {
            LZ_ASSIGN_OR_RETURN(spec.rel_to, FindNodeOr(w.engine(), q->rel_to(), "rel_to"));
          }
          ApplyResult a = w.ApplyKeyed(market::OpPlaceOrder{p.tenant, spec}, q->idempotency_key());
          if (!a.status.ok()) return a.status;
          return a.created_id;
        }));
        r->set_order(id);
        return Status::Ok();
      });
    }

    static Status Update(WriterContext& w, TenantId tenant, uint64_t order, int64_t price) {
      LZ_RETURN_IF_ERROR(OwnOrder(w.engine(), tenant, order).status());
      return w.Apply(market::OpUpdateOrder{tenant, OrderId(order), price}).status;
    }

    // UpdateOrder runs on gRPC's callback API like StreamUpdates: the request
    // is queued from gRPC's thread and the committing thread (the committer, or
    // the writer when it commits its own batch) finishes the call once the
    // update is durable. A synchronous handler here left the server mixed
    // (synchronous and callback), and a unary update then waited about 100 ms
    // now and then (a p999 of ~100 ms, issue 12): gRPC 1.51's callback
    // threads, idle for a second while only synchronous calls ran, sleep
    // 100 ms and starve the polling meanwhile.
    grpc::ServerUnaryReactor* UpdateOrder(grpc::CallbackServerContext* c, const pb::UpdateOrderRequest* q,
                                          pb::UpdateOrderResponse* r) override {
      grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
      auto t0 = std::chrono::steady_clock::now();
      MethodStats* stats = s_->Stats("UpdateOrder");
      auto finish = [reactor, t0, stats](const Status& st) {
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
        stats->Observe(static_cast<int>(st.code()), us);
        reactor->Finish(ToGrpc(st));
      };
      Result<Principal> admitted = s_->Admit(c, Need::kTenant);
      Status edge = admitted.status();
      if (edge.ok() && q->updates_size() > 0) {
        edge = InvalidArgument("updates: only StreamUpdates takes several updates per message");
      }
      if (edge.ok()) edge = CheckPrice(q->price(), "price");
      if (!edge.ok()) {
        finish(edge);
        return reactor;
      }
      r->set_tag(q->tag());
      const TenantId tenant = admitted->tenant;
      std::string actor = admitted->Actor();
      s_->ExecAsync(
          std::make_shared<const Principal>(std::move(*admitted)), std::move(actor),
          [tenant, order = q->order(), price = q->price()](WriterContext& w) -> Status {
            return Update(w, tenant, order, price);
          },
          [finish](const Status& done) { finish(done); });
      return reactor;
    }

    // The most updates a StreamUpdates stream has unacknowledged (and the most
    // one message may carry).
    static constexpr size_t kStreamWindow = 4096;

    // One update of a StreamUpdates message, from receipt to its ack.
    struct StreamItem {
      uint64_t tag = 0, order = 0;
      int64_t price = 0;
      Status status;  // Edge checks, then the writer's result.
    };

    // The updates one StreamUpdates message carries, checked at the edge
    // (rate limit, field checks); an item that fails keeps its error and is
    // not applied.
    std::vector<StreamItem> StreamItems(const Principal& p, const pb::UpdateOrderRequest& q) {
      std::vector<StreamItem> items;
      if (q.updates_size() == 0) {
        items.push_back({q.tag(), q.order(), q.price(), s_->Limit(p)});
        if (items.back().status.ok()) items.back().status = CheckPrice(q.price(), "price");
        return items;
      }
      Status shape;
      if (static_cast<size_t>(q.updates_size()) > kStreamWindow) {
        shape = InvalidArgument("updates: at most " + std::to_string(kStreamWindow) + " per message (got " +
                                std::to_string(q.updates_size()) + ")");
      } else if (q.order() != 0 || q.price() != 0) {
        shape = InvalidArgument("updates: a message with updates sets no order or price of its own");
      }
      items.reserve(static_cast<size_t>(q.updates_size()));
      for (int i = 0; i < q.updates_size(); ++i) {
        const pb::UpdateOrderRequest& u = q.updates(i);
        StreamItem it{u.tag(), u.order(), u.price(), shape};
        std::string field = "updates[" + std::to_string(i) + "]";
        if (it.status.ok() && u.updates_size() > 0) it.status = InvalidArgument(field + ".updates: updates do not nest");
        if (it.status.ok()) it.status = s_->Limit(p);
        if (it.status.ok()) it.status = CheckPrice(u.price(), field + ".price");
        items.push_back(std::move(it));
      }
      return items;
    }

    // StreamUpdates runs on gRPC's callback API, one reactor per stream: a
    // completed read submits its updates to the writer queue from gRPC's own
    // thread, and the committing thread that makes them durable (the committer,
    // or the writer when it commits its own batch) starts the write of their
    // ack itself. (The synchronous handler it replaces handed every ack
    // to a writer thread of its own per stream: one more wake-up per round
    // trip, issue 12.)
    grpc::ServerBidiReactor<pb::UpdateOrderRequest, pb::UpdateOrderResponse>* StreamUpdates(
        grpc::CallbackServerContext* c) override {
      return new UpdateStream(this, c);
    }

    class UpdateStream final : public grpc::ServerBidiReactor<pb::UpdateOrderRequest, pb::UpdateOrderResponse> {
     public:
      UpdateStream(Tenant* t, grpc::CallbackServerContext* c)
          : t_(t), c_(c), t0_(std::chrono::steady_clock::now()), stats_(t->s_->Stats("StreamUpdates.update")) {
        auto principal = t->s_->Authenticate(c);
        Status st = principal.status();
        if (st.ok()) st = Authorize(*principal, Need::kTenant);
        if (st.ok()) st = t->s_->AcquireStream(*principal);
        if (!st.ok()) {
          t->s_->Stats("StreamUpdates")->Observe(static_cast<int>(st.code()), 0);
          finished_ = true;
          Finish(ToGrpc(st));
          return;
        }
        actor_ = principal->Actor();
        p_ = std::make_shared<const Principal>(std::move(*principal));
        open_ = true;
        t->Register(this);
        StartRead(&in_);
      }

      void OnReadDone(bool ok) override {
        if (!ok) {
          std::unique_lock lock(mu_);
          reading_done_ = true;
          FinishIfDone(lock);
          return;
        }
        Message m{std::make_shared<std::vector<StreamItem>>(t_->StreamItems(*p_, in_)), in_.updates_size() > 0,
                  in_.tag()};
        {
          std::lock_guard lock(mu_);
          // A message larger than the window (refused above, item by item)
          // waits until nothing else is outstanding; reading pauses meanwhile.
          if (!Fits(m.items->size())) {
            parked_ = std::move(m);
            return;
          }
          outstanding_ += m.items->size();
        }
        Submit(std::move(m));
        StartRead(&in_);
      }

      void OnWriteDone(bool ok) override {
        const pb::UpdateOrderResponse* next = nullptr;
        std::optional<Message> resume;
        std::unique_lock lock(mu_);
        outstanding_ -= out_.front().updates;
        out_.pop_front();
        if (!ok) {
          // The client is gone: the acks still to come are dropped as they arrive.
          broken_ = true;
          for (const Out& o : out_) outstanding_ -= o.updates;
          out_.clear();
          DropParked();
        }
        if (!out_.empty()) next = &out_.front().resp;
        if (parked_ && Fits(parked_->items->size())) {
          resume = std::move(parked_);
          parked_.reset();
          outstanding_ += resume->items->size();
        }
        if (!next && !resume) {
          FinishIfDone(lock);
          return;
        }
        lock.unlock();
        // Outstanding work (this write, or the resumed message) keeps the reactor alive.
        if (next) StartWrite(next);
        if (resume) {
          Submit(*std::move(resume));
          StartRead(&in_);
        }
      }

      void OnDone() override {
        if (open_) {
          t_->Unregister(this);
          t_->s_->ReleaseStream(*p_);
          auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0_).count();
          t_->s_->Stats("StreamUpdates")->Observe(0, us);
        }
        delete this;
      }

      // Called every 200 ms by the revocation sweep (under its lock, so
      // before OnDone): a revoked token ends an idle stream too (the client
      // sees CANCELLED); each message is re-checked on the writer thread anyway.
      void CancelIfRevoked() {
        if (cancelled_ || t_->s_->s_->tokens_.Recheck(*p_).ok()) return;
        cancelled_ = true;
        c_->TryCancel();
      }

     private:
      struct Message {
        std::shared_ptr<std::vector<StreamItem>> items;
        bool batched = false;
        uint64_t tag = 0;
      };
      struct Out {
        pb::UpdateOrderResponse resp;
        size_t updates = 0;
      };

      bool Fits(size_t n) const { return outstanding_ == 0 || outstanding_ + n <= kStreamWindow; }

      // The client is gone (an ack's write failed): a parked message is
      // dropped unapplied (nothing of it was acknowledged), and since no read
      // is pending while one is parked, reading is over; otherwise the stream
      // would wait for room forever and never finish. Under mu_.
      void DropParked() {
        if (!parked_) return;
        parked_.reset();
        reading_done_ = true;
      }

      // Finishes once the client is done sending and every update it sent
      // was acknowledged (or dropped with the client): nothing refers to the
      // reactor after that. Unlocks `lock`.
      void FinishIfDone(std::unique_lock<std::mutex>& lock) {
        bool done = reading_done_ && outstanding_ == 0 && out_.empty() && !parked_ && !finished_;
        if (done) finished_ = true;
        lock.unlock();
        if (done) Finish(grpc::Status::OK);
      }

      // One command for the whole message: its updates apply in order in
      // one writer batch and become durable in the same commit. Items that
      // failed at the edge still go through the queue, so acks stay in order.
      // Through the shared path (Services::ExecAsync): the token is re-checked
      // on the writer thread once per message, and the call's status is the
      // re-check's, or the commit's failure, or OK.
      void Submit(Message m) {
        auto start = std::chrono::steady_clock::now();
        const TenantId tenant = p_->tenant;
        t_->s_->ExecAsync(
            p_, actor_,
            [tenant, items = m.items](WriterContext& w) -> Status {
              for (StreamItem& it : *items) {
                if (it.status.ok()) it.status = Update(w, tenant, it.order, it.price);
              }
              return Status::Ok();
            },
            // On the committing thread, once the message's records are durable.
            [this, m, start](const Status& call) {
              auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start)
                            .count();
              auto fill = [&](const StreamItem& it, pb::UpdateOrderResponse* a) {
                a->set_tag(it.tag);
                // An update refused at the edge or by the engine keeps its own
                // error; the others carry the call's (token, commit).
                const Status& s = it.status.ok() ? call : it.status;
                a->set_code(static_cast<int>(s.code()));
                if (!s.ok()) a->set_message(s.message());
                stats_->Observe(static_cast<int>(s.code()), us);
              };
              pb::UpdateOrderResponse a;
              if (m.batched) {
                a.set_tag(m.tag);
                for (const StreamItem& it : *m.items) fill(it, a.add_acks());
              } else {
                fill(m.items->front(), &a);
              }
              Acked(std::move(a), m.items->size());
            });
      }

      // Queues an ack and starts its write if none is in flight (gRPC allows
      // one at a time; OnWriteDone starts the next).
      void Acked(pb::UpdateOrderResponse a, size_t updates) {
        const pb::UpdateOrderResponse* first = nullptr;
        {
          std::unique_lock lock(mu_);
          if (broken_) {
            outstanding_ -= updates;
            DropParked();
            FinishIfDone(lock);
            return;
          }
          out_.push_back(Out{std::move(a), updates});
          if (out_.size() > 1) return;  // A write is in flight; OnWriteDone starts this one.
          first = &out_.front().resp;
        }
        StartWrite(first);
      }

      Tenant* const t_;
      grpc::CallbackServerContext* const c_;
      const std::chrono::steady_clock::time_point t0_;
      MethodStats* const stats_;
      // Shared by the stream's messages (Services::ExecAsync); set once authenticated.
      std::shared_ptr<const Principal> p_;
      std::string actor_;
      bool open_ = false;       // Authenticated and counted (AcquireStream).
      bool cancelled_ = false;  // By the revocation sweep (its lock).
      pb::UpdateOrderRequest in_;
      std::mutex mu_;
      size_t outstanding_ = 0;  // Updates received and not yet acknowledged on the wire.
      std::deque<Out> out_;     // Acks to write; the front one is being written.
      bool reading_done_ = false;
      bool broken_ = false;
      bool finished_ = false;
      std::optional<Message> parked_;
    };

    void Register(UpdateStream* u) {
      std::lock_guard lock(live_mu_);
      live_.insert(u);
    }
    void Unregister(UpdateStream* u) {
      std::lock_guard lock(live_mu_);
      live_.erase(u);
    }

    // One thread for every stream's token re-check.
    void SweepRevoked() {
      std::unique_lock lock(live_mu_);
      while (!live_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return sweep_stop_; })) {
        for (UpdateStream* u : live_) u->CancelIfRevoked();
      }
    }

    grpc::Status CancelOrder(ServerContext* c, const pb::CancelOrderRequest* q, pb::CancelOrderResponse*) override {
      return s_->Call("CancelOrder", c, Need::kTenant, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          market::OpBody op = market::OpCancelOrder{p.tenant, OrderId(q->order())};
          // A repeat answers as the original did, though the order is no longer open.
          if (const KeyedOutcome* prior = w.Repeat(q->idempotency_key())) return w.SameRequest(*prior, {op});
          LZ_RETURN_IF_ERROR(OwnOrder(w.engine(), p.tenant, q->order()).status());
          return w.ApplyKeyed(std::move(op), q->idempotency_key()).status;
        });
      });
    }

    grpc::Status SetLimit(ServerContext* c, const pb::SetLimitRequest* q, pb::SetLimitResponse*) override {
      return s_->Call("SetLimit", c, Need::kTenant, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->node(), "node"));
        LZ_RETURN_IF_ERROR(CheckPrice(q->limit(), "limit"));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(NodeId n, FindNodeOr(w.engine(), q->node(), "node"));
          LZ_RETURN_IF_ERROR(HeldBy(w, p, n));
          return w.Apply(market::OpSetLimit{p.tenant, n, q->limit()}).status;
        });
      });
    }

    // The same answer for a node held by someone else as for a free one.
    static Status HeldBy(WriterContext& w, const Principal& p, NodeId n) {
      auto v = w.engine().GetNode(n);
      if (!v.ok() || v->holder != p.tenant ||
          (v->status != market::NodeStatus::kHeld && v->status != market::NodeStatus::kContested)) {
        return FailedPrecondition("node: you do not hold \"" + w.engine().topology().node(n).name + "\"");
      }
      return Status::Ok();
    }

    grpc::Status Relinquish(ServerContext* c, const pb::RelinquishRequest* q, pb::RelinquishResponse*) override {
      return s_->Call("Relinquish", c, Need::kTenant, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->node(), "node"));
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(NodeId n, FindNodeOr(w.engine(), q->node(), "node"));
          market::OpBody op = market::OpRelinquish{p.tenant, n};
          // A repeat answers as the original did, though the node is no longer held.
          if (const KeyedOutcome* prior = w.Repeat(q->idempotency_key())) return w.SameRequest(*prior, {op});
          LZ_RETURN_IF_ERROR(HeldBy(w, p, n));
          return w.ApplyKeyed(std::move(op), q->idempotency_key()).status;
        });
      });
    }

    grpc::Status ListOrders(ServerContext* c, const pb::ListOrdersRequest*, pb::ListOrdersResponse* r) override {
      return s_->Call("ListOrders", c, Need::kTenant, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(market::TenantView t, w.engine().GetTenant(p.tenant));
          for (OrderId id : t.orders) {
            auto o = w.engine().GetOrder(id);
            if (o.ok()) FillOrder(w.engine(), *o, r->add_orders());
          }
          return Status::Ok();
        });
      });
    }

    grpc::Status ListNodes(ServerContext* c, const pb::ListNodesRequest*, pb::ListNodesResponse* r) override {
      return s_->Call("ListNodes", c, Need::kTenant, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          const auto& e = w.engine();
          LZ_ASSIGN_OR_RETURN(market::TenantView t, e.GetTenant(p.tenant));
          for (NodeId n : t.nodes) {
            auto v = e.GetNode(n);
            if (!v.ok()) continue;
            auto* out = r->add_nodes();
            const auto& node = e.topology().node(n);
            out->set_node(node.name);
            out->set_node_id(n.value);
            out->set_type(e.topology().type_name(node.type));
            out->set_location(LocationPath(e.topology(), n));
            out->set_limit(v->limit);
            out->set_held_since(v->held_since);
            out->set_status(std::string(market::NodeStatusName(v->status)));
          }
          return Status::Ok();
        });
      });
    }

    grpc::Status Quote(ServerContext* c, const pb::QuoteRequest* q, pb::QuoteResponse* r) override {
      return s_->Call("Quote", c, Need::kAnyRole, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->vertex(), "vertex"));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(VertexId v, FindVertexOr(w.engine(), q->vertex(), "vertex"));
          LZ_ASSIGN_OR_RETURN(market::VertexQuote vq, w.engine().Quote(v, q->depth()));
          FillQuote(w.engine(), vq, r->mutable_quote());
          return Status::Ok();
        });
      });
    }

    grpc::Status EvictionQuote(ServerContext* c, const pb::EvictionQuoteRequest* q,
                               pb::EvictionQuoteResponse* r) override {
      return s_->Call("EvictionQuote", c, Need::kTenant, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->node(), "node"));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(NodeId n, FindNodeOr(w.engine(), q->node(), "node"));
          LZ_RETURN_IF_ERROR(HeldBy(w, p, n));
          LZ_ASSIGN_OR_RETURN(market::EvictionQuote e, w.engine().GetEvictionQuote(p.tenant, n));
          r->set_node(q->node());
          r->set_limit(e.limit);
          r->set_competing(e.competing);
          r->set_floor(e.floor);
          r->set_obtain(e.obtain);
          r->set_pays(e.pays);
          r->set_contested(e.contested);
          r->set_deadline(e.deadline);
          if (e.reasons) r->set_reasons(market::ReasonNames(e.reasons));
          return Status::Ok();
        });
      });
    }

    grpc::Status GetBalance(ServerContext* c, const pb::GetBalanceRequest*, pb::BalanceResponse* r) override {
      return s_->Call("GetBalance", c, Need::kTenant, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(market::TenantView t, w.engine().GetTenant(p.tenant));
          LZ_ASSIGN_OR_RETURN(Money avail, w.engine().AvailableBalance(p.tenant));
          r->set_tenant(t.name);
          r->set_tenant_id(t.id.value);
          r->set_balance(t.balance);
          r->set_available(avail);
          r->set_max_rate(t.max_rate);
          r->set_committed_rate(t.committed_rate);
          r->set_spend_rate(t.spend_rate);
          r->set_paid(t.paid);
          r->set_waived(t.waived);
          r->set_exhausted(t.exhausted);
          return Status::Ok();
        });
      });
    }

    grpc::Status GetLedger(ServerContext* c, const pb::GetLedgerRequest* q, pb::LedgerResponse* r) override {
      return s_->Call("GetLedger", c, Need::kTenant, [&](const Principal& p) -> Status {
        size_t limit = q->limit() == 0 ? 100 : std::min<size_t>(q->limit(), kMaxListed);
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          auto ledger = w.engine().ledger();
          std::vector<const market::LedgerEntry*> mine;
          for (auto it = ledger.rbegin(); it != ledger.rend() && mine.size() < limit; ++it) {
            if (it->tenant == p.tenant) mine.push_back(&*it);
          }
          for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
            FillLedger(w.engine(), **it, false, w, r->add_entries());
          }
          return Status::Ok();
        });
      });
    }

    grpc::Status GetTopology(ServerContext* c, const pb::GetTopologyRequest*, pb::TopologyResponse* r) override {
      return s_->Call("GetTopology", c, Need::kAnyRole, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          const auto& t = w.engine().topology();
          for (uint32_t i = 0; i < t.node_count(); ++i) {
            NodeId id(i);
            const auto& n = t.node(id);
            auto* out = r->add_nodes();
            out->set_id(i);
            out->set_name(n.name);
            out->set_type(t.type_name(n.type));
            // Rack path is region/zone/row/rack.
            std::vector<std::string> parts;
            for (LocationId l = n.rack; l.valid() && l != topology::Topology::kRootLocation; l = t.location(l).parent) {
              parts.insert(parts.begin(), t.location(l).name);
            }
            if (parts.size() == 4) {
              out->set_region(parts[0]);
              out->set_zone(parts[1]);
              out->set_row(parts[2]);
              out->set_rack(parts[3]);
            }
            out->set_gpus(n.meta.gpus);
            out->set_memory_gb(n.meta.memory_gb);
            out->set_power_w(n.meta.power_w);
            out->set_alive(n.alive);
            out->set_leaf(n.leaf.value);
            out->set_type_root(t.TypeRoot(n.type).value);
          }
          for (uint32_t v = 0; v < t.vertex_count(); ++v) {
            auto* out = r->add_vertices();
            out->set_id(v);
            out->set_name(t.VertexName(VertexId(v)));
          }
          r->set_now(w.now());
          return Status::Ok();
        });
      });
    }

    grpc::Status Watch(ServerContext* c, const pb::WatchRequest* q, grpc::ServerWriter<pb::Event>* w) override {
      return s_->Stream("Watch", c, w, Need::kTenant, q);
    }

   private:
    Services* s_;
    std::mutex live_mu_;
    std::condition_variable live_cv_;
    std::unordered_set<UpdateStream*> live_;  // Open StreamUpdates streams.
    bool sweep_stop_ = false;
    std::thread sweeper_;
  };

  // ---- Operator service ----
  class Operator final : public pb::OperatorService::Service {
   public:
    explicit Operator(Services* s) : s_(s) {}

    grpc::Status AddNodes(ServerContext* c, const pb::AddNodesRequest* q, pb::AddNodesResponse* r) override {
      return s_->Call("AddNodes", c, Need::kOperator, [&](const Principal& p) -> Status {
        if (q->nodes_size() == 0) return InvalidArgument("nodes: must not be empty");
        if (q->nodes_size() > 10000) return InvalidArgument("nodes: at most 10000 per call");
        std::vector<topology::NodeInfo> infos;
        std::unordered_set<std::string> names;
        for (int i = 0; i < q->nodes_size(); ++i) {
          const auto& n = q->nodes(i);
          std::string f = "nodes[" + std::to_string(i) + "].";
          LZ_RETURN_IF_ERROR(CheckName(n.name(), f + "name"));
          LZ_RETURN_IF_ERROR(CheckName(n.type(), f + "type"));
          LZ_RETURN_IF_ERROR(CheckName(n.region(), f + "region"));
          LZ_RETURN_IF_ERROR(CheckName(n.zone(), f + "zone"));
          LZ_RETURN_IF_ERROR(CheckName(n.row(), f + "row"));
          LZ_RETURN_IF_ERROR(CheckName(n.rack(), f + "rack"));
          for (const std::string* part : {&n.name(), &n.type(), &n.region(), &n.zone(), &n.row(), &n.rack()}) {
            if (part->find('/') != std::string::npos) return InvalidArgument(f + "name: must not contain '/'");
          }
          if (n.gpus() < 0) return InvalidArgument(f + "gpus: must not be negative");
          if (n.memory_gb() < 0) return InvalidArgument(f + "memory_gb: must not be negative");
          if (n.power_w() < 0) return InvalidArgument(f + "power_w: must not be negative");
          if (!names.insert(n.name()).second) return InvalidArgument(f + "name: repeated in this request");
          infos.push_back(topology::NodeInfo{n.name(), n.type(), n.region(), n.zone(), n.row(), n.rack(),
                                             topology::NodeMeta{n.gpus(), n.memory_gb(), n.power_w()}});
        }
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        const std::string& key = q->idempotency_key();
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          if (const KeyedOutcome* prior = w.Repeat(key)) {
            std::vector<market::OpBody> ops;
            for (const auto& info : infos) ops.push_back(market::OpAddNode{info});
            LZ_RETURN_IF_ERROR(w.SameRequest(*prior, ops));
            r->add_node_ids(static_cast<uint32_t>(prior->created_id));
            for (uint64_t id : prior->more_ids) r->add_node_ids(static_cast<uint32_t>(id));
            return Status::Ok();
          }
          const auto& topo = w.engine().topology();
          std::unordered_set<std::string> types;
          for (const auto& info : infos) types.insert(info.type);
          for (size_t i = 0; i < infos.size(); ++i) {
            std::string f = "nodes[" + std::to_string(i) + "].";
            if (topo.FindNode(infos[i].name).ok()) {
              return AlreadyExists(f + "name: a node named \"" + infos[i].name + "\" exists");
            }
            // A node named like a hardware type could not be addressed by
            // name (the type's vertex takes the name), and the reverse.
            if (types.count(infos[i].name) || topo.FindVertex(infos[i].name).ok()) {
              return InvalidArgument(f + "name: \"" + infos[i].name +
                                     "\" is the name of a hardware type or vertex; pick another");
            }
            if (topo.FindNode(infos[i].type).ok() || names.count(infos[i].type)) {
              return InvalidArgument(f + "type: \"" + infos[i].type + "\" is the name of a node; pick another");
            }
          }
          for (const auto& info : infos) {
            ApplyResult a = w.ApplyKeyed(market::OpAddNode{info}, key);
            if (!a.status.ok()) return a.status;
            r->add_node_ids(static_cast<uint32_t>(a.created_id));
          }
          return Status::Ok();
        });
      });
    }

    static Result<market::FloorTarget> Target(WriterContext& w, const std::string& node, const std::string& location) {
      market::FloorTarget t;
      if (!node.empty() && !location.empty()) return InvalidArgument("node: give a node or a location, not both");
      if (!node.empty()) {
        LZ_ASSIGN_OR_RETURN(t.node, FindNodeOr(w.engine(), node, "node"));
        return t;
      }
      auto l = w.engine().topology().FindLocation(location);
      if (!l.ok()) return NotFound("location: no location \"" + location.substr(0, 64) + "\"");
      t.location = *l;
      return t;
    }

    grpc::Status DrainNodes(ServerContext* c, const pb::DrainRequest* q, pb::PolicyResponse* r) override {
      return s_->Call("DrainNodes", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->node(), "node", false));
        LZ_RETURN_IF_ERROR(CheckName(q->location(), "location", false));
        if (q->start() < 0) return InvalidArgument("start: must not be negative");
        if (q->end() < 0) return InvalidArgument("end: must not be negative");
        if (q->end() != 0 && q->end() <= q->start()) return InvalidArgument("end: must be after start");
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          if (q->node().empty() && q->location().empty()) return InvalidArgument("node: give a node or a location");
          LZ_ASSIGN_OR_RETURN(auto target, Target(w, q->node(), q->location()));
          // "Now" of a repeat is the original's time, so the same request matches.
          const KeyedOutcome* prior = w.Repeat(q->idempotency_key());
          market::MaintenanceSpec m;
          m.target = target;
          m.start = std::max(q->start(), prior ? prior->time : w.MutationTime());
          m.end = q->end() == 0 ? kNever : q->end();
          if (!prior && m.end <= m.start) return InvalidArgument("end: must be in the future");
          ApplyResult a = w.ApplyKeyed(market::OpAddPolicy{m}, q->idempotency_key());
          if (!a.status.ok()) return a.status;
          return a.created_id;
        }));
        r->set_policy(static_cast<uint32_t>(id));
        return Status::Ok();
      });
    }

    grpc::Status RemoveNodes(ServerContext* c, const pb::RemoveNodesRequest* q, pb::RemoveNodesResponse*) override {
      return s_->Call("RemoveNodes", c, Need::kOperator, [&](const Principal& p) -> Status {
        if (q->nodes_size() == 0) return InvalidArgument("nodes: must not be empty");
        if (q->nodes_size() > 10000) return InvalidArgument("nodes: at most 10000 per call");
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        const std::string& key = q->idempotency_key();
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          if (const KeyedOutcome* prior = w.Repeat(key)) {
            std::vector<market::OpBody> ops;
            for (int i = 0; i < q->nodes_size(); ++i) {
              // The nodes are gone, but a removed node keeps its name (never reused).
              auto n = w.engine().topology().FindNode(q->nodes(i));
              if (!n.ok()) return NotFound("nodes[" + std::to_string(i) + "]: no node named \"" + q->nodes(i) + "\"");
              ops.push_back(market::OpRemoveNode{*n});
            }
            return w.SameRequest(*prior, ops);
          }
          std::vector<NodeId> ids;
          for (int i = 0; i < q->nodes_size(); ++i) {
            std::string f = "nodes[" + std::to_string(i) + "]";
            LZ_ASSIGN_OR_RETURN(NodeId n, FindNodeOr(w.engine(), q->nodes(i), f));
            auto v = w.engine().GetNode(n);
            if (!v.ok() || v->status != market::NodeStatus::kFree) {
              return FailedPrecondition(f + ": \"" + q->nodes(i) + "\" is not free; drain it first");
            }
            ids.push_back(n);
          }
          for (NodeId n : ids) {
            Status st = w.ApplyKeyed(market::OpRemoveNode{n}, key).status;
            if (!st.ok()) return st;
          }
          return Status::Ok();
        });
      });
    }

    grpc::Status SetFloor(ServerContext* c, const pb::SetFloorRequest* q, pb::PolicyResponse* r) override {
      return s_->Call("SetFloor", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->node(), "node", false));
        LZ_RETURN_IF_ERROR(CheckName(q->location(), "location", false));
        LZ_RETURN_IF_ERROR(CheckPrice(q->price(), "price"));
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          LZ_ASSIGN_OR_RETURN(auto target, Target(w, q->node(), q->location()));
          return AddPolicy(w, market::StaticFloorSpec{target, q->price()}, q->idempotency_key());
        }));
        r->set_policy(static_cast<uint32_t>(id));
        return Status::Ok();
      });
    }

    static constexpr int kMaxSeries = 10000;
    // The controller fields both adaptive requests carry under the same names.
    template <typename Request, typename Spec>
    static void CopyControl(const Request& q, Spec* s) {
      s->margin_ppm = q.margin_ppm();
      s->band_ppm = q.band_ppm();
      s->interval = q.interval_us();
      s->rise_ppm = q.rise_ppm();
      s->rise_min = q.rise_min();
      s->rise_max = q.rise_max();
      s->fall_step = q.fall_step();
    }

    // A row by its location path: NOT_FOUND or INVALID_ARGUMENT naming `row`.
    static Result<LocationId> Row(WriterContext& w, const std::string& path) {
      auto l = w.engine().topology().FindLocation(path);
      if (!l.ok()) return NotFound("row: no location \"" + path.substr(0, 64) + "\"");
      if (w.engine().topology().location(*l).level != topology::Level::kRow) {
        return InvalidArgument("row: \"" + path + "\" is not a row");
      }
      return *l;
    }

    // A repeat of a keyed call returns the original policy id.
    static Result<uint64_t> AddPolicy(WriterContext& w, market::PolicySpec spec, const std::string& key) {
      ApplyResult a = w.ApplyKeyed(market::OpAddPolicy{std::move(spec)}, key);
      if (!a.status.ok()) return a.status;
      return a.created_id;
    }

    grpc::Status SetPowerCap(ServerContext* c, const pb::PowerCapRequest* q, pb::PolicyResponse* r) override {
      return s_->Call("SetPowerCap", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->row(), "row"));
        if (q->cap_w() <= 0) return InvalidArgument("cap_w: must be positive");
        if (q->steps_size() == 0) return InvalidArgument("steps: must not be empty");
        if (q->steps_size() > 64) return InvalidArgument("steps: at most 64");
        market::PowerCapSpec spec;
        spec.cap_w = q->cap_w();
        Ppm last = -1;
        for (int i = 0; i < q->steps_size(); ++i) {
          std::string f = "steps[" + std::to_string(i) + "].";
          const auto& s = q->steps(i);
          if (s.utilization_ppm() < 0) return InvalidArgument(f + "utilization_ppm: must not be negative");
          if (s.utilization_ppm() <= last) return InvalidArgument(f + "utilization_ppm: must increase");
          last = s.utilization_ppm();
          if (s.floor() != kInfPrice) LZ_RETURN_IF_ERROR(CheckPrice(s.floor(), f + "floor"));
          spec.steps.emplace_back(s.utilization_ppm(), s.floor());
        }
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          LZ_ASSIGN_OR_RETURN(spec.row, Row(w, q->row()));
          return AddPolicy(w, spec, q->idempotency_key());
        }));
        r->set_policy(static_cast<uint32_t>(id));
        return Status::Ok();
      });
    }

    // Every parameter is checked by market::ValidateOperation on the writer
    // (the same check replay runs), which names the field.
    grpc::Status AddAdaptivePowerCap(ServerContext* c, const pb::AdaptivePowerCapRequest* q,
                                     pb::PolicyResponse* r) override {
      return s_->Call("AddAdaptivePowerCap", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->row(), "row"));
        market::AdaptivePowerCapSpec spec;
        spec.cap_w = q->cap_w();
        CopyControl(*q, &spec);
        spec.min_floor = q->min_floor();
        spec.max_floor = q->max_floor();
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          LZ_ASSIGN_OR_RETURN(spec.row, Row(w, q->row()));
          return AddPolicy(w, spec, q->idempotency_key());
        }));
        r->set_policy(static_cast<uint32_t>(id));
        return Status::Ok();
      });
    }

    grpc::Status AddAdaptiveCarbonBudget(ServerContext* c, const pb::AdaptiveCarbonBudgetRequest* q,
                                         pb::PolicyResponse* r) override {
      return s_->Call("AddAdaptiveCarbonBudget", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckName(q->region(), "region"));
        if (q->series_size() > kMaxSeries) {
          return InvalidArgument("series: at most " + std::to_string(kMaxSeries) + " points");
        }
        market::AdaptiveCarbonBudgetSpec spec;
        spec.budget_g_per_h = q->budget_g_per_h();
        for (const auto& pt : q->series()) spec.series.emplace_back(pt.from(), pt.g_per_kwh());
        CopyControl(*q, &spec);
        spec.min_price = q->min_price();
        spec.max_price = q->max_price();
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        LZ_ASSIGN_OR_RETURN(uint64_t id, s_->Exec<uint64_t>(p, [&](WriterContext& w) -> Result<uint64_t> {
          const auto& topo = w.engine().topology();
          auto l = topo.FindLocation(q->region());
          if (!l.ok()) return NotFound("region: no location \"" + q->region().substr(0, 64) + "\"");
          if (topo.location(*l).level != topology::Level::kRegion) {
            return InvalidArgument("region: \"" + q->region() + "\" is not a region");
          }
          spec.region = *l;
          return AddPolicy(w, spec, q->idempotency_key());
        }));
        r->set_policy(static_cast<uint32_t>(id));
        return Status::Ok();
      });
    }

    grpc::Status SetAdaptiveCap(ServerContext* c, const pb::SetAdaptiveCapRequest* q,
                                pb::SetAdaptiveCapResponse*) override {
      return s_->Call("SetAdaptiveCap", c, Need::kOperator, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) {
          return w.Apply(market::OpSetAdaptiveCap{PolicyId(q->policy()), q->cap()}).status;
        });
      });
    }

    grpc::Status RemovePolicy(ServerContext* c, const pb::RemovePolicyRequest* q, pb::RemovePolicyResponse*) override {
      return s_->Call("RemovePolicy", c, Need::kOperator, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        return s_->ExecStatus(p, [&](WriterContext& w) {
          return w.ApplyKeyed(market::OpRemovePolicy{PolicyId(q->policy())}, q->idempotency_key()).status;
        });
      });
    }

    grpc::Status SetVolatility(ServerContext* c, const pb::SetVolatilityRequest* q, pb::MarketParams* r) override {
      return s_->Call("SetVolatility", c, Need::kOperator, [&](const Principal& p) -> Status {
        if (q->update_size() > 16) return InvalidArgument("update: at most 16 fields");
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          market::MarketParams mp = w.engine().params();
          const auto& in = q->params();
          for (int i = 0; i < q->update_size(); ++i) {
            const std::string& f = q->update(i);
            if (f == "grace_us") mp.grace = in.grace_us();
            else if (f == "hysteresis_ppm") mp.hysteresis_ppm = in.hysteresis_ppm();
            else if (f == "tick") mp.tick = in.tick();
            else if (f == "clip_alpha_ppm") mp.clip_alpha_ppm = in.clip_alpha_ppm();
            else if (f == "clip_interval_us") mp.clip_interval = in.clip_interval_us();
            else if (f == "decay_beta") mp.decay_beta = in.decay_beta();
            else if (f == "min_hold_us") mp.min_hold = in.min_hold_us();
            else return InvalidArgument("update[" + std::to_string(i) + "]: unknown field \"" + f.substr(0, 32) + "\"");
          }
          if (q->update_size() > 0) {
            LZ_RETURN_IF_ERROR(market::ValidateParams(mp));
            LZ_RETURN_IF_ERROR(w.Apply(market::OpSetParams{mp}).status);
          }
          const auto& now = w.engine().params();
          r->set_grace_us(now.grace);
          r->set_hysteresis_ppm(now.hysteresis_ppm);
          r->set_tick(now.tick);
          r->set_clip_alpha_ppm(now.clip_alpha_ppm);
          r->set_clip_interval_us(now.clip_interval);
          r->set_decay_beta(now.decay_beta);
          r->set_min_hold_us(now.min_hold);
          return Status::Ok();
        });
      });
    }

    grpc::Status ListCluster(ServerContext* c, const pb::ListClusterRequest*, pb::ListClusterResponse* r) override {
      return s_->Call("ListCluster", c, Need::kOperator, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          const auto& e = w.engine();
          const auto& t = e.topology();
          for (uint32_t i = 0; i < t.node_count(); ++i) {
            NodeId id(i);
            if (!t.IsLiveNode(id)) continue;
            auto v = e.GetNode(id);
            if (!v.ok()) continue;
            auto* out = r->add_nodes();
            out->set_node(t.node(id).name);
            out->set_node_id(i);
            out->set_type(t.type_name(t.node(id).type));
            out->set_location(LocationPath(t, id));
            out->set_status(std::string(market::NodeStatusName(v->status)));
            if (v->holder.valid()) out->set_holder(w.TenantName(v->holder));
            out->set_limit(v->limit);
            out->set_floor(v->floor);
          }
          r->set_now(w.now());
          r->set_resting_orders(e.resting_order_count());
          r->set_tenants(static_cast<uint32_t>(e.tenant_count()));
          return Status::Ok();
        });
      });
    }

    grpc::Status GetLedger(ServerContext* c, const pb::OperatorLedgerRequest* q,
                           pb::OperatorLedgerResponse* r) override {
      return s_->Call("Operator.GetLedger", c, Need::kOperator, [&](const Principal& p) -> Status {
        size_t limit = q->limit() == 0 ? 100 : std::min<size_t>(q->limit(), kMaxListed);
        LZ_RETURN_IF_ERROR(CheckName(q->tenant(), "tenant", false));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          const auto& e = w.engine();
          TenantId filter;
          if (!q->tenant().empty()) {
            LZ_ASSIGN_OR_RETURN(filter, FindTenantOr(e, q->tenant(), "tenant"));
          }
          auto ledger = e.ledger();
          std::vector<const market::LedgerEntry*> picked;
          for (auto it = ledger.rbegin(); it != ledger.rend() && picked.size() < limit; ++it) {
            if (!filter.valid() || it->tenant == filter) picked.push_back(&*it);
          }
          for (auto it = picked.rbegin(); it != picked.rend(); ++it) FillLedger(e, **it, true, w, r->add_entries());
          auto totals = e.ledger_totals();
          r->set_deposited(totals.deposited);
          r->set_tenant_balances(totals.tenant_balances);
          r->set_operator_revenue(totals.operator_revenue);
          r->set_waived(totals.waived);
          r->set_unsettled(e.UnsettledCharges());
          r->set_total_entries(totals.entries);
          return Status::Ok();
        });
      });
    }

    grpc::Status GetAuditLog(ServerContext* c, const pb::AuditLogRequest* q, pb::AuditLogResponse* r) override {
      return s_->Call("GetAuditLog", c, Need::kOperator, [&](const Principal&) -> Status {
        size_t limit = q->limit() == 0 ? 100 : std::min<size_t>(q->limit(), kMaxListed);
        LZ_ASSIGN_OR_RETURN(auto records, s_->s_->store_->RecentJournal(limit));
        for (const auto& rec : records) {
          auto* out = r->add_records();
          out->set_seq(rec.seq);
          out->set_actor(rec.actor);
          out->set_operation(rec.line);
        }
        return Status::Ok();
      });
    }

    grpc::Status Watch(ServerContext* c, const pb::WatchRequest* q, grpc::ServerWriter<pb::Event>* w) override {
      return s_->Stream("Operator.Watch", c, w, Need::kOperator, q);
    }

   private:
    Services* s_;
  };

  // ---- Admin service ----
  class Admin final : public pb::AdminService::Service {
   public:
    explicit Admin(Services* s) : s_(s) {}

    static TokenRecord NewRecord(WriterContext& w, const std::string& token, Role role, TenantId tenant,
                                 const std::string& name) {
      TokenRecord t;
      t.id = w.NextTokenId();
      t.hash = HashToken(token);
      t.role = std::string(RoleName(role));
      t.tenant_id = tenant.value;
      t.name = name;
      t.created = WallClockMicros();
      return t;
    }

    grpc::Status CreateTenant(ServerContext* c, const pb::CreateTenantRequest* q, pb::CreateTenantResponse* r) override {
      return s_->Call("CreateTenant", c, Need::kAdmin, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckTenantName(q->name()));
        LZ_RETURN_IF_ERROR(CheckAmount(q->balance(), "balance", "micro-units"));
        LZ_RETURN_IF_ERROR(CheckPrice(q->max_rate(), "max_rate"));
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        std::string token = NewToken();
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          Price max_rate = q->max_rate() == 0 ? kInfPrice : q->max_rate();
          market::OpBody op = market::OpCreateTenant{q->name(), q->balance(), max_rate};
          if (const KeyedOutcome* prior = w.Repeat(q->idempotency_key())) {
            // The token is kept only as its hash: it cannot be returned again.
            LZ_RETURN_IF_ERROR(w.SameRequest(*prior, {op}));
            return FailedPrecondition("idempotency_key: already applied: this key created tenant \"" + q->name() +
                                      "\" (tenant_id " + std::to_string(prior->created_id) +
                                      "); its first token was returned once and is not kept: issue a new one "
                                      "(IssueToken, role tenant)");
          }
          if (w.engine().FindTenant(q->name()).ok()) {
            return AlreadyExists("name: a tenant named \"" + q->name() + "\" exists");
          }
          ApplyResult a = w.ApplyKeyed(std::move(op), q->idempotency_key());
          if (!a.status.ok()) return a.status;
          TenantId id(static_cast<uint32_t>(a.created_id));
          TokenRecord t = NewRecord(w, token, Role::kTenant, id, q->name());
          w.PutToken(t);
          r->set_tenant(q->name());
          r->set_tenant_id(id.value);
          r->set_token(token);
          r->set_token_id(t.id);
          return Status::Ok();
        });
      });
    }

    grpc::Status Deposit(ServerContext* c, const pb::DepositRequest* q, pb::DepositResponse* r) override {
      return s_->Call("Deposit", c, Need::kAdmin, [&](const Principal& p) -> Status {
        LZ_RETURN_IF_ERROR(CheckAmount(q->amount(), "amount", "micro-units"));
        if (q->amount() == 0) return InvalidArgument("amount: must be positive");
        LZ_RETURN_IF_ERROR(CheckKey(q->idempotency_key()));
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_ASSIGN_OR_RETURN(TenantId t, FindTenantOr(w.engine(), q->tenant(), "tenant"));
          bool repeated = false;
          int64_t balance = 0;
          LZ_RETURN_IF_ERROR(
              w.ApplyKeyed(market::OpDeposit{t, q->amount()}, q->idempotency_key(), &repeated, &balance).status);
          r->set_balance(balance);
          return Status::Ok();
        });
      });
    }

    grpc::Status IssueToken(ServerContext* c, const pb::IssueTokenRequest* q, pb::IssueTokenResponse* r) override {
      return s_->Call("IssueToken", c, Need::kAdmin, [&](const Principal& p) -> Status {
        LZ_ASSIGN_OR_RETURN(Role role, ParseRole(q->role(), "role"));
        LZ_RETURN_IF_ERROR(CheckName(q->name(), "name", false));
        if (role != Role::kTenant && !q->tenant().empty()) return InvalidArgument("tenant: only for role tenant");
        std::string token = NewToken();
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_RETURN_IF_ERROR(w.Writable());
          TenantId tenant;
          std::string name = q->name();
          if (role == Role::kTenant) {
            LZ_ASSIGN_OR_RETURN(tenant, FindTenantOr(w.engine(), q->tenant(), "tenant"));
            name = q->tenant();
          } else if (name.empty()) {
            name = std::string(RoleName(role));
          }
          TokenRecord t = NewRecord(w, token, role, tenant, name);
          w.PutToken(t);
          r->set_token(token);
          r->set_token_id(t.id);
          return Status::Ok();
        });
      });
    }

    grpc::Status RevokeToken(ServerContext* c, const pb::RevokeTokenRequest* q, pb::RevokeTokenResponse*) override {
      return s_->Call("RevokeToken", c, Need::kAdmin, [&](const Principal& p) -> Status {
        return s_->ExecStatus(p, [&](WriterContext& w) -> Status {
          LZ_RETURN_IF_ERROR(w.Writable());
          LZ_ASSIGN_OR_RETURN(TokenRecord t, s_->s_->tokens_.Get(q->token_id()));
          if (t.revoked) return Status::Ok();  // Idempotent.
          t.revoked = true;
          w.PutToken(t);
          return Status::Ok();
        });
      });
    }

   private:
    Services* s_;
  };

  Server* s_;
  std::mutex streams_mu_;
  std::unordered_map<uint64_t, int> streams_;
  std::mutex stats_mu_;
  std::unordered_map<std::string, MethodStats*> stats_;
  Tenant tenant_;
  Operator op_;
  Admin admin_;
};

// ---------------------------------------------------------------------------

Server::Server(ServerOptions options) : options_(std::move(options)) {
  if (options_.db == ":memory:") options_.db.clear();
  if (options_.admin_token_file.empty() && !options_.db.empty()) {
    options_.admin_token_file = options_.db + ".admin-token";
  }
  limiter_ = std::make_unique<RateLimiter>(options_.rate_limit, options_.rate_burst);
}

Server::~Server() { Shutdown(); }

Status Server::Limit(const Principal& p) {
  uint64_t key = p.role == Role::kTenant ? p.tenant.value : (1ull << 63) | p.token_id;
  if (limiter_->Allow(key)) return Status::Ok();
  metrics_.rate_limited.fetch_add(1, std::memory_order_relaxed);
  return ResourceExhausted("rate limit: more than " + std::to_string(static_cast<int64_t>(options_.rate_limit)) +
                           " requests per second for " + p.Actor());
}

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  grpc::ChannelArguments args;
  return grpc_->InProcessChannel(args);
}

namespace {
Result<std::string> ReadFile(const std::string& path, std::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(std::string(field) + ": cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Writes `token` to `path` (mode 0600) without ever replacing an existing
// file: written and fsynced under a temporary name, then linked into place,
// which fails if `path` exists.
Status WriteNewTokenFile(const std::string& path, const std::string& token) {
  std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable("admin_token_file: cannot write " + tmp + ": " + std::strerror(errno));
  std::string line = token + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Unavailable("admin_token_file: cannot write " + tmp);
  }
  int rc = ::link(tmp.c_str(), path.c_str());
  int err = errno;
  ::unlink(tmp.c_str());
  if (rc != 0) {
    if (err == EEXIST) return AlreadyExists("admin_token_file: " + path + " exists; it is never overwritten");
    return Unavailable("admin_token_file: cannot create " + path + ": " + std::strerror(err));
  }
  return Status::Ok();
}
}  // namespace

// Decides whether this start may create a market, and how (see server.h).
Status Server::PrepareCreation(MarketCreation* creation) {
  std::string token;
  std::string pending = store_->PendingIdentity();
  const std::string& file = options_.admin_token_file;
  bool replicated = !options_.etcd.empty();
  if (replicated) {
    // Any replica may be the one that creates the market: the one elected
    // first on an empty etcd. It writes its admin-token file then (replacing
    // one left by a replica that prepared a creation and never committed it).
    creation->identity = NewIdentity();
  } else if (!options_.db.empty()) {
    std::string side = SidecarPath(options_.db);
    if (!pending.empty()) {
      // A creation that began (sidecar written) but never committed: nothing
      // was acknowledged. Finish it, with the admin token already written.
      creation->identity = pending;
      if (!file.empty() && Exists(file)) {
        LZ_ASSIGN_OR_RETURN(token, ReadTokenFile(file));
        if (token.rfind("lz_", 0) != 0) return FailedPrecondition("admin_token_file: " + file + " holds no token");
      }
    } else {
      if (!file.empty() && Exists(file)) {
        return FailedPrecondition("db: " + options_.db + " holds no market, but " + file +
                                  " exists: an old market's database (or its write-ahead log) may have been lost. "
                                  "Restore it; to create a new market on purpose, move " + file + " away first");
      }
      creation->identity = NewIdentity();
      LZ_RETURN_IF_ERROR(CreateSidecar(side, creation->identity));
    }
  } else {
    creation->identity = NewIdentity();
  }
  if (token.empty()) {
    token = NewToken();
    if (!file.empty() && !replicated) LZ_RETURN_IF_ERROR(WriteNewTokenFile(file, token));
  }

  std::vector<topology::NodeInfo> nodes;
  if (!options_.cluster_file.empty()) {
    auto spec = topology::LoadClusterYaml(options_.cluster_file);
    if (!spec.ok()) return InvalidArgument("cluster: " + spec.status().message());
    nodes = std::move(spec->nodes);
  }
  creation->actor = nodes.empty() ? "server" : "operator:cluster-file";
  creation->create = [this, token, nodes = std::move(nodes), replicated, file](WriterContext& w) -> Status {
    if (replicated && !file.empty()) {
      ::unlink((file + ".new").c_str());
      LZ_RETURN_IF_ERROR(WriteNewTokenFile(file + ".new", token));
      if (::rename((file + ".new").c_str(), file.c_str()) != 0) {
        return Unavailable("admin_token_file: cannot create " + file + ": " + std::strerror(errno));
      }
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      Status st = w.Apply(market::OpAddNode{nodes[i]}).status;
      if (!st.ok()) return InvalidArgument("cluster: nodes[" + std::to_string(i) + "]: " + st.message());
    }
    TokenRecord t;
    t.id = w.NextTokenId();
    t.hash = HashToken(token);
    t.role = "admin";
    t.name = "admin";
    t.created = WallClockMicros();
    w.PutToken(t);
    admin_token_ = token;
    return Status::Ok();
  };
  return Status::Ok();
}

// --cluster on an existing market: accepted only if the market already has
// every node of the file as the file describes it.
Status Server::CheckClusterFile() {
  auto spec = topology::LoadClusterYaml(options_.cluster_file);
  if (!spec.ok()) return InvalidArgument("cluster: " + spec.status().message());
  Status r = core_->Execute("server", [&](WriterContext& w) -> Status {
    const auto& t = w.engine().topology();
    for (const auto& n : spec->nodes) {
      auto id = t.FindNode(n.name);
      std::string want = n.region + "/" + n.zone + "/" + n.row + "/" + n.rack;
      std::string why;
      if (!id.ok() || !t.IsLiveNode(*id)) {
        why = "is not in the market";
      } else if (t.type_name(t.node(*id).type) != n.type) {
        why = "has type " + std::string(t.type_name(t.node(*id).type)) + " in the market, " + n.type + " in the file";
      } else if (LocationPath(t, *id) != want) {
        why = "is at " + LocationPath(t, *id) + " in the market, " + want + " in the file";
      }
      if (!why.empty()) {
        return FailedPrecondition("cluster: the database already holds a market, and node \"" + n.name + "\" of " +
                                  options_.cluster_file + " " + why +
                                  "; --cluster only seeds a new market. Change the cluster with `laissez nodes "
                                  "add|drain|remove`, or start without --cluster");
      }
    }
    return Status::Ok();
  });
  LZ_RETURN_IF_ERROR(r);
  cluster_note_ = "every node of " + options_.cluster_file + " is already in the market";
  return Status::Ok();
}

Status Server::Start() {
  // Debian builds Abseil without NDEBUG, so every lock of gRPC's mutexes also
  // updates a lock-order graph for deadlock detection, a debugging aid that
  // release builds leave off: about 1-2% of the server's CPU at 50k updates/s
  // (issue 12; docs/PERFORMANCE_LOG.md). Process-wide.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (options_.tls_cert.empty() != options_.tls_key.empty()) {
    return InvalidArgument("tls: give both --tls-cert and --tls-key");
  }
  if (!options_.etcd.empty()) {
    LZ_ASSIGN_OR_RETURN(auto client, etcd::Client::Create(options_.etcd));
    auto store = std::make_unique<EtcdStore>(client, options_.etcd_prefix);
    // Replay and the follower's watch start from one revision.
    LZ_RETURN_IF_ERROR(store->Pin().status());
    etcd_store_ = store.get();
    store_ = std::move(store);
    options_.core.follower = true;
  } else if (options_.db.empty()) {
    store_ = NewMemoryStore();
  } else {
    const bool journal_file = IsJournalFile(options_.db);
    if (options_.store == "sqlite" && journal_file) {
      return FailedPrecondition("store: " + options_.db + " is a journal file: open it with --store journal");
    }
    if (options_.store == "journal" || (options_.store.empty() && journal_file)) {
      LZ_ASSIGN_OR_RETURN(store_, OpenJournalStore(options_.db));
    } else if (options_.store.empty() || options_.store == "sqlite") {
      LZ_ASSIGN_OR_RETURN(store_, OpenSqliteStore(options_.db));
    } else {
      return InvalidArgument("store: '" + options_.store + "' is not a store (sqlite or journal)");
    }
  }
  LZ_ASSIGN_OR_RETURN(std::string identity, store_->Identity());
  LZ_ASSIGN_OR_RETURN(uint64_t last_seq, store_->LastSeq());
  LZ_ASSIGN_OR_RETURN(auto stored_tokens, store_->LoadTokens());
  bool creating = identity.empty() && last_seq == 0 && stored_tokens.empty();
  if (!creating && options_.init) {
    return FailedPrecondition("init: " + (options_.db.empty() ? std::string("the store") : options_.db) +
                              " already holds market " + identity + "; --init only creates a new one");
  }
  MarketCreation creation;
  if (creating) LZ_RETURN_IF_ERROR(PrepareCreation(&creation));
  core_ = std::make_unique<MarketCore>(store_.get(), &tokens_, &metrics_, options_.core);
  LZ_RETURN_IF_ERROR(core_->Start(creation));
  if (!creating && !options_.cluster_file.empty()) {
    Status st = CheckClusterFile();
    if (!st.ok()) {
      core_->Stop();
      return st;
    }
  }

  services_ = std::make_unique<Services>(this);
  grpc::ServerBuilder b;
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options_.tls_cert.empty()) {
    LZ_ASSIGN_OR_RETURN(std::string cert, ReadFile(options_.tls_cert, "tls_cert"));
    LZ_ASSIGN_OR_RETURN(std::string key, ReadFile(options_.tls_key, "tls_key"));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  b.AddListeningPort(options_.listen, creds, &grpc_port_);
  b.SetMaxReceiveMessageSize(options_.max_message_bytes);
  b.RegisterService(&services_->tenant_);
  b.RegisterService(&services_->op_);
  b.RegisterService(&services_->admin_);
  grpc_ = b.BuildAndStart();
  if (!grpc_ || grpc_port_ == 0) {
    core_->Stop();
    return Unavailable("listen: cannot listen on " + options_.listen);
  }

  if (!etcd_store_ && options_.snapshot_every.count() > 0) snapshotter_ = std::thread([this] { SnapshotLoop(); });

  if (etcd_store_) {
    ReplicaOptions ro;
    ro.etcd = options_.etcd;
    ro.prefix = options_.etcd_prefix;
    ro.advertise = options_.advertise.empty() ? "127.0.0.1:" + std::to_string(grpc_port_) : options_.advertise;
    ro.lease_ttl_s = options_.lease_ttl_s;
    ro.snapshot_every = options_.snapshot_every;
    replica_ = std::make_unique<Replica>(ro, etcd_store_, core_.get(), creation);
    if (Status st = replica_->Start(); !st.ok()) {
      grpc_->Shutdown();
      core_->Stop();
      return st;
    }
  }

  if (!options_.http.empty()) {
    HttpLimits limits;
    limits.max_body_bytes = options_.http_max_body_bytes;
    http_ = std::make_unique<HttpServer>(limits);
    InstallHttpRoutes();
    if (options_.http_routes) options_.http_routes(*this);
    LZ_RETURN_IF_ERROR(http_->Start(options_.http));
  }
  return Status::Ok();
}

// /healthz answers anyone (liveness: status and engine time); /metrics needs an
// operator or admin token. Every /api/ request and every request with a body
// is authenticated from its headers, before its body is read, and counted by
// the same rate limiter as gRPC.
void Server::InstallHttpRoutes() {
  auto& r = http_->router();
  r.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    bool has_body = req.has_header("Content-Length") ? req.get_header_value("Content-Length") != "0"
                                                     : req.has_header("Transfer-Encoding");
    bool api = req.path.rfind("/api/", 0) == 0;
    if (!has_body && !api) return httplib::Server::HandlerResponse::Unhandled;
    auto fail = [&](const Status& st, int code) {
      res.status = code;
      res.set_header("Cache-Control", "no-store");
      res.set_content(std::string("{\"error\":\"") + st.message() + "\",\"code\":" +
                          std::to_string(static_cast<int>(st.code())) + "}",
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    };
    auto p = tokens_.Authenticate(req.get_header_value("Authorization"));
    if (!p.ok()) return fail(p.status(), 401);
    if (Status st = Limit(*p); !st.ok()) return fail(st, 429);
    return httplib::Server::HandlerResponse::Unhandled;
  });
  r.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    bool ok = !core_->failed();
    res.status = ok ? 200 : 503;
    res.set_header("Cache-Control", "no-store");
    std::string ha;
    if (replica_) {
      // A replica also says its role, how far it has applied the journal and who leads.
      ha = std::string(",\"role\":\"") + (core_->follower() ? "follower" : "leader") +
           "\",\"applied_seq\":" + std::to_string(core_->applied_seq()) + ",\"leader\":\"" +
           replica_->leader_address() + "\"";
    }
    res.set_content(std::string("{\"status\":\"") + (ok ? "ok" : "failed") +
                        "\",\"engine_time_us\":" + std::to_string(metrics_.engine_time_us.load()) + ha + "}\n",
                    "application/json");
  });
  r.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    auto p = tokens_.Authenticate(req.get_header_value("Authorization"));
    Status st = p.status();
    if (st.ok() && p->role == Role::kTenant) st = PermissionDenied("authorization: /metrics needs an operator or admin token");
    if (st.ok()) st = Limit(*p);
    if (!st.ok()) {
      res.status = st.code() == StatusCode::kUnauthenticated ? 401
                   : st.code() == StatusCode::kPermissionDenied ? 403 : 429;
      res.set_content(st.message() + "\n", "text/plain");
      return;
    }
    res.set_content(metrics_.Render(), "text/plain; version=0.0.4");
  });
}

void Server::SnapshotLoop() {
  uint64_t last = core_->restored_seq();
  std::unique_lock lock(snapshot_mu_);
  while (!snapshot_cv_.wait_for(lock, options_.snapshot_every, [&] { return snapshot_stop_; })) {
    if (core_->applied_seq() <= last || core_->failed()) continue;
    lock.unlock();
    // A failed snapshot costs only a longer replay at the next start.
    auto snap = core_->TakeSnapshot();
    Status st = snap.ok() ? store_->WriteSnapshot(*snap) : snap.status();
    if (st.ok()) last = snap->seq;
    else std::fprintf(stderr, "laissez serve: snapshot: %s\n", st.ToString().c_str());
    lock.lock();
  }
}

void Server::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (snapshotter_.joinable()) {
    {
      std::lock_guard lock(snapshot_mu_);
      snapshot_stop_ = true;
    }
    snapshot_cv_.notify_all();
    snapshotter_.join();
  }
  if (http_) http_->Stop();
  if (grpc_) {
    // Watch streams end within their poll interval once the deadline passes.
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (core_) core_->Stop();
  // A leader that stops revokes its lease (after its last commit), so another
  // replica takes over at once.
  if (replica_) replica_->Stop();
}

void Server::Wait() {
  if (grpc_) grpc_->Wait();
}

}  // namespace laissez::server
