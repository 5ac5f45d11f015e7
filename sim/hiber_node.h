// A node running Hiber: the real scheduler (scheduler/scheduler.h) decides, the real GPU pools
// (memory/gpu_pools.h) hold the blocks, and the link model and the pipelined-execution formula
// give the times. Nothing here chooses a GPU, a victim or a queue order; this class only carries
// out the scheduler's decisions the way hiberd's controller and executors do, and reports back.
//
// Carrying out a decision for request r on GPU g:
//   1. free the blocks of every replica in `evictions` (host copies are authoritative: nothing
//      is copied back);
//   2. for a swap, allocate the model's blocks on g: its PyTorch segments (models.h), one pool
//      allocation each, as hiberd re-places a function's blocks;
//   3. allocate r's scratch (activations and workspace) on g;
//      if the pool refuses a block in 2 or 3 (fragmentation, or scratch the view did not count),
//      ask the scheduler to make_room() and free what its policy names, until the block fits
//      or nothing more can go; then r fails;
//   4. resident: r computes for the model's execution time. Swap: after the setup time, the
//      model's bytes move over g's PCIe switch (host) or the NVLink from the source GPU (peer),
//      sharing the link with other transfers (links.h), and r's computation follows the bytes
//      (pipeline.h). The scheduler hears load_done when the last byte is there; a peer move
//      then frees the source replica (release_source).
//   5. done: r's scratch is freed and the scheduler hears done().
// After every change of the pools the scheduler is told the bytes used by anything but models
// (set_reserved): the per-GPU runtime reserve, scratch, and the pool's rounding and waste.
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
#include "scheduler/scheduler.h"
#include "sim/device_malloc.h"
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
  // Check the scheduler's and the pools' invariants after every event (tests; slow).
  bool check_invariants = false;
};

class HiberNode final : public Node, public EventHandler, public TransferListener {
 public:
  // `queue`, `recorder` and `oracle` must outlive the node. The oracle is needed only by the
  // oracle eviction policies; it must count this node's arrivals in order.
  static Result<std::unique_ptr<HiberNode>> create(const NodeConfig& config,
                                                   const HiberOptions& options, EventQueue* queue,
                                                   Recorder* recorder, int node_index,
                                                   const scheduler::FutureOracle* oracle = nullptr);
  ~HiberNode() override;

  Status add_function(uint32_t index, const SimFunction& function, Time now) override;
  void arrive(uint32_t index, Time now) override;
  void finish(Time now) override;
  std::string summary() const override;

  void on_event(int kind, uint64_t arg, Time now) override;
  void transfer_progress(uint64_t tag, Time t, double bytes_done) override;
  void transfer_done(uint64_t tag, Time t) override;

  const scheduler::Scheduler& scheduler() const { return *scheduler_; }
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
    bool release_source = false;
    bool started = false;
    std::vector<Block> scratch;
    PipelinedRun pipeline;
  };
  struct Deployed {
    const SimFunction* function = nullptr;
    const Model* model = nullptr;
  };

  HiberNode(const HiberOptions& options, EventQueue* queue, Recorder* recorder, int node_index);
  // The outcome of `r` as far as its request got: `kind`, not completed.
  Outcome outcome_of(const Request& r, StartKind kind) const;

  static scheduler::FunctionId id_of(uint32_t index) { return scheduler::FunctionId{index + 1}; }
  void dispatch(Time now);
  void start(const scheduler::Decision& decision, Time now);
  void fail(scheduler::RequestId id, Request& r, Time now);
  void complete(scheduler::RequestId id, Time now);
  // Allocates `bytes` on `gpu` for function `index`, evicting through make_room if needed.
  bool allocate(int gpu, uint64_t bytes, uint32_t index, Time now, std::vector<Block>* out);
  void free_blocks(int gpu, std::vector<Block>* blocks, bool model);
  void free_model(int gpu, uint32_t index);
  void update_reserved(int gpu);
  void collect_device_cost(int gpu);
  void schedule_wakeup(Time now);
  void check(Time now) const;

  HiberOptions options_;
  EventQueue* queue_;
  Recorder* recorder_;
  int node_index_;
  std::unique_ptr<scheduler::Topology> topology_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::vector<std::unique_ptr<TimedChunkSource>> device_;  // block and naive pools only
  std::unique_ptr<memory::GpuPools> pools_;
  std::unique_ptr<LinkModel> links_;

  std::vector<Deployed> deployed_;                        // by workload index
  std::vector<std::vector<std::vector<Block>>> models_;   // [gpu][workload index]
  std::vector<uint64_t> allocated_;                       // per GPU: bytes the pool gave out
  std::vector<uint64_t> model_requested_;                 // per GPU: model segments' bytes
  std::vector<uint64_t> reported_reserved_;
  std::vector<scheduler::Duration> device_cost_;          // per GPU: owed by the next start
  std::unordered_map<scheduler::RequestId, Request> requests_;
  std::vector<scheduler::Decision> decisions_;
  Time wakeup_at_ = scheduler::Scheduler::kNever;
  uint64_t pool_failures_ = 0;
  uint64_t evictions_ = 0;
  uint64_t lost_replicas_ = 0;
};

}  // namespace hiber::sim
