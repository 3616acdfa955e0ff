// Integration tests of the control plane over real gRPC on loopback: every
// call, the watch stream, the authorization matrix, the bad-input table, rate
// limits, oversized requests, restart with the SQLite store, the HTTP
// listener and the SDK's gRPC transport.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "laissez/v1/market.grpc.pb.h"
#include "server/grpc_client.h"
#include "server/server.h"
#include "server/server_test_fixture.h"

namespace laissez::server {
namespace {
namespace pb = ::laissez::v1;
using grpc::StatusCode;
using namespace testing_fixture;  // NOLINT

// A valid adaptive power cap on row eu/eu-1a/r1 (Populate's row).
pb::AdaptivePowerCapRequest AdaptiveCap() {
  pb::AdaptivePowerCapRequest q;
  q.set_row("eu/eu-1a/r1");
  q.set_cap_w(20000);
  q.set_margin_ppm(100'000);
  q.set_band_ppm(100'000);
  q.set_interval_us(60'000'000);
  q.set_rise_ppm(250'000);
  q.set_rise_min(kUnit / 4);
  q.set_rise_max(2 * kUnit);
  q.set_fall_step(kUnit / 10);
  q.set_min_floor(kUnit);
  q.set_max_floor(kInfPrice);
  return q;
}

// A valid adaptive carbon budget on region eu (Populate's region).
pb::AdaptiveCarbonBudgetRequest CarbonBudget() {
  pb::AdaptiveCarbonBudgetRequest q;
  q.set_region("eu");
  q.set_budget_g_per_h(5'000);
  auto* p0 = q.add_series();
  p0->set_from(0);
  p0->set_g_per_kwh(300);
  auto* p1 = q.add_series();
  p1->set_from(4'000'000'000'000'000);
  p1->set_g_per_kwh(120);
  q.set_margin_ppm(100'000);
  q.set_band_ppm(100'000);
  q.set_interval_us(60'000'000);
  q.set_rise_ppm(250'000);
  q.set_rise_min(100 * kUnit);
  q.set_rise_max(1'000 * kUnit);
  q.set_fall_step(50 * kUnit);
  q.set_min_price(10 * kUnit);
  q.set_max_price(kInfPrice);
  return q;
}

// After a batch, the writer commits it itself when no command waits (one
// thread wake-up fewer before the acks), and a completion runs only once its
// records are in the store; under a burst batches go to the committer too,
// and completions still come in submission order.
TEST(MarketCoreCommits, TheWriterCommitsItsOwnBatchWhenNothingWaits) {
  auto store = NewMemoryStore();
  TokenTable tokens;
  Metrics metrics;
  std::atomic<Micros> now{1'700'000'000'000'000};
  CoreOptions options;
  options.clock = [&] { return now.fetch_add(1'000'000); };  // Every batch journals an advance.
  MarketCore core(store.get(), &tokens, &metrics, options);
  ASSERT_TRUE(core.Start().ok());
  for (int i = 0; i < 20; ++i) {
    std::thread::id ran, completed;
    uint64_t applied = 0, stored = 0;
    std::atomic<bool> finished{false};
    core.Submit(
        "server",
        [&](WriterContext& w) {
          ran = std::this_thread::get_id();
          w.MutationTime();
          applied = core.applied_seq();
        },
        [&](const Status& st) {
          EXPECT_TRUE(st.ok()) << st.ToString();
          completed = std::this_thread::get_id();
          stored = *store->LastSeq();
          finished = true;
          finished.notify_one();
        });
    finished.wait(false);
    EXPECT_EQ(ran, completed) << "command " << i;
    EXPECT_GE(stored, applied) << "command " << i;  // Its advance was committed first.
    EXPECT_GT(applied, 0u);
  }
  constexpr int kThreads = 4, kEach = 500;
  std::mutex mu;
  std::vector<std::vector<int>> order(kThreads);
  std::atomic<int> left{kThreads * kEach};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        core.Submit(
            "server", [](WriterContext& w) { w.MutationTime(); },
            [&, t, i](const Status& st) {
              EXPECT_TRUE(st.ok());
              std::lock_guard lock(mu);
              order[t].push_back(i);
              if (--left == 0) left.notify_one();
            });
      }
    });
  }
  for (auto& th : submitters) th.join();
  for (int n = left.load(); n != 0; n = left.load()) left.wait(n);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(order[t].size(), static_cast<size_t>(kEach));
    EXPECT_TRUE(std::is_sorted(order[t].begin(), order[t].end())) << "submitter " << t;
  }
  core.Stop();
}

// Execute and ExecAsync hand back the work's own result (a Status or a
// Result<T>) once it is durable, and UNAVAILABLE once the core has stopped.
TEST(MarketCoreCommits, ExecuteHandsBackTheWorksResult) {
  auto store = NewMemoryStore();
  TokenTable tokens;
  Metrics metrics;
  MarketCore core(store.get(), &tokens, &metrics);
  ASSERT_TRUE(core.Start().ok());
  Status refused = core.Execute("server", [](WriterContext&) -> Status { return NotFound("x: none"); });
  EXPECT_EQ(refused.code(), laissez::StatusCode::kNotFound);
  Result<int> seven = core.Execute<int>("server", [](WriterContext&) -> Result<int> { return 7; });
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(*seven, 7);
  std::atomic<bool> done{false};
  Status got;
  core.ExecAsync(
      "server", [](WriterContext&) -> Status { return InvalidArgument("y: bad"); },
      [&](Status st) {
        got = std::move(st);
        done = true;
        done.notify_one();
      });
  done.wait(false);
  EXPECT_EQ(got.code(), laissez::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.message(), "y: bad");
  core.Stop();
  Status stopped = core.Execute("server", [](WriterContext&) -> Status { return Status::Ok(); });
  EXPECT_EQ(stopped.code(), laissez::StatusCode::kUnavailable);
}

// LAISSEZ_COMMIT_TRACE=FILE: the core stamps each command and writes the
// per-phase table to FILE when it stops (docs/SERVER.md, "Tracing the ack's path").
TEST(MarketCoreTrace, WritesEachPhaseWhenTheCoreStops) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("laissez-commit-trace-" + std::to_string(getpid()))).string();
  std::filesystem::remove(path);
  auto store = NewMemoryStore();
  TokenTable tokens;
  Metrics metrics;
  setenv("LAISSEZ_COMMIT_TRACE", path.c_str(), 1);
  MarketCore core(store.get(), &tokens, &metrics);
  unsetenv("LAISSEZ_COMMIT_TRACE");
  ASSERT_TRUE(core.Start().ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(core.Execute("server", [](WriterContext&) -> Status { return Status::Ok(); }).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "written before the core stopped";
  core.Stop();
  std::ifstream in(path);
  ASSERT_TRUE(in) << "no trace at " << path;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  EXPECT_EQ(text.rfind("commands 3,", 0), 0u) << text;
  for (const char* phase : {"queued -> the writer begins its batch |", "COMMIT (WAL writes, fsync) |",
                            "COMMIT ends -> its completion returned (completions in turn) |",
                            "total, queued -> completion returned |"}) {
    EXPECT_NE(text.find(phase), std::string::npos) << "no line for " << phase << " in:\n" << text;
  }
}

TEST_F(ServerFixture, FreshServerCreatesAnAdminToken) {
  EXPECT_TRUE(server_->fresh());
  EXPECT_EQ(admin_.substr(0, 3), "lz_");
  EXPECT_EQ(admin_.size(), 67u);
}

TEST_F(ServerFixture, TenantFlowEndToEnd) {
  Populate();
  Watcher wa(tenant_stub_.get(), a_, {"h100x8"});
  uint64_t order = 0;
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit, &order).ok());
  ASSERT_TRUE(wa.WaitFor(Type("allocated")));
  auto nodes = Nodes(a_);
  ASSERT_EQ(nodes.nodes_size(), 1);
  const std::string held = nodes.nodes(0).node();
  EXPECT_EQ(nodes.nodes(0).limit(), 10 * kUnit);
  EXPECT_EQ(nodes.nodes(0).type(), "h100x8");

  // Quote at the type root: three nodes left free at floor 0.
  pb::QuoteRequest qq;
  qq.set_vertex("h100x8");
  qq.set_depth(true);
  pb::QuoteResponse qr;
  ASSERT_TRUE(tenant_stub_->Quote(Ctx(b_).get(), qq, &qr).ok());
  EXPECT_EQ(qr.quote().total(), 4u);
  EXPECT_EQ(qr.quote().free(), 3u);
  EXPECT_EQ(qr.quote().held(), 1u);

  // Raise the retention limit; the eviction quote reflects it.
  pb::SetLimitRequest sl;
  sl.set_node(held);
  sl.set_limit(20 * kUnit);
  pb::SetLimitResponse slr;
  ASSERT_TRUE(tenant_stub_->SetLimit(Ctx(a_).get(), sl, &slr).ok());
  pb::EvictionQuoteRequest eq;
  eq.set_node(held);
  pb::EvictionQuoteResponse er;
  ASSERT_TRUE(tenant_stub_->EvictionQuote(Ctx(a_).get(), eq, &er).ok());
  EXPECT_EQ(er.limit(), 20 * kUnit);
  EXPECT_FALSE(er.contested());
  EXPECT_GT(er.obtain(), 20 * kUnit);

  // b outbids a on that node: a gets a notice with a deadline, never b's name.
  ASSERT_TRUE(Place(b_, held, 30 * kUnit).ok());
  pb::Event notice;
  ASSERT_TRUE(wa.WaitFor(Type("notice"), &notice));
  EXPECT_EQ(notice.node(), held);
  EXPECT_GT(notice.deadline(), notice.time());
  EXPECT_NE(notice.reasons().find("outbid"), std::string::npos);
  EXPECT_TRUE(notice.tenant().empty());
  EXPECT_EQ(notice.order(), 0u) << "the challenger's order id leaked";
  EXPECT_EQ(notice.other_id(), UINT32_MAX);
  EXPECT_TRUE(notice.other().empty());

  // a relinquishes early: the node moves to b at once.
  pb::RelinquishRequest rq;
  rq.set_node(held);
  pb::RelinquishResponse rr;
  ASSERT_TRUE(tenant_stub_->Relinquish(Ctx(a_).get(), rq, &rr).ok());
  // The contested node moves to its challenger: a sees it leave.
  ASSERT_TRUE(wa.WaitFor([](const pb::Event& e) { return e.type() == "released" || e.type() == "transferred"; }));
  EXPECT_EQ(Nodes(a_).nodes_size(), 0);
  ASSERT_EQ(Nodes(b_).nodes_size(), 1);
  EXPECT_EQ(Nodes(b_).nodes(0).node(), held);

  // a's ledger shows what it paid; the balance reflects it.
  pb::BalanceResponse bal;
  ASSERT_TRUE(tenant_stub_->GetBalance(Ctx(a_).get(), pb::GetBalanceRequest(), &bal).ok());
  EXPECT_EQ(bal.tenant(), "acme");
  pb::LedgerResponse led;
  ASSERT_TRUE(tenant_stub_->GetLedger(Ctx(a_).get(), pb::GetLedgerRequest(), &led).ok());
  int64_t paid = 0;
  for (const auto& e : led.entries()) {
    EXPECT_TRUE(e.tenant().empty());
    paid += e.amount();
  }
  EXPECT_EQ(bal.balance(), 1000 * kUnit - paid);
  EXPECT_EQ(bal.paid(), paid);

  // An order that rests, then is updated and cancelled.
  uint64_t resting = 0;
  ASSERT_TRUE(Place(a_, "l4", 0, &resting).ok());
  pb::ListOrdersResponse lo;
  ASSERT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &lo).ok());
  (void)lo;
  pb::UpdateOrderRequest uq;
  uq.set_order(resting);
  uq.set_price(1);
  pb::UpdateOrderResponse ur;
  grpc::Status ust = tenant_stub_->UpdateOrder(Ctx(a_).get(), uq, &ur);
  // The l4 node is free at floor 0, so the order was filled at once; updating
  // a filled order is NOT_FOUND. Either way the call was authorized.
  EXPECT_TRUE(ust.ok() || ust.error_code() == StatusCode::NOT_FOUND) << ust.error_message();

  // Money is conserved: deposits = balances + revenue + unsettled.
  auto led2 = OperatorLedger();
  EXPECT_EQ(led2.deposited(), led2.tenant_balances() + led2.operator_revenue());
}

// A floor at `location` (orders below it rest).
grpc::Status SetFloor(pb::OperatorService::Stub* stub, grpc::ClientContext* ctx, const std::string& location,
                      int64_t price) {
  pb::SetFloorRequest q;
  q.set_location(location);
  q.set_price(price);
  pb::PolicyResponse r;
  return stub->SetFloor(ctx, q, &r);
}

TEST_F(ServerFixture, RestingOrderUpdateCancelAndStream) {
  Populate();
  // A floor keeps the order resting.
  ASSERT_TRUE(SetFloor(op_stub_.get(), Ctx(op_).get(), "eu", 50 * kUnit).ok());
  uint64_t id = 0;
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit, &id).ok());
  pb::ListOrdersResponse lo;
  ASSERT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &lo).ok());
  ASSERT_EQ(lo.orders_size(), 1);
  EXPECT_EQ(lo.orders(0).state(), "resting");
  EXPECT_EQ(lo.orders(0).scope(), "h100x8");

  pb::UpdateOrderRequest uq;
  uq.set_order(id);
  uq.set_price(12 * kUnit);
  pb::UpdateOrderResponse ur;
  ASSERT_TRUE(tenant_stub_->UpdateOrder(Ctx(a_).get(), uq, &ur).ok());

  // Streamed updates: one ack per update, in order, with the tag.
  {
    auto ctx = Ctx(a_);
    auto stream = tenant_stub_->StreamUpdates(ctx.get());
    for (int i = 0; i < 100; ++i) {
      pb::UpdateOrderRequest q;
      q.set_order(id);
      q.set_price((13 + i % 5) * kUnit);
      q.set_tag(static_cast<uint64_t>(i));
      ASSERT_TRUE(stream->Write(q));
    }
    pb::UpdateOrderRequest bad;
    bad.set_order(id);
    bad.set_price(-1);
    bad.set_tag(100);
    ASSERT_TRUE(stream->Write(bad));
    stream->WritesDone();
    pb::UpdateOrderResponse ack;
    std::vector<pb::UpdateOrderResponse> acks;
    while (stream->Read(&ack)) acks.push_back(ack);
    ASSERT_TRUE(stream->Finish().ok());
    ASSERT_EQ(acks.size(), 101u);
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(acks[i].tag(), static_cast<uint64_t>(i));
      EXPECT_EQ(acks[i].code(), 0) << acks[i].message();
    }
    EXPECT_EQ(acks[100].code(), static_cast<int>(StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(acks[100].message().find("price"), std::string::npos);
  }
  ASSERT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &lo).ok());
  // OrderView.spec.price keeps the placed price; the effective price follows
  // updates (no clipping here).
  EXPECT_EQ(lo.orders(0).effective_price(), (13 + 99 % 5) * kUnit);

  pb::CancelOrderRequest cq;
  cq.set_order(id);
  pb::CancelOrderResponse cr;
  ASSERT_TRUE(tenant_stub_->CancelOrder(Ctx(a_).get(), cq, &cr).ok());
  grpc::Status again = tenant_stub_->CancelOrder(Ctx(a_).get(), cq, &cr);
  EXPECT_EQ(again.error_code(), StatusCode::NOT_FOUND);
}

// Several updates per StreamUpdates message: one response per message with
// one ack per update, in order; a bad update fails alone; the old
// one-update messages still work on the same stream; everything acknowledged
// is in the journal and survives a restart.
TEST_F(ServerFixture, StreamUpdatesCarriesSeveralUpdatesPerMessageDurably) {
  ServerOptions o = RestartOnDisk("batched.db");
  Populate();
  ASSERT_TRUE(SetFloor(op_stub_.get(), Ctx(op_).get(), "eu", 50 * kUnit).ok());
  uint64_t mine = 0, theirs = 0;
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit, &mine).ok());
  ASSERT_TRUE(Place(b_, "h100x8", 10 * kUnit, &theirs).ok());
  auto add = [](pb::UpdateOrderRequest* q, uint64_t tag, uint64_t order, int64_t price) {
    auto* u = q->add_updates();
    u->set_tag(tag);
    u->set_order(order);
    u->set_price(price);
    return u;
  };
  std::vector<pb::UpdateOrderResponse> acks;
  {
    auto ctx = Ctx(a_);
    auto stream = tenant_stub_->StreamUpdates(ctx.get());
    pb::UpdateOrderRequest q1;  // Three good updates.
    q1.set_tag(1);
    for (uint64_t i = 0; i < 3; ++i) add(&q1, 10 + i, mine, static_cast<int64_t>(11 + i) * kUnit);
    ASSERT_TRUE(stream->Write(q1));
    pb::UpdateOrderRequest q2;  // Good, bad price, another tenant's order, good.
    q2.set_tag(2);
    add(&q2, 20, mine, 20 * kUnit);
    add(&q2, 21, mine, -1);
    add(&q2, 22, theirs, 22 * kUnit);
    add(&q2, 23, mine, 23 * kUnit);
    ASSERT_TRUE(stream->Write(q2));
    pb::UpdateOrderRequest q3;  // One update per message, as before.
    q3.set_tag(3);
    q3.set_order(mine);
    q3.set_price(24 * kUnit);
    ASSERT_TRUE(stream->Write(q3));
    pb::UpdateOrderRequest q4;  // Updates and a price of its own: refused whole.
    q4.set_tag(4);
    q4.set_price(1 * kUnit);
    add(&q4, 40, mine, 40 * kUnit);
    ASSERT_TRUE(stream->Write(q4));
    pb::UpdateOrderRequest q5;  // Nested updates are refused, the rest applies.
    q5.set_tag(5);
    add(add(&q5, 50, mine, 50 * kUnit), 0, mine, 51 * kUnit);
    add(&q5, 52, mine, 25 * kUnit);
    ASSERT_TRUE(stream->Write(q5));
    pb::UpdateOrderRequest q6;  // More updates than the window: all refused, the stream goes on.
    q6.set_tag(6);
    for (uint64_t i = 0; i < 4097; ++i) add(&q6, 100 + i, mine, 30 * kUnit);
    ASSERT_TRUE(stream->Write(q6));
    pb::UpdateOrderRequest q7;
    q7.set_tag(7);
    add(&q7, 70, mine, 26 * kUnit);
    ASSERT_TRUE(stream->Write(q7));
    stream->WritesDone();
    pb::UpdateOrderResponse a;
    while (stream->Read(&a)) acks.push_back(a);
    ASSERT_TRUE(stream->Finish().ok());
  }
  ASSERT_EQ(acks.size(), 7u);
  auto codes = [](const pb::UpdateOrderResponse& r) {
    std::vector<std::pair<uint64_t, int>> out;
    for (const auto& a : r.acks()) out.emplace_back(a.tag(), a.code());
    return out;
  };
  using V = std::vector<std::pair<uint64_t, int>>;
  const int kOk = 0, kBad = static_cast<int>(StatusCode::INVALID_ARGUMENT);
  const int kGone = static_cast<int>(StatusCode::NOT_FOUND);
  EXPECT_EQ(acks[0].tag(), 1u);
  EXPECT_EQ(codes(acks[0]), (V{{10, kOk}, {11, kOk}, {12, kOk}}));
  EXPECT_EQ(acks[1].tag(), 2u);
  EXPECT_EQ(codes(acks[1]), (V{{20, kOk}, {21, kBad}, {22, kGone}, {23, kOk}}));
  EXPECT_NE(acks[1].acks(1).message().find("updates[1].price"), std::string::npos) << acks[1].acks(1).message();
  EXPECT_EQ(acks[2].tag(), 3u);
  EXPECT_EQ(acks[2].acks_size(), 0);
  EXPECT_EQ(acks[2].code(), kOk) << acks[2].message();
  EXPECT_EQ(codes(acks[3]), (V{{40, kBad}}));
  EXPECT_NE(acks[3].acks(0).message().find("updates: a message with updates"), std::string::npos);
  EXPECT_EQ(codes(acks[4]), (V{{50, kBad}, {52, kOk}}));
  EXPECT_NE(acks[4].acks(0).message().find("updates[0].updates"), std::string::npos);
  ASSERT_EQ(acks[5].acks_size(), 4097);
  for (const auto& a : acks[5].acks()) ASSERT_EQ(a.code(), kBad);
  EXPECT_NE(acks[5].acks(0).message().find("updates: at most 4096 per message (got 4097)"), std::string::npos);
  EXPECT_EQ(codes(acks[6]), (V{{70, kOk}}));

  // Unary UpdateOrder takes one update.
  pb::UpdateOrderRequest uq;
  add(&uq, 60, mine, 60 * kUnit);
  pb::UpdateOrderResponse ur;
  EXPECT_EQ(tenant_stub_->UpdateOrder(Ctx(a_).get(), uq, &ur).error_code(), StatusCode::INVALID_ARGUMENT);

  auto price = [&](const std::string& token) {
    pb::ListOrdersResponse lo;
    EXPECT_TRUE(tenant_stub_->ListOrders(Ctx(token).get(), pb::ListOrdersRequest(), &lo).ok());
    return lo.orders_size() == 1 ? lo.orders(0).effective_price() : -1;
  };
  EXPECT_EQ(price(a_), 26 * kUnit);  // The last acknowledged update.
  EXPECT_EQ(price(b_), 10 * kUnit);  // Untouched by a's updates.
  // Acknowledged means committed: every OK update is in the journal, and a
  // restart gives the same prices.
  auto journal = server_->store().RecentJournal(64);
  ASSERT_TRUE(journal.ok());
  size_t updates = 0;
  for (const auto& r : *journal) updates += r.line.find("update_order") != std::string::npos ? 1 : 0;
  EXPECT_EQ(updates, 3u + 2u + 1u + 1u + 1u);
  server_->Shutdown();
  StartServer(o);
  EXPECT_EQ(price(a_), 26 * kUnit);
  EXPECT_EQ(price(b_), 10 * kUnit);
}

// A stream that fills the server's window of 4,096 unacknowledged updates:
// the message that does not fit waits (the server stops reading) until the
// acks before it are written, then applies; every update is acknowledged
// once, in order, and every acknowledged update survives a restart.
TEST_F(ServerFixture, StreamUpdatesBeyondTheWindowWaitAndLoseNoAck) {
  ServerOptions o = RestartOnDisk("window.db");
  Populate();
  ASSERT_TRUE(SetFloor(op_stub_.get(), Ctx(op_).get(), "eu", 50 * kUnit).ok());
  uint64_t mine = 0;
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit, &mine).ok());
  const int kMessages = 3, kPer = 3000;  // 9,000 updates; any two messages exceed the window.
  std::vector<pb::UpdateOrderResponse> acks;
  {
    auto ctx = Ctx(a_);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = tenant_stub_->StreamUpdates(ctx.get());
    for (int m = 0; m < kMessages; ++m) {
      pb::UpdateOrderRequest q;
      q.set_tag(static_cast<uint64_t>(m));
      for (int i = 0; i < kPer; ++i) {
        auto* u = q.add_updates();
        u->set_tag(static_cast<uint64_t>(m * kPer + i));
        u->set_order(mine);
        u->set_price((11 + (m * kPer + i) % 7) * kUnit);
      }
      ASSERT_TRUE(stream->Write(q));
    }
    pb::UpdateOrderRequest last;  // One update of its own after them.
    last.set_tag(99);
    last.set_order(mine);
    last.set_price(30 * kUnit);
    ASSERT_TRUE(stream->Write(last));
    stream->WritesDone();
    pb::UpdateOrderResponse a;
    while (stream->Read(&a)) acks.push_back(a);
    grpc::Status st = stream->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_EQ(acks.size(), static_cast<size_t>(kMessages + 1));
  for (int m = 0; m < kMessages; ++m) {
    EXPECT_EQ(acks[m].tag(), static_cast<uint64_t>(m));
    ASSERT_EQ(acks[m].acks_size(), kPer);
    for (int i = 0; i < kPer; ++i) {
      ASSERT_EQ(acks[m].acks(i).tag(), static_cast<uint64_t>(m * kPer + i));
      ASSERT_EQ(acks[m].acks(i).code(), 0) << acks[m].acks(i).message();
    }
  }
  EXPECT_EQ(acks[kMessages].tag(), 99u);
  EXPECT_EQ(acks[kMessages].code(), 0) << acks[kMessages].message();
  auto price = [&] {
    pb::ListOrdersResponse lo;
    EXPECT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &lo).ok());
    return lo.orders_size() == 1 ? lo.orders(0).effective_price() : -1;
  };
  EXPECT_EQ(price(), 30 * kUnit);
  auto journal = server_->store().RecentJournal(20000);
  ASSERT_TRUE(journal.ok());
  size_t updates = 0;
  for (const auto& r : *journal) updates += r.line.find("update_order") != std::string::npos ? 1 : 0;
  EXPECT_EQ(updates, static_cast<size_t>(kMessages * kPer + 1));
  server_->Shutdown();
  StartServer(o);
  EXPECT_EQ(price(), 30 * kUnit);
}

// A client that goes away with updates in flight (one at a time, or whole
// messages, one of them waiting for room in the window): the stream ends once
// the acks still to come were dropped, and its slot is given back (a stream
// that never ended would also hold up the fixture's server shutdown). Twice the
// per-token bound of streams is opened and abandoned this way; a stream that
// never ended would keep its slot, and the last stream would be refused.
TEST_F(ServerFixture, StreamUpdatesAbandonedMidFlightGiveTheirSlotBack) {
  Populate();
  ASSERT_TRUE(SetFloor(op_stub_.get(), Ctx(op_).get(), "eu", 50 * kUnit).ok());
  uint64_t mine = 0;
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit, &mine).ok());
  auto update = [&](uint64_t tag) {
    pb::UpdateOrderRequest q;
    q.set_tag(tag);
    q.set_order(mine);
    q.set_price((11 + tag % 7) * kUnit);
    return q;
  };
  for (int s = 0; s < 32; ++s) {
    auto ctx = Ctx(a_);
    auto stream = tenant_stub_->StreamUpdates(ctx.get());
    if (s % 2 == 0) {
      for (uint64_t i = 0; i < 200; ++i) {
        if (!stream->Write(update(i))) break;
      }
    } else {
      // Messages of 1,500 updates: the third does not fit the window beside
      // the first two and is parked (reading pauses) when the client leaves;
      // a parked message must not keep the stream from ending.
      for (uint64_t m = 0; m < 4; ++m) {
        pb::UpdateOrderRequest q;
        q.set_tag(m);
        for (uint64_t i = 0; i < 1500; ++i) *q.add_updates() = update(m * 1500 + i);
        if (!stream->Write(q)) break;
      }
    }
    ctx->TryCancel();
    (void)stream->Finish();
  }
  // The slots come back as the server finishes the abandoned streams.
  bool accepted = false;
  for (int attempt = 0; attempt < 100 && !accepted; ++attempt) {
    auto ctx = Ctx(a_);
    auto stream = tenant_stub_->StreamUpdates(ctx.get());
    pb::UpdateOrderResponse ack;
    accepted = stream->Write(update(7)) && stream->Read(&ack) && ack.code() == 0;
    stream->WritesDone();
    (void)stream->Finish();
    if (!accepted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(accepted);
}

TEST_F(ServerFixture, WatchSeesPricesAtWatchedVerticesAndOnlyOwnEvents) {
  Populate();
  Watcher wb(tenant_stub_.get(), b_, {"l4"});
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());  // a's allocation: not b's business.
  ASSERT_TRUE(Place(a_, "l4", 5 * kUnit).ok());       // Changes the l4 quote b watches.
  pb::Event pc;
  ASSERT_TRUE(wb.WaitFor(Type("price_changed"), &pc));
  EXPECT_EQ(pc.vertex(), "l4");
  for (const auto& e : wb.events()) {
    EXPECT_EQ(e.type(), "price_changed") << "b saw someone else's " << e.type();
    EXPECT_EQ(e.vertex(), "l4");
    EXPECT_TRUE(e.tenant().empty());
  }
}

// Resumable watches (docs/HA.md): every event carries its position (journal
// seq, index among that record's events), and a watch may resume after one.
pb::WatchRequest After(const pb::Event& e) {
  pb::WatchRequest q;
  q.set_resume(true);
  q.set_after_seq(e.seq());
  q.set_after_index(e.index());
  return q;
}

void ExpectSameEvents(const std::vector<pb::Event>& got, const std::vector<pb::Event>& want, size_t from, size_t n) {
  ASSERT_GE(got.size(), n);
  ASSERT_GE(want.size(), from + n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].seq(), want[from + i].seq()) << i;
    EXPECT_EQ(got[i].index(), want[from + i].index()) << i;
    EXPECT_EQ(got[i].type(), want[from + i].type()) << i;
  }
}

// The events delivered once the calls made so far are acknowledged (a reply
// leaves before its events are delivered, so let them arrive).
std::vector<pb::Event> Settled(Watcher& w) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return w.events();
}

TEST_F(ServerFixture, WatchResumesInsideTheRingWithNoGapOrDuplicate) {
  Populate();
  Watcher all(op_stub_.get(), op_, pb::WatchRequest());
  auto start = ParseWatchPosition(all.position(), "laissez-position");
  ASSERT_TRUE(start.ok()) << all.position();
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());
  ASSERT_TRUE(Place(b_, "h100x8", 12 * kUnit).ok());
  ASSERT_TRUE(Place(a_, "l4", 5 * kUnit).ok());
  std::vector<pb::Event> seen = Settled(all);
  ASSERT_GE(seen.size(), 6u);
  // Positions increase strictly and start after the stream's position.
  EXPECT_GT(std::make_pair(seen[0].seq(), seen[0].index()), std::make_pair(start->seq, start->index));
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_LT(std::make_pair(seen[i - 1].seq(), seen[i - 1].index()), std::make_pair(seen[i].seq(), seen[i].index()))
        << i;
  }
  // Resume after the third event: the rest from the ring, then live ones.
  const size_t k = 2;
  Watcher resumed(op_stub_.get(), op_, After(seen[k]));
  EXPECT_EQ(resumed.position(), std::to_string(seen[k].seq()) + "." + std::to_string(seen[k].index()));
  ExpectSameEvents(resumed.WaitCount(seen.size() - k - 1), seen, k + 1, seen.size() - k - 1);
  ASSERT_TRUE(Place(b_, "l4", 6 * kUnit).ok());
  std::vector<pb::Event> more = Settled(all);
  ASSERT_GT(more.size(), seen.size());
  std::vector<pb::Event> got = resumed.events();
  EXPECT_EQ(got.size(), more.size() - k - 1) << "a resumed stream got an event twice or missed one";
  ExpectSameEvents(got, more, k + 1, more.size() - k - 1);
  // A tenant resumes too, and sees only its own events and watched prices.
  Watcher tenant(tenant_stub_.get(), b_, After(seen[k]));
  for (const auto& e : tenant.WaitCount(1)) EXPECT_TRUE(e.tenant().empty());
  // Resuming at the newest event gets only what comes next.
  Watcher at_end(op_stub_.get(), op_, After(more.back()));
  ASSERT_TRUE(Place(a_, "h100x8", 11 * kUnit).ok());
  std::vector<pb::Event> last = Settled(all);
  ExpectSameEvents(at_end.events(), last, more.size(), last.size() - more.size());
  EXPECT_EQ(at_end.events().size(), last.size() - more.size());
}

class SmallRingServer : public ServerFixture {
 protected:
  void SetUp() override {
    auto o = DefaultOptions();
    o.core.event_ring = 4;
    StartServer(o);
  }
};

TEST_F(SmallRingServer, ResumeAtTheRingsEdgeWorksAndPastItIsOutOfRange) {
  Populate();
  Watcher all(op_stub_.get(), op_, pb::WatchRequest());
  ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());
  ASSERT_TRUE(Place(b_, "h100x8", 12 * kUnit).ok());
  ASSERT_TRUE(Place(a_, "l4", 5 * kUnit).ok());
  std::vector<pb::Event> seen = Settled(all);
  const size_t n = seen.size();
  ASSERT_GE(n, 6u);
  // The ring holds the last 4 events: resuming after the one before them works...
  Watcher edge(op_stub_.get(), op_, After(seen[n - 5]));
  ExpectSameEvents(edge.WaitCount(4), seen, n - 4, 4);
  // ...and one further back needs an event the ring dropped.
  Watcher past(op_stub_.get(), op_, After(seen[n - 6]));
  grpc::Status st = past.WaitEnd();
  EXPECT_EQ(st.error_code(), StatusCode::OUT_OF_RANGE) << st.error_message();
  EXPECT_NE(st.error_message().find("after: this server no longer has the events after seq"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(past.events().empty());
  // The stream that was refused left nothing behind: the edge stream still gets live events.
  ASSERT_TRUE(Place(b_, "l4", 6 * kUnit).ok());
  std::vector<pb::Event> more = Settled(all);
  ExpectSameEvents(edge.events(), more, n - 4, more.size() - (n - 4));
}

// Tests of restarts run on each store that keeps a file: SQLite, and the
// journal file (`--store journal`).
class RestartTest : public ServerFixture, public ::testing::WithParamInterface<const char*> {};
INSTANTIATE_TEST_SUITE_P(Stores, RestartTest, ::testing::Values("sqlite", "journal"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Idempotency keys: a repeat of a committed key returns the original result
// and applies nothing, also after a restart (the key is journaled with the
// operation); the same key with other arguments is refused.
TEST_P(RestartTest, IdempotencyKeysApplyOnceAndSurviveRestart) {
  ServerOptions o = RestartOnDisk("idem.db", GetParam());
  Populate();
  auto deposit = [&](const std::string& key, int64_t amount, pb::DepositResponse* r) {
    pb::DepositRequest q;
    q.set_tenant("acme");
    q.set_amount(amount);
    q.set_idempotency_key(key);
    return admin_stub_->Deposit(Ctx(admin_).get(), q, r);
  };
  auto place = [&](const std::string& token, const std::string& key, int64_t price, uint64_t* id) {
    pb::PlaceOrderRequest q;
    q.set_scope("h100x8");
    q.set_price(price);
    q.set_idempotency_key(key);
    pb::PlaceOrderResponse r;
    grpc::Status st = tenant_stub_->PlaceOrder(Ctx(token).get(), q, &r);
    *id = r.order();
    return st;
  };
  const int64_t deposited0 = OperatorLedger().deposited();
  pb::DepositResponse d1, d2;
  ASSERT_TRUE(deposit("dep-1", 5 * kUnit, &d1).ok());
  ASSERT_TRUE(deposit("dep-2", 1 * kUnit, &d2).ok());  // Moves the balance on.
  pb::DepositResponse again;
  ASSERT_TRUE(deposit("dep-1", 5 * kUnit, &again).ok());
  EXPECT_EQ(again.balance(), d1.balance()) << "a repeat returns the original result";
  EXPECT_EQ(OperatorLedger().deposited(), deposited0 + 6 * kUnit) << "a repeat must not deposit again";
  uint64_t o1 = 0, o1_again = 0, o2 = 0;
  ASSERT_TRUE(place(a_, "ord-1", 3 * kUnit, &o1).ok());
  ASSERT_TRUE(place(a_, "ord-1", 3 * kUnit, &o1_again).ok());
  EXPECT_EQ(o1_again, o1);
  // Keys belong to their caller: another tenant's same key is its own call.
  ASSERT_TRUE(place(b_, "ord-1", 3 * kUnit, &o2).ok());
  EXPECT_NE(o2, o1);
  pb::ListOrdersResponse mine;
  ASSERT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &mine).ok());
  // The order filled a free node (or rests): one either way, not two.
  EXPECT_EQ(mine.orders_size() + Nodes(a_).nodes_size(), 1) << "a repeat must not place a second order";
  // The same key with other arguments: refused, naming the field; nothing applied.
  pb::DepositResponse bad;
  grpc::Status st = deposit("dep-1", 7 * kUnit, &bad);
  EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(st.error_message().rfind("idempotency_key: already used for a different request", 0), 0u)
      << st.error_message();
  // A malformed key.
  st = deposit(std::string(65, 'k'), kUnit, &bad);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("idempotency_key: at most 64", 0), 0u) << st.error_message();
  st = deposit("a b", kUnit, &bad);
  EXPECT_EQ(st.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OperatorLedger().deposited(), deposited0 + 6 * kUnit);

  // After a restart the keys are rebuilt from the journal.
  server_->Shutdown();
  StartServer(o);
  ASSERT_TRUE(deposit("dep-1", 5 * kUnit, &again).ok());
  EXPECT_EQ(again.balance(), d1.balance());
  EXPECT_EQ(OperatorLedger().deposited(), deposited0 + 6 * kUnit) << "a repeat after a restart deposited again";
  ASSERT_TRUE(place(a_, "ord-1", 3 * kUnit, &o1_again).ok());
  EXPECT_EQ(o1_again, o1);
  st = deposit("dep-2", 2 * kUnit, &bad);
  EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION);
  // A new key is a new deposit.
  ASSERT_TRUE(deposit("dep-3", 5 * kUnit, &again).ok());
  EXPECT_EQ(OperatorLedger().deposited(), deposited0 + 11 * kUnit);
}

// Every call that is not an absolute set takes an idempotency key
// (docs/SERVER.md, "Idempotency keys"): a repeat gives the original answer and
// applies nothing, before and after a restart; the key with other arguments
// is refused naming the field.
TEST_F(ServerFixture, EveryNonIdempotentCallTakesAKey) {
  ServerOptions o = RestartOnDisk("keys.db");
  Populate();
  using Answer = std::pair<grpc::Status, std::string>;
  struct Keyed {
    std::string key;
    int records;                         // Journal records the call makes.
    std::function<Answer(bool other)> run;  // `other`: the same key, other arguments.
  };
  auto policy = [](const grpc::Status& st, const pb::PolicyResponse& r) {
    return Answer(st, st.ok() ? std::to_string(r.policy()) : st.error_message());
  };
  uint64_t floor_policy = 0;
  ASSERT_TRUE(Place(a_, "n1", 20 * kUnit).ok());  // a holds n1 (to relinquish).
  std::vector<Keyed> calls;
  calls.push_back({"ct-1", 1, [&](bool other) {
                     pb::CreateTenantRequest q;
                     q.set_name("cora");
                     q.set_balance(other ? 2 * kUnit : kUnit);
                     q.set_idempotency_key("ct-1");
                     pb::CreateTenantResponse r;
                     grpc::Status st = admin_stub_->CreateTenant(Ctx(admin_).get(), q, &r);
                     return Answer(st, st.ok() ? std::to_string(r.tenant_id()) : st.error_message());
                   }});
  calls.push_back({"an-1", 2, [&](bool other) {
                     pb::AddNodesRequest q;
                     for (const char* name : {"n5", "n6"}) {
                       if (other && std::string(name) == "n6") continue;
                       auto* n = q.add_nodes();
                       n->set_name(name);
                       n->set_type("h100x8");
                       n->set_region("eu");
                       n->set_zone("eu-1a");
                       n->set_row("r2");
                       n->set_rack("k3");
                     }
                     q.set_idempotency_key("an-1");
                     pb::AddNodesResponse r;
                     grpc::Status st = op_stub_->AddNodes(Ctx(op_).get(), q, &r);
                     std::string ids;
                     for (uint32_t id : r.node_ids()) ids += std::to_string(id) + ",";
                     return Answer(st, st.ok() ? ids : st.error_message());
                   }});
  calls.push_back({"sf-1", 1, [&](bool other) {
                     pb::SetFloorRequest q;
                     q.set_location("eu");
                     q.set_price(other ? 60 * kUnit : 50 * kUnit);
                     q.set_idempotency_key("sf-1");
                     pb::PolicyResponse r;
                     grpc::Status st = op_stub_->SetFloor(Ctx(op_).get(), q, &r);
                     if (st.ok()) floor_policy = r.policy();
                     return policy(st, r);
                   }});
  calls.push_back({"dr-1", 1, [&](bool other) {
                     pb::DrainRequest q;
                     q.set_node(other ? "n2" : "n6");  // start 0: now (the original's now, for a repeat).
                     q.set_idempotency_key("dr-1");
                     pb::PolicyResponse r;
                     return policy(op_stub_->DrainNodes(Ctx(op_).get(), q, &r), r);
                   }});
  calls.push_back({"pc-1", 1, [&](bool other) {
                     pb::PowerCapRequest q;
                     q.set_row("eu/eu-1a/r1");
                     q.set_cap_w(other ? 30000 : 20000);
                     auto* s1 = q.add_steps();
                     s1->set_utilization_ppm(500000);
                     s1->set_floor(5 * kUnit);
                     q.set_idempotency_key("pc-1");
                     pb::PolicyResponse r;
                     return policy(op_stub_->SetPowerCap(Ctx(op_).get(), q, &r), r);
                   }});
  calls.push_back({"ap-1", 1, [&](bool other) {
                     pb::AdaptivePowerCapRequest q = AdaptiveCap();
                     if (other) q.set_cap_w(25000);
                     q.set_idempotency_key("ap-1");
                     pb::PolicyResponse r;
                     return policy(op_stub_->AddAdaptivePowerCap(Ctx(op_).get(), q, &r), r);
                   }});
  calls.push_back({"cb-1", 1, [&](bool other) {
                     pb::AdaptiveCarbonBudgetRequest q = CarbonBudget();
                     if (other) q.set_budget_g_per_h(6'000);
                     q.set_idempotency_key("cb-1");
                     pb::PolicyResponse r;
                     return policy(op_stub_->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r), r);
                   }});
  calls.push_back({"rn-1", 1, [&](bool other) {
                     pb::RemoveNodesRequest q;
                     q.add_nodes(other ? "n2" : "n5");
                     q.set_idempotency_key("rn-1");
                     pb::RemoveNodesResponse r;
                     grpc::Status st = op_stub_->RemoveNodes(Ctx(op_).get(), q, &r);
                     return Answer(st, st.error_message());
                   }});
  calls.push_back({"rl-1", 1, [&](bool other) {
                     pb::RelinquishRequest q;
                     q.set_node(other ? "n2" : "n1");
                     q.set_idempotency_key("rl-1");
                     pb::RelinquishResponse r;
                     grpc::Status st = tenant_stub_->Relinquish(Ctx(a_).get(), q, &r);
                     return Answer(st, st.error_message());
                   }});
  uint64_t resting = 0;  // Under the 50-unit floor: rests.
  bool placed = false;
  calls.push_back({"co-1", 1, [&](bool other) {
                     if (!placed) {
                       EXPECT_TRUE(Place(a_, "h100x8", 10 * kUnit, &resting).ok());
                       placed = true;
                     }
                     pb::CancelOrderRequest q;
                     q.set_order(other ? resting + 1000 : resting);
                     q.set_idempotency_key("co-1");
                     pb::CancelOrderResponse r;
                     grpc::Status st = tenant_stub_->CancelOrder(Ctx(a_).get(), q, &r);
                     return Answer(st, st.error_message());
                   }});
  calls.push_back({"rp-1", 1, [&](bool other) {
                     pb::RemovePolicyRequest q;
                     q.set_policy(other ? static_cast<uint32_t>(floor_policy + 1000) : static_cast<uint32_t>(floor_policy));
                     q.set_idempotency_key("rp-1");
                     pb::RemovePolicyResponse r;
                     grpc::Status st = op_stub_->RemovePolicy(Ctx(op_).get(), q, &r);
                     return Answer(st, st.error_message());
                   }});
  auto records_with = [&](const std::string& key) {
    pb::AuditLogRequest q;
    q.set_limit(10000);
    pb::AuditLogResponse r;
    EXPECT_TRUE(op_stub_->GetAuditLog(Ctx(op_).get(), q, &r).ok());
    int n = 0;
    for (const auto& rec : r.records()) n += rec.operation().find("\"key\":\"" + key + "\"") != std::string::npos;
    return n;
  };
  auto expect_refused = [&](const Keyed& c) {
    Answer bad = c.run(true);
    EXPECT_EQ(bad.first.error_code(), StatusCode::FAILED_PRECONDITION) << c.key << ": " << bad.second;
    EXPECT_EQ(bad.second.rfind("idempotency_key: already used for a different request", 0), 0u) << c.key;
  };
  std::vector<Answer> first;
  for (const auto& c : calls) {
    first.push_back(c.run(false));
    EXPECT_TRUE(first.back().first.ok()) << c.key << ": " << first.back().second;
    Answer again = c.run(false);
    if (c.key == "ct-1") {
      // The tenant's first token is not kept: the repeat says it was applied.
      EXPECT_EQ(again.first.error_code(), StatusCode::FAILED_PRECONDITION) << again.second;
      EXPECT_EQ(again.second.rfind("idempotency_key: already applied: this key created tenant \"cora\" (tenant_id " +
                                       first.back().second + ")",
                                   0),
                0u)
          << again.second;
    } else {
      EXPECT_TRUE(again.first.ok()) << c.key << " repeated: " << again.second;
      EXPECT_EQ(again.second, first.back().second) << c.key << ": a repeat must give the original answer";
    }
    EXPECT_EQ(records_with(c.key), c.records) << c.key << ": applied more than once";
    expect_refused(c);
  }
  // After a restart the keys are rebuilt from the journal: same answers, nothing applied.
  server_->Shutdown();
  StartServer(o);
  for (size_t i = 0; i < calls.size(); ++i) {
    Answer again = calls[i].run(false);
    if (calls[i].key == "ct-1") {
      EXPECT_EQ(again.first.error_code(), StatusCode::FAILED_PRECONDITION) << again.second;
    } else {
      EXPECT_TRUE(again.first.ok()) << calls[i].key << " after restart: " << again.second;
      EXPECT_EQ(again.second, first[i].second) << calls[i].key;
    }
    EXPECT_EQ(records_with(calls[i].key), calls[i].records) << calls[i].key << ": applied again after the restart";
    expect_refused(calls[i]);
  }
  // Without a key, a repeat is a new call: cancelling again is NOT_FOUND.
  pb::CancelOrderRequest q;
  q.set_order(resting);
  pb::CancelOrderResponse r;
  EXPECT_EQ(tenant_stub_->CancelOrder(Ctx(a_).get(), q, &r).error_code(), StatusCode::NOT_FOUND);
}

// The event ring is refilled from the journal when the server starts: a
// watcher that saw events before a restart resumes after its last position
// and gets exactly what an uninterrupted watch from the beginning would have
// shown after it (same positions, no gap, no duplicate).
TEST_P(RestartTest, ResumeFromBeforeARestartContinuesExactly) {
  ServerOptions o = RestartOnDisk("ring.db", GetParam());
  Populate();
  std::vector<pb::Event> before;
  pb::WatchRequest from_start;  // Where the first watch started.
  from_start.set_resume(true);
  {
    Watcher all(op_stub_.get(), op_, pb::WatchRequest());
    auto p0 = ParseWatchPosition(all.position(), "laissez-position");
    ASSERT_TRUE(p0.ok()) << all.position();
    from_start.set_after_seq(p0->seq);
    from_start.set_after_index(p0->index);
    ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());
    ASSERT_TRUE(Place(b_, "h100x8", 12 * kUnit).ok());
    before = Settled(all);
    ASSERT_GE(before.size(), 2u);
  }
  server_->Shutdown();
  StartServer(o);
  Watcher resumed(op_stub_.get(), op_, After(before.back()));
  ASSERT_TRUE(Place(a_, "l4", 5 * kUnit).ok());
  std::vector<pb::Event> after = Settled(resumed);
  ASSERT_FALSE(after.empty());
  // The uninterrupted history since the first watch began, from the ring.
  Watcher whole(op_stub_.get(), op_, from_start);
  std::vector<pb::Event> all = Settled(whole);
  ASSERT_EQ(all.size(), before.size() + after.size()) << "a resume across the restart lost or repeated events";
  // Those before the restart as they were seen live, then the resumed ones.
  ExpectSameEvents(std::vector<pb::Event>(all.begin(), all.begin() + static_cast<ptrdiff_t>(before.size())), before,
                   0, before.size());
  std::vector<pb::Event> joined = before;
  joined.insert(joined.end(), after.begin(), after.end());
  ExpectSameEvents(all, joined, 0, joined.size());
}

// After a restore the ring starts at the snapshot, but a watch that saw the
// snapshot's last event missed nothing: it resumes. One that stopped before
// that event is OUT_OF_RANGE (the events in between were not replayed).
TEST_P(RestartTest, ResumeFromTheSnapshotsLastEventAfterARestore) {
  ServerOptions o = RestartOnDisk("snapring.db", GetParam());
  o.snapshot_every = std::chrono::milliseconds(0);  // Snapshots only when this test takes them.
  server_->Shutdown();
  StartServer(o);
  Populate();
  std::vector<pb::Event> before;
  uint64_t snap_seq = 0;
  {
    Watcher all(op_stub_.get(), op_, pb::WatchRequest());
    ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());
    ASSERT_TRUE(Place(b_, "h100x8", 12 * kUnit).ok());
    auto snap = server_->core().TakeSnapshot();
    ASSERT_TRUE(snap.ok()) << snap.status().ToString();
    ASSERT_TRUE(server_->store().WriteSnapshot(*snap).ok());
    snap_seq = snap->seq;
    before = Settled(all);  // Every event the snapshot covers, and maybe later ones.
    ASSERT_GE(before.size(), 2u);
    ASSERT_LE(before.front().seq(), snap_seq);
  }
  server_->Shutdown();
  StartServer(o);
  ASSERT_EQ(server_->core().restored_seq(), snap_seq);
  Watcher resumed(op_stub_.get(), op_, After(before.back()));
  ASSERT_TRUE(Place(a_, "l4", 5 * kUnit).ok());
  std::vector<pb::Event> after = Settled(resumed);
  ASSERT_FALSE(after.empty());
  EXPECT_TRUE(after.front().seq() > before.back().seq() ||
              (after.front().seq() == before.back().seq() && after.front().index() > before.back().index()));
  Watcher old(op_stub_.get(), op_, After(before.front()));
  EXPECT_EQ(old.WaitEnd().error_code(), StatusCode::OUT_OF_RANGE);
}

// With a small ring, a restart keeps only the last records' events: a
// position older than that is OUT_OF_RANGE, as it would be live.
TEST_P(RestartTest, ResumeFromBeforeTheRefilledRingIsOutOfRange) {
  ServerOptions o = RestartOnDisk("ring2.db", GetParam());
  Populate();
  pb::Event first;
  {
    Watcher all(op_stub_.get(), op_, pb::WatchRequest());
    ASSERT_TRUE(Place(a_, "h100x8", 10 * kUnit).ok());
    ASSERT_TRUE(all.WaitFor(Type("allocated"), &first));
  }
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Place(b_, "l4", (1 + i) * kUnit).ok());
  server_->Shutdown();
  o.core.event_ring = 3;
  StartServer(o);
  Watcher resumed(op_stub_.get(), op_, After(first));
  grpc::Status st = resumed.WaitEnd();
  EXPECT_EQ(st.error_code(), StatusCode::OUT_OF_RANGE) << st.error_message();
  // With the ring off, nothing is kept: any resume from the past is OUT_OF_RANGE.
  server_->Shutdown();
  o.core.event_ring = 0;
  StartServer(o);
  pb::WatchRequest from_start;
  from_start.set_resume(true);
  Watcher none(op_stub_.get(), op_, from_start);
  EXPECT_EQ(none.WaitEnd().error_code(), StatusCode::OUT_OF_RANGE);
}

TEST_F(ServerFixture, GraceDeadlineTransfersTheNode) {
  Populate();
  pb::SetVolatilityRequest vq;
  vq.mutable_params()->set_grace_us(300'000);
  vq.add_update("grace_us");
  pb::MarketParams mp;
  ASSERT_TRUE(op_stub_->SetVolatility(Ctx(op_).get(), vq, &mp).ok());
  EXPECT_EQ(mp.grace_us(), 300'000);
  Watcher wa(tenant_stub_.get(), a_, {});
  Watcher wb(tenant_stub_.get(), b_, {});
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit).ok());
  ASSERT_TRUE(wa.WaitFor(Type("allocated")));
  ASSERT_TRUE(Place(b_, "n1", 20 * kUnit).ok());
  ASSERT_TRUE(wa.WaitFor(Type("notice")));
  // The server's timer applies the deadline with no further traffic.
  pb::Event t;
  ASSERT_TRUE(wb.WaitFor(Type("transferred"), &t));
  EXPECT_EQ(t.node(), "n1");
  EXPECT_TRUE(t.other().empty());
  EXPECT_EQ(Nodes(b_).nodes_size(), 1);
  EXPECT_EQ(Nodes(a_).nodes_size(), 0);
}

TEST_F(ServerFixture, OperatorCalls) {
  Populate();
  ASSERT_TRUE(Place(a_, "n3", 10 * kUnit).ok());
  Watcher wa(tenant_stub_.get(), a_, {});

  pb::ListClusterResponse lc;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &lc).ok());
  ASSERT_EQ(lc.nodes_size(), 5);
  int held = 0;
  for (const auto& n : lc.nodes()) {
    if (n.node() == "n3") {
      EXPECT_EQ(n.holder(), "acme");
      EXPECT_EQ(n.status(), "held");
      ++held;
    }
  }
  EXPECT_EQ(held, 1);
  EXPECT_EQ(lc.tenants(), 2u);

  // Drain the rack: a's node gets a maintenance notice.
  pb::DrainRequest dq;
  dq.set_location("eu/eu-1a/r1/k2");
  pb::PolicyResponse dr;
  ASSERT_TRUE(op_stub_->DrainNodes(Ctx(op_).get(), dq, &dr).ok());
  pb::Event notice;
  ASSERT_TRUE(wa.WaitFor(Type("notice"), &notice));
  EXPECT_NE(notice.reasons().find("maintenance"), std::string::npos);

  // Remove a free node; a held one needs draining first.
  pb::RemoveNodesRequest rq;
  rq.add_nodes("n1");
  pb::RemoveNodesResponse rr;
  ASSERT_TRUE(op_stub_->RemoveNodes(Ctx(op_).get(), rq, &rr).ok());
  rq.clear_nodes();
  rq.add_nodes("n3");
  EXPECT_EQ(op_stub_->RemoveNodes(Ctx(op_).get(), rq, &rr).error_code(), StatusCode::FAILED_PRECONDITION);

  pb::PowerCapRequest pq;
  pq.set_row("eu/eu-1a/r1");
  pq.set_cap_w(20000);
  auto* s1 = pq.add_steps();
  s1->set_utilization_ppm(500000);
  s1->set_floor(5 * kUnit);
  pb::PolicyResponse pr;
  grpc::Status pst = op_stub_->SetPowerCap(Ctx(op_).get(), pq, &pr);
  ASSERT_TRUE(pst.ok()) << pst.error_message();
  pb::RemovePolicyRequest rpq;
  rpq.set_policy(pr.policy());
  pb::RemovePolicyResponse rpr;
  ASSERT_TRUE(op_stub_->RemovePolicy(Ctx(op_).get(), rpq, &rpr).ok());

  pb::AuditLogResponse audit;
  ASSERT_TRUE(op_stub_->GetAuditLog(Ctx(op_).get(), pb::AuditLogRequest(), &audit).ok());
  bool saw_tenant = false, saw_ops = false;
  for (const auto& r : audit.records()) {
    saw_tenant |= r.actor() == "tenant:acme" && r.operation().find("place_order") != std::string::npos;
    saw_ops |= r.actor() == "operator:ops" && r.operation().find("remove_node") != std::string::npos;
  }
  EXPECT_TRUE(saw_tenant);
  EXPECT_TRUE(saw_ops);

  auto led = OperatorLedger();
  EXPECT_EQ(led.deposited(), 2000 * kUnit);
}

// The operator API of adaptive power caps: add one with every parameter, change
// its cap in place (the controller's floor and step times stay), and the calls
// are journaled under the operator's name.
TEST_F(ServerFixture, AdaptivePowerCapAddAndChangeInPlace) {
  Populate();
  pb::PolicyResponse pr;
  grpc::Status st = op_stub_->AddAdaptivePowerCap(Ctx(op_).get(), AdaptiveCap(), &pr);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto policy = [&](uint32_t id) {
    return server_->core().Execute<market::PolicyView>(
        "test", [&](WriterContext& w) { return w.engine().GetPolicy(PolicyId(id)); });
  };
  auto before = policy(pr.policy());
  ASSERT_TRUE(before.ok());
  const auto* spec = std::get_if<market::AdaptivePowerCapSpec>(&before->spec);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->cap_w, 20000);
  EXPECT_EQ(spec->margin_ppm, 100'000);
  EXPECT_EQ(spec->rise_min, kUnit / 4);
  EXPECT_EQ(spec->max_floor, kInfPrice);
  EXPECT_EQ(before->floor, kUnit);  // min_floor, at once.

  pb::SetAdaptiveCapRequest cq;
  cq.set_policy(pr.policy());
  cq.set_cap(6000);
  pb::SetAdaptiveCapResponse cr;
  st = op_stub_->SetAdaptiveCap(Ctx(op_).get(), cq, &cr);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto after = policy(pr.policy());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(std::get<market::AdaptivePowerCapSpec>(after->spec).cap_w, 6000);
  EXPECT_EQ(after->floor, before->floor);
  EXPECT_EQ(after->next_step, before->next_step);

  // Only adaptive caps have a cap to change.
  pb::SetFloorRequest fq;
  fq.set_location("eu");
  fq.set_price(kUnit);
  pb::PolicyResponse fr;
  ASSERT_TRUE(op_stub_->SetFloor(Ctx(op_).get(), fq, &fr).ok());
  cq.set_policy(fr.policy());
  st = op_stub_->SetAdaptiveCap(Ctx(op_).get(), cq, &cr);
  EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_EQ(st.error_message().rfind("policy:", 0), 0u) << st.error_message();
  // Tenants cannot call either.
  EXPECT_EQ(op_stub_->AddAdaptivePowerCap(Ctx(a_).get(), AdaptiveCap(), &pr).error_code(),
            StatusCode::PERMISSION_DENIED);

  pb::AuditLogResponse audit;
  ASSERT_TRUE(op_stub_->GetAuditLog(Ctx(op_).get(), pb::AuditLogRequest(), &audit).ok());
  bool saw_add = false, saw_change = false;
  for (const auto& r : audit.records()) {
    saw_add |= r.actor() == "operator:ops" && r.operation().find("adaptive_power_cap") != std::string::npos;
    saw_change |= r.actor() == "operator:ops" && r.operation().find("\"set_adaptive_cap\"") != std::string::npos;
  }
  EXPECT_TRUE(saw_add);
  EXPECT_TRUE(saw_change);
}

// The operator API of adaptive carbon budgets: add one, change its budget in
// place through the same SetAdaptiveCap (the price and step times stay).
TEST_F(ServerFixture, AdaptiveCarbonBudgetAddAndChangeInPlace) {
  Populate();
  pb::PolicyResponse pr;
  grpc::Status st = op_stub_->AddAdaptiveCarbonBudget(Ctx(op_).get(), CarbonBudget(), &pr);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto policy = [&] {
    return server_->core().Execute<market::PolicyView>(
        "test", [&](WriterContext& w) { return w.engine().GetPolicy(PolicyId(pr.policy())); });
  };
  auto before = policy();
  ASSERT_TRUE(before.ok());
  const auto* spec = std::get_if<market::AdaptiveCarbonBudgetSpec>(&before->spec);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(spec->budget_g_per_h, 5'000);
  ASSERT_EQ(spec->series.size(), 2u);
  EXPECT_EQ(spec->series[1].second, 120);
  EXPECT_EQ(spec->rise_min, 100 * kUnit);
  EXPECT_EQ(spec->max_price, kInfPrice);
  EXPECT_EQ(before->carbon_price, 10 * kUnit);  // min_price, at once.

  pb::SetAdaptiveCapRequest cq;
  cq.set_policy(pr.policy());
  cq.set_cap(1'000);
  pb::SetAdaptiveCapResponse cr;
  st = op_stub_->SetAdaptiveCap(Ctx(op_).get(), cq, &cr);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto after = policy();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(std::get<market::AdaptiveCarbonBudgetSpec>(after->spec).budget_g_per_h, 1'000);
  EXPECT_EQ(after->carbon_price, before->carbon_price);
  EXPECT_EQ(after->next_step, before->next_step);
}

TEST_F(ServerFixture, AdminDepositsAndRevokesTokens) {
  Populate();
  pb::DepositRequest dq;
  dq.set_tenant("acme");
  dq.set_amount(5 * kUnit);
  pb::DepositResponse dr;
  ASSERT_TRUE(admin_stub_->Deposit(Ctx(admin_).get(), dq, &dr).ok());
  EXPECT_EQ(dr.balance(), 1005 * kUnit);

  pb::IssueTokenRequest iq;
  iq.set_role("tenant");
  iq.set_tenant("acme");
  pb::IssueTokenResponse ir;
  ASSERT_TRUE(admin_stub_->IssueToken(Ctx(admin_).get(), iq, &ir).ok());
  pb::BalanceResponse bal;
  ASSERT_TRUE(tenant_stub_->GetBalance(Ctx(ir.token()).get(), pb::GetBalanceRequest(), &bal).ok());
  EXPECT_EQ(bal.tenant(), "acme");
  pb::RevokeTokenRequest rq;
  rq.set_token_id(ir.token_id());
  pb::RevokeTokenResponse rr;
  ASSERT_TRUE(admin_stub_->RevokeToken(Ctx(admin_).get(), rq, &rr).ok());
  grpc::Status st = tenant_stub_->GetBalance(Ctx(ir.token()).get(), pb::GetBalanceRequest(), &bal);
  EXPECT_EQ(st.error_code(), StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos);
  // The tenant's first token still works.
  EXPECT_TRUE(tenant_stub_->GetBalance(Ctx(a_).get(), pb::GetBalanceRequest(), &bal).ok());
}

// ---------------------------------------------------------------------------
// Authorization matrix: every call x every kind of caller.

enum Who { kNone, kBad, kRevoked, kOther, kOperator, kAdmin, kTenant };
const char* kWhoNames[] = {"no token", "bad token", "revoked", "other tenant", "operator", "admin", "tenant"};

enum class Family { kTenant, kTenantOwn, kTenantOrAny, kOperator, kAdmin };

struct MatrixCall {
  std::string name;
  Family family;
  std::function<grpc::Status(const std::string& token)> call;
};

TEST_F(ServerFixture, AuthorizationMatrix) {
  Populate();
  // a holds n1 and has a resting order on l4 behind a floor; b is the "other tenant".
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit).ok());
  pb::SetFloorRequest fq;
  fq.set_node("l4-1");
  fq.set_price(100 * kUnit);
  pb::PolicyResponse fr;
  ASSERT_TRUE(op_stub_->SetFloor(Ctx(op_).get(), fq, &fr).ok());
  uint64_t order = 0;
  ASSERT_TRUE(Place(a_, "l4", 10 * kUnit, &order).ok());
  // A revoked token of a.
  pb::IssueTokenRequest iq;
  iq.set_role("tenant");
  iq.set_tenant("acme");
  pb::IssueTokenResponse ir;
  ASSERT_TRUE(admin_stub_->IssueToken(Ctx(admin_).get(), iq, &ir).ok());
  pb::RevokeTokenRequest rq;
  rq.set_token_id(ir.token_id());
  pb::RevokeTokenResponse rr;
  ASSERT_TRUE(admin_stub_->RevokeToken(Ctx(admin_).get(), rq, &rr).ok());
  const std::string tokens[] = {"", "lz_" + std::string(64, 'f'), ir.token(), b_, op_, admin_, a_};

  int counter = 0;
  auto* ts = tenant_stub_.get();
  auto* os = op_stub_.get();
  auto* as = admin_stub_.get();
  auto ctx = [this](const std::string& t) { return Ctx(t); };
  std::vector<MatrixCall> calls = {
      {"PlaceOrder", Family::kTenant, [&](const std::string& t) {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(0); pb::PlaceOrderResponse r;
         return ts->PlaceOrder(ctx(t).get(), q, &r); }},
      {"UpdateOrder", Family::kTenantOwn, [&](const std::string& t) {
         pb::UpdateOrderRequest q; q.set_order(order); q.set_price(11 * kUnit); pb::UpdateOrderResponse r;
         return ts->UpdateOrder(ctx(t).get(), q, &r); }},
      {"StreamUpdates", Family::kTenantOwn, [&](const std::string& t) {
         auto c = ctx(t);
         auto s = ts->StreamUpdates(c.get());
         pb::UpdateOrderRequest q; q.set_order(order); q.set_price(11 * kUnit);
         s->Write(q);
         s->WritesDone();
         pb::UpdateOrderResponse a;
         int code = -1;
         while (s->Read(&a)) code = a.code();
         grpc::Status st = s->Finish();
         if (!st.ok() || code <= 0) return st;
         return grpc::Status(static_cast<StatusCode>(code), a.message()); }},
      {"SetLimit", Family::kTenantOwn, [&](const std::string& t) {
         pb::SetLimitRequest q; q.set_node("n1"); q.set_limit(10 * kUnit); pb::SetLimitResponse r;
         return ts->SetLimit(ctx(t).get(), q, &r); }},
      {"EvictionQuote", Family::kTenantOwn, [&](const std::string& t) {
         pb::EvictionQuoteRequest q; q.set_node("n1"); pb::EvictionQuoteResponse r;
         return ts->EvictionQuote(ctx(t).get(), q, &r); }},
      {"ListOrders", Family::kTenant, [&](const std::string& t) {
         pb::ListOrdersResponse r; return ts->ListOrders(ctx(t).get(), pb::ListOrdersRequest(), &r); }},
      {"ListNodes", Family::kTenant, [&](const std::string& t) {
         pb::ListNodesResponse r; return ts->ListNodes(ctx(t).get(), pb::ListNodesRequest(), &r); }},
      {"Quote", Family::kTenantOrAny, [&](const std::string& t) {
         pb::QuoteRequest q; q.set_vertex("h100x8"); pb::QuoteResponse r; return ts->Quote(ctx(t).get(), q, &r); }},
      {"GetTopology", Family::kTenantOrAny, [&](const std::string& t) {
         pb::TopologyResponse r; return ts->GetTopology(ctx(t).get(), pb::GetTopologyRequest(), &r); }},
      {"GetBalance", Family::kTenant, [&](const std::string& t) {
         pb::BalanceResponse r; return ts->GetBalance(ctx(t).get(), pb::GetBalanceRequest(), &r); }},
      {"GetLedger", Family::kTenant, [&](const std::string& t) {
         pb::LedgerResponse r; return ts->GetLedger(ctx(t).get(), pb::GetLedgerRequest(), &r); }},
      {"Watch", Family::kTenant, [&](const std::string& t) {
         // An admitted stream stays open until its deadline; a refused one ends at once.
         auto c = ctx(t);
         c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
         auto rd = ts->Watch(c.get(), pb::WatchRequest());
         pb::Event e;
         while (rd->Read(&e)) {}
         grpc::Status st = rd->Finish();
         return st.error_code() == StatusCode::DEADLINE_EXCEEDED ? grpc::Status::OK : st; }},
      {"AddNodes", Family::kOperator, [&](const std::string& t) {
         pb::AddNodesRequest q; auto* n = q.add_nodes();
         n->set_name("m" + std::to_string(counter++)); n->set_type("a100"); n->set_region("eu");
         n->set_zone("z"); n->set_row("r"); n->set_rack("k");
         pb::AddNodesResponse r; return os->AddNodes(ctx(t).get(), q, &r); }},
      {"SetFloor", Family::kOperator, [&](const std::string& t) {
         pb::SetFloorRequest q; q.set_location("eu"); q.set_price(1); pb::PolicyResponse r;
         return os->SetFloor(ctx(t).get(), q, &r); }},
      {"SetVolatility", Family::kOperator, [&](const std::string& t) {
         pb::SetVolatilityRequest q; pb::MarketParams r; return os->SetVolatility(ctx(t).get(), q, &r); }},
      {"ListCluster", Family::kOperator, [&](const std::string& t) {
         pb::ListClusterResponse r; return os->ListCluster(ctx(t).get(), pb::ListClusterRequest(), &r); }},
      {"Operator.GetLedger", Family::kOperator, [&](const std::string& t) {
         pb::OperatorLedgerResponse r; return os->GetLedger(ctx(t).get(), pb::OperatorLedgerRequest(), &r); }},
      {"GetAuditLog", Family::kOperator, [&](const std::string& t) {
         pb::AuditLogResponse r; return os->GetAuditLog(ctx(t).get(), pb::AuditLogRequest(), &r); }},
      {"DrainNodes", Family::kOperator, [&](const std::string& t) {
         pb::DrainRequest q; q.set_node("n4"); pb::PolicyResponse r; return os->DrainNodes(ctx(t).get(), q, &r); }},
      {"RemovePolicy", Family::kOperator, [&](const std::string& t) {
         pb::RemovePolicyRequest q; q.set_policy(999999); pb::RemovePolicyResponse r;
         return os->RemovePolicy(ctx(t).get(), q, &r); }},
      {"RemoveNodes", Family::kOperator, [&](const std::string& t) {
         pb::RemoveNodesRequest q; q.add_nodes("no-such-node"); pb::RemoveNodesResponse r;
         return os->RemoveNodes(ctx(t).get(), q, &r); }},
      {"SetPowerCap", Family::kOperator, [&](const std::string& t) {
         pb::PowerCapRequest q; q.set_row("eu/eu-1a/r1"); q.set_cap_w(1000000);
         auto* s = q.add_steps(); s->set_utilization_ppm(900000); s->set_floor(1);
         pb::PolicyResponse r; return os->SetPowerCap(ctx(t).get(), q, &r); }},
      {"Operator.Watch", Family::kOperator, [&](const std::string& t) {
         // An admitted stream stays open until its deadline; a refused one ends at once.
         auto c = ctx(t);
         c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
         auto rd = os->Watch(c.get(), pb::WatchRequest());
         pb::Event e;
         while (rd->Read(&e)) {}
         grpc::Status st = rd->Finish();
         return st.error_code() == StatusCode::DEADLINE_EXCEEDED ? grpc::Status::OK : st; }},
      {"CreateTenant", Family::kAdmin, [&](const std::string& t) {
         pb::CreateTenantRequest q; q.set_name("t" + std::to_string(counter++)); q.set_balance(kUnit);
         pb::CreateTenantResponse r; return as->CreateTenant(ctx(t).get(), q, &r); }},
      {"Deposit", Family::kAdmin, [&](const std::string& t) {
         pb::DepositRequest q; q.set_tenant("bolt"); q.set_amount(1); pb::DepositResponse r;
         return as->Deposit(ctx(t).get(), q, &r); }},
      {"IssueToken", Family::kAdmin, [&](const std::string& t) {
         pb::IssueTokenRequest q; q.set_role("operator"); pb::IssueTokenResponse r;
         return as->IssueToken(ctx(t).get(), q, &r); }},
      {"RevokeToken", Family::kAdmin, [&](const std::string& t) {
         pb::RevokeTokenRequest q; q.set_token_id(ir.token_id()); pb::RevokeTokenResponse r;
         return as->RevokeToken(ctx(t).get(), q, &r); }},
      // Last: these end a's holding and order.
      {"CancelOrder", Family::kTenantOwn, [&](const std::string& t) {
         pb::CancelOrderRequest q; q.set_order(order); pb::CancelOrderResponse r;
         return ts->CancelOrder(ctx(t).get(), q, &r); }},
      {"Relinquish", Family::kTenantOwn, [&](const std::string& t) {
         pb::RelinquishRequest q; q.set_node("n1"); pb::RelinquishResponse r;
         return ts->Relinquish(ctx(t).get(), q, &r); }},
  };

  for (const auto& c : calls) {
    for (int who = kNone; who <= kTenant; ++who) {
      grpc::Status st = c.call(tokens[who]);
      SCOPED_TRACE(c.name + " as " + kWhoNames[who] + ": " + std::to_string(st.error_code()) + " " +
                   st.error_message());
      if (who <= kRevoked) {
        EXPECT_EQ(st.error_code(), StatusCode::UNAUTHENTICATED);
        EXPECT_NE(st.error_message().find("authorization"), std::string::npos);
        continue;
      }
      bool tenant_call = c.family == Family::kTenant || c.family == Family::kTenantOwn;
      bool allowed = false;
      switch (c.family) {
        case Family::kTenant:
        case Family::kTenantOwn: allowed = who == kTenant || who == kOther; break;
        case Family::kTenantOrAny: allowed = true; break;
        case Family::kOperator: allowed = who == kOperator || who == kAdmin; break;
        case Family::kAdmin: allowed = who == kAdmin; break;
      }
      if (!allowed) {
        EXPECT_EQ(st.error_code(), StatusCode::PERMISSION_DENIED);
        EXPECT_NE(st.error_message().find("authorization"), std::string::npos);
        continue;
      }
      if (tenant_call && who == kOther && c.family == Family::kTenantOwn) {
        // Another tenant's order or node: refused, and indistinguishable from a missing one.
        EXPECT_TRUE(st.error_code() == StatusCode::NOT_FOUND || st.error_code() == StatusCode::FAILED_PRECONDITION);
        continue;
      }
      EXPECT_NE(st.error_code(), StatusCode::UNAUTHENTICATED);
      EXPECT_NE(st.error_code(), StatusCode::PERMISSION_DENIED);
      if (who == kTenant) {
        EXPECT_TRUE(st.ok());  // The owner's own calls succeed.
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Bad input: the right code, a message naming the field, and no change.

TEST_F(ServerFixture, BadInputTable) {
  Populate();
  uint64_t order = 0;
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit, &order).ok());
  auto* ts = tenant_stub_.get();
  auto* os = op_stub_.get();
  auto* as = admin_stub_.get();
  struct Case {
    std::string name;
    StatusCode code;
    std::string field;
    std::function<grpc::Status()> call;
  };
  std::vector<Case> cases = {
      {"negative price", StatusCode::INVALID_ARGUMENT, "price", [&] {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(-1); pb::PlaceOrderResponse r;
         return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"overflowing price", StatusCode::INVALID_ARGUMENT, "price", [&] {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(INT64_MAX); pb::PlaceOrderResponse r;
         return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"huge gang", StatusCode::INVALID_ARGUMENT, "count", [&] {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(1); q.set_count(1u << 30);
         pb::PlaceOrderResponse r; return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"unknown scope", StatusCode::NOT_FOUND, "scope", [&] {
         pb::PlaceOrderRequest q; q.set_scope("tpu"); q.set_price(1); pb::PlaceOrderResponse r;
         return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"empty scope", StatusCode::INVALID_ARGUMENT, "scope", [&] {
         pb::PlaceOrderRequest q; q.set_price(1); pb::PlaceOrderResponse r;
         return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"locality without rel_to", StatusCode::INVALID_ARGUMENT, "rel_to", [&] {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(1); q.set_locality(pb::LOCALITY_SAME_RACK);
         pb::PlaceOrderResponse r; return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"bad locality enum", StatusCode::INVALID_ARGUMENT, "locality", [&] {
         pb::PlaceOrderRequest q; q.set_scope("h100x8"); q.set_price(1); q.set_locality(static_cast<pb::Locality>(77));
         pb::PlaceOrderResponse r; return ts->PlaceOrder(Ctx(b_).get(), q, &r); }},
      {"unknown order", StatusCode::NOT_FOUND, "order", [&] {
         pb::UpdateOrderRequest q; q.set_order(987654); q.set_price(1); pb::UpdateOrderResponse r;
         return ts->UpdateOrder(Ctx(a_).get(), q, &r); }},
      {"other tenant's order", StatusCode::NOT_FOUND, "order", [&] {
         pb::CancelOrderRequest q; q.set_order(order); pb::CancelOrderResponse r;
         return ts->CancelOrder(Ctx(b_).get(), q, &r); }},
      {"negative limit", StatusCode::INVALID_ARGUMENT, "limit", [&] {
         pb::SetLimitRequest q; q.set_node("n1"); q.set_limit(-5); pb::SetLimitResponse r;
         return ts->SetLimit(Ctx(a_).get(), q, &r); }},
      {"unknown node", StatusCode::NOT_FOUND, "node", [&] {
         pb::RelinquishRequest q; q.set_node("zz"); pb::RelinquishResponse r;
         return ts->Relinquish(Ctx(a_).get(), q, &r); }},
      {"node held by another", StatusCode::FAILED_PRECONDITION, "node", [&] {
         pb::RelinquishRequest q; q.set_node("n1"); pb::RelinquishResponse r;
         return ts->Relinquish(Ctx(b_).get(), q, &r); }},
      {"unknown watch vertex", StatusCode::NOT_FOUND, "vertices[1]", [&] {
         grpc::ClientContext c; c.AddMetadata("authorization", "Bearer " + b_);
         pb::WatchRequest q; q.add_vertices("h100x8"); q.add_vertices("nope");
         auto rd = ts->Watch(&c, q); pb::Event e; while (rd->Read(&e)) {} return rd->Finish(); }},
      {"malformed token", StatusCode::UNAUTHENTICATED, "authorization", [&] {
         pb::BalanceResponse r; return ts->GetBalance(Ctx("not-a-token").get(), pb::GetBalanceRequest(), &r); }},
      {"control characters in a name", StatusCode::INVALID_ARGUMENT, "nodes[0].name", [&] {
         pb::AddNodesRequest q; auto* n = q.add_nodes(); n->set_name(std::string("a\x01", 2)); n->set_type("t");
         n->set_region("r"); n->set_zone("z"); n->set_row("w"); n->set_rack("k");
         pb::AddNodesResponse r; return os->AddNodes(Ctx(op_).get(), q, &r); }},
      {"duplicate node", StatusCode::ALREADY_EXISTS, "nodes[0].name", [&] {
         pb::AddNodesRequest q; auto* n = q.add_nodes(); n->set_name("n1"); n->set_type("t");
         n->set_region("r"); n->set_zone("z"); n->set_row("w"); n->set_rack("k");
         pb::AddNodesResponse r; return os->AddNodes(Ctx(op_).get(), q, &r); }},
      {"negative floor", StatusCode::INVALID_ARGUMENT, "price", [&] {
         pb::SetFloorRequest q; q.set_location("eu"); q.set_price(-1); pb::PolicyResponse r;
         return os->SetFloor(Ctx(op_).get(), q, &r); }},
      {"unknown location", StatusCode::NOT_FOUND, "location", [&] {
         pb::SetFloorRequest q; q.set_location("mars"); q.set_price(1); pb::PolicyResponse r;
         return os->SetFloor(Ctx(op_).get(), q, &r); }},
      {"unknown volatility field", StatusCode::INVALID_ARGUMENT, "update[0]", [&] {
         pb::SetVolatilityRequest q; q.add_update("speed"); pb::MarketParams r;
         return os->SetVolatility(Ctx(op_).get(), q, &r); }},
      {"power cap on a zone", StatusCode::INVALID_ARGUMENT, "row", [&] {
         pb::PowerCapRequest q; q.set_row("eu/eu-1a"); q.set_cap_w(10); auto* s = q.add_steps();
         s->set_utilization_ppm(1); s->set_floor(1); pb::PolicyResponse r;
         return os->SetPowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap on a zone", StatusCode::INVALID_ARGUMENT, "row", [&] {
         auto q = AdaptiveCap(); q.set_row("eu/eu-1a"); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap on an unknown row", StatusCode::NOT_FOUND, "row", [&] {
         auto q = AdaptiveCap(); q.set_row("eu/eu-1a/r9"); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap without a rise", StatusCode::INVALID_ARGUMENT, "rise_min", [&] {
         auto q = AdaptiveCap(); q.set_rise_min(0); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap stepping every microsecond", StatusCode::INVALID_ARGUMENT, "interval", [&] {
         auto q = AdaptiveCap(); q.set_interval_us(1); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap with max below min", StatusCode::INVALID_ARGUMENT, "max_floor", [&] {
         auto q = AdaptiveCap(); q.set_max_floor(kUnit / 2); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap with a negative fall", StatusCode::INVALID_ARGUMENT, "fall_step", [&] {
         auto q = AdaptiveCap(); q.set_fall_step(-1); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap with margin + band over 1", StatusCode::INVALID_ARGUMENT, "band_ppm", [&] {
         auto q = AdaptiveCap(); q.set_band_ppm(950'000); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"adaptive cap of no watts", StatusCode::INVALID_ARGUMENT, "cap_w", [&] {
         auto q = AdaptiveCap(); q.set_cap_w(0); pb::PolicyResponse r;
         return os->AddAdaptivePowerCap(Ctx(op_).get(), q, &r); }},
      {"carbon budget on a zone", StatusCode::INVALID_ARGUMENT, "region", [&] {
         auto q = CarbonBudget(); q.set_region("eu/eu-1a"); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"carbon budget on an unknown region", StatusCode::NOT_FOUND, "region", [&] {
         auto q = CarbonBudget(); q.set_region("mars"); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"carbon budget of nothing", StatusCode::INVALID_ARGUMENT, "budget_g_per_h", [&] {
         auto q = CarbonBudget(); q.set_budget_g_per_h(0); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"carbon series out of order", StatusCode::INVALID_ARGUMENT, "series[1].time", [&] {
         auto q = CarbonBudget(); q.mutable_series(1)->set_from(0); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"negative carbon intensity", StatusCode::INVALID_ARGUMENT, "series[0].intensity", [&] {
         auto q = CarbonBudget(); q.mutable_series(0)->set_g_per_kwh(-1); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"carbon price max below min", StatusCode::INVALID_ARGUMENT, "max_price", [&] {
         auto q = CarbonBudget(); q.set_max_price(kUnit); pb::PolicyResponse r;
         return os->AddAdaptiveCarbonBudget(Ctx(op_).get(), q, &r); }},
      {"new cap of no watts", StatusCode::INVALID_ARGUMENT, "cap", [&] {
         pb::SetAdaptiveCapRequest q; q.set_policy(0); q.set_cap(0); pb::SetAdaptiveCapResponse r;
         return os->SetAdaptiveCap(Ctx(op_).get(), q, &r); }},
      {"new cap of an unknown policy", StatusCode::NOT_FOUND, "policy", [&] {
         pb::SetAdaptiveCapRequest q; q.set_policy(4242); q.set_cap(1000); pb::SetAdaptiveCapResponse r;
         return os->SetAdaptiveCap(Ctx(op_).get(), q, &r); }},
      {"bad tenant name", StatusCode::INVALID_ARGUMENT, "name", [&] {
         pb::CreateTenantRequest q; q.set_name("a b"); pb::CreateTenantResponse r;
         return as->CreateTenant(Ctx(admin_).get(), q, &r); }},
      {"negative balance", StatusCode::INVALID_ARGUMENT, "balance", [&] {
         pb::CreateTenantRequest q; q.set_name("neg"); q.set_balance(-1); pb::CreateTenantResponse r;
         return as->CreateTenant(Ctx(admin_).get(), q, &r); }},
      {"duplicate tenant", StatusCode::ALREADY_EXISTS, "name", [&] {
         pb::CreateTenantRequest q; q.set_name("acme"); pb::CreateTenantResponse r;
         return as->CreateTenant(Ctx(admin_).get(), q, &r); }},
      {"unknown role", StatusCode::INVALID_ARGUMENT, "role", [&] {
         pb::IssueTokenRequest q; q.set_role("root"); pb::IssueTokenResponse r;
         return as->IssueToken(Ctx(admin_).get(), q, &r); }},
      {"unknown token id", StatusCode::NOT_FOUND, "token_id", [&] {
         pb::RevokeTokenRequest q; q.set_token_id(424242); pb::RevokeTokenResponse r;
         return as->RevokeToken(Ctx(admin_).get(), q, &r); }},
      {"deposit to unknown tenant", StatusCode::NOT_FOUND, "tenant", [&] {
         pb::DepositRequest q; q.set_tenant("ghost"); q.set_amount(1); pb::DepositResponse r;
         return as->Deposit(Ctx(admin_).get(), q, &r); }},
  };
  auto before = OperatorLedger();
  pb::ListClusterResponse cluster_before;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &cluster_before).ok());
  auto seq_before = server_->store().LastSeq();
  for (const auto& c : cases) {
    grpc::Status st = c.call();
    EXPECT_EQ(st.error_code(), c.code) << c.name << ": " << st.error_message();
    EXPECT_EQ(st.error_message().rfind(c.field + ":", 0), 0u) << c.name << ": " << st.error_message();
  }
  // Nothing changed: no journal records but (at most) time advances, same
  // ledger, same cluster.
  ASSERT_TRUE(server_->store().ReadJournal(*seq_before, [](const JournalRecord& r) {
    EXPECT_NE(r.line.find("\"op\":\"advance\""), std::string::npos) << r.line;
    return Status::Ok();
  }).ok());
  auto after = OperatorLedger();
  EXPECT_EQ(after.deposited(), before.deposited());
  EXPECT_EQ(after.tenant_balances(), before.tenant_balances());
  pb::ListClusterResponse cluster_after;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &cluster_after).ok());
  EXPECT_EQ(cluster_after.nodes_size(), cluster_before.nodes_size());
}

TEST_F(ServerFixture, OversizedRequestIsRefused) {
  Populate();
  pb::AddNodesRequest q;
  for (int i = 0; i < 20000; ++i) {
    auto* n = q.add_nodes();
    n->set_name(std::string(100, 'x') + std::to_string(i));
    n->set_type("t");
  }
  pb::AddNodesResponse r;
  grpc::Status st = op_stub_->AddNodes(Ctx(op_).get(), q, &r);
  EXPECT_EQ(st.error_code(), StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
}

class RateLimitedServer : public ServerFixture {
 protected:
  void SetUp() override {
    auto o = DefaultOptions();
    o.rate_limit = 1;  // One request per second after a burst of five.
    o.rate_burst = 5;
    StartServer(o);
  }
};

TEST_F(RateLimitedServer, TenantsOverTheirRateGetResourceExhausted) {
  a_ = CreateTenant("acme", kUnit);
  b_ = CreateTenant("bolt", kUnit);
  pb::BalanceResponse r;
  int ok = 0;
  grpc::Status last;
  for (int i = 0; i < 8; ++i) {
    last = tenant_stub_->GetBalance(Ctx(a_).get(), pb::GetBalanceRequest(), &r);
    ok += last.ok();
  }
  EXPECT_GE(ok, 5);
  EXPECT_LT(ok, 8);
  EXPECT_EQ(last.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(last.error_message().find("rate limit"), std::string::npos);
  // Another tenant has its own budget.
  EXPECT_TRUE(tenant_stub_->GetBalance(Ctx(b_).get(), pb::GetBalanceRequest(), &r).ok());
}

TEST_F(ServerFixture, HttpHealthAndMetrics) {
  Populate();
  httplib::Client http("127.0.0.1", server_->http_port());
  auto h = http.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_NE(h->body.find("\"ok\""), std::string::npos);
  // /metrics shows per-method and tenant counts: operators only.
  auto anonymous = http.Get("/metrics");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  auto as_tenant = http.Get("/metrics", {{"Authorization", "Bearer " + a_}});
  ASSERT_TRUE(as_tenant);
  EXPECT_EQ(as_tenant->status, 403);
  auto m = http.Get("/metrics", {{"Authorization", "Bearer " + op_}});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("laissez_requests_total{method=\"AddNodes\",code=\"OK\"} 1"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("laissez_request_seconds_bucket{method=\"CreateTenant\""), std::string::npos);
  EXPECT_NE(m->body.find("laissez_market_live_nodes 5"), std::string::npos);
  EXPECT_NE(m->body.find("laissez_engine_queue_length"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Durability: a restart on the same database gives the same market.

TEST_P(RestartTest, RestartRecoversTheSameState) {
  server_->Shutdown();
  std::string db = TempPath(std::string("restart-") + GetParam() + ".db");
  cleanup_ = {db, db + "-wal", db + "-shm", db + ".admin-token", db + ".identity", db + ".snapshot"};
  auto o = DefaultOptions();
  o.db = db;
  o.store = GetParam();
  StartServer(o);
  EXPECT_EQ(IsJournalFile(db), o.store == "journal");
  ASSERT_TRUE(server_->fresh());
  // The admin token file: mode 0600, same token.
  struct stat st {};
  ASSERT_EQ(::stat((db + ".admin-token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto file_token = ReadTokenFile(db + ".admin-token");
  ASSERT_TRUE(file_token.ok());
  EXPECT_EQ(*file_token, admin_);

  Populate();
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit).ok());
  ASSERT_TRUE(Place(b_, "h100x8/eu/eu-1a/r1/k2", 7 * kUnit).ok());
  // An adaptive cap whose cap was changed in place: both calls are journaled.
  pb::PolicyResponse cap;
  ASSERT_TRUE(op_stub_->AddAdaptivePowerCap(Ctx(op_).get(), AdaptiveCap(), &cap).ok());
  pb::SetAdaptiveCapRequest cq;
  cq.set_policy(cap.policy());
  cq.set_cap(7000);
  pb::SetAdaptiveCapResponse cr;
  ASSERT_TRUE(op_stub_->SetAdaptiveCap(Ctx(op_).get(), cq, &cr).ok());
  auto policy = [&] {
    return server_->core().Execute<market::PolicyView>(
        "test", [&](WriterContext& w) { return w.engine().GetPolicy(PolicyId(cap.policy())); });
  };
  auto cap_before = policy();
  ASSERT_TRUE(cap_before.ok());
  auto before = OperatorLedger();
  pb::ListClusterResponse cb;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &cb).ok());
  server_->Shutdown();

  StartServer(o);
  EXPECT_FALSE(server_->fresh());
  EXPECT_TRUE(server_->admin_token().empty());
  pb::ListClusterResponse ca;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &ca).ok());
  ASSERT_EQ(ca.nodes_size(), cb.nodes_size());
  for (int i = 0; i < ca.nodes_size(); ++i) {
    EXPECT_EQ(ca.nodes(i).holder(), cb.nodes(i).holder());
    EXPECT_EQ(ca.nodes(i).limit(), cb.nodes(i).limit());
  }
  auto cap_after = policy();
  ASSERT_TRUE(cap_after.ok());
  EXPECT_EQ(cap_after->spec, cap_before->spec);  // cap_w 7000 and every controller parameter.
  EXPECT_TRUE(cap_after->alive);
  EXPECT_EQ(std::get<market::AdaptivePowerCapSpec>(cap_after->spec).cap_w, 7000);
  EXPECT_EQ(cap_after->next_step, cap_before->next_step);  // The step grid from the add_policy time.
  auto after = OperatorLedger();
  EXPECT_EQ(after.deposited(), before.deposited());
  // Money is conserved across the restart; holders paid for the time in between.
  EXPECT_EQ(after.deposited(), after.tenant_balances() + after.operator_revenue());
  EXPECT_GE(after.operator_revenue(), before.operator_revenue());
  // Tokens survived, hashed.
  EXPECT_EQ(Nodes(a_).nodes_size(), 1);
  auto tokens = server_->store().LoadTokens();
  ASSERT_TRUE(tokens.ok());
  for (const auto& t : tokens.value()) {
    EXPECT_EQ(t.hash.size(), 64u);
    EXPECT_NE(t.hash, a_);
  }
}

// The journal file keeps snapshots beside it (PATH.snapshot): a restart
// restores the newest and replays only the journal after it. A database's
// kind is found from its file when --store is not given; the other kind, asked
// by name, is refused.
TEST_F(ServerFixture, TheJournalFileRestartsFromASnapshotAndKeepsItsKind) {
  server_->Shutdown();
  std::string db = TempPath("snap.journal");
  cleanup_ = {db, db + ".admin-token", db + ".identity", db + ".snapshot", db + ".snapshot.new"};
  ServerOptions o = DefaultOptions();
  o.db = db;
  o.store = "journal";
  o.snapshot_every = std::chrono::milliseconds(0);
  StartServer(o);
  Populate();
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit).ok());
  auto snap = server_->core().TakeSnapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  ASSERT_TRUE(server_->store().WriteSnapshot(*snap).ok());
  ASSERT_TRUE(Place(b_, "h100x8/eu/eu-1a/r1/k2", 7 * kUnit).ok());
  auto before = OperatorLedger();
  pb::ListClusterResponse cb;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &cb).ok());
  server_->Shutdown();

  o.store.clear();  // Found from the file.
  StartServer(o);
  EXPECT_EQ(server_->core().restored_seq(), snap->seq);
  EXPECT_GT(server_->core().replayed(), 0u);
  pb::ListClusterResponse ca;
  ASSERT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &ca).ok());
  ASSERT_EQ(ca.nodes_size(), cb.nodes_size());
  for (int i = 0; i < ca.nodes_size(); ++i) EXPECT_EQ(ca.nodes(i).holder(), cb.nodes(i).holder());
  auto after = OperatorLedger();
  EXPECT_EQ(after.deposited(), before.deposited());
  EXPECT_EQ(after.deposited(), after.tenant_balances() + after.operator_revenue());
  server_->Shutdown();

  o.store = "sqlite";
  Server wrong(o);
  laissez::Status st = wrong.Start();
  EXPECT_EQ(st.code(), laissez::StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("--store journal"), std::string::npos) << st.ToString();
  o.store = "journal";
  StartServer(o);  // Still whole after the refusal.
  EXPECT_EQ(OperatorLedger().deposited(), before.deposited());
}

// A snapshot in the SQLite database: a restart restores it and replays only
// the journal after it, to the same state and the same idempotency keys; the
// journal itself stays whole. A snapshot that does not load is skipped (the
// journal is whole), with the same result.
TEST_P(RestartTest, RestartFromASnapshotReplaysOnlyTheTail) {
  ServerOptions o = RestartOnDisk("snap.db", GetParam());
  o.snapshot_every = std::chrono::milliseconds(0);  // Snapshots only when this test takes them.
  server_->Shutdown();
  StartServer(o);
  Populate();
  ASSERT_TRUE(Place(a_, "n1", 10 * kUnit).ok());
  pb::DepositRequest dq;
  dq.set_tenant("acme");
  dq.set_amount(5 * kUnit);
  dq.set_idempotency_key("before-snapshot");
  pb::DepositResponse d1;
  ASSERT_TRUE(admin_stub_->Deposit(Ctx(admin_).get(), dq, &d1).ok());
  auto snap = server_->core().TakeSnapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  ASSERT_TRUE(server_->store().WriteSnapshot(*snap).ok());
  // The tail: more calls after the snapshot.
  ASSERT_TRUE(Place(b_, "h100x8/eu/eu-1a/r1/k2", 7 * kUnit).ok());
  ASSERT_TRUE(Place(a_, "h100x8", 2 * kUnit).ok());
  auto state = [&] {
    pb::ListClusterResponse c;
    EXPECT_TRUE(op_stub_->ListCluster(Ctx(op_).get(), pb::ListClusterRequest(), &c).ok());
    std::string out;
    for (const auto& n : c.nodes()) out += n.node() + ":" + n.holder() + ":" + std::to_string(n.limit()) + ";";
    pb::ListOrdersResponse mine;
    EXPECT_TRUE(tenant_stub_->ListOrders(Ctx(a_).get(), pb::ListOrdersRequest(), &mine).ok());
    for (const auto& ord : mine.orders()) out += std::to_string(ord.id()) + "@" + std::to_string(ord.price()) + ";";
    return out;
  };
  std::string before = state();
  uint64_t last = server_->core().applied_seq();
  ASSERT_GT(last, snap->seq);
  server_->Shutdown();

  StartServer(o);
  EXPECT_EQ(server_->core().restored_seq(), snap->seq);
  // The shutdown's last time advance may add a record to the tail.
  EXPECT_GE(server_->core().replayed(), last - snap->seq);
  EXPECT_LT(server_->core().replayed(), last);
  EXPECT_EQ(state(), before);
  auto led = OperatorLedger();
  EXPECT_EQ(led.deposited(), led.tenant_balances() + led.operator_revenue());
  // The key table came back with the snapshot: a repeat is the original.
  pb::DepositResponse again;
  ASSERT_TRUE(admin_stub_->Deposit(Ctx(admin_).get(), dq, &again).ok());
  EXPECT_EQ(again.balance(), d1.balance());
  EXPECT_EQ(OperatorLedger().deposited(), led.deposited()) << "a repeat after a restore deposited again";
  // The journal is whole: replay and explain still read it from seq 1.
  uint64_t first = 0;
  (void)server_->store().ReadJournal(0, [&](const JournalRecord& r) {
    first = r.seq;
    return Internal("first record read");
  });
  EXPECT_EQ(first, 1u);
  std::string with_snapshot = state();
  server_->Shutdown();

  // A damaged snapshot: skipped, the whole journal replayed, the same state.
  {
    auto store = o.store == "journal" ? OpenJournalStore(o.db) : OpenSqliteStore(o.db);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto seq = (*store)->LastSeq();
    ASSERT_TRUE(seq.ok());
    StoredSnapshot bad = *snap;
    bad.seq = *seq;
    bad.image[bad.image.size() / 2] ^= 1;
    ASSERT_TRUE((*store)->WriteSnapshot(bad).ok());
    EXPECT_EQ((*store)->WriteSnapshot(StoredSnapshot{*seq + 1, "x"}).code(), laissez::StatusCode::kInvalidArgument);
  }
  StartServer(o);
  EXPECT_EQ(server_->core().restored_seq(), 0u);
  EXPECT_EQ(state(), with_snapshot);
}

// The server's snapshot thread writes one when the journal moved on.
TEST_F(ServerFixture, SnapshotsAreWrittenPeriodically) {
  server_->Shutdown();
  ServerOptions o = DefaultOptions();
  o.snapshot_every = std::chrono::milliseconds(50);
  StartServer(o);
  Populate();
  uint64_t seq = server_->core().applied_seq();
  bool written = false;
  for (int i = 0; i < 200 && !written; ++i) {
    auto snap = server_->store().LoadSnapshot();
    written = snap.ok() && snap->seq >= seq;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(written);
}

// ---------------------------------------------------------------------------
// The SDK's gRPC transport.

TEST_F(ServerFixture, SdkClientOverGrpc) {
  Populate();
  ConnectOptions co;
  co.address = "127.0.0.1:" + std::to_string(server_->grpc_port());
  co.token = a_;
  auto client = GrpcMarketClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto& c = **client;
  EXPECT_EQ(c.tenant_name(), "acme");
  auto v = c.FindVertex("h100x8/eu/eu-1a/r1/k1");
  ASSERT_TRUE(v.ok());
  auto watch = c.Watch({"h100x8"});
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  market::OrderSpec spec;
  spec.scope = *v;
  spec.price = 10 * kUnit;
  auto order = c.PlaceOrder(spec);
  ASSERT_TRUE(order.ok()) << order.status().ToString();
  std::vector<market::Event> events;
  for (int i = 0; i < 100 && events.empty(); ++i) {
    ASSERT_TRUE((*watch)->Poll(&events, 200).ok());
    std::erase_if(events, [](const market::Event& e) { return e.type != market::EventType::kAllocated; });
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tenant, c.tenant());
  auto me = c.Me();
  ASSERT_TRUE(me.ok());
  ASSERT_EQ(me->nodes.size(), 1u);
  EXPECT_EQ(me->nodes[0], events[0].node);
  auto desc = c.DescribeNode(me->nodes[0]);
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->rack, "k1");
  auto ev = c.GetEvictionQuote(me->nodes[0]);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->limit, 10 * kUnit);
  auto q = c.Quote(desc->type_root, true);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->held, 1u);
  EXPECT_TRUE(c.SetLimit(me->nodes[0], 12 * kUnit).ok());
  EXPECT_TRUE(c.Relinquish(me->nodes[0]).ok());
  auto bal = c.Balance();
  ASSERT_TRUE(bal.ok());
  EXPECT_LE(*bal, 1000 * kUnit);
  EXPECT_EQ(c.CancelOrder(OrderId(999999)).code(), ::laissez::StatusCode::kNotFound);
}

}  // namespace
}  // namespace laissez::server
