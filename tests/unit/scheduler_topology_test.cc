// Topology: the scheduler's precomputed view of the shipped node configs (the Torpor paper's
// 4-GPU node and an 8-GPU NVSwitch node), and the configs it refuses.
#include "scheduler/topology.h"

#include <gtest/gtest.h>

#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::shipped_config;

TEST(TopologyTest, TorporNodeHasTwoSwitchPairsAndTwoLinkSpeeds) {
  Result<Topology> t = Topology::from_config(shipped_config("torpor-4gpu.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpu_count(), 4);
  EXPECT_EQ(t->all_gpus(), 0b1111u);
  EXPECT_EQ(t->memory_bytes(0), 16 * kGiB);
  EXPECT_DOUBLE_EQ(t->host_to_device_gbps(3), 12.0);

  EXPECT_EQ(t->pcie_neighbours(0), gpu_bit(1));
  EXPECT_EQ(t->pcie_neighbours(1), gpu_bit(0));
  EXPECT_EQ(t->pcie_neighbours(2), gpu_bit(3));
  EXPECT_EQ(t->pcie_neighbours(3), gpu_bit(2));

  // Fig. 5: 0-3, 1-2, 2-3 at 50 GB/s (rank 0); 0-1, 0-2, 1-3 at 25 GB/s (rank 1).
  const int fast[][2] = {{0, 3}, {1, 2}, {2, 3}};
  const int slow[][2] = {{0, 1}, {0, 2}, {1, 3}};
  for (const auto& p : fast) {
    EXPECT_DOUBLE_EQ(t->peer_gbps(p[0], p[1]), 50.0);
    EXPECT_DOUBLE_EQ(t->peer_gbps(p[1], p[0]), 50.0);
    EXPECT_EQ(t->performance_rank(p[0], p[1]), 0);
  }
  for (const auto& p : slow) {
    EXPECT_DOUBLE_EQ(t->peer_gbps(p[0], p[1]), 25.0);
    EXPECT_EQ(t->performance_rank(p[1], p[0]), 1);
  }
  for (int g = 0; g < 4; ++g) {
    EXPECT_DOUBLE_EQ(t->peer_gbps(g, g), 0.0);
    EXPECT_EQ(t->performance_rank(g, g), -1);
  }
  EXPECT_EQ(t->peers_by_speed(0), (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(t->peers_by_speed(1), (std::vector<int>{2, 0, 3}));
  EXPECT_EQ(t->peers_by_speed(2), (std::vector<int>{1, 3, 0}));
  EXPECT_EQ(t->peers_by_speed(3), (std::vector<int>{0, 2, 1}));
}

TEST(TopologyTest, NvSwitchNodeLinksEveryPairAtOneSpeed) {
  Result<Topology> t = Topology::from_config(shipped_config("nvswitch-8gpu.json"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpu_count(), 8);
  for (int a = 0; a < 8; ++a) {
    EXPECT_EQ(t->pcie_neighbours(a), gpu_bit(a ^ 1));  // pairs behind four switches
    EXPECT_EQ(t->peers_by_speed(a).size(), 7u);
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      EXPECT_DOUBLE_EQ(t->peer_gbps(a, b), 450.0);
      EXPECT_EQ(t->performance_rank(a, b), 0);
    }
  }
  EXPECT_EQ(t->peers_by_speed(5), (std::vector<int>{0, 1, 2, 3, 4, 6, 7}));
}

TEST(TopologyTest, NodeWithoutLinksHasNoPeers) {
  const Topology t = testing::plain_topology(3, kGiB);
  EXPECT_EQ(t.pcie_neighbours(1), gpu_bit(0) | gpu_bit(2));
  EXPECT_TRUE(t.peers_by_speed(0).empty());
  EXPECT_EQ(t.performance_rank(0, 1), -1);
}

TEST(TopologyTest, RefusesConfigsTheSchedulerCannotUse) {
  const NodeConfig good = shipped_config("torpor-4gpu.json");

  NodeConfig none = good;
  none.gpus.clear();
  EXPECT_EQ(Topology::from_config(none).status().code(), ErrorCode::kInvalidValue);

  NodeConfig too_many = good;
  too_many.gpus.resize(65, good.gpus[0]);
  EXPECT_EQ(Topology::from_config(too_many).status().code(), ErrorCode::kInvalidValue);

  NodeConfig no_memory = good;
  no_memory.gpus[2].memory_bytes = 0;
  EXPECT_EQ(Topology::from_config(no_memory).status().code(), ErrorCode::kInvalidValue);

  NodeConfig bad_switch = good;
  bad_switch.gpus[1].pcie_switch = 5;
  EXPECT_EQ(Topology::from_config(bad_switch).status().code(), ErrorCode::kInvalidValue);

  NodeConfig bad_link = good;
  bad_link.nvlinks.push_back({1, 4, 25});
  EXPECT_EQ(Topology::from_config(bad_link).status().code(), ErrorCode::kInvalidValue);

  NodeConfig self_link = good;
  self_link.nvlinks.push_back({2, 2, 25});
  EXPECT_EQ(Topology::from_config(self_link).status().code(), ErrorCode::kInvalidValue);

  NodeConfig bad_fabric = good;
  bad_fabric.nvswitches.push_back({{0, 9}, 100});
  EXPECT_EQ(Topology::from_config(bad_fabric).status().code(), ErrorCode::kInvalidValue);
}

}  // namespace
}  // namespace hiber::scheduler
