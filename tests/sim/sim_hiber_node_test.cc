// Hiber's node in the simulator, in scenarios worked out by hand: the real scheduler decides,
// the real buddy pools hold the blocks, and the latencies follow from the timing model's
// formulas written out here independently (PCIe 12 GB/s per switch, one transfer alone at 88%
// of it = 10.56 bytes/ns, two at 6 each; NVLink 25 GB/s -> 22 bytes/ns; setup 1.6 ms; 2 MiB
// pipelining groups).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "sim/hiber_node.h"
#include "sim/simulation.h"
#include "sim_test_nodes.h"

namespace hiber::sim {
namespace {

constexpr double kAlone = 10.56;  // bytes per ns: 12 GB/s x 0.88
constexpr double kGroup = 2.0 * kMiB;
constexpr double kSetup = 1.6e6;

// A pipelined swap at a constant rate, by the formula of docs/sim.md: the first group's
// transfer plus the whole computation, or the whole transfer plus the last group's computation.
double swap_ns(const Model& m, double rate) {
  const double s = static_cast<double>(m.model_bytes);
  const double e = static_cast<double>(m.exec);
  return kSetup + std::max(kGroup / rate + e, s / rate + e * kGroup / s);
}

const Model& model(const char* name) { return paper_models()[*find_model(name)]; }

class Scenario {
 public:
  Scenario(const NodeConfig& config, std::vector<std::string> models, HiberOptions o = {},
           scheduler::ShedRule shed = scheduler::ShedRule::kNone,
           scheduler::PrewarmRule prewarm = scheduler::PrewarmRule::kNone) {
    workload_ = hand_workload(models);
    recorder_ = std::make_unique<Recorder>(workload_, 0, 1, config.gpu_count());
    o.check_invariants = true;
    o.scheduler.shed = shed;
    o.scheduler.prewarm = prewarm;
    // One GPU: a prewarm may take the only idle one. No keep-alive: a function with too few
    // idle times to predict is not expected at all.
    o.scheduler.prewarm_options.keep_idle_gpus = 0;
    o.scheduler.prewarm_options.keep_alive = 0;
    Result<std::unique_ptr<HiberNode>> node =
        HiberNode::create(config, o, &queue_, recorder_.get(), 0);
    EXPECT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    for (uint32_t f = 0; f < workload_.functions.size(); ++f)
      EXPECT_TRUE(node_->add_function(f, workload_.functions[f], 0).ok());
  }

  void arrive(uint32_t f, Time t) { deliver_arrival(queue_, *node_, f, t); }
  // Runs every event, then ends the run.
  void finish() {
    while (!queue_.empty()) queue_.run_next();
    node_->finish(queue_.now());
    results_ = recorder_->results();
  }
  const Results& results() const { return results_; }
  HiberNode& node() { return *node_; }

 private:
  Workload workload_;
  EventQueue queue_;
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<HiberNode> node_;
  Results results_;
};

// Latencies of one model's requests, in ms. With one or two requests, p50 is the smaller and
// p99 the larger (nearest rank).
const LatencyQuantiles& of(const Results& r, const char* name) {
  return r.latency_by_model[*find_model(name)];
}

TEST(HiberNode, TwoFunctionsTakeTurnsOnOneGpu) {
  // One GPU whose pool (832 MiB - 512 MiB runtime reserve = 320 MiB) holds either model with
  // its scratch but not both: ResNet-50 (118 MiB + 40 MiB scratch) and ResNet-101 (192 + 40).
  // Both models alone would fit (310 MiB), so the scheduler places B without evicting A; B's
  // scratch then finds no room, and make_room() evicts A. Any allocator must do so: 350 MiB
  // cannot fit in 320.
  ASSERT_EQ(model("resnet50").model_bytes, 118 * kMiB);
  ASSERT_EQ(model("resnet101").model_bytes, 192 * kMiB);
  ASSERT_EQ(model("resnet101").scratch_bytes, 40 * kMiB);
  Scenario s(torpor_gpus(1, 832 * kMiB), {"resnet50", "resnet101"});
  s.arrive(0, 1 * kSecond);  // A: swapped in
  s.arrive(1, 2 * kSecond);  // B: evicts A, swapped in
  s.arrive(0, 3 * kSecond);  // A: evicts B, swapped in again
  s.arrive(0, 4 * kSecond);  // A: resident
  s.finish();
  const scheduler::SchedulerCounters& c = s.node().scheduler().counters();
  EXPECT_EQ(c.host_swaps, 3u);
  EXPECT_EQ(c.resident_starts, 1u);
  EXPECT_EQ(s.node().evictions(), 2u);
  EXPECT_EQ(c.peer_swaps, 0u);
  // At 2 s and at 3 s the pool refused a block (at least the scratch) before make_room().
  EXPECT_GE(s.node().pool_failures(), 2u);
  const Results& r = s.results();
  // ResNet-50: 118 MiB at 10.56 bytes/ns = 11.72 ms + 9 ms x 2/118 of computation after the
  // last group + 1.6 ms setup = 13.47 ms, twice; then 9 ms resident (the smallest of three).
  const double a = swap_ns(model("resnet50"), kAlone) / 1e6;
  EXPECT_NEAR(a, 13.4695, 1e-3);
  EXPECT_NEAR(of(r, "resnet50").p50, a, 1e-3);
  EXPECT_NEAR(of(r, "resnet50").p99, a, 1e-3);
  EXPECT_EQ(r.requests_by_model[*find_model("resnet50")], 3u);
  // ResNet-101: 192 MiB: 19.07 + 0.15 + 1.6 = 20.81 ms.
  EXPECT_NEAR(of(r, "resnet101").p50, swap_ns(model("resnet101"), kAlone) / 1e6, 1e-3);
  EXPECT_NEAR(of(r, "resnet101").p50, 20.8109, 1e-3);
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kResident)], 1u);
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kHost)], 3u);
  // Everything was freed: the pool holds only A's model.
  EXPECT_EQ(s.node().pools().stats(0).allocated_bytes, 118 * kMiB);
}

TEST(HiberNode, NeighboursLoadingAtOnceShareTheirSwitch) {
  // GPUs 0 and 1 share PCIe switch 0. Two ResNet-152 functions arrive together: with no other
  // GPU, Algorithm 1 loads both from the host at once, and each transfer gets 6 bytes/ns.
  Scenario s(torpor_gpus(2, 32 * kGiB), {"resnet152", "resnet152"});
  s.arrive(0, 1 * kSecond);
  s.arrive(1, 1 * kSecond);
  s.finish();
  const Results& r = s.results();
  const double shared = swap_ns(model("resnet152"), 6.0) / 1e6;  // 47.52 ms
  EXPECT_NEAR(shared, 47.5176, 1e-3);
  EXPECT_NEAR(of(r, "resnet152").p50, shared, 1e-3);
  EXPECT_NEAR(of(r, "resnet152").p99, shared, 1e-3);
  EXPECT_EQ(s.node().scheduler().counters().host_swaps, 2u);
  // Alone, the same swap takes 27.75 ms.
  Scenario alone(torpor_gpus(2, 32 * kGiB), {"resnet152"});
  alone.arrive(0, 1 * kSecond);
  alone.finish();
  EXPECT_NEAR(alone.results().latency.p50, swap_ns(model("resnet152"), kAlone) / 1e6, 1e-3);
}

TEST(HiberNode, CopiesFromABusyHolderOverNvlink) {
  // A (ResNet-152) and B (Bert-qa) load onto GPUs 0 and 1. At 2 s, C (ResNet-50) loads onto
  // GPU 0 (more free memory); 1 ms later A's request finds its only replica on busy GPU 0 and
  // GPU 1 free: Algorithm 1 copies it over their 25 GB/s NVLink (22 bytes/ns):
  // 1.6 ms + max(2 MiB / 22 + 17 ms, 262 MiB / 22 + 17 ms x 2/262) = 18.70 ms.
  Scenario s(torpor_gpus(2, 32 * kGiB), {"resnet152", "bertqa", "resnet50"});
  s.arrive(0, 1 * kSecond);
  s.arrive(1, 1 * kSecond);
  s.arrive(2, 2 * kSecond);
  s.arrive(0, 2 * kSecond + 1 * kMillisecond);
  s.finish();
  const scheduler::SchedulerCounters& c = s.node().scheduler().counters();
  EXPECT_EQ(c.peer_swaps, 1u);
  EXPECT_EQ(c.host_swaps, 3u);
  const Results& r = s.results();
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kPeer)], 1u);
  EXPECT_NEAR(of(r, "resnet152").p50, swap_ns(model("resnet152"), 22.0) / 1e6, 1e-3);
  EXPECT_NEAR(swap_ns(model("resnet152"), 22.0) / 1e6, 18.6953, 1e-3);
}

TEST(HiberNode, MeetsOneSloAndMissesTheNext) {
  // Two Bert-qa functions on one GPU at once. The first swaps in alone: 1294 MiB at
  // 10.56 bytes/ns = 128.49 ms + 43 ms x 2/1294 + 1.6 ms = 130.16 ms, within 200 ms. The
  // second waits for the GPU, then swaps in the same way: 260.31 ms, late.
  Scenario s(torpor_gpus(1, 32 * kGiB), {"bertqa", "bertqa"});
  s.arrive(0, 1 * kSecond);
  s.arrive(1, 1 * kSecond);
  s.finish();
  const Results& r = s.results();
  const double one = swap_ns(model("bertqa"), kAlone) / 1e6;
  EXPECT_NEAR(one, 130.1567, 1e-3);
  EXPECT_NEAR(r.latency.p50, one, 1e-3);
  EXPECT_NEAR(r.latency.p99, 2 * one, 2e-3);
  EXPECT_EQ(r.on_time, 1u);
  EXPECT_EQ(r.compliant, 1);
  EXPECT_EQ(r.functions_with_requests, 2);
}

TEST(HiberNode, ShedsTheRequestThatCannotMakeItAndCountsItAsAMiss) {
  // The two Bert-qa requests above. When the GPU frees at 1.130 s, the second's model is on no
  // GPU: 1.130 s + max(43 ms execution, 1294 MiB / 12 GB/s = 113 ms host swap) > 1.2 s, so
  // "hopeless" sheds it. "late" counts the execution alone (1.173 s <= 1.2 s) and runs it late.
  Scenario hopeless(torpor_gpus(1, 32 * kGiB), {"bertqa", "bertqa"}, {},
                    scheduler::ShedRule::kHopeless);
  hopeless.arrive(0, 1 * kSecond);
  hopeless.arrive(1, 1 * kSecond);
  hopeless.finish();
  const Results& r = hopeless.results();
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kRejected)], 1u);
  EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kHost)], 1u);
  EXPECT_EQ(hopeless.node().scheduler().counters().rejected, 1u);
  EXPECT_EQ(r.requests, 2u);
  EXPECT_EQ(r.completed, 1u);
  EXPECT_EQ(r.on_time, 1u);
  EXPECT_EQ(r.compliant, 1) << "the shed request is a miss: its function does not comply";
  EXPECT_EQ(r.functions_with_requests, 2);
  EXPECT_TRUE(std::isinf(r.latency.p99)) << "a request that never finished is late";

  Scenario late(torpor_gpus(1, 32 * kGiB), {"bertqa", "bertqa"}, {}, scheduler::ShedRule::kLate);
  late.arrive(0, 1 * kSecond);
  late.arrive(1, 1 * kSecond);
  late.finish();
  EXPECT_EQ(late.results().by_kind[static_cast<int>(StartKind::kRejected)], 0u);
  EXPECT_EQ(late.results().completed, 2u);
  EXPECT_NEAR(late.results().latency.p99, 2 * swap_ns(model("bertqa"), kAlone) / 1e6, 2e-3);
}

// Spatial sharing: ResNet-152 (17 ms; compute 0.9, memory 0.6) runs from 3 s; EfficientNet-B0
// (12 ms; 0.5, 0.7) arrives 3 ms later, both models resident. The scheduler predicts 14 ms left
// for ResNet-152 and lets EfficientNet-B0 join (12 <= 14, both deadlines far). Together they
// run at max(1.4, 1.3) = 1.4: EfficientNet-B0 ends after 12 x 1.4 = 16.8 ms; ResNet-152 has
// then done 3 + 12 = 15 ms of its 17, and ends 2 ms later: 21.8 ms after its arrival.
// Without interference: 17 ms and 12 ms. Without sharing EfficientNet-B0 waits: 14 + 12 = 26 ms.
struct SharedLatencies {
  LatencyQuantiles resnet152, efficientnet;  // of its swap and its resident run
  uint64_t shared = 0;
};
SharedLatencies share_one_gpu(const std::string& sharing, bool interference) {
  HiberOptions o;
  o.scheduler.sharing = sharing;
  o.interference = interference;
  Scenario s(torpor_gpus(1, 32 * kGiB), {"resnet152", "efficientnet_b0"}, o);
  s.arrive(0, 1 * kSecond);  // both swapped in, alone
  s.arrive(1, 2 * kSecond);
  s.arrive(0, 3 * kSecond);
  s.arrive(1, 3 * kSecond + 3 * kMillisecond);
  s.finish();
  const Results& r = s.results();
  return {of(r, "resnet152"), of(r, "efficientnet_b0"),
          s.node().scheduler().counters().shared_starts};
}

TEST(HiberNode, RequestsSharingAGpuSlowEachOtherByTheModel) {
  // The swaps alone (the larger of ResNet-152's two, the smaller of EfficientNet-B0's).
  const double swap152 = swap_ns(model("resnet152"), kAlone) / 1e6;            // 27.75 ms
  const double swap_effnet = swap_ns(model("efficientnet_b0"), kAlone) / 1e6;  // 13.80 ms
  const SharedLatencies shared = share_one_gpu("usher", true);
  EXPECT_EQ(shared.shared, 1u);
  EXPECT_NEAR(shared.resnet152.p99, swap152, 1e-3);
  EXPECT_NEAR(shared.resnet152.p50, 21.8, 1e-3);
  EXPECT_NEAR(shared.efficientnet.p50, swap_effnet, 1e-3);
  EXPECT_NEAR(shared.efficientnet.p99, 16.8, 1e-3);
  const SharedLatencies free_ride = share_one_gpu("usher", false);
  EXPECT_EQ(free_ride.shared, 1u);
  EXPECT_NEAR(free_ride.resnet152.p50, 17.0, 1e-3);
  EXPECT_NEAR(free_ride.efficientnet.p50, 12.0, 1e-3);
  const SharedLatencies off = share_one_gpu("off", true);
  EXPECT_EQ(off.shared, 0u);
  EXPECT_NEAR(off.resnet152.p50, 17.0, 1e-3);
  EXPECT_NEAR(off.efficientnet.p99, 26.0, 1e-3);
}

TEST(HiberNode, PrewarmBringsBackAnEvictedModelBeforeItsPredictedArrival) {
  // One GPU with room for one Bert-qa. Function 0 comes every second from 1 s to 11 s (10 idle
  // times of 1 s: window [last + 1 s, last + 2 s)); function 1 once at 11.2 s, evicting it. With
  // prewarming, function 0's model is loaded back before 12 s (the wakeup falls due a host swap
  // estimate ahead of the window), evicting function 1's (not expected again), so the request
  // at 12 s starts resident; without, it loads from the host.
  for (const bool prewarm : {false, true}) {
    SCOPED_TRACE(prewarm ? "prewarm" : "no prewarm");
    Scenario s(torpor_gpus(1, 2560 * kMiB), {"bertqa", "bertqa"}, {}, scheduler::ShedRule::kNone,
               prewarm ? scheduler::PrewarmRule::kHistogram : scheduler::PrewarmRule::kNone);
    for (int i = 1; i <= 11; ++i) s.arrive(0, i * kSecond);
    s.arrive(1, 11200 * scheduler::kMillisecond);
    s.arrive(0, 12 * kSecond);
    s.finish();
    const Results& r = s.results();
    const scheduler::SchedulerCounters& c = s.node().scheduler().counters();
    EXPECT_EQ(r.completed, 13u);
    EXPECT_EQ(c.prewarms, prewarm ? 1u : 0u);
    EXPECT_EQ(c.prewarm_evictions, prewarm ? 1u : 0u);
    EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kResident)], prewarm ? 11u : 10u);
    EXPECT_EQ(r.by_kind[static_cast<int>(StartKind::kHost)], prewarm ? 2u : 3u);
  }
}

TEST(Simulation, TheSameSeedGivesTheSameRunAndAnotherSeedAnother) {
  auto run = [](uint64_t seed) {
    SyntheticOptions w;
    w.functions = 40;
    w.duration = 90 * kSecond;
    w.seed = seed;
    Workload workload = *synthetic_workload(w);
    SystemSpec system;
    system.hiber.scheduler.placement = "random";  // the scheduler's generator matters too
    system.hiber.scheduler.seed = seed;
    system.hiber.check_invariants = true;
    RunConfig config;
    config.node = torpor_gpus(4, 2 * kGiB);  // small GPUs: evictions happen
    config.warmup = 10 * kSecond;
    return *simulate(system, config, workload);
  };
  const RunOutput a = run(5);
  const RunOutput b = run(5);
  const RunOutput c = run(6);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.node_summaries, b.node_summaries);
  EXPECT_EQ(a.results.on_time, b.results.on_time);
  EXPECT_EQ(a.results.gpu_load, b.results.gpu_load);
  EXPECT_EQ(a.results.normalized_latency_quantiles, b.results.normalized_latency_quantiles);
  for (int k = 0; k < kStartKinds; ++k) EXPECT_EQ(a.results.by_kind[k], b.results.by_kind[k]);
  EXPECT_NE(a.events, c.events);
  EXPECT_GT(a.results.by_kind[static_cast<int>(StartKind::kHost)], 0u);
}

TEST(Simulation, RefusesAnUnknownPolicyAndANodeTooSmall) {
  SyntheticOptions w;
  w.functions = 4;
  w.duration = 10 * kSecond;
  Workload workload = *synthetic_workload(w);
  SystemSpec system;
  system.hiber.scheduler.eviction = "clairvoyant";
  RunConfig config;
  config.node = torpor_gpus(2, 32 * kGiB);
  EXPECT_EQ(simulate(system, config, workload).status().code(), ErrorCode::kInvalidValue);
  system.hiber.scheduler.eviction = "heaviness";
  config.node = torpor_gpus(2, 256 * kMiB);  // less than the runtime reserve
  EXPECT_EQ(simulate(system, config, workload).status().code(), ErrorCode::kInvalidValue);
}

}  // namespace
}  // namespace hiber::sim
