#include "oplog/explain.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "oplog/random_log.h"
#include "oplog/replay.h"

namespace laissez::oplog {
namespace {

// alice holds n-0 at 2/h; bob bids 3/h at 60 s; alice raises to 4/h at 100 s
// and keeps it; carol bids 5/h at 200 s; alice lets the grace run out at 320 s.
const char* kLog =
    R"({"v":1,"t":0,"op":"add_node","id":0,"name":"n-0","type":"h100x8","region":"eu","zone":"eu-1a","row":"r1","rack":"k1","gpus":8,"memory_gb":640,"power_w":7000}
{"v":1,"t":0,"op":"create_tenant","id":0,"name":"alice","balance":1000000000}
{"v":1,"t":0,"op":"create_tenant","id":1,"name":"bob","balance":1000000000}
{"v":1,"t":0,"op":"create_tenant","id":2,"name":"carol","balance":1000000000}
{"v":1,"t":1000000,"op":"place_order","id":0,"tenant":0,"scope":0,"price":2000000}
{"v":1,"t":60000000,"op":"place_order","id":1,"tenant":1,"scope":0,"price":3000000}
{"v":1,"t":100000000,"op":"set_limit","tenant":0,"node":0,"limit":4000000}
{"v":1,"t":200000000,"op":"place_order","id":2,"tenant":2,"scope":0,"price":5000000}
{"v":1,"t":400000000,"op":"advance"}
)";

ExplainOutput RunExplain(const ExplainQuery& q) {
  auto r = Explain(kLog, false, q);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ExplainOutput{};
}

TEST(Explain, NodeHistoryOperatorView) {
  ExplainQuery q;
  q.node = "n-0";
  ExplainOutput out = RunExplain(q);
  auto j = nlohmann::json::parse(out.json);
  ASSERT_EQ(j["contests"].size(), 2u);
  const auto& c1 = j["contests"][0];
  EXPECT_EQ(c1["holder"]["name"], "alice");
  EXPECT_EQ(c1["winning_price"], 3000000);
  EXPECT_EQ(c1["holder_limit"], 2000000);
  EXPECT_EQ(c1["deadline"], 180000000);
  EXPECT_EQ(c1["outcome"], "kept");
  EXPECT_EQ(c1["challenger"]["name"], "bob");
  const auto& c2 = j["contests"][1];
  EXPECT_EQ(c2["winning_price"], 5000000);
  EXPECT_EQ(c2["holder_limit"], 4000000);
  EXPECT_EQ(c2["deadline"], 320000000);
  EXPECT_EQ(c2["outcome"], "transferred");
  EXPECT_EQ(c2["new_holder"]["name"], "carol");
  EXPECT_EQ(c2["new_holder_limit"], 5000000);
  ASSERT_EQ(j["holdings"].size(), 2u);
  EXPECT_EQ(j["holdings"][0]["tenant"]["name"], "alice");
  EXPECT_EQ(j["holdings"][0]["from"], 1000000);
  EXPECT_EQ(j["holdings"][0]["to"], 320000000);
  EXPECT_EQ(j["holdings"][1]["tenant"]["name"], "carol");
  EXPECT_EQ(j["holdings"][1]["to"], "never");
  // Every settled interval is listed and sums to what alice paid in all.
  int64_t sum = 0;
  for (const auto& p : j["payments"]) {
    if (p["tenant"]["name"] == "alice") sum += p["paid"].get<int64_t>();
  }
  EXPECT_GT(sum, 0);
  EXPECT_EQ(j["holdings"][0]["paid"], sum);
  EXPECT_NE(out.text.find("alice raised its limit to 4/h"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("grace deadline T+320s"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("the node moved to carol at limit 5/h"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("kept at T+100s after raising the limit to 4/h"), std::string::npos) << out.text;
}

TEST(Explain, TenantViewHidesRivals) {
  ExplainQuery q;
  q.node = "0";
  q.as = "alice";
  ExplainOutput out = RunExplain(q);
  EXPECT_EQ(out.text.find("bob"), std::string::npos) << out.text;
  EXPECT_EQ(out.text.find("carol"), std::string::npos) << out.text;
  EXPECT_EQ(out.json.find("bob"), std::string::npos) << out.json;
  EXPECT_EQ(out.json.find("carol"), std::string::npos) << out.json;
  EXPECT_EQ(out.json.find("challenger_order"), std::string::npos);
  // Carol's limit (5/h) appears only as the notice's price to beat, which alice was told.
  auto j = nlohmann::json::parse(out.json);
  EXPECT_EQ(j["holdings"].size(), 1u);
  EXPECT_FALSE(j["contests"][1].contains("new_holder_limit"));
  EXPECT_NE(out.text.find("another tenant"), std::string::npos);
  EXPECT_NE(out.text.find("not held by you"), std::string::npos);
}

TEST(Explain, TenantEvictions) {
  ExplainQuery q;
  q.tenant = "alice";
  q.as = "alice";
  ExplainOutput out = RunExplain(q);
  auto j = nlohmann::json::parse(out.json);
  EXPECT_EQ(j["evictions"], 1);
  EXPECT_EQ(j["contests"].size(), 2u);
  EXPECT_EQ(out.text.find("carol"), std::string::npos);
  ExplainQuery other;
  other.tenant = "alice";
  other.as = "bob";
  auto denied = Explain(kLog, false, other);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied);
  ExplainQuery bob;
  bob.tenant = "bob";
  auto jb = nlohmann::json::parse(RunExplain(bob).json);
  EXPECT_EQ(jb["evictions"], 0);
  EXPECT_EQ(jb["contests"].size(), 0u);
}

TEST(Explain, AtStopsTheAccount) {
  ExplainQuery q;
  q.node = "n-0";
  auto at = ParseTimeArg("150000000", "--at");
  ASSERT_TRUE(at.ok());
  q.at = *at;
  auto j = nlohmann::json::parse(RunExplain(q).json);
  EXPECT_EQ(j["up_to"], 150000000);
  ASSERT_EQ(j["contests"].size(), 1u);
  EXPECT_EQ(j["contests"][0]["outcome"], "kept");
  EXPECT_EQ(j["now"]["holder"]["name"], "alice");
  EXPECT_EQ(j["now"]["limit"], 4000000);
}

TEST(Explain, SameLogSameBytesAndErrors) {
  ExplainQuery q;
  q.node = "n-0";
  EXPECT_EQ(RunExplain(q).json, RunExplain(q).json);
  EXPECT_EQ(RunExplain(q).text, RunExplain(q).text);
  ExplainQuery missing;
  missing.node = "n-9";
  auto r = Explain(kLog, false, missing);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--node: no node 'n-9'"), std::string::npos);
  ExplainQuery both;
  both.node = "0";
  both.tenant = "alice";
  EXPECT_FALSE(Explain(kLog, false, both).ok());
  std::string bad = std::string(kLog) + "{\"v\":1,\"t\":5,\"op\":\"advance\",\"x\":1}\n";
  auto b = Explain(bad, false, q);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "line 10: x: unknown field");
}

TEST(Explain, RandomLogsExplainEveryNodeAndTenant) {
  // Explain must account for every holding and contest on any history.
  RandomLogOptions opts;
  opts.seed = 5;
  opts.operations = 600;
  opts.nodes = 8;
  opts.tenants = 4;
  market::MarketEngine engine;
  auto log = DriveRandom(engine, opts);
  std::string text;
  for (const auto& r : log) {
    AppendOperation(r.op, r.created_id, &text);
    text.push_back('\n');
  }
  int64_t paid_by_nodes = 0;
  for (size_t n = 0; n < engine.topology().node_count(); ++n) {  // Late additions included.
    ExplainQuery q;
    q.node = std::to_string(n);
    auto r = Explain(text, false, q);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto j = nlohmann::json::parse(r->json);
    paid_by_nodes += j["paid_total"].get<int64_t>();
    for (const auto& c : j["contests"]) {
      EXPECT_TRUE(c["outcome"] == "kept" || c["outcome"] == "transferred" || c["outcome"] == "released" ||
                  c["outcome"] == "open");
    }
  }
  // The operator's per-node accounts add up to the engine's revenue.
  EXPECT_EQ(paid_by_nodes, engine.ledger_totals().operator_revenue);
  int64_t paid_by_tenants = 0;
  for (int t = 0; t < opts.tenants; ++t) {
    ExplainQuery q;
    q.tenant = std::to_string(t);
    q.as = q.tenant;
    auto r = Explain(text, false, q);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto j = nlohmann::json::parse(r->json);
    paid_by_tenants += j["paid_total"].get<int64_t>();
    EXPECT_EQ(j["paid_total"], engine.GetTenant(TenantId(t))->paid);
  }
  EXPECT_EQ(paid_by_tenants, engine.ledger_totals().operator_revenue);
}

TEST(ExplainTime, ParseAndFormat) {
  EXPECT_EQ(*ParseTimeArg("0", "--at"), 0);
  EXPECT_EQ(*ParseTimeArg("1500000", "--at"), 1'500'000);
  EXPECT_EQ(*ParseTimeArg("1970-01-01T00:00:01Z", "--at"), 1'000'000);
  EXPECT_EQ(*ParseTimeArg("2026-11-30T05:00:00Z", "--at"), 1'796'014'800LL * kMicrosPerSecond);
  EXPECT_EQ(*ParseTimeArg("2026-11-30T06:00:00.25+01:00", "--at"), 1'796'014'800LL * kMicrosPerSecond + 250'000);
  EXPECT_EQ(*ParseTimeArg("2026-11-30 05:00Z", "--at"), 1'796'014'800LL * kMicrosPerSecond);
  for (const char* bad : {"", "-5", "soon", "2026-11-30T05:00:00", "2026-02-30T00:00:00Z", "2026-11-30T25:00:00Z",
                          "2026-11-30T05:00:00.1234567Z", "99999999999999999999", "2026-11-30T05:00:00Zjunk"}) {
    auto r = ParseTimeArg(bad, "--at");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("--at: ", 0), 0u) << r.status().message();
  }
  EXPECT_EQ(FormatTime(180'000'000), "T+180s");
  EXPECT_EQ(FormatTime(1'500'000), "T+1.5s");
  EXPECT_EQ(FormatTime(1'796'014'800LL * kMicrosPerSecond + 250'000), "2026-11-30T05:00:00.25Z");
  EXPECT_EQ(*ParseTimeArg(FormatTime(1'796'014'800LL * kMicrosPerSecond + 250'000), "--at"),
            1'796'014'800LL * kMicrosPerSecond + 250'000);
}

}  // namespace
}  // namespace laissez::oplog
