// Prewarming (SchedulerOptions::prewarm, scheduler/prewarm.h): the idle-time histogram's window
// worked by hand from the arrivals fed to it, and the scheduler's prewarm decisions: which model
// goes onto which GPU, which replica it may evict, and when nothing is prewarmed and why.
#include <gtest/gtest.h>

#include "scheduler/prewarm.h"
#include "scheduler/scheduler.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::kMs;
using testing::make_scheduler;
using testing::spec;
using testing::torpor_topology;

constexpr Duration kS = kSecond;
const FunctionIndex kF{0};

// ---- The histogram ----

TEST(IdleHistogramsTest, RepresentativeWindowRunsFromThe5thTo99thPercentileBin) {
  IdleHistograms h(PrewarmOptions{});
  EXPECT_FALSE(h.window(kF).has_value()) << "no arrival yet";
  EXPECT_EQ(h.next_use(kF, 0), kNotExpected);
  // Ten idle times of 3.5 s: all in bin 3 ([3 s, 4 s)), one bin of 240, so CV = sqrt(239).
  for (int i = 0; i <= 10; ++i) h.record_arrival(kF, i * 3500 * kMs);
  const Time last = 35 * kS;
  const std::optional<ArrivalWindow> w = h.window(kF);
  ASSERT_TRUE(w.has_value());
  EXPECT_TRUE(w->representative);
  EXPECT_EQ(w->from, last + 3 * kS);   // the head's bin, lower edge
  EXPECT_EQ(w->until, last + 4 * kS);  // the tail's bin, upper edge
  EXPECT_EQ(h.next_use(kF, last + 1 * kS), last + 3 * kS) << "before the window: its start";
  EXPECT_EQ(h.next_use(kF, last + 3500 * kMs), last + 3500 * kMs) << "inside: now";
  EXPECT_EQ(h.next_use(kF, last + 5 * kS), kNotExpected) << "after the tail: nothing predicted";
}

TEST(IdleHistogramsTest, TooFewSamplesFallBackToTheFixedKeepAlive) {
  IdleHistograms h(PrewarmOptions{});
  for (int i = 0; i <= 9; ++i) h.record_arrival(kF, i * 3 * kS);  // 9 idle times, 10 needed
  const std::optional<ArrivalWindow> w = h.window(kF);
  ASSERT_TRUE(w.has_value());
  EXPECT_FALSE(w->representative);
  EXPECT_EQ(w->from, 27 * kS);
  EXPECT_EQ(w->until, 27 * kS + 60 * kS);
}

TEST(IdleHistogramsTest, EvenlySpreadOrOutOfRangeIdleTimesFallBack) {
  PrewarmOptions o;
  o.bins = 4;
  o.min_samples = 4;
  IdleHistograms even(o);
  // One idle time in each of the 4 bins: every bin count is 1, CV 0 < 2.
  Time t = 0;
  even.record_arrival(kF, t);
  for (int b = 0; b < 4; ++b) even.record_arrival(kF, t += b * kS + 500 * kMs);
  EXPECT_FALSE(even.window(kF)->representative);

  IdleHistograms far(o);
  // Four idle times of 10 s, beyond the 4-second range: all out of range.
  for (int i = 0; i <= 4; ++i) far.record_arrival(kF, i * 10 * kS);
  EXPECT_FALSE(far.window(kF)->representative);
  EXPECT_EQ(far.window(kF)->until, 40 * kS + 60 * kS);
}

TEST(IdleHistogramsTest, BadOptionsAreRefused) {
  PrewarmOptions o;
  o.head_percentile = 0.99;
  o.tail_percentile = 0.05;
  EXPECT_FALSE(validate(o).ok());
  o = PrewarmOptions{};
  o.bin = 0;
  EXPECT_FALSE(validate(o).ok());
  EXPECT_FALSE(prewarm_rule_from_name("sometimes").ok());
  EXPECT_EQ(*prewarm_rule_from_name("histogram"), PrewarmRule::kHistogram);
}

// ---- The scheduler's decisions ----

class PrewarmTest : public ::testing::Test {
 protected:
  // Functions 1 and 2 of 1.5 GiB (swap 50 ms); fillers 10..13 of 1 GiB.
  std::unique_ptr<Scheduler> scheduler(uint64_t gpu_memory, int keep_idle_gpus = 0) {
    topology_ = std::make_unique<Topology>(torpor_topology(gpu_memory));
    SchedulerOptions options;
    options.prewarm = PrewarmRule::kHistogram;
    options.prewarm_options.min_samples = 3;
    options.prewarm_options.keep_idle_gpus = keep_idle_gpus;
    auto s = make_scheduler(*topology_, options);
    for (uint32_t id : {1u, 2u}) {
      FunctionSpec f = spec(1536 * kMiB, 200 * kMs, 10 * kMs);
      f.swap_time_hint = 50 * kMs;
      EXPECT_TRUE(s->register_function(FunctionId{id}, f, 0).ok());
    }
    for (uint32_t id = 10; id <= 13; ++id)
      EXPECT_TRUE(s->register_function(FunctionId{id}, spec(kGiB), 0).ok());
    return s;
  }
  // An arrival the histogram sees, withdrawn before it runs.
  void arrival(Scheduler& s, uint32_t id, Time now) {
    Result<RequestId> r = s.arrive(FunctionId{id}, now);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(s.cancel(*r, now).ok());
  }
  // Runs one request of `id` to the end; returns its GPU.
  int serve(Scheduler& s, uint32_t id, Time now) {
    Result<RequestId> r = s.arrive(FunctionId{id}, now);
    EXPECT_TRUE(r.ok());
    std::vector<Decision> d;
    s.dispatch(now, &d);
    EXPECT_EQ(d.size(), 1u);
    if (d.empty()) return -1;
    if (d[0].source != Source::kResident) {
      EXPECT_TRUE(s.load_done(*r, now + kMs, true).ok());
    }
    EXPECT_TRUE(s.done(*r, now + 2 * kMs).ok());
    return d[0].gpu;
  }
  std::vector<Decision> prewarm(Scheduler& s, Time now) {
    std::vector<Decision> out;
    s.prewarm(now, &out);
    return out;
  }

  std::unique_ptr<Topology> topology_;
};

TEST_F(PrewarmTest, LoadsTheDueModelOntoTheIdleGpuWithTheMostFreeMemory) {
  auto s = scheduler(4 * kGiB);
  // Filler 10 goes onto GPU 0 (all empty: the lowest), leaving GPU 0 the least free memory.
  ASSERT_EQ(serve(*s, 10, 0), 0);
  // Function 1 every 3 s (last at 109 s): window [112 s, 113 s). Function 2 every 5 s (last at
  // 110 s): window [115 s, 116 s). In time order: the scheduler's clock never goes back.
  arrival(*s, 2, 95 * kS);
  arrival(*s, 1, 100 * kS);
  arrival(*s, 2, 100 * kS);
  arrival(*s, 1, 103 * kS);
  arrival(*s, 2, 105 * kS);
  arrival(*s, 1, 106 * kS);
  arrival(*s, 1, 109 * kS);
  arrival(*s, 2, 110 * kS);
  EXPECT_TRUE(prewarm(*s, 111 * kS).empty())
      << "function 1's window opens in 1 s, beyond its 50 ms load";
  // 30 ms before function 1's window: it is due; function 2 is not (3 s away).
  const Time now = 112 * kS - 30 * kMs;
  const std::vector<Decision> d = prewarm(*s, now);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].function, FunctionId{1});
  EXPECT_EQ(d[0].gpu, 1) << "GPUs 1 to 3 have 4 GiB free, GPU 0 3 GiB: the lowest of the most";
  EXPECT_EQ(d[0].source, Source::kHost);
  EXPECT_TRUE(d[0].prewarm);
  EXPECT_TRUE(d[0].evictions.empty());
  EXPECT_EQ(s->counters().prewarms, 1u);
  EXPECT_EQ(s->counters().background, 1u);
  EXPECT_EQ(s->request(d[0].request)->state, RequestState::kLoading);
  EXPECT_INVARIANTS(*s);
  // The load ends; the replica keeps the function's last use (109 s), not the load's end.
  ASSERT_TRUE(s->load_done(d[0].request, now + 50 * kMs, true).ok());
  ASSERT_TRUE(s->done(d[0].request, now + 50 * kMs).ok());
  const FunctionIndex f1 = *s->functions().find(FunctionId{1});
  ASSERT_NE(s->node().find(1, f1), nullptr);
  EXPECT_FALSE(s->node().find(1, f1)->loading);
  EXPECT_EQ(s->node().find(1, f1)->last_used, 109 * kS);
  EXPECT_EQ(s->counters().completed, 1u) << "filler 10's request only: a prewarm is no caller's";
  // Resident now, and prewarmed once since its last arrival: not again.
  EXPECT_TRUE(prewarm(*s, 112 * kS).empty());
  // Function 2 is due at 115 s - 30 ms; GPU 1 is now the fullest: GPU 2 has the most free.
  const std::vector<Decision> d2 = prewarm(*s, 115 * kS - 30 * kMs);
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2[0].function, FunctionId{2});
  EXPECT_EQ(d2[0].gpu, 2);
  EXPECT_INVARIANTS(*s);
}

TEST_F(PrewarmTest, OneLoadPerPcieSwitchAndNothingWhileARequestWaits) {
  auto s = scheduler(4 * kGiB);
  for (Time t : {100, 103, 106, 109}) {
    arrival(*s, 1, t * kS);
    arrival(*s, 2, t * kS);
  }
  // A caller's request waits (not dispatched yet): prewarms never go before it.
  Result<RequestId> waiting = s->arrive(FunctionId{10}, 112 * kS);
  ASSERT_TRUE(waiting.ok());
  EXPECT_TRUE(prewarm(*s, 112 * kS).empty());
  ASSERT_TRUE(s->cancel(*waiting, 112 * kS).ok());
  // Now three are due: functions 1 and 2 (their window opens) and filler 10 (one arrival, at
  // 112 s: the fixed keep-alive). All predicted now; filler 10's miss costs the most (its
  // estimated host swap of 1 GiB plus 10 ms, against a 100 ms SLO; functions 1 and 2: 60 ms of
  // 200), so it goes first, onto GPU 0. GPU 1 shares GPU 0's PCIe switch: function 1 goes
  // behind the other switch, onto GPU 2, and function 2 finds no idle host link.
  const std::vector<Decision> d = prewarm(*s, 112 * kS);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].function, FunctionId{10});
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_EQ(d[1].function, FunctionId{1});
  EXPECT_EQ(d[1].gpu, 2);
  EXPECT_INVARIANTS(*s);
}

TEST_F(PrewarmTest, NeverTakesTheGpusThatMustStayIdle) {
  auto none = scheduler(4 * kGiB, /*keep_idle_gpus=*/4);
  for (Time t : {100, 103, 106, 109}) arrival(*none, 1, t * kS);
  EXPECT_TRUE(prewarm(*none, 112 * kS).empty()) << "4 GPUs idle, 4 must stay so";
  auto one = scheduler(4 * kGiB, /*keep_idle_gpus=*/3);
  for (Time t : {100, 103, 106, 109}) {
    arrival(*one, 1, t * kS);
    arrival(*one, 2, t * kS);
  }
  const std::vector<Decision> d = prewarm(*one, 112 * kS);
  ASSERT_EQ(d.size(), 1u) << "two due, but after one load only 3 GPUs are idle";
  EXPECT_EQ(d[0].function, FunctionId{1});
}

TEST_F(PrewarmTest, EvictsOnlyAModelPredictedLaterThanThePrewarmedOne) {
  // 2 GiB GPUs: a filler of 1 GiB on each leaves 1 GiB, short of function 1's 1.5 GiB.
  auto s = scheduler(2 * kGiB);
  for (uint32_t id = 10; id <= 13; ++id)
    ASSERT_EQ(serve(*s, id, (id - 10) * 10 * kMs), static_cast<int>(id - 10));
  for (Time t : {100, 103, 106, 109}) arrival(*s, 1, t * kS);
  // Filler 10 arrived again at 110 s: kept alive (fallback window [110 s, 170 s]), so predicted
  // now, as soon as function 1. The others last came at 0 s: past their keep-alive.
  arrival(*s, 10, 110 * kS);
  const std::vector<Decision> d = prewarm(*s, 112 * kS);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].function, FunctionId{1});
  EXPECT_EQ(d[0].gpu, 1) << "GPU 0's only victim, filler 10, is predicted as soon";
  ASSERT_EQ(d[0].evictions.size(), 1u);
  EXPECT_EQ(d[0].evictions[0], (Eviction{FunctionId{11}, 1, kGiB}));
  EXPECT_EQ(s->counters().prewarm_evictions, 1u);
  EXPECT_NE(s->node().find(0, *s->functions().find(FunctionId{10})), nullptr);
  EXPECT_EQ(s->node().find(1, *s->functions().find(FunctionId{11})), nullptr);
  EXPECT_INVARIANTS(*s);
}

TEST_F(PrewarmTest, OffByDefault) {
  Topology topology = torpor_topology(4 * kGiB);
  auto s = make_scheduler(topology);
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  for (Time t : {100, 103, 106, 109}) {
    Result<RequestId> r = s->arrive(FunctionId{1}, t * kS);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(s->cancel(*r, t * kS).ok());
  }
  std::vector<Decision> out;
  s->prewarm(112 * kS, &out);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace hiber::scheduler
