#include "server/staging_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

namespace hiber::server {
namespace {

TEST(StagingTracker, ReleasesOnlyTheFinishedPrefix) {
  std::vector<uint64_t> released;
  StagingTracker tracker([&](uint64_t end) { released.push_back(end); });
  auto a = tracker.begin(100), b = tracker.begin(200), c = tracker.begin(300);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  tracker.finish(*b);
  EXPECT_TRUE(released.empty()) << "b finished before a: nothing can be reused yet";
  tracker.finish(*a);
  EXPECT_EQ(released, std::vector<uint64_t>({200}));
  tracker.finish(*c);
  EXPECT_EQ(released, std::vector<uint64_t>({200, 300}));
  EXPECT_EQ(tracker.outstanding(), 0u);
}

TEST(StagingTracker, RefusesEndsThatGoBackwards) {
  StagingTracker tracker([](uint64_t) {});
  ASSERT_TRUE(tracker.begin(500).ok());
  auto back = tracker.begin(400);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(tracker.outstanding(), 1u);
}

TEST(StagingTracker, IgnoresUnknownAndRepeatedTickets) {
  std::vector<uint64_t> released;
  StagingTracker tracker([&](uint64_t end) { released.push_back(end); });
  auto a = tracker.begin(8);
  tracker.finish(*a + 1000);
  tracker.finish(*a);
  tracker.finish(*a);
  EXPECT_EQ(released, std::vector<uint64_t>({8}));
}

TEST(StagingTracker, ConcurrentFinishersReleaseEverything) {
  std::atomic<uint64_t> high{0};
  StagingTracker tracker([&](uint64_t end) {
    uint64_t seen = high.load();
    while (end > seen && !high.compare_exchange_weak(seen, end)) {
    }
  });
  constexpr int kCalls = 20000;
  std::vector<StagingTracker::Ticket> tickets;
  for (int i = 1; i <= kCalls; ++i) tickets.push_back(*tracker.begin(i * 64));
  std::shuffle(tickets.begin(), tickets.end(), std::mt19937(7));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < tickets.size(); i += 4) tracker.finish(tickets[i]);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(high.load(), uint64_t{kCalls} * 64);
  EXPECT_EQ(tracker.outstanding(), 0u);
}

}  // namespace
}  // namespace hiber::server
