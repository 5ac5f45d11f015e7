// The node's pools: per-function accounting across GPUs, quotas, shortfalls that name the
// GPU, and concurrent use by many sessions.
#include "memory/gpu_pools.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <vector>

namespace hiber::memory {
namespace {

std::unique_ptr<GpuPools> four_buddy_gpus(uint64_t per_gpu = 256 * kMiB) {
  auto pools = GpuPools::create_buddy(std::vector<std::vector<uint64_t>>(4, {per_gpu}));
  EXPECT_TRUE(pools.ok()) << pools.status();
  return std::move(*pools);
}

TEST(GpuPools, ParsesPoolNames) {
  EXPECT_EQ(*parse_pool_kind("buddy"), PoolKind::kBuddy);
  EXPECT_EQ(*parse_pool_kind("block"), PoolKind::kBlock);
  EXPECT_EQ(*parse_pool_kind("naive"), PoolKind::kNaive);
  Result<PoolKind> bad = parse_pool_kind("slab");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("buddy, block or naive"), std::string::npos);
}

TEST(GpuPools, AccountsEachFunctionPerGpu) {
  auto pools = four_buddy_gpus();
  AllocationResult a = pools->allocate(0, 20 * kMiB, FunctionId{7});
  AllocationResult b = pools->allocate(2, 3 * kMiB, FunctionId{7});
  AllocationResult c = pools->allocate(2, 2 * kMiB, FunctionId{8});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(pools->function_bytes(FunctionId{7}, 0), 20 * kMiB);
  EXPECT_EQ(pools->function_bytes(FunctionId{7}, 2), 4 * kMiB);
  EXPECT_EQ(pools->function_bytes(FunctionId{7}), 24 * kMiB);
  EXPECT_EQ(pools->function_bytes(FunctionId{8}), 2 * kMiB);
  EXPECT_EQ(pools->stats(2).allocated_bytes, 6 * kMiB);
  EXPECT_TRUE(pools->check_invariants().ok());
  ASSERT_TRUE(pools->deallocate(2, *b).ok());
  EXPECT_EQ(pools->function_bytes(FunctionId{7}), 20 * kMiB);
  // Freed on the wrong GPU, or twice: refused, nothing changes.
  EXPECT_EQ(pools->deallocate(1, *a).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(pools->deallocate(2, *b).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(pools->deallocate(9, *a).code(), ErrorCode::kInvalidDevice);
  EXPECT_EQ(pools->function_bytes(FunctionId{7}, 0), 20 * kMiB);
  EXPECT_TRUE(pools->check_invariants().ok());
}

TEST(GpuPools, EnforcesEachFunctionsQuotaOnEveryGpu) {
  auto pools = four_buddy_gpus();
  pools->set_quota(FunctionId{7}, 40 * kMiB);
  ASSERT_TRUE(pools->allocate(1, 20 * kMiB, FunctionId{7}).ok());
  ASSERT_TRUE(pools->allocate(1, 20 * kMiB, FunctionId{7}).ok());
  AllocationResult over = pools->allocate(1, 2 * kMiB, FunctionId{7});
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(over.shortfall().over_quota);
  EXPECT_FALSE(over.shortfall().never_fits);
  EXPECT_EQ(over.shortfall().gpu, 1);
  EXPECT_EQ(over.shortfall().evict_bytes, 2 * kMiB);
  // The quota is per GPU: a replica on another GPU has its own.
  EXPECT_TRUE(pools->allocate(3, 40 * kMiB, FunctionId{7}).ok());
  AllocationResult too_big = pools->allocate(2, 41 * kMiB, FunctionId{7});
  ASSERT_FALSE(too_big.ok());
  EXPECT_TRUE(too_big.shortfall().never_fits);
  // Other functions are not limited by 7's quota.
  EXPECT_TRUE(pools->allocate(1, 100 * kMiB, FunctionId{8}).ok());
  pools->set_quota(FunctionId{7}, 0);
  EXPECT_TRUE(pools->allocate(1, 60 * kMiB, FunctionId{7}).ok());
}

// Regression: the quota was checked against the request, not against what the pool took after
// rounding, so a function could end up over its quota by up to a minimum block per request.
TEST(GpuPools, AQuotaCountsTheBytesThePoolTakesAfterRounding) {
  auto pools = four_buddy_gpus();
  pools->set_quota(FunctionId{7}, 41 * kMiB);
  AllocationResult rounded = pools->allocate(0, 41 * kMiB, FunctionId{7});  // takes 42 MiB
  ASSERT_FALSE(rounded.ok());
  EXPECT_TRUE(rounded.shortfall().over_quota);
  EXPECT_TRUE(rounded.shortfall().never_fits);
  EXPECT_EQ(rounded.shortfall().needed_bytes, 42 * kMiB);
  EXPECT_EQ(pools->stats(0).allocated_bytes, 0u) << "the pool's allocation was given back";
  ASSERT_TRUE(pools->allocate(0, 40 * kMiB, FunctionId{7}).ok());
  AllocationResult one_byte = pools->allocate(0, 1, FunctionId{7});  // takes 2 MiB: 42 > 41
  ASSERT_FALSE(one_byte.ok());
  EXPECT_TRUE(one_byte.shortfall().over_quota);
  EXPECT_FALSE(one_byte.shortfall().never_fits);
  EXPECT_EQ(one_byte.shortfall().evict_bytes, 1 * kMiB);
  EXPECT_EQ(pools->function_bytes(FunctionId{7}, 0), 40 * kMiB);
  EXPECT_TRUE(pools->check_invariants().ok()) << pools->check_invariants();
}

TEST(GpuPools, FreeingBringsAFunctionBackUnderItsQuota) {
  auto pools = four_buddy_gpus();
  pools->set_quota(FunctionId{7}, 20 * kMiB);
  AllocationResult a = pools->allocate(2, 20 * kMiB, FunctionId{7});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(pools->allocate(2, 2 * kMiB, FunctionId{7}).shortfall().over_quota);
  ASSERT_TRUE(pools->deallocate(2, *a).ok());
  EXPECT_TRUE(pools->allocate(2, 20 * kMiB, FunctionId{7}).ok());
}

TEST(GpuPools, EvictingWhatAShortfallNamesMakesTheRequestFit) {
  auto pools = four_buddy_gpus(256 * kMiB);
  // Eight functions fill GPU 1 with 32 MiB each, in 2 and 20 MiB segments.
  std::map<FunctionId, std::vector<Allocation>> held;
  for (uint32_t i = 1; i <= 8; ++i) {
    const FunctionId f{i};
    for (uint64_t size : {20 * kMiB, 2 * kMiB, 2 * kMiB, 2 * kMiB, 2 * kMiB, 2 * kMiB, 2 * kMiB}) {
      AllocationResult r = pools->allocate(1, size, f);
      ASSERT_TRUE(r.ok()) << r.shortfall().describe();
      held[f].push_back(*r);
    }
  }
  // Function 9 wants 64 MiB in one block; function 3 is running and may not be evicted.
  const auto evictable = [](FunctionId f) { return f != FunctionId{3} && f != FunctionId{9}; };
  AllocationResult r = pools->allocate(1, 64 * kMiB, FunctionId{9}, evictable);
  ASSERT_FALSE(r.ok());
  const Shortfall shortfall = r.shortfall();
  EXPECT_EQ(shortfall.gpu, 1);
  ASSERT_FALSE(shortfall.evict.empty()) << shortfall.describe();
  uint64_t named = 0;
  for (const OwnerBytes& owner : shortfall.evict) {
    EXPECT_NE(owner.function, FunctionId{3});
    named += owner.bytes;
    for (const Allocation& a : held[owner.function]) ASSERT_TRUE(pools->deallocate(1, a).ok());
    held.erase(owner.function);
  }
  EXPECT_GE(named, 64 * kMiB);
  EXPECT_EQ(named, shortfall.evict_bytes);
  EXPECT_TRUE(pools->allocate(1, 64 * kMiB, FunctionId{9}, evictable).ok());
  EXPECT_TRUE(pools->check_invariants().ok()) << pools->check_invariants();
}

TEST(GpuPools, AShortfallNamesTheGpuAndWhoToEvict) {
  auto pools = four_buddy_gpus(64 * kMiB);
  ASSERT_TRUE(pools->allocate(3, 64 * kMiB, FunctionId{5}).ok());
  AllocationResult r = pools->allocate(3, 8 * kMiB, FunctionId{6});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.shortfall().gpu, 3);
  EXPECT_EQ(r.shortfall().evict, (std::vector<OwnerBytes>{{FunctionId{5}, 64 * kMiB}}));
  EXPECT_NE(r.shortfall().describe().find("on GPU 3"), std::string::npos);
  AllocationResult nowhere = pools->allocate(4, 8 * kMiB, FunctionId{6});
  ASSERT_FALSE(nowhere.ok());
  EXPECT_TRUE(nowhere.shortfall().never_fits);
  EXPECT_TRUE(pools->allocate(2, 8 * kMiB, FunctionId{6}).ok()) << "GPU 2 still has room";
}

TEST(GpuPools, BlockAndNaivePoolsAllocateFromTheirUpstream) {
  CountingChunkSource gpu0(128 * kMiB), gpu1(128 * kMiB);
  for (PoolKind kind : {PoolKind::kBlock, PoolKind::kNaive}) {
    auto pools = GpuPools::create_upstream(kind, {&gpu0, &gpu1}, {128 * kMiB, 128 * kMiB});
    ASSERT_TRUE(pools.ok());
    EXPECT_EQ((*pools)->pool_name(), pool_kind_name(kind));
    AllocationResult a = (*pools)->allocate(1, 30 * kMiB, FunctionId{3});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(gpu1.live_bytes(), 30 * kMiB);
    EXPECT_EQ(gpu0.live_bytes(), 0u);
    ASSERT_TRUE((*pools)->deallocate(1, *a).ok());
    (*pools)->release_cached();
    EXPECT_EQ(gpu1.live_bytes(), 0u);
  }
  EXPECT_FALSE(GpuPools::create_upstream(PoolKind::kBuddy, {&gpu0}, {1}).ok());
  EXPECT_FALSE(GpuPools::create_upstream(PoolKind::kBlock, {&gpu0}, {}).ok());
}

TEST(GpuPools, ManySessionsAllocateAndFreeConcurrently) {
  auto pools = four_buddy_gpus(512 * kMiB);
  std::vector<std::thread> sessions;
  for (uint32_t f = 1; f <= 8; ++f) {
    sessions.emplace_back([&pools, f] {
      std::vector<std::pair<int, Allocation>> held;
      for (int i = 0; i < 300; ++i) {
        const int gpu = static_cast<int>((f + i) % 4);
        AllocationResult r = pools->allocate(gpu, (1 + (i * f) % 10) * kMiB, FunctionId{f});
        if (r.ok()) held.push_back({gpu, *r});
        if (held.size() > 6) {
          ASSERT_TRUE(pools->deallocate(held.front().first, held.front().second).ok());
          held.erase(held.begin());
        }
      }
      for (auto& [gpu, a] : held) ASSERT_TRUE(pools->deallocate(gpu, a).ok());
    });
  }
  for (std::thread& t : sessions) t.join();
  EXPECT_TRUE(pools->check_invariants().ok());
  for (int gpu = 0; gpu < 4; ++gpu) EXPECT_EQ(pools->stats(gpu).allocated_bytes, 0u);
}

}  // namespace
}  // namespace hiber::memory
