// HttpServer: the `--http` listener. It serves `/healthz` and `/metrics` and is
// the place where later features (the dashboard of issue 6, its event stream)
// add their routes: `router()` is a cpp-httplib server whose routes can be
// registered before `Start`.
//
// Thread-safety: register routes before Start; handlers run on httplib's
// worker threads and must be thread-safe.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace httplib {
class Server;
}

namespace laissez::server {

// Resource bounds of the listener (docs/SERVER.md, "Threat model and limits").
struct HttpLimits {
  int workers = 64;                      // Connections served at once; more wait for a worker.
  int read_timeout_s = 5;                // A request that sends nothing for this long is dropped.
  int write_timeout_s = 5;               // A client that reads nothing for this long is dropped.
  int keep_alive_s = 2;                  // Idle keep-alive connections close after this.
  size_t max_body_bytes = 64 << 10;      // Larger bodies get 413 before they are read.
};

class HttpServer {
 public:
  explicit HttpServer(HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  httplib::Server& router() { return *server_; }

  // Binds "HOST:PORT" (port 0: any free port) and serves on a background thread.
  Status Start(const std::string& address);
  void Stop();
  int port() const { return port_; }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// Splits "HOST:PORT" ("[::1]:80" too). INVALID_ARGUMENT naming `field` otherwise.
Result<std::pair<std::string, int>> SplitHostPort(const std::string& address, std::string_view field);

}  // namespace laissez::server
