// EtcdClient: the subset of etcd's v3 API the replicated market needs (KV
// range/put/txn/compact, leases, watch), spoken through etcd's JSON gateway
// (grpc-gateway, `/v3/...` on the client URL) with the HTTP library the
// server already uses. Why the gateway and not gRPC: it needs no copy of
// etcd's .proto files (Debian ships none for C++), no generated code, and the
// same endpoints work in etcd 3.4 and later; the cost is JSON and base64 on
// every call (docs/HA.md, "Talking to etcd").
//
// Endpoints: several "HOST:PORT" (comma-separated). A call goes to the
// current endpoint; on a connection error, or an answer that says the member
// cannot serve it (no leader, timeouts), it moves to the next one and retries,
// going around the list until the call's timeout has passed. Every error is
// UNAVAILABLE with "etcd: ..." (OUT_OF_RANGE for a compacted revision).
//
// Thread-safety: every method may be called from any thread; each thread
// keeps its own HTTP connections.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace laissez::server::etcd {

std::string Base64Encode(std::string_view in);
Result<std::string> Base64Decode(std::string_view in);
// The range end that covers every key starting with `prefix`.
std::string PrefixEnd(const std::string& prefix);

enum class Sort { kNone, kCreateAscend, kKeyDescend };

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // The store's revision the range was read at.
  bool more = false;
};

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;
};

// A transaction: all `compares` hold -> `success` ops, else `failure` ops.
// Ops are JSON objects of the gateway ({"request_put": {...}}...); use the helpers.
struct Txn {
  nlohmann::json compares = nlohmann::json::array();
  nlohmann::json success = nlohmann::json::array();
  nlohmann::json failure = nlohmann::json::array();
  // Compare: the key's create revision equals `rev` (0: the key is absent).
  void IfCreateRevision(const std::string& key, int64_t rev);
  static nlohmann::json Put(const std::string& key, const std::string& value, int64_t lease = 0);
  static nlohmann::json Delete(const std::string& key);
  // Deletes [key, range_end); an empty range_end deletes `key` alone.
  static nlohmann::json DeleteRange(const std::string& key, const std::string& range_end);
  static nlohmann::json Get(const std::string& key);
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  nlohmann::json responses;  // As the gateway returned them.
};

class Client {
 public:
  // INVALID_ARGUMENT naming "etcd" if `endpoints` is empty or malformed. No call is made.
  static Result<std::shared_ptr<Client>> Create(
      const std::string& endpoints, std::chrono::milliseconds timeout = std::chrono::milliseconds(3000));

  Result<RangeResult> Range(const std::string& key, const std::string& range_end = "", int64_t revision = 0,
                            int64_t limit = 0, Sort sort = Sort::kNone, bool keys_only = false);
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Result<TxnResult> Commit(const Txn& txn);
  Status Compact(int64_t revision);
  Result<int64_t> LeaseGrant(int64_t ttl_seconds);
  // The lease's remaining TTL after the renewal; 0 when the lease is gone.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  Status LeaseRevoke(int64_t id);

  // Watches [key, range_end) from `start_revision`, calling `fn` with each
  // response's events and header revision, until `fn` returns false, `stop`
  // turns true (checked at least every `poll`), or the stream fails. Returns
  // OK when stopped; OUT_OF_RANGE if `start_revision` was compacted away;
  // UNAVAILABLE if the stream broke (watch again from the last revision seen).
  Status Watch(const std::string& key, const std::string& range_end, int64_t start_revision,
               const std::function<bool(const std::vector<WatchEvent>&, int64_t revision)>& fn,
               const std::atomic<bool>* stop,
               std::chrono::milliseconds poll = std::chrono::milliseconds(500));

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  Client(std::vector<std::string> endpoints, std::chrono::milliseconds timeout)
      : endpoints_(std::move(endpoints)), timeout_(timeout) {}
  Result<nlohmann::json> Call(const std::string& path, const nlohmann::json& body);

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds timeout_;
  std::atomic<size_t> current_{0};
};

}  // namespace laissez::server::etcd
