#include "sim/calibration.h"

#include <algorithm>

#include <glog/logging.h>

#include "scheduler/topology.h"

namespace hiber::sim {
namespace {

// A model swapped in and computed again and again on one GPU, as fast as it can go.
class SwapLoop final : public TransferListener, public EventHandler {
 public:
  SwapLoop(LinkModel* links, EventQueue* queue, int link, const Model& model,
           const PipelineOptions& pipeline, int runs)
      : links_(links),
        queue_(queue),
        link_(link),
        model_(model),
        pipeline_(pipeline),
        runs_(runs) {}

  void begin(Time now) {
    started_ = now;
    queue_->schedule(now + pipeline_.setup, this, kTransfer, 0);
  }
  void on_event(int kind, uint64_t, Time now) override {
    if (kind == kTransfer) {
      run_ = PipelinedRun(now, model_.model_bytes, model_.exec, pipeline_.group_bytes);
      links_->start(link_, model_.model_bytes, this, 0);
      return;
    }
    total_ += now - started_;
    if (++done_ < runs_) begin(now);
  }
  void transfer_progress(uint64_t, Time t, double bytes) override { run_.observe(t, bytes); }
  void transfer_done(uint64_t, Time t) override {
    queue_->schedule(run_.finish(t), this, kFinished, 0);
  }

  bool finished() const { return done_ >= runs_; }
  Duration mean() const { return done_ ? total_ / done_ : 0; }

 private:
  enum { kTransfer = 1, kFinished = 2 };
  LinkModel* links_;
  EventQueue* queue_;
  int link_;
  const Model& model_;
  PipelineOptions pipeline_;
  int runs_;
  int done_ = 0;
  Time started_ = 0;
  Duration total_ = 0;
  PipelinedRun run_;
};

}  // namespace

SwapLatency swap_latency(const NodeConfig& config, const Model& model,
                         const PipelineOptions& pipeline, const LinkOptions& links) {
  Result<scheduler::Topology> topology = scheduler::Topology::from_config(config);
  CHECK(topology.ok()) << topology.status();
  EventQueue queue;
  LinkModel model_links(*topology, &queue, links);
  SwapLatency out;
  const int host = model_links.host_link(0);
  out.pcie = pipeline.setup + PipelinedRun::constant_rate(model.model_bytes, model.exec,
                                                          pipeline.group_bytes,
                                                          model_links.share(host, 1));
  double fastest = 0;
  for (int b = 1; b < topology->gpu_count(); ++b)
    fastest = std::max(fastest, topology->peer_gbps(0, b));
  for (int a = 0; a < topology->gpu_count(); ++a) {
    for (int b = a + 1; b < topology->gpu_count(); ++b) {
      const int link = model_links.peer_link(a, b);
      if (link < 0 || topology->peer_gbps(a, b) < fastest) continue;
      out.nvlink = pipeline.setup + PipelinedRun::constant_rate(model.model_bytes, model.exec,
                                                                pipeline.group_bytes,
                                                                model_links.share(link, 1));
      return out;
    }
  }
  return out;
}

Duration contended_latency(const NodeConfig& config, const Model& row, const Model* column,
                           const PipelineOptions& pipeline, const LinkOptions& links, int runs) {
  Result<scheduler::Topology> topology = scheduler::Topology::from_config(config);
  CHECK(topology.ok()) << topology.status();
  CHECK_GE(topology->gpu_count(), 2);
  EventQueue queue;
  LinkModel model_links(*topology, &queue, links);
  const int link = model_links.host_link(0);
  CHECK_EQ(link, model_links.host_link(1)) << "GPUs 0 and 1 must share a PCIe switch";
  SwapLoop measured(&model_links, &queue, link, row, pipeline, runs);
  // The contender never stops on its own: it runs far more often than the measured loop.
  SwapLoop contender(&model_links, &queue, link, column ? *column : row, pipeline, 1 << 30);
  measured.begin(0);
  if (column != nullptr) contender.begin(0);
  while (!measured.finished() && !queue.empty()) queue.run_next();
  return measured.mean();
}

}  // namespace hiber::sim
