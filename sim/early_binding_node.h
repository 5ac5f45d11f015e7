// The early-binding systems Hiber is compared with (Torpor §7.3, §7.4). They are other
// systems, not Hiber policies, so they are modelled here rather than through the scheduler:
//
//   native      Each function runs in its own GPU container, bound to one GPU when it is
//               deployed, with its whole native footprint (weights, its own CUDA context, cuDNN
//               and cuBLAS, the caching allocator's reserve; models.h) and native latency
//               (Table 4 "Native"). Functions are bound while memory lasts, each to the GPU
//               with the most free memory; requests of a function that found no room are
//               rejected (Fig. 10: "Native can only execute 72 out of 160 functions").
//   infless-ka  Native with INFless's keep-alive (Torpor implemented it in Native, §7.3). An
//               instance idle for `keep_alive` is shut down; a request for a function without
//               an instance cold-starts one (Table 1's cold-start time) on the GPU with the most
//               free memory, first shutting down idle instances on the GPU that needs the fewest
//               (least recently used first) if none has room. A request that still finds no
//               room waits until an instance goes idle. ASSUMPTION: INFless sizes keep-alive
//               windows from per-function histograms; we use one fixed window (default 60 s,
//               longer than the gap between requests at 5 r/m) and reclaim idle instances on
//               demand, which is how INFless "reclaims GPU memory via cleaning up idle
//               functions".
//   nonswap     GPU remoting without swapping (§7.4): one runtime per GPU shared by all
//               functions (so a function takes only its model blocks and scratch), remoting
//               latency, but each function stays bound to the GPU it was deployed on (most free
//               memory first).
// In all three a GPU runs one request at a time, in arrival order (one FIFO per GPU): native
// containers on one GPU time-slice, which serves them no faster than one after another.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <vector>

#include "common/node_config.h"
#include "sim/exec_variation.h"
#include "sim/node.h"

namespace hiber::sim {

enum class EarlyBinding : uint8_t { kNative, kInflessKeepAlive, kNonSwap };
Result<EarlyBinding> parse_early_binding(std::string_view name);
const char* early_binding_name(EarlyBinding kind);

struct EarlyBindingOptions {
  EarlyBinding kind = EarlyBinding::kNative;
  Duration keep_alive = 60 * kSecond;  // infless-ka only
  // GPU memory no instance can use. Native instances carry their own context, so nothing;
  // NonSwap's shared server runtime takes what hiberd's does (HiberOptions::gpu_reserve_bytes).
  uint64_t gpu_reserve_bytes = 0;
  // Per-request spread of execution times (off by default: Table 4's fixed times).
  ExecVariation exec_variation;
};

class EarlyBindingNode final : public Node, public EventHandler {
 public:
  // `queue` and `recorder` must outlive the node.
  static Result<std::unique_ptr<EarlyBindingNode>> create(const NodeConfig& config,
                                                          const EarlyBindingOptions& options,
                                                          EventQueue* queue, Recorder* recorder,
                                                          int node_index);

  Status add_function(uint32_t index, const SimFunction& function, Time now) override;
  void arrive(uint32_t index, Time now) override;
  void finish(Time now) override;
  std::string summary() const override;
  void on_event(int kind, uint64_t arg, Time now) override;

  // Functions with an instance now, and GPU memory in use.
  int instances() const;
  uint64_t used_bytes(int gpu) const { return gpus_[gpu].used; }
  uint64_t cold_starts() const { return cold_starts_; }

 private:
  enum EventKind : int { kDone = 1, kReady = 2, kExpire = 3 };
  enum class State : uint8_t { kNone, kStarting, kWarm };

  struct Queued {
    uint32_t function = 0;
    Time arrival = 0;
    Duration load = 0;
    StartKind kind = StartKind::kWarm;
  };
  struct Gpu {
    uint64_t capacity = 0;
    uint64_t used = 0;
    std::deque<Queued> fifo;
    bool running = false;
    Queued current;
    Time started = 0;
  };
  struct Instance {
    const SimFunction* function = nullptr;
    State state = State::kNone;
    int gpu = -1;
    uint64_t footprint = 0;
    Duration exec = 0;
    ModelClass model_class = ModelClass::kVision;
    uint64_t served = 0;  // numbers the function's requests for ExecVariation
    Duration cold_start = 0;
    uint32_t in_flight = 0;  // queued or running on its GPU
    Time last_used = 0;
    uint32_t version = 0;       // invalidates keep-alive and ready events
    bool pending = false;       // in pending_, waiting for memory
    std::vector<Time> waiting;  // arrivals waiting for the instance to start
  };

  EarlyBindingNode(const EarlyBindingOptions& options, EventQueue* queue, Recorder* recorder,
                   int node_index);

  // The GPU with the most free memory that fits `bytes`, or -1.
  int roomiest(uint64_t bytes) const;
  bool cold_start(uint32_t index, Time now);
  // Shuts down idle instances on one GPU so that `bytes` fit there; that GPU, or -1.
  int reclaim(uint64_t bytes);
  void unload(uint32_t index);
  void enqueue(uint32_t index, const Queued& q, Time now);
  void run_next(int gpu, Time now);
  void retry_pending(Time now);
  void record_unfinished(uint32_t function, Time arrival);

  EarlyBindingOptions options_;
  EventQueue* queue_;
  Recorder* recorder_;
  int node_index_;
  std::vector<Gpu> gpus_;
  std::vector<Instance> instances_;  // by workload index
  std::deque<uint32_t> pending_;     // functions waiting for memory to cold-start
  uint64_t cold_starts_ = 0;
  uint64_t rejected_ = 0;
  uint64_t reclaimed_ = 0;
  uint64_t expired_ = 0;
};

}  // namespace hiber::sim
