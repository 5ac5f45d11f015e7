// The queue meter (server/queue_meter.h): what it counts as queued, from markers placed and run,
// and the errors past its limits. Times are given explicitly, so nothing here depends on timing.
#include "server/queue_meter.h"

#include <gtest/gtest.h>

#include <vector>

namespace hiber::server {
namespace {

using namespace std::chrono_literals;
using Clock = QueueMeter::Clock;

constexpr uint64_t kMiB = 1 << 20;
const device::Stream kA{1, 0};
const device::Stream kB{2, 0};

TEST(QueueMeter, BytesBehindAnUnfinishedMarkerCountUntilItRuns) {
  QueueMeter meter({.max_bytes = 64 * kMiB});
  const Clock::time_point t0 = Clock::now();
  std::vector<device::Stream> unmarked;
  ASSERT_TRUE(meter.admit("memcpyHtoD", t0, unmarked).ok());
  ASSERT_TRUE(meter.enqueued(kA, 32 * kMiB));  // no marker yet: place one
  meter.marked(kA, t0);
  ASSERT_TRUE(meter.admit("memcpyHtoD", t0, unmarked).ok());
  EXPECT_FALSE(meter.enqueued(kA, 32 * kMiB));  // behind the outstanding marker's work
  EXPECT_EQ(meter.queued_bytes(), 64 * kMiB);
  const Status full = meter.admit("memcpyHtoD", t0, unmarked);
  EXPECT_EQ(full.code(), ErrorCode::kOutOfMemory) << full;
  EXPECT_NE(full.message().find("--session_max_queued_mib"), std::string::npos) << full;
  EXPECT_NE(full.message().find("memcpyHtoD"), std::string::npos) << full;
  // The marker ran: its 32 MiB are done; the 32 MiB after it may not be, and need a marker
  // before they count again.
  meter.finished(kA);
  EXPECT_EQ(meter.queued_bytes(), 0u);
  ASSERT_TRUE(meter.admit("memset", t0, unmarked).ok());
  ASSERT_EQ(unmarked.size(), 1u);
  EXPECT_EQ(unmarked[0].id, kA.id);
  meter.marked(kA, t0);
  EXPECT_EQ(meter.queued_bytes(), 32 * kMiB);
  meter.finished(kA);
  EXPECT_EQ(meter.queued_bytes(), 0u);
}

TEST(QueueMeter, StreamsAddUp) {
  QueueMeter meter({.max_bytes = 100 * kMiB});
  const Clock::time_point t0 = Clock::now();
  std::vector<device::Stream> unmarked;
  for (device::Stream s : {kA, kB}) {
    ASSERT_TRUE(meter.enqueued(s, 50 * kMiB));
    meter.marked(s, t0);
  }
  EXPECT_EQ(meter.admit("memcpyDtoD", t0, unmarked).code(), ErrorCode::kOutOfMemory);
  meter.finished(kB);
  EXPECT_TRUE(meter.admit("memcpyDtoD", t0, unmarked).ok());
}

TEST(QueueMeter, WorkUnfinishedPastTheAgeLimitRefusesMore) {
  QueueMeter meter({.max_age = 2s});
  const Clock::time_point t0 = Clock::now();
  std::vector<device::Stream> unmarked;
  ASSERT_TRUE(meter.enqueued(kA, 0));
  meter.marked(kA, t0);
  EXPECT_TRUE(meter.admit("launchKernel", t0 + 2s, unmarked).ok());
  const Status late = meter.admit("launchKernel", t0 + 3s, unmarked);
  EXPECT_EQ(late.code(), ErrorCode::kTimeout) << late;
  EXPECT_NE(late.message().find("--session_max_queue_age_ms"), std::string::npos) << late;
  meter.finished(kA);
  EXPECT_TRUE(meter.admit("launchKernel", t0 + 10s, unmarked).ok());
}

TEST(QueueMeter, ZeroLimitsRefuseNothing) {
  QueueMeter meter({});
  const Clock::time_point t0 = Clock::now();
  std::vector<device::Stream> unmarked;
  ASSERT_TRUE(meter.enqueued(kA, UINT64_MAX / 2));
  meter.marked(kA, t0);
  EXPECT_TRUE(meter.admit("memset", t0 + 1h, unmarked).ok());
}

}  // namespace
}  // namespace hiber::server
