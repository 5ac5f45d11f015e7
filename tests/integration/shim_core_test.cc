// The shim's client core in-process against a real hiberd: the flush policy (N calls, B bytes,
// T microseconds of quiet), the quota checked at the call, sticky asynchronous errors, modules
// loaded through the content-hash cache, and kernels run with layouts the client parsed itself.
//
// The core is a per-process singleton configured from the environment, so ctest runs this
// binary three times, each run's filter picking its tests: HIBER_BATCH_CALLS=8 (the N tests)
// and HIBER_BATCH_BYTES=1024 with N large (the B test), both with T = 10 minutes, so whatever
// is sent was sent by N or B however slow the machine; and T = 2 s (the T test), which checks
// that a stranded call goes out, and not before T.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "client_shim/client.h"
#include "tests/integration/hiberd_harness.h"

namespace hiber::shim {
namespace {

using namespace std::chrono_literals;
using testing::Hiberd;

Hiberd* hiberd = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    hiberd = new Hiberd({"--default_quota_mib=64", "--max_quota_mib=64"});
    setenv("HIBER_RUN_DIR", hiberd->run_dir().c_str(), 1);
    setenv("HIBER_FUNCTION_ID", "shim-core-test", 1);
    if (getenv("HIBER_BATCH_QUIET_US") == nullptr) setenv("HIBER_BATCH_QUIET_US", "600000000", 1);
  }
  void TearDown() override {
    delete hiberd;
    hiberd = nullptr;
  }
};

// Calls hiberd has received from this process's session.
uint64_t server_calls() {
  auto view = hiberd->status();
  if (!view.ok()) return ~uint64_t{0};
  for (const auto& s : view->sessions) {
    if (s.pid == getpid()) return s.calls;
  }
  return 0;
}

uint64_t wait_for_calls(uint64_t at_least, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint64_t calls = server_calls();
  while (calls < at_least && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    calls = server_calls();
  }
  return calls;
}

Client& client() {
  Client& c = Client::get();
  EXPECT_TRUE(c.ready().ok()) << c.ready().message();
  return c;
}

uint64_t device_buffer(uint64_t bytes) {
  auto p = client().malloc_device(bytes);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : 0;
}

TEST(FlushByCalls, NthCallSendsTheBatch) {
  ASSERT_EQ(client().config().batch_calls, 8u);
  const uint64_t buffer = device_buffer(4096);
  ASSERT_TRUE(client().synchronize_device().ok());  // everything so far is sent and done
  const uint64_t before = server_calls();
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(client().memset(buffer, i, 1, 64, nullptr, true).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(server_calls(), before) << "7 calls of a batch of 8 were sent before the quiet time";
  ASSERT_TRUE(client().memset(buffer, 7, 1, 64, nullptr, true).ok());
  EXPECT_GE(wait_for_calls(before + 8, 30s), before + 8) << "the 8th call did not send the batch";
  ASSERT_TRUE(client().free_device(buffer).ok());
}

TEST(FlushByQuiet, AStrandedCallIsSentAfterTheQuietTime) {
  const auto quiet = std::chrono::microseconds(client().config().quiet_us);
  ASSERT_EQ(quiet, 2s);
  const uint64_t buffer = device_buffer(4096);
  ASSERT_TRUE(client().synchronize_device().ok());
  const uint64_t before = server_calls();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client().memset(buffer, 1, 1, 64, nullptr, true).ok());
  // Nobody synchronises: the background flusher must send it after T of quiet, and not before.
  EXPECT_GE(wait_for_calls(before + 1, 60s), before + 1);
  EXPECT_GE(std::chrono::steady_clock::now() - start, quiet);
  ASSERT_TRUE(client().free_device(buffer).ok());
}

TEST(FlushByBytes, BatchOverBBytesIsSent) {
  ASSERT_EQ(client().config().batch_bytes, 1024u);
  ASSERT_GT(client().config().batch_calls, 1000u);
  const uint64_t buffer = device_buffer(4096);
  ASSERT_TRUE(client().synchronize_device().ok());
  const uint64_t before = server_calls();
  // A memset takes well under 1 KiB; 64 of them cannot stay under it.
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(client().memset(buffer, i, 1, 64, nullptr, true).ok());
  EXPECT_GE(wait_for_calls(before + 8, 30s), before + 8) << "no batch went out at B bytes";
  ASSERT_TRUE(client().free_device(buffer).ok());
}

TEST(FlushByCalls, QuotaIsCheckedAtTheCall) {
  const MemoryInfo info = client().memory_info();
  EXPECT_EQ(info.total_bytes, 64u << 20);
  auto too_big = client().malloc_device(info.total_bytes + 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), ErrorCode::kOutOfMemory);
  // Filling the quota with large allocations works; one byte more does not.
  std::vector<uint64_t> blocks;
  while (true) {
    auto p = client().malloc_device(8 << 20);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), ErrorCode::kOutOfMemory);
      break;
    }
    blocks.push_back(*p);
  }
  EXPECT_FALSE(blocks.empty());
  for (uint64_t b : blocks) ASSERT_TRUE(client().free_device(b).ok());
  EXPECT_EQ(client().memory_info().free_bytes, info.free_bytes);
  EXPECT_TRUE(client().synchronize_device().ok());
}

TEST(FlushByCalls, SmallAllocationsShareSlabsAndAreChecked) {
  const uint64_t a = device_buffer(100), b = device_buffer(100);
  EXPECT_EQ(b - a, 256u);  // packed, at cudaMalloc's alignment
  EXPECT_FALSE(client().memset(a, 0, 1, 257, nullptr, true).ok());  // past the allocation
  EXPECT_FALSE(client().free_device(a + 16).ok());
  ASSERT_TRUE(client().free_device(a).ok());
  EXPECT_FALSE(client().free_device(a).ok());  // twice
  ASSERT_TRUE(client().free_device(b).ok());
  EXPECT_TRUE(client().synchronize_device().ok());
}

TEST(FlushByCalls, KernelsRunWithLayoutsTheClientParsed) {
  if (testing::kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit";
  const std::vector<std::byte> image = testing::read_bytes(testing::kernels_fatbin_path());
  ASSERT_FALSE(image.empty());
  auto module = client().load_module(image);
  ASSERT_TRUE(module.ok()) << module.status().message();
  auto kernel = client().module_function(*module, "_Z7vec_addPKfS0_Pfi");
  ASSERT_TRUE(kernel.ok()) << kernel.status().message();
  auto info = client().kernel_info(*kernel);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ((*info)->params.size(), 4u);

  constexpr int n = 1000;
  std::vector<float> x(n), y(n), out(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<float>(3 * i);
  }
  uint64_t a = device_buffer(n * 4), b = device_buffer(n * 4), c = device_buffer(n * 4);
  ASSERT_TRUE(client()
                  .memcpy(reinterpret_cast<void*>(a), x.data(), n * 4, CopyKind::kHostToDevice,
                          nullptr, false)
                  .ok());
  ASSERT_TRUE(client()
                  .memcpy(reinterpret_cast<void*>(b), y.data(), n * 4, CopyKind::kHostToDevice,
                          nullptr, false)
                  .ok());
  int count = n;
  void* args[] = {&a, &b, &c, &count};
  ASSERT_TRUE(
      client().launch(*kernel, {(n + 127) / 128, 1, 1}, {128, 1, 1}, 0, nullptr, args).ok());
  ASSERT_TRUE(client()
                  .memcpy(out.data(), reinterpret_cast<void*>(c), n * 4, CopyKind::kDeviceToHost,
                          nullptr, false)
                  .ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] + y[i]) << i;

  // A second load of the same image is found by its hash in hiberd.
  auto again = client().load_module(image);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(client().unload_module(*again).ok());
  EXPECT_TRUE(client().unload_module(*module).ok());
  for (uint64_t p : {a, b, c}) EXPECT_TRUE(client().free_device(p).ok());
  EXPECT_TRUE(client().synchronize_device().ok());
}

TEST(FlushByCalls, PinnedHostMemoryLivesInTheArena) {
  auto pinned = client().malloc_host(1 << 20);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(client().classify(*pinned).kind, PointerKind::kArena);
  std::vector<char> pageable(4096);
  EXPECT_EQ(client().classify(pageable.data()).kind, PointerKind::kHost);
  EXPECT_FALSE(client().classify(pageable.data()).pinned);
  ASSERT_TRUE(client().register_host(pageable.data(), pageable.size()).ok());
  EXPECT_TRUE(client().classify(pageable.data() + 100).pinned);
  EXPECT_FALSE(client().register_host(pageable.data(), 16).ok());
  ASSERT_TRUE(client().unregister_host(pageable.data()).ok());

  // Round trip through the device with async copies from and to pinned memory.
  auto* bytes = static_cast<unsigned char*>(*pinned);
  for (int i = 0; i < (1 << 20); ++i) bytes[i] = static_cast<unsigned char>(i * 7);
  const uint64_t d = device_buffer(1 << 20);
  auto stream = client().create_stream(0, 0);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(client()
                  .memcpy(reinterpret_cast<void*>(d), bytes, 1 << 19, CopyKind::kHostToDevice,
                          *stream, true)
                  .ok());
  ASSERT_TRUE(client()
                  .memcpy(bytes + (1 << 19), reinterpret_cast<void*>(d), 1 << 19,
                          CopyKind::kDeviceToHost, *stream, true)
                  .ok());
  ASSERT_TRUE(client().synchronize_stream(*stream).ok());
  for (int i = 0; i < (1 << 19); ++i)
    ASSERT_EQ(bytes[(1 << 19) + i], static_cast<unsigned char>(i * 7)) << i;
  EXPECT_TRUE(client().destroy_stream(*stream).ok());
  EXPECT_TRUE(client().free_device(d).ok());
  Status freed = client().free_host(*pinned);
  EXPECT_TRUE(freed.ok()) << freed.message();
  EXPECT_FALSE(client().free_host(*pinned).ok());
}

TEST(FlushByCalls, ResetFreesEverythingAndCodeLoadsAgain) {
  if (testing::kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit";
  auto module = client().load_module(testing::read_bytes(testing::kernels_fatbin_path()));
  ASSERT_TRUE(module.ok()) << module.status().message();
  auto kernel = client().module_function(*module, "_Z7vec_addPKfS0_Pfi");
  ASSERT_TRUE(kernel.ok());
  const uint64_t big = device_buffer(8 << 20);
  ASSERT_NE(big, 0u);
  ASSERT_NE(device_buffer(100), 0u);
  auto stream = client().create_stream(0, 0);
  ASSERT_TRUE(stream.ok());
  auto event = client().create_event(0);
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE(client().record_event(*event, *stream).ok());

  ASSERT_TRUE(client().reset_device().ok());
  const MemoryInfo info = client().memory_info();
  EXPECT_EQ(info.free_bytes, info.total_bytes);
  EXPECT_EQ(client().stream(*stream).status().code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(client().event(*event).status().code(), ErrorCode::kInvalidHandle);
  auto view = hiberd->wait_for(
      [](const testing::StatusView& v) {
        for (const auto& s : v.sessions) {
          if (s.pid == getpid()) return s.allocated_bytes == 0;
        }
        return false;
      },
      5s);
  ASSERT_TRUE(view.ok());
  for (const auto& s : view->sessions) {
    if (s.pid == getpid()) {
      EXPECT_EQ(s.allocated_bytes, 0u);
    }
  }

  // The module loads again at the next launch, and the kernel computes the right thing.
  constexpr int n = 256;
  std::vector<float> x(n, 1.5f), y(n, 2.25f), out(n);
  uint64_t a = device_buffer(n * 4), b = device_buffer(n * 4), c = device_buffer(n * 4);
  ASSERT_TRUE(client()
                  .memcpy(reinterpret_cast<void*>(a), x.data(), n * 4, CopyKind::kHostToDevice,
                          nullptr, false)
                  .ok());
  ASSERT_TRUE(client()
                  .memcpy(reinterpret_cast<void*>(b), y.data(), n * 4, CopyKind::kHostToDevice,
                          nullptr, false)
                  .ok());
  int count = n;
  void* args[] = {&a, &b, &c, &count};
  ASSERT_TRUE(client().launch(*kernel, {2, 1, 1}, {128, 1, 1}, 0, nullptr, args).ok());
  ASSERT_TRUE(client()
                  .memcpy(out.data(), reinterpret_cast<void*>(c), n * 4, CopyKind::kDeviceToHost,
                          nullptr, false)
                  .ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 3.75f) << i;
  EXPECT_TRUE(client().unload_module(*module).ok());
  for (uint64_t p : {a, b, c}) EXPECT_TRUE(client().free_device(p).ok());
  EXPECT_TRUE(client().synchronize_device().ok());
}

// Last, because it ends the session's usefulness: as in CUDA, an illegal address is a sticky
// error of the whole context. The launch itself succeeds (it is asynchronous); the fault comes
// back at the next synchronisation point, and at every one after it.
TEST(FlushByCalls, ZzFaultIsReportedAtTheSyncPointAndStays) {
  if (testing::kernels_fatbin_path().empty()) GTEST_SKIP() << "built without the CUDA toolkit";
  auto module = client().load_module(testing::read_bytes(testing::kernels_fatbin_path()));
  ASSERT_TRUE(module.ok()) << module.status().message();
  auto kernel = client().module_function(*module, "_Z7vec_addPKfS0_Pfi");
  ASSERT_TRUE(kernel.ok());
  uint64_t a = device_buffer(4096), b = device_buffer(4096), c = device_buffer(4096);
  int huge = 1 << 30;
  void* bad_args[] = {&a, &b, &c, &huge};
  ASSERT_TRUE(client().launch(*kernel, {1 << 14, 1, 1}, {1024, 1, 1}, 0, nullptr, bad_args).ok());
  Status synced = client().synchronize_device();
  EXPECT_EQ(synced.code(), ErrorCode::kIllegalAddress) << synced.message();
  EXPECT_EQ(client().synchronize_device().code(), ErrorCode::kIllegalAddress);
  // hiberd itself is fine: another session works.
  auto other = hiberd->connect("bystander");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->ping().ok());
}

}  // namespace
}  // namespace hiber::shim

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new hiber::shim::Environment);
  return RUN_ALL_TESTS();
}
