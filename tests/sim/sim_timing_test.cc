// The timing model by hand: pipelined execution (pipeline.h), link sharing (links.h), and the
// PyTorch segments a model's swap moves (models.h).
#include <gtest/gtest.h>

#include <vector>

#include "common/node_config.h"
#include "scheduler/topology.h"
#include "sim/links.h"
#include "sim/models.h"
#include "sim/pipeline.h"

namespace hiber::sim {
namespace {

TEST(Pipeline, SwapHidesBehindALongerComputationAndViceVersa) {
  // 1000 bytes at 1 byte/ns in groups of 100: the first group is there at 100 ns.
  // Compute 500 ns: transfer-bound, 1000 + 500 * 100 / 1000 = 1050.
  EXPECT_EQ(PipelinedRun::constant_rate(1000, 500, 100, 1.0), 1050);
  // Compute 2000 ns: compute-bound, 100 + 2000 = 2100.
  EXPECT_EQ(PipelinedRun::constant_rate(1000, 2000, 100, 1.0), 2100);
  // A model smaller than one group is one group: all of it, then all the computation.
  EXPECT_EQ(PipelinedRun::constant_rate(50, 300, 100, 0.5), 400);
}

TEST(Pipeline, FollowsTheArrivalCurveWhenTheRateChanges) {
  // 1000 bytes: 1 byte/ns until t = 400 (400 bytes), then 0.5 byte/ns: done at 1600.
  // Candidates: first group at t = 100 -> 100 + 1000 = 1100; (400, 400) -> 400 + 1000 * 0.7 =
  // 1100; the end -> 1600 + 100 = 1700.
  PipelinedRun run(0, 1000, 1000, 100);
  run.observe(400, 400);
  EXPECT_EQ(run.finish(1600), 1700);
  // Slow first, fast later: 0.25 byte/ns until t = 800 (200 bytes), then 2 bytes/ns: done at
  // 1200. The knee dominates: 800 + 1000 * (1 - 100 / 1000) = 1700, more than the first group
  // (400 + 1000 = 1400) or the end (1200 + 100 = 1300).
  PipelinedRun knee(0, 1000, 1000, 100);
  knee.observe(800, 200);
  EXPECT_EQ(knee.finish(1200), 1700);
}

class LinkRecorder final : public TransferListener {
 public:
  void transfer_progress(uint64_t, Time, double) override {}
  void transfer_done(uint64_t tag, Time t) override { done[tag] = t; }
  Time done[4] = {-1, -1, -1, -1};
};

// Runs the queue dry.
void drain(EventQueue& queue) {
  while (!queue.empty()) queue.run_next();
}

class Links : public ::testing::Test {
 protected:
  Links() : topology_(*scheduler::Topology::from_config(paper_node_config())) {}
  scheduler::Topology topology_;
  EventQueue queue_;
  LinkOptions options_;  // efficiency 0.88: 12 GB/s PCIe -> 10.56 bytes/ns alone
  LinkRecorder recorder_;
};

TEST_F(Links, ALoneHostLoadGetsItsShareOfTheSwitch) {
  LinkModel links(topology_, &queue_, options_);
  links.start(links.host_link(0), 105'600'000, &recorder_, 0);  // 105.6 MB / 10.56 = 10 ms
  drain(queue_);
  EXPECT_EQ(recorder_.done[0], 10'000'000);
}

TEST_F(Links, NeighboursBehindOneSwitchSplitItsBandwidth) {
  // GPUs 0 and 1 share PCIe switch 0 (12 GB/s). A starts alone; B joins at 5 ms.
  // A: 52.8 MB by 5 ms at 10.56; then both at 6 bytes/ns: A's other 67.2 MB take 11.2 ms,
  // done at 16.2 ms. B has 67.2 MB by then, its last 52.8 MB alone take 5 ms: 21.2 ms.
  LinkModel links(topology_, &queue_, options_);
  ASSERT_EQ(links.host_link(0), links.host_link(1));
  links.start(links.host_link(0), 120'000'000, &recorder_, 0);
  struct Later final : EventHandler {
    LinkModel* links;
    LinkRecorder* recorder;
    void on_event(int, uint64_t, Time) override {
      links->start(links->host_link(1), 120'000'000, recorder, 1);
    }
  } later;
  later.links = &links;
  later.recorder = &recorder_;
  queue_.schedule(5'000'000, &later, 0, 0);
  drain(queue_);
  EXPECT_EQ(recorder_.done[0], 16'200'000);
  EXPECT_EQ(recorder_.done[1], 21'200'000);
}

TEST_F(Links, GpusOnDifferentSwitchesDoNotContend) {
  LinkModel links(topology_, &queue_, options_);
  ASSERT_NE(links.host_link(0), links.host_link(2));
  links.start(links.host_link(0), 105'600'000, &recorder_, 0);
  links.start(links.host_link(2), 105'600'000, &recorder_, 1);
  drain(queue_);
  EXPECT_EQ(recorder_.done[0], 10'000'000);
  EXPECT_EQ(recorder_.done[1], 10'000'000);
}

TEST_F(Links, PeerCopiesTakeTheirNvlinkSpeed) {
  // The Torpor node: 0-3 has 50 GB/s (44 bytes/ns at 0.88), 0-1 has 25 GB/s (22 bytes/ns).
  LinkModel links(topology_, &queue_, options_);
  links.start(links.peer_link(3, 0), 440'000'000, &recorder_, 0);
  links.start(links.peer_link(0, 1), 440'000'000, &recorder_, 1);
  drain(queue_);
  EXPECT_EQ(recorder_.done[0], 10'000'000);
  EXPECT_EQ(recorder_.done[1], 20'000'000);
  // Peer copies do not touch the host links.
  EXPECT_EQ(links.active_transfers(links.host_link(0)), 0);
}

TEST(Models, PackTensorsIntoPyTorchSegments) {
  // 3 MiB of small tensors: two 2 MiB segments. Three 9 MiB tensors: the first opens a 20 MiB
  // segment, the second takes 9 of its remaining 11, the third needs a new one. The small
  // segments are spread among the large ones.
  const std::vector<uint64_t> a = pytorch_segments(3, {{3, 9}});
  EXPECT_EQ(a, (std::vector<uint64_t>{20 * kMiB, 2 * kMiB, 20 * kMiB, 2 * kMiB}));
  // A 12 MiB tensor fits the 16 MiB left of a 20 MiB segment; a 15 MiB one does not fit the 4
  // left and gets its own segment rounded up to 16 MiB.
  const std::vector<uint64_t> b = pytorch_segments(0, {{1, 4}, {1, 12}, {1, 15}});
  EXPECT_EQ(b, (std::vector<uint64_t>{20 * kMiB, 16 * kMiB}));
}

TEST(Models, TableHoldsThePapersEightModels) {
  ASSERT_EQ(paper_models().size(), 8u);
  const Model& bert = paper_models()[*find_model("bertqa")];
  EXPECT_EQ(bert.model_class, ModelClass::kLanguage);
  EXPECT_EQ(bert.exec, 43 * kMillisecond);         // Table 4, GPU remoting
  EXPECT_EQ(bert.native_exec, 42 * kMillisecond);  // Table 4, native
  EXPECT_EQ(bert.cold_start, 11 * kSecond);        // Table 1
  EXPECT_EQ(bert.native_footprint, static_cast<uint64_t>(2.4 * kGiB + 0.5));
  // bert-large in fp32 is 335M parameters, ~1278 MiB; its segments are a little more.
  EXPECT_GT(bert.weight_bytes, 1270 * kMiB);
  EXPECT_LT(bert.weight_bytes, 1290 * kMiB);
  EXPECT_GE(bert.model_bytes, bert.weight_bytes);
  for (const Model& m : paper_models()) {
    EXPECT_EQ(m.model_bytes % (2 * kMiB), 0u) << m.name;
    EXPECT_GT(m.native_footprint, m.model_bytes) << m.name;
  }
  EXPECT_FALSE(find_model("vgg16").ok());
}

}  // namespace
}  // namespace hiber::sim
