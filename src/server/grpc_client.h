// The SDK's gRPC transport (target `sdk_grpc`): `sdk::MarketClient` over a
// live LaissezCloud server, and the watch stream that feeds an EconAdapter.
//
// Names and ids: the wire identifies nodes and vertices by name; this client
// keeps a copy of the public topology (GetTopology) to translate the SDK's
// engine ids, refreshing it when it meets an id or name it does not know.
//
// Thread-safety: a GrpcMarketClient is used by one thread (MarketClient's
// contract). Its EventStream runs its own reader thread and is safe to poll
// from the client's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "market/types.h"
#include "sdk/market_client.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc
namespace laissez::v1 {
class WatchRequest;
}

namespace laissez::server {

// The endpoints of a market: one address, or the replicas of a replicated
// market (docs/HA.md), "HOST:PORT,HOST:PORT,...". Calls go to the current
// one; after an UNAVAILABLE the caller may move on (Next) and retry.
class Endpoints {
 public:
  explicit Endpoints(const std::string& list);
  const std::string& current() const { return list_[cur_]; }
  size_t size() const { return list_.size(); }
  // Moves on after `error`: to the leader it names ("leader=HOST:PORT", a
  // follower's refusal), else to the next endpoint.
  void Next(const std::string& error);

 private:
  std::vector<std::string> list_;
  size_t cur_ = 0;
};

// Whether a call that failed with (`code`, `message`) may be sent again to
// another endpoint. Any UNAVAILABLE if the call is `idempotent`: reads,
// updates that set a value (UpdateOrder, SetLimit), and calls that carry an
// idempotency key (every other mutation but IssueToken, when it carries
// `idempotency_key`: a repeat of a committed key is not applied again). Otherwise only an UNAVAILABLE that
// proves the call was not applied: a follower refused it, it never reached a
// server, or the server had stopped before taking it; a leader that died
// while committing gives an ambiguous error, which is returned to the caller.
bool Retryable(int code, const std::string& message, bool idempotent);

// A fresh idempotency key for one logical call ("k-" and 32 hex digits);
// send every retry of that call with the same key.
std::string NewIdempotencyKey();

// How long clients keep failing over before they give up (a new leader is
// normally elected within the lease TTL, 2 s by default).
inline constexpr int kFailoverBudgetMs = 15000;

// A watch stream's position: the last event received (Event.seq, .index), or
// where the stream started. Resuming after it (WatchRequest.resume) loses and
// repeats nothing (docs/HA.md, "Resumable watches").
struct WatchPosition {
  uint64_t seq = 0;
  uint32_t index = 0;
};
// Parses the `laissez-position` metadata or a `--after` flag: "SEQ.INDEX".
Result<WatchPosition> ParseWatchPosition(std::string_view text, std::string_view field);
// A watch request for `vertices`, resuming after `after` if given.
laissez::v1::WatchRequest MakeWatchRequest(const std::vector<std::string>& vertices,
                                           const std::optional<WatchPosition>& after);
// Where a watch stream starts: its `laissez-position` initial metadata, once
// received (none if the stream failed before it was live).
std::optional<WatchPosition> StreamStart(const grpc::ClientContext& ctx);

struct ConnectOptions {
  std::string address;         // "HOST:PORT", or several: "HOST:PORT,HOST:PORT" (replicas).
  std::string token;           // Bearer token.
  std::string tls_ca;          // PEM file of the CA; "" for a plaintext channel.
  int timeout_ms = 10000;      // Per call.
};

// Reads a token file (first line, whitespace trimmed). INVALID_ARGUMENT naming
// `field` if missing or empty.
Result<std::string> ReadTokenFile(const std::string& path, std::string_view field = "token_file");

std::shared_ptr<grpc::Channel> MakeChannel(const ConnectOptions& options);

class GrpcMarketClient final : public sdk::MarketClient {
 public:
  // Connects and learns the tenant's id (GetBalance) and the topology.
  static Result<std::unique_ptr<GrpcMarketClient>> Connect(const ConnectOptions& options);
  ~GrpcMarketClient() override;

  TenantId tenant() const override { return tenant_; }
  // The server's clock: the engine time of the last reply, plus the local time since.
  Micros Now() const override;

  Result<OrderId> PlaceOrder(const market::OrderSpec& spec) override;
  Status UpdateOrder(OrderId order, Price price) override;
  Status CancelOrder(OrderId order) override;
  Status SetLimit(NodeId node, Price limit) override;
  Status Relinquish(NodeId node) override;

  Result<market::VertexQuote> Quote(VertexId vertex, bool with_depth = false) override;
  Result<market::EvictionQuote> GetEvictionQuote(NodeId node) override;
  Result<market::OrderView> GetOrder(OrderId order) override;
  Result<market::TenantView> Me() override;
  Result<Money> Balance() override;

  Result<VertexId> FindVertex(std::string_view name) override;
  Result<sdk::NodeDescription> DescribeNode(NodeId node) override;

  const std::string& tenant_name() const { return tenant_name_; }
  Status RefreshTopology();
  std::string VertexName(VertexId v) const;

  // A watch stream: price changes at `vertices` and this tenant's events,
  // converted to engine events. Poll from the client's thread.
  class EventStream {
   public:
    ~EventStream();
    // Moves the events received so far into `out`, waiting up to `wait_ms` for one.
    // Returns the stream's error once it has ended (OK while it is open).
    Status Poll(std::vector<market::Event>* out, int wait_ms);
    bool open() const { return open_.load(); }
    // The last event received (and handed to Poll), else where the stream started.
    WatchPosition position() const;

   private:
    friend class GrpcMarketClient;
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::atomic<bool> open_{true};
  };
  // Opens the stream and waits until the server has registered it. With
  // `after`, the stream resumes after that position (an old stream's
  // position()): it starts with the events after it, none lost or repeated;
  // its Poll says OUT_OF_RANGE if the server no longer has them all (then
  // re-read state and watch without `after`).
  Result<std::unique_ptr<EventStream>> Watch(const std::vector<std::string>& vertices,
                                             std::optional<WatchPosition> after = std::nullopt);
  // After a stream or call failed with UNAVAILABLE `error`: moves to another
  // endpoint (the leader it names, else the next one). Open a new Watch then,
  // after the old stream's position (docs/HA.md, "Clients").
  void Failover(const std::string& error);

 private:
  struct Impl;
  explicit GrpcMarketClient(std::unique_ptr<Impl> impl);
  Result<std::string> NodeName(NodeId node);

  std::unique_ptr<Impl> impl_;
  TenantId tenant_;
  std::string tenant_name_;
};

}  // namespace laissez::server
