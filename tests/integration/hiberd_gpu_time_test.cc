// No GPU held forever (issue 18, items 3 and 6), against a real hiberd on one simulated GPU with
// clients in this process:
//   - a function whose kernel never ends gets CUDA_ERROR_LAUNCH_TIMEOUT after the kernel deadline,
//     and every later call of it fails the same way, while another function's work on the same
//     GPU completes with correct results;
//   - a function that keeps its implicit lease busy without a pause does not keep the GPU from
//     another function: the lease slice hands the GPU over, and both compute correct results.
// Every result is compared with the same computation on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/hiberd_harness.h"
#include "tests/kernels/test_kernels.h"
#include "wire/call_client.h"

namespace hiber::testing {
namespace {

namespace proto = wire::proto;

std::unique_ptr<wire::CallClient> connect(const Hiberd& hiberd, const std::string& function) {
  auto client = hiberd.connect(function);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

Status allocate(wire::CallClient& c, uint64_t va, uint64_t bytes) {
  return c.enqueue([&](proto::Call::Builder call) {
    auto a = call.initMemAllocate();
    a.setVa(va);
    a.setBytes(bytes);
  });
}

Status memset32(wire::CallClient& c, uint64_t dst, uint32_t value, uint64_t words) {
  return c.enqueue([&](proto::Call::Builder call) {
    auto m = call.initMemset();
    m.setDst(dst);
    m.setValue(value);
    m.setElementBytes(4);
    m.setCount(words);
  });
}

Status upload(wire::CallClient& c, uint64_t dst, const void* src, uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto staged, c.stage(bytes));
  std::memcpy(staged.bytes.data(), src, bytes);
  return c.enqueue([&](proto::Call::Builder call) {
    auto m = call.initMemcpyHtoD();
    m.setDst(dst);
    m.setSrcOffset(staged.offset);
    m.setBytes(bytes);
    m.setStagingEnd(staged.staging_end);
  });
}

// Waits for the copy: a synchronisation, which reports the session's sticky error.
Status download(wire::CallClient& c, void* dst, uint64_t src, uint64_t bytes) {
  HIBER_ASSIGN_OR_RETURN(auto staged, c.stage(bytes));
  HIBER_RETURN_IF_ERROR(c.call([&](proto::Call::Builder call) {
                           auto m = call.initMemcpyDtoH();
                           m.setDstOffset(staged.offset);
                           m.setSrc(src);
                           m.setBytes(bytes);
                           m.setStagingEnd(staged.staging_end);
                         }).status());
  std::memcpy(dst, staged.bytes.data(), bytes);
  return Status();
}

// One round of checked work: random bytes up, a device-to-device copy, a memset over part of
// it, and the result back, compared with the host doing the same.
void check_round(wire::CallClient& c, uint64_t a, uint64_t b, uint64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> host(bytes), back(bytes);
  for (auto& x : host) x = static_cast<uint8_t>(rng());
  ASSERT_TRUE(upload(c, a, host.data(), bytes).ok());
  ASSERT_TRUE(c.enqueue([&](proto::Call::Builder call) {
                 auto m = call.initMemcpyDtoD();
                 m.setDst(b);
                 m.setSrc(a);
                 m.setBytes(bytes);
               }).ok());
  const uint32_t pattern = 0xA5000000u | seed;
  ASSERT_TRUE(memset32(c, b, pattern, bytes / 16).ok());
  for (uint64_t w = 0; w < bytes / 16; ++w) std::memcpy(host.data() + w * 4, &pattern, 4);
  const Status got = download(c, back.data(), b, bytes);
  ASSERT_TRUE(got.ok()) << got;
  EXPECT_EQ(back, host) << "round " << seed;
}

// Loads the test kernels and launches spin_until(stop), which ends only when *stop != 0.
Status launch_spinner(wire::CallClient& c, uint64_t stop) {
  const std::vector<std::byte> image = read_bytes(kernels_fatbin_path());
  HIBER_ASSIGN_OR_RETURN(auto staged, c.stage(image.size()));
  std::memcpy(staged.bytes.data(), image.data(), image.size());
  HIBER_RETURN_IF_ERROR(c.enqueue([&](proto::Call::Builder call) {
    auto m = call.initModuleLoad();
    m.setModule(1);
    m.setImageOffset(staged.offset);
    m.setImageBytes(image.size());
    m.setStagingEnd(staged.staging_end);
  }));
  HIBER_RETURN_IF_ERROR(c.call([&](proto::Call::Builder call) {
                           auto f = call.initFunctionGet();
                           f.setFunction(2);
                           f.setModule(1);
                           f.setName(test_kernels::kSpinUntil);
                         }).status());
  return c.enqueue([&](proto::Call::Builder call) {
    auto l = call.initLaunchKernel();
    l.setFunction(2);
    l.setGridX(1);
    l.setGridY(1);
    l.setGridZ(1);
    l.setBlockX(1);
    l.setBlockY(1);
    l.setBlockZ(1);
    l.setParams(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(&stop), sizeof stop));
  });
}

TEST(GpuTime, AKernelPastItsDeadlineFailsItsFunctionAndFreesTheGpuForOthers) {
  if (kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit: no fatbin";
  Hiberd hiberd({"--node_config=" + one_gpu_node_config(16), "--kernel_deadline_ms=300"});
  auto runaway = connect(hiberd, "runaway");
  auto neighbour = connect(hiberd, "neighbour");
  ASSERT_TRUE(runaway && neighbour);
  constexpr uint64_t kBytes = 64 << 10;

  const uint64_t stop = runaway->session().grant.va_base;
  ASSERT_TRUE(allocate(*runaway, stop, 4096).ok());
  ASSERT_TRUE(memset32(*runaway, stop, 0, 1024).ok());
  ASSERT_TRUE(launch_spinner(*runaway, stop).ok());
  ASSERT_TRUE(runaway->flush().ok());

  // The neighbour's work runs on the same (only) GPU once the runaway kernel is stopped.
  std::thread other([&] {
    const uint64_t a = neighbour->session().grant.va_base;
    const uint64_t b = a + (2 << 20);
    ASSERT_TRUE(allocate(*neighbour, a, kBytes).ok());
    ASSERT_TRUE(allocate(*neighbour, b, kBytes).ok());
    for (uint32_t round = 1; round <= 3; ++round) check_round(*neighbour, a, b, kBytes, round);
  });

  uint32_t value = 0;
  const Status stopped = download(*runaway, &value, stop, sizeof value);
  EXPECT_EQ(stopped.code(), ErrorCode::kLaunchTimeout) << stopped;
  EXPECT_NE(stopped.message().find("deadline of 300 ms"), std::string::npos) << stopped;
  other.join();

  // Sticky: every later call of the runaway function fails the same way, with the reason.
  (void)runaway->take_error();
  ASSERT_TRUE(memset32(*runaway, stop, 1, 1).ok()) << "enqueued; it fails when executed";
  const Status later = download(*runaway, &value, stop, sizeof value);
  EXPECT_EQ(later.code(), ErrorCode::kLaunchTimeout) << later;
  EXPECT_NE(later.message().find("every later call fails"), std::string::npos) << later;
  EXPECT_EQ(runaway->ping().code(), ErrorCode::kLaunchTimeout);

  // And the node goes on serving: the neighbour once more, and a function that connects now.
  const uint64_t a = neighbour->session().grant.va_base;
  check_round(*neighbour, a, a + (2 << 20), kBytes, 9);
  auto late = connect(hiberd, "late");
  ASSERT_TRUE(late);
  const uint64_t la = late->session().grant.va_base;
  ASSERT_TRUE(allocate(*late, la, kBytes).ok());
  ASSERT_TRUE(allocate(*late, la + (2 << 20), kBytes).ok());
  check_round(*late, la, la + (2 << 20), kBytes, 10);
  EXPECT_NE(hiberd.log().find("CUDA_ERROR_LAUNCH_TIMEOUT"), std::string::npos) << hiberd.log();
}

TEST(GpuTime, ABusyImplicitLeaseSharesTheOnlyGpuWithAnotherFunction) {
  // An idle implicit lease would go back after 30 s only: a busy one, on a loaded machine too,
  // keeps its GPU unless the slice takes it.
  Hiberd hiberd({"--node_config=" + one_gpu_node_config(16), "--lease_slice_ms=20",
                 "--implicit_lease_idle_us=30000000"});
  auto busy = connect(hiberd, "busy");
  auto other = connect(hiberd, "other");
  ASSERT_TRUE(busy && other);
  constexpr uint64_t kBytes = 64 << 10;
  // Without preemption the other function would wait for all of these.
  constexpr uint32_t kBusyRounds = 20000;

  std::atomic<bool> other_done{false};
  std::atomic<uint32_t> busy_rounds{0};
  uint32_t rounds_when_done = 0;
  std::thread hog([&] {
    const uint64_t buffer = busy->session().grant.va_base;
    ASSERT_TRUE(allocate(*busy, buffer, kBytes).ok());
    std::vector<uint32_t> back(kBytes / 4);
    // Its lease never idles: every round is a memset and a synchronous copy back, checked.
    uint32_t round = 1;
    for (; round <= kBusyRounds && !other_done.load(); ++round) {
      ASSERT_TRUE(memset32(*busy, buffer, round, kBytes / 4).ok());
      const Status got = download(*busy, back.data(), buffer, kBytes);
      ASSERT_TRUE(got.ok()) << got;
      ASSERT_TRUE(std::all_of(back.begin(), back.end(), [&](uint32_t v) { return v == round; }))
          << "round " << round;
      busy_rounds.store(round);
    }
    rounds_when_done = round;
  });

  // The other function starts once the busy one holds the GPU.
  while (busy_rounds.load() < 10) std::this_thread::yield();
  const uint64_t a = other->session().grant.va_base;
  const uint64_t b = a + (2 << 20);
  ASSERT_TRUE(allocate(*other, a, kBytes).ok());
  ASSERT_TRUE(allocate(*other, b, kBytes).ok());
  for (uint32_t round = 1; round <= 5; ++round) check_round(*other, a, b, kBytes, round);
  other_done.store(true);
  hog.join();
  EXPECT_LT(rounds_when_done, kBusyRounds)
      << "the other function was served only after the busy one stopped on its own";
  EXPECT_TRUE(busy->take_error().ok());
  EXPECT_TRUE(other->take_error().ok());
}

}  // namespace
}  // namespace hiber::testing
