// Events timed across leases on different GPUs (issue 18, item 12), through a real hiberd
// --device=sim driven by raw calls.
//
// Two records on different GPUs are timed by the host clock when each completed. The bug: the
// time was stored by a device callback of its own, so a client told that the event was complete
// (by eventQuery or eventSynchronize, answered by other paths) could ask for the time before it
// landed, and got cudaErrorNotReady. The test makes that order certain: each simulated GPU has
// one worker, held by a slow copy, so the record's own callback cannot run while the client
// queries and times the event.
#include <gtest/gtest.h>

#include <unistd.h>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "tests/integration/hiberd_harness.h"
#include "wire/control_client.h"

namespace hiber::testing {
namespace {

using namespace std::chrono_literals;
namespace proto = wire::proto;
using Clock = std::chrono::steady_clock;

// Two simulated GPUs, each behind its own PCIe link of 0.1 GB/s (with --sim_throttle a 32 MiB
// copy holds its GPU's worker for a third of a second).
std::string two_slow_gpus_config() {
  const std::string path = "/tmp/hiber-events-" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({
    "name": "two-slow-gpus",
    "gpuModels": [{"name": "g", "productName": "Simulated GPU", "memoryBytes": 4294967296,
                   "computeCapabilityMajor": 9, "computeCapabilityMinor": 0,
                   "multiprocessors": 8}],
    "gpus": [{"model": "g", "pcieSwitch": 0}, {"model": "g", "pcieSwitch": 1}],
    "pcieSwitches": [{"hostToDeviceGBps": 0.1, "deviceToHostGBps": 0.1},
                     {"hostToDeviceGBps": 0.1, "deviceToHostGBps": 0.1}]
  })";
  return path;
}

wire::ControlClient control(const Hiberd& hiberd) {
  auto client = wire::ControlClient::connect(hiberd.control_socket_path(), 60s);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(client).value();
}

class EventClient {
 public:
  explicit EventClient(const Hiberd& hiberd) {
    auto c = hiberd.connect("events");
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) c_ = std::move(c).value();
  }
  bool connected() const { return c_ != nullptr; }
  wire::CallClient& calls() { return *c_; }

  // A call the client waits for; not sticky, so a "not ready" answer is only an answer.
  template <typename Fill>
  Result<wire::CallResult> call(Fill&& fill) {
    return c_->call(std::forward<Fill>(fill), /*sticky=*/false);
  }
  // A call queued without a reply (as the shim sends asynchronous work).
  template <typename Fill>
  Status enqueue(Fill&& fill) {
    return c_->enqueue(std::forward<Fill>(fill));
  }

  Status record(uint64_t event, uint64_t stream) {
    return enqueue([&](proto::Call::Builder c) {
      auto r = c.initEventRecord();
      r.setEvent(event);
      r.setStream(stream);
    });
  }
  Status synchronize(uint64_t event) {
    return call([&](proto::Call::Builder c) { c.initEventSynchronize().setEvent(event); }).status();
  }
  Status query(uint64_t event) {
    return call([&](proto::Call::Builder c) { c.initEventQuery().setEvent(event); }).status();
  }
  Result<float> elapsed_ms(uint64_t start, uint64_t end) {
    auto r = call([&](proto::Call::Builder c) {
      auto e = c.initEventElapsedTime();
      e.setStart(start);
      e.setEnd(end);
    });
    if (!r.ok()) return r.status();
    const float* ms = std::get_if<float>(&*r);
    if (ms == nullptr) return Status(ErrorCode::kUnknown, "eventElapsedTime: no elapsedMs");
    return *ms;
  }

 private:
  std::unique_ptr<wire::CallClient> c_;
};

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

TEST(HiberdEvents, AnEventReportedCompleteOnAnotherGpuIsTimedAtOnce) {
  HiberdOptions options;
  options.extra_flags = {"--node_config=" + two_slow_gpus_config(), "--sim_throttle",
                         "--sim_workers_per_gpu=1"};
  Hiberd hiberd(options);
  EventClient client(hiberd);
  ASSERT_TRUE(client.connected());
  constexpr uint64_t kStart = 1, kEnd = 2, kBehindCopy = 3, kCopyStream = 7, kIdleStream = 8;

  // The first record runs under a lease on GPU 0 (GPU 1 is drained).
  ASSERT_TRUE(control(hiberd).drain(1).ok());
  for (uint64_t event : {kStart, kEnd, kBehindCopy}) {
    ASSERT_TRUE(client
                    .enqueue([&](proto::Call::Builder c) {
                      auto e = c.initEventCreate();
                      e.setEvent(event);
                      e.setDisableTiming(false);
                    })
                    .ok());
  }
  for (uint64_t stream : {kCopyStream, kIdleStream}) {
    ASSERT_TRUE(
        client.enqueue([&](proto::Call::Builder c) { c.initStreamCreate().setStream(stream); })
            .ok());
  }
  const Clock::time_point start_sent = Clock::now();
  ASSERT_TRUE(client.record(kStart, 0).ok());
  ASSERT_TRUE(client.synchronize(kStart).ok());
  const Clock::time_point start_done = Clock::now();

  // GPU 0 closes once the lease idles out; the next work runs on GPU 1.
  ASSERT_TRUE(control(hiberd).drain(1, /*resume=*/true).ok());
  ASSERT_TRUE(control(hiberd).drain(0).ok());

  // A slow copy holds GPU 1's only worker; the end event is recorded on an idle stream, so the
  // device completes it at once, while its stream's callback waits for the worker.
  constexpr uint64_t kBytes = 32 << 20;
  const uint64_t va = client.calls().session().grant.va_base;
  ASSERT_TRUE(client
                  .enqueue([&](proto::Call::Builder c) {
                    auto a = c.initMemAllocate();
                    a.setVa(va);
                    a.setBytes(kBytes);
                  })
                  .ok());
  auto staged = client.calls().stage(kBytes);
  ASSERT_TRUE(staged.ok()) << staged.status();
  std::memset(staged->bytes.data(), 1, kBytes);
  const Clock::time_point end_sent = Clock::now();
  ASSERT_TRUE(client
                  .enqueue([&](proto::Call::Builder c) {
                    auto m = c.initMemcpyHtoD();
                    m.setDst(va);
                    m.setSrcOffset(staged->offset);
                    m.setBytes(kBytes);
                    m.setStagingEnd(staged->staging_end);
                    m.setStream(kCopyStream);
                  })
                  .ok());
  ASSERT_TRUE(client.record(kBehindCopy, kCopyStream).ok());
  ASSERT_TRUE(client.record(kEnd, kIdleStream).ok());

  // Work still queued is "not ready": an answer, not a failure.
  EXPECT_EQ(client.query(kBehindCopy).code(), ErrorCode::kNotReady);
  Status done = client.query(kEnd);
  ASSERT_TRUE(done.ok()) << done;
  // Complete, so timed: not cudaErrorNotReady.
  Result<float> ms = client.elapsed_ms(kStart, kEnd);
  const Clock::time_point end_done = Clock::now();
  ASSERT_TRUE(ms.ok()) << ms.status();
  // Each record completed between its call and its answer, on the same monotonic clock.
  EXPECT_GE(*ms, ms_between(start_done, end_sent) - 0.01);
  EXPECT_LE(*ms, ms_between(start_sent, end_done) + 0.01);
  EXPECT_EQ(client.query(kBehindCopy).code(), ErrorCode::kNotReady) << "the copy is still running";

  // Timing an event still pending is "not ready", and the copy's event completes in time.
  EXPECT_EQ(client.elapsed_ms(kStart, kBehindCopy).status().code(), ErrorCode::kNotReady);
  ASSERT_TRUE(client.synchronize(kBehindCopy).ok());
  Result<float> copy_ms = client.elapsed_ms(kEnd, kBehindCopy);
  ASSERT_TRUE(copy_ms.ok()) << copy_ms.status();
  EXPECT_GE(*copy_ms, 0.0f);

  // None of the "not ready" answers counted as a failed call.
  auto view = hiberd.status();
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->sessions.size(), 1u);
  EXPECT_EQ(view->sessions[0].failed_calls, 0u);
  ASSERT_TRUE(control(hiberd).drain(0, /*resume=*/true).ok());
}

}  // namespace
}  // namespace hiber::testing
