#include "topology/topology.h"

#include <gtest/gtest.h>

namespace laissez::topology {
namespace {

NodeInfo N(std::string name, std::string type, std::string zone, std::string row, std::string rack) {
  return NodeInfo{std::move(name), std::move(type), "eu", std::move(zone), std::move(row), std::move(rack), {8, 640, 700}};
}

TEST(Topology, VerticesCoverContiguousRanges) {
  Topology t;
  ASSERT_TRUE(t.AddNode(N("a", "h100", "z1", "r1", "k1")).ok());
  ASSERT_TRUE(t.AddNode(N("b", "a100", "z1", "r1", "k1")).ok());
  ASSERT_TRUE(t.AddNode(N("c", "h100", "z2", "r1", "k1")).ok());
  ASSERT_TRUE(t.AddNode(N("d", "h100", "z1", "r2", "k9")).ok());
  TypeId h100 = *t.FindType("h100");
  auto order = t.LeafOrder(h100);
  ASSERT_EQ(order.size(), 3u);
  VertexId z1 = *t.FindVertex("h100/eu/z1");
  auto [lo, hi] = t.Range(z1);
  EXPECT_EQ(hi - lo, 2u);  // a and d, not c (other zone) nor b (other type).
  for (uint32_t i = lo; i < hi; ++i) EXPECT_NE(t.node(order[i]).name, "c");
  EXPECT_EQ(t.VertexName(z1), "h100/eu/z1");
  EXPECT_EQ(t.Range(t.TypeRoot(h100)).second - t.Range(t.TypeRoot(h100)).first, 3u);
}

TEST(Topology, RejectsBadNodes) {
  Topology t;
  ASSERT_TRUE(t.AddNode(N("a", "h100", "z1", "r1", "k1")).ok());
  EXPECT_EQ(t.AddNode(N("a", "h100", "z1", "r1", "k1")).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(t.AddNode(N("", "h100", "z1", "r1", "k1")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.AddNode(N("x", "h100", "z/1", "r1", "k1")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.node_count(), 1u);
}

TEST(Topology, RemovedNodesLeaveTheLeafOrder) {
  Topology t;
  NodeId a = *t.AddNode(N("a", "h100", "z1", "r1", "k1"));
  ASSERT_TRUE(t.AddNode(N("b", "h100", "z1", "r1", "k1")).ok());
  uint64_t g = t.generation();
  (void)t.LeafOrder(TypeId(0));
  ASSERT_TRUE(t.RemoveNode(a).ok());
  EXPECT_EQ(t.LeafOrder(TypeId(0)).size(), 1u);
  EXPECT_NE(t.generation(), g);
  EXPECT_FALSE(t.RemoveNode(a).ok());
}

// The leaf order: locations depth first in the order they were made, a rack's live nodes in id
// order, and every vertex's range exactly its nodes (issue 12: the nodes are sorted into racks by
// counting, each rack's slice starting where the previous location's ends). Nodes arrive across
// racks, zones and types out of order, and some are removed; the order and every range are
// checked against the names, before and after the removal.
TEST(Topology, TheLeafOrderGoesByLocationThenId) {
  Topology t;
  const char* nodes[][5] = {
      {"a", "h100", "z2", "r1", "k2"}, {"b", "h100", "z1", "r1", "k1"}, {"c", "a100", "z1", "r1", "k1"},
      {"d", "h100", "z2", "r1", "k2"}, {"e", "h100", "z1", "r2", "k3"}, {"f", "h100", "z1", "r1", "k1"},
      {"g", "h100", "z2", "r1", "k4"}, {"h", "a100", "z2", "r1", "k2"}, {"i", "h100", "z1", "r1", "k1"},
  };
  std::vector<NodeId> ids;
  for (auto& n : nodes) ids.push_back(*t.AddNode(N(n[0], n[1], n[2], n[3], n[4])));
  const TypeId h100 = *t.FindType("h100"), a100 = *t.FindType("a100");
  auto names = [&](TypeId type) {
    std::string s;
    for (NodeId n : t.LeafOrder(type)) s += t.node(n).name;
    return s;
  };
  auto range = [&](const char* vertex) {
    const auto [lo, hi] = t.Range(*t.FindVertex(vertex));
    std::string s;
    for (uint32_t i = lo; i < hi; ++i) s += t.node(t.LeafOrder(t.vertex(*t.FindVertex(vertex)).type)[i]).name;
    return s;
  };
  // z2 came first (a), then z1; in z2, rack k2 before k4; in z1, row r1 (k1) before r2 (k3).
  EXPECT_EQ(names(h100), "adgbfie");
  EXPECT_EQ(names(a100), "hc");
  EXPECT_EQ(range("h100/eu/z2/r1/k2"), "ad");
  EXPECT_EQ(range("h100/eu/z2/r1/k4"), "g");
  EXPECT_EQ(range("h100/eu/z1/r1/k1"), "bfi");
  EXPECT_EQ(range("h100/eu/z1"), "bfie");
  EXPECT_EQ(range("a100/eu/z1/r1/k1"), "c");
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto [lo, hi] = t.Range(t.node(ids[i]).leaf);
    EXPECT_EQ(hi, lo + 1);
    EXPECT_EQ(t.LeafIndex(ids[i]), lo);
  }
  ASSERT_TRUE(t.RemoveNode(ids[3]).ok());  // d
  ASSERT_TRUE(t.RemoveNode(ids[5]).ok());  // f
  EXPECT_EQ(names(h100), "agbie");
  EXPECT_EQ(range("h100/eu/z2/r1/k2"), "a");
  EXPECT_EQ(range("h100/eu/z1/r1/k1"), "bi");
  EXPECT_EQ(range("h100/eu/z1"), "bie");
  EXPECT_EQ(t.LeafIndex(ids[3]), UINT32_MAX);
  EXPECT_EQ(t.LeafIndex(ids[8]), 3u);  // i
}

TEST(Topology, AncestorsAndContainment) {
  Topology t;
  NodeId a = *t.AddNode(N("a", "h100", "z1", "r1", "k1"));
  LocationId rack = t.node(a).rack;
  LocationId zone = t.AncestorAt(rack, Level::kZone);
  EXPECT_EQ(t.location(zone).path, "eu/z1");
  EXPECT_TRUE(t.LocationContains(zone, rack));
  EXPECT_FALSE(t.LocationContains(rack, zone));
  std::vector<VertexId> anc;
  t.AncestorsOf(t.node(a).leaf, &anc);
  EXPECT_EQ(anc.size(), 6u);
}

}  // namespace
}  // namespace laissez::topology
