// FunctionMemory on the simulated device: a function's bytes follow it from GPU to GPU through
// the host copy or a peer copy, and a copy that is not valid (stale after a write elsewhere, or
// the target of a failed swap) is never used as a source; with pipelining, a pointer table's
// users wait for the whole swap. Every read is checked against the bytes the test wrote, on the
// host.
#include "server/function_memory.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <vector>

#include "server/device/sim_device.h"
#include "server/device_pools.h"
#include "server/model_repository.h"

namespace hiber::server {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBlockBytes = 6 * kMiB;  // three granules, three 2 MiB swap groups

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::hiber::Status assert_ok_status_ = (expr);         \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

std::vector<uint8_t> pattern(uint8_t seed) {
  std::vector<uint8_t> bytes(kBlockBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + seed);
  return bytes;
}

class FunctionMemoryTest : public testing::Test {
 protected:
  // `slow_link`: host copies run at 0.05 GB/s, so a swap of a few MiB stays in flight for a
  // few hundred milliseconds, long enough to look at what a use must wait for.
  // `function_bytes`: the function's range and quota; `repository_max`: what host copies may
  // take (in chunks of 64 MiB).
  void start(bool stateful, int failing_gpu = -1, bool slow_link = false,
             uint64_t function_bytes = 64 * kMiB, uint64_t repository_max = 128 * kMiB) {
    device::SimDeviceOptions options;
    for (GpuSpec& gpu : options.node.gpus) gpu.memory_bytes = 256 * kMiB;
    options.fail_transfers_to_gpu = failing_gpu;
    if (slow_link) {
      options.throttle_copies = true;
      for (PcieSwitchSpec& link : options.node.pcie_switches) {
        link.host_to_device_gbps = 0.05;
        link.device_to_host_gbps = 0.05;
      }
    }
    auto device = device::SimDevice::create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    DevicePoolsOptions pools;
    pools.reserve_bytes = 64 * kMiB;
    pools.chunk_bytes = 64 * kMiB;
    auto created = DevicePools::create(*device_, pools);
    ASSERT_TRUE(created.ok()) << created.status();
    pools_ = std::move(*created);
    auto repository = ModelRepository::create(*device_, {64 * kMiB, repository_max, true});
    ASSERT_TRUE(repository.ok()) << repository.status();
    repository_ = std::move(*repository);
    FunctionMemoryOptions memory_options;
    memory_options.stateful = stateful;
    auto memory = FunctionMemory::create(*device_, *pools_, *repository_, FunctionId{1},
                                         function_bytes, function_bytes, memory_options);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(*memory);
    for (int gpu = 0; gpu < device_->gpu_count(); ++gpu) {
      auto stream = device_->create_stream(gpu, 0);
      ASSERT_TRUE(stream.ok()) << stream.status();
      streams_.push_back(*stream);
    }
  }

  void TearDown() override {
    memory_.reset();
    repository_.reset();
    pools_.reset();
  }

  // Binds to `gpu`; the future ends with the swap.
  std::future<Status> start_bind(int gpu, scheduler::Source source = scheduler::Source::kHost,
                                 int source_gpu = -1, bool first_request = false) {
    Lease lease{.id = RequestId{++leases_}, .gpus = GpuSet::of(GpuId{gpu})};
    lease.source = source;
    if (source_gpu >= 0) lease.source_gpu = GpuId{source_gpu};
    lease.first_request = first_request;
    auto done = std::make_shared<std::promise<Status>>();
    Status bound =
        memory_->bind(lease, streams_[gpu],
                      [done](const Status& s, const SwapReport&) { done->set_value(s); }, {});
    if (!bound.ok()) done->set_value(bound);
    return done->get_future();
  }

  // Binds to `gpu` and waits for the swap; its status.
  Status bind(int gpu, scheduler::Source source = scheduler::Source::kHost, int source_gpu = -1,
              bool first_request = false) {
    return start_bind(gpu, source, source_gpu, first_request).get();
  }

  // The ids of the events a read of [va, va + 8) must wait for now.
  std::vector<uint64_t> waits_of(uint64_t va) {
    std::vector<device::Event> waits;
    memory_->access(va, 8, /*write=*/false, &waits);
    std::vector<uint64_t> ids;
    for (const device::Event& e : waits) ids.push_back(e.id);
    return ids;
  }

  // The session's host-to-device copy: the data is looked at, the write noted, then copied.
  void store(uint64_t va, std::span<const std::byte> data, int gpu) {
    memory_->storing(va, data);
    std::vector<device::Event> waits;
    memory_->access(va, data.size(), /*write=*/true, &waits);
    for (const device::Event& e : waits) ASSERT_OK(device_->wait_event(streams_[gpu], e));
    ASSERT_OK(device_->copy_host_to_device(streams_[gpu], va, data.data(), data.size()));
    ASSERT_OK(device_->synchronize_stream(streams_[gpu]));
  }

  // A write by the function under its lease, noted as the session notes a copy.
  void write(const std::vector<uint8_t>& bytes, int gpu) {
    std::vector<device::Event> waits;
    memory_->access(block_, bytes.size(), /*write=*/true, &waits);
    for (const device::Event& e : waits) ASSERT_OK(device_->wait_event(streams_[gpu], e));
    ASSERT_OK(device_->copy_host_to_device(streams_[gpu], block_, bytes.data(), bytes.size()));
    ASSERT_OK(device_->synchronize_stream(streams_[gpu]));
  }

  std::vector<uint8_t> read(int gpu) {
    std::vector<uint8_t> bytes(kBlockBytes);
    std::vector<device::Event> waits;
    memory_->access(block_, bytes.size(), /*write=*/false, &waits);
    for (const device::Event& e : waits) EXPECT_TRUE(device_->wait_event(streams_[gpu], e).ok());
    EXPECT_TRUE(
        device_->copy_device_to_host(streams_[gpu], bytes.data(), block_, bytes.size()).ok());
    EXPECT_TRUE(device_->synchronize_stream(streams_[gpu]).ok());
    return bytes;
  }

  // The function allocates its block and fills it on `gpu` (before its first request).
  void load_model(int gpu, const std::vector<uint8_t>& bytes) {
    ASSERT_OK(bind(gpu));
    block_ = memory_->va_base();
    ASSERT_OK(memory_->add_block(block_, kBlockBytes, GpuId{gpu}, {}));
    write(bytes, gpu);
    ASSERT_OK(memory_->unbind());
  }

  std::unique_ptr<device::SimDevice> device_;
  std::unique_ptr<DevicePools> pools_;
  std::unique_ptr<ModelRepository> repository_;
  std::shared_ptr<FunctionMemory> memory_;
  std::vector<device::Stream> streams_;
  uint64_t block_ = 0;
  uint64_t leases_ = 0;
};

TEST_F(FunctionMemoryTest, AModelFilledBeforeItsFirstRequestIsWrittenBackOnEvictionAndComesBack) {
  start(/*stateful=*/false);
  const auto model = pattern(1);
  load_model(0, model);
  EXPECT_EQ(memory_->model_bytes(), kBlockBytes);
  // Before the first request the only copy is on GPU 0: eviction writes it to the host first.
  auto freed = memory_->evict(GpuId{0}, streams_[0]);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GE(*freed, kBlockBytes);
  EXPECT_EQ(memory_->placed_bytes(GpuId{0}), 0u);
  EXPECT_EQ(memory_->host_bytes(), kBlockBytes);

  ASSERT_OK(bind(1, scheduler::Source::kHost, -1, /*first_request=*/true));
  EXPECT_TRUE(memory_->model_fixed());
  EXPECT_EQ(read(1), model);
  // A plain function's writes after its first request do not change its model.
  write(pattern(9), 1);
  ASSERT_OK(memory_->unbind());
  ASSERT_TRUE(memory_->evict(GpuId{1}, streams_[1]).ok());
  ASSERT_OK(bind(2));
  EXPECT_EQ(read(2), model);
  ASSERT_OK(memory_->unbind());
}

// A block larger than the pool's largest block (a chunk of 64 MiB here) is placed in pieces,
// mapped back to back at its address: a copy across the pieces' seams reads what was written,
// a peer copy to another GPU and a host copy larger than a repository chunk carry it whole.
TEST_F(FunctionMemoryTest, ABlockLargerThanThePoolsLargestBlockIsPlacedInPiecesAndTravelsWhole) {
  constexpr uint64_t kLarge = 150 * kMiB;
  start(/*stateful=*/false, -1, false, /*function_bytes=*/160 * kMiB,
        /*repository_max=*/512 * kMiB);
  ASSERT_EQ(pools_->pools().stats(0).max_block_bytes, 64 * kMiB);
  // Bounded by the quota (and the smallest GPU's pool: 192 MiB here), not by the chunk.
  EXPECT_EQ(memory_->largest_allocation(), 160 * kMiB);
  std::vector<uint8_t> model(kLarge);
  for (size_t i = 0; i < model.size(); ++i) model[i] = static_cast<uint8_t>(i * 13 + i / 4099);
  auto copy = [&](int gpu, void* host, bool to_device) {
    std::vector<device::Event> waits;
    memory_->access(block_, kLarge, to_device, &waits);
    for (const device::Event& e : waits) ASSERT_OK(device_->wait_event(streams_[gpu], e));
    ASSERT_OK(to_device ? device_->copy_host_to_device(streams_[gpu], block_, host, kLarge)
                        : device_->copy_device_to_host(streams_[gpu], host, block_, kLarge));
    ASSERT_OK(device_->synchronize_stream(streams_[gpu]));
  };
  auto read_on = [&](int gpu) {
    std::vector<uint8_t> back(kLarge);
    copy(gpu, back.data(), false);
    return back;
  };
  ASSERT_OK(bind(0));
  block_ = memory_->va_base();
  ASSERT_OK(memory_->add_block(block_, kLarge, GpuId{0}, {}));
  EXPECT_GE(memory_->placed_bytes(GpuId{0}), kLarge);
  ASSERT_OK(memory_->check_range(block_ + 64 * kMiB - 8, 16, "across the first seam"));
  copy(0, model.data(), true);
  EXPECT_EQ(read_on(0), model);
  ASSERT_OK(memory_->unbind());

  ASSERT_OK(bind(1, scheduler::Source::kPeer, 0));
  EXPECT_EQ(read_on(1), model);
  ASSERT_OK(memory_->unbind());
  memory_->retire_windows();
  // GPU 1's copy goes without a copy back (GPU 0 holds one); GPU 0's is the last, so it is
  // written to the host, into a repository chunk made for it (the chunks are 64 MiB).
  for (int gpu : {1, 0}) {
    Result<uint64_t> evicted = memory_->evict(GpuId{gpu}, streams_[gpu]);
    ASSERT_TRUE(evicted.ok()) << evicted.status();
  }
  EXPECT_EQ(memory_->placed_bytes(GpuId{0}), 0u);
  EXPECT_EQ(memory_->host_bytes(), kLarge);
  ASSERT_OK(bind(2, scheduler::Source::kHost, -1, /*first_request=*/true));
  EXPECT_EQ(read_on(2), model);
  ASSERT_OK(memory_->unbind());
  // Freed under a lease: every piece's mapping and placement goes.
  ASSERT_OK(bind(2));
  ASSERT_OK(memory_->remove_block(block_));
  EXPECT_EQ(memory_->placed_bytes(GpuId{2}), 0u);
  EXPECT_EQ(pools_->pools().function_bytes(FunctionId{1}), 0u);
  ASSERT_OK(memory_->unbind());
}

TEST_F(FunctionMemoryTest, ALeaseOfSeveralGpusIsRefusedAndBindsNothing) {
  start(/*stateful=*/false);
  const auto model = pattern(3);
  load_model(0, model);
  Lease lease{.id = RequestId{++leases_}};
  lease.gpus.insert(GpuId{1});
  lease.gpus.insert(GpuId{2});
  const Status refused =
      memory_->bind(lease, streams_[1], [](const Status&, const SwapReport&) {}, {});
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidValue) << refused;
  EXPECT_EQ(memory_->placed_bytes(GpuId{1}), 0u);
  EXPECT_EQ(memory_->placed_bytes(GpuId{2}), 0u);
  // Nothing is bound: a lease of one GPU works next.
  ASSERT_OK(bind(1));
  EXPECT_EQ(read(1), model);
  ASSERT_OK(memory_->unbind());
}

TEST_F(FunctionMemoryTest, AStatefulFunctionsCopyWrittenElsewhereIsStaleAndNeverASource) {
  start(/*stateful=*/true);
  const auto first = pattern(1);
  const auto second = pattern(2);
  load_model(0, first);
  ASSERT_OK(bind(1, scheduler::Source::kPeer, 0, /*first_request=*/true));
  EXPECT_EQ(read(1), first);
  write(second, 1);  // GPU 0's copy is stale now
  ASSERT_OK(memory_->unbind());
  // GPU 0 still holds a placement, but not the function's bytes: they must come from GPU 1.
  EXPECT_GT(memory_->placed_bytes(GpuId{0}), 0u);
  ASSERT_OK(bind(0, scheduler::Source::kPeer, 0));
  EXPECT_EQ(read(0), second);
  ASSERT_OK(memory_->unbind());
  // Evicting GPU 0 writes the state back; GPU 1's copy is as new, so nothing is lost either way.
  ASSERT_TRUE(memory_->evict(GpuId{0}, streams_[0]).ok());
  ASSERT_TRUE(memory_->evict(GpuId{1}, streams_[1]).ok());
  ASSERT_OK(bind(3));
  EXPECT_EQ(read(3), second);
  ASSERT_OK(memory_->unbind());
}

TEST_F(FunctionMemoryTest, AFailedSwapLeavesItsTargetInvalidAndTheNextSwapRefillsIt) {
  start(/*stateful=*/false, /*failing_gpu=*/2);
  const auto model = pattern(3);
  load_model(0, model);
  ASSERT_OK(bind(1, scheduler::Source::kHost, -1, /*first_request=*/true));  // the host copy
  ASSERT_OK(memory_->unbind());
  ASSERT_TRUE(memory_->evict(GpuId{0}, streams_[0]).ok());
  ASSERT_TRUE(memory_->evict(GpuId{1}, streams_[1]).ok());

  const Status failed = bind(2);
  EXPECT_FALSE(failed.ok());
  (void)device_->synchronize_stream(streams_[2]);
  ASSERT_OK(memory_->unbind());
  // GPU 2's placement holds nothing valid: a later swap onto GPU 3 may not copy from it, and
  // GPU 3 gets the model from the host.
  ASSERT_OK(bind(3, scheduler::Source::kPeer, 2));
  EXPECT_EQ(read(3), model);
  ASSERT_OK(memory_->unbind());
  memory_->forget(GpuId{2});
  EXPECT_EQ(memory_->placed_bytes(GpuId{2}), 0u);
}

// Pipelining: a kernel waits only for the swap groups its arguments point into. A block that
// holds pointers to the function's blocks (an array of weight pointers for a batched GEMM, say)
// lets a kernel reach blocks its arguments do not name: its users wait for the whole swap.
TEST_F(FunctionMemoryTest, UsersOfAPointerTableWaitForTheWholeSwap) {
  start(/*stateful=*/false, -1, /*slow_link=*/true);
  ASSERT_OK(bind(0));
  // In order of first use, so the swap moves them in this order, one 2 MiB group each for the
  // tables and three for the weights: tables in groups 0 and 1, the weights' end in group 4.
  const uint64_t table = memory_->va_base();
  const uint64_t plain = table + 2 * kMiB;
  const uint64_t weights = table + 4 * kMiB;
  ASSERT_OK(memory_->add_block(table, 2 * kMiB, GpuId{0}, {}));
  ASSERT_OK(memory_->add_block(plain, 2 * kMiB, GpuId{0}, {}));
  ASSERT_OK(memory_->add_block(weights, kBlockBytes, GpuId{0}, {}));
  const std::vector<uint64_t> pointers = {weights, weights + 2 * kMiB, weights + 4 * kMiB};
  const std::vector<float> numbers(1024, 0.5f);
  store(table, std::as_bytes(std::span(pointers)), 0);
  store(plain, std::as_bytes(std::span(numbers)), 0);
  const auto model = pattern(4);
  store(weights, std::as_bytes(std::span(model)), 0);
  ASSERT_OK(memory_->unbind());
  ASSERT_TRUE(
      memory_->evict(GpuId{0}, streams_[0]).ok());  // written back: the host copy is the model

  std::future<Status> swap = start_bind(1);
  // A block waits for the group that completes it: the weights for the last one.
  const std::vector<uint64_t> last_group = waits_of(weights);
  ASSERT_EQ(last_group.size(), 1u) << "the swap (about 200 ms) ended before it was looked at";
  EXPECT_EQ(waits_of(table), last_group) << "a user of the pointer table waits for everything";
  const std::vector<uint64_t> plain_group = waits_of(plain);
  ASSERT_EQ(plain_group.size(), 1u);
  EXPECT_NE(plain_group, last_group) << "a block of plain numbers waits for its own group only";
  // What a kernel given the table reads through it, after waiting as told, is the model.
  std::vector<device::Event> waits;
  memory_->access(table, 8, /*write=*/false, &waits);
  for (const device::Event& e : waits) ASSERT_OK(device_->wait_event(streams_[1], e));
  std::vector<uint8_t> reached(kBlockBytes);
  ASSERT_OK(device_->copy_device_to_host(streams_[1], reached.data(), weights, kBlockBytes));
  ASSERT_OK(device_->synchronize_stream(streams_[1]));
  EXPECT_EQ(reached, model);
  ASSERT_OK(swap.get());
  ASSERT_OK(memory_->unbind());
}

}  // namespace
}  // namespace hiber::server
