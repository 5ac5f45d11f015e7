// The buddy allocator's own behaviour: orders, split and coalesce, tail trimming,
// consolidation, sharing, and what a shortfall names.
#include "memory/buddy_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

namespace hiber::memory {
namespace {

using FreeBlocks = std::vector<std::pair<PoolLocation, uint64_t>>;

std::unique_ptr<BuddyAllocator> make(std::vector<uint64_t> chunks, BuddyOptions options = {}) {
  auto buddy = BuddyAllocator::create(chunks, options);
  EXPECT_TRUE(buddy.ok()) << buddy.status();
  return std::move(*buddy);
}

BuddyOptions no_sharing() {
  BuddyOptions options;
  options.shared_sizes = {};
  return options;
}

TEST(BuddyAllocator, RejectsBadOptionsAndChunks) {
  BuddyOptions odd;
  odd.min_block_bytes = 3 * kMiB;
  EXPECT_EQ(BuddyAllocator::create({64 * kMiB}, odd).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(BuddyAllocator::create({65 * kMiB}).status().code(), ErrorCode::kInvalidValue);
  BuddyOptions shared;
  shared.shared_sizes = {3 * kMiB};
  EXPECT_EQ(BuddyAllocator::create({64 * kMiB}, shared).status().code(), ErrorCode::kInvalidValue);
}

TEST(BuddyAllocator, ANonPowerOfTwoChunkIsCutIntoAlignedPieces) {
  auto buddy = make({(64 + 16 + 4) * kMiB});
  const FreeBlocks expected = {
      {{0, 0}, 64 * kMiB}, {{0, 64 * kMiB}, 16 * kMiB}, {{0, 80 * kMiB}, 4 * kMiB}};
  EXPECT_EQ(buddy->free_blocks(), expected);
  EXPECT_EQ(buddy->stats().largest_free_bytes, 64 * kMiB);
}

TEST(BuddyAllocator, SplitsDownToTheRequestAndCoalescesBackOnFree) {
  auto buddy = make({64 * kMiB}, no_sharing());
  AllocationResult a = buddy->allocate(2 * kMiB, FunctionId{1});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->where, (PoolLocation{0, 0}));
  EXPECT_EQ(a->bytes, 2 * kMiB);
  // 64 = 2 (taken) + 2 + 4 + 8 + 16 + 32, each free buddy pushed by one split.
  const FreeBlocks split = {{{0, 2 * kMiB}, 2 * kMiB},
                            {{0, 4 * kMiB}, 4 * kMiB},
                            {{0, 8 * kMiB}, 8 * kMiB},
                            {{0, 16 * kMiB}, 16 * kMiB},
                            {{0, 32 * kMiB}, 32 * kMiB}};
  EXPECT_EQ(buddy->free_blocks(), split);
  EXPECT_EQ(buddy->stats().splits, 5u);
  ASSERT_TRUE(buddy->deallocate(*a).ok());
  EXPECT_EQ(buddy->free_blocks(), (FreeBlocks{{{0, 0}, 64 * kMiB}}));
  EXPECT_EQ(buddy->stats().merges, 5u);
}

TEST(BuddyAllocator, TrimsTheTailSoA20MiBSegmentTakes20MiB) {
  auto buddy = make({64 * kMiB}, no_sharing());
  AllocationResult a = buddy->allocate(20 * kMiB, FunctionId{1});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bytes, 20 * kMiB);
  EXPECT_EQ(buddy->stats().internal_waste_bytes(), 0u);
  // [0, 20) taken; [20, 24), [24, 32) and [32, 64) free.
  const FreeBlocks free = {
      {{0, 20 * kMiB}, 4 * kMiB}, {{0, 24 * kMiB}, 8 * kMiB}, {{0, 32 * kMiB}, 32 * kMiB}};
  EXPECT_EQ(buddy->free_blocks(), free);
  AllocationResult odd = buddy->allocate(5 * kMiB + 1, FunctionId{1});
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->bytes, 6 * kMiB);
  EXPECT_EQ(buddy->stats().internal_waste_bytes(), kMiB - 1);
  ASSERT_TRUE(buddy->deallocate(*a).ok());
  ASSERT_TRUE(buddy->deallocate(*odd).ok());
  EXPECT_EQ(buddy->free_blocks(), (FreeBlocks{{{0, 0}, 64 * kMiB}}));
  EXPECT_TRUE(buddy->check_invariants().ok());
}

TEST(BuddyAllocator, WithoutTrimmingWasteIsTheRoundingToAPowerOfTwo) {
  BuddyOptions plain = no_sharing();
  plain.trim_tail = false;
  auto buddy = make({64 * kMiB}, plain);
  AllocationResult a = buddy->allocate(20 * kMiB, FunctionId{1});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bytes, 32 * kMiB);
  EXPECT_EQ(buddy->stats().internal_waste_bytes(), 12 * kMiB);
}

TEST(BuddyAllocator, FreeingEverythingInRandomOrderGivesBackWholeChunks) {
  auto buddy = make({1 * kGiB, 512 * kMiB, 96 * kMiB});
  const FreeBlocks initial = buddy->free_blocks();
  std::mt19937_64 rng(7);
  std::vector<Allocation> live;
  for (int i = 0; i < 400; ++i) {
    AllocationResult r =
        buddy->allocate((1 + rng() % 24) * kMiB, FunctionId{static_cast<uint32_t>(1 + rng() % 5)});
    if (r.ok()) live.push_back(*r);
  }
  ASSERT_GT(live.size(), 50u);
  std::shuffle(live.begin(), live.end(), rng);
  for (const Allocation& a : live) ASSERT_TRUE(buddy->deallocate(a).ok());
  buddy->release_cached();
  EXPECT_EQ(buddy->free_blocks(), initial);
  EXPECT_TRUE(buddy->check_invariants().ok());
}

TEST(BuddyAllocator, KeepsAFunctionsBlocksTogether) {
  // Two functions allocate interleaved in one 512 MiB chunk. With consolidation each one's
  // blocks fill a region of its own; without, they alternate.
  const auto largest_free_after_evicting_the_first = [](bool consolidate) {
    BuddyOptions options = no_sharing();
    options.consolidate = consolidate;
    auto buddy = make({512 * kMiB}, options);
    std::vector<Allocation> first, second;
    for (int i = 0; i < 24; ++i) {
      first.push_back(*buddy->allocate(8 * kMiB, FunctionId{1}));
      second.push_back(*buddy->allocate(8 * kMiB, FunctionId{2}));
    }
    for (const Allocation& a : first) EXPECT_TRUE(buddy->deallocate(a).ok());
    EXPECT_TRUE(buddy->check_invariants().ok());
    return buddy->stats().largest_free_bytes;
  };
  // Function 1 had [0, 256 MiB) to itself: all of it is free again.
  EXPECT_EQ(largest_free_after_evicting_the_first(true), 256 * kMiB);
  // Interleaved over [0, 384 MiB): only the untouched top 128 MiB is whole.
  EXPECT_EQ(largest_free_after_evicting_the_first(false), 128 * kMiB);
}

TEST(BuddyAllocator, AFunctionsNextBlockStartsRightAfterItsLatest) {
  // PyTorch's segments of one model, one after another: back to back from 0, with no skip to
  // the next aligned boundary (a 20 MiB block after a 20 MiB block starts at 20, not 32).
  auto buddy = make({512 * kMiB}, no_sharing());
  uint64_t expected = 0;
  for (uint64_t size : {20 * kMiB, 2 * kMiB, 6 * kMiB, 20 * kMiB, 20 * kMiB, 2 * kMiB, 64 * kMiB}) {
    AllocationResult r = buddy->allocate(size, FunctionId{1});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->where.offset, expected) << size / kMiB << " MiB";
    expected += size;
  }
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  EXPECT_EQ(buddy->stats().internal_waste_bytes(), 0u);
}

TEST(BuddyAllocator, WhenTheNextPagesAreTakenTheBlockGoesToAFreeBuddyOfItsRegion) {
  BuddyOptions options = no_sharing();
  options.home_region_bytes = 2 * kMiB;  // new functions take the best fit, next to others
  auto buddy = make({32 * kMiB}, options);
  ASSERT_EQ(buddy->allocate(2 * kMiB, FunctionId{1})->where.offset, 0u);
  ASSERT_EQ(buddy->allocate(2 * kMiB, FunctionId{2})->where.offset, 2 * kMiB)
      << "right after function 1";
  // Function 1's next block cannot follow its latest; it takes the nearest free buddy of that
  // block's ancestors: [4, 8).
  AllocationResult next = buddy->allocate(4 * kMiB, FunctionId{1});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->where.offset, 4 * kMiB);
  EXPECT_TRUE(buddy->check_invariants().ok());
}

TEST(BuddyAllocator, FreeingBlocksPlacedBackToBackCoalescesThemIntoAlignedBlocks) {
  auto buddy = make({128 * kMiB}, no_sharing());
  std::vector<Allocation> blocks;
  for (uint64_t size : {20 * kMiB, 20 * kMiB, 6 * kMiB, 20 * kMiB}) {
    blocks.push_back(*buddy->allocate(size, FunctionId{1}));
  }
  // The second block [20, 40) straddles the 32 MiB boundary.
  ASSERT_EQ(blocks[1].where.offset, 20 * kMiB);
  ASSERT_TRUE(buddy->deallocate(blocks[1]).ok());
  // [20, 40) comes back as aligned pieces [20, 24) [24, 32) [32, 40).
  const FreeBlocks after_one = buddy->free_blocks();
  EXPECT_NE(std::find(after_one.begin(), after_one.end(),
                      std::pair<PoolLocation, uint64_t>{{0, 24 * kMiB}, 8 * kMiB}),
            after_one.end());
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  for (size_t i : {0, 3, 2}) ASSERT_TRUE(buddy->deallocate(blocks[i]).ok());
  EXPECT_EQ(buddy->free_blocks(), (FreeBlocks{{{0, 0}, 128 * kMiB}}));
}

TEST(BuddyAllocator, ANewBlockGoesToTheFunctionsHomeChunk) {
  auto buddy = make({64 * kMiB, 64 * kMiB}, no_sharing());
  AllocationResult a = buddy->allocate(32 * kMiB, FunctionId{1});
  AllocationResult b = buddy->allocate(64 * kMiB, FunctionId{2});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->where.chunk, 0u);
  EXPECT_EQ(b->where.chunk, 1u);
  ASSERT_TRUE(buddy->deallocate(*b).ok());
  // Function 1's next block lands beside its first in chunk 0, not in the emptier chunk 1.
  AllocationResult c = buddy->allocate(16 * kMiB, FunctionId{1});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->where, (PoolLocation{0, 32 * kMiB}));
}

TEST(BuddyAllocator, SharesCommonSizesAcrossFunctionsWithoutSplitting) {
  auto buddy = make({512 * kMiB});  // the cache holds up to 1/16: 32 MiB
  AllocationResult a = buddy->allocate(20 * kMiB, FunctionId{1});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(buddy->deallocate(*a).ok());
  EXPECT_EQ(buddy->stats().cached_bytes, 20 * kMiB);
  const uint64_t splits = buddy->stats().splits;
  AllocationResult b = buddy->allocate(20 * kMiB - 12345, FunctionId{2});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->where, a->where) << "function 2 reuses function 1's freed 20 MiB block";
  EXPECT_EQ(buddy->stats().splits, splits);
  EXPECT_EQ(buddy->stats().cache_hits, 1u);
  EXPECT_EQ(buddy->stats().cached_bytes, 0u);
  EXPECT_TRUE(buddy->check_invariants().ok());
}

TEST(BuddyAllocator, TheSharingCacheIsBoundedAndFlushedBeforeAShortfall) {
  BuddyOptions options;
  options.shared_cache_bytes = 8 * kMiB;
  auto buddy = make({64 * kMiB}, options);
  std::vector<Allocation> blocks;
  for (int i = 0; i < 32; ++i)
    blocks.push_back(*buddy->allocate(2 * kMiB, FunctionId{static_cast<uint32_t>(1 + i % 3)}));
  for (const Allocation& a : blocks) ASSERT_TRUE(buddy->deallocate(a).ok());
  EXPECT_EQ(buddy->stats().cached_bytes, 8 * kMiB) << "four blocks cached, the rest coalesced";
  // 64 MiB fits only once the cache is flushed.
  AllocationResult whole = buddy->allocate(64 * kMiB, FunctionId{5});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(buddy->stats().cached_bytes, 0u);
  EXPECT_EQ(buddy->stats().failures, 0u);
}

TEST(BuddyAllocator, AShortfallNamesTheCheapestRegionsOwners) {
  auto buddy = make({64 * kMiB}, no_sharing());
  // Each new function starts in the largest free block (none reaches the 256 MiB home
  // region): f1 [0,16), f2 [32,48), f3 [48,64) (twice 8 MiB), f4 [16,32).
  EXPECT_EQ(buddy->allocate(16 * kMiB, FunctionId{1})->where.offset, 0u);
  EXPECT_EQ(buddy->allocate(16 * kMiB, FunctionId{2})->where.offset, 32 * kMiB);
  EXPECT_EQ(buddy->allocate(8 * kMiB, FunctionId{3})->where.offset, 48 * kMiB);
  EXPECT_EQ(buddy->allocate(8 * kMiB, FunctionId{3})->where.offset, 56 * kMiB);
  EXPECT_EQ(buddy->allocate(16 * kMiB, FunctionId{4})->where.offset, 16 * kMiB);
  AllocationResult r = buddy->allocate(16 * kMiB, FunctionId{9});
  ASSERT_FALSE(r.ok());
  // Four 16 MiB regions each cost 16 MiB; the first, f1's, wins the tie.
  EXPECT_EQ(r.shortfall().evict_bytes, 16 * kMiB);
  EXPECT_EQ(r.shortfall().evict, (std::vector<OwnerBytes>{{FunctionId{1}, 16 * kMiB}}));

  // Protect f1 and f4 (say, executing): the answer moves on to f2's region.
  r = buddy->allocate(16 * kMiB, FunctionId{9},
                      [](FunctionId f) { return f != FunctionId{1} && f != FunctionId{4}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.shortfall().evict, (std::vector<OwnerBytes>{{FunctionId{2}, 16 * kMiB}}));

  // 32 MiB with f3 protected: [0,32) costs f1 + f4; [32,64) holds f3.
  r = buddy->allocate(32 * kMiB, FunctionId{9}, [](FunctionId f) { return f != FunctionId{3}; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.shortfall().evict_bytes, 32 * kMiB);
  EXPECT_EQ(r.shortfall().evict,
            (std::vector<OwnerBytes>{{FunctionId{1}, 16 * kMiB}, {FunctionId{4}, 16 * kMiB}}));

  // Nobody evictable: an answer, with nothing to evict.
  r = buddy->allocate(16 * kMiB, FunctionId{9}, [](FunctionId) { return false; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.shortfall().evict_bytes, 0u);
  EXPECT_TRUE(r.shortfall().evict.empty());
  EXPECT_NE(r.shortfall().describe().find("nothing evictable"), std::string::npos);
  EXPECT_EQ(buddy->stats().failures, 4u);
}

// Eight 8 MiB blocks of eight functions filling a 64 MiB chunk, in address order.
std::vector<Allocation> eight_blocks(BuddyAllocator& buddy) {
  std::vector<Allocation> blocks;
  for (int i = 0; i < 8; ++i)
    blocks.push_back(*buddy.allocate(8 * kMiB, FunctionId{static_cast<uint32_t>(1 + i)}));
  std::sort(blocks.begin(), blocks.end(), [](const Allocation& a, const Allocation& b) {
    return a.where.offset < b.where.offset;
  });
  return blocks;
}

TEST(BuddyAllocator, CountsAFailureDespiteEnoughFreeBytesAsFragmentation) {
  auto buddy = make({64 * kMiB}, no_sharing());
  std::vector<Allocation> blocks = eight_blocks(*buddy);
  // Free every other block: 32 MiB free, in 8 MiB holes.
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(buddy->deallocate(blocks[i]).ok());
  EXPECT_EQ(buddy->largest_free_run_bytes(), 8 * kMiB);
  AllocationResult r = buddy->allocate(16 * kMiB, FunctionId{20});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.shortfall().free_bytes, 32 * kMiB);
  EXPECT_EQ(r.shortfall().largest_free_bytes, 8 * kMiB);
  EXPECT_EQ(r.shortfall().evict_bytes, 8 * kMiB) << "one neighbour must go";
  EXPECT_EQ(buddy->stats().fragmentation_failures, 1u);
  EXPECT_DOUBLE_EQ(buddy->stats().fragmentation(), 0.75);
}

// Fragmentation compares the largest free block with the largest there could be: the free
// bytes, but never more than a chunk (no block is larger). An empty pool of many chunks reads 0
// (it once read 1 - 1/chunks: "frag 97%" on every idle GPU), so does one whose free chunks are
// whole; a checkerboard reads high.
TEST(BuddyAllocator, FragmentationIsZeroForAnEmptyOrWholePoolAndHighForACheckerboard) {
  auto buddy = make(std::vector<uint64_t>(32, 64 * kMiB), no_sharing());
  EXPECT_EQ(buddy->stats().max_block_bytes, 64 * kMiB);
  EXPECT_DOUBLE_EQ(buddy->stats().fragmentation(), 0.0) << "empty";
  // Half full, in whole chunks: every free chunk is one piece.
  std::vector<Allocation> half;
  for (int i = 0; i < 16; ++i) {
    AllocationResult r = buddy->allocate(64 * kMiB, FunctionId{1});
    ASSERT_TRUE(r.ok());
    half.push_back(*r);
  }
  EXPECT_EQ(buddy->stats().free_bytes, 16 * 64 * kMiB);
  EXPECT_DOUBLE_EQ(buddy->stats().fragmentation(), 0.0) << "half full, whole chunks";
  for (const Allocation& a : half) ASSERT_TRUE(buddy->deallocate(a).ok());
  EXPECT_DOUBLE_EQ(buddy->stats().fragmentation(), 0.0) << "empty again";
  // A checkerboard of 2 MiB blocks (the smallest) over every chunk: 2 MiB holes, half the pool
  // free.
  std::vector<Allocation> blocks;
  for (int i = 0; i < 32 * 32; ++i) {
    AllocationResult r = buddy->allocate(2 * kMiB, FunctionId{2});
    ASSERT_TRUE(r.ok());
    blocks.push_back(*r);
  }
  for (size_t i = 0; i < blocks.size(); i += 2) ASSERT_TRUE(buddy->deallocate(blocks[i]).ok());
  const PoolStats board = buddy->stats();
  EXPECT_EQ(board.free_bytes, 32 * 32 * kMiB);
  EXPECT_EQ(board.largest_free_bytes, 2 * kMiB);
  // The largest there could be is one chunk (64 MiB) of the 1 GiB free: 1 - 2/64.
  EXPECT_DOUBLE_EQ(board.fragmentation(), 1.0 - 2.0 / 64);
}

TEST(BuddyAllocator, ARequestNoFreeBlockHoldsTakesARunOfAdjacentFreeBlocks) {
  auto buddy = make({64 * kMiB}, no_sharing());
  std::vector<Allocation> blocks = eight_blocks(*buddy);
  // [8, 16) and [16, 24) are free: adjacent, but not buddies, so no 16 MiB block exists.
  ASSERT_TRUE(buddy->deallocate(blocks[1]).ok());
  ASSERT_TRUE(buddy->deallocate(blocks[2]).ok());
  EXPECT_EQ(buddy->stats().largest_free_bytes, 8 * kMiB);
  EXPECT_EQ(buddy->largest_free_run_bytes(), 16 * kMiB);
  AllocationResult r = buddy->allocate(16 * kMiB, FunctionId{20});
  ASSERT_TRUE(r.ok()) << r.shortfall().describe();
  EXPECT_EQ(r->where.offset, 8 * kMiB);
  EXPECT_EQ(buddy->stats().fragmentation_failures, 0u);
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  // Freed, the run comes back as the two aligned blocks it was made of.
  ASSERT_TRUE(buddy->deallocate(*r).ok());
  EXPECT_EQ(buddy->free_blocks(),
            (FreeBlocks{{{0, 8 * kMiB}, 8 * kMiB}, {{0, 16 * kMiB}, 8 * kMiB}}));
}

TEST(BuddyAllocator, AddedChunksJoinThePool) {
  auto buddy = make({64 * kMiB});
  EXPECT_FALSE(buddy->allocate(128 * kMiB, FunctionId{1}).ok());
  auto added = buddy->add_chunk(64 * kMiB);
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(*added, 1u);
  EXPECT_EQ(buddy->stats().capacity_bytes, 128 * kMiB);
  EXPECT_TRUE(buddy->allocate(64 * kMiB, FunctionId{1}).ok());
  EXPECT_TRUE(buddy->allocate(64 * kMiB, FunctionId{2}).ok());
  EXPECT_TRUE(buddy->check_invariants().ok());
}

// Regression: the largest block was fixed by the chunks given at creation, so a larger chunk
// added later (or any chunk added to an empty pool) could only be handed out in pieces of the
// old largest size, and requests between the two never fit.
TEST(BuddyAllocator, AChunkLargerThanAnyBeforeRaisesTheLargestBlock) {
  auto buddy = make({64 * kMiB, 96 * kMiB}, no_sharing());
  ASSERT_TRUE(buddy->allocate(48 * kMiB, FunctionId{1}).ok());
  ASSERT_TRUE(buddy->add_chunk(512 * kMiB).ok());
  AllocationResult large = buddy->allocate(300 * kMiB, FunctionId{2});
  ASSERT_TRUE(large.ok()) << large.shortfall().describe();
  EXPECT_EQ(large->where.chunk, 2u);
  EXPECT_EQ(buddy->stats().largest_free_bytes, 128 * kMiB);
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  ASSERT_TRUE(buddy->deallocate(*large).ok());
  EXPECT_EQ(buddy->stats().largest_free_bytes, 512 * kMiB);

  auto empty = make({}, no_sharing());
  EXPECT_FALSE(empty->allocate(2 * kMiB, FunctionId{1}).ok());
  ASSERT_TRUE(empty->add_chunk(64 * kMiB).ok());
  EXPECT_TRUE(empty->allocate(64 * kMiB, FunctionId{1}).ok());
  EXPECT_TRUE(empty->check_invariants().ok()) << empty->check_invariants();
}

TEST(BuddyAllocator, ManyChunksUseTheirNonEmptyBitmaps) {
  // More than 64 chunks spans several bitmap words.
  std::vector<uint64_t> chunks(130, 4 * kMiB);
  auto buddy = make(chunks, no_sharing());
  std::set<uint32_t> used;
  for (int i = 0; i < 130; ++i) {
    AllocationResult r = buddy->allocate(4 * kMiB, FunctionId{static_cast<uint32_t>(1000 + i)});
    ASSERT_TRUE(r.ok()) << i;
    used.insert(r->where.chunk);
  }
  EXPECT_EQ(used.size(), 130u);
  EXPECT_FALSE(buddy->allocate(2 * kMiB, FunctionId{1}).ok());
  EXPECT_TRUE(buddy->check_invariants().ok());
}

// ---- The slow paths against brute-force references ----
//
// The allocator keeps each chunk's free runs and region costs between requests (until the
// chunk changes); these tests replay long random sequences and check every answer of those
// paths against a reference computed from scratch from the test's own records.

struct Live {
  Allocation allocation;
  FunctionId owner;
};

uint64_t pages_of(uint64_t bytes) { return (bytes + 2 * kMiB - 1) / (2 * kMiB); }
int order_of(uint64_t pages) {
  int order = 0;
  while ((uint64_t{1} << order) < pages) ++order;
  return order;
}

// Without consolidation or sharing, a request no free block holds takes the shortest run of
// adjacent free blocks that holds it, the lowest among equals (from free_blocks()).
TEST(BuddyAllocator, ARunRequestTakesTheShortestRunAsAFullWalkFindsIt) {
  BuddyOptions options = no_sharing();
  options.consolidate = false;
  const std::vector<uint64_t> chunks = {64 * kMiB, 40 * kMiB, 64 * kMiB, 128 * kMiB};
  auto buddy = make(chunks, options);
  std::mt19937_64 rng(11);
  std::vector<Allocation> live;
  const uint64_t sizes[] = {2, 4, 6, 10, 12, 20, 24, 30};
  int run_requests = 0;
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(buddy->deallocate(live[i]).ok());
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    const uint64_t bytes = sizes[rng() % std::size(sizes)] * kMiB;
    const uint64_t pages = pages_of(bytes);
    // The reference: runs of adjacent free blocks, per chunk, in address order.
    const FreeBlocks free = buddy->free_blocks();
    uint64_t largest_block = 0;
    for (const auto& [where, size] : free) largest_block = std::max(largest_block, size);
    const bool run_path = largest_block < (uint64_t{1} << order_of(pages)) * 2 * kMiB;
    std::optional<PoolLocation> expected;
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < free.size();) {
      const PoolLocation start = free[i].first;
      uint64_t end = start.offset + free[i].second;
      size_t j = i + 1;
      while (j < free.size() && free[j].first.chunk == start.chunk && free[j].first.offset == end)
        end += free[j++].second;
      const uint64_t length = end - start.offset;
      if (length >= pages * 2 * kMiB && length < best) {
        best = length;
        expected = start;
      }
      i = j;
    }
    AllocationResult r = buddy->allocate(bytes, FunctionId{static_cast<uint32_t>(1 + rng() % 9)});
    if (run_path) {
      ++run_requests;
      ASSERT_EQ(r.ok(), expected.has_value()) << "step " << step;
      if (r.ok()) {
        EXPECT_EQ(r->where, *expected) << "step " << step;
      }
    }
    if (r.ok()) live.push_back(*r);
  }
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  EXPECT_GT(run_requests, 500) << "the sequence must exercise the slow path";
}

// With the default options (consolidation, sharing): every shortfall names the cheapest
// aligned region of the request's order that holds none of the requester's allocations, the
// first among equals, with its owners' bytes, all recomputed from the live allocations.
TEST(BuddyAllocator, AShortfallNamesTheRegionAFullWalkFinds) {
  const std::vector<uint64_t> chunks = {64 * kMiB, 40 * kMiB, 64 * kMiB, 128 * kMiB};
  auto buddy = make(chunks);
  std::mt19937_64 rng(5);
  std::vector<Live> live;
  const uint64_t sizes[] = {2, 2, 4, 10, 20, 20, 24, 34, 64};
  int shortfalls = 0;
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(buddy->deallocate(live[i].allocation).ok());
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    const uint64_t bytes = sizes[rng() % std::size(sizes)] * kMiB;
    const FunctionId owner{static_cast<uint32_t>(1 + rng() % 12)};
    AllocationResult r = buddy->allocate(bytes, owner);
    if (r.ok()) {
      live.push_back({*r, owner});
      continue;
    }
    ++shortfalls;
    const uint64_t region = (uint64_t{1} << order_of(pages_of(bytes))) * 2 * kMiB;
    uint64_t best_cost = UINT64_MAX;
    std::vector<OwnerBytes> best_owners;
    for (uint32_t chunk = 0; chunk < chunks.size(); ++chunk) {
      for (uint64_t start = 0; start + region <= chunks[chunk]; start += region) {
        uint64_t cost = 0;
        bool blocked = false;
        std::map<FunctionId, uint64_t> owners;
        for (const Live& l : live) {
          const Allocation& a = l.allocation;
          if (a.where.chunk != chunk || a.where.offset >= start + region ||
              a.where.offset + a.bytes <= start)
            continue;
          cost += a.bytes;
          blocked |= l.owner == owner;
          owners[l.owner] += a.bytes;
        }
        if (blocked || cost >= best_cost) continue;
        best_cost = cost;
        best_owners.clear();
        for (const auto& [f, b] : owners) best_owners.push_back({f, b});
        std::stable_sort(
            best_owners.begin(), best_owners.end(),
            [](const OwnerBytes& a, const OwnerBytes& b) { return a.bytes > b.bytes; });
      }
    }
    if (best_cost == UINT64_MAX) {
      EXPECT_EQ(r.shortfall().evict_bytes, 0u) << "step " << step;
      EXPECT_TRUE(r.shortfall().evict.empty()) << "step " << step;
    } else {
      EXPECT_EQ(r.shortfall().evict_bytes, best_cost) << "step " << step;
      EXPECT_EQ(r.shortfall().evict, best_owners) << "step " << step;
    }
  }
  EXPECT_TRUE(buddy->check_invariants().ok()) << buddy->check_invariants();
  EXPECT_GT(shortfalls, 1000) << "the sequence must exercise the shortfall";
}

}  // namespace
}  // namespace hiber::memory
