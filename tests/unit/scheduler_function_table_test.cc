// The function table: its id index, its sliding window and the figures the policies read from
// it: arrival rate, service time, demand, swap and execution estimates. Every expected value is
// worked by hand from the bucket arithmetic in function_table.h, or recounted from the events.
#include "scheduler/function_table.h"

#include <gtest/gtest.h>

#include <map>

#include "scheduler/id_index.h"
#include "scheduler/random.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

constexpr Duration kMs = kMillisecond;
constexpr Duration kS = kSecond;

TEST(IdIndexTest, AgreesWithAnOrderedMapThroughInsertsAndErases) {
  IdIndex index;
  std::map<FunctionId, FunctionIndex> model;
  Rng rng(3);
  for (int step = 0; step < 50000; ++step) {
    // Ids from a small range collide and cluster; a few large ones exercise the hash.
    const FunctionId id = rng.uniform(8) == 0 ? static_cast<FunctionId>(rng.next())
                                              : static_cast<FunctionId>(rng.uniform(600));
    if (rng.uniform(3) != 0 && model.count(id) == 0) {
      const FunctionIndex value = static_cast<FunctionIndex>(step);
      index.insert(id, value);
      model.insert_or_assign(id, value);
    } else {
      EXPECT_EQ(index.erase(id), model.erase(id) == 1);
    }
    ASSERT_EQ(index.size(), model.size());
    const FunctionId probe = static_cast<FunctionId>(rng.uniform(600));
    auto it = model.find(probe);
    ASSERT_EQ(index.find(probe),
              it == model.end() ? std::nullopt : std::optional<FunctionIndex>(it->second))
        << "step " << step;
  }
  for (const auto& [id, value] : model) EXPECT_EQ(index.find(id), value);
}

// 60 s in 12 buckets of 5 s.
TEST(SlidingWindowTest, CountsTheLastTwelveBucketsOfFiveSeconds) {
  SlidingWindow w(WindowOptions{});
  EXPECT_EQ(w.width(), 5 * kS);
  w.add_arrival(0);
  w.add_arrival(1 * kS);
  w.add_arrival(6 * kS);
  w.add_completion(7 * kS, /*on_time=*/true, 20 * kMs);
  w.add_completion(8 * kS, /*on_time=*/false, 40 * kMs);
  WindowTotals t = w.totals(6 * kS);
  EXPECT_EQ(t.arrivals, 3u);
  t = w.totals(59 * kS);  // bucket 11: buckets 0..11 count
  EXPECT_EQ(t.arrivals, 3u);
  EXPECT_EQ(t.completions, 2u);
  EXPECT_EQ(t.on_time, 1u);
  EXPECT_EQ(t.busy, 60 * kMs);
  t = w.totals(61 * kS);  // bucket 12: bucket 0 has left
  EXPECT_EQ(t.arrivals, 1u);
  EXPECT_EQ(t.completions, 2u);
  t = w.totals(66 * kS);  // bucket 13: bucket 1 has left too
  EXPECT_EQ(t.arrivals, 0u);
  EXPECT_EQ(t.completions, 0u);
}

TEST(SlidingWindowTest, ReusedBucketsForgetTheirOldCounts) {
  SlidingWindow w(WindowOptions{});
  w.add_arrival(2 * kS);   // bucket 0, ring slot 0
  w.add_arrival(62 * kS);  // bucket 12, ring slot 0 again
  EXPECT_EQ(w.totals(62 * kS).arrivals, 1u);
}

TEST(SlidingWindowTest, TimesBeforeTheEpochFallInTheirOwnBuckets) {
  SlidingWindow w(WindowOptions{});
  w.add_arrival(-1);  // bucket -1, not bucket 0
  w.add_arrival(1);
  EXPECT_EQ(w.totals(1).arrivals, 2u);
  EXPECT_EQ(w.totals(55 * kS + 1).arrivals, 1u);  // bucket 11: bucket -1 has left, 0 stays
}

// The running sum against a recount of every event, over random times: arrivals and completions
// up to 20 s in the past, steps of up to 8 s and now and then a jump past the whole window.
TEST(SlidingWindowTest, RunningTotalsMatchARecountOfTheEvents) {
  SlidingWindow w(WindowOptions{});
  const int64_t n = 12;
  const Duration width = w.width();
  auto index_of = [&](Time t) { return t >= 0 ? t / width : -((-t + width - 1) / width); };
  struct Event {
    int64_t index;
    WindowTotals delta;
  };
  std::vector<Event> accepted;
  int64_t newest = INT64_MIN;
  Rng rng(17);
  Time now = -30 * kS;
  for (int step = 0; step < 20000; ++step) {
    now += rng.uniform(50) == 0 ? 70 * kS : static_cast<Duration>(rng.uniform(8 * kS));
    const int events = static_cast<int>(rng.uniform(4));
    for (int e = 0; e < events; ++e) {
      const Time t = now - static_cast<Duration>(rng.uniform(20 * kS));
      WindowTotals delta;
      if (rng.uniform(2) == 0) {
        w.add_arrival(t);
        delta.arrivals = 1;
      } else {
        const bool on_time = rng.uniform(2) == 0;
        const Duration busy = static_cast<Duration>(rng.uniform(kS));
        w.add_completion(t, on_time, busy);
        delta = WindowTotals{0, 1, on_time ? 1u : 0u, busy};
      }
      const int64_t index = index_of(t);
      if (newest != INT64_MIN && index <= newest - n) continue;  // older than the window
      newest = std::max(newest, index);
      accepted.push_back({index, delta});
    }
    WindowTotals expected;
    const int64_t current = index_of(now);
    // Time only moves on: an event that has left the window never counts again.
    std::erase_if(accepted, [&](const Event& e) { return e.index <= current - n; });
    for (const Event& e : accepted) {
      if (e.index <= current) expected += e.delta;
    }
    ASSERT_EQ(w.totals(now), expected) << "step " << step;
  }
}

class FunctionTableTest : public ::testing::Test {
 protected:
  FunctionTableTest() : table_(WindowOptions{}, HeavinessOptions{}, /*host_gbps=*/10.0) {}
  FunctionTable table_;
};

TEST_F(FunctionTableTest, ArrivalRateDividesByTheCoveredSpanNotTheWholeWindow) {
  Result<FunctionIndex> f = table_.add(FunctionId{1}, testing::spec(kGiB), 0);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 20; ++i) table_.record_arrival(*f, i * 500 * kMs);
  // Registered at 0: at 10 s the window has covered 10 s, 20 / 10 s = 2/s.
  EXPECT_DOUBLE_EQ(table_.arrival_rate(*f, 10 * kS), 2.0);
  // At 100 s the window is 45 s .. 100 s (buckets 9..20) and the arrivals have left.
  EXPECT_DOUBLE_EQ(table_.arrival_rate(*f, 100 * kS), 0.0);
  // Never below one bucket: 20 arrivals just after registering are 20 / 5 s.
  Result<FunctionIndex> g = table_.add(FunctionId{2}, testing::spec(kGiB), 0);
  ASSERT_TRUE(g.ok());
  for (int i = 0; i < 20; ++i) table_.record_arrival(*g, 0);
  EXPECT_DOUBLE_EQ(table_.arrival_rate(*g, 1 * kMs), 4.0);
}

TEST_F(FunctionTableTest, DemandIsRateTimesMeanServiceTime) {
  Result<FunctionIndex> f = table_.add(FunctionId{1}, testing::spec(kGiB, 100 * kMs, 10 * kMs), 0);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 100; ++i) table_.record_arrival(*f, i * 100 * kMs);
  // No completions yet: the execution hint, 10 ms.
  EXPECT_DOUBLE_EQ(table_.service_seconds(*f, 10 * kS), 0.010);
  table_.record_completion(*f, 2 * kS, true, 30 * kMs);
  table_.record_completion(*f, 2 * kS, true, 50 * kMs);
  EXPECT_DOUBLE_EQ(table_.service_seconds(*f, 10 * kS), 0.040);
  // 100 arrivals in 10 s = 10/s, x 40 ms = 0.4 GPU-seconds per second.
  EXPECT_DOUBLE_EQ(table_.demand(*f, 10 * kS), 0.4);
}

TEST_F(FunctionTableTest, SwapAndExecEstimatesPreferMeasurementsThenHints) {
  FunctionSpec s = testing::spec(2'000'000'000, 100 * kMs, 0);
  Result<FunctionIndex> f = table_.add(FunctionId{1}, s, 0);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(table_.swap_estimate(*f), 200 * kMs);  // 2 GB at 10 GB/s
  EXPECT_EQ(table_.exec_estimate(*f), 0);
  s.swap_time_hint = 150 * kMs;
  s.exec_time_hint = 30 * kMs;
  Result<FunctionIndex> g = table_.add(FunctionId{2}, s, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(table_.swap_estimate(*g), 150 * kMs);
  EXPECT_EQ(table_.exec_estimate(*g), 30 * kMs);
  table_.record_host_swap(*g, 120 * kMs);
  table_.record_exec(*g, 25 * kMs);
  EXPECT_EQ(table_.swap_estimate(*g), 120 * kMs);
  EXPECT_EQ(table_.exec_estimate(*g), 25 * kMs);
}

TEST_F(FunctionTableTest, RefusesBadSpecsAndDuplicateIds) {
  EXPECT_TRUE(table_.add(FunctionId{1}, testing::spec(kGiB), 0).ok());
  EXPECT_EQ(table_.add(FunctionId{1}, testing::spec(kGiB), 0).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(table_.add(FunctionId{2}, testing::spec(0), 0).status().code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(table_.add(FunctionId{3}, testing::spec(kGiB, 0), 0).status().code(),
            ErrorCode::kInvalidValue);
  FunctionSpec p = testing::spec(kGiB);
  p.tail_percentile = 1.0;
  EXPECT_EQ(table_.add(FunctionId{4}, p, 0).status().code(), ErrorCode::kInvalidValue);
  p.tail_percentile = 0.98;
  p.exec_time_hint = -1;
  EXPECT_EQ(table_.add(FunctionId{5}, p, 0).status().code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(table_.remove(FunctionId{9}).code(), ErrorCode::kNotFound);
}

TEST_F(FunctionTableTest, RemovedIdsCanReturnUnderANewIndex) {
  Result<FunctionIndex> a = table_.add(FunctionId{1}, testing::spec(kGiB), 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(table_.remove(FunctionId{1}).ok());
  EXPECT_FALSE(table_.live(*a));
  EXPECT_EQ(table_.find(FunctionId{1}), std::nullopt);
  Result<FunctionIndex> b = table_.add(FunctionId{1}, testing::spec(kGiB), 0);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(table_.live_count(), 1u);
  EXPECT_EQ(table_.slots(), 2u);
}

}  // namespace
}  // namespace hiber::scheduler
