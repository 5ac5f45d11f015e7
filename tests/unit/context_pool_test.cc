// ContextPool: in context mode each instance gets a fresh context of its own per GPU, made ahead
// where it can be, and destroyed once given back; in shared mode every instance gets the GPU's
// shared context, which is never destroyed.
#include "server/context_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <thread>

#include "server/device/sim_device.h"

namespace hiber::server {
namespace {

std::unique_ptr<device::SimDevice> make_device() {
  device::SimDeviceOptions options;
  for (GpuSpec& gpu : options.node.gpus) gpu.memory_bytes = 64 << 20;
  auto device = device::SimDevice::create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? std::move(device).value() : nullptr;
}

// Waits (up to a minute, for a loaded machine) until `done` holds.
template <typename Done>
bool eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ContextPool, ParsesTheTwoModesAndRefusesOthers) {
  EXPECT_EQ(*parse_isolation("context"), Isolation::kContext);
  EXPECT_EQ(*parse_isolation("shared"), Isolation::kShared);
  Result<Isolation> bad = parse_isolation("process");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("context"), std::string::npos) << bad.status();
  EXPECT_EQ(isolation_name(Isolation::kShared), "shared");
}

TEST(ContextPool, EachInstanceGetsAFreshContextThatIsDestroyedWhenGivenBack) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  ContextPool pool(*device, Isolation::kContext, /*ready_per_gpu=*/2);
  // Made ahead, on every GPU.
  ASSERT_TRUE(eventually([&] {
    return pool.stats().created >= 2u * static_cast<uint64_t>(device->gpu_count());
  })) << "created "
      << pool.stats().created;

  std::set<uint64_t> ids;
  std::vector<device::Context> taken;
  for (int i = 0; i < 5; ++i) {  // more than are ready: the rest are made on demand
    Result<device::Context> c = pool.take(1);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->gpu, 1);
    EXPECT_NE(*c, device->shared_context(1));
    EXPECT_TRUE(ids.insert(c->id).second) << "each instance gets its own";
    taken.push_back(*c);
  }
  const ContextPoolStats after_take = pool.stats();
  EXPECT_EQ(after_take.taken_ready + after_take.taken_made, 5u);
  EXPECT_GE(after_take.taken_ready, 2u);

  // A context is a real one: streams in it work.
  Result<device::Stream> s = device->create_stream(taken[0], 0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->context, taken[0].id);
  ASSERT_TRUE(device->destroy_stream(*s).ok());

  for (const device::Context& c : taken) pool.give_back(c);
  ASSERT_TRUE(eventually([&] { return pool.stats().destroyed >= 5u; }));
  for (const device::Context& c : taken) {
    EXPECT_EQ(device->context_status(c).code(), ErrorCode::kInvalidContext)
        << "a context given back is never handed out again";
  }
  EXPECT_EQ(pool.take(device->gpu_count()).status().code(), ErrorCode::kInvalidDevice);
}

TEST(ContextPool, SharedModeHandsOutTheGpusSharedContext) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  ContextPool pool(*device, Isolation::kShared, /*ready_per_gpu=*/2);
  Result<device::Context> a = pool.take(0), b = pool.take(0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, device->shared_context(0));
  EXPECT_EQ(*b, *a);
  pool.give_back(*a);
  EXPECT_TRUE(device->context_status(*a).ok()) << "the shared context stays";
  EXPECT_EQ(pool.stats().created, 0u);
}

}  // namespace
}  // namespace hiber::server
