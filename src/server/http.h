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

class HttpServer {
 public:
  HttpServer();
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
