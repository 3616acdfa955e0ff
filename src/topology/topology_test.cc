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
