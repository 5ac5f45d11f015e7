// The contract every pool allocator keeps (buddy, block, naive), checked by long random
// sequences of allocate and free against a simple reference model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "memory/block_allocator.h"
#include "memory/buddy_allocator.h"
#include "memory/naive_allocator.h"

namespace hiber::memory {
namespace {

constexpr uint64_t kPool = 1 * kGiB;

struct Subject {
  std::unique_ptr<CountingChunkSource> upstream;
  std::unique_ptr<PoolAllocator> pool;
};

Subject make(const std::string& kind) {
  Subject s;
  if (kind == "buddy") {
    s.pool = BuddyAllocator::create({512 * kMiB, 256 * kMiB, 256 * kMiB}).value();
  } else if (kind == "buddy-plain") {
    BuddyOptions plain;
    plain.trim_tail = false;
    plain.consolidate = false;
    plain.shared_sizes = {};
    s.pool = BuddyAllocator::create({512 * kMiB, 256 * kMiB, 256 * kMiB}, plain).value();
  } else {
    s.upstream = std::make_unique<CountingChunkSource>(kPool);
    if (kind == "block") {
      s.pool = std::make_unique<BlockAllocator>(*s.upstream, kPool);
    } else {
      s.pool = std::make_unique<NaiveAllocator>(*s.upstream, kPool);
    }
  }
  return s;
}

// The reference: live allocations with what they asked for. Overlap is checked per chunk by
// an ordered map of [offset, offset + bytes).
struct Live {
  Allocation allocation;
  uint64_t requested;
  FunctionId owner;
};

void expect_no_overlap(const std::vector<Live>& live) {
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> ranges;
  for (const Live& l : live) {
    ASSERT_GE(l.allocation.bytes, l.requested);
    auto [it, inserted] = ranges.emplace(
        std::pair{l.allocation.where.chunk, l.allocation.where.offset}, l.allocation.bytes);
    ASSERT_TRUE(inserted) << "two allocations at chunk " << l.allocation.where.chunk << " offset "
                          << l.allocation.where.offset;
  }
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    auto next = std::next(it);
    if (next == ranges.end() || next->first.first != it->first.first) continue;
    ASSERT_LE(it->first.second + it->second, next->first.second)
        << "chunk " << it->first.first << ": [" << it->first.second << ", +" << it->second
        << ") overlaps the allocation at " << next->first.second;
  }
}

class PoolContract : public testing::TestWithParam<std::string> {};

TEST_P(PoolContract, RandomAllocateAndFreeKeepEveryByteAccountedFor) {
  Subject s = make(GetParam());
  std::mt19937_64 rng(20261122);
  // PyTorch-like sizes: 2 MiB and 20 MiB segments, 2 MiB-rounded large ones, and odd sizes.
  const auto random_size = [&]() -> uint64_t {
    switch (rng() % 5) {
      case 0: return 2 * kMiB;
      case 1: return 20 * kMiB;
      case 2: return (1 + rng() % 48) * 2 * kMiB;
      case 3: return 1 + rng() % (3 * kMiB);
      default: return 1 + rng() % (96 * kMiB);
    }
  };
  std::vector<Live> live;
  uint64_t failures = 0;
  for (int step = 0; step < 6000; ++step) {
    const bool allocate = live.empty() || rng() % 100 < 55;
    if (allocate) {
      const uint64_t bytes = random_size();
      const FunctionId owner{static_cast<uint32_t>(1 + rng() % 7)};
      const PoolStats before = s.pool->stats();
      AllocationResult result = s.pool->allocate(bytes, owner);
      if (result.ok()) {
        live.push_back({*result, bytes, owner});
      } else {
        ++failures;
        const Shortfall& shortfall = result.shortfall();
        EXPECT_EQ(shortfall.requested_bytes, bytes);
        EXPECT_GE(shortfall.needed_bytes, bytes);
        EXPECT_FALSE(shortfall.over_quota);
        // A request never fails while one free block (cache included) could hold it whole.
        EXPECT_LT(before.largest_free_bytes, shortfall.needed_bytes)
            << GetParam() << " step " << step;
        // Others' allocations can always be evicted to make room, so "nothing evictable makes
        // room" means the requester's own blocks (not evictable for its own request) lie in
        // every region that could hold it.
        if (!shortfall.never_fits && shortfall.evict_bytes == 0) {
          EXPECT_TRUE(std::any_of(live.begin(), live.end(), [&](const Live& l) {
            return l.owner == owner;
          })) << shortfall.describe();
        }
      }
    } else {
      const size_t index = rng() % live.size();
      const Allocation freed = live[index].allocation;
      ASSERT_TRUE(s.pool->deallocate(freed).ok());
      live[index] = live.back();
      live.pop_back();
      // Freed (or cached for sharing): nobody's any more, unless the same place was handed out
      // again, which it cannot have been yet.
      EXPECT_EQ(s.pool->owner(freed), std::nullopt) << GetParam() << " step " << step;
    }
    if (step % 97 == 0 || step > 5900) {
      // Every live allocation's owner, as the reference recorded it; a wrong size is no one's.
      for (const Live& l : live) {
        ASSERT_EQ(s.pool->owner(l.allocation), l.owner) << GetParam() << " step " << step;
        Allocation resized = l.allocation;
        resized.bytes += 2 * kMiB;
        ASSERT_EQ(s.pool->owner(resized), std::nullopt) << GetParam() << " step " << step;
      }
      ASSERT_TRUE(s.pool->check_invariants().ok()) << s.pool->check_invariants();
      expect_no_overlap(live);
      const PoolStats stats = s.pool->stats();
      uint64_t allocated = 0, requested = 0;
      for (const Live& l : live) {
        allocated += l.allocation.bytes;
        requested += l.requested;
      }
      ASSERT_EQ(stats.allocated_bytes, allocated);
      ASSERT_EQ(stats.requested_bytes, requested);
      ASSERT_EQ(stats.internal_waste_bytes(), allocated - requested);
      ASSERT_EQ(stats.live_allocations, live.size());
      ASSERT_EQ(stats.allocated_bytes + stats.cached_bytes + stats.free_bytes,
                stats.capacity_bytes);
    }
  }
  EXPECT_GT(failures, 0u) << "the sequence should have filled the pool at least once";
  for (const Live& l : live) ASSERT_TRUE(s.pool->deallocate(l.allocation).ok());
  s.pool->release_cached();
  const PoolStats empty = s.pool->stats();
  EXPECT_EQ(empty.allocated_bytes, 0u);
  EXPECT_EQ(empty.cached_bytes, 0u);
  EXPECT_EQ(empty.free_bytes, empty.capacity_bytes);
  EXPECT_TRUE(s.pool->check_invariants().ok());
  if (s.upstream) {
    EXPECT_EQ(s.upstream->live_bytes(), 0u);
  }
}

TEST_P(PoolContract, AFreeOfSomethingNotLiveIsRefusedAndChangesNothing) {
  Subject s = make(GetParam());
  AllocationResult a = s.pool->allocate(6 * kMiB, FunctionId{1});
  ASSERT_TRUE(a.ok());
  const PoolStats before = s.pool->stats();
  Allocation wrong_size = *a;
  wrong_size.bytes += 2 * kMiB;
  EXPECT_EQ(s.pool->deallocate(wrong_size).code(), ErrorCode::kInvalidValue);
  Allocation elsewhere = *a;
  elsewhere.where.chunk += 100;
  EXPECT_EQ(s.pool->deallocate(elsewhere).code(), ErrorCode::kInvalidValue);
  Allocation unaligned = *a;
  unaligned.where.offset += 4096;
  EXPECT_EQ(s.pool->deallocate(unaligned).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(s.pool->stats().allocated_bytes, before.allocated_bytes);
  ASSERT_TRUE(s.pool->deallocate(*a).ok());
  EXPECT_EQ(s.pool->deallocate(*a).code(), ErrorCode::kInvalidValue) << "double free";
  EXPECT_TRUE(s.pool->check_invariants().ok());
}

TEST_P(PoolContract, ZeroAndHugeRequestsAreAnsweredNotFatal) {
  Subject s = make(GetParam());
  AllocationResult zero = s.pool->allocate(0, FunctionId{1});
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(zero.shortfall().never_fits);
  AllocationResult huge = s.pool->allocate(uint64_t{1} << 50, FunctionId{1});
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(huge.shortfall().never_fits);
  EXPECT_NE(huge.shortfall().describe().find("larger than any block"), std::string::npos);
}

TEST_P(PoolContract, AFullPoolSaysHowMuchMustBeEvicted) {
  Subject s = make(GetParam());
  std::vector<Allocation> held;
  for (;;) {
    AllocationResult r =
        s.pool->allocate(64 * kMiB, FunctionId{static_cast<uint32_t>(1 + held.size() % 3)});
    if (!r.ok()) break;
    held.push_back(*r);
  }
  ASSERT_EQ(held.size(), kPool / (64 * kMiB));
  AllocationResult more = s.pool->allocate(64 * kMiB, FunctionId{9});
  ASSERT_FALSE(more.ok());
  const Shortfall& shortfall = more.shortfall();
  EXPECT_EQ(shortfall.free_bytes, 0u);
  EXPECT_EQ(shortfall.evict_bytes, 64 * kMiB) << shortfall.describe();
  // Evicting what it says makes the request fit.
  ASSERT_TRUE(s.pool->deallocate(held.back()).ok());
  EXPECT_TRUE(s.pool->allocate(64 * kMiB, FunctionId{9}).ok());
}

// Skipping the eviction advice (hiber-sim does) changes no placement and nothing else a
// shortfall says: the same random sequence runs on two pools in lockstep, one asking for the
// advice and one skipping it, and they must agree on every answer and every counter.
TEST_P(PoolContract, SkippingTheEvictionAdviceChangesOnlyTheAdvice) {
  Subject advised = make(GetParam());
  Subject skipped = make(GetParam());
  std::mt19937_64 rng(11);
  std::vector<Allocation> live;
  const uint64_t sizes[] = {2, 2, 3, 20, 20, 24, 40, 64, 100, 130};
  int shortfalls = 0;
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(advised.pool->deallocate(live[i]).ok()) << "step " << step;
      ASSERT_TRUE(skipped.pool->deallocate(live[i]).ok()) << "step " << step;
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    const uint64_t bytes = sizes[rng() % std::size(sizes)] * kMiB;
    const FunctionId owner{static_cast<uint32_t>(1 + rng() % 12)};
    const AllocationResult a = advised.pool->allocate(bytes, owner);
    const AllocationResult b = skipped.pool->allocate(bytes, owner, {}, EvictionAdvice::kSkipped);
    ASSERT_EQ(a.ok(), b.ok()) << "step " << step;
    if (a.ok()) {
      ASSERT_EQ(*a, *b) << "step " << step;
      live.push_back(*a);
      continue;
    }
    ++shortfalls;
    const Shortfall& x = a.shortfall();
    const Shortfall& y = b.shortfall();
    EXPECT_TRUE(x.advised);
    EXPECT_FALSE(y.advised);
    EXPECT_EQ(y.evict_bytes, 0u) << "step " << step;
    EXPECT_TRUE(y.evict.empty()) << "step " << step;
    EXPECT_EQ(std::tie(x.requested_bytes, x.needed_bytes, x.free_bytes, x.largest_free_bytes,
                       x.over_quota, x.never_fits),
              std::tie(y.requested_bytes, y.needed_bytes, y.free_bytes, y.largest_free_bytes,
                       y.over_quota, y.never_fits))
        << "step " << step << ": " << x.describe() << " / " << y.describe();
    EXPECT_EQ(y.describe().find("evict"), std::string::npos) << y.describe();
  }
  const PoolStats x = advised.pool->stats();
  const PoolStats y = skipped.pool->stats();
  EXPECT_EQ(std::tie(x.allocated_bytes, x.cached_bytes, x.free_bytes, x.allocations, x.failures,
                     x.fragmentation_failures, x.splits, x.merges, x.cache_hits),
            std::tie(y.allocated_bytes, y.cached_bytes, y.free_bytes, y.allocations, y.failures,
                     y.fragmentation_failures, y.splits, y.merges, y.cache_hits));
  EXPECT_TRUE(skipped.pool->check_invariants().ok()) << skipped.pool->check_invariants();
  EXPECT_GT(shortfalls, 500) << "the sequence must exercise the shortfall";
}

INSTANTIATE_TEST_SUITE_P(AllPools, PoolContract,
                         testing::Values("buddy", "buddy-plain", "block", "naive"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace hiber::memory
