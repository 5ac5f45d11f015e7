// The mapping mechanism on the simulated GPU, end to end: a function's blocks placed in two
// GPUs' pools by the buddy allocator, mapped at the function's own addresses with the map plan,
// a pointer to one block stored inside another block in device memory, a swap to the other GPU,
// and the stored pointer still reaching the right bytes there. The rewriting mechanism is shown
// to reach the same bytes through the pool's own mapping.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "memory/block_table.h"
#include "memory/gpu_pools.h"
#include "memory/translation.h"
#include "server/device/sim_device.h"

namespace hiber::memory {
namespace {

using device::DevicePtr;
using device::PhysicalMemory;
using device::Stream;

constexpr uint64_t kPoolBytes = 128 * kMiB;
constexpr uint64_t kRangeBytes = 256 * kMiB;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::hiber::Status assert_ok_status_ = (expr);         \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

// One GPU's pool: a physical chunk, and the address at which hiberd itself maps it (the base
// the rewriting mechanism translates to).
struct GpuPool {
  PhysicalMemory chunk;
  DevicePtr window = 0;
};

class TranslationOnSimulatedGpu : public testing::Test {
 protected:
  void SetUp() override {
    auto device = device::SimDevice::create(device::SimDeviceOptions{});
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
    granularity_ = device_->allocation_granularity(0);
    for (int gpu = 0; gpu < 2; ++gpu) {
      auto chunk = device_->create_physical(gpu, kPoolBytes);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      auto window = device_->reserve_address_range(kPoolBytes, 0);
      ASSERT_TRUE(window.ok()) << window.status();
      pools_[gpu] = {*chunk, *window};
      ASSERT_OK(device_->map(*window, kPoolBytes, *chunk, 0));
      const int only[] = {gpu};
      ASSERT_OK(device_->set_access(*window, kPoolBytes, only));
      auto stream = device_->create_stream(gpu, 0);
      ASSERT_TRUE(stream.ok());
      streams_[gpu] = *stream;
    }
    auto gpu_pools = GpuPools::create_buddy({{kPoolBytes}, {kPoolBytes}});
    ASSERT_TRUE(gpu_pools.ok());
    gpu_pools_ = std::move(gpu_pools).value();
    auto range = device_->reserve_address_range(kRangeBytes, 0);
    ASSERT_TRUE(range.ok());
    range_ = *range;
  }

  void TearDown() override {
    for (int gpu = 0; gpu < 2; ++gpu) {
      EXPECT_TRUE(device_->destroy_stream(streams_[gpu]).ok());
      EXPECT_TRUE(device_->unmap(pools_[gpu].window, kPoolBytes).ok());
      EXPECT_TRUE(device_->free_address_range(pools_[gpu].window, kPoolBytes).ok());
      EXPECT_TRUE(device_->release_physical(pools_[gpu].chunk).ok());
    }
    if (range_ != 0) {
      EXPECT_TRUE(device_->free_address_range(range_, kRangeBytes).ok());
    }
  }

  // Places every block of `table` on `gpu` (the session's allocation path) and records where.
  void place_all(BlockTable& table, int gpu) {
    for (const VirtualBlock& block : table.blocks()) {
      AllocationResult placed = gpu_pools_->allocate(gpu, block.bytes, kFunction);
      ASSERT_TRUE(placed.ok()) << placed.shortfall().describe();
      ASSERT_OK(table.place(block.va, gpu, *placed));
    }
  }
  // Applies a plan: one map call per MapCall, one set_access per address run.
  void apply(const MapPlan& plan) {
    for (const MapCall& call : plan.calls) {
      ASSERT_EQ(call.chunk, 0u);  // one chunk per pool here
      ASSERT_OK(device_->map(call.va, call.bytes, pools_[plan.gpu].chunk, call.chunk_offset));
      ++map_calls_;
    }
    const int only[] = {plan.gpu};
    for (const VaRange& run : plan.va_runs())
      ASSERT_OK(device_->set_access(run.va, run.bytes, only));
  }
  void unmap(const MapPlan& plan) {
    for (const VaRange& run : plan.va_runs()) ASSERT_OK(device_->unmap(run.va, run.bytes));
  }
  // The independent count of map calls a swap needs: blocks in address order, a new run
  // wherever the next block does not follow the previous one in both addresses and its chunk.
  static size_t contiguous_runs(const BlockTable& table, int gpu) {
    size_t runs = 0;
    const VirtualBlock* previous = nullptr;
    for (const VirtualBlock& block : table.blocks()) {
      const Allocation& here = block.on(gpu).pieces.front();
      const Allocation* before = previous ? &previous->on(gpu).pieces.front() : nullptr;
      const bool follows = before != nullptr && previous->end() == block.va &&
                           before->where.chunk == here.where.chunk &&
                           before->where.offset + previous->bytes == here.where.offset;
      runs += !follows;
      previous = &block;
    }
    return runs;
  }
  Status read(int gpu, void* dst, DevicePtr src, uint64_t bytes) {
    HIBER_RETURN_IF_ERROR(device_->copy_device_to_host(streams_[gpu], dst, src, bytes));
    return device_->synchronize_stream(streams_[gpu]);
  }

  static constexpr FunctionId kFunction{7};
  std::unique_ptr<device::SimDevice> device_;
  uint64_t granularity_ = 0;
  GpuPool pools_[2];
  Stream streams_[2];
  std::unique_ptr<GpuPools> gpu_pools_;
  DevicePtr range_ = 0;
  size_t map_calls_ = 0;
};

TEST_F(TranslationOnSimulatedGpu, AStoredPointerStillReachesItsBytesAfterASwapToAnotherGpu) {
  auto created = BlockTable::create(range_, kRangeBytes, granularity_, 2);
  ASSERT_TRUE(created.ok()) << created.status();
  BlockTable table = std::move(created).value();
  // PyTorch's segments at consecutive addresses (20, 2, 2, 20 and 6 MiB), then, after a gap the
  // function freed, a 2 MiB scratch block.
  uint64_t va = range_;
  for (uint64_t bytes : {20 * kMiB, 2 * kMiB, 2 * kMiB, 20 * kMiB, 6 * kMiB}) {
    ASSERT_OK(table.add(va, bytes, BlockKind::kModel));
    va += bytes;
  }
  const DevicePtr scratch = va + 8 * kMiB;
  ASSERT_OK(table.add(scratch, 2 * kMiB, BlockKind::kScratch));
  const DevicePtr weights = range_;             // the first 20 MiB segment
  const DevicePtr holder = range_ + 20 * kMiB;  // a 2 MiB segment that stores a pointer

  // ---- On GPU 0 ----
  place_all(table, 0);
  Result<MapPlan> plan0 = plan_mapping(table, 0);
  ASSERT_TRUE(plan0.ok()) << plan0.status();
  apply(*plan0);
  EXPECT_EQ(map_calls_, contiguous_runs(table, 0));
  EXPECT_EQ(map_calls_, 2u) << "the five segments back to back, and the scratch block";
  EXPECT_LT(map_calls_, table.size());

  // A tensor at an interior offset of the weights, and a pointer to it stored in device memory
  // (as a pointer array or a cuDNN variant pack would hold it).
  const uint64_t offset = 3 * kMiB + 4040;
  std::vector<uint8_t> tensor(64 * kKiB);
  std::iota(tensor.begin(), tensor.end(), uint8_t{11});
  const DevicePtr stored = weights + offset;
  ASSERT_OK(device_->copy_host_to_device(streams_[0], stored, tensor.data(), tensor.size()));
  ASSERT_OK(device_->copy_host_to_device(streams_[0], holder + 256, &stored, sizeof(stored)));
  ASSERT_OK(device_->synchronize_stream(streams_[0]));
  for (const VirtualBlock& block : table.blocks()) {
    ASSERT_OK(table.set_residency(block.va, 0, Residency::kResident));
  }
  EXPECT_TRUE(table.residency(0).complete());

  // ---- The swap to GPU 1 ----
  // Place there, copy the model blocks' bytes GPU to GPU into the new placements (through GPU
  // 1's pool window; scratch is re-placed, not copied), then take GPU 0's mapping and
  // placements away and map GPU 1's.
  place_all(table, 1);
  for (const VirtualBlock& block : table.blocks(BlockKind::kModel)) {
    const DevicePtr destination = pools_[1].window + block.on(1).pieces.front().where.offset;
    ASSERT_OK(device_->copy_peer(streams_[1], destination, 1, block.va, 0, block.bytes));
  }
  ASSERT_OK(device_->synchronize_stream(streams_[1]));
  unmap(*plan0);
  for (const VirtualBlock& block : table.blocks()) {
    Result<std::vector<Allocation>> freed = table.unplace(block.va, 0);
    ASSERT_TRUE(freed.ok());
    for (const Allocation& piece : *freed) ASSERT_OK(gpu_pools_->deallocate(0, piece));
    ASSERT_OK(table.set_residency(block.va, 1, Residency::kResident));
  }
  EXPECT_EQ(gpu_pools_->function_bytes(kFunction, 0), 0u);
  EXPECT_EQ(table.residency(0).evicted.blocks, table.size());
  map_calls_ = 0;
  Result<MapPlan> plan1 = plan_mapping(table, 1);
  ASSERT_TRUE(plan1.ok()) << plan1.status();
  apply(*plan1);
  EXPECT_EQ(map_calls_, contiguous_runs(table, 1));
  EXPECT_EQ(plan1->unplaced_blocks, 0u);

  // The pointer stored in device memory is read back on GPU 1 and still reaches the tensor.
  DevicePtr loaded = 0;
  ASSERT_OK(read(1, &loaded, holder + 256, sizeof(loaded)));
  EXPECT_EQ(loaded, stored);
  std::vector<uint8_t> back(tensor.size());
  ASSERT_OK(read(1, back.data(), loaded, back.size()));
  EXPECT_EQ(back, tensor);

  // GPU 0 can no longer reach the function's addresses.
  std::vector<uint8_t> denied(16);
  EXPECT_FALSE(read(0, denied.data(), weights + offset, denied.size()).ok());

  // Rewriting reaches the same bytes through the pool's own mapping, without the function's
  // addresses: what hiberd would do if GPU 0 ran a second replica at the same time.
  auto rewriter = RewritingTranslator::create(table, {{pools_[0].window}, {pools_[1].window}});
  ASSERT_TRUE(rewriter.ok()) << rewriter.status();
  Result<uint64_t> translated = (*rewriter)->translate(loaded, tensor.size(), 1);
  ASSERT_TRUE(translated.ok()) << translated.status();
  EXPECT_NE(*translated, loaded);
  std::fill(back.begin(), back.end(), 0);
  ASSERT_OK(read(1, back.data(), *translated, back.size()));
  EXPECT_EQ(back, tensor);

  unmap(*plan1);
  for (const VirtualBlock& block : table.blocks()) {
    Result<std::vector<Allocation>> freed = table.unplace(block.va, 1);
    ASSERT_TRUE(freed.ok());
    for (const Allocation& piece : *freed) ASSERT_OK(gpu_pools_->deallocate(1, piece));
  }
  EXPECT_TRUE(gpu_pools_->check_invariants().ok());
  EXPECT_TRUE(table.check_invariants().ok());
}

}  // namespace
}  // namespace hiber::memory
