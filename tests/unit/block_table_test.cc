// A function's block table: adding and removing blocks, resolving every kind of pointer,
// model/scratch marks, the dirty bit, residency per GPU, and a long random run against a
// reference that resolves pointers the obvious way.
#include "memory/block_table.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <random>
#include <vector>

namespace hiber::memory {
namespace {

constexpr uint64_t kGranule = 2 * kMiB;
constexpr uint64_t kBase = 0x7f0000000000;  // where the simulated device's ranges lie
constexpr uint64_t kRange = 1 * kGiB;

BlockTable make(int gpus = 2) {
  Result<BlockTable> table = BlockTable::create(kBase, kRange, kGranule, gpus);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

uint64_t at(uint64_t granules) { return kBase + granules * kGranule; }

TEST(BlockTable, RefusesABadGranularityRangeOrGpuCount) {
  EXPECT_EQ(BlockTable::create(kBase, kRange, 3 * kMiB, 1).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(BlockTable::create(kBase, kRange, 0, 1).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(BlockTable::create(kBase + kMiB, kRange, kGranule, 1).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(BlockTable::create(kBase, kRange + kMiB, kGranule, 1).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(BlockTable::create(kBase, 0, kGranule, 1).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(BlockTable::create(kBase, kRange, kGranule, 0).status().code(),
            ErrorCode::kInvalidValue);
  // A range whose end does not fit in 64 bits.
  EXPECT_EQ(BlockTable::create(uint64_t{0} - kRange, kRange, kGranule, 1).status().code(),
            ErrorCode::kInvalidValue);
  // The page map's bit budget: 2^27 granules at most.
  EXPECT_TRUE(BlockTable::create(0, BlockTable::kMaxPages * kGranule, kGranule, 1).ok());
  EXPECT_EQ(
      BlockTable::create(0, (BlockTable::kMaxPages + 1) * kGranule, kGranule, 1).status().code(),
      ErrorCode::kInvalidValue);
}

TEST(BlockTable, RefusesBlocksThatOverlapAreMisalignedOrLieOutsideTheRange) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(10), 10 * kGranule, BlockKind::kModel).ok());
  const struct {
    uint64_t va;
    uint64_t bytes;
  } bad[] = {
      {at(10), kGranule},                      // same start
      {at(19), kGranule},                      // inside
      {at(5), 6 * kGranule},                   // runs into it
      {at(8), 20 * kGranule},                  // covers it
      {at(30) + 4096, kGranule},               // misaligned start
      {at(30), kGranule + 4096},               // misaligned size
      {at(30), 0},                             // empty
      {kBase - kGranule, kGranule},            // before the range
      {at(511), 2 * kGranule},                 // past its end
      {kBase + kRange, kGranule},              // at its end
      {uint64_t{0} - kGranule, 2 * kGranule},  // wraps around
  };
  for (const auto& block : bad) {
    EXPECT_EQ(table.add(block.va, block.bytes, BlockKind::kModel).code(), ErrorCode::kInvalidValue)
        << std::hex << block.va << " +" << block.bytes;
  }
  EXPECT_EQ(table.size(), 1u);
  // Touching on either side is fine, and so are the range's first and last granules.
  EXPECT_TRUE(table.add(at(9), kGranule, BlockKind::kModel).ok());
  EXPECT_TRUE(table.add(at(20), kGranule, BlockKind::kModel).ok());
  EXPECT_TRUE(table.add(at(0), kGranule, BlockKind::kModel).ok());
  EXPECT_TRUE(table.add(at(511), kGranule, BlockKind::kModel).ok());
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, ResolvesInteriorPointersAndViewsToTheirBlockAndOffset) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(4), 10 * kGranule, BlockKind::kModel).ok());
  const VirtualBlock* block = table.block_at(at(4));
  ASSERT_NE(block, nullptr);
  // A tensor at offset 12345 of its segment, and a view 1000 floats into it.
  const uint64_t tensor = at(4) + 12345;
  const uint64_t view = tensor + 1000 * sizeof(float);
  for (uint64_t ptr : {at(4), tensor, view, at(5), at(14) - 1}) {
    const PointerTarget target = table.resolve(ptr);
    ASSERT_TRUE(target.found()) << std::hex << ptr;
    EXPECT_EQ(target.block, block);
    EXPECT_EQ(target.offset, ptr - at(4));
  }
}

TEST(BlockTable, APointerExactlyAtABlocksEndResolvesToThatBlock) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(4), 3 * kGranule, BlockKind::kModel).ok());
  const PointerTarget end = table.resolve(at(7));
  ASSERT_TRUE(end.found());
  EXPECT_EQ(end.block->va, at(4));
  EXPECT_EQ(end.offset, 3 * kGranule);
  // One byte further is in no block.
  EXPECT_FALSE(table.resolve(at(7) + 1).found());
  // The last block of the range ends at the range's end.
  ASSERT_TRUE(table.add(at(510), 2 * kGranule, BlockKind::kModel).ok());
  const PointerTarget range_end = table.resolve(kBase + kRange);
  ASSERT_TRUE(range_end.found());
  EXPECT_EQ(range_end.block->va, at(510));
  EXPECT_EQ(range_end.offset, 2 * kGranule);
}

TEST(BlockTable, APointerAtABlocksStartBelongsToItEvenWhereAnotherBlockEnds) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(4), 3 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(7), kGranule, BlockKind::kScratch).ok());
  const PointerTarget target = table.resolve(at(7));
  ASSERT_TRUE(target.found());
  EXPECT_EQ(target.block->va, at(7));
  EXPECT_EQ(target.offset, 0u);
  // Once the second block is gone, the same pointer is the first one's end again.
  ASSERT_TRUE(table.remove(at(7)).ok());
  EXPECT_EQ(table.resolve(at(7)).block->va, at(4));
  EXPECT_EQ(table.resolve(at(7)).offset, 3 * kGranule);
}

TEST(BlockTable, PointersOutsideEveryBlockAreNotFound) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(0), kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(10), kGranule, BlockKind::kModel).ok());
  for (uint64_t ptr :
       {kBase - 1, kBase - kGranule, at(1) + 1, at(5), at(9) + kGranule - 1, at(11) + 8,
        kBase + kRange, kBase + kRange + 1, uint64_t{0}, uint64_t{0} - 1, uint64_t{42}}) {
    EXPECT_FALSE(table.resolve(ptr).found()) << std::hex << ptr;
  }
}

TEST(BlockTable, ARangeArgumentMustLieInsideOneBlock) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(4), 2 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(6), 2 * kGranule, BlockKind::kModel).ok());
  // Up to the block's last byte.
  Result<PointerTarget> whole = table.resolve_range(at(4), 2 * kGranule);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->block->va, at(4));
  EXPECT_TRUE(table.resolve_range(at(5) + 100, kGranule - 100).ok());
  // Across the boundary into the next block, adjacent or not, is refused.
  EXPECT_EQ(table.resolve_range(at(6) - 8, 16).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.resolve_range(at(7), 2 * kGranule).status().code(), ErrorCode::kInvalidValue);
  // An empty range at the end of the second block is fine; a byte there is not.
  EXPECT_TRUE(table.resolve_range(at(8), 0).ok());
  EXPECT_EQ(table.resolve_range(at(8), 1).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.resolve_range(at(20), 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(table.resolve_range(at(20), 8).status().message().find("in no block"),
            std::string::npos);
}

TEST(BlockTable, RemovingABlockHandsBackItsPlacementsAndFreesItsAddresses) {
  BlockTable table = make(2);
  ASSERT_TRUE(table.add(at(2), 2 * kGranule, BlockKind::kModel).ok());
  const Allocation where{{3, 40 * kMiB}, 4 * kMiB};
  ASSERT_TRUE(table.place(at(2), 1, where).ok());
  Result<VirtualBlock> removed = table.remove(at(2));
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->va, at(2));
  EXPECT_FALSE(removed->on(0).placed());
  EXPECT_EQ(removed->on(1).pieces, std::vector<Allocation>{where});
  EXPECT_FALSE(table.resolve(at(2)).found());
  EXPECT_EQ(table.remove(at(2)).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.residency(1), GpuResidency{});
  // The addresses can hold a new block.
  EXPECT_TRUE(table.add(at(1), 4 * kGranule, BlockKind::kScratch).ok());
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, MarksModelAndScratchBlocksAndCountsTheirBytes) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(0), 10 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(10), kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(20), 3 * kGranule, BlockKind::kScratch).ok());
  EXPECT_EQ(table.model_bytes(), 11 * kGranule);
  EXPECT_EQ(table.scratch_bytes(), 3 * kGranule);
  EXPECT_EQ(table.total_bytes(), 14 * kGranule);
  std::vector<uint64_t> model;
  for (const VirtualBlock& block : table.blocks(BlockKind::kModel)) model.push_back(block.va);
  EXPECT_EQ(model, (std::vector<uint64_t>{at(0), at(10)}));
  // The first request came while a block was still counted as model: it becomes scratch.
  ASSERT_TRUE(table.set_kind(at(10), BlockKind::kScratch).ok());
  EXPECT_EQ(table.model_bytes(), 10 * kGranule);
  EXPECT_EQ(table.scratch_bytes(), 4 * kGranule);
  EXPECT_EQ(std::ranges::distance(table.blocks(BlockKind::kScratch)), 2);
  EXPECT_EQ(table.set_kind(at(5), BlockKind::kModel).code(), ErrorCode::kInvalidValue)
      << "not the start of a block";
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, KeepsADirtyBitPerBlock) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(0), 2 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(2), kGranule, BlockKind::kModel).ok());
  EXPECT_FALSE(table.block_at(at(0))->dirty);
  ASSERT_TRUE(table.set_dirty(at(0), true).ok());
  ASSERT_TRUE(table.set_dirty(at(0), true).ok()) << "marking twice counts once";
  EXPECT_TRUE(table.block_at(at(0))->dirty);
  EXPECT_EQ(table.dirty_bytes(), 2 * kGranule);
  ASSERT_TRUE(table.set_dirty(at(2), true).ok());
  ASSERT_TRUE(table.set_dirty(at(0), false).ok());  // written back to its host copy
  EXPECT_EQ(table.dirty_bytes(), kGranule);
  ASSERT_TRUE(table.remove(at(2)).ok());
  EXPECT_EQ(table.dirty_bytes(), 0u);
  EXPECT_EQ(table.set_dirty(at(9), true).code(), ErrorCode::kInvalidValue);
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, ABlockGoesFromEvictedThroughLoadingToResidentAndBackOnEachGpu) {
  BlockTable table = make(3);
  ASSERT_TRUE(table.add(at(0), 2 * kGranule, BlockKind::kModel).ok());
  const Allocation where{{0, 8 * kMiB}, 4 * kMiB};
  EXPECT_EQ(table.block_at(at(0))->on(1).residency, Residency::kEvicted);
  // Loading and resident need a placement first.
  EXPECT_EQ(table.set_residency(at(0), 1, Residency::kResident).code(), ErrorCode::kInvalidValue);
  ASSERT_TRUE(table.place(at(0), 1, where).ok());
  EXPECT_EQ(table.block_at(at(0))->on(1).residency, Residency::kLoading);
  EXPECT_EQ(table.block_at(at(0))->on(1).pieces, std::vector<Allocation>{where});
  EXPECT_EQ(table.place(at(0), 1, where).code(), ErrorCode::kInvalidValue) << "placed twice";
  ASSERT_TRUE(table.set_residency(at(0), 1, Residency::kResident).ok());
  EXPECT_EQ(table.block_at(at(0))->on(1).residency, Residency::kResident);
  // Only unplace() evicts: it hands the allocation back for the pool.
  EXPECT_EQ(table.set_residency(at(0), 1, Residency::kEvicted).code(), ErrorCode::kInvalidValue);
  // Invalidated and copied again (a stateful function wrote it elsewhere).
  ASSERT_TRUE(table.set_residency(at(0), 1, Residency::kLoading).ok());
  Result<std::vector<Allocation>> freed = table.unplace(at(0), 1);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, std::vector<Allocation>{where});
  EXPECT_EQ(table.block_at(at(0))->on(1).residency, Residency::kEvicted);
  EXPECT_EQ(table.unplace(at(0), 1).status().code(), ErrorCode::kInvalidValue);
  // Bad GPUs, unknown blocks and allocations too small for the block are refused.
  EXPECT_EQ(table.place(at(0), 3, where).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.place(at(0), -1, where).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.place(at(1), 0, where).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table.place(at(0), 0, Allocation{{0, 0}, 2 * kMiB}).code(), ErrorCode::kInvalidValue);
  // A larger allocation is fine (the block allocator may hand out a bigger cached block).
  EXPECT_TRUE(table.place(at(0), 0, Allocation{{7, 0}, 64 * kMiB}).ok());
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, SummarizesResidencyPerGpu) {
  BlockTable table = make(2);
  ASSERT_TRUE(table.add(at(0), 4 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(4), 2 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.add(at(8), kGranule, BlockKind::kScratch).ok());
  EXPECT_EQ(table.residency(0).evicted, (ResidencyCount{3, 7 * kGranule}));
  EXPECT_FALSE(table.residency(0).complete());
  ASSERT_TRUE(table.place(at(0), 0, {{0, 0}, 8 * kMiB}).ok());
  ASSERT_TRUE(table.place(at(4), 0, {{0, 8 * kMiB}, 4 * kMiB}).ok());
  ASSERT_TRUE(table.place(at(8), 0, {{0, 12 * kMiB}, 2 * kMiB}).ok());
  ASSERT_TRUE(table.set_residency(at(8), 0, Residency::kResident).ok());  // scratch: no copy
  ASSERT_TRUE(table.set_residency(at(0), 0, Residency::kResident).ok());
  const GpuResidency gpu0 = table.residency(0);
  EXPECT_EQ(gpu0.evicted, (ResidencyCount{0, 0}));
  EXPECT_EQ(gpu0.loading, (ResidencyCount{1, 2 * kGranule}));
  EXPECT_EQ(gpu0.resident, (ResidencyCount{2, 5 * kGranule}));
  EXPECT_FALSE(gpu0.complete());
  ASSERT_TRUE(table.set_residency(at(4), 0, Residency::kResident).ok());
  EXPECT_TRUE(table.residency(0).complete());
  // GPU 1 saw none of it.
  EXPECT_EQ(table.residency(1).evicted, (ResidencyCount{3, 7 * kGranule}));
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(BlockTable, IteratesBlocksInAddressOrder) {
  BlockTable table = make();
  for (uint64_t g : {40, 3, 17, 0, 500}) {
    ASSERT_TRUE(table.add(at(g), kGranule, BlockKind::kModel).ok());
  }
  std::vector<uint64_t> order;
  for (const VirtualBlock& block : table.blocks()) order.push_back(block.va);
  EXPECT_EQ(order, (std::vector<uint64_t>{at(0), at(3), at(17), at(40), at(500)}));
}

TEST(BlockTable, AMovedTableStillResolves) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(3), kGranule, BlockKind::kModel).ok());
  BlockTable moved = std::move(table);
  ASSERT_TRUE(moved.resolve(at(3) + 5).found());
  EXPECT_EQ(moved.resolve(at(3) + 5).block, moved.block_at(at(3)));
}

// The reference: blocks in a std::map, a pointer resolved by looking at every block.
PointerTarget reference_resolve(const std::map<uint64_t, uint64_t>& blocks, const BlockTable& table,
                                uint64_t ptr) {
  for (const auto& [va, bytes] : blocks) {
    if (ptr >= va && ptr < va + bytes) return {table.block_at(va), ptr - va};
  }
  for (const auto& [va, bytes] : blocks) {
    if (ptr == va + bytes) return {table.block_at(va), bytes};
  }
  return {};
}

TEST(BlockTable, RandomAddsRemovesAndLookupsAgreeWithAReferenceMap) {
  BlockTable table = make(2);
  std::map<uint64_t, uint64_t> reference;
  std::mt19937_64 rng(20261123);
  const uint64_t pages = kRange / kGranule;
  uint64_t lookups = 0, found = 0, ends = 0;
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 3) {
      const uint64_t page = rng() % pages;
      const uint64_t length = 1 + rng() % 12;
      const uint64_t va = kBase + page * kGranule;
      const uint64_t bytes = length * kGranule;
      bool overlaps = page + length > pages;
      for (const auto& [v, b] : reference) overlaps |= va < v + b && v < va + bytes;
      const Status added =
          table.add(va, bytes, rng() % 2 ? BlockKind::kModel : BlockKind::kScratch);
      ASSERT_EQ(added.ok(), !overlaps) << added;
      if (added.ok()) reference.emplace(va, bytes);
    } else if (op < 5 && !reference.empty()) {
      auto it = std::next(reference.begin(), static_cast<long>(rng() % reference.size()));
      ASSERT_TRUE(table.remove(it->first).ok());
      reference.erase(it);
    } else {
      // Pointers of every kind: block starts, ends and insides, and anywhere near the range.
      uint64_t ptr;
      if (!reference.empty() && rng() % 2 == 0) {
        auto it = std::next(reference.begin(), static_cast<long>(rng() % reference.size()));
        const uint64_t choice = rng() % 3;
        ptr = choice == 0   ? it->first
              : choice == 1 ? it->first + it->second
                            : it->first + rng() % it->second;
      } else {
        ptr = kBase - kGranule + rng() % (kRange + 2 * kGranule);
        if (rng() % 4 == 0) ptr &= ~(kGranule - 1);
      }
      const PointerTarget expected = reference_resolve(reference, table, ptr);
      const PointerTarget actual = table.resolve(ptr);
      ASSERT_EQ(actual.block, expected.block) << std::hex << ptr;
      ASSERT_EQ(actual.offset, expected.offset) << std::hex << ptr;
      ++lookups;
      found += actual.found();
      ends += actual.found() && actual.offset == actual.block->bytes;
    }
    if (step % 500 == 0) {
      ASSERT_TRUE(table.check_invariants().ok()) << table.check_invariants();
      ASSERT_EQ(table.size(), reference.size());
    }
  }
  // The run exercised what it claims to.
  EXPECT_GT(found, lookups / 4);
  EXPECT_LT(found, lookups);
  EXPECT_GT(ends, 100u);
}

}  // namespace
}  // namespace hiber::memory
