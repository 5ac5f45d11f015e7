// The two translation mechanisms: the map plan of a swap (mapping) and pointer rewriting with
// its kernel-argument scan, including the false-positive guard against adversarial integers.
#include "memory/translation.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <vector>

#include "memory/buddy_allocator.h"

namespace hiber::memory {
namespace {

constexpr uint64_t kGranule = 2 * kMiB;
constexpr uint64_t kBase = 0x7f0000000000;
constexpr uint64_t kRange = 1 * kGiB;

uint64_t at(uint64_t granules) { return kBase + granules * kGranule; }

BlockTable make(int gpus = 2) {
  Result<BlockTable> table = BlockTable::create(kBase, kRange, kGranule, gpus);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

// Adds a block of `granules` at granule `va_granule`, placed on `gpu` at (chunk, offset).
void add_placed(BlockTable& table, uint64_t va_granule, uint64_t granules, int gpu, uint32_t chunk,
                uint64_t offset, BlockKind kind = BlockKind::kModel) {
  ASSERT_TRUE(table.add(at(va_granule), granules * kGranule, kind).ok());
  ASSERT_TRUE(table.place(at(va_granule), gpu, {{chunk, offset}, granules * kGranule}).ok());
}

// ---- Mapping: the plan ----

TEST(MapPlan, BlocksAdjacentInAddressesAndInTheirChunkMapInOneCall) {
  BlockTable table = make();
  // PyTorch's segments as the buddy allocator lays them out: 20 MiB, 2 MiB, 6 MiB, back to back.
  add_placed(table, 0, 10, 0, 0, 0);
  add_placed(table, 10, 1, 0, 0, 20 * kMiB);
  add_placed(table, 11, 3, 0, 0, 22 * kMiB);
  Result<MapPlan> plan = plan_mapping(table, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->calls, (std::vector<MapCall>{{at(0), 28 * kMiB, 0, 0}}));
  EXPECT_EQ(plan->blocks, 3u);
  EXPECT_EQ(plan->bytes, 28 * kMiB);
  EXPECT_EQ(plan->unplaced_blocks, 0u);
  EXPECT_EQ(plan->va_runs(), (std::vector<VaRange>{{at(0), 28 * kMiB}}));
}

TEST(MapPlan, AGapInAddressesOrInThePoolStartsANewCall) {
  BlockTable table = make();
  add_placed(table, 0, 1, 0, 0, 0);
  add_placed(table, 2, 1, 0, 0, 2 * kMiB);   // a gap in addresses
  add_placed(table, 3, 1, 0, 0, 8 * kMiB);   // a gap in the chunk
  add_placed(table, 4, 1, 0, 1, 10 * kMiB);  // the next offset, but another chunk
  add_placed(table, 5, 1, 0, 1, 6 * kMiB);   // adjacent, but before its neighbour in the pool
  add_placed(table, 6, 1, 0, 1, 8 * kMiB);   // follows the one before: merges
  Result<MapPlan> plan = plan_mapping(table, 0);
  ASSERT_TRUE(plan.ok());
  const std::vector<MapCall> expected = {{at(0), kGranule, 0, 0},
                                         {at(2), kGranule, 0, 2 * kMiB},
                                         {at(3), kGranule, 0, 8 * kMiB},
                                         {at(4), kGranule, 1, 10 * kMiB},
                                         {at(5), 2 * kGranule, 1, 6 * kMiB}};
  EXPECT_EQ(plan->calls, expected);
  // Access and unmap go by address runs, whatever backs them.
  EXPECT_EQ(plan->va_runs(), (std::vector<VaRange>{{at(0), kGranule}, {at(2), 5 * kGranule}}));
}

TEST(MapPlan, LeavesOutBlocksNotPlacedOnTheGpuAndCountsThem) {
  BlockTable table = make(2);
  add_placed(table, 0, 1, 0, 0, 0);
  add_placed(table, 1, 1, 1, 0, 0);  // on GPU 1 only
  add_placed(table, 2, 1, 0, 0, 4 * kMiB);
  Result<MapPlan> plan = plan_mapping(table, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->calls,
            (std::vector<MapCall>{{at(0), kGranule, 0, 0}, {at(2), kGranule, 0, 4 * kMiB}}));
  EXPECT_EQ(plan->unplaced_blocks, 1u);
  EXPECT_EQ(plan_mapping(table, 1)->unplaced_blocks, 2u);
}

TEST(MapPlan, AFilterChoosesTheBlocks) {
  BlockTable table = make();
  add_placed(table, 0, 2, 0, 0, 0, BlockKind::kModel);
  add_placed(table, 2, 1, 0, 0, 4 * kMiB, BlockKind::kScratch);
  add_placed(table, 3, 1, 0, 0, 6 * kMiB, BlockKind::kModel);
  Result<MapPlan> models =
      plan_mapping(table, 0, [](const VirtualBlock& b) { return b.kind == BlockKind::kModel; });
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->calls,
            (std::vector<MapCall>{{at(0), 2 * kGranule, 0, 0}, {at(3), kGranule, 0, 6 * kMiB}}));
  EXPECT_EQ(models->unplaced_blocks, 0u) << "filtered-out blocks are not 'unplaced'";
  EXPECT_EQ(plan_mapping(table, 0)->calls.size(), 1u);
}

// A block larger than a pool block is placed in pieces: one call per piece, each at the block's
// address plus the pieces before it, the last cut to the block's end; pieces that happen to be
// adjacent in their chunk merge, as blocks do, and so does the next block.
TEST(MapPlan, ABlockInPiecesMapsPieceByPieceAtItsOwnAddress) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(0), 7 * kGranule, BlockKind::kModel).ok());
  const std::vector<Allocation> pieces = {
      {{2, 0}, 3 * kGranule}, {{0, 20 * kMiB}, 3 * kGranule}, {{0, 26 * kMiB}, 2 * kGranule}};
  ASSERT_TRUE(table.place(at(0), 0, pieces).ok());
  add_placed(table, 7, 1, 0, 0, 30 * kMiB);
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
  EXPECT_EQ(block_map_calls(*table.block_at(at(0)), 0, at(100)),
            (std::vector<MapCall>{{at(100), 3 * kGranule, 2, 0},
                                  {at(103), 3 * kGranule, 0, 20 * kMiB},
                                  {at(106), kGranule, 0, 26 * kMiB}}));
  Result<MapPlan> plan = plan_mapping(table, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The third piece is cut to the block's end (1 granule of its 2), so the next block, at
  // 30 MiB, does not follow it in the chunk.
  EXPECT_EQ(plan->calls, (std::vector<MapCall>{{at(0), 3 * kGranule, 2, 0},
                                               {at(3), 4 * kGranule, 0, 20 * kMiB},
                                               {at(7), kGranule, 0, 30 * kMiB}}));
  EXPECT_EQ(plan->blocks, 2u);
  EXPECT_EQ(plan->va_runs(), (std::vector<VaRange>{{at(0), 8 * kGranule}}));
  // Pieces must tile the block: too few bytes, or a piece (but the last) off the granularity.
  ASSERT_TRUE(table.add(at(10), 4 * kGranule, BlockKind::kModel).ok());
  EXPECT_EQ(table.place(at(10), 0, {{{0, 0}, kGranule}, {{0, 64 * kMiB}, 2 * kGranule}}).code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(table.place(at(10), 0, {{{0, 0}, kGranule + 4096}, {{1, 0}, 4 * kGranule}}).code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(table.place(at(10), 0, std::vector<Allocation>{}).code(), ErrorCode::kInvalidValue);
  Result<std::vector<Allocation>> freed = table.unplace(at(0), 0);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, pieces);
  EXPECT_TRUE(table.check_invariants().ok()) << table.check_invariants();
}

TEST(MapPlan, RefusesABadGpuAndAPlacementTheDeviceCouldNotMap) {
  BlockTable table = make();
  ASSERT_TRUE(table.add(at(0), kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(table.place(at(0), 0, {{0, 64 * kKiB}, kGranule}).ok());
  EXPECT_EQ(plan_mapping(table, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(plan_mapping(table, 2).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(plan_mapping(table, -1).status().code(), ErrorCode::kInvalidValue);
}

// A ResNet-152-sized model (about 230 MB) in PyTorch's segments, allocated from a buddy pool
// while another function allocates at the same time; the shim hands out consecutive addresses.
// Returns {blocks, map calls, contiguous runs counted independently}.
struct PlanShape {
  size_t blocks = 0;
  size_t calls = 0;
  size_t runs = 0;
};
PlanShape plan_a_model(bool consolidate) {
  BuddyOptions options;
  options.consolidate = consolidate;
  options.shared_sizes = {};
  auto pool = BuddyAllocator::create({1 * kGiB}, options);
  EXPECT_TRUE(pool.ok());
  BlockTable table = make(1);
  std::vector<uint64_t> segments;
  for (int i = 0; i < 6; ++i) segments.push_back(2 * kMiB);
  for (int i = 0; i < 8; ++i) segments.push_back(20 * kMiB);
  for (uint64_t mib : {10, 18, 36, 10}) segments.push_back(mib * kMiB);
  uint64_t va = kBase;
  std::vector<std::pair<uint64_t, PoolLocation>> placed;  // (va, where), address order
  for (uint64_t bytes : segments) {
    AllocationResult mine = (*pool)->allocate(bytes, FunctionId{1});
    AllocationResult other =
        (*pool)->allocate(2 * kMiB, FunctionId{2});  // another function's scratch
    EXPECT_TRUE(mine.ok() && other.ok());
    EXPECT_TRUE(table.add(va, bytes, BlockKind::kModel).ok());
    EXPECT_TRUE(table.place(va, 0, *mine).ok());
    placed.push_back({va, mine->where});
    va += bytes;
  }
  Result<MapPlan> plan = plan_mapping(table, 0);
  EXPECT_TRUE(plan.ok());
  // The reference: a new run wherever the next block is not the next thing in the same chunk.
  size_t runs = 0;
  for (size_t i = 0; i < placed.size(); ++i) {
    const bool continues =
        i > 0 && placed[i].second.chunk == placed[i - 1].second.chunk &&
        placed[i].second.offset == placed[i - 1].second.offset + segments[i - 1] &&
        placed[i].first == placed[i - 1].first + segments[i - 1];
    runs += !continues;
  }
  return {segments.size(), plan->calls.size(), runs};
}

TEST(MapPlan, ConsolidationLetsAModelMapInFewCalls) {
  const PlanShape together = plan_a_model(true);
  EXPECT_EQ(together.calls, together.runs);
  EXPECT_LE(together.calls * 4, together.blocks) << together.calls << " calls";
  // Without consolidation the other function's blocks land in between.
  const PlanShape apart = plan_a_model(false);
  EXPECT_EQ(apart.calls, apart.runs);
  EXPECT_GT(apart.calls, together.calls);
}

// ---- Kernel arguments ----

// A packed parameter buffer built parameter by parameter, each at its ABI alignment.
class Params {
 public:
  template <typename T>
  Params& add(const T& value, uint32_t alignment = alignof(T)) {
    return add_bytes(&value, sizeof(T), alignment);
  }
  Params& add_bytes(const void* bytes, uint32_t size, uint32_t alignment) {
    const auto offset =
        static_cast<uint32_t>((buffer_.size() + alignment - 1) / alignment * alignment);
    buffer_.resize(offset + size);
    std::memcpy(buffer_.data() + offset, bytes, size);
    kernel_.params.push_back({offset, size});
    return *this;
  }
  std::span<std::byte> bytes() { return buffer_; }
  const KernelInfo& kernel() const { return kernel_; }
  template <typename T>
  T read(uint32_t offset) const {
    T value;
    std::memcpy(&value, buffer_.data() + offset, sizeof(T));
    return value;
  }

 private:
  std::vector<std::byte> buffer_;
  KernelInfo kernel_{"kernel", {}};
};

// A table with three blocks placed on GPU 0 and GPU 1 at different chunks and offsets, and the
// pools' chunk bases.
struct Placed {
  BlockTable table = make(2);
  std::vector<std::vector<uint64_t>> chunk_base = {{0x100000000000, 0x100040000000},
                                                   {0x200000000000}};
  Placed() {
    add_placed(table, 0, 10, 0, 1, 30 * kMiB);  // a 20 MiB segment
    add_placed(table, 10, 1, 0, 0, 0);          // a 2 MiB one
    add_placed(table, 20, 4, 0, 0, 64 * kMiB);  // a large tensor
    EXPECT_TRUE(table.place(at(0), 1, {{0, 100 * kMiB}, 20 * kMiB}).ok());
    EXPECT_TRUE(table.place(at(10), 1, {{0, 2 * kMiB}, 2 * kMiB}).ok());
  }
  std::unique_ptr<RewritingTranslator> rewriter() {
    auto translator = RewritingTranslator::create(table, chunk_base);
    EXPECT_TRUE(translator.ok()) << translator.status();
    return std::move(translator).value();
  }
};

TEST(Rewriting, TranslatesAPointerToWhereItsBlockLiesInThePool) {
  Placed p;
  auto rewriter = p.rewriter();
  EXPECT_EQ(rewriter->name(), "rewriting");
  // Interior pointers and views keep their offset in the block.
  EXPECT_EQ(*rewriter->translate(at(0) + 4096, 256, 0), 0x100040000000 + 30 * kMiB + 4096);
  EXPECT_EQ(*rewriter->translate(at(0) + 4096, 256, 1), 0x200000000000 + 100 * kMiB + 4096);
  EXPECT_EQ(*rewriter->translate(at(10), 2 * kMiB, 0), 0x100000000000);
  // A pointer at a block's end, with nothing to copy, translates to the placement's end.
  EXPECT_EQ(*rewriter->translate(at(11), 0, 0), 0x100000000000 + 2 * kMiB);
  EXPECT_EQ(rewriter->counters().ranges, 4u);
  // Past the block's end, in a gap, on a GPU it is not placed on, on no GPU at all.
  EXPECT_EQ(rewriter->translate(at(10) + 8, 2 * kMiB, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(rewriter->translate(at(15), 8, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(rewriter->translate(at(20), 8, 1).status().code(), ErrorCode::kNotMapped);
  EXPECT_EQ(rewriter->translate(at(20), 8, 2).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(rewriter->counters().refused, 4u);
  EXPECT_EQ(rewriter->counters().ranges, 4u);
}

// Rewritten pointers address the pool directly: a block placed in pieces cannot be given one.
TEST(Rewriting, RefusesABlockPlacedInPieces) {
  Placed p;
  ASSERT_TRUE(p.table.add(at(30), 4 * kGranule, BlockKind::kModel).ok());
  ASSERT_TRUE(
      p.table.place(at(30), 0, {{{0, 128 * kMiB}, 2 * kGranule}, {{1, 0}, 2 * kGranule}}).ok());
  auto rewriter = p.rewriter();
  const Result<uint64_t> refused = rewriter->translate(at(30), 8, 0);
  EXPECT_EQ(refused.status().code(), ErrorCode::kNotMapped);
  EXPECT_NE(refused.status().message().find("placed in 2 pieces"), std::string::npos)
      << refused.status();
}

TEST(Rewriting, RefusesMissingChunkBasesAndRangesBelow4GiB) {
  Placed p;
  EXPECT_EQ(RewritingTranslator::create(p.table, {{1}}).status().code(), ErrorCode::kInvalidValue);
  Result<BlockTable> low = BlockTable::create(0x40000000, kRange, kGranule, 1);
  ASSERT_TRUE(low.ok());
  EXPECT_EQ(RewritingTranslator::create(*low, {{0x100000000000}}).status().code(),
            ErrorCode::kInvalidValue);
  // A placement in a chunk the translator was given no base for: hiberd's bug, not the client's.
  p.chunk_base[1].clear();
  auto rewriter = p.rewriter();
  EXPECT_EQ(rewriter->translate(at(0), 8, 1).status().code(), ErrorCode::kIllegalState);
}

TEST(Rewriting, RewritesPointersInsideStructsPassedByValue) {
  Placed p;
  auto rewriter = p.rewriter();
  struct View {  // a tensor view as a kernel takes it: data, size, end
    uint64_t data;
    int64_t size;
    uint64_t end;
  };
  // A view 1000 floats into the large tensor; `end` is its block's one-past-the-end pointer.
  const View view{at(20) + 1000 * 4, 500, at(24)};
  Params params;
  params.add(at(0)).add(int32_t{7}).add(view).add(float{1.5f}).add(at(10) + 64);
  ASSERT_TRUE(rewriter->translate_kernel_params(params.bytes(), params.kernel(), 0).ok());
  const uint64_t large = 0x100000000000 + 64 * kMiB;  // block at(20) on GPU 0
  EXPECT_EQ(params.read<uint64_t>(0), 0x100040000000 + 30 * kMiB);
  EXPECT_EQ(params.read<int32_t>(8), 7);
  EXPECT_EQ(params.read<uint64_t>(16), large + 4000);
  EXPECT_EQ(params.read<int64_t>(24), 500);
  EXPECT_EQ(params.read<uint64_t>(32), large + 8 * kMiB);
  EXPECT_EQ(params.read<float>(40), 1.5f);
  EXPECT_EQ(params.read<uint64_t>(48), 0x100000000000 + 64);
  EXPECT_EQ(rewriter->counters().launches, 1u);
  EXPECT_EQ(rewriter->counters().words_scanned, 5u) << "3 pointers, the struct's size word, and "
                                                       "nothing of the int and the float";
  EXPECT_EQ(rewriter->counters().words_rewritten, 4u);
}

TEST(Rewriting, NeverReadsAWordAcrossParametersOrAtAnUnalignedOffset) {
  Placed p;
  auto rewriter = p.rewriter();
  const uint64_t address = at(10) + 128;  // inside a live block
  const auto lo = static_cast<uint32_t>(address);
  const auto hi = static_cast<uint32_t>(address >> 32);
  Params params;
  // Two int parameters whose bytes, side by side at an 8-aligned offset, spell the address.
  params.add(uint64_t{0}).add(lo).add(hi);
  // A struct of three ints (alignment 4) at offset 20: its last two members, at the
  // 8-aligned offset 24, spell the address too.
  struct Three {
    uint32_t a, b, c;
  };
  params.add(uint32_t{0});
  params.add(Three{99, lo, hi});
  // A 16-byte struct at an 8-aligned offset that holds the address at an inner offset of 4.
  struct Packed {
    uint32_t pad, lo, hi, tail;
  };
  params.add(Packed{0, lo, hi, 0}, 8);
  ASSERT_EQ(params.kernel().params[4].offset, 20u);
  ASSERT_EQ(params.read<uint64_t>(8), address);
  ASSERT_EQ(params.read<uint64_t>(24), address);
  const std::vector<std::byte> before(params.bytes().begin(), params.bytes().end());
  ASSERT_TRUE(rewriter->translate_kernel_params(params.bytes(), params.kernel(), 0).ok());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), params.bytes().begin()));
  EXPECT_EQ(rewriter->counters().words_rewritten, 0u);
  EXPECT_EQ(rewriter->counters().words_scanned, 3u) << "the uint64 and the two aligned words "
                                                       "of the 16-byte struct";
}

TEST(Rewriting, LeavesAdversarialIntegersAndFloatsAlone) {
  Placed p;
  // Free the middle block so that its addresses are dangling, not live.
  ASSERT_TRUE(p.table.remove(at(10)).ok());
  auto rewriter = p.rewriter();
  const auto floats = [](float lo, float hi) {
    return uint64_t{std::bit_cast<uint32_t>(hi)} << 32 | std::bit_cast<uint32_t>(lo);
  };
  // clang-format off
  const uint64_t adversarial[] = {
      0, 1, 2, 7, 4096, 1 << 20, 0xFFFFFFFF,                    // small integers
      uint64_t(-1), uint64_t(-2), uint64_t(int64_t{-4096}),     // negatives, sign-extended
      uint64_t(std::numeric_limits<int64_t>::min()),
      uint64_t(std::numeric_limits<int64_t>::max()),
      kBase - 1, kBase - kGranule,                              // just below the range
      kBase + kRange, kBase + kRange - 8, kBase + kRange + 8,   // its end: no block there
      at(10) + 8, at(11) - 8, at(11), at(11) + 1,               // the freed block
      at(15), at(19) + kGranule - 1,                            // a gap
      at(24) + 1, at(30),                                       // just past the last block
      std::bit_cast<uint64_t>(1.0), std::bit_cast<uint64_t>(-0.0),
      std::bit_cast<uint64_t>(3.14159), std::bit_cast<uint64_t>(1e-300),
      floats(1.0f, 2.0f), floats(0.5f, -3.0f), floats(123.0f, 0.0f), floats(0.0f, 1e-30f),
      uint64_t{5} << 32 | 17,                                   // the int pair {17, 5}
  };
  // clang-format on

  Params params;
  for (uint64_t value : adversarial) params.add(value);
  const std::vector<std::byte> before(params.bytes().begin(), params.bytes().end());
  ASSERT_TRUE(rewriter->translate_kernel_params(params.bytes(), params.kernel(), 0).ok());
  for (size_t i = 0; i < std::size(adversarial); ++i) {
    EXPECT_EQ(params.read<uint64_t>(static_cast<uint32_t>(8 * i)), adversarial[i])
        << "word " << i << " = 0x" << std::hex << adversarial[i] << " was rewritten";
  }
  EXPECT_EQ(rewriter->counters().words_scanned, std::size(adversarial));
  EXPECT_EQ(rewriter->counters().words_rewritten, 0u);
}

TEST(Rewriting, AnIntegerThatEqualsALiveBlockAddressIsTheDocumentedResidualRisk) {
  // The guard cannot tell an int64 (or a pair of int32s) that equals a live block address from
  // a pointer: it is rewritten. This is why mapping is the default (memory/translation.h).
  Placed p;
  auto rewriter = p.rewriter();
  Params params;
  params.add(int64_t(at(20) + 8));
  ASSERT_TRUE(rewriter->translate_kernel_params(params.bytes(), params.kernel(), 0).ok());
  EXPECT_EQ(rewriter->counters().words_rewritten, 1u);
}

TEST(Rewriting, AnErrorLeavesTheParameterBufferUnchanged) {
  Placed p;
  auto rewriter = p.rewriter();
  Params params;
  params.add(at(0)).add(at(20));  // the second block is not placed on GPU 1
  const std::vector<std::byte> before(params.bytes().begin(), params.bytes().end());
  const Status status = rewriter->translate_kernel_params(params.bytes(), params.kernel(), 1);
  EXPECT_EQ(status.code(), ErrorCode::kNotMapped);
  EXPECT_NE(status.message().find("offset 8"), std::string::npos) << status;
  EXPECT_TRUE(std::equal(before.begin(), before.end(), params.bytes().begin()));
  EXPECT_EQ(rewriter->counters().launches, 0u);
  EXPECT_EQ(rewriter->counters().refused, 1u);
}

TEST(Rewriting, RefusesABufferThatDoesNotMatchTheLayout) {
  Placed p;
  auto rewriter = p.rewriter();
  Params params;
  params.add(at(0)).add(int32_t{1});
  std::span<std::byte> bytes = params.bytes();
  EXPECT_EQ(rewriter->translate_kernel_params(bytes.first(8), params.kernel(), 0).code(),
            ErrorCode::kInvalidValue);
  KernelInfo outside = params.kernel();
  outside.params.insert(outside.params.begin(), ParamInfo{4096, 8});  // out of order and out
  EXPECT_EQ(rewriter->translate_kernel_params(bytes, outside, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(rewriter->translate_kernel_params(bytes, params.kernel(), 5).code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(params.read<uint64_t>(0), at(0));
}

TEST(KernelArgumentScan, ReportsTheBlocksAKernelTouches) {
  // What the mapping path uses to wait only for the swap groups a kernel's arguments touch.
  Placed p;
  Params params;
  params.add(at(20) + 16).add(int32_t{3}).add(at(0));
  std::vector<ArgumentPointer> found;
  Result<uint64_t> scanned = scan_kernel_params(p.table, params.bytes(), params.kernel(), found);
  ASSERT_TRUE(scanned.ok());
  EXPECT_EQ(*scanned, 2u);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].offset, 0u);
  EXPECT_EQ(found[0].target.block->va, at(20));
  EXPECT_EQ(found[0].target.offset, 16u);
  EXPECT_EQ(found[1].offset, 16u);
  EXPECT_EQ(found[1].target.block->va, at(0));
  // A kernel without parameters.
  EXPECT_EQ(*scan_kernel_params(p.table, {}, KernelInfo{"empty", {}}, found), 0u);
  EXPECT_TRUE(found.empty());
}

TEST(PointerTables, DataHoldingABlockAddressAtAnAlignedWordIsAPointerTable) {
  Placed p;
  std::vector<uint64_t> words(64, 0);
  for (size_t i = 0; i < words.size(); ++i) words[i] = std::bit_cast<uint64_t>(0.25 * i);
  const auto bytes = [&] { return std::as_bytes(std::span(words)); };
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), bytes())) << "doubles are not pointers";
  words[17] = at(20) + 4096;  // an interior pointer, as in an array of weight pointers
  EXPECT_TRUE(holds_block_pointers(p.table, at(40), bytes()));
  // The same word read at device addresses that are not 8-aligned is not a word the GPU reads
  // as a pointer.
  EXPECT_FALSE(holds_block_pointers(p.table, at(40) + 4, bytes()));
  // One past the end of a block counts (the table's rule), a gap or a freed block does not.
  words[17] = at(0) + p.table.resolve(at(0)).block->bytes;
  EXPECT_TRUE(holds_block_pointers(p.table, at(40), bytes()));
  words[17] = at(15);
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), bytes()));
  ASSERT_TRUE(p.table.remove(at(20)).ok());
  words[17] = at(20) + 4096;
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), bytes()));
  // A word cut by the end of the data is not read.
  words.back() = at(0);
  EXPECT_TRUE(holds_block_pointers(p.table, at(40), bytes()));
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), bytes().first(bytes().size() - 1)));
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), {}));
  // Words are read eight at a time, then one by one: a pointer in the last word of a length
  // that is not a multiple of eight words is found.
  words.back() = 0;
  words.resize(61);
  words.back() = at(10) + 8;
  EXPECT_TRUE(holds_block_pointers(p.table, at(40), bytes()));
  words.back() = 0;
  EXPECT_FALSE(holds_block_pointers(p.table, at(40), bytes()));
}

// ---- Mapping: the translator ----

TEST(Mapping, PassesPointersThroughOnceTheirRangeIsChecked) {
  Placed p;
  MappingTranslator mapping(p.table);
  EXPECT_EQ(mapping.name(), "mapping");
  EXPECT_EQ(*mapping.translate(at(0) + 4096, 256, 1), at(0) + 4096);
  EXPECT_EQ(*mapping.translate(at(11), 0, 0), at(11));
  EXPECT_EQ(mapping.translate(at(20), 8, 1).status().code(), ErrorCode::kNotMapped);
  EXPECT_EQ(mapping.translate(at(9), 4 * kMiB, 0).status().code(), ErrorCode::kInvalidValue);
  // Kernel arguments are left exactly as they are: pointers and all.
  Params params;
  params.add(at(20)).add(int32_t{1});
  const std::vector<std::byte> before(params.bytes().begin(), params.bytes().end());
  ASSERT_TRUE(mapping.translate_kernel_params(params.bytes(), params.kernel(), 0).ok());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), params.bytes().begin()));
  EXPECT_EQ(mapping.translate_kernel_params(params.bytes().first(4), params.kernel(), 0).code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(mapping.counters().ranges, 2u);
  EXPECT_EQ(mapping.counters().launches, 1u);
  EXPECT_EQ(mapping.counters().words_scanned, 0u);
  EXPECT_EQ(mapping.counters().refused, 3u);
}

}  // namespace
}  // namespace hiber::memory
