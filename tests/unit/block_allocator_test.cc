// The Torpor-Block baseline's own behaviour: its cache of freed device allocations, and what it
// does when the device refuses.
#include "memory/block_allocator.h"

#include <gtest/gtest.h>

namespace hiber::memory {
namespace {

TEST(BlockAllocator, ReturnsTheSmallestCachedBlockThatIsBigEnough) {
  CountingChunkSource device(1 * kGiB);
  BlockAllocator block(device, 1 * kGiB);
  Allocation small = *block.allocate(8 * kMiB, FunctionId{1});
  Allocation large = *block.allocate(64 * kMiB, FunctionId{1});
  ASSERT_TRUE(block.deallocate(large).ok());
  ASSERT_TRUE(block.deallocate(small).ok());
  AllocationResult reused = block.allocate(6 * kMiB, FunctionId{2});
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(*reused, small);
  EXPECT_EQ(block.stats().internal_waste_bytes(), 2 * kMiB);
  // Nothing cached fits 100 MiB: the device makes a new one, and the cache stays.
  ASSERT_TRUE(block.allocate(100 * kMiB, FunctionId{2}).ok());
  EXPECT_EQ(block.stats().cached_bytes, 64 * kMiB);
  EXPECT_EQ(block.stats().upstream_allocations, 3u);
  EXPECT_EQ(block.stats().cache_hits, 1u);
}

TEST(BlockAllocator, FreesTheOldestCachedBlocksWhenTheBudgetIsShort) {
  CountingChunkSource device(1 * kGiB);
  BlockAllocator block(device, 128 * kMiB);
  Allocation a = *block.allocate(32 * kMiB, FunctionId{1});
  Allocation b = *block.allocate(32 * kMiB, FunctionId{1});
  Allocation c = *block.allocate(32 * kMiB, FunctionId{1});
  for (const Allocation& x : {a, b, c}) ASSERT_TRUE(block.deallocate(x).ok());
  // 96 MiB cached, 32 free: 64 MiB needs one cached block released, the oldest (a).
  ASSERT_TRUE(block.allocate(64 * kMiB, FunctionId{2}).ok());
  EXPECT_EQ(block.stats().upstream_releases, 1u);
  EXPECT_EQ(block.stats().cached_bytes, 64 * kMiB);
  EXPECT_TRUE(block.check_invariants().ok());
}

// Regression: when the budget had room but the device refused (another process holds memory,
// or the device is fragmented), the allocator gave up although cached blocks, which hold
// device memory, could still be released.
TEST(BlockAllocator, ReleasesCachedBlocksUntilTheDevicePlacesTheRequest) {
  CountingChunkSource device(64 * kMiB);  // the device has less than the budget says
  BlockAllocator block(device, 128 * kMiB);
  Allocation a = *block.allocate(32 * kMiB, FunctionId{1});
  Allocation b = *block.allocate(32 * kMiB, FunctionId{1});
  ASSERT_TRUE(block.deallocate(a).ok());
  ASSERT_TRUE(block.deallocate(b).ok());
  AllocationResult r = block.allocate(48 * kMiB, FunctionId{2});
  ASSERT_TRUE(r.ok()) << r.shortfall().describe();
  EXPECT_EQ(block.stats().upstream_releases, 2u);
  EXPECT_EQ(block.stats().fragmentation_failures, 0u);
  // Nothing left to release: the device's refusal is an answer.
  AllocationResult full = block.allocate(32 * kMiB, FunctionId{3});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.shortfall().evict_bytes, 32 * kMiB);
  EXPECT_EQ(block.stats().fragmentation_failures, 1u);
  EXPECT_TRUE(block.check_invariants().ok());
}

TEST(BlockAllocator, ARequestThatRoundsPastTheBudgetNeverFits) {
  CountingChunkSource device(1 * kGiB);
  BlockAllocator block(device, 33 * kMiB);  // not a multiple of the 2 MiB granularity
  AllocationResult r = block.allocate(33 * kMiB, FunctionId{1});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.shortfall().never_fits);
  EXPECT_TRUE(block.allocate(32 * kMiB, FunctionId{1}).ok());
}

}  // namespace
}  // namespace hiber::memory
