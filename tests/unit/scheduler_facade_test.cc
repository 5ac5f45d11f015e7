// The Scheduler facade's event flow: arrive, dispatch, load_done, done, cancel, unregister,
// make_room and GPU health, with every invariant checked after every step; and its answers to
// bad input.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include "scheduler_test_support.h"

namespace hiber::scheduler {
namespace {

using testing::dispatch;
using testing::kMs;
using testing::make_scheduler;
using testing::spec;
using testing::torpor_topology;

constexpr uint64_t kGpu = 4 * kGiB;

class FacadeTest : public ::testing::Test {
 protected:
  void SetUp() override { topology_ = std::make_unique<Topology>(torpor_topology(kGpu)); }

  std::unique_ptr<Scheduler> scheduler(const SchedulerOptions& options = {}) {
    return make_scheduler(*topology_, options);
  }

  std::unique_ptr<Topology> topology_;
};

TEST_F(FacadeTest, ColdRequestLoadsFromHostThenNextRunsResident) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{7}, spec(kGiB), 0).ok());
  Result<RequestId> r1 = s->arrive(FunctionId{7}, 0);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(s->queued(), 1u);
  EXPECT_INVARIANTS(*s);

  std::vector<Decision> d = dispatch(*s, 0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, *r1);
  EXPECT_EQ(d[0].function, FunctionId{7});
  EXPECT_EQ(d[0].gpu, 0);  // every GPU equally free: the lowest
  EXPECT_EQ(d[0].source, Source::kHost);
  EXPECT_EQ(d[0].rule, PlacementRule::kHostQuietNeighbours);
  EXPECT_TRUE(d[0].evictions.empty());
  EXPECT_EQ(d[0].arrival_index, 0u);
  EXPECT_EQ(s->request(*r1)->state, RequestState::kLoading);
  EXPECT_EQ(s->node().host_loading(), gpu_bit(0));
  EXPECT_EQ(s->node().available(), 0b1110u);
  EXPECT_EQ(s->queued(), 0u);
  EXPECT_INVARIANTS(*s);

  ASSERT_TRUE(s->load_done(*r1, 5 * kMs, true).ok());
  const FunctionIndex f = *s->functions().find(FunctionId{7});
  EXPECT_EQ(s->node().holders(f), gpu_bit(0));
  EXPECT_EQ(s->node().host_loading(), 0u);
  EXPECT_EQ(s->request(*r1)->state, RequestState::kRunning);
  EXPECT_EQ(s->functions().stats(f).host_swap.samples, 1u);
  EXPECT_INVARIANTS(*s);

  ASSERT_TRUE(s->done(*r1, 15 * kMs).ok());
  EXPECT_EQ(s->node().available(), 0b1111u);
  EXPECT_EQ(s->request(*r1)->state, RequestState::kFinished);
  EXPECT_INVARIANTS(*s);

  Result<RequestId> r2 = s->arrive(FunctionId{7}, 20 * kMs);
  ASSERT_TRUE(r2.ok());
  d = dispatch(*s, 20 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_EQ(d[0].source, Source::kResident);
  EXPECT_EQ(d[0].rule, PlacementRule::kResident);
  EXPECT_EQ(s->request(*r2)->state, RequestState::kRunning);
  EXPECT_INVARIANTS(*s);
  ASSERT_TRUE(s->done(*r2, 30 * kMs).ok());
  // A resident run without a measured execution time counts dispatch -> done as one.
  EXPECT_EQ(s->functions().stats(f).exec.samples, 1u);
  EXPECT_DOUBLE_EQ(s->functions().stats(f).exec.value, 10.0 * kMs);

  const SchedulerCounters& c = s->counters();
  EXPECT_EQ(c.arrivals, 2u);
  EXPECT_EQ(c.dispatched, 2u);
  EXPECT_EQ(c.completed, 2u);
  EXPECT_EQ(c.on_time, 2u);
  EXPECT_EQ(c.host_swaps, 1u);
  EXPECT_EQ(c.resident_starts, 1u);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, AModelResidentOnlyOnABusyGpuIsCopiedAndAFullTargetMakesTheCopyAMove) {
  // 3 GiB GPUs: A (2 GiB) on GPU 0, C1..C3 (2 GiB) on GPUs 1..3, then B (1 GiB) runs on GPU 0.
  const Topology small = torpor_topology(3 * kGiB);
  auto s = make_scheduler(small);
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(2 * kGiB), 0).ok());  // A
  ASSERT_TRUE(s->register_function(FunctionId{2}, spec(kGiB), 0).ok());      // B
  for (FunctionId c : testing::function_ids(3, 5))
    ASSERT_TRUE(s->register_function(c, spec(2 * kGiB), 0).ok());
  auto run = [&](FunctionId f, Time t, int expected_gpu) {
    const RequestId r = *s->arrive(f, t);
    const std::vector<Decision> d = dispatch(*s, t);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].gpu, expected_gpu) << "function " << f;
    ASSERT_TRUE(s->load_done(r, t + kMs, true).ok());
    ASSERT_TRUE(s->done(r, t + 2 * kMs).ok());
  };
  run(FunctionId{1}, 0, 0);
  run(FunctionId{3}, 10 * kMs, 1);
  run(FunctionId{4}, 20 * kMs, 2);
  run(FunctionId{5}, 30 * kMs, 3);
  const RequestId b = *s->arrive(FunctionId{2}, 40 * kMs);
  ASSERT_EQ(dispatch(*s, 40 * kMs).size(), 1u);
  ASSERT_EQ(s->request(b)->gpu, 0);

  const RequestId a = *s->arrive(FunctionId{1}, 50 * kMs);
  const std::vector<Decision> d = dispatch(*s, 50 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].gpu, 3);  // 50 GB/s to GPU 0
  EXPECT_EQ(d[0].source, Source::kPeer);
  EXPECT_EQ(d[0].source_gpu, 0);
  EXPECT_EQ(d[0].evictions, (std::vector<Eviction>{{FunctionId{5}, 3, 2 * kGiB}}));
  EXPECT_TRUE(d[0].release_source);
  const FunctionIndex fa = *s->functions().find(FunctionId{1});
  EXPECT_EQ(s->node().find(0, fa)->source_pins, 1u);
  EXPECT_INVARIANTS(*s);

  ASSERT_TRUE(s->load_done(a, 60 * kMs, true).ok());
  EXPECT_EQ(s->node().holders(fa), gpu_bit(3)) << "the source left the view: one replica";
  EXPECT_EQ(s->node().find(0, fa), nullptr);
  EXPECT_EQ(s->counters().peer_swaps, 1u);
  EXPECT_EQ(s->counters().evictions, 1u);
  EXPECT_EQ(s->counters().evicted_bytes, 2 * kGiB);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, AFunctionAtItsConcurrencyLimitWaitsWhileOthersRun) {
  auto s = scheduler();  // one request per function at a time
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  ASSERT_TRUE(s->register_function(FunctionId{2}, spec(kGiB), 0).ok());
  const RequestId a1 = *s->arrive(FunctionId{1}, 0);
  const RequestId a2 = *s->arrive(FunctionId{1}, 0);
  const RequestId b = *s->arrive(FunctionId{2}, kMs);
  std::vector<Decision> d = dispatch(*s, kMs);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].request, a1);
  EXPECT_EQ(d[1].request, b);
  EXPECT_EQ(s->request(a2)->state, RequestState::kQueued);
  EXPECT_INVARIANTS(*s);
  ASSERT_TRUE(s->load_done(a1, 2 * kMs, true).ok());
  ASSERT_TRUE(s->done(a1, 3 * kMs).ok());
  d = dispatch(*s, 3 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, a2);
  EXPECT_EQ(d[0].source, Source::kResident);
  EXPECT_INVARIANTS(*s);

  SchedulerOptions two;
  two.per_function_concurrency = 2;
  auto t = scheduler(two);
  ASSERT_TRUE(t->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  ASSERT_TRUE(t->arrive(FunctionId{1}, 0).ok());
  ASSERT_TRUE(t->arrive(FunctionId{1}, 0).ok());
  d = dispatch(*t, 0);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NE(d[0].gpu, d[1].gpu);
  EXPECT_INVARIANTS(*t);
}

TEST_F(FacadeTest, ARequestThatCannotBePlacedDoesNotBlockTheNextFunction) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(3 * kGiB), 0).ok());  // big
  ASSERT_TRUE(s->register_function(FunctionId{2}, spec(kGiB), 0).ok());      // small
  for (FunctionId f : testing::function_ids(10, 12))
    ASSERT_TRUE(s->register_function(f, spec(kGiB), 0).ok());
  for (FunctionId f : testing::function_ids(10, 12)) ASSERT_TRUE(s->arrive(f, 0).ok());
  ASSERT_EQ(dispatch(*s, 0).size(), 3u);  // GPUs 0..2 busy
  s->set_reserved(3, 2 * kGiB);           // GPU 3 can never hold 3 GiB
  const RequestId big = *s->arrive(FunctionId{1}, kMs);
  const RequestId small = *s->arrive(FunctionId{2}, 2 * kMs);
  const std::vector<Decision> d = dispatch(*s, 2 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, small);
  EXPECT_EQ(d[0].gpu, 3);
  EXPECT_EQ(s->request(big)->state, RequestState::kQueued);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, AGpuWhereEvictionCannotMakeRoomIsExcludedAndTheQueueMovesOn) {
  SchedulerOptions two;
  two.per_function_concurrency = 2;
  auto s = scheduler(two);
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(3 * kGiB), 0).ok());  // X
  ASSERT_TRUE(s->register_function(FunctionId{2}, spec(2 * kGiB), 0).ok());  // Y
  ASSERT_TRUE(s->register_function(FunctionId{3}, spec(kGiB), 0).ok());      // Z
  ASSERT_TRUE(s->register_function(FunctionId{4}, spec(kGiB), 0).ok());
  ASSERT_TRUE(s->register_function(FunctionId{5}, spec(kGiB), 0).ok());
  const RequestId x1 = *s->arrive(FunctionId{1}, 0);
  ASSERT_EQ(dispatch(*s, 0)[0].gpu, 0);
  ASSERT_TRUE(s->load_done(x1, kMs, true).ok());
  ASSERT_TRUE(s->arrive(FunctionId{4}, kMs).ok());
  ASSERT_TRUE(s->arrive(FunctionId{5}, kMs).ok());
  std::vector<Decision> d = dispatch(*s, kMs);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].gpu, 1);
  EXPECT_EQ(d[1].gpu, 2);
  // A second X copies from GPU 0 to GPU 3, pinning X's replica on GPU 0.
  const RequestId x2 = *s->arrive(FunctionId{1}, 2 * kMs);
  d = dispatch(*s, 2 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].gpu, 3);
  EXPECT_EQ(d[0].source, Source::kPeer);
  ASSERT_TRUE(s->done(x1, 3 * kMs).ok());
  // GPU 0 is free but full of a pinned X: Y cannot go there, Z (1 GiB) fits without evicting.
  const RequestId y = *s->arrive(FunctionId{2}, 4 * kMs);
  const RequestId z = *s->arrive(FunctionId{3}, 5 * kMs);
  d = dispatch(*s, 5 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, z);
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_TRUE(d[0].evictions.empty());
  EXPECT_EQ(s->request(y)->state, RequestState::kQueued);
  EXPECT_INVARIANTS(*s);
  // Once the copy is done, X on GPU 0 is a duplicate and leaves for Y.
  ASSERT_TRUE(s->load_done(x2, 6 * kMs, true).ok());
  ASSERT_TRUE(s->load_done(z, 6 * kMs, true).ok());
  ASSERT_TRUE(s->done(z, 7 * kMs).ok());
  d = dispatch(*s, 7 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].request, y);
  EXPECT_EQ(d[0].gpu, 0);
  EXPECT_EQ(d[0].evictions, (std::vector<Eviction>{{FunctionId{1}, 0, 3 * kGiB}}));
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, CancelWithdrawsQueuedRequestsAndReleasesDispatchedOnes) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  const RequestId r1 = *s->arrive(FunctionId{1}, 0);
  const RequestId r2 = *s->arrive(FunctionId{1}, 0);
  ASSERT_EQ(dispatch(*s, 0).size(), 1u);  // r1 loads on GPU 0
  ASSERT_TRUE(s->cancel(r2, kMs).ok());
  EXPECT_EQ(s->queued(), 0u);
  EXPECT_INVARIANTS(*s);
  ASSERT_TRUE(s->cancel(r1, 2 * kMs).ok());
  EXPECT_EQ(s->node().available(), 0b1111u);
  EXPECT_EQ(s->node().gpu(0).replicas.size(), 0u) << "the loading replica is dropped";
  EXPECT_EQ(s->node().host_loading(), 0u);
  EXPECT_EQ(s->cancel(r1, 3 * kMs).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->counters().cancelled, 2u);
  EXPECT_EQ(s->counters().failed, 1u);
  EXPECT_EQ(s->counters().completed, 1u);
  EXPECT_EQ(s->counters().on_time, 0u);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, UnregisterCancelsQueuedRequestsButNotRunningOnes) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  const RequestId r1 = *s->arrive(FunctionId{1}, 0);
  ASSERT_EQ(dispatch(*s, 0).size(), 1u);
  const RequestId r2 = *s->arrive(FunctionId{1}, kMs);
  const RequestId r3 = *s->arrive(FunctionId{1}, kMs);
  std::vector<RequestId> cancelled;
  EXPECT_EQ(s->unregister_function(FunctionId{1}, kMs, &cancelled).code(),
            ErrorCode::kIllegalState);
  EXPECT_TRUE(cancelled.empty());
  ASSERT_TRUE(s->load_done(r1, 2 * kMs, true).ok());
  ASSERT_TRUE(s->done(r1, 3 * kMs).ok());
  ASSERT_TRUE(s->unregister_function(FunctionId{1}, 3 * kMs, &cancelled).ok());
  EXPECT_EQ(cancelled, (std::vector<RequestId>{r2, r3}));
  EXPECT_EQ(s->queued(), 0u);
  EXPECT_EQ(s->node().gpu(0).replicas.size(), 0u);
  EXPECT_EQ(s->arrive(FunctionId{1}, 4 * kMs).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->unregister_function(FunctionId{1}, 4 * kMs, nullptr).code(), ErrorCode::kNotFound);
  EXPECT_INVARIANTS(*s);
  // The id can come back, as a new function.
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(2 * kGiB), 5 * kMs).ok());
  ASSERT_TRUE(s->arrive(FunctionId{1}, 5 * kMs).ok());
  const std::vector<Decision> d = dispatch(*s, 5 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].source, Source::kHost);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, MakeRoomEvictsButNeverTheRunningOrKeptModel) {
  auto s = scheduler();
  for (FunctionId f : testing::function_ids(1, 4))
    ASSERT_TRUE(s->register_function(f, spec(kGiB), 0).ok());
  // Models 1..4 all go to GPU 0: the first while the node is idle, the others while GPUs 1-3
  // run three other functions.
  for (FunctionId f : testing::function_ids(10, 12))
    ASSERT_TRUE(s->register_function(f, spec(kGiB), 0).ok());
  Time t = 0;
  for (FunctionId f : testing::function_ids(1, 4)) {
    const RequestId r = *s->arrive(f, t);
    if (f == FunctionId{1}) {
      ASSERT_EQ(dispatch(*s, t).size(), 1u);
      for (FunctionId o : testing::function_ids(10, 12)) ASSERT_TRUE(s->arrive(o, t).ok());
      ASSERT_EQ(dispatch(*s, t).size(), 3u);
    } else {
      ASSERT_EQ(dispatch(*s, t)[0].gpu, 0);
    }
    ASSERT_TRUE(s->load_done(r, t + kMs, true).ok());
    if (f < FunctionId{4}) {
      ASSERT_TRUE(s->done(r, t + 2 * kMs).ok());
    }
    t += 10 * kMs;
  }
  // GPU 0 runs 4 and holds 1, 2, 3, 4: 4 GiB, full.
  std::vector<Eviction> out;
  EXPECT_FALSE(s->make_room(0, 4 * kGiB, FunctionId{3}, t, &out));
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(s->make_room(0, 2 * kGiB, FunctionId{1}, t, &out));
  // Light everywhere: least recently used first, skipping 1 (kept) and 4 (running).
  EXPECT_EQ(out, (std::vector<Eviction>{{FunctionId{2}, 0, kGiB}, {FunctionId{3}, 0, kGiB}}));
  EXPECT_GE(s->node().free_bytes(0), 2 * kGiB);
  out.clear();
  EXPECT_TRUE(s->make_room(0, kGiB, FunctionId{1}, t, &out));
  EXPECT_TRUE(out.empty()) << "already free";
  EXPECT_FALSE(s->make_room(9, kGiB, FunctionId{1}, t, &out));
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, AnUnhealthyGpuGetsNoRequestsAndLosesItsReplicas) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  const RequestId r1 = *s->arrive(FunctionId{1}, 0);
  ASSERT_EQ(dispatch(*s, 0)[0].gpu, 0);
  ASSERT_TRUE(s->load_done(r1, kMs, true).ok());
  s->set_gpu_healthy(0, false);
  EXPECT_EQ(s->node().gpu(0).replicas.size(), 0u);
  EXPECT_EQ(s->node().healthy(), 0b1110u);
  EXPECT_INVARIANTS(*s);
  ASSERT_TRUE(s->done(r1, 2 * kMs).ok()) << "its running request still ends";
  EXPECT_EQ(s->node().available(), 0b1110u);
  const RequestId r2 = *s->arrive(FunctionId{1}, 3 * kMs);
  std::vector<Decision> d = dispatch(*s, 3 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].gpu, 1);
  EXPECT_EQ(d[0].source, Source::kHost);
  ASSERT_TRUE(s->done(r2, 4 * kMs).ok());
  s->set_gpu_healthy(0, true);
  EXPECT_EQ(s->node().available(), 0b1111u);
  s->set_gpu_healthy(7, false);  // not a GPU of this node: ignored
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, AGrownModelOverCommitsItsGpuUntilTheNextPlacementThere) {
  auto s = scheduler();
  for (FunctionId f : testing::function_ids(1, 5))
    ASSERT_TRUE(s->register_function(f, spec(kGiB), 0).ok());
  Time t = 0;
  for (FunctionId f :
       testing::function_ids(1, 4)) {  // 1..4 end up on GPUs 0..3, then 1 runs again on 0
    const RequestId r = *s->arrive(f, t);
    ASSERT_EQ(dispatch(*s, t).size(), 1u);
    ASSERT_TRUE(s->load_done(r, t + kMs, true).ok());
    ASSERT_TRUE(s->done(r, t + 2 * kMs).ok());
    t += 10 * kMs;
  }
  const FunctionIndex f1 = *s->functions().find(FunctionId{1});
  ASSERT_EQ(s->node().holders(f1), gpu_bit(0));
  ASSERT_TRUE(s->set_model_bytes(FunctionId{1}, 4 * kGiB).ok());
  EXPECT_EQ(s->node().gpu(0).used, 4 * kGiB);
  EXPECT_EQ(s->set_model_bytes(FunctionId{1}, 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(s->set_model_bytes(FunctionId{1}, 64 * kGiB).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(s->set_model_bytes(FunctionId{99}, kGiB).code(), ErrorCode::kNotFound);
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, BadInputGetsAClearErrorAndChangesNothing) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{1}, spec(kGiB), 0).ok());
  EXPECT_EQ(s->register_function(FunctionId{1}, spec(kGiB), 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(s->register_function(FunctionId{2}, spec(0), 0).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(s->register_function(FunctionId{3}, spec(5 * kGiB), 0).code(), ErrorCode::kInvalidValue)
      << "larger than every GPU";
  EXPECT_EQ(s->arrive(FunctionId{42}, 0).status().code(), ErrorCode::kNotFound);

  const RequestId r = *s->arrive(FunctionId{1}, 0);
  EXPECT_EQ(s->done(r, 0).code(), ErrorCode::kNotFound) << "still queued";
  EXPECT_EQ(s->load_done(r, 0, true).code(), ErrorCode::kNotFound);
  ASSERT_EQ(dispatch(*s, 0).size(), 1u);
  ASSERT_TRUE(s->load_done(r, kMs, true).ok());
  EXPECT_EQ(s->load_done(r, kMs, true).code(), ErrorCode::kNotFound) << "loaded already";
  ASSERT_TRUE(s->done(r, 2 * kMs).ok());
  EXPECT_EQ(s->done(r, 3 * kMs).code(), ErrorCode::kNotFound) << "done twice";
  EXPECT_EQ(s->cancel(r, 3 * kMs).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->counters().completed, 1u);

  // r's slot is reused by the next request: the stale id still names nothing live.
  const RequestId next = *s->arrive(FunctionId{1}, 4 * kMs);
  EXPECT_EQ(static_cast<uint32_t>(next.value()), static_cast<uint32_t>(r.value()));
  EXPECT_NE(next, r);
  EXPECT_EQ(s->request(r)->state, RequestState::kFinished);
  EXPECT_EQ(s->request(next)->state, RequestState::kQueued);
  EXPECT_EQ(s->cancel(r, 4 * kMs).code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->request(next)->state, RequestState::kQueued);
  EXPECT_EQ(s->request(RequestId{0}).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->request(RequestId{uint64_t{7} << 32 | 5}).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s->rrc(FunctionId{42}, 0), 0.0);
  s->set_reserved(-1, kGiB);
  s->drop_replica(9, FunctionId{1});
  s->drop_replica(0, FunctionId{42});
  EXPECT_INVARIANTS(*s);
}

TEST_F(FacadeTest, CreateRefusesUnknownPoliciesAndBadOptions) {
  auto refused = [&](const SchedulerOptions& o, const FutureOracle* oracle = nullptr) {
    Result<std::unique_ptr<Scheduler>> s = Scheduler::create(*topology_, o, oracle);
    EXPECT_FALSE(s.ok());
    return s.ok() ? Status() : s.status();
  };
  SchedulerOptions o;
  o.queue = "lifo";
  Status st = refused(o);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidValue);
  EXPECT_NE(st.message().find("rrc, fifo, gshare"), std::string::npos) << st;
  o = {};
  o.placement = "best";
  EXPECT_NE(refused(o).message().find("algorithm1, random"), std::string::npos);
  o = {};
  o.eviction = "arc";
  EXPECT_NE(refused(o).message().find("heaviness, lru, lfu"), std::string::npos);
  o = {};
  o.eviction = "belady";
  EXPECT_EQ(refused(o).code(), ErrorCode::kInvalidValue) << "no oracle";
  o = {};
  o.per_function_concurrency = 0;
  EXPECT_EQ(refused(o).code(), ErrorCode::kInvalidValue);
  o = {};
  o.queue_options.target_utilisation = 0;
  EXPECT_EQ(refused(o).code(), ErrorCode::kInvalidValue);
  o = {};
  o.heaviness.ewma_alpha = 2;
  EXPECT_EQ(refused(o).code(), ErrorCode::kInvalidValue);
  o = {};
  o.window.buckets = 0;
  EXPECT_EQ(refused(o).code(), ErrorCode::kInvalidValue);
}

// Regression: a resident start runs no eviction plan, and must not drop the victims of an
// earlier plan (found by hiber-sim: an eviction counted for a start that evicted nothing).
TEST_F(FacadeTest, AResidentStartEvictsNothingAfterAnEarlierPlanHadVictims) {
  auto s = scheduler();
  // GPU memory 4 GiB: three 1.5 GiB models cannot share a GPU.
  for (FunctionId id : testing::function_ids(1, 3))
    ASSERT_TRUE(s->register_function(id, spec(1536 * kMiB), 0).ok());
  Time now = 0;
  // 1 then 2 load onto GPU 0 only (the others are drained), 2 evicting nothing, 3 evicting 1.
  for (int g : {1, 2, 3}) s->set_gpu_healthy(g, false);
  auto run = [&](FunctionId id) {
    Result<RequestId> r = s->arrive(id, now);
    EXPECT_TRUE(r.ok());
    std::vector<Decision> d = dispatch(*s, now);
    EXPECT_EQ(d.size(), 1u);
    if (d.size() == 1 && d[0].source != Source::kResident) {
      EXPECT_TRUE(s->load_done(*r, ++now, true).ok());
    }
    EXPECT_TRUE(s->done(*r, ++now).ok());
    EXPECT_INVARIANTS(*s);
    return d.empty() ? Decision{.request = RequestId{0}, .function = id} : d[0];
  };
  EXPECT_TRUE(run(FunctionId{1}).evictions.empty());
  EXPECT_TRUE(run(FunctionId{2}).evictions.empty());
  const Decision third = run(FunctionId{3});
  ASSERT_EQ(third.evictions.size(), 1u);
  EXPECT_EQ(s->counters().evictions, 1u);
  // 3 is resident now: its start plans nothing, so nothing more leaves.
  const Decision again = run(FunctionId{3});
  EXPECT_EQ(again.source, Source::kResident);
  EXPECT_TRUE(again.evictions.empty());
  EXPECT_EQ(s->counters().evictions, 1u);
  const FunctionIndex survivor = *s->functions().find(FunctionId{2});
  EXPECT_EQ(s->node().holders(survivor), gpu_bit(0)) << "the other model stays";
}

// A background request (a function's own use of a GPU outside its callers' requests) is
// scheduled like any other but counts for none of the function's request statistics.
TEST_F(FacadeTest, BackgroundRequestsHoldAGpuButDoNotCountAsTheFunctionsRequests) {
  auto s = scheduler();
  ASSERT_TRUE(s->register_function(FunctionId{7}, spec(kGiB, /*slo=*/10 * kMs), 0).ok());
  const FunctionIndex f = *s->functions().find(FunctionId{7});
  Result<RequestId> b = s->arrive(FunctionId{7}, 0, /*background=*/true);
  ASSERT_TRUE(b.ok());
  std::vector<Decision> d = dispatch(*s, 0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(s->node().available(), 0b1110u) << "it holds its GPU";
  ASSERT_TRUE(s->load_done(*b, kMs, true).ok());
  // Far past its SLO: a caller's request would be late.
  ASSERT_TRUE(s->done(*b, 500 * kMs).ok());
  EXPECT_INVARIANTS(*s);
  EXPECT_EQ(s->counters().arrivals, 0u);
  EXPECT_EQ(s->counters().background, 1u);
  EXPECT_EQ(s->counters().completed, 0u);
  EXPECT_EQ(s->functions().stats(f).requests, 0u);
  EXPECT_EQ(s->functions().stats(f).window.totals(500 * kMs).completions, 0u);
  EXPECT_EQ(s->functions().stats(f).exec.samples, 0u);
  EXPECT_EQ(s->functions().stats(f).host_swap.samples, 1u) << "its swap was a real swap";
  EXPECT_EQ(s->rrc(FunctionId{7}, 500 * kMs), 0.0);
  // The model it loaded is resident for the next caller's request.
  Result<RequestId> r = s->arrive(FunctionId{7}, 600 * kMs);
  ASSERT_TRUE(r.ok());
  d = dispatch(*s, 600 * kMs);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].source, Source::kResident);
}

}  // namespace
}  // namespace hiber::scheduler
