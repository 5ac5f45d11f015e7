// Requests executing on one GPU at once (sim/co_run.h), re-timed by hand: each runs at
// 1 / slowdown of its speed alone while others run beside it, slowdown = max(1, sum compute,
// sum memory) (scheduler/interference.h).
#include <gtest/gtest.h>

#include <vector>

#include "sim/co_run.h"

namespace hiber::sim {
namespace {

constexpr Duration kMs = scheduler::kMillisecond;
constexpr scheduler::Intensity kComputeHeavy{0.9, 0.6};

Time finish_of(const std::vector<CoRun::Finish>& f, RequestId id) {
  for (const CoRun::Finish& x : f) {
    if (x.request == id) return x.at;
  }
  ADD_FAILURE() << "no finish for request " << id;
  return -1;
}

TEST(CoRun, AloneARequestTakesExactlyItsWork) {
  CoRun gpu(true);
  std::vector<CoRun::Finish> f;
  gpu.enter(RequestId{1}, 10 * kMs + 7, kComputeHeavy, 3 * kMs, &f);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].at, 13 * kMs + 7);
  EXPECT_DOUBLE_EQ(gpu.slowdown(), 1.0);
}

TEST(CoRun, ASecondRequestSlowsBothAndItsEndSpeedsTheFirstUp) {
  // A: 10 ms from 0. B: 4 ms from 4 ms; together at 1.8. A has 6 ms left at 4 ms: it would end
  // at 4 + 6 x 1.8 = 14.8 ms; B ends at 4 + 4 x 1.8 = 11.2 ms. Then A has done 7.2 / 1.8 = 4 ms
  // more: 2 ms left, alone: it ends at 13.2 ms.
  const RequestId a{1}, b{2};
  CoRun gpu(true);
  std::vector<CoRun::Finish> f;
  gpu.enter(a, 10 * kMs, kComputeHeavy, 0, &f);
  f.clear();
  gpu.enter(b, 4 * kMs, kComputeHeavy, 4 * kMs, &f);
  EXPECT_DOUBLE_EQ(gpu.slowdown(), 1.8);
  EXPECT_EQ(finish_of(f, a), 14'800'000);
  EXPECT_EQ(finish_of(f, b), 11'200'000);
  f.clear();
  gpu.leave(b, 11'200'000, &f);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(finish_of(f, a), 13'200'000);
  EXPECT_EQ(gpu.size(), 1u);
}

TEST(CoRun, ThreeRequestsAndComplementaryOnes) {
  // A (0.9, 0.6) and M (0.5, 0.7) from 0, 10 ms each: 1.4 -> both at 14 ms. C (0.5, 0.7) joins
  // at 7 ms (5 ms left each, C 2 ms): memory 2.0 -> C ends at 7 + 4 = 11 ms, A and M at
  // 7 + 10 = 17 ms; then 3 ms left each at 1.4: 11 + 4.2 = 15.2 ms.
  const RequestId a{1}, m{2}, c{3};
  CoRun gpu(true);
  std::vector<CoRun::Finish> f;
  gpu.enter(a, 10 * kMs, kComputeHeavy, 0, &f);
  f.clear();
  gpu.enter(m, 10 * kMs, {0.5, 0.7}, 0, &f);
  EXPECT_EQ(finish_of(f, a), 14 * kMs);
  EXPECT_EQ(finish_of(f, m), 14 * kMs);
  f.clear();
  gpu.enter(c, 2 * kMs, {0.5, 0.7}, 7 * kMs, &f);
  EXPECT_DOUBLE_EQ(gpu.slowdown(), 2.0);
  EXPECT_EQ(finish_of(f, c), 11 * kMs);
  EXPECT_EQ(finish_of(f, a), 17 * kMs);
  f.clear();
  gpu.leave(c, 11 * kMs, &f);
  EXPECT_EQ(finish_of(f, a), 15'200'000);
  EXPECT_EQ(finish_of(f, m), 15'200'000);
}

TEST(CoRun, WithoutInterferenceNobodySlows) {
  const RequestId a{1}, b{2};
  CoRun gpu(false);
  std::vector<CoRun::Finish> f;
  gpu.enter(a, 10 * kMs, kComputeHeavy, 0, &f);
  f.clear();
  gpu.enter(b, 4 * kMs, kComputeHeavy, 4 * kMs, &f);
  EXPECT_EQ(finish_of(f, a), 10 * kMs);
  EXPECT_EQ(finish_of(f, b), 8 * kMs);
}

}  // namespace
}  // namespace hiber::sim
