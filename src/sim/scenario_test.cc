#include "sim/scenario.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

namespace laissez::sim {
namespace {

const std::string kBase = std::string(LAISSEZ_SOURCE_DIR) + "/scenarios/base.yaml";

TEST(ScenarioTest, ShippedBaseScenarioParsesAndExpands) {
  auto s = LoadScenario(kBase);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->types.size(), 3u);
  EXPECT_EQ(s->workloads.size(), 4u);
  auto w = BuildWorld(*s, 1);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->nodes.size(), 48u);
  EXPECT_EQ(w->NodesOfType(0) + w->NodesOfType(1) + w->NodesOfType(2), 48u);
  // Offered batch work reaches the contention target.
  double offered = 0;
  int inference = 0;
  for (const Job& j : w->jobs) {
    if (j.kind == JobKind::kInference) {
      ++inference;
      EXPECT_FALSE(j.need.empty());
      continue;
    }
    offered += j.nodes * j.ideal_hours;
    EXPECT_GE(j.arrival, 0);
    EXPECT_LT(j.arrival, s->arrival_window);
    EXPECT_GT(j.value, 0);
  }
  EXPECT_EQ(inference, 2);
  EXPECT_GE(offered, 48 * 24.0);
  // Jobs are in arrival order with ids in that order.
  for (size_t i = 1; i < w->jobs.size(); ++i) {
    EXPECT_LE(w->jobs[i - 1].arrival, w->jobs[i].arrival);
    EXPECT_EQ(w->jobs[i].id, i);
  }
}

TEST(ScenarioTest, SameSeedSameWorldDifferentSeedDifferentWorld) {
  auto s = LoadScenario(kBase);
  ASSERT_TRUE(s.ok());
  auto a = BuildWorld(*s, 7), b = BuildWorld(*s, 7), c = BuildWorld(*s, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->jobs.size(), b->jobs.size());
  for (size_t i = 0; i < a->jobs.size(); ++i) {
    EXPECT_EQ(a->jobs[i].arrival, b->jobs[i].arrival);
    EXPECT_EQ(a->jobs[i].value, b->jobs[i].value);
  }
  bool differ = a->jobs.size() != c->jobs.size();
  for (size_t i = 0; !differ && i < a->jobs.size(); ++i) differ = a->jobs[i].arrival != c->jobs[i].arrival;
  EXPECT_TRUE(differ);
}

TEST(ScenarioTest, CompositionIsHonouredByLargestRemainder) {
  auto s = LoadScenario(kBase);
  ASSERT_TRUE(s.ok());
  s->node_count = 10;
  s->composition = {{"h100x8", 0.5}, {"a100x8", 0.25}, {"l40sx8", 0.25}};
  auto w = BuildWorld(*s, 1);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->NodesOfType(0), 5u);
  EXPECT_EQ(w->NodesOfType(1) + w->NodesOfType(2), 5u);
}

struct BadCase {
  const char* yaml;
  const char* error;
};

TEST(ScenarioTest, BadInputNamesTheFieldAndTheReason) {
  const std::string types = "types: [{name: h, list_price: 1}]\n";
  const std::string work = "workloads: [{kind: training, share: 1, speed: {h: 1}}]\n";
  const BadCase cases[] = {
      {"[1, 2]", "scenario: must be a YAML mapping"},
      {"bogus: 1\n", "bogus: unknown key"},
      {"duration: -1h\n", "duration"},
      {"workloads: []\n", "workloads: must list at least one workload"},
      {"types: [{name: h, list_price: nan}]\n", "types[0].list_price"},
      {"types: [{name: h, list_price: -3}]\n", "types[0].list_price"},
      {"types: [{name: h, list_price: 1}, {name: h, list_price: 2}]\n", "types[1].name: duplicate type"},
      {"cluster: {nodes: 0}\n", "cluster.nodes: must be positive"},
      {"workloads: [{kind: quantum, speed: {h: 1}}]\n", "workloads[0].kind: unknown kind"},
      {"workloads: [{kind: training, speed: {h: 2}}]\n", "workloads[0].speed.h: must be at most 1"},
      {"workloads: [{kind: training, speed: {x: 1}}]\n", "workloads[0].speed.x: unknown type"},
      {"workloads: [{kind: training, speed: {h: 1}, checkpoint_save: soon}]\n", "workloads[0].checkpoint_save"},
      {"workloads: [{kind: inference, speed: {h: 1}}]\n", "workloads[0].trace: is required"},
      {"market: {grace: 5x}\n", "market.grace"},
  };
  for (const BadCase& c : cases) {
    std::string doc = c.yaml;
    if (doc.find("types") == std::string::npos && doc.rfind("[", 0) != 0) doc = types + doc;
    if (doc.find("workloads") == std::string::npos && doc.rfind("[", 0) != 0) doc += work;
    auto s = ParseScenario(doc);
    ASSERT_FALSE(s.ok()) << c.yaml;
    SCOPED_TRACE(c.yaml);
    EXPECT_NE(s.status().message().find(c.error), std::string::npos) << s.status().message() << " for " << c.yaml;
  }
}

TEST(ScenarioTest, TypesAreRequired) {
  auto s = ParseScenario("workloads: [{kind: training, share: 1, speed: {h: 1}}]\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("types: must list at least one hardware type"), std::string::npos);
}

TEST(ScenarioTest, TraceShapeIsNormalizedPerMinute) {
  auto shape = LoadTraceShape(DataDir() + "/traces/AzureLLMInferenceTrace_conv.csv");
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_GE(shape->size(), 50u);
  EXPECT_LE(shape->size(), 62u);
  double mx = 0;
  for (double v : *shape) {
    EXPECT_GE(v, 0);
    mx = std::max(mx, v);
  }
  EXPECT_DOUBLE_EQ(mx, 1.0);
  EXPECT_FALSE(LoadTraceShape("/nonexistent/trace.csv").ok());
}

TEST(ScenarioTest, AdaptivePowerCapIsReadIntoTheWorld) {
  auto base = LoadScenario(kBase);
  ASSERT_TRUE(base.ok());
  std::ifstream in(kBase);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cluster = "cluster:\n";
  auto with = [&](const std::string& extra) {
    std::string t = text;
    size_t at = t.find(cluster);
    EXPECT_NE(at, std::string::npos);
    t.insert(at + cluster.size(), extra);
    return ParseScenario(t);
  };
  auto s = with("  power_caps: [{row: 0, cap_w: 50000}]\n"
                "  power_adaptive: {margin: 0.15, band: 0.2, interval: 30s, rise: 0.25, rise_min: 1, rise_max: 20, "
                "fall: 0.5}\n");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->power_adaptive.has_value());
  EXPECT_EQ(s->power_adaptive->margin_ppm, 150'000);
  EXPECT_EQ(s->power_adaptive->band_ppm, 200'000);
  EXPECT_EQ(s->power_adaptive->interval, 30 * kMicrosPerSecond);
  EXPECT_EQ(s->power_adaptive->rise_max, 20 * kMicroUnits);
  EXPECT_EQ(s->power_adaptive->fall_step, kMicroUnits / 2);
  EXPECT_EQ(s->power_adaptive->max_floor, kInfPrice);
  auto w = BuildWorld(*s, 1);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->power_adaptive.has_value());
  EXPECT_EQ(*w->power_adaptive, *s->power_adaptive);

  auto missing = with("  power_adaptive: {margin: 0.15, band: 0.2, rise: 0.25, rise_min: 1, rise_max: 20}\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cluster.power_adaptive.fall"), std::string::npos)
      << missing.status().ToString();
  auto bad = with("  power_adaptive: {margin: 0.15, band: 0.2, rise: 0.25, rise_min: 0, rise_max: 20, fall: 1}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rise_min"), std::string::npos) << bad.status().ToString();
  auto typo = with("  power_adaptive: {margn: 0.15}\n");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("margn"), std::string::npos);
}

}  // namespace
}  // namespace laissez::sim
