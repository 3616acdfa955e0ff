#include "server/http.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <thread>

namespace laissez::server {

Result<std::pair<std::string, int>> SplitHostPort(const std::string& address, std::string_view field) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument(std::string(field) + ": must be HOST:PORT (got \"" + address + "\")");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  const char* b = address.data() + colon + 1;
  const char* e = address.data() + address.size();
  auto [ptr, ec] = std::from_chars(b, e, port);
  if (ec != std::errc() || ptr != e || port < 0 || port > 65535) {
    return InvalidArgument(std::string(field) + ": port must be 0..65535 (got \"" + address.substr(colon + 1) + "\")");
  }
  return std::make_pair(host, port);
}

HttpServer::HttpServer(HttpLimits limits) : server_(std::make_unique<httplib::Server>()) {
  // httplib serves each connection on a worker thread of this pool; an event
  // stream keeps its worker, so the pool is sized well above the stream bounds
  // (server.h) and /healthz always finds a free worker.
  int workers = std::max(limits.workers, 8);
  server_->new_task_queue = [workers] { return new httplib::ThreadPool(static_cast<size_t>(workers)); };
  server_->set_read_timeout(limits.read_timeout_s, 0);
  server_->set_write_timeout(limits.write_timeout_s, 0);
  server_->set_keep_alive_timeout(limits.keep_alive_s);
  server_->set_payload_max_length(limits.max_body_bytes);
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start(const std::string& address) {
  LZ_ASSIGN_OR_RETURN(auto hp, SplitHostPort(address, "http"));
  if (hp.second == 0) {
    port_ = server_->bind_to_any_port(hp.first);
    if (port_ < 0) return Unavailable("http: cannot bind " + address);
  } else {
    if (!server_->bind_to_port(hp.first, hp.second)) return Unavailable("http: cannot bind " + address);
    port_ = hp.second;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() is a no-op until the listener runs, so a Stop() right
  // after Start() would leave the thread in accept() forever: wait for it.
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server_->is_running()) return Unavailable("http: listener on " + address + " did not start");
  return Status::Ok();
}

void HttpServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

}  // namespace laissez::server
