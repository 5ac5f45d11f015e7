// gShare's dual-queue lazy dispatch through the Scheduler, on examples worked by hand with the
// mapping of queue.h: predictions are 1.4 x the mean, slack = deadline - now - 1.4 (swap +
// exec), at-risk requests (slack < 0 at arrival) go to the cache queue.
#include <gtest/gtest.h>

#include "scheduler/scheduler.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::dispatch;
using testing::kMs;
using testing::spec;

SchedulerOptions gshare() {
  SchedulerOptions o;
  o.queue = "gshare";
  return o;
}

// 1 GiB models with a 100 ms host swap and 10 ms executions: I = 140 ms, D = 14 ms.
FunctionSpec model(Duration slo) {
  FunctionSpec s = spec(kGiB, slo, 10 * kMs);
  s.swap_time_hint = 100 * kMs;
  return s;
}

TEST(GshareTest, AtRiskRequestsAreServedFirstInArrivalOrder) {
  const Topology topology = testing::plain_topology(1, 16 * kGiB);
  auto s = testing::make_scheduler(topology, gshare());
  ASSERT_TRUE(s->register_function(FunctionId{1}, model(1000 * kMs), 0).ok());  // slack 846 ms
  ASSERT_TRUE(s->register_function(FunctionId{2}, model(100 * kMs), 0).ok());  // 154 > 100: at risk
  ASSERT_TRUE(s->register_function(FunctionId{3}, model(120 * kMs), 0).ok());  // 154 > 120: at risk
  const RequestId x = *s->arrive(FunctionId{1}, 0);
  const RequestId r2 = *s->arrive(FunctionId{2}, 1 * kMs);
  const RequestId r3 = *s->arrive(FunctionId{3}, 2 * kMs);
  std::vector<Decision> d = dispatch(*s, 2 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, r2);
  ASSERT_TRUE(s->load_done(r2, 50 * kMs, true).ok());
  ASSERT_TRUE(s->done(r2, 60 * kMs).ok());
  d = dispatch(*s, 60 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, r3);
  ASSERT_TRUE(s->load_done(r3, 70 * kMs, true).ok());
  ASSERT_TRUE(s->done(r3, 80 * kMs).ok());
  d = dispatch(*s, 80 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, x);
  EXPECT_INVARIANTS(*s);
}

// On the 4-GPU node: S (id 1, SLO 200 ms) and T (id 2) are resident on GPU 0 and T runs there,
// its swap done; GPUs 1-3 are idle and hold other models. At 230 ms a request of S arrives:
//   GPU 0: T's predicted end (120 + 14 ms) has passed, so wait 0, resident: margin
//          200 - 14 = 186 ms;
//   GPU 3: a peer copy over 50 GB/s, 1.4 x 1 GiB / 50 GB/s = 30.06 ms: margin 155.9 ms;
//   GPUs 1, 2: 25 GB/s, 60.1 ms: margin 125.9 ms.
// Its best GPU is the busy GPU 0, and its slack is 200 - 140 - 14 = 46 ms: it waits, until
// 276 ms at the latest.
class GshareLazyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = testing::make_scheduler(topology_, gshare());
    for (FunctionId id : testing::function_ids(1, 5))
      ASSERT_TRUE(
          s_->register_function(id, model(id == FunctionId{1} ? 200 * kMs : 1000 * kMs), 0).ok());
    // S runs first, on GPU 0.
    const RequestId s1 = *s_->arrive(FunctionId{1}, 0);
    std::vector<Decision> d = dispatch(*s_, 0);
    ASSERT_EQ(d.size(), 1u);
    ASSERT_EQ(d[0].gpu, 0);
    ASSERT_TRUE(s_->load_done(s1, 100 * kMs, true).ok());
    // Three others take GPUs 1-3 while S runs.
    std::vector<RequestId> others;
    for (FunctionId id : testing::function_ids(3, 5)) others.push_back(*s_->arrive(id, 100 * kMs));
    d = dispatch(*s_, 100 * kMs);
    ASSERT_EQ(d.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(d[i].gpu, static_cast<int>(i) + 1);
    ASSERT_TRUE(s_->done(s1, 110 * kMs, Completion{.exec = 10 * kMs}).ok());
    // T takes GPU 0, the only idle one.
    t_ = *s_->arrive(FunctionId{2}, 120 * kMs);
    d = dispatch(*s_, 120 * kMs);
    ASSERT_EQ(d.size(), 1u);
    ASSERT_EQ(d[0].gpu, 0);
    for (RequestId r : others) ASSERT_TRUE(s_->load_done(r, 200 * kMs, true).ok());
    ASSERT_TRUE(s_->load_done(t_, 220 * kMs, true).ok());
    for (RequestId r : others) ASSERT_TRUE(s_->done(r, 230 * kMs).ok());
    ASSERT_TRUE(dispatch(*s_, 230 * kMs).empty());
    ASSERT_EQ(s_->node().available(), 0b1110u);

    s2_ = *s_->arrive(FunctionId{1}, 230 * kMs);
    EXPECT_TRUE(dispatch(*s_, 230 * kMs).empty()) << "waits for GPU 0";
    EXPECT_EQ(s_->request(s2_)->state, RequestState::kQueued);
    EXPECT_EQ(s_->next_wakeup(), 276 * kMs);
    EXPECT_INVARIANTS(*s_);
  }

  Topology topology_ = testing::torpor_topology();
  std::unique_ptr<Scheduler> s_;
  RequestId t_{0};   // set by SetUp
  RequestId s2_{0};  // set by SetUp
};

TEST_F(GshareLazyTest, AWaitingRequestTakesItsBestGpuOnceItIsFree) {
  EXPECT_TRUE(dispatch(*s_, 250 * kMs).empty());
  ASSERT_TRUE(s_->done(t_, 255 * kMs).ok());
  const std::vector<Decision> d = dispatch(*s_, 255 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, s2_);
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_EQ(d[0].source, Source::kResident);
  EXPECT_EQ(s_->next_wakeup(), Scheduler::kNever);
  EXPECT_INVARIANTS(*s_);
}

TEST_F(GshareLazyTest, WhenItsSlackRunsOutAWaitingRequestTakesTheBestIdleGpu) {
  EXPECT_TRUE(dispatch(*s_, 275 * kMs).empty());
  const std::vector<Decision> d = dispatch(*s_, 276 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, s2_);
  EXPECT_EQ(d[0].gpu, 3);  // the fastest link to GPU 0
  EXPECT_EQ(d[0].source, Source::kPeer);
  EXPECT_EQ(d[0].source_gpu, 0);
  EXPECT_INVARIANTS(*s_);
}

TEST(GshareTest, SlackQueueServesTheSmallestSlackFirst) {
  // One GPU. A (SLO 1000 ms) arrives at 0: slack runs out at 1000 - 154 = 846 ms. B (SLO
  // 300 ms) arrives at 1 ms: at 1 + 300 - 154 = 147 ms. B goes first.
  const Topology topology = testing::plain_topology(1, 16 * kGiB);
  auto s = testing::make_scheduler(topology, gshare());
  ASSERT_TRUE(s->register_function(FunctionId{1}, model(1000 * kMs), 0).ok());
  ASSERT_TRUE(s->register_function(FunctionId{2}, model(300 * kMs), 0).ok());
  const RequestId a = *s->arrive(FunctionId{1}, 0);
  const RequestId b = *s->arrive(FunctionId{2}, 1 * kMs);
  std::vector<Decision> d = dispatch(*s, 1 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, b);
  EXPECT_EQ(s->next_wakeup(), Scheduler::kNever) << "no GPU is free: only an event helps";
  ASSERT_TRUE(s->done(b, 150 * kMs).ok());
  d = dispatch(*s, 150 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, a);
  EXPECT_INVARIANTS(*s);
}

}  // namespace
}  // namespace hiber::scheduler
