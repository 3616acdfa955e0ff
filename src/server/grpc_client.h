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
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "market/types.h"
#include "sdk/market_client.h"

namespace grpc {
class Channel;
}

namespace laissez::server {

struct ConnectOptions {
  std::string address;         // "HOST:PORT".
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

   private:
    friend class GrpcMarketClient;
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::atomic<bool> open_{true};
  };
  // Opens the stream and waits until the server has registered it.
  Result<std::unique_ptr<EventStream>> Watch(const std::vector<std::string>& vertices);

 private:
  struct Impl;
  explicit GrpcMarketClient(std::unique_ptr<Impl> impl);
  Result<std::string> NodeName(NodeId node);

  std::unique_ptr<Impl> impl_;
  TenantId tenant_;
  std::string tenant_name_;
};

}  // namespace laissez::server
