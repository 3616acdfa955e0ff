// Server: the LaissezCloud control plane. It owns the durable store, the
// market core (engine + writer thread + group commit), the gRPC services
// (proto/laissez/v1/market.proto) and the HTTP listener.
//
// Protobuf types stop here: server.cc converts and validates requests at the
// edge and hands plain engine values to the core.
//
// Lifecycle: construct, Start, then Wait (or Shutdown from another thread).
// On the first start with an empty store, Start creates an admin token and,
// when `admin_token_file` is set, writes it there (mode 0600).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/auth.h"
#include "server/http.h"
#include "server/market_core.h"
#include "server/metrics.h"
#include "server/store.h"

namespace grpc {
class Server;
}

namespace laissez::server {

struct ServerOptions {
  // SQLite database file; "" or ":memory:" uses the in-memory store (tests).
  std::string db;
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks a free port.
  std::string http;                        // "HOST:PORT" for /healthz and /metrics; "" for none.
  std::string tls_cert, tls_key;           // PEM files; both or neither.
  // Where a new database's admin token goes; default "<db>.admin-token".
  std::string admin_token_file;
  double rate_limit = 5000;  // Requests per second per tenant; 0 turns limiting off.
  double rate_burst = 10000;
  int max_message_bytes = 1 << 20;  // Larger requests are refused (RESOURCE_EXHAUSTED).
  CoreOptions core;
  // Adds routes to the HTTP listener before it starts (the dashboard, issue 6).
  std::function<void(class Server&)> http_routes;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Status Start();
  // Stops accepting calls, ends watch streams, commits what was accepted.
  void Shutdown();
  // Blocks until Shutdown.
  void Wait();

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_ ? http_->port() : 0; }
  // The admin token created by this Start on a fresh store ("" otherwise).
  const std::string& admin_token() const { return admin_token_; }
  const std::string& admin_token_file() const { return options_.admin_token_file; }
  bool fresh() const { return core_ && core_->fresh(); }

  MarketCore& core() { return *core_; }
  Metrics& metrics() { return metrics_; }
  TokenTable& tokens() { return tokens_; }
  Store& store() { return *store_; }
  // Null when no --http was given. Add routes before Start.
  HttpServer* http() { return http_.get(); }

 private:
  class Services;
  Status CreateAdminToken();

  ServerOptions options_;
  Metrics metrics_;
  TokenTable tokens_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<MarketCore> core_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<HttpServer> http_;
  int grpc_port_ = 0;
  std::string admin_token_;
  bool shut_down_ = false;
};

}  // namespace laissez::server
