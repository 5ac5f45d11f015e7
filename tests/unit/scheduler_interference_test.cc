// The interference model and the sharing admission rule (scheduler/interference.h), against
// values worked out by hand from the formula slowdown = max(1, sum compute, sum memory).
#include <gtest/gtest.h>

#include <vector>

#include "scheduler/interference.h"

namespace hiber::scheduler {
namespace {

constexpr Duration kMs = kMillisecond;
constexpr Intensity kComputeHeavy{0.9, 0.6};
constexpr Intensity kMemoryHeavy{0.5, 0.7};

TEST(Interference, SlowdownIsTheMostOversubscribedResource) {
  EXPECT_DOUBLE_EQ(co_run_slowdown({}), 1.0);
  EXPECT_DOUBLE_EQ(co_run_slowdown(std::vector<Intensity>{kComputeHeavy}), 1.0);
  // Two compute-heavy models: compute 1.8 (USHER Fig. 2's goodput ratio of 0.55).
  EXPECT_DOUBLE_EQ(co_run_slowdown(std::vector<Intensity>{kComputeHeavy, kComputeHeavy}), 1.8);
  // Compute-heavy beside memory-heavy: compute 1.4, memory 1.3.
  EXPECT_DOUBLE_EQ(co_run_slowdown(std::vector<Intensity>{kComputeHeavy, kMemoryHeavy}), 1.4);
  // Within the GPU in both dimensions: no interference (USHER §3.3).
  EXPECT_DOUBLE_EQ(co_run_slowdown(std::vector<Intensity>{{0.5, 0.3}, {0.4, 0.6}}), 1.0);
  // Three memory-heavy: memory 2.1.
  EXPECT_DOUBLE_EQ(
      co_run_slowdown(std::vector<Intensity>{kMemoryHeavy, kMemoryHeavy, kMemoryHeavy}), 2.1);
}

TEST(Interference, AdmitsWhenEveryDeadlineHolds) {
  // A runner with 30 ms left, due in 100 ms; a 10 ms request due in 20 ms: at 1.4 it ends at
  // 14 ms, the runner at 42 ms.
  const std::vector<CoRunner> runners{{kComputeHeavy, 30 * kMs, 100 * kMs}};
  const std::optional<double> s = admit_co_runner(runners, {kMemoryHeavy, 10 * kMs, 20 * kMs}, 0);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(*s, 1.4);
  // Beside a compute-heavy one it runs at 1.8 and ends at 18 ms.
  EXPECT_DOUBLE_EQ(*admit_co_runner(runners, {kComputeHeavy, 10 * kMs, 20 * kMs}, 0), 1.8);
}

TEST(Interference, RefusesWhenTheNewcomerWouldBeLate) {
  const std::vector<CoRunner> runners{{kComputeHeavy, 30 * kMs, 100 * kMs}};
  // 10 ms at 1.8 = 18 ms > 15 ms.
  EXPECT_FALSE(admit_co_runner(runners, {kComputeHeavy, 10 * kMs, 15 * kMs}, 0).has_value());
  // The same at `now` = 5 ms, due at 23 ms: ends at 23 ms exactly, admitted.
  EXPECT_TRUE(admit_co_runner(runners, {kComputeHeavy, 10 * kMs, 23 * kMs}, 5 * kMs).has_value());
}

TEST(Interference, ProtectsARunnerThatWouldBeOnTime) {
  // The runner ends at 30 ms alone, due at 50 ms; at 1.8 it would end at 54 ms.
  const std::vector<CoRunner> on_time{{kComputeHeavy, 30 * kMs, 50 * kMs}};
  EXPECT_FALSE(admit_co_runner(on_time, {kComputeHeavy, 10 * kMs, 100 * kMs}, 0).has_value());
  // At 1.4 it ends at 42 ms: admitted.
  EXPECT_TRUE(admit_co_runner(on_time, {kMemoryHeavy, 10 * kMs, 100 * kMs}, 0).has_value());
  // A runner late already (due at 20 ms, 30 ms left) is not protected.
  const std::vector<CoRunner> late{{kComputeHeavy, 30 * kMs, 20 * kMs}};
  EXPECT_TRUE(admit_co_runner(late, {kComputeHeavy, 10 * kMs, 100 * kMs}, 0).has_value());
}

TEST(Interference, RefusesANewcomerThatWouldOutlastTheRunner) {
  // 40 ms of work beside a runner with 30 ms left would keep the GPU busy after the runner.
  const std::vector<CoRunner> runners{{kComputeHeavy, 30 * kMs, 1000 * kMs}};
  EXPECT_FALSE(admit_co_runner(runners, {kMemoryHeavy, 40 * kMs, 1000 * kMs}, 0).has_value());
  EXPECT_TRUE(admit_co_runner(runners, {kMemoryHeavy, 30 * kMs, 1000 * kMs}, 0).has_value());
}

}  // namespace
}  // namespace hiber::scheduler
