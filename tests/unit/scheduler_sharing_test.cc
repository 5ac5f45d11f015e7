// Spatial sharing (SchedulerOptions::sharing = "usher"): which GPU a request takes, or whether
// it waits, in situations built by hand. The predicted slowdowns follow interference.h's formula
// worked out here: compute-heavy X and Y' (0.9, 0.6), memory-heavy M (0.5, 0.8).
#include <gtest/gtest.h>

#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::dispatch;
using testing::kMs;
using testing::plain_topology;

constexpr Intensity kComputeHeavy{0.9, 0.6};
constexpr Intensity kMemoryHeavy{0.5, 0.8};

FunctionSpec function(uint64_t mib, Duration exec, Intensity intensity, Duration slo = 200 * kMs) {
  FunctionSpec s = testing::spec(mib * kMiB, slo, exec);
  s.intensity = intensity;
  return s;
}

SchedulerOptions sharing(int runners = 2) {
  SchedulerOptions o;
  o.sharing = "usher";
  o.max_runners_per_gpu = runners;
  return o;
}

class Sharing : public ::testing::Test {
 protected:
  void make(int gpus, const SchedulerOptions& options) {
    topology_ = std::make_unique<Topology>(plain_topology(gpus, 1 * kGiB));
    s_ = testing::make_scheduler(*topology_, options);
  }
  void add(uint32_t id, const FunctionSpec& spec) {
    ASSERT_TRUE(s_->register_function(FunctionId{id}, spec, now_).ok());
  }
  // A request of `id` that runs to its end; returns the GPU it ran on.
  int run_once(uint32_t id) {
    const RequestId r = start(id);
    EXPECT_TRUE(s_->done(r, now_).ok());
    return s_->request(r).ok() ? last_gpu_ : -1;
  }
  // A request of `id` that starts now and keeps running (its swap, if any, done).
  RequestId start(uint32_t id) {
    const RequestId r = *s_->arrive(FunctionId{id}, now_);
    const std::vector<Decision> d = dispatch(*s_, now_);
    EXPECT_EQ(d.size(), 1u);
    if (d.empty()) return r;
    last_gpu_ = d[0].gpu;
    if (d[0].source != Source::kResident) {
      EXPECT_TRUE(s_->load_done(r, now_, true).ok());
    }
    return r;
  }

  std::unique_ptr<Topology> topology_;
  std::unique_ptr<Scheduler> s_;
  Time now_ = 0;
  int last_gpu_ = -1;
};

TEST_F(Sharing, OffARequestWaitsForItsGpu) {
  make(1, SchedulerOptions{});
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(1);
  run_once(2);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
  EXPECT_INVARIANTS(*s_);
}

TEST_F(Sharing, StartsBesideARunnerWhereItsModelIsResident) {
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(1);
  run_once(2);
  const RequestId a = start(1);
  now_ = 5 * kMs;
  const RequestId b = *s_->arrive(FunctionId{2}, now_);
  const std::vector<Decision> d = dispatch(*s_, now_);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, b);
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_EQ(d[0].source, Source::kResident);
  EXPECT_EQ(d[0].rule, PlacementRule::kShared);
  EXPECT_TRUE(d[0].evictions.empty());
  EXPECT_EQ(s_->counters().shared_starts, 1u);
  EXPECT_INVARIANTS(*s_);
  // The running request ends first: the sharer takes its place, and the GPU stays busy.
  ASSERT_TRUE(s_->done(a, 20 * kMs).ok());
  EXPECT_EQ(s_->node().gpu(0).running, b);
  EXPECT_TRUE(s_->node().gpu(0).sharing.empty());
  EXPECT_EQ(s_->node().available(), 0u);
  EXPECT_INVARIANTS(*s_);
  ASSERT_TRUE(s_->done(b, 21 * kMs).ok());
  EXPECT_EQ(s_->node().available(), 1u);
  EXPECT_INVARIANTS(*s_);
}

TEST_F(Sharing, ARequestWhoseModelIsNotResidentWaits) {
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(1);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
}

TEST_F(Sharing, WaitsWhenTheSlowdownWouldMakeItLate) {
  // 10 ms beside the compute-heavy runner: memory-heavy at max(1.4, 1.4) = 1.4 -> 14 ms, over
  // its 12 ms deadline.
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy, 12 * kMs));
  run_once(1);
  run_once(2);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
}

TEST_F(Sharing, WaitsWhenTheRunnerWouldBeLate) {
  // The runner alone ends at 30 ms, due at 40 ms; beside the newcomer it would end at 42 ms.
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy, 40 * kMs));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(1);
  run_once(2);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
}

TEST_F(Sharing, WaitsWhenItWouldOutlastTheRunner) {
  // The runner started at 0 with 30 ms of work; at 25 ms it has 5 ms left, less than the
  // newcomer's 10 ms, which would keep the GPU busy after it. At 15 ms (15 ms left) it joins.
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(1);
  run_once(2);
  start(1);
  now_ = 25 * kMs;
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
  now_ = 15 * kMs;  // time never goes back: the scheduler takes 25 ms
  EXPECT_TRUE(dispatch(*s_, now_).empty());
}

// A (30 ms) runs from 0; B (10 ms) joins at 5 ms at 1.4: B's prediction ends at 19 ms, A has
// 25 ms left at 5 ms. When B ends at 19 ms, A has done 14 / 1.4 = 10 ms more: 15 ms left. So
// C (10 ms, memory-heavy) may join at 19 ms (10 <= 15), but not at 26 ms (8 ms left).
class SharingProgress : public Sharing {
 protected:
  // Runs A, lets B join and end at 19 ms; then C arrives at `c_arrives` and is dispatched.
  std::vector<Decision> c_decisions(Time c_arrives) {
    make(1, sharing());
    add(1, function(100, 30 * kMs, kComputeHeavy));
    add(2, function(100, 10 * kMs, kMemoryHeavy));
    add(3, function(100, 10 * kMs, kMemoryHeavy));
    run_once(1);
    run_once(2);
    run_once(3);
    start(1);
    now_ = 5 * kMs;
    const RequestId b = *s_->arrive(FunctionId{2}, now_);
    EXPECT_EQ(dispatch(*s_, now_).size(), 1u);
    now_ = 19 * kMs;
    EXPECT_TRUE(s_->done(b, now_).ok());
    now_ = c_arrives;
    EXPECT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
    return dispatch(*s_, now_);
  }
};

TEST_F(SharingProgress, TooLateToJoinOnceTheRunnerHasLessLeftThanTheJoiner) {
  EXPECT_TRUE(c_decisions(26 * kMs).empty());
}

TEST_F(SharingProgress, JoinsWhileTheRunnerHasEnoughLeft) {
  const std::vector<Decision> d = c_decisions(19 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].rule, PlacementRule::kShared);
}

// In FIFO order: C (not resident: it needs the GPU to itself) arrived before B. B does not jump
// ahead by sharing, which would keep the GPU C waits for busy longer. Arriving first, it shares.
class SharingBehindAWaiter : public Sharing {
 protected:
  bool b_shares(bool c_first) {
    SchedulerOptions options = sharing();
    options.queue = "fifo";
    make(1, options);
    add(1, function(100, 30 * kMs, kComputeHeavy));
    add(2, function(100, 10 * kMs, kMemoryHeavy));
    add(3, function(100, 10 * kMs, kMemoryHeavy));
    run_once(1);
    run_once(2);
    start(1);
    if (c_first) {
      EXPECT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
    }
    const RequestId b = *s_->arrive(FunctionId{2}, now_);
    if (!c_first) {
      EXPECT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
    }
    const std::vector<Decision> d = dispatch(*s_, now_);
    EXPECT_INVARIANTS(*s_);
    return d.size() == 1 && d[0].request == b && d[0].rule == PlacementRule::kShared;
  }
};

TEST_F(SharingBehindAWaiter, NotBehindARequestThatWaits) { EXPECT_FALSE(b_shares(true)); }
TEST_F(SharingBehindAWaiter, AheadOfIt) { EXPECT_TRUE(b_shares(false)); }

TEST_F(Sharing, NoMoreRunnersThanTheLimit) {
  make(1, sharing(2));
  add(1, function(100, 30 * kMs, {0.3, 0.3}));
  add(2, function(100, 10 * kMs, {0.3, 0.3}));
  add(3, function(100, 10 * kMs, {0.3, 0.3}));
  run_once(1);
  run_once(2);
  run_once(3);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  ASSERT_EQ(dispatch(*s_, now_).size(), 1u);
  ASSERT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
  EXPECT_INVARIANTS(*s_);
}

TEST_F(Sharing, ThreeRunnersWhenTheLimitAllows) {
  make(1, sharing(3));
  add(1, function(100, 30 * kMs, {0.3, 0.3}));
  add(2, function(100, 10 * kMs, {0.3, 0.3}));
  add(3, function(100, 10 * kMs, {0.3, 0.3}));
  run_once(1);
  run_once(2);
  run_once(3);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  ASSERT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
  EXPECT_EQ(dispatch(*s_, now_).size(), 2u);
  EXPECT_EQ(s_->node().gpu(0).sharing.size(), 2u);
  EXPECT_INVARIANTS(*s_);
}

TEST_F(Sharing, NeverBesideALoadingRequest) {
  make(1, sharing());
  add(1, function(100, 30 * kMs, kComputeHeavy));
  add(2, function(100, 10 * kMs, kMemoryHeavy));
  run_once(2);
  // Function 1 loads from the host (no load_done yet).
  ASSERT_TRUE(s_->arrive(FunctionId{1}, now_).ok());
  ASSERT_EQ(dispatch(*s_, now_).size(), 1u);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  EXPECT_TRUE(dispatch(*s_, now_).empty());
}

TEST_F(Sharing, TheRunnersOfASharedGpuAreNotEvicted) {
  // GPU memory: 1 GiB. A (400 MiB) runs, B (400 MiB) shares it; C (400 MiB) has no GPU to go
  // to, and make_room on GPU 0 finds nothing it may take.
  make(1, sharing());
  add(1, function(400, 30 * kMs, kComputeHeavy));
  add(2, function(400, 10 * kMs, kMemoryHeavy));
  run_once(1);
  run_once(2);
  start(1);
  ASSERT_TRUE(s_->arrive(FunctionId{2}, now_).ok());
  ASSERT_EQ(dispatch(*s_, now_).size(), 1u);
  std::vector<Eviction> victims;
  EXPECT_FALSE(s_->make_room(0, 1 * kGiB, FunctionId{3}, now_, &victims));
  EXPECT_TRUE(victims.empty());
}

// Two GPUs: compute-heavy X runs on GPU 0, memory-heavy Y on GPU 1, and Z's model is on both.
// Z joins the runner it interferes with least: memory-heavy Z beside X (max(1.4, 1.4) = 1.4,
// beside Y 1.6); compute-heavy Z beside Y (max(1.4, 1.4) = 1.4, beside X 1.8).
class Pairing : public Sharing {
 protected:
  int place_z(Intensity z) {
    make(2, sharing());
    add(1, function(200, 30 * kMs, kComputeHeavy));  // X
    add(2, function(100, 30 * kMs, kMemoryHeavy));   // Y
    add(3, function(50, 10 * kMs, z));               // Z
    EXPECT_EQ(run_once(1), 0);                       // X on GPU 0 (both empty: the lowest)
    EXPECT_EQ(run_once(2), 1);                       // Y on GPU 1 (more room)
    // Z onto GPU 0 while Y runs on GPU 1, then onto GPU 1 while X runs on GPU 0.
    // (X and Y run for their 30 ms: the scheduler measures resident executions.)
    RequestId y = start(2);
    EXPECT_EQ(run_once(3), 0);
    now_ += 30 * kMs;
    EXPECT_TRUE(s_->done(y, now_).ok());
    RequestId x = start(1);
    EXPECT_EQ(run_once(3), 1);
    now_ += 30 * kMs;
    EXPECT_TRUE(s_->done(x, now_).ok());
    // Now X runs on GPU 0 and Y on GPU 1.
    EXPECT_EQ((start(1), last_gpu_), 0);
    EXPECT_EQ((start(2), last_gpu_), 1);
    EXPECT_TRUE(s_->arrive(FunctionId{3}, now_).ok());
    const std::vector<Decision> d = dispatch(*s_, now_);
    EXPECT_INVARIANTS(*s_);
    if (d.size() != 1 || d[0].rule != PlacementRule::kShared) return -1;
    return d[0].gpu;
  }
};

TEST_F(Pairing, MemoryHeavyJoinsComputeHeavy) { EXPECT_EQ(place_z({0.5, 0.8}), 0); }
TEST_F(Pairing, ComputeHeavyJoinsMemoryHeavy) { EXPECT_EQ(place_z({0.9, 0.6}), 1); }

}  // namespace
}  // namespace hiber::scheduler
