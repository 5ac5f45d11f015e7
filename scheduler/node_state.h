// The scheduler's global view of the node's GPUs (Torpor §5.4: "manages memory of all GPUs as
// a pool"): per GPU, which request runs there, which model is being loaded onto it from the
// host, how many bytes are spoken for, and the model replicas it holds; per function, the set
// of GPUs holding a complete replica.
//
// The view is what the scheduler has been told and has decided, not a measurement: the
// Scheduler updates it on every event and decision, and the caller's memory layer reports
// bytes it uses for anything other than models (scratch, pool overhead) as `reserved`.
// Placement and eviction policies read it through const references.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "scheduler/topology.h"
#include "scheduler/types.h"

namespace hiber::scheduler {

// One copy of a function's model on one GPU.
struct Replica {
  FunctionIndex function{0};  // set by NodeState::add_replica
  uint64_t bytes = 0;
  bool loading = false;      // bytes still in flight; complete once the swap finishes
  uint32_t source_pins = 0;  // peer copies reading from this replica right now
  Time last_used = 0;        // last dispatch or completion of a request on this replica
};

// A request executing on a GPU beside the one in GpuState::running (spatial sharing).
struct CoRunning {
  RequestId request;
  FunctionIndex function{0};
};

struct GpuState {
  uint64_t capacity = 0;  // bytes the scheduler may place models in (the GPU's memory)
  uint64_t reserved = 0;  // bytes used for anything but models, as the memory layer reports
  uint64_t used = 0;      // bytes of the replicas below, loading ones included
  std::optional<RequestId> running;  // the request placed here, until it is done
  std::optional<FunctionIndex> running_function;
  // Requests started beside `running` (SchedulerOptions::sharing); empty without sharing. When
  // `running` is done the first of them takes its place.
  std::vector<CoRunning> sharing;
  std::optional<FunctionIndex> host_loading;  // model in flight from the host (PCIe), if any
  std::vector<Replica> replicas;
};

class NodeState {
 public:
  explicit NodeState(const Topology& topology);

  const Topology& topology() const { return *topology_; }
  int gpu_count() const { return topology_->gpu_count(); }
  const GpuState& gpu(int g) const { return gpus_[g]; }

  // Healthy GPUs, not held, with no request placed on them: Algorithm 1's set A.
  GpuMask available() const { return available_; }
  // GPUs that may take requests; an unhealthy GPU is never available.
  GpuMask healthy() const { return healthy_; }
  // GPUs holding a complete replica of f: Algorithm 1's set M.
  GpuMask holders(FunctionIndex f) const {
    return f.value() < holders_.size() ? holders_[f.value()] : 0;
  }
  // GPUs with a PCIe load in flight.
  GpuMask host_loading() const { return host_loading_mask_; }

  // Bytes free for models on g: capacity - reserved - used, 0 when over-committed.
  uint64_t free_bytes(int g) const;
  // Bytes g could ever give one model: capacity - reserved.
  uint64_t usable_bytes(int g) const;

  const Replica* find(int g, FunctionIndex f) const;
  Replica* find(int g, FunctionIndex f);
  // f has a request executing on g (running there or sharing it).
  bool executing(int g, FunctionIndex f) const;
  // Complete replicas of f across the node.
  int replica_count(FunctionIndex f) const;

  // --- Mutations: the Scheduler's, after it has checked the arguments. ---
  void ensure_function_slots(size_t slots);
  void set_capacity(int g, uint64_t bytes) { gpus_[g].capacity = bytes; }
  void set_reserved(int g, uint64_t bytes) { gpus_[g].reserved = bytes; }
  // Adds a replica (loading or complete); the caller has made sure none is there yet.
  Replica& add_replica(int g, FunctionIndex f, uint64_t bytes, bool loading, Time now);
  // Removes f's replica from g, if present.
  void remove_replica(int g, FunctionIndex f);
  // Resizes f's replica on g, if present (the model's size became known).
  void set_replica_bytes(int g, FunctionIndex f, uint64_t bytes);
  // The replica (on GPU g) has all its bytes.
  void mark_complete(int g, Replica& replica);
  void set_running(int g, RequestId request, std::optional<FunctionIndex> f);
  // `request` joins g's running request (spatial sharing). REQUIRES: g runs one.
  void add_sharing(int g, RequestId request, FunctionIndex f);
  // `request`, running on g or sharing it, is done; g is available once nothing runs there.
  void clear_running(int g, RequestId request);
  // The request running on g, if any, is done.
  void clear_running(int g);
  void set_host_loading(int g, std::optional<FunctionIndex> f);
  void set_healthy(int g, bool healthy);
  // A held GPU takes no requests, and keeps its replicas and whatever runs there.
  void set_held(int g, bool held);

  // The invariants every event must keep: used = sum of replica bytes, holder masks match the
  // replicas, availability matches health and the running requests, at most one replica per
  // (GPU, model), requests share a GPU only beside a running one.
  // kIllegalState naming the first broken one. For tests and the simulator's debug mode.
  Status check_invariants() const;

 private:
  const Topology* topology_;
  std::vector<GpuState> gpus_;
  std::vector<GpuMask> holders_;
  GpuMask available_ = 0;
  GpuMask healthy_ = 0;
  GpuMask held_ = 0;
  GpuMask host_loading_mask_ = 0;
};

}  // namespace hiber::scheduler
