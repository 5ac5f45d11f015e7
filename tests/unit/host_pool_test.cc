// The pinned host pool: model copies and staging buffers carved from registered chunks, with
// accounting per function and per GPU and a fragmentation metric.
#include "memory/host_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace hiber::memory {
namespace {

std::unique_ptr<HostPool> make(std::vector<uint64_t> chunks, int gpus = 4) {
  auto pool = HostPool::create(chunks, gpus);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(*pool);
}

TEST(HostPool, AccountsModelCopiesPerFunctionAndStagingPerGpu) {
  auto pool = make({1 * kGiB});
  AllocationResult m1 = pool->allocate_model_copy(FunctionId{1}, 100 * kMiB + 1);
  AllocationResult m2 = pool->allocate_model_copy(FunctionId{2}, 30 * kMiB);
  AllocationResult s0 = pool->allocate_staging(0, 8 * kMiB);
  AllocationResult s3 = pool->allocate_staging(3, 8 * kMiB);
  ASSERT_TRUE(m1.ok() && m2.ok() && s0.ok() && s3.ok());
  EXPECT_EQ(m1->bytes, 100 * kMiB + HostPool::kMinBlockBytes) << "rounded to 64 KiB, not 128 MiB";
  EXPECT_EQ(pool->model_bytes(FunctionId{1}), m1->bytes);
  EXPECT_EQ(pool->model_bytes(FunctionId{2}), 30 * kMiB);
  EXPECT_EQ(pool->staging_bytes(0), 8 * kMiB);
  EXPECT_EQ(pool->staging_bytes(1), 0u);
  const HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.model_bytes, m1->bytes + 30 * kMiB);
  EXPECT_EQ(stats.staging_bytes, 16 * kMiB);
  EXPECT_EQ(stats.allocations, 4u);
  EXPECT_TRUE(pool->check_invariants().ok());
  ASSERT_TRUE(pool->release(*s0).ok());
  EXPECT_EQ(pool->staging_bytes(0), 0u);
  EXPECT_EQ(pool->release(*s0).code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(pool->allocate_staging(4, kMiB).ok()) << "no GPU 4";
}

TEST(HostPool, DroppingAFunctionReleasesAllItsCopies) {
  auto pool = make({512 * kMiB});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool->allocate_model_copy(FunctionId{5}, 7 * kMiB).ok());
  ASSERT_TRUE(pool->allocate_model_copy(FunctionId{6}, 7 * kMiB).ok());
  EXPECT_EQ(pool->release_function(FunctionId{5}), 70 * kMiB);
  EXPECT_EQ(pool->model_bytes(FunctionId{5}), 0u);
  EXPECT_EQ(pool->model_bytes(FunctionId{6}), 7 * kMiB);
  EXPECT_TRUE(pool->check_invariants().ok());
}

TEST(HostPool, ReportsFragmentationAsLargestFreeOverFree) {
  auto pool = make({64 * kMiB});
  EXPECT_DOUBLE_EQ(pool->stats().largest_free_ratio(), 1.0);
  std::vector<Allocation> blocks;
  for (int i = 0; i < 8; ++i)
    blocks.push_back(
        *pool->allocate_model_copy(FunctionId{static_cast<uint32_t>(1 + i)}, 8 * kMiB));
  EXPECT_DOUBLE_EQ(pool->stats().largest_free_ratio(), 1.0) << "nothing free counts as whole";
  // Free functions 1, 3, 5, 7: 32 MiB free, but how much of it in one piece?
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(pool->release(blocks[i]).ok());
  const HostPoolStats stats = pool->stats();
  EXPECT_EQ(stats.free_bytes, 32 * kMiB);
  EXPECT_DOUBLE_EQ(stats.largest_free_ratio(),
                   static_cast<double>(stats.largest_free_bytes) / (32 * kMiB));
  EXPECT_LT(stats.largest_free_ratio(), 1.0);
}

TEST(HostPool, GrowsByWholeChunksAndAnswersWhenFull) {
  auto pool = make({64 * kMiB});
  ASSERT_TRUE(pool->allocate_model_copy(FunctionId{1}, 64 * kMiB).ok());
  AllocationResult full = pool->allocate_model_copy(FunctionId{2}, kMiB);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.shortfall().free_bytes, 0u);
  EXPECT_EQ(pool->stats().failures, 1u);
  ASSERT_TRUE(pool->add_chunk(256 * kMiB).ok());
  EXPECT_TRUE(pool->allocate_model_copy(FunctionId{2}, kMiB).ok());
  EXPECT_EQ(pool->stats().chunks, 2u);
  EXPECT_EQ(pool->stats().peak_used_bytes, 64 * kMiB + kMiB);
}

TEST(HostPool, RandomUseKeepsTheAccountsExact) {
  auto pool = make({256 * kMiB, 256 * kMiB});
  std::mt19937_64 rng(11);
  std::vector<Allocation> live;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const uint64_t bytes = 1 + rng() % (12 * kMiB);
      AllocationResult r =
          rng() % 3 == 0
              ? pool->allocate_staging(rng() % 4, bytes)
              : pool->allocate_model_copy(FunctionId{static_cast<uint32_t>(1 + rng() % 9)}, bytes);
      if (r.ok()) live.push_back(*r);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(pool->release(live[i]).ok());
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 50 == 0) {
      ASSERT_TRUE(pool->check_invariants().ok()) << pool->check_invariants();
    }
  }
  for (const Allocation& a : live) ASSERT_TRUE(pool->release(a).ok());
  EXPECT_EQ(pool->stats().free_bytes, 512 * kMiB);
  EXPECT_DOUBLE_EQ(pool->stats().largest_free_ratio(), 0.5) << "two whole chunks";
}

}  // namespace
}  // namespace hiber::memory
