// The node choice hiber-sim's balancer and the router share (scheduler/cluster_balancer.h).
#include "scheduler/cluster_balancer.h"

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace hiber::scheduler {
namespace {

NodeCandidate node(double load, bool resident = false, bool up = true) {
  return NodeCandidate{.up = up, .resident = resident, .expected_load = load};
}

TEST(ClusterBalancer, PicksTheLeastExpectedLoad) {
  const std::vector<NodeCandidate> nodes = {node(0.5), node(0.2), node(0.9)};
  EXPECT_EQ(choose_node(nodes), 1u);
}

TEST(ClusterBalancer, PrefersANodeWhereTheModelIsResidentOverALighterOne) {
  const std::vector<NodeCandidate> nodes = {node(0.1), node(3.0, /*resident=*/true), node(0.0)};
  EXPECT_EQ(choose_node(nodes), 1u);
}

TEST(ClusterBalancer, AmongResidentNodesPicksTheLeastLoaded) {
  const std::vector<NodeCandidate> nodes = {node(2.0, true), node(0.0), node(1.0, true)};
  EXPECT_EQ(choose_node(nodes), 2u);
}

TEST(ClusterBalancer, SkipsNodesThatAreDown) {
  // The lightest node and the only resident one are both down.
  const std::vector<NodeCandidate> nodes = {node(0.0, false, /*up=*/false),
                                            node(0.0, true, /*up=*/false), node(0.7), node(0.4)};
  EXPECT_EQ(choose_node(nodes), 3u);
}

TEST(ClusterBalancer, TiesGoToTheLowerIndex) {
  EXPECT_EQ(choose_node(std::vector<NodeCandidate>{node(1.0), node(0.5), node(0.5)}), 1u);
  EXPECT_EQ(choose_node(std::vector<NodeCandidate>{node(1.0, true), node(1.0, true)}), 0u);
  EXPECT_EQ(choose_node(std::vector<NodeCandidate>{node(0.0), node(0.0), node(0.0)}), 0u);
}

TEST(ClusterBalancer, NoneWhenNoNodeIsUp) {
  EXPECT_EQ(choose_node(std::vector<NodeCandidate>{}), std::nullopt);
  EXPECT_EQ(
      choose_node(std::vector<NodeCandidate>{node(0.0, true, false), node(1.0, false, false)}),
      std::nullopt);
}

// Against the rule written another way: the smallest (not resident, load, index) among the nodes
// that are up.
TEST(ClusterBalancer, MatchesTheRuleOnRandomClusters) {
  std::mt19937 random(17);
  std::uniform_int_distribution<int> size(0, 8);
  std::uniform_int_distribution<int> coin(0, 3);
  std::uniform_int_distribution<int> load(0, 4);  // few values, so ties happen
  for (int round = 0; round < 2000; ++round) {
    std::vector<NodeCandidate> nodes(static_cast<size_t>(size(random)));
    for (NodeCandidate& n : nodes) {
      n = node(load(random) * 0.25, coin(random) == 0, coin(random) != 0);
    }
    std::optional<size_t> expected;
    std::tuple<bool, double, size_t> best_key{};
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!nodes[i].up) continue;
      const auto key = std::make_tuple(!nodes[i].resident, nodes[i].expected_load, i);
      if (!expected || key < best_key) {
        expected = i;
        best_key = key;
      }
    }
    ASSERT_EQ(choose_node(nodes), expected) << "round " << round;
  }
}

}  // namespace
}  // namespace hiber::scheduler
