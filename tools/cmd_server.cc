// The control plane's commands: `serve`; tenant commands (bid, update, cancel,
// retain, release, quote, eviction-quote, watch, balance, orders, holdings,
// ledger); operator commands (nodes add/drain/remove/list, floor set/remove,
// powercap set/adaptive/set-cap, carbon budget/set-budget, volatility set/show, audit); admin commands (tenant create /
// deposit, token issue/revoke); `agent`; `bench server`; `demo live`.
//
// Client commands talk to a server over gRPC: `--server HOST:PORT` (or
// $LAISSEZ_SERVER), `--token-file FILE` (or $LAISSEZ_TOKEN_FILE). Prices and
// money are decimal units on the command line ("12.5" = 12.5 per hour) and
// exact micro-units in `--json` output.
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/money.h"
#include "common/time_format.h"
#include "laissez/v1/market.grpc.pb.h"
#include "server/agent.h"
#include "server/etcd.h"
#include "server/grpc_client.h"
#include "server/live_demo.h"
#include "server/server.h"
#ifdef LAISSEZ_HAVE_DASHBOARD
#include "server/dashboard/dashboard.h"  // The dashboard on --http (docs/DASHBOARD.md).
#endif
#include "tools/commands.h"
#include "topology/cluster_yaml.h"

namespace laissez::cli {

namespace {
namespace pb = ::laissez::v1;
namespace gp = ::google::protobuf;
using nlohmann::json;

// ---------------------------------------------------------------------------
// Output: one JSON document with --json (int64 as numbers, micro-units), or
// human text with money in units and times in ISO-8601.

bool IsMoneyField(const std::string& n) {
  static const char* kNames[] = {"price", "effective_price", "limit", "quote", "competing", "floor", "obtain",
                                 "pays", "balance", "available", "max_rate", "committed_rate", "spend_rate",
                                 "paid", "waived", "amount", "rate", "deposited", "tenant_balances",
                                 "operator_revenue", "unsettled"};
  return std::find(std::begin(kNames), std::end(kNames), n) != std::end(kNames);
}
bool IsTimeField(const std::string& n) {
  return n == "time" || n == "from" || n == "deadline" || n == "held_since" || n == "now";
}

std::string FormatTime(int64_t us) { return FormatIsoTime(us); }

json FieldJson(const gp::Message& m, const gp::FieldDescriptor* f, int index);

json ToJson(const gp::Message& m) {
  json out = json::object();
  const gp::Descriptor* d = m.GetDescriptor();
  const gp::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const gp::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      json arr = json::array();
      for (int j = 0; j < r->FieldSize(m, f); ++j) arr.push_back(FieldJson(m, f, j));
      out[f->name()] = arr;
    } else {
      out[f->name()] = FieldJson(m, f, -1);
    }
  }
  return out;
}

json FieldJson(const gp::Message& m, const gp::FieldDescriptor* f, int i) {
  const gp::Reflection* r = m.GetReflection();
  bool rep = i >= 0;
  switch (f->cpp_type()) {
    case gp::FieldDescriptor::CPPTYPE_INT32: return rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f);
    case gp::FieldDescriptor::CPPTYPE_INT64: return rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f);
    case gp::FieldDescriptor::CPPTYPE_UINT32: return rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f);
    case gp::FieldDescriptor::CPPTYPE_UINT64: return rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f);
    case gp::FieldDescriptor::CPPTYPE_BOOL: return rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f);
    case gp::FieldDescriptor::CPPTYPE_STRING: return rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
    case gp::FieldDescriptor::CPPTYPE_ENUM:
      return std::string(rep ? r->GetRepeatedEnum(m, f, i)->name() : r->GetEnum(m, f)->name());
    case gp::FieldDescriptor::CPPTYPE_MESSAGE:
      return ToJson(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
    default: return nullptr;
  }
}

std::string Human(const std::string& name, const json& v) {
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return v.dump();
    if (IsMoneyField(name)) return FormatMoney(x);
    if (IsTimeField(name)) return FormatTime(x);
    if (x == UINT32_MAX && name.size() > 3 && name.substr(name.size() - 3) == "_id") return "-";
    return std::to_string(x);
  }
  if (v.is_string()) return v.get<std::string>().empty() ? "-" : v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.dump();
}

void PrintTable(const json& rows) {
  if (rows.empty()) {
    std::cout << "(none)\n";
    return;
  }
  std::vector<std::string> cols;
  for (auto it = rows[0].begin(); it != rows[0].end(); ++it) {
    if (!it->is_array() && !it->is_object()) cols.push_back(it.key());
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width;
  for (const auto& c : cols) width.push_back(c.size());
  for (const auto& row : rows) {
    std::vector<std::string> line;
    for (size_t i = 0; i < cols.size(); ++i) {
      line.push_back(Human(cols[i], row[cols[i]]));
      width[i] = std::max(width[i], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  for (size_t i = 0; i < cols.size(); ++i) std::printf("%-*s  ", static_cast<int>(width[i]), cols[i].c_str());
  std::printf("\n");
  for (const auto& line : cells) {
    for (size_t i = 0; i < cols.size(); ++i) std::printf("%-*s  ", static_cast<int>(width[i]), line[i].c_str());
    std::printf("\n");
  }
}

void PrintHuman(const json& j, const std::string& indent = "") {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_array()) {
      if (!it->empty() && (*it)[0].is_object()) {
        std::cout << indent << it.key() << ":\n";
        PrintTable(*it);
      } else if (!it->empty()) {
        std::cout << indent << it.key() << ": " << it->dump() << "\n";
      }
    } else if (it->is_object()) {
      std::cout << indent << it.key() << ":\n";
      PrintHuman(*it, indent + "  ");
    } else {
      std::cout << indent << it.key() << ": " << Human(it.key(), *it) << "\n";
    }
  }
}

const char* CodeName(int code) {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                 "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kCodes[code] : "UNKNOWN";
}

// Reports an error: stderr always; with --json also one JSON document on stdout.
int Fail(bool as_json, int code, const std::string& message) {
  std::fprintf(stderr, "laissez: %s: %s\n", CodeName(code), message.c_str());
  if (as_json) std::cout << json{{"error", {{"code", CodeName(code)}, {"message", message}}}}.dump() << "\n";
  return code == 3 ? 2 : 1;
}
int Fail(bool as_json, const Status& s) { return Fail(as_json, static_cast<int>(s.code()), s.message()); }

// ---------------------------------------------------------------------------
// Client plumbing.

struct ClientFlags {
  std::string server;
  std::string token_file;
  std::string tls_ca;
  bool json = false;
};

void AddClientFlags(CLI::App* c, ClientFlags* f) {
  const char* env_server = std::getenv("LAISSEZ_SERVER");
  const char* env_token = std::getenv("LAISSEZ_TOKEN_FILE");
  f->server = env_server ? env_server : "127.0.0.1:50051";
  f->token_file = env_token ? env_token : "";
  c->add_option("--server", f->server,
                "Server address HOST:PORT, or the replicas of a replicated market HOST:PORT,HOST:PORT,... "
                "(calls move to the leader; docs/HA.md) (default $LAISSEZ_SERVER or 127.0.0.1:50051)");
  c->add_option("--token-file", f->token_file, "File holding the bearer token (default $LAISSEZ_TOKEN_FILE)");
  c->add_option("--tls-ca", f->tls_ca, "CA certificate (PEM) for a TLS server");
  c->add_flag("--json", f->json, "Print one JSON document (micro-units, microsecond times)");
}

// --idempotency-key of a call that is not an absolute set (docs/SERVER.md,
// "Idempotency keys"): the call goes out with `*key`, or a fresh key, and
// every retry after UNAVAILABLE carries the same one, so it applies once.
void AddKeyFlag(CLI::App* c, std::string* key) {
  c->add_option("--idempotency-key", *key,
                "An idempotency key for this call (default: a fresh one; every retry after UNAVAILABLE uses it). "
                "Give the key of an earlier call whose outcome you do not know to get its result without applying "
                "it twice");
}
std::string KeyOrNew(const std::string& key) { return key.empty() ? server::NewIdempotencyKey() : key; }

// --server may list several replicas of a replicated market (docs/HA.md):
// calls go to one, and move to the leader after an UNAVAILABLE that Retryable
// allows (grpc_client.h).
class Client {
 public:
  explicit Client(const ClientFlags& f) : flags_(f), endpoints_(f.server) {}
  Status Open() {
    LZ_ASSIGN_OR_RETURN(token_, server::ReadTokenFile(flags_.token_file, "token-file"));
    Dial();
    return Status::Ok();
  }
  // After a failed call: true, with the stubs on another endpoint, if the
  // call may be sent again and the failover budget is not spent.
  bool Failover(const grpc::Status& g, bool idempotent) {
    if (!server::Retryable(g.error_code(), g.error_message(), idempotent)) return false;
    auto now = std::chrono::steady_clock::now();
    if (first_failure_ == std::chrono::steady_clock::time_point()) first_failure_ = now;
    if (now - first_failure_ > std::chrono::milliseconds(server::kFailoverBudgetMs)) return false;
    endpoints_.Next(g.error_message());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Dial();
    return true;
  }
  // After a call or stream that worked: the failover budget starts again.
  void Succeeded() { first_failure_ = {}; }
  const std::string& address() const { return endpoints_.current(); }
  std::unique_ptr<grpc::ClientContext> Ctx(int timeout_s = 30) const {
    auto c = std::make_unique<grpc::ClientContext>();
    c->AddMetadata("authorization", "Bearer " + token_);
    if (timeout_s > 0) c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    return c;
  }
  const std::string& token() const { return token_; }

  std::unique_ptr<pb::TenantService::Stub> tenant;
  std::unique_ptr<pb::OperatorService::Stub> op;
  std::unique_ptr<pb::AdminService::Stub> admin;

 private:
  void Dial() {
    server::ConnectOptions o;
    o.address = endpoints_.current();
    o.token = token_;
    o.tls_ca = flags_.tls_ca;
    auto ch = server::MakeChannel(o);
    tenant = pb::TenantService::NewStub(ch);
    op = pb::OperatorService::NewStub(ch);
    admin = pb::AdminService::NewStub(ch);
  }
  ClientFlags flags_;
  server::Endpoints endpoints_;
  std::string token_;
  std::chrono::steady_clock::time_point first_failure_{};
};

// Runs one unary call: opens the client, builds the request, prints the reply.
template <typename Resp>
int RunCall(const ClientFlags& f, const std::function<Status()>& prepare,
            const std::function<grpc::Status(Client&, Resp*)>& call,
            const std::function<void(const Resp&)>& human = nullptr, bool idempotent = false) {
  if (prepare) {
    Status st = prepare();
    if (!st.ok()) return Fail(f.json, st);
  }
  Client c(f);
  Status st = c.Open();
  if (!st.ok()) return Fail(f.json, st);
  Resp resp;
  grpc::Status g = call(c, &resp);
  while (!g.ok() && c.Failover(g, idempotent)) {
    resp.Clear();
    g = call(c, &resp);
  }
  if (!g.ok()) return Fail(f.json, g.error_code(), g.error_message());
  if (f.json) {
    std::cout << ToJson(resp).dump() << "\n";
  } else if (human) {
    human(resp);
  } else {
    json j = ToJson(resp);
    if (j.empty()) std::cout << "ok\n";
    else PrintHuman(j);
  }
  return 0;
}

Status ParsePriceFlag(const std::string& text, std::string_view field, int64_t* out) {
  LZ_ASSIGN_OR_RETURN(*out, ParseMoney(text, field));
  return Status::Ok();
}

// The controller flags of `powercap adaptive` and `carbon budget`
// (docs/MECHANISM.md): prices in units like every price flag, the interval as
// a duration. `value` names what the controller sets ("floor" or "price").
struct ControlFlags {
  std::string value;
  std::string interval = "60s", rise_min, rise_max, fall_step = "0", min_value = "0", max_value = "inf";
  int64_t margin_ppm = 0, band_ppm = 0, rise_ppm = 0;

  void Add(CLI::App* cmd, const std::string& what, const std::string& unit) {
    cmd->add_option("--margin-ppm", margin_ppm, "Target T = cap x (1 - margin), margin in ppm (default 0)");
    cmd->add_option("--band-ppm", band_ppm, "Hold band below the target, ppm of the cap (default 0)");
    cmd->add_option("--interval", interval, "Control interval, at least 1s (default 60s)");
    cmd->add_option("--rise-ppm", rise_ppm, "Multiplicative part of a rise, ppm of the " + what + " (default 0)");
    cmd->add_option("--rise-min", rise_min, "Smallest rise per interval, " + unit + " (> 0)")->required();
    cmd->add_option("--rise-max", rise_max, "Largest rise per interval, " + unit + " (>= --rise-min)")->required();
    cmd->add_option("--fall-step", fall_step, "Most the " + what + " falls per interval, " + unit + " (default 0: never)");
    cmd->add_option("--min-" + value, min_value, "Starting and lowest " + what + ", " + unit + " (default 0)");
    cmd->add_option("--max-" + value, max_value, "Highest " + what + ", " + unit + ", or inf (default inf)");
  }
  // Fills the request's controller fields; the min and max go to the
  // request's own setters.
  template <typename Request>
  Status Fill(Request* q, void (Request::*set_min)(int64_t), void (Request::*set_max)(int64_t)) const {
    q->set_margin_ppm(margin_ppm);
    q->set_band_ppm(band_ppm);
    q->set_rise_ppm(rise_ppm);
    LZ_ASSIGN_OR_RETURN(Micros iv, ParseDuration(interval, "interval"));
    q->set_interval_us(iv);
    int64_t p = 0;
    LZ_RETURN_IF_ERROR(ParsePriceFlag(rise_min, "rise-min", &p));
    q->set_rise_min(p);
    LZ_RETURN_IF_ERROR(ParsePriceFlag(rise_max, "rise-max", &p));
    q->set_rise_max(p);
    LZ_RETURN_IF_ERROR(ParsePriceFlag(fall_step, "fall-step", &p));
    q->set_fall_step(p);
    LZ_RETURN_IF_ERROR(ParsePriceFlag(min_value, "min-" + value, &p));
    (q->*set_min)(p);
    if (max_value == "inf") {
      p = kInfPrice;
    } else {
      LZ_RETURN_IF_ERROR(ParsePriceFlag(max_value, "max-" + value, &p));
    }
    (q->*set_max)(p);
    return Status::Ok();
  }
};

Result<pb::Locality> ParseLocalityFlag(const std::string& text) {
  LZ_ASSIGN_OR_RETURN(market::Locality l, market::ParseLocality(text, "locality"));
  return static_cast<pb::Locality>(static_cast<int>(l));
}

// ---------------------------------------------------------------------------
// serve

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// One replica of a replicated market (docs/HA.md): whenever the replica must
// start over (it lost its lease or its fence, or its tail was compacted away)
// the server is shut down and started again, as a follower that catches up
// from etcd; while etcd cannot be reached, it retries twice a second.
// How Start recovered: "journal replayed N records" or, from a snapshot, "restored
// the snapshot at seq S, then replayed N journal records". The ha tests read it.
std::string RecoveryNote(server::MarketCore& core) {
  std::string replayed = std::to_string(core.replayed());
  if (core.restored_seq() == 0) return "journal replayed " + replayed + " records";
  return "restored the snapshot at seq " + std::to_string(core.restored_seq()) + ", then replayed " + replayed +
         " journal records";
}

int RunReplica(server::ServerOptions o) {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::string last_error;
  while (!g_stop) {
    server::Server s(o);
    Status st = s.Start();
    if (!st.ok()) {
      if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kFailedPrecondition) {
        std::fprintf(stderr, "laissez serve: %s\n", st.ToString().c_str());
        return 1;
      }
      if (st.message() != last_error) std::fprintf(stderr, "laissez serve: %s; retrying\n", st.ToString().c_str());
      last_error = st.message();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    last_error.clear();
    // A replica that starts over keeps its port: clients have it in their lists.
    if (o.listen.size() >= 2 && o.listen.compare(o.listen.size() - 2, 2, ":0") == 0) {
      o.listen = o.listen.substr(0, o.listen.size() - 1) + std::to_string(s.grpc_port());
    }
    std::fprintf(stderr, "laissez serve: replica listening on %s (gRPC port %d)%s%s; etcd %s; %s\n",
                 o.listen.c_str(), s.grpc_port(), o.http.empty() ? "" : ", HTTP on ", o.http.empty() ? "" : o.http.c_str(),
                 o.etcd.c_str(), RecoveryNote(s.core()).c_str());
    bool announced = false;
    while (!g_stop && !s.replica_lost()) {
      if (!announced && !s.admin_token().empty() && !s.admin_token_file().empty()) {
        std::fprintf(stderr, "laissez serve: new market; admin token written to %s (mode 0600)\n",
                     s.admin_token_file().c_str());
        announced = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!g_stop) {
      std::string why = s.replica()->why_lost();
      if (why.empty()) why = "the store failed";
      std::fprintf(stderr, "laissez serve: stepping down (%s); rejoining as a follower\n", why.c_str());
      // Until etcd answers again (a quorum is back), this server stays up and
      // refuses every call with the reason, rather than closing its port.
      s.core().Refuse("this replica stepped down: " + why + "; waiting for etcd");
      auto etcd = server::etcd::Client::Create(o.etcd);
      while (!g_stop && etcd.ok() && !(*etcd)->Range(o.etcd_prefix + "identity").ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    s.Shutdown();
  }
  std::fprintf(stderr, "laissez serve: stopping\n");
  return 0;
}

int RunServe(server::ServerOptions o) {
#ifdef LAISSEZ_HAVE_DASHBOARD
  o.http_routes = server::dashboard::Install;
#endif
  if (!o.etcd.empty()) {
    if (o.snapshot_every < std::chrono::milliseconds(100)) {
      std::fprintf(stderr, "laissez serve: --snapshot-ms: must be at least 100 with --etcd (its journal shrinks only by snapshots)\n");
      return 2;
    }
    if (!o.db.empty()) {
      std::fprintf(stderr, "laissez serve: --db: not used with --etcd (the journal lives in etcd)\n");
      return 2;
    }
    if (!o.store.empty()) {
      std::fprintf(stderr, "laissez serve: --store: not used with --etcd (the journal lives in etcd)\n");
      return 2;
    }
    return RunReplica(o);
  }
  if (o.db.empty()) {
    std::fprintf(stderr, "laissez serve: --db: required (use :memory: for a throwaway market)\n");
    return 2;
  }
  if (!o.store.empty() && o.db == ":memory:") {
    std::fprintf(stderr, "laissez serve: --store: not used with --db :memory:\n");
    return 2;
  }
  server::Server s(o);
  Status st = s.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "laissez serve: %s\n", st.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "laissez serve: listening on %s (gRPC port %d)%s%s; %s\n", o.listen.c_str(), s.grpc_port(),
               o.http.empty() ? "" : ", HTTP on ", o.http.empty() ? "" : o.http.c_str(), RecoveryNote(s.core()).c_str());
  if (!s.admin_token().empty()) {
    if (!s.admin_token_file().empty()) {
      std::fprintf(stderr, "laissez serve: new database; admin token written to %s (mode 0600)\n",
                   s.admin_token_file().c_str());
    } else {
      std::fprintf(stderr, "laissez serve: new in-memory market; admin token: %s\n", s.admin_token().c_str());
    }
    if (!o.cluster_file.empty()) {
      std::fprintf(stderr, "laissez serve: the new market holds the nodes of %s\n", o.cluster_file.c_str());
    }
  }
  if (!s.cluster_note().empty()) std::fprintf(stderr, "laissez serve: --cluster: %s\n", s.cluster_note().c_str());
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!g_stop && !s.core().failed()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  bool failed = s.core().failed();
  std::fprintf(stderr, "laissez serve: %s\n", failed ? "store failed; stopping" : "stopping");
  s.Shutdown();
  return failed ? 1 : 0;
}

// ---------------------------------------------------------------------------
// watch: events as they come. With --json, one JSON array, closed at the end.

int RunWatch(const ClientFlags& f, const std::vector<std::string>& vertices, bool operator_view, int count,
             double seconds, const std::string& after_flag) {
  std::optional<server::WatchPosition> after;
  if (!after_flag.empty()) {
    auto p = server::ParseWatchPosition(after_flag, "after");
    if (!p.ok()) return Fail(f.json, p.status());
    after = *p;
  }
  Client c(f);
  Status st = c.Open();
  if (!st.ok()) return Fail(f.json, st);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  if (f.json) std::cout << "[";
  int n = 0;
  grpc::Status g;
  // One stream per replica: when its replica goes (UNAVAILABLE), the next
  // stream resumes after the last event printed, on the leader or the next
  // endpoint, so no event is lost or printed twice.
  for (;;) {
    auto ctx = c.Ctx(0);
    if (seconds > 0) ctx->set_deadline(deadline);
    pb::WatchRequest q = server::MakeWatchRequest(vertices, after);
    auto reader = operator_view ? c.op->Watch(ctx.get(), q) : c.tenant->Watch(ctx.get(), q);
    grpc::ClientContext* raw = ctx.get();
    std::atomic<bool> done{false};
    std::thread stopper([&] {
      while (!done && !g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      raw->TryCancel();
    });
    reader->WaitForInitialMetadata();
    if (auto start = server::StreamStart(*ctx)) {
      c.Succeeded();  // The stream is live: the failover budget starts again.
      if (!after) after = start;
    }
    pb::Event e;
    while ((count <= 0 || n < count) && reader->Read(&e)) {
      after = server::WatchPosition{e.seq(), e.index()};
      if (f.json) {
        std::cout << (n ? ",\n" : "\n") << ToJson(e).dump() << std::flush;
      } else {
        std::string line = FormatTime(e.time()) + "  " + e.type();
        if (!e.node().empty()) line += "  node=" + e.node();
        if (!e.vertex().empty() && e.node().empty()) line += "  vertex=" + e.vertex();
        if (e.has_order()) line += "  order=" + std::to_string(e.order());
        if (e.price()) line += "  price=" + FormatMoney(e.price());
        if (e.amount()) line += "  amount=" + FormatMoney(e.amount());
        if (e.deadline()) line += "  deadline=" + FormatTime(e.deadline());
        if (!e.reasons().empty()) line += "  reasons=" + e.reasons();
        if (!e.tenant().empty()) line += "  tenant=" + e.tenant();
        if (!e.other().empty()) line += "  from=" + e.other();
        std::cout << line << std::endl;
      }
      ++n;
    }
    bool finished = count > 0 && n >= count;
    done = true;
    if (finished) raw->TryCancel();
    g = reader->Finish();
    stopper.join();
    if (finished || g_stop || g.ok() || !c.Failover(g, /*idempotent=*/true)) break;
  }
  if (f.json) std::cout << "\n]\n";
  bool normal = g.ok() || g.error_code() == grpc::StatusCode::CANCELLED ||
                g.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (!normal) {
    std::fprintf(stderr, "laissez: %s: %s\n", CodeName(g.error_code()), g.error_message().c_str());
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// bench server: concurrent tenants re-pricing resting orders over gRPC.

struct BenchFlags {
  ClientFlags client;
  int tenants = 8;
  double seconds = 10;
  int window = 256;
  int batch = 1;  // Stream mode: most updates per message (1: one update per message).
  std::string mode = "stream";
  // Stream mode: updates per second over all tenants on a fixed schedule (open
  // loop), latency from each update's scheduled time; 0 sends whenever the
  // window has room (closed loop).
  double rate = 0;
};

// One StreamUpdates stream of an open-loop run (--rate): a sender thread sends
// this tenant's messages at their scheduled times, each of --batch updates (a
// tenant that re-prices its orders once per tick sends them together), one
// message every batch x tenants / rate seconds, and this thread reads the
// acks. An update's latency runs from its message's scheduled time, not from
// when it was sent: a sender that falls behind (a full window, a late
// wake-up, a slow server) adds its lateness to the updates that waited, as a
// real client's would, instead of hiding it by sending less (coordinated
// omission); the schedule ends at `until`, and every message due before it
// is sent and waited for, however late. `phase` is the tenant's first
// message's time; `next_due` is its place in the schedule (messages), kept
// across failovers. Returns why the stream failed, or "" when it ended.
template <typename Stub, typename OnError>
std::string OpenLoopStream(Stub& stub, const std::string& token, uint64_t order, const BenchFlags& b,
                           std::chrono::steady_clock::time_point phase, std::chrono::steady_clock::time_point until,
                           uint64_t* next_due, std::vector<double>* lat_ms, std::vector<double>* late_ms,
                           OnError&& error) {
  using Clock = std::chrono::steady_clock;
  const double interval_ns = 1e9 * b.batch * b.tenants / b.rate;
  auto due = [&](uint64_t k) {
    return phase + std::chrono::nanoseconds(static_cast<int64_t>(interval_ns * static_cast<double>(k)));
  };
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  auto stream = stub.StreamUpdates(&ctx);
  const size_t ring = 1 << 16;  // More than the server's window of 4096 unacknowledged.
  std::vector<std::atomic<int64_t>> sent(ring);  // By tag: the update's scheduled time (ns on Clock).
  std::atomic<uint64_t> acked{0};
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> wake{0};  // Moved on acks and on a stop: wakes a sender waiting for the window.
  auto wake_sender = [&wake] {
    wake.fetch_add(1, std::memory_order_release);
    wake.notify_one();
  };
  uint64_t next = 0;  // Tags on this stream; the sender's until it is joined.
  bool write_failed = false;
  std::thread sender([&] {
    // Wake at the scheduled time, not up to the default 50 us after it: the
    // load generator's own lateness would count as the server's latency.
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    const int64_t price_base = 10 * kMicroUnits;
    while (!stop.load(std::memory_order_relaxed)) {
      // The schedule ends at `until`; every message due before it is sent,
      // however late (one left unsent would be one of the slowest, unmeasured).
      const auto due_at = due(*next_due);
      if (due_at >= until) break;
      const auto now = Clock::now();
      if (due_at > now) {
        // In steps of at most 10 ms, so a stop (a failover) is seen soon
        // even when messages are seconds apart (a low --rate).
        std::this_thread::sleep_until(std::min(due_at, now + std::chrono::milliseconds(10)));
        continue;
      }
      const uint32_t seen = wake.load(std::memory_order_acquire);
      if (next + static_cast<uint64_t>(b.batch) - acked.load(std::memory_order_acquire) > static_cast<uint64_t>(b.window)) {
        // The window has no room for the message: it waits for acks (or a
        // stop), and its latency counts the wait.
        wake.wait(seen, std::memory_order_acquire);
        continue;
      }
      const int64_t at = due(*next_due).time_since_epoch().count();
      pb::UpdateOrderRequest q;
      for (int n = 0; n < b.batch; ++n) {
        pb::UpdateOrderRequest* u = b.batch > 1 ? q.add_updates() : &q;
        u->set_tag(next);
        u->set_order(order);
        u->set_price(price_base + static_cast<int64_t>(next % 100));
        sent[next % ring].store(at, std::memory_order_release);
        ++next;
      }
      ++*next_due;
      // How late the message leaves against its schedule: the load
      // generator's own share of the latency (a late wake-up, a full window).
      late_ms->push_back(std::chrono::duration<double, std::milli>(Clock::now() - due_at).count());
      if (!stream->Write(q)) {
        write_failed = true;
        break;
      }
    }
    stream->WritesDone();
  });
  std::string refused;  // A follower's (or stepped-down replica's) UNAVAILABLE: go elsewhere.
  pb::UpdateOrderResponse r;
  while (stream->Read(&r)) {
    const auto now = Clock::now();
    auto one = [&](const pb::UpdateOrderResponse& a) {
      if (a.code() != 0) {
        error(1, "ack of update " + std::to_string(a.tag()) + ": code " + std::to_string(a.code()) + ": " + a.message());
      } else {
        const Clock::time_point at{Clock::duration(sent[a.tag() % ring].load(std::memory_order_acquire))};
        lat_ms->push_back(std::chrono::duration<double, std::milli>(now - at).count());
      }
      acked.fetch_add(1, std::memory_order_release);
      if (a.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE) && refused.empty()) refused = a.message();
    };
    if (r.acks_size() == 0) one(r);
    for (const auto& a : r.acks()) one(a);
    wake_sender();
    if (!refused.empty()) {
      ctx.TryCancel();  // The sender's next Write fails; the stream is closed below.
      break;
    }
  }
  // A sender asleep sees the stop within 10 ms; one waiting for the window,
  // at once.
  stop.store(true, std::memory_order_relaxed);
  wake_sender();
  sender.join();
  grpc::Status g = stream->Finish();
  std::string failure = !refused.empty() ? refused : g.ok() ? "" : g.error_message();
  const uint64_t lost = next - acked.load();
  error(lost, std::to_string(lost) + " updates sent and never acknowledged; the stream ended with code " +
                  std::to_string(g.error_code()) + (g.ok() ? "" : ": " + g.error_message()) +
                  (write_failed ? " (a write of the stream failed)" : ""));
  return failure;
}

int RunBenchServer(const BenchFlags& b) {
  // The load generator shares the server's cores: as in Server::Start, no
  // lock-order graph for Abseil's deadlock detection under gRPC's mutexes.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const bool as_json = b.client.json;
  Client admin(b.client);
  Status st = admin.Open();
  if (!st.ok()) return Fail(as_json, st);
  // A node behind a floor no bid reaches, so the tenants' orders rest and every
  // update re-prices a resting order (the common case of a live market).
  std::string tag = "bench" + std::to_string(::getpid()) + "-" + std::to_string(std::time(nullptr));
  {
    pb::AddNodesRequest q;
    auto* n = q.add_nodes();
    n->set_name(tag + "-n0");
    n->set_type(tag);
    n->set_region("bench");
    n->set_zone("z");
    n->set_row("r");
    n->set_rack("k");
    // Setup calls carry keys too: retried through a failover, applied once.
    q.set_idempotency_key(server::NewIdempotencyKey());
    pb::AddNodesResponse r;
    grpc::Status g;
    do g = admin.op->AddNodes(admin.Ctx().get(), q, &r);
    while (!g.ok() && admin.Failover(g, true));
    if (!g.ok()) return Fail(as_json, g.error_code(), "bench setup: add node: " + g.error_message());
    pb::SetFloorRequest fq;
    fq.set_node(tag + "-n0");
    fq.set_price(1'000'000 * kMicroUnits);
    fq.set_idempotency_key(server::NewIdempotencyKey());
    pb::PolicyResponse fr;
    do g = admin.op->SetFloor(admin.Ctx().get(), fq, &fr);
    while (!g.ok() && admin.Failover(g, true));
    if (!g.ok()) return Fail(as_json, g.error_code(), "bench setup: floor: " + g.error_message());
  }
  struct Worker {
    std::string token;
    uint64_t order = 0;
    std::vector<double> lat_ms;
    std::vector<double> late_ms;  // Open loop: each message's send time after its scheduled time.
    uint64_t errors = 0;
    std::string first_error;  // What the first error was (an error count alone cannot be diagnosed).
    void Error(uint64_t n, const std::string& what) {
      errors += n;
      if (first_error.empty() && n > 0) first_error = what;
    }
  };
  std::vector<Worker> workers(static_cast<size_t>(b.tenants));
  for (int i = 0; i < b.tenants; ++i) {
    pb::CreateTenantRequest q;
    q.set_name(tag + "-t" + std::to_string(i));
    q.set_balance(1'000'000'000 * kMicroUnits);
    q.set_idempotency_key(server::NewIdempotencyKey());
    pb::CreateTenantResponse r;
    grpc::Status g;
    do g = admin.admin->CreateTenant(admin.Ctx().get(), q, &r);
    while (!g.ok() && admin.Failover(g, true));
    if (g.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
        g.error_message().rfind("idempotency_key: already applied", 0) == 0) {
      // Created by an attempt whose answer was lost, token and all: issue another.
      pb::IssueTokenRequest iq;
      iq.set_role("tenant");
      iq.set_tenant(q.name());
      pb::IssueTokenResponse ir;
      do g = admin.admin->IssueToken(admin.Ctx().get(), iq, &ir);
      while (!g.ok() && admin.Failover(g, false));
      r.set_token(ir.token());
    }
    if (!g.ok()) return Fail(as_json, g.error_code(), "bench setup: create tenant: " + g.error_message());
    workers[static_cast<size_t>(i)].token = r.token();
    pb::PlaceOrderRequest pq;
    pq.set_scope(tag);
    pq.set_price(10 * kMicroUnits);
    pq.set_idempotency_key(server::NewIdempotencyKey());  // Retried with it: placed once.
    pb::PlaceOrderResponse pr;
    do {
      grpc::ClientContext tctx;
      tctx.AddMetadata("authorization", "Bearer " + r.token());
      g = admin.tenant->PlaceOrder(&tctx, pq, &pr);
    } while (!g.ok() && admin.Failover(g, /*idempotent=*/true));
    if (!g.ok()) return Fail(as_json, g.error_code(), "bench setup: place order: " + g.error_message());
    workers[static_cast<size_t>(i)].order = pr.order();
  }

  // Workers start at the endpoint the setup reached (the leader) and fail
  // over like the CLI: an update sets an absolute price, so one that was not
  // acknowledged is simply sent again to the new leader.
  std::string first = admin.address() + "," + b.client.server;
  rusage ru0{};
  // The clock starts once every tenant's first connection is up (or has had
  // its 2 s): an open loop's schedule must not count the connections' set-up
  // as the server's latency, nor a closed loop's rate the time before its
  // first send. The barrier's completion sets the start for all, and the CPU
  // count starts with it.
  const auto length = std::chrono::milliseconds(static_cast<int64_t>(b.seconds * 1000));
  std::chrono::steady_clock::time_point t0, until;
  std::barrier start(b.tenants, [&]() noexcept {
    getrusage(RUSAGE_SELF, &ru0);
    t0 = std::chrono::steady_clock::now();
    until = t0 + length;
  });
  std::vector<std::thread> threads;
  // Open loop: each tenant sends a message every `message_interval`, tenant i
  // i / tenants of it after the start, so that the messages of all tenants
  // come evenly spaced.
  const std::chrono::nanoseconds message_interval(
      b.rate > 0 ? static_cast<int64_t>(1e9 * b.batch * b.tenants / b.rate) : 0);
  for (size_t ti = 0; ti < workers.size(); ++ti) {
    Worker& w = workers[ti];
    threads.emplace_back([&w, &b, &first, &start, &t0, &until, message_interval, ti] {
      server::Endpoints eps(first);
      uint64_t next_due = 0;  // Open loop: the next message of the schedule (kept across failovers).
      w.lat_ms.reserve(1 << 20);
      int64_t price_base = 10 * kMicroUnits;
      // Each tenant has its own channel, as separate clients would.
      auto channel = [&eps] {
        grpc::ChannelArguments args;
        args.SetInt("grpc.use_local_subchannel_pool", 1);
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        return grpc::CreateCustomChannel(eps.current(), grpc::InsecureChannelCredentials(), args);
      };
      // Connected before anything is sent: a call on a channel whose first
      // connection attempt failed fails at once (UNAVAILABLE, "failed to
      // connect to all addresses"), and the bench counted the window it had
      // written into such a stream as updates never acknowledged, though the
      // server never saw them (now and then, on loopback, at a run's start).
      // The channel retries the connection itself (backoff 100 ms to 1 s);
      // an endpoint that does not connect within 2 s is left for the next.
      auto ch = channel();
      bool connected = ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2));
      start.arrive_and_wait();
      const auto phase = t0 + message_interval * static_cast<int64_t>(ti) / b.tenants;
      while (std::chrono::steady_clock::now() < until) {
        if (ch == nullptr) {
          ch = channel();
          auto wait = std::min<std::chrono::steady_clock::duration>(until - std::chrono::steady_clock::now(),
                                                                    std::chrono::seconds(2));
          connected = ch->WaitForConnected(std::chrono::system_clock::now() + wait);
        }
        if (!connected) {
          if (std::chrono::steady_clock::now() >= until) break;
          eps.Next("could not connect to " + eps.current() + " within 2 s");
          ch = nullptr;
          continue;
        }
        auto stub = pb::TenantService::NewStub(ch);
        std::string failure;
        if (b.mode == "unary") {
          for (uint64_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
            pb::UpdateOrderRequest q;
            q.set_order(w.order);
            q.set_price(price_base + static_cast<int64_t>(i % 100));
            pb::UpdateOrderResponse r;
            grpc::ClientContext ctx;
            ctx.AddMetadata("authorization", "Bearer " + w.token);
            auto s = std::chrono::steady_clock::now();
            grpc::Status g = stub->UpdateOrder(&ctx, q, &r);
            auto e = std::chrono::steady_clock::now();
            if (g.ok()) {
              w.lat_ms.push_back(std::chrono::duration<double, std::milli>(e - s).count());
              continue;
            }
            w.Error(1, "UpdateOrder: code " + std::to_string(g.error_code()) + ": " + g.error_message());
            if (g.error_code() == grpc::StatusCode::UNAVAILABLE) {
              failure = g.error_message();
              break;
            }
          }
        } else if (b.rate > 0) {
          failure = OpenLoopStream(*stub, w.token, w.order, b, phase, until, &next_due, &w.lat_ms, &w.late_ms,
                                   [&w](uint64_t n, const std::string& what) { w.Error(n, what); });
        } else {
          grpc::ClientContext ctx;
          ctx.AddMetadata("authorization", "Bearer " + w.token);
          auto stream = stub->StreamUpdates(&ctx);
          const size_t ring = 1 << 16;
          std::vector<std::chrono::steady_clock::time_point> sent(ring);
          uint64_t next = 0, acked = 0;
          bool writing = true;
          bool write_failed = false;
          std::string refused;  // A follower's (or stepped-down replica's) UNAVAILABLE: go elsewhere.
          // One thread sends and reads: the thread that reads an ack refills
          // the window (a second thread would add a wake-up to every round trip).
          // The server reads whatever fits its window of 4096, so a Write never
          // waits for acks this thread has not read.
          auto refill = [&] {
            while (writing && next - acked < static_cast<uint64_t>(b.window)) {
              auto now = std::chrono::steady_clock::now();
              if (now >= until) {
                stream->WritesDone();
                writing = false;
                break;
              }
              // With --batch > 1, as many updates as the window has room for
              // (at most --batch) go in one message.
              uint64_t room = static_cast<uint64_t>(b.window) - (next - acked);
              uint64_t n = b.batch > 1 ? std::min<uint64_t>(room, static_cast<uint64_t>(b.batch)) : 1;
              pb::UpdateOrderRequest q;
              for (uint64_t i = 0; i < n; ++i) {
                pb::UpdateOrderRequest* u = b.batch > 1 ? q.add_updates() : &q;
                u->set_tag(next);
                u->set_order(w.order);
                u->set_price(price_base + static_cast<int64_t>(next % 100));
                sent[next % ring] = now;
                ++next;
              }
              if (!stream->Write(q)) {
                writing = false;
                write_failed = true;
              }
            }
          };
          refill();
          pb::UpdateOrderResponse r;
          while (stream->Read(&r)) {
            auto now = std::chrono::steady_clock::now();
            // A message of several updates is answered with one ack per update.
            auto one = [&](const pb::UpdateOrderResponse& a) {
              if (a.code() != 0) w.Error(1, "ack of update " + std::to_string(a.tag()) + ": code " + std::to_string(a.code()) + ": " + a.message());
              else w.lat_ms.push_back(std::chrono::duration<double, std::milli>(now - sent[a.tag() % ring]).count());
              ++acked;
              if (a.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE) && refused.empty()) refused = a.message();
            };
            if (r.acks_size() == 0) one(r);
            for (const auto& a : r.acks()) one(a);
            if (!refused.empty()) {
              ctx.TryCancel();  // The stream is closed below.
              break;
            }
            refill();
          }
          grpc::Status g = stream->Finish();
          if (!g.ok()) failure = g.error_message();
          if (!refused.empty()) failure = refused;
          // Sent, never acknowledged: the next stream sends new updates.
          w.Error(next - acked, std::to_string(next - acked) + " updates sent and never acknowledged; the stream ended with code " +
                                    std::to_string(g.error_code()) + (g.ok() ? "" : ": " + g.error_message()) +
                                    (write_failed ? " (a write of the stream failed)" : ""));
        }
        if (failure.empty()) break;
        eps.Next(failure);
        ch = nullptr;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  for (auto& t : threads) t.join();
  // An open loop's tenants stop once their last message due is acknowledged,
  // which may come before `until`: the run lasts its schedule, at least.
  auto t1 = std::chrono::steady_clock::now();
  if (b.rate > 0) t1 = std::max(t1, until);
  rusage ru1{};
  getrusage(RUSAGE_SELF, &ru1);
  double wall = std::chrono::duration<double>(t1 - t0).count();
  auto cpu = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
  };
  double cpu_s = cpu(ru1) - cpu(ru0);
  std::vector<double> all, late;
  uint64_t errors = 0;
  std::string first_error;
  for (auto& w : workers) {
    all.insert(all.end(), w.lat_ms.begin(), w.lat_ms.end());
    late.insert(late.end(), w.late_ms.begin(), w.late_ms.end());
    errors += w.errors;
    if (first_error.empty()) first_error = w.first_error;
  }
  std::sort(all.begin(), all.end());
  std::sort(late.begin(), late.end());
  auto pct_of = [](const std::vector<double>& v, double p) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  };
  auto pct = [&](double p) { return pct_of(all, p); };
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  json out = {{"updates_per_sec", static_cast<double>(all.size()) / wall},
              {"p50_ms", pct(0.50)},
              {"p99_ms", pct(0.99)},
              {"p999_ms", pct(0.999)},
              {"durable", true},
              {"mode", b.mode == "unary" ? "unary UpdateOrder" : "bidirectional StreamUpdates"},
              {"window", b.mode == "unary" ? 1 : b.window},
              {"offered_per_sec", b.rate},
              {"latency_from", b.rate > 0 ? "scheduled send time" : "send"},
              {"batch", b.mode == "unary" ? 1 : std::max(b.batch, 1)},
              {"tenants", b.tenants},
              {"seconds", wall},
              {"acknowledged", all.size()},
              {"errors", errors},
              {"first_error", first_error},
              {"loadgen_cpu_cores", cpu_s / wall},
              {"loadgen_cpu_share", cpu_s / wall / static_cast<double>(cores)},
              {"machine_cores", cores}};
  if (b.rate > 0) {
    out["send_late_p50_ms"] = pct_of(late, 0.50);
    out["send_late_p99_ms"] = pct_of(late, 0.99);
  }
  if (as_json) {
    std::cout << out.dump() << "\n";
  } else {
    if (b.rate > 0) {
      std::printf("open loop: %.0f updates/s offered, latency from each update's scheduled time; messages left "
                  "%.3f ms (p50), %.3f ms (p99) after their scheduled time\n",
                  b.rate, pct_of(late, 0.5), pct_of(late, 0.99));
    }
    std::printf("%s (up to %d updates per message), %d tenants, %.1f s: %.0f durable updates/s, p50 %.3f ms, p99 %.3f ms, %llu errors; "
                "load generator used %.2f cores (%.0f%% of the machine)\n",
                out["mode"].get<std::string>().c_str(), out["batch"].get<int>(), b.tenants, wall, out["updates_per_sec"].get<double>(),
                pct(0.5), pct(0.99), static_cast<unsigned long long>(errors), cpu_s / wall,
                100 * cpu_s / wall / static_cast<double>(cores));
    if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  }
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------

void RegisterServerCommands(CLI::App& app, int* exit_code) {
  // serve
  {
    auto* cmd = app.add_subcommand("serve", "Run the control-plane server (gRPC, a durable journal in SQLite or a journal file, or a replica on etcd, HTTP metrics)");
    static server::ServerOptions o;
    static int64_t tick_ms = 1000;
    static int64_t snapshot_ms = 10000;
    cmd->add_option("--db", o.db, "Database file (created if missing); :memory: for a throwaway market. "
                                  "Required unless --etcd");
    cmd->add_option("--store", o.store,
                    "What keeps --db: sqlite (SQLite in WAL mode) or journal (a journal file of its own: one write "
                    "and one sync a commit; docs/SERVER.md, \"The journal file\"). Default: the kind of an "
                    "existing file, sqlite for a new one")
        ->check(CLI::IsMember({"sqlite", "journal"}));
    cmd->add_option("--etcd", o.etcd,
                    "Run one replica of a replicated market whose journal lives in etcd: HOST:PORT[,HOST:PORT...] "
                    "(docs/HA.md)");
    cmd->add_option("--etcd-prefix", o.etcd_prefix, "Key prefix of this market in etcd")->capture_default_str();
    cmd->add_option("--advertise", o.advertise,
                    "With --etcd: the gRPC address clients reach this replica at (default 127.0.0.1:PORT)");
    cmd->add_option("--lease-ttl", o.lease_ttl_s, "With --etcd: election lease TTL in seconds")
        ->capture_default_str()
        ->check(CLI::Range(1, 60));
    cmd->add_option("--snapshot-ms", snapshot_ms,
                    "Write a snapshot of the market this often if it changed (docs/HA.md): with --etcd the leader's "
                    "snapshot lets it delete the journal keys it covers and compact etcd (at least 100); with --db "
                    "a restart replays only the journal after it (0: never)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
    cmd->add_option("--listen", o.listen, "gRPC address HOST:PORT")->capture_default_str();
    cmd->add_option("--http", o.http, "HTTP address HOST:PORT for /healthz and /metrics");
    cmd->add_option("--tls-cert", o.tls_cert, "TLS certificate chain (PEM)");
    cmd->add_option("--tls-key", o.tls_key, "TLS private key (PEM)");
    cmd->add_option("--admin-token-file", o.admin_token_file, "Where a new database's admin token goes (default DB.admin-token)");
    cmd->add_option("--rate-limit", o.rate_limit, "Requests per second per tenant (0: unlimited)")->capture_default_str();
    cmd->add_option("--rate-burst", o.rate_burst, "Burst size per tenant")->capture_default_str();
    cmd->add_option("--max-message-bytes", o.max_message_bytes, "Largest request accepted")->capture_default_str();
    cmd->add_option("--tick-ms", tick_ms, "Advance the market at least this often when idle")->capture_default_str();
    cmd->add_option("--cluster", o.cluster_file,
                    "Cluster YAML: the nodes of a new market (created in the same transaction); on an existing "
                    "market every node must already be there, or the server refuses to start");
    cmd->add_flag("--init", o.init, "Create a new market; refuse to start if the database already holds one");
    cmd->add_option("--watch-ring", o.core.event_ring,
                    "Recent events kept for watches that resume (refilled from the journal on start); 0 keeps none "
                    "(a resume is then OUT_OF_RANGE)")
        ->capture_default_str()
        ->check(CLI::Range(size_t{0}, size_t{16777216}));
    cmd->callback([exit_code] {
      o.core.idle_tick = std::chrono::milliseconds(std::max<int64_t>(tick_ms, 1));
      o.snapshot_every = std::chrono::milliseconds(snapshot_ms);
      *exit_code = RunServe(o);
    });
  }

  // ---- Tenant commands ----
  {
    auto* cmd = app.add_subcommand("bid", "Place an order (a bid) for a node, any node below a vertex, or a gang");
    static ClientFlags f;
    static std::string scope, price, locality = "any", rel_to, key;
    static uint32_t count = 1;
    AddClientFlags(cmd, &f);
    AddKeyFlag(cmd, &key);
    cmd->add_option("--scope", scope, "Vertex: TYPE, TYPE/region/zone/row/rack, or a node name")->required();
    cmd->add_option("--price", price, "Limit price per node per hour, in units (e.g. 12.5)")->required();
    cmd->add_option("--count", count, "Nodes (> 1: all-or-nothing gang)");
    cmd->add_option("--locality", locality, "any, same_region, same_zone, same_row, same_rack");
    cmd->add_option("--rel-to", rel_to, "A node you hold, for --locality");
    cmd->callback([exit_code] {
      pb::PlaceOrderRequest q;
      *exit_code = RunCall<pb::PlaceOrderResponse>(
          f,
          [&]() -> Status {
            int64_t p = 0;
            LZ_RETURN_IF_ERROR(ParsePriceFlag(price, "price", &p));
            LZ_ASSIGN_OR_RETURN(pb::Locality l, ParseLocalityFlag(locality));
            q.set_scope(scope);
            q.set_price(p);
            q.set_count(count);
            q.set_locality(l);
            q.set_rel_to(rel_to);
            // Retried with the same key on any UNAVAILABLE: placed once.
            q.set_idempotency_key(KeyOrNew(key));
            return Status::Ok();
          },
          [&](Client& c, pb::PlaceOrderResponse* r) { return c.tenant->PlaceOrder(c.Ctx().get(), q, r); }, nullptr,
          /*idempotent=*/true);
    });
  }
  {
    auto* cmd = app.add_subcommand("update", "Change an open order's price");
    static ClientFlags f;
    static uint64_t order = 0;
    static std::string price;
    AddClientFlags(cmd, &f);
    cmd->add_option("order", order, "Order id")->required();
    cmd->add_option("--price", price, "New limit price per node per hour, in units")->required();
    cmd->callback([exit_code] {
      pb::UpdateOrderRequest q;
      *exit_code = RunCall<pb::UpdateOrderResponse>(
          f,
          [&]() -> Status {
            int64_t p = 0;
            LZ_RETURN_IF_ERROR(ParsePriceFlag(price, "price", &p));
            q.set_order(order);
            q.set_price(p);
            return Status::Ok();
          },
          [&](Client& c, pb::UpdateOrderResponse* r) { return c.tenant->UpdateOrder(c.Ctx().get(), q, r); },
          [](const pb::UpdateOrderResponse&) { std::cout << "ok\n"; });
    });
  }
  {
    auto* cmd = app.add_subcommand("cancel", "Withdraw an open order");
    static ClientFlags f;
    static uint64_t order = 0;
    AddClientFlags(cmd, &f);
    static std::string key;
    AddKeyFlag(cmd, &key);
    cmd->add_option("order", order, "Order id")->required();
    cmd->callback([exit_code] {
      pb::CancelOrderRequest q;
      q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
      q.set_order(order);
      *exit_code = RunCall<pb::CancelOrderResponse>(
          f, nullptr, [&](Client& c, pb::CancelOrderResponse* r) { return c.tenant->CancelOrder(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
    });
  }
  {
    auto* cmd = app.add_subcommand("retain", "Set the retention limit on a node you hold");
    static ClientFlags f;
    static std::string node, limit;
    AddClientFlags(cmd, &f);
    cmd->add_option("node", node, "Node name")->required();
    cmd->add_option("--limit", limit, "The most you will pay per hour to keep it, in units")->required();
    cmd->callback([exit_code] {
      pb::SetLimitRequest q;
      *exit_code = RunCall<pb::SetLimitResponse>(
          f,
          [&]() -> Status {
            int64_t p = 0;
            LZ_RETURN_IF_ERROR(ParsePriceFlag(limit, "limit", &p));
            q.set_node(node);
            q.set_limit(p);
            return Status::Ok();
          },
          [&](Client& c, pb::SetLimitResponse* r) { return c.tenant->SetLimit(c.Ctx().get(), q, r); });
    });
  }
  {
    auto* cmd = app.add_subcommand("release", "Relinquish a node you hold");
    static ClientFlags f;
    static std::string node;
    AddClientFlags(cmd, &f);
    static std::string key;
    AddKeyFlag(cmd, &key);
    cmd->add_option("node", node, "Node name")->required();
    cmd->callback([exit_code] {
      pb::RelinquishRequest q;
      q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
      q.set_node(node);
      *exit_code = RunCall<pb::RelinquishResponse>(
          f, nullptr, [&](Client& c, pb::RelinquishResponse* r) { return c.tenant->Relinquish(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
    });
  }
  {
    auto* cmd = app.add_subcommand("quote", "The price to obtain a node below a vertex, with free counts and depth");
    static ClientFlags f;
    static std::string vertex;
    static bool depth = false;
    AddClientFlags(cmd, &f);
    cmd->add_option("vertex", vertex, "TYPE, TYPE/region/zone/row/rack, or a node name")->required();
    cmd->add_flag("--depth", depth, "Include resting demand by price level");
    cmd->callback([exit_code] {
      pb::QuoteRequest q;
      q.set_vertex(vertex);
      q.set_depth(depth);
      *exit_code = RunCall<pb::QuoteResponse>(
          f, nullptr, [&](Client& c, pb::QuoteResponse* r) { return c.tenant->Quote(c.Ctx().get(), q, r); });
    });
  }
  {
    auto* cmd = app.add_subcommand("eviction-quote", "How close the market is to taking a node you hold");
    static ClientFlags f;
    static std::string node;
    AddClientFlags(cmd, &f);
    cmd->add_option("node", node, "Node name")->required();
    cmd->callback([exit_code] {
      pb::EvictionQuoteRequest q;
      q.set_node(node);
      *exit_code = RunCall<pb::EvictionQuoteResponse>(f, nullptr, [&](Client& c, pb::EvictionQuoteResponse* r) {
        return c.tenant->EvictionQuote(c.Ctx().get(), q, r);
      });
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "watch",
        "Stream prices at vertices and your own events (Ctrl-C to stop). With several --server "
        "replicas, a stream whose replica goes resumes on another, after the last event printed "
        "(each event's position is `seq` and `index` in --json)");
    static ClientFlags f;
    static std::vector<std::string> vertices;
    static bool all = false;
    static int count = 0;
    static double seconds = 0;
    static std::string after;
    AddClientFlags(cmd, &f);
    cmd->add_option("--after", after,
                    "Resume after this event position, SEQ.INDEX (an event's seq and index from --json); "
                    "OUT_OF_RANGE if the server no longer keeps the events after it");
    cmd->add_option("--vertex", vertices, "Vertices whose price changes to stream (repeatable)");
    cmd->add_flag("--operator", all, "Every market event, operator view (operator or admin token)");
    cmd->add_option("--count", count, "Stop after this many events");
    cmd->add_option("--seconds", seconds, "Stop after this long");
    cmd->callback([exit_code] { *exit_code = RunWatch(f, vertices, all, count, seconds, after); });
  }
  {
    auto* cmd = app.add_subcommand("balance", "Your balance, rates and totals paid");
    static ClientFlags f;
    AddClientFlags(cmd, &f);
    cmd->callback([exit_code] {
      *exit_code = RunCall<pb::BalanceResponse>(f, nullptr, [&](Client& c, pb::BalanceResponse* r) {
        return c.tenant->GetBalance(c.Ctx().get(), pb::GetBalanceRequest(), r);
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("orders", "Your open orders");
    static ClientFlags f;
    AddClientFlags(cmd, &f);
    cmd->callback([exit_code] {
      *exit_code = RunCall<pb::ListOrdersResponse>(f, nullptr, [&](Client& c, pb::ListOrdersResponse* r) {
        return c.tenant->ListOrders(c.Ctx().get(), pb::ListOrdersRequest(), r);
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("holdings", "The nodes you hold, with their limits");
    static ClientFlags f;
    AddClientFlags(cmd, &f);
    cmd->callback([exit_code] {
      *exit_code = RunCall<pb::ListNodesResponse>(f, nullptr, [&](Client& c, pb::ListNodesResponse* r) {
        return c.tenant->ListNodes(c.Ctx().get(), pb::ListNodesRequest(), r);
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("ledger", "Settled charges: yours (tenant token) or the market's (--operator)");
    static ClientFlags f;
    static uint32_t limit = 100;
    static bool all = false;
    static std::string tenant;
    AddClientFlags(cmd, &f);
    cmd->add_option("--limit", limit, "Most recent entries");
    cmd->add_flag("--operator", all, "The whole market's ledger and money totals (operator or admin token)");
    cmd->add_option("--tenant", tenant, "With --operator: one tenant's entries");
    cmd->callback([exit_code] {
      if (all) {
        pb::OperatorLedgerRequest q;
        q.set_limit(limit);
        q.set_tenant(tenant);
        *exit_code = RunCall<pb::OperatorLedgerResponse>(f, nullptr, [&](Client& c, pb::OperatorLedgerResponse* r) {
          return c.op->GetLedger(c.Ctx().get(), q, r);
        });
      } else {
        pb::GetLedgerRequest q;
        q.set_limit(limit);
        *exit_code = RunCall<pb::LedgerResponse>(
            f, nullptr, [&](Client& c, pb::LedgerResponse* r) { return c.tenant->GetLedger(c.Ctx().get(), q, r); });
      }
    });
  }

  // ---- Operator commands ----
  {
    auto* nodes = app.add_subcommand("nodes", "Operator: add, drain, remove and list nodes");
    nodes->require_subcommand(1);
    {
      auto* cmd = nodes->add_subcommand("add", "Add one node, or every node of a cluster YAML file");
      static ClientFlags f;
      static std::string file, name, type, region, zone, row, rack;
      static int32_t gpus = 0, memory_gb = 0, power_w = 0;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("--file", file, "Cluster YAML (docs/CLUSTER_FORMAT.md)");
      cmd->add_option("--name", name, "Node name");
      cmd->add_option("--type", type, "Hardware type, e.g. h100x8");
      cmd->add_option("--region", region);
      cmd->add_option("--zone", zone);
      cmd->add_option("--row", row);
      cmd->add_option("--rack", rack);
      cmd->add_option("--gpus", gpus);
      cmd->add_option("--memory-gb", memory_gb);
      cmd->add_option("--power-w", power_w);
      cmd->callback([exit_code] {
        pb::AddNodesRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::AddNodesResponse>(
            f,
            [&]() -> Status {
              if (!file.empty()) {
                LZ_ASSIGN_OR_RETURN(topology::ClusterSpec spec, topology::LoadClusterYaml(file));
                for (const auto& n : spec.nodes) {
                  auto* o = q.add_nodes();
                  o->set_name(n.name);
                  o->set_type(n.type);
                  o->set_region(n.region);
                  o->set_zone(n.zone);
                  o->set_row(n.row);
                  o->set_rack(n.rack);
                  o->set_gpus(n.meta.gpus);
                  o->set_memory_gb(n.meta.memory_gb);
                  o->set_power_w(n.meta.power_w);
                }
                return Status::Ok();
              }
              if (name.empty()) return InvalidArgument("name: give --name (or --file)");
              auto* o = q.add_nodes();
              o->set_name(name);
              o->set_type(type);
              o->set_region(region);
              o->set_zone(zone);
              o->set_row(row);
              o->set_rack(rack);
              o->set_gpus(gpus);
              o->set_memory_gb(memory_gb);
              o->set_power_w(power_w);
              return Status::Ok();
            },
            [&](Client& c, pb::AddNodesResponse* r) { return c.op->AddNodes(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = nodes->add_subcommand("drain", "Reclaim a node or location: infinite floor, notices, grace");
      static ClientFlags f;
      static std::string node, location, start, end;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("--node", node, "Node name");
      cmd->add_option("--location", location, "Location path, e.g. eu/eu-1a/r1/k2");
      cmd->add_option("--in", start, "Start after this long (e.g. 10m); default now");
      cmd->add_option("--for", end, "Maintenance length (e.g. 2h); default: for good");
      cmd->callback([exit_code] {
        pb::DrainRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::PolicyResponse>(
            f,
            [&]() -> Status {
              q.set_node(node);
              q.set_location(location);
              if (node.empty() && location.empty()) return InvalidArgument("node: give --node or --location");
              Micros now = server::WallClockMicros();
              Micros s = now;
              if (!start.empty()) {
                LZ_ASSIGN_OR_RETURN(Micros d, ParseDuration(start, "in"));
                s = now + d;
                q.set_start(s);
              }
              if (!end.empty()) {
                LZ_ASSIGN_OR_RETURN(Micros d, ParseDuration(end, "for"));
                q.set_start(s);
                q.set_end(s + d);
              }
              return Status::Ok();
            },
            [&](Client& c, pb::PolicyResponse* r) { return c.op->DrainNodes(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = nodes->add_subcommand("remove", "Remove free nodes from the market (drain them first)");
      static ClientFlags f;
      static std::vector<std::string> names;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("nodes", names, "Node names")->required();
      cmd->callback([exit_code] {
        pb::RemoveNodesRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        for (const auto& n : names) q.add_nodes(n);
        *exit_code = RunCall<pb::RemoveNodesResponse>(
            f, nullptr, [&](Client& c, pb::RemoveNodesResponse* r) { return c.op->RemoveNodes(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = nodes->add_subcommand("list", "Every node: status, holder, limit, floor");
      static ClientFlags f;
      AddClientFlags(cmd, &f);
      cmd->callback([exit_code] {
        *exit_code = RunCall<pb::ListClusterResponse>(f, nullptr, [&](Client& c, pb::ListClusterResponse* r) {
          return c.op->ListCluster(c.Ctx().get(), pb::ListClusterRequest(), r);
        });
      });
    }
  }
  {
    auto* floor = app.add_subcommand("floor", "Operator: InfraMaps floor prices");
    floor->require_subcommand(1);
    {
      auto* cmd = floor->add_subcommand("set", "A static floor on a node or a location (all types below it)");
      static ClientFlags f;
      static std::string node, location, price;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("--node", node, "Node name");
      cmd->add_option("--location", location, "Location path (\"\" or omitted: the whole cluster)");
      cmd->add_option("--price", price, "Floor per node per hour, in units")->required();
      cmd->callback([exit_code] {
        pb::SetFloorRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::PolicyResponse>(
            f,
            [&]() -> Status {
              int64_t p = 0;
              LZ_RETURN_IF_ERROR(ParsePriceFlag(price, "price", &p));
              q.set_node(node);
              q.set_location(location);
              q.set_price(p);
              return Status::Ok();
            },
            [&](Client& c, pb::PolicyResponse* r) { return c.op->SetFloor(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = floor->add_subcommand("remove", "Remove a floor, power cap or drain by its policy id");
      static ClientFlags f;
      static uint32_t policy = 0;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("policy", policy, "Policy id")->required();
      cmd->callback([exit_code] {
        pb::RemovePolicyRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        q.set_policy(policy);
        *exit_code = RunCall<pb::RemovePolicyResponse>(
            f, nullptr, [&](Client& c, pb::RemovePolicyResponse* r) { return c.op->RemovePolicy(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
  }
  {
    auto* pc = app.add_subcommand("powercap", "Operator: a row's floor rises as its committed power nears a cap");
    pc->require_subcommand(1);
    auto* cmd = pc->add_subcommand("set", "Set a power-cap InfraMap on a row (a fixed staircase of floors)");
    static ClientFlags f;
    static std::string row;
    static int64_t cap_w = 0;
    static std::vector<std::string> steps;
    AddClientFlags(cmd, &f);
    static std::string key;
    AddKeyFlag(cmd, &key);
    cmd->add_option("--row", row, "Row path, e.g. eu/eu-1a/r1")->required();
    cmd->add_option("--cap-w", cap_w, "Cap in watts")->required();
    cmd->add_option("--step", steps, "UTILIZATION%=FLOOR, e.g. 80=5 or 100=inf (repeatable)")->required();
    cmd->callback([exit_code] {
      pb::PowerCapRequest q;
      q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
      *exit_code = RunCall<pb::PolicyResponse>(
          f,
          [&]() -> Status {
            q.set_row(row);
            q.set_cap_w(cap_w);
            for (size_t i = 0; i < steps.size(); ++i) {
              std::string field = "step[" + std::to_string(i) + "]";
              auto eq = steps[i].find('=');
              if (eq == std::string::npos) return InvalidArgument(field + ": must be UTILIZATION%=FLOOR");
              LZ_ASSIGN_OR_RETURN(int64_t pct_micro, ParseMoney(steps[i].substr(0, eq), field + ".utilization"));
              auto* s = q.add_steps();
              s->set_utilization_ppm(pct_micro / 100);  // Percent (6 decimals) to ppm.
              std::string fl = steps[i].substr(eq + 1);
              if (fl == "inf") {
                s->set_floor(kInfPrice);
              } else {
                LZ_ASSIGN_OR_RETURN(int64_t p, ParseMoney(fl, field + ".floor"));
                s->set_floor(p);
              }
            }
            return Status::Ok();
          },
          [&](Client& c, pb::PolicyResponse* r) { return c.op->SetPowerCap(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
    });
    {
      auto* cmd = pc->add_subcommand(
          "adaptive",
          "An adaptive power cap on a row: a controller raises the row's floor while the power that stays is above "
          "the target cap x (1 - margin), holds in the band below it or while a reclaim is pending, and otherwise "
          "lowers it by at most --fall-step per interval (docs/MECHANISM.md, \"Adaptive power caps\"). "
          "Prints the policy id.");
      static ClientFlags f;
      static std::string row;
      static int64_t cap_w = 0;
      static ControlFlags control{"floor"};
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("--row", row, "Row path, e.g. eu/eu-1a/r1")->required();
      cmd->add_option("--cap-w", cap_w, "Cap in watts")->required();
      control.Add(cmd, "floor", "in units per node-hour");
      cmd->callback([exit_code] {
        pb::AdaptivePowerCapRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::PolicyResponse>(
            f,
            [&]() -> Status {
              q.set_row(row);
              q.set_cap_w(cap_w);
              return control.Fill(&q, &pb::AdaptivePowerCapRequest::set_min_floor,
                                  &pb::AdaptivePowerCapRequest::set_max_floor);
            },
            [&](Client& c, pb::PolicyResponse* r) { return c.op->AddAdaptivePowerCap(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = pc->add_subcommand(
          "set-cap",
          "Change a live adaptive cap's cap in place (a cooling failure, or its end): the controller keeps its "
          "floor and its step times, and its next step measures against the new target");
      static ClientFlags f;
      static uint32_t policy = 0;
      static int64_t cap_w = 0;
      AddClientFlags(cmd, &f);
      cmd->add_option("policy", policy, "Policy id of the adaptive cap")->required();
      cmd->add_option("--cap-w", cap_w, "The new cap in watts")->required();
      cmd->callback([exit_code] {
        pb::SetAdaptiveCapRequest q;
        q.set_policy(policy);
        q.set_cap(cap_w);
        *exit_code = RunCall<pb::SetAdaptiveCapResponse>(
            f, nullptr, [&](Client& c, pb::SetAdaptiveCapResponse* r) { return c.op->SetAdaptiveCap(c.Ctx().get(), q, r); });
      });
    }
  }
  {
    auto* carbon = app.add_subcommand("carbon", "Operator: carbon InfraMaps");
    carbon->require_subcommand(1);
    {
      auto* cmd = carbon->add_subcommand(
          "budget",
          "An adaptive carbon budget on a region: a controller sets a carbon price per tonne so that the region's "
          "emissions that stay (power x intensity over held nodes not leaving) come under the target "
          "budget x (1 - margin); each node's floor is intensity x power x price (docs/MECHANISM.md, \"Adaptive "
          "carbon budgets\"). Prints the policy id.");
      static ClientFlags f;
      static std::string region;
      static int64_t budget = 0;
      static std::vector<std::string> intensity;
      static ControlFlags control{"price"};
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("--region", region, "Region path, e.g. eu")->required();
      cmd->add_option("--budget-g-per-h", budget, "Budget in grams CO2 per hour")->required();
      cmd->add_option("--intensity", intensity,
                      "IN=G: carbon intensity G (gCO2/kWh) from IN after now (a duration: 0, 30m, 6h; repeatable, "
                      "ascending)")
          ->required();
      control.Add(cmd, "price", "in units per tonne CO2");
      cmd->callback([exit_code] {
        pb::AdaptiveCarbonBudgetRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::PolicyResponse>(
            f,
            [&]() -> Status {
              q.set_region(region);
              q.set_budget_g_per_h(budget);
              Micros now = server::WallClockMicros();
              for (size_t i = 0; i < intensity.size(); ++i) {
                std::string field = "intensity[" + std::to_string(i) + "]";
                auto eq = intensity[i].find('=');
                if (eq == std::string::npos) return InvalidArgument(field + ": must be IN=G, e.g. 0=300 or 6h=120");
                LZ_ASSIGN_OR_RETURN(Micros in, ParseDuration(intensity[i].substr(0, eq), field + ".in"));
                std::string g = intensity[i].substr(eq + 1);
                int64_t grams = 0;
                auto [end, ec] = std::from_chars(g.data(), g.data() + g.size(), grams);
                if (ec != std::errc() || end != g.data() + g.size() || grams < 0) {
                  return InvalidArgument(field + ".g: '" + g + "' is not a whole number of grams per kWh >= 0");
                }
                auto* pt = q.add_series();
                pt->set_from(now + in);
                pt->set_g_per_kwh(grams);
              }
              return control.Fill(&q, &pb::AdaptiveCarbonBudgetRequest::set_min_price,
                                  &pb::AdaptiveCarbonBudgetRequest::set_max_price);
            },
            [&](Client& c, pb::PolicyResponse* r) { return c.op->AddAdaptiveCarbonBudget(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
    {
      auto* cmd = carbon->add_subcommand(
          "set-budget",
          "Change a live adaptive carbon budget's budget in place: the controller keeps its price and step times");
      static ClientFlags f;
      static uint32_t policy = 0;
      static int64_t budget = 0;
      AddClientFlags(cmd, &f);
      cmd->add_option("policy", policy, "Policy id of the carbon budget")->required();
      cmd->add_option("--budget-g-per-h", budget, "The new budget in grams CO2 per hour")->required();
      cmd->callback([exit_code] {
        pb::SetAdaptiveCapRequest q;
        q.set_policy(policy);
        q.set_cap(budget);
        *exit_code = RunCall<pb::SetAdaptiveCapResponse>(
            f, nullptr, [&](Client& c, pb::SetAdaptiveCapResponse* r) { return c.op->SetAdaptiveCap(c.Ctx().get(), q, r); });
      });
    }
  }
  {
    auto* vol = app.add_subcommand("volatility", "Operator: volatility controls and market parameters");
    vol->require_subcommand(1);
    auto* set = vol->add_subcommand("set", "Change some parameters (the others keep their values)");
    auto* show = vol->add_subcommand("show", "Show the parameters in force");
    static ClientFlags f, fs;
    static std::string grace, clip_interval, min_hold, decay_beta, tick;
    static int64_t hysteresis_ppm = -1, clip_alpha_ppm = -1;
    AddClientFlags(set, &f);
    AddClientFlags(show, &fs);
    set->add_option("--grace", grace, "Notice-to-transfer window, e.g. 2m");
    set->add_option("--hysteresis-ppm", hysteresis_ppm, "A challenger must beat the limit by this fraction (ppm)");
    set->add_option("--tick", tick, "Smallest price step, in units");
    set->add_option("--clip-alpha-ppm", clip_alpha_ppm, "Price clipping per interval (ppm; 0 turns it off)");
    set->add_option("--clip-interval", clip_interval, "Clipping interval, e.g. 60s");
    set->add_option("--decay-beta", decay_beta, "Floor decay after release, units per hour per second");
    set->add_option("--min-hold", min_hold, "Minimum hold before tenant orders may contest, e.g. 5m");
    set->callback([exit_code] {
      pb::SetVolatilityRequest q;
      *exit_code = RunCall<pb::MarketParams>(
          f,
          [&]() -> Status {
            auto* p = q.mutable_params();
            if (!grace.empty()) {
              LZ_ASSIGN_OR_RETURN(Micros g, ParseDuration(grace, "grace"));
              p->set_grace_us(g);
              q.add_update("grace_us");
            }
            if (hysteresis_ppm >= 0) {
              p->set_hysteresis_ppm(hysteresis_ppm);
              q.add_update("hysteresis_ppm");
            }
            if (!tick.empty()) {
              LZ_ASSIGN_OR_RETURN(int64_t t, ParseMoney(tick, "tick"));
              p->set_tick(t);
              q.add_update("tick");
            }
            if (clip_alpha_ppm >= 0) {
              p->set_clip_alpha_ppm(clip_alpha_ppm);
              q.add_update("clip_alpha_ppm");
            }
            if (!clip_interval.empty()) {
              LZ_ASSIGN_OR_RETURN(Micros d, ParseDuration(clip_interval, "clip-interval"));
              p->set_clip_interval_us(d);
              q.add_update("clip_interval_us");
            }
            if (!decay_beta.empty()) {
              LZ_ASSIGN_OR_RETURN(int64_t b, ParseMoney(decay_beta, "decay-beta"));
              p->set_decay_beta(b);
              q.add_update("decay_beta");
            }
            if (!min_hold.empty()) {
              LZ_ASSIGN_OR_RETURN(Micros d, ParseDuration(min_hold, "min-hold"));
              p->set_min_hold_us(d);
              q.add_update("min_hold_us");
            }
            if (q.update_size() == 0) return InvalidArgument("volatility set: give at least one parameter");
            return Status::Ok();
          },
          [&](Client& c, pb::MarketParams* r) { return c.op->SetVolatility(c.Ctx().get(), q, r); });
    });
    show->callback([exit_code] {
      *exit_code = RunCall<pb::MarketParams>(fs, nullptr, [&](Client& c, pb::MarketParams* r) {
        return c.op->SetVolatility(c.Ctx().get(), pb::SetVolatilityRequest(), r);
      });
    });
  }
  {
    auto* cmd = app.add_subcommand("audit", "Operator: the most recent journal records and who made them");
    static ClientFlags f;
    static uint32_t limit = 50;
    AddClientFlags(cmd, &f);
    cmd->add_option("--limit", limit, "Records");
    cmd->callback([exit_code] {
      pb::AuditLogRequest q;
      q.set_limit(limit);
      *exit_code = RunCall<pb::AuditLogResponse>(
          f, nullptr, [&](Client& c, pb::AuditLogResponse* r) { return c.op->GetAuditLog(c.Ctx().get(), q, r); });
    });
  }

  // ---- Admin commands ----
  {
    auto* tenant = app.add_subcommand("tenant", "Admin: create tenants and deposit money");
    tenant->require_subcommand(1);
    {
      auto* cmd = tenant->add_subcommand("create", "Create a tenant with a budget; prints its first token");
      static ClientFlags f;
      static std::string name, balance = "0", max_rate, token_out;
      AddClientFlags(cmd, &f);
      static std::string key;
      AddKeyFlag(cmd, &key);
      cmd->add_option("name", name, "Tenant name (letters, digits, - _ .)")->required();
      cmd->add_option("--balance", balance, "Initial balance, in units");
      cmd->add_option("--max-rate", max_rate, "Maximum spend per hour, in units (default: none)");
      cmd->add_option("--token-out", token_out, "Write the tenant's token to this file (mode 0600) instead of printing it");
      cmd->callback([exit_code] {
        pb::CreateTenantRequest q;
        q.set_idempotency_key(KeyOrNew(key));  // Every retry carries it.
        *exit_code = RunCall<pb::CreateTenantResponse>(
            f,
            [&]() -> Status {
              q.set_name(name);
              int64_t b = 0;
              LZ_RETURN_IF_ERROR(ParsePriceFlag(balance, "balance", &b));
              q.set_balance(b);
              if (!max_rate.empty()) {
                int64_t m = 0;
                LZ_RETURN_IF_ERROR(ParsePriceFlag(max_rate, "max-rate", &m));
                q.set_max_rate(m);
              }
              return Status::Ok();
            },
            [&](Client& c, pb::CreateTenantResponse* r) {
              grpc::Status g = c.admin->CreateTenant(c.Ctx().get(), q, r);
              if (g.ok() && !token_out.empty()) {
                std::FILE* fp = std::fopen(token_out.c_str(), "w");
                if (!fp) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "token-out: cannot write " + token_out);
                ::fchmod(fileno(fp), 0600);
                std::fprintf(fp, "%s\n", r->token().c_str());
                std::fclose(fp);
                r->set_token("(written to " + token_out + ")");
              }
              return g;
            },
            nullptr, /*idempotent=*/true);
      });
    }
    {
      auto* cmd = tenant->add_subcommand("deposit", "Add money to a tenant's balance");
      static ClientFlags f;
      static std::string name, amount, key;
      AddClientFlags(cmd, &f);
      cmd->add_option("name", name, "Tenant name")->required();
      cmd->add_option("--amount", amount, "Amount, in units")->required();
      AddKeyFlag(cmd, &key);
      cmd->callback([exit_code] {
        pb::DepositRequest q;
        *exit_code = RunCall<pb::DepositResponse>(
            f,
            [&]() -> Status {
              int64_t a = 0;
              LZ_RETURN_IF_ERROR(ParsePriceFlag(amount, "amount", &a));
              q.set_tenant(name);
              q.set_amount(a);
              q.set_idempotency_key(KeyOrNew(key));
              return Status::Ok();
            },
            [&](Client& c, pb::DepositResponse* r) { return c.admin->Deposit(c.Ctx().get(), q, r); }, nullptr,
            /*idempotent=*/true);
      });
    }
  }
  {
    auto* token = app.add_subcommand("token", "Admin: issue and revoke bearer tokens");
    token->require_subcommand(1);
    {
      auto* cmd = token->add_subcommand("issue", "Issue a token (shown once; the server keeps only its hash)");
      static ClientFlags f;
      static std::string role, tenant, name, out;
      AddClientFlags(cmd, &f);
      cmd->add_option("--role", role, "tenant, operator or admin")->required();
      cmd->add_option("--tenant", tenant, "The tenant, for --role tenant");
      cmd->add_option("--name", name, "A label for the audit log");
      cmd->add_option("--out", out, "Write the token to this file (mode 0600) instead of printing it");
      cmd->callback([exit_code] {
        pb::IssueTokenRequest q;
        q.set_role(role);
        q.set_tenant(tenant);
        q.set_name(name);
        *exit_code = RunCall<pb::IssueTokenResponse>(f, nullptr, [&](Client& c, pb::IssueTokenResponse* r) {
          grpc::Status g = c.admin->IssueToken(c.Ctx().get(), q, r);
          if (g.ok() && !out.empty()) {
            std::FILE* fp = std::fopen(out.c_str(), "w");
            if (!fp) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "out: cannot write " + out);
            ::fchmod(fileno(fp), 0600);
            std::fprintf(fp, "%s\n", r->token().c_str());
            std::fclose(fp);
            r->set_token("(written to " + out + ")");
          }
          return g;
        });
      });
    }
    {
      auto* cmd = token->add_subcommand("revoke", "Revoke a token by id (idempotent)");
      static ClientFlags f;
      static uint64_t id = 0;
      AddClientFlags(cmd, &f);
      cmd->add_option("token_id", id, "Token id")->required();
      cmd->callback([exit_code] {
        pb::RevokeTokenRequest q;
        q.set_token_id(id);
        *exit_code = RunCall<pb::RevokeTokenResponse>(
            f, nullptr, [&](Client& c, pb::RevokeTokenResponse* r) { return c.admin->RevokeToken(c.Ctx().get(), q, r); });
      });
    }
  }

  // ---- bench server (under the `bench` family registered by cmd_bench.cc) ----
  {
    CLI::App* bench = nullptr;
    try {
      bench = app.get_subcommand("bench");
    } catch (const CLI::OptionNotFound&) {
      bench = app.add_subcommand("bench", "Benchmarks (not tests)");
      bench->require_subcommand(1);
    }
    auto* cmd = bench->add_subcommand("server", "Durable bid updates per second and acknowledgement latency over gRPC");
    static BenchFlags b;
    AddClientFlags(cmd, &b.client);
    cmd->add_option("--tenants", b.tenants, "Concurrent tenants (each its own connection)")->check(CLI::Range(1, 1024));
    cmd->add_option("--seconds", b.seconds,
                    "Measurement time (with --rate, every message due in it is sent and waited for, so a run "
                    "against a slow server lasts longer)")->check(CLI::Range(0.1, 3600.0));
    cmd->add_option("--window", b.window,
                    "Updates in flight per tenant (stream mode; the server keeps at most 4096 of a stream "
                    "unacknowledged)")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--batch", b.batch,
                    "Stream mode: up to this many updates per message (UpdateOrderRequest.updates); 1 sends one "
                    "update per message")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--mode", b.mode, "stream (bidirectional StreamUpdates) or unary (UpdateOrder)")
        ->check(CLI::IsMember({"stream", "unary"}));
    cmd->add_option("--rate", b.rate,
                    "Stream mode: offer this many updates per second over all tenants on a fixed schedule (open "
                    "loop: each tenant sends a message of --batch updates every batch x tenants / rate seconds; "
                    "latency from the message's scheduled time, and how late messages left in send_late_*); 0 sends "
                    "whenever the window has room")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1e7));
    cmd->callback([exit_code] {
      if (b.rate > 0 && b.mode == "unary") {
        // A unary caller has one update in flight: it cannot keep a schedule.
        *exit_code = Fail(b.client.json, grpc::StatusCode::INVALID_ARGUMENT,
                          "--rate: an open-loop schedule needs --mode stream (a unary tenant has one update in flight)");
        return;
      }
      if (b.rate > 0 && b.rate < 1) {
        *exit_code = Fail(b.client.json, grpc::StatusCode::INVALID_ARGUMENT,
                          "--rate: at least 1 update per second (0 runs a closed loop)");
        return;
      }
      if (b.rate > 0 && b.batch > b.window) {
        *exit_code = Fail(b.client.json, grpc::StatusCode::INVALID_ARGUMENT,
                          "--batch: with --rate each message carries --batch updates, which must fit the window (--window " +
                              std::to_string(b.window) + ")");
        return;
      }
      *exit_code = RunBenchServer(b);
    });
  }

  // ---- agent: one tenant's EconAdapter with a ready strategy ----
  {
    auto* cmd = app.add_subcommand("agent", "Run an EconAdapter agent for a tenant against a live server");
    static ClientFlags f;
    static server::AgentOptions ao;
    static std::string value = "10", cap;
    AddClientFlags(cmd, &f);
    cmd->add_option("--strategy", ao.strategy,
                    "cost-of-delay (the truthful bid, docs/STRATEGIES.md), fixed, on-demand, spot, budget, locality, "
                    "migration")
        ->capture_default_str();
    cmd->add_option("--value", value,
                    "What a node-hour is worth, in units; cost-of-delay: what the job finishing in its ideal time is "
                    "worth");
    cmd->add_option("--hours", ao.hours, "cost-of-delay: the job's estimated duration alone on --type")
        ->capture_default_str();
    cmd->add_option("--cap", cap, "budget: the most per node per hour, in units");
    cmd->add_option("--type", ao.node_type, "Hardware type wanted")->capture_default_str();
    cmd->add_option("--location", ao.location, "Narrow to a location path, e.g. eu/eu-1a");
    cmd->add_option("--count", ao.count, "Nodes wanted")->capture_default_str();
    cmd->add_flag("--gang", ao.gang, "All or nothing");
    cmd->add_option("--seconds", ao.seconds, "Stop after this long (default: until Ctrl-C)");
    cmd->callback([exit_code] {
      Status st = ParsePriceFlag(value, "value", &ao.value);
      if (st.ok() && !cap.empty()) st = ParsePriceFlag(cap, "cap", &ao.cap);
      if (st.ok()) {
        auto tok = server::ReadTokenFile(f.token_file, "token-file");
        if (tok.ok()) ao.connect.token = *tok;
        else st = tok.status();
      }
      if (!st.ok()) {
        *exit_code = Fail(f.json, st);
        return;
      }
      ao.connect.address = f.server;
      ao.connect.tls_ca = f.tls_ca;
      struct sigaction sa {};
      sa.sa_handler = OnSignal;
      sigaction(SIGINT, &sa, nullptr);
      sigaction(SIGTERM, &sa, nullptr);
      static std::atomic<bool> stop{false};
      std::thread watcher([] {
        while (!stop) {
          if (g_stop) stop = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      auto r = server::RunAgent(ao, &stop, [](const std::string& line) { std::fprintf(stderr, "agent: %s\n", line.c_str()); });
      stop = true;
      watcher.join();
      if (!r.ok()) {
        *exit_code = Fail(f.json, r.status());
        return;
      }
      json j = {{"tenant", r->tenant}, {"held_at_end", r->held_at_end}, {"gained", r->gained}, {"lost", r->lost},
                {"notices", r->notices}, {"charged", r->charged}, {"reprices", r->reprices},
                {"orders_placed", r->orders_placed}, {"orders_updated", r->orders_updated},
                {"limits_set", r->limits_set}, {"rejected", r->rejected}};
      if (f.json) std::cout << j.dump() << "\n";
      else PrintHuman(j);
      *exit_code = 0;
    });
  }

  // ---- demo live (under the `demo` family registered by cmd_demo.cc) ----
  {
    CLI::App* demo = nullptr;
    try {
      demo = app.get_subcommand("demo");
    } catch (const CLI::OptionNotFound&) {
      demo = app.add_subcommand("demo", "Run a demonstration");
      demo->require_subcommand(1);
    }
    auto* cmd = demo->add_subcommand("live", "A live market: server, cluster and strategy agents over real gRPC");
    static server::LiveDemoOptions lo;
    cmd->add_option("--seconds", lo.seconds, "How long to run")->capture_default_str()->check(CLI::Range(5.0, 3600.0));
    cmd->add_option("--cluster", lo.cluster, "Cluster YAML")->capture_default_str();
    cmd->add_option("--db", lo.db, "Keep the journal in this SQLite file (default: a temporary one)");
    cmd->add_flag("--json", lo.json, "Print one JSON summary (narration goes to stderr)");
    cmd->add_flag("--quiet", lo.quiet, "Summary only");
    cmd->callback([exit_code] { *exit_code = server::RunLiveDemo(lo); });
  }
}

}  // namespace laissez::cli
