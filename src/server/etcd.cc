#include "server/etcd.h"

#include <httplib.h>

#include <array>
#include <map>
#include <thread>

namespace laissez::server::etcd {

using nlohmann::json;

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int64_t Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;  // The gateway omits zero values.
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number()) return it->get<int64_t>();
  return 0;
}

Result<KeyValue> ParseKv(const json& j) {
  KeyValue kv;
  LZ_ASSIGN_OR_RETURN(kv.key, Base64Decode(j.value("key", "")));
  LZ_ASSIGN_OR_RETURN(kv.value, Base64Decode(j.value("value", "")));
  kv.create_revision = Int(j, "create_revision");
  kv.mod_revision = Int(j, "mod_revision");
  kv.lease = Int(j, "lease");
  return kv;
}

// One HTTP connection per thread and endpoint (httplib clients are not shared
// between threads).
httplib::Client& Connection(const std::string& endpoint, std::chrono::milliseconds timeout) {
  thread_local std::map<std::string, std::unique_ptr<httplib::Client>> clients;
  auto& c = clients[endpoint];
  if (!c) {
    c = std::make_unique<httplib::Client>("http://" + endpoint);
    c->set_keep_alive(true);
    // Headers and body leave in separate writes: without TCP_NODELAY, Nagle's
    // algorithm and the peer's delayed ACK add ~40 ms to every call.
    c->set_tcp_nodelay(true);
    auto s = timeout.count() / 1000, us = (timeout.count() % 1000) * 1000;
    c->set_connection_timeout(s, us);
    c->set_read_timeout(s, us);
    c->set_write_timeout(s, us);
  }
  return *c;
}
}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kB64[i])] = static_cast<int8_t>(i);
    return t;
  }();
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    if (ch == '=') break;
    int8_t v = table[static_cast<uint8_t>(ch)];
    if (v < 0) return Unavailable("etcd: the gateway sent bad base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // Every key.
}

void Txn::IfCreateRevision(const std::string& key, int64_t rev) {
  compares.push_back({{"target", "CREATE"},
                      {"result", "EQUAL"},
                      {"key", Base64Encode(key)},
                      {"create_revision", std::to_string(rev)}});
}
json Txn::Put(const std::string& key, const std::string& value, int64_t lease) {
  json p = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) p["lease"] = std::to_string(lease);
  return {{"request_put", p}};
}
json Txn::Delete(const std::string& key) { return {{"request_delete_range", {{"key", Base64Encode(key)}}}}; }
json Txn::DeleteRange(const std::string& key, const std::string& range_end) {
  json d = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) d["range_end"] = Base64Encode(range_end);
  return {{"request_delete_range", d}};
}
json Txn::Get(const std::string& key) { return {{"request_range", {{"key", Base64Encode(key)}}}}; }

Result<std::shared_ptr<Client>> Client::Create(const std::string& endpoints,
                                               std::chrono::milliseconds timeout) {
  std::vector<std::string> list;
  size_t start = 0;
  while (start <= endpoints.size()) {
    size_t comma = endpoints.find(',', start);
    if (comma == std::string::npos) comma = endpoints.size();
    std::string e = endpoints.substr(start, comma - start);
    if (e.rfind("http://", 0) == 0) e = e.substr(7);
    while (!e.empty() && e.back() == '/') e.pop_back();
    if (!e.empty()) {
      size_t colon = e.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == e.size()) {
        return InvalidArgument("etcd: \"" + e + "\" is not HOST:PORT");
      }
      list.push_back(e);
    }
    start = comma + 1;
  }
  if (list.empty()) return InvalidArgument("etcd: give at least one endpoint HOST:PORT");
  return std::shared_ptr<Client>(new Client(std::move(list), timeout));
}

Result<json> Client::Call(const std::string& path, const json& body) {
  std::string payload = body.dump();
  std::string last_error;
  // Around the members until one answers or `timeout_` has passed: an etcd
  // election (a member died) takes about one election timeout. Retrying a
  // call that may have been applied is safe for the journal: a chunk's key is
  // its first seq, a token's its id, so a repeat writes the same values to
  // the same keys under the same fence. A repeated campaign or fold fails its
  // compare, and the caller tries again later.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    size_t first = current_.load();
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      size_t idx = (first + k) % endpoints_.size();
      const std::string& ep = endpoints_[idx];
      auto res = Connection(ep, timeout_).Post(path.c_str(), payload, "application/json");
      if (!res) {
        last_error = ep + ": " + httplib::to_string(res.error());
        continue;
      }
      json j = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
      if (res->status == 200 && !j.is_discarded()) {
        current_.store(idx);
        return j;
      }
      std::string msg = j.is_discarded() ? res->body : j.value("message", j.value("error", res->body));
      int code = j.is_discarded() ? 14 : j.value("code", 14);
      // 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED (no leader, timeouts): another member may serve it.
      if (code == 14 || code == 4 || res->status >= 500) {
        last_error = ep + ": " + msg;
        continue;
      }
      if (code == 11) return OutOfRange("etcd: " + msg);
      return Unavailable("etcd: " + path + ": " + msg);
    }
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Unavailable("etcd: no member answered " + path + " (" + last_error + ")");
}

Result<RangeResult> Client::Range(const std::string& key, const std::string& range_end, int64_t revision,
                                  int64_t limit, Sort sort, bool keys_only) {
  json body = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) body["range_end"] = Base64Encode(range_end);
  if (revision > 0) body["revision"] = std::to_string(revision);
  if (limit > 0) body["limit"] = std::to_string(limit);
  if (sort == Sort::kCreateAscend) {
    body["sort_target"] = "CREATE";
    body["sort_order"] = "ASCEND";
  } else if (sort == Sort::kKeyDescend) {
    body["sort_target"] = "KEY";
    body["sort_order"] = "DESCEND";
  }
  if (keys_only) body["keys_only"] = true;
  LZ_ASSIGN_OR_RETURN(json j, Call("/v3/kv/range", body));
  RangeResult r;
  r.revision = Int(j.value("header", json::object()), "revision");
  r.more = j.value("more", false);
  for (const auto& kv : j.value("kvs", json::array())) {
    LZ_ASSIGN_OR_RETURN(KeyValue v, ParseKv(kv));
    r.kvs.push_back(std::move(v));
  }
  return r;
}

Result<int64_t> Client::Put(const std::string& key, const std::string& value, int64_t lease) {
  json body = Txn::Put(key, value, lease)["request_put"];
  LZ_ASSIGN_OR_RETURN(json j, Call("/v3/kv/put", body));
  return Int(j.value("header", json::object()), "revision");
}

Result<TxnResult> Client::Commit(const Txn& txn) {
  json body = {{"compare", txn.compares}, {"success", txn.success}, {"failure", txn.failure}};
  LZ_ASSIGN_OR_RETURN(json j, Call("/v3/kv/txn", body));
  TxnResult r;
  r.succeeded = j.value("succeeded", false);
  r.revision = Int(j.value("header", json::object()), "revision");
  r.responses = j.value("responses", json::array());
  return r;
}

Status Client::Compact(int64_t revision) {
  auto r = Call("/v3/kv/compaction", {{"revision", std::to_string(revision)}});
  if (!r.ok() && r.status().code() != StatusCode::kOutOfRange) return r.status();
  return Status::Ok();  // Already compacted that far: nothing to do.
}

Result<int64_t> Client::LeaseGrant(int64_t ttl_seconds) {
  LZ_ASSIGN_OR_RETURN(json j, Call("/v3/lease/grant", {{"TTL", std::to_string(ttl_seconds)}}));
  int64_t id = Int(j, "ID");
  if (id == 0) return Unavailable("etcd: lease grant returned no id: " + j.value("error", std::string()));
  return id;
}

Result<int64_t> Client::LeaseKeepAlive(int64_t id) {
  LZ_ASSIGN_OR_RETURN(json j, Call("/v3/lease/keepalive", {{"ID", std::to_string(id)}}));
  if (j.contains("error"))
    return Unavailable("etcd: keepalive: " + j["error"].value("message", std::string()));
  return Int(j.value("result", json::object()), "TTL");
}

Status Client::LeaseRevoke(int64_t id) {
  auto r = Call("/v3/lease/revoke", {{"ID", std::to_string(id)}});
  return r.status();
}

Status Client::Watch(const std::string& key, const std::string& range_end, int64_t start_revision,
                     const std::function<bool(const std::vector<WatchEvent>&, int64_t)>& fn,
                     const std::atomic<bool>* stop, std::chrono::milliseconds poll) {
  int64_t next = start_revision;
  std::string last_error;
  int failures = 0;
  while (!(stop && stop->load())) {
    const std::string& ep = endpoints_[current_.load() % endpoints_.size()];
    httplib::Client cli("http://" + ep);
    cli.set_tcp_nodelay(true);
    cli.set_connection_timeout(timeout_.count() / 1000, (timeout_.count() % 1000) * 1000);
    // An idle stream times out after `poll`: check `stop`, then watch again from `next`.
    cli.set_read_timeout(poll.count() / 1000, (poll.count() % 1000) * 1000);
    json create = {{"key", Base64Encode(key)}, {"start_revision", std::to_string(next)}};
    if (!range_end.empty()) create["range_end"] = Base64Encode(range_end);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v3/watch";
    req.body = json{{"create_request", create}}.dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    Status result = Status::Ok();
    bool done = false, got_data = false;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) -> bool {
      got_data = true;
      buf.append(data, len);
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        if (line.empty()) continue;
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) {
          result = Unavailable("etcd: watch: " + j["error"].value("message", std::string()));
          return false;
        }
        const json& r = j.value("result", json::object());
        if (Int(r, "compact_revision") > 0 && r.value("canceled", false)) {
          result =
              OutOfRange("etcd: watch: revision " + std::to_string(next) + " was compacted (oldest kept " +
                         std::to_string(Int(r, "compact_revision")) + ")");
          done = true;
          return false;
        }
        std::vector<WatchEvent> events;
        for (const auto& e : r.value("events", json::array())) {
          WatchEvent we;
          we.deleted = e.value("type", "PUT") == "DELETE";
          auto kv = ParseKv(e.value("kv", json::object()));
          if (!kv.ok()) {
            result = kv.status();
            return false;
          }
          we.kv = std::move(*kv);
          next = std::max(next, we.kv.mod_revision + 1);
          events.push_back(std::move(we));
        }
        int64_t rev = Int(r.value("header", json::object()), "revision");
        if (!events.empty() || rev > 0) {
          if (!fn(events, rev)) {
            done = true;
            return false;
          }
        }
      }
      return !(stop && stop->load());
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    cli.send(req, res, err);
    if (done || !result.ok()) return result;
    if (err == httplib::Error::Read || err == httplib::Error::Canceled || got_data) {
      failures = 0;
      continue;  // Idle timeout or a stream that ran: watch again from `next`.
    }
    last_error = ep + ": " + httplib::to_string(err);
    current_.store((current_.load() + 1) % endpoints_.size());
    if (++failures >= static_cast<int>(endpoints_.size())) {
      return Unavailable("etcd: watch: no member reachable (" + last_error + ")");
    }
  }
  return Status::Ok();
}

}  // namespace laissez::server::etcd
