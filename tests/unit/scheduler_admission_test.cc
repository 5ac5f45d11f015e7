// Admission (SchedulerOptions::shed): which queued request dispatch() sheds instead of starting,
// worked by hand from the functions' SLOs, execution and swap estimates; shed requests count as
// misses in RRC, and nothing is shed when the caller cannot answer or the rule is kNone.
#include <gtest/gtest.h>

#include "scheduler/scheduler.h"
#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::kMs;
using testing::make_scheduler;
using testing::spec;
using testing::torpor_topology;

constexpr uint64_t kGpu = 4 * kGiB;

// SLO 100 ms, execution 10 ms, host swap 50 ms.
FunctionSpec function_spec() {
  FunctionSpec s = spec(kGiB, 100 * kMs, 10 * kMs);
  s.swap_time_hint = 50 * kMs;
  return s;
}

class AdmissionTest : public ::testing::Test {
 protected:
  std::unique_ptr<Scheduler> scheduler(ShedRule rule) {
    SchedulerOptions options;
    options.shed = rule;
    auto s = make_scheduler(topology_, options);
    for (uint32_t id : {1u, 2u})
      EXPECT_TRUE(s->register_function(FunctionId{id}, function_spec(), 0).ok());
    return s;
  }
  RequestId arrive(Scheduler& s, uint32_t id, Time now, bool background = false) {
    Result<RequestId> r = s.arrive(FunctionId{id}, now, background);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }

  Topology topology_ = torpor_topology(kGpu);
  std::vector<Decision> decisions_;
  std::vector<RequestId> rejected_;
};

TEST_F(AdmissionTest, LateShedsARequestThatCannotFinishInTimeEvenResidentAndRunsTheOthers) {
  auto s = scheduler(ShedRule::kLate);
  const RequestId late = arrive(*s, 1, 0);             // deadline 100 ms
  const RequestId punctual = arrive(*s, 2, 80 * kMs);  // deadline 180 ms
  // At 91 ms: 91 + 10 > 100 for the first; 91 + 10 <= 180 for the second.
  s->dispatch(91 * kMs, &decisions_, &rejected_);
  EXPECT_EQ(rejected_, std::vector<RequestId>{late});
  ASSERT_EQ(decisions_.size(), 1u);
  EXPECT_EQ(decisions_[0].request, punctual);
  EXPECT_EQ(s->request(late)->state, RequestState::kFinished);
  EXPECT_EQ(s->counters().rejected, 1u);
  EXPECT_EQ(s->counters().completed, 0u) << "a shed request is not a completed one";
  EXPECT_EQ(s->queued(), 0u);
  // It is a miss in its function's window: n = 1, m = 0, RRC = (0.98 * 1 - 0) / (1 - 0.98).
  EXPECT_NEAR(s->rrc(FunctionId{1}, 91 * kMs), 0.98 / 0.02, 1e-9);
  EXPECT_INVARIANTS(*s);
}

TEST_F(AdmissionTest, LateKeepsARequestThatCanStillFinishInTimeWithItsModelResident) {
  auto s = scheduler(ShedRule::kLate);
  const RequestId r = arrive(*s, 1, 0);
  // 90 + 10 = 100: exactly on time if it ran resident, so it runs (and loads from the host).
  s->dispatch(90 * kMs, &decisions_, &rejected_);
  EXPECT_TRUE(rejected_.empty());
  ASSERT_EQ(decisions_.size(), 1u);
  EXPECT_EQ(decisions_[0].request, r);
  EXPECT_EQ(decisions_[0].source, Source::kHost);
}

TEST_F(AdmissionTest, HopelessAlsoBoundsByTheHostSwapOfAModelNoGpuHolds) {
  auto s = scheduler(ShedRule::kHopeless);
  // Function 2's model goes resident on a GPU first.
  const RequestId warm = arrive(*s, 2, 0);
  s->dispatch(0, &decisions_, &rejected_);
  ASSERT_EQ(decisions_.size(), 1u);
  ASSERT_TRUE(s->load_done(warm, 50 * kMs, true).ok());
  ASSERT_TRUE(s->done(warm, 60 * kMs).ok());
  decisions_.clear();

  const RequestId cold = arrive(*s, 1, 100 * kMs);  // deadline 200 ms, resident nowhere
  const RequestId hot = arrive(*s, 2, 100 * kMs);   // deadline 200 ms, resident on its GPU
  // At 151 ms: 151 + max(50 swap, 10 execution) > 200 for the cold one (its swap overlaps its
  // execution, so the longer of the two bounds its finish); 151 + 10 <= 200 for the resident one.
  s->dispatch(151 * kMs, &decisions_, &rejected_);
  EXPECT_EQ(rejected_, std::vector<RequestId>{cold});
  ASSERT_EQ(decisions_.size(), 1u);
  EXPECT_EQ(decisions_[0].request, hot);
  EXPECT_EQ(decisions_[0].source, Source::kResident);
  EXPECT_INVARIANTS(*s);

  // 350 + 50 = 400: a host load still makes it, so it runs.
  const RequestId in_time = arrive(*s, 1, 300 * kMs);
  decisions_.clear();
  rejected_.clear();
  s->dispatch(350 * kMs, &decisions_, &rejected_);
  EXPECT_TRUE(rejected_.empty());
  ASSERT_EQ(decisions_.size(), 1u);
  EXPECT_EQ(decisions_[0].request, in_time);
  EXPECT_EQ(decisions_[0].source, Source::kHost);
}

TEST_F(AdmissionTest, NothingIsShedWithoutARuleForBackgroundRequestsOrWhenTheCallerCannotAnswer) {
  auto none = scheduler(ShedRule::kNone);
  const RequestId a = arrive(*none, 1, 0);
  none->dispatch(500 * kMs, &decisions_, &rejected_);
  EXPECT_TRUE(rejected_.empty());
  ASSERT_EQ(decisions_.size(), 1u);
  EXPECT_EQ(decisions_[0].request, a);

  auto late = scheduler(ShedRule::kLate);
  const RequestId background = arrive(*late, 1, 0, /*background=*/true);
  const RequestId unanswerable = arrive(*late, 2, 0);
  decisions_.clear();
  late->dispatch(500 * kMs, &decisions_, nullptr);
  ASSERT_EQ(decisions_.size(), 2u);
  EXPECT_EQ(decisions_[0].request, background);
  EXPECT_EQ(decisions_[1].request, unanswerable);
  EXPECT_EQ(late->counters().rejected, 0u);
}

TEST(ShedRuleNames, KnownNamesParseAndOthersAreRefusedWithTheList) {
  EXPECT_EQ(*shed_rule_from_name("none"), ShedRule::kNone);
  EXPECT_EQ(*shed_rule_from_name("late"), ShedRule::kLate);
  EXPECT_EQ(*shed_rule_from_name("hopeless"), ShedRule::kHopeless);
  const Result<ShedRule> bad = shed_rule_from_name("always");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(bad.status().message().find("none, late, hopeless"), std::string::npos);
}

}  // namespace
}  // namespace hiber::scheduler
