// The fixture of the server's integration tests (server_test.cc and
// server_hardening_test.cc): a server on loopback with stubs, tokens for two
// tenants, an operator and the admin, and a watch-stream reader.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "laissez/v1/market.grpc.pb.h"
#include "server/grpc_client.h"
#include "server/server.h"

namespace laissez::server {
namespace testing_fixture {
namespace pb = ::laissez::v1;
using grpc::StatusCode;

constexpr int64_t kUnit = 1'000'000;

inline std::string TempPath(const std::string& name) {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("laissez_server_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name))
      .string();
}

// A running server plus stubs; tokens for two tenants, an operator and admin.
class ServerFixture : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(DefaultOptions()); }
  void TearDown() override {
    if (server_) server_->Shutdown();
    for (const auto& p : cleanup_) std::filesystem::remove(p);
  }

  ServerOptions DefaultOptions() {
    ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.http = "127.0.0.1:0";
    o.rate_limit = 0;
    return o;
  }

  void StartServer(ServerOptions o) {
    server_ = std::make_unique<Server>(std::move(o));
    Status st = server_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    if (!server_->admin_token().empty()) admin_ = server_->admin_token();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    tenant_stub_ = pb::TenantService::NewStub(channel_);
    op_stub_ = pb::OperatorService::NewStub(channel_);
    admin_stub_ = pb::AdminService::NewStub(channel_);
  }

  // Replaces the in-memory server with one on a file (removed at the end):
  // SQLite, or `store` (ServerOptions::store); returns its options, to start
  // it again after a Shutdown.
  ServerOptions RestartOnDisk(const std::string& name, const std::string& store = "") {
    server_->Shutdown();
    std::string db = TempPath(store.empty() ? name : store + "-" + name);
    cleanup_ = {db, db + "-wal", db + "-shm", db + ".admin-token", db + ".identity", db + ".snapshot"};
    ServerOptions o = DefaultOptions();
    o.db = db;
    o.store = store;
    StartServer(o);
    return o;
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto c = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return c;
  }

  // Creates tenants a and b, an operator token and a small cluster.
  void Populate() {
    a_ = CreateTenant("acme", 1000 * kUnit);
    b_ = CreateTenant("bolt", 1000 * kUnit);
    pb::IssueTokenRequest q;
    q.set_role("operator");
    q.set_name("ops");
    pb::IssueTokenResponse r;
    ASSERT_TRUE(admin_stub_->IssueToken(Ctx(admin_).get(), q, &r).ok());
    op_ = r.token();
    pb::AddNodesRequest add;
    for (int i = 1; i <= 4; ++i) {
      auto* n = add.add_nodes();
      n->set_name("n" + std::to_string(i));
      n->set_type("h100x8");
      n->set_region("eu");
      n->set_zone("eu-1a");
      n->set_row("r1");
      n->set_rack(i <= 2 ? "k1" : "k2");
      n->set_gpus(8);
      n->set_power_w(6000);
    }
    auto* l4 = add.add_nodes();
    *l4 = add.nodes(0);
    l4->set_name("l4-1");
    l4->set_type("l4");
    pb::AddNodesResponse ar;
    grpc::Status st = op_stub_->AddNodes(Ctx(op_).get(), add, &ar);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(ar.node_ids_size(), 5);
  }

  std::string CreateTenant(const std::string& name, int64_t balance) {
    pb::CreateTenantRequest q;
    q.set_name(name);
    q.set_balance(balance);
    pb::CreateTenantResponse r;
    grpc::Status st = admin_stub_->CreateTenant(Ctx(admin_).get(), q, &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return r.token();
  }

  grpc::Status Place(const std::string& token, const std::string& scope, int64_t price, uint64_t* id = nullptr) {
    pb::PlaceOrderRequest q;
    q.set_scope(scope);
    q.set_price(price);
    pb::PlaceOrderResponse r;
    grpc::Status st = tenant_stub_->PlaceOrder(Ctx(token).get(), q, &r);
    if (id) *id = r.order();
    return st;
  }

  pb::ListNodesResponse Nodes(const std::string& token) {
    pb::ListNodesResponse r;
    EXPECT_TRUE(tenant_stub_->ListNodes(Ctx(token).get(), pb::ListNodesRequest(), &r).ok());
    return r;
  }

  pb::OperatorLedgerResponse OperatorLedger() {
    pb::OperatorLedgerResponse r;
    EXPECT_TRUE(op_stub_->GetLedger(Ctx(admin_).get(), pb::OperatorLedgerRequest(), &r).ok());
    return r;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::TenantService::Stub> tenant_stub_;
  std::unique_ptr<pb::OperatorService::Stub> op_stub_;
  std::unique_ptr<pb::AdminService::Stub> admin_stub_;
  std::string admin_, op_, a_, b_;
  std::vector<std::string> cleanup_;
};

// Reads a watch stream on its own thread until `pred` matches an event.
class Watcher {
 public:
  Watcher(pb::TenantService::Stub* stub, const std::string& token, std::vector<std::string> vertices)
      : Watcher(stub, token, Request(std::move(vertices))) {}
  // Any watch (tenant or operator stub, resuming or not).
  template <typename Stub>
  Watcher(Stub* stub, const std::string& token, const pb::WatchRequest& q) {
    ctx_.AddMetadata("authorization", "Bearer " + token);
    reader_ = stub->Watch(&ctx_, q);
    reader_->WaitForInitialMetadata();
    const auto& md = ctx_.GetServerInitialMetadata();
    if (auto it = md.find("laissez-position"); it != md.end()) {
      position_ = std::string(it->second.data(), it->second.size());
    }
    thread_ = std::thread([this] {
      pb::Event e;
      while (reader_->Read(&e)) {
        std::lock_guard lock(mu_);
        events_.push_back(e);
        cv_.notify_all();
      }
      grpc::Status st = reader_->Finish();
      std::lock_guard lock(mu_);
      status_ = st;
      done_ = true;
      cv_.notify_all();
    });
  }
  ~Watcher() {
    ctx_.TryCancel();
    thread_.join();
  }
  // The stream's `laissez-position` metadata ("SEQ.INDEX"; empty if it failed at once).
  const std::string& position() const { return position_; }
  // Waits until the stream has `n` events or has ended; returns the events.
  std::vector<pb::Event> WaitCount(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return done_ || events_.size() >= n; });
    return events_;
  }
  // Waits until the stream ends; returns its status.
  grpc::Status WaitEnd() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return done_; });
    return done_ ? status_ : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test: the stream did not end");
  }
  // Waits (bounded, so a broken server fails the test instead of hanging).
  bool WaitFor(const std::function<bool(const pb::Event&)>& pred, pb::Event* out = nullptr) {
    std::unique_lock lock(mu_);
    bool found = cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      for (const auto& e : events_) {
        if (pred(e)) {
          if (out) *out = e;
          return true;
        }
      }
      return done_;
    });
    if (!found) return false;
    for (const auto& e : events_) {
      if (pred(e)) return true;
    }
    return false;
  }
  std::vector<pb::Event> events() {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<pb::Event>> reader_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::Event> events_;
  std::string position_;
  grpc::Status status_;
  bool done_ = false;

  static pb::WatchRequest Request(std::vector<std::string> vertices) {
    pb::WatchRequest q;
    for (auto& v : vertices) q.add_vertices(v);
    return q;
  }
};

inline auto Type(const std::string& t) {
  return [t](const pb::Event& e) { return e.type() == t; };
}

}  // namespace testing_fixture
}  // namespace laissez::server
