// A node running Hiber: the node core (node/node_core.h) decides, exactly as in hiberd; the real
// GPU pools (memory/gpu_pools.h) hold the blocks, and the link model and the pipelined-execution
// formula give the times. Nothing here chooses a GPU, a victim or a queue order: this class is
// the core's Actuator for the simulator, as server/controller.cc is hiberd's.
//
// Carrying out a start of request r on GPU g (Actuator::start):
//   1. the core has freed the replicas its decision evicts (evict(): the blocks go back to the
//      pool; host copies are authoritative, nothing is copied back);
//   2. for a swap, allocate the model's blocks on g: its PyTorch segments (models.h), one pool
//      allocation each, as hiberd re-places a function's blocks;
//   3. allocate r's scratch (activations and workspace) on g;
//      if the pool refuses a block in 2 or 3 (fragmentation, or scratch the view did not count),
//      ask the core to make_room() (its eviction policy picks the victims) until the block fits
//      or nothing more can go; then r fails: streaming(error), done(failed);
//   4. resident: r computes for the model's execution time. Swap: after the setup time, the
//      model's bytes move over g's PCIe switch (host) or the NVLink from the source GPU (peer),
//      sharing the link with other transfers (links.h), and r's computation follows the bytes
//      (pipeline.h). The core hears swap_done when the last byte is there; a peer move then has
//      the source replica forgotten (forget()).
//      A request executes beside the others on g (spatial sharing, SchedulerOptions::sharing)
//      at the slowdown of the interference model (co_run.h): from its start for a resident
//      model, from the swap's last byte for the computation still left after it.
//   5. finished: the core hears done(); its end() frees r's scratch and reports released().
//
// The Torpor-Block ablation runs the same node with PoolKind::kBlock, whose device allocations
// cost time (device_malloc.h); the buddy pools were reserved at start and cost nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/node_config.h"
#include "memory/gpu_pools.h"
#include "node/node_core.h"
#include "scheduler/scheduler.h"
#include "sim/co_run.h"
#include "sim/device_malloc.h"
#include "sim/exec_variation.h"
#include "sim/links.h"
#include "sim/node.h"
#include "sim/pipeline.h"

namespace hiber::sim {

struct HiberOptions {
  scheduler::SchedulerOptions scheduler;
  memory::PoolKind pool = memory::PoolKind::kBuddy;
  memory::BuddyOptions buddy;
  // GPU memory the pools never get: hiberd's CUDA context with cuDNN and cuBLAS loaded, one per
  // GPU in runtime-sharing mode (ESTIMATED; a PyTorch process's context on a V100 is of this
  // order).
  uint64_t gpu_reserve_bytes = 512 * kMiB;
  // The buddy pool is reserved in chunks of at most this size (hiberd reserves a few large ones).
  uint64_t pool_chunk_bytes = 2 * kGiB;
  PipelineOptions pipeline;
  LinkOptions links;
  DeviceMallocCost device_malloc;
  // Per-request spread of execution times (off by default: Table 4's fixed times).
  ExecVariation exec_variation;
  // Each function loads its model when it is deployed, under a background request, as a
  // function's instance does at start-up in hiberd (its weights are copied in before its first
  // request). Off: a model reaches a GPU with its function's first request.
  bool start_up = false;
  // Requests executing on one GPU at once slow each other (co_run.h). Off: they never do.
  bool interference = true;
  // Check the scheduler's and the pools' invariants after every event (tests; slow).
  bool check_invariants = false;
};

class HiberNode final : public Node,
                        public EventHandler,
                        public TransferListener,
                        private node::Actuator {
 public:
  // `queue`, `recorder` and `oracle` must outlive the node. The oracle is needed only by the
  // oracle eviction policies; it must count this node's arrivals in order.
  static Result<std::unique_ptr<HiberNode>> create(const NodeConfig& config,
                                                   const HiberOptions& options, EventQueue* queue,
                                                   Recorder* recorder, int node_index,
                                                   const scheduler::FutureOracle* oracle = nullptr);
  ~HiberNode() override;

  Status add_function(uint32_t index, const SimFunction& function, Time now) override;
  // The same for a model that is not one of the paper's (function.model is ignored). `model`
  // must outlive the node.
  Status add_function(uint32_t index, const SimFunction& function, const Model& model, Time now);
  void arrive(uint32_t index, Time now) override;
  void finish(Time now) override;
  std::string summary() const override;

  void on_event(int kind, uint64_t arg, Time now) override;
  void transfer_progress(uint64_t tag, Time t, double bytes_done) override;
  void transfer_done(uint64_t tag, Time t) override;

  const scheduler::Scheduler& scheduler() const { return core_->scheduler(); }
  const memory::GpuPools& pools() const { return *pools_; }
  uint64_t pool_failures() const { return pool_failures_; }
  // Replicas the node freed because a decision or make_room() named them.
  uint64_t evictions() const { return evictions_; }
  uint64_t device_mallocs() const;

 private:
  enum EventKind : int { kStartTransfer = 1, kDone = 2, kWakeup = 3 };

  struct Block {
    memory::Allocation allocation;
    uint64_t requested = 0;
  };
  struct Request {
    uint32_t function = 0;
    Time arrival = 0;
    Time dispatched = 0;
    Time load_end = 0;
    int gpu = -1;
    int source_gpu = -1;
    scheduler::Source source = scheduler::Source::kResident;
    bool started = false;
    bool background = false;  // a start-up (HiberOptions::start_up), not an arrival
    Duration exec = 0;        // this request's computation at full speed
    bool executing = false;   // in its GPU's CoRun
    Time finish_at = -1;      // of its latest kDone event; older ones are stale
    std::vector<Block> scratch;
    PipelinedRun pipeline;
  };
  struct Deployed {
    const SimFunction* function = nullptr;
    const Model* model = nullptr;
    uint64_t arrivals = 0;  // numbers the function's requests for ExecVariation
  };

  HiberNode(const HiberOptions& options, EventQueue* queue, Recorder* recorder, int node_index);
  // The outcome of `r` as far as its request got: `kind`, not completed.
  Outcome outcome_of(const Request& r, StartKind kind) const;

  // A simulated function has one instance, numbered as the function.
  static FunctionId id_of(uint32_t index) { return FunctionId{index + 1}; }
  static InstanceId instance_of(uint32_t index) { return InstanceId{index + 1}; }
  static uint32_t index_of(InstanceId id) { return id.value() - 1; }
  void dispatch(Time now);
  // The start failed (no room): the core hears it, and the outcome is recorded.
  void fail(RequestId id, Request& r, Time now);
  void complete(RequestId id, Time now);
  // `r` computes `work` (time alone) on its GPU from now, beside whatever executes there.
  void execute(RequestId id, Request& r, Duration work, Time now);
  // Schedules the kDone events of finish times that changed.
  void retime(const std::vector<CoRun::Finish>& finishes);
  // Allocates `bytes` on `gpu` for function `index`, evicting through make_room if needed.
  // `may_evict`: when the pool refuses, the core's eviction policy makes room; a prewarm does
  // not (it must not evict what the scheduler did not name), so it fails instead.
  bool allocate(int gpu, uint64_t bytes, uint32_t index, Time now, std::vector<Block>* out,
                bool may_evict = true);
  void free_blocks(int gpu, std::vector<Block>* blocks, bool model, uint32_t index);
  void free_model(int gpu, uint32_t index);
  void collect_device_cost(int gpu);
  void schedule_wakeup(Time now);
  void check(Time now) const;

  // ---- node::Actuator ----
  Result<uint64_t> evict(InstanceId instance, GpuId gpu) override;
  void forget(InstanceId instance, GpuId gpu) override;
  void start(const node::Start& start) override;
  void end(RequestId request, InstanceId instance, const Status& failure) override;
  // Nobody waits for a start or drains a simulated node.
  void answer_start(RequestId, const Result<node::StartInfo>&) override {}
  void drained(std::optional<GpuId>) override {}
  void rejected(RequestId request, InstanceId instance, const Status& why) override;
  uint64_t pool_allocated(GpuId gpu) const override { return allocated_[gpu.value()]; }
  uint64_t placed_bytes(InstanceId instance, GpuId gpu) const override;
  uint64_t model_bytes(InstanceId instance) const override;

  HiberOptions options_;
  EventQueue* queue_;
  Recorder* recorder_;
  int node_index_;
  Time now_ = 0;  // of the event being handled: the actuator's calls carry no time
  std::unique_ptr<scheduler::Topology> topology_;
  std::vector<std::unique_ptr<TimedChunkSource>> device_;  // block and naive pools only
  std::unique_ptr<memory::GpuPools> pools_;
  std::unique_ptr<node::NodeCore> core_;
  std::unique_ptr<LinkModel> links_;

  std::vector<Deployed> deployed_;                       // by workload index
  std::vector<std::vector<std::vector<Block>>> models_;  // [gpu][workload index]
  std::vector<std::vector<uint64_t>> model_placed_;      // [gpu][workload index]: requested bytes
  std::vector<uint64_t> allocated_;                      // per GPU: bytes the pool gave out
  std::vector<scheduler::Duration> device_cost_;         // per GPU: owed by the next start
  std::vector<CoRun> co_run_;                            // per GPU: what executes there
  std::vector<CoRun::Finish> finishes_;                  // scratch of retime()
  std::unordered_map<RequestId, Request> requests_;
  Time wakeup_at_ = scheduler::Scheduler::kNever;
  uint64_t pool_failures_ = 0;
  uint64_t evictions_ = 0;
  uint64_t lost_replicas_ = 0;
};

}  // namespace hiber::sim
