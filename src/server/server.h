// Server: the LaissezCloud control plane. It owns the durable store, the
// market core (engine + writer thread + group commit), the gRPC services
// (proto/laissez/v1/market.proto) and the HTTP listener.
//
// Protobuf types stop here: server.cc converts and validates requests at the
// edge and hands plain engine values to the core.
//
// Lifecycle: construct, Start, then Wait (or Shutdown from another thread).
// On the first start with an empty store, Start creates the market in one
// transaction: its identity, an admin token (written first to
// `admin_token_file`, mode 0600, never over an existing file) and the nodes of
// `cluster_file`. It refuses to create a market where there are signs of an
// old one (an admin-token file, or a sidecar that says commits were made):
// a lost or damaged database is an error, never a silent new market.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/auth.h"
#include "server/http.h"
#include "server/market_core.h"
#include "server/metrics.h"
#include "server/replica.h"
#include "server/store.h"

namespace grpc {
class Channel;
class Server;
}

namespace laissez::server {

struct ServerOptions {
  // The database file; "" or ":memory:" uses the in-memory store (tests).
  std::string db;
  // Which store keeps `db`: "sqlite" (SQLite, WAL) or "journal" (the
  // journal file, OpenJournalStore). "" takes the kind of an existing file,
  // and SQLite for a new one. A kind that is not the existing file's is
  // refused by name.
  std::string store;
  std::string listen = "127.0.0.1:50051";  // gRPC; port 0 picks a free port.
  std::string http;                        // "HOST:PORT" for /healthz and /metrics; "" for none.
  std::string tls_cert, tls_key;           // PEM files; both or neither.
  // Where a new database's admin token goes; default "<db>.admin-token".
  std::string admin_token_file;
  // Create a new market and refuse to start on an existing one.
  bool init = false;
  // Cluster YAML: the nodes of a new market, added in its creating
  // transaction. On an existing market every node of the file must already be
  // there with the same type and location, or Start refuses (FAILED_PRECONDITION
  // naming the node): the file is never silently ignored.
  std::string cluster_file;
  // Requests per second per tenant (per token for operators and admins),
  // counted across gRPC and HTTP together; 0 turns limiting off.
  double rate_limit = 5000;
  double rate_burst = 10000;
  // Open gRPC streams (Watch, Operator.Watch, StreamUpdates) per token.
  int grpc_streams_per_token = 16;
  // HTTP bounds (docs/SERVER.md, "Threat model and limits").
  int http_streams_per_token = 4;     // Open /api/v1/events streams per token.
  int http_streams_total = 32;        // ... and over all tokens.
  size_t http_max_body_bytes = 64 << 10;
  int max_message_bytes = 1 << 20;  // Larger requests are refused (RESOURCE_EXHAUSTED).
  CoreOptions core;
  // A replicated market (docs/HA.md): etcd endpoints "HOST:PORT,..."; the
  // journal lives in etcd under `etcd_prefix` and `db` is not used. This
  // server is one replica: a follower until it wins the election.
  std::string etcd;
  std::string etcd_prefix = "/laissez/";
  std::string advertise;  // The gRPC address clients reach this replica at; default 127.0.0.1:PORT.
  int lease_ttl_s = 2;
  // How often a snapshot of the market is written (docs/HA.md, "Snapshots and
  // compaction"), if the journal moved on since the last one: by the leader to
  // etcd (which then drops the journal keys it covers), or to the SQLite
  // database (which keeps its whole journal; a restart replays only the tail).
  // 0: never (SQLite only; a replicated market always snapshots).
  std::chrono::milliseconds snapshot_every{10000};
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
  // One rate limiter for both doors (gRPC and HTTP): RESOURCE_EXHAUSTED
  // ("rate limit: ...") when `p` is over its rate.
  Status Limit(const Principal& p);
  // A channel to this server's own gRPC services that needs no network and no
  // TLS (the dashboard's controls use it). Valid after Start.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // What Start found about --cluster on an existing market ("" if nothing).
  const std::string& cluster_note() const { return cluster_note_; }

  // The admin token created by this Start on a fresh store ("" otherwise).
  const std::string& admin_token() const { return admin_token_; }
  const std::string& admin_token_file() const { return options_.admin_token_file; }
  bool fresh() const { return core_ && core_->fresh(); }

  const ServerOptions& options() const { return options_; }
  MarketCore& core() { return *core_; }
  Metrics& metrics() { return metrics_; }
  TokenTable& tokens() { return tokens_; }
  Store& store() { return *store_; }
  // Null when no --http was given. Add routes before Start.
  HttpServer* http() { return http_.get(); }
  // Replicated market: null without --etcd.
  Replica* replica() { return replica_.get(); }
  // True when this replica must start over (replica.h): shut it down and start a new Server.
  bool replica_lost() const { return replica_ && (replica_->lost() || core_->failed()); }

 private:
  class Services;
  Status PrepareCreation(MarketCreation* creation);
  Status CheckClusterFile();
  void InstallHttpRoutes();
  // The single-process store's snapshot thread (not with --etcd: the leader's loop does it there).
  void SnapshotLoop();

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
  std::string cluster_note_;
  std::unique_ptr<RateLimiter> limiter_;
  EtcdStore* etcd_store_ = nullptr;
  std::unique_ptr<Replica> replica_;
  bool shut_down_ = false;
  std::mutex snapshot_mu_;
  std::condition_variable snapshot_cv_;
  bool snapshot_stop_ = false;
  std::thread snapshotter_;
};

}  // namespace laissez::server
