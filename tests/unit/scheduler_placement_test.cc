// Placement: Torpor's Algorithm 1 branch by branch on the paper's 4-GPU node (Fig. 5), our tie
// rules, the exclusion mask and too-small GPUs; and the Random ablation.
//
// The node: GPUs {0,1} share PCIe switch 0 and {2,3} switch 1; NVLink 0-3, 1-2 and 2-3 run at
// 50 GB/s, 0-1, 0-2 and 1-3 at 25 GB/s.
#include "scheduler/placement.h"

#include <gtest/gtest.h>

#include <array>

#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::spec;
using testing::torpor_topology;

constexpr uint64_t kGpu = 8 * kGiB;

class PlacementTest : public ::testing::Test {
 protected:
  PlacementTest()
      : topology_(torpor_topology(kGpu)),
        node_(topology_),
        functions_(WindowOptions{}, HeavinessOptions{}, 12.0),
        rng_(1),
        algorithm1_(make_algorithm1_placement()) {}

  FunctionIndex add(FunctionId id, uint64_t bytes, bool heavy = false) {
    Result<FunctionIndex> f =
        functions_.add(id, spec(bytes, 100 * kMillisecond, 10 * kMillisecond, heavy), 0);
    EXPECT_TRUE(f.ok()) << f.status();
    node_.ensure_function_slots(functions_.slots());
    return *f;
  }

  // GPU g runs some request of `f` (none: a request whose model we do not care about).
  void busy(int g, std::optional<FunctionIndex> f = std::nullopt) {
    node_.set_running(g, RequestId{100 + static_cast<uint64_t>(g)}, f);
  }
  // GPU g is busy loading f from the host.
  void host_loading(int g, FunctionIndex f) {
    busy(g, f);
    node_.add_replica(g, f, functions_.spec(f).model_bytes, /*loading=*/true, 0);
    node_.set_host_loading(g, f);
  }
  void resident(int g, FunctionIndex f) {
    node_.add_replica(g, f, functions_.spec(f).model_bytes, /*loading=*/false, 0);
  }

  Placement place(FunctionIndex f, GpuMask excluded = 0) {
    return algorithm1_->place(f, PlacementContext{node_, functions_, rng_, excluded});
  }

  Topology topology_;
  NodeState node_;
  FunctionTable functions_;
  Rng rng_;
  std::unique_ptr<PlacementPolicy> algorithm1_;
};

TEST_F(PlacementTest, ResidentOnAnAvailableGpuRunsThereWithoutSwap) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  resident(2, f);
  resident(3, f);
  const Placement p = place(f);
  EXPECT_EQ(p.gpu, 2);  // "any GPU in G": the lowest
  EXPECT_EQ(p.source, Source::kResident);
  EXPECT_EQ(p.source_gpu, -1);
  EXPECT_EQ(p.rule, PlacementRule::kResident);
}

TEST_F(PlacementTest, ResidentOnlyOnBusyGpusCopiesOverTheFastestLink) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  resident(0, f);
  busy(0);
  // Available {1,2,3}; links to holder 0: 1 at 25, 2 at 25, 3 at 50 GB/s.
  const Placement p = place(f);
  EXPECT_EQ(p.gpu, 3);
  EXPECT_EQ(p.source, Source::kPeer);
  EXPECT_EQ(p.source_gpu, 0);
  EXPECT_EQ(p.rule, PlacementRule::kPeer);
}

TEST_F(PlacementTest, EqualLinksGoToTheTargetWithMoreFreeMemoryThenTheLowestPair) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex other = add(FunctionId{2}, 3 * kGiB);
  resident(0, f);
  resident(1, f);
  busy(0);
  busy(1);
  // Available {2,3}: pairs (2,1) and (3,0) both at 50 GB/s, equally free: the lower target.
  Placement p = place(f);
  EXPECT_EQ(p.gpu, 2);
  EXPECT_EQ(p.source_gpu, 1);
  // With less room on GPU 2, the pair (3,0) wins.
  resident(2, other);
  p = place(f);
  EXPECT_EQ(p.gpu, 3);
  EXPECT_EQ(p.source_gpu, 0);
}

TEST_F(PlacementTest, NotResidentLoadsFromHostAwayFromLoadingNeighbours) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex loader = add(FunctionId{2}, kGiB, /*heavy=*/true);
  host_loading(1, loader);
  // GPU 0's neighbour 1 is loading; GPUs 2 and 3 have quiet neighbours: the lower of them.
  const Placement p = place(f);
  EXPECT_EQ(p.gpu, 2);
  EXPECT_EQ(p.source, Source::kHost);
  EXPECT_EQ(p.rule, PlacementRule::kHostQuietNeighbours);
}

TEST_F(PlacementTest, QuietCandidatesGoToTheMostFreeGpu) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex other = add(FunctionId{2}, 2 * kGiB);
  resident(0, other);
  resident(1, other);
  resident(2, other);
  EXPECT_EQ(place(f).gpu, 3);
}

TEST_F(PlacementTest, WithEveryNeighbourLoadingPreferOnesLoadingLightModels) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex heavy = add(FunctionId{2}, kGiB, /*heavy=*/true);
  const FunctionIndex light = add(FunctionId{3}, kGiB, /*heavy=*/false);
  host_loading(1, heavy);  // neighbour of 0
  host_loading(3, light);  // neighbour of 2
  const Placement p = place(f);
  EXPECT_EQ(p.gpu, 2);
  EXPECT_EQ(p.source, Source::kHost);
  EXPECT_EQ(p.rule, PlacementRule::kHostLightNeighbours);
}

TEST_F(PlacementTest, WithOnlyHeavyLoadingNeighboursTakeAnyGpuWithTheMostRoom) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex heavy_a = add(FunctionId{2}, kGiB, /*heavy=*/true);
  const FunctionIndex heavy_b = add(FunctionId{3}, kGiB, /*heavy=*/true);
  const FunctionIndex other = add(FunctionId{4}, kGiB);
  host_loading(1, heavy_a);
  host_loading(3, heavy_b);
  resident(0, other);  // GPU 2 has more room
  const Placement p = place(f);
  EXPECT_EQ(p.gpu, 2);
  EXPECT_EQ(p.rule, PlacementRule::kHostAny);
}

TEST_F(PlacementTest, PeerCopiesDoNotCountAsLoadingNeighbours) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const FunctionIndex copied = add(FunctionId{2}, kGiB);
  // GPU 1 receives a peer copy: busy and loading, but not over the switch's host link.
  busy(1, copied);
  node_.add_replica(1, copied, kGiB, /*loading=*/true, 0);
  EXPECT_EQ(place(f).rule, PlacementRule::kHostQuietNeighbours);
  EXPECT_EQ(place(f).gpu, 0);
}

TEST_F(PlacementTest, NoAvailableGpuMeansWait) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  for (int g = 0; g < 4; ++g) busy(g);
  const Placement p = place(f);
  EXPECT_FALSE(p.placed());
  EXPECT_EQ(p.rule, PlacementRule::kWait);
}

TEST_F(PlacementTest, GpusTooSmallForTheModelAreNotCandidates) {
  const FunctionIndex big = add(FunctionId{1}, 6 * kGiB);
  node_.set_reserved(2, 3 * kGiB);  // GPU 2 can never hold 6 GiB
  busy(0);
  busy(1);
  busy(3);
  EXPECT_FALSE(place(big).placed());
  node_.clear_running(3);
  EXPECT_EQ(place(big).gpu, 3);
}

TEST_F(PlacementTest, ExcludedGpusAreNeverChosenEvenWhereTheModelIsResident) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  resident(0, f);
  // GPU 0 excluded: the model is "resident only on GPUs we cannot use": copy from it.
  Placement p = place(f, gpu_bit(0));
  EXPECT_EQ(p.gpu, 3);
  EXPECT_EQ(p.source, Source::kPeer);
  EXPECT_EQ(p.source_gpu, 0);
  // Excluding 3 too leaves the 25 GB/s links: 1 and 2 tie, the lower wins.
  p = place(f, gpu_bit(0) | gpu_bit(3));
  EXPECT_EQ(p.gpu, 1);
  EXPECT_FALSE(place(f, 0b1111).placed());
}

TEST_F(PlacementTest, WithoutADirectLinkAPeerCopyFallsBackToTheHost) {
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  const Topology plain = testing::plain_topology(2, kGpu);
  NodeState node(plain);
  node.ensure_function_slots(functions_.slots());
  node.add_replica(0, f, kGiB, false, 0);
  node.set_running(0, RequestId{1}, std::nullopt);
  const Placement p = algorithm1_->place(f, PlacementContext{node, functions_, rng_});
  EXPECT_EQ(p.gpu, 1);
  EXPECT_EQ(p.source, Source::kHost);
  EXPECT_EQ(p.rule, PlacementRule::kHostQuietNeighbours);
}

TEST_F(PlacementTest, RandomPlacementRunsAResidentReplicaElseAUniformHostLoad) {
  auto random = make_random_placement();
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  std::array<int, 4> counts{};
  for (int i = 0; i < 4000; ++i) {
    const Placement p = random->place(f, PlacementContext{node_, functions_, rng_});
    ASSERT_TRUE(p.placed());
    EXPECT_EQ(p.source, Source::kHost);
    EXPECT_EQ(p.rule, PlacementRule::kRandom);
    ++counts[static_cast<size_t>(p.gpu)];
  }
  // 1000 expected per GPU; the standard deviation is ~27, so 150 is over 5 sigma.
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  // Blind to links and to loading neighbours, but a resident replica still runs in place.
  resident(1, f);
  for (int i = 0; i < 20; ++i) {
    const Placement p = random->place(f, PlacementContext{node_, functions_, rng_});
    EXPECT_EQ(p.gpu, 1);
    EXPECT_EQ(p.source, Source::kResident);
  }
}

TEST_F(PlacementTest, RandomPlacementReplaysUnderASeed) {
  auto random = make_random_placement();
  const FunctionIndex f = add(FunctionId{1}, kGiB);
  auto draw = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int> gpus;
    for (int i = 0; i < 50; ++i)
      gpus.push_back(random->place(f, PlacementContext{node_, functions_, rng}).gpu);
    return gpus;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

}  // namespace
}  // namespace hiber::scheduler
