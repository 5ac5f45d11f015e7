// The swap engine on the simulated device: bytes from a host copy and from another GPU's replica
// arrive intact, in groups of the elbow size with an event after each; each transfer names the
// group holding its last byte, and the end of the swap is reported with what it moved.
#include "server/swap_engine.h"

#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "server/device/sim_device.h"
#include "tests/unit/sim_device_for_test.h"

namespace hiber::server {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class SwapEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = hiber::testing::sim_device_for_test(64 * kMiB);
    ASSERT_NE(device_, nullptr);
    for (int g = 0; g < 2; ++g) {
      auto stream = device_->create_stream(g, 0);
      ASSERT_TRUE(stream.ok()) << stream.status();
      streams_.push_back(*stream);
    }
  }
  void TearDown() override {
    for (const auto& [va, bytes] : mapped_) {
      (void)device_->unmap(va, bytes);
      (void)device_->free_address_range(va, bytes);
    }
    for (device::PhysicalMemory m : physical_) (void)device_->release_physical(m);
    for (device::Stream s : streams_) (void)device_->destroy_stream(s);
  }

  // `bytes` of memory on `gpu`, mapped at an address of its own.
  device::DevicePtr allocate(int gpu, uint64_t bytes) {
    auto va = device_->reserve_address_range(bytes, 2 * kMiB);
    EXPECT_TRUE(va.ok()) << va.status();
    auto memory = device_->create_physical(gpu, bytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    EXPECT_TRUE(device_->map(*va, bytes, *memory, 0).ok());
    const int gpus[] = {0, 1};
    EXPECT_TRUE(device_->set_access(*va, bytes, gpus).ok());
    physical_.push_back(*memory);
    mapped_.emplace_back(*va, bytes);
    return *va;
  }
  std::vector<std::byte> read(int gpu, device::DevicePtr va, uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    EXPECT_TRUE(device_->copy_device_to_host(streams_[gpu], out.data(), va, bytes).ok());
    EXPECT_TRUE(device_->synchronize_stream(streams_[gpu]).ok());
    return out;
  }
  static std::vector<std::byte> pattern(uint64_t bytes, uint8_t seed) {
    std::vector<std::byte> out(bytes);
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::byte(static_cast<uint8_t>(i * 13 + seed));
    return out;
  }

  std::unique_ptr<device::SimDevice> device_;
  std::vector<device::Stream> streams_;
  std::vector<device::PhysicalMemory> physical_;
  std::vector<std::pair<device::DevicePtr, uint64_t>> mapped_;
};

TEST_F(SwapEngineTest, MovesHostAndPeerBytesInGroupsAndReportsTheEnd) {
  // Target blocks on GPU 0: 5 MiB and 1 MiB from host copies, 2 MiB from GPU 1's replica.
  const device::DevicePtr a = allocate(0, 6 * kMiB);
  const device::DevicePtr b = allocate(0, 2 * kMiB);
  const device::DevicePtr c = allocate(0, 2 * kMiB);
  const device::DevicePtr replica = allocate(1, 2 * kMiB);
  const std::vector<std::byte> host_a = pattern(5 * kMiB, 1);
  const std::vector<std::byte> host_b = pattern(1 * kMiB, 2);
  const std::vector<std::byte> peer = pattern(2 * kMiB, 3);
  ASSERT_TRUE(device_->copy_host_to_device(streams_[1], replica, peer.data(), peer.size()).ok());
  ASSERT_TRUE(device_->synchronize_stream(streams_[1]).ok());

  SwapEngine engine(*device_, 2, 2 * kMiB);
  EXPECT_TRUE(engine.complete()) << "no swap yet";
  const std::vector<SwapEngine::Transfer> transfers = {
      {.dst = a, .bytes = 5 * kMiB, .host = host_a.data()},
      {.dst = b, .bytes = 1 * kMiB, .host = host_b.data()},
      {.dst = c, .bytes = 2 * kMiB, .from_gpu = 1, .from_va = replica},
  };
  Result<std::vector<int32_t>> groups = engine.start(0, streams_[0], transfers);
  ASSERT_TRUE(groups.ok()) << groups.status();
  // 2 MiB groups: a fills groups 0, 1 and half of 2; b ends group 2; c is group 3.
  EXPECT_EQ(*groups, (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(engine.groups(), 4);

  std::promise<std::pair<Status, SwapReport>> ended;
  ASSERT_TRUE(engine
                  .report_end(streams_[0],
                              [&](const Status& s, const SwapReport& r) {
                                ended.set_value({s, r});
                              })
                  .ok());
  const auto [status, report] = ended.get_future().get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(report.bytes, 8 * kMiB);
  EXPECT_EQ(report.groups, 4u);
  EXPECT_GT(report.duration_ns, 0);
  EXPECT_TRUE(engine.complete());
  EXPECT_FALSE(engine.failed());
  for (int32_t g = 0; g < engine.groups(); ++g) {
    EXPECT_TRUE(device_->query_event(engine.group_event(0, g)).ok()) << "group " << g;
  }
  EXPECT_EQ(read(0, a, host_a.size()), host_a);
  EXPECT_EQ(read(0, b, host_b.size()), host_b);
  EXPECT_EQ(read(0, c, peer.size()), peer);
}

TEST_F(SwapEngineTest, WithoutGroupBytesEachBlockIsAGroup) {
  const device::DevicePtr a = allocate(0, 4 * kMiB);
  const device::DevicePtr b = allocate(0, 2 * kMiB);
  const std::vector<std::byte> host = pattern(4 * kMiB, 4);
  SwapEngine engine(*device_, 2, 0);
  const std::vector<SwapEngine::Transfer> transfers = {
      {.dst = a, .bytes = 4 * kMiB, .host = host.data()},
      {.dst = b, .bytes = 2 * kMiB, .host = host.data()},
  };
  Result<std::vector<int32_t>> groups = engine.start(0, streams_[0], transfers);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(*groups, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(engine.groups(), 2);
  ASSERT_TRUE(device_->synchronize_stream(streams_[0]).ok());
  EXPECT_EQ(read(0, a, host.size()), host);
}

TEST_F(SwapEngineTest, AnEmptySwapIsCompleteAtOnceAndAFailedOneSaysSo) {
  SwapEngine engine(*device_, 2, 2 * kMiB);
  Result<std::vector<int32_t>> none = engine.start(0, streams_[0], {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(engine.complete());
  EXPECT_EQ(engine.groups(), 0);
  // A copy into memory that is not mapped is refused when it is enqueued or when it runs.
  const std::vector<std::byte> host = pattern(2 * kMiB, 5);
  const std::vector<SwapEngine::Transfer> bad = {
      {.dst = 0x10000, .bytes = 2 * kMiB, .host = host.data()}};
  Result<std::vector<int32_t>> started = engine.start(0, streams_[0], bad);
  if (!started.ok()) {
    EXPECT_TRUE(engine.complete());
    EXPECT_TRUE(engine.failed());
    return;
  }
  std::promise<Status> ended;
  ASSERT_TRUE(
      engine
          .report_end(streams_[0], [&](const Status& s, const SwapReport&) { ended.set_value(s); })
          .ok());
  EXPECT_FALSE(ended.get_future().get().ok());
  EXPECT_TRUE(engine.complete());
  EXPECT_TRUE(engine.failed());
}

}  // namespace
}  // namespace hiber::server
