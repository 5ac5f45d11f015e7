// The node core driven with scripted events: each test checks the actuator calls it makes (what
// it evicts, starts, ends, forgets and answers) and the state of its requests, against what the
// request life cycle in node/node_core.h promises.
#include "node/node_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "scheduler_test_support.h"

namespace hiber::node {
namespace {

using scheduler::kGiB;
using scheduler::kMillisecond;
using scheduler::PlacementRule;
using scheduler::Source;
using scheduler::Topology;
using scheduler::testing::plain_topology;
using scheduler::testing::torpor_topology;

constexpr Duration kMs = kMillisecond;

// Records every call, and keeps a memory ledger that behaves like a pool: a start places the
// model (and nothing else), evict and forget free it.
class RecordingActuator final : public Actuator {
 public:
  struct EndCall {
    RequestId request;
    InstanceId instance;
    Status failure;
  };

  Result<uint64_t> evict(InstanceId instance, GpuId gpu) override {
    log.push_back(str_cat("evict f", instance, " g", gpu));
    const uint64_t freed = placed[{instance, gpu}];
    allocated[gpu] -= freed;
    placed.erase({instance, gpu});
    return freed;
  }
  void forget(InstanceId instance, GpuId gpu) override {
    log.push_back(str_cat("forget f", instance, " g", gpu));
    allocated[gpu] -= placed[{instance, gpu}];
    placed.erase({instance, gpu});
  }
  void start(const Start& s) override {
    log.push_back(str_cat("start r", s.request, " f", s.instance, " g", s.gpu, " ",
                          scheduler::source_name(s.source), s.background ? " background" : "",
                          s.release_source ? " move" : ""));
    starts.push_back(s);
    if (s.source != Source::kResident) {
      const uint64_t bytes = model_sizes.count(s.instance) ? model_sizes[s.instance] : 0;
      uint64_t& here = placed[{s.instance, s.gpu}];
      allocated[s.gpu] += bytes - here;
      here = bytes;
    }
  }
  void end(RequestId request, InstanceId instance, const Status& failure) override {
    log.push_back(str_cat("end r", request, failure.ok() ? "" : " failed"));
    ends.push_back({request, instance, failure});
  }
  void answer_start(RequestId request, const Result<StartInfo>& answer) override {
    log.push_back(str_cat("answer r", request, answer.ok() ? " ok" : " error"));
    answers.emplace(request, answer);
  }
  void rejected(RequestId request, InstanceId, const Status& why) override {
    log.push_back(str_cat("rejected r", request));
    rejections.emplace(request, why);
  }
  void drained(std::optional<GpuId> gpu) override {
    log.push_back(gpu ? str_cat("drained g", *gpu) : std::string("drained node"));
  }
  uint64_t pool_allocated(GpuId gpu) const override {
    auto it = allocated.find(gpu);
    return it == allocated.end() ? 0 : it->second;
  }
  uint64_t placed_bytes(InstanceId instance, GpuId gpu) const override {
    auto it = placed.find({instance, gpu});
    return it == placed.end() ? 0 : it->second;
  }
  uint64_t model_bytes(InstanceId instance) const override {
    auto it = model_sizes.find(instance);
    return it == model_sizes.end() ? 1 : it->second;
  }

  std::vector<std::string> take_log() { return std::exchange(log, {}); }

  std::vector<std::string> log;
  std::vector<Start> starts;
  std::vector<EndCall> ends;
  std::map<RequestId, Result<StartInfo>> answers;
  std::map<RequestId, Status> rejections;
  std::map<InstanceId, uint64_t> model_sizes;
  std::map<std::pair<InstanceId, GpuId>, uint64_t> placed;
  std::map<GpuId, uint64_t> allocated;
};

FunctionSpec spec(const std::string& name, uint64_t bytes, bool stateful = false) {
  FunctionSpec s;
  s.name = name;
  s.model_bytes = bytes;
  s.slo = 100 * kMs;
  s.exec_time_hint = 10 * kMs;
  s.stateful = stateful;
  return s;
}

class NodeCoreTest : public ::testing::Test {
 protected:
  void make(const Topology& topology, NodeOptions options = {}) {
    topology_ = std::make_unique<Topology>(topology);
    auto core = NodeCore::create(*topology_, options, actuator_);
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(core).value();
  }
  // Adds a function whose model is `bytes` and attaches its one instance, numbered as the
  // function (instance()).
  FunctionId add(uint32_t id, uint64_t bytes, bool stateful = false) {
    const FunctionId f{id};
    actuator_.model_sizes[instance(f)] = bytes;
    EXPECT_TRUE(core_->add_function(f, spec(str_cat("fn", id), bytes, stateful), now_).ok());
    EXPECT_TRUE(core_->attach(instance(f), f, now_).ok());
    return f;
  }
  static InstanceId instance(FunctionId f) { return InstanceId{f.value()}; }
  // A request the core gives an instance of `f`.
  RequestId arrive(FunctionId f) {
    Result<RequestId> r = core_->arrive(f, std::nullopt, now_);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }
  // Runs one request of `f` to its end: arrives, starts, streams, swaps, done, released.
  Start serve(FunctionId f) {
    const RequestId r = arrive(f);
    core_->dispatch(now_);
    EXPECT_FALSE(actuator_.starts.empty());
    const Start s = actuator_.starts.back();
    EXPECT_EQ(s.request, r);
    core_->streaming(r, Status(), now_);
    if (s.source != Source::kResident) core_->swap_done(r, Status(), {}, now_);
    EXPECT_TRUE(core_->done(r, false, now_).ok());
    core_->released(r, Status(), now_);
    core_->dispatch(now_);
    EXPECT_FALSE(core_->phase(r).has_value());
    return s;
  }

  Time now_ = 0;
  RecordingActuator actuator_;
  std::unique_ptr<Topology> topology_;
  std::unique_ptr<NodeCore> core_;
};

TEST_F(NodeCoreTest, ARequestLoadsFromTheHostRunsAndEndsThenTheNextRunsResident) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId r = arrive(f);
  EXPECT_EQ(core_->phase(r), Phase::kQueued);
  ASSERT_TRUE(core_->await_start(r, now_).ok());
  EXPECT_TRUE(actuator_.answers.empty()) << "nothing runs before dispatch";

  now_ = 5 * kMs;
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 1u);
  const Start& s = actuator_.starts[0];
  EXPECT_EQ(s.function, f);
  EXPECT_EQ(s.gpu, GpuId{0});
  EXPECT_EQ(s.source, Source::kHost);
  EXPECT_TRUE(s.first_request);
  EXPECT_FALSE(s.background);
  EXPECT_EQ(core_->phase(r), Phase::kPlacing);
  EXPECT_EQ(core_->running(GpuId{0}), r);

  now_ = 7 * kMs;
  core_->streaming(r, Status(), now_);
  EXPECT_EQ(core_->phase(r), Phase::kRunning);
  ASSERT_EQ(actuator_.answers.count(r), 1u);
  const Result<StartInfo>& answer = actuator_.answers.at(r);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->gpu, GpuId{0});
  EXPECT_EQ(answer->source, Source::kHost);
  EXPECT_EQ(answer->queued, 7 * kMs) << "from arrival to the answer";

  core_->swap_done(r, Status(), SwapStats{kGiB, 3 * kMs}, now_);
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  EXPECT_EQ(core_->phase(r), Phase::kEnding);
  ASSERT_EQ(actuator_.ends.size(), 1u);
  EXPECT_TRUE(actuator_.ends[0].failure.ok());
  EXPECT_EQ(core_->running(GpuId{0}), r) << "the GPU is busy until the work drains";
  core_->released(r, Status(), now_);
  EXPECT_FALSE(core_->phase(r).has_value()) << "done and released: forgotten";
  EXPECT_FALSE(core_->running(GpuId{0}).has_value());

  const Start second = serve(f);
  EXPECT_EQ(second.source, Source::kResident);
  EXPECT_FALSE(second.first_request);
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.gpus[0].swaps_in, 1u);
  EXPECT_EQ(status.gpus[0].swap_in_bytes, kGiB);
  // By link: the one swap came from the host; its 3 ms fall in the (2.5 ms, 5 ms] bucket.
  const auto host = static_cast<size_t>(node::SwapLink::kHost);
  EXPECT_EQ(status.swaps_by_link[host].swaps, 1u);
  EXPECT_EQ(status.swaps_by_link[host].bytes, kGiB);
  EXPECT_EQ(status.swaps_by_link[static_cast<size_t>(node::SwapLink::kNvlink)].swaps, 0u);
  EXPECT_EQ(status.swaps_by_link[static_cast<size_t>(node::SwapLink::kPcie)].swaps, 0u);
  EXPECT_EQ(status.swap_seconds.count, 1u);
  EXPECT_DOUBLE_EQ(status.swap_seconds.sum, 0.003);
  ASSERT_EQ(status.swap_seconds.upper_bounds.at(2), 0.005);
  EXPECT_EQ(status.swap_seconds.counts.at(2), 1u);
  EXPECT_EQ(status.counters.completed, 2u);
  EXPECT_EQ(status.counters.on_time, 2u);
}

// A load from the host that finds the whole model in place (a function's first lease, before it
// has a model to bring) moves nothing: it is answered as resident and counts no swap, so the
// counters never hold a 0-byte, 0 s host swap that the caller was told nothing about.
TEST_F(NodeCoreTest, AStartThatMovesNothingIsResidentAndNoSwap) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId r = arrive(f);
  ASSERT_TRUE(core_->await_start(r, now_).ok());
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 1u);
  EXPECT_EQ(actuator_.starts[0].source, Source::kHost);  // the placement expected a load
  core_->streaming(r, Status(), now_, /*moves_nothing=*/true);
  ASSERT_EQ(actuator_.answers.count(r), 1u);
  ASSERT_TRUE(actuator_.answers.at(r).ok());
  EXPECT_EQ(actuator_.answers.at(r)->source, Source::kResident);
  core_->swap_done(r, Status(), SwapStats{0, 0}, now_);
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  core_->released(r, Status(), now_);
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.gpus[0].swaps_in, 0u);
  for (const NodeStatus::LinkSwaps& by_link : status.swaps_by_link) {
    EXPECT_EQ(by_link.swaps, 0u);
    EXPECT_EQ(by_link.bytes, 0u);
  }
  EXPECT_EQ(status.swap_seconds.count, 0u);
  EXPECT_EQ(status.counters.completed, 1u);
  // A second request of another function that does move bytes is a host swap, counted.
  const FunctionId g = add(2, kGiB);
  const RequestId r2 = arrive(g);
  ASSERT_TRUE(core_->await_start(r2, now_).ok());
  core_->dispatch(now_);
  core_->streaming(r2, Status(), now_);
  EXPECT_EQ(actuator_.answers.at(r2)->source, Source::kHost);
  core_->swap_done(r2, Status(), SwapStats{kGiB, 1'000'000}, now_);
  EXPECT_EQ(core_->status(now_).gpus[0].swaps_in, 1u);
  EXPECT_EQ(core_->status(now_).gpus[0].swap_in_bytes, kGiB);
}

// The same when the swap's end is reported before its streaming: hiberd's swap ends on the
// device's callback thread, and with nothing to copy it can end at once.
TEST_F(NodeCoreTest, ASwapThatEndsBeforeItsStreamingAndMovedNothingIsNoSwap) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId r = arrive(f);
  ASSERT_TRUE(core_->await_start(r, now_).ok());
  core_->dispatch(now_);
  core_->swap_done(r, Status(), SwapStats{0, 0}, now_);
  core_->streaming(r, Status(), now_, /*moves_nothing=*/true);
  ASSERT_TRUE(actuator_.answers.at(r).ok());
  EXPECT_EQ(actuator_.answers.at(r)->source, Source::kResident);
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.gpus[0].swaps_in, 0u);
  EXPECT_EQ(status.swap_seconds.count, 0u);
}

TEST_F(NodeCoreTest, BackgroundRequestsAreOneAtATimeAndForgottenWhenReleased) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  core_->need_gpu(instance(f), now_);
  core_->need_gpu(instance(f), now_);  // asked again before the grant: still one
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 1u);
  const Start s = actuator_.starts[0];
  EXPECT_TRUE(s.background);
  EXPECT_FALSE(s.first_request) << "a background request does not fix the model";
  core_->need_gpu(instance(f), now_);  // holds a lease: nothing more
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.starts.size(), 1u);
  EXPECT_EQ(core_->await_start(s.request, now_).code(), ErrorCode::kNotFound)
      << "nobody waits for a background request";
  core_->streaming(s.request, Status(), now_);
  core_->swap_done(s.request, Status(), {}, now_);
  core_->released(s.request, Status(), now_);
  EXPECT_FALSE(core_->phase(s.request).has_value());
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.counters.background, 1u);
  EXPECT_EQ(status.counters.arrivals, 0u);
}

// Lease slices (issue 18, item 6): a background request that has held the only GPU for a slice
// gives it up when another function waits, and not before; the next one gets it, and the
// preempted function queues behind.
TEST_F(NodeCoreTest, ABackgroundLeasePastItsSliceIsPreemptedWhenAnotherFunctionWaits) {
  NodeOptions options;
  options.lease_slice = 50 * kMs;
  make(plain_topology(1, 16 * kGiB), options);
  const FunctionId busy = add(1, kGiB);
  const FunctionId other = add(2, kGiB);
  core_->need_gpu(instance(busy), now_);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 1u);
  const RequestId hog = actuator_.starts[0].request;
  core_->streaming(hog, Status(), now_);
  core_->swap_done(hog, Status(), {}, now_);
  EXPECT_EQ(core_->next_wakeup(), scheduler::Scheduler::kNever) << "nobody waits: no slice ends";

  now_ = 10 * kMs;
  core_->need_gpu(instance(other), now_);
  EXPECT_EQ(core_->next_wakeup(), 50 * kMs) << "the slice counts from the busy lease's start";
  core_->dispatch(now_);
  EXPECT_TRUE(actuator_.ends.empty()) << "within its slice the lease keeps the GPU";
  EXPECT_EQ(actuator_.starts.size(), 1u);

  now_ = 50 * kMs;
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.ends.size(), 1u);
  EXPECT_EQ(actuator_.ends[0].request, hog);
  EXPECT_EQ(actuator_.ends[0].instance, instance(busy));
  EXPECT_TRUE(actuator_.ends[0].failure.ok()) << "an ordinary end: its work drains and is kept";
  EXPECT_EQ(core_->phase(hog), Phase::kEnding);
  EXPECT_EQ(core_->status(now_).preemptions, 1u);
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.ends.size(), 1u) << "ended once";

  // The busy function asks again as soon as its lease is gone: it queues behind the other.
  now_ = 52 * kMs;
  core_->released(hog, Status(), now_);
  core_->need_gpu(instance(busy), now_);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 2u);
  const Start next = actuator_.starts[1];
  EXPECT_EQ(next.function, other);
  EXPECT_TRUE(next.background);
  EXPECT_EQ(core_->status(now_).gpus[0].evictions, 0u)
      << "the preempted model stays on the GPU while there is room";
  EXPECT_EQ(core_->running(GpuId{0}), next.request);

  // And the slice turns: the other function's lease goes back to the busy one a slice later.
  core_->streaming(next.request, Status(), now_);
  core_->swap_done(next.request, Status(), {}, now_);
  now_ = 101 * kMs;
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.ends.size(), 1u) << "49 ms into its slice";
  now_ = 102 * kMs;
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.ends.size(), 2u);
  EXPECT_EQ(actuator_.ends[1].request, next.request);
  core_->released(next.request, Status(), now_);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 3u);
  EXPECT_EQ(actuator_.starts[2].function, busy);
  EXPECT_EQ(actuator_.starts[2].source, Source::kResident) << "its replica stayed";
}

TEST_F(NodeCoreTest, NoPreemptionWithoutASliceForCallersRequestsOrForTheSameFunction) {
  // Without a slice (the default), a background lease is never ended by others waiting.
  make(plain_topology(1, 16 * kGiB));
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  core_->need_gpu(instance(a), now_);
  core_->dispatch(now_);
  core_->streaming(actuator_.starts[0].request, Status(), now_);
  core_->need_gpu(instance(b), now_);
  now_ = 3600 * scheduler::kSecond;
  core_->dispatch(now_);
  EXPECT_TRUE(actuator_.ends.empty());
  EXPECT_EQ(core_->next_wakeup(), scheduler::Scheduler::kNever);

  // With one, a caller's request is never preempted: it ends when the caller says done.
  NodeOptions options;
  options.lease_slice = 10 * kMs;
  actuator_ = RecordingActuator();
  now_ = 0;
  make(plain_topology(1, 16 * kGiB), options);
  const FunctionId c = add(1, kGiB);
  const FunctionId d = add(2, kGiB);
  const RequestId r = arrive(c);
  core_->dispatch(now_);
  core_->streaming(r, Status(), now_);
  core_->need_gpu(instance(d), now_);
  now_ = 100 * kMs;
  core_->dispatch(now_);
  EXPECT_TRUE(actuator_.ends.empty()) << "a caller's request is not preempted";

  // Nor is a background lease when only its own function's request waits.
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  core_->released(r, Status(), now_);
  core_->dispatch(now_);  // d's background request starts
  ASSERT_EQ(actuator_.starts.size(), 2u);
  const RequestId bg = actuator_.starts[1].request;
  core_->streaming(bg, Status(), now_);
  const RequestId own = arrive(d);  // its own caller's request waits behind it
  now_ = 200 * kMs;
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.ends.size(), 1u) << "only r's end; the background lease stays";
  EXPECT_EQ(core_->phase(own), Phase::kQueued);
}

TEST_F(NodeCoreTest, PreemptionEndsNoMoreLeasesThanThereAreWaitersLongestHeldFirst) {
  NodeOptions options;
  options.lease_slice = 10 * kMs;
  make(plain_topology(2, 16 * kGiB), options);
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  const FunctionId waiter = add(3, kGiB);
  core_->need_gpu(instance(a), now_);
  core_->dispatch(now_);
  now_ = 5 * kMs;
  core_->need_gpu(instance(b), now_);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 2u);
  for (const Start& s : actuator_.starts) core_->streaming(s.request, Status(), now_);
  core_->need_gpu(instance(waiter), now_);
  now_ = 30 * kMs;  // both are past their slice
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.ends.size(), 1u) << "one waiter: one GPU is enough";
  EXPECT_EQ(actuator_.ends[0].instance, instance(a)) << "the lease held longest goes first";
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.ends.size(), 1u) << "a GPU on its way back covers the waiter";
}

TEST_F(NodeCoreTest, AQueuedCallerRequestServesTheInstancesOwnNeedsToo) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId busy = add(1, kGiB);
  const FunctionId f = add(2, kGiB);
  const RequestId hog = arrive(busy);
  core_->dispatch(now_);  // the only GPU is taken
  const RequestId r = arrive(f);
  core_->need_gpu(instance(f), now_);  // its calls will run under r's lease
  core_->streaming(hog, Status(), now_);
  core_->swap_done(hog, Status(), {}, now_);
  ASSERT_TRUE(core_->done(hog, false, now_).ok());
  core_->released(hog, Status(), now_);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 2u);
  EXPECT_EQ(actuator_.starts[1].request, r);
  EXPECT_EQ(core_->status(now_).counters.background, 0u) << "no background request was made";
}

TEST_F(NodeCoreTest, AFailedGpuEndsItsRequestWhichStaysEndedUntilTheCallerSaysDone) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  const Start sb = serve(b);  // b's model stays on its GPU
  const RequestId r = arrive(a);
  core_->dispatch(now_);
  const Start sa = actuator_.starts.back();
  ASSERT_NE(sa.gpu, sb.gpu) << "Algorithm 1 keeps b's replica";
  core_->streaming(r, Status(), now_);
  actuator_.take_log();

  core_->swap_done(r, error(ErrorCode::kUnknown, "DMA error"), {}, now_);
  std::vector<std::string> log = actuator_.take_log();
  EXPECT_EQ(log, (std::vector<std::string>{str_cat("forget f", b, " g", sa.gpu),
                                           str_cat("end r", r, " failed")}))
      << "every other function's copy there is forgotten at once; the running function's when "
         "its request releases";
  ASSERT_TRUE(core_->await_start(r, now_).ok());  // answered at once: it runs
  core_->released(r, actuator_.ends.back().failure, now_);
  EXPECT_EQ(core_->phase(r), Phase::kEnded);
  log = actuator_.take_log();
  EXPECT_EQ(log, (std::vector<std::string>{str_cat("answer r", r, " ok"),
                                           str_cat("forget f", a, " g", sa.gpu)}));
  EXPECT_TRUE(core_->done(r, false, now_).ok());
  EXPECT_FALSE(core_->phase(r).has_value());
  EXPECT_EQ(core_->done(r, false, now_).code(), ErrorCode::kNotFound);

  // The failed GPU takes no more requests: a's next one runs on the other GPU.
  const Start next = serve(a);
  EXPECT_EQ(next.gpu, sb.gpu);
  EXPECT_FALSE(core_->status(now_).gpus[sa.gpu.value()].healthy);
}

// A held GPU (hiberd resetting its shared context after a fault) takes no new requests, evicts
// nothing and keeps its replicas; released, it takes requests again, and its model is there.
TEST_F(NodeCoreTest, AHeldGpuTakesNoRequestsAndKeepsItsReplicas) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const Start first = serve(f);
  EXPECT_EQ(first.source, Source::kHost);
  ASSERT_TRUE(core_->hold_gpu(GpuId{0}, true).ok());
  const RequestId r = arrive(f);
  actuator_.take_log();
  core_->dispatch(now_);
  EXPECT_EQ(core_->phase(r), Phase::kQueued) << "nothing starts on a held GPU";
  EXPECT_TRUE(actuator_.take_log().empty()) << "and nothing is evicted or forgotten";
  EXPECT_EQ(core_->status(now_).gpus[0].evictions, 0u);

  ASSERT_TRUE(core_->hold_gpu(GpuId{0}, false).ok());
  core_->dispatch(now_);
  ASSERT_EQ(core_->phase(r), Phase::kPlacing);
  EXPECT_EQ(actuator_.starts.back().request, r);
  EXPECT_EQ(actuator_.starts.back().source, Source::kResident) << "the replica stayed";
  EXPECT_EQ(core_->hold_gpu(GpuId{1}, true).code(), ErrorCode::kInvalidDevice);
}

TEST_F(NodeCoreTest, AShedRequestIsAnsweredOverloadedAndEndsUnstartedUntilTheCallerSaysDone) {
  NodeOptions options;
  options.scheduler.shed = scheduler::ShedRule::kLate;
  make(plain_topology(1, 16 * kGiB), options);
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  const RequestId first = arrive(a);
  core_->dispatch(now_);
  core_->streaming(first, Status(), now_);
  core_->swap_done(first, Status(), {}, now_);
  const RequestId waiting = arrive(b);  // SLO 100 ms, execution 10 ms
  ASSERT_TRUE(core_->await_start(waiting, now_).ok());
  actuator_.take_log();

  // The GPU frees at 95 ms: 95 + 10 > 100, so b's request cannot make its deadline.
  now_ = 95 * kMs;
  ASSERT_TRUE(core_->done(first, false, now_).ok());
  core_->released(first, Status(), now_);
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.take_log(), (std::vector<std::string>{str_cat("end r", first),
                                                            str_cat("answer r", waiting, " error"),
                                                            str_cat("rejected r", waiting)}));
  const Result<StartInfo>& answer = actuator_.answers.at(waiting);
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), ErrorCode::kDeviceUnavailable);
  EXPECT_NE(answer.status().message().find("overloaded"), std::string::npos) << answer.status();
  EXPECT_EQ(actuator_.rejections.at(waiting).code(), ErrorCode::kDeviceUnavailable);
  EXPECT_EQ(core_->phase(waiting), Phase::kEnded);
  EXPECT_FALSE(core_->running(GpuId{0}).has_value()) << "it never held the GPU";
  EXPECT_EQ(core_->status(now_).counters.rejected, 1u);
  EXPECT_TRUE(core_->done(waiting, true, now_).ok());
  EXPECT_FALSE(core_->phase(waiting).has_value());
}

// Spatial sharing: two functions' requests on one GPU, each started, ended and released on its
// own; the GPU is free only once both are.
class SharingCoreTest : public NodeCoreTest {
 protected:
  void make_shared() {
    NodeOptions options;
    options.scheduler.sharing = "usher";
    make(plain_topology(1, 16 * kGiB), options);
    a_ = add(1, kGiB);
    b_ = add(2, kGiB);
    serve(a_);
    serve(b_);
    ra_ = arrive(a_);
    core_->dispatch(now_);
    core_->streaming(ra_, Status(), now_);
    rb_ = arrive(b_);
    core_->dispatch(now_);
    ASSERT_EQ(actuator_.starts.back().request, rb_);
    EXPECT_EQ(actuator_.starts.back().gpu, GpuId{0});
    EXPECT_EQ(actuator_.starts.back().rule, PlacementRule::kShared);
    core_->streaming(rb_, Status(), now_);
    EXPECT_EQ(core_->phase(rb_), Phase::kRunning);
    EXPECT_EQ(core_->running(GpuId{0}), ra_);
    const NodeStatus status = core_->status(now_);
    EXPECT_EQ(status.gpus[0].running, instance(a_));
    EXPECT_EQ(status.gpus[0].sharing, std::vector<InstanceId>{instance(b_)});
    actuator_.take_log();
  }
  FunctionId a_{0}, b_{0};
  RequestId ra_{0}, rb_{0};
};

TEST_F(SharingCoreTest, TheRunningRequestEndsFirstAndTheSharerTakesItsPlace) {
  make_shared();
  ASSERT_TRUE(core_->done(ra_, false, now_).ok());
  core_->released(ra_, Status(), now_);
  EXPECT_EQ(core_->running(GpuId{0}), rb_);
  EXPECT_TRUE(core_->status(now_).gpus[0].sharing.empty());
  // A third request waits for the GPU (b's prediction is 10 ms, the same as c's, but c's model
  // is not resident).
  const FunctionId c = add(3, kGiB);
  const RequestId rc = arrive(c);
  core_->dispatch(now_);
  EXPECT_EQ(core_->phase(rc), Phase::kQueued);
  ASSERT_TRUE(core_->done(rb_, false, now_).ok());
  core_->released(rb_, Status(), now_);
  core_->dispatch(now_);
  EXPECT_EQ(core_->phase(rc), Phase::kPlacing);
  EXPECT_EQ(core_->running(GpuId{0}), rc);
}

TEST_F(SharingCoreTest, TheSharerEndsFirstAndTheRunningRequestKeepsTheGpu) {
  make_shared();
  ASSERT_TRUE(core_->done(rb_, false, now_).ok());
  core_->released(rb_, Status(), now_);
  EXPECT_EQ(core_->running(GpuId{0}), ra_);
  EXPECT_TRUE(core_->status(now_).gpus[0].sharing.empty());
  ASSERT_TRUE(core_->done(ra_, false, now_).ok());
  core_->released(ra_, Status(), now_);
  EXPECT_FALSE(core_->running(GpuId{0}).has_value());
  EXPECT_TRUE(core_->scheduler().check_invariants().ok());
}

TEST_F(SharingCoreTest, AFailedGpuEndsEveryRequestOnIt) {
  make_shared();
  core_->fail_gpu(GpuId{0}, error(ErrorCode::kUnknown, "ECC error"));
  EXPECT_EQ(actuator_.take_log(), (std::vector<std::string>{str_cat("end r", ra_, " failed"),
                                                            str_cat("end r", rb_, " failed")}));
  core_->released(rb_, actuator_.ends.back().failure, now_);
  core_->released(ra_, actuator_.ends.back().failure, now_);
  EXPECT_EQ(core_->phase(ra_), Phase::kEnded);
  EXPECT_EQ(core_->phase(rb_), Phase::kEnded);
  EXPECT_FALSE(core_->running(GpuId{0}).has_value());
  EXPECT_TRUE(core_->scheduler().check_invariants().ok());
}

TEST_F(SharingCoreTest, DrainingASharedGpuWaitsForBothRequests) {
  make_shared();
  ASSERT_TRUE(core_->drain(GpuId{0}, false).ok());
  EXPECT_TRUE(actuator_.take_log().empty()) << "both models are in use: nothing is evicted yet";
  ASSERT_TRUE(core_->done(ra_, false, now_).ok());
  core_->released(ra_, Status(), now_);
  core_->dispatch(now_);
  std::vector<std::string> log = actuator_.take_log();
  EXPECT_EQ(std::count(log.begin(), log.end(), "drained g0"), 0);
  ASSERT_TRUE(core_->done(rb_, false, now_).ok());
  core_->released(rb_, Status(), now_);
  core_->dispatch(now_);
  log = actuator_.take_log();
  EXPECT_EQ(std::count(log.begin(), log.end(), "drained g0"), 1);
}

TEST_F(NodeCoreTest, AnEndedRequestOutlivesItsSchedulerSlotWhichALaterRequestReuses) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  const RequestId ended = arrive(a);
  core_->dispatch(now_);
  core_->streaming(ended, Status(), now_);
  core_->fail_gpu(actuator_.starts.back().gpu, error(ErrorCode::kUnknown, "ECC error"));
  core_->released(ended, actuator_.ends.back().failure, now_);
  ASSERT_EQ(core_->phase(ended), Phase::kEnded) << "kept until the caller says done";
  // The scheduler is done with it: its slot goes to the next request.
  const RequestId next = arrive(b);
  EXPECT_EQ(next.value() & 0xffffffffu, ended.value() & 0xffffffffu) << "the slot is reused";
  EXPECT_NE(next, ended);
  EXPECT_EQ(core_->phase(ended), Phase::kEnded);
  EXPECT_EQ(core_->phase(next), Phase::kQueued);
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.starts.back().request, next);
  ASSERT_TRUE(core_->done(ended, true, now_).ok());
  EXPECT_FALSE(core_->phase(ended).has_value());
  EXPECT_EQ(core_->phase(next), Phase::kPlacing);
}

TEST_F(NodeCoreTest, AStartThatFailsAnswersTheWaiterWithItsError) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId r = arrive(f);
  ASSERT_TRUE(core_->await_start(r, now_).ok());
  core_->dispatch(now_);
  const Status why = error(ErrorCode::kOutOfMemory, "no room");
  core_->streaming(r, why, now_);
  ASSERT_EQ(actuator_.answers.count(r), 1u);
  EXPECT_EQ(actuator_.answers.at(r).status().code(), ErrorCode::kOutOfMemory);
  core_->released(r, why, now_);
  EXPECT_EQ(core_->phase(r), Phase::kEnded);
  EXPECT_TRUE(core_->done(r, true, now_).ok());
  EXPECT_EQ(core_->status(now_).counters.failed, 1u);
}

TEST_F(NodeCoreTest, DecisionsEvictBeforeTheyStartAndTheActuatorFreesTheVictim) {
  // One GPU with room for two 6 GiB models.
  make(plain_topology(1, 13 * kGiB));
  const FunctionId a = add(1, 6 * kGiB);
  const FunctionId b = add(2, 6 * kGiB);
  const FunctionId c = add(3, 6 * kGiB);
  serve(a);
  serve(b);
  actuator_.take_log();
  const Start sc = serve(c);
  EXPECT_EQ(sc.source, Source::kHost);
  const std::vector<std::string> log = actuator_.take_log();
  ASSERT_GE(log.size(), 2u);
  EXPECT_TRUE(log[0].starts_with("evict f")) << log[0];
  EXPECT_TRUE(log[1].starts_with(str_cat("start r", sc.request))) << log[1];
  EXPECT_EQ(actuator_.allocated[GpuId{0}], 12 * kGiB) << "two models, the victim's freed";
  EXPECT_EQ(core_->status(now_).gpus[0].evictions, 1u);
  const auto by_reason = core_->status(now_).gpus[0].evictions_by_reason;
  EXPECT_EQ(by_reason[static_cast<size_t>(node::EvictionReason::kPlacement)], 1u);
  EXPECT_EQ(by_reason[static_cast<size_t>(node::EvictionReason::kMemory)], 0u);
  EXPECT_EQ(by_reason[static_cast<size_t>(node::EvictionReason::kDrain)], 0u);
}

TEST_F(NodeCoreTest, MakeRoomEvictsByThePolicyAndRefusesWhenNothingMayGo) {
  make(plain_topology(1, 13 * kGiB));
  const FunctionId a = add(1, 4 * kGiB);
  const FunctionId b = add(2, 4 * kGiB);
  serve(a);
  const RequestId r = arrive(b);
  core_->dispatch(now_);
  core_->streaming(r, Status(), now_);
  actuator_.take_log();
  // b, running, needs 4 GiB of scratch that the view did not count: a's replica goes.
  actuator_.allocated[GpuId{0}] += 2 * kGiB;  // some scratch is placed already
  ASSERT_TRUE(core_->make_room(instance(b), GpuId{0}, 4 * kGiB, now_).ok());
  EXPECT_EQ(actuator_.take_log(), (std::vector<std::string>{str_cat("evict f", a, " g0")}));
  const NodeStatus::Gpu gpu = core_->status(now_).gpus[0];
  EXPECT_EQ(gpu.evictions, 1u);
  EXPECT_EQ(gpu.evictions_by_reason[static_cast<size_t>(node::EvictionReason::kMemory)], 1u);
  // Nothing else may go: b runs.
  const Status refused = core_->make_room(instance(b), GpuId{0}, 8 * kGiB, now_);
  EXPECT_EQ(refused.code(), ErrorCode::kOutOfMemory) << refused;
  EXPECT_TRUE(actuator_.take_log().empty());
}

TEST_F(NodeCoreTest, TheReserveIsWhatThePoolGaveOutBeyondTheViewsPlacedReplicas) {
  NodeOptions options;
  options.outside_pool_bytes = {kGiB};
  make(plain_topology(1, 16 * kGiB), options);
  EXPECT_EQ(core_->scheduler().node().gpu(0).reserved, kGiB);
  const FunctionId f = add(1, 2 * kGiB);
  serve(f);
  EXPECT_EQ(core_->scheduler().node().gpu(0).reserved, kGiB) << "the model is not reserve";
  actuator_.allocated[GpuId{0}] += 3 * kGiB;  // scratch
  core_->memory_changed(GpuId{0});
  core_->dispatch(now_);  // the scheduler hears of it before it decides
  EXPECT_EQ(core_->scheduler().node().gpu(0).reserved, 4 * kGiB);
  // A replica counts for what of it is placed: while its blocks are being placed, the rest of
  // what the pool gave out is still reserve.
  actuator_.placed[{instance(f), GpuId{0}}] = kGiB;
  core_->memory_changed(GpuId{0});
  core_->dispatch(now_);
  EXPECT_EQ(core_->scheduler().node().gpu(0).reserved, 5 * kGiB);
}

// Two GPUs joined by NVLink (GPUs 0 and 1 of the Torpor node).
Topology nvlinked_pair(uint64_t memory) {
  NodeConfig config = scheduler::testing::shipped_config("torpor-4gpu.json");
  config.gpus.resize(2);
  for (GpuSpec& gpu : config.gpus) gpu.memory_bytes = memory;
  std::erase_if(config.nvlinks, [](const NvLinkSpec& l) { return l.gpu_a > 1 || l.gpu_b > 1; });
  Result<Topology> topology = Topology::from_config(config);
  EXPECT_TRUE(topology.ok()) << topology.status();
  return std::move(topology).value();
}

TEST_F(NodeCoreTest, APeerCopyOfAFunctionWithoutAFixedModelIsAMove) {
  // Until its first caller request every block of a function is state: one replica only.
  make(nvlinked_pair(16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const FunctionId other = add(2, kGiB);
  const FunctionId third = add(3, kGiB);
  const RequestId first = arrive(other);  // takes one GPU ...
  core_->dispatch(now_);
  core_->need_gpu(instance(f), now_);  // ... so f's start-up runs on the other
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 2u);
  const Start boot = actuator_.starts[1];
  ASSERT_TRUE(boot.background);
  core_->streaming(boot.request, Status(), now_);
  core_->swap_done(boot.request, Status(), {}, now_);
  core_->released(boot.request, Status(), now_);
  const RequestId second = arrive(third);  // f's GPU is the only free one: third takes it
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.back().request, second);
  ASSERT_EQ(actuator_.starts.back().gpu, boot.gpu);
  core_->streaming(first, Status(), now_);
  ASSERT_TRUE(core_->done(first, false, now_).ok());
  core_->released(first, Status(), now_);  // the first GPU is free again
  const RequestId r = arrive(f);
  core_->dispatch(now_);
  const Start s = actuator_.starts.back();
  ASSERT_EQ(s.request, r);
  ASSERT_EQ(s.source, Source::kPeer) << "f's replica is on a busy GPU one NVLink away";
  EXPECT_TRUE(s.release_source);
  EXPECT_EQ(s.source_gpu, boot.gpu);
  EXPECT_TRUE(s.first_request);
  actuator_.take_log();
  core_->streaming(r, Status(), now_);
  core_->swap_done(r, Status(), SwapStats{kGiB, 1'000'000}, now_);  // the copy moved the model
  EXPECT_EQ(actuator_.take_log(),
            (std::vector<std::string>{str_cat("forget f", f, " g", boot.gpu)}));
  const auto index = core_->scheduler().functions().find(f);
  ASSERT_TRUE(index.has_value());
  EXPECT_FALSE(core_->scheduler().node().holders(*index) & scheduler::gpu_bit(boot.gpu.value()))
      << "the source replica left the view";
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.swaps_by_link[static_cast<size_t>(node::SwapLink::kNvlink)].swaps, 1u);
  EXPECT_EQ(status.swaps_by_link[static_cast<size_t>(node::SwapLink::kPcie)].swaps, 0u);
}

TEST(SwapLink, PeerCopiesGoOverNvlinkWhereTheTopologyHasOneElsePcie) {
  const Topology nvlinked = nvlinked_pair(16 * kGiB);
  const Topology plain = plain_topology(2, 16 * kGiB);
  EXPECT_EQ(node::swap_link(nvlinked, Source::kPeer, 0, 1), node::SwapLink::kNvlink);
  EXPECT_EQ(node::swap_link(plain, Source::kPeer, 0, 1), node::SwapLink::kPcie);
  EXPECT_EQ(node::swap_link(plain, Source::kHost, -1, 1), node::SwapLink::kHost);
  EXPECT_FALSE(node::swap_link(plain, Source::kResident, -1, 1).has_value());
  EXPECT_STREQ(node::swap_link_name(node::SwapLink::kNvlink), "nvlink");
  EXPECT_STREQ(node::swap_link_name(node::SwapLink::kPcie), "pcie");
  EXPECT_STREQ(node::swap_link_name(node::SwapLink::kHost), "host");
}

TEST_F(NodeCoreTest, DetachWithdrawsQueuedRequestsAndFailsTheRunningOne) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId running = arrive(f);
  core_->dispatch(now_);
  core_->streaming(running, Status(), now_);
  const RequestId queued = arrive(f);
  ASSERT_TRUE(core_->await_start(queued, now_).ok());
  core_->detach(instance(f), now_);
  EXPECT_FALSE(core_->phase(running).has_value());
  EXPECT_FALSE(core_->phase(queued).has_value());
  ASSERT_EQ(actuator_.answers.count(queued), 1u);
  EXPECT_EQ(actuator_.answers.at(queued).status().code(), ErrorCode::kDeinitialized);
  EXPECT_FALSE(core_->running(GpuId{0}).has_value());
  EXPECT_EQ(core_->arrive(f, std::nullopt, now_).status().code(), ErrorCode::kDeviceUnavailable);
  const NodeStatus status = core_->status(now_);
  EXPECT_EQ(status.counters.failed, 1u);
  EXPECT_EQ(status.counters.cancelled, 1u);
  EXPECT_TRUE(core_->remove_function(f, now_).ok());
  EXPECT_FALSE(core_->has_function(f));
}

TEST_F(NodeCoreTest, DrainingAGpuEvictsItsModelsAndReportsWhenItsRequestIsDone) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId a = add(1, kGiB);
  const FunctionId b = add(2, kGiB);
  const Start sa = serve(a);
  const RequestId r = arrive(b);
  core_->dispatch(now_);
  const Start sb = actuator_.starts.back();
  ASSERT_NE(sb.gpu, sa.gpu);
  core_->streaming(r, Status(), now_);
  actuator_.take_log();
  ASSERT_TRUE(core_->drain(sb.gpu, /*resume=*/false).ok());
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.take_log(), (std::vector<std::string>{str_cat("evict f", a, " g", sb.gpu)}))
      << "b runs there: it stays until its request is done";
  core_->swap_done(r, Status(), {}, now_);
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  core_->released(r, Status(), now_);
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.take_log(),
            (std::vector<std::string>{str_cat("end r", r), str_cat("evict f", b, " g", sb.gpu),
                                      str_cat("drained g", sb.gpu)}));
  // Every eviction there was the drain's (a's at least; b's counts if it had placed bytes).
  const NodeStatus::Gpu drained = core_->status(now_).gpus[sb.gpu.value()];
  EXPECT_GE(drained.evictions, 1u);
  EXPECT_EQ(drained.evictions_by_reason[static_cast<size_t>(node::EvictionReason::kDrain)],
            drained.evictions);
  // Nothing runs there any more: b's next request goes to the other GPU.
  EXPECT_EQ(serve(b).gpu, sa.gpu);
  EXPECT_EQ(core_->drain(GpuId{7}, false).code(), ErrorCode::kInvalidDevice);
}

TEST_F(NodeCoreTest, DrainingTheNodeRefusesArrivalsAndEndsWhenCallersRequestsAreDone) {
  make(plain_topology(1, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const RequestId r = arrive(f);
  core_->dispatch(now_);
  actuator_.take_log();
  ASSERT_TRUE(core_->drain(std::nullopt, false).ok());
  core_->dispatch(now_);
  EXPECT_TRUE(actuator_.take_log().empty());
  EXPECT_EQ(core_->arrive(f, std::nullopt, now_).status().code(), ErrorCode::kDeviceUnavailable);
  core_->streaming(r, Status(), now_);
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  core_->released(r, Status(), now_);
  core_->dispatch(now_);
  const std::vector<std::string> log = actuator_.take_log();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "drained node");
}

TEST_F(NodeCoreTest, BadCallsGetClearErrors) {
  make(plain_topology(1, 16 * kGiB));
  EXPECT_EQ(core_->arrive(FunctionId{9}, std::nullopt, now_).status().code(), ErrorCode::kNotFound);
  const FunctionId f{1};
  ASSERT_TRUE(core_->add_function(f, spec("fn", kGiB), now_).ok());
  EXPECT_EQ(core_->add_function(f, spec("fn", kGiB), now_).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(core_->arrive(f, std::nullopt, now_).status().code(), ErrorCode::kDeviceUnavailable)
      << "no instance attached";
  ASSERT_TRUE(core_->attach(instance(f), f, now_).ok());
  EXPECT_EQ(core_->attach(instance(f), f, now_).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(core_->remove_function(f, now_).code(), ErrorCode::kIllegalState);
  const RequestId r = arrive(f);
  ASSERT_TRUE(core_->await_start(r, now_).ok());
  EXPECT_EQ(core_->await_start(r, now_).code(), ErrorCode::kInvalidValue);
  EXPECT_EQ(core_->await_start(RequestId{12345}, now_).code(), ErrorCode::kNotFound);
  EXPECT_EQ(core_->done(RequestId{12345}, false, now_).code(), ErrorCode::kNotFound);
  // Reports about requests the core does not know are ignored.
  core_->streaming(RequestId{12345}, Status(), now_);
  core_->released(RequestId{12345}, Status(), now_);
  core_->swap_done(RequestId{12345}, Status(), {}, now_);
  EXPECT_EQ(core_->make_room(instance(f), GpuId{3}, kGiB, now_).code(), ErrorCode::kOutOfMemory);
  // A queued request that the caller gives up on leaves the queue.
  ASSERT_TRUE(core_->done(r, false, now_).ok());
  EXPECT_EQ(actuator_.answers.at(r).status().code(), ErrorCode::kDeinitialized);
  core_->dispatch(now_);
  EXPECT_TRUE(actuator_.starts.empty());
}

// ---- Functions and instances ----

// Attaches one more instance of `f`, numbered `id`, whose model is `bytes`.
class NodeCoreInstancesTest : public NodeCoreTest {
 protected:
  InstanceId attach(FunctionId f, uint32_t id, uint64_t bytes) {
    const InstanceId i{id};
    actuator_.model_sizes[i] = bytes;
    EXPECT_TRUE(core_->attach(i, f, now_).ok());
    return i;
  }
  // Starts the one request dispatch() starts now, and answers its swap.
  Start start_next() {
    const size_t before = actuator_.starts.size();
    core_->dispatch(now_);
    EXPECT_EQ(actuator_.starts.size(), before + 1);
    const Start s = actuator_.starts.back();
    core_->streaming(s.request, Status(), now_);
    if (s.source != Source::kResident) core_->swap_done(s.request, Status(), {}, now_);
    return s;
  }
  // Dispatches after `r` arrived: it starts.
  Start start_next_after(RequestId r) {
    const Start s = start_next();
    EXPECT_EQ(s.request, r);
    return s;
  }
  void finish(const Start& s) {
    ASSERT_TRUE(core_->done(s.request, false, now_).ok());
    core_->released(s.request, Status(), now_);
  }
};

TEST_F(NodeCoreInstancesTest, TwoInstancesOfOneFunctionRunItsRequestsAtOnceOnTwoGpus) {
  make(plain_topology(4, 16 * kGiB));
  const FunctionId f = add(1, kGiB);  // instance 1
  const InstanceId second = attach(f, 2, kGiB);
  const RequestId r1 = arrive(f);
  const RequestId r2 = arrive(f);
  core_->dispatch(now_);
  ASSERT_EQ(actuator_.starts.size(), 2u) << "one request per instance, both at once";
  const Start a = actuator_.starts[0];
  const Start b = actuator_.starts[1];
  EXPECT_EQ(a.request, r1);
  EXPECT_EQ(b.request, r2);
  EXPECT_EQ(a.function, f);
  EXPECT_EQ(b.function, f);
  EXPECT_NE(a.instance, b.instance);
  EXPECT_TRUE(b.instance == second || a.instance == second);
  EXPECT_NE(a.gpu, b.gpu) << "a GPU runs one instance at a time";
  EXPECT_EQ(core_->instance_of(r1), a.instance);
  EXPECT_EQ(core_->instance_of(r2), b.instance);
  for (const Start& s : {a, b}) {
    core_->streaming(s.request, Status(), now_);
    core_->swap_done(s.request, Status(), {}, now_);
  }
  // A third request waits for one of them: each instance runs one request at a time.
  const RequestId r3 = arrive(f);
  core_->dispatch(now_);
  EXPECT_EQ(actuator_.starts.size(), 2u);
  EXPECT_EQ(core_->phase(r3), Phase::kQueued);
  const NodeStatus status = core_->status(now_);
  ASSERT_EQ(status.functions.size(), 1u);
  EXPECT_EQ(status.functions[0].instances, (std::vector<InstanceId>{InstanceId{1}, second}));
  EXPECT_EQ(status.functions[0].requests, 3u) << "the function's requests, over its instances";
  EXPECT_EQ(status.functions[0].resident_gpus.size(), 2u) << "a replica on each instance's GPU";
}

TEST_F(NodeCoreInstancesTest, ARequestWithoutAnInstanceGoesToTheLeastBusyThenToOneWithItsModel) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const InstanceId first{1};
  const InstanceId second = attach(f, 2, kGiB);
  // The second instance runs a request once, so its model stays on a GPU.
  ASSERT_TRUE(core_->arrive(f, second, now_).ok());
  finish(start_next());
  // Both idle: the one whose model is resident, though it attached later.
  now_ += kMs;
  const Start warm = start_next_after(arrive(f));
  EXPECT_EQ(warm.instance, second);
  EXPECT_EQ(warm.source, Source::kResident);
  // It is busy now: the next goes to the idle one, which must load its own copy.
  const Start cold = start_next_after(arrive(f));
  EXPECT_EQ(cold.instance, first);
  EXPECT_EQ(cold.source, Source::kHost);
  EXPECT_NE(cold.gpu, warm.gpu);
}

TEST_F(NodeCoreInstancesTest, ARequestForANamedInstanceRunsThereOrIsRefused) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const FunctionId other = add(2, kGiB);
  const InstanceId second = attach(f, 3, kGiB);
  const Result<RequestId> named = core_->arrive(f, second, now_);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(start_next().instance, second);
  EXPECT_EQ(core_->arrive(f, InstanceId{99}, now_).status().code(), ErrorCode::kDeviceUnavailable)
      << "no such instance";
  EXPECT_EQ(core_->arrive(f, instance(other), now_).status().code(), ErrorCode::kDeviceUnavailable)
      << "another function's instance";
  EXPECT_EQ(core_->function_of(second), f);
  EXPECT_EQ(core_->function_of(InstanceId{99}), std::nullopt);
}

TEST_F(NodeCoreInstancesTest, AnInstanceThatGoesLeavesTheOthersRunningAndItsSlotToTheNext) {
  make(plain_topology(2, 16 * kGiB));
  const FunctionId f = add(1, kGiB);
  const InstanceId second = attach(f, 2, kGiB);
  ASSERT_TRUE(core_->arrive(f, InstanceId{1}, now_).ok());
  const Start gone = start_next();
  ASSERT_TRUE(core_->arrive(f, second, now_).ok());
  const Start stays = start_next();
  core_->detach(InstanceId{1}, now_);
  EXPECT_EQ(core_->phase(gone.request), std::nullopt) << "its request ended with it";
  EXPECT_EQ(core_->phase(stays.request), Phase::kRunning) << "the other instance's goes on";
  EXPECT_EQ(core_->function_of(InstanceId{1}), std::nullopt);
  EXPECT_EQ(core_->remove_function(f, now_).code(), ErrorCode::kIllegalState)
      << "an instance is still attached";
  // A new instance takes the free slot: the function's statistics carry on, its memory does not.
  const InstanceId third = attach(f, 3, kGiB);
  const NodeStatus status = core_->status(now_);
  ASSERT_EQ(status.functions.size(), 1u);
  EXPECT_EQ(status.functions[0].instances, (std::vector<InstanceId>{second, third}));
  EXPECT_EQ(status.functions[0].requests, 2u);
  ASSERT_TRUE(core_->arrive(f, third, now_).ok());
  const Start fresh = start_next();
  EXPECT_EQ(fresh.instance, third);
  EXPECT_EQ(fresh.source, Source::kHost) << "the old instance's replica went with it";
  EXPECT_NE(fresh.gpu, stays.gpu);
  finish(stays);
  finish(fresh);
  core_->detach(second, now_);
  core_->detach(third, now_);
  EXPECT_TRUE(core_->remove_function(f, now_).ok());
  EXPECT_TRUE(core_->scheduler().check_invariants().ok());
}

TEST_F(NodeCoreInstancesTest, FunctionIdsOfTheCoresOwnAreRefused) {
  make(plain_topology(1, 16 * kGiB));
  EXPECT_EQ(core_->add_function(FunctionId{NodeCore::kFirstOwnId}, spec("high", kGiB), now_).code(),
            ErrorCode::kInvalidValue);
  EXPECT_EQ(core_->attach(InstanceId{1}, FunctionId{5}, now_).code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace hiber::node
