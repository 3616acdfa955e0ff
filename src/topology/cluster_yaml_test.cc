#include "topology/cluster_yaml.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace laissez::topology {
namespace {

constexpr const char* kSmall = R"(
types:
  - {name: h100x8, gpus: 8, memory_gb: 640, power_w: 10200}
  - name: a100x8
    gpus: 8
    memory_gb: 640
    power_w: 6500
regions:
  - name: eu
    zones:
      - name: eu-1a
        rows:
          - name: r1
            power_cap_w: 40000
            racks:
              - name: k1
                nodes:
                  - {type: h100x8, count: 2}
                  - {name: n-17, type: a100x8}
                  - {type: h100x8, count: 1}
          - name: r2
            racks:
              - name: k1
                nodes:
                  - {type: a100x8, count: 1}
)";

std::string ErrorOf(std::string_view yaml) {
  auto r = ParseClusterYaml(yaml);
  EXPECT_FALSE(r.ok()) << "expected a parse error for:\n" << yaml;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(ClusterYamlTest, ParsesNodesInFileOrderWithGeneratedNames) {
  auto r = ParseClusterYaml(kSmall);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& nodes = r->nodes;
  ASSERT_EQ(nodes.size(), 5u);
  EXPECT_EQ(nodes[0].name, "eu-1a-r1-k1-h100x8-0");
  EXPECT_EQ(nodes[1].name, "eu-1a-r1-k1-h100x8-1");
  EXPECT_EQ(nodes[2].name, "n-17");
  // A second count entry of the same type in the same rack continues the numbering.
  EXPECT_EQ(nodes[3].name, "eu-1a-r1-k1-h100x8-2");
  EXPECT_EQ(nodes[4].name, "eu-1a-r2-k1-a100x8-0");
  EXPECT_EQ(nodes[2].type, "a100x8");
  EXPECT_EQ(nodes[2].region, "eu");
  EXPECT_EQ(nodes[2].zone, "eu-1a");
  EXPECT_EQ(nodes[2].row, "r1");
  EXPECT_EQ(nodes[2].rack, "k1");
  EXPECT_EQ(nodes[0].meta.gpus, 8);
  EXPECT_EQ(nodes[0].meta.memory_gb, 640);
  EXPECT_EQ(nodes[0].meta.power_w, 10200);
  EXPECT_EQ(nodes[4].meta.power_w, 6500);
  ASSERT_EQ(r->power_caps.size(), 1u);
  EXPECT_EQ(r->power_caps[0], (RowPowerCap{"eu/eu-1a/r1", 40000}));
}

TEST(ClusterYamlTest, NodesBuildATopology) {
  auto r = ParseClusterYaml(kSmall);
  ASSERT_TRUE(r.ok());
  Topology topo;
  for (const auto& n : r->nodes) ASSERT_TRUE(topo.AddNode(n).ok()) << n.name;
  EXPECT_EQ(topo.live_node_count(), 5u);
  EXPECT_EQ(topo.type_count(), 2u);
  auto row = topo.FindLocation(r->power_caps[0].row_path);
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(topo.location(*row).level, Level::kRow);
  auto v = topo.FindVertex("h100x8/eu/eu-1a/r1/k1");
  ASSERT_TRUE(v.ok());
  auto [b, e] = topo.Range(*v);
  EXPECT_EQ(e - b, 3u);
}

TEST(ClusterYamlTest, SameInputGivesSameOutput) {
  auto a = ParseClusterYaml(kSmall);
  auto b = ParseClusterYaml(kSmall);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->nodes.size(), b->nodes.size());
  for (size_t i = 0; i < a->nodes.size(); ++i) EXPECT_EQ(a->nodes[i].name, b->nodes[i].name);
}

TEST(ClusterYamlTest, ZeroCountAndEmptyListsAreAllowed) {
  auto r = ParseClusterYaml(R"(
types: [{name: l4, gpus: 1, memory_gb: 24, power_w: 72}]
regions:
  - name: us
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes: [{type: l4, count: 0}]
  - name: ap
    zones: []
)");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->nodes.empty());
}

TEST(ClusterYamlTest, UnknownTypeNamesPathLineAndKnownTypes) {
  std::string m = ErrorOf(R"(types:
  - {name: h100x8, gpus: 8, memory_gb: 640, power_w: 10200}
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {type: h200x8, count: 2}
)");
  EXPECT_NE(m.find("regions[0].zones[0].rows[0].racks[0].nodes[0].type"), std::string::npos) << m;
  EXPECT_NE(m.find("line 12"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown type 'h200x8'"), std::string::npos) << m;
  EXPECT_NE(m.find("h100x8"), std::string::npos) << m;
}

TEST(ClusterYamlTest, NegativeCountIsRejected) {
  std::string m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {type: t, count: -3}
)");
  EXPECT_NE(m.find("nodes[0].count"), std::string::npos) << m;
  EXPECT_NE(m.find("line 11"), std::string::npos) << m;
  EXPECT_NE(m.find("must not be negative"), std::string::npos) << m;
}

TEST(ClusterYamlTest, DuplicateNodeNamesAreRejectedIncludingGenerated) {
  std::string m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {name: n-1, type: t}
              - name: k2
                nodes:
                  - {name: n-1, type: t}
)");
  EXPECT_NE(m.find("racks[1].nodes[0].name"), std::string::npos) << m;
  EXPECT_NE(m.find("duplicate node name 'n-1'"), std::string::npos) << m;
  EXPECT_NE(m.find("first defined on line 11"), std::string::npos) << m;

  // An explicit name that collides with a generated one.
  m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {type: t, count: 2}
                  - {name: z-r-k-t-1, type: t}
)");
  EXPECT_NE(m.find("duplicate node name 'z-r-k-t-1'"), std::string::npos) << m;
}

TEST(ClusterYamlTest, DuplicateSiblingLocationsAndTypesAreRejected) {
  std::string m = ErrorOf(R"(types:
  - {name: t, gpus: 1, memory_gb: 1, power_w: 1}
  - {name: t, gpus: 2, memory_gb: 1, power_w: 1}
regions: []
)");
  EXPECT_NE(m.find("types[1].name"), std::string::npos) << m;
  EXPECT_NE(m.find("duplicate type 't'"), std::string::npos) << m;

  m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - {name: z, rows: []}
      - {name: z, rows: []}
)");
  EXPECT_NE(m.find("regions[0].zones[1].name"), std::string::npos) << m;
  EXPECT_NE(m.find("duplicate zone 'z'"), std::string::npos) << m;
}

TEST(ClusterYamlTest, MissingFieldsAreNamed) {
  std::string m = ErrorOf("types: [{name: t, gpus: 1, power_w: 1}]\nregions: []\n");
  EXPECT_NE(m.find("types[0]"), std::string::npos) << m;
  EXPECT_NE(m.find("memory_gb: missing"), std::string::npos) << m;

  m = ErrorOf("types: []\n");
  EXPECT_NE(m.find("regions: missing"), std::string::npos) << m;

  m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {count: 2}
)");
  EXPECT_NE(m.find("nodes[0]"), std::string::npos) << m;
  EXPECT_NE(m.find("type: missing"), std::string::npos) << m;

  m = ErrorOf(R"(types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - name: r
            racks:
              - name: k
                nodes:
                  - {type: t}
)");
  EXPECT_NE(m.find("exactly one of 'name' or 'count'"), std::string::npos) << m;

  m = ErrorOf("types: [{name: t, gpus: 1, memory_gb: 1, power_w: 1}]\nregions: [{zones: []}]\n");
  EXPECT_NE(m.find("regions[0]"), std::string::npos) << m;
  EXPECT_NE(m.find("name: missing"), std::string::npos) << m;
}

TEST(ClusterYamlTest, WrongTypesAreRejected) {
  std::string m = ErrorOf("types: [{name: t, gpus: eight, memory_gb: 1, power_w: 1}]\nregions: []\n");
  EXPECT_NE(m.find("types[0].gpus"), std::string::npos) << m;
  EXPECT_NE(m.find("'eight' is not an integer"), std::string::npos) << m;

  m = ErrorOf("types: [{name: t, gpus: 1.5, memory_gb: 1, power_w: 1}]\nregions: []\n");
  EXPECT_NE(m.find("'1.5' is not an integer"), std::string::npos) << m;

  m = ErrorOf("types: [{name: t, gpus: 1, memory_gb: 1, power_w: 99999999999}]\nregions: []\n");
  EXPECT_NE(m.find("must be at most"), std::string::npos) << m;

  m = ErrorOf("types: {name: t}\nregions: []\n");
  EXPECT_NE(m.find("types (line 1"), std::string::npos) << m;
  EXPECT_NE(m.find("must be a list"), std::string::npos) << m;

  m = ErrorOf("types: []\nregions: [{name: [a, b], zones: []}]\n");
  EXPECT_NE(m.find("regions[0].name"), std::string::npos) << m;
  EXPECT_NE(m.find("must be a string"), std::string::npos) << m;

  m = ErrorOf("types: []\nregions: [{name: eu, zones: 3}]\n");
  EXPECT_NE(m.find("regions[0].zones"), std::string::npos) << m;
  EXPECT_NE(m.find("must be a list"), std::string::npos) << m;

  m = ErrorOf("types: []\nregions: [{name: e/u, zones: []}]\n");
  EXPECT_NE(m.find("must not contain '/'"), std::string::npos) << m;
}

TEST(ClusterYamlTest, BadPowerCap) {
  std::string m = ErrorOf(R"(types: []
regions:
  - name: eu
    zones:
      - name: z
        rows:
          - {name: r, power_cap_w: 0, racks: []}
)");
  EXPECT_NE(m.find("rows[0].power_cap_w"), std::string::npos) << m;
  EXPECT_NE(m.find("line 7"), std::string::npos) << m;
  EXPECT_NE(m.find("must be at least 1"), std::string::npos) << m;
}

TEST(ClusterYamlTest, UnknownAndDuplicateKeysAreRejected) {
  std::string m = ErrorOf("types: []\nregion: []\n");
  EXPECT_NE(m.find("unknown key 'region'"), std::string::npos) << m;
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;

  m = ErrorOf("types: [{name: t, gpus: 1, gpus: 2, memory_gb: 1, power_w: 1}]\nregions: []\n");
  EXPECT_NE(m.find("duplicate key 'gpus'"), std::string::npos) << m;
}

TEST(ClusterYamlTest, SyntaxErrorsAndEmptyDocuments) {
  std::string m = ErrorOf("types: [\n");
  EXPECT_NE(m.find("line"), std::string::npos) << m;
  m = ErrorOf("");
  EXPECT_NE(m.find("empty document"), std::string::npos) << m;
  m = ErrorOf("- a\n- b\n");
  EXPECT_NE(m.find("must be a mapping"), std::string::npos) << m;
}

TEST(ClusterYamlTest, LoadReadsFilesAndPrefixesErrors) {
  std::string path = ::testing::TempDir() + "cluster_yaml_test.yaml";
  {
    std::ofstream out(path);
    out << kSmall;
  }
  auto r = LoadClusterYaml(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->nodes.size(), 5u);
  {
    std::ofstream out(path);
    out << "types: []\nregions: 7\n";
  }
  r = LoadClusterYaml(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
  std::remove(path.c_str());

  r = LoadClusterYaml(path + ".missing");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

#ifdef LAISSEZ_SOURCE_DIR
TEST(ClusterYamlTest, ShippedSmallExampleLoads) {
  auto r = LoadClusterYaml(std::string(LAISSEZ_SOURCE_DIR) + "/scenarios/clusters/small.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Topology topo;
  for (const auto& n : r->nodes) ASSERT_TRUE(topo.AddNode(n).ok()) << n.name;
  EXPECT_EQ(topo.type_count(), 3u);
  EXPECT_FALSE(r->power_caps.empty());
  for (const auto& cap : r->power_caps) {
    auto row = topo.FindLocation(cap.row_path);
    ASSERT_TRUE(row.ok()) << cap.row_path;
    EXPECT_EQ(topo.location(*row).level, Level::kRow);
  }
}
#endif

}  // namespace
}  // namespace laissez::topology
